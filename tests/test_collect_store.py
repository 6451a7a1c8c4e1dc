"""The results store: schema, versioning, the manifest/status API for submit, and the CLI."""

from __future__ import annotations

import json

import duckdb
import pytest

from harness.contract.errors import InputError, SchemaMismatchError
from harness.db.manifest import record_manifest
from harness.db.runs import replace_runs
from harness.db.schema import ENTITY_COLUMNS, SCHEMA_VERSION
from harness.db.status import attempt_rows, next_attempt, point_status, status_rows
from harness.db.store import open_store
from harness.db.values import from_json, to_json

from .kit import jobdirs, sbench

EXP = "finetune_lora_benchmark-v1.0.0"


def manifest(campaign="scan", n=3, executor="slurm"):
    evs = [jobdirs.manifest_events(campaign, EXP, executor)]
    for i in range(n):
        ent = jobdirs.entity_for(EXP, batch_size=8 * (i + 1),
                                 fast_kernels=["True", "False", "True"] if i == 0 else None)
        pid = f"{i:016x}"
        evs.append({"type": "point", "campaign": campaign, "point_id": pid, "repeat": 0, "experiment": EXP,
                    "entity": ent, "valid": i != 2, "reasons": [] if i != 2 else ["batch_size % number_gpus != 0"],
                    "notes": []})
        if i != 2:
            evs.append({"type": "attempt", "campaign": campaign, "point_id": pid, "repeat": 0, "attempt": 1,
                        "job_dir": f"/abs/results/runs/{campaign}/{pid}.r0.a1", "executor": executor,
                        "job_id": f"1234_{i}", "array_job_id": "1234", "array_task_id": i,
                        "submitted_at": "2025-11-21T10:00:01+00:00", "reason": "new"})
    return evs


def table_dump(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall()
                for t in ("campaigns", "points", "campaign_points", "runs")}
    finally:
        con.close()


def test_schema_created_with_version_and_typed_entity_columns(tmp_path):
    db = tmp_path / "sub" / "r.duckdb"
    with open_store(db) as st:
        assert st.con.execute("SELECT value FROM metadata WHERE key = 'schema_version'").fetchall() == [
            (str(SCHEMA_VERSION),)]
        types = dict(st.con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                    "WHERE table_name = 'points'").fetchall())
        views = {r[0] for r in st.con.execute("SELECT table_name FROM information_schema.tables "
                                              "WHERE table_type = 'VIEW'").fetchall()}
    assert types["batch_size"] == "BIGINT" and types["num_train_epochs"] == "DOUBLE"
    assert types["gradient_checkpointing"] == "BOOLEAN" and types["model_name"] == "VARCHAR"
    assert types["fast_kernels"] == "VARCHAR[]" and types["r"] == "BIGINT"
    assert {"latest_measurements", "run_summary", "stage_durations", "point_status"} <= views
    # every entity-space field of every experiment is a column
    from harness.spec.catalog import EXPERIMENTS
    names = {c for c, _ in ENTITY_COLUMNS}
    assert all(f.name in names for e in EXPERIMENTS.values() for f in e.fields)


def test_schema_mismatch_is_refused_clearly(tmp_path):
    db = tmp_path / "r.duckdb"
    open_store(db).close()
    con = duckdb.connect(str(db))
    con.execute("UPDATE metadata SET value = '0' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(SchemaMismatchError) as exc:
        open_store(db)
    msg = str(exc.value)
    assert str(db) in msg and "version 0" in msg and f"version {SCHEMA_VERSION}" in msg
    assert "sbench collect" in msg and "mv " in msg
    res = sbench("query", "select 1", "--db", db, in_process=True, ok=None)
    assert res.exit_code == 1 and "schema version 0" in res.output


def test_foreign_duckdb_file_is_refused(tmp_path):
    db = tmp_path / "other.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE t (x INT)")
    con.close()
    with pytest.raises(SchemaMismatchError, match="not an sbench results database"):
        open_store(db)


