"""One store's whole history into another: a DuckDB file's into a shared store (moving a team in), or back.

Every table of the schema is streamed across in Arrow batches inside one transaction of the destination (all or
nothing), its rows as they are: the same counts, and so the same answers from every query, compare and report.
The destination must hold no results yet (to merge two stores' campaigns, export one and import it into the
other: that names them by cluster and checks them). Both stores must be of this sbench's schema; an older file
is upgraded by any command that writes it first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.contract.errors import InputError

from .lake import WRITER_KEY
from .schema import SCHEMA, SCHEMA_VERSION, q
from .store import Store

BATCH_ROWS = 100_000
OWN_KEYS = ("schema_version", "created_by", "upgraded_from", WRITER_KEY)  # metadata each store keeps of its own


@dataclass
class CopyReport:
    source: str
    target: str
    rows: dict[str, int] = field(default_factory=dict)
    campaigns: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "schema_version": SCHEMA_VERSION,
                "campaigns": self.campaigns, "rows": self.rows}


def _count(store: Store, table: str) -> int:
    found = store.con.execute(f"SELECT count(*) FROM {q(table)}").fetchone()
    return int(found[0]) if found else 0


def copy_store(src: Store, dst: Store) -> CopyReport:
    """Copy every row of *src* into *dst*, which must be empty of results (see the module docstring)."""
    if str(src.path) == str(dst.path):
        raise InputError(f"{src.path}: the source and the destination are the same store")
    held = {t: n for t in ("runs", "campaigns", "measurements") if (n := _count(dst, t))}
    if held:
        raise InputError(f"{dst.path} holds results already ({', '.join(f'{n} {t}' for t, n in held.items())}): a "
                         "whole store is copied into an empty one only. To add campaigns to a store that has some, "
                         f"sbench export them from {src.path} and sbench import the export")
    report = CopyReport(str(src.path), str(dst.path))
    report.campaigns = [r[0] for r in src.con.execute("SELECT campaign FROM campaigns ORDER BY 1").fetchall()]
    dst.note_campaigns(report.campaigns)
    with dst.transaction():
        for table, cols in SCHEMA.items():
            names = ", ".join(q(c) for c, _ in cols)
            where = f" WHERE key NOT IN ({', '.join('?' for _ in OWN_KEYS)})" if table == "metadata" else ""
            params = list(OWN_KEYS) if where else []
            found = src.con.execute(f"SELECT count(*) FROM {q(table)}{where}", params).fetchone()
            report.rows[table] = int(found[0]) if found else 0
            reader = src.con.execute(f"SELECT {names} FROM {q(table)}{where}", params).fetch_record_batch(BATCH_ROWS)
            casts = ", ".join(f"CAST({q(c)} AS {t}) AS {q(c)}" for c, t in cols)
            _sbench_copy = reader  # noqa: F841 - named in the statement (DuckDB scans the frame's local)
            dst.raw.execute(f"INSERT INTO {q(table)} BY NAME SELECT {casts} FROM _sbench_copy")
    return report


__all__ = ["CopyReport", "copy_store"]
