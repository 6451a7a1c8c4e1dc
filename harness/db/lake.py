"""A shared results store: a DuckLake (Parquet files in a shared directory, a Postgres catalog) opened by DuckDB
with the same SQL as a file.

What differs from a DuckDB file, and where it is handled:

- The extensions come from the installed packages ``duckdb-extension-ducklake`` and
  ``duckdb-extension-postgres-scanner`` (``LOAD '<path>'``: never a download); a missing one is an input error
  naming the package (:func:`extension_paths`).
- DuckLake has no primary keys, sequences, indexes or user-defined types: the tables are made without keys (the
  writers' anti-joins keep them unique, as they do in a file), ``sample_kind`` columns are VARCHAR in the lake,
  and the ENUM lives in the connection's own in-memory catalog, where readers of the samples CSV use it
  (:func:`connect`).
- Writers take turns: a write transaction first takes a Postgres advisory lock held until it ends (another
  writer waits for it, up to ``$SBENCH_DB_WAIT``), then marks the ``metadata`` row :data:`WRITER_KEY`, so that
  two writes that somehow overlap conflict at commit instead of both landing (DuckLake lets two appends to one
  table both commit). A commit that conflicts changes nothing: :func:`is_conflict` tells the caller to run
  its work again (collect does).
- Each commit records who made it (``user@host``), the command and the campaigns it touched
  (:func:`commit_note`); ``sbench db snapshots`` lists them and ``--at`` reads the store as one of them left
  it (:func:`attach_options`).
- A reading connection attaches the lake read-only, then locks itself down as a file's does: no files outside
  the data directory, no ATTACH, no SET that lifts it (the statements ``sbench query`` runs are checked too:
  :data:`QUERY_STATEMENTS`).
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import os
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from harness.contract.errors import EmptyStoreError, InputError
from harness.contract.paths import LAKE_SCHEME, Lake

LAKE_ALIAS = "sbench_lake"  # the lake's name inside the connection (USE'd: sbench's SQL names no catalog)
LOCK_ALIAS = "sbench_lock"  # the catalog database attached a second time, for the writers' advisory lock
WRITER_KEY = "lake_writer"  # the metadata row every write transaction marks (see the module docstring)
LOCK_ID = 0x5BE7C4  # the advisory lock's key: one writer at a time per catalog database
EXTENSIONS = {"postgres_scanner": "duckdb-extension-postgres-scanner", "ducklake": "duckdb-extension-ducklake"}
SQL_ONLY_TYPES = {"sample_kind": "VARCHAR"}  # a user-defined type's column in the lake (DuckLake has none)
# What `sbench query` may run on a lake: reads. (On a file the connection's own lock-down is enough; a lake's
# connection must be able to write its data directory's Parquet files, so a COPY TO there is refused here.)
QUERY_STATEMENTS = ("SELECT", "EXPLAIN")


def extension_paths() -> dict[str, Path]:
    """Each extension's file in its installed package, for this DuckDB's version; an :class:`InputError` naming
    the package to install when one is missing."""
    out: dict[str, Path] = {}
    for ext, package in EXTENSIONS.items():
        module = package.replace("-", "_")
        spec = importlib.util.find_spec(module)
        where = Path(spec.origin).parent if spec is not None and spec.origin else None
        path = where / "extensions" / f"v{duckdb.__version__}" / f"{ext}.duckdb_extension" if where else None
        if path is None or not path.is_file():
            found = sorted(p.parent.name for p in where.glob(f"extensions/*/{ext}.duckdb_extension")) if where else []
            had = f" (it has {', '.join(found)} only)" if found else ""
            raise InputError(
                f"a shared store needs DuckDB's {ext} extension for DuckDB {duckdb.__version__}: the package "
                f"{package}=={duckdb.__version__} is not installed{had}. Install it (pip install "
                f"'{package}=={duckdb.__version__}'), or pass a DuckDB file as --db")
        out[ext] = path
    return out


def is_conflict(exc: BaseException) -> bool:
    """Whether *exc* is DuckLake refusing a commit because another writer committed first (nothing was
    written: run the work again)."""
    return isinstance(exc, duckdb.Error) and "conflict" in str(exc).lower() and "commit" in str(exc).lower()


def is_unreachable(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(w in text for w in ("connection to server", "could not connect", "connection refused",
                                   "could not translate host", "no such file or directory", "timeout expired",
                                   "server closed the connection", "password authentication failed",
                                   "definition of service", "no password supplied", "does not exist"))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def attach_options(lake: Lake, *, read_only: bool, at: str | None) -> str:
    """The ATTACH options: the data directory (when given), read-only, and the snapshot *at* (a number: that
    snapshot; else a time)."""
    opts = []
    if lake.data is not None:
        opts.append(f"DATA_PATH {_quote(str(lake.data) + os.sep)}")
    if read_only or at is not None:
        opts.append("READ_ONLY")
    if at is not None:
        opts.append(f"SNAPSHOT_VERSION {int(at)}" if at.isdigit() else f"SNAPSHOT_TIME {_quote(at)}")
    return f" ({', '.join(opts)})" if opts else ""


INIT_RACE = ("failed to initialize ducklake", "duplicate key", "already exists")
INIT_TRIES = 8


def _attach(con: duckdb.DuckDBPyConnection, lake: Lake, *, read_only: bool, at: str | None) -> None:
    """ATTACH the lake. Two processes making a new lake's catalog at once: the one that loses meets the other's
    tables half made, and attaches again once they are there."""
    options = attach_options(lake, read_only=read_only, at=at)
    sql = f"ATTACH {_quote(LAKE_SCHEME + lake.conninfo)} AS {LAKE_ALIAS}{options}"
    for turn in range(INIT_TRIES):
        try:
            con.execute(sql)
            return
        except duckdb.Error as exc:
            text = str(exc).lower()
            if turn + 1 == INIT_TRIES or not (INIT_RACE[0] in text and any(w in text for w in INIT_RACE[1:])):
                raise
            time.sleep(0.2 * (turn + 1))


def connect(lake: Lake, *, read_only: bool, at: str | None, config: dict[str, Any], types: dict[str, str],
            settings: Sequence[str] = ()) -> duckdb.DuckDBPyConnection:
    """A connection to *lake* (its catalog reachable, else an :class:`InputError` naming it): its *settings*
    (SET statements) run, the extensions loaded from their packages, the lake attached and USE'd, the types
    *types* made in the connection's own catalog and put on the search path; a reading connection then locked
    down."""
    paths = extension_paths()
    con = duckdb.connect(":memory:", config=dict(config))
    try:
        for statement in settings:
            con.execute(statement)
        for ext in EXTENSIONS:
            con.execute(f"LOAD {_quote(str(paths[ext]))}")
        for name, definition in types.items():
            con.execute(f"CREATE TYPE memory.main.{name} AS {definition}")
        try:
            _attach(con, lake, read_only=read_only, at=at)
        except duckdb.Error as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "creating a new ducklake is explicitly disabled" in str(exc).lower():
                raise EmptyStoreError(f"{lake}: an empty store, no results database yet; run `sbench collect` "
                                      "first (or pass --db)") from None
            if at is not None and ("snapshot" in text.lower()):
                raise InputError(f"--at {at}: {text}; `sbench db snapshots --db {lake}` lists the snapshots") from None
            if is_unreachable(exc):
                raise InputError(f"{lake}: the catalog cannot be reached: {text}. Check the connection (libpq "
                                 "reads ~/.pgpass, $PGPASSFILE, $PGSERVICEFILE) and that the server runs") from None
            raise InputError(f"{lake}: cannot attach the shared store: {text}") from None
        con.execute(f"USE {LAKE_ALIAS}")
        con.execute(f"SET search_path = '{LAKE_ALIAS}.main,memory.main'")
        if read_only:
            data = data_path(con)
            # A literal: a bound list parameter makes DuckDB's Python client import numpy and pandas (a second).
            con.execute(f"SET allowed_directories = [{_quote(data) if data else ''}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def data_path(con: duckdb.DuckDBPyConnection) -> str | None:
    """The data directory the lake's catalog records."""
    try:
        row = con.execute(f"SELECT value FROM {LAKE_ALIAS}.options() WHERE option_name = 'data_path'").fetchone()
    except duckdb.Error:
        row = None
    if row is None:
        try:
            row = con.execute("SELECT value FROM duckdb_settings() WHERE name = 'ducklake_data_path'").fetchone()
        except duckdb.Error:
            row = None
    return str(row[0]) if row and row[0] else None


