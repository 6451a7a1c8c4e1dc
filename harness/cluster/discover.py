"""``sbench inventory discover``: an inventory written from what SLURM and the nodes say.

SLURM is asked once each: ``sinfo`` (the partitions, their nodes and time limits) and ``scontrol show node``
(each node's CPUs, memory, GRES, features, address, state). With ``--on slurm`` the node probe
(:mod:`harness.runner.probe`: GPUs through NVML, HCAs, their ports, link layers and GID tables) runs on every
usable node through ``srun``, one task per node, one allocation per partition, each node probed once
(:func:`harness.cluster.probe.probe_hosts`). :func:`render` writes a complete, commented inventory that
``sbench inventory check`` accepts as it is: each partition's figures (the smallest node's CPUs and memory, the
GPUs NVML sees, else SLURM's GRES), each host with its address and RoCE ports (the active Ethernet ports' RoCE v2
IPv4 GID index), a comment with what SLURM and the probe say of it, and a comment on every host that differs
from the rest of its partition. :func:`changes` says what moved since an earlier inventory (``--against``).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError
from harness.slurm.client import Slurm
from harness.slurm.nodes import SlurmNode, SlurmPartition
from harness.spec.inventory import CPU_MODEL, Inventory, gpu_label
from harness.spec.schema import SLURM_TIME

from .probe import probe_hosts, roce_block


def _names(nodes: list[str] | tuple[str, ...], most: int = 8) -> str:
    return ",".join(nodes[:most]) + (f",... ({len(nodes)} in all)" if len(nodes) > most else "")


MB_PER_GB = 1000  # inventory GB as sbench requests it from SLURM: 1 GB = 1000 MB


@dataclass
class Discovered:
    cluster: str
    partitions: dict[str, SlurmPartition]
    nodes: dict[str, SlurmNode]
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> its probe
    not_probed: dict[str, str] = field(default_factory=dict)  # node -> why not
    probed: bool = False  # --on slurm


def discover(slurm: Slurm, partitions: list[str], probe: bool, workdir: Path) -> Discovered:
    """Ask SLURM (once each) and, with *probe*, probe every usable node of the chosen partitions."""
    parts, nodes = slurm.cluster_nodes()
    unknown = [p for p in partitions if p not in parts]
    if unknown:
        raise InputError(f"--partition {', '.join(unknown)}: SLURM has no such partition; it has "
                         f"{', '.join(sorted(parts)) or 'none'}")
    chosen = {p: parts[p] for p in (partitions or sorted(parts))}
    d = Discovered(cluster=slurm.config().get("ClusterName") or "cluster", partitions=chosen, nodes=nodes,
                   probed=probe)
    if not probe:
        return d
    for name, part in chosen.items():
        todo = []
        for n in part.nodes:
            node = nodes.get(n)
            if n in d.probes or n in d.not_probed:
                continue
            if node is None or not node.usable:
                d.not_probed[n] = f"state {node.state if node else 'unknown to scontrol'}"
            else:
                todo.append(n)
        if todo:
            got = probe_hosts(todo, name, sys.executable, workdir, slurm=slurm)
            d.probes.update(got)
            d.not_probed.update({n: "the probe wrote nothing" for n in todo if n not in got})
    return d


# -- the partition from its nodes -------------------------------------------------------------------------------

def _most(values: list[Any]) -> Any:
    """The most common value (the first seen on a tie)."""
    return Counter(values).most_common(1)[0][0] if values else None


def _gpus(probe: dict[str, Any] | None) -> tuple[str | None, int]:
    gpus = (probe or {}).get("gpus") or []
    return (gpu_label(gpus[0]["name"]) if gpus else None), int((probe or {}).get("gpu_count") or len(gpus))


def _facts(node: SlurmNode, probe: dict[str, Any] | None) -> dict[str, Any]:
    """What a host's comparison with its partition looks at."""
    model, count = _gpus(probe)
    roce = roce_block(probe)
    return {"CPUs": node.cpus, "memory MB": node.memory_mb, "GRES": node.gres,
            "features": ",".join(node.features) or "(none)",
            **({"GPUs (NVML)": f"{count} x {model}" if count else "none"} if probe is not None else {}),
            **({"RoCE HCAs": " ".join(roce["hcas"]) if roce else "none",
                "gid_index": roce["gid_index"] if roce else None} if probe is not None else {})}


@dataclass
class PartitionDoc:
    doc: dict[str, Any]  # the inventory's partition block
    notes: dict[str, str]  # key of doc -> the comment that says where its value came from
    host_notes: dict[str, list[str]]  # host -> its comment lines
    left_out: list[str] = field(default_factory=list)  # a comment line per node left out (not probed)


