"""YAML loading that refuses duplicate keys and remembers line numbers.

PyYAML silently keeps the last of two equal keys; a cluster description where
``gid_index`` appears twice must be an error, not a coin toss.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from harness.contract.errors import InputError

MAX_DOC_BYTES = 1 << 20  # an inventory, sweep or model map larger than 1 MiB is a mistake
MAX_ALIASES = 256  # alias uses (*name) in one document
MAX_NODES = 200_000  # values in one document after aliases are expanded (a "billion laughs" stops here)
MAX_DEPTH = 64  # nesting of mappings and lists


class LineDict(dict):
    """A dict that knows the source line (1-based) of each of its keys."""

    lines: dict[str, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines = {}
        self.start_line = 0


class DuplicateKeyError(Exception):
    def __init__(self, key: str, first: int, second: int, path: list[str]) -> None:
        super().__init__(key)
        self.key, self.first, self.second, self.path = key, first, second, path


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and counts aliases and nesting while it composes."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.aliases = 0
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES} aliases (*name): refusing "
                                                  "a document that expands this much", mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> LineDict:
    """A mapping with line numbers. A key written twice is an error; a key a merge (``<<: *base``) brings in
    may be overridden, as YAML allows: by a key written in the mapping itself, or by an earlier merged map."""
    own = sum(1 for key_node, _ in node.value if key_node.tag != MERGE_TAG)
    loader.flatten_mapping(node)  # the merged pairs come first (the earliest map last), then the mapping's own
    merged = len(node.value) - own
    out = LineDict()
    out.start_line = node.start_mark.line + 1
    from_merge: set[str] = set()
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable or complex key {key!r}", key_node.start_mark
            )
        skey = str(key) if not isinstance(key, str) else key
        line = key_node.start_mark.line + 1
        if skey in out and skey not in from_merge:
            raise DuplicateKeyError(skey, out.lines[skey], line, [])
        if i < merged:
            from_merge.add(skey)
        else:
            from_merge.discard(skey)
        out[skey] = loader.construct_object(value_node, deep=True)
        out.lines[skey] = line
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
class Scientific(str):
    """A plain (unquoted) scalar in scientific notation without PyYAML's dot and signed exponent (``1e12``,
    ``5E-3``): YAML 1.2 reads it as a number, PyYAML (YAML 1.1) as text. It stays text wherever text is
    asked for (an env value, a name), and :meth:`harness.spec.schema.Checker.number` takes it as the number
    it is, so ``max_seconds: 1e12`` is judged as 1e12 seconds, not refused as "not a number"."""


SCIENTIFIC = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
SCIENTIFIC_TAG = "tag:sbench,2025:scientific"
_Loader.add_implicit_resolver(SCIENTIFIC_TAG, SCIENTIFIC, list("-+0123456789."))


def _construct_scientific(loader: _Loader, node: yaml.ScalarNode) -> Scientific:
    return Scientific(loader.construct_scalar(node))


_Loader.add_constructor(SCIENTIFIC_TAG, _construct_scientific)


def _locate_duplicate(text: str, key: str, second_line: int) -> str:
    """Best-effort dotted path of the duplicated key, from indentation."""
    lines = text.splitlines()
    if not (0 < second_line <= len(lines)):
        return key
    target = lines[second_line - 1]
    indent = len(target) - len(target.lstrip())
    parts = [key]
    for raw in reversed(lines[: second_line - 1]):
        stripped = raw.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        ind = len(raw) - len(stripped)
        if ind < indent and ":" in stripped:
            parts.append(stripped.split(":", 1)[0].strip().strip("'\"").lstrip("- "))
            indent = ind
            if ind == 0:
                break
    return ".".join(reversed(parts))


def load_yaml(path: str | Path, error: type[InputError] = InputError, what: str = "file") -> Any:
    """Load one YAML document from *path*; every problem becomes *error* naming the file."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if p.is_dir():
            raise IsADirectoryError(str(p))
        if not p.is_file():
            raise error(f"{p}: is not a regular file; give the path of a YAML {what}")
        if size > MAX_DOC_BYTES:
            raise error(f"{p}: the {what} is {size} bytes; at most {MAX_DOC_BYTES} are allowed")
        with p.open("rb") as fh:
            data = fh.read(MAX_DOC_BYTES + 1)
        if len(data) > MAX_DOC_BYTES:
            raise error(f"{p}: the {what} is larger than {MAX_DOC_BYTES} bytes, the most allowed")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise error(f"{p}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{p}: is a directory, expected a YAML {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{p}: cannot read {what}: {exc}") from None
    return loads_yaml(text, str(p), error)


def _expanded_size(doc: Any) -> int:
    """Values in *doc* counting every alias expansion (shared objects counted once per use); raises
    ``ValueError`` on a recursive alias. Memoised per object, so a 9-level alias bomb costs 9 steps."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(obj: Any) -> int:
        if not isinstance(obj, (dict, list)):
            return 1
        key = id(obj)
        if key in memo:
            return memo[key]
        if key in active:
            raise ValueError("a recursive alias (a value that contains itself)")
        active.add(key)
        items = obj.values() if isinstance(obj, dict) else obj
        n = 1 + sum(size(v) for v in items) + (len(obj) if isinstance(obj, dict) else 0)
        active.discard(key)
        memo[key] = n
        return n

    return size(doc)


def loads_yaml(text: str, source: str, error: type[InputError] = InputError) -> Any:
    if len(text) > MAX_DOC_BYTES:
        raise error(f"{source}: the document is {len(text)} characters; at most {MAX_DOC_BYTES} are allowed")
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
        n = _expanded_size(doc)
        if n > MAX_NODES:
            raise error(f"{source}: the document expands to {n} values (anchors and aliases included); at most "
                        f"{MAX_NODES} are allowed - write the values out or split the file")
        return doc
    except ValueError as exc:  # int() of a huge literal, a recursive alias
        raise error(f"{source}: invalid YAML: {exc}") from None
    except RecursionError:
        raise error(f"{source}: invalid YAML: nested too deeply") from None
    except DuplicateKeyError as dup:
        dotted = _locate_duplicate(text, dup.key, dup.second)
        raise error(
            f"{source}:{dup.second}: duplicate key {dotted!r} (first defined on line {dup.first}); "
            "YAML would silently keep only the last one - remove or rename one of them"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{where}: invalid YAML: {problem}") from None


def line_of(node: Any, key: str) -> int | None:
    if isinstance(node, LineDict):
        return node.lines.get(key)
    return None
