"""What the scheduler (or the executor) says about the runs a collect may have to re-read: SLURM's
accounting for the SLURM runs (the queue for those sacct does not know, or when it cannot answer),
asked through the command's client (``harness.slurm.client``), and the process id for local runs. A
collect asks it on a thread of its own (:func:`ask`) while it reads the job dirs whose files changed."""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from harness.contract.jobstate import FINAL_STATES
from harness.slurm.client import Slurm
from harness.slurm.sacct import JobAccounting, Queued

from .discover import Attempt, spec_exec
from .outcome import Sched

Recorded = tuple[bool, list[str], dict[str, dict[str, Any]]]  # manifests changed, problems, runs as recorded


@dataclass
class Answer:
    """The scheduler's word on the runs that may have changed, with what the manifests recorded."""

    manifests_changed: bool
    problems: list[str]  # manifest lines that could not be recorded
    index: dict[str, dict[str, Any]]  # run_id -> the runs row as recorded
    todo: list[tuple[Attempt, dict[str, Any]]]  # runs that may have changed, with what is known of their job
    scheds: dict[str, Sched]  # run_id -> the scheduler's word
    sacct: str | None  # "ok", why sacct could not answer, or None when not asked


def local_alive(job_id: str | None) -> bool | None:
    """Whether the local executor's job (submitit's local job id is its process id) still runs."""
    try:
        pid = int(str(job_id))
    except (TypeError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def states(todo: list[tuple[Attempt, dict[str, Any]]], slurm: Slurm) -> tuple[dict[str, Sched], str | None]:
    """SLURM's accounting (the queue as a fallback) for the SLURM runs of *todo*; the process of each
    local one. Also sacct's status ("ok" or why it could not answer; None when not asked)."""
    out: dict[str, Sched] = {}
    jobs = {a.run_id: str(info["job_id"]) for a, info in todo
            if info.get("executor") == "slurm" and info.get("job_id")}
    acct: dict[str, JobAccounting] | None = None
    queue: dict[str, Queued] | None = None
    status = None
    if jobs:
        acct, why = slurm.accounting(jobs.values())
        status = why or "ok"
        missing = [j for j in jobs.values() if acct is None or j not in acct]
        if missing:
            queue = slurm.queue()
    for a, info in todo:
        if a.run_id in jobs:
            jid = jobs[a.run_id]
            if acct is not None and jid in acct:
                out[a.run_id] = Sched("sacct", acct[jid].state, acct[jid])
            elif queue is not None and jid in queue:
                out[a.run_id] = Sched("executor", queue[jid].state)
            elif queue is not None:
                out[a.run_id] = Sched("files", None, gone=True)
            else:
                out[a.run_id] = Sched("files")
        elif info.get("executor") == "local":
            alive = local_alive(info.get("job_id"))
            out[a.run_id] = Sched("executor", "RUNNING" if alive else None, gone=alive is False)
        else:
            out[a.run_id] = Sched("files")
    return out, status


def ask(recorded: Future[Recorded], attempts: dict[str, Attempt], slurm: Slurm | None) -> Answer:
    """Once the manifests are recorded (*recorded*, from the database worker): which runs may have changed
    (new, files changed, or a state that can still change), and the scheduler's word on each, asked
    through *slurm* (the command's client; a client of its own when collect runs as a command by itself)."""
    manifests_changed, problems, index = recorded.result()
    todo: list[tuple[Attempt, dict[str, Any]]] = []
    for a in attempts.values():
        info = dict(index.get(a.run_id) or {})
        if not info.get("executor") or not info.get("job_id"):
            sub = spec_exec(a)
            info["executor"] = info.get("executor") or sub.get("executor")
            info["job_id"] = info.get("job_id") or sub.get("job_id")
        if info.get("fingerprint") != a.fingerprint or info.get("state") not in FINAL_STATES:
            todo.append((a, info))
    scheds, status = states(todo, slurm or Slurm())
    return Answer(manifests_changed, problems, index, todo, scheds, status)


__all__ = ["Answer", "ask", "local_alive", "states"]