def check_writable(lake: Lake, con: duckdb.DuckDBPyConnection) -> None:
    """An :class:`InputError` when the lake's data directory cannot take a file (before anything is written)."""
    where = data_path(con) or (str(lake.data) if lake.data else None)
    if where is None:
        raise InputError(f"{lake}: the store's data directory is unknown: pass --db-data DIR (a directory every "
                         "login node and job reads: NFS, Lustre)")
    d = Path(where)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".sbench-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"{lake}: its data directory {d} cannot be written ({exc.strerror}): fix its "
                         "permissions, or pass --db-data with one this user may write") from None


def attach_lock(lake: Lake, con: duckdb.DuckDBPyConnection) -> None:
    """The catalog database attached a second time (the writers' lock is taken there); an :class:`InputError`
    when this role may read the lake but not write it (before anything is written)."""
    con.execute(f"ATTACH {_quote(lake.conninfo)} AS {LOCK_ALIAS} (TYPE postgres)")
    found = con.execute(
        f"SELECT * FROM postgres_query('{LOCK_ALIAS}', 'SELECT current_user::text, CASE WHEN to_regclass("
        f"''ducklake_snapshot'') IS NULL THEN true ELSE has_table_privilege(''ducklake_snapshot'', ''INSERT'') "
        f"END')").fetchone()
    if found is not None and not found[1]:
        raise InputError(f"{lake}: the role {found[0]} may read this store but not write it: a command that writes "
                         "(collect, submit, import, db maintain) needs the team's writer role")


