"""Small, explicit checks for YAML documents.

Every message names the file, the line where known, the dotted key and what
would fix it: ``inventory/x.yaml:12: partitions.a100.gpus_per_node must be an
integer >= 0, got 'eight'``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from harness.contract.errors import InputError

from .yamlio import LineDict, Scientific

# -- limits: the one home of every input bound -------------------------------------------------------------
INT_MAX = 2**31 - 1  # what an INTEGER column holds; the default ceiling of an integer key
MAX_STRING = 4096  # characters in any one string value
MAX_LIST = 1024  # items in any one list value (setup lines, HCAs, grid values, ...)
MAX_NUMBER = 1e15  # magnitude of any float value
# A name that becomes part of a file name, a job name or a script: letters, digits, '.', '_', '-'.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # every control character but tab and newline
_CONTROL_LINE = re.compile(r"[\x00-\x1f\x7f]")  # every control character, tab and newline included


# SLURM's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) and its words for no limit.
SLURM_TIME = re.compile(r"\d{1,4}-\d{1,2}(?::\d{2}){0,2}|\d{1,7}(?::\d{2}){0,2}|UNLIMITED|INFINITE|unlimited|infinite")
SLURM_TIME_TEXT = "a SLURM time like '90', '01:00:00', '1-12:00:00' or 'UNLIMITED'"
# Names SLURM accepts for partitions, accounts, QOS and reservations; a constraint adds its operators.
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
SLURM_NAME_TEXT = "a SLURM name (letters, digits, '_', '.', '+', '-')"
SLURM_CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,\[\]*()!:+-]{1,512}")
SLURM_CONSTRAINT_TEXT = "a SLURM constraint expression (features joined by & | , [ ] *)"
# A host address: an IPv4/IPv6 literal or a DNS name.
ADDRESS = re.compile(r"[0-9A-Fa-f:.]{2,45}|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})")
# NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: interface names or prefixes, '^' to exclude, '=' for exact.
IFNAME = re.compile(r"[\^=]?[A-Za-z0-9_.:@-]{1,64}(?:,[\^=]?[A-Za-z0-9_.:@-]{1,64}){0,31}")


# sbatch long options a sweep's slurm.extra or a partition's slurm_extra may add. sbench renders the rest
# itself (nodes, tasks, CPUs, memory, time, partition, account, qos, constraint, exclusive, nodelist,
# requeue, job name, output, array), and options that change how the script runs (--wrap, --export,
# --chdir, --hold, --parsable, --wait) are refused.
SBATCH_EXTRA_OPTIONS = frozenset({
    "reservation", "switches", "gres", "gpus", "gpus-per-task", "gpus-per-socket", "gpu-bind", "gpu-freq",
    "cpus-per-gpu", "mem-per-gpu", "mem-bind", "cpu-freq", "hint", "core-spec", "thread-spec", "comment",
    "wckey", "licenses", "begin", "deadline", "distribution", "exclude", "network", "prefer", "priority",
    "nice", "mail-type", "mail-user", "signal", "tmp", "mincpus", "sockets-per-node", "cores-per-socket",
    "threads-per-core", "ntasks-per-core", "ntasks-per-socket", "spread-job", "use-min-nodes",
    "cluster-constraint", "clusters", "profile", "acctg-freq", "power", "bb", "bbf", "oversubscribe",
    "overcommit", "dependency", "kill-on-invalid-dep", "container", "container-id", "container-image",
    "container-mounts", "container-workdir", "container-name", "container-save", "container-mount-home",
    "no-container-mount-home", "container-remap-root", "no-container-remap-root", "container-entrypoint",
    "no-container-entrypoint", "container-writable", "container-readonly", "container-env",
    "container-image-save", "time-min", "gres-flags", "tres-per-task", "x11", "delay-boot", "qos-level",
})


def sbatch_extra(ck: Checker, node: Mapping[str, Any], key: str, name: str) -> dict[str, Any]:
    """A mapping of known sbatch long options (see :data:`SBATCH_EXTRA_OPTIONS`) to values: a string or
    number (rendered ``--opt=value``, quoted when needed) or ``true`` (a bare ``--opt``)."""
    value = node.get(name)
    dotted = f"{key}.{name}" if key else name
    if value is None:
        return {}
    value = ck.mapping(value, dotted, node, name)
    out: dict[str, Any] = {}
    for opt, v in value.items():
        opt = str(opt).lstrip("-").replace("_", "-")
        if opt not in SBATCH_EXTRA_OPTIONS:
            close = difflib.get_close_matches(opt, sorted(SBATCH_EXTRA_OPTIONS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            ck.fail(f"{dotted}.{opt}", f"is not an sbatch option sbench passes through; {hint}sbench sets nodes, "
                                       "tasks, CPUs, memory, time and placement itself (see docs/inventory.md)",
                    value, opt)
        if v is True:
            out[opt] = True
        elif v is False or v is None:
            continue
        elif isinstance(v, (str, int)) and not isinstance(v, bool):
            text = str(v)
            if not text or text_problem(text):
                ck.fail(f"{dotted}.{opt}", f"must be a one-line value without control characters, got {show(v)}",
                        value, opt)
            out[opt] = text
        else:
            ck.fail(f"{dotted}.{opt}", f"must be a string, a number or true, got {show(v)}", value, opt)
    return out


def slurm_time_minutes(text: str) -> float | None:
    """A SLURM time in minutes; None for UNLIMITED/INFINITE. Raises ``ValueError`` on another format."""
    text = str(text).strip()
    if SLURM_TIME.fullmatch(text) is None:
        raise ValueError(f"not {SLURM_TIME_TEXT}: {text!r}")
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        h, m, s = ([int(p) for p in text.split(":")] + [0, 0])[:3]
    else:
        parts = [int(p) for p in text.split(":")]
        h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return days * 1440 + h * 60 + m + s / 60


def minutes_text(minutes: float) -> str:
    """Minutes as SLURM's ``D-HH:MM:SS``."""
    secs = int(round(minutes * 60))
    d, rest = divmod(secs, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def slurm_time_key(text: str) -> float:
    """A SLURM time as minutes to compare by, UNLIMITED/INFINITE the longest. Raises ``ValueError`` on another
    format."""
    minutes = slurm_time_minutes(text)
    return float("inf") if minutes is None else minutes


def control_char(text: str, multiline: bool = False) -> str | None:
    """The first control character of *text* (newline and tab allowed when *multiline*), shown escaped."""
    m = (_CONTROL if multiline else _CONTROL_LINE).search(text)
    return None if m is None else repr(m.group(0))


def text_problem(text: str, max_len: int = MAX_STRING, multiline: bool = False) -> str | None:
    """What is wrong with a string value (too long, or a control character), as the end of a message
    that starts with its key; None when nothing is."""
    if len(text) > max_len:
        return f"is {len(text)} characters long; at most {max_len} are allowed"
    bad = control_char(text, multiline)
    if bad is not None:
        return f"contains the control character {bad}; remove it (got {show(text)})"
    return None


def is_name(text: Any) -> bool:
    """True for a full-match identifier (see :data:`NAME`); a trailing newline is no match."""
    return isinstance(text, str) and NAME.fullmatch(text) is not None


def is_campaign_ref(text: Any) -> bool:
    """A campaign as the readers name it: a name, or ``cluster/name`` for one imported from another database
    (harness.contract.exchange.namespaced)."""
    if not isinstance(text, str):
        return False
    head, sep, tail = text.partition("/")
    return is_name(head) and (not sep or is_name(tail))


def show(value: Any) -> str:
    """*value* for an error message: short, and safe for huge integers and containers."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value))) if abs(value) < 10**4000 else 'over 4000'} digits"
    if isinstance(value, (list, dict)) and len(value) > 20:
        return f"a {type(value).__name__} of {len(value)} items"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


class Checker:
    """Raises ``error`` with file/line/key context."""

    def __init__(self, source: str, error: type[InputError]) -> None:
        self.source = source
        self.error = error

    def fail(self, key: str, message: str, node: Any = None, leaf: str | None = None) -> NoReturn:
        line = None
        if isinstance(node, LineDict):
            line = node.lines.get(leaf) if leaf is not None else None
            if line is None:
                line = node.start_line or None
        where = f"{self.source}:{line}" if line else self.source
        raise self.error(f"{where}: {key} {message}")

    # -- structure ---------------------------------------------------------
    def mapping(self, value: Any, key: str, parent: Any = None, leaf: str | None = None) -> Mapping[str, Any]:
        if value is None:
            return LineDict()
        if not isinstance(value, Mapping):
            self.fail(key, f"must be a mapping (key: value), got {show(value)}", parent, leaf)
        return value

    def known_keys(self, node: Mapping[str, Any], key: str, allowed: Iterable[str],
                   kinds: Mapping[str, type | tuple[type, ...]] | None = None,
                   elsewhere: Mapping[str, str] | None = None) -> None:
        """Refuse a key not in *allowed*, naming the fix. *kinds*: the type a key's value must have; a
        near-miss is suggested only when the value would fit it (``trainer: x`` is no ``runner:``, which is
        a mapping). *elsewhere*: keys that belong in another place -> the rest of the message saying where."""
        allowed = list(allowed)
        for k in node:
            if k not in allowed:
                dotted = f"{key}.{k}" if key else str(k)
                if elsewhere and str(k) in elsewhere:
                    self.fail(dotted, elsewhere[str(k)], node, k)
                close = [c for c in difflib.get_close_matches(str(k), allowed, n=3)
                         if kinds is None or c not in kinds or isinstance(node[k], kinds[c])][:1]
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.fail(dotted, f"is not a known key; {hint}valid keys: {', '.join(allowed)}", node, k)

    def require(self, node: Mapping[str, Any], key: str, name: str, hint: str = "") -> Any:
        if name not in node or node[name] is None:
            dotted = f"{key}.{name}" if key else name
            extra = f" ({hint})" if hint else ""
            self.fail(dotted, f"is required but missing{extra}", node)
        return node[name]

    # -- scalars -----------------------------------------------------------
    def string(self, node: Mapping[str, Any], key: str, name: str, default: Any = None, nonempty: bool = True,
               pattern: re.Pattern[str] | None = None, what: str = "", multiline: bool = False,
               max_len: int = MAX_STRING) -> Any:
        """A string value: no control characters (newlines only when *multiline*), at most *max_len*
        characters, and a full match of *pattern* (described by *what*) when given."""
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(dotted, f"must be a string, got {show(value)}", node, name)
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(dotted, f"must be a string, got {show(value)}", node, name)
        value = str(value)
        self.text(value, dotted, node, name, multiline=multiline, max_len=max_len)
        if nonempty and not value.strip():
            self.fail(dotted, "must not be empty", node, name)
        if pattern is not None and pattern.fullmatch(value) is None:
            self.fail(dotted, f"must be {what or 'a name'}, got {show(value)}", node, name)
        return value

    def text(self, value: str, dotted: str, node: Any = None, leaf: str | None = None, *,
             multiline: bool = False, max_len: int = MAX_STRING) -> str:
        """Check a string already in hand: length and control characters."""
        problem = text_problem(value, max_len, multiline)
        if problem:
            self.fail(dotted, problem, node, leaf)
        return value

    def name(self, value: Any, dotted: str, node: Any = None, leaf: str | None = None, what: str = "name") -> str:
        """A key used as an identifier (partition, host, campaign): a full match of :data:`NAME`."""
        if not is_name(value):
            self.fail(dotted, f"is not a valid {what}: use letters, digits, '.', '_' or '-' (start with a letter "
                              f"or digit, at most 100), got {show(value)}", node, leaf)
        return value

    def integer(self, node: Mapping[str, Any], key: str, name: str, default: Any = None, minimum: int | None = None,
                maximum: int = INT_MAX) -> Any:
        """An integer (a YAML number, never a quoted string) in [minimum, maximum]."""
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        bound = f" >= {minimum}" if minimum is not None else ""
        if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) <= maximum:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(dotted, f"must be an integer{bound}, got {show(value)}", node, name)
        if minimum is not None and value < minimum:
            self.fail(dotted, f"must be an integer{bound}, got {show(value)}", node, name)
        if value > maximum:
            self.fail(dotted, f"must be an integer <= {maximum}, got {show(value)}", node, name)
        return value

    def number(self, node: Mapping[str, Any], key: str, name: str, default: Any = None, minimum: float | None = None,
               maximum: float = MAX_NUMBER) -> Any:
        """A finite number (a YAML number, never a quoted string, NaN or infinity) in [minimum, maximum]."""
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        bound = f" >= {minimum}" if minimum is not None else ""
        if isinstance(value, Scientific):  # 1e12 unquoted: a number in YAML 1.2
            value = float(value.replace("_", ""))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(dotted, f"must be a number{bound}, got {show(value)}", node, name)
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(dotted, f"must be a finite number{bound}, got {show(value)}", node, name)
        if minimum is not None and value < minimum:
            self.fail(dotted, f"must be a number{bound}, got {show(value)}", node, name)
        if value > maximum:
            self.fail(dotted, f"must be a number <= {maximum:g}, got {show(value)}", node, name)
        return value

    def boolean(self, node: Mapping[str, Any], key: str, name: str, default: Any = None) -> Any:
        value = node.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            dotted = f"{key}.{name}" if key else name
            self.fail(dotted, f"must be true or false, got {show(value)}", node, name)
        return value

    def choice(self, node: Mapping[str, Any], key: str, name: str, choices: Iterable[str], default: Any = None) -> Any:
        """One of *choices* (a string), with the closest one suggested on a typo."""
        value = node.get(name, default)
        allowed = list(choices)
        if value is not None and (not isinstance(value, str) or value not in allowed):
            close = difflib.get_close_matches(value, allowed, n=1) if isinstance(value, str) and len(value) < 100 \
                else []
            hint = f"; did you mean {close[0]!r}?" if close else ""
            dotted = f"{key}.{name}" if key else name
            self.fail(dotted, f"must be one of: {', '.join(allowed)}; got {show(value)}{hint}", node, name)
        return value

    def string_list(self, node: Mapping[str, Any], key: str, name: str, default: Any = None) -> Any:
        value = node.get(name, default)
        if value is None:
            return default
        dotted = f"{key}.{name}" if key else name
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
            self.fail(dotted, f"must be a list of strings, got {show(value)}", node, name)
        if len(value) > MAX_LIST:
            self.fail(dotted, f"has {len(value)} items; at most {MAX_LIST} are allowed", node, name)
        out = [str(v) for v in value]
        for i, v in enumerate(out):
            self.text(v, f"{dotted}[{i}]", node, name)
        return out

    def string_map(self, node: Mapping[str, Any], key: str, name: str) -> dict[str, str]:
        value = node.get(name)
        dotted = f"{key}.{name}" if key else name
        if value is None:
            return {}
        value = self.mapping(value, dotted, node, name)
        if len(value) > MAX_LIST:
            self.fail(dotted, f"has {len(value)} entries; at most {MAX_LIST} are allowed", node, name)
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, bool):
                v = "1" if v else "0"
            if not isinstance(v, (str, int, float)) or (isinstance(v, float) and not math.isfinite(v)):
                self.fail(f"{dotted}.{k}", f"must be a string, got {show(v)}", value, k)
            out[str(k)] = self.text(str(v), f"{dotted}.{k}", value, k)
        return out
