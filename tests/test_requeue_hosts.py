"""A job SLURM requeues may start again on another node. What the first execution's host wrote (its result:
cancelled by SIGTERM) is not the run's result once the last execution, on another host, ended ok."""

from __future__ import annotations

import json
from pathlib import Path

from harness.collect import collect
from harness.contract.formats import Stage
from harness.slurm.client import Slurm

from .kit import jobdirs, sql_rows
from .kit.jobdirs import FakeSlurm


def test_a_requeued_job_that_ran_again_on_another_node_is_judged_by_its_last_execution(tmp_path: Path) -> None:
    wd = tmp_path / "runs"
    run = jobdirs.make_run(wd, "rq", 0, hosts=("node2",), gpus_per_host=1, ticks=20)
    paths = run["paths"]
    jobdirs.append_manifest(wd, "rq", run["events"])
    # The last execution (restart 1) on node2: its stages, as the runner writes them after a requeue.
    events = [json.loads(x) for x in paths.stages("node2").read_text().splitlines()]
    jobdirs.write_stages(paths, "node2", [{**e, "restart": 1} for e in events])
    # The first execution (restart 0) on node1, stopped mid-training by the requeue's SIGTERM.
    t0 = jobdirs.T0 - 100
    jobdirs.write_stages(paths, "node1", [
        jobdirs.stage_event("start", Stage.SETUP, "node1", t0),
        jobdirs.stage_event("end", Stage.SETUP, "node1", t0 + 1),
        jobdirs.stage_event("start", Stage.TRAIN, "node1", t0 + 5, 0),
        jobdirs.stage_event("end", Stage.TRAIN, "node1", t0 + 9, 0, status="error", error="terminated by signal 15")])
    jobdirs.write_json(paths.result("node1"), jobdirs.result_doc(
        "node1", 0, t0, t0 + 10, outcome="failed", exit_code=143, signal=15,
        reason="cancelled by signal 15 (SIGTERM); training stopped"))
    jobdirs.write_json(paths.error(0), {
        "kind": "failed", "error_type": "Terminated", "message": "terminated by signal 15", "rank": 0,
        "host": "node1", "stage": "train", "t_wall": t0 + 9})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node2")})))
    (r,) = sql_rows(db, "SELECT outcome, reason, restarts, warnings FROM runs")
    assert (r["outcome"], r["restarts"]) == ("ok", 1), r
    said = "; ".join(r["warnings"] or [])
    assert "result.node1.json: written by execution 0 of a job SLURM started again (1) without this host" in said
    assert sql_rows(db, "SELECT count(*) AS n FROM measurements") == [{"n": 1}]


def test_a_requeued_job_on_the_same_node_keeps_reading_that_nodes_files(tmp_path: Path) -> None:
    """Every host of the last execution is read, whatever the restart: a single-node job requeued onto the same
    node is the case the runner's restart count already covers."""
    wd = tmp_path / "runs"
    run = jobdirs.make_run(wd, "rq", 0, hosts=("node1",), gpus_per_host=1, ticks=20)
    paths = run["paths"]
    jobdirs.append_manifest(wd, "rq", run["events"])
    events = [json.loads(x) for x in paths.stages("node1").read_text().splitlines()]
    jobdirs.write_stages(paths, "node1", [{**e, "restart": 0} for e in events[:3]] + [{**e, "restart": 1}
                                                                                      for e in events])
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    (r,) = sql_rows(db, "SELECT outcome, restarts, warnings FROM runs")
    assert (r["outcome"], r["restarts"]) == ("ok", 1), r
    assert not [w for w in r["warnings"] or [] if "not read" in w]