def take_turn(con: duckdb.DuckDBPyConnection, wait_s: float) -> duckdb.DuckDBPyConnection:
    """Wait (up to *wait_s*) for the writers' advisory lock, taken in a transaction of a second connection (a
    cursor of *con*) and held until :func:`end_turn`: the caller's own transaction commits first, and only then
    may the next writer begin (a lock in the caller's transaction would be let go before the lake's commit
    lands). :class:`TimeoutError` when another writer holds it longer."""
    ms = max(1, int(wait_s * 1000))
    cur = con.cursor()
    try:
        cur.execute("BEGIN TRANSACTION")
        cur.execute(f"CALL postgres_execute('{LOCK_ALIAS}', "
                    f"'SET LOCAL lock_timeout = {ms}; SELECT pg_advisory_xact_lock({LOCK_ID})')")
    except duckdb.Error as exc:
        end_turn(cur)
        if "lock timeout" in str(exc).lower():
            raise TimeoutError(holders(con)) from None
        raise
    return cur


def end_turn(cur: duckdb.DuckDBPyConnection) -> None:
    """Let the next writer go (see :func:`take_turn`)."""
    try:
        cur.execute("ROLLBACK")
    except duckdb.Error:
        pass
    cur.close()


def holders(con: duckdb.DuckDBPyConnection) -> str:
    """Who holds the writers' lock now (user, client address, since when), as text; "" when unknown."""
    try:
        rows = con.execute(
            f"SELECT * FROM postgres_query('{LOCK_ALIAS}', 'SELECT a.usename, coalesce(host(a.client_addr), "
            f"''local''), a.application_name, a.xact_start::text FROM pg_locks l JOIN pg_stat_activity a "
            f"USING (pid) WHERE l.locktype = ''advisory'' AND l.granted AND l.objid = {LOCK_ID}')").fetchall()
    except duckdb.Error:
        return ""
    return "; ".join(f"{u} from {h} since {t}" for u, h, _app, t in rows)


