"""The cluster description: partitions, hosts, GPUs, RoCE HCAs and GID indices.

Load it with :func:`load_inventory`. With no path and no ``$SBENCH_INVENTORY``
the built-in ``local`` inventory describes this machine.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from harness.contract import envvars
from harness.contract.errors import InventoryError

from .flops import DTYPES
from .schema import (
    ADDRESS,
    IFNAME,
    SLURM_CONSTRAINT,
    SLURM_CONSTRAINT_TEXT,
    SLURM_NAME,
    SLURM_NAME_TEXT,
    SLURM_TIME,
    SLURM_TIME_TEXT,
    Checker,
    sbatch_extra,
)
from .yamlio import load_yaml

# Every pattern is used with fullmatch: '$' would accept a trailing newline.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HCA = re.compile(r"[A-Za-z0-9_.-]{1,64}:[0-9]{1,3}")
GPU_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,127}")
CPU_MODEL = "cpu"
MAX_GPUS_PER_NODE = 1024
MAX_CPUS_PER_NODE = 1 << 16
MAX_MEMORY_GB = 1 << 20
# The inventory's memory unit (memory_gb, gpu_memory_gb): 1 GB = 10^9 bytes. The memory prediction's budget
# (harness.spec.memory) and the local inventory's figure both convert through it.
BYTES_PER_GB = 1e9
MAX_GID_INDEX = 255

TOP_KEYS = ("cluster", "defaults", "partitions")
DEFAULT_KEYS = ("env", "nccl", "setup", "python", "data_dir", "models_dir", "envs_dir")
PARTITION_KEYS = (
    "slurm_partition", "account", "qos", "constraint", "time_limit", "gpu_model",
    "gpus_per_node", "cpus_per_node", "memory_gb", "setup", "env", "python", "exclusive", "hosts", "slurm_extra",
    "peak_tflops", "gpu_memory_gb", "price_per_gpu_hour",
)
MAX_PEAK_TFLOPS = 1e6
MAX_PRICE_PER_GPU_HOUR = 1e6  # in the team's currency
HOST_KEYS = ("address", "roce", "nccl_topo_file", "env")
ROCE_KEYS = ("hcas", "gid_index", "socket_ifname")


@dataclass(frozen=True)
class Roce:
    hcas: tuple[str, ...]
    gid_index: int
    socket_ifname: str | None = None

    @property
    def nccl_ib_hca(self) -> str:
        """NCCL's exact-match form: ``=mlx5_0,mlx5_3`` (ports dropped; ``=`` stops prefix matching)."""
        return "=" + ",".join(h.split(":", 1)[0] for h in self.hcas)


@dataclass(frozen=True)
class Host:
    name: str
    address: str | None = None
    roce: Roce | None = None
    nccl_topo_file: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Partition:
    name: str
    slurm_partition: str
    gpu_model: str
    gpus_per_node: int
    cpus_per_node: int
    memory_gb: float
    hosts: dict[str, Host]
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_limit: str | None = None
    setup: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    exclusive: bool = False
    slurm_extra: dict[str, Any] = field(default_factory=dict)
    peak_tflops: float | dict[str, float] | None = None  # per device; a number, or per dtype (harness.spec.flops)
    gpu_memory_gb: float | None = None  # one device's memory (harness.spec.memory; default: gpu_memory.yaml)
    # what one device (one worker process on a CPU partition) costs an hour, in the team's currency: a run's
    # cost_per_million_tokens (harness.spec.flops.cost_per_million_tokens)
    price_per_gpu_hour: float | None = None

    @property
    def is_cpu(self) -> bool:
        return self.gpu_model.lower() == CPU_MODEL

    def public(self) -> dict[str, Any]:
        """What the partition is, for others to read (a campaign's record, an export): its hardware and host
        names; never its env, setup lines, interpreter, account or extra sbatch options."""
        return {"slurm_partition": self.slurm_partition, "gpu_model": self.gpu_model,
                "gpus_per_node": self.gpus_per_node, "cpus_per_node": self.cpus_per_node, "memory_gb": self.memory_gb,
                "gpu_memory_gb": self.gpu_memory_gb, "peak_tflops": self.peak_tflops,
                "price_per_gpu_hour": self.price_per_gpu_hour, "hosts": sorted(self.hosts)}


