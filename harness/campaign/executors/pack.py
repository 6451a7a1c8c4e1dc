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
``python -m harness.campaign.executors.pack``): none is measured on memory a failed step left fragmented; in a
search's scan (a packed ``batch_size: fit``) a larger batch of the shape that ran out of memory is not started at
all (:func:`not_needed_after_oom`). A point that fails otherwise does not stop the others. The pack job ends 0
once its points ran, so SLURM's word on the job never overrides a point's own files
(:mod:`harness.collect.outcome`).

Each packed job dir's ``submitted.json`` says ``pack: {index, size, job_dirs}``; the attempt lines of the
manifest carry the same (``pack_index``, ``pack_size``) and the pack's job id.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from harness.build.jobspec import JobSpec
from harness.build.sbatch import job_name_of
from harness.campaign import manifest
from harness.campaign.grouping import (  # noqa: F401 - which points pack together lives in grouping; its callers import it here
    AUTO_MAX,
    batch_size,
    in_process,
    make_packs,
    pack_key,
    pack_labels,
    pack_size,
    packable,
)
from harness.campaign.lock import CampaignLocks, holding_campaign_locks
from harness.contract import safefile
from harness.contract.errors import SbenchError, SubmitError
from harness.contract.paths import CampaignPaths, JobPaths
from harness.contract.records import (
    AttemptExtra,
    AttemptLine,
    ManifestLine,
    Predicted,
    SubmittedInfo,
    append_manifest,
    attempt_line,
    now_iso,
    read_submitted,
    write_submitted,
)
from harness.slurm.client import Slurm
from harness.slurm.localjob import SETTLED, update_submitted
from harness.spec.schema import minutes_text, slurm_time_minutes
from harness.spec.search import BATCH_FIELD

REQUEUE_REASON = "requeued unpacked: an earlier point of its pack ran out of GPU memory"


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

SCAN_SKIP = ("not run: batch {oom} of its shape ran out of GPU memory earlier in its pack, and a search's scan "
             "needs no larger batch of it")
_SCAN_SKIPPED = re.compile(re.escape(SCAN_SKIP).replace(re.escape("{oom}"), r"\d+"))


def scan_skipped(outcome: object, reason: object) -> bool:
    """Whether a run failed only as its pack did not start it for a search's scan (its reason :data:`SCAN_SKIP`): a
    run the search does not need, which ``submit --wait`` and ``status`` count as not needed rather than failed."""
    return outcome == "failed" and isinstance(reason, str) and bool(_SCAN_SKIPPED.search(reason))


def ended_invalid(job_dir: str | Path) -> bool:
    """Whether a node runner of the job dir ended ``invalid`` (GPU out of memory) in its result file."""
    paths = JobPaths(job_dir)
    for host in paths.result_hosts():
        try:
            doc = safefile.read_json(paths.result(host), paths.root.parent, safefile.RUNNER_MAX)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("outcome") == "invalid":
            return True
    return False


def _shape_and_batch(job_dir: Path) -> tuple[str, int] | None:
    """A job dir's point as a search's scan sees it: its entity without the batch size (as sorted JSON), and its
    batch size; None when its ``spec.json`` does not say."""
    try:
        doc = safefile.read_json(JobPaths(job_dir).spec, job_dir.parent, safefile.SPEC_MAX)
        entity = dict(doc["jobspec"]["entity"])
        batch = int(entity.pop(BATCH_FIELD))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return json.dumps(entity, sort_keys=True, default=str), batch


def not_needed_after_oom(job_dirs: Sequence[str | Path]) -> list[Path]:
    """Of the points a pack did not run after an OOM (*job_dirs*), those a search's scan (``search.scan``: a packed
    ``batch_size: fit``) needs no more, marked not started (``not_started_reason``: :data:`SCAN_SKIP`): a larger
    batch of the same shape as a point of the pack that ran out of GPU memory. The rest go back to the queue; in a
    campaign without a scan every one does (a grid measures each point's OOM). Returns those still to requeue."""
    dirs = [Path(d) for d in job_dirs]
    if not dirs or not (manifest.search_spec(dirs[0].parent) or {}).get("scan"):
        return dirs
    pack = read_submitted(dirs[0]).get("pack")
    members = pack.get("job_dirs") or [] if pack else []
    ooms: dict[str, int] = {}
    for m in map(Path, members):
        sb = _shape_and_batch(m) if m not in dirs and ended_invalid(m) else None
        if sb is not None:
            ooms[sb[0]] = min(sb[1], ooms.get(sb[0], sb[1]))
    keep = []
    for d in dirs:
        sb = _shape_and_batch(d)
        oom = ooms.get(sb[0]) if sb is not None else None
        if sb is None or oom is None or sb[1] < oom:
            keep.append(d)
            continue
        update_submitted(d, {"not_started_at": now_iso(), "not_started_reason": SCAN_SKIP.format(oom=oom)},
                         unless=SETTLED)
    return keep


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