def partition_doc(d: Discovered, name: str) -> PartitionDoc:
    part = d.partitions[name]
    every = [d.nodes[n] for n in part.nodes if n in d.nodes]
    if not every:
        raise InputError(f"partition {name}: scontrol shows none of its nodes ({_names(part.nodes)})")
    probes = {n.name: d.probes[n.name] for n in every if n.name in d.probes}
    # A node the probe could not reach (down, drained) is left out, named in a comment: its RoCE ports are
    # unknown, and a RoCE point needs them on every host. Without any probe, SLURM's word is all there is.
    nodes = [n for n in every if n.name in probes] if probes else every
    left_out = [n for n in every if n not in nodes]
    notes: dict[str, str] = {}
    seen = [_gpus(p) for p in probes.values()]
    gres_gpus = _most([n.gpus or 0 for n in nodes])
    if seen and any(c for _, c in seen):
        model, per_node = _most([s for s in seen if s[1]])
        notes["gpu_model"] = f"NVML on {sum(1 for s in seen if s == (model, per_node))} of {len(seen)} probed node(s)"
    elif seen:
        model, per_node = CPU_MODEL, max(1, min(int(p.get("cores") or 1) for p in probes.values()))
        notes["gpu_model"] = ("NVML sees no GPU" + (f" although SLURM's GRES says gpu:{gres_gpus}" if gres_gpus else "")
                              + ": a CPU partition")
        notes["gpus_per_node"] = "worker processes: one per core the probe found"
    elif gres_gpus:
        model = _most([n.gpu_type for n in nodes]) or "unknown-gpu"
        per_node = gres_gpus
        notes["gpu_model"] = "SLURM's GRES type (not probed: --on slurm asks NVML); set the product name"
    else:
        model, per_node = CPU_MODEL, 1
        notes["gpu_model"] = "no GPU GRES (not probed)"
        notes["gpus_per_node"] = "worker processes (not probed: --on slurm counts the cores)"
    cpus = min(n.cpus or 1 for n in nodes)
    mem_gb = max(1, min(n.memory_mb or MB_PER_GB for n in nodes) // MB_PER_GB)
    notes["cpus_per_node"] = "SLURM's CPUs of the smallest node"
    notes["memory_gb"] = "SLURM's RealMemory of the smallest node, 1 GB = 1000 MB"
    doc: dict[str, Any] = {"gpu_model": model, "gpus_per_node": per_node, "cpus_per_node": cpus,
                           "memory_gb": mem_gb}
    if part.time_limit and SLURM_TIME.fullmatch(part.time_limit) and part.time_limit.lower() not in (
            "infinite", "unlimited"):
        doc["time_limit"] = part.time_limit
    facts = {n.name: _facts(n, probes.get(n.name)) for n in nodes}
    usual = {k: _most([f.get(k) for f in facts.values() if k in f]) for k in {k for f in facts.values() for k in f}}
    hosts: dict[str, Any] = {}
    host_notes: dict[str, list[str]] = {}
    for n in nodes:
        entry: dict[str, Any] = {}
        if n.address and n.address != n.name:
            entry["address"] = n.address
        roce = roce_block(probes.get(n.name))
        if roce:
            entry["roce"] = roce
        hosts[n.name] = entry
        said = [f"{n.name}: SLURM {n.cpus} CPUs, {n.memory_mb} MB, GRES {n.gres}, features "
                f"{','.join(n.features) or '(none)'}, state {n.state}"]
        pr = probes.get(n.name)
        if pr is not None:
            m, c = _gpus(pr)
            ports = [f"{h['name']}:{p['port']} {(p.get('state') or '?').split(':')[-1].strip()} {p.get('link_layer')}"
                     for h in pr.get("hcas") or [] for p in h["ports"]]
            said.append(f"probe: {c} GPU(s){f' {m}' if m else ''}, {pr.get('cores')} cores, HCA ports: "
                        f"{', '.join(ports) or 'none'}")
        elif d.probed:
            said.append(f"not probed: {d.not_probed.get(n.name, 'unknown')}")
        odd = [f"{k} {facts[n.name][k]} (the others: {usual[k]})" for k in facts[n.name]
               if facts[n.name][k] != usual[k]]
        if odd and len(nodes) > 1:
            said.append(f"DIFFERS from the rest of partition {name}: {'; '.join(odd)}")
        host_notes[n.name] = said
    doc["hosts"] = hosts
    return PartitionDoc(doc, notes, host_notes, [f"{n.name} left out (not probed: {d.not_probed.get(n.name)}): "
                                                 f"SLURM {n.cpus} CPUs, {n.memory_mb} MB, GRES {n.gres}"
                                                 for n in left_out])


# -- the text -------------------------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}


def _key(k: str) -> str:
    return k if _PLAIN.fullmatch(k) and k.lower() not in _YAML_WORDS else json.dumps(k)


def _value(v: Any) -> str:
    return json.dumps(v)  # JSON is YAML: strings quoted, lists in flow style


def render(d: Discovered, now: _dt.datetime | None = None) -> str:
    """The inventory as commented YAML (every value written as JSON, which YAML reads as it is)."""
    when = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%d %H:%M:%S UTC")
    how = "probes through srun (GPUs by NVML, HCAs and GID tables)" if d.probed else "no probe (--on none)"
    lines = [f"# sbench inventory discover, {when}: from sinfo and scontrol show node, and {how}.",
             "# Check it with: sbench inventory check -i THIS_FILE", f"cluster: {_value(d.cluster)}", "partitions:"]
    for name in d.partitions:
        pd = partition_doc(d, name)
        part = d.partitions[name]
        lines.append(f"  # SLURM partition {name}: {len(part.nodes)} node(s) {_names(part.nodes)}, "
                     f"time limit {part.time_limit or '?'}")
        lines.append(f"  {_key(name)}:")
        for k, v in pd.doc.items():
            if k == "hosts":
                continue
            note = f"  # {pd.notes[k]}" if k in pd.notes else ""
            lines.append(f"    {k}: {_value(v)}{note}")
        lines.append("    hosts:")
        lines += [f"      # {x}" for x in pd.left_out]
        for h, entry in pd.doc["hosts"].items():
            lines += [f"      # {x}" for x in pd.host_notes.get(h, [])]
            if not entry:
                lines.append(f"      {_key(h)}: {{}}")
                continue
            lines.append(f"      {_key(h)}:")
            for k, v in entry.items():
                lines.append(f"        {k}: {_value(v)}")
    return "\n".join(lines) + "\n"


def changes(old: Inventory, d: Discovered) -> list[str]:
    """What changed since *old* (``--against``): partitions and hosts gone or new, partition figures that moved,
    and on the probed hosts RoCE ports gone or down and GID indices that moved."""
    out: list[str] = []
    for name in sorted(set(old.partitions) - set(d.partitions)):
        out.append(f"partition {name}: gone (SLURM does not list it, or --partition left it out)")
    for name in d.partitions:
        new = partition_doc(d, name).doc
        if name not in old.partitions:
            out.append(f"partition {name}: new ({len(new['hosts'])} host(s))")
            continue
        was = old.partitions[name]
        for key, before in (("gpu_model", was.gpu_model), ("gpus_per_node", was.gpus_per_node),
                            ("cpus_per_node", was.cpus_per_node), ("memory_gb", was.memory_gb)):
            if str(new[key]) != str(before) and not (isinstance(before, float) and before == new[key]):
                out.append(f"partition {name}: {key} {before} -> {new[key]}")
        for h in sorted(set(was.hosts) - set(new["hosts"])):
            out.append(f"{name}/{h}: host gone (not in SLURM's partition)")
        for h in sorted(set(new["hosts"]) - set(was.hosts)):
            out.append(f"{name}/{h}: new host")
        for h in sorted(set(was.hosts) & set(new["hosts"])):
            out += _host_changes(name, h, was.hosts[h].roce, d)
    return out


def _host_changes(part: str, host: str, roce: Any, d: Discovered) -> list[str]:
    probe = d.probes.get(host)
    if roce is None or probe is None:
        return []
    out = []
    ports = {f"{h['name']}:{p['port']}": p for h in probe.get("hcas") or [] for p in h["ports"]}
    for hca in roce.hcas:
        port = ports.get(hca)
        if port is None:
            out.append(f"{part}/{host}: HCA {hca} gone (the node has {', '.join(sorted(ports)) or 'no RDMA port'})")
        elif "ACTIVE" not in (port.get("state") or ""):
            out.append(f"{part}/{host}: HCA {hca} down ({port.get('state') or 'state unknown'})")
    now = roce_block(probe)
    if now is not None and now["gid_index"] != roce.gid_index:
        out.append(f"{part}/{host}: RoCE v2 IPv4 GID index moved {roce.gid_index} -> {now['gid_index']}")
    elif now is None and roce.hcas and not out:
        out.append(f"{part}/{host}: no active RoCE v2 port left (the inventory has {', '.join(roce.hcas)})")
    return out
