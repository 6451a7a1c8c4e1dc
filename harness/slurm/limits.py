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
from dataclasses import dataclass, field, replace

DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's default when scontrol does not say
# "MaxSubmitJobs=15(3)", "GrpSubmitJobs=N(0)" (N: no limit), "MaxSubmitJobsPU=20(4)"; an empty value is no limit.
_LIMIT = re.compile(r"\b(MaxSubmitJobs(?:PU|PA|PerUser|PerAccount)?|GrpSubmitJobs)=(\d+|N)?(?:\((\d+)\))?")
_FIELD = re.compile(r"(\S+?)=(\S*)")


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


@dataclass
class Record:
    """One record of ``scontrol show assoc_mgr``: an association or a QOS, its fields (``MaxWallPJ`` -> ``5``),
    and a QOS's per-user limits (user name or uid -> fields)."""

    kind: str  # "association" or "qos"
    fields: dict[str, str]
    users: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def account(self) -> str:
        return self.fields.get("Account", "")

    @property
    def user(self) -> str:
        return self.fields.get("UserName", "").split("(")[0]

    @property
    def name(self) -> str:
        return self.fields.get("QOS", "").split("(")[0]

    @property
    def where(self) -> str:
        """How a message names it: ``association root/alice``, ``account root``, ``QOS normal``."""
        if self.kind == "qos":
            return f"QOS {self.name}"
        return f"association {self.account}/{self.user}" if self.user else f"account {self.account}"


def parse_records(text: str) -> list[Record]:
    """``scontrol show assoc_mgr flags=assoc,qos`` -> its association and QOS records. A QOS's user limits are
    listed under ``User Limits`` as the user (name or uid) on a line of its own with the limits below it, or (older
    releases) as ``[alice] MaxJobsPU=...`` on one line."""
    records: list[Record] = []
    section = ""
    sub = ""  # "users" or "accounts" inside a QOS record
    ident = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line in ("Association Records", "QOS Records"):
            section, sub = line.split()[0].lower(), ""
            continue
        if section == "association" and line.startswith("ClusterName="):
            records.append(Record("association", dict(_FIELD.findall(line))))
            continue
        if section == "qos" and line.startswith("QOS="):
            records.append(Record("qos", dict(_FIELD.findall(line))))
            sub = ""
            continue
        if not records or not line or records[-1].kind != section:
            continue
        rec = records[-1]
        if section == "qos" and line in ("User Limits", "Account Limits"):
            sub, ident = ("users" if line == "User Limits" else "accounts"), ""
            continue
        if sub == "accounts":
            continue
        if sub == "users":
            m = re.match(r"^\[([^\]]*)\]\s*(.*)$", line)
            if m:
                ident, line = m.group(1), m.group(2)
            elif "=" not in line:
                ident = line
                continue
            if ident:
                rec.users.setdefault(ident, {}).update(_FIELD.findall(line))
            continue
        rec.fields.update(_FIELD.findall(line))
    return records


def _submit_limits(fields: dict[str, str], where: str) -> list[tuple[int, int, str]]:
    out = []
    for key, value in fields.items():
        m = _LIMIT.fullmatch(f"{key}={value}")
        if not m or not m.group(2) or m.group(2) == "N":
            continue
        limit, used = int(m.group(2)), int(m.group(3) or 0)
        out.append((max(0, limit - used), limit, f"{where} {m.group(1)}={limit}({used})"))
    return out


def parse_assoc_mgr(text: str, user: str, qos: set[str] | None = None,
                    uid: int | None = None) -> tuple[int | None, int | None, str]:
    """``scontrol show assoc_mgr users=USER flags=assoc,qos`` -> (free, limit, source): the fewest jobs the user
    may still submit under any submit limit that applies (the user's associations and the accounts they list;
    the QOS named in *qos*, or every QOS when None, and its per-user limits for *user*, named or by *uid*), the
    limit that binds, and where it was found. (None, None, "") when no limit is set."""
    found: list[tuple[int, int, str]] = []
    me = {user} | ({str(uid)} if uid is not None else set())
    for rec in parse_records(text):
        if rec.kind == "association":
            if rec.user and rec.user != user:
                continue
            found += _submit_limits(rec.fields, rec.where)
        elif qos is None or rec.name in qos:
            found += _submit_limits(rec.fields, rec.where)
            for ident, fields in rec.users.items():
                if ident in me:
                    found += _submit_limits(fields, rec.where)
    return min(found, key=lambda f: f[0]) if found else (None, None, "")


