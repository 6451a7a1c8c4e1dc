"""What ``sacct`` and ``squeue`` say, read: the words of each question and the parsers of the answers.

:mod:`harness.slurm.client` asks them; the meaning of each state is :mod:`harness.contract.jobstate`'s.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from harness.contract import jobstate

from .hostlist import expand_hostlist

# JobName last: the one field a user could fill with the '|' that -P puts between fields. ConsumedEnergyRaw:
# joules, when the cluster gathers energy (AcctGatherEnergyType); empty or 0 when it does not.
SACCT_FORMAT = "JobID,State,ExitCode,Elapsed,MaxRSS,NodeList,Start,End,Submit,ConsumedEnergyRaw,JobName"
_FIELDS = SACCT_FORMAT.count(",") + 1
# How long before sbench recorded a submission SLURM may have stamped it: sbatch's own time, and the clocks
# of this host and the controller apart. A record submitted earlier is another job that had the same id.
SUBMIT_SLACK = _dt.timedelta(hours=1)
SQUEUE_FORMAT = "%i|%T|%r|%N|%j"  # job id, state, why it waits, its nodes, its name (last: a name may hold "|")


@dataclass
class StepAccounting:
    step_id: str
    state: str
    exit_code: int | None
    max_rss_mb: float | None
    node_list: str | None


@dataclass
class JobAccounting:
    """One job (or array task) as sacct reports it, its steps folded in."""

    job_id: str
    state: str  # normalised: first word, e.g. 'CANCELLED' for 'CANCELLED by 0'
    state_raw: str
    exit_code: int | None
    exit_signal: int | None
    elapsed_s: float | None
    node_list: str | None
    start: _dt.datetime | None
    end: _dt.datetime | None
    steps: list[StepAccounting] = field(default_factory=list)
    submit: _dt.datetime | None = None  # when SLURM took it (a requeued run: when it went back to the queue)
    name: str | None = None  # its job name (None when the answer did not say)
    ranged: bool = False  # from its array's one record of the tasks still queued (``123_[0-3]``)
    consumed_energy_j: float | None = None  # ConsumedEnergyRaw (None: empty, 0 or unknown: not gathered)

    @property
    def hosts(self) -> list[str]:
        return expand_hostlist(self.node_list)

    @property
    def max_rss_mb(self) -> float | None:
        vals = [s.max_rss_mb for s in self.steps if s.max_rss_mb is not None]
        return max(vals) if vals else None


def parse_elapsed(text: str | None) -> float | None:
    """``[D-]HH:MM:SS``, ``MM:SS`` or ``MM:SS.mmm`` -> seconds."""
    if not text or text in ("INVALID", "UNLIMITED", "Partition_Limit"):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [float(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    h, m, s = parts[-3:]
    return days * 86400 + h * 3600 + m * 60 + s


_RSS = re.compile(r"^([0-9.]+)([KMGTP]?)$")


def parse_rss_mb(text: str | None) -> float | None:
    """sacct's MaxRSS (``1234K``, ``12.5M``, ``2G``; no suffix = bytes) in MiB."""
    if not text:
        return None
    m = _RSS.match(text.strip())
    if not m:
        return None
    scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}[m.group(2)]
    return float(m.group(1)) * scale


def parse_exit(text: str | None) -> tuple[int | None, int | None]:
    if not text or ":" not in text:
        return None, None
    a, b = text.split(":", 1)
    try:
        return int(a), int(b)
    except ValueError:
        return None, None


def parse_time(text: str | None) -> _dt.datetime | None:
    """sacct prints the cluster's local time without a zone; returned as naive UTC."""
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return _dt.datetime.fromisoformat(text).astimezone(_dt.timezone.utc).replace(tzinfo=None)
    except ValueError:
        return None


def parse_energy(text: str | None) -> float | None:
    """sacct's ConsumedEnergyRaw (joules, an integer) -> joules; None when empty, 0 (energy accounting off),
    not a number or SLURM's "no value" (2**64 - 2 and around)."""
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return float(value) if 0 < value < 2**63 else None


