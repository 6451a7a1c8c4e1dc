"""``sbench probe``: what each node really has, compared with the inventory.

On each node, :mod:`harness.runner.probe` reads what the node has (GPUs, RDMA devices and their GID
tables, memlock, cores, memory). :func:`compare` turns the differences from the inventory into lines that
each say the fix; :func:`fragment` writes an inventory fragment from what was found. With ``--on slurm``
the scheduler client runs it with ``srun``, one task per inventory host.

``python -m harness.runner.probe --out-dir DIR`` is what runs on each node (one task per inventory host with
``--on slurm``); it writes ``DIR/probe.<node>.json``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from harness.contract import envvars, safefile
from harness.contract.errors import InputError, RunnerError
from harness.contract.paths import package_dir
from harness.runner.probe import probe_node
from harness.slurm.client import Slurm
from harness.spec.inventory import CPU_MODEL, Host, Inventory, Partition, gpu_label


def roce_v2_ipv4(port: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in port.get("gids") or [] if (g.get("type") or "").lower() == "roce v2" and g.get("ipv4")]


def roce_ports(probe: dict[str, Any] | None, active: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """The host's RoCE ports from its probe, as ``("mlx5_0:1", port)``: Ethernet ports with a RoCE v2 IPv4 GID
    (and, with *active*, in state ACTIVE)."""
    return [(f"{d['name']}:{p['port']}", p) for d in (probe or {}).get("hcas") or [] for p in d["ports"]
            if (p.get("link_layer") or "").lower() == "ethernet" and roce_v2_ipv4(p)
            and (not active or "ACTIVE" in (p.get("state") or ""))]


def roce_block(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    """The inventory's ``roce:`` block a host's probe proposes (``probe --write``, ``discover``): its active RoCE
    ports, the first one's RoCE v2 IPv4 GID index and network interface; None without one."""
    ports = roce_ports(probe)
    if not ports:
        return None
    first = roce_v2_ipv4(ports[0][1])[0]
    ifname = next((g.get("ndev") for _, p in ports for g in roce_v2_ipv4(p)[:1] if g.get("ndev")), None)
    return {"hcas": [name for name, _ in ports], "gid_index": first["index"],
            **({"socket_ifname": ifname} if ifname else {})}


SLOW_DNS_S = 1.0  # a reverse lookup slower than this holds up every rendezvous


def _hca_port(probe: dict[str, Any], hca: str) -> dict[str, Any] | None:
    dev, _, port = hca.partition(":")
    for d in probe.get("hcas") or []:
        if d["name"] == dev:
            for p in d["ports"]:
                if str(p["port"]) == port:
                    return p
    return None


def devices(part: Partition | None, probe: dict[str, Any]) -> tuple[str, int]:
    """(gpu_model, gpus_per_node) for a node from its probe: what ``compare`` advises and ``fragment``
    writes, so the two never disagree. The node's GPUs when NVML sees any; else a CPU partition with the
    inventory's worker processes when it already is one, or one worker per core."""
    gpus = probe.get("gpus") or []
    n = int(probe.get("gpu_count") or len(gpus))
    if n:
        model = gpu_label(gpus[0]["name"]) if gpus else (part.gpu_model if part and not part.is_cpu else "unknown")
        return model, n
    if part is not None and part.is_cpu:
        return CPU_MODEL, part.gpus_per_node
    return CPU_MODEL, max(1, int(probe.get("cores") or 1))