@dataclass(frozen=True)
class Inventory:
    cluster: str
    source: str
    partitions: dict[str, Partition]
    env: dict[str, str] = field(default_factory=dict)
    nccl: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    python: str | None = None
    data_dir: str | None = None
    models_dir: str | None = None
    envs_dir: str | None = None  # where trainer environments (fms-hf-tuning releases) are built, shared
    warnings: tuple[str, ...] = ()  # every warning: the inventory's own and each partition's
    partition_warnings: dict[str, tuple[str, ...]] = field(default_factory=dict)  # partition -> its warnings

    def warnings_for(self, partitions: Any) -> list[str]:
        """The warnings that concern *partitions* (names): theirs, and none about another partition."""
        names = set(partitions)
        other = {w for p, ws in self.partition_warnings.items() if p not in names for w in ws}
        return [w for w in self.warnings if w not in other]

    def partition(self, name: str | None, choose: str = "'partition:' in the sweep") -> Partition:
        """The partition *name*, or the only one; *choose* says how the user names one (a sweep's key, or a
        command's option such as ``--partition``)."""
        if name is None:
            if len(self.partitions) == 1:
                return next(iter(self.partitions.values()))
            example = f" (e.g. {choose} {next(iter(self.partitions))})" if choose.startswith("--") else ""
            raise InventoryError(
                f"{self.source}: has {len(self.partitions)} partitions "
                f"({', '.join(self.partitions)}); name one with {choose}{example}"
            )
        if name not in self.partitions:
            raise InventoryError(
                f"{self.source}: no partition {name!r}; known partitions: {', '.join(self.partitions)}"
            )
        return self.partitions[name]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _checker(source: str) -> Checker:
    return Checker(source, InventoryError)


def _env(ck: Checker, node: Mapping[str, Any], key: str, name: str) -> dict[str, str]:
    env = ck.string_map(node, key, name)
    for k in env:
        if not ENV_NAME.fullmatch(k):
            ck.fail(f"{key}.{name}.{k}", "is not a valid environment variable name (letters, digits, _)",
                    node.get(name), k)
    return env


def _roce(ck: Checker, node: Any, key: str, parent: Mapping[str, Any]) -> Roce:
    node = ck.mapping(node, key, parent, "roce")
    ck.known_keys(node, key, ROCE_KEYS)
    hcas = ck.string_list(node, key, "hcas")
    if not hcas:
        ck.fail(f"{key}.hcas", "is required: list the RoCE HCAs as 'dev:port', e.g. ['mlx5_0:1']", node, "hcas")
    for i, h in enumerate(hcas):
        if not HCA.fullmatch(h):
            ck.fail(f"{key}.hcas[{i}]", f"must be in 'dev:port' form (e.g. 'mlx5_0:1'), got {h!r}", node, "hcas")
    gid = node.get("gid_index")
    if gid is None:
        ck.fail(f"{key}.gid_index", "is required: the GID index of a RoCE v2 entry (see show_gids)", node)
    if isinstance(gid, bool) or not isinstance(gid, int) or gid < 0:
        ck.fail(f"{key}.gid_index", f"must be an integer >= 0, got {gid!r}", node, "gid_index")
    ck.integer(node, key, "gid_index", minimum=0, maximum=MAX_GID_INDEX)
    ifname = ck.string(node, key, "socket_ifname", pattern=IFNAME,
                       what="a network interface name, or NCCL's list form such as 'eth0' or '^lo,docker'")
    return Roce(hcas=tuple(hcas), gid_index=gid, socket_ifname=ifname)


def _host(ck: Checker, name: str, node: Any, key: str, parent: Mapping[str, Any]) -> Host:
    ck.name(name, key, parent, name, what="host name (the SLURM node name)")
    node = ck.mapping(node, key, parent, name)
    ck.known_keys(node, key, HOST_KEYS)
    roce = _roce(ck, node["roce"], f"{key}.roce", node) if node.get("roce") is not None else None
    return Host(
        name=name,
        address=ck.string(node, key, "address", pattern=ADDRESS, what="an IP address or a DNS name"),
        roce=roce,
        nccl_topo_file=ck.string(node, key, "nccl_topo_file"),
        env=_env(ck, node, key, "env"),
    )


