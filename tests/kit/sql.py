"""Reading a results database in a test: every helper opens it read-only and closes it before it returns."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def _connect(db: Path):
    import duckdb

    return duckdb.connect(str(db), read_only=True)


def sql_rows(db: Path, query: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """Rows of *query* against the results DB, as dicts."""
    con = _connect(db)
    try:
        cur = con.execute(query, list(params or []))
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


def rows_of(db: Path, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    """Rows of *query*, as tuples."""
    con = _connect(db)
    try:
        return con.execute(query, list(params or [])).fetchall()
    finally:
        con.close()


def one(db: Path, query: str, params: Sequence[Any] = ()) -> dict[str, Any]:
    """The one row of *query*, as a dict (a query that gives another number of rows fails the test)."""
    rows = sql_rows(db, query, params)
    assert len(rows) == 1, rows
    return rows[0]


def dump(db: Path, tables: Iterable[str] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of *tables* (default: every table of the schema), ordered by all columns."""
    if tables is None:
        from harness.db.schema import SCHEMA

        tables = SCHEMA
    con = _connect(db)
    try:
        return {t: con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall() for t in tables}
    finally:
        con.close()


def table_contents(db: Path, tables: list[str]) -> dict[str, list[str]]:
    """Every row of *tables* as its repr, sorted, for before/after comparisons."""
    con = _connect(db)
    try:
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in tables}
    finally:
        con.close()


def assert_same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]], what: str) -> None:
    """*got* and *want* hold the same rows: every value equal, a float to 1e-12 of the other. The samples' averages
    are compensated sums DuckDB takes in parallel; two collects of the same files may combine the partial sums in
    another order and differ in the last bit, and nothing else."""
    assert len(got) == len(want), (what, len(got), len(want))
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys(), what
        for k, v in g.items():
            if isinstance(v, float) and isinstance(w[k], float):
                assert math.isclose(v, w[k], rel_tol=1e-12), (what, k, v, w[k])
            else:
                assert v == w[k], (what, k, v, w[k])
