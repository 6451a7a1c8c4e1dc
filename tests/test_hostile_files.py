"""Hostile and special files in a work dir: FIFOs, devices, links out of the campaign directory, oversized
files, job dirs that are not their attempt's, and control characters in a job's text. Each one costs only the
run it is in, with the reason recorded: ``collect``, ``status``, ``cancel`` and ``submit`` run as processes of
their own, as a user runs them, and each finishes within 30 s without a traceback; nothing from outside the
work dir reaches the database; the other runs are stored exactly as without the hostile file.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from harness.collect import collect
from harness.contract import safefile
from harness.contract.paths import JobPaths

from . import kit
from .kit import LAB_INVENTORY, LAB_SWEEP, assert_same_rows, setin, sql_rows
from .kit.jobdirs import append_manifest, make_run, write_json

CAMPAIGN = "hard"  # LAB_SWEEP's: a submit of it reads this campaign (its points are all invalid: nothing runs)
LIMIT_S = 30
CANARY = "CANARY-0f1e2d3c"  # in every file outside the work dir a link points to


def sbench(*args: Any, cwd: Path, timeout: float = LIMIT_S) -> subprocess.CompletedProcess[str]:
    """``sbench ARGS`` as its own process, bounded by this file's limit; a hang or a traceback fails the test."""
    return kit.sbench(*args, cwd=cwd, timeout=timeout, ok=None, env={"SBENCH_DB_WAIT": "5"})


def run(wd: Path, index: int, campaign: str = CAMPAIGN) -> dict[str, Any]:
    """One complete synthetic local run (one host, one rank) with its manifest lines."""
    r = make_run(wd, campaign, index, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local",
                 job_id=str(999000 + index))
    append_manifest(wd, campaign, r["events"])
    return r


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def link(path: Path, target: str | Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def runs_by_point(db: Path) -> dict[str, dict[str, Any]]:
    return {r["point_id"]: r for r in sql_rows(db, "SELECT * FROM runs")}


def measurements(db: Path) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in sql_rows(db, "SELECT * FROM measurements")}


def said(row: dict[str, Any]) -> str:
    """Everything a run's row says about what went wrong."""
    return f"{row['reason'] or ''} | {'; '.join(row['warnings'] or [])}"


def every_text(db: Path) -> str:
    """Every value of every table of the results database, as text."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        return "\n".join(repr(row) for t in tables for row in con.execute(f'SELECT * FROM "{t}"').fetchall())
    finally:
        con.close()


@pytest.fixture
def lab(lab: dict[str, Any]) -> dict[str, Any]:
    """The corner, with an inventory, a sweep whose points are all invalid (rule 1: nothing runs) and two good
    synthetic runs of the campaign."""
    lab["inv"].write_text(yaml.safe_dump(LAB_INVENTORY))
    sweep = setin(LAB_SWEEP, ("entity", "model_max_length"), 64) | {"grid": {"batch_size": [3], "number_gpus": [2]}}
    lab["sweep"].write_text(yaml.safe_dump(sweep))
    wd = lab["wd"] = lab["workdir"]
    lab["good"] = [run(wd, 0), run(wd, 1)]
    lab["common"] = ["--workdir", wd, "--db", lab["db"]]
    return lab


def baseline(lab: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The good runs' measurements from a collect before anything hostile was put in."""
    db0 = lab["root"] / "baseline.duckdb"
    collect(db0, lab["wd"], CAMPAIGN)
    return measurements(db0)


# Which other runs held a host at the same time depends on which runs there are (the victims ran "on"
# the good runs' host too): every other value must be the same.
SHARED = ("shared_host", "overlapped_with")


def assert_good_runs_exact(lab: dict[str, Any], before: dict[str, dict[str, Any]]) -> None:
    after = measurements(lab["db"])
    for r in lab["good"]:
        rid = f"{CAMPAIGN}/{r['job_dir'].name}"
        assert {k: v for k, v in after[rid].items() if k not in SHARED} == \
            {k: v for k, v in before[rid].items() if k not in SHARED}
    rows = runs_by_point(lab["db"])
    assert all(rows[r["point_id"]]["outcome"] == "ok" for r in lab["good"])


