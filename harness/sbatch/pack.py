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
from harness.contract import safefile
from harness.contract.errors import SbenchError, SubmitError
from harness.contract.paths import JobPaths
from harness.slurm import localjob
from harness.slurm.client import Slurm
from harness.spec.schema import slurm_time_minutes

from . import manifest
from .grouping import (  # noqa: F401 - which points pack together lives in grouping; its callers import it here
    AUTO_MAX,
    batch_size,
    in_process,
    make_packs,
    pack_key,
    pack_labels,
    pack_size,
    packable,
)
from .lock import CampaignLocks, holding_campaign_locks

REQUEUE_REASON = "requeued unpacked: an earlier point of its pack ran out of GPU memory"


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


def pack_info(members: Sequence[JobSpec], index: int) -> dict[str, Any]:
    """What a packed job dir's ``submitted.json`` (``pack``) records."""
    return {"index": index, "size": len(members), "job_dirs": [s.job_dir for s in members]}


# -- on the node: the rest of a pack after an OOM -----------------------------------------------------------

def _spec_of(job_dir: Path, campaign_dir: Path) -> dict[str, Any]:
    doc = safefile.read_json(JobPaths(job_dir).spec, campaign_dir, safefile.SPEC_MAX)
    js = doc.get("jobspec") if isinstance(doc, dict) else None
    if not isinstance(js, dict):
        raise SubmitError(f"{job_dir}: spec.json is not a rendered job spec")
    return js


def _job_name(script: str) -> str | None:
    for line in script.splitlines():
        if line.startswith("#SBATCH --job-name="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def requeue_line(js: dict[str, Any], job_dir: Path, executor: str, job_id: str | None, stamp: str,
                 **extra: Any) -> dict[str, Any]:
    """The manifest's attempt line of a point its pack put back in the queue (its reason says so: the
    point's ``runs.submit_reason`` is the last line's)."""
    return {"type": "attempt", "campaign": js.get("campaign"), "point_id": js.get("point_id"),
            "repeat": js.get("repeat"), "attempt": js.get("attempt"), "job_dir": str(job_dir),
            "executor": executor, "job_id": job_id, "array_job_id": None, "array_task_id": None,
            "submitted_at": stamp, "reason": REQUEUE_REASON, **extra}


def requeued_locally(job_dirs: Sequence[Path]) -> None:
    """Record the points a local pack put back in its queue: an attempt line each, with the requeue's reason
    (the local queue process has no job id for them until it starts them)."""
    stamp = manifest.now_iso()
    by_campaign: dict[Path, list[dict[str, Any]]] = {}
    for jd in map(Path, job_dirs):
        campaign_dir = jd.parent
        try:
            js = _spec_of(jd, campaign_dir)
        except (OSError, SbenchError):
            continue  # its spec.json is not readable: collect says why; the queue still runs it
        by_campaign.setdefault(campaign_dir, []).append(requeue_line(js, jd, "local", None, stamp, requeued_at=stamp))
    for campaign_dir, lines in by_campaign.items():
        manifest.append(campaign_dir, lines)


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
    out: list[tuple[str, str]] = []
    lines: list[dict[str, Any]] = []
    for jd in job_dirs:
        jd = Path(jd)
        info = localjob.submitted(jd)
        if info.get("cancelled_at") or JobPaths(jd).stage_hosts():
            continue
        js = _spec_of(jd, campaign_dir)
        script = safefile.read_bytes(jd / "job.sbatch", campaign_dir, safefile.SMALL_MAX).decode()
        job_id = slurm.sbatch(script, campaign_dir / ".submitit")
        stamp = manifest.now_iso()
        name = _job_name(script)
        manifest.write_submitted(jd, {"executor": "slurm", "job_id": job_id, "submitted_at": stamp,
                                      "job_name": name, "requeued_from": info.get("job_id"),
                                      "requeued_at": stamp})
        lines.append(requeue_line(js, jd, "slurm", job_id, stamp, job_name=name, requeued_from=info.get("job_id")))
        out.append((str(jd), job_id))
    manifest.append(campaign_dir, lines)
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
