"""Bad input gets a clear error naming the file and key, exit code 2, and no traceback."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import psutil
import pytest
import yaml

from harness.spec.inventory import local_inventory
from harness.spec.memory import device_memory

GOOD_PARTITION = """\
    gpu_model: NVIDIA-A100-SXM4-80GB
    gpus_per_node: 8
    cpus_per_node: 64
    memory_gb: 720
"""


def inv(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "cluster.yaml"
    p.write_text(textwrap.dedent(body))
    return p


INVENTORY_ERRORS = {
    "duplicate_key": ("""\
        cluster: c
        partitions:
          a100:
            gpu_model: NVIDIA-A100-SXM4-80GB
            gpus_per_node: 8
            cpus_per_node: 64
            memory_gb: 720
            hosts:
              gpu-a01:
                roce: {hcas: ["mlx5_0:1"], gid_index: 3}
                address: 10.0.0.1
                address: 10.0.0.2
        """, ["cluster.yaml:12", "duplicate key", "partitions.a100.hosts.gpu-a01.address", "line 11"]),
    "wrong_type": ("""\
        partitions:
          a100:
            gpu_model: NVIDIA-A100-SXM4-80GB
            gpus_per_node: eight
            cpus_per_node: 64
            memory_gb: 720
            hosts: {h1: {}}
        """, ["cluster.yaml:4", "partitions.a100.gpus_per_node must be an integer >= 0, got 'eight'"]),
    "missing_required": ("""\
        partitions:
          a100:
            gpus_per_node: 8
            cpus_per_node: 64
            memory_gb: 720
            hosts: {h1: {}}
        """, ["partitions.a100.gpu_model is required but missing"]),
    "hca_form": ("""\
        partitions:
          a100:
            gpu_model: NVIDIA-A100-SXM4-80GB
            gpus_per_node: 8
            cpus_per_node: 64
            memory_gb: 720
            hosts:
              h1: {roce: {hcas: [mlx5_0], gid_index: 3}}
        """, ["partitions.a100.hosts.h1.roce.hcas[0] must be in 'dev:port' form", "'mlx5_0'"]),
    "gid_not_int": ("""\
        partitions:
          a100:
            gpu_model: NVIDIA-A100-SXM4-80GB
            gpus_per_node: 8
            cpus_per_node: 64
            memory_gb: 720
            hosts:
              h1: {roce: {hcas: ["mlx5_0:1"], gid_index: three}}
        """, ["partitions.a100.hosts.h1.roce.gid_index must be an integer >= 0, got 'three'"]),
    "gid_negative": ("""\
        partitions:
          a100:
            gpu_model: NVIDIA-A100-SXM4-80GB
            gpus_per_node: 8
            cpus_per_node: 64
            memory_gb: 720
            hosts:
              h1: {roce: {hcas: ["mlx5_0:1"], gid_index: -1}}
        """, ["roce.gid_index must be an integer >= 0, got -1"]),
    "unknown_key": ("""\
        partitions:
          a100:
            gpu_model: NVIDIA-A100-SXM4-80GB
            gpus_per_nod: 8
            cpus_per_node: 64
            memory_gb: 720
            hosts: {h1: {}}
        """, ["partitions.a100.gpus_per_nod is not a known key", "did you mean 'gpus_per_node'"]),
    "empty_partition": ("""\
        partitions:
          a100:
            gpu_model: NVIDIA-A100-SXM4-80GB
            gpus_per_node: 8
            cpus_per_node: 64
            memory_gb: 720
            hosts: {}
        """, ["partitions.a100.hosts is empty"]),
    "bad_env_name": ("""\
        partitions:
          a100:
            gpu_model: cpu
            gpus_per_node: 2
            cpus_per_node: 4
            memory_gb: 8
            env: {"BAD NAME; rm -rf /": "x"}
            hosts: {h1: {}}
        """, ["is not a valid environment variable name"]),
    "not_yaml": ("partitions: [unclosed\n", ["cluster.yaml:", "invalid YAML"]),
}


@pytest.mark.parametrize("case", sorted(INVENTORY_ERRORS))
def test_inventory_errors(case: str, cli, tmp_path: Path) -> None:
    body, needles = INVENTORY_ERRORS[case]
    path = inv(tmp_path, body)
    res = cli("inventory", "check", "-i", path)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert str(path) in res.output
    for n in needles:
        assert n in res.output, f"{n!r} not in {res.output!r}"


def test_missing_inventory_file(cli, tmp_path: Path) -> None:
    res = cli("inventory", "check", "-i", tmp_path / "nope.yaml")
    assert res.exit_code == 2 and "inventory not found" in res.output


def test_inventory_check_json_and_gid_warning(cli) -> None:
    root = Path(__file__).resolve().parent.parent
    res = cli("inventory", "check", "-i", root / "inventory" / "example-roce.yaml", "--json")
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert set(doc["partitions"]) == {"a100", "h100"}
    a03 = doc["partitions"]["a100"]["hosts"]["gpu-a03"]["roce"]
    assert a03 == {"hcas": ["mlx5_1:1", "mlx5_2:1"], "nccl_ib_hca": "=mlx5_1,mlx5_2", "gid_index": 1,
                   "socket_ifname": "net1-1"}
    assert any("different RoCE GID indices" in w for w in doc["warnings"])


def test_local_inventory_describes_this_machine(cli) -> None:
    import os

    import psutil

    res = cli("inventory", "check", "--json", env={"SBENCH_INVENTORY": ""})
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    part = doc["partitions"]["local"]
    assert part["cpus_per_node"] == os.cpu_count()
    assert abs(part["memory_gb"] - psutil.virtual_memory().total / 1e9) <= 0.05  # GB = 10^9 bytes, to 0.1
    assert part["gpu_model"] == "cpu" and part["gpus_per_node"] == os.cpu_count()  # no NVML GPUs here


def test_the_local_inventorys_memory_budget_is_this_machines_memory() -> None:
    """The memory prediction's budget for a worker of the local CPU partition is its share (95 %, over the
    processes) of this machine's memory in bytes, within the 0.1 GB the inventory rounds to: not 7 % less,
    as it was when the inventory's figure was GiB read as GB."""
    total = psutil.virtual_memory().total
    part = local_inventory().partitions["local"]
    for procs in (1, 4):
        budget, source = device_memory(part, procs)
        assert source == "node memory_gb / processes"
        assert budget is not None and abs(budget - 0.95 * total / procs) <= 0.95 * 0.05e9 / procs


