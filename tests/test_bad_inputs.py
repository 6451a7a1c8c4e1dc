"""Bad inputs and damaged databases: a model config.json that is not a config, a work dir sbench cannot write,
a SQLite file or a FIFO passed as --db, a view replaced behind sbench's back, a query of tens of millions of
rows, and a YAML merge key that overrides. Each is a plain message with the documented exit code, never a
traceback, a hang, a download or an out-of-memory.
"""

from __future__ import annotations

import json
import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from harness.db.schema import VIEWS
from harness.db.store import normal_view, open_store, view_definitions
from harness.spec.inventory import load_inventory
from harness.spec.memory import predict
from harness.spec.plan import plan_sweep
from harness.spec.sweep import load_sweep
from harness.spec.yamlio import loads_yaml

from . import kit
from .kit import ROOT, command, sbench
from .kit.jobdirs import append_manifest, make_run

INVENTORY = kit.inventory("lab", gpus=2, cpus=8, memory_gb=16, time_limit="00:30:00",
                          defaults={"env": {"OMP_NUM_THREADS": "1"}})
SWEEP: dict[str, Any] = {
    "campaign": "bad", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
    "entity": {"model_name": "tiny", "model_max_length": 64, "max_steps": 2, "batch_size": 2},
    "grid": {"number_gpus": [1]}, "model_map": {"tiny": "./model"},
}
# A Llama config the memory formula supports (the tiny model's shape).
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512, "tie_word_embeddings": False}


@pytest.fixture
def lab(lab: dict[str, Path]) -> dict[str, Path]:
    """The corner, with this file's inventory and sweep written."""
    lab["inv"].write_text(yaml.safe_dump(INVENTORY))
    lab["sweep"].write_text(yaml.safe_dump(SWEEP))
    return lab


# -- a model config.json that is not a config ---------------------------------------------------------------

