"""The runner's small entry points, in-process and in seconds: the runner's command line, the interface that
carries a host's address, the idle workload's files, and the flags the fms-hf-tuning trainer leaves to sbench.
The slow tests run each of them for real on the nodes; these keep ``make test-fast`` on every module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.build.trainargs import OWN_FLAGS
from harness.contract.paths import JobPaths
from harness.runner import __main__ as runner_main
from harness.runner import fms, idle, netif
from harness.runner.stages import read_stages


def test_the_runner_command_line_names_its_one_command(capsys) -> None:
    assert runner_main.main(["--help"]) == 0 and "node --job-dir DIR" in capsys.readouterr().out
    assert runner_main.main([]) == 3
    assert runner_main.main(["train"]) == 3 and "unknown runner command 'train'" in capsys.readouterr().err


def test_the_interface_that_holds_an_address(capsys) -> None:
    assert netif.addresses_of("127.0.0.1") == {"127.0.0.1"}
    assert "127.0.0.1" in netif.addresses_of("localhost")
    assert netif.addresses_of("no-such-host.invalid") == set()
    assert netif.interface_for("127.0.0.1") == "lo"
    assert netif.interface_for("192.0.2.77") is None  # TEST-NET-1: on no interface here
    assert netif.main(["127.0.0.1"]) == 0 and capsys.readouterr().out.strip() == "lo"
    assert netif.main(["192.0.2.77"]) == 1 and capsys.readouterr().out == ""
    assert netif.main([]) == 2


def test_the_idle_workload_writes_a_train_stage_and_a_rank_result(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SBENCH_HOST", "h1")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert idle.main(["--job-dir", str(tmp_path), "--seconds", "0.05"]) == 0
    paths = JobPaths(tmp_path)
    doc = json.loads(paths.rank_result(1).read_text())
    assert (doc["rank"], doc["host"], doc["world_size"], doc["status"], doc["workload"]) == (1, "h1", 2, "ok", "idle")
    assert doc["metrics"]["train_runtime"] == pytest.approx(doc["train_end_wall"] - doc["train_start_wall"])
    assert doc["metrics"]["train_runtime"] >= 0.05
    stages = [e for e in read_stages(paths.stages(doc["host"])) if e["stage"] == "train"]
    assert stages and stages[-1]["rank"] == 1


def test_fms_hf_tuning_gets_the_command_line_without_sbenchs_own_flags() -> None:
    own = sorted(OWN_FLAGS)[0]
    argv = ["--model_name_or_path", "m", own, "value", "--per_device_train_batch_size", "4"]
    assert fms.fms_argv(argv) == ["--model_name_or_path", "m", "--per_device_train_batch_size", "4"]
    assert fms.fms_argv([]) == []
