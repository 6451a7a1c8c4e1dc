"""Shared hosts: runs that held one host at the same time are flagged by collect (runs.overlapped_with, the warning,
measurements.shared_host / overlapped_with), and compare, check and the report leave them out.

Synthetic job dirs (tests/kit/jobdirs.py) and a fake sacct whose start, end and node list each test sets per job;
local runs are placed by their stage events. Expected flags follow from the times each test wrote.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest

from harness.collect import collect
from harness.contract.errors import SchemaMismatchError
from harness.db.overlaps import WARNING_PREFIX
from harness.db.store import open_store
from harness.report.page import build_report
from harness.slurm.client import Slurm
from harness.spec.references import Reference

from .kit import LORA, jobdirs, sql_rows, table_contents
from .kit.report import html_only

BASE = dt.datetime(2025, 11, 22)
ROW_TABLES = ["runs", "run_hosts", "measurements", "checks"]


class FakeSacct:
    """sacct for jobs given as job id -> (nodes, start minute, end minute or None while it runs)."""

    def __init__(self, jobs: dict[str, tuple[str, int, int | None]]) -> None:
        self.jobs = jobs

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] != "sacct":
            return subprocess.CompletedProcess(argv, 1, "", "not faked")
        lines = []
        for j in argv[argv.index("-j") + 1].split(","):
            if j not in self.jobs:
                continue
            nodes, start, end = self.jobs[j]
            state = "COMPLETED" if end is not None else "RUNNING"
            t0 = (BASE + dt.timedelta(minutes=start)).isoformat()
            t1 = (BASE + dt.timedelta(minutes=end)).isoformat() if end is not None else "Unknown"
            elapsed = f"00:{(end or start) - start:02d}:00"
            lines.append(f"{j}|{state}|0:0|{elapsed}||{nodes}|{t0}|{t1}")
            lines.append(f"{j}.0|{state}|0:0|{elapsed}|1048576K|{nodes}|{t0}|{t1}")
        return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")


def run(workdir: Path, campaign: str, index: int, job_id: str, host: str = "node1", executor: str = "slurm",
        t0: float = jobdirs.T0, references: list[Reference] | None = None) -> dict:
    """One finished run of point *index* in *campaign* on *host* (its manifest lines appended)."""
    r = jobdirs.make_run(workdir, campaign, index, hosts=(host,), gpus_per_host=2, ticks=30, experiment=LORA,
                         executor=executor, job_id=job_id, t0=t0)
    man = Path(workdir) / campaign / "manifest.jsonl"
    first = [] if man.exists() else [{**jobdirs.manifest_events(campaign, LORA, executor),
                                      "references": [x.to_dict() for x in references or []]}]
    jobdirs.append_manifest(workdir, campaign, first + r["events"])
    r["run_id"] = f"{campaign}/{r['job_dir'].name}"
    return r


def flags(db: Path) -> dict[str, list[str] | None]:
    return {r["run_id"]: r["overlapped_with"] for r in sql_rows(db, "SELECT run_id, overlapped_with FROM runs")}


def test_runs_on_one_host_at_the_same_time_flag_each_other_and_name_the_other(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    a = run(wd, "c", 1, "101")  # node1, minutes 0-10
    b = run(wd, "c", 2, "102")  # node1, minutes 5-15: overlaps a
    c = run(wd, "c", 3, "103", host="node2")  # node2, minutes 0-15: another host
    d = run(wd, "c", 4, "104")  # node1, minutes 15-20: starts as b ends (touching is no overlap)
    e = run(wd, "other", 5, "105")  # another campaign, node1, minutes 8-9: overlaps a and b
    sacct = FakeSacct({"101": ("node1", 0, 10), "102": ("node1", 5, 15), "103": ("node2", 0, 15),
                       "104": ("node1", 15, 20), "105": ("node1", 8, 9)})
    collect(db, wd, slurm=Slurm(sacct))
    got = flags(db)
    assert got[a["run_id"]] == sorted([b["run_id"], e["run_id"]])
    assert got[b["run_id"]] == sorted([a["run_id"], e["run_id"]])
    assert got[e["run_id"]] == sorted([a["run_id"], b["run_id"]])
    assert got[c["run_id"]] == [] and got[d["run_id"]] == []
    runs = {r["run_id"]: r for r in sql_rows(db, "SELECT run_id, outcome, warnings FROM runs")}
    (warn,) = [w for w in runs[a["run_id"]]["warnings"] if w.startswith(WARNING_PREFIX)]
    assert "node1" in warn and b["run_id"] in warn and e["run_id"] in warn
    assert runs[c["run_id"]]["warnings"] is None and runs[a["run_id"]]["outcome"] == "ok"
    meas = {m["run_id"]: m for m in sql_rows(db, "SELECT run_id, shared_host, overlapped_with FROM measurements")}
    assert meas[a["run_id"]]["shared_host"] is True and meas[a["run_id"]]["overlapped_with"] == got[a["run_id"]]
    assert meas[c["run_id"]]["shared_host"] is False and meas[c["run_id"]]["overlapped_with"] == []
    hosts = {r["run_id"]: r for r in sql_rows(db, "SELECT run_id, host, held_start_wall, held_end_wall "
                                                  "FROM run_hosts")}
    start = BASE.replace(tzinfo=dt.timezone.utc).timestamp()
    assert hosts[b["run_id"]]["held_start_wall"] == start + 5 * 60
    assert hosts[b["run_id"]]["held_end_wall"] == start + 15 * 60
    # idempotent: a second collect changes no row
    before = table_contents(db, ROW_TABLES)
    collect(db, wd, slurm=Slurm(sacct))
    assert table_contents(db, ROW_TABLES) == before


def test_a_later_run_flags_an_earlier_one_and_incremental_equals_from_scratch(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    sacct = FakeSacct({"201": ("node1", 0, 30), "202": ("node[1-2]", 20, 40), "203": ("node2", 45, 50)})
    a = run(wd, "c", 1, "201")
    collect(db, wd, slurm=Slurm(sacct))
    assert flags(db) == {a["run_id"]: []}
    assert sql_rows(db, "SELECT shared_host FROM measurements") == [{"shared_host": False}]
    b = jobdirs.make_run(wd, "c", 2, hosts=("node1", "node2"), gpus_per_host=2, ticks=30, experiment=LORA,
                         job_id="202")
    jobdirs.append_manifest(wd, "c", b["events"])
    b_id = f"c/{b['job_dir'].name}"
    collect(db, wd, slurm=Slurm(sacct))
    # the earlier run, not read again, is flagged now too: its row, its warning and its measurement
    assert flags(db) == {a["run_id"]: [b_id], b_id: [a["run_id"]]}
    (m,) = sql_rows(db, "SELECT shared_host, overlapped_with FROM measurements WHERE run_id = ?", [a["run_id"]])
    assert m == {"shared_host": True, "overlapped_with": [b_id]}
    c = run(wd, "c", 3, "203", host="node2")
    collect(db, wd, slurm=Slurm(sacct))
    incremental = table_contents(db, ROW_TABLES)
    assert flags(db)[c["run_id"]] == []
    # the same job dirs collected into a new database at once give the same rows (collected_at aside)
    fresh = tmp_path / "fresh.duckdb"
    collect(fresh, wd, slurm=Slurm(sacct))
    strip = "SELECT * EXCLUDE (collected_at) FROM runs ORDER BY run_id"
    assert sql_rows(fresh, strip) == sql_rows(db, strip)
    assert table_contents(fresh, ["run_hosts"]) == {"run_hosts": incremental["run_hosts"]}
    # The measurements too, every value equal; a float to its last digit or two (a sum's last bits depend on the
    # order its rows were stored in, which differs between one collect and three).
    order = "SELECT * FROM measurements ORDER BY run_id"
    for a_row, b_row in zip(sql_rows(fresh, order), sql_rows(db, order), strict=True):
        assert a_row.keys() == b_row.keys()
        for k in a_row:
            x, y = a_row[k], b_row[k]
            if isinstance(x, float) and isinstance(y, float):
                assert x == pytest.approx(y, rel=1e-12, abs=1e-12), k
            else:
                assert x == y, k


def test_a_run_still_running_overlaps_what_starts_after_it(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    a = run(wd, "c", 1, "301")
    b = run(wd, "c", 2, "302")
    sacct = FakeSacct({"301": ("node1", 0, None), "302": ("node1", 600, 610)})  # a is still running
    collect(db, wd, slurm=Slurm(sacct))
    assert flags(db) == {a["run_id"]: [b["run_id"]], b["run_id"]: [a["run_id"]]}
    (h,) = sql_rows(db, "SELECT held_end_wall FROM run_hosts WHERE run_id = ?", [a["run_id"]])
    assert h["held_end_wall"] is None
    # a ends before b starts after all: the next collect takes both flags back
    sacct.jobs["301"] = ("node1", 0, 10)
    collect(db, wd, slurm=Slurm(sacct))
    assert flags(db) == {a["run_id"]: [], b["run_id"]: []}
    runs = sql_rows(db, "SELECT warnings FROM runs")
    assert all(not any(w.startswith(WARNING_PREFIX) for w in r["warnings"] or []) for r in runs)


def test_local_runs_are_placed_by_their_stage_events(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    a = run(wd, "loc", 1, "pid-a", host="vm", executor="local")
    b = run(wd, "loc", 2, "pid-b", host="vm", executor="local", t0=jobdirs.T0 + 20)  # a's stages run to T0 + 26
    c = run(wd, "loc", 3, "pid-c", host="vm", executor="local", t0=jobdirs.T0 + 100)
    collect(db, wd, slurm=Slurm(FakeSacct({})))
    assert flags(db) == {a["run_id"]: [b["run_id"]], b["run_id"]: [a["run_id"]], c["run_id"]: []}
    (h,) = sql_rows(db, "SELECT held_start_wall, held_end_wall FROM run_hosts WHERE run_id = ?", [c["run_id"]])
    events = [json.loads(x) for x in c["paths"].stages("vm").read_text().splitlines()]
    assert h == {"held_start_wall": min(e["t_wall"] for e in events), "held_end_wall": max(e["t_wall"] for e in events)}


def _two_campaigns(wd: Path, refs: list[Reference] | None = None) -> dict[str, dict]:
    """Campaigns base and cand of points 1 and 2, one after the other; cand's point 2 shared node2 with a run
    of campaign noise."""
    out = {"b1": run(wd, "base", 1, "401", references=refs), "b2": run(wd, "base", 2, "402"),
           "c1": run(wd, "cand", 1, "403", references=refs), "c2": run(wd, "cand", 2, "404", host="node2"),
           "x": run(wd, "noise", 9, "405", host="node2")}
    return out


SACCT_TWO = {"401": ("node1", 0, 10), "402": ("node1", 20, 30), "403": ("node1", 40, 50), "404": ("node2", 60, 70),
             "405": ("node2", 65, 66)}


def test_compare_leaves_shared_runs_out_and_says_how_many(cli, tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    r = _two_campaigns(wd)
    collect(db, wd, slurm=Slurm(FakeSacct(SACCT_TWO)))
    assert flags(db)[r["c2"]["run_id"]] == [r["x"]["run_id"]]
    res = cli("compare", "base", "cand", "--db", db, "--json")
    doc = json.loads(res.stdout)
    assert [row["point_id"] for row in doc["rows"]] == [r["b1"]["point_id"]]  # point 2 has no clean CAND run
    assert doc["excluded_shared"] == {"BASE": [], "CAND": [r["c2"]["run_id"]]}
    text = cli("compare", "base", "cand", "--db", db).stdout
    assert "excluded 1 run(s)" in text and r["c2"]["run_id"] in text and "--include-shared" in text
    both = json.loads(cli("compare", "base", "cand", "--db", db, "--json", "--include-shared").stdout)
    assert len(both["rows"]) == 2 and both["excluded_shared"] == {"BASE": [], "CAND": []}
    assert both["kept"] == {"CAND": [{"run_id": r["c2"]["run_id"], "why": "shared host"}]}
    kept = cli("compare", "base", "cand", "--db", db, "--include-shared").stdout
    # what it kept is said, never "none shared its host" about runs that did
    assert "--include-shared kept 1 run(s)" in kept and "(CAND 1)" in kept and "none shared" not in kept
    assert "1 on a host another sbench run used at the same time" in kept
    # a side left with nothing says why
    res = cli("compare", "base", "noise", "--db", db)
    assert res.exit_code == 2 and "1 measured on a host another sbench run used at the same time" in res.output


def test_check_does_not_judge_a_shared_run_and_the_report_leaves_it_out(cli, tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    refs = [Reference("train_tokens_per_second", 1000.0, lower=0.5)]  # the ranks wrote 1000 tok/s each
    r = _two_campaigns(wd, refs)
    collect(db, wd, slurm=Slurm(FakeSacct(SACCT_TWO)))
    res = cli("check", "cand", "--db", db, "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["counts"] == {"pass": 1, "fail": 0, "missing": 0, "shared": 1}
    (shared,) = [c for c in doc["checks"] if c["status"] == "shared"]
    assert shared["run_id"] == r["c2"]["run_id"] and r["x"]["run_id"] in shared["reason"]
    assert cli("check", "cand", "--db", db, "--allow-missing").exit_code == 0
    assert json.loads(cli("check", "base", "--db", db, "--json").stdout)["ok"]
    rep = build_report(db, campaign="cand")
    assert [m["run_id"] for m in rep.data.measurements] == [r["c1"]["run_id"]]
    assert [m["run_id"] for m in rep.data.shared] == [r["c2"]["run_id"]]
    assert "1 measurement left out: measured on a shared or busy host" in rep.html and r["x"]["run_id"] in rep.html
    assert "left out" not in html_only(build_report(db, campaign="base").html)


@pytest.mark.parametrize("damage", ["runs.overlapped_with", "measurements.shared_host"])
def test_an_older_database_is_refused_with_the_fix(tmp_path: Path, damage: str) -> None:
    """A database of the schema before shared hosts (version 8, without the columns) is not upgraded in
    place: it is refused with the command that rebuilds it from the job dirs."""
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    run(wd, "c", 1, "501")
    collect(db, wd, slurm=Slurm(FakeSacct({"501": ("node1", 0, 1)})))
    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    table, col = damage.split(".")
    con = duckdb.connect(str(old))
    con.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    con.execute("UPDATE metadata SET value = '8' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(SchemaMismatchError, match="sbench collect"):
        open_store(old)
