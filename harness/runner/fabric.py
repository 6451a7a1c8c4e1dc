"""``python -m harness.runner.fabric --job-dir D [--sizes ...]``: the in-job workload of ``sbench fabric``.

One process per device, started by accelerate like a training run: ``torch.distributed`` all-reduce and
all-gather over a range of message sizes, NCCL on GPUs and gloo on CPU partitions. Rank 0 records per size
the time, the algorithm bandwidth (bytes / time) and the bus bandwidth (all-reduce: algbw x 2(n-1)/n;
all-gather: algbw x (n-1)/n, with bytes the gathered total, as nccl-tests reports them) in its
``rank.0.json``; ``harness.cluster.fabric`` submits the job and reads the results.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any

from harness.contract import envvars
from harness.contract.atomic import write_json
from harness.contract.formats import Stage
from harness.contract.paths import JobPaths

from .stages import StageLog

DEFAULT_SIZES = tuple(4**k * 1024 for k in range(0, 10))  # 1 KiB .. 256 MiB
CPU_SIZES = tuple(4**k * 1024 for k in range(0, 8))  # 1 KiB .. 16 MiB: gloo on CPUs is slow


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * scale)


# -- in the job ----------------------------------------------------------------------------------------------
def _bench(sizes: list[int], iters: int, warmup: int) -> dict[str, Any]:
    import torch  # heavy: only where a model is built or trained
    import torch.distributed as dist  # heavy: only where a model is built or trained

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
                run = functools.partial(dist.all_reduce, buf)
                factor = 2 * (n - 1) / n
            else:
                inp = torch.ones(numel // n, dtype=torch.float32, device=dev)
                out = torch.empty(numel, dtype=torch.float32, device=dev)
                run = functools.partial(dist.all_gather_into_tensor, out, inp)
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
    ap = argparse.ArgumentParser(prog="python -m harness.runner.fabric")
    ap.add_argument("--job-dir", required=True)
    ap.add_argument("--sizes", default=None, help="comma-separated byte sizes (K/M/G suffixes)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    paths = JobPaths(args.job_dir)
    rank = int(os.environ.get("RANK", "0"))
    host = envvars.host()
    log = StageLog(paths.stages(host), host, rank=rank)
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else list(DEFAULT_SIZES)
    doc: dict[str, Any] = {"rank": rank, "host": host, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
    with log.stage(Stage.FABRIC) as info:
        res = _bench(sizes, args.iters, args.warmup)
        info.update(backend=res["backend"], sizes=len(sizes))
    doc.update(status="ok", world_size=res["world_size"], fabric=res if rank == 0 else {"backend": res["backend"]})
    write_json(paths.rank_result(rank), doc, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
