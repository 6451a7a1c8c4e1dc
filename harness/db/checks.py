"""The campaigns' references and collect's checks of their runs against them (``sbench check``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.spec.published import matches
from harness.spec.references import FROM_CAMPAIGN, Reference, check_rows

from .exchange import imported_sql
from .schema import COLUMN_NAMES, q
from .store import Store
from .values import from_json, to_json


# -- references and checks ---------------------------------------------------------------------------
def references_of(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Campaign -> its recorded references (only campaigns that declare some)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for camp, spec in store.con.execute("SELECT campaign, references_spec FROM campaigns "
                                       "WHERE references_spec IS NOT NULL").fetchall():
        refs = from_json(spec)
        if isinstance(refs, list) and refs:
            out[camp] = [r for r in refs if isinstance(r, dict)]
    return out


def check_inputs(store: Store, campaign: str, metrics: Sequence[str]) -> list[dict[str, Any]]:
    """The campaign's valid point-repeats at their latest attempt: entity, run, outcome, the runs that shared
    a host with it (``overlapped_with``) and the measured *metrics* (see harness.references.check_rows); a
    profiled repeat (``runs.profiled``) is no input."""
    cols = [m for m in dict.fromkeys(metrics) if m in COLUMN_NAMES["measurements"]]
    picked = "".join(f", m.{q(c)}" for c in cols)
    rows = store.fetch_dicts(
        f"""WITH latest AS (
                SELECT * FROM runs WHERE campaign = ?
                QUALIFY row_number() OVER (PARTITION BY point_id, repeat ORDER BY attempt DESC) = 1)
            SELECT cp.point_id, cp.repeat, p.experiment, p.entity, r.run_id, r.outcome, r.overlapped_with, m.host_busy,
                   m.host_other_cpu_pct, m.straggler, m.straggler_ranks{picked}
            FROM campaign_points cp JOIN points p USING (point_id)
                 LEFT JOIN latest r ON r.point_id = cp.point_id AND r.repeat = cp.repeat
                 LEFT JOIN measurements m ON m.run_id = r.run_id
            WHERE cp.campaign = ? AND p.valid IS DISTINCT FROM false
                  AND NOT coalesce(r.profiled, false)  -- a profiled repeat measured the profiler too: never checked
            ORDER BY cp.point_id, cp.repeat""", [campaign, campaign])
    for r in rows:
        r["entity"] = from_json(r["entity"], {})
        r["values"] = {c: r.pop(c) for c in cols}
    return rows


def reference_values(store: Store, campaign: str, metric: str) -> list[tuple[dict[str, Any], float]]:
    """*campaign*'s valid measurements of *metric*, each with the entity fields its point recorded (a published
    point's are those its file gave), leaving out those measured on a shared or busy host."""
    if metric not in COLUMN_NAMES["measurements"]:
        return []
    rows = store.con.execute(
        f"""SELECT p.entity, p.experiment, m.{q(metric)} FROM measurements m JOIN points p USING (point_id)
            WHERE m.campaign = ? AND m.is_valid AND m.{q(metric)} IS NOT NULL
              AND NOT coalesce(m.shared_host, false) AND NOT coalesce(m.host_busy, false)
            ORDER BY m.run_id""", [campaign]).fetchall()
    out = []
    for entity, experiment, value in rows:
        given = from_json(entity, {})
        out.append(({**(given if isinstance(given, dict) else {}), "experiment": experiment}, float(value)))
    return out


class ReferenceValues:
    """``check_rows``' *value_of*: the median of what a campaign measured of a point, found on the entity fields
    the campaign recorded (:func:`harness.spec.published.matches`); read once per campaign and metric."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cache: dict[tuple[str, str], list[tuple[dict[str, Any], float]]] = {}

    def __call__(self, campaign: str, metric: str, entity: Mapping[str, Any]) -> float | None:
        key = (campaign, metric)
        if key not in self.cache:
            self.cache[key] = reference_values(self.store, campaign, metric)
        found = sorted(v for given, v in self.cache[key] if matches(given, entity))
        if not found:
            return None
        mid = len(found) // 2
        return found[mid] if len(found) % 2 else (found[mid - 1] + found[mid]) / 2


def referencing(store: Store, campaigns: Sequence[str]) -> list[str]:
    """The campaigns submitted here whose references take their values from one of *campaigns*."""
    wanted = set(campaigns)
    return sorted(c for c, refs in references_of(store).items() if c not in set(imported(store))
                  and any(r.get(FROM_CAMPAIGN) in wanted for r in refs))


def imported(store: Store) -> list[str]:
    """The campaigns that came from elsewhere: their checks are those they came with."""
    return [r[0] for r in store.con.execute(f"SELECT campaign FROM campaigns WHERE {imported_sql()}").fetchall()]


def replace_checks(store: Store, campaign: str, rows: Sequence[Mapping[str, Any]]) -> None:
    store.con.execute("DELETE FROM checks WHERE campaign = ?", [campaign])
    store.insert("checks", [{**r, "selector": to_json(r.get("selector"))} for r in rows])


def drop_checks_except(store: Store, campaigns: Sequence[str]) -> None:
    """Forget the checks of campaigns that no longer declare references."""
    store.con.execute("DELETE FROM checks WHERE NOT list_contains(?::VARCHAR[], campaign)", [list(campaigns)])


def check_results(store: Store, campaign: str) -> list[dict[str, Any]]:
    """The campaign's checks, failures first."""
    return store.fetch_dicts(
        """SELECT c.*, p.model_name, p.number_gpus, p.batch_size FROM checks c LEFT JOIN points p USING (point_id)
           WHERE c.campaign = ?
           ORDER BY CASE c.status WHEN 'fail' THEN 0 WHEN 'missing' THEN 1 WHEN 'shared' THEN 2 ELSE 3 END, c.metric,
                    p.model_name, p.number_gpus, p.batch_size, c.point_id, c.repeat""", [campaign])


def refresh_checks(store: Store, now: Any = None, campaigns: Sequence[str] | None = None) -> int:
    """Recompute the ``checks`` of every campaign submitted here that declares references (of *campaigns* only,
    when given), inside the caller's transaction; returns the number of rows written. An imported campaign
    keeps the checks it came with."""
    recorded = references_of(store)
    kept = imported(store)
    value_of = ReferenceValues(store)
    n = 0
    for campaign, docs in recorded.items():
        if campaign in kept or (campaigns is not None and campaign not in campaigns):
            continue
        refs = [Reference.from_dict(d) for d in docs]
        rows = check_rows(campaign, refs, check_inputs(store, campaign, [r.metric for r in refs]), value_of)
        for r in rows:
            r["checked_at"] = now
        replace_checks(store, campaign, rows)
        n += len(rows)
    if campaigns is None:
        drop_checks_except(store, [*recorded, *kept])
    return n