SWEEP_BASE = {
    "campaign": "c", "experiment": "finetune_lora_benchmark-v1.0.0",
    "entity": {"model_name": "smollm2-135m", "model_max_length": 512, "number_gpus": 1, "batch_size": 4},
}


def sweep_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(textwrap.dedent(text))
    return p


SWEEP_ERRORS = {
    "unknown_field": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4, batchsize: 8}
        """, ["entity.batchsize is not a field of finetune_lora_benchmark-v1.0.0", "did you mean 'batch_size'"]),
    "wrong_type": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1}
        grid: {batch_size: [4, eight]}
        """, ["grid.batch_size[1]", "batch_size must be an integer, got 'eight'"]),
    "domain": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4, torch_dtype: float64}
        """, ["entity.torch_dtype", "must be one of: bfloat16, float32, float16; got 'float64'"]),
    "unknown_experiment": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v9
        entity: {}
        """, ["experiment names an unknown experiment", "finetune_lora_benchmark-v1.0.0"]),
    "missing_required": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, number_gpus: 1, batch_size: 4}
        """, ["entity.model_max_length is required"]),
    "missing_campaign": ("""\
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {}
        """, ["campaign is required"]),
    "unknown_model": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: gpt-17, model_max_length: 512, number_gpus: 1, batch_size: 4}
        """, ["unknown model 'gpt-17'", "model_map"]),
    "duplicate_key": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        grid:
          batch_size: [1]
          batch_size: [2]
        """, ["sweep.yaml:6", "duplicate key 'grid.batch_size'"]),
    "empty_grid_list": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1}
        grid: {batch_size: []}
        """, ["grid.batch_size is an empty list"]),
    "unknown_top_key": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        repeat: 3
        """, ["repeat is not a known key", "did you mean 'repeats'"]),
    "bad_campaign_name": ("""\
        campaign: "my campaign; rm -rf /"
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        """, ["campaign must use letters, digits"]),
    "bad_time": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        slurm: {time: "one hour"}
        """, ["slurm.time must be a SLURM time"]),
    "in_both": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        grid: {batch_size: [1, 2]}
        """, ["grid.batch_size is set in both entity: and grid:"]),
    "bad_reuse": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        reuse: measure
        """, ["sweep.yaml:4", "reuse must be one of: none, measured; got 'measure'", "did you mean 'measured'"]),
    "reuse_not_a_word": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        reuse: true
        """, ["sweep.yaml:4", "reuse must be one of: none, measured; got True"]),
    "reuse_misspelt_key": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        reuse_measured: true
        """, ["sweep.yaml:4", "reuse_measured is not a known key; write 'reuse: measured'"]),
    "reuse_typo": ("""\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        resue: measured
        """, ["sweep.yaml:4", "resue is not a known key", "did you mean 'reuse'"]),
}


