"""What changed under the numbers: the differences between two sets of runs' recorded environments.

Each run is reduced to its facts (:func:`run_facts`), each a ``(kind, name)`` and a value:

- ``package``: the versions collect recorded (``environment``'s columns, and every package of its ``packages``
  JSON; the training processes' own, ``trainer_packages``, as ``trainer package``);
- ``driver``: the GPU driver, the CUDA driver and runtime, NCCL, cuDNN and flash-attn;
- ``firmware``: each HCA's firmware (``hca_firmware``);
- ``env``: the recorded variables (NCCL_*, OMP_*, SBENCH_*, ...), less those that name the attempt rather
  than how it ran (:data:`harness.contract.envvars.PER_ATTEMPT`: the run's campaign, point, host, rendezvous
  port, SLURM's job variables...); the run's own job directory in a value reads ``<job dir>``;
- ``container``: the runtime, image and digest the node runner ran in;
- ``hardware``: the GPUs and CPU count the nodes had; ``hosts``: the hosts the run ran on;
- ``sbench``: sbench's version and commit;
- ``ran``: what the run did of the sweep's settings: the dtype of the loaded weights, the attention, the
  trainer, the NCCL transport, and each adjustment the runner made (``adjustments``).

A side's value of a fact is the set of its runs' values. A fact differs when the two sets differ; a fact one
side has and the other lacks differs too (a variable set on one side only), unless a side recorded no
environment at all (the reference's published measurements): then only the facts both sides have are compared
and :attr:`EnvDiff.note` says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.contract.envvars import PER_ATTEMPT, PER_ATTEMPT_PREFIXES
from harness.db.values import from_json

PACKAGE_COLUMNS = ("python", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "submitit", "duckdb",
                   "nvidia_ml_py")
DRIVER_COLUMNS = {"driver_version": "GPU driver", "cuda_driver": "CUDA driver", "cuda_runtime": "CUDA runtime",
                  "nccl": "NCCL", "cudnn": "cuDNN", "flash_attn": "flash-attn"}
CONTAINER_COLUMNS = {"container_runtime": "container runtime", "container_image": "container image",
                     "container_digest": "container digest"}
# packages whose version is a driver fact already (DRIVER_COLUMNS, from the same packages)
_AS_DRIVER = ("nvidia_nccl_", "nvidia_cudnn_", "nvidia_cuda_runtime_", "flash_attn")
RAN_COLUMNS = {"effective_torch_dtype": "torch_dtype that ran", "attn_implementation": "attention that ran",
               "transport": "NCCL transport"}
KIND_ORDER = ("ran", "package", "trainer package", "driver", "firmware", "container", "env", "hardware", "hosts",
              "sbench")
JOB_DIR = "<job dir>"
Fact = tuple[str, str]


@dataclass
class Change:
    """One fact that differs: its kind and name, and each side's values (empty: not recorded there)."""

    kind: str
    name: str
    base: list[str]
    cand: list[str]

    def text(self) -> str:
        return f"{self.name} {_show(self.base)} -> {_show(self.cand)}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text()}


def _show(values: Sequence[str]) -> str:
    if not values:
        return "(not recorded)"
    return ", ".join(values) if len(values) <= 4 else ", ".join(values[:4]) + f" (+{len(values) - 4})"


@dataclass
class EnvDiff:
    changes: list[Change] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"changes": [c.to_dict() for c in self.changes], "note": self.note}


