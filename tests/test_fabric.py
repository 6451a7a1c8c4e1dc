"""sbench fabric and submit --preflight: real torch.distributed collectives through the benchmark's own
launch path, bandwidths recomputed independently, rows in the fabric table, the report's plot."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.cluster.fabric import FabricResult
from harness.cluster.preflight import check_fabric
from harness.contract.errors import SubmitError
from harness.spec.inventory import load_inventory
from harness.spec.plan import plan_sweep
from harness.spec.sweep import parse_sweep

from .kit import TEST_INVENTORY, sql_rows


def check_rows(rows: list[dict], world: int, sizes: list[int]) -> None:
    """algbw and busbw recomputed from bytes and time, as nccl-tests defines them."""
    assert sorted({(r["op"], r["bytes"]) for r in rows}) == sorted(
        {(op, s // 4 // world * world * 4) for op in ("all_reduce", "all_gather") for s in sizes})
    for r in rows:
        algbw = r["bytes"] / (r["time_us"] * 1e-6) / 1e9
        factor = 2 * (world - 1) / world if r["op"] == "all_reduce" else (world - 1) / world
        assert r["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
        assert r["busbw_gbps"] == pytest.approx(algbw * factor, rel=1e-9)
        assert r["time_us"] > 0 and r["iters"] == 5


@pytest.mark.train
@pytest.mark.slow(10)
def test_fabric_on_one_node_with_the_local_executor(cli, tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    res = cli("fabric", "--nodes", "1", "--executor", "local", "--sizes", "4K,256K", "--iters", "5",
              "--workdir", tmp_path / "runs", "--db", db, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ok"] and out["backend"] == "gloo" and out["world_size"] >= 1
    rows = sql_rows(db, "SELECT * FROM fabric ORDER BY op, bytes")
    if out["world_size"] > 1:
        check_rows(rows, out["world_size"], [4096, 262144])
    # the fabric job is sbench's own: collect does not turn it into a run of a campaign
    assert cli("collect", "--workdir", tmp_path / "runs", "--db", db).exit_code == 0
    assert sql_rows(db, "SELECT count(*) AS n FROM runs") == [{"n": 0}]


@pytest.mark.slurm
@pytest.mark.slow(20)
def test_fabric_across_two_test_cluster_nodes_lands_in_the_db_and_the_report(cli, slurm_cluster,
                                                                             tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    res = cli("fabric", "-i", TEST_INVENTORY, "--partition", "cpu", "--nodes", "2", "--executor", "slurm",
              "--sizes", "1K,64K,1M", "--iters", "5", "--workdir", tmp_path / "runs", "--db", db, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    # gloo across the namespaced nodes, bound to each node's inventory address (no GLOO_SOCKET_IFNAME set)
    assert out["ok"] and out["backend"] == "gloo" and out["world_size"] == 4
    assert set(out["transports"]) == {"node1", "node2"}
    rows = sql_rows(db, "SELECT * FROM fabric WHERE fabric_id = ? ORDER BY op, bytes", [out["fabric_id"]])
    check_rows(rows, 4, [1024, 65536, 1048576])
    assert all(r["nodes"] == 2 and r["partition"] == "cpu" and r["ok"] for r in rows)
    env = json.loads(Path(out["job_dir"], "rank.0.json").read_text())
    assert env["world_size"] == 4
    # The report plots it (beside a campaign's runs; the fabric job itself is no run).
    assert cli("collect", "--workdir", tmp_path / "runs", "--db", db).exit_code == 0
    assert sql_rows(db, "SELECT count(*) AS n FROM runs") == [{"n": 0}]
    page_db = db
    from .kit.jobdirs import append_manifest, make_run

    wd = tmp_path / "runs2"
    run = make_run(wd, "r", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999989")
    append_manifest(wd, "r", run["events"])
    assert cli("collect", "--workdir", wd, "--db", page_db).exit_code == 0
    assert cli("report", "--db", page_db, "-o", tmp_path / "r.html").exit_code == 0
    page = (tmp_path / "r.html").read_text()
    fabric = page[page.index('id="fabric"'):page.index('id="latest"')]
    assert fabric.count('class="vl-spec"') == 2 and "cpu x2" in fabric


@pytest.mark.slurm
@pytest.mark.slow(15)
def test_fabric_without_a_partition_names_the_option_that_works(cli, slurm_cluster, tmp_path: Path) -> None:
    """Two partitions and no sweep: the message names --partition (not a sweep's key), and following its
    example runs the fabric job."""
    db, runs = tmp_path / "r.duckdb", tmp_path / "runs"
    common = ["--nodes", "1", "--executor", "slurm", "--sizes", "1K", "--iters", "1", "--workdir", runs, "--db", db]
    res = cli("fabric", "-i", TEST_INVENTORY, *common)
    assert res.exit_code == 2 and "in the sweep" not in res.output, res.output
    (example,) = re.findall(r"\(e\.g\. (--partition \S+)\)", res.output)
    res = cli("fabric", "-i", TEST_INVENTORY, *example.split(), *common, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ok"] and out["partition"] == example.split()[1]
    assert sql_rows(db, "SELECT DISTINCT partition FROM fabric") == [{"partition": out["partition"]}]


@pytest.mark.slurm
@pytest.mark.slow(35)
def test_submit_preflight_runs_fabric_first_then_submits(cli, slurm_cluster, tiny_model, tmp_path: Path,
                                                         monkeypatch) -> None:
    # Both test nodes share this machine's loaded cores, where one node's matmul can measure a fifth under the
    # other's without a fault; the slowness check has its own tests (test_cluster_health: a 4x slowed node).
    monkeypatch.setenv("SBENCH_PREFLIGHT_THRESHOLD", "0.2")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "pre", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny", "model_max_length": 64, "batch_size": 4, "number_gpus": 4,
                   "number_nodes": 2, "max_steps": 2},
        "model_map": {"tiny": str(tiny_model)}, "data_dir": str(tmp_path / "data")}))
    res = cli("submit", sweep, "-i", TEST_INVENTORY, "--executor", "slurm", "--preflight", "--hold", "--json",
              "--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    try:
        assert [(p["partition"], p["nodes"], p["ok"]) for p in rep["preflight"]] == [("cpu", 2, True)]
        assert rep["submitted"] == 1
        assert sql_rows(tmp_path / "r.duckdb", "SELECT count(DISTINCT fabric_id) AS n FROM fabric") == [{"n": 1}]
    finally:
        ids = {p["job_id"] for p in rep["points"] if p["job_id"]}
        subprocess.run(["scancel", *ids], check=False)


def _fake(ok: bool, transports: dict):
    calls = []

    def fabric(inv, part, n, workdir, runner, roce=None):
        calls.append((part, n, roce))
        return FabricResult(f"f-{part}-{n}", part, n, "/jd", ok, None if ok else "rank 1: connect refused", "nccl",
                            n * 8, transports, [])

    return fabric, calls


def test_preflight_refuses_roce_points_over_socket_and_failed_fabric(tmp_path: Path) -> None:
    inv = load_inventory(TEST_INVENTORY)
    sweep = parse_sweep({"campaign": "x", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "gpu",
                         "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 32},
                         "grid": {"number_gpus": [8, 16], "number_nodes": [1, 2], "enable_roce": [True, False]}},
                        "x.yaml", tmp_path)
    points = plan_sweep(sweep, inv)
    fabric, calls = _fake(True, {"node1": "roce", "node2": "roce"})
    out = check_fabric(inv, points, tmp_path, tmp_path / "r.duckdb", None, fabric=fabric)
    assert calls == [("gpu", 2, True)] and out[0]["ok"]  # one fabric per partition and node count, RoCE on
    fabric, _ = _fake(True, {"node1": "roce", "node2": "socket"})
    with pytest.raises(SubmitError, match="would run over Socket .*node2"):
        check_fabric(inv, points, tmp_path, tmp_path / "r.duckdb", None, fabric=fabric)
    fabric, _ = _fake(False, {})
    with pytest.raises(SubmitError, match="failed: rank 1: connect refused; nothing was submitted"):
        check_fabric(inv, points, tmp_path, tmp_path / "r.duckdb", None, fabric=fabric)
    no_roce = [p for p in points if not p.entity.get("enable_roce")]
    fabric, _ = _fake(True, {"node1": "socket", "node2": "socket"})
    assert check_fabric(inv, no_roce, tmp_path, tmp_path / "r.duckdb", None, fabric=fabric)[0]["ok"]


def test_idle_workload_runs_the_whole_harness_and_measures_nothing(cli, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    doc = {"campaign": "dry", "experiment": "finetune_lora_benchmark-v1.0.0",
           "entity": {"model_name": "tiny", "model_max_length": 64, "batch_size": 2},
           "grid": {"number_gpus": [1, 2]}, "model_map": {"tiny": str(tmp_path / "model")},
           "runner": {"workload": "idle", "idle_seconds": 0.5, "sample_interval_s": 0.2}}
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(doc))
    common = ["--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb"]
    res = cli("submit", sweep, "--executor", "local", "--wait", "--json", *common)
    assert res.exit_code == 0, res.output
    assert cli("collect", *common).exit_code == 0
    runs = sql_rows(tmp_path / "r.duckdb", "SELECT run_id, outcome, reason FROM runs ORDER BY run_id")
    assert [r["outcome"] for r in runs] == ["ok", "ok"], runs
    assert sql_rows(tmp_path / "r.duckdb", "SELECT count(*) AS n FROM measurements") == [{"n": 0}]
    stages = sql_rows(tmp_path / "r.duckdb", "SELECT DISTINCT stage FROM stages ORDER BY 1")
    assert [s["stage"] for s in stages] == ["setup", "teardown", "train"]  # no dataset stage for a dry run
    # its point ids are its own: a real sweep of the same entity is never "already measured" by it
    trained = json.loads(cli("plan", sweep.write_text(yaml.safe_dump({**doc, "runner": {}})) and sweep,
                             "--json").output)
    dry_ids = {r["run_id"].split("/")[1].split(".")[0] for r in runs}
    assert dry_ids.isdisjoint({p["point_id"] for p in trained})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**doc, "runner": {"workload": "sleep"}}))
    res = cli("plan", bad)
    assert res.exit_code == 2 and "runner.workload" in res.output
