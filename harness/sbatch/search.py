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
from harness.contract.paths import CampaignPaths, resolve_db, resolve_workdir
from harness.contract.records import ManifestLine, SearchLine, append_manifest, now_iso
from harness.db.search import campaign_seconds, search_decisions, search_runs
from harness.db.store import open_store
from harness.spec.plan import PlannedPoint
from harness.spec.search import BATCH_FIELD, Candidate, RunSeen, SearchSpec, SearchState, step
from harness.spec.sweep import MAX_REL_CI, Sweep

from . import manifest

MIN_STEPS = 3  # a short run's fewest auto-stop steps: an interval needs a few


def spec_of(recorded: dict[str, Any]) -> SearchSpec:
    """A campaign line's ``search`` back as the spec."""
    sense, metric = next(iter(recorded["goal"].items()))
    return SearchSpec(str(metric), str(sense), recorded.get("batch_size"), recorded.get("method"),
                      int(recorded.get("eta") or 3))


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
    return {**spec.to_dict(), "grid_fields": list(grid_fields), "repeats": repeats,
            "points": [{"point_id": c.point_id, "entity": dict(c.entity), "total_bytes": c.total_bytes,
                        "device_bytes": c.device_bytes, "predicted_oom": c.predicted_oom}
                       for c in candidates(points, grid_fields)]}


def scaled_sweep(sweep: Sweep, scale: float) -> Sweep:
    """*sweep* with its runner settings for a run *scale* of its length (a rung's short run): the auto-stop's
    warm-up, window and time limit shortened by it, its steps too (at least MIN_STEPS), and the precision
    method's interval widened as a shorter run's is (by 1 / sqrt(scale), at most MAX_REL_CI)."""
    r = sweep.runner
    short = dataclasses.replace(
        r, warmup_seconds=r.warmup_seconds * scale, stable_seconds=r.stable_seconds * scale,
        max_seconds=r.max_seconds * scale, min_steps=max(MIN_STEPS, round(r.min_steps * scale)),
        rel_ci=min(MAX_REL_CI, r.rel_ci / math.sqrt(scale)))
    return dataclasses.replace(sweep, runner=short)


def history_runs(db: Path, campaign: str, metric: str) -> dict[str, list[RunSeen]]:
    """Each point's repeats as the database has them (none without a database yet)."""
    if not Path(db).is_file():
        return {}
    out: dict[str, list[RunSeen]] = {}
    with open_store(db, read_only=True) as st:
        for r in search_runs(st, campaign, metric):
            out.setdefault(r["point_id"], []).append(RunSeen(
                int(r["repeat"]), r["outcome"], None if r["value"] is None else float(r["value"]),
                None if r["rel_ci"] is None else float(r["rel_ci"]), r["reason"]))
    return out


def search_state(db: Path, campaign: str, spec: SearchSpec, points: Sequence[PlannedPoint],
                 grid_fields: Sequence[str], repeats: int) -> SearchState:
    return step(spec, candidates(points, grid_fields), history_runs(db, campaign, spec.metric), repeats)


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


def record_decisions(campaign_dir: Path, campaign: str, state: SearchState) -> list[ManifestLine]:
    return append_manifest(CampaignPaths(campaign_dir), decision_lines(campaign_dir, campaign, state))


def best(campaign: str, workdir: Path | None = None, db: Path | None = None) -> dict[str, Any]:
    """``sbench best``: the search's answer from the database: the best point with its goal value and interval,
    the largest batch that fits per shape with its evidence, the decisions, and what the campaign spent beside
    what the full grid would have."""
    wd, dbp = resolve_workdir(workdir), resolve_db(db)
    campaign_dir = wd / campaign
    recorded = manifest.search_spec(campaign_dir)
    if recorded is None:
        raise InputError(f"campaign {campaign!r}: no search (its sweep has no search: section, or there is no "
                         f"manifest {CampaignPaths(campaign_dir).manifest}); sbench best answers a search campaign")
    if not dbp.is_file():
        raise InputError(f"{dbp}: no results database; run sbench collect --campaign {campaign} first")
    spec = spec_of(recorded)
    grid_fields = list(recorded.get("grid_fields") or [])
    cands = [Candidate(str(c["point_id"]), dict(c.get("entity") or {}), c.get("total_bytes"), c.get("device_bytes"),
                       c.get("predicted_oom")) for c in recorded.get("points") or []]
    repeats = int(recorded.get("repeats") or 1)
    state = step(spec, cands, history_runs(dbp, campaign, spec.metric), repeats)
    with open_store(dbp, read_only=True) as st:
        spent = campaign_seconds(st, campaign)
        decisions = search_decisions(st, campaign)
    entity = {c.point_id: c.entity for c in cands}
    iv = state.best_interval
    # The full grid, estimated from what this campaign measured: each valid point once, a point at or below its
    # shape's largest fitting batch at the mean of the ok runs, one above it at the mean of the OOM runs.
    valid = cands
    limit = {tuple(sorted((k, repr(v)) for k, v in f.shape.items() if k != BATCH_FIELD)): f for f in state.fits}

    def fits(c: Candidate) -> bool:
        f = limit.get(tuple(sorted((k, repr(c.entity.get(k))) for k in grid_fields if k != BATCH_FIELD)))
        if f is None:  # no batch_size: fit: every valid point runs
            return True
        return f.batch_size is not None and c.batch <= f.batch_size

    n_fit = sum(1 for c in valid if fits(c))
    n_oom = len(valid) - n_fit
    return {
        "campaign": campaign, "goal": {spec.sense: spec.metric}, "done": state.done, "stuck": state.stuck,
        "best": None if state.best is None or iv is None else {
            "point_id": state.best, **{k: entity[state.best].get(k) for k in grid_fields}, "value": iv.mean,
            "interval": [iv.lo, iv.hi], "runs": iv.runs},
        "runners_up": state.runners_up,
        "max_batch_size": [{"shape": {k: v for k, v in f.shape.items() if k != BATCH_FIELD},
                            "batch_size": f.batch_size, "largest_ok": f.largest_ok, "smallest_oom": f.smallest_oom,
                            "decided": f.decided} for f in state.fits],
        "runs": int(spent["runs"]), "grid_points": len(valid), "train_s": spent["train_s"],
        "allocation_s": spent["allocation_s"],
        "grid_train_s_estimate": n_fit * spent["ok_train_s"] + n_oom * spent["invalid_train_s"],
        "grid_allocation_s_estimate": n_fit * spent["ok_allocation_s"] + n_oom * spent["invalid_allocation_s"],
        "decisions": [{k: (str(v) if k == "decided_at" and v is not None else v) for k, v in d.items()}
                      for d in decisions],
    }
