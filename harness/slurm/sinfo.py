"""What ``sinfo`` says about a partition's nodes, read, and which requests do not fit them.

:mod:`harness.slurm.client` asks; ``harness.cluster.fit`` uses the answer to keep allocations on
inventory hosts and to name the rendered requests that do not fit the nodes as SLURM configured them
(cores, memory, GPUs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .hostlist import expand_hostlist

# node name, CPUs, RealMemory (MB), Gres, the partition's time limit (MaxTime) and job size in nodes (MinNodes-MaxNodes)
SINFO_FORMAT = "%N|%c|%m|%G|%l|%s"


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpus: int | None
    memory_mb: int | None
    gpus: int | None
    time_limit: str | None = None  # its partition's MaxTime as sinfo words it (``1-00:00:00``, ``30:00``, infinite)
    max_nodes: int | None = None  # its partition's MaxNodes, the most nodes one job may have (None: no limit)


def _gpus(gres: str) -> int | None:
    """``gpu:8``, ``gpu:h100:8(S:0-1)``, ``gpu:a100:4,nic:2`` -> the GPU count; ``(null)`` -> 0."""
    total, seen = 0, False
    for part in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", part.strip())
        if m:
            total += int(m.group(1))
            seen = True
    return total if seen else (0 if gres.strip() in ("(null)", "") else None)


def _int(text: str) -> int | None:
    try:
        return int(text.strip().rstrip("+"))
    except ValueError:
        return None


def parse_sinfo(text: str) -> dict[str, NodeInfo]:
    nodes: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) not in (4, 5, 6) or not parts[0]:
            continue
        limit = (parts[4].strip() or None) if len(parts) >= 5 else None
        most = _int(parts[5].rpartition("-")[2]) if len(parts) == 6 else None  # "1-4"; "1-infinite": no limit
        for name in expand_hostlist(parts[0]):
            nodes[name] = NodeInfo(name, _int(parts[1]), _int(parts[2]), _gpus(parts[3]), limit, most)
    return nodes


def sinfo_argv(slurm_partition: str) -> list[str]:
    """The question about a partition: one line per node."""
    return ["sinfo", "-h", "-N", "-p", slurm_partition, "-o", SINFO_FORMAT]


def mem_mb(request: str) -> float | None:
    """``--mem`` as rendered (``0``, ``1234M``, ``10G``) in MB; None for 0 (the whole node)."""
    m = re.fullmatch(r"(\d+)([KMGT]?)", request)
    if not m or m.group(1) == "0":
        return None
    return int(m.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}[m.group(2)]


def misfits(hosts: Sequence[str], nodes: dict[str, NodeInfo], resources: dict, slurm_partition: str) -> list[str]:
    """What of one point's request does not fit the inventory hosts as SLURM configured them."""
    out = []
    missing = [h for h in hosts if h not in nodes]
    if missing:
        out.append(f"inventory hosts {', '.join(missing)} are not nodes of SLURM partition {slurm_partition!r}")
    for h in hosts:
        n = nodes.get(h)
        if n is None:
            continue
        cpus = resources.get("cpus_per_task")
        if n.cpus is not None and isinstance(cpus, int) and cpus > n.cpus:
            out.append(f"{h}: --cpus-per-task={cpus} but SLURM gives the node {n.cpus} CPUs (fix cpus_per_node)")
        want = mem_mb(str(resources.get("mem", "0")))
        if n.memory_mb is not None and want is not None and want > n.memory_mb:
            out.append(f"{h}: --mem={resources['mem']} but the node's RealMemory is {n.memory_mb} MB "
                       "(fix memory_gb or slurm.mem_gb)")
        gpus = resources.get("gpus_per_node")
        if n.gpus is not None and isinstance(gpus, int) and gpus > n.gpus:
            out.append(f"{h}: --gpus-per-node={gpus} but the node has {n.gpus} GPUs in its Gres (fix gpus_per_node)")
    return out