def commands(lab: dict[str, Any]) -> None:
    """status, cancel and submit of the campaign finish, with no traceback (sbench() checks both)."""
    root, common = lab["root"], lab["common"]
    assert sbench("status", *common, cwd=root).returncode == 0
    assert sbench("status", "--campaign", CAMPAIGN, "--json", *common, cwd=root).returncode == 0
    assert sbench("cancel", "--campaign", CAMPAIGN, *common, cwd=root).returncode == 0
    sub = sbench("submit", "sweep.yaml", "-i", "inv.yaml", "--executor", "local", "--json", *common, cwd=root)
    # every point of the sweep is invalid: bad input, said after the campaign's files were read
    assert sub.returncode == 2 and "every point is invalid" in sub.stderr, sub.stderr


# -- FIFOs --------------------------------------------------------------------------------------------------------

# A victim run per job-dir file, that file replaced by a FIFO (nobody ever writes to it).
JOB_FILES = ["spec.json", "submitted.json", "stages.node1.jsonl", "result.node1.json", "rank.0.json", "error.0.json",
             "environment.node1.json", "samples.node1.csv", "train.node1.log", "slurm-1.out"]
RUNNER_FILES = ["stages.node1.jsonl", "result.node1.json", "rank.0.json", "environment.node1.json",
                "samples.node1.csv", "train.node1.log"]


def test_fifos_in_place_of_job_dir_files_hang_nothing_and_cost_only_their_run(lab) -> None:
    before = baseline(lab)
    wd = lab["wd"]
    victims = {}
    for i, name in enumerate(JOB_FILES):
        r = run(wd, 10 + i)
        if name == "slurm-1.out":  # the batch output is read when the runner left nothing
            for f in RUNNER_FILES:
                (r["job_dir"] / f).unlink()
        fifo(r["job_dir"] / name)
        victims[name] = r
    # Campaign files: the local queue's pid file of a queued attempt, and a prepare job's record.
    queued = run(wd, 30)
    for f in RUNNER_FILES:
        (queued["job_dir"] / f).unlink()
    qfile = wd / CAMPAIGN / ".local" / "queue-1.json"
    qfile.parent.mkdir()
    write_json(queued["paths"].submitted, {"executor": "local", "job_id": None, "queue": str(qfile)})
    append_manifest(wd, CAMPAIGN, [{**queued["events"][1], "job_id": None, "queue": str(qfile)}])
    fifo(qfile.with_suffix(".pid"))
    fifo(wd / CAMPAIGN / "prepare-job.json")

    col = sbench("collect", *lab["common"], cwd=lab["root"])
    assert col.returncode == 0, col.stderr
    assert_good_runs_exact(lab, before)
    rows = runs_by_point(lab["db"])
    for name, r in victims.items():
        row = rows[r["point_id"]]
        assert f"{name}: not read (a FIFO, not a regular file)" in said(row), (name, row)
    assert rows[victims["spec.json"]["point_id"]]["outcome"] == "failed"  # whose run it is cannot be told
    assert measurements(lab["db"]).keys().isdisjoint({f"{CAMPAIGN}/{victims['spec.json']['job_dir'].name}"})
    commands(lab)


def test_a_fifo_manifest_is_a_warning_for_collect_and_status_and_an_error_for_submit(lab) -> None:
    before = baseline(lab)
    other = run(lab["wd"], 5, campaign="other")
    fifo(lab["wd"] / "other" / "manifest.jsonl")
    col = sbench("collect", *lab["common"], cwd=lab["root"])
    assert col.returncode == 0 and "other/manifest.jsonl: not read (a FIFO" in col.stderr, col.stderr
    assert_good_runs_exact(lab, before)
    # Its job dir is still found by its spec.json: collected, though the manifest is not read.
    assert runs_by_point(lab["db"])[other["point_id"]]["campaign"] == "other"
    st = sbench("status", *lab["common"], cwd=lab["root"])
    assert st.returncode == 0 and "manifest.jsonl: not read (a FIFO" in st.stderr
    assert sbench("cancel", *lab["common"], cwd=lab["root"]).returncode == 0
    sweep = yaml.safe_load((lab["root"] / "sweep.yaml").read_text()) | {"campaign": "other"}
    (lab["root"] / "other.yaml").write_text(yaml.safe_dump(sweep))
    sub = sbench("submit", "other.yaml", "-i", "inv.yaml", "--executor", "local", *lab["common"], cwd=lab["root"])
    assert sub.returncode == 1 and "manifest.jsonl: the campaign manifest was not read (a FIFO" in sub.stderr
    assert stat_is_fifo(lab["wd"] / "other" / "manifest.jsonl")  # left as it was: never replaced or written
    commands(lab)


