"""What collect reads and writes of ``runs`` as a whole: the index it decides from, its full view of the runs
it read, and the counts its report prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .schema import SCHEMA
from .store import Store


# -- collect internals ---------------------------------------------------------------------------------
def run_counts(store: Store, campaign: str | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """Runs per outcome ('pending' for none yet) and per accounting source ('none'): of one campaign, or all."""
    where, params = (" WHERE campaign = ?", [campaign]) if campaign is not None else ("", [])
    outcomes = store.con.execute(f"SELECT coalesce(outcome, 'pending'), count(*) FROM runs{where} GROUP BY ALL "
                                "ORDER BY 1", params).fetchall()
    sources = store.con.execute(f"SELECT coalesce(accounting_source, 'none'), count(*) FROM runs{where} "
                               "GROUP BY ALL ORDER BY 1", params).fetchall()
    return {k: int(v) for k, v in outcomes}, {k: int(v) for k, v in sources}


def run_index(store: Store) -> dict[str, dict[str, Any]]:
    """What collect needs to decide whether a run changed."""
    rows = store.fetch_dicts("SELECT run_id, campaign, point_id, repeat, attempt, job_dir, executor, job_id, "
                            "state, outcome, fingerprint, accounting_source, cancel_requested_at FROM runs")
    return {r["run_id"]: r for r in rows}


def replace_runs(store: Store, runs: Sequence[Mapping[str, Any]]) -> None:
    """Write collect's full view of *runs* (manifest columns included) over any existing rows."""
    if not runs:
        return
    cols = [c for c, _ in SCHEMA["runs"] if c != "run_id"]
    store.upsert("runs", runs, cols)