def _partition(ck: Checker, name: str, node: Any, parent: Mapping[str, Any]) -> Partition:
    key = f"partitions.{name}"
    ck.name(name, key, parent, name, what="partition name")
    node = ck.mapping(node, key, parent, name)
    ck.known_keys(node, key, PARTITION_KEYS)
    gpu_model = ck.require(node, key, "gpu_model", "the GPU product name, or 'cpu' for a CPU partition")
    gpu_model = ck.string(node, key, "gpu_model", pattern=GPU_MODEL,
                          what="a GPU product name such as 'NVIDIA-A100-SXM4-80GB', or 'cpu'")
    ck.require(node, key, "gpus_per_node", "GPUs per host; on a CPU partition, worker processes per host")
    gpus = ck.integer(node, key, "gpus_per_node", minimum=0, maximum=MAX_GPUS_PER_NODE)
    ck.require(node, key, "cpus_per_node")
    cpus = ck.integer(node, key, "cpus_per_node", minimum=1, maximum=MAX_CPUS_PER_NODE)
    ck.require(node, key, "memory_gb")
    mem = ck.number(node, key, "memory_gb", minimum=0, maximum=MAX_MEMORY_GB)
    if mem <= 0:
        ck.fail(f"{key}.memory_gb", f"must be a number > 0, got {mem}", node, "memory_gb")
    if gpu_model.lower() == CPU_MODEL and gpus < 1:
        ck.fail(f"{key}.gpus_per_node",
                "must be >= 1 on a CPU partition (it is the number of worker processes per host)", node,
                "gpus_per_node")
    hosts_node = node.get("hosts")
    if not hosts_node:
        ck.fail(f"{key}.hosts", "is empty: a partition needs at least one host (hosts: {name: {address: ...}})",
                node, "hosts")
    hosts_node = ck.mapping(hosts_node, f"{key}.hosts", node, "hosts")
    hosts = {str(h): _host(ck, str(h), v, f"{key}.hosts.{h}", hosts_node) for h, v in hosts_node.items()}
    setup = ck.string_list(node, key, "setup", default=[])
    return Partition(
        name=name,
        slurm_partition=ck.string(node, key, "slurm_partition", default=name, pattern=SLURM_NAME,
                                  what=SLURM_NAME_TEXT),
        gpu_model=gpu_model,
        gpus_per_node=gpus,
        cpus_per_node=cpus,
        memory_gb=float(mem),
        hosts=hosts,
        account=ck.string(node, key, "account", pattern=SLURM_NAME, what=SLURM_NAME_TEXT),
        qos=ck.string(node, key, "qos", pattern=SLURM_NAME, what=SLURM_NAME_TEXT),
        constraint=ck.string(node, key, "constraint", pattern=SLURM_CONSTRAINT,
                             what=SLURM_CONSTRAINT_TEXT),
        time_limit=ck.string(node, key, "time_limit", pattern=SLURM_TIME, what=SLURM_TIME_TEXT),
        setup=tuple(setup),
        env=_env(ck, node, key, "env"),
        python=ck.string(node, key, "python"),
        exclusive=ck.boolean(node, key, "exclusive", default=False),
        slurm_extra=sbatch_extra(ck, node, key, "slurm_extra"),
        peak_tflops=_peak(ck, node, key),
        gpu_memory_gb=ck.number(node, key, "gpu_memory_gb", minimum=0.001, maximum=MAX_MEMORY_GB),
        price_per_gpu_hour=ck.number(node, key, "price_per_gpu_hour", minimum=0, maximum=MAX_PRICE_PER_GPU_HOUR),
    )


def _peak(ck: Any, node: Any, key: str) -> float | dict[str, float] | None:
    """``peak_tflops``: dense TFLOP/s of one device (one CPU worker process on a CPU partition), or per dtype."""
    value = node.get("peak_tflops")
    if value is None or not isinstance(value, dict):
        return ck.number(node, key, "peak_tflops", minimum=1e-9, maximum=MAX_PEAK_TFLOPS)
    sub = ck.mapping(value, f"{key}.peak_tflops", node, "peak_tflops")
    ck.known_keys(sub, f"{key}.peak_tflops", DTYPES)
    return {d: float(ck.number(sub, f"{key}.peak_tflops", d, minimum=1e-9, maximum=MAX_PEAK_TFLOPS))
            for d in DTYPES if sub.get(d) is not None}


def parse_inventory(doc: Any, source: str) -> Inventory:
    ck = _checker(source)
    if doc is None:
        ck.fail("(document)", "is empty; expected 'cluster:' and 'partitions:'")
    doc = ck.mapping(doc, "(document)")
    ck.known_keys(doc, "", TOP_KEYS)
    cluster = ck.string(doc, "", "cluster", default="cluster")
    ck.name(cluster, "cluster", doc, "cluster", what="cluster name")
    defaults = ck.mapping(doc.get("defaults"), "defaults", doc, "defaults")
    ck.known_keys(defaults, "defaults", DEFAULT_KEYS)
    parts_node = doc.get("partitions")
    if not parts_node:
        ck.fail("partitions", "is required: describe at least one partition", doc, "partitions")
    parts_node = ck.mapping(parts_node, "partitions", doc, "partitions")
    partitions = {str(n): _partition(ck, str(n), v, parts_node) for n, v in parts_node.items()}
    seen: dict[str, tuple[str, str | None]] = {}
    for p in partitions.values():
        for h in p.hosts.values():
            first = seen.setdefault(h.name, (p.name, h.address))
            if first[0] != p.name and h.address and first[1] and h.address != first[1]:
                ck.fail(f"partitions.{p.name}.hosts.{h.name}.address",
                        f"is {h.address!r}, but partitions.{first[0]}.hosts.{h.name}.address is {first[1]!r}; "
                        "one SLURM node has one address - make them equal", parts_node.get(p.name))
    per_partition: dict[str, tuple[str, ...]] = {}
    for p in partitions.values():
        gids = {h.name: h.roce.gid_index for h in p.hosts.values() if h.roce}
        if len(set(gids.values())) > 1:
            detail = ", ".join(f"{h}={g}" for h, g in gids.items())
            per_partition[p.name] = (
                f"{source}: partitions.{p.name}: hosts use different RoCE GID indices ({detail}); "
                "this is allowed (each node sources its own env) but check it is intended",)
    warnings = [w for ws in per_partition.values() for w in ws]
    return Inventory(
        cluster=cluster,
        source=source,
        partitions=partitions,
        env=_env(ck, defaults, "defaults", "env"),
        nccl=_env(ck, defaults, "defaults", "nccl"),
        setup=tuple(ck.string_list(defaults, "defaults", "setup", default=[])),
        python=ck.string(defaults, "defaults", "python"),
        data_dir=ck.string(defaults, "defaults", "data_dir"),
        models_dir=ck.string(defaults, "defaults", "models_dir"),
        envs_dir=ck.string(defaults, "defaults", "envs_dir"),
        warnings=tuple(warnings),
        partition_warnings=per_partition,
    )


