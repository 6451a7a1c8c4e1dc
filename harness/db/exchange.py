"""Campaigns in and out of a results database: the rows an export holds, the rows an import writes, and which
campaigns came from elsewhere.

Every table belongs to an export by its scope (:func:`scope_of`): a table with a ``campaign`` column holds its
rows of the exported campaigns; one with a ``run_id`` column, its rows of their runs; ``points`` the points
they name; ``sample_files`` and ``sample_rows`` their runs' samples, the file ids numbered from 0 in the order
of run, host and path (so that an export does not depend on the order its database loaded them);
``probes`` and ``fabric`` the rows of the campaigns' cluster and partitions from the last one before the
campaign to its end; ``metadata`` stays. A table added later follows the same rules by its columns.

An import writes the rows of an export's campaigns under their namespace (:mod:`harness.contract.exchange`):
each ``campaign`` column, each ``run_id`` and the run ids of ``overlapped_with``; sample file ids move past the
database's own; points, probes and fabric rows the database has are kept. Every row of an export is read
in memory first (:func:`arrow_tables` in the caller), so that a file that does not parse is refused before
anything is written, and the whole import is one transaction.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb

from harness.contract.exchange import NAMESPACE_SEP, ORIGIN_ADO_CSV, ORIGIN_EXPORT, ORIGINS

from .lake import SQL_ONLY_TYPES
from .schema import COLUMN_NAMES, SCHEMA, q
from .staging import frame
from .store import Store
from .values import from_json, to_json

if TYPE_CHECKING:
    import pyarrow as pa

CAMPAIGN, RUN, POINT, FILES, FILE_ROWS, CLUSTER = "campaign", "run", "point", "files", "file_rows", "cluster"
_SCOPES = {"metadata": None, "points": POINT, "sample_files": FILES, "sample_rows": FILE_ROWS,
           "probes": CLUSTER, "fabric": CLUSTER}


def scope_of(table: str) -> str | None:
    """How *table*'s rows belong to exported campaigns (None: not exported)."""
    if table in _SCOPES:
        return _SCOPES[table]
    cols = COLUMN_NAMES[table]
    return CAMPAIGN if "campaign" in cols else RUN if "run_id" in cols else None


EXPORTED = tuple(t for t in SCHEMA if scope_of(t) is not None)


def _in(values: Sequence[str]) -> str:
    return "(" + ", ".join("?" for _ in values) + ")" if values else "(NULL)"


def _columns(table: str, replace: Mapping[str, str] | None = None) -> str:
    """*table*'s columns as an export writes them: a column of sbench's own type cast to it (a lake stores it
    as VARCHAR), so that a file and a lake export the same bytes."""
    replace = replace or {}
    return ", ".join(replace.get(c, f"CAST({q(c)} AS {t}) AS {q(c)}" if t in SQL_ONLY_TYPES else q(c))
                     for c, t in SCHEMA[table])