def stat_is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


# -- devices, oversized files ------------------------------------------------------------------------------------

def test_links_to_devices_and_oversized_files_are_not_read_and_the_others_are_collected(lab) -> None:
    before = baseline(lab)
    wd = lab["wd"]
    cases = {"result.node1.json": "/dev/zero", "stages.node1.jsonl": "/dev/urandom", "spec.json": "/dev/zero",
             "samples.node1.csv": "/dev/urandom", "train.node1.log": "/dev/zero", "rank.0.json": "/dev/urandom"}
    victims = {}
    for i, (name, dev) in enumerate(cases.items()):
        r = run(wd, 10 + i)
        link(r["job_dir"] / name, dev)
        victims[name] = r
    # Regular files past their bound: sparse, so they cost no disk.
    big = {"result.node1.json": safefile.RUNNER_MAX + 1, "spec.json": safefile.SPEC_MAX + 1,
           "submitted.json": safefile.SMALL_MAX + 1}
    large = {}
    for i, (name, size) in enumerate(big.items()):
        r = run(wd, 20 + i)
        with open(r["job_dir"] / name, "r+b") as fh:
            fh.truncate(size)
        large[name] = r
    huge_log = run(wd, 25)  # a training log far past what is read of it: only its start is read
    with open(huge_log["paths"].train_log("node1"), "r+b") as fh:
        fh.truncate(4 << 30)
    link(wd / "other-manifest-campaign", "/dev/zero")  # a campaign "dir" that is a device: not a campaign
    (wd / "zero").mkdir()
    link(wd / "zero" / "manifest.jsonl", "/dev/zero")

    col = sbench("collect", *lab["common"], cwd=lab["root"])
    assert col.returncode == 0, col.stderr
    assert "zero/manifest.jsonl: not read (a symbolic link to /dev/zero" in col.stderr
    assert_good_runs_exact(lab, before)
    rows = runs_by_point(lab["db"])
    for name, r in victims.items():
        dev = cases[name]
        assert f"{name}: not read (a symbolic link to {dev}, outside" in said(rows[r["point_id"]]), name
    for name, r in large.items():
        assert f"{name}: not read (" in said(rows[r["point_id"]]) and "larger than the" in said(rows[r["point_id"]])
    assert rows[huge_log["point_id"]]["outcome"] == "ok"
    commands(lab)


# -- links out of the work dir --------------------------------------------------------------------------------------

