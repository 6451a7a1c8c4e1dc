"""sbench probe: sysfs RDMA layout, GID types, comparison with the inventory and its fixes, the inventory
fragment, provenance; and for real on the test cluster's nodes (no HCAs there)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from harness.cluster.probe import compare, fragment
from harness.runner.envcapture import hca_firmware, ipv4_of_gid, read_hcas
from harness.spec.inventory import load_inventory, parse_inventory

from .kit import TEST_INVENTORY, sql_rows
from .kit.sysfs import make_sysfs


def inv_with(tmp_path: Path, roce: dict) -> tuple:
    doc = {"cluster": "c", "partitions": {"a100": {
        "gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 8, "cpus_per_node": 64, "memory_gb": 720,
        "hosts": {"gpu-a01": {"address": "10.0.1.11", "roce": roce}}}}}
    inv = parse_inventory(doc, "inv.yaml")
    part = inv.partitions["a100"]
    return part, part.hosts["gpu-a01"]


def node_probe(ib: Path, **over) -> dict:
    gpus = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{i}", "memory_gb": 79.2} for i in range(8)]
    return {"host": "gpu-a01", "gpus": gpus, "gpu_count": 8, "driver": "550.54.15", "cuda_driver": "12.4",
            "hcas": read_hcas(ib), "memlock": "unlimited", "cores": 64, "memory_gb": 1031.9, **over}


def test_sysfs_is_read_with_gid_types_and_ipv4(tmp_path: Path) -> None:
    ib = make_sysfs(tmp_path)
    hcas = {d["name"]: d for d in read_hcas(ib)}
    assert set(hcas) == {"mlx5_0", "mlx5_1", "mlx5_3"} and hcas["mlx5_0"]["fw_ver"] == "28.39.1002"
    (port,) = hcas["mlx5_0"]["ports"]
    assert port["state"] == "4: ACTIVE" and port["link_layer"] == "Ethernet" and port["rate"].startswith("200")
    assert [(g["index"], g["type"], g["ipv4"]) for g in port["gids"]] == [
        (0, "IB/RoCE v1", None), (1, "RoCE v2", None), (2, "IB/RoCE v1", "10.0.1.11"), (3, "RoCE v2", "10.0.1.11")]
    assert ipv4_of_gid("::ffff:192.168.3.4") == "192.168.3.4" and ipv4_of_gid("fe80::1") is None
    assert [h["fw_ver"] for h in hca_firmware(ib)] == ["28.39.1002", "20.31.1014", "28.39.1002"]
    assert read_hcas(tmp_path / "nothing") == []


def test_a_correct_inventory_has_no_differences(tmp_path: Path) -> None:
    ib = make_sysfs(tmp_path)
    part, host = inv_with(tmp_path, {"hcas": ["mlx5_0:1"], "gid_index": 3})
    assert compare(part, host, node_probe(ib)) == []


@pytest.mark.parametrize("roce,over,words", [
    ({"hcas": ["mlx5_0:1"], "gid_index": 1}, {}, ["gid_index 1 on mlx5_0:1 is RoCE v2", "use gid_index: 3"]),
    ({"hcas": ["mlx5_0:1"], "gid_index": 2}, {}, ["is IB/RoCE v1", "use gid_index: 3 (RoCE v2, 10.0.1.11)"]),
    ({"hcas": ["mlx5_0:1"], "gid_index": 9}, {}, ["gid_index 9 on mlx5_0:1 is empty"]),
    ({"hcas": ["mlx5_3:1"], "gid_index": 3}, {}, ["mlx5_3:1 is 1: DOWN, not ACTIVE"]),
    ({"hcas": ["mlx5_1:1"], "gid_index": 0}, {}, ["link layer InfiniBand"]),
    ({"hcas": ["mlx5_9:1"], "gid_index": 3}, {}, ["names mlx5_9:1, which the node does not have"]),
    ({"hcas": ["mlx5_0:1"], "gid_index": 3}, {"memlock": "65536"}, ["memlock limit is 65536"]),
    ({"hcas": ["mlx5_0:1"], "gid_index": 3}, {"gpu_count": 4, "gpus": []}, ["gpus_per_node is 8, NVML sees 4",
                                                                            "set gpus_per_node: 4"]),
    ({"hcas": ["mlx5_0:1"], "gid_index": 3}, {"cores": 32}, ["set cpus_per_node: 32"]),
    ({"hcas": ["mlx5_0:1"], "gid_index": 3}, {"memory_gb": 500.2}, ["set memory_gb: 500"]),
    ({"hcas": ["mlx5_0:1"], "gid_index": 3}, {"reverse_dns_s": 10.01}, ["reverse DNS lookup takes 10 s",
                                                                        "RES_OPTIONS"]),
])
def test_each_difference_names_its_fix(tmp_path: Path, roce, over, words) -> None:
    ib = make_sysfs(tmp_path)
    part, host = inv_with(tmp_path, roce)
    text = "\n".join(compare(part, host, node_probe(ib, **over)))
    assert all(w in text for w in words), text


def test_the_fragment_proposes_what_the_node_has(tmp_path: Path) -> None:
    ib = make_sysfs(tmp_path)
    frag = fragment("a100", {"gpu-a01": node_probe(ib)}, {"gpu-a01": "10.0.1.11"})
    part = frag["partitions"]["a100"]
    assert part["gpu_model"] == "NVIDIA-A100-SXM4-80GB" and part["gpus_per_node"] == 8
    assert part["hosts"]["gpu-a01"] == {"address": "10.0.1.11", "roce": {"hcas": ["mlx5_0:1"], "gid_index": 3,
                                                                         "socket_ifname": "net1-0"}}
    # what it proposes is a valid inventory, and one without differences
    doc = {"cluster": "c", "partitions": frag["partitions"]}
    inv = parse_inventory(yaml.safe_load(yaml.safe_dump(doc)), "frag.yaml")
    p = inv.partitions["a100"]
    assert compare(p, p.hosts["gpu-a01"], node_probe(ib)) == []


@pytest.mark.slurm
@pytest.mark.slow(10)
def test_probe_runs_on_every_test_cluster_node_and_lands_in_the_db(cli, slurm_cluster, tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    res = cli("probe", "-i", TEST_INVENTORY, "--partition", "cpu", "--on", "slurm", "--workdir", tmp_path / "runs",
              "--db", db, "--write", tmp_path / "frag.yaml", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["probes"]) == {"node1", "node2"}
    assert all(p["host"] in ("node1", "node2") and p["hcas"] == [] for p in out["probes"].values())
    rows = sql_rows(db, "SELECT host, hcas, differences FROM probes ORDER BY host")
    assert [r["host"] for r in rows] == ["node1", "node2"]
    # the test inventory claims HCAs the namespaced nodes do not have: each is named, with the fix
    assert any("which the node does not have (it has no RDMA devices)" in d for d in rows[0]["differences"])
    frag = yaml.safe_load((tmp_path / "frag.yaml").read_text())
    assert set(frag["partitions"]["cpu"]["hosts"]) == {"node1", "node2"}
    assert load_inventory(TEST_INVENTORY).partitions["cpu"].hosts["node1"].address == \
        frag["partitions"]["cpu"]["hosts"]["node1"]["address"]


def test_provenance_is_captured_and_collected(tmp_path: Path) -> None:
    from harness.collect import collect
    from harness.runner.envcapture import capture

    from .kit.jobdirs import append_manifest, make_run

    env = capture("node1")
    prov = env["provenance"]
    assert set(prov) >= {"driver", "cuda_driver", "cuda_runtime", "nccl", "cudnn", "flash_attn", "hcas"}
    import torch

    assert prov["cuda_runtime"] == torch.version.cuda  # read from torch/version.py without importing torch
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    run = make_run(wd, "p", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999990")
    append_manifest(wd, "p", run["events"])
    doc = json.loads(run["paths"].environment("node1").read_text())
    doc["provenance"] = {"driver": "550.54.15", "cuda_driver": "12.4", "cuda_runtime": "12.4", "nccl": "2.21.5",
                         "cudnn": "9.1.0.70", "flash_attn": "2.6.3",
                         "hcas": [{"name": "mlx5_0", "fw_ver": "28.39.1002", "board_id": "MT_1", "hca_type": None}]}
    run["paths"].environment("node1").write_text(json.dumps(doc))
    collect(db, wd)
    (row,) = sql_rows(db, "SELECT driver_version, cuda_driver, cuda_runtime, nccl, cudnn, flash_attn, "
                          "hca_firmware->>'$[0].fw_ver' AS fw FROM environment")
    assert row == {"driver_version": "550.54.15", "cuda_driver": "12.4", "cuda_runtime": "12.4", "nccl": "2.21.5",
                   "cudnn": "9.1.0.70", "flash_attn": "2.6.3", "fw": "28.39.1002"}


def _advised(diffs: list[str], key: str) -> set[str]:
    """The values the differences tell the user to set for *key* ("set gpus_per_node: 2", "gpus_per_node: 2")."""
    return {m for d in diffs for m in re.findall(rf"\b{key}: (\S+?)[;,)\s]", d + " ")}


@pytest.mark.parametrize("inventory_model, gpus, node_gpus", [
    ("NVIDIA-A100-SXM4-80GB", 8, 0),  # a GPU partition whose nodes show no GPU: the advice is a CPU partition
    ("NVIDIA-A100-SXM4-80GB", 8, 4),
    ("cpu", 2, 0),
    ("cpu", 2, 8),
])
def test_probe_advises_the_gpus_per_node_that_write_writes(tmp_path: Path, inventory_model, gpus, node_gpus) -> None:
    ib = make_sysfs(tmp_path)
    doc = {"cluster": "c", "partitions": {"p": {
        "gpu_model": inventory_model, "gpus_per_node": gpus, "cpus_per_node": 64, "memory_gb": 720,
        "hosts": {"gpu-a01": {"address": "10.0.1.11", "roce": {"hcas": ["mlx5_0:1"], "gid_index": 3}}}}}}
    part = parse_inventory(doc, "inv.yaml").partitions["p"]
    gpu_list = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{i}", "memory_gb": 79.2}
                for i in range(node_gpus)]
    probe = node_probe(ib, gpus=gpu_list, gpu_count=node_gpus, cores=16)
    diffs = compare(part, part.hosts["gpu-a01"], probe)
    frag = fragment("p", {"gpu-a01": probe}, {"gpu-a01": "10.0.1.11"}, part)["partitions"]["p"]
    if (inventory_model == "cpu") == (node_gpus == 0) and gpus == frag["gpus_per_node"]:
        assert not _advised(diffs, "gpus_per_node"), diffs  # nothing to change
    else:
        assert _advised(diffs, "gpus_per_node") == {str(frag["gpus_per_node"])}, diffs
        assert _advised(diffs, "gpu_model") <= {frag["gpu_model"]}, diffs
    # following the advice (the fragment) gives an inventory with nothing left to say about devices
    fixed = {**doc["partitions"]["p"], "gpu_model": frag["gpu_model"], "gpus_per_node": frag["gpus_per_node"]}
    p2 = parse_inventory({"cluster": "c", "partitions": {"p": fixed}}, "fixed.yaml").partitions["p"]
    assert not [d for d in compare(p2, p2.hosts["gpu-a01"], probe) if re.search("gpus_per_node|gpu_model|NVML", d)]


@pytest.mark.slurm
@pytest.mark.slow(20)
def test_probe_names_the_partition_option_and_its_advice_matches_write(cli, slurm_cluster, tmp_path: Path) -> None:
    """With two partitions and no sweep, the message names --partition; following it, probe runs. On the
    test cluster's GPU partition (its nodes have no GPU) probe advises what --write writes; following that
    advice leaves no difference about GPUs, cores or memory."""
    db, runs = tmp_path / "r.duckdb", tmp_path / "runs"
    res = cli("probe", "-i", TEST_INVENTORY, "--on", "slurm", "--workdir", runs, "--db", db)
    assert res.exit_code == 2 and "name one with --partition (e.g. --partition cpu)" in res.output, res.output
    assert "in the sweep" not in res.output
    res = cli("probe", "-i", TEST_INVENTORY, "--partition", "gpu", "--on", "slurm", "--workdir", runs, "--db", db,
              "--write", tmp_path / "frag.yaml")
    assert res.exit_code == 0, res.output
    frag = yaml.safe_load((tmp_path / "frag.yaml").read_text())["partitions"]["gpu"]
    said = [line for line in res.output.splitlines() if line.startswith("differs: ")]
    assert _advised(said, "gpus_per_node") == {str(frag["gpus_per_node"])}, said
    assert _advised(said, "gpu_model") == {frag["gpu_model"]} == {"cpu"}, said
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    doc["partitions"]["gpu"].update({k: frag[k] for k in ("gpu_model", "gpus_per_node", "cpus_per_node",
                                                          "memory_gb")})
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(yaml.safe_dump(doc))
    again = cli("probe", "-i", fixed, "--partition", "gpu", "--on", "slurm", "--workdir", runs, "--db", db)
    assert again.exit_code == 0, again.output
    left = [line for line in again.output.splitlines() if line.startswith("differs: ")]
    assert left and not [d for d in left if re.search(r"gpus_per_node|gpu_model|NVML|cores|memory_gb", d)], left
