"""Shared hosts: which runs held one host at the same time (``runs.overlapped_with``), written by collect.

Each run's ``run_hosts`` rows say when it held each host (``held_start_wall`` to ``held_end_wall``:
sacct's start and end on its node list, else its stage events; NULL end while it runs). Two runs
overlap when one of them started on a host before the other one left it (runs imported from another database
are not compared: their hosts are another cluster's). A run that overlapped
another sbench run (any campaign) measured on shared hardware: its ``runs.overlapped_with`` names the other
runs, ``runs.warnings`` says so in words, and its measurement carries the same list
(``measurements.overlapped_with``) and ``shared_host = true``. The list is ``[]`` for a run
that held its hosts alone, NULL when no host and time of it is known (it never started).

Collect calls :func:`refresh_overlaps` with the runs it wrote, inside its transaction. It recomputes
those runs and every run that overlaps one of them now or did before (the relation is symmetric, so a
run whose stored list names a changed run is one of the latter): a later run that overlaps an earlier
one flags both, and a re-collect that changes nothing writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .exchange import imported_sql
from .staging import frame
from .store import Store

WARNING_PREFIX = "shared host: "
NAMED = 5  # other runs named in the warning; runs.overlapped_with lists them all

# The hosts of the runs submitted here: an imported run held another cluster's hosts (a host of the same name there
# is another machine), and keeps the lists it came with.
_HOSTS = f"(SELECT * FROM run_hosts WHERE run_id NOT IN (SELECT run_id FROM runs WHERE {imported_sql()}))"
_OVERLAP = ("a.host = b.host AND a.run_id <> b.run_id AND a.held_start_wall IS NOT NULL "
            "AND b.held_start_wall IS NOT NULL "
            "AND a.held_start_wall < coalesce(b.held_end_wall, 'infinity'::DOUBLE) "
            "AND b.held_start_wall < coalesce(a.held_end_wall, 'infinity'::DOUBLE)")


def overlap_warning(others: Sequence[str], hosts: Sequence[str]) -> str:
    """The words of ``runs.warnings`` for a run that shared *hosts* with the runs *others*."""
    named = ", ".join(others[:NAMED]) + (f" and {len(others) - NAMED} more" if len(others) > NAMED else "")
    return (f"{WARNING_PREFIX}another sbench run held {', '.join(hosts)} at the same time ({named}); its "
            "measurements are not those of an isolated node (runs.overlapped_with)")


def refresh_overlaps(store: Store, changed: Sequence[str]) -> int:
    """Recompute ``runs.overlapped_with`` (and the warning, and the measurement's copy) of the *changed* runs and of
    every run that overlaps one of them, now or before; returns how many runs' lists changed."""
    if not changed:
        return 0
    fresh = set(changed)  # their measurements rows were written anew, without the list
    store.con.register("_sbench_changed", frame([("run_id", "VARCHAR")], [{"run_id": r} for r in changed]))
    try:
        store.con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _sbench_affected AS
            SELECT run_id FROM _sbench_changed
            UNION
            SELECT b.run_id FROM {_HOSTS} a JOIN {_HOSTS} b ON {_OVERLAP}
            WHERE a.run_id IN (SELECT run_id FROM _sbench_changed)
            UNION
            SELECT r.run_id FROM runs r, unnest(r.overlapped_with) AS u(other)
            WHERE u.other IN (SELECT run_id FROM _sbench_changed)""")
    finally:
        store.con.unregister("_sbench_changed")
    try:
        rows = store.fetch_dicts(f"""
            WITH pairs AS (
                SELECT a.run_id, a.host, b.run_id AS other FROM {_HOSTS} a JOIN {_HOSTS} b ON {_OVERLAP}
                WHERE a.run_id IN (SELECT run_id FROM _sbench_affected)),
            found AS (
                SELECT run_id, list_sort(list_distinct(list(other))) AS others,
                       list_sort(list_distinct(list(host))) AS hosts
                FROM pairs GROUP BY run_id),
            known AS (
                SELECT DISTINCT run_id FROM run_hosts
                WHERE held_start_wall IS NOT NULL AND run_id IN (SELECT run_id FROM _sbench_affected))
            SELECT r.run_id, r.overlapped_with AS before, r.warnings,
                   CASE WHEN f.run_id IS NOT NULL THEN f.others WHEN k.run_id IS NOT NULL THEN []::VARCHAR[] END
                       AS others,
                   f.hosts
            FROM runs r LEFT JOIN found f USING (run_id) LEFT JOIN known k USING (run_id)
            WHERE r.run_id IN (SELECT run_id FROM _sbench_affected)
            ORDER BY r.run_id""")
    finally:
        store.con.execute("DROP TABLE IF EXISTS _sbench_affected")
    runs: list[dict[str, Any]] = []
    for r in rows:
        kept = [w for w in (r["warnings"] or []) if not w.startswith(WARNING_PREFIX)]
        if r["others"]:
            kept.append(overlap_warning(r["others"], r["hosts"]))
        if r["before"] != r["others"] or (r["warnings"] or None) != (kept or None) or r["run_id"] in fresh:
            runs.append({"run_id": r["run_id"], "overlapped_with": r["others"], "warnings": kept or None})
    if not runs:
        return 0
    store.upsert("runs", runs, ["overlapped_with", "warnings"])
    store.con.register("_sbench_ov", frame([("run_id", "VARCHAR"), ("overlapped_with", "VARCHAR[]")], runs))
    try:
        store.con.execute("""
            UPDATE measurements AS m
            SET overlapped_with = s.runs, shared_host = s.shared
            FROM (SELECT run_id, overlapped_with::VARCHAR[] AS runs, len(overlapped_with) > 0 AS shared
                  FROM _sbench_ov) AS s
            WHERE m.run_id = s.run_id
              AND (m.overlapped_with IS DISTINCT FROM s.runs OR m.shared_host IS DISTINCT FROM s.shared)""")
    finally:
        store.con.unregister("_sbench_ov")
    return sum(1 for r in rows if r["before"] != r["others"])