def detect_gpus() -> list[dict[str, Any]]:
    """GPUs through NVML; an empty list when NVML is missing or sees none."""
    try:
        import pynvml  # optional: NVML is there only with an NVIDIA driver
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVML raises many library-specific errors
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append({"index": i, "name": name, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                         "memory_gb": round(mem / 2**30, 1)})
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def gpu_label(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB`` -> ``NVIDIA-A100-SXM4-80GB`` (the label form the seeds use)."""
    return re.sub(r"\s+", "-", name.strip())


def local_inventory() -> Inventory:
    """This machine as a one-host inventory: NVML GPUs when present, else a CPU partition."""
    host = socket.gethostname().split(".")[0] or "localhost"
    cpus = os.cpu_count() or 1
    mem_gb = round(psutil.virtual_memory().total / BYTES_PER_GB, 1)
    gpus = detect_gpus()
    if gpus:
        model, per_node = gpu_label(gpus[0]["name"]), len(gpus)
    else:
        model, per_node = CPU_MODEL, cpus
    part = Partition(
        name="local",
        slurm_partition="local",
        gpu_model=model,
        gpus_per_node=per_node,
        cpus_per_node=cpus,
        memory_gb=mem_gb,
        hosts={host: Host(name=host, address="127.0.0.1")},
    )
    return Inventory(cluster="local", source="<built-in local inventory>", partitions={"local": part})


def inventory_path(path: str | Path | None) -> Path | None:
    """The inventory file, absolute (recorded in manifests, so `retry` works from any directory)."""
    if path:
        return Path(path).expanduser().absolute()
    named = envvars.INVENTORY.get()
    return Path(named).expanduser().absolute() if named else None


def load_inventory(path: str | Path | None = None) -> Inventory:
    """Load ``path``, else ``$SBENCH_INVENTORY``, else the built-in local inventory."""
    p = inventory_path(path)
    if p is None:
        return local_inventory()
    doc = load_yaml(p, InventoryError, "inventory")
    return parse_inventory(doc, str(p))


def describe(inv: Inventory) -> dict[str, Any]:
    """The JSON shape of ``sbench inventory check --json``."""
    parts = {}
    for p in inv.partitions.values():
        parts[p.name] = {
            "slurm_partition": p.slurm_partition,
            "gpu_model": p.gpu_model,
            "cpu_partition": p.is_cpu,
            "gpus_per_node": p.gpus_per_node,
            "cpus_per_node": p.cpus_per_node,
            "memory_gb": p.memory_gb,
            "account": p.account,
            "qos": p.qos,
            "constraint": p.constraint,
            "time_limit": p.time_limit,
            "hosts": {
                h.name: {
                    "address": h.address,
                    "roce": None if h.roce is None else {
                        "hcas": list(h.roce.hcas),
                        "nccl_ib_hca": h.roce.nccl_ib_hca,
                        "gid_index": h.roce.gid_index,
                        "socket_ifname": h.roce.socket_ifname,
                    },
                    "nccl_topo_file": h.nccl_topo_file,
                }
                for h in p.hosts.values()
            },
        }
    return {"cluster": inv.cluster, "source": inv.source, "partitions": parts, "warnings": list(inv.warnings)}


def shared_dir(value: str | None, inv: Any) -> Path | None:
    """An inventory path (defaults.data_dir / models_dir): absolute, or relative to the inventory file."""
    if not value:
        return None
    p = Path(value).expanduser()
    if not p.is_absolute():
        src = Path(inv.source)
        p = (src.parent / p).resolve() if src.is_file() else p.resolve()
    return p