def who() -> str:
    """``user@host`` of this process: what a commit records as its author."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def commit_note(con: duckdb.DuckDBPyConnection, command: str, campaigns: Sequence[str]) -> None:
    """Record on the commit being made: its author (:func:`who`), *command*, and the campaigns it touched."""
    extra = json.dumps({"command": command, "campaigns": sorted(set(campaigns))}, separators=(",", ":"))
    con.execute(f"CALL {LAKE_ALIAS}.set_commit_message(?, ?, extra_info => ?)", [who(), command, extra])


def snapshots(con: duckdb.DuckDBPyConnection, limit: int | None = None) -> list[dict[str, Any]]:
    """The lake's snapshots, newest first: id, time (text, UTC), author, command, campaigns, and what changed."""
    sql = (f"SELECT snapshot_id, strftime(snapshot_time AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%SZ'), author, "
           f"commit_message, commit_extra_info, changes::VARCHAR FROM ducklake_snapshots('{LAKE_ALIAS}') "
           f"ORDER BY snapshot_id DESC" + (f" LIMIT {int(limit)}" if limit else ""))
    out = []
    for sid, at, author, msg, extra, changes in con.execute(sql).fetchall():
        try:
            info = json.loads(extra) if extra else {}
        except ValueError:
            info = {}
        out.append({"snapshot": int(sid), "time": at, "author": author, "command": msg,
                    "campaigns": info.get("campaigns", []) if isinstance(info, dict) else [], "changes": changes})
    return out


_SNAPSHOT_TIME = re.compile(r"^\d{4}-\d\d-\d\d([ T]\d\d:\d\d(:\d\d(\.\d+)?)?)?(Z|[+-]\d\d(:?\d\d)?)?$")


def check_at(at: str) -> str:
    """*at* as ATTACH takes it: a snapshot number, or an ISO time (a date alone is its midnight, UTC unless it
    says); an :class:`InputError` for anything else."""
    text = at.strip()
    if text.isdigit():
        return text
    if _SNAPSHOT_TIME.match(text):
        return text.replace("T", " ").replace("Z", "+00")
    raise InputError(f"--at {at!r}: give a snapshot number (sbench db snapshots lists them) or a time such as "
                     "2026-11-28T09:30Z")


def data_files(con: duckdb.DuckDBPyConnection) -> int:
    """How many Parquet data files the lake's current snapshot reads (every table)."""
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = ? AND table_type = 'BASE TABLE'",
        [LAKE_ALIAS]).fetchall()]
    n = 0
    for t in tables:
        found = con.execute(f"SELECT count(*) FROM ducklake_list_files('{LAKE_ALIAS}', ?)", [t]).fetchone()
        n += int(found[0]) if found else 0
    return n


def maintain(con: duckdb.DuckDBPyConnection, older_than_days: float | None) -> dict[str, Any]:
    """Merge the lake's small Parquet files (many small collects leave many), and with *older_than_days*
    expire the snapshots older than that and delete the files only they read: the files before and after."""
    before = data_files(con)
    con.execute(f"CALL ducklake_merge_adjacent_files('{LAKE_ALIAS}')")
    expired = 0
    if older_than_days is not None:
        found = con.execute(f"CALL ducklake_expire_snapshots('{LAKE_ALIAS}', older_than => now() - "
                            f"to_seconds({float(older_than_days) * 86400.0}))").fetchall()
        expired = len(found)
    con.execute(f"CALL ducklake_cleanup_old_files('{LAKE_ALIAS}', cleanup_all => true)")
    return {"files_before": before, "files_after": data_files(con), "snapshots_expired": expired}


__all__ = ["LAKE_ALIAS", "QUERY_STATEMENTS", "SQL_ONLY_TYPES", "WRITER_KEY", "attach_lock", "check_at",
           "check_writable", "commit_note", "connect", "data_files", "extension_paths", "holders", "is_conflict",
           "maintain", "snapshots", "take_turn", "who"]