def requeue_line(key: tuple[str, str, int, int], job_dir: Path, executor: str, job_id: str | None, stamp: str,
                 extra: AttemptExtra, predicted: Predicted | None = None) -> AttemptLine:
    """The manifest's attempt line of a point its pack put back in the queue (*key*: :func:`_attempt_of`; its
    reason says so: the point's ``runs.submit_reason`` is the last line's), with what submit predicted of it
    (*predicted*: its first line's, :func:`predictions_of`)."""
    campaign, point_id, repeat, attempt = key
    return attempt_line(campaign, point_id, repeat, attempt, str(job_dir), executor, job_id, stamp, REQUEUE_REASON,
                        extra=extra, prediction=predicted)


def predictions_of(campaign_dir: Path) -> dict[str, Predicted]:
    """What submit predicted of each job dir of the campaign (its attempt lines' ``prediction``, by job dir): a
    requeue's line keeps it, as the run it puts back is the same attempt."""
    out: dict[str, Predicted] = {}
    for ev in manifest.read(campaign_dir):
        if ev["type"] == "attempt" and ev.get("job_dir") and isinstance(ev.get("prediction"), Mapping):
            out[str(ev["job_dir"])] = cast(Predicted, ev["prediction"])
    return out


def requeued_locally(job_dirs: Sequence[Path]) -> None:
    """Record the points a local pack put back in its queue: an attempt line each, with the requeue's reason
    (the local queue process has no job id for them until it starts them)."""
    stamp = now_iso()
    by_campaign: dict[Path, list[ManifestLine]] = {}
    predicted: dict[Path, dict[str, Predicted]] = {}
    for jd in map(Path, job_dirs):
        campaign_dir = jd.parent
        try:
            key = _attempt_of(jd, campaign_dir)
        except (OSError, SbenchError):
            continue  # its spec.json is not readable: collect says why; the queue still runs it
        if campaign_dir not in predicted:
            predicted[campaign_dir] = predictions_of(campaign_dir)
        by_campaign.setdefault(campaign_dir, []).append(
            requeue_line(key, jd, "local", None, stamp, AttemptExtra(requeued_at=stamp),
                         predicted[campaign_dir].get(str(jd))))
    for campaign_dir, lines in by_campaign.items():
        append_manifest(CampaignPaths(campaign_dir), lines)


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
    predicted = predictions_of(campaign_dir)
    for jd in not_needed_after_oom(job_dirs):
        info = read_submitted(jd)
        if info.get("cancelled_at") or JobPaths(jd).stage_hosts():
            continue
        key = _attempt_of(jd, campaign_dir)
        script = safefile.read_bytes(JobPaths(jd).sbatch, campaign_dir, safefile.SMALL_MAX).decode()
        job_id = slurm.sbatch(script, camp.submissions)
        stamp = now_iso()
        name = job_name_of(script)
        write_submitted(jd, SubmittedInfo(executor="slurm", job_id=job_id, submitted_at=stamp, job_name=name,
                                          requeued_from=info.get("job_id"), requeued_at=stamp))
        lines.append(requeue_line(key, jd, "slurm", job_id, stamp,
                                  AttemptExtra(job_name=name, requeued_from=info.get("job_id")),
                                  predicted.get(str(jd))))
        out.append((str(jd), job_id))
    append_manifest(camp, lines)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "requeue":
        sys.stderr.write("usage: python -m harness.campaign.executors.pack requeue CAMPAIGN_DIR JOB_DIR...\n")
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
