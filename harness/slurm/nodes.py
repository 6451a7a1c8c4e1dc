"""What ``scontrol show node`` and ``sinfo`` say about a cluster's nodes and partitions, read (``sbench inventory
discover``). :mod:`harness.slurm.client` asks, once each."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .hostlist import expand_hostlist
from .sinfo import _gpus

# partition, its nodes (a host list), its time limit
PARTITIONS_ARGV = ["sinfo", "-h", "-o", "%R|%N|%l"]
NODES_ARGV = ["scontrol", "show", "node"]
# a node in one of these states cannot run a probe: discover does not ask for it
UNUSABLE_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "POWERED_DOWN", "POWER_DOWN", "UNKNOWN")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str | None
    cpus: int | None
    memory_mb: int | None
    gres: str
    gpus: int | None
    gpu_type: str | None
    features: tuple[str, ...]
    partitions: tuple[str, ...]
    state: str

    @property
    def usable(self) -> bool:
        return not any(s in self.state.upper() for s in UNUSABLE_STATES)


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    nodes: tuple[str, ...]
    time_limit: str | None  # sinfo's word (D-HH:MM:SS, HH:MM:SS or infinite)
    hosts: dict[str, SlurmNode] = field(default_factory=dict)


def _fields(record: str) -> dict[str, str]:
    """``Key=value`` pairs of one record; a word without ``=`` belongs to the value before it (``OS=Linux 6.1
    #1 SMP``)."""
    out: dict[str, str] = {}
    last: str | None = None
    for tok in record.split():
        key, eq, value = tok.partition("=")
        if eq and re.fullmatch(r"[A-Za-z][A-Za-z0-9_/]*", key):
            out[key], last = value, key
        elif last is not None:
            out[last] += " " + tok
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def _gpu_type(gres: str) -> str | None:
    m = re.search(r"(?:^|,)gpu:([^:(,]+):\d+", gres)
    return m.group(1) if m else None


def _list(text: str | None) -> tuple[str, ...]:
    return tuple(x for x in (text or "").split(",") if x and x != "(null)")


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    """``scontrol show node`` (records separated by blank lines, or one per line with ``-o``)."""
    records = [r for r in re.split(r"\n\s*\n|\n(?=NodeName=)", text) if r.strip()]
    out: dict[str, SlurmNode] = {}
    for rec in records:
        f = _fields(rec)
        name = f.get("NodeName")
        if not name:
            continue
        gres = f.get("Gres") or "(null)"
        addr = f.get("NodeAddr")
        out[name] = SlurmNode(name=name, address=addr,
                              cpus=_int(f.get("CPUTot")), memory_mb=_int(f.get("RealMemory")), gres=gres,
                              gpus=_gpus(gres), gpu_type=_gpu_type(gres), features=_list(f.get("AvailableFeatures")),
                              partitions=_list(f.get("Partitions")), state=f.get("State") or "UNKNOWN")
    return out


def parse_partitions(text: str) -> dict[str, SlurmPartition]:
    """``sinfo -h -o '%R|%N|%l'``: each partition's nodes and time limit (a partition on several lines, one per
    node state, is one)."""
    out: dict[str, tuple[list[str], str | None]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0]:
            continue
        nodes, limit = out.setdefault(parts[0], ([], parts[2].strip() if len(parts) > 2 else None))
        for n in expand_hostlist(parts[1].strip()) if parts[1].strip() not in ("", "(null)") else []:
            if n not in nodes:
                nodes.append(n)
    return {p: SlurmPartition(p, tuple(sorted(n)), lim) for p, (n, lim) in out.items()}
