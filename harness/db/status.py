"""What ``submit``, ``status`` and ``cancel`` read: each point's attempts and outcomes.

``point_status(store, campaign=None, point_ids=None)``: per point, the attempts that are ``ok`` /
``invalid`` / ``failed`` / ``pending`` (outcome NULL: submitted, queued, running), ``attempts``,
``last_attempt`` and ``last_outcome``. With ``campaign``, only that campaign's attempts; with
``point_ids``, those points' attempts in every campaign (a point is the same point across campaigns);
with both, the intersection. ``status_rows`` lists every (campaign, point, repeat), attempts or not
(invalid points have none), with its latest attempt; ``attempt_rows`` every attempt; ``measured_runs`` a
point's measured runs in the other campaigns (what ``submit`` may reuse when asked to).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .exchange import imported_sql
from .schema import point_stability_sql, point_status_sql, run_overhead_sql
from .store import Store


# -- status (submit/status API) ------------------------------------------------------------------------
def point_status(store: Store, campaign: str | None = None,
                 point_ids: Iterable[str] | None = None) -> dict[str, PointStatus]:
    where, params = [], []
    if campaign is not None:
        where.append("campaign = ?")
        params.append(campaign)
    ids = list(point_ids) if point_ids is not None else None
    if ids is not None:
        if not ids:
            return {}
        where.append(f"point_id IN ({', '.join('?' for _ in ids)})")
        params.extend(ids)
    sql = ("SELECT point_id, attempt, outcome, submitted_at, run_id FROM runs"
           + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY point_id, submitted_at NULLS FIRST, attempt, run_id")
    out: dict[str, PointStatus] = {pid: PointStatus(pid) for pid in ids or []}
    for pid, attempt, outcome, _sub, _rid in store.con.execute(sql, params).fetchall():
        st = out.setdefault(pid, PointStatus(pid))
        st.attempts += 1
        if outcome in ("ok", "invalid", "failed"):
            setattr(st, outcome, getattr(st, outcome) + 1)
        else:
            st.pending += 1
        st.last_attempt = max(st.last_attempt, int(attempt or 0))
        st.last_outcome = outcome
    if campaign is not None and ids is None:
        for (pid,) in store.con.execute("SELECT DISTINCT point_id FROM campaign_points WHERE campaign = ?",
                                       [campaign]).fetchall():
            out.setdefault(pid, PointStatus(pid))
    return out


def next_attempt(store: Store, campaign: str, point_id: str, repeat: int) -> int:
    rows = store.con.execute("SELECT max(attempt) FROM runs WHERE campaign = ? AND point_id = ? AND repeat = ?",
                            [campaign, point_id, repeat]).fetchall()
    return int(rows[0][0] or 0) + 1


def attempt_rows(store: Store, campaign: str | None = None) -> list[dict[str, Any]]:
    cols = ("run_id, campaign, point_id, repeat, attempt, experiment, executor, job_id, state, outcome, reason, "
            "accounting_source, submitted_at, started_at, ended_at, elapsed_s, node_list, transport, job_dir, "
            "cancel_requested_at")
    sql = f"SELECT {cols} FROM runs" + (" WHERE campaign = ?" if campaign else "")
    return store.fetch_dicts(sql + " ORDER BY campaign, point_id, repeat, attempt", [campaign] if campaign else [])


def measured_runs(store: Store, point_ids: Iterable[str], exclude_campaign: str) -> list[dict[str, Any]]:
    """The measured runs (outcome ``ok`` or ``invalid``) of *point_ids* in every campaign submitted here but
    *exclude_campaign*, oldest first: what ``submit --reuse-measured`` may take instead of measuring (another
    cluster's measurement, imported, is not this cluster's)."""
    ids = list(point_ids)
    if not ids:
        return []
    sql = (f"SELECT run_id, campaign, point_id, repeat, attempt, outcome, submitted_at FROM runs "
           f"WHERE outcome IN ('ok', 'invalid') AND campaign <> ? AND point_id IN ({', '.join('?' for _ in ids)}) "
           f"AND NOT {imported_sql()} ORDER BY point_id, submitted_at NULLS LAST, run_id")
    return store.fetch_dicts(sql, [exclude_campaign, *ids])


def job_dirs(store: Store, campaign: str | None = None) -> set[str]:
    """The job dir of every attempt recorded (of one campaign, or all)."""
    sql = "SELECT job_dir FROM runs WHERE job_dir IS NOT NULL" + (" AND campaign = ?" if campaign else "")
    return {r[0] for r in store.con.execute(sql, [campaign] if campaign else []).fetchall()}


def status_rows(store: Store, campaign: str | None = None) -> list[dict[str, Any]]:
    """Every (campaign, point, repeat) with its attempt counts, its latest attempt and that attempt's overhead
    (``point_status``, ``run_overhead``), and its point's throughput CV across repeats with its rating
    (``point_stability``: ``throughput_cv``, ``throughput_stability``). With *campaign*, every part reads
    only that campaign's rows (not the views over every run: a history of many campaigns answers as fast
    as one)."""
    # every campaign: those submitted here (an imported one is never in flight here, nor retried or cancelled)
    where, params = (" WHERE campaign = ?", [campaign, campaign, campaign]) if campaign else (
        f" WHERE NOT {imported_sql()}", [])
    latest_stages = "(SELECT * FROM stages WHERE run_id IN (SELECT run_id FROM latest))"
    sql = f"""
        WITH r0 AS (SELECT * FROM runs{where}),
        cp0 AS (SELECT * FROM campaign_points{where}),
        st AS ({point_stability_sql(f"(SELECT * FROM measurements{where})")}),
        ps AS ({point_status_sql("cp0", "r0")}),
        latest AS (
            SELECT * EXCLUDE (_rn) FROM (
                SELECT r.*, row_number() OVER (PARTITION BY campaign, point_id, repeat
                                               ORDER BY attempt DESC) AS _rn FROM r0 r)
            WHERE _rn = 1)
        SELECT ps.campaign, ps.point_id, ps.repeat, ps.valid, p.reasons AS point_reasons, p.model_name,
               ps.attempts, ps.ok, ps.invalid, ps.failed, ps.pending,
               l.attempt AS last_attempt, l.job_id, l.state, l.outcome, l.reason, l.warnings, l.submitted_at,
               l.started_at, l.ended_at, l.job_dir, o.startup_s, o.outside_train_s, o.outside_train_fraction,
               o.prepared_in_job, st.repeats_measured, st.throughput_cv, st.throughput_stability
        FROM ps LEFT JOIN points p USING (point_id)
             LEFT JOIN st ON st.campaign = ps.campaign AND st.point_id = ps.point_id
             LEFT JOIN latest l ON l.campaign = ps.campaign AND l.point_id = ps.point_id AND l.repeat = ps.repeat
             LEFT JOIN (SELECT run_id, max(startup_s) AS startup_s, max(outside_train_s) AS outside_train_s,
                               max(outside_train_fraction) AS outside_train_fraction,
                               bool_or(prepared_in_job) AS prepared_in_job
                        FROM ({run_overhead_sql(latest_stages)}) GROUP BY run_id) o ON o.run_id = l.run_id
    """
    return store.fetch_dicts(sql + " ORDER BY ps.campaign, ps.point_id, ps.repeat", params)


def point_stability(store: Store, campaign: str) -> dict[str, tuple[int, float | None]]:
    """Per point of *campaign*: how many valid repeats its ``point_stability`` row counts, and their throughput
    CV (None with fewer than two); what adaptive repeats (``harness.campaign.repeats``) decide on."""
    rows = point_stability_sql("(SELECT * FROM measurements WHERE campaign = ?)")
    sql = f"SELECT point_id, repeats_measured, throughput_cv FROM ({rows})"
    return {r[0]: (int(r[1]), None if r[2] is None else float(r[2]))
            for r in store.con.execute(sql, [campaign]).fetchall()}


@dataclass
class PointStatus:
    """Attempt counts of one point, for submit's skip / --force / --retry-failed decisions."""

    point_id: str
    ok: int = 0
    invalid: int = 0
    failed: int = 0
    pending: int = 0
    attempts: int = 0
    last_attempt: int = 0
    last_outcome: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def campaign_names(store: Store) -> list[str]:
    """Every campaign with a recorded campaign row or a run."""
    return [r[0] for r in store.con.execute(
        "SELECT campaign FROM campaigns UNION SELECT campaign FROM runs WHERE campaign IS NOT NULL "
        "ORDER BY 1").fetchall()]
