"""A point's nodes, devices and training processes are counted in one place (harness.spec.resources.point_counts),
and the placement rules, the memory prediction, the node share and the job spec all agree with it: without
devices, on one device, on a whole 8-device node and on two of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.build.jobspec import build_jobspec
from harness.spec.inventory import load_inventory
from harness.spec.plan import plan_sweep
from harness.spec.resources import Counts, point_counts, point_share
from harness.spec.rules import placement_reasons
from harness.spec.sweep import parse_sweep

from .kit import TEST_INVENTORY

EXPERIMENT = "finetune_full_benchmark-v1.0.0"

# number_gpus, number_nodes -> (nodes, devices, devices per node, processes, processes per node)
CASES = {
    (0, 1): (1, 0, 0, 1, 1),
    (1, 1): (1, 1, 1, 1, 1),
    (8, 1): (1, 8, 8, 8, 8),
    (16, 2): (2, 16, 8, 16, 8),
}


def _point(tmp_path: Path, gpus: int, nodes: int):
    doc = {"campaign": "counts", "experiment": EXPERIMENT, "partition": "gpu",
           "entity": {"model_name": "llama3-8b", "model_max_length": 1024, "batch_size": 16, "number_gpus": gpus,
                      "number_nodes": nodes, "fsdp_sharding_strategy": "FULL_SHARD"},
           "model_map": {"llama3-8b": "/models/llama3-8b"}, "data_dir": "/data/sbench"}
    sweep = parse_sweep(doc, "counts.yaml", tmp_path)
    inv = load_inventory(TEST_INVENTORY)
    (point,) = plan_sweep(sweep, inv, memory=True)
    return sweep, inv, point


@pytest.mark.parametrize(("gpus", "nodes"), list(CASES))
def test_every_module_takes_a_points_counts_from_one_place(tmp_path: Path, gpus: int, nodes: int) -> None:
    sweep, inv, point = _point(tmp_path, gpus, nodes)
    counts = point_counts(point.entity)
    assert counts == Counts(*CASES[(gpus, nodes)])
    assert point.valid, point.reasons
    part = inv.partition("gpu")
    assert part.gpus_per_node == 8
    # the share of a node render asks SLURM for
    share = point_share(part, point.entity, None, None)
    assert share.devices == counts.devices_per_node
    assert share.fraction == min(1.0, counts.processes_per_node / part.gpus_per_node)
    # the job spec: nodes, processes, and the GPUs per node (none asked for without devices)
    spec = build_jobspec(sweep, inv, point, 1, str(tmp_path / "job"))
    assert (spec.num_machines, spec.num_processes, spec.processes_per_node) == (
        counts.nodes, counts.processes, counts.processes_per_node)
    assert spec.resources["nodes"] == counts.nodes
    assert spec.resources.get("gpus_per_node") == (counts.devices_per_node or None)
    assert spec.launcher == ("python" if counts.single else "accelerate")
    # the memory prediction: FULL_SHARD divides the parameters by the processes
    mem = point.memory
    assert mem is not None and mem["status"] == "ok", mem
    single = _point(tmp_path / "one", 1, 1)[2].memory
    assert single is not None
    assert mem["param_bytes"] == pytest.approx(single["param_bytes"] / counts.processes, rel=1e-6, abs=1)


def test_a_node_holds_no_more_than_its_devices_and_an_uneven_split_rounds_up(tmp_path: Path) -> None:
    inv = load_inventory(TEST_INVENTORY)
    part = inv.partition("gpu")
    exp = parse_sweep({"campaign": "c", "experiment": EXPERIMENT, "partition": "gpu",
                       "entity": {"model_name": "llama3-8b", "model_max_length": 1024, "batch_size": 16}},
                      "c.yaml", tmp_path).experiment
    reasons, _ = placement_reasons(exp, {"number_gpus": 16, "number_nodes": 1, "gpu_model": part.gpu_model}, part)
    assert any("16 GPUs per node requested" in r for r in reasons), reasons
    uneven = {"number_gpus": 3, "number_nodes": 2}
    assert point_counts(uneven) == Counts(nodes=2, devices=3, devices_per_node=2, processes=3, processes_per_node=1)
    assert point_share(part, uneven, None, None).devices == 2