def _per_attempt(name: str) -> bool:
    return name in PER_ATTEMPT or name.startswith(PER_ATTEMPT_PREFIXES)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def env_facts(row: Mapping[str, Any], job_dir: str | None) -> dict[Fact, str]:
    """The facts of one ``environment`` row (one host of a run)."""
    out: dict[Fact, str] = {}
    for col in PACKAGE_COLUMNS:
        if row.get(col):
            out[("package", col.replace("_", "-") if col == "nvidia_ml_py" else col)] = str(row[col])
    pk = from_json(row.get("packages"))
    for name, version in (pk.items() if isinstance(pk, dict) else []):
        key = str(name).replace("-", "_").lower()
        if key in PACKAGE_COLUMNS:  # a column's package: its column says it, the JSON where the column is empty
            fact = ("package", key.replace("_", "-") if key == "nvidia_ml_py" else key)
            if version and fact not in out:
                out[fact] = str(version)
        elif version and not key.startswith(_AS_DRIVER):
            out[("package", str(name))] = str(version)
    tp = from_json(row.get("trainer_packages"))
    for name, version in (tp.items() if isinstance(tp, dict) else []):
        if version:
            out[("trainer package", str(name))] = str(version)
    for col, name in DRIVER_COLUMNS.items():
        if row.get(col):
            out[("driver", name)] = str(row[col])
    for hca in (from_json(row.get("hca_firmware")) or []):
        if isinstance(hca, dict) and hca.get("name"):
            out[("firmware", f"HCA {hca['name']} firmware")] = str(hca.get("fw_ver"))
    env = from_json(row.get("env"))
    for name, value in (env.items() if isinstance(env, dict) else []):
        if not _per_attempt(str(name)):
            text = _text(value)
            out[("env", str(name))] = text.replace(job_dir, JOB_DIR) if job_dir else text
    for col, name in CONTAINER_COLUMNS.items():
        if row.get(col):
            out[("container", name)] = str(row[col])
    if row.get("gpu_names"):
        out[("hardware", "GPUs")] = ", ".join(sorted(map(str, row["gpu_names"])))
    if row.get("cpu_count"):
        out[("hardware", "CPUs")] = str(row["cpu_count"])
    if row.get("trainer"):
        out[("ran", "trainer")] = str(row["trainer"])
    for col, name in (("sbench_version", "sbench version"), ("git_commit", "git commit")):
        if row.get(col):
            out[("sbench", name)] = str(row[col])
    return out


def ran_facts(m: Mapping[str, Any]) -> dict[Fact, str]:
    """What a measurement says the run did of the sweep's settings."""
    out = {("ran", name): str(m[col]) for col, name in RAN_COLUMNS.items() if m.get(col)}
    for adj in (from_json(m.get("adjustments")) or []):
        if isinstance(adj, dict) and adj.get("setting"):
            out[("ran", f"{adj['setting']} adjusted")] = f"{adj.get('asked')} -> {adj.get('used')}"
    return out


@dataclass
class Side:
    """One side's facts: each fact's set of values, and whether it recorded any environment."""

    facts: dict[Fact, set[str]] = field(default_factory=dict)
    recorded: bool = False

    def add(self, facts: Mapping[Fact, str]) -> None:
        for k, v in facts.items():
            self.facts.setdefault(k, set()).add(v)


def side(measurements: Iterable[Mapping[str, Any]], environment: Mapping[str, Sequence[Mapping[str, Any]]]) -> Side:
    """The facts of a side's runs: *measurements* (their rows) and *environment* (run id -> its environment rows,
    each with the run's ``job_dir``)."""
    out = Side()
    for m in measurements:
        out.add(ran_facts(m))
        hosts = set()
        for row in environment.get(str(m.get("run_id")), []):
            out.recorded = True
            out.add(env_facts(row, row.get("job_dir")))
            if row.get("host"):
                hosts.add(str(row["host"]))
        if hosts:
            out.facts.setdefault(("hosts", "hosts"), set()).update(hosts)
    return out


def differences(base: Side, cand: Side) -> list[Change]:
    """The facts whose values differ, in :data:`KIND_ORDER` and then by name."""
    # a side with no environment (published measurements) is compared on the facts it has, not on those it lacks
    keys = set(base.facts) | set(cand.facts) if base.recorded and cand.recorded else set(base.facts) & set(cand.facts)
    out = []
    for key in keys:
        b, c = base.facts.get(key, set()), cand.facts.get(key, set())
        if b != c:
            out.append(Change(key[0], key[1], sorted(b), sorted(c)))
    rank = {k: i for i, k in enumerate(KIND_ORDER)}
    return sorted(out, key=lambda ch: (rank.get(ch.kind, len(rank)), ch.name))


def diff(base: Side, cand: Side) -> EnvDiff:
    note = None
    missing = [name for name, s in (("BASE", base), ("CAND", cand)) if not s.recorded]
    if missing:
        note = (f"{' and '.join(missing)} recorded no environment (published measurements, or runs whose "
                "environment.<host>.json is missing): only the facts both sides recorded are compared")
    return EnvDiff(differences(base, cand), note)
