"""The node runner and its parts, driven with a stand-in training command (fast, no torch).

The real trainer runs in tests/test_runner_train.py (marked ``train``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.contract.paths import JobPaths
from harness.runner import classify, envcapture
from harness.runner.faults import FaultSpecError, parse_faults
from harness.runner.node import NodeRunner, cmd_port, trial_port, with_port
from harness.runner.stages import StageLog, Terminated, open_stages, read_stages

from .kit import ROOT

# A stand-in for harness.runner.train: writes what a rank writes, then behaves as asked.
FAKE_TRAINER = textwrap.dedent('''
    import json, os, signal, subprocess, sys, time
    sys.path.insert(0, os.environ["SBENCH_REPO"])
    from harness.contract.paths import JobPaths
    from harness.runner.stages import StageLog
    mode, job = sys.argv[1], JobPaths(sys.argv[2])
    rank = int(os.environ.get("RANK", "0"))
    host = os.environ["SBENCH_HOST"]
    trial = os.environ.get("SBENCH_TRIAL")
    log = StageLog(job.stages(host), host, rank=rank, trial=int(trial) if trial else None)
    def done(status, **kw):
        doc = {"rank": rank, "status": status, "global_step": 3, "trial": trial,
               "env_port": os.environ.get("SBENCH_MAIN_PORT"), **kw}
        job.rank_result(rank).write_text(json.dumps(doc))
    def on_term(sig, frame):
        log.end("train", "killed", "terminated by signal %d" % sig)
        done("killed")
        sys.exit(128 + sig)
    log.start("train")
    if mode == "ok":
        time.sleep(0.3)
        log.end("train", info={"global_step": 3})
        done("ok")
        job.log_history.write_text(json.dumps([{"loss": 1.0, "step": 1}]))
    elif mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "oom":
        job.error(rank).write_text(json.dumps({"rank": rank, "host": host, "kind": "invalid",
            "error_type": "torch.OutOfMemoryError", "message": "CUDA out of memory", "traceback": "",
            "stage": "train", "trial": trial, "t_wall": time.time()}))
        sys.exit(1)
    elif mode == "trials":
        if trial == "1":
            os.execv(sys.executable, [sys.executable, __file__, "oom", sys.argv[2]])
        if trial == "3":
            sys.exit(7)
        log.end("train"); done("ok")
    elif mode == "term":
        signal.signal(signal.SIGTERM, on_term)
        open(sys.argv[3], "w").write("ready")
        time.sleep(120)
    elif mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(sys.argv[3], "w").write("ready")
        time.sleep(120)
    elif mode == "orphan":
        # a "rank" in a session of its own (as torch elastic starts them), left behind by its launcher
        code = "import time\\ntime.sleep(120)\\n"
        child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        open(sys.argv[3], "w").write(str(child.pid))
        time.sleep(2.5)
        log.end("train"); done("ok")
    elif mode == "busy-child":
        code = "import time\\nt=time.time()\\nwhile time.time()-t<1.5: pass\\n"
        subprocess.run([sys.executable, "-c", code])
        log.end("train"); done("ok")
''')


@pytest.fixture
def job(tmp_path: Path):
    """A job directory with a minimal spec.json and an external dataset file; returns a runner factory."""
    jd = tmp_path / "job"
    jd.mkdir()
    data = tmp_path / "news-chars-512-entries-4096.jsonl"
    data.write_text('{"output": "x\\n### Response: y"}\n')  # no sidecar: ensure_dataset leaves it alone
    fake = tmp_path / "fake_trainer.py"
    fake.write_text(FAKE_TRAINER)

    def make(mode: str, *extra: str, trials: int = 1, ppn: int = 1, grace: float = 30.0,
             interval: float = 0.1) -> tuple[JobPaths, list[str]]:
        spec = {"jobspec": {"trials": trials, "processes_per_node": ppn, "cpu_partition": True,
                            "dataset_id": "news-chars-512-entries-4096", "dataset_path": str(data),
                            "model_source": "/nonexistent",
                            "runner": {"sample_interval_s": interval, "stop_grace_s": grace}}}
        (jd / "spec.json").write_text(json.dumps(spec))
        return JobPaths(jd), [sys.executable, str(fake), mode, str(jd), *extra]

    return make


def run_node(paths: JobPaths, cmd: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    e = {**os.environ, "SBENCH_HOST": "node7", "SBENCH_REPO": str(ROOT), "SBENCH_MACHINE_RANK": "0",
         "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness.runner", "node", "--job-dir", str(paths.root),
                           "--host", "node7", "--", *cmd], env=e, capture_output=True, text=True, timeout=120, **kw)


def result(paths: JobPaths) -> dict:
    return json.loads(paths.result("node7").read_text())


# -- node runner ---------------------------------------------------------------------------

def test_ok_run_writes_every_file_in_stage_order(job):
    paths, cmd = job("ok")
    proc = run_node(paths, cmd)
    assert proc.returncode == 0, proc.stderr
    res = result(paths)
    assert res["outcome"] == "ok" and res["exit_code"] == 0 and res["signal"] is None
    assert [r["rank"] for r in res["ranks"]] == [0] and res["training"]["global_step"] == 3
    assert res["log_history"] == [{"loss": 1.0, "step": 1}]
    events = read_stages(paths.stages("node7"))
    seq = [(e["event"], e["stage"], e["rank"]) for e in events]
    assert seq == [("start", "setup", None), ("end", "setup", None), ("start", "dataset", None),
                   ("end", "dataset", None), ("start", "train", 0), ("end", "train", 0),
                   ("start", "teardown", None), ("end", "teardown", None)]
    assert [e["t_wall"] for e in events] == sorted(e["t_wall"] for e in events)
    assert all(e["host"] == "node7" and e["restart"] == 0 for e in events)
    env = json.loads(paths.environment("node7").read_text())
    assert env["host"] == "node7" and env["machine_rank"] == 0
    assert env["packages"]["torch"] and env["sbench_version"]
    assert "==> sbench" in paths.train_log("node7").read_text()
    # The sampler followed the fake trainer: process rows inside the run window.
    rows = paths.samples("node7").read_text().splitlines()
    assert rows[0].startswith("t_wall,t_mono,kind,device,gpu_util")
    assert res["samples"] == len(rows) - 1 > 0
    t = [float(r.split(",")[0]) for r in rows[1:]]
    assert res["started_wall"] <= min(t) and max(t) <= res["ended_wall"]


def test_the_setup_stage_records_the_runners_start(job):
    """The node runner's start is its process's start, which launch.sh execs into: a shell that waits 2 s before
    the exec (as launch.sh's setup lines would) moves the recorded start 2 s before the runner's own first
    reading of the clock, and never before the process was spawned."""
    paths, cmd = job("ok")
    e = {**os.environ, "SBENCH_HOST": "node7", "SBENCH_REPO": str(ROOT), "SBENCH_MACHINE_RANK": "0",
         "PYTHONPATH": str(ROOT)}
    runner = [sys.executable, "-m", "harness.runner", "node", "--job-dir", str(paths.root), "--host", "node7", "--",
              *cmd]
    spawned = time.time()
    proc = subprocess.run(["bash", "-c", 'sleep 2; exec "$@"', "launch", *runner], env=e, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (setup,) = [ev for ev in read_stages(paths.stages("node7")) if ev["stage"] == "setup" and ev["event"] == "end"]
    start = setup["info"]["runner_start_wall"]
    assert spawned - 0.05 <= start <= result(paths)["started_wall"] - 2.0  # a clock tick is 10 ms


def test_restart_count_is_recorded(job):
    paths, cmd = job("ok")
    assert run_node(paths, cmd, env={"SLURM_RESTART_COUNT": "2"}).returncode == 0
    assert {e["restart"] for e in read_stages(paths.stages("node7"))} == {2}


def test_sigkill_of_the_trainer_is_recognisable_from_disk(job):
    paths, cmd = job("sigkill")
    proc = run_node(paths, cmd)
    assert proc.returncode == 1
    res = result(paths)
    assert res["outcome"] == "failed" and res["signal"] == signal.SIGKILL and res["exit_code"] is None
    assert "killed by signal 9 (SIGKILL)" in res["reason"]
    opened = open_stages(read_stages(paths.stages("node7")))
    assert [(e["stage"], e["rank"]) for e in opened] == [("train", 0)]
    assert res["open_stages"][0]["stage"] == "train"


def test_invalid_error_file_gives_invalid_and_exit_2(job):
    paths, cmd = job("oom")
    proc = run_node(paths, cmd)
    assert proc.returncode == 2
    res = result(paths)
    assert res["outcome"] == "invalid" and res["exit_code"] == 1
    assert "torch.OutOfMemoryError" in res["reason"]


def test_missing_rank_file_is_a_failure(job):
    paths, cmd = job("ok", ppn=2)  # two ranks expected, the stand-in is one process
    proc = run_node(paths, cmd)
    assert proc.returncode == 1
    assert "rank(s) [1] wrote no rank.<rank>.json" in result(paths)["reason"]


def test_stability_trials_each_recorded_with_own_port(job):
    paths, cmd = job("trials", trials=5)
    cmd = cmd + ["--main_process_port", "25000"]
    proc = run_node(paths, cmd)
    assert proc.returncode == 0, proc.stderr
    res = result(paths)
    assert [t["outcome"] for t in res["trials"]] == ["ok", "invalid", "ok", "failed", "ok"]
    assert res["trials"][3]["exit_code"] == 7 and "exited with code 7" in res["trials"][3]["reason"]
    assert res["trial_counts"] == {"ok": 3, "invalid": 1, "failed": 1}
    assert res["outcome"] == "ok" and "3 ok, 1 invalid" in res["reason"]
    ports = [t["port"] for t in res["trials"]]
    assert len(set(ports)) == 5 and ports[0] == 25000
    trial_events = [e for e in read_stages(paths.stages("node7")) if e["stage"] == "trial"]
    assert [(e["event"], e["trial"]) for e in trial_events] == [(ev, i) for i in range(5) for ev in ("start", "end")]
    # The last trial's rank file saw its own trial number and port.
    assert res["ranks"][0]["trial"] == "4" and res["ranks"][0]["env_port"] == str(ports[4])


def test_sigterm_is_forwarded_and_result_written(job, tmp_path):
    ready = tmp_path / "ready"
    paths, cmd = job("term", str(ready))
    p = subprocess.Popen([sys.executable, "-m", "harness.runner", "node", "--job-dir", str(paths.root), "--host",
                          "node7", "--", *cmd],
                         env={**os.environ, "SBENCH_HOST": "node7", "SBENCH_REPO": str(ROOT), "PYTHONPATH": str(ROOT)})
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists()
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert time.time() - t0 < 10  # the trainer honoured SIGTERM: no grace period needed
    res = result(paths)
    assert res["outcome"] == "failed" and res["terminated_by"] == signal.SIGTERM
    assert res["ranks"][0]["status"] == "killed" and res["exit_code"] == 128 + signal.SIGTERM
    train_end = [e for e in read_stages(paths.stages("node7")) if e["stage"] == "train" and e["event"] == "end"]
    assert train_end[0]["status"] == "killed"


def test_trainer_ignoring_sigterm_is_killed_after_grace(job, tmp_path):
    ready = tmp_path / "ready"
    paths, cmd = job("ignore-term", str(ready), grace=1.0)
    p = subprocess.Popen([sys.executable, "-m", "harness.runner", "node", "--job-dir", str(paths.root), "--host",
                          "node7", "--", *cmd],
                         env={**os.environ, "SBENCH_HOST": "node7", "SBENCH_REPO": str(ROOT), "PYTHONPATH": str(ROOT)})
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert 0.9 < time.time() - t0 < 10
    res = result(paths)
    assert res["signal"] == signal.SIGKILL and res["outcome"] == "failed"
    assert "signal 15" in res["reason"]


def test_sampler_counts_the_trainers_children(job):
    paths, cmd = job("busy-child", interval=0.2)
    assert run_node(paths, cmd).returncode == 0
    procs = [r.split(",") for r in paths.samples("node7").read_text().splitlines()[1:] if ",proc," in r]
    assert max(int(r[12]) for r in procs) >= 2  # trainer + its child
    assert max(float(r[9]) for r in procs) > 40  # the child's busy loop is counted


def test_orphaned_ranks_do_not_outlive_the_training_command(job, tmp_path):
    import psutil

    pid_file = tmp_path / "orphan.pid"
    paths, cmd = job("orphan", str(pid_file))
    assert run_node(paths, cmd).returncode == 0
    pid = int(pid_file.read_text())
    deadline = time.time() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_secrets_never_reach_the_job_dir(job):
    paths, cmd = job("ok")
    secret = "hf_s3cr3t_value_123"
    env = {"HF_TOKEN": secret, "SBENCH_API_KEY": secret, "NCCL_PASSWORD": secret, "SLURM_SECRET_X": secret,
           "HF_AUTH": secret, "SBENCH_API_PASS": secret, "NCCL_DEBUG": "INFO",
           "NCCL_COMMENT": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"}
    assert run_node(paths, cmd, env=env).returncode == 0
    for f in paths.root.rglob("*"):
        if f.is_file():
            text = f.read_text(errors="replace")
            assert secret not in text and "hf_AbCdEf" not in text, f
    captured = json.loads(paths.environment("node7").read_text())["env"]
    # Not on the allow-list: never recorded. On it but named or shaped like a credential: redacted.
    assert not {"HF_TOKEN", "SBENCH_API_KEY", "HF_AUTH", "SBENCH_API_PASS"} & set(captured)
    assert captured["NCCL_PASSWORD"] == captured["SLURM_SECRET_X"] == captured["NCCL_COMMENT"] == "<redacted>"
    assert captured["NCCL_DEBUG"] == "INFO"


def test_bad_invocation(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness.runner", "node", "--job-dir", str(tmp_path), "--host",
                           "h", "--", "true"], capture_output=True, text=True, env={**os.environ,
                                                                                   "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3 and "spec.json" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "harness.runner", "bogus"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3 and "unknown runner command" in proc.stderr


def test_node_runner_reads_spec(job):
    paths, cmd = job("ok", trials=5, ppn=4)
    r = NodeRunner(paths.root, "node7", cmd)
    assert r.trials == 5 and r.expected_ranks == [0, 1, 2, 3]
    os.environ["SBENCH_MACHINE_RANK"] = "1"
    try:
        assert NodeRunner(paths.root, "node7", cmd).expected_ranks == [4, 5, 6, 7]
    finally:
        del os.environ["SBENCH_MACHINE_RANK"]


def test_ports_per_trial():
    cmd = ["x", "--main_process_port", "25000", "-m", "y"]
    assert cmd_port(cmd) == 25000
    assert with_port(cmd, 25007) == ["x", "--main_process_port", "25007", "-m", "y"]
    ports = [trial_port(31995, i) for i in range(5)]
    assert len(set(ports)) == 5 and all(20000 <= p < 32000 for p in ports)


# -- stages ----------------------------------------------------------------------------------

def test_stage_context_records_errors_and_kills(tmp_path):
    log = StageLog(tmp_path / "s.jsonl", "h", rank=3, trial=2)
    with log.stage("dataset") as info:
        info["entries"] = 5
    with pytest.raises(ValueError), log.stage("tokens"):
        raise ValueError("bad")
    with pytest.raises(Terminated), log.stage("train"):
        raise Terminated(15)
    ev = read_stages(tmp_path / "s.jsonl")
    ends = [(e["stage"], e["status"], e["error"]) for e in ev if e["event"] == "end"]
    assert ends == [("dataset", "ok", None), ("tokens", "error", "ValueError: bad"),
                    ("train", "killed", "terminated by signal 15")]
    assert ev[1]["info"] == {"entries": 5} and all(e["rank"] == 3 and e["trial"] == 2 for e in ev)
    assert log.last_failed == "train"


def test_torn_last_line_is_skipped_and_open_stage_found(tmp_path):
    p = tmp_path / "s.jsonl"
    log = StageLog(p, "h", rank=0)
    log.start("model_load")
    with open(p, "a") as f:
        f.write('{"event": "end", "sta')  # killed mid-write
    ev = read_stages(p)
    assert len(ev) == 1 and open_stages(ev)[0]["stage"] == "model_load"


def test_concurrent_appends_never_interleave(tmp_path):
    p = tmp_path / "s.jsonl"
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\nfrom harness.runner.stages import StageLog\n"
            f"l = StageLog({str(p)!r}, 'h', rank=int(sys.argv[1]))\n"
            "for i in range(300): l.start('train'); l.end('train', info={'pad': 'x' * 3000})\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)]) for r in range(3)]
    assert all(pr.wait(60) == 0 for pr in procs)
    lines = p.read_text().splitlines()
    assert len(lines) == 3 * 600 and all(json.loads(x)["host"] == "h" for x in lines)


# -- classification --------------------------------------------------------------------------

def test_exception_classification():
    import torch

    assert classify.classify_exception(torch.OutOfMemoryError("CUDA out of memory")) == "invalid"
    assert classify.classify_exception(torch.cuda.OutOfMemoryError("x")) == "invalid"
    illegal = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert classify.classify_exception(illegal) == "invalid"
    assert classify.classify_exception(RuntimeError("NCCL Error 3: internal error")) == "failed"
    assert classify.classify_exception(ValueError("an illegal memory access was encountered")) == "failed"
    try:
        try:
            raise torch.OutOfMemoryError("inner")
        except torch.OutOfMemoryError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as outer:
        assert classify.classify_exception(outer) == "invalid"
    rec = classify.error_record(ImportError("no bitsandbytes"), rank=1, host="h", stage="train", trial=None, t_wall=1.0)
    assert rec["kind"] == "failed" and rec["error_type"] == "ImportError" and rec["message"] == "no bitsandbytes"
    assert set(rec) == {"rank", "host", "kind", "error_type", "message", "traceback", "stage", "trial", "t_wall"}


ELASTIC_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
harness.runner.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_00:27:33
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 27508)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_00:27:31
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 27509)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 27509
"""


def test_elastic_summary_names_the_killed_rank_as_root_cause():
    codes = classify.elastic_failures(ELASTIC_SUMMARY)
    assert codes == {0: 1, 1: -9}
    gloo = {"rank": 0, "kind": "failed", "error_type": "RuntimeError", "message": "Connection reset by peer",
            "t_wall": 2.0}
    outcome, reason = classify.node_outcome(exit_code=1, signal=None, errors=[gloo], expected_ranks=[0, 1],
                                            rank_docs={}, rank_exit=codes)
    assert outcome == "failed" and reason.startswith("rank 1 killed by signal 9 (SIGKILL)")
    assert "then rank 0: RuntimeError" in reason
    oom = {**gloo, "rank": 1, "kind": "invalid", "error_type": "torch.OutOfMemoryError"}
    assert classify.node_outcome(exit_code=1, signal=None, errors=[gloo, oom], expected_ranks=[0, 1],
                                 rank_docs={}, rank_exit={})[0] == "invalid"
    assert classify.node_outcome(exit_code=1, signal=None, errors=[], expected_ranks=[0], rank_docs={},
                                 log_tail="torch.OutOfMemoryError: CUDA out of memory")[0] == "invalid"


# -- faults ----------------------------------------------------------------------------------

def test_fault_spec_parsing():
    f = parse_faults("oom@step=2,rank=1; sleep@step=1:30 ;error@stage=model_load,trial=3")
    assert [(x.kind, x.step, x.stage, x.rank, x.trial, x.arg) for x in f] == [
        ("oom", 2, None, 1, None, None), ("sleep", 1, None, None, None, "30"),
        ("error", None, "model_load", None, 3, None)]
    assert f[0].applies(rank=1, trial=None, step=2) and not f[0].applies(rank=0, trial=None, step=2)
    assert not f[0].applies(rank=1, trial=None, step=3)
    assert f[2].applies(rank=0, trial=3, stage="model_load") and not f[2].applies(rank=0, trial=2, stage="model_load")
    assert parse_faults(None) == [] and parse_faults("") == []
    for bad in ("oom", "boom@step=1", "oom@step=x", "oom@when=1", "oom@rank=1", "oom@step=1,stage=train",
                "sleep@step=*,stage=train", "sleep@step=*,step=2:1"):
        with pytest.raises(FaultSpecError):
            parse_faults(bad)


def test_a_fault_on_every_step_applies_at_each_step_of_its_job_only():
    (f,) = parse_faults("sleep@step=*,job=p-7.:0.3")
    assert f.every_step and f.arg == "0.3"
    assert all(f.applies(rank=0, trial=None, step=s, job="p-7.r0.a1") for s in (1, 2, 50))
    assert not f.applies(rank=0, trial=None, step=1, job="p-8.r0.a1")
    assert not f.applies(rank=0, trial=None, stage="train", job="p-7.r0.a1")


def test_fault_fire_raises_the_classified_errors():
    import torch

    (oom,) = parse_faults("oom@step=1")
    with pytest.raises(torch.OutOfMemoryError) as e:
        oom.fire("here")
    assert classify.classify_exception(e.value) == "invalid"
    (ill,) = parse_faults("illegal@step=1")
    with pytest.raises(RuntimeError) as e:
        ill.fire("here")
    assert classify.classify_exception(e.value) == "invalid"
    (err,) = parse_faults("error@step=1")
    with pytest.raises(RuntimeError) as e:
        err.fire("here")
    assert classify.classify_exception(e.value) == "failed"


# -- environment capture ---------------------------------------------------------------------

def test_relevant_env_records_an_allow_list_and_redacts():
    env = {"HF_TOKEN": "t", "HF_HOME": "/h", "SBENCH_API_KEY": "k", "NCCL_IB_HCA": "=mlx5_0",
           "TORCH_SECRET_SAUCE": "s", "SLURM_JOB_ID": "12", "GLOO_SOCKET_IFNAME": "eth0", "PATH": "/bin",
           "AWS_SECRET_ACCESS_KEY": "aws", "ACCELERATE_PASSWORD_X": "p", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "GPU-5f0e2a57-7d2c-4bb4-9d0b-0f1c7a9e1b11,1", "HF_AUTH": "x",
           "SBENCH_API_PASS": "y", "SBENCH_CAMPAIGN": "c1", "NCCL_DEBUG_FILE": "hf_abcdefghijklmnopqrstuvwxyz012",
           "SLURM_JOB_COMMENT": "token=AbCdEf0123456789AbCdEf0123456789xyz",
           "MASTER_ADDR": "https://user:hunter2@example.org/x", "TORCH_HOME": "/shared/torch/cache"}
    out = envcapture.relevant_env(env)
    assert out == {
        "ACCELERATE_PASSWORD_X": "<redacted>", "CUDA_VISIBLE_DEVICES": "GPU-5f0e2a57-7d2c-4bb4-9d0b-0f1c7a9e1b11,1",
        "GLOO_SOCKET_IFNAME": "eth0", "HF_HOME": "/h", "NCCL_IB_HCA": "=mlx5_0", "OMP_NUM_THREADS": "1",
        "SLURM_JOB_ID": "12", "TORCH_SECRET_SAUCE": "<redacted>", "SBENCH_CAMPAIGN": "c1",
        "NCCL_DEBUG_FILE": "<redacted>", "SLURM_JOB_COMMENT": "<redacted>",
        "MASTER_ADDR": "https://user:<redacted>@example.org/x",  # only a URL's password goes
        "TORCH_HOME": "/shared/torch/cache"}


def test_git_commit_read_from_the_repository_files(tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "repo"
    (repo / ".git" / "refs" / "heads").mkdir(parents=True)
    (repo / "pkg" / "sub").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / ".git" / "refs" / "heads" / "main").write_text(sha + "\n")
    assert envcapture.git_commit(repo / "pkg" / "sub") == sha
    (repo / ".git" / "refs" / "heads" / "main").unlink()
    (repo / ".git" / "packed-refs").write_text(f"# pack-refs\n{sha[::-1]} refs/heads/main\n")
    assert envcapture.git_commit(repo / "pkg") == sha[::-1]
    (repo / ".git" / "HEAD").write_text(sha + "\n")  # detached
    assert envcapture.git_commit(repo) == sha
    assert envcapture.git_commit(tmp_path / "elsewhere") is None or not (tmp_path / ".git").exists()
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / ".git").mkdir()
    (lone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # a fresh repo without commits
    assert envcapture.git_commit(lone) is None


def test_capture_lists_packages_and_gpus(monkeypatch):
    import importlib.metadata

    monkeypatch.setenv("SBENCH_SAMPLER_BACKEND", "fake")
    monkeypatch.setenv("SBENCH_FAKE_GPUS", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    doc = envcapture.capture("nodeX", 1)
    assert doc["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert set(doc["packages"]) == set(envcapture.PACKAGES)
    assert [g["uuid"] for g in doc["gpus"]] == ["GPU-fa4e0000-0000-0000-0000-000000000001",
                                                "GPU-fa4e0000-0000-0000-0000-000000000002"]
    assert [g["index"] for g in doc["gpus"]] == [0, 1] and doc["gpus"][0]["pci_bus_id"] == "00000000:11:00.0"
    assert doc["host"] == "nodeX" and doc["machine_rank"] == 1 and doc["cpu_count"] == os.cpu_count()
    assert doc["env"]["CUDA_VISIBLE_DEVICES"] == "1,2"
