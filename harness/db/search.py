"""What a search (``search:``, harness.spec.search) reads of its campaign: each repeat's last attempt with its goal
value and interval, the decisions recorded, the seconds the campaign spent training and holding allocations, and
the search's answer (``sbench best`` and the report's section say it alike)."""

from __future__ import annotations

import json
from typing import Any

from harness.contract.formats import Stage
from harness.spec.search import BATCH_FIELD, Candidate, RunSeen, SearchSpec, spread_rel_ci, step

from .schema import COLUMN_NAMES, q
from .store import Store


def search_runs(store: Store, campaign: str, metric: str) -> list[dict[str, Any]]:
    """Each (point, repeat) of *campaign* with its last attempt's outcome and reason, the goal column *metric* and
    the precision auto-stop's relative half-width of its measurement (NULL when not measured)."""
    if metric not in COLUMN_NAMES["measurements"]:  # the sweep's check names the key; this one guards the SQL
        raise ValueError(f"{metric!r} is not a measurements column")
    sql = (f"SELECT r.point_id, r.repeat, r.attempt, r.outcome, r.reason, m.{q(metric)} AS value, "
           "m.ci_rel_halfwidth AS rel_ci, m.step_time_cv, m.steps_timed FROM runs r "
           "LEFT JOIN measurements m ON m.run_id = r.run_id "
           "WHERE r.campaign = ? QUALIFY row_number() OVER (PARTITION BY r.point_id, r.repeat "
           "ORDER BY r.attempt DESC) = 1 ORDER BY r.point_id, r.repeat")
    return store.fetch_dicts(sql, [campaign])


def search_decisions(store: Store, campaign: str) -> list[dict[str, Any]]:
    """The newest recorded decision about each point of *campaign*."""
    return store.fetch_dicts("SELECT point_id, phase, action, reason, repeat, decided_at FROM search_decisions "
                             "WHERE campaign = ? ORDER BY point_id", [campaign])


def search_spec_of(recorded: dict[str, Any]) -> SearchSpec:
    """A recorded ``search`` (the campaign line's, ``campaigns.search_spec``) back as the spec."""
    sense, metric = next(iter(recorded["goal"].items()))
    return SearchSpec(str(metric), str(sense), recorded.get("batch_size"), recorded.get("method"),
                      int(recorded.get("eta") or 3))


def recorded_candidates(recorded: dict[str, Any]) -> list[Candidate]:
    return [Candidate(str(c["point_id"]), dict(c.get("entity") or {}), c.get("total_bytes"), c.get("device_bytes"),
                      c.get("predicted_oom")) for c in recorded.get("points") or []]


def runs_seen(store: Store, campaign: str, metric: str) -> dict[str, list[RunSeen]]:
    """Each point's repeats as the search sees them (:func:`search_runs`): the precision auto-stop's interval,
    else one from the run's own step times (``harness.spec.search.spread_rel_ci``)."""
    out: dict[str, list[RunSeen]] = {}
    for r in search_runs(store, campaign, metric):
        rel = float(r["rel_ci"]) if r["rel_ci"] is not None else spread_rel_ci(
            None if r["step_time_cv"] is None else float(r["step_time_cv"]), r["steps_timed"])
        out.setdefault(r["point_id"], []).append(RunSeen(
            int(r["repeat"]), r["outcome"], None if r["value"] is None else float(r["value"]), rel, r["reason"]))
    return out


