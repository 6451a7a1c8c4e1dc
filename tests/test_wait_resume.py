"""``submit --wait`` and ``retry --wait`` resume: run again after Ctrl-C, they wait for every attempt of the
campaign still queued or running (not only those they submitted), and exit 0 only once every run of the
campaign ended ok or invalid. The jobs are the harness's idle workload (no training), so this costs seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.campaign.wait import campaign_outcome
from harness.collect.ingest import collect
from harness.contract.paths import JobPaths
from harness.slurm import localjob

from .kit import ROOT, command, write_yaml
from .kit.jobdirs import append_manifest, make_run, manifest_events, result_doc, write_json


def _cmd(root: Path, *args: object) -> list[str]:
    return command(*args, "--workdir", root / "runs", "--db", root / "r.duckdb")


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "SBENCH_FAULT"}, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow(30)
def test_submit_wait_after_ctrl_c_waits_for_the_attempts_in_flight(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    sweep = write_yaml(tmp_path / "s.yaml", {
        "campaign": "resume", "experiment": "finetune_lora_benchmark-v1.0.0",
        "entity": {"model_name": "tiny", "model_max_length": 64, "batch_size": 2, "number_gpus": 1},
        "grid": {"max_steps": [2, 3]}, "model_map": {"tiny": str(tmp_path / "model")},
        # 10 s a run: the second submit, started after the first one stopped, must still find an attempt in flight
        # when this loaded machine takes seconds to start it (4 s was not enough at load 8).
        "runner": {"workload": "idle", "idle_seconds": 10, "sample_interval_s": 0.2}})
    err = (tmp_path / "first.err").open("w")
    first = subprocess.Popen(_cmd(tmp_path, "submit", sweep, "--executor", "local", "--wait"), cwd=tmp_path,
                             env=_env(), stdout=subprocess.DEVNULL, stderr=err, text=True)
    deadline = time.monotonic() + 120
    while "waiting for 2 attempt(s)" not in (tmp_path / "first.err").read_text():
        assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "first.err").read_text()
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=60) == 130
    dirs = [json.loads(line)["job_dir"] for line in (tmp_path / "runs" / "resume" / "manifest.jsonl").read_text()
            .splitlines() if json.loads(line)["type"] == "attempt"]
    assert any(localjob.job_state(d) in ("PENDING", "RUNNING") for d in dirs)

    again = subprocess.run(_cmd(tmp_path, "submit", sweep, "--executor", "local", "--wait", "--json"), cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    rep = json.loads(again.stdout)
    assert rep["submitted"] == 0
    # every attempt it found in flight was waited for: all over, collected, ok
    assert all(localjob.job_state(d) == "COMPLETED" for d in dirs)
    assert rep["summary"]["counts"]["ok"] >= 1 and rep["summary"]["counts"]["failed"] == 0
    assert rep["summary"]["campaign"]["done"] and rep["summary"]["campaign"]["ended"]["ok"] == 2
    # the skip reason of an attempt still in flight names its job id, never "job None"
    skipped = [p["reason"] for p in rep["points"] if p["action"] == "skip"]
    assert not any("job None" in r for r in skipped)
    # once every run ended: retry --wait has nothing to wait for and says the campaign is done
    done = subprocess.run(_cmd(tmp_path, "retry", "resume", "--executor", "local", "--wait"), cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "campaign resume: 2 run(s) by their last attempt: 2 ok, 0 invalid, 0 failed, 0 not ended" in done.stdout


def test_a_campaign_is_done_only_when_every_run_ended_ok_or_invalid(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    ok, bad = (make_run(wd, "c", i, hosts=("node1",), gpus_per_host=1, ticks=20, executor="local", job_id=f"{i}")
               for i in (0, 1))
    append_manifest(wd, "c", [manifest_events("c", "finetune_full_benchmark-v1.0.0", "local"), *ok["events"],
                              *bad["events"]])
    paths = JobPaths(bad["job_dir"])
    write_json(paths.result("node1"), result_doc("node1", 0, bad["t_train0"] - 10, bad["t_train1"], outcome="failed",
                                                 reason="RuntimeError: boom", exit_code=1))
    collect(db, wd, "c", slurm=None)
    out = campaign_outcome("c", db)
    assert not out.done and out.ended == {"ok": 1, "invalid": 0} and len(out.failed) == 1 and not out.open
    assert "1 failed" in out.text() and "sbench retry c" in out.text()