@dataclass(frozen=True)
class JobLimit:
    """One per-job limit of an association or a QOS: a job that asks for more is never started (it pends with
    *reason*, or sbatch refuses it where the QOS says ``DenyOnLimit``)."""

    tres: str  # "wall" (minutes), "node", "cpu", "gres/gpu"
    most: int
    where: str  # "association root/alice", "account physics", "QOS normal"
    name: str  # as SLURM prints it: "MaxWallPJ=300", "MaxTRESPJ node=2"
    reason: str  # the pending reason SLURM gives a job over it
    partition: bool = False  # set by the QOS of SLURM's partition (which binds every job in it)


# per-job limits SLURM keeps a job pending for, by TRES: (association's reason, QOS's reason)
_JOB_REASONS = {
    "wall": ("AssocMaxWallDurationPerJobLimit", "QOSMaxWallDurationPerJobLimit"),
    "node": ("AssocMaxNodesPerJobLimit", "QOSMaxNodePerJobLimit"),
    "cpu": ("AssocMaxCpuPerJobLimit", "QOSMaxCpuPerJobLimit"),
    "gres/gpu": ("AssocMaxGRESPerJob", "QOSMaxGRESPerJob"),
}


def _job_limits(rec: Record) -> dict[str, JobLimit]:
    out: dict[str, JobLimit] = {}
    reason = 0 if rec.kind == "association" else 1
    wall = rec.fields.get("MaxWallPJ", "").split("(")[0]
    if wall.isdigit():
        out["wall"] = JobLimit("wall", int(wall), rec.where, f"MaxWallPJ={wall}", _JOB_REASONS["wall"][reason])
    for tres, value in re.findall(r"([\w/]+)=(\d+)", rec.fields.get("MaxTRESPJ", "")):
        if tres in _JOB_REASONS:
            out[tres] = JobLimit(tres, int(value), rec.where, f"MaxTRESPJ {tres}={value}", _JOB_REASONS[tres][reason])
    return out


def job_association(records: list[Record], user: str, account: str | None = None,
                    partition: str | None = None) -> Record | None:
    """The association a job of *user* runs under: *account*'s (else the user's default, ``DefAssoc=Yes``), the
    one of *partition* where the user has one of its own, else the plain one; None when none is listed."""
    mine = [r for r in records if r.kind == "association" and r.user == user]
    acct = account or next((r.account for r in mine if r.fields.get("DefAssoc") == "Yes"), None)
    own = [r for r in mine if r.account == acct]
    return next((r for r in own if partition and r.fields.get("Partition") == partition), None) or next(
        (r for r in own if not r.fields.get("Partition")), None)


def parse_job_limits(text: str, user: str, *, account: str | None = None, partition: str | None = None,
                     qos: str | None = None, partition_qos: str | None = None,
                     over_partition_qos: bool = False) -> list[JobLimit]:
    """:func:`job_limits` of ``scontrol show assoc_mgr users=USER flags=assoc,qos``."""
    return job_limits(parse_records(text), user, account=account, partition=partition, qos=qos,
                      partition_qos=partition_qos, over_partition_qos=over_partition_qos)


def qos_limits(records: list[Record], name: str | None) -> dict[str, JobLimit]:
    """The per-job limits the QOS *name* sets, by TRES ({} for None or a QOS the records do not list)."""
    out: dict[str, JobLimit] = {}
    for rec in records:
        if rec.kind == "qos" and name and rec.name == name:
            out.update(_job_limits(rec))
    return out


