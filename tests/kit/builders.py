"""Sweeps and inventories as the tests write them: small valid documents to change a key of, and one writer.

:func:`sweep` and :func:`inventory` give the common case (the tiny model on this machine, through the local
executor); a test that tests a key overrides that key. :func:`write_yaml` is the one way a test writes a YAML
input. ``LAB_INVENTORY`` and ``LAB_SWEEP`` are the two-host inputs the hostile-input tests change one key of
(:func:`setin`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SMALL_DATASET = "news-chars-512-entries-4096"  # the small_data_dir fixture holds 64 entries of it
FULL = "finetune_full_benchmark-v1.0.0"
LORA = "finetune_lora_benchmark-v1.0.0"


def write_yaml(path: Path, doc: Any) -> Path:
    """*doc* as YAML at *path* (a string is written as it is: YAML a test typed); returns *path*."""
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def sweep(model: Path | str | None = None, data_dir: Path | str | None = None, **over: Any) -> dict[str, Any]:
    """A small valid sweep: full fine-tuning of the tiny model (``model_name: tiny``), one process, batch 2,
    64 tokens, 2 steps, gradient accumulation 1, on :data:`SMALL_DATASET`. It names no partition, so it plans on
    the built-in local inventory (no ``-i``) as on :func:`inventory`'s one partition, and runs through the local
    executor.

    *model*: the tiny model's directory (the ``model_map``; default ``./model``, beside the sweep file: enough to
    plan). *data_dir*: where :data:`SMALL_DATASET` lies (default: none given). *over*: top-level keys replaced,
    except ``entity``, whose keys are laid over the default entity (a key given None is dropped); a key swept in
    ``grid`` leaves the entity (a key may not be in both)."""
    doc: dict[str, Any] = {
        "campaign": "c", "experiment": FULL,
        "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "number_gpus": 1,
                   "batch_size": 2, "gradient_accumulation_steps": 1, "max_steps": 2},
        "model_map": {"tiny": str(model) if model is not None else "./model"},
    }
    if data_dir is not None:
        doc["data_dir"] = str(data_dir)
    entity = {**doc["entity"], **over.pop("entity", {})}
    doc.update(over)
    doc["entity"] = {k: v for k, v in entity.items() if v is not None and k not in (doc.get("grid") or {})}
    return doc


def inventory(cluster: str = "c", *, gpus: int = 1, cpus: int = 2, memory_gb: float = 8,
              env: dict[str, str] | None = None, defaults: dict[str, Any] | None = None,
              **partition: Any) -> dict[str, Any]:
    """An inventory of this machine alone: partition ``cpu`` whose host ``h1`` (127.0.0.1) has *gpus* CPU
    "devices", *cpus* cores and *memory_gb*; *env* for the partition's jobs, *defaults* for the cluster's.
    *partition*: more keys of the partition (``time_limit``, ``peak_tflops``, ...)."""
    part: dict[str, Any] = {"gpu_model": "cpu", "gpus_per_node": gpus, "cpus_per_node": cpus,
                            "memory_gb": memory_gb, **partition}
    if env is not None:
        part["env"] = env
    part["hosts"] = {"h1": {"address": "127.0.0.1"}}
    return {"cluster": cluster, **({"defaults": defaults} if defaults else {}), "partitions": {"cpu": part}}


# -- the hostile-input tests' base: two hosts (one of them RoCE), a LoRA sweep of four points -------------------
LAB_INVENTORY: dict[str, Any] = {
    "cluster": "lab",
    "defaults": {"env": {"OMP_NUM_THREADS": "1"}, "setup": []},
    "partitions": {
        "cpu": {"gpu_model": "cpu", "gpus_per_node": 2, "cpus_per_node": 8, "memory_gb": 16,
                "time_limit": "00:30:00",
                "hosts": {"h1": {"address": "127.0.0.1", "env": {"X": "1"}},
                          "h2": {"address": "10.9.0.2", "roce": {"hcas": ["mlx5_0:1"], "gid_index": 3}}}},
    },
}
LAB_SWEEP: dict[str, Any] = {
    "campaign": "hard", "experiment": LORA, "partition": "cpu",
    "entity": {"model_name": "tiny", "model_max_length": 64, "max_steps": 2},
    "grid": {"batch_size": [2, 4], "number_gpus": [1, 2]},
    "repeats": 1, "model_map": {"tiny": "./model"}, "runner": {"sample_interval_s": 0.5},
    "slurm": {"time": "00:10:00"},
}


def setin(doc: dict, dotted: tuple[str, ...], value: Any) -> dict:
    """A deep copy of *doc* with the key at *dotted* (made where missing) set to *value*."""
    out = copy.deepcopy(doc)
    node = out
    for k in dotted[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[dotted[-1]] = value
    return out
