"""How much of a node one point asks for: its nodes, devices and training processes (:func:`point_counts`, the
one place they are counted), its share of the devices, cores and memory, and whether it owns its nodes.

``plan`` checks that a point fits its partition with these and shows the share, ``memory`` predicts per process
with them, and ``build`` renders the same numbers as sbatch options (``--nodes``, ``--gpus-per-node``,
``--cpus-per-task``, ``--mem``, ``--exclusive``), the launch's process counts and ``OMP_NUM_THREADS``.

Isolation by default: a point that uses whole nodes is ``--exclusive`` on every partition (no other
job shares its nodes, whatever cores and memory SLURM knows of beyond the inventory's), and so is a
multi-node RoCE point or any point of an ``exclusive`` partition. A partial-node point shares its node
and says so. The sweep's ``slurm.exclusive`` decides for all of its points: ``true`` makes partial-node
points exclusive too, ``false`` lets every point share (a whole-node point then asks for the inventory's
memory instead of ``--mem=0``, so that SLURM can place another job beside it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from .inventory import Partition

MIN_CPUS = 2  # the reference's floor of CPU cores for one task


MEM_RESERVE = 0.05  # of a partial node's memory share, left to the OS and other jobs' daemons


MB_PER_GB = 1000  # inventory GB -> SLURM MB, rounding down: SLURM's RealMemory is often a little below spec


@dataclass(frozen=True)
class Counts:
    """How many nodes, devices and training processes one point asks for.

    A point without devices (``number_gpus: 0``) still trains: one process, on a CPU, asking SLURM for no GPU.
    When ``number_gpus`` is not a multiple of ``number_nodes`` (the point is invalid, rule 2), a node holds at
    most :attr:`devices_per_node` of them."""

    nodes: int  # number_nodes, at least 1
    devices: int  # number_gpus: GPUs in all, or CPU worker processes on a CPU partition; 0 asks for none
    devices_per_node: int  # the most devices one node holds: devices / nodes, rounded up; 0 without devices
    processes: int  # training processes in all: one per device, one without devices
    processes_per_node: int  # training processes on each node: processes / nodes, at least 1

    @property
    def single(self) -> bool:
        """One training process: the trainer runs directly, with no distributed backend."""
        return self.processes <= 1


def point_counts(entity: Mapping[str, Any]) -> Counts:
    """The counts of a point's resolved *entity* (its ``number_nodes`` and ``number_gpus``)."""
    nodes = max(1, int(entity.get("number_nodes") or 1))
    devices = max(0, int(entity.get("number_gpus") or 0))
    processes = max(1, devices)
    return Counts(nodes=nodes, devices=devices, devices_per_node=-(-devices // nodes), processes=processes,
                  processes_per_node=max(1, processes // nodes))


def per_device_batch(entity: Mapping[str, Any]) -> int:
    """A point's per-device batch size: its ``batch_size`` (the whole step's) over its training processes."""
    return int(entity.get("batch_size") or 0) // point_counts(entity).processes


def node_share(part: Partition, per_node: int) -> float:
    """The fraction of a node one point uses: its devices (CPU workers) over the node's."""
    if part.gpus_per_node <= 0:
        return 1.0
    return min(1.0, max(per_node, 1) / part.gpus_per_node)


def whole_node(part: Partition, per_node: int) -> bool:
    return node_share(part, per_node) >= 1.0


def cpus_per_task(part: Partition, per_node: int) -> int:
    """One task per node gets the node's cores, or its share of them for a partial node (at least 2):
    the ranks and the node's sampler run inside that task, so it must not be a slice of 2 per GPU."""
    return max(MIN_CPUS, int(part.cpus_per_node * node_share(part, per_node)))


def threads_per_rank(part: Partition, per_node: int) -> int:
    """OMP_NUM_THREADS when the inventory does not set it: the task's cores over its ranks."""
    return max(1, cpus_per_task(part, per_node) // max(per_node, 1))


def memory_request(part: Partition, per_node: int, override_gb: float | None, exclusive: bool = True) -> str:
    """``--mem``: the sweep's ``slurm.mem_gb`` when given; ``0`` (all of the node's memory) for a whole
    node it owns (*exclusive*); else the point's share of the node less a reserve, in MB. Never the
    spec-sheet figure in G: SLURM counts 1G as 1024 MB, so ``memory_gb: 1000`` as ``1000G`` exceeds a
    RealMemory=1000000 node."""
    if override_gb:
        return f"{max(1, math.floor(override_gb * MB_PER_GB))}M"
    if whole_node(part, per_node) and exclusive:
        return "0"
    share = part.memory_gb * MB_PER_GB * node_share(part, per_node) * (1 - MEM_RESERVE)
    return f"{max(1, math.floor(share))}M"


def exclusive(part: Partition, per_node: int, nodes: int, roce: bool, sweep_exclusive: bool | None) -> tuple[bool, str]:
    """Whether a point owns its nodes (``--exclusive``), and why: the sweep's ``slurm.exclusive`` when
    set; else a whole node, an ``exclusive`` partition or a multi-node RoCE point owns its nodes."""
    if sweep_exclusive is not None:
        return sweep_exclusive, f"slurm.exclusive: {str(sweep_exclusive).lower()}"
    if whole_node(part, per_node):
        return True, "whole node"
    if part.exclusive:
        return True, f"partition {part.name} is exclusive"
    if roce and nodes > 1:
        return True, "multi-node RoCE"
    return False, "partial node"


@dataclass(frozen=True)
class Share:
    """A point's share of each of its nodes, as render asks SLURM for it (spec.json's ``node_share``)."""

    fraction: float  # of one node: its devices over the node's
    devices: int  # per node: GPUs, or CPU worker processes on a CPU partition
    node_devices: int  # the inventory's gpus_per_node
    cpus: int  # --cpus-per-task (one task per node)
    node_cpus: int  # the inventory's cpus_per_node
    mem: str  # --mem ("0": all of the node's memory)
    exclusive: bool  # --exclusive: no other job on its nodes
    why: str  # what decided exclusive (see :func:`exclusive`)
    device_word: str = "GPU"

    @property
    def text(self) -> str:
        """``whole node, exclusive`` or ``1/2 node (1 of 2 workers, 48 of 96 cores, 7600M), shared``."""
        how = "exclusive" if self.exclusive else "shared"
        if self.why.startswith("slurm.exclusive"):
            how += f" ({self.why})"
        if self.fraction >= 1.0:
            return f"whole node, {how}"
        part = Fraction(self.fraction).limit_denominator(1024)
        mem = "" if self.mem == "0" else f", {self.mem}"
        return (f"{part.numerator}/{part.denominator} node ({self.devices} of {self.node_devices} "
                f"{self.device_word}s, {self.cpus} of {self.node_cpus} cores{mem}), {how}")

    @property
    def short(self) -> str:
        """``whole, exclusive`` or ``1/2, shared``: plan's column."""
        part = Fraction(self.fraction).limit_denominator(1024)
        size = "whole" if self.fraction >= 1.0 else f"{part.numerator}/{part.denominator}"
        return f"{size}, {'exclusive' if self.exclusive else 'shared'}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text}


def point_share(part: Partition, entity: Mapping[str, Any], sweep_exclusive: bool | None,
                mem_gb: float | None) -> Share:
    """The share of each node one point (its resolved *entity*) asks for on *part*."""
    counts = point_counts(entity)
    per_node = counts.devices_per_node
    excl, why = exclusive(part, per_node, counts.nodes, bool(entity.get("enable_roce")), sweep_exclusive)
    return Share(fraction=node_share(part, per_node), devices=per_node, node_devices=part.gpus_per_node,
                 cpus=cpus_per_task(part, per_node), node_cpus=part.cpus_per_node,
                 mem=memory_request(part, per_node, mem_gb, excl), exclusive=excl, why=why,
                 device_word="worker" if part.is_cpu else "GPU")
