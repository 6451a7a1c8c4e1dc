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

``python -m harness.fabric --job-dir D [--sizes ...]`` is the in-job workload (one process per device,
started by accelerate like a training run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_SIZES = tuple(4**k * 1024 for k in range(0, 10))  # 1 KiB .. 256 MiB
CPU_SIZES = tuple(4**k * 1024 for k in range(0, 8))  # 1 KiB .. 16 MiB: gloo on CPUs is slow


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * scale)


# -- in the job ----------------------------------------------------------------------------------------------
def _bench(sizes: list[int], iters: int, warmup: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group(backend=backend)
    n, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    results = []
    for size in sizes:
        for op in ("all_reduce", "all_gather"):
            numel = max(n, size // 4 // n * n)  # float32; divisible by the world for all-gather
            if op == "all_reduce":
                buf = torch.ones(numel, dtype=torch.float32, device=dev)
                run = lambda: dist.all_reduce(buf)  # noqa: E731
                factor = 2 * (n - 1) / n
            else:
                inp = torch.ones(numel // n, dtype=torch.float32, device=dev)
                out = torch.empty(numel, dtype=torch.float32, device=dev)
                run = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
                factor = (n - 1) / n
            for _ in range(warmup):
                run()
            sync()
            dist.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                run()
            sync()
            elapsed = torch.tensor([(time.perf_counter() - t) / iters], dtype=torch.float64, device=dev)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            secs = float(elapsed.item())
            nbytes = numel * 4
            algbw = nbytes / secs / 1e9 if secs > 0 else None
            results.append({"op": op, "bytes": nbytes, "iters": iters, "time_us": secs * 1e6, "algbw_gbps": algbw,
                            "busbw_gbps": algbw * factor if algbw is not None else None})
    dist.barrier()
    dist.destroy_process_group()
    return {"backend": backend, "world_size": n, "rank": rank, "results": results}


def main(argv: list[str] | None = None) -> int:
    from .paths import JobPaths
    from .runner.stages import StageLog

    ap = argparse.ArgumentParser(prog="python -m harness.fabric")
    ap.add_argument("--job-dir", required=True)
    ap.add_argument("--sizes", default=None, help="comma-separated byte sizes (K/M/G suffixes)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    paths = JobPaths(args.job_dir)
    rank = int(os.environ.get("RANK", "0"))
    host = os.environ.get("SBENCH_HOST", "local")
    log = StageLog(paths.stages(host), host, rank=rank)
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else list(DEFAULT_SIZES)
    doc: dict[str, Any] = {"rank": rank, "host": host, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
    with log.stage("fabric") as info:
        res = _bench(sizes, args.iters, args.warmup)
        info.update(backend=res["backend"], sizes=len(sizes))
    doc.update(status="ok", world_size=res["world_size"], fabric=res if rank == 0 else {"backend": res["backend"]})
    tmp = paths.rank_result(rank).with_name(f".rank.{rank}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, paths.rank_result(rank))
    return 0


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
    from .plan import parse_sweep, plan_sweep

    part = inv.partition(partition)
    doc = {"campaign": f"fabric-{part.name}-{nodes}n", "experiment": "finetune_full_benchmark-v1.0.0",
           "partition": part.name,
           "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_nodes": nodes,
                      "number_gpus": nodes * part.gpus_per_node, "batch_size": nodes * part.gpus_per_node,
                      "distributed_backend": "DDP", "enable_roce": roce}}
    sweep = parse_sweep(doc, f"<fabric {part.name} x{nodes}>", out)
    (point,) = plan_sweep(sweep, inv)
    if not point.valid:
        from .errors import InputError

        raise InputError(f"fabric on partition {part.name!r} with {nodes} node(s): {'; '.join(point.reasons)}")
    return sweep, point


def run_fabric(inv: Any, partition: str | None, nodes: int, workdir: Path, *, executor: str = "slurm",
               roce: bool | None = None, sizes: list[int] | None = None, iters: int = 20) -> FabricResult:
    """Render, submit and wait for one fabric job; its results as :class:`FabricResult` rows."""
    from .collect.parse import nccl_transport
    from .jobspec import build_jobspec
    from .paths import JobPaths
    from .render import cluster_fit, write_job_dir
    from .sbatch.executors import SubmitOptions, get_backend

    part = inv.partition(partition)
    if roce is None:
        roce = nodes > 1 and all(h.roce is not None for h in part.hosts.values())
    fabric_id = time.strftime("%Y%m%dT%H%M%S") + f"-{part.name}-{nodes}n"
    out = (workdir / ".fabric" / fabric_id).resolve()
    sweep, point = fabric_sweep(inv, part.name, nodes, roce, out)
    fit = cluster_fit(inv, [point]) if executor == "slurm" else None
    job_dir = out / f"{point.point_id}.r0.a1"
    spec = build_jobspec(sweep, inv, point, 1, str(job_dir), exclude=fit.exclude if fit else None)
    sizes = sizes or list(CPU_SIZES if part.is_cpu else DEFAULT_SIZES)
    spec.workload = "fabric"
    spec.train_argv = ["--job-dir", str(job_dir), "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters)]
    spec.resources["job_name"] = f"sbench.fabric.{part.name}.{nodes}n"
    write_job_dir(spec, inv, point, sweep)
    backend = get_backend(executor)
    backend.check([spec])
    submitted = backend.submit(out, [spec], SubmitOptions(wait=True))
    backend.wait(submitted)
    paths = JobPaths(job_dir)
    results = {}
    for h in paths.result_hosts():
        try:
            results[h] = json.loads(paths.result(h).read_text())
        except (OSError, ValueError):
            continue
    try:
        rank0 = json.loads(paths.rank_result(0).read_text())
    except (OSError, ValueError):
        rank0 = {}
    transports = {h: nccl_transport(paths.train_log(h))[0] for h in sorted(results)}
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


if __name__ == "__main__":
    sys.exit(main())
