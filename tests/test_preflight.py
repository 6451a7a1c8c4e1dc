"""sbench preflight without a cluster: each device's figures ranked against the partition's median, a device
slowed with SBENCH_FAULT flagged, the threshold from the option or the environment, bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.contract.errors import InputError
from harness.runner.preflight import MATMUL, MEMCPY, preflight_node
from harness.sbatch.preflight import default_threshold, rank_devices


def test_a_slowed_node_is_flagged_against_the_median(monkeypatch) -> None:
    docs = {"a": preflight_node("a", gpu=False, budget_s=0.2)}
    monkeypatch.setenv("SBENCH_FAULT", "slow@stage=preflight,host=b:10")
    docs["b"] = preflight_node("b", gpu=False, budget_s=0.2)
    docs["c"] = preflight_node("c", gpu=False, budget_s=0.2)  # the fault names b only
    assert docs["b"]["slow_fault"] == 10.0 and "slow_fault" not in docs["c"]
    rows = rank_devices(docs, "p1", "c", "cpu", 0.9)
    mm = {r["host"]: r for r in rows if r["figure"] == MATMUL}
    assert {r["figure"] for r in rows} == {MATMUL, MEMCPY} and len(rows) == 6
    mid = sorted(r["value"] for r in mm.values())[1]
    assert all(r["partition_median"] == mid and r["ratio"] == pytest.approx(r["value"] / mid) for r in mm.values())
    assert mm["b"]["flagged"] and mm["b"]["ratio"] < 0.5
    cp = {r["host"]: r for r in rows if r["figure"] == MEMCPY}
    assert cp["b"]["flagged"] and cp["b"]["value"] < min(cp["a"]["value"], cp["c"]["value"])  # copies too
    # b is the lowest, so the median is a clean node's
    assert mm["b"]["value"] < min(mm["a"]["value"], mm["c"]["value"])
    for r in rows:
        assert r["unit"] == ("TFLOP/s" if r["figure"] == MATMUL else "GB/s") and len(r["reps"]) == 5
        assert r["dtype"] == "fp32" and r["device"] == "cpu"


def test_the_threshold_comes_from_the_environment_else_the_default(monkeypatch) -> None:
    monkeypatch.delenv("SBENCH_PREFLIGHT_THRESHOLD", raising=False)
    assert default_threshold() == 0.9
    monkeypatch.setenv("SBENCH_PREFLIGHT_THRESHOLD", "0.75")
    assert default_threshold() == 0.75
    monkeypatch.setenv("SBENCH_PREFLIGHT_THRESHOLD", "2")
    with pytest.raises(InputError, match=r"SBENCH_PREFLIGHT_THRESHOLD must be a share .* got '2'"):
        default_threshold()


def test_preflight_on_this_machine_records_its_figures(cli, tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    res = cli("preflight", "--seconds", "0.2", "--db", db, "--workdir", tmp_path / "runs", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert {r["figure"] for r in doc["rows"]} == {MATMUL, MEMCPY} and doc["slow_hosts"] == []
    assert all(r["ratio"] == 1.0 for r in doc["rows"])  # one device: it is its partition's median


@pytest.mark.parametrize(("args", "says"), [
    (["preflight", "--threshold", "1.5"], "Invalid value for '--threshold'"),
    (["preflight", "--seconds", "0"], "Invalid value for '--seconds'"),
    (["submit", "nosuch.yaml", "--exclude-slow"], "does not exist"),
])
def test_bad_options_are_usage_errors(cli, args, says) -> None:
    res = cli(*args)
    assert res.exit_code == 2 and says in res.output


def test_exclude_slow_needs_preflight(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text("campaign: c\n")
    res = cli("submit", sweep, "--exclude-slow")
    assert res.exit_code == 2 and "--exclude-slow leaves out the hosts that --preflight finds slow" in res.output