def compare(part: Partition, host: Host, probe: dict[str, Any]) -> list[str]:
    """Each difference between the inventory's word on *host* and what the node has, with its fix."""
    key = f"partitions.{part.name}"
    out: list[str] = []
    n = probe.get("gpu_count") or 0
    model, per_node = devices(part, probe)
    if not part.is_cpu and not n:
        out.append(f"{host.name}: {key} has gpu_model {part.gpu_model} x{part.gpus_per_node}, but NVML sees no GPU "
                   f"(none on the node, or no NVIDIA driver); to benchmark the node's CPU set gpu_model: {model} "
                   f"and gpus_per_node: {per_node} (worker processes), else install the driver")
    elif not part.is_cpu:
        if per_node != part.gpus_per_node:
            out.append(f"{host.name}: {key}.gpus_per_node is {part.gpus_per_node}, NVML sees {n} GPU(s); "
                       f"set gpus_per_node: {per_node}")
        names = {gpu_label(g["name"]) for g in probe.get("gpus") or []}
        if names and part.gpu_model not in names:
            out.append(f"{host.name}: {key}.gpu_model is {part.gpu_model!r}, the node has {', '.join(sorted(names))}; "
                       f"set gpu_model: {model}")
    elif n:
        out.append(f"{host.name}: {key} is a CPU partition but NVML sees {n} GPU(s); set gpu_model to "
                   f"{model} and gpus_per_node: {per_node} to benchmark them")
    cores = probe.get("cores")
    if isinstance(cores, int) and part.cpus_per_node > cores:
        out.append(f"{host.name}: {key}.cpus_per_node is {part.cpus_per_node}, the node has {cores} cores; "
                   f"set cpus_per_node: {cores}")
    mem = probe.get("memory_gb")
    if isinstance(mem, (int, float)) and part.memory_gb > mem:
        out.append(f"{host.name}: {key}.memory_gb is {part.memory_gb:g}, the node has {mem:g} GB; "
                   f"set memory_gb: {int(mem)}")
    dns = probe.get("reverse_dns_s")
    if isinstance(dns, (int, float)) and dns > SLOW_DNS_S:
        out.append(f"{host.name}: a reverse DNS lookup takes {dns:.0f} s (no DNS server answering?); torch's "
                   "rendezvous makes one per peer, so every multi-process start would wait that long. sbench jobs "
                   "cap it with RES_OPTIONS='timeout:1 attempts:2'; make the DNS server reachable from the nodes "
                   "to save even that")
    hkey = f"{key}.hosts.{host.name}.roce"
    if host.roce is None:
        usable = [name for name, _ in roce_ports(probe, active=False)]
        if usable:
            out.append(f"{host.name}: has RoCE ports {', '.join(usable)} but the inventory has no roce: for it; "
                       "sbench probe --write FILE proposes one")
        return out
    for hca in host.roce.hcas:
        port = _hca_port(probe, hca)
        if port is None:
            have = [f"{d['name']}:{p['port']}" for d in probe.get("hcas") or [] for p in d["ports"]]
            out.append(f"{host.name}: {hkey}.hcas names {hca}, which the node does not have "
                       f"(it has {', '.join(have) or 'no RDMA devices'}); fix hcas")
            continue
        if "ACTIVE" not in (port.get("state") or ""):
            out.append(f"{host.name}: {hca} is {port.get('state') or 'in an unknown state'}, not ACTIVE; "
                       "check the cable and the switch port, or drop it from hcas")
        if (port.get("link_layer") or "").lower() != "ethernet":
            out.append(f"{host.name}: {hca} has link layer {port.get('link_layer')}, not Ethernet: that is "
                       "InfiniBand, not RoCE")
        gid = next((g for g in port.get("gids") or [] if g["index"] == host.roce.gid_index), None)
        v2 = roce_v2_ipv4(port)
        if gid is None or gid not in v2:
            what = "is empty" if gid is None else f"is {gid.get('type')} {gid.get('gid')}"
            fix = f"use gid_index: {v2[0]['index']} (RoCE v2, {v2[0]['ipv4']})" if v2 else \
                "the port has no RoCE v2 entry with an IPv4 address"
            out.append(f"{host.name}: {hkey}.gid_index {host.roce.gid_index} on {hca} {what}; {fix}")
    if probe.get("memlock") != "unlimited":
        out.append(f"{host.name}: the memlock limit is {probe.get('memlock')} bytes; RDMA needs it unlimited "
                   "(ulimit -l unlimited, or the limits.conf / slurmd unit of the nodes)")
    return out