# -- export --------------------------------------------------------------------------------------------------
@dataclass
class CampaignRecord:
    """One campaign as provenance.json describes it."""

    campaign: str
    cluster: str | None
    partitions: Any
    partition: str | None
    experiment: str | None
    sweep: str | None
    origin: str | None
    created_at: str | None
    first_submitted: str | None
    last_ended: str | None
    runs: int
    sha256: str  # its runs as collected (ids, fingerprints, states, outcomes): an import of the same is a no-op

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def campaign_records(store: Store, campaigns: Sequence[str]) -> list[CampaignRecord]:
    """The campaigns' records, in the order asked; a campaign the database does not hold is left out."""
    out = []
    for name in campaigns:
        rows = store.fetch_dicts("SELECT * FROM campaigns WHERE campaign = ?", [name])
        runs = store.fetch_dicts("SELECT run_id, fingerprint, state, outcome, collected_at, submitted_at, ended_at "
                                 "FROM runs WHERE campaign = ? ORDER BY run_id", [name])
        if not rows and not runs:
            continue
        c = rows[0] if rows else {}
        blob = json.dumps({"campaign": {k: v for k, v in c.items() if k not in ("origin", "imported")},
                           "runs": [[r["run_id"], r["fingerprint"], r["state"], r["outcome"], r["collected_at"]]
                                    for r in runs]}, sort_keys=True, default=str)
        subs = [r["submitted_at"] for r in runs if r["submitted_at"] is not None]
        ends = [r["ended_at"] for r in runs if r["ended_at"] is not None]
        partitions = c.get("partitions")
        out.append(CampaignRecord(
            name, c.get("cluster"), from_json(partitions),
            c.get("partition"), c.get("experiment"), c.get("sweep"), c.get("origin"),
            _iso(c.get("created_at")), _iso(min(subs, default=None)), _iso(max(ends, default=None)), len(runs),
            hashlib.sha256(blob.encode()).hexdigest()))
    return out


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def _cluster_rows(store: Store, table: str, records: Sequence[CampaignRecord]) -> tuple[str, list[Any]]:
    """The ids (probe or fabric run) of *table*'s rows of the campaigns' cluster and partitions: those taken while
    a campaign ran, and the last one before it."""
    key, at = ("probe_id", "probed_at") if table == "probes" else ("fabric_id", "measured_at")
    ids: set[str] = set()
    for r in records:
        start = r.first_submitted or r.created_at
        end = r.last_ended or start
        if r.cluster is None or start is None:
            continue
        parts = sorted(r.partitions) if isinstance(r.partitions, dict) and r.partitions else [r.partition]
        for part in parts:
            rows = store.con.execute(
                f"""WITH ids AS (SELECT {key} AS id, max({at}) AS t FROM {table} WHERE cluster = ? AND partition = ?
                                 GROUP BY 1)
                    SELECT id FROM ids WHERE t BETWEEN ?::TIMESTAMP AND ?::TIMESTAMP
                    UNION SELECT * FROM (SELECT id FROM ids WHERE t < ?::TIMESTAMP ORDER BY t DESC, id LIMIT 1)""",
                [r.cluster, part, start, end, start]).fetchall()
            ids.update(str(x[0]) for x in rows)
    return f"{key} IN {_in(sorted(ids))}", sorted(ids)


def export_sql(store: Store, table: str, campaigns: Sequence[str],
               records: Sequence[CampaignRecord]) -> tuple[str, list[Any]]:
    """The query of *table*'s rows of *campaigns*, in SCHEMA's column order and a total order of rows."""
    scope = scope_of(table)
    names = list(campaigns)
    runs = f"SELECT run_id FROM runs WHERE campaign IN {_in(names)}"
    files = (f"SELECT file_id, row_number() OVER (ORDER BY run_id, host, path, file_id) - 1 AS new_id "
             f"FROM sample_files WHERE run_id IN ({runs})")
    if scope == CAMPAIGN:
        return f"SELECT {_columns(table)} FROM {q(table)} WHERE campaign IN {_in(names)} ORDER BY ALL", names
    if scope == RUN:
        return f"SELECT {_columns(table)} FROM {q(table)} WHERE run_id IN ({runs}) ORDER BY ALL", names
    if scope == POINT:
        return (f"SELECT {_columns(table)} FROM points WHERE point_id IN (SELECT point_id FROM campaign_points WHERE "
                f"campaign IN {_in(names)} UNION SELECT point_id FROM runs WHERE campaign IN {_in(names)}) "
                "ORDER BY point_id", names + names)
    if scope == FILES:
        return (f"WITH f AS ({files}) SELECT {_columns(table, {'file_id': 'f.new_id AS file_id'})} "
                "FROM sample_files s JOIN f USING (file_id) ORDER BY 1", names)
    if scope == FILE_ROWS:
        return (f"WITH f AS ({files}) SELECT {_columns(table, {'file_id': 'f.new_id AS file_id'})} "
                "FROM sample_rows s JOIN f USING (file_id) ORDER BY ALL", names)
    if scope == CLUSTER:
        where, params = _cluster_rows(store, table, records)
        return f"SELECT {_columns(table)} FROM {q(table)} WHERE {where} ORDER BY ALL", params
    raise ValueError(f"{table} is not exported")


