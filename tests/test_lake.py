"""The shared results store (``--db ducklake:postgres:<conninfo>``, a real Postgres from tests/pg/pg.sh) against
a DuckDB file: every command answers the same from either; writers at once lose and double nothing; a killed
collect or a stopped Postgres leaves the last snapshot whole; history is read back with --at; a file's history
moves in whole; and the store's access rules (no password from sbench, a read-only query sandbox, a reader role,
clear errors for an unreachable catalog or data path) hold.

The campaigns are the session's trained ones, collected into a fresh lake per test (no test trains)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from harness.db.schema import SCHEMA

from .kit import TRAINED_CAMPAIGNS, Trained, sbench
from .kit.cli import command
from .kit.lake import PASSWORDS, READER, PgServer, start_server

FIRST, SECOND = TRAINED_CAMPAIGNS
pytestmark = [pytest.mark.slow(25)]


def _json(proc: Any) -> Any:
    return json.loads(proc.stdout)


def _collect(db: str, data: Path, workdir: Path, *extra: Any, ok: tuple[int, ...] = (0,)) -> Any:
    return sbench("collect", "--workdir", workdir, "--db", db, "--db-data", data, "--json", *extra, ok=ok)


def _counts(db: str | Path) -> dict[str, tuple[int, int]]:
    """Per table: (rows, distinct run ids where the table has run_id) as sbench query reads them."""
    parts = []
    for table, cols in SCHEMA.items():
        distinct = "count(DISTINCT run_id)" if "run_id" in dict(cols) else "0"
        parts.append(f"SELECT '{table}' AS t, count(*) AS n, {distinct} AS d FROM {table}")
    rows = _json(sbench("query", " UNION ALL ".join(parts), "--db", db, "--format", "json"))
    return {r["t"]: (r["n"], r["d"]) for r in rows if r["t"] != "metadata"}


def _same_answers(cmd: list[Any], file_db: Path, lake_db: str, ok: tuple[int, ...] = (0,)) -> Any:
    """Run *cmd* on the file and on the lake: the same exit code and the same output (the store's own name
    aside)."""
    a = sbench(*cmd, "--db", file_db, ok=ok)
    b = sbench(*cmd, "--db", lake_db, ok=ok)
    assert a.returncode == b.returncode, (a.stdout + a.stderr, b.stdout + b.stderr)
    norm_a = (a.stdout + a.stderr).replace(str(file_db), "<DB>")
    norm_b = (b.stdout + b.stderr).replace(lake_db, "<DB>")
    parts_a, parts_b = _NUMBER.split(norm_a), _NUMBER.split(norm_b)
    assert parts_a[::2] == parts_b[::2], cmd  # every word and every separator the same
    for x, y in zip(parts_a[1::2], parts_b[1::2], strict=True):
        assert x == y or math.isclose(float(x), float(y), rel_tol=1e-12), (cmd, x, y)
    return a


# A number as the commands print one. The samples' averages are compensated sums (fsum) taken in parallel: a
# store that keeps its rows in other blocks (a lake's Parquet files, a file's row groups) may combine the partial
# sums in another order and differ in the last bit, so numbers agree to 1e-12 and everything else exactly.
_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def test_every_command_answers_the_same_from_a_lake_as_from_a_file(trained: Trained, lake: tuple[str, Path],
                                                                   pg_server: PgServer, tmp_path: Path) -> None:
    db, data = lake
    db2, data2 = pg_server.new_lake(tmp_path / "data2")
    rep = _json(_collect(db, data, trained.workdir))
    assert rep["new"] == len(_json(sbench("query", "SELECT run_id FROM runs", "--db", trained.db,
                                          "--format", "json")))
    assert _counts(db) == _counts(trained.db)
    for cmd, ok in ([["status", "--campaign", FIRST, "--workdir", trained.workdir, "--json"], (0,)],
                    [["compare", FIRST, SECOND, "--json"], (0, 1)],
                    [["compare", FIRST, SECOND, "--metric", "train_runtime"], (0, 1)],
                    [["check", SECOND, "--json"], (0, 1, 2)],
                    [["hosts", "--json", "--all"], (0,)],
                    [["scaling", FIRST, "--json"], (0, 2)],
                    [["best", FIRST, "--json", "--workdir", trained.workdir], (0, 2)],
                    [["query", "SELECT * FROM latest_measurements ORDER BY run_id", "--format", "csv"], (0,)],
                    [["query", "SELECT * FROM point_status ORDER BY 1, 2", "--format", "csv"], (0,)]):
        _same_answers(cmd, trained.db, db, ok)
    # The report: the same page but for the store's name, and the same summary.
    pages = {}
    for name, store in (("file", trained.db), ("lake", db)):
        out = tmp_path / f"{name}.html"
        res = sbench("report", "--campaign", FIRST, "-o", out, "--db", store)
        pages[name] = res.stdout.split(":", 1)[1]
    assert pages["file"] == pages["lake"]
    # An export from the lake holds the same Parquet bytes as one from the file (of the same collect: a collect
    # stamps its runs with its time).
    sbench("db", "copy", trained.db, "--db", db2, "--db-data", data2)
    for name, store in (("file", trained.db), ("lake", db2)):
        sbench("export", *TRAINED_CAMPAIGNS, "-o", tmp_path / f"export-{name}", "--db", store)
    prov = {n: json.loads((tmp_path / f"export-{n}" / "provenance.json").read_text()) for n in ("file", "lake")}
    assert {t: e["sha256"] for t, e in prov["file"]["tables"].items()} == \
        {t: e["sha256"] for t, e in prov["lake"]["tables"].items()}
    # An export imports into a lake as into a file (the campaigns under their cluster's name); preflight records
    # its device figures there, and hosts reads them back.
    imp = _json(sbench("import", tmp_path / "export-file", "--db", db, "--json"))
    assert set(imp["campaigns"].values()) == {"imported"}
    names = _json(sbench("query", "SELECT campaign FROM campaigns ORDER BY 1", "--db", db, "--format", "json"))
    assert len(names) == 2 * len(TRAINED_CAMPAIGNS)
    sbench("preflight", "--seconds", "0.2", "--workdir", tmp_path / "pf", "--db", db, "--json", ok=(0, 1))
    figures = _json(sbench("query", "SELECT count(*) AS n FROM preflight", "--db", db, "--format", "json"))
    assert figures[0]["n"] > 0
    # A submit of the same sweep on the lake decides from the lake's history: every point measured, nothing runs.
    copy = trained.copy(tmp_path / "copy")
    _collect(db, data, copy.workdir)
    sub = _json(sbench("submit", copy.sweep, "-i", copy.inventory, "--executor", "local", "--workdir", copy.workdir,
                       "--db", db, "--json", "--campaign", FIRST))
    assert sub["submitted"] == 0 and sub["points"]
    assert all(p["action"] == "skip" and "already measured" in p["reason"] for p in sub["points"])
    res = sbench("retry", FIRST, "--workdir", copy.workdir, "--db", db, ok=(0,))
    assert "0 attempt(s) submitted" in res.stdout


def test_two_collects_at_once_of_the_same_campaigns_leave_each_run_once(trained: Trained, lake: tuple[str, Path],
                                                                        tmp_path: Path) -> None:
    db, data = lake
    procs = [subprocess.Popen(command("collect", "--workdir", trained.workdir, "--db", db, "--db-data", data,
                                      "--json", *(["--campaign", c] if c else [])),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
             for c in (None, None, FIRST, SECOND)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    reports = [json.loads(o) for o, _ in outs]
    expected = _counts(trained.db)
    assert _counts(db) == expected  # each run once in every table, whoever wrote it
    # One collect recorded each run; the others found it there (or recorded another campaign's runs).
    total_runs = expected["runs"][0]
    assert sum(r["new"] for r in reports) == total_runs
    snaps = _json(sbench("db", "snapshots", "--db", db, "--json", "--limit", "0"))
    writers = [s for s in snaps if s["command"] == "python -m collect" or "collect" in (s["command"] or "")]
    assert writers and all(s["author"] and "@" in s["author"] for s in writers)
    touched = {c for s in writers for c in s["campaigns"]}
    assert touched == set(TRAINED_CAMPAIGNS)


def test_at_reads_the_store_as_an_earlier_snapshot_left_it(trained: Trained, lake: tuple[str, Path]) -> None:
    db, data = lake
    _collect(db, data, trained.workdir, "--campaign", FIRST)
    first = _json(sbench("db", "snapshots", "--db", db, "--json", "--limit", "1"))[0]
    assert first["campaigns"] == [FIRST]
    _collect(db, data, trained.workdir, "--campaign", SECOND)
    now = _json(sbench("query", "SELECT DISTINCT campaign FROM runs ORDER BY 1", "--db", db, "--format", "json"))
    then = _json(sbench("query", "SELECT DISTINCT campaign FROM runs ORDER BY 1", "--db", db, "--format", "json",
                        "--at", first["snapshot"]))
    assert [r["campaign"] for r in now] == [FIRST, SECOND]
    assert [r["campaign"] for r in then] == [FIRST]
    # Yesterday's verdict shown again: compare at the first snapshot cannot see the second campaign.
    later = sbench("compare", FIRST, SECOND, "--db", db, "--json", ok=(0, 1))
    earlier = sbench("compare", FIRST, SECOND, "--db", db, "--json", "--at", first["snapshot"], ok=(0, 1, 2))
    assert _json(later)["rows"] and earlier.stdout != later.stdout
    # --at on a file, or of a snapshot that is not there: input errors that say why.
    res = sbench("query", "SELECT 1", "--db", trained.db, "--at", "1", ok=(2,))
    assert "keeps no history" in res.stderr
    res = sbench("query", "SELECT 1", "--db", db, "--at", "yesterday", ok=(2,))
    assert "snapshot number" in res.stderr


def test_a_files_whole_history_moves_into_a_lake_and_a_full_lake_refuses_a_copy(trained: Trained,
                                                                               lake: tuple[str, Path]) -> None:
    db, data = lake
    rep = _json(sbench("db", "copy", trained.db, "--db", db, "--db-data", data, "--json"))
    assert rep["rows"]["runs"] == _counts(trained.db)["runs"][0] > 0
    assert _counts(db) == _counts(trained.db)
    _same_answers(["compare", FIRST, SECOND, "--json"], trained.db, db, (0, 1))
    res = sbench("db", "copy", trained.db, "--db", db, ok=(2,))
    assert "holds results already" in res.stderr
    assert _counts(db) == _counts(trained.db)


def test_a_killed_collect_leaves_the_last_snapshot_and_the_next_one_completes_and_maintenance_waits_its_turn(
        trained: Trained, lake: tuple[str, Path]) -> None:
    db, data = lake
    _collect(db, data, trained.workdir, "--campaign", FIRST)
    before = _counts(db)
    proc = subprocess.Popen(command("collect", "--workdir", trained.workdir, "--db", db, "--db-data", data),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SBENCH_COLLECT_PAUSE_AT": "commit", "SBENCH_COLLECT_PAUSE_S": "60"})
    _wait_for_pause(proc)
    # Maintenance takes its turn too: while the collect holds the writers' turn, it waits, then says who writes.
    busy = sbench("db", "maintain", "--db", db, "--db-data", data, ok=(1,), env={"SBENCH_DB_WAIT": "1"})
    assert "another sbench process is writing" in busy.stderr and "waited 1 s" in busy.stderr, busy.stderr
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _counts(db) == before  # nothing of the killed collect's transaction
    _collect(db, data, trained.workdir)
    assert _counts(db) == _counts(trained.db)


def _wait_for_pause(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        if "paused at" in line:
            return
        assert time.monotonic() < deadline, "collect never reached its pause"
    raise AssertionError(f"collect ended before its pause: exit {proc.wait()}")


def test_a_postgres_that_stops_mid_collect_is_exit_1_with_the_reason_and_the_next_collect_completes(
        trained: Trained, tmp_path: Path, pg_server: PgServer) -> None:
    # A Postgres of this test's own (stopping the session's would stop the other tests' stores), in a directory
    # the postgres user can reach (the test's own is private to root).
    where = Path(tempfile.mkdtemp(prefix="sbench-pg-"))
    own = start_server(where, pg_server.port + 1 + (os.getpid() % 400))
    try:
        db, data = own.new_lake(tmp_path / "data")
        env = {**os.environ, **own.env}
        proc = subprocess.Popen(command("collect", "--workdir", trained.workdir, "--db", db, "--db-data", data),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**env, "SBENCH_COLLECT_PAUSE_AT": "write", "SBENCH_COLLECT_PAUSE_S": "5"})
        _wait_for_pause(proc)
        own.stop()
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, out + err
        assert "Traceback" not in err and "internal error" not in err
        assert "collect failed and changed nothing" in err or "cannot be reached" in err, err
        own.start()
        res = sbench("collect", "--workdir", trained.workdir, "--db", db, "--db-data", data, "--json",
                     env=own.env)
        assert _json(res)["runs"] > 0
        assert _counts_env(db, own.env) == _counts(trained.db)
    finally:
        own.stop()
        shutil.rmtree(where, ignore_errors=True)


def _counts_env(db: str, env: dict[str, str]) -> dict[str, tuple[int, int]]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _counts(db)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_access_no_password_from_sbench_a_sandboxed_query_and_a_reader_that_cannot_write(
        trained: Trained, lake: tuple[str, Path], pg_server: PgServer, tmp_path: Path) -> None:
    db, data = lake
    # A password in --db is refused before anything is opened.
    res = sbench("status", "--db", db + f" password={PASSWORDS[0]}", ok=(2,))
    assert "password" in res.stderr and PASSWORDS[0] not in res.stderr
    _collect(db, data, trained.workdir)
    # No password in anything sbench wrote: the lake's data, the report, an export.
    sbench("report", "--campaign", FIRST, "-o", tmp_path / "r.html", "--db", db)
    sbench("export", FIRST, "-o", tmp_path / "exp", "--db", db)
    for root in (data, tmp_path / "exp"):
        for p in root.rglob("*"):
            if p.is_file():
                blob = p.read_bytes()
                assert not any(pw.encode() in blob for pw in PASSWORDS), p
    assert not any(pw in (tmp_path / "r.html").read_text() for pw in PASSWORDS)
    # query reads, and nothing else, on a lake.
    for sql in ("COPY (SELECT 1) TO '" + str(data / "x.csv") + "'", "ATTACH '/tmp/x.duckdb' AS x",
                "INSERT INTO metadata VALUES ('k', 'v')", "SET enable_external_access = true",
                "LOAD postgres_scanner", "DETACH sbench_lake",
                "CALL postgres_execute('__ducklake_metadata_sbench_lake', 'DROP TABLE ducklake_snapshot')",
                "SELECT * FROM read_csv('/etc/passwd')"):
        res = sbench("query", sql, "--db", db, ok=(2,))
        assert res.stderr.startswith("Error:"), (sql, res.stderr)
    assert not (data / "x.csv").exists()
    assert _counts(db) == _counts(trained.db)
    # The reader role reads everything and writes nothing.
    reader_db = db.replace("user=bench", f"user={READER}")
    _same_answers(["compare", FIRST, SECOND, "--json"], trained.db, reader_db, (0, 1))
    res = sbench("collect", "--workdir", trained.workdir, "--db", reader_db, ok=(2,))
    assert f"role {READER} may read" in res.stderr, res.stderr
    assert _counts(db) == _counts(trained.db)


def test_an_unreachable_catalog_or_an_unwritable_data_path_is_exit_2_before_anything_is_written(
        trained: Trained, lake: tuple[str, Path], pg_server: PgServer, tmp_path: Path) -> None:
    db, data = lake
    closed = db.replace(f"port={pg_server.port}", "port=1")
    res = sbench("collect", "--workdir", trained.workdir, "--db", closed, "--db-data", data, ok=(2,))
    assert "catalog cannot be reached" in res.stderr
    assert not data.exists()
    if os.getuid() == 0:  # root writes anywhere: a file where the directory should be stands in
        (tmp_path / "file").write_text("x")
        bad = tmp_path / "file" / "d"
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        bad = tmp_path / "ro" / "lake"
    res = sbench("collect", "--workdir", trained.workdir, "--db", db, "--db-data", bad, ok=(2,))
    assert "cannot be written" in res.stderr and str(bad) in res.stderr, res.stderr
    res = sbench("status", "--db", db, ok=(0, 2))
    assert "no results database yet" in res.stderr or res.returncode == 0


def test_a_lake_of_a_newer_schema_is_refused_by_name(trained: Trained, lake: tuple[str, Path]) -> None:
    db, data = lake
    _collect(db, data, trained.workdir, "--campaign", FIRST)
    import duckdb

    from harness.contract.paths import parse_lake
    from harness.db import lake as lakes

    con = lakes.connect(parse_lake(db), read_only=False, at=None, config={}, types={})
    con.execute("UPDATE metadata SET value = '99' WHERE key = 'schema_version'")
    con.close()
    res = sbench("status", "--db", db, ok=(1, 2))
    assert "schema version 99" in res.stderr
    assert isinstance(duckdb.__version__, str)


def test_maintenance_merges_the_small_files_many_collects_leave(trained: Trained, lake: tuple[str, Path]) -> None:
    db, data = lake
    for c in TRAINED_CAMPAIGNS:
        _collect(db, data, trained.workdir, "--campaign", c)
    before = _counts(db)
    rep = _json(sbench("db", "maintain", "--db", db, "--json"))
    assert rep["files_after"] <= rep["files_before"]
    assert _counts(db) == before
    for c in ("maintain", "snapshots"):
        res = sbench("db", c, "--db", trained.db, ok=(0, 2))
        assert res.returncode == (0 if c == "maintain" else 2)


def test_a_missing_extension_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import duckdb

    from harness.contract.errors import InputError
    from harness.db import lake as lakes

    monkeypatch.setattr(duckdb, "__version__", "9.9.9")
    with pytest.raises(InputError, match=r"duckdb-extension-postgres-scanner==9\.9\.9"):
        lakes.extension_paths()