def search_answer(store: Store, campaign: str) -> dict[str, Any] | None:
    """What a search campaign found (None: the campaign has no search): the best point with its goal value and
    interval, the largest batch that fits per shape with its evidence, the decisions recorded, and what the
    campaign spent beside the full grid's estimate (each valid point once: one at or below its shape's largest
    fitting batch at the mean of the campaign's ok runs, one above it at the mean of its OOM runs)."""
    row = store.fetch_dicts("SELECT search_spec FROM campaigns WHERE campaign = ?", [campaign])
    raw = row[0]["search_spec"] if row else None
    if not raw:
        return None
    recorded = json.loads(raw) if isinstance(raw, str) else dict(raw)
    spec = search_spec_of(recorded)
    grid_fields = list(recorded.get("grid_fields") or [])
    cands = recorded_candidates(recorded)
    state = step(spec, cands, runs_seen(store, campaign, spec.metric), int(recorded.get("repeats") or 1))
    spent = campaign_seconds(store, campaign)
    entity = {c.point_id: c.entity for c in cands}
    iv = state.best_interval
    limit = {tuple(sorted((k, repr(v)) for k, v in f.shape.items() if k != BATCH_FIELD)): f for f in state.fits}

    def fits(c: Candidate) -> bool:
        f = limit.get(tuple(sorted((k, repr(c.entity.get(k))) for k in grid_fields if k != BATCH_FIELD)))
        if f is None:  # no batch_size: fit: every valid point runs
            return True
        return f.batch_size is not None and c.batch <= f.batch_size

    full = store.fetch_dicts("SELECT entity FROM points WHERE point_id = ?", [state.best]) if state.best else []
    best_entity = json.loads(full[0]["entity"]) if full and isinstance(full[0]["entity"], str) else (
        dict(full[0]["entity"]) if full and full[0]["entity"] else {})
    n_fit = sum(1 for c in cands if fits(c))
    n_oom = len(cands) - n_fit
    return {
        "campaign": campaign, "goal": {spec.sense: spec.metric}, "done": state.done, "stuck": state.stuck,
        "best": None if state.best is None or iv is None else {
            "point_id": state.best, **{k: entity[state.best].get(k) for k in grid_fields}, "value": iv.mean,
            "interval": [iv.lo, iv.hi], "runs": iv.n, "entity": best_entity},
        "runners_up": state.runners_up,
        "max_batch_size": [{"shape": {k: v for k, v in f.shape.items() if k != BATCH_FIELD},
                            "batch_size": f.batch_size, "largest_ok": f.largest_ok, "smallest_oom": f.smallest_oom,
                            "decided": f.decided} for f in state.fits],
        "runs": int(spent["runs"]), "grid_points": len(cands), "train_s": spent["train_s"],
        "allocation_s": spent["allocation_s"], "gpu_s": spent["gpu_s"],
        "grid_train_s_estimate": n_fit * spent["ok_train_s"] + n_oom * spent["invalid_train_s"],
        "grid_allocation_s_estimate": n_fit * spent["ok_allocation_s"] + n_oom * spent["invalid_allocation_s"],
        "grid_gpu_s_estimate": n_fit * spent["ok_gpu_s"] + n_oom * spent["invalid_gpu_s"],
        "decisions": [{k: (str(v) if k == "decided_at" and v is not None else v) for k, v in d.items()}
                      for d in search_decisions(store, campaign)],
    }


def campaign_seconds(store: Store, campaign: str) -> dict[str, float]:
    """What *campaign* spent: ``train_s`` (every run's training, the longest rank's train stage), ``allocation_s``
    (the runs' elapsed time as the scheduler counted it), ``gpu_s`` (that times each point's number_gpus), ``runs``
    (attempts that ended), and per outcome (ok, invalid) the mean of each over its runs (``ok_train_s``,
    ``ok_allocation_s``, ``ok_gpu_s``, ...; 0 without such runs)."""
    rows = store.fetch_dicts(
        "WITH t AS (SELECT s.run_id, max(s.duration_s) AS d FROM stages s JOIN runs r ON r.run_id = s.run_id "
        "WHERE r.campaign = ? AND s.stage = ? GROUP BY s.run_id) "
        "SELECT r.outcome, count(*) AS n, coalesce(sum(t.d), 0) AS train_s, coalesce(sum(r.elapsed_s), 0) AS "
        "allocation_s, coalesce(sum(r.elapsed_s * coalesce(p.number_gpus, 1)), 0) AS gpu_s FROM runs r "
        "LEFT JOIN t ON t.run_id = r.run_id LEFT JOIN points p ON p.point_id = r.point_id "
        "WHERE r.campaign = ? AND r.outcome IS NOT NULL GROUP BY r.outcome", [campaign, Stage.TRAIN, campaign])
    out = {k: sum(float(r[k]) for r in rows) for k in ("train_s", "allocation_s", "gpu_s")}
    out["runs"] = float(sum(int(r["n"]) for r in rows))
    for outcome in ("ok", "invalid"):
        r = next((r for r in rows if r["outcome"] == outcome), None)
        out[f"{outcome}_train_s"] = float(r["train_s"]) / int(r["n"]) if r else 0.0
        out[f"{outcome}_allocation_s"] = float(r["allocation_s"]) / int(r["n"]) if r else 0.0
        out[f"{outcome}_gpu_s"] = float(r["gpu_s"]) / int(r["n"]) if r else 0.0
    return out