def test_no_byte_of_a_file_outside_the_work_dir_reaches_the_database(lab) -> None:
    """Every job-dir file, the job dir itself and a campaign's manifest, each a link to a file outside the work
    dir that holds a canary in the shape sbench expects: the canary is in no table afterwards."""
    wd, outside = lab["wd"], lab["root"] / "outside"
    outside.mkdir()
    victims: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(JOB_FILES):
        r = run(wd, 10 + i)
        if name == "slurm-1.out":
            for f in RUNNER_FILES:
                (r["job_dir"] / f).unlink()
        src = r["job_dir"] / name
        target = outside / f"{i}-{name}"
        text = src.read_text() if src.exists() else ""
        if name == "error.0.json":
            text = json.dumps({"rank": 0, "kind": "failed", "error_type": CANARY, "message": CANARY})
        elif name == "samples.node1.csv":
            text = text.replace("81920.0", "987654321.0")  # no text column: a number that stands out
        elif name == "train.node1.log":
            text += f"node1:1:1 [0] NCCL INFO Using network {CANARY}\n"
        elif name == "slurm-1.out":
            text = f"fatal: {CANARY}\n"
        else:
            doc = json.loads(text) if name.endswith(".json") else None
            if isinstance(doc, dict):
                doc["reason"] = doc["host"] = doc["executor"] = CANARY
                text = json.dumps(doc)
            else:
                text = text.replace('"ok"', json.dumps(CANARY))
        target.write_text(text)
        target.chmod(0o600)
        link(src, target)
        victims[name] = r
    # A job dir that is itself a link to a directory outside, holding a complete run with canaries.
    moved = run(wd, 40)
    away = outside / "jobdir"
    shutil.move(moved["job_dir"], away)
    res = json.loads(JobPaths(away).result("node1").read_text())
    JobPaths(away).result("node1").write_text(json.dumps({**res, "reason": CANARY}))
    moved["job_dir"].symlink_to(away, target_is_directory=True)
    # A campaign whose manifest is a link to one outside (its attempt lines name canary job ids).
    stranger = run(wd, 41, campaign="linked")
    text = (wd / "linked" / "manifest.jsonl").read_text().replace("999041", CANARY)
    (outside / "manifest.jsonl").write_text(text)
    link(wd / "linked" / "manifest.jsonl", outside / "manifest.jsonl")

    # A whole campaign directory that is a link to a campaign outside the work dir.
    far = run(lab["root"] / "elsewhere", 42, campaign="far")
    res = json.loads(far["paths"].result("node1").read_text())
    far["paths"].result("node1").write_text(json.dumps({**res, "reason": CANARY}))
    (wd / "far").symlink_to(lab["root"] / "elsewhere" / "far", target_is_directory=True)

    col = sbench("collect", *lab["common"], cwd=lab["root"])
    assert col.returncode == 0, col.stderr
    assert f"{wd / 'far'}: not a campaign directory of this work dir (it resolves to" in col.stderr
    dump = every_text(lab["db"])
    assert CANARY not in dump and "987654321" not in dump
    rows = runs_by_point(lab["db"])
    for name, r in victims.items():
        assert f"{name}: not read (a symbolic link to {outside}" in said(rows[r["point_id"]]), name
    assert rows[moved["point_id"]]["outcome"] == "failed"
    assert f"job directory {moved['job_dir']} not read: it resolves to {away}" in rows[moved["point_id"]]["reason"]
    assert rows[stranger["point_id"]]["campaign"] == "linked"  # found by its spec.json; the manifest not read
    commands(lab)
    st = sbench("status", "--json", *lab["common"], cwd=lab["root"])
    assert CANARY not in st.stdout and f"{wd / 'far'}: not read (it resolves to" in json.loads(st.stdout)["note"]
    assert CANARY not in every_text(lab["db"])


# -- job dirs that are not their attempt's ----------------------------------------------------------------------------