def expand_job_ids(job_id: str) -> list[str]:
    """``123_[5-7%2]`` (a pending array's tasks in one record) -> ``['123_5', '123_6', '123_7']``."""
    m = re.match(r"^(\d+)_\[([^\]]*)\]$", job_id)
    if not m:
        return [job_id]
    base, spec = m.group(1), m.group(2).split("%", 1)[0]
    out: list[str] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(f"{base}_{n}" for n in range(int(a), int(b) + 1))
        elif part:
            out.append(f"{base}_{part}")
    return out


class JobKey(NamedTuple):
    """What sbench knows of a job it submitted, to tell its records from those of another job that had
    the same id (ids start again after the controller's state is reset, and on each cluster of a federation)."""

    submitted: _dt.datetime | None = None  # naive UTC: when sbench recorded the submission (after sbatch)
    name: str | None = None  # the job name it submitted it under

    @classmethod
    def of(cls, submitted_at: object, name: object) -> JobKey:
        """From ``submitted.json``'s (or the manifest's) ``submitted_at`` (ISO) and ``job_name``."""
        when = None
        if isinstance(submitted_at, str) and submitted_at:
            try:
                when = _dt.datetime.fromisoformat(submitted_at)
            except ValueError:
                when = None
            if when is not None:
                when = when.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return cls(when, name if isinstance(name, str) and name else None)

    @property
    def since(self) -> _dt.datetime | None:
        """The earliest submit time a record of this job can carry."""
        return None if self.submitted is None else self.submitted - SUBMIT_SLACK