@pytest.mark.parametrize("case", sorted(SWEEP_ERRORS))
@pytest.mark.parametrize("command", ["plan", "render"])
def test_sweep_errors(case: str, command: str, cli, tmp_path: Path) -> None:
    body, needles = SWEEP_ERRORS[case]
    path = sweep_file(tmp_path, body)
    args = ["plan", path] if command == "plan" else ["render", path, "-o", tmp_path / "out"]
    res = cli(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert str(path) in res.output
    for n in needles:
        assert n in res.output, f"{n!r} not in {res.output!r}"
    if command == "render":
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_unknown_partition(cli, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    path = sweep_file(tmp_path, """\
        campaign: c
        experiment: finetune_lora_benchmark-v1.0.0
        partition: v100
        entity: {model_name: smollm2-135m, model_max_length: 512, number_gpus: 1, batch_size: 4}
        """)
    res = cli("plan", path, "-i", root / "inventory" / "example-roce.yaml")
    assert res.exit_code == 2
    assert "no partition 'v100'" in res.output and "a100, h100" in res.output


def test_unknown_experiment_show(cli) -> None:
    res = cli("experiments", "show", "nope")
    assert res.exit_code == 2 and "unknown experiment 'nope'" in res.output


# -- advice that works: each message's fix, followed, makes the command succeed ------------------------------------
def _follow(doc: dict, key: str, message: str) -> dict:
    """*doc* changed exactly as *message* advises for the top-level *key*: moved under the section it names, or
    renamed to the key it suggests."""
    fixed = {k: v for k, v in doc.items() if k != key}
    moved = re.search(r"put it under (\w+):", message)
    renamed = re.search(r"did you mean '(\w+)'\?", message)
    assert moved or renamed, message
    if moved:
        fixed[moved.group(1)] = {**(doc.get(moved.group(1)) or {}), key: doc[key]}
    else:
        fixed[renamed.group(1)] = doc[key]
    return fixed


@pytest.mark.parametrize("key, value, not_suggested", [
    ("trainer", "fms-hf-tuning", "runner"),  # an entity field: 'runner' is a mapping, never the fix
    ("batch_size", 8, None),
    ("time", "01:00:00", None),  # a slurm: setting
    ("workload", "idle", None),  # a runner: setting
    ("runer", {"workload": "idle"}, None),  # a near miss of the same type: the suggestion is the fix
    ("repeat", 2, None),
])
def test_a_misplaced_sweep_key_gets_advice_that_works(key, value, not_suggested, cli, tmp_path: Path) -> None:
    entity = dict(SWEEP_BASE["entity"])
    if key in entity:
        del entity[key]
    doc = {**SWEEP_BASE, "entity": entity, key: value}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = cli("plan", path)
    assert res.exit_code == 2 and re.search(rf"sweep\.yaml:\d+: {key} ", res.output), res.output
    if not_suggested:
        assert repr(not_suggested) not in res.output and "is a field of finetune_lora_benchmark" in res.output
    path.write_text(yaml.safe_dump(_follow(doc, key, res.output), sort_keys=False))
    again = cli("plan", path, "--json")
    assert again.exit_code == 0, again.output
    points = json.loads(again.stdout)
    assert len(points) == (value if key == "repeat" else 1)
    if key in points[0]["entity"]:
        assert points[0]["entity"][key] == value


def test_a_partition_warning_is_given_for_sweeps_on_that_partition_only(cli, tmp_path: Path) -> None:
    from .kit import TEST_INVENTORY

    # the test inventory's cpu partition has hosts with different GID indices; its gpu partition does not
    said = {}
    for part in ("cpu", "gpu"):
        path = tmp_path / f"{part}.yaml"
        path.write_text(yaml.safe_dump({**SWEEP_BASE, "partition": part}))
        res = cli("plan", path, "-i", TEST_INVENTORY)
        assert res.exit_code == 0, res.output
        said[part] = res.stderr
    assert "partitions.cpu: hosts use different RoCE GID indices" in said["cpu"]
    assert "GID" not in said["gpu"]
    whole = cli("inventory", "check", "-i", TEST_INVENTORY)
    assert "partitions.cpu: hosts use different RoCE GID indices" in whole.stderr