def test_a_job_dir_that_is_another_campaigns_is_not_stored_under_this_point(lab) -> None:
    before = baseline(lab)
    wd = lab["wd"]
    theirs = run(wd, 7, campaign="theirs")  # another campaign's run: a measurement of another point
    linked = run(wd, 8)  # this campaign's job dir replaced by a link to theirs
    shutil.rmtree(linked["job_dir"])
    linked["job_dir"].symlink_to(theirs["job_dir"], target_is_directory=True)
    copied = run(wd, 9)  # this campaign's job dir replaced by a copy of theirs (a spec.json of another run)
    shutil.rmtree(copied["job_dir"])
    shutil.copytree(theirs["job_dir"], copied["job_dir"])
    # Same point, other campaign: the spec.json of "theirs" copied into this campaign's attempt of that point.
    same = run(wd, 7)
    spec = json.loads(theirs["paths"].spec.read_text())
    same["paths"].spec.write_text(json.dumps(spec))

    col = sbench("collect", *lab["common"], cwd=lab["root"])
    assert col.returncode == 0, col.stderr
    again = collect(lab["db"], wd)  # a refused run is recorded once, not read again and again
    assert again.new == 0 and again.updated == 0
    assert_good_runs_exact(lab, before)
    runs = {r["run_id"]: r for r in sql_rows(lab["db"], "SELECT * FROM runs")}
    meas = measurements(lab["db"])
    mine = {k: f"{CAMPAIGN}/{r['job_dir'].name}" for k, r in (("linked", linked), ("copied", copied),
                                                               ("same", same))}
    for what, rid in mine.items():
        assert runs[rid]["outcome"] == "failed" and rid not in meas, what
        assert not sql_rows(lab["db"], "SELECT 1 FROM samples WHERE run_id = ?", [rid]), what
        assert not sql_rows(lab["db"], "SELECT 1 FROM run_hosts WHERE run_id = ?", [rid]), what
        assert not sql_rows(lab["db"], "SELECT 1 FROM runs WHERE list_contains(overlapped_with, ?)", [rid]), what
    assert "resolves to" in runs[mine["linked"]]["reason"] and str(theirs["job_dir"]) in runs[mine["linked"]]["reason"]
    assert "its spec.json is not this attempt's (names point" in runs[mine["copied"]]["reason"]
    assert "its spec.json is not this attempt's (names campaign 'theirs'" in runs[mine["same"]]["reason"]
    # Their own measurement is stored once, under their campaign and point.
    (m,) = [m for m in meas.values() if m["point_id"] == theirs["point_id"]]
    assert m["run_id"] == f"theirs/{theirs['job_dir'].name}"
    # status shows the reason; cancel never reads a job dir that is not the campaign's own.
    st = sbench("status", "--campaign", CAMPAIGN, "--json", *lab["common"], cwd=lab["root"])
    by_point = {r["point_id"]: r for r in json.loads(st.stdout)["rows"]}
    assert "not read" in by_point[linked["point_id"]]["reason"]
    assert f"left out: job dir {linked['job_dir']}: it resolves to {theirs['job_dir']}" in json.loads(st.stdout)["note"]
    commands(lab)


# -- control characters ------------------------------------------------------------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b31m\r\x08\x00\u202eevil"


def test_escape_sequences_from_a_job_never_reach_the_terminal(lab) -> None:
    r = run(lab["wd"], 10)
    write_json(r["paths"].error(0), {"rank": 0, "host": "node1", "kind": "failed", "error_type": "Boom" + ESCAPES,
                                     "message": "boom " + ESCAPES + "\nsecond line"})
    odd = r["job_dir"] / ("stages.x" + ESCAPES.replace("\x00", "") + ".jsonl")  # a file name with escapes
    odd.write_text('{"event": "start", "stage": "x", "t_wall": 1}\nnot json\n')
    col = sbench("collect", *lab["common"], cwd=lab["root"])
    (row,) = [x for x in sql_rows(lab["db"], "SELECT reason FROM runs") if x["reason"]]
    assert "\x1b]0;owned" in row["reason"]  # stored as the job wrote it ...
    outputs = [col, sbench("status", *lab["common"], cwd=lab["root"]),
               sbench("status", "--json", *lab["common"], cwd=lab["root"]),
               sbench("query", "select reason, warnings from runs", "--db", lab["db"], cwd=lab["root"])]
    for proc in outputs:  # ... and never printed raw
        text = proc.stdout + proc.stderr
        assert not any(c in text for c in "\x1b\x07\x9b\r\x08\x00\u202e"), repr(text)
    assert "\\x1b]0;owned" in outputs[1].stdout  # shown escaped, so it can still be read
    # In-process too, with click's own stripping of colour codes turned off.
    res = kit.sbench("status", *lab["common"], in_process=True, ok=None, color=True)
    assert res.exit_code == 0 and "\x1b" not in res.output and "\\x1b" in res.output


# -- the reader itself ----------------------------------------------------------------------------------------------

