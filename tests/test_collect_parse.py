"""Parsers used by collect: sacct output, NCCL transport lines, host lists, JSON(L) problems."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.collect.parse import csv_tail, nccl_transport, parse_stages, read_json, read_jsonl, summarize_transports
from harness.contract import jobstate
from harness.contract.jobstate import FINAL_STATES
from harness.slurm.client import Slurm
from harness.slurm.hostlist import expand_hostlist
from harness.slurm.sacct import JobKey, parse_elapsed, parse_rss_mb, parse_sacct, parse_squeue, sacct_argv

FIX = Path(__file__).parent / "fixtures" / "collect"


# -- sacct ---------------------------------------------------------------------------------------------------
def test_sacct_recorded_output_jobs_steps_and_arrays():
    jobs = parse_sacct((FIX / "sacct" / "mixed.txt").read_text())
    assert sorted(jobs) == ["4101_0", "4101_1", "4101_2", "4101_3", "4101_4", "4101_5", "4101_6", "4101_7",
                            "4101_8", "4101_9", "4102", "4103"]
    ok = jobs["4101_0"]
    assert (ok.state, ok.exit_code, ok.exit_signal, ok.elapsed_s) == ("COMPLETED", 0, 0, 12 * 60 + 31)
    assert ok.hosts == ["node1", "node2"]
    assert [s.step_id for s in ok.steps] == ["batch", "extern", "0"]
    assert ok.max_rss_mb == pytest.approx(37748736 / 1024)  # MaxRSS lives on the steps
    assert jobs["4101_1"].state == "CANCELLED" and jobs["4101_1"].state_raw == "CANCELLED by 0"
    assert jobs["4101_2"].max_rss_mb == pytest.approx(2.5 * 1024)
    assert jobs["4101_5"].exit_code == 1
    assert jobs["4101_6"].hosts == ["gpu-a01", "gpu-a02", "gpu-a07"] and jobs["4101_6"].end is None
    assert jobs["4101_8"].state == "PENDING" and jobs["4101_8"].node_list is None
    assert jobs["4102"].elapsed_s == 86400 + 2 * 3600 + 3 * 60 + 4


@pytest.mark.parametrize("state,verdict,reason", [
    ("COMPLETED", "files", None), ("FAILED", "files", None), ("CANCELLED by 0", "failed", "cancelled"),
    ("TIMEOUT", "failed", "timeout"), ("NODE_FAIL", "failed", "node failure"),
    ("OUT_OF_MEMORY", "failed", "host OOM"), ("PREEMPTED", "failed", "preempted"),
    ("REQUEUED", "pending", None), ("PENDING", "pending", None), ("RUNNING", "pending", None),
])
def test_state_verdicts(state, verdict, reason):
    assert jobstate.verdict(state) == (verdict, reason)


def test_preempted_is_asked_about_again_but_cancelled_is_final():
    assert "PREEMPTED" not in FINAL_STATES and "REQUEUED" not in FINAL_STATES
    assert {"CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "COMPLETED", "FAILED"} <= FINAL_STATES


def test_requeued_job_listed_twice_is_one_job_with_the_latest_state():
    jobs = parse_sacct((FIX / "sacct" / "requeue_dup.txt").read_text())
    assert list(jobs) == ["4200"]
    assert jobs["4200"].state == "RUNNING" and jobs["4200"].hosts == ["node2"]


def test_sacct_is_batched_and_failure_falls_back():
    calls = []

    def runner(argv):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    ids = [f"77_{i}" for i in range(450)]
    jobs, why = Slurm(runner, chunk=200).accounting(ids)
    assert jobs == {} and why is None
    # 450 ids in batches of 200, not 450 calls; then, since sacct knows none of these tasks, one question
    # about their array (a task that never left the queue is part of its array's one record)
    assert len(calls) == 4 and calls[3][:3] == ["sacct", "-j", "77"]
    assert calls[0][:2] == ["sacct", "-j"] and calls[0][2].count(",") == 199
    assert "--format=JobID,State,ExitCode,Elapsed,MaxRSS,NodeList,Start,End,Submit,ConsumedEnergyRaw,JobName" in (
        calls[0])
    assert "-D" in calls[0] and "-S" not in calls[0]  # every record; no submit time given: since ever

    def missing(argv):
        raise FileNotFoundError(argv[0])

    assert Slurm(missing).accounting(["1"]) == (None, "no sacct command")

    def disabled(argv):
        return subprocess.CompletedProcess(argv, 1, "", "sacct: error: Slurm accounting storage is disabled\n")

    jobs, why = Slurm(disabled).accounting(["1"])
    assert jobs is None and "accounting storage is disabled" in why
    assert sacct_argv(["1", "2_3"])[2] == "1,2_3"


def test_small_sacct_fields():
    assert parse_elapsed("05:07") == 307 and parse_elapsed("2-00:00:01") == 172801
    assert parse_rss_mb("2048K") == 2.0 and parse_rss_mb("1G") == 1024.0 and parse_rss_mb("") is None
    assert parse_squeue("55_[1-2]|PENDING|Resources|\n56|RUNNING|None|node[3-4]\n") == {
        "55_1": ("PENDING", None, "Resources", None), "55_2": ("PENDING", None, "Resources", None),
        "56": ("RUNNING", "node[3-4]", "None", None)}


def test_a_queued_job_of_another_name_is_a_strangers():
    """A job id reused after the controller's state was reset: the queue's job of that id is not sbench's
    when its name differs from the one sbench submitted under."""
    q = parse_squeue("77_3|RUNNING|None|node1|sbench.night.4f2a9c01\n78|PENDING|Priority||someone-elses-job\n")
    assert q["77_3"].name == "sbench.night.4f2a9c01" and q["78"].name == "someone-elses-job"
    mine = JobKey(None, "sbench.night.4f2a9c01")
    assert q["77_3"].belongs(mine) and not q["78"].belongs(mine)
    assert q["78"].belongs(None) and q["78"].belongs(JobKey(None, None))  # nothing to tell them apart by


def test_expand_hostlist():
    assert expand_hostlist("gpu-a[01-03,07],node9") == ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07", "node9"]
    assert expand_hostlist("node1") == ["node1"]
    assert expand_hostlist("None assigned") == []


# -- NCCL ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,transport,evidence", [
    ("roce.node1.log", "roce", "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_3:1/RoCE"),
    ("socket.node2.log", "socket", "Using network Socket"),
    ("ib.node1.log", "ib", "NET/IB : Using [0]mlx5_0:1/IB"),
    ("ib_disabled.node1.log", "socket", "Using network Socket"),
    ("single_node.node1.log", None, None),
    ("no_nccl.node1.log", None, None),
])
def test_nccl_transport_from_recorded_logs(name, transport, evidence):
    found, line = nccl_transport(FIX / "nccl" / name)
    assert found == transport
    if evidence is None:
        assert line is None
    else:
        assert evidence in line


def test_nccl_transport_channel_lines_alone(tmp_path):
    p = tmp_path / "train.n.log"
    p.write_text("h:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0\n")
    assert nccl_transport(p)[0] == "socket"
    assert nccl_transport(tmp_path / "missing.log") == (None, None)


def test_transport_summary():
    assert summarize_transports({"a": "roce", "b": "roce"}) == ("roce", "a=roce,b=roce")
    assert summarize_transports({"a": "roce", "b": "socket"}) == ("mixed", "a=roce,b=socket")
    assert summarize_transports({"a": None}) == (None, "a=-")


# -- JSON / JSONL / CSV ----------------------------------------------------------------------------------
def test_jsonl_truncated_last_line_and_invalid_middle_line(tmp_path):
    p = tmp_path / "stages.node1.jsonl"
    good = json.dumps({"event": "start", "stage": "train", "t_wall": 1.0})
    p.write_text(f"{good}\nnot json\n{good}\n{{\"event\": \"end\", \"sta")
    objs, problems = read_jsonl(p, ("event", "stage", "t_wall"))
    assert [i for i, _ in objs] == [1, 3]
    assert problems == ["stages.node1.jsonl line 2: invalid JSON", "stages.node1.jsonl line 4: truncated JSON"]


def test_stage_pairing_and_crash(tmp_path):
    p = tmp_path / "stages.n1.jsonl"
    evs = [{"event": "start", "stage": "setup", "rank": None, "t_wall": 10.0, "t_mono": 1.0, "pid": 1},
           {"event": "end", "stage": "setup", "rank": None, "t_wall": 11.0, "t_mono": 2.5, "pid": 1, "status": "ok"},
           {"event": "start", "stage": "train", "rank": 0, "t_wall": 12.0, "t_mono": 3.0, "pid": 2}]
    p.write_text("".join(json.dumps(e) + "\n" for e in evs))
    log = parse_stages(p, "n1")
    assert [(r.stage, r.status, r.duration_s) for r in log.rows] == [("setup", "ok", 1.5),
                                                                     ("train", "incomplete", None)]


def test_read_json_problems(tmp_path):
    (tmp_path / "a.json").write_text('{"host": "n1", "exit')
    (tmp_path / "b.json").write_text('{"host": "n1",, "x": 1}')
    assert read_json(tmp_path / "a.json") == (None, "a.json line 1: truncated JSON")
    assert read_json(tmp_path / "b.json")[1].startswith("b.json line 1: invalid JSON")
    assert read_json(tmp_path / "c.json") == (None, None)


def test_csv_tail(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("a,b\n1,2\n3,")
    assert csv_tail(p) == (len("a,b\n1,2\n"), 3)
    p.write_text("a,b\n1,2\n")
    assert csv_tail(p) is None


def test_sacct_output_recorded_on_the_test_cluster():
    """Recorded from Slurm 22.05 on tests/cluster (a 2-node job and a job array)."""
    jobs = parse_sacct((FIX / "sacct" / "testcluster.txt").read_text())
    assert sorted(jobs) == ["1", "3_0", "3_1"]
    assert jobs["1"].hosts == ["node1", "node2"] and jobs["1"].state == "COMPLETED"
    assert [s.step_id for s in jobs["1"].steps] == ["batch", "0", "1"]
    assert jobs["1"].max_rss_mb == pytest.approx(10884 / 1024)
    assert jobs["3_0"].elapsed_s == 1.0 and jobs["3_0"].exit_code == 0
