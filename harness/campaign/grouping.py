"""Which points share an allocation under ``slurm.pack`` (:mod:`harness.campaign.executors.pack` runs them):
pure functions of the points' JobSpecs, with nothing of the database or the scheduler, so ``plan`` and
``render`` show the packs without loading either."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.build.jobspec import JobSpec
from harness.build.trainargs import pack_in_one_process
from harness.spec.schema import slurm_time_minutes
from harness.spec.sweep import PACK_AUTO

AUTO_MAX = 8  # points per allocation with slurm.pack: auto

def pack_key(spec: JobSpec) -> tuple[Any, ...]:
    """What points must share to share an allocation: resource shape, model, trainer, dtype (and method,
    workload, launcher); None-free so it sorts."""
    e = spec.entity
    return (spec.shape(), str(e.get("model_name")), spec.trainer, str(e.get("torch_dtype")), bool(e.get("bf16")),
            bool(e.get("fp16")), str(spec.compute_dtype), spec.method, spec.workload, spec.launcher, spec.dataset_id,
            spec.model_source, spec.python, spec.trainer_python or "")


def batch_size(spec: JobSpec) -> int:
    try:
        return int(spec.entity.get("batch_size") or 0)
    except (TypeError, ValueError):
        return 0


def packable(spec: JobSpec) -> bool:
    """The stability experiment runs trials in its own allocation; fabric jobs are not points."""
    return spec.trials <= 1 and spec.workload in ("train", "idle")


def in_process(spec: JobSpec) -> bool:
    """Whether a pack of *spec*'s points runs in one training process (the node runner's rule)."""
    return pack_in_one_process(spec.trainer, spec.workload, spec.trials)


def pack_size(pack: int | str, spec: JobSpec, time_limit: str | None) -> int:
    """How many points of *spec*'s group one allocation holds: N; with ``auto`` as many as the partition's
    time limit holds at the points' own limits, at most :data:`AUTO_MAX` (and :data:`AUTO_MAX` when one point
    alone asks for the partition's whole limit, as it does when the sweep sets no ``slurm.time``: the pack's
    limit is then the partition's)."""
    if pack != PACK_AUTO:
        return max(1, int(pack))
    point = slurm_time_minutes(str(spec.resources.get("time") or ""))
    limit = slurm_time_minutes(time_limit) if time_limit else None
    if point is None or point <= 0 or limit is None or limit < 2 * point:
        return AUTO_MAX
    return min(AUTO_MAX, int(limit // point))


def make_packs(specs: Sequence[JobSpec], pack: int | str, time_limit: str | None = None) -> list[list[JobSpec]]:
    """*specs* in packs: each a list of points that share one allocation, in ascending batch size (then point
    id and repeat); a point that packs with nothing is a pack of one. Groups keep their first point's order."""
    if pack == 1:
        return [[s] for s in specs]
    groups: dict[tuple[Any, ...], list[JobSpec]] = {}
    alone: list[list[JobSpec]] = []
    for s in specs:
        if packable(s):
            groups.setdefault(pack_key(s), []).append(s)
        else:
            alone.append([s])
    out: list[list[JobSpec]] = []
    for members in groups.values():
        members = sorted(members, key=lambda s: (batch_size(s), s.point_id, s.repeat, s.attempt))
        n = pack_size(pack, members[0], time_limit)
        out += [members[i:i + n] for i in range(0, len(members), n)]
    return out + alone


def pack_labels(packs: Sequence[Sequence[JobSpec]]) -> dict[tuple[str, int], str]:
    """Where each point goes, as ``plan`` and ``render`` show it: ``pack 2, 1 of 3`` for a point that shares
    an allocation, ``alone`` for one that does not (``(point_id, repeat)`` -> text)."""
    out: dict[tuple[str, int], str] = {}
    shared = 0
    for members in packs:
        if len(members) > 1:
            shared += 1
        for i, s in enumerate(members):
            out[(s.point_id, s.repeat)] = f"pack {shared}, {i + 1} of {len(members)}" if len(members) > 1 else "alone"
    return out