def export_table(store: Store, table: str, campaigns: Sequence[str], records: Sequence[CampaignRecord]) -> pa.Table:
    """*table*'s rows of *campaigns* as an Arrow table."""
    sql, params = export_sql(store, table, campaigns, records)
    return store.con.sql(sql, params=params).to_arrow_table()


# -- imported campaigns --------------------------------------------------------------------------------------
def imported_campaigns(store: Store) -> dict[str, dict[str, Any]]:
    """Every campaign that came from elsewhere: name -> ``{"origin": ..., **imported}``."""
    out = {}
    for name, origin, doc in store.con.execute(
            "SELECT campaign, origin, imported FROM campaigns WHERE origin IS NOT NULL ORDER BY campaign").fetchall():
        meta = from_json(doc, {})
        out[str(name)] = {**(meta if isinstance(meta, dict) else {}), "origin": origin}
    return out


def imported_sql(column: str = "campaign") -> str:
    """SQL that is true where *column* names a campaign that came from elsewhere."""
    return f"{column} IN (SELECT campaign FROM campaigns WHERE origin IN ({', '.join(repr(o) for o in ORIGINS)}))"


def delete_campaign(store: Store, campaign: str) -> None:
    """Every row of *campaign* (points stay: they are any campaign's)."""
    run_ids = [r[0] for r in store.con.execute("SELECT run_id FROM runs WHERE campaign = ?", [campaign]).fetchall()]
    store.delete_runs(run_ids, [t for t in EXPORTED if scope_of(t) in (RUN, FILES) and t != "runs"])
    for t in EXPORTED:
        if scope_of(t) == CAMPAIGN:
            store.con.execute(f"DELETE FROM {q(t)} WHERE campaign = ?", [campaign])


# -- import --------------------------------------------------------------------------------------------------
@dataclass
class ImportPlan:
    """What an import writes: *names* maps each exported campaign to import to its name here; *meta* is each
    one's ``campaigns.imported`` document; *replace* the names here whose rows go first."""

    namespace: str
    names: dict[str, str]
    meta: dict[str, dict[str, Any]]
    replace: list[str] = field(default_factory=list)


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ns_name(expr: str, ns: str) -> str:
    return (f"CASE WHEN {expr} IS NULL OR contains({expr}, '{NAMESPACE_SEP}') THEN {expr} "
            f"ELSE {_lit(ns + NAMESPACE_SEP)} || {expr} END")


def _ns_run(expr: str, ns: str) -> str:
    # a run id is <campaign>/<job dir name>: two separators or more say its campaign has a namespace already
    two = f"length({expr}) - length(replace({expr}, '{NAMESPACE_SEP}', '')) >= 2"
    return f"CASE WHEN {expr} IS NULL OR {two} THEN {expr} ELSE {_lit(ns + NAMESPACE_SEP)} || {expr} END"


def _select(table: str, have: set[str], ns: str, file_offset: int) -> str:
    """The SELECT of *table*'s rows from ``_x_src`` as this database stores them: namespaced, cast, and NULL for a
    column the export lacks (written by an older schema)."""
    parts = []
    for col, dtype in SCHEMA[table]:
        if table == "campaigns" and col == "origin":  # published measurements stay a reference campaign
            expr = (f"CASE WHEN s.origin = {_lit(ORIGIN_ADO_CSV)} THEN s.origin ELSE {_lit(ORIGIN_EXPORT)} END"
                    if "origin" in have else _lit(ORIGIN_EXPORT))
        elif table == "campaigns" and col == "imported":
            expr = "(SELECT m.imported FROM _x_meta m WHERE m.campaign = s.campaign)"
        elif col not in have:
            expr = "NULL"
        elif col == "campaign":
            expr = _ns_name(f"s.{q(col)}", ns)
        elif col == "run_id":
            expr = _ns_run(f"s.{q(col)}", ns)
        elif col == "overlapped_with":
            expr = f"list_transform(s.{q(col)}, lambda x: {_ns_run('x', ns)})"
        elif col == "file_id" and table in ("sample_files", "sample_rows"):
            expr = f"s.file_id + {int(file_offset)}"
        else:
            expr = f"s.{q(col)}"
        parts.append(f"CAST({expr} AS {dtype}) AS {q(col)}")
    return ", ".join(parts)


