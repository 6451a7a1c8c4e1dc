"""``sbench fabric``: the network as a benchmark point sees it.

One SLURM job of N whole nodes of a partition, rendered like a benchmark point (same ``launch.sh``,
same ``env/<host>.sh``: RoCE HCAs, GID index, socket interface, the gloo/NCCL interface binding),
runs ``torch.distributed`` all-reduce and all-gather over a range of message sizes, NCCL on GPUs and
gloo on CPU partitions. Rank 0 records per size the time, the algorithm bandwidth (bytes / time) and
the bus bandwidth (all-reduce: algbw x 2(n-1)/n; all-gather: algbw x (n-1)/n, with bytes the gathered
total, as nccl-tests reports them); each host's NCCL log says which transport it used. The rows land
in the ``fabric`` table and the report plots them. ``sbench submit --preflight`` runs it first for
each partition and node count of a sweep and refuses to submit when it fails, or when RoCE points
would run over Socket.

``python -m harness.runner.fabric`` is the in-job workload (one process per device, started by
accelerate like a training run); this module submits it and reads its results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.build.jobspec import JobSpec, build_jobspec
from harness.build.render import write_job_dir
from harness.collect.parse import nccl_transport
from harness.contract import safefile
from harness.contract.errors import InputError
from harness.contract.paths import JobPaths
from harness.runner.fabric import CPU_SIZES, DEFAULT_SIZES
from harness.spec.inventory import Inventory
from harness.spec.plan import PlannedPoint, plan_sweep
from harness.spec.sweep import Sweep, parse_sweep

from .fit import ClusterFit


class JobRunner(Protocol):
    """What a check of the cluster asks of an executor (``harness.campaign.executors.registry.job_runner`` makes
    one): where its jobs may go, and one job run to its end."""

    def fit(self, inv: Inventory, sweep: Sweep, points: list[PlannedPoint]) -> ClusterFit: ...

    def run(self, out: Path, spec: JobSpec) -> None: ...


# -- on the login node ---------------------------------------------------------------------------------------
@dataclass
class FabricResult:
    fabric_id: str
    partition: str
    nodes: int
    job_dir: str
    ok: bool
    reason: str | None
    backend: str | None = None
    world_size: int | None = None
    transports: dict[str, str | None] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def socket_hosts(self) -> list[str]:
        return sorted(h for h, t in self.transports.items() if t == "socket")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("fabric_id", "partition", "nodes", "job_dir", "ok", "reason", "backend",
                                              "world_size", "transports", "rows")}


def fabric_sweep(inv: Any, partition: str, nodes: int, roce: bool, out: Path) -> tuple[Any, Any]:
    """A one-point sweep of *nodes* whole nodes (one process per device), planned against *inv*."""
    part = inv.partition(partition)
    doc = {"campaign": f"fabric-{part.name}-{nodes}n", "experiment": "finetune_full_benchmark-v1.0.0",
           "partition": part.name,
           "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_nodes": nodes,
                      "number_gpus": nodes * part.gpus_per_node, "batch_size": nodes * part.gpus_per_node,
                      "distributed_backend": "DDP", "enable_roce": roce}}
    sweep = parse_sweep(doc, f"<fabric {part.name} x{nodes}>", out)
    (point,) = plan_sweep(sweep, inv)
    if not point.valid:
        raise InputError(f"fabric on partition {part.name!r} with {nodes} node(s): {'; '.join(point.reasons)}")
    return sweep, point


def run_fabric(inv: Any, partition: str | None, nodes: int, workdir: Path, runner: JobRunner, *,
               roce: bool | None = None, sizes: list[int] | None = None, iters: int = 20) -> FabricResult:
    """Render one fabric job and run it with *runner*; its results as :class:`FabricResult` rows."""
    part = inv.partition(partition)
    if roce is None:
        roce = nodes > 1 and all(h.roce is not None for h in part.hosts.values())
    fabric_id = time.strftime("%Y%m%dT%H%M%S") + f"-{part.name}-{nodes}n"
    out = (workdir / ".fabric" / fabric_id).resolve()
    sweep, point = fabric_sweep(inv, part.name, nodes, roce, out)
    fit = runner.fit(inv, sweep, [point])
    job_dir = out / f"{point.point_id}.r0.a1"
    spec = build_jobspec(sweep, inv, point, 1, str(job_dir), exclude=fit.exclude)
    sizes = sizes or list(CPU_SIZES if part.is_cpu else DEFAULT_SIZES)
    spec.workload = "fabric"
    spec.train_argv = ["--job-dir", str(job_dir), "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters)]
    spec.resources["job_name"] = f"sbench.fabric.{part.name}.{nodes}n"
    write_job_dir(spec, inv, point, sweep)
    runner.run(out, spec)
    paths = JobPaths(job_dir)
    results = {}
    for h in paths.result_hosts():
        try:
            results[h] = safefile.read_json(paths.result(h), paths.root, safefile.RUNNER_MAX)
        except (OSError, ValueError):
            continue
    try:
        rank0 = safefile.read_json(paths.rank_result(0), paths.root, safefile.RUNNER_MAX)
    except (OSError, ValueError):
        rank0 = {}
    results = {h: r for h, r in results.items() if isinstance(r, dict)}
    rank0 = rank0 if isinstance(rank0, dict) else {}
    transports = {h: nccl_transport(paths.train_log(h), paths.root)[0] for h in sorted(results)}
    bad = [f"{h}: {r.get('reason')}" for h, r in sorted(results.items()) if r.get("outcome") != "ok"]
    fab = rank0.get("fabric") or {}
    ok = not bad and len(results) >= nodes and bool(fab.get("results"))
    reason = "; ".join(bad) if bad else (None if ok else f"no fabric results in {job_dir} (see slurm-*.out there)")
    res = FabricResult(fabric_id, part.name, nodes, str(job_dir), ok, reason, fab.get("backend"),
                       fab.get("world_size"), transports)
    at = time.time()
    for r in fab.get("results") or []:
        res.rows.append({"fabric_id": fabric_id, "cluster": inv.cluster, "partition": part.name, "nodes": nodes,
                         "world_size": fab.get("world_size"), "backend": fab.get("backend"), "enable_roce": roce,
                         **{k: r.get(k) for k in ("op", "bytes", "iters", "time_us", "algbw_gbps", "busbw_gbps")},
                         "transport_by_host": transports, "ok": ok, "reason": reason, "job_dir": str(job_dir),
                         "measured_at": at})
    if not res.rows:
        res.rows.append({"fabric_id": fabric_id, "cluster": inv.cluster, "partition": part.name, "nodes": nodes,
                         "enable_roce": roce, "transport_by_host": transports, "ok": False, "reason": reason,
                         "job_dir": str(job_dir), "measured_at": at})
    return res
