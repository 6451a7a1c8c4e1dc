"""The campaigns' references and collect's checks of their runs against them (``sbench check``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from harness.spec.references import Reference, check_rows

from .schema import COLUMN_NAMES, q
from .store import Store
from .values import to_json


# -- references and checks ---------------------------------------------------------------------------
def references_of(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Campaign -> its recorded references (only campaigns that declare some)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for camp, spec in store.con.execute("SELECT campaign, references_spec FROM campaigns "
                                       "WHERE references_spec IS NOT NULL").fetchall():
        try:
            refs = json.loads(spec)
        except ValueError:
            continue
        if isinstance(refs, list) and refs:
            out[camp] = [r for r in refs if isinstance(r, dict)]
    return out


def check_inputs(store: Store, campaign: str, metrics: Sequence[str]) -> list[dict[str, Any]]:
    """The campaign's valid point-repeats at their latest attempt: entity, run, outcome, the runs that shared
    a host with it (``overlapped_with``) and the measured *metrics* (see harness.references.check_rows)."""
    cols = [m for m in dict.fromkeys(metrics) if m in COLUMN_NAMES["measurements"]]
    picked = "".join(f", m.{q(c)}" for c in cols)
    rows = store.fetch_dicts(
        f"""WITH latest AS (
                SELECT * FROM runs WHERE campaign = ?
                QUALIFY row_number() OVER (PARTITION BY point_id, repeat ORDER BY attempt DESC) = 1)
            SELECT cp.point_id, cp.repeat, p.entity, r.run_id, r.outcome, r.overlapped_with, m.host_busy,
                   m.host_other_cpu_pct, m.straggler, m.straggler_ranks{picked}
            FROM campaign_points cp JOIN points p USING (point_id)
                 LEFT JOIN latest r ON r.point_id = cp.point_id AND r.repeat = cp.repeat
                 LEFT JOIN measurements m ON m.run_id = r.run_id
            WHERE cp.campaign = ? AND p.valid IS DISTINCT FROM false
            ORDER BY cp.point_id, cp.repeat""", [campaign, campaign])
    for r in rows:
        try:
            r["entity"] = json.loads(r["entity"]) if r["entity"] else {}
        except ValueError:
            r["entity"] = {}
        r["values"] = {c: r.pop(c) for c in cols}
    return rows


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


def refresh_checks(store: Store, now: Any = None) -> int:
    """Recompute the ``checks`` of every campaign that declares references (inside the caller's
    transaction); returns the number of rows written."""
    recorded = references_of(store)
    n = 0
    for campaign, docs in recorded.items():
        refs = [Reference.from_dict(d) for d in docs]
        rows = check_rows(campaign, refs, check_inputs(store, campaign, [r.metric for r in refs]))
        for r in rows:
            r["checked_at"] = now
        replace_checks(store, campaign, rows)
        n += len(rows)
    drop_checks_except(store, list(recorded))
    return n
