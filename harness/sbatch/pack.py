"""Several points per allocation: the sweep's ``slurm.pack: N`` (or ``auto``).

**Which points pack together.** Points of one resource shape, model, trainer and dtype (and experiment method,
workload) that train once each (not the stability experiment's trials) share allocations: each pack runs its
points one after another, in ascending batch size, at most N per pack (``auto``: up to :data:`AUTO_MAX`, fewer
when the partition's time limit holds fewer). Each point keeps its own job dir, ``job.sbatch``, node runner,
stages, samples, outcome and measurements; the pack only saves the queue wait, the prolog and the allocation
of every point but the first. Its job's time limit is the sum of its points' (within the partition's).

**What a pack does** (:func:`harness.build.sbatch.pack_lines`): for each of its job dirs, unless ``sbench
cancel`` marked it (``cancelled_at`` in its ``submitted.json``), it runs that job dir's ``job.sbatch`` in the
allocation. When a point's node runner ends ``invalid`` (GPU out of memory, exit status 2), the points still
to run go back to the queue as their own jobs (:func:`requeue`, this module run on the node as
``python -m harness.sbatch.pack``): none is measured on memory a failed step left fragmented. A point that
fails otherwise does not stop the others. The pack job ends 0 once its points ran, so SLURM's word on the job
never overrides a point's own files (:mod:`harness.collect.outcome`).

Each packed job dir's ``submitted.json`` says ``pack: {index, size, job_dirs}``; the attempt lines of the
manifest carry the same (``pack_index``, ``pack_size``) and the pack's job id.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.build.jobspec import JobSpec
from harness.build.sbatch import job_name_of
from harness.build.trainargs import pack_in_one_process
from harness.contract import safefile
from harness.contract.errors import SbenchError, SubmitError
from harness.contract.paths import CampaignPaths, JobPaths
from harness.contract.records import (
    AttemptExtra,
    ManifestLine,
    SubmittedInfo,
    append_manifest,
    attempt_line,
    now_iso,
    read_submitted,
    write_submitted,
)
from harness.slurm.client import Slurm
from harness.spec.schema import slurm_time_minutes
from harness.spec.sweep import PACK_AUTO

from .lock import CampaignLocks, holding_campaign_locks

AUTO_MAX = 8  # points per allocation with slurm.pack: auto
REQUEUE_REASON = "requeued unpacked: an earlier point of its pack ran out of GPU memory"


def pack_key(spec: JobSpec) -> tuple[Any, ...]:
    """What points must share to share an allocation: resource shape, model, trainer, dtype (and method,
    workload, launcher); None-free so it sorts."""
    e = spec.entity
    return (spec.shape(), str(e.get("model_name")), spec.trainer, str(e.get("torch_dtype")), bool(e.get("bf16")),
            bool(e.get("fp16")), str(spec.compute_dtype), spec.method, spec.workload, spec.launcher, spec.dataset_id,
            spec.model_source, spec.python, spec.trainer_python or "")


def batch_size(spec: JobSpec) -> int:
    try:
        return int(spec.entity.get("batch_size") or 0)
    except (TypeError, ValueError):
        return 0


def packable(spec: JobSpec) -> bool:
    """The stability experiment runs trials in its own allocation; fabric jobs are not points."""
    return spec.trials <= 1 and spec.workload in ("train", "idle")


def in_process(spec: JobSpec) -> bool:
    """Whether a pack of *spec*'s points runs in one training process (the node runner's rule)."""
    return pack_in_one_process(spec.trainer, spec.workload, spec.trials)


def pack_size(pack: int | str, spec: JobSpec, time_limit: str | None) -> int:
    """How many points of *spec*'s group one allocation holds: N; with ``auto`` as many as the partition's
    time limit holds at the points' own limits, at most :data:`AUTO_MAX` (and :data:`AUTO_MAX` when one point
    alone asks for the partition's whole limit, as it does when the sweep sets no ``slurm.time``: the pack's
    limit is then the partition's)."""
    if pack != PACK_AUTO:
        return max(1, int(pack))
    point = slurm_time_minutes(str(spec.resources.get("time") or ""))
    limit = slurm_time_minutes(time_limit) if time_limit else None
    if point is None or point <= 0 or limit is None or limit < 2 * point:
        return AUTO_MAX
    return min(AUTO_MAX, int(limit // point))


def make_packs(specs: Sequence[JobSpec], pack: int | str, time_limit: str | None = None) -> list[list[JobSpec]]:
    """*specs* in packs: each a list of points that share one allocation, in ascending batch size (then point
    id and repeat); a point that packs with nothing is a pack of one. Groups keep their first point's order."""
    if pack == 1:
        return [[s] for s in specs]
    groups: dict[tuple[Any, ...], list[JobSpec]] = {}
    alone: list[list[JobSpec]] = []
    for s in specs:
        if packable(s):
            groups.setdefault(pack_key(s), []).append(s)
        else:
            alone.append([s])
    out: list[list[JobSpec]] = []
    for members in groups.values():
        members = sorted(members, key=lambda s: (batch_size(s), s.point_id, s.repeat, s.attempt))
        n = pack_size(pack, members[0], time_limit)
        out += [members[i:i + n] for i in range(0, len(members), n)]
    return out + alone


def minutes_text(minutes: float) -> str:
    """Minutes as SLURM's ``D-HH:MM:SS``."""
    secs = int(round(minutes * 60))
    d, rest = divmod(secs, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def pack_time(members: Sequence[JobSpec], time_limit: str | None) -> str | None:
    """The pack's time limit: the sum of its points' (within the partition's *time_limit*); None when a point
    has none (UNLIMITED or unreadable: the pack asks for what its first point asks)."""
    total = 0.0
    for s in members:
        m = slurm_time_minutes(str(s.resources.get("time") or ""))
        if m is None:
            return None
        total += m
    cap = slurm_time_minutes(time_limit) if time_limit else None
    return minutes_text(min(total, cap) if cap else total)


# -- on the node: the rest of a pack after an OOM -----------------------------------------------------------

def _attempt_of(job_dir: Path, campaign_dir: Path) -> tuple[str, str, int, int]:
    """(campaign, point id, repeat, attempt) of a job dir, as its ``spec.json`` says."""
    doc = safefile.read_json(JobPaths(job_dir).spec, campaign_dir, safefile.SPEC_MAX)
    js = doc.get("jobspec") if isinstance(doc, dict) else None
    try:
        if isinstance(js, dict):
            return str(js["campaign"]), str(js["point_id"]), int(js["repeat"]), int(js["attempt"])
    except (KeyError, TypeError, ValueError):
        pass
    raise SubmitError(f"{job_dir}: spec.json is not a rendered job spec")


@holding_campaign_locks("requeue")
def requeue(locks: CampaignLocks, campaign_dir: Path, job_dirs: Sequence[Path], slurm: Slurm | None = None,
            ) -> list[tuple[str, str]]:
    """Submit each of *job_dirs* (the points a pack did not run after an OOM) as its own job, its own
    ``job.sbatch`` as rendered; record the new job id in ``submitted.json`` and an attempt line of the
    manifest. A job dir ``sbench cancel`` marked, or that started already, is left alone. Returns
    (job dir, job id) for each submitted."""
    slurm = slurm or Slurm()
    campaign_dir = Path(campaign_dir)
    locks.acquire(campaign_dir, "requeue", wait_s=60.0)
    camp = CampaignPaths(campaign_dir)
    out: list[tuple[str, str]] = []
    lines: list[ManifestLine] = []
    for jd in job_dirs:
        jd = Path(jd)
        info = read_submitted(jd)
        if info.get("cancelled_at") or JobPaths(jd).stage_hosts():
            continue
        campaign, point_id, repeat, attempt = _attempt_of(jd, campaign_dir)
        script = safefile.read_bytes(JobPaths(jd).sbatch, campaign_dir, safefile.SMALL_MAX).decode()
        job_id = slurm.sbatch(script, camp.submissions)
        stamp = now_iso()
        name = job_name_of(script)
        write_submitted(jd, SubmittedInfo(executor="slurm", job_id=job_id, submitted_at=stamp, job_name=name,
                                          requeued_from=info.get("job_id"), requeued_at=stamp))
        lines.append(attempt_line(campaign, point_id, repeat, attempt, str(jd), "slurm", job_id, stamp, REQUEUE_REASON,
                                  extra=AttemptExtra(job_name=name, requeued_from=info.get("job_id"))))
        out.append((str(jd), job_id))
    append_manifest(camp, lines)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "requeue":
        sys.stderr.write("usage: python -m harness.sbatch.pack requeue CAMPAIGN_DIR JOB_DIR...\n")
        return 2
    try:
        done = requeue(Path(argv[1]), [Path(a) for a in argv[2:]])
    except SbenchError as exc:
        sys.stderr.write(f"sbench pack: {exc}\n")
        return 1
    for jd, jid in done:
        print(f"sbench pack: {jd} requeued as job {jid}")
    return 0


if __name__ == "__main__":  # a pack's job, after a point ran out of GPU memory
    sys.exit(main(sys.argv[1:]))
