"""What ``sacct`` and ``squeue`` say, read: the words of each question and the parsers of the answers.

:mod:`harness.slurm.client` asks them; the meaning of each state is :mod:`harness.contract.jobstate`'s.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from harness.contract import jobstate

from .hostlist import expand_hostlist

SACCT_FORMAT = "JobID,State,ExitCode,Elapsed,MaxRSS,NodeList,Start,End"
SQUEUE_FORMAT = "%i|%T|%r|%N"  # job id, state, why it waits, its nodes


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


def parse_sacct(text: str) -> dict[str, JobAccounting]:
    """Parse ``sacct -P -n --format=JobID,State,ExitCode,Elapsed,MaxRSS,NodeList,Start,End`` output.

    Job records (``123``, ``123_4``) become :class:`JobAccounting`; step records (``123_4.batch``,
    ``123_4.0``, ``123.extern``) are folded into their job (MaxRSS lives on steps). When a job
    appears twice (requeues listed with ``-D``) the last record wins, so a run is never duplicated; a
    task's own record wins over its array's record of the tasks still queued (``123_[0-3]``), which SLURM
    does not narrow once a task has started.
    """
    jobs: dict[str, JobAccounting] = {}
    own: set[str] = set()  # ids with a record of their own (not from an array's range)
    steps: list[tuple[str, StepAccounting]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 8:
            f += [""] * (8 - len(f))
        jid, state_raw, exitc, elapsed, rss, nodes, start, end = (x.strip() for x in f[:8])
        if "." in jid:
            parent, step = jid.split(".", 1)
            code, _sig = parse_exit(exitc)
            steps.append((parent, StepAccounting(step, jobstate.normalise(state_raw), code, parse_rss_mb(rss),
                                                 nodes or None)))
            continue
        code, sig = parse_exit(exitc)
        ranged = "[" in jid
        for one in expand_job_ids(jid):
            if ranged and one in own:
                continue
            if not ranged:
                own.add(one)
            jobs[one] = JobAccounting(
                job_id=one, state=jobstate.normalise(state_raw), state_raw=state_raw, exit_code=code,
                exit_signal=sig, elapsed_s=parse_elapsed(elapsed),
                node_list=None if nodes in ("", "None assigned") else nodes,
                start=parse_time(start), end=parse_time(end))
    for parent, st in steps:
        if parent in jobs:
            jobs[parent].steps.append(st)
    return jobs


def sacct_argv(job_ids: Sequence[str]) -> list[str]:
    """The accounting question for *job_ids*: every record (steps included, they hold MaxRSS)."""
    return ["sacct", "-j", ",".join(job_ids), "-P", "-n", f"--format={SACCT_FORMAT}"]


def squeue_argv() -> list[str]:
    """The queue question: every job it holds, one line per array task."""
    return ["squeue", "-h", "-r", "-o", SQUEUE_FORMAT]


class Queued(NamedTuple):
    """One job as the queue shows it."""

    state: str  # normalised
    nodes: str | None
    reason: str | None  # why it waits (squeue's %r), as SLURM words it

    @property
    def word(self) -> str:
        """What status shows: the state, and for a pending job why it waits."""
        return self.state + (f" ({self.reason})" if self.state == "PENDING" and self.reason else "")


def parse_squeue(text: str) -> dict[str, Queued]:
    """``squeue -h -o '%i|%T|%r|%N'`` -> {job id: :class:`Queued`}; a pending array's grouped record is
    one entry per task."""
    out: dict[str, Queued] = {}
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) < 2 or not f[0]:
            continue
        reason = f[2].strip() if len(f) > 2 and f[2].strip() else None
        nodes = f[3].strip() if len(f) > 3 and f[3].strip() else None
        for one in expand_job_ids(f[0].strip()):
            out[one] = Queued(jobstate.normalise(f[1]), nodes, reason)
    return out
