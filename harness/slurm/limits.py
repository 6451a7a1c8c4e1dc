"""The cluster's limits on what one user may submit, as SLURM states them.

- ``MaxArraySize`` (``scontrol show config``): an array's task index must be below it, so one array holds at
  most that many tasks (SLURM's default is 1001; many sites set it lower).
- Submit quotas: ``MaxSubmitJobs`` of the user's association and of the accounts above it, ``GrpSubmitJobs``
  of those, and a QOS's ``MaxSubmitJobsPU`` / ``GrpSubmitJobs``. Each array task counts as one job. They
  are read from the controller's own view (``scontrol show assoc_mgr``), which gives each limit with its
  current use, ``MaxSubmitJobs=15(3)``: 12 more may be submitted now.

A limit that cannot be read (no accounting, a site that hides it) is unknown, not zero: the submitter then
learns it from sbatch's refusal (:func:`refusal_kind`) and holds the rest back. Nothing here runs a
command; :mod:`harness.slurm.client` asks the questions and hands the answers to these parsers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's default when scontrol does not say
# "MaxSubmitJobs=15(3)", "GrpSubmitJobs=N(0)" (N: no limit), "MaxSubmitJobsPU=20(4)"; an empty value is no limit.
_LIMIT = re.compile(r"\b(MaxSubmitJobs(?:PU|PA|PerUser|PerAccount)?|GrpSubmitJobs)=(\d+|N)?(?:\((\d+)\))?")
_ASSOC = re.compile(r"^ClusterName=\S*\s+Account=(\S*)\s+UserName=(\S*)")
_QOS = re.compile(r"^QOS=([^(\s]+)")


@dataclass(frozen=True)
class SubmitLimits:
    """What one submission may hold: tasks per array, and jobs the user may still add to the queue now."""

    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE
    free: int | None = None  # jobs that may still be submitted now (None: no limit known)
    limit: int | None = None  # the tightest submit limit found (None: none)
    source: str = ""  # which limit binds, as SLURM names it ("association root/alice MaxSubmitJobs=15(3)")

    def describe(self) -> str:
        quota = f"{self.free} more job(s) now ({self.source})" if self.free is not None else "no submit limit known"
        return f"arrays of at most {self.max_array_size} task(s); {quota}"


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {name: value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() and " " not in name.strip():
            out[name.strip()] = value.strip()
    return out


def max_array_size(config: dict[str, str]) -> int:
    """Tasks one array may hold: ``MaxArraySize`` (indices 0 .. MaxArraySize-1)."""
    try:
        return max(1, int(config.get("MaxArraySize", "").split()[0]))
    except (ValueError, IndexError):
        return DEFAULT_MAX_ARRAY_SIZE


def parse_assoc_mgr(text: str, user: str, qos: set[str] | None = None) -> tuple[int | None, int | None, str]:
    """``scontrol show assoc_mgr users=USER flags=assoc,qos`` -> (free, limit, source): the fewest jobs the user
    may still submit under any submit limit that applies (the user's associations and the accounts they list;
    the QOS named in *qos*, or every QOS when None, and its per-user limits for *user*), the limit that binds,
    and where it was found. (None, None, "") when no limit is set."""
    best: tuple[int, int, str] | None = None
    where = ""
    section = ""
    in_users = False
    for raw in text.splitlines():
        line = raw.strip()
        if line in ("Association Records", "QOS Records"):
            section, where, in_users = line.split()[0].lower(), "", False
            continue
        m = _ASSOC.match(line)
        if m:
            account, name = m.group(1), m.group(2).split("(")[0]
            where = f"association {account}/{name}" if name == user else (
                f"account {account}" if not name else "")
            continue
        m = _QOS.match(line)
        if m and section == "qos":
            where = f"QOS {m.group(1)}" if qos is None or m.group(1) in qos else ""
            in_users = False
            continue
        if section == "qos" and line in ("User Limits", "Account Limits"):
            in_users = line == "User Limits"
            continue
        if not where:
            continue
        if section == "qos" and in_users and line.startswith("["):
            # "[alice] MaxJobsPU=N(0) ... MaxSubmitJobsPU=20(4)": only this user's line
            if not line.startswith(f"[{user}]"):
                continue
        for lm in _LIMIT.finditer(line):
            value, used = lm.group(2), lm.group(3)
            if not value or value == "N":
                continue
            limit, n_used = int(value), int(used or 0)
            free = max(0, limit - n_used)
            if best is None or free < best[0]:
                best = (free, limit, f"{where} {lm.group(1)}={limit}({n_used})")
    return (best[0], best[1], best[2]) if best is not None else (None, None, "")


# sbatch's words when a limit refuses a submission (SLURM's reason names and its message texts)
_QUOTA_WORDS = ("MaxSubmitJob", "SubmitJobLimit", "job submit limit", "accounting/QOS policy",
                "QOSMaxSubmitJob", "AssocMaxSubmitJob", "AssocGrpSubmitJob", "QOSGrpSubmitJob")
_ARRAY_WORDS = ("Invalid job array specification", "MaxArraySize")
_BUSY_WORDS = ("Resource temporarily unavailable", "MaxJobCount", "temporarily unable to accept job")


def refusal_kind(message: str) -> str | None:
    """What a refused sbatch says: ``quota`` (a submit limit), ``array`` (the array is too large),
    ``busy`` (the controller holds as many jobs as it may), or None (anything else: a real error)."""
    low = message.lower()
    if any(w.lower() in low for w in _QUOTA_WORDS):
        return "quota"
    if any(w.lower() in low for w in _ARRAY_WORDS):
        return "array"
    if any(w.lower() in low for w in _BUSY_WORDS):
        return "busy"
    return None


__all__ = ["DEFAULT_MAX_ARRAY_SIZE", "SubmitLimits", "max_array_size", "parse_assoc_mgr", "parse_config",
           "refusal_kind"]
