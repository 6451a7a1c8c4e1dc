"""SLURM submission: job arrays per resource shape, within the cluster's limits (``harness.campaign.executors.feed``),
submitted through the scheduler client.

Each array task runs one point's own ``job.sbatch`` (the file ``render`` wrote), so what was rendered
is exactly what runs; the array wrapper (``harness.build.sbatch.array_sbatch``) only adds ``--array``
and picks the job directory for ``$SLURM_ARRAY_TASK_ID``. The client (``harness.slurm.client``)
submits through submitit and answers what the jobs' states are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.build.jobspec import JobSpec
from harness.campaign.prepare import live_prepare_job, record_prepare_job, submit_prepare_job
from harness.cluster.fit import ClusterFit, cluster_fit
from harness.contract import jobstate
from harness.contract.poll import poll_until
from harness.contract.records import read_submitted
from harness.slurm.client import Slurm
from harness.slurm.held import held_states
from harness.slurm.sacct import JobKey
from harness.spec.inventory import Inventory
from harness.spec.plan import PlannedPoint
from harness.spec.sweep import Sweep

from . import feed
from .base import SubmitOptions, Submitted
from .pack import make_packs

# (first, cap) of the poller's pauses while it waits, in seconds (harness.contract.poll): each look asks SLURM
WAIT_POLL_S = (0.5, 60.0)


def group_by_shape(specs: list[JobSpec]) -> list[list[JobSpec]]:
    groups: dict[tuple, list[JobSpec]] = {}
    for s in specs:
        groups.setdefault(s.shape(), []).append(s)
    return list(groups.values())


class SlurmBackend:
    name = "slurm"
    on_nodes = True

    def __init__(self, slurm: Slurm) -> None:
        self.slurm = slurm
        self.sbatch_calls = 0
        self._keys: dict[str, JobKey] = {}  # job id -> its name and submit time, as submit recorded them

    def check(self, specs: list[JobSpec]) -> None:
        """Nothing beyond what plan and render checked: SLURM places multi-node points itself."""

    def fit(self, inv: Inventory, sweep: Sweep, points: list[PlannedPoint]) -> ClusterFit:
        """The partition as its controller describes it (``harness.cluster.fit``)."""
        return cluster_fit(inv, sweep, points, self.slurm)

    def complete(self, opts: SubmitOptions, sweep: Sweep, inv: Inventory, campaign_dir: Path) -> SubmitOptions:
        """The feeder job's script (what the submit quota holds back, ``feed``) and the command a pack runs after an
        OOM (``pack``)."""
        return dataclasses.replace(opts, feeder_script=feed.feeder_script(sweep, inv, campaign_dir,
                                                                                  opts.feeder_module),
                                   requeue_command=feed.pack_requeue(sweep, inv, campaign_dir))

    def live_prepare_job(self, campaign_dir: Path) -> str | None:
        return live_prepare_job(campaign_dir, self.slurm)

    def prepare_job(self, sweep: Sweep, inv: Inventory, sweep_path: Path, inventory_path: Path | None,
                    model_map: Path | None, campaign_dir: Path) -> str:
        job_id = submit_prepare_job(sweep, inv, sweep_path, inventory_path, model_map, campaign_dir, self.slurm)
        record_prepare_job(campaign_dir, job_id)
        return job_id

    def feed_summary(self, campaign_dir: Path) -> dict[str, Any]:
        """What the feeder job submits in waves; a feeding that stopped (its feeder job gone) starts again here."""
        return feed.feed_summary(self.slurm, campaign_dir)

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]:
        """One array per resource shape, split to fit ``MaxArraySize``, within the submit quota; what does not
        fit is held back for the campaign's feeder job (``harness.campaign.executors.feed``). With ``slurm.pack``, the
        points that pack together (``harness.campaign.executors.pack``) are one array task each pack."""
        packs = make_packs(specs, opts.pack, opts.pack_time_limit)
        alone = [p[0] for p in packs if len(p) == 1]
        out, calls = feed.start(self.slurm, campaign_dir, specs[0].campaign if specs else "", specs,
                                group_by_shape(alone), opts, [p for p in packs if len(p) > 1])
        self.sbatch_calls += calls
        return out

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None:
        """Until every attempt is over, those sbench held back too: each poll reads the job id the feeder
        gave a held one; one that nothing will submit any more is over."""
        # each attempt: its job dir (None when only its job id is known) and its job id (None while held back)
        ids: list[tuple[str | None, str | None]] = [(s.spec.job_dir if s.spec is not None else None, s.job_id)
                                                    for s in submitted]
        self._learn([{"job_id": s.job_id, **s.extra} for s in submitted])
        finished: dict[str, str] = {}  # a job over stays over: asked about once

        def over() -> int:
            self.slurm.forget()  # each poll asks afresh: the states move while it waits
            for k, (jd, jid) in enumerate(ids):
                if not jid and jd:  # held back: the feeder writes its job id, name and submit time there
                    info = read_submitted(jd)
                    if info.get("job_id"):
                        self._learn([info])
                        ids[k] = (jd, str(info["job_id"]))
            states = self._states([j for _jd, j in ids if j and j not in finished])  # gone, no record: done too
            finished.update({j: st for j, st in states.items() if jobstate.is_done(st)})
            states.update(finished)
            for k, (jd, jid) in enumerate(ids):
                # a pack's point that its pack put back in the queue (harness.campaign.executors.pack): its own job now
                if jd and jid and jobstate.is_done(states.get(jid)):
                    info = read_submitted(jd)
                    if info.get("requeued_at") and info.get("job_id") and str(info["job_id"]) != jid:
                        self._learn([info])
                        ids[k] = (jd, str(info["job_id"]))
                        states.update(self._states([str(info["job_id"])]))
            waiting = [jd for jd, j in ids if not j and jd]
            held = held_states(waiting, self.slurm)
            # a job pending for a reason that does not pass by itself is over for a wait (jobstate.stuck)
            done = sum(1 for _jd, j in ids if j and not jobstate.waits(states.get(j)))
            return done + sum(1 for jd in waiting if jd not in held or held[jd][0] != "HELD")

        poll_until(over, len(ids), WAIT_POLL_S, progress)

    def cancel(self, attempts: Sequence[Mapping[str, Any]]) -> list[str]:
        """Stop the feeding of the attempts' campaigns first (nothing held is submitted after this), then
        cancel the jobs; returns the job ids and the held job dirs cancelled."""
        held: list[str] = []
        for cdir in sorted({str(Path(a["job_dir"]).parent) for a in attempts if a.get("job_dir")}):
            held += feed.stop(self.slurm, Path(cdir))
        ids = sorted({str(a["job_id"]) for a in attempts if a.get("job_id")})
        if ids:
            self.slurm.cancel(ids)
        return ids + held

    def live_states(self, attempts: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """Job id -> SLURM state, from squeue for live jobs and sacct for finished ones; ``GONE`` for a job
        neither knows when both answered: it left the scheduler without an accounting record, as an array
        task cancelled while pending does (SLURM drops it from its array's one record of queued tasks).
        An attempt sbench holds back (no job id yet) is keyed by its job dir: ``HELD``, or ``CANCELLED`` /
        ``NOT_STARTED`` once nothing will submit it (``harness.slurm.held``)."""
        self._learn(attempts)
        out = self._states([str(a["job_id"]) for a in attempts if a.get("job_id")])
        waiting = [a["job_dir"] for a in attempts if not a.get("job_id") and a.get("held_back") and a.get("job_dir")]
        out.update({jd: st for jd, (st, _why) in held_states(waiting, self.slurm).items()})
        return out

    def _learn(self, attempts: Sequence[Mapping[str, Any]]) -> None:
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
