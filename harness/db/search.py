"""What a search (``search:``, harness.spec.search) reads of its campaign: each repeat's last attempt with its goal
value, interval and host, the decisions recorded, the seconds each run spent training and holding its allocation,
and all of it at once with the search its campaign line recorded (:func:`search_evidence`, from which
harness.spec.search.answer says what the search found: ``sbench best`` and the report's section say it alike)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.contract.formats import Stage
from harness.spec.search import RecordedSearch, RunSeen, SearchEvidence, spread_rel_ci

from .schema import COLUMN_NAMES, q
from .store import Store
from .values import from_json


def search_runs(store: Store, campaign: str, metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Each (point, repeat) of *campaign* with its last attempt's outcome and reason, the goal's columns *metrics*
    (``v0``, ``v1``, ...), the precision auto-stop's relative half-width of its measurement (NULL when not
    measured) and whether it ran on a host busy with other work (``measurements.host_busy``)."""
    bad = [m for m in metrics if m not in COLUMN_NAMES["measurements"]]
    if bad or not metrics:  # the sweep's check names the key; this one guards the SQL
        raise ValueError(f"{bad or metrics!r}: not measurements columns")
    cols = ", ".join(f"m.{q(m)} AS v{i}" for i, m in enumerate(metrics))
    sql = (f"SELECT r.point_id, r.repeat, r.attempt, r.outcome, r.reason, {cols}, "
           "m.ci_rel_halfwidth AS rel_ci, m.step_time_cv, m.steps_timed, coalesce(m.host_busy, false) AS busy "
           "FROM runs r "
           "LEFT JOIN measurements m ON m.run_id = r.run_id "
           "WHERE r.campaign = ? QUALIFY row_number() OVER (PARTITION BY r.point_id, r.repeat "
           "ORDER BY r.attempt DESC) = 1 ORDER BY r.point_id, r.repeat")
    return store.fetch_dicts(sql, [campaign])


def search_decisions(store: Store, campaign: str) -> list[dict[str, Any]]:
    """The newest recorded decision about each point of *campaign*."""
    return store.fetch_dicts("SELECT point_id, phase, action, reason, repeat, decided_at FROM search_decisions "
                             "WHERE campaign = ? ORDER BY point_id", [campaign])


def runs_seen(store: Store, campaign: str, metrics: Sequence[str]) -> dict[str, list[RunSeen]]:
    """Each point's repeats as the search sees them (:func:`search_runs`; the value is the first of *metrics*,
    every one in ``values``): the precision auto-stop's interval, else one from the run's own step times
    (``harness.spec.search.spread_rel_ci``)."""
    out: dict[str, list[RunSeen]] = {}
    for r in search_runs(store, campaign, metrics):
        rel = float(r["rel_ci"]) if r["rel_ci"] is not None else spread_rel_ci(
            None if r["step_time_cv"] is None else float(r["step_time_cv"]), r["steps_timed"])
        values = {m: None if r[f"v{i}"] is None else float(r[f"v{i}"]) for i, m in enumerate(metrics)}
        out.setdefault(r["point_id"], []).append(RunSeen(
            int(r["repeat"]), r["outcome"], values[metrics[0]], rel, r["reason"], bool(r["busy"]), values))
    return out


def search_evidence(store: Store, campaign: str) -> SearchEvidence | None:
    """What *campaign* holds of its search (None: the campaign has no search): the search its campaign line
    recorded, each point's repeats, the seconds spent, the decisions recorded and its points' entities, from which
    :func:`harness.spec.search.answer` says what the search found."""
    row = store.fetch_dicts("SELECT search_spec FROM campaigns WHERE campaign = ?", [campaign])
    doc = from_json(row[0]["search_spec"]) if row else None
    if not doc:
        return None
    recorded = RecordedSearch.from_dict(doc)
    return SearchEvidence(campaign, recorded, runs_seen(store, campaign, recorded.spec.metrics),
                          run_seconds(store, campaign), search_decisions(store, campaign),
                          entities_of(store, [c.point_id for c in recorded.candidates]))


def never_run(store: Store, campaign: str | None = None) -> list[dict[str, Any]]:
    """The grid points each search campaign (*campaign*, else every one) never ran: ``campaign``, ``point_id`` and
    the newest decision about it (``action``, ``reason``; NULL before the search decided anything of it)."""
    where, params = (" AND campaign = ?", [campaign]) if campaign else ("", [])
    out: list[dict[str, Any]] = []
    for row in store.fetch_dicts(f"SELECT campaign, search_spec FROM campaigns WHERE search_spec IS NOT NULL{where} "
                                 "ORDER BY campaign", params):
        doc = from_json(row["search_spec"])
        if not isinstance(doc, dict):
            continue
        camp = str(row["campaign"])
        ran = {r[0] for r in store.con.execute("SELECT DISTINCT point_id FROM runs WHERE campaign = ?",
                                               [camp]).fetchall()}
        said = {d["point_id"]: d for d in search_decisions(store, camp)}
        for c in RecordedSearch.from_dict(doc).candidates:
            if c.point_id not in ran:
                d = said.get(c.point_id) or {}
                out.append({"campaign": camp, "point_id": c.point_id, "action": d.get("action"),
                            "reason": d.get("reason")})
    return out


def entities_of(store: Store, point_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The recorded entity (``points.entity``) of each of *point_ids* that has one."""
    ids = sorted(set(point_ids))
    if not ids:
        return {}
    rows = store.con.execute(f"SELECT point_id, entity FROM points WHERE point_id IN ({', '.join('?' for _ in ids)})",
                             ids).fetchall()
    return {str(pid): doc for pid, entity in rows if isinstance(doc := from_json(entity), dict) and doc}


def run_seconds(store: Store, campaign: str) -> list[dict[str, Any]]:
    """Each ended attempt of *campaign*: ``point_id``, ``repeat``, ``outcome``, ``train_s`` (the longest rank's
    train stage; NULL without one), ``allocation_s`` (the run's elapsed time as the scheduler counted it; NULL
    unknown) and ``number_gpus`` (the point's, NULL unrecorded)."""
    return store.fetch_dicts(
        "WITH t AS (SELECT s.run_id, max(s.duration_s) AS d FROM stages s JOIN runs r ON r.run_id = s.run_id "
        "WHERE r.campaign = ? AND s.stage = ? GROUP BY s.run_id) "
        "SELECT r.point_id, r.repeat, r.outcome, t.d AS train_s, r.elapsed_s AS allocation_s, p.number_gpus "
        "FROM runs r LEFT JOIN t ON t.run_id = r.run_id LEFT JOIN points p ON p.point_id = r.point_id "
        "WHERE r.campaign = ? AND r.outcome IS NOT NULL ORDER BY r.point_id, r.repeat, r.attempt",
        [campaign, Stage.TRAIN, campaign])


def point_costs(store: Store, campaign: str) -> dict[str, float]:
    """Each point's mean ``cost_per_million_tokens`` over the campaign's valid measurements that have one."""
    rows = store.con.execute("SELECT point_id, avg(cost_per_million_tokens) FROM measurements WHERE campaign = ? "
                             "AND is_valid AND cost_per_million_tokens IS NOT NULL GROUP BY point_id",
                             [campaign]).fetchall()
    return {str(pid): float(v) for pid, v in rows}