def test_record_manifest_is_idempotent_and_feeds_point_status(tmp_path):
    db = tmp_path / "r.duckdb"
    evs = manifest()
    with open_store(db) as st:
        assert record_manifest(st, evs) == []
    first = table_dump(db)
    with open_store(db) as st:
        record_manifest(st, evs)
        record_manifest(st, evs[:3])
    assert table_dump(db) == first
    with open_store(db) as st:
        runs = attempt_rows(st, "scan")
        assert [(r["job_id"], r["state"], r["outcome"]) for r in runs] == [("1234_0", "SUBMITTED", None),
                                                                           ("1234_1", "SUBMITTED", None)]
        status = point_status(st, "scan")
        assert set(status) == {f"{i:016x}" for i in range(3)}
        assert status[f"{0:016x}"].pending == 1 and status[f"{0:016x}"].attempts == 1
        assert status[f"{2:016x}"].attempts == 0  # invalid point: no attempt
        # collect's later verdict survives a re-recorded manifest
        st.con.execute("UPDATE runs SET state = 'COMPLETED', outcome = 'failed' WHERE job_id = '1234_0'")
        record_manifest(st, evs)
        assert point_status(st, point_ids=[f"{0:016x}"])[f"{0:016x}"].failed == 1
        assert next_attempt(st, "scan", f"{0:016x}", 0) == 2
        rows = status_rows(st, "scan")
        assert [(r["point_id"][-1], r["valid"], r["state"]) for r in rows] == [
            ("0", True, "COMPLETED"), ("1", True, "SUBMITTED"), ("2", False, None)]
        assert st.con.execute("SELECT fast_kernels, batch_size FROM points WHERE point_id = ?",
                              [f"{0:016x}"]).fetchall() == [(["True", "False", "True"], 8)]
        # a cancel line marks the run
        record_manifest(st, [{"type": "cancel", "campaign": "scan", "job_ids": ["1234_1"],
                             "at": "2025-11-21T11:00:00Z"}])
        assert st.con.execute("SELECT count(*) FROM runs WHERE cancel_requested_at IS NOT NULL").fetchall() == [(1,)]


def test_malformed_manifest_events(tmp_path):
    with open_store(tmp_path / "r.duckdb") as st:
        with pytest.raises(Exception, match="event 1: attempt line is malformed"):
            record_manifest(st, [{"type": "attempt", "campaign": "x"}])
        problems = record_manifest(st, [{"type": "bogus"}, {"type": "campaign", "campaign": "ok"}], strict=False)
        assert problems == ["manifest event 1: unknown type 'bogus' (expected campaign, point, attempt, cancel, "
                            "references, repeats, budget or search)"]
        assert st.con.execute("SELECT campaign FROM campaigns").fetchall() == [("ok",)]


def test_query_cli_formats_and_errors(tmp_path):
    db = tmp_path / "r.duckdb"
    with open_store(db) as st:
        record_manifest(st, manifest())
    res = sbench("query", "select job_id, attempt from runs order by job_id", "--db", db, in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].split() == ["job_id", "attempt"]
    assert "1234_1  1" in res.output and "(2 rows)" in res.output
    res = sbench("query", "select job_id, attempt from runs order by job_id", "--db", db,
                 "--format", "csv", in_process=True, ok=None)
    assert res.output == "job_id,attempt\n1234_0,1\n1234_1,1\n"
    res = sbench("query", "select job_id, submitted_at from runs order by job_id", "--db", db,
                 "--format", "json", in_process=True, ok=None)
    assert json.loads(res.output)[0] == {"job_id": "1234_0", "submitted_at": "2025-11-21 10:00:01"}
    res = sbench("query", "selec nonsense", "--db", db, in_process=True, ok=None)
    assert res.exit_code == 2 and res.output.startswith("Error: SQL error: Parser Error")
    assert "Traceback" not in res.output
    res = sbench("query", "delete from runs", "--db", db, in_process=True, ok=None)
    assert res.exit_code == 2 and "read-only" in res.output
    res = sbench("query", "select 1", "--db", tmp_path / "nope.duckdb", in_process=True, ok=None)
    assert res.exit_code == 2 and "run `sbench collect` first" in res.output
    assert not (tmp_path / "nope.duckdb").exists()


