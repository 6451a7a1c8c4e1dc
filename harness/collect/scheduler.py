"""What the scheduler (or the executor) says about the runs a collect may have to re-read: SLURM's
accounting for the SLURM runs (the queue for those sacct does not know, or when it cannot answer),
asked through the command's client (``harness.slurm.client``), and the process id for local runs."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from harness.contract.jobstate import FINAL_STATES
from harness.slurm.client import Slurm
from harness.slurm.sacct import JobAccounting, Queued

from .discover import Attempt, spec_exec
from .outcome import Sched


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


def unsettled(attempts: Iterable[Attempt],
              index: Mapping[str, Mapping[str, Any]]) -> list[tuple[Attempt, dict[str, Any]]]:
    """The runs whose outcome may have changed since *index* (the runs as recorded): new, files changed, or a
    scheduler state that can still change; each with what is known of its job (executor, job id, state)."""
    todo: list[tuple[Attempt, dict[str, Any]]] = []
    for a in attempts:
        info = dict(index.get(a.run_id) or {})
        if not info.get("executor") or not info.get("job_id"):
            sub = spec_exec(a)
            info["executor"] = info.get("executor") or sub.get("executor")
            info["job_id"] = info.get("job_id") or sub.get("job_id")
        if info.get("fingerprint") != a.fingerprint or info.get("state") not in FINAL_STATES:
            todo.append((a, info))
    return todo


__all__ = ["local_alive", "states", "unsettled"]
