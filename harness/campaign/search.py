"""An adaptive campaign on the login node: the search's state from what the database holds of the campaign
(``harness.spec.search`` decides; this module reads and records), the manifest lines of its decisions, and
``sbench best``'s answer.

Nothing has to stay alive for a search: each ``sbench submit`` of the sweep, ``retry``, ``collect`` (and
``submit --wait``'s loop, and on SLURM the feeder job) asks :func:`search_state` what to run next, from the
database, so an interrupted search goes on where it stopped and a decided point is never run again.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError
from harness.contract.paths import CampaignPaths, DbRef, DbTarget, resolve_db, resolve_workdir
from harness.contract.records import ManifestLine, SearchLine, append_manifest, now_iso
from harness.db.search import point_costs, runs_seen, search_evidence
from harness.db.status import campaign_names
from harness.db.store import open_store, store_exists
from harness.spec.plan import PlannedPoint
from harness.spec.search import (
    MIN_STEPS,
    Candidate,
    RecordedSearch,
    RunSeen,
    SearchSpec,
    SearchState,
    answer,
    short_run_steps,
    step,
)
from harness.spec.sweep import MAX_REL_CI, Sweep

from . import manifest


def candidates(points: Sequence[PlannedPoint], grid_fields: Sequence[str]) -> list[Candidate]:
    """The valid points (repeat 0) as the search sees them: the grid's fields, and the memory prediction."""
    out = []
    for p in points:
        if p.repeat != 0 or not p.valid:
            continue
        mem = p.memory or {}
        out.append(Candidate(p.point_id, {k: p.entity.get(k) for k in grid_fields}, mem.get("total_bytes"),
                             mem.get("device_bytes"), mem.get("predicted_oom")))
    return out


def recorded(spec: SearchSpec, points: Sequence[PlannedPoint], grid_fields: Sequence[str],
             repeats: int) -> dict[str, Any]:
    """What the campaign line records of a search: the spec, the grid's fields, the campaign's repeats, and the
    valid points as the search sees them (``sbench best`` answers from these and the database alone)."""
    return RecordedSearch(spec, tuple(grid_fields), repeats, tuple(candidates(points, grid_fields))).to_dict()


def scaled_sweep(sweep: Sweep, scale: float) -> Sweep:
    """*sweep* with its runner settings for a run *scale* of its length (a rung's short run): the auto-stop's
    warm-up, window and time limit shortened by it, its steps too (at least MIN_STEPS), and the precision
    method's interval widened as a shorter run's is (by 1 / sqrt(scale), at most MAX_REL_CI); where the sweep's
    entity sets max_steps, the run stops after that share of them (``runner.max_run_steps``, at least MIN_STEPS)."""
    r = sweep.runner
    steps = int(sweep.entity.get("max_steps") or 0)
    short = dataclasses.replace(
        r, warmup_seconds=r.warmup_seconds * scale, stable_seconds=r.stable_seconds * scale,
        max_seconds=r.max_seconds * scale, min_steps=max(MIN_STEPS, round(r.min_steps * scale)),
        rel_ci=min(MAX_REL_CI, r.rel_ci / math.sqrt(scale)),
        # a point's own max_steps ends its run before any auto-stop: its share of them, then
        max_run_steps=short_run_steps(steps, scale) if steps > 0 else 0)
    return dataclasses.replace(sweep, runner=short)


def history_runs(db: DbTarget, campaign: str, metrics: Sequence[str]) -> dict[str, list[RunSeen]]:
    """Each point's repeats as the database has them, with the goal's *metrics* (none without a database yet)."""
    if not store_exists(db):
        return {}
    with open_store(db, read_only=True) as st:
        return runs_seen(st, campaign, metrics)


def search_state(db: DbTarget, campaign: str, spec: SearchSpec, points: Sequence[PlannedPoint],
                 grid_fields: Sequence[str], repeats: int) -> SearchState:
    return step(spec, candidates(points, grid_fields), history_runs(db, campaign, spec.metrics), repeats)


def decision_lines(campaign_dir: Path, campaign: str, state: SearchState) -> list[SearchLine]:
    """A search line for each point whose decision is not the one the manifest holds last."""
    last = manifest.search_lines(campaign_dir)
    out: list[SearchLine] = []
    for pid, d in sorted(state.decisions.items()):
        had = last.get(pid)
        if had and (had.get("phase"), had.get("action"), had.get("reason"), had.get("repeat")) == (
                d.phase, d.action, d.reason, d.repeat):
            continue
        out.append(SearchLine(type="search", campaign=campaign, point_id=pid, at=now_iso(), phase=d.phase,
                              action=d.action, reason=d.reason, repeat=d.repeat))
    return out


def recorded_state(recorded: dict[str, Any], db: DbTarget, campaign: str) -> SearchState:
    """The search's state from what the campaign line recorded of it and what the database holds."""
    rec = RecordedSearch.from_dict(recorded)
    return step(rec.spec, list(rec.candidates), history_runs(db, campaign, rec.spec.metrics), rec.repeats)


def summary(state: SearchState) -> dict[str, Any]:
    """What a submission says of the search it decided on (``SubmitReport.search``)."""
    return {"done": state.done, "todo": [list(t) for t in state.todo], "stuck": state.stuck, "best": state.best,
            "decisions": {k: d.to_dict() for k, d in state.decisions.items()}}


def record_decisions(campaign_dir: Path, campaign: str, state: SearchState) -> list[ManifestLine]:
    return append_manifest(CampaignPaths(campaign_dir), decision_lines(campaign_dir, campaign, state))


def best(campaign: str, workdir: Path | None = None, db: DbRef | None = None) -> dict[str, Any]:
    """``sbench best``: the search's answer (``harness.spec.search.answer``) from what the database holds of it
    (``harness.db.search.search_evidence``)."""
    wd, dbp = resolve_workdir(workdir), resolve_db(db)
    if not store_exists(dbp):
        raise InputError(f"{dbp}: no results database; run sbench collect --campaign {campaign} first (or name "
                         "the database with --db)")
    with open_store(dbp, read_only=True) as st:  # the database answers, wherever it was made or imported from
        known = campaign_names(st)
        ev = search_evidence(st, campaign) if campaign in known else None
        costs = point_costs(st, campaign) if ev is not None else {}
    if ev is not None:
        ans = answer(ev)
        if ans["best"]:  # what a million tokens cost at the best point (its partition's price_per_gpu_hour)
            ans["best"]["cost_per_million_tokens"] = costs.get(ans["best"]["point_id"])
        return ans
    if manifest.search_spec(wd / campaign) is not None:  # submitted here, not collected yet
        raise InputError(f"{dbp}: campaign {campaign!r} has no search recorded yet; run sbench collect --campaign "
                         f"{campaign} first")
    if campaign not in known:
        near = ", ".join(known[:8]) + (" ..." if len(known) > 8 else "")
        raise InputError(f"{dbp}: no campaign {campaign!r} (it has: {near or 'none'}); name a search campaign "
                         "of this database, or another database with --db")
    raise InputError(f"campaign {campaign!r} in {dbp}: no search (its sweep has no search: section); sbench best "
                     "answers a search campaign")