def parse_sacct_records(text: str) -> dict[str, list[JobAccounting]]:
    """Parse ``sacct -P -n -D --format=<SACCT_FORMAT>`` output: every record of each id, in the order listed.

    Job records (``123``, ``123_4``) become :class:`JobAccounting`; step records (``123_4.batch``,
    ``123_4.0``, ``123.extern``) are folded into the record of their job listed last before them (sacct
    lists a record's steps after it; MaxRSS lives on steps). An array's record of its tasks still queued
    (``123_[0-3]``) becomes one ``ranged`` record per task. ConsumedEnergyRaw is the job record's (SLURM's
    figure for the whole job; a step's is part of it). Answers in the older formats parse too: 8 fields
    (no Submit, no JobName) and 10 (no ConsumedEnergyRaw; a line of 11 fields or more is of the current
    format, so an old answer's job name with a '|' in it would be misread).
    """
    records: dict[str, list[JobAccounting]] = {}
    orphans: list[tuple[str, StepAccounting]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < _FIELDS - 1:
            f += [""] * (_FIELDS - 1 - len(f))
        if len(f) == _FIELDS - 1:
            f.insert(9, "")  # the 10-field format: no ConsumedEnergyRaw
        jid, state_raw, exitc, elapsed, rss, nodes, start, end, submit, energy = (x.strip() for x in f[:10])
        name = "|".join(f[10:]).strip() or None
        if "." in jid:
            parent, step = jid.split(".", 1)
            code, _sig = parse_exit(exitc)
            st = StepAccounting(step, jobstate.normalise(state_raw), code, parse_rss_mb(rss), nodes or None)
            own = [r for r in records.get(parent, []) if not r.ranged]
            if own:
                own[-1].steps.append(st)
            else:
                orphans.append((parent, st))
            continue
        code, sig = parse_exit(exitc)
        ranged = "[" in jid
        for one in expand_job_ids(jid):
            records.setdefault(one, []).append(JobAccounting(
                job_id=one, state=jobstate.normalise(state_raw), state_raw=state_raw, exit_code=code,
                exit_signal=sig, elapsed_s=parse_elapsed(elapsed),
                node_list=None if nodes in ("", "None assigned") else nodes,
                start=parse_time(start), end=parse_time(end), submit=parse_time(submit), name=name,
                ranged=ranged, consumed_energy_j=parse_energy(energy)))
    for parent, st in orphans:  # a step listed before any record of its job: the job's last record
        own = [r for r in records.get(parent, []) if not r.ranged]
        if own:
            own[-1].steps.append(st)
    return records


_NEVER = _dt.datetime.min
_NOT_YET = _dt.datetime.max


def _when(rec: JobAccounting) -> tuple[_dt.datetime, _dt.datetime, _dt.datetime]:
    """A record's place in its job's history: submitted, started, ended (not started or not ended: last)."""
    return (rec.submit or _NEVER, rec.start or _NOT_YET, rec.end or _NOT_YET)


def pick(records: Sequence[JobAccounting], key: JobKey | None = None) -> JobAccounting | None:
    """The record of the job *key* describes among *records* (every record sacct gave of one id), or None.

    A record of another name (but an array's record of its queued tasks, matched on time alone), or
    submitted before the job was (less :data:`SUBMIT_SLACK`), is another job's. Of the rest, ordered by
    submit, start and end time: the first is the job's own submission, and a later one is the same job
    only as a requeue, after a record left in one of ``jobstate.REQUEUE_STATES``; the last of that chain is
    the job's state now. A task's own record wins over its array's record of the tasks still queued.
    Without a submit time (older answers) the latest record wins.
    """
    for ranged in (False, True):
        # An array's record of its queued tasks is matched on time alone: cancelled while pending, SLURM
        # may record it under the name 'allocation'.
        mine = [r for r in records if r.ranged == ranged
                and (key is None or key.name is None or r.name is None or r.name == key.name or ranged)
                and (key is None or key.since is None or r.submit is None or r.submit >= key.since)]
        if not mine:
            continue
        order = sorted(range(len(mine)), key=lambda i: (_when(mine[i]), i))
        cur = mine[order[0]]
        if key is None or key.since is None:
            return mine[order[-1]]
        for i in order[1:]:
            if cur.state not in jobstate.REQUEUE_STATES:
                break
            cur = mine[i]
        return cur
    return None


def parse_sacct(text: str, keys: Mapping[str, JobKey] | None = None) -> dict[str, JobAccounting]:
    """Parse sacct's answer (:func:`parse_sacct_records`) into one record per id: :func:`pick`'s, with
    the id's key in *keys* when given."""
    out: dict[str, JobAccounting] = {}
    for jid, recs in parse_sacct_records(text).items():
        rec = pick(recs, (keys or {}).get(jid))
        if rec is not None:
            out[jid] = rec
    return out


def sacct_time(when: _dt.datetime) -> str:
    """A naive UTC time as sacct reads it: the local time of this host (sacct's own zone)."""
    return when.replace(tzinfo=_dt.timezone.utc).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def sacct_argv(job_ids: Sequence[str], since: _dt.datetime | None = None) -> list[str]:
    """The accounting question for *job_ids*: every record (steps included, they hold MaxRSS; ``-D``: every
    run of a requeued job, and every job that had the id) of the jobs seen after *since* (naive UTC; None:
    since accounting began, sacct's default with ``-j``)."""
    return ["sacct", "-j", ",".join(job_ids), "-P", "-n", "-D",
            *(["-S", sacct_time(since)] if since is not None else []), f"--format={SACCT_FORMAT}"]


def squeue_argv() -> list[str]:
    """The queue question: every job it holds, one line per array task, in every partition (``-a``: hidden
    ones and those of other groups too, so that a job missing from the answer has left the queue)."""
    return ["squeue", "-a", "-h", "-r", "-o", SQUEUE_FORMAT]


class Queued(NamedTuple):
    """One job as the queue shows it."""

    state: str  # normalised
    nodes: str | None
    reason: str | None  # why it waits (squeue's %r), as SLURM words it
    name: str | None = None  # the job's name (squeue's %j)

    def belongs(self, key: JobKey | None) -> bool:
        """Whether this queued job can be the one *key* describes: a job of the same id but another name is
        a stranger's (ids start again after the controller's state is reset)."""
        return key is None or key.name is None or self.name is None or self.name == key.name

    @property
    def word(self) -> str:
        """What status shows: the state, and for a pending job why it waits."""
        return self.state + (f" ({self.reason})" if self.state == "PENDING" and self.reason else "")


def parse_squeue(text: str) -> dict[str, Queued]:
    """``squeue -h -o '%i|%T|%r|%N|%j'`` -> {job id: :class:`Queued`}; a pending array's grouped record is
    one entry per task. An answer without the name field (older format) parses too."""
    out: dict[str, Queued] = {}
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) < 2 or not f[0]:
            continue
        reason = f[2].strip() if len(f) > 2 and f[2].strip() else None
        nodes = f[3].strip() if len(f) > 3 and f[3].strip() else None
        name = "|".join(f[4:]).strip() or None
        for one in expand_job_ids(f[0].strip()):
            out[one] = Queued(jobstate.normalise(f[1]), nodes, reason, name)
    return out
