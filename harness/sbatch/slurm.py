"""SLURM submission: one job array per resource shape, submitted through the scheduler client.

Each array task runs one point's own ``job.sbatch`` (the file ``render`` wrote), so what was rendered
is exactly what runs; the array wrapper (``harness.build.sbatch.array_sbatch``) only adds ``--array``
and picks the job directory for ``$SLURM_ARRAY_TASK_ID``. The client (``harness.slurm.client``)
submits through submitit and answers what the jobs' states are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.build.jobspec import JobSpec
from harness.build.sbatch import array_job_name, array_sbatch
from harness.contract import jobstate, safefile
from harness.slurm.client import Slurm
from harness.slurm.sacct import JobKey

from .executors import SubmitOptions, Submitted
from .manifest import now_iso, write_submitted


def group_by_shape(specs: list[JobSpec]) -> list[list[JobSpec]]:
    groups: dict[tuple, list[JobSpec]] = {}
    for s in specs:
        groups.setdefault(s.shape(), []).append(s)
    return list(groups.values())


class SlurmBackend:
    name = "slurm"

    def __init__(self, slurm: Slurm) -> None:
        self.slurm = slurm
        self.sbatch_calls = 0
        self._keys: dict[str, JobKey] = {}  # job id -> its name and submit time, as submit recorded them

    def check(self, specs: list[JobSpec]) -> None:
        """Nothing beyond what plan and render checked: SLURM places multi-node points itself."""

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]:
        folder = campaign_dir / ".submitit"
        logs = campaign_dir / ".slurm"
        logs.mkdir(parents=True, exist_ok=True)
        out: list[Submitted] = []
        for group in group_by_shape(specs):
            if len(group) == 1:
                script = safefile.read_bytes(Path(group[0].job_dir, "job.sbatch"), campaign_dir,
                                             safefile.SMALL_MAX).decode()
                name = group[0].resources.get("job_name")
            else:
                script = array_sbatch(group[0].campaign, group, opts.max_parallel, logs)
                name = array_job_name(group[0].campaign, group)
            job_id = self.slurm.sbatch(script, folder, hold=opts.hold, after=opts.dependency)
            self.sbatch_calls += 1
            stamp = now_iso()
            # The name and the time tell this job's accounting from another job's that had its id.
            known = {"job_name": name, "submitted_at": stamp}
            if len(group) == 1:
                subs = [Submitted(spec=group[0], job_id=job_id, extra=dict(known))]
            else:
                subs = [Submitted(spec=s, job_id=f"{job_id}_{i}", array_job_id=job_id, array_task_id=i,
                                  extra=dict(known)) for i, s in enumerate(group)]
            for sub in subs:
                write_submitted(Path(sub.spec.job_dir), {
                    "executor": "slurm", "job_id": sub.job_id, "array_job_id": sub.array_job_id,
                    "array_task_id": sub.array_task_id, **known, "held": opts.hold})
            out.extend(subs)
        return out

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None:
        ids = [s.job_id for s in submitted if s.job_id]
        self._learn([{"job_id": s.job_id, **s.extra} for s in submitted])
        total = len(ids)
        while True:
            self.slurm.forget()  # each poll asks afresh: the states move while it waits
            states = self._states(ids)  # a task that left without a record is done too (no wait forever)
            done = sum(1 for i in ids if jobstate.is_done(states.get(i)))
            if progress:
                progress(done, total)
            if done >= total:
                return
            time.sleep(2.0)

    def cancel(self, attempts: list[dict[str, Any]]) -> list[str]:
        ids = sorted({str(a["job_id"]) for a in attempts if a.get("job_id")})
        if ids:
            self.slurm.cancel(ids)
        return ids

    def live_states(self, attempts: list[dict[str, Any]]) -> dict[str, str]:
        """Job id -> SLURM state, from squeue for live jobs and sacct for finished ones; ``GONE`` for a job
        neither knows when both answered: it left the scheduler without an accounting record, as an array
        task cancelled while pending does (SLURM drops it from its array's one record of queued tasks)."""
        self._learn(attempts)
        return self._states([str(a["job_id"]) for a in attempts if a.get("job_id")])

    def _learn(self, attempts: list[dict[str, Any]]) -> None:
        """Keep what *attempts* (manifest attempt lines, what submit returned) say of each job: its name and
        when it was submitted, which tell its accounting from another job's that had its id."""
        for a in attempts:
            if a.get("job_id") and (a.get("submitted_at") or a.get("job_name")):
                self._keys.setdefault(str(a["job_id"]), JobKey.of(a.get("submitted_at"), a.get("job_name")))

    def _states(self, ids: list[str]) -> dict[str, str]:
        keys = {j: self._keys[j] for j in ids if j in self._keys}
        states = self.slurm.states(ids, keys)
        unknown = [j for j in ids if j not in states]
        # both answers are remembered by the client: asking again here asks SLURM nothing
        if unknown and self.slurm.queue() is not None and self.slurm.accounting(unknown, keys)[0] is not None:
            states.update({j: "GONE" for j in unknown})
        return states