def fragment(part_name: str, probes: dict[str, dict[str, Any]], addresses: dict[str, str | None],
             inventory_part: Partition | None = None) -> dict[str, Any]:
    """An inventory partition built from *probes* (host -> probe): what the nodes have (GPUs as
    :func:`devices` says, the same figures ``compare`` advises)."""
    first = next(iter(probes.values()), {})
    model, per_node = devices(inventory_part, first)
    part: dict[str, Any] = {
        "gpu_model": model,
        "gpus_per_node": per_node,
        "cpus_per_node": min(int(p.get("cores") or 1) for p in probes.values()),
        "memory_gb": int(min(float(p.get("memory_gb") or 0) for p in probes.values())),
        "hosts": {},
    }
    for name, pr in sorted(probes.items()):
        entry: dict[str, Any] = {}
        if addresses.get(name):
            entry["address"] = addresses[name]
        roce = roce_block(pr)
        if roce:
            entry["roce"] = roce
        part["hosts"][name] = entry
    return {"partitions": {part_name: part}}


def run_probe(inv: Inventory, partition: str | None, on_slurm: bool, workdir: Path,
              host: str | None = None, slurm: Slurm | None = None) -> dict[str, dict[str, Any]]:
    """Probe the partition's hosts: each through SLURM (one task per host), or this machine as *host*."""
    part = inv.partition(partition)
    if not on_slurm:
        me = local_host(part, host)
        return {me: probe_node(me)}
    return probe_hosts(sorted(part.hosts), part.slurm_partition, part.python or inv.python or sys.executable,
                       workdir, account=part.account, qos=part.qos, slurm=slurm)


def probe_hosts(hosts: list[str], slurm_partition: str, python: str, workdir: Path, *, account: str | None = None,
                qos: str | None = None, slurm: Slurm | None = None) -> dict[str, dict[str, Any]]:
    """Probe *hosts* of a SLURM partition through ``srun``: one allocation, one task on each; host -> its probe
    (a host that wrote nothing is missing)."""
    opts = [f"--partition={slurm_partition}", "--mem=100M", *([f"--account={account}"] if account else []),
            *([f"--qos={qos}"] if qos else [])]
    return on_each_host("probe", hosts, opts, python, [], workdir, slurm)


def local_host(part: Partition, host: str | None) -> str:
    """The inventory host this machine is in *part*: *host* if given, else this node's name by launch.sh's rule
    (:func:`harness.contract.envvars.host`; a partition of one host: that host). An InputError says how to
    name it."""
    me = host or envvars.host()
    if me in part.hosts:
        return me
    if len(part.hosts) == 1 and host is None:
        return next(iter(part.hosts))
    raise InputError(f"this machine ({me}) is not a host of partition {part.name!r} "
                     f"({', '.join(part.hosts)}); pass --host NAME or use --on slurm")


def runner_env() -> dict[str, str]:
    """This environment, with this sbench first on ``PYTHONPATH``: what a process running ``harness.runner.*``
    (through srun, or on this machine) needs to import the same sbench."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_dir().parent),
                                                         os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def on_each_host(kind: str, hosts: list[str], srun_opts: list[str], python: str, args: list[str], workdir: Path,
                 slurm: Slurm | None) -> dict[str, dict[str, Any]]:
    """Run ``python -m harness.runner.<kind> --out-dir D *args*`` once on each of *hosts* (one ``srun``
    allocation, one task per host; *srun_opts*: the partition, account, qos, resources); host -> the
    ``<kind>.<host>.json`` it wrote in D (``workdir/.<kind>/<time>``). A host that wrote nothing is missing;
    none at all is a RunnerError with srun's last words."""
    if shutil.which("srun") is None:
        raise RunnerError("--on slurm: srun is not on PATH; run on a SLURM login node")
    out_dir = (workdir / f".{kind}" / time.strftime("%Y%m%dT%H%M%S")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [*srun_opts, f"--nodes={len(hosts)}", f"--nodelist={','.join(hosts)}", "--ntasks-per-node=1",
            f"--job-name=sbench.{kind}", "--time=00:10:00",
            python, "-m", f"harness.runner.{kind}", "--out-dir", str(out_dir), *args]
    env = runner_env()
    proc = (slurm or Slurm()).srun(argv, env=env, timeout=1800)
    docs = {}
    for h in hosts:
        try:
            docs[h] = safefile.read_json(out_dir / f"{kind}.{h}.json", out_dir, safefile.RUNNER_MAX)
        except (OSError, ValueError):
            continue
    if not docs:
        raise RunnerError(f"{kind} job wrote nothing (srun exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return docs
