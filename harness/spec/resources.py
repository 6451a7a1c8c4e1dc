"""How much of a node one point asks for: its share of the devices, cores and memory.

``plan`` checks that a point fits its partition with these, and ``build`` renders the same numbers
as sbatch options (``--cpus-per-task``, ``--mem``) and ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import math

from .inventory import Partition

MIN_CPUS = 2  # the reference's floor of CPU cores for one task


MEM_RESERVE = 0.05  # of a partial node's memory share, left to the OS and other jobs' daemons


MB_PER_GB = 1000  # inventory GB -> SLURM MB, rounding down: SLURM's RealMemory is often a little below spec


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


def memory_request(part: Partition, per_node: int, override_gb: float | None) -> str:
    """``--mem``: the sweep's ``slurm.mem_gb`` when given; ``0`` (all of the node's memory) for a whole
    node; else the point's share of the node less a reserve, in MB. Never the spec-sheet figure in G:
    SLURM counts 1G as 1024 MB, so ``memory_gb: 1000`` as ``1000G`` exceeds a RealMemory=1000000 node."""
    if override_gb:
        return f"{max(1, math.floor(override_gb * MB_PER_GB))}M"
    if whole_node(part, per_node):
        return "0"
    share = part.memory_gb * MB_PER_GB * node_share(part, per_node) * (1 - MEM_RESERVE)
    return f"{max(1, math.floor(share))}M"
