"""Plans: a sweep expanded into points, each entity resolved (defaults filled, types and domains checked)
and judged by the validity rules (``rules``).

A *point* is an experiment plus its fully resolved entity values; its id is a stable hash of exactly
those, so the same point is recognised across campaigns. Invalid points are reported with their
reasons, never dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError, SweepError
from harness.contract.records import PointFields

from .catalog import EXPERIMENTS
from .flops import compute_dtype, flops_per_token, peak_tflops
from .inventory import Inventory, Partition
from .memory import config_for, flop_counts, predict
from .modelconfig import architecture, model_config
from .modelmap import is_local_source, mount_visible
from .predict import Compute
from .resources import point_counts
from .rules import (
    change_warnings,
    placement_reasons,
    trainer_reasons,
    validity_reasons,
    vision_reasons,
    vision_release,
)
from .schema import slurm_time_key
from .sweep import Sweep


@dataclass
class PlannedPoint:
    point_id: str
    repeat: int
    experiment: str
    entity: dict[str, Any]
    valid: bool
    reasons: list[str]
    notes: list[str]
    partition: str
    model_source: str | None
    memory: dict[str, Any] | None = None  # harness.spec.memory's prediction (plan --memory)
    # What the FLOP model knows of a valid point (harness.spec.predict): for this process's predictions, not recorded.
    compute: Compute | None = field(default=None, metadata={"recorded": False})
    # Settings the trainer will change (rules.change_warnings, and the data layer's masked entries), one
    # text per cause.
    warnings: list[str] = field(default_factory=list)

    @property
    def predicted_oom(self) -> bool:
        return bool(self.memory and self.memory.get("predicted_oom"))

    def to_dict(self) -> PointFields:
        out: PointFields = {
            "point_id": self.point_id, "repeat": self.repeat, "experiment": self.experiment,
            "entity": self.entity, "valid": self.valid, "reasons": self.reasons, "notes": self.notes,
            "partition": self.partition, "model_source": self.model_source, "warnings": self.warnings,
        }
        if self.memory is not None:
            out["memory"] = self.memory
            out["predicted_oom"] = self.memory.get("predicted_oom")  # null: not predicted (memory.reason says why)
        return out


def point_id(experiment: str, entity: Mapping[str, Any], workload: str = "train") -> str:
    """Stable id: a hash of the experiment and every resolved entity value (key order irrelevant). A dry
    run (``runner.workload: idle``) has ids of its own, so it never stands for a trained point."""
    exp = EXPERIMENTS.get(experiment)
    ent = dict(entity)
    if exp is not None:
        for f in exp.fields:
            if f.id_omit_default and f.name in ent and ent[f.name] == f.default:
                del ent[f.name]
    doc: dict[str, Any] = {"experiment": experiment, "entity": ent}
    if workload != "train":
        doc["workload"] = workload
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _where(sweep: Sweep, combo_keys: dict[str, int], name: str) -> str:
    if name in combo_keys:
        return f"{sweep.source}: grid.{name}[{combo_keys[name]}]"
    return f"{sweep.source}: entity.{name}"


def resolve_entity(sweep: Sweep, raw: Mapping[str, Any], partition: Partition,
                   combo_keys: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    """Fill defaults and hardcoded values, check types and domains. Returns (entity, notes)."""
    exp = sweep.experiment
    notes: list[str] = []
    values = dict(raw)
    if values.get("gpu_model") in (None, "") and "gpu_model" not in raw:
        values["gpu_model"] = partition.gpu_model
        notes.append(f"gpu_model taken from partition {partition.name!r}: {partition.gpu_model}")
    entity: dict[str, Any] = {}
    for spec in exp.fields:
        where = _where(sweep, combo_keys, spec.name)
        if spec.name in values:
            entity[spec.name] = spec.coerce(values[spec.name], where)
        elif spec.required:
            raise SweepError(f"{sweep.source}: entity.{spec.name} is required by {exp.id} but missing; "
                             f"add it under entity: or grid: ({spec.help})")
        else:
            entity[spec.name] = spec.default
    # Model names: the experiment's own list plus anything a model map names.
    name = entity["model_name"]
    if name not in exp.models and name not in sweep.model_map:
        raise SweepError(
            f"{_where(sweep, combo_keys, 'model_name')}: unknown model {name!r} for {exp.id}; add it to the "
            f"sweep's model_map: (name: HF id or local path) or use one of: {', '.join(exp.models)}")
    # Single-device runs use no distributed backend (the trainer runs directly).
    if "distributed_backend" in entity:
        single = point_counts(entity).single
        if single and entity["distributed_backend"] == "DEEPSPEED":
            pass  # ZeRO-Offload on one device is a memory technique of its own: keep it
        elif single:
            if entity["distributed_backend"] is not None:
                notes.append(f"distributed_backend {entity['distributed_backend']} ignored: single-device run")
            entity["distributed_backend"] = None
        elif entity["distributed_backend"] is None:
            entity["distributed_backend"] = "FSDP"
    return entity, notes


def _combos(sweep: Sweep) -> list[tuple[dict[str, Any], dict[str, int]]]:
    keys = list(sweep.grid)
    out = []
    for idx in itertools.product(*(range(len(sweep.grid[k])) for k in keys)):
        raw = dict(sweep.entity)
        pos = {}
        for k, i in zip(keys, idx):
            raw[k] = sweep.grid[k][i]
            pos[k] = i
        out.append((raw, pos))
    return out


def plan_sweep(sweep: Sweep, inventory: Inventory, *, memory: bool = False) -> list[PlannedPoint]:
    """Every point x repeat of the sweep, with validity and reasons; with *memory*, each valid point's
    predicted per-device memory (harness.spec.memory)."""
    try:
        partition = inventory.partition(sweep.partition)
    except InputError as exc:
        raise SweepError(f"{sweep.source}: partition: {exc}") from None
    check_time_limit(sweep, inventory, partition)
    exp = sweep.experiment
    cfg_cache: dict[str, Any] = {}
    arch_cache: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    points: list[PlannedPoint] = []
    seen: set[str] = set()
    for raw, pos in _combos(sweep):
        entity, notes = resolve_entity(sweep, raw, partition, pos)
        variant = "GPTQ-Quantized" if exp.method == "gptq-lora" else "Vanilla"
        src = sweep.model_map.source(entity["model_name"], variant)
        unquantized = src is None and variant != "Vanilla"
        if unquantized:
            src = sweep.model_map.source(entity["model_name"])
        cfg = None
        if entity.get("fast_moe") and src:
            if src not in cfg_cache:
                cfg_cache[src] = model_config(src)
            cfg = cfg_cache[src]
        arch_key = f"{entity['model_name']}\0{src}"
        if arch_key not in arch_cache:
            arch_cache[arch_key] = architecture(entity["model_name"], src)
        vision_release(entity, "fms_hf_tuning_version" in raw, arch_cache[arch_key][0], notes)
        reasons, vnotes = validity_reasons(exp, entity, cfg, src)
        preasons, pnotes = placement_reasons(exp, entity, partition)
        preasons += trainer_reasons(exp, entity, partition, inventory, pnotes)
        preasons += vision_reasons(exp, entity, *arch_cache[arch_key], pnotes)
        if unquantized:
            # fms-acceleration's GPTQ loader reads the checkpoint's quantization config: plain weights fail.
            preasons.append(f"model: GPTQ-LoRA needs GPTQ-quantized weights and none are mapped for "
                            f"{entity['model_name']}; add model_map.{entity['model_name']}.GPTQ-Quantized")
        elif exp.method == "gptq-lora" and src and is_local_source(src) and Path(src).expanduser().exists():
            if src not in cfg_cache:
                cfg_cache[src] = model_config(src)
            quant = ((cfg_cache[src] or {}).get("quantization_config") or {}).get("quant_method")
            if quant != "gptq":
                found = f"quantization {quant!r}" if quant else "no quantization_config"
                preasons.append(f"model: GPTQ-LoRA needs GPTQ-quantized weights; {src} has {found} in config.json")
        if src is None:
            preasons.append(f"model: no weights mapped for {entity['model_name']}; add it to model_map:")
        elif is_local_source(src) and not Path(src).expanduser().exists():
            origin = sweep.model_map.origins.get(entity["model_name"], "built-in")
            if origin != "built-in" and mount_visible(src):
                # A path the user wrote: a typo here costs an allocation, so it is an input error.
                raise SweepError(
                    f"{origin}: model_map.{entity['model_name']} points to {src}, which does not exist; fix the "
                    f"path, or create it (for a test model: sbench model tiny -o {src})")
            # The built-in map names the reference deployment's paths, and a file system that is not
            # mounted here at all may be mounted on the compute nodes: say so, do not invalidate.
            notes.append(f"model weights {src} are not visible from this machine (for a test model: "
                         f"sbench model tiny -o {src})")
        pid = point_id(exp.id, entity, sweep.runner.workload)
        if pid in seen:
            # The same point reached twice through the grid (e.g. a backend ignored on one device).
            grid_pos = ", ".join(f"{k}[{i}]" for k, i in pos.items())
            for p in points:
                if p.point_id == pid:
                    p.notes.append(f"also produced by grid combination {grid_pos}; measured once")
            continue
        seen.add(pid)
        mem = None
        if memory and not (reasons or preasons):
            # The model's config.json where it is readable, else the catalogue's facts: predicted before any download
            arch, arch_source = config_for(entity["model_name"], src)
            mem = predict(entity, exp.method, arch, partition,
                          target_modules=tuple(exp.target_modules(entity["model_name"], sweep.model_map))
                          if exp.method in ("lora", "gptq-lora") else (), config_source=arch_source).to_dict()
        warnings = [] if reasons or preasons or sweep.runner.workload != "train" else \
            change_warnings(exp, entity, partition, inventory)
        compute = None if reasons or preasons else point_compute(exp, entity, partition, arch_cache[arch_key][0],
                                                                 sweep)
        for r in range(sweep.repeats):
            points.append(PlannedPoint(
                point_id=pid, repeat=r, experiment=exp.id, entity=entity, valid=not (reasons or preasons),
                reasons=reasons + preasons, notes=notes + vnotes + pnotes, partition=partition.name,
                model_source=src, memory=mem, warnings=list(warnings), compute=compute,
            ))
    check_profile(sweep, points)
    return points


def point_compute(exp: Any, entity: Mapping[str, Any], partition: Partition, arch: dict[str, Any] | None,
                  sweep: Sweep) -> Compute:
    """What the FLOP model needs of a valid point: its model FLOPs per token at ``model_max_length`` (counted from
    the architecture, gradient checkpointing's recompute not being model FLOPs), and its devices' peak."""
    dtype = compute_dtype(dict(entity), partition.is_cpu)
    peak, peak_source = peak_tflops(str(entity.get("gpu_model") or partition.gpu_model), dtype, partition.peak_tflops)
    counts = flop_counts(arch, exp.method, r=int(entity.get("r") or 4),
                         target_modules=tuple(exp.target_modules(entity["model_name"], sweep.model_map))
                         if exp.method in ("lora", "gptq-lora") else (),
                         num_virtual_tokens=int(entity.get("num_virtual_tokens") or 20))
    f = flops_per_token(counts, float(entity.get("model_max_length") or 0)) if counts else None
    missing = None if f else ("no architecture known for " + str(entity.get("model_name")) if arch is None
                              else "no parameter formula for its architecture")
    return Compute(f[0] if f else None, dtype, peak, peak_source, missing)


def check_time_limit(sweep: Sweep, inventory: Inventory, partition: Partition) -> None:
    """``slurm.time`` within the partition's ``time_limit`` (SLURM's MaxTime, as the inventory records it): a
    longer request is refused by sbatch, or (``EnforcePartLimits=NO``, SLURM's default) pends for ever with the
    reason ``PartitionTimeLimit``. Refused here, exit 2, naming both keys."""
    asked, limit = sweep.slurm.time, partition.time_limit
    if asked and limit and slurm_time_key(asked) > slurm_time_key(limit):
        raise SweepError(
            f"{sweep.source}: slurm.time: {asked} is longer than partition {partition.name!r} allows: time_limit "
            f"{limit} ({inventory.source}: partitions.{partition.name}.time_limit); SLURM would refuse its jobs or "
            f"keep them pending for ever (PartitionTimeLimit). Ask for at most {limit}, or correct the inventory's "
            "time_limit if the partition allows more")


def check_profile(sweep: Sweep, points: list[PlannedPoint]) -> None:
    """``runner.profile`` must name steps and ranks each valid point has: a step past its ``max_steps`` or a
    rank past its processes would add a profiled repeat that profiles nothing (refused, exit 2, naming the key)."""
    rs = sweep.runner
    if not rs.profiled:
        return
    for p in points:
        if not p.valid or p.repeat != 0:
            continue
        max_steps = int(p.entity.get("max_steps") or -1)
        if max_steps > 0 and rs.profile_end > max_steps:
            raise SweepError(
                f"{sweep.source}: runner.profile.steps: [{rs.profile_start}, {rs.profile_end}] goes past max_steps: "
                f"{max_steps} of point {p.point_id}, so its profiled repeat would profile "
                f"{'nothing' if rs.profile_start > max_steps else 'fewer steps than asked'}; profile steps within "
                f"it (for example steps: [{max(1, min(rs.profile_start, max_steps - 1))}, {max_steps}]) or raise "
                "max_steps")
        processes = point_counts(p.entity).processes
        beyond = [r for r in rs.profile_rank_list() if r >= processes]
        if beyond:
            raise SweepError(
                f"{sweep.source}: runner.profile.ranks: {beyond} is past the {processes} process(es) of point "
                f"{p.point_id} (global ranks 0 to {processes - 1}), so no trace would be written for "
                f"{'it' if len(beyond) == 1 else 'them'}; name ranks below {processes}, for example ranks: [0]")


def plan_warnings(sweep: Sweep, inventory: Inventory, points: list[PlannedPoint]) -> list[str]:
    """What a user should read before these points run: the inventory's warnings for their partitions, and
    each point's warning once per cause, with how many runs it concerns. ``plan`` and ``submit`` both show
    them."""
    parts = {p.partition for p in points} or {inventory.partition(sweep.partition).name}
    out = list(inventory.warnings_for(parts))
    if sweep.search and "cost_per_million_tokens" in sweep.search.metrics:
        unpriced = sorted(n for n in parts if inventory.partition(n).price_per_gpu_hour is None)
        if unpriced:
            out.append(f"search.goal names cost_per_million_tokens, but partition(s) {', '.join(unpriced)} have no "
                       "price_per_gpu_hour in the inventory: their points have no cost, and none is cut on it")
    return out + counted_warnings(w for p in points for w in p.warnings)


def counted_warnings(warnings: Iterable[str]) -> list[str]:
    """Each warning once, in the order first seen, with how many runs it concerns."""
    changes: dict[str, int] = {}
    for w in warnings:
        changes[w] = changes.get(w, 0) + 1
    return [f"{w} ({runs} run(s))" for w, runs in changes.items()]
