"""Interruptions, concurrency and process identity on the local executor (docs/reliability.md).

Real processes and real signals: ``sbench`` runs as a subprocess (``python -m harness``), the local queue
runs detached as it does for a user, and the signals are sent with ``os.kill`` at chosen moments (before the
queue starts a job, while one runs, after one ended). The tests marked ``train`` run the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from harness.campaign.lock import CampaignLocks, holding_campaign_locks
from harness.contract.errors import Interrupted
from harness.contract.paths import CampaignPaths, JobPaths
from harness.runner import stages
from harness.runner.node import NodeRunner
from harness.runner.stages import read_stages
from harness.slurm import localjob

from .kit import FULL, ROOT, SMALL_DATASET, Campaign, command, jobdirs, sql_rows, write_yaml

# -- helpers -------------------------------------------------------------------------------------------------

def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SBENCH_FAULT"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def sbench(lab: dict[str, Path], *args: Any, env: dict[str, str] | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``sbench ARGS --workdir W --db D`` as a process of its own."""
    cmd = command(*args, "--workdir", lab["workdir"], "--db", lab["db"])
    return subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=timeout, cwd=lab["root"])


def start(lab: dict[str, Path], name: str, *args: Any, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``sbench ARGS`` in the background; its output goes to <root>/<name>.out and .err."""
    cmd = command(*args, "--workdir", lab["workdir"], "--db", lab["db"])
    out, err = (lab["root"] / f"{name}.out").open("w"), (lab["root"] / f"{name}.err").open("w")
    return subprocess.Popen(cmd, env=env or _env(), cwd=lab["root"], text=True, stdout=out, stderr=err)


def output(lab: dict[str, Path], name: str) -> tuple[str, str]:
    return (lab["root"] / f"{name}.out").read_text(), (lab["root"] / f"{name}.err").read_text()


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def attempt_lines(lab: dict[str, Path], campaign: str) -> list[dict[str, Any]]:
    return Campaign(lab["workdir"], lab["db"], campaign).manifest("attempt")


def job_dirs(lab: dict[str, Path], campaign: str) -> list[str]:
    """The campaign's attempts' job dirs, in submission (queue) order."""
    return [ev["job_dir"] for ev in attempt_lines(lab, campaign)]


def state(jd: str) -> str | None:
    return localjob.job_state(jd)


def training(jd: str) -> bool:
    """Rank 0 of the job in *jd* is in its train stage."""
    paths = JobPaths(jd)
    return any(e["stage"] == "train" and e["rank"] == 0
               for h in paths.stage_hosts() for e in read_stages(paths.stages(h)))


def queue_pid(lab: dict[str, Path], campaign: str) -> int:
    (pidfile,) = (lab["workdir"] / campaign / ".local").glob("queue-*.pid")
    return int(json.loads(pidfile.read_text())["pid"])


def status_rows(lab: dict[str, Path], campaign: str) -> dict[str, dict[str, Any]]:
    res = sbench(lab, "status", "--campaign", campaign, "--json")
    assert res.returncode == 0, res.stderr
    return {r["job_dir"]: r for r in json.loads(res.stdout)["rows"] if r.get("job_dir")}


def runs(lab: dict[str, Path], campaign: str) -> list[dict[str, Any]]:
    return sql_rows(lab["db"], "SELECT point_id, attempt, state, outcome, reason, job_dir, cancel_requested_at "
                               "FROM runs WHERE campaign = ? ORDER BY job_dir", [campaign])


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def sweep_file(lab: dict[str, Path], campaign: str, model: Path, data: Path, grid: dict[str, list[Any]]) -> Path:
    return write_yaml(lab["root"] / f"{campaign}.yaml", {
        "campaign": campaign, "experiment": FULL,
        "entity": {"model_name": "tiny", "model_max_length": 96, "dataset_id": SMALL_DATASET, "batch_size": 2,
                   "number_gpus": 1, "gradient_accumulation_steps": 1, "torch_dtype": "float32"},
        "grid": grid, "model_map": {"tiny": str(model)}, "data_dir": str(data),
        "runner": {"sample_interval_s": 0.5}})


# -- process identity: a file names a pid, it never vouches for it -------------------------------------------

def test_a_forged_submitted_json_or_queue_pidfile_is_never_trusted(lab) -> None:
    """status must not show RUNNING (or PENDING) for a process sbench did not start, and cancel must not
    signal it, whatever submitted.json or the queue's pidfile say about it (its start time and command line
    included)."""
    stranger = subprocess.Popen(["setsid", "sleep", "600"])  # setsid execs sleep: the same pid
    pid = stranger.pid
    try:
        wait_until(lambda: psutil.Process(pid).name() == "sleep", 10, "the sleep to start")
        camp = lab["workdir"] / "forged"
        qfile = camp / ".local" / "queue-1.json"
        qfile.parent.mkdir(parents=True)
        qfile.write_text("{}")
        CampaignPaths.queue_pidfile(qfile).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
        events = [jobdirs.manifest_events("forged", FULL, "local")]
        dirs = []
        for i, started in enumerate((True, False)):
            jd = camp / f"{i:016x}.r0.a1"
            jd.mkdir()
            info: dict[str, Any] = {"executor": "local", "job_id": str(pid), "queue": str(qfile),
                                    "submitted_at": "2026-01-01T00:00:00+0000"}
            if started:  # what the old identity check trusted: the real start time and a command-line needle
                info.update(pid=pid, started_at="2026-01-01T00:00:01+0000",
                            process={"pid": pid, "create_time": psutil.Process(pid).create_time(), "needle": "sleep"})
            jobdirs.write_json(jd / "submitted.json", info)
            events.append({"type": "attempt", "campaign": "forged", "point_id": f"{i:016x}", "repeat": 0, "attempt": 1,
                           "job_dir": str(jd), "executor": "local", "job_id": str(pid), "reason": "new"})
            dirs.append(str(jd))
        jobdirs.append_manifest(lab["workdir"], "forged", events)
        rows = status_rows(lab, "forged")
        assert rows[dirs[0]]["live_state"] == "LOST" and rows[dirs[0]]["phase"] != "running", rows[dirs[0]]
        assert rows[dirs[1]]["live_state"] == "NOT_STARTED" and rows[dirs[1]]["phase"] == "not started", rows[dirs[1]]
        res = sbench(lab, "cancel", "--campaign", "forged")
        assert res.returncode == 0, res.stderr
        time.sleep(0.5)
        assert psutil.Process(pid).is_running() and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE, \
            "cancel signalled a process sbench did not start"
        assert sbench(lab, "collect").returncode == 0
        assert all(r["state"] != "RUNNING" for r in runs(lab, "forged")), runs(lab, "forged")
    finally:
        stranger.kill()
        stranger.wait()


# -- the campaign lock ------------------------------------------------------------------------------------

def test_a_held_campaign_lock_makes_submit_and_cancel_wait_then_exit_1_naming_the_holder(lab) -> None:
    sweep = write_yaml(lab["root"] / "s.yaml", {
        "campaign": "busy", "experiment": FULL, "entity": {"model_name": "tiny", "model_max_length": 64,
                                                           "batch_size": 2, "number_gpus": 1},
        "model_map": {"tiny": str(lab["root"] / "model")}})
    locks = CampaignLocks("submit")
    locks.acquire(lab["workdir"] / "busy")
    try:
        t0 = time.monotonic()
        res = sbench(lab, "submit", sweep, "--executor", "local", "--no-prepare", env=_env(SBENCH_CAMPAIGN_WAIT="1"))
        assert time.monotonic() - t0 < 60
        assert res.returncode == 1, res.stdout + res.stderr
        assert (f"campaign 'busy' is in use by another sbench submit (PID {os.getpid()} on {socket.gethostname()}"
                in res.stderr), res.stderr
        assert "waited 1 s" in res.stderr and "SBENCH_CAMPAIGN_WAIT" in res.stderr and "Traceback" not in res.stderr
        assert not (lab["workdir"] / "busy" / "manifest.jsonl").exists()  # nothing written
        assert [p.name for p in (lab["workdir"] / "busy").iterdir()] == [".lock"]
        res = sbench(lab, "cancel", "--campaign", "busy", env=_env(SBENCH_CAMPAIGN_WAIT="0.5"))
        assert res.returncode == 1 and f"PID {os.getpid()}" in res.stderr, res.stderr
    finally:
        locks.release_all()


def test_a_signal_while_the_campaign_lock_is_held_takes_effect_once_the_work_is_done(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)

    @holding_campaign_locks("submit")
    def submit_like(locks: CampaignLocks, campaign_dir: Path) -> str:
        locks.acquire(campaign_dir)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the writing
        time.sleep(0.2)
        (campaign_dir / "written").write_text("every line")
        return "the report"

    with pytest.raises(Interrupted) as exc:
        submit_like(tmp_path / "c")
    assert exc.value.signum == signal.SIGTERM and exc.value.exit_code == 143
    assert exc.value.result == "the report" and (tmp_path / "c" / "written").read_text() == "every line"
    assert signal.getsignal(signal.SIGTERM) == before
    other = CampaignLocks("cancel")
    other.acquire(tmp_path / "c", wait_s=0)  # released: free at once
    other.release_all()


def test_retry_refuses_a_sweep_that_now_names_another_campaign(lab) -> None:
    doc = {"campaign": "first", "experiment": FULL, "entity": {"model_name": "tiny", "model_max_length": 64,
                                                               "batch_size": 2, "number_gpus": 1},
           "model_map": {"tiny": str(lab["root"] / "model")}}
    sweep = write_yaml(lab["root"] / "s.yaml", doc)
    manifest = jobdirs.append_manifest(lab["workdir"], "first", [{**jobdirs.manifest_events("first", FULL, "local"),
                                                                 "sweep": str(sweep), "inventory": None}])
    before = manifest.read_text()
    write_yaml(sweep, {**doc, "campaign": "second"})
    res = sbench(lab, "retry", "first", "--executor", "local")
    assert res.returncode == 2, res.stdout + res.stderr
    assert str(sweep) in res.stderr and "'second'" in res.stderr and "'first'" in res.stderr
    assert "Traceback" not in res.stderr
    assert manifest.read_text() == before and not (lab["workdir"] / "second").exists()
    # A campaign submitted under another name (submit --campaign) follows its sweep while the sweep's
    # campaign: says what it said then.
    write_yaml(sweep, {**doc, "campaign": "nightly"})
    jobdirs.append_manifest(lab["workdir"], "nightly-2", [{**jobdirs.manifest_events("nightly-2", FULL, "local"),
                                                           "sweep": str(sweep), "inventory": None,
                                                           "sweep_campaign": "nightly"}])
    res = sbench(lab, "retry", "nightly-2", "--executor", "local", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["campaign"] == "nightly-2", res.stdout + res.stderr


def test_a_submit_killed_before_it_hands_its_job_dirs_over_leaves_them_visibly_not_started(lab) -> None:
    """SIGKILL between writing the job dirs and handing them to the executor (the window SIGINT and SIGTERM
    wait out): the attempt is not started, never queued for ever, and its number is never used again."""
    sweep = write_yaml(lab["root"] / "s.yaml", {
        "campaign": "killed", "experiment": FULL, "entity": {"model_name": "tiny", "model_max_length": 64,
                                                             "batch_size": 2, "number_gpus": 1},
        "model_map": {"tiny": str(lab["root"] / "model")}})
    code = ("import os, signal, sys\n"
            "from harness.campaign.executors import local\n"
            "local.LocalBackend.submit = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
            "from harness.cli import main\n"
            "main(sys.argv[1:], prog_name='sbench')\n")
    proc = subprocess.run([sys.executable, "-c", code, "submit", str(sweep), "--executor", "local", "--no-prepare",
                           "--workdir", str(lab["workdir"]), "--db", str(lab["db"])], env=_env(), capture_output=True,
                          text=True, timeout=300, cwd=lab["root"])
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (jd,) = [p.parent for p in (lab["workdir"] / "killed").glob("*/spec.json")]
    assert jd.name.endswith(".a1") and not attempt_lines(lab, "killed")  # written, never recorded
    assert state(str(jd)) == "NOT_STARTED"
    # The next submit of the campaign sees it (by its spec.json) and uses a new attempt number.
    res = sbench(lab, "submit", sweep, "--executor", "local", "--no-prepare", "--retry-failed", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    (row,) = json.loads(res.stdout)["points"]
    assert (row["action"], row["attempt"], row["reason"]) == ("submit", 2, "retry"), row
    got = {Path(r["job_dir"]).name: r for r in runs(lab, "killed")}
    assert (got[jd.name]["state"], got[jd.name]["outcome"]) == ("NOT_STARTED", "failed")
    assert "stopped before handing it to the executor" in got[jd.name]["reason"]
    assert sbench(lab, "cancel", "--campaign", "killed").returncode == 0  # the new attempt: nothing to train


# -- attempts left not started: status, cancel and collect, in either order ---------------------------------

@pytest.mark.parametrize("collect_first", [True, False])
def test_an_attempt_whose_queue_died_is_not_started_and_cancel_takes_whatever_collect_did(lab, collect_first) -> None:
    run = jobdirs.make_run(lab["workdir"], "strand", 0, hosts=("n1",), gpus_per_host=1, ticks=5, executor="local")
    for f in run["paths"].root.iterdir():
        if not f.name.startswith(("spec.", "submitted.")):
            f.unlink()
    qfile = lab["workdir"] / "strand" / ".local" / "queue-1.json"  # its queue never wrote a pidfile, or died
    jobdirs.write_json(run["paths"].submitted, {"executor": "local", "job_id": None, "queue": str(qfile),
                                                "submitted_at": "2026-01-01T00:00:00+0000"})
    jobdirs.append_manifest(lab["workdir"], "strand",
                            [jobdirs.manifest_events("strand", FULL, "local"), *run["events"]])
    jd = str(run["job_dir"])
    row = status_rows(lab, "strand")[jd]
    assert (row["phase"], row["live_state"]) == ("not started", "NOT_STARTED")
    if collect_first:
        assert sbench(lab, "collect").returncode == 0
        (r,) = runs(lab, "strand")
        assert (r["state"], r["outcome"]) == ("NOT_STARTED", "failed") and r["reason"].startswith("not started")
    res = sbench(lab, "cancel", "--campaign", "strand")
    assert res.returncode == 0 and "cancelled 1 attempt(s)" in res.stdout, res.stdout + res.stderr
    assert sbench(lab, "collect").returncode == 0
    (r,) = runs(lab, "strand")
    assert (r["state"], r["outcome"], r["reason"]) == ("CANCELLED", "failed", "cancelled before it started")
    assert r["cancel_requested_at"] is not None
    assert "cancelled 0 attempt(s)" in sbench(lab, "cancel", "--campaign", "strand").stdout


# -- the node runner: the signal is the reason, wherever it landed ----------------------------------------

def test_a_signal_that_sets_off_another_error_is_recorded_as_the_signal(tmp_path: Path, monkeypatch) -> None:
    """As when SIGTERM lands inside ``import numpy`` and the half-done import then raises RecursionError: the
    run is "cancelled by signal 15" and exits 143, not failed with the RecursionError."""
    jd = tmp_path / "job"
    jd.mkdir()
    (jd / "spec.json").write_text(json.dumps({"jobspec": {"cpu_partition": True, "runner": {}}}))
    runner = NodeRunner(jd, "node7", ["true"])

    def setup() -> None:
        with runner.log.stage("setup"):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # a second signal while it unwinds: ignored
                raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(runner, "setup", setup)
    monkeypatch.setattr(stages, "_SIGNAL", [])  # the signal this process "received" is forgotten afterwards
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = runner.main()
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert code == 128 + signal.SIGTERM
    res = json.loads(JobPaths(jd).result("node7").read_text())
    assert res["outcome"] == "failed" and res["terminated_by"] == signal.SIGTERM
    assert res["reason"] == "cancelled by signal 15 (SIGTERM); stopped during setup, before training", res["reason"]
    ends = [e for e in read_stages(JobPaths(jd).stages("node7")) if e["event"] == "end"]
    assert [(e["stage"], e["status"]) for e in ends] == [("setup", "killed"), ("teardown", "ok")]


# -- real runs: the tiny model through the local executor ---------------------------------------------------

@pytest.mark.train
@pytest.mark.slow(20)
def test_two_concurrent_submits_of_one_sweep_start_each_attempt_once(lab, tiny_model, small_data_dir) -> None:
    sweep = sweep_file(lab, "twice", tiny_model, small_data_dir, {"max_steps": [2, 3]})
    procs = [start(lab, f"submit{i}", "submit", sweep, "--executor", "local", "--no-prepare", "--json")
             for i in range(2)]
    codes = [p.wait(timeout=600) for p in procs]
    submitted = []
    for i, code in enumerate(codes):
        out, err = output(lab, f"submit{i}")
        assert "Traceback" not in err, err
        if code == 0:
            submitted.append(json.loads(out)["submitted"])
        else:  # the loser of the race for the campaign lock
            assert code == 1 and "campaign 'twice' is in use by another sbench submit (PID" in err, err
    assert sorted(submitted)[-1] == 2 and sum(submitted) == 2, submitted  # one set of attempts, whoever won
    lines = attempt_lines(lab, "twice")
    assert len(lines) == 2 and len({ev["job_dir"] for ev in lines}) == 2
    assert {ev["attempt"] for ev in lines} == {1}
    dirs = job_dirs(lab, "twice")
    wait_until(lambda: all(state(d) == "COMPLETED" for d in dirs), 600, "both attempts to end")
    for d in dirs:
        paths = JobPaths(d)
        (host,) = paths.stage_hosts()
        starts = [e["stage"] for e in read_stages(paths.stages(host)) if e["event"] == "start" and e["rank"] is None]
        assert starts == ["setup", "dataset", "teardown"], starts  # each stage once: one run in this job dir
        assert len(list(paths.root.glob("slurm-local-*.out"))) == 1
    assert sbench(lab, "collect").returncode == 0
    assert [r["outcome"] for r in runs(lab, "twice")] == ["ok", "ok"]


@pytest.mark.train
@pytest.mark.slow(15)
def test_submit_wait_of_a_sweep_whose_jobs_all_fail_exits_1_with_a_summary(lab, tiny_model, small_data_dir) -> None:
    sweep = sweep_file(lab, "allfail", tiny_model, small_data_dir, {"max_steps": [2, 3]})
    res = sbench(lab, "submit", sweep, "--executor", "local", "--no-prepare", "--wait",
                 env=_env(SBENCH_FAULT="error@stage=model_load"))
    assert res.returncode == 1, res.stdout + res.stderr
    table, summary = res.stdout.split("2 attempt(s) ended:")
    assert "submit  1" in table and "campaign allfail: 2 attempt(s) submitted" in table  # the table came first
    assert summary.startswith(" 0 ok, 0 invalid, 2 failed"), summary
    failed = [line for line in summary.splitlines() if line.strip().startswith("failed")]
    assert len(failed) == 2 and all("SBENCH_FAULT error injected" in line for line in failed), failed
    assert "Traceback" not in res.stderr


@pytest.mark.train
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow(20)
def test_a_stopped_submit_wait_strands_nothing(lab, tiny_model, small_data_dir, sig) -> None:
    """Before the queue starts the second job: SIGTERM (exit 143, the queued attempts listed with the cancel
    command) or SIGKILL of ``submit --wait`` stops the waiting; the detached queue runs every attempt."""
    sweep = sweep_file(lab, "stopwait", tiny_model, small_data_dir, {"max_steps": [2, 3]})
    proc = start(lab, "submit", "submit", sweep, "--executor", "local", "--no-prepare", "--wait")
    wait_until(lambda: "waiting for 2 attempt(s)" in output(lab, "submit")[1], 300, "submit to wait")
    dirs = job_dirs(lab, "stopwait")
    assert state(dirs[1]) == "PENDING"
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    out, err = output(lab, "submit")
    if sig == signal.SIGTERM:
        assert code == 143, err
        assert "interrupted by signal 15" in err and "stop them with: sbench cancel --campaign stopwait" in err, err
        assert dirs[1] in err and "Traceback" not in err
    else:
        assert code == -signal.SIGKILL
    wait_until(lambda: all(state(d) == "COMPLETED" for d in dirs), 600, "the queue to run both")
    assert sbench(lab, "collect").returncode == 0
    assert [(r["attempt"], r["outcome"]) for r in runs(lab, "stopwait")] == [(1, "ok"), (1, "ok")]


@pytest.mark.train
def test_ctrl_c_of_submit_wait_then_a_killed_queue_and_cancel(lab, tiny_model, small_data_dir) -> None:
    """Three points, one job at a time: A ends ok, B sleeps at step 3, C waits. SIGINT of ``submit --wait``
    (exit 130) leaves B running and C queued; SIGKILL of the queue leaves C visibly not started; collect, then
    cancel, stops B and C whatever collect recorded first; retry then runs nothing, and A is never rerun."""
    sweep = sweep_file(lab, "ctrlc", tiny_model, small_data_dir, {"max_steps": [2, 4, 5]})
    proc = start(lab, "submit", "submit", sweep, "--executor", "local", "--no-prepare", "--wait",
                 env=_env(SBENCH_FAULT="sleep@step=3:600"))
    wait_until(lambda: "waiting for 3 attempt(s)" in output(lab, "submit")[1], 300, "submit to wait")
    a, b, c = job_dirs(lab, "ctrlc")
    wait_until(lambda: state(a) == "COMPLETED" and state(b) == "RUNNING", 600, "A to end and B to run")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    err = output(lab, "submit")[1]
    assert "interrupted by signal 2" in err and "2 attempt(s) are still queued or running" in err, err
    assert b in err and c in err and "sbench cancel --campaign ctrlc" in err and "Traceback" not in err
    assert (state(b), state(c)) == ("RUNNING", "PENDING")
    queue = queue_pid(lab, "ctrlc")
    os.kill(queue, signal.SIGKILL)
    wait_until(lambda: gone(queue), 30, "the queue to die")
    assert (state(b), state(c)) == ("RUNNING", "NOT_STARTED")
    rows = status_rows(lab, "ctrlc")
    assert (rows[b]["phase"], rows[c]["phase"]) == ("running", "not started")
    assert sbench(lab, "collect").returncode == 0
    assert {r["job_dir"]: r["state"] for r in runs(lab, "ctrlc")}[c] == "NOT_STARTED"
    res = sbench(lab, "cancel", "--campaign", "ctrlc")
    assert res.returncode == 0 and "cancelled 2 attempt(s)" in res.stdout, res.stdout + res.stderr
    wait_until(lambda: state(b) == "CANCELLED", 120, "B to stop")
    assert sbench(lab, "collect").returncode == 0
    got = {r["job_dir"]: r for r in runs(lab, "ctrlc")}
    assert (got[a]["state"], got[a]["outcome"]) == ("COMPLETED", "ok")
    assert (got[b]["state"], got[b]["outcome"]) == ("CANCELLED", "failed") and "cancel" in got[b]["reason"]
    assert (got[c]["state"], got[c]["reason"]) == ("CANCELLED", "cancelled before it started")
    res = sbench(lab, "retry", "ctrlc", "--executor", "local", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["submitted"] == 0, res.stdout + res.stderr
    assert len(attempt_lines(lab, "ctrlc")) == 3


@pytest.mark.train
@pytest.mark.slow(30)
def test_a_signalled_queue_leaves_a_campaign_that_retry_finishes_without_rerunning_measured_points(
        lab, tiny_model, small_data_dir) -> None:
    """SIGTERM of the local queue itself while B runs: B is recorded "cancelled by signal 15", C not started
    (it says why), A stays measured; ``retry --wait`` runs B and C as new attempts and leaves A alone."""
    sweep = sweep_file(lab, "qterm", tiny_model, small_data_dir, {"max_steps": [2, 4, 5]})
    res = sbench(lab, "submit", sweep, "--executor", "local", "--no-prepare", env=_env(SBENCH_FAULT="sleep@step=3:600"))
    assert res.returncode == 0, res.stderr
    a, b, c = job_dirs(lab, "qterm")
    wait_until(lambda: state(a) == "COMPLETED" and training(b), 600, "A to end and B to train")
    queue = queue_pid(lab, "qterm")
    os.kill(queue, signal.SIGTERM)
    wait_until(lambda: gone(queue), 120, "the queue to stop")
    wait_until(lambda: state(b) == "FAILED", 120, "B to stop")
    assert state(c) == "NOT_STARTED"
    assert status_rows(lab, "qterm")[c]["phase"] == "not started"
    assert sbench(lab, "collect").returncode == 0
    measured_a = sql_rows(lab["db"], "SELECT * FROM measurements WHERE run_id LIKE ?", [f"%{Path(a).name}"])
    assert len(measured_a) == 1
    res = sbench(lab, "retry", "qterm", "--executor", "local", "--wait", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(res.stdout)
    assert rep["submitted"] == 2 and rep["summary"]["counts"] == {"ok": 2, "invalid": 0, "failed": 0, "unknown": 0,
                                                                 "not needed": 0, "stuck": 0}
    assert {p["attempt"] for p in rep["points"] if p["action"] == "submit"} == {2}
    got = {(r["job_dir"].split("/")[-1][:16], r["attempt"]): r for r in runs(lab, "qterm")}
    pa, pb, pc = (Path(d).name[:16] for d in (a, b, c))
    assert sorted(got) == sorted([(pa, 1), (pb, 1), (pb, 2), (pc, 1), (pc, 2)])  # A has one attempt only
    assert got[(pa, 1)]["outcome"] == "ok"
    assert got[(pb, 1)]["outcome"] == "failed" and "cancelled by signal 15" in got[(pb, 1)]["reason"]
    assert (got[(pc, 1)]["state"], got[(pc, 1)]["reason"]) == \
        ("NOT_STARTED", "not started: its local queue stopped on signal 15 first")
    assert got[(pb, 2)]["outcome"] == got[(pc, 2)]["outcome"] == "ok"
    assert sql_rows(lab["db"], "SELECT * FROM measurements WHERE run_id LIKE ?", [f"%{Path(a).name}"]) == measured_a


# -- the same on the project's SLURM test cluster ------------------------------------------------------------

def slurm_sweep(lab: dict[str, Path], campaign: str, model: Path, data: Path, grid: dict[str, list[Any]]) -> Path:
    path = sweep_file(lab, campaign, model, data, grid)
    doc = {**yaml.safe_load(path.read_text()), "partition": "cpu"}
    return write_yaml(path, doc)


@pytest.mark.slurm
@pytest.mark.train
def test_slurm_submit_wait_whose_jobs_all_fail_exits_1_with_a_summary(lab, tiny_model, small_data_dir,
                                                                      slurm_cluster) -> None:
    sweep = slurm_sweep(lab, "slurmfail", tiny_model, small_data_dir, {"max_steps": [2, 3]})
    res = sbench(lab, "submit", sweep, "-i", slurm_cluster["inventory"], "--executor", "slurm", "--no-prepare",
                 "--wait", env=_env(SBENCH_FAULT="error@stage=model_load"))
    assert res.returncode == 1, res.stdout + res.stderr
    table, summary = res.stdout.split("2 attempt(s) ended:")
    assert "campaign slurmfail: 2 attempt(s) submitted with the slurm executor" in table
    assert summary.startswith(" 0 ok, 0 invalid, 2 failed"), summary
    assert sum("SBENCH_FAULT error injected" in line for line in summary.splitlines()) == 2, summary


@pytest.mark.slurm
@pytest.mark.train
def test_slurm_two_concurrent_submits_of_one_sweep_submit_each_attempt_once(lab, tiny_model, small_data_dir,
                                                                           slurm_cluster) -> None:
    sweep = slurm_sweep(lab, "slurmtwice", tiny_model, small_data_dir, {"max_steps": [2, 3]})
    args = ("submit", sweep, "-i", slurm_cluster["inventory"], "--executor", "slurm", "--no-prepare", "--hold",
            "--json")
    procs = [start(lab, f"submit{i}", *args) for i in range(2)]
    try:
        codes = [p.wait(timeout=600) for p in procs]
        submitted = []
        for i, code in enumerate(codes):
            out, err = output(lab, f"submit{i}")
            assert "Traceback" not in err, err
            if code == 0:
                submitted.append(json.loads(out)["submitted"])
            else:
                assert code == 1 and "campaign 'slurmtwice' is in use by another sbench submit (PID" in err, err
        assert sum(submitted) == 2, submitted
        lines = attempt_lines(lab, "slurmtwice")
        assert len(lines) == 2
        assert len({ev["job_dir"] for ev in lines}) == 2 and len({ev["job_id"] for ev in lines}) == 2
        for ev in lines:  # the job dir's own record names the one job that runs it
            assert json.loads((Path(ev["job_dir"]) / "submitted.json").read_text())["job_id"] == ev["job_id"]
    finally:
        res = sbench(lab, "cancel", "--campaign", "slurmtwice")  # held: nothing of it needs to run
    assert res.returncode == 0 and "cancelled 2 attempt(s)" in res.stdout, res.stdout + res.stderr