def test_collect_cli_json_and_plain(tmp_path, monkeypatch):
    wd = tmp_path / "runs"
    run = jobdirs.make_run(wd, "c", 0, hosts=("node1",), gpus_per_host=1, ticks=20, executor="local",
                           job_id="not-a-pid")
    jobdirs.append_manifest(wd, "c", [jobdirs.manifest_events("c", "finetune_full_benchmark-v1.0.0", "local"),
                                      *run["events"]])
    db = tmp_path / "r.duckdb"
    res = sbench("collect", "--db", db, "--workdir", wd, "--json", in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert (doc["runs"], doc["new"], doc["outcomes"]) == (1, 1, {"ok": 1})
    res = sbench("collect", "--db", db, "--workdir", wd, in_process=True, ok=None)
    assert res.exit_code == 0
    assert "collected 1 run(s)" in res.output and "0 new, 0 updated, 1 unchanged" in res.output
    assert "runs by outcome (every campaign): 1 ok" in res.output


def test_collect_of_one_campaign_totals_that_campaign(tmp_path):
    """collect --campaign prints (and returns) the totals of that campaign, not of the whole database."""
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    for camp, n in (("big", 3), ("small", 1)):
        runs = [jobdirs.make_run(wd, camp, i, hosts=("node1",), gpus_per_host=1, ticks=20, executor="local",
                                 job_id="not-a-pid") for i in range(n)]
        jobdirs.append_manifest(wd, camp, [jobdirs.manifest_events(camp, "finetune_full_benchmark-v1.0.0", "local"),
                                           *(e for r in runs for e in r["events"])])
    res = sbench("collect", "--db", db, "--workdir", wd, "--json", in_process=True, ok=None)
    assert json.loads(res.output)["outcomes"] == {"ok": 4}
    # one campaign, nothing new: its totals, not the database's
    res = sbench("collect", "--db", db, "--workdir", wd, "--campaign", "small", "--json", in_process=True, ok=None)
    doc = json.loads(res.output)
    assert (doc["campaign"], doc["runs"], doc["outcomes"]) == ("small", 1, {"ok": 1})
    res = sbench("collect", "--db", db, "--workdir", wd, "--campaign", "big", in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    assert "collected 3 run(s)" in res.output and "runs of campaign big by outcome: 3 ok" in res.output
    with duckdb.connect(str(db), read_only=True) as con:  # the database holds both campaigns
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 4


def test_commands_have_help_with_example():
    for cmd in ("collect", "query"):
        res = sbench(cmd, "--help", in_process=True, ok=None)
        assert res.exit_code == 0 and "Example: sbench " + cmd in res.output


def test_query_rejects_missing_sql_argument():
    res = sbench("query", in_process=True, ok=None)
    assert res.exit_code == 2


def test_sacct_cli_path_uses_fake_binary(tmp_path, monkeypatch):
    """collect calls the real `sacct` on PATH in one batched call: here a recorded-output stand-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    (bin_dir / "sacct").write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" >> {calls}\n"
        "echo '1000_0|COMPLETED|0:0|00:09:00||node[1-2]|2025-11-22T00:00:00|2025-11-22T00:09:00'\n"
        "echo '1000_0.0|COMPLETED|0:0|00:09:00|1048576K|node[1-2]|2025-11-22T00:00:00|2025-11-22T00:09:00'\n"
        "echo '1000_1|NODE_FAIL|0:0|00:01:00||node[3-4]|2025-11-22T00:00:00|2025-11-22T00:01:00'\n")
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    wd = tmp_path / "runs"
    evs = [jobdirs.manifest_events("c", "finetune_full_benchmark-v1.0.0")]
    for i in range(2):
        evs += jobdirs.make_run(wd, "c", i, ticks=20, gpus_per_host=1)["events"]
    jobdirs.append_manifest(wd, "c", evs)
    db = tmp_path / "r.duckdb"
    res = sbench("collect", "--db", db, "--workdir", wd, in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    assert calls.read_text().count("-j") == 1
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT job_id, state, outcome, reason, max_rss_mb, node_list, accounting_source "
                       "FROM runs ORDER BY job_id").fetchall()
    con.close()
    assert rows[0] == ("1000_0", "COMPLETED", "ok", None, 1024.0, "node[1-2]", "sacct")
    assert rows[1][:3] == ("1000_1", "NODE_FAIL", "failed") and rows[1][3].startswith("node failure")
    # node3/node4 were allocated, but the files came from node1/node2: said so, precisely
    assert "node node3: no stages file (expected hosts node3,node4)" in rows[1][3]


def test_open_read_only_does_not_create(tmp_path):
    with pytest.raises(InputError):
        open_store(tmp_path / "x.duckdb", read_only=True)


def test_a_row_with_an_unknown_key_fails_loudly(tmp_path) -> None:
    from harness.db.staging import stage

    good = {"run_id": "c/p/r0/a1", "host": "n1", "rank": 0, "stage": "train"}
    assert stage("stages", [good]).rows == 1
    with pytest.raises(ValueError, match="stages: row with unknown column\\(s\\) 'duraton_s'"):
        stage("stages", [good, {**good, "duraton_s": 1.0}])
    with open_store(tmp_path / "r.duckdb") as store, store.transaction():
        with pytest.raises(ValueError, match="runs: row with unknown column"):
            replace_runs(store, [{"run_id": "x", "campaing": "c"}])


def test_epoch_columns_are_converted_at_once_exactly_as_one_by_one():
    # The vector conversion of epoch seconds must give the very datetimes utc() gives value by value,
    # half-microsecond ties included (rounded half to even), NULLs kept; anything else takes the slow way.
    import random

    from harness.db.staging import _column
    from harness.db.values import epochs as _epochs
    from harness.db.values import utc
    rnd = random.Random(5)
    values = [rnd.uniform(0, 4e9) for _ in range(20000)] + [k + 0.5e-6 for k in range(200)] + \
        [k + 1.5e-6 for k in range(200)] + [1763769601.9999996, 0.0, None, 1e-7]
    got = _column(values, "TIMESTAMP")
    assert got.dtype.kind == "M"
    assert [None if v != v else v.astype(object) for v in got] == [utc(v) for v in values]
    assert _epochs([1.0, 2]) is None and _epochs([1e12]) is None and _epochs([-1.0]) is None
    assert list(_column([1e12, None], "TIMESTAMP")) == [None, None]  # out of range: NULL, as utc() says


@pytest.mark.slow(10)
def test_staged_columns_hold_what_one_by_one_conversion_makes(tmp_path) -> None:
    # stage() converts each column with _column (plain values of the column's type kept as they are, the
    # rest value by value): a stored value must be what _column makes of it, and the DB must take it.
    import math

    from harness.db.schema import SCHEMA
    from harness.db.staging import _column, stage
    from harness.db.values import JsonText, to_json
    nasty = [None, True, False, 0, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63, 2**80, 1.0, 2.5, float("nan"),
             float("inf"), "", "plain", "naïve", "nul\0in", "lone \ud800 surrogate", "3", "1e999", "true",
             [1, "a"], {"k": 1}, JsonText('{"a":1}'), '{"b": 2}', "not json {"]
    by_kind = {"VARCHAR": ["a", "b", None, "ümlaut"], "INTEGER": [1, None, -5, 7], "BIGINT": [2**40, None, 3, 4],
               "DOUBLE": [1.5, None, 2.0, -0.0], "BOOLEAN": [True, None, False, True],
               "JSON": [to_json({"x": 1}), None, to_json([1]), to_json("s")],
               "TIMESTAMP": [1763769600.25, None, 0.0, 1.5e9]}

    def same(a, b):
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))

    store = open_store(tmp_path / "s.duckdb")
    for table in ("stages", "run_hosts"):
        cols = SCHEMA[table]
        # each column in turn: all plain (the fast way), then with one nasty value in it (the careful way)
        cases = [{}] + [{c: v} for c, _ in cols for v in nasty]
        for case in cases:
            rows = [{c: (case[c] if c in case and i == 1 else by_kind[t][i]) for c, t in cols} for i in range(4)]
            staged = stage(table, rows)
            got = {c: list(staged.columns[c].to_numpy()) for c in staged.columns}

            def plain(vals, t):  # a datetime64 array's NaT and values as None and datetime
                if t != "TIMESTAMP":
                    return vals
                return [None if w is None or w != w else w.astype(object) if hasattr(w, "astype") else w for w in vals]
            for c, t in cols:
                want = plain(list(_column([r[c] for r in rows], t)), t)
                assert all(same(g, w) for g, w in zip(plain(got[c], t), want)), (table, c, case, got[c], want)
            assert store.insert(table, staged) == 4
            store.con.execute(f"DELETE FROM {table}")
    store.close()


def test_a_json_column_is_read_back_by_one_reader(tmp_path) -> None:
    # harness.db.values.from_json: what to_json wrote comes back equal (an integer of any size an integer), a value
    # DuckDB already decoded as it is, and NULL, empty text and text that is no JSON as the caller's default
    for value in ({"a": [1, 2.5, None, "ü"]}, [2**80, -(2**70)], "s", 0, True):
        assert from_json(to_json(value)) == value
    decoded = {"k": 1}
    assert from_json(decoded) is decoded
    assert [from_json(v, {}) for v in (None, "", "not json {", b"\xff")] == [{}, {}, {}, {}]
    assert from_json(None) is None and from_json("null", {}) is None
    with open_store(tmp_path / "j.duckdb") as st:
        st.con.execute("CREATE TABLE j (doc JSON)")
        st.con.execute("INSERT INTO j VALUES (?), (NULL)", [to_json({"x": [1, 2]})])
        assert [from_json(v, {}) for (v,) in st.con.execute("SELECT doc FROM j").fetchall()] == [{"x": [1, 2]}, {}]


def test_a_collect_stages_pandas_frames_and_arrow_still_gives_pandas_output(tmp_path):
    # Collect stages its rows as numpy columns in a pandas frame (DuckDB 1.5 scans a dict of numpy arrays through
    # pandas's API anyway, and fails on a sparse object column that is no Series), imported once the first rows
    # are staged; arrow and pandas output still work afterwards.
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from harness.collect import collect
        from tests.kit import jobdirs
        wd = Path({str(tmp_path / "runs")!r})
        r = jobdirs.make_run(wd, "pd", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local",
                             job_id="999990")
        jobdirs.append_manifest(wd, "pd", r["events"])
        assert "pandas" not in sys.modules, "imported before the collect"
        rep = collect({str(tmp_path / "r.duckdb")!r}, wd)
        assert rep.outcomes == {{"ok": 1}}, rep.outcomes
        print("pandas" in sys.modules)  # imported by the staging
        import pyarrow as pa
        print(type(pa.table({{"a": [1, 2]}}).to_pandas()).__name__)
        import pandas as pd
        print(pa.array(pd.Series([1.5, None])).null_count)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "DataFrame", "1"]