def job_limits(records: list[Record], user: str, *, account: str | None = None, partition: str | None = None,
               qos: str | None = None, partition_qos: str | None = None,
               over_partition_qos: bool = False) -> list[JobLimit]:
    """The per-job limits a job of *user* meets, from the controller's *records* (:func:`parse_records`):
    its association's (the one of *account*, else the user's default, ``DefAssoc=Yes``; for *partition* where
    the user has one of its own), each limit the association leaves unset taken from the nearest account above
    it that sets it; then *qos*'s, which take the place of the association's where set (a QOS's limits come
    first in SLURM); then the QOS SLURM's partition gives its jobs (*partition_qos*, its ``QoS=``), whose limits
    come before the job's QOS's, unless that one has the ``OverPartQOS`` flag (*over_partition_qos*). A QOS that is
    not named is not read: which one a job gets by default is not in these records."""
    assoc = job_association(records, user, account, partition)
    part = {t: replace(lim, where=f"partition {partition}'s QOS {partition_qos}" if partition else lim.where,
                       partition=True)
            for t, lim in qos_limits(records, partition_qos).items()}
    if assoc is None:
        return list(part.values())
    limits: dict[str, JobLimit] = {}
    accounts = {r.account: r for r in records if r.kind == "association" and not r.user}
    chain: list[Record] = [assoc]
    seen = set()
    name: str | None = assoc.account
    while name and name in accounts and name not in seen:  # the account, then its parents
        seen.add(name)
        chain.append(accounts[name])
        name = accounts[name].fields.get("ParentAccount") or None
    for rec in chain:
        for tres, lim in _job_limits(rec).items():
            limits.setdefault(tres, lim)
    own = qos_limits(records, qos) if qos != partition_qos else {}
    for layer in ((part, own) if over_partition_qos else (own, part)):  # the last one's limits stand
        limits.update(layer)
    return list(limits.values())


def parse_partition_qos(text: str) -> str | None:
    """``scontrol show partition -o NAME`` -> the QOS the partition gives every job in it (``QoS=``); None where it
    has none (``N/A``)."""
    found = dict(_FIELD.findall(text)).get("QoS")
    return found if found and found not in ("N/A", "(null)") else None


def has_over_part_qos(text: str) -> bool:
    """``sacctmgr -nP show qos NAME format=flags`` -> whether the QOS has the ``OverPartQOS`` flag (its limits then
    come before the partition QOS's)."""
    return "overpartqos" in text.lower()


def default_qos(text: str, partition: str | None = None) -> str | None:
    """The QOS a job gets when it names none, from ``sacctmgr -nP show assoc where user=U account=A
    format=partition,qos,defaultqos`` (the association of *partition* where the user has one, else the plain one):
    its ``DefaultQOS``; else its only allowed QOS; else ``normal`` where allowed (as slurmctld chooses). None when
    the text does not say."""
    rows = [line.split("|") for line in text.splitlines() if line.count("|") >= 2]
    row = next((r for r in rows if partition and r[0] == partition), None) or next((r for r in rows if not r[0]),
                                                                                 None)
    if row is None:
        return None
    allowed = [q for q in row[1].split(",") if q]
    if row[2]:
        return row[2]
    if len(allowed) == 1:
        return allowed[0]
    return "normal" if "normal" in allowed else None


# sbatch's words when a limit refuses a submission (SLURM's reason names and its message texts)
_QUOTA_WORDS = ("MaxSubmitJob", "SubmitJobLimit", "job submit limit", "accounting/QOS policy",
                "QOSMaxSubmitJob", "AssocMaxSubmitJob", "AssocGrpSubmitJob", "QOSGrpSubmitJob")
# a per-job limit's reason in sbatch's refusal ("sbatch: error: QOSMaxWallDurationPerJobLimit"), which comes with
# the same "violates accounting/QOS policy" words as a full quota
_PER_JOB_WORDS = ("PerJob", "MaxWallDuration")
_ARRAY_WORDS = ("Invalid job array specification", "MaxArraySize")
_BUSY_WORDS = ("Resource temporarily unavailable", "MaxJobCount", "temporarily unable to accept job")


def refusal_kind(message: str) -> str | None:
    """What a refused sbatch says: ``quota`` (a submit limit), ``array`` (the array is too large),
    ``busy`` (the controller holds as many jobs as it may), or None (anything else, a per-job limit included: a
    real error)."""
    low = message.lower()
    if any(w.lower() in low for w in _PER_JOB_WORDS):
        return None  # a per-job limit (a QOS with DenyOnLimit): no wait for room lets it in
    if any(w.lower() in low for w in _QUOTA_WORDS):
        return "quota"
    if any(w.lower() in low for w in _ARRAY_WORDS):
        return "array"
    if any(w.lower() in low for w in _BUSY_WORDS):
        return "busy"
    return None


__all__ = ["DEFAULT_MAX_ARRAY_SIZE", "JobLimit", "Record", "SubmitLimits", "default_qos", "has_over_part_qos",
           "job_association", "job_limits", "max_array_size", "parse_assoc_mgr", "parse_config", "parse_job_limits",
           "parse_partition_qos", "parse_records", "qos_limits", "refusal_kind"]