def test_the_reader_refuses_without_blocking_and_bounds_what_it_reads(tmp_path: Path) -> None:
    root = tmp_path / "camp"
    root.mkdir()
    (root / "ok.json").write_text('{"a": 1}')
    fifo(root / "pipe")
    link(root / "in.json", root / "ok.json")
    (tmp_path / "secret").write_text("s")
    link(root / "out", tmp_path / "secret")
    link(root / "zero", "/dev/zero")
    (root / "big").write_bytes(b"x" * 100)
    assert safefile.read_json(root / "in.json", root) == {"a": 1}  # a link inside the root is followed
    for name, why in (("pipe", "a FIFO, not a regular file"), ("out", f"a symbolic link to {tmp_path / 'secret'}"),
                      ("zero", "a symbolic link to /dev/zero"), ("big", "100 bytes, larger than the 10 bytes")):
        with pytest.raises(safefile.Refused, match=why.replace("(", r"\(")):
            safefile.read_bytes(root / name, root, 10)
    assert safefile.read_bytes(root / "big", root, 10, part="tail") == b"x" * 10
    with pytest.raises(safefile.Refused):
        safefile.read_bytes(root / "in.json", None, 10)  # no root: a link is never followed
    (root / "sub").mkdir()
    link(root / "away", tmp_path)
    safefile.check_dir(root / "sub", root)
    with pytest.raises(safefile.Refused, match="outside"):
        safefile.check_dir(root / "away", root)


# -- a real local run ----------------------------------------------------------------------------------------------

@pytest.mark.train
def test_a_real_local_run_with_hostile_files_beside_its_own_is_collected_exactly(tmp_path: Path, trained) -> None:
    """Real runs of the tiny model through the local executor (a copy of the session's trained campaigns); then
    FIFOs and links are put beside one run's files: collect stores exactly what it stored without them, and
    says what it did not read."""
    lab = trained.copy(tmp_path / "lab")
    wd, db = lab.workdir, lab.db
    common = ["--workdir", wd, "--db", db]
    clean = tmp_path / "clean.duckdb"
    collect(clean, wd)
    runs = sql_rows(clean, "SELECT job_dir, outcome FROM runs ORDER BY job_dir")
    assert len(runs) == 4 and {r["outcome"] for r in runs} == {"ok"}
    jd = Path(runs[0]["job_dir"])
    (tmp_path / "secret").write_text(json.dumps({"rank": 5, "host": CANARY, "metrics": {}}))
    link(jd / "rank.5.json", tmp_path / "secret")
    link(jd / "samples.ghost.csv", "/dev/zero")
    fifo(jd / "slurm-99.out")
    fifo(jd / "error.3.json")
    col = sbench("collect", *common, cwd=tmp_path)
    assert col.returncode == 0, col.stderr
    for table in ("measurements", "ranks", "stages", "run_hosts", "environment"):
        assert_same_rows(sql_rows(db, f"SELECT * EXCLUDE (run_id) FROM {table} ORDER BY ALL"),
                         sql_rows(clean, f"SELECT * EXCLUDE (run_id) FROM {table} ORDER BY ALL"), table)
    assert sql_rows(db, "SELECT count(*) AS n FROM samples") == sql_rows(clean, "SELECT count(*) AS n FROM samples")
    rows = {r["job_dir"]: r for r in sql_rows(db, "SELECT job_dir, outcome, warnings FROM runs")}
    before = {r["job_dir"]: r for r in sql_rows(clean, "SELECT job_dir, outcome, warnings FROM runs")}
    assert {r["outcome"] for r in rows.values()} == {"ok"}
    assert {d: r for d, r in rows.items() if d != str(jd)} == {d: r for d, r in before.items() if d != str(jd)}
    text = "; ".join(rows[str(jd)]["warnings"] or [])
    for what in ("rank.5.json: not read (a symbolic link", "samples.ghost.csv: not read (a symbolic link to /dev/zero",
                 "error.3.json: not read (a FIFO"):
        assert what in text, text
    assert CANARY not in every_text(db)
    for args in (["status"], ["cancel"]):
        assert sbench(*args, *common, cwd=tmp_path).returncode == 0
    again = sbench("submit", lab.sweep, "--campaign", "nightly-1", "--json", *lab.local, cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["submitted"] == 0  # measured: not run again
