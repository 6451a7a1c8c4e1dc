"""What a search (``search:``, harness.spec.search) reads of its campaign: each repeat's last attempt with its goal
value and interval, the decisions recorded, and the seconds the campaign spent training and holding allocations."""

from __future__ import annotations

from typing import Any

from harness.contract.formats import Stage

from .schema import COLUMN_NAMES, q
from .store import Store


def search_runs(store: Store, campaign: str, metric: str) -> list[dict[str, Any]]:
    """Each (point, repeat) of *campaign* with its last attempt's outcome and reason, the goal column *metric* and
    the precision auto-stop's relative half-width of its measurement (NULL when not measured)."""
    if metric not in COLUMN_NAMES["measurements"]:  # the sweep's check names the key; this one guards the SQL
        raise ValueError(f"{metric!r} is not a measurements column")
    sql = (f"SELECT r.point_id, r.repeat, r.attempt, r.outcome, r.reason, m.{q(metric)} AS value, "
           "m.ci_rel_halfwidth AS rel_ci FROM runs r LEFT JOIN measurements m ON m.run_id = r.run_id "
           "WHERE r.campaign = ? QUALIFY row_number() OVER (PARTITION BY r.point_id, r.repeat "
           "ORDER BY r.attempt DESC) = 1 ORDER BY r.point_id, r.repeat")
    return store.fetch_dicts(sql, [campaign])


def search_decisions(store: Store, campaign: str) -> list[dict[str, Any]]:
    """The newest recorded decision about each point of *campaign*."""
    return store.fetch_dicts("SELECT point_id, phase, action, reason, repeat, decided_at FROM search_decisions "
                             "WHERE campaign = ? ORDER BY point_id", [campaign])


def campaign_seconds(store: Store, campaign: str) -> dict[str, float]:
    """What *campaign* spent: ``train_s`` (every run's training, the longest rank's train stage), ``allocation_s``
    (the runs' elapsed time as the scheduler counted it), ``runs`` (attempts that ended), and per outcome (ok,
    invalid) the mean of both over its runs (``ok_train_s``, ``ok_allocation_s``, ...; 0 without such runs)."""
    rows = store.fetch_dicts(
        "WITH t AS (SELECT s.run_id, max(s.duration_s) AS d FROM stages s JOIN runs r ON r.run_id = s.run_id "
        "WHERE r.campaign = ? AND s.stage = ? GROUP BY s.run_id) "
        "SELECT r.outcome, count(*) AS n, coalesce(sum(t.d), 0) AS train_s, coalesce(sum(r.elapsed_s), 0) AS "
        "allocation_s FROM runs r LEFT JOIN t ON t.run_id = r.run_id WHERE r.campaign = ? AND r.outcome IS NOT NULL "
        "GROUP BY r.outcome", [campaign, Stage.TRAIN, campaign])
    out = {"train_s": sum(float(r["train_s"]) for r in rows), "allocation_s": sum(float(r["allocation_s"])
                                                                                 for r in rows),
           "runs": float(sum(int(r["n"]) for r in rows))}
    for outcome in ("ok", "invalid"):
        r = next((r for r in rows if r["outcome"] == outcome), None)
        out[f"{outcome}_train_s"] = float(r["train_s"]) / int(r["n"]) if r else 0.0
        out[f"{outcome}_allocation_s"] = float(r["allocation_s"]) / int(r["n"]) if r else 0.0
    return out