CONFIGS = [  # (what the file holds, what the message must name)
    ("[1, 2, 3]", "a list"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
    ('{"model_type": "llama", ', "invalid JSON"),
    ("null", "null"),
    (json.dumps({**LLAMA, "hidden_size": 1e308}), "hidden_size"),
    (json.dumps({**LLAMA, "num_hidden_layers": -4}), "num_hidden_layers"),
    (json.dumps({**LLAMA, "intermediate_size": 0}), "intermediate_size"),
    (json.dumps({**LLAMA, "vocab_size": "32000"}), "vocab_size"),
    (json.dumps({**LLAMA, "num_attention_heads": True}), "num_attention_heads"),
    (json.dumps({**LLAMA, "head_dim": 2.5}), "head_dim"),
    (json.dumps({**LLAMA, "hidden_size": 10**400}), "hidden_size"),
    (json.dumps({**LLAMA}).replace('"hidden_size": 64', '"hidden_size": NaN'), "hidden_size"),
    (json.dumps({**LLAMA, "tie_word_embeddings": "yes"}), "tie_word_embeddings"),
    (json.dumps({**LLAMA, "model_type": ["llama"]}), "model_type"),
    (json.dumps({**LLAMA, "quantization_config": [1]}), "quantization_config"),
    (json.dumps({**LLAMA, "text_config": {"num_local_experts": -1}}), "text_config.num_local_experts"),
]


@pytest.mark.parametrize("text,named", CONFIGS, ids=[f"config{i}" for i in range(len(CONFIGS))])
def test_a_bad_model_config_is_exit_2_naming_the_file_and_key(lab, text: str, named: str) -> None:
    lab["config"].write_text(text)
    for args in (["plan", lab["sweep"], "-i", lab["inv"], "--memory"],
                 ["render", lab["sweep"], "-i", lab["inv"], "-o", lab["out"]],
                 ["submit", lab["sweep"], "-i", lab["inv"], "--executor", "local", "--no-prepare",
                  "--workdir", lab["workdir"], "--db", lab["db"]]):
        res = sbench(*args, in_process=True, ok=None)
        assert res.exit_code == 2, (args[0], res.output)
        assert str(lab["config"]) in res.output and named in res.output, res.output
        assert "internal error" not in res.output and "Traceback" not in res.output
    assert not lab["out"].exists() and not (lab["workdir"] / "bad").exists()


def test_a_config_that_is_a_fifo_or_a_device_is_refused_without_reading_it(lab) -> None:
    os.mkfifo(lab["config"])
    t0 = time.monotonic()
    res = sbench("plan", lab["sweep"], "-i", lab["inv"], "--memory", in_process=True, ok=None)
    assert res.exit_code == 2 and "not a regular file" in res.output and time.monotonic() - t0 < 20
    lab["config"].unlink()
    lab["config"].symlink_to("/dev/zero")
    res = sbench("plan", lab["sweep"], "-i", lab["inv"], "--memory", in_process=True, ok=None)
    assert res.exit_code == 2 and "not a regular file" in res.output


def test_a_good_config_still_predicts_and_a_negative_size_never_fits(lab) -> None:
    lab["config"].write_text(json.dumps(LLAMA))
    res = sbench("plan", lab["sweep"], "-i", lab["inv"], "--memory", "--json", in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    (point,) = json.loads(res.stdout)
    assert point["memory"]["status"] == "ok" and point["memory"]["total_bytes"] > 0
    # Past the reader (a config built in code): a negative count predicts nothing rather than a negative fit.
    inv = load_inventory(lab["inv"])
    (p,) = plan_sweep(load_sweep(lab["sweep"]), inv)
    pred = predict(p.entity, "lora", {**LLAMA, "num_hidden_layers": -40}, inv.partition("cpu"),
                   target_modules=("q_proj", "v_proj"))
    assert pred.status == "unknown" and pred.total_bytes is None and pred.predicted_oom is None


# -- a work dir sbench cannot write -------------------------------------------------------------------------

def _read_only(path: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """Run sbench with *path* read-only: a read-only bind mount in a mount namespace of its own when this is
    root (root writes through mode bits), else the mode bits."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            return subprocess.run(command(*argv), capture_output=True, text=True, env=env, timeout=120)
        finally:
            path.chmod(0o755)
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 99; shift; '
              'touch "$0/probe" 2>/dev/null && exit 98; exec "$@"')
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, str(path), str(path), *command(*argv)],
                          capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode in (98, 99):
        pytest.skip("no read-only bind mount here (unshare/mount not permitted)")
    return proc


def test_a_read_only_work_dir_is_exit_1_with_a_plain_message(lab) -> None:
    lab["workdir"].mkdir()
    proc = _read_only(lab["workdir"], ["submit", str(lab["sweep"]), "-i", str(lab["inv"]), "--executor", "local",
                                       "--no-prepare", "--workdir", str(lab["workdir"]), "--db", str(lab["db"])])
    err = proc.stderr
    assert proc.returncode == 1, (proc.returncode, err)
    assert str(lab["workdir"]) in err and ("Read-only file system" in err or "Permission denied" in err), err
    assert "internal error" not in err and "bug" not in err and "Traceback" not in err
    assert not any(lab["workdir"].iterdir())  # nothing half-written


# -- the database: offline, foreign files, replaced views ----------------------------------------------------

def test_every_connection_is_offline(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    for read_only in (False, True):
        with open_store(db, read_only=read_only) as st:
            for setting in ("autoinstall_known_extensions", "autoload_known_extensions"):
                (value,) = st.con.execute(f"SELECT current_setting('{setting}')").fetchone()
                assert value is False, (read_only, setting)


@pytest.mark.parametrize("command", [["query", "select 1"], ["status"], ["collect"], ["report", "-o", "{root}/r.html"],
                                     ["check", "c"]])
def test_a_sqlite_file_or_a_fifo_as_db_is_refused_without_an_extension(tmp_path: Path, command: list[str]) -> None:
    sq = tmp_path / "results.sqlite"
    con = sqlite3.connect(sq)
    con.execute("CREATE TABLE runs (run_id TEXT)")
    con.commit()
    con.close()
    fifo = tmp_path / "fifo.duckdb"
    os.mkfifo(fifo)
    (tmp_path / "runs").mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home)}  # where DuckDB would put an extension
    for db, what in ((sq, "is a SQLite database"), (fifo, "is not a regular file")):
        argv = [a.format(root=tmp_path) for a in command]
        proc = subprocess.run([*kit.command(*argv), "--db", str(db), *(
            ["--workdir", str(tmp_path / "runs")] if argv[0] in ("status", "collect") else [])],
            capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert str(db) in proc.stderr and what in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (home / ".duckdb").exists()  # nothing was downloaded or installed
    assert sq.read_bytes().startswith(b"SQLite format 3")


@pytest.fixture
def collected(tmp_path: Path) -> dict[str, Path]:
    wd, db = tmp_path / "runs", tmp_path / "results.duckdb"
    run = make_run(wd, "good", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999999")
    append_manifest(wd, "good", run["events"])
    sbench("collect", "--workdir", wd, "--db", db, in_process=True)
    return {"workdir": wd, "db": db, "root": tmp_path}


def _views(db: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(the views of *db* as DuckDB wrote them, sbench's definitions as DuckDB writes them), both in DuckDB's
    settled writing (normal_view)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        found = {name: normal_view(con, name, sql.split(" AS ", 1)[1].rstrip(";")) for name, sql in con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND NOT temporary").fetchall()}
        expected = view_definitions(con)
        assert not con.execute("SELECT * FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()  # none left
        return found, expected
    finally:
        con.close()


def test_a_replaced_view_is_refused_by_readers_and_restored_by_collect(collected) -> None:
    db = collected["db"]
    found, expected = _views(db)
    assert found == expected and set(expected) == set(VIEWS)
    con = duckdb.connect(str(db))
    # A forged latest_measurements: every measurement, the invalid ones too.
    con.execute("CREATE OR REPLACE VIEW latest_measurements AS SELECT * FROM measurements")
    con.execute("DROP VIEW run_overhead")
    con.close()
    for args in (["query", "select count(*) from latest_measurements"], ["status", "--workdir", collected["workdir"]],
                 ["report", "-o", collected["root"] / "r.html"]):
        res = sbench(*args, "--db", db, in_process=True, ok=None)
        assert res.exit_code == 1, res.output
        assert "view latest_measurements was replaced" in res.output and "view run_overhead is missing" in res.output
        assert "sbench collect" in res.output and "Traceback" not in res.output
    res = sbench("collect", "--workdir", collected["workdir"], "--db", db, in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    found, expected = _views(db)
    assert found == expected and found["latest_measurements"] != "SELECT * FROM measurements"
    res = sbench("query", "select count(*) as n from latest_measurements", "--db", db, "--format", "json",
                 in_process=True, ok=None)
    assert res.exit_code == 0 and json.loads(res.output) == [{"n": 1}]


def test_sbenchs_view_definitions_are_kept_per_duckdb_release_and_made_anew_when_the_kept_file_is_bad(
        collected, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    con = duckdb.connect(str(collected["db"]), read_only=True)
    try:
        made = view_definitions(con)
        kept = list((tmp_path / "cache" / "sbench").glob(f"views-{duckdb.__version__}-file-*.json"))
        assert set(made) == set(VIEWS) and len(kept) == 1 and json.loads(kept[0].read_text()) == made
        kept[0].write_text(json.dumps({**made, "run_summary": "SELECT 1"}))
        assert view_definitions(con)["run_summary"] == "SELECT 1"  # a kept set is what the check compares with
        for bad in ("{", json.dumps({"run_summary": "SELECT 1"}), json.dumps({**made, "run_summary": 1})):
            kept[0].write_text(bad)
            assert view_definitions(con) == made and json.loads(kept[0].read_text()) == made
        assert not con.execute("SELECT * FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()
    finally:
        con.close()


def test_no_connection_draws_a_progress_bar_on_stdout_and_a_readers_stays_locked(collected) -> None:
    for read_only in (True, False):
        with open_store(collected["db"], read_only=read_only) as st:
            assert st.con.execute("SELECT current_setting('enable_progress_bar')").fetchone() == (False,)
            if read_only:
                with pytest.raises(duckdb.Error, match="configuration"):
                    st.con.execute("SET enable_progress_bar = true")


def test_a_table_in_place_of_a_view_is_refused_by_every_command(collected) -> None:
    con = duckdb.connect(str(collected["db"]))
    con.execute("DROP VIEW run_summary")
    con.execute("CREATE TABLE run_summary AS SELECT 1 AS forged")
    con.close()
    for args in (["query", "select 1"], ["collect", "--workdir", collected["workdir"]]):
        res = sbench(*args, "--db", collected["db"], in_process=True, ok=None)
        assert res.exit_code == 1 and "table run_summary holds the name of sbench's view" in res.output, res.output
        assert "mv " in res.output


# -- query: streamed, or stopped at --limit ------------------------------------------------------------------

def test_query_stops_at_limit_and_says_how_many_rows_there_were(collected) -> None:
    t0 = time.monotonic()
    res = sbench("query", "select range as i from range(40000000)", "--db", collected["db"], "--limit", "10",
                 in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    assert time.monotonic() - t0 < 30  # the 40 million rows are counted by DuckDB, never fetched
    assert res.stdout.splitlines()[2:12] == [str(i) for i in range(10)]
    assert "(10 of 40000000 rows)" in res.stdout and "first 10 of 40,000,000 rows" in res.stderr
    for fmt, parse in (("json", json.loads), ("csv", lambda t: t.splitlines()[1:])):
        res = sbench("query", "select range as i from range(40000000)", "--db", collected["db"],
                     "--limit", "3", "--format", fmt, in_process=True, ok=None)
        assert res.exit_code == 0 and len(parse(res.stdout)) == 3 and "40,000,000" in res.stderr
    # A statement DuckDB cannot wrap in a count is counted by streaming it again.
    res = sbench("query", "select range from range(5); select range from range(7)", "--db", collected["db"],
                 "--limit", "2", in_process=True, ok=None)
    assert res.exit_code == 0 and "(2 of 7 rows)" in res.stdout, res.output


def test_query_prints_every_row_to_a_pipe_in_the_same_formats(collected) -> None:
    sql = "select range as i, 'r' || range as s, [range, 1] as l from range(2500)"
    res = sbench("query", sql, "--db", collected["db"], "--format", "json", in_process=True, ok=None)
    rows = json.loads(res.stdout)
    assert len(rows) == 2500 and rows[-1] == {"i": 2499, "s": "r2499", "l": [2499, 1]}
    assert res.stdout == json.dumps(rows, indent=2) + "\n"  # the streamed JSON is json.dumps' own layout
    res = sbench("query", sql, "--db", collected["db"], "--format", "csv", in_process=True, ok=None)
    assert res.stdout.splitlines()[0] == "i,s,l" and len(res.stdout.splitlines()) == 2501
    res = sbench("query", "select range as i from range(25000)", "--db", collected["db"], in_process=True, ok=None)
    lines = res.stdout.splitlines()
    assert lines[-1] == "(25000 rows)" and len(lines) == 25003 and lines[-2] == "24999" and not res.stderr
    assert sbench("query", "select 1 as x where false", "--db", collected["db"], "--format", "json", in_process=True,
                  ok=None).stdout == "[]\n"


def test_a_reader_that_stops_early_stops_the_query_quietly(collected) -> None:
    """`sbench query ... | head -2`: the query ends as a Unix tool ends on SIGPIPE, with no message."""
    proc = subprocess.Popen(command("query", "select range from range(5000000)", "--db", collected["db"], "--format",
                                    "csv"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    assert [proc.stdout.readline(), proc.stdout.readline()] == [b"range\n", b"0\n"]
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b"", err


def test_query_to_a_terminal_stops_at_10000_rows_by_default(collected) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(command("query", "select range as i from range(25000)", "--db", collected["db"]),
                            stdout=slave, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    err = proc.communicate(timeout=30)[1].decode()
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert proc.returncode == 0, err
    assert lines[-1] == "(10000 of 25000 rows)" and lines[-2] == "9999" and len(lines) == 10003
    assert "first 10,000 of 25,000 rows" in err


def test_a_huge_result_streams_in_bounded_memory(collected) -> None:
    """120,000 rows of 2,000 characters: held at once they took 800 MB here; streamed, the process stays small."""
    probe = ("import resource, subprocess, sys\n"
             "with open('/dev/null', 'w') as null:\n"
             "    rc = subprocess.run(sys.argv[1:], stdout=null).returncode\n"
             "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    proc = subprocess.run([sys.executable, "-c", probe, *command(
                           "query", "select range as i, repeat('x', 2000) as pad from range(120000)", "--db",
                           collected["db"], "--format", "csv")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    rc, rss_kb = map(int, proc.stdout.split())
    assert rc == 0, proc.stderr
    assert rss_kb < 400_000, f"query held {rss_kb} KB"


# -- YAML merge keys -----------------------------------------------------------------------------------------

MERGED_INVENTORY = """\
cluster: lab
defaults:
  env: &common {OMP_NUM_THREADS: "1", A: "base"}
partitions:
  cpu:
    gpu_model: cpu
    gpus_per_node: 2
    cpus_per_node: 8
    memory_gb: 16
    hosts:
      h1:
        address: 127.0.0.1
        env:
          <<: *common
          A: "h1"
"""


def test_a_merge_key_that_overrides_is_accepted_and_a_duplicate_is_not(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(MERGED_INVENTORY)
    res = sbench("inventory", "check", "-i", inv, in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    assert load_inventory(inv).partitions["cpu"].hosts["h1"].env == {"OMP_NUM_THREADS": "1", "A": "h1"}
    inv.write_text(MERGED_INVENTORY + '          A: "again"\n')  # a key written twice is still refused
    res = sbench("inventory", "check", "-i", inv, in_process=True, ok=None)
    assert res.exit_code == 2 and "duplicate key" in res.output and ".A'" in res.output, res.output
    # Merged maps among themselves: the first one listed wins, as YAML says; the mapping's own keys win over all.
    doc = loads_yaml("a: &a {k: 1}\nb: &b {k: 2, j: 3}\nc:\n  <<: [*a, *b]\nd:\n  <<: [*a, *b]\n  j: 4\n", "m.yaml")
    assert doc["c"] == {"k": 1, "j": 3} and doc["d"] == {"k": 1, "j": 4}
