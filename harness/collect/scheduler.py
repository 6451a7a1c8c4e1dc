"""What the scheduler (or the executor) says about the runs a collect may have to re-read: SLURM's
accounting for the SLURM runs (the queue for those sacct does not know, or when it cannot answer),
asked through the command's client (``harness.slurm.client``), and for local runs the local executor's
word (``harness.slurm.localjob``: a verified process, its queue, what ``submitted.json`` recorded)."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import Any

from harness.contract.jobstate import FINAL_STATES
from harness.contract.paths import JobPaths
from harness.contract.records import read_submitted
from harness.slurm import localjob
from harness.slurm.client import Slurm
from harness.slurm.held import held_states
from harness.slurm.sacct import JobAccounting, JobKey, Queued

from .discover import Attempt, spec_exec
from .outcome import Sched


def local_sched(job_dir: Any) -> Sched:
    """The local executor's word on one job (``harness.slurm.localjob.job_state``). Not started, cancelled
    before it started, running or queued: a state that dictates or defers the outcome. Ended, or gone without
    recording an end: the files decide."""
    if job_dir is None:
        return Sched("files")
    state = localjob.job_state(job_dir)
    if state is None:
        return Sched("files")
    if state == "NOT_STARTED":
        return Sched("executor", state, note=read_submitted(job_dir).get("not_started_reason"))
    if state in ("RUNNING", "PENDING", "UNKNOWN"):
        return Sched("executor", state)
    if state == "CANCELLED" and not read_submitted(job_dir).get("ended_at"):
        return Sched("executor", "CANCELLED")  # cancelled before it started
    return Sched("executor", None, gone=True)


_EPOCH = _dt.datetime.min


def job_key(a: Attempt) -> JobKey:
    """What sbench recorded of a run's SLURM job, to tell its accounting from another job's with the same id:
    its name and submit time, from ``submitted.json``, else the manifest's attempt line."""
    for doc in (spec_exec(a), a.manifest or {}):
        if doc.get("submitted_at") or doc.get("job_name"):
            return JobKey.of(doc.get("submitted_at"), doc.get("job_name"))
    return JobKey()


def states(todo: list[tuple[Attempt, dict[str, Any]]], slurm: Slurm) -> tuple[dict[str, Sched], str | None]:
    """SLURM's accounting (the queue as a fallback) for the SLURM runs of *todo*; the process of each
    local one. Also sacct's status ("ok" or why it could not answer; None when not asked)."""
    out: dict[str, Sched] = {}
    jobs = {a.run_id: str(info["job_id"]) for a, info in todo
            if info.get("executor") == "slurm" and info.get("job_id")}
    keys = {a.run_id: job_key(a) for a, _info in todo if a.run_id in jobs}
    acct: dict[str, JobAccounting] | None = None
    queue: dict[str, Queued] | None = None
    status = None
    if jobs:
        # Asked from the earliest submission of each id (two attempts may have had one id); each run then
        # takes the record of its own job.
        ask: dict[str, JobKey] = {}
        for rid, jid in jobs.items():
            if jid not in ask or (ask[jid].since or _EPOCH) > (keys[rid].since or _EPOCH):
                ask[jid] = keys[rid]
        found, why = slurm.accounting(jobs.values(), ask)
        status = why or "ok"
        if found is not None:
            acct = {rid: rec for rid, jid in jobs.items() if (rec := slurm.record(jid, keys[rid])) is not None}
        missing = [rid for rid in jobs if acct is None or rid not in acct]
        if missing:
            queue = slurm.queue()
    # attempts sbench held back (no job id): still held, or never to be submitted (harness.slurm.held)
    held = held_states([a.job_dir for a, info in todo if info.get("executor") == "slurm" and not info.get("job_id")
                        and a.job_dir is not None], slurm)
    for a, info in todo:
        if a.job_dir is not None and str(a.job_dir) in held and a.run_id not in jobs:
            state, why = held[str(a.job_dir)]
            out[a.run_id] = Sched("executor", state, note=why)
            continue
        if a.run_id in jobs:
            jid = jobs[a.run_id]
            if acct is not None and a.run_id in acct:
                out[a.run_id] = Sched("sacct", acct[a.run_id].state, acct[a.run_id])
            elif queue is not None and jid in queue and queue[jid].belongs(keys[a.run_id]):
                out[a.run_id] = Sched("executor", queue[jid].state)
            elif queue is not None:
                out[a.run_id] = Sched("files", None, gone=True)
            else:
                out[a.run_id] = Sched("files")
        elif info.get("executor") == "local":
            out[a.run_id] = local_sched(a.job_dir)
        elif info.get("executor") == "slurm" and a.job_dir is not None and not JobPaths(a.job_dir).stage_hosts():
            # rendered, and its submit stopped before sbatch gave it a job id: it never ran
            why = read_submitted(a.job_dir).get("not_started_reason")
            out[a.run_id] = Sched("executor", "NOT_STARTED", note=why)
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


__all__ = ["job_key", "local_sched", "states", "unsettled"]