def _filter(table: str, have: set[str]) -> str:
    scope = scope_of(table)
    keep = "(SELECT campaign FROM _x_keep)"
    if scope == CAMPAIGN:
        return f"s.campaign IN {keep}"
    if scope == RUN:
        return f"s.run_id IN (SELECT run_id FROM _x_runs WHERE campaign IN {keep})"
    if scope == FILES:
        return f"s.run_id IN (SELECT run_id FROM _x_runs WHERE campaign IN {keep})"
    if scope == FILE_ROWS:
        return (f"s.file_id IN (SELECT file_id FROM _x_files WHERE run_id IN (SELECT run_id FROM _x_runs "
                f"WHERE campaign IN {keep}))")
    if scope == POINT:
        return "s.point_id NOT IN (SELECT point_id FROM points)"
    if table == "probes":
        return "NOT EXISTS (SELECT 1 FROM probes p WHERE p.probe_id = s.probe_id AND p.host = s.host)"
    if table == "fabric":
        return "s.fabric_id NOT IN (SELECT fabric_id FROM fabric WHERE fabric_id IS NOT NULL)"
    raise ValueError(f"{table} is not imported")


def import_tables(store: Store, tables: Mapping[str, pa.Table], plan: ImportPlan) -> dict[str, int]:
    """Write the rows of *plan*'s campaigns from *tables* (table name -> its Arrow table) inside the caller's
    transaction; returns the rows written per table."""
    import pyarrow as pa  # heavy: only an import reads Arrow tables

    for name in plan.replace:
        delete_campaign(store, name)
    empty = {"runs": pa.table({"run_id": pa.array([], pa.string()), "campaign": pa.array([], pa.string())}),
             "sample_files": pa.table({"file_id": pa.array([], pa.int32()), "run_id": pa.array([], pa.string())})}
    runs = tables.get("runs", empty["runs"])
    files = tables.get("sample_files", empty["sample_files"])
    offset = int(store.con.execute("SELECT coalesce(max(file_id) + 1, 0) FROM sample_files").fetchall()[0][0])
    keep = frame([("campaign", "VARCHAR")], [{"campaign": c} for c in plan.names])
    meta = frame([("campaign", "VARCHAR"), ("imported", "VARCHAR")],
                 [{"campaign": c, "imported": to_json(plan.meta.get(c))} for c in plan.names])
    registered = {"_x_runs": runs.select([c for c in ("run_id", "campaign") if c in runs.column_names]),
                  "_x_files": files.select([c for c in ("file_id", "run_id") if c in files.column_names]),
                  "_x_keep": keep, "_x_meta": meta}
    written: dict[str, int] = {}
    try:
        for name, obj in registered.items():
            store.con.register(name, obj)
        for table in EXPORTED:
            src = tables.get(table)
            if src is None or src.num_rows == 0:
                continue
            store.con.register("_x_src", src)
            try:
                have = set(src.column_names)
                before = int(store.con.execute(f"SELECT count(*) FROM {q(table)}").fetchall()[0][0])
                store.con.execute(f"INSERT INTO {q(table)} SELECT {_select(table, have, plan.namespace, offset)} "
                                  f"FROM _x_src s WHERE {_filter(table, have)}")
                written[table] = int(store.con.execute(f"SELECT count(*) FROM {q(table)}").fetchall()[0][0]) - before
            finally:
                try:
                    store.con.unregister("_x_src")
                except duckdb.Error:
                    pass
    finally:
        for name in registered:
            try:
                store.con.unregister(name)
            except duckdb.Error:  # the transaction failed: the error that did is the one to see
                pass
    return written


def point_ids(store: Store) -> set[str]:
    """Every point id the database has."""
    return {r[0] for r in store.con.execute("SELECT point_id FROM points").fetchall()}


def insert_rows(store: Store, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, int]:
    """Rows of several tables (a published file's campaign), inside the caller's transaction; the caller leaves
    out the points the database has already (:func:`point_ids`)."""
    return {table: store.insert(table, list(items)) for table, items in rows.items()}
