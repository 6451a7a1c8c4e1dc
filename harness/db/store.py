"""The connection to the results database: opening it (and waiting while another process holds the write
lock), creating or checking its schema, transactions, and the generic statements every writer uses.

``open_store(path, wait_s=None)`` opens (and creates) the database for writing. DuckDB allows one writing
process at a time; while another holds the lock it retries for ``wait_s`` seconds (default
``$SBENCH_DB_WAIT`` or 5 s), then raises :class:`StoreBusyError` naming the file and the holder's PID. Use
it as a context manager and keep it open briefly. ``read_only=True`` opens a sandboxed connection for
reading (no ATTACH, no COPY TO, no other files, no extensions).

A database of another schema version is refused with a message that says what to do; so is one whose
tables or views were changed (a writing connection first puts sbench's views back: they hold no data). A
``--db`` that is no DuckDB file is refused before DuckDB sees it, and no connection installs or loads an
extension by itself. ``Store.query`` streams its rows. Every write runs in a transaction. What is written
and read lives in the modules beside this one, one per job (see ``harness/db/__init__.py``); this one knows
no table but ``metadata``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import re
import stat
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import duckdb

from harness.contract import envvars, usercache
from harness.contract.errors import CollectError, EmptyStoreError, InputError, SchemaMismatchError, StoreBusyError
from harness.contract.paths import LAKE_SCHEME, Lake, is_lake_text, parse_lake

from . import lake as lakes
from .bind import LiteralConnection
from .lake import QUERY_STATEMENTS, SQL_ONLY_TYPES, WRITER_KEY, check_at
from .schema import KIND_SQL, PRIMARY_KEYS, RUN_CHILD_TABLES, SCHEMA, SCHEMA_VERSION, TYPES, UPGRADE_FROM, VIEWS, q
from .staging import Staged, check_keys, frame, stage, typed
from .values import COERCE

# Every connection: DuckDB never downloads or loads an extension by itself (a SQLite file passed as --db
# would otherwise make it fetch sqlite_scanner from the network).
OFFLINE_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                  "allow_community_extensions": False}
READ_ONLY_CONFIG = {**OFFLINE_CONFIG, "enable_external_access": False}  # and its configuration locked (below)
# Every connection's own settings, before a reader's configuration is locked: no progress bar (DuckDB draws one
# on stdout for a statement over two seconds, in the middle of a query's CSV or a command's --json).
SESSION_SETTINGS = ("SET enable_progress_bar = false",)
QUERY_BATCH = 10_000  # rows fetched at a time by ``sbench query``
DUCKDB_MAGIC = b"DUCK"  # bytes 8-11 of a DuckDB database file
SQLITE_MAGIC = b"SQLite format 3\x00"


def foreign_file(p: Path) -> str | None:
    """What *p* is when it exists and is not a DuckDB database (None when it is one, is empty or is absent):
    it is never handed to DuckDB, which would try to load a reader extension for it."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_size == 0:
        return None
    try:
        with p.open("rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if head[8:12] == DUCKDB_MAGIC:
        return None
    if head.startswith(SQLITE_MAGIC):
        return "is a SQLite database, not a DuckDB one"
    return "is not a DuckDB database"


FILE_WAIT_S = 5.0  # the default wait for another writer of a DuckDB file (one collect holds it briefly)
LAKE_WAIT_S = 600.0  # ... and of a shared store, where a team's writers take turns (a collect may take minutes)


def _default_wait(lake: bool) -> float:
    try:
        return float(envvars.DB_WAIT.get())
    except ValueError:
        return LAKE_WAIT_S if lake else FILE_WAIT_S


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Could not set lock" in text or "Conflicting lock" in text)


def create_schema(con: duckdb.DuckDBPyConnection, types: Iterable[str] = (), lake: bool = False) -> None:
    """The types (but those named in *types*: they exist), tables (those missing) and views of
    :mod:`harness.db.schema` in *con*'s database. In a *lake*: no keys and no types (DuckLake has neither; a
    column of sbench's type is VARCHAR there, see :mod:`harness.db.lake`)."""
    for name, definition in TYPES.items():
        if name not in set(types) and not lake:
            con.execute(f"CREATE TYPE {q(name)} AS {definition}")
    for table, cols in SCHEMA.items():
        body = ", ".join(f"{q(c)} {SQL_ONLY_TYPES.get(t, t) if lake else t}" for c, t in cols)
        pk = PRIMARY_KEYS.get(table)
        if pk and not lake:
            body += f", PRIMARY KEY ({', '.join(q(c) for c in pk)})"
        con.execute(f"CREATE TABLE IF NOT EXISTS {q(table)} ({body})")
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {q(name)} AS {sql}")


EXPECT_PREFIX = "_sbench_expect_"  # temporary views that show how DuckDB writes sbench's own definitions


def _view_body(sql: str) -> str:
    """The query of a stored view definition (``CREATE [TEMP] VIEW name AS <query>;``)."""
    return sql.split(" AS ", 1)[-1].strip().rstrip(";")


def _round_trip(con: duckdb.DuckDBPyConnection, name: str, sql: str) -> str | None:
    """*sql* as DuckDB writes it back once made a temporary view on *con* (None when it cannot be made)."""
    tmp = q(EXPECT_PREFIX + name)
    try:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {tmp} AS {sql}")
        found = con.execute("SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?",
                            [EXPECT_PREFIX + name]).fetchone()
    except duckdb.Error:
        return None
    finally:
        try:
            con.execute(f"DROP VIEW IF EXISTS temp.{tmp}")
        except duckdb.Error:
            pass
    return _view_body(found[0]) if found is not None else None


_SETTLED: dict[str, str] = {}  # a query's text -> its settled writing, as this process found it (normal_view)


def normal_view(con: duckdb.DuckDBPyConnection, name: str, sql: str) -> str | None:
    """A view's query in DuckDB's own writing, written and read back until it no longer changes: DuckDB 1.5
    writes a stored view's query back a little differently from how it was given (``AS "DOUBLE"``, a UNION's
    parentheses), so a text is compared with another only in this settled form.

    The settled writing is the DuckDB release's rewriting of the text alone, so a text settled once is not made
    again in this process (every store's check settles the same stored views: four temporary views and eight
    statements each time). A text that could not be made (its tables were changed) is tried again each time."""
    known = _SETTLED.get(sql)
    if known is not None:
        return known
    text, again = sql, _round_trip(con, name, sql)
    for _ in range(3):
        if again is None or again == text:
            break
        text, again = again, _round_trip(con, name, again)
    if again is not None:
        _SETTLED[sql] = again
    return again


def view_definitions(con: duckdb.DuckDBPyConnection, *, lake: bool = False) -> dict[str, str]:
    """Each of sbench's views in :func:`normal_view`'s settled writing, made as temporary views on *con* (a
    read-only connection may make them) and dropped again. A view that cannot be made there (its tables were
    changed: reported on their own) is left out.

    The writing depends only on the DuckDB release, the store's kind (*lake*) and sbench's definitions, and
    making them all costs every command about 0.3 s (more on a lake, whose catalog each binding asks): a full set
    is kept in the user's cache (:mod:`harness.contract.usercache`) under those three and read from there."""
    name = f"views-{duckdb.__version__}-{'lake' if lake else 'file'}-{_VIEWS_DIGEST}.json"
    kept = usercache.read(name, _VIEWS_MAX)
    if kept is not None:
        try:
            doc = json.loads(kept)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and set(doc) == set(VIEWS) and all(isinstance(v, str) for v in doc.values()):
            return doc
    out: dict[str, str] = {}
    for view, sql in VIEWS.items():
        found = normal_view(con, view, sql)
        if found is not None:
            out[view] = found
    if len(out) == len(VIEWS):
        usercache.write(name, json.dumps(out, sort_keys=True))
    return out


_VIEWS_DIGEST = hashlib.sha256(json.dumps(VIEWS, sort_keys=True).encode()).hexdigest()[:16]
_VIEWS_MAX = 4 << 20


def upgradable(found: str | None) -> bool:
    """Whether a database of schema version *found* is upgraded in place (from :data:`UPGRADE_FROM` on)."""
    try:
        return found is not None and UPGRADE_FROM <= int(found) < SCHEMA_VERSION
    except ValueError:
        return False


def open_store(path: str | Path | Lake, *, read_only: bool = False, wait_s: float | None = None,
               at: str | None = None) -> Store:
    """Open the results DB, a DuckDB file or a shared store (creating it and its schema unless *read_only*), as
    the snapshot *at* left it when given (a lake only); see :class:`Store`."""
    return Store.open(path, read_only=read_only, wait_s=wait_s, at=at)


_READERS: dict[tuple[str, str, str | None], duckdb.DuckDBPyConnection] = {}  # see Store._open_lake


def _close_readers() -> None:
    for con in _READERS.values():
        try:
            con.close()
        except duckdb.Error:
            pass
    _READERS.clear()


def store_exists(target: str | Path | Lake) -> bool:
    """Whether *target* holds a results database already: a file that exists, or a lake whose schema was made
    (its catalog is asked: an unreachable one is the input error it is)."""
    if isinstance(target, str) and is_lake_text(target):
        target = parse_lake(target)
    if not isinstance(target, Lake):
        return Path(target).is_file()
    try:
        with Store.open(target, read_only=True):
            return True
    except EmptyStoreError:
        return False


def _command() -> str:
    """The command this process runs, as a commit records it (``sbench collect``): the program's name and its
    first word, never the options (a path or a conninfo says nothing the snapshot's campaigns do not)."""
    argv = [a for a in sys.argv[:2] if a]
    name = Path(argv[0]).name if argv else "python"
    word = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else ""
    return f"{name} {word}".strip()


class Store:
    """A connection to the results DB with the schema checked. Not thread-safe."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path | Lake, read_only: bool,
                 wait_s: float = FILE_WAIT_S) -> None:
        # Parameters written into the statements (harness.db.bind): no numpy/pandas/pyarrow import per command.
        self.con = cast(duckdb.DuckDBPyConnection, LiteralConnection(con))
        self.raw = con  # the connection itself: a statement that scans a Python local must run from its frame
        self.path = path
        self.read_only = read_only
        self.lake = isinstance(path, Lake)
        self.wait_s = wait_s
        self._tx_depth = 0
        self._shared = False  # a lake reader's connection this process keeps (see _open_lake)
        self.command = _command()  # what a lake's commits record: the sbench command, the campaigns touched
        self.campaigns: set[str] = set()

    # -- opening -------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path | Lake, *, read_only: bool = False, wait_s: float | None = None,
             at: str | None = None) -> Store:
        if isinstance(path, str) and is_lake_text(path):
            try:
                path = parse_lake(path)
            except ValueError as exc:
                raise InputError(f"--db: {exc}") from None
        if isinstance(path, Lake):
            return cls._open_lake(path, read_only=read_only, wait_s=wait_s, at=at)
        if at is not None:
            raise InputError(f"--at {at}: {path} is a DuckDB file, which keeps no history; --at reads a shared "
                             f"store (--db {LAKE_SCHEME}...) as one of its snapshots left it")
        p = Path(path)
        if read_only and not p.exists():
            raise InputError(f"{p}: no results database here; run `sbench collect` first (or pass --db)")
        what = foreign_file(p)
        if what is not None:
            raise InputError(f"{p}: {what}; sbench's results database is a DuckDB file: pass its path with "
                             f"--db (or ${envvars.DB.name}), or a new path to create one")
        if not read_only:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CollectError(f"cannot create {p.parent}: {exc}") from None
        wait = _default_wait(False) if wait_s is None else wait_s
        deadline = time.monotonic() + max(0.0, wait)
        # A read-only connection is sandboxed: no ATTACH (of a writable link to this very file), no COPY
        # TO, no reading other files, no extensions, and no SET to undo that.
        config = READ_ONLY_CONFIG if read_only else OFFLINE_CONFIG
        while True:
            try:
                con = duckdb.connect(str(p), read_only=read_only, config=dict(config))
                break
            except duckdb.Error as exc:
                if not _is_lock_error(exc):
                    raise CollectError(f"{p}: cannot open the results database: {exc}") from None
                if time.monotonic() >= deadline:
                    m = re.search(r"\(PID (\d+)\)", str(exc))
                    holder = f" (PID {m.group(1)})" if m else ""
                    raise StoreBusyError(
                        f"{p} is in use by another process{holder}; waited {wait:g} s. DuckDB allows one "
                        f"writer at a time: wait for that sbench collect/submit to finish and retry "
                        f"({envvars.DB_WAIT.name}=<seconds> waits longer).") from None
                time.sleep(0.2)
        try:
            for statement in SESSION_SETTINGS + (("SET lock_configuration = true",) if read_only else ()):
                con.execute(statement)
        except BaseException:
            con.close()
            raise
        store = cls(con, p, read_only, wait)
        try:
            store._check_schema()
        except BaseException:
            con.close()
            raise
        return store

    @classmethod
    def _open_lake(cls, lake: Lake, *, read_only: bool, wait_s: float | None, at: str | None) -> Store:
        when = check_at(at) if at is not None else None
        reads = read_only or when is not None
        key = (str(lake), str(lake.data), when)
        wait = _default_wait(True) if wait_s is None else wait_s
        if reads and key in _READERS:  # this process opened it to read before: the same connection, checked
            store = cls(_READERS[key], lake, True, wait)
            store._shared = True
            return store
        con = lakes.connect(lake, read_only=read_only, at=when, config=OFFLINE_CONFIG, types=TYPES,
                            settings=SESSION_SETTINGS)
        store = cls(con, lake, reads, wait)
        try:
            if not store.read_only:
                lakes.check_writable(lake, con)
                lakes.attach_lock(lake, con)
            store._check_schema()
        except duckdb.Error as exc:
            con.close()
            raise CollectError(f"{lake}: {str(exc).splitlines()[0]}") from None
        except BaseException:
            con.close()
            raise
        if reads:
            # A command may open the store to read several times (status: four): a lake's connection costs its
            # extensions' loads, the attach and the schema's check (a second or more, the catalog being a
            # server), so this process keeps it. Each statement still reads the newest snapshot (or *at*'s).
            if not _READERS:
                atexit.register(_close_readers)
            _READERS[key] = con
            store._shared = True
        return store

    def close(self) -> None:
        if not self._shared:
            self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _tables(self) -> set[str]:
        rows = self.con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
            "AND table_catalog = current_database()").fetchall()
        return {r[0] for r in rows}

    def _check_schema(self) -> None:
        tables = self._tables()
        if "metadata" in tables:
            try:
                rows = self.con.execute("SELECT value FROM metadata WHERE key = 'schema_version'").fetchall()
            except duckdb.Error:
                rows = []
            found = rows[0][0] if rows else None
            if upgradable(found):
                if self.read_only:
                    raise SchemaMismatchError(
                        f"{self.path} has results schema version {found}; this sbench uses version {SCHEMA_VERSION} "
                        f"and upgrades it in place (it adds what version {SCHEMA_VERSION} has more; nothing is "
                        f"lost): run `sbench collect --db {self.path}` once (any command that writes the database "
                        "does it), then this command again.")
                self._upgrade(str(found))
                found = str(SCHEMA_VERSION)
            if found != str(SCHEMA_VERSION):
                raise SchemaMismatchError(
                    f"{self.path} has results schema version {found or '(none)'}, but this sbench uses version "
                    f"{SCHEMA_VERSION}. Move the file aside (e.g. mv {self.path} {self.path}.v{found or 'old'}) "
                    f"and run `sbench collect` to rebuild it from the job directories, or use the sbench "
                    f"version that wrote it.")
            problems = self._schema_problems()
            if problems and all(pr.startswith("view ") for pr in problems):
                raise SchemaMismatchError(
                    f"{self.path}: its views were changed ({'; '.join(problems[:5])}"
                    f"{'; ...' if len(problems) > 5 else ''}), so a query could read other rows than sbench's "
                    f"views give. Run `sbench collect --db {self.path}`: a writing command puts sbench's views back "
                    "(they hold no data; nothing is lost).")
            if problems:
                raise SchemaMismatchError(
                    f"{self.path} says schema version {SCHEMA_VERSION} but its tables were changed "
                    f"({'; '.join(problems[:5])}{'; ...' if len(problems) > 5 else ''}). Move the file aside "
                    f"(mv {self.path} {self.path}.damaged) and run `sbench collect` to rebuild it from the job "
                    "directories.")
            return
        if tables:
            raise SchemaMismatchError(
                f"{self.path} is not an sbench results database (it has tables {', '.join(sorted(tables))} but "
                f"no metadata table with a schema_version); pass another --db or move it aside.")
        if self.read_only:  # as good as no database yet: the same input error as a missing file (exit 2)
            what = "an empty store" if self.lake else "an empty file"
            raise EmptyStoreError(f"{self.path}: {what}, no results database yet; run `sbench collect` first "
                             "(or pass --db)")
        with self.transaction():
            if self.lake and self._tables():  # another writer made it while this one waited its turn
                pass
            else:
                create_schema(self.con, lake=self.lake)
                self.con.execute("INSERT INTO metadata VALUES ('schema_version', ?), ('created_by', 'sbench')",
                                 [str(SCHEMA_VERSION)])
                if self.lake:
                    self.con.execute("INSERT INTO metadata VALUES (?, ?)", [WRITER_KEY, lakes.who()])
        if self.lake:
            self._check_schema()

    def _upgrade(self, found: str) -> None:
        """Bring a database of schema *found* (:func:`upgradable`) to :data:`SCHEMA_VERSION` in one transaction:
        the types, tables and columns it lacks are added (a new column is NULL in the rows it already has) and
        the views put back. The manifests' recorded fingerprints are forgotten, so that the next collect records
        every campaign line again and fills what the new columns take from it (``campaigns.cluster``)."""
        with self.transaction():
            types = {r[0] for r in self.con.execute("SELECT type_name FROM duckdb_types() WHERE NOT internal "
                                                    "AND schema_name = 'main'").fetchall()}
            have: dict[str, set[str]] = {}
            for table, col in self.con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                               "WHERE table_schema = 'main' AND table_catalog = current_database()"
                                               ).fetchall():
                have.setdefault(table, set()).add(col)
            for table, cols in SCHEMA.items():
                for col, dtype in cols:
                    if table in have and col not in have[table]:
                        kind = SQL_ONLY_TYPES.get(dtype, dtype) if self.lake else dtype
                        self.con.execute(f"ALTER TABLE {q(table)} ADD COLUMN {q(col)} {kind}")
            create_schema(self.con, types, lake=self.lake)  # the types and tables it lacks, and sbench's views
            self.con.execute("DELETE FROM metadata WHERE starts_with(key, 'manifest:')")
            self.con.execute("UPDATE metadata SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
            self.con.execute("INSERT INTO metadata SELECT 'upgraded_from', ? WHERE NOT EXISTS "
                             "(SELECT 1 FROM metadata WHERE key = 'upgraded_from')", [found])

    def _changed_views(self) -> tuple[list[str], list[str]]:
        """(views that are missing, views whose definition is not sbench's), compared with
        :func:`view_definitions` as DuckDB writes them."""
        stored = {name: _view_body(sql) for name, sql in self.con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND NOT temporary "
            "AND schema_name = 'main' AND database_name = current_database()").fetchall()}
        expected = view_definitions(self.con, lake=self.lake)
        found = {name: normal_view(self.con, name, sql) if name in expected and sql != expected[name] else sql
                 for name, sql in stored.items()}
        missing = [v for v in VIEWS if v not in found]
        replaced = [v for v in VIEWS if v in found and v in expected and found[v] != expected[v]]
        return missing, replaced

    def _restore_views(self) -> None:
        """A writing connection puts back sbench's views where one was dropped or replaced (views hold no data:
        this loses nothing); a name now held by a table stays a problem :meth:`_schema_problems` reports."""
        missing, replaced = self._changed_views()
        tables = self._tables()
        todo = [v for v in VIEWS if v in replaced or (v in missing and v not in tables)]
        if todo:
            with self.transaction():
                for name in todo:
                    self.con.execute(f"CREATE OR REPLACE VIEW {q(name)} AS {VIEWS[name]}")

    def _schema_problems(self) -> list[str]:
        """What differs from :data:`SCHEMA` and :data:`VIEWS`: missing tables, views or columns, a column of
        another type, or a view whose definition is not sbench's (a writing connection restores the views
        first)."""
        if not self.read_only:
            self._restore_views()
        have: dict[str, list[tuple[str, str]]] = {}
        for table, col, dtype in self.con.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'main' AND table_catalog = current_database() "
                "ORDER BY table_name, ordinal_position").fetchall():
            have.setdefault(table, []).append((col, dtype))
        kinds = dict(self.con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                      "WHERE table_schema = 'main' AND table_catalog = current_database()"
                                      ).fetchall())
        problems = []
        for table, cols in SCHEMA.items():
            if kinds.get(table) != "BASE TABLE":
                problems.append(f"table {table} is missing")
                continue
            found = dict(have.get(table, []))
            for col, dtype in cols:
                if col not in found:
                    problems.append(f"{table}.{col} is missing")
                elif dtype in KIND_SQL.values() or dtype in COERCE:
                    if found[col] != dtype and not (dtype == "JSON" and found[col] == "JSON"):
                        problems.append(f"{table}.{col} is {found[col]}, not {dtype}")
        missing, replaced = self._changed_views()
        for view in VIEWS:
            if kinds.get(view) not in (None, "VIEW"):
                problems.append(f"table {view} holds the name of sbench's view {view}")
            elif kinds.get(view) is None or view in missing:
                problems.append(f"view {view} is missing")
            elif view in replaced:
                problems.append(f"view {view} was replaced by another definition")
        return problems

    # -- transactions --------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; nested uses join the outer one."""
        if self._tx_depth:
            self._tx_depth += 1
            try:
                yield
            finally:
                self._tx_depth -= 1
            return
        with self.writers_turn() as taken:
            self.con.execute("BEGIN TRANSACTION")
            self._tx_depth = 1
            try:
                if taken:
                    self._mark_writer()
                yield
                if taken:
                    lakes.commit_note(self.con, self.command, sorted(self.campaigns))
            except BaseException:
                self._tx_depth = 0
                try:
                    self.con.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                raise
            self._tx_depth = 0
            self.con.execute("COMMIT")

    @contextmanager
    def writers_turn(self) -> Iterator[bool]:
        """A lake writer's turn, held until the block ends (whether this writer took one: a file's writer holds
        the file, a reader writes nothing). :meth:`transaction` runs in one; so does maintenance, whose calls
        commit on their own."""
        turn = self._take_turn() if self.lake and not self.read_only else None
        try:
            yield turn is not None
        finally:
            if turn is not None:
                lakes.end_turn(turn)

    def _take_turn(self) -> duckdb.DuckDBPyConnection:
        """A lake writer's turn (:mod:`harness.db.lake`): the writers' lock, held by a second connection until
        this one's transaction has committed (so the next writer starts from what it wrote)."""
        try:
            return lakes.take_turn(self.con, self.wait_s)
        except TimeoutError as exc:
            held = f" (held by {exc})" if str(exc) else ""
            raise StoreBusyError(
                f"{self.path}: another sbench process is writing{held}; waited {self.wait_s:g} s. Writers of a "
                f"shared store take turns: retry when it is done ({envvars.DB_WAIT.name}=<seconds> waits "
                "longer).") from None

    def _mark_writer(self) -> None:
        """The mark that makes two overlapping writes conflict at commit, should the lock ever fail to part them."""
        if self._tables() >= {"metadata"}:
            self.con.execute("UPDATE metadata SET value = ? WHERE key = ?", [lakes.who(), WRITER_KEY])

    def note_campaigns(self, campaigns: Iterable[str]) -> None:
        """Campaigns this connection's writes touch: a lake's commit records them (``sbench db snapshots``)."""
        self.campaigns.update(c for c in campaigns if c)

    # -- generic helpers -----------------------------------------------------------------------------------
    def insert(self, table: str, rows: Sequence[Mapping[str, Any]] | Staged) -> int:
        """Insert *rows* (dicts, or :func:`stage`'s typed columns, built ahead without the database)."""
        staged = rows if isinstance(rows, Staged) else stage(table, rows)
        if not staged.rows:
            return 0
        # Read by DuckDB's scan of this frame's local (not register(): a view registered and dropped inside a
        # transaction keeps its Python objects until the commit, so a long import or collect grew by every row).
        _sbench_stage = staged.columns  # noqa: F841 - named in the statement
        cols = ", ".join(f"CAST({q(c)} AS {t}) AS {q(c)}" for c, t in SCHEMA[table])
        self.raw.execute(f"INSERT INTO {q(table)} BY NAME SELECT {cols} FROM _sbench_stage")
        return staged.rows

    def delete_runs(self, run_ids: Sequence[str], tables: Iterable[str] = RUN_CHILD_TABLES) -> None:
        if not run_ids:
            return
        self.con.register("_sbench_ids", frame([("run_id", "VARCHAR")], [{"run_id": r} for r in run_ids]))
        try:
            for t in tables:
                if t == "sample_files":
                    self.con.execute("DELETE FROM sample_rows WHERE file_id IN (SELECT file_id FROM sample_files "
                                     "WHERE run_id IN (SELECT run_id FROM _sbench_ids))")
                self.con.execute(f"DELETE FROM {q(t)} WHERE run_id IN (SELECT run_id FROM _sbench_ids)")
        finally:
            self.con.unregister("_sbench_ids")

    def upsert(self, table: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                keep_when_null: bool = False) -> None:
        """Insert rows whose key is new; update *columns* of existing rows only where a value differs
        (so re-recording the same rows rewrites nothing). With *keep_when_null* a NULL in *rows* leaves
        the stored value alone."""
        if not rows:
            return
        check_keys(table, rows)
        key = PRIMARY_KEYS[table]
        types = dict(SCHEMA[table])
        cols = list(dict.fromkeys([*key, *columns]))
        # Later duplicates of a key win (a manifest is append-only: the last line is the newest word).
        latest: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        for r in rows:
            latest[tuple(r.get(k) for k in key)] = r
        self.con.register("_sbench_up", typed([(c, types[c]) for c in cols], list(latest.values())))
        try:
            self.con.execute("CREATE OR REPLACE TEMP TABLE _sbench_up_t AS SELECT "
                             + ", ".join(f"CAST({q(c)} AS {types[c]}) AS {q(c)}" for c in cols) + " FROM _sbench_up")
            on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key)
            upd = [c for c in columns if c not in key]
            if upd:
                if keep_when_null:
                    sets = ", ".join(f"{q(c)} = coalesce(s.{q(c)}, t.{q(c)})" for c in upd)
                    differs = " OR ".join(f"(s.{q(c)} IS NOT NULL AND t.{q(c)} IS DISTINCT FROM s.{q(c)})"
                                          for c in upd)
                else:
                    sets = ", ".join(f"{q(c)} = s.{q(c)}" for c in upd)
                    differs = " OR ".join(f"t.{q(c)} IS DISTINCT FROM s.{q(c)}" for c in upd)
                self.con.execute(f"UPDATE {q(table)} AS t SET {sets} FROM _sbench_up_t AS s WHERE {on} AND ({differs})")
            self.con.execute(
                f"INSERT INTO {q(table)} ({', '.join(q(c) for c in cols)}) "
                f"SELECT {', '.join('s.' + q(c) for c in cols)} FROM _sbench_up_t AS s "
                f"WHERE NOT EXISTS (SELECT 1 FROM {q(table)} AS t WHERE {on})")
        finally:
            self.con.unregister("_sbench_up")
            self.con.execute("DROP TABLE IF EXISTS _sbench_up_t")

    def fetch_dicts(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def get_metadata(self, key: str) -> str | None:
        rows = self.con.execute("SELECT value FROM metadata WHERE key = ?", [key]).fetchall()
        return rows[0][0] if rows else None

    def set_metadata(self, key: str, value: str) -> None:
        """Record *value* under *key* (nothing is written when it is there already)."""
        found = self.get_metadata(key)
        if found == value:
            return
        if found is None:
            self.con.execute("INSERT INTO metadata (key, value) VALUES (?, ?)", [key, value])
        else:
            self.con.execute("UPDATE metadata SET value = ? WHERE key = ?", [value, key])

    # -- query ---------------------------------------------------------------------------------------------
    def query(self, sql: str, batch: int = QUERY_BATCH) -> tuple[list[str], Iterator[tuple[Any, ...]]]:
        """Run user SQL: its column names and its rows, streamed *batch* at a time (never all in memory, so a
        40-million-row result costs no more than a small one). Errors become :class:`InputError` (exit 2)
        with DuckDB's message, also while the rows are read."""
        if self.lake:
            self._check_reads(sql)
        try:
            cur = self.con.execute(sql)
        except duckdb.Error as exc:
            raise InputError(f"SQL error: {exc}") from None
        if cur.description is None:
            return [], iter(())

        def rows() -> Iterator[tuple[Any, ...]]:
            while True:
                try:
                    chunk = cur.fetchmany(batch)
                except duckdb.Error as exc:
                    raise InputError(f"SQL error: {exc}") from None
                if not chunk:
                    return
                yield from chunk

        return [d[0] for d in cur.description], rows()

    def _check_reads(self, sql: str) -> None:
        """A lake's query runs reads only (see :data:`~harness.db.lake.QUERY_STATEMENTS`)."""
        try:
            statements = self.con.extract_statements(sql)
        except duckdb.Error as exc:
            raise InputError(f"SQL error: {exc}") from None
        for st in statements:
            kind = st.type.name if hasattr(st.type, "name") else str(st.type)
            if kind.removesuffix("_STATEMENT") not in QUERY_STATEMENTS:
                raise InputError(f"{kind.removesuffix('_STATEMENT')} is not allowed here: a query of a shared store "
                                 "reads (SELECT, WITH ... SELECT, EXPLAIN), and writes nothing anywhere")

    def count_rows(self, sql: str) -> int | None:
        """How many rows *sql* gives in all (a stream of it still being read is abandoned): DuckDB counts them
        when the statement is a query it can wrap, else its rows are streamed again and counted; None when
        the statement cannot run twice."""
        body = sql.strip().rstrip(";").strip()
        try:
            found = self.con.execute(f"SELECT count(*) FROM (\n{body}\n)").fetchone()
            if found is not None:
                return int(found[0])
        except duckdb.Error:
            pass
        try:
            _, again = self.query(sql)
            return sum(1 for _ in again)
        except InputError:
            return None


