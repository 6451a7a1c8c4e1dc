"""Attempts sbench holds back from SLURM: the part of a campaign that did not fit the submit quota yet.

``sbench submit`` submits what the cluster's limits allow (:mod:`harness.slurm.limits`) and writes the rest
into the campaign's feed file (``CampaignPaths.feed``); a small feeder job (``harness.campaign.executors.feed``) submits
the next wave when there is room, then submits itself again, until nothing is held. No process on the login
node has to stay alive. Each held job dir's ``submitted.json`` says ``held_back_at`` and has no job id.

The feed file (written whole, under the campaign lock, by submit, the feeder and cancel)::

    {"campaign": ..., "groups": [{"name": <array job name>, "shape": {<sbatch options>}, "max_parallel": N,
                                   "after": <prepare job id>, "last_array": <job id>,
                                   "held": [{"job_dir", "point_id", "repeat", "attempt", "reason"}, ...]}],
     "feeder_job": <job id of the feeder queued or running>, "interval_s": 60,
     "cancelled_at": null, "stopped": null, "waves": [{"at", "arrays", "submitted", "held", "limits"}]}

This module reads and writes that file and says what a held attempt's state is; the states are
:mod:`harness.contract.jobstate`'s ``HELD`` (in the feed, waiting for room, its feeder alive),
``CANCELLED`` (``sbench cancel`` stopped the feeding first) and ``NOT_STARTED`` (the feeding stopped: its
feeder job is gone, or failed turn after turn). A NOT_STARTED attempt is failed for good: ``sbench retry``
(or ``submit --retry-failed``) runs its point as a new attempt, and a later feed never takes it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.contract import jobstate, safefile
from harness.contract.atomic import write_json
from harness.contract.paths import CampaignPaths
from harness.contract.records import read_submitted

from .client import Slurm


def read_feed(campaign_dir: str | Path) -> dict[str, Any]:
    """The campaign's feed file; {} when there is none (or it is not read: harness.contract.safefile)."""
    try:
        doc = safefile.read_json(CampaignPaths(campaign_dir).feed, campaign_dir, safefile.MANIFEST_MAX)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_feed(campaign_dir: str | Path, doc: dict[str, Any]) -> None:
    path = CampaignPaths(campaign_dir).feed
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, doc, indent=1)


def _held_dirs(h: dict[str, Any]) -> list[str]:
    """The job dirs a held entry stands for: a pack's points (``slurm.pack``), else its own."""
    pack = h.get("pack")
    if isinstance(pack, list) and pack:
        return [str(m.get("job_dir")) for m in pack if isinstance(m, dict)]
    return [str(h.get("job_dir"))]


def held_count(doc: dict[str, Any]) -> int:
    return sum(len(_held_dirs(h)) for g in doc.get("groups") or [] if isinstance(g, dict)
               for h in g.get("held") or [] if isinstance(h, dict))


def feeding_stopped(doc: dict[str, Any], slurm: Slurm) -> str | None:
    """Why the feeding of a campaign with held attempts has stopped, or None while its feeder job is queued
    or running (a cancelled feeding says so)."""
    if doc.get("cancelled_at"):
        return "cancelled with sbench cancel before it was submitted"
    if doc.get("stopped"):
        return f"not submitted: the feeding stopped ({doc['stopped']})"
    feeder = doc.get("feeder_job")
    if not feeder:
        return "not submitted: no feeder job holds the rest of the campaign"
    state = slurm.states([str(feeder)]).get(str(feeder))
    if state is not None and not jobstate.is_done(state):
        return None
    return f"not submitted: the feeder job {feeder} ended ({state or 'gone'}) before submitting it"


def held_states(job_dirs: Sequence[str | Path], slurm: Slurm) -> dict[str, tuple[str, str | None]]:
    """Keyed by job dir: (state, why) of each job dir sbench holds back; a job dir that is not held (it has a
    job id, or was never held) is left out. ``HELD`` while the feeding goes on; ``CANCELLED`` or
    ``NOT_STARTED``, with the reason, once nothing will submit it. Each campaign's feed is read once."""
    out: dict[str, tuple[str, str | None]] = {}
    stopped: dict[str, str | None] = {}
    members: dict[str, set[str]] = {}  # the job dirs each campaign's feed still holds
    for job_dir in job_dirs:
        jd = Path(job_dir)
        info = read_submitted(jd)
        if info.get("job_id") or not info.get("held_back_at"):
            continue
        if info.get("cancelled_at"):
            out[str(job_dir)] = ("CANCELLED", "cancelled with sbench cancel before it was submitted")
            continue
        camp = str(jd.parent)
        if camp not in stopped:
            doc = read_feed(camp)
            stopped[camp] = feeding_stopped(doc, slurm)
            members[camp] = {d for g in doc.get("groups") or [] if isinstance(g, dict)
                             for h in g.get("held") or [] if isinstance(h, dict) for d in _held_dirs(h)}
        why = stopped[camp]
        if why is None and str(jd) not in members[camp]:
            why = "not submitted: its feeding stopped before it was submitted (retry runs it as a new attempt)"
        out[str(job_dir)] = ("HELD", None) if why is None else (
            "CANCELLED" if why.startswith("cancelled") else "NOT_STARTED", why)
    return out


__all__ = ["feeding_stopped", "held_count", "held_states", "read_feed", "write_feed"]
