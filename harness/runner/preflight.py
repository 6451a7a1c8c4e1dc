"""``python -m harness.runner.preflight --out-dir DIR``: how fast each device of this node computes and copies
memory (see ``sbench preflight``).

Per device (each GPU at bf16, all at once, one thread each; the CPU at fp32, on one core, on a CPU partition or a
node without GPUs): a dense square matmul (TFLOP/s: 2 n^3 per matmul) and a device memory copy of one buffer into
another (GB/s: the bytes read plus the bytes written), each timed in :data:`REPS` repetitions that together take
about ``--seconds``; a figure is the median of its repetitions, with their spread ((max - min) / median).
``harness.cluster.preflight`` ranks them against the partition's median. It writes ``DIR/preflight.<node>.json``.

``SBENCH_FAULT slow@stage=preflight[,host=NAME][,look=1|2][:FACTOR]`` makes this node's matmuls and copies take
FACTOR times as long (each timed repetition waits the extra time): a slow device, for tests; with ``look=``, only
at that look (``--look``: the first measurement, or the second look ``harness.cluster.preflight`` takes at a device
found slow).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

from harness.contract import envvars
from harness.contract.atomic import write_json
from harness.contract.formats import Stage

from .faults import faults_from_env

REPS = 5
MATMUL, MEMCPY = "matmul_tflops", "memcpy_gbps"
UNITS = {MATMUL: "TFLOP/s", MEMCPY: "GB/s"}
# matrix side and copy size: large enough to keep a device busy, small enough for seconds on a CPU
SIZES = {"cuda": (8192, 1 << 30), "cpu": (512, 64 << 20)}


def slow_factor(host: str, look: int = 1) -> float:
    """The factor an injected ``slow`` fault puts on this node's figures at this *look* (1: none)."""
    factor = 1.0
    for f in faults_from_env():
        if f.kind == "slow" and f.applies(rank=0, trial=None, stage=Stage.PREFLIGHT, host=host, look=look):
            factor = max(factor, f.factor)
    return factor


def _timed(work: Callable[[], object], sync: Callable[[], None], budget_s: float, factor: float = 1.0) -> list[float]:
    """Seconds per call of *work*, in REPS repetitions of as many calls as fit *budget_s* / REPS (at least one)."""
    work()
    sync()  # warm-up: allocation, kernel selection
    t0 = time.perf_counter()
    work()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, int(budget_s / REPS / one))
    out = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        for _ in range(calls):
            work()
        sync()
        took = time.perf_counter() - t0
        if factor > 1:
            time.sleep(took * (factor - 1))
            took *= factor
        out.append(took / calls)
    return out


def figure(values: list[float]) -> dict[str, Any]:
    mid = median(values)
    return {"value": mid, "reps": values, "spread": (max(values) - min(values)) / mid if mid else None}


def measure_device(device: str, dtype: str, budget_s: float, factor: float) -> dict[str, Any]:
    import torch  # heavy: only the preflight's own process measures

    kind = "cuda" if device.startswith("cuda") else "cpu"
    if kind == "cpu":
        # one core: a CPU partition's device is one worker process; threads that wait for each other on a busy
        # host measure the other work, not the core
        torch.set_num_threads(1)
    n, nbytes = SIZES[kind]
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    dev = torch.device(device)

    def sync() -> None:
        if kind == "cuda":
            torch.cuda.synchronize(dev)

    held = {"a": torch.randn(n, n, device=dev, dtype=dt), "b": torch.randn(n, n, device=dev, dtype=dt)}
    mm = _timed(lambda: torch.mm(held["a"], held["b"]), sync, budget_s, factor)
    held = {"src": torch.empty(nbytes // 4, device=dev, dtype=torch.float32)}  # the matrices' memory goes back
    held["dst"] = torch.empty_like(held["src"])
    cp = _timed(lambda: held["dst"].copy_(held["src"]), sync, budget_s, factor)
    held.clear()
    name = torch.cuda.get_device_name(dev) if kind == "cuda" else "cpu"
    return {"device": device, "name": name, "dtype": dtype, "matmul_n": n, "copy_bytes": nbytes,
            "figures": {MATMUL: figure([2 * n**3 / t / 1e12 for t in mm]),
                        MEMCPY: figure([2 * nbytes / t / 1e9 for t in cp])}}


def preflight_node(host: str | None = None, gpu: bool = True, budget_s: float = 2.0, look: int = 1) -> dict[str, Any]:
    """Measure every device of this node: its GPUs (bf16) when *gpu* and CUDA sees any, else the CPU (fp32).
    *look*: 1, or 2 for the second look at a node found slow (what a ``look=`` fault matches)."""
    import torch  # heavy: only the preflight's own process measures

    me = host or envvars.host()
    t0 = time.time()
    factor = slow_factor(me, look)
    if gpu and torch.cuda.is_available():
        devs, dtype = [f"cuda:{i}" for i in range(torch.cuda.device_count())], "bf16"
    else:
        devs, dtype = ["cpu"], "fp32"
    # the GPUs side by side, one thread each (their kernels release the GIL): a node's check takes about as long
    # as one device's, and the devices work as they do in a run, together
    with ThreadPoolExecutor(max_workers=len(devs)) as pool:
        out = list(pool.map(lambda d: measure_device(d, dtype, budget_s, factor), devs))
    return {"host": me, "t_wall": t0, "elapsed_s": round(time.time() - t0, 3), "dtype": dtype, "devices": out,
            "look": look,
            **({"slow_fault": factor} if factor > 1 else {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.runner.preflight",
                                 description="Measure this node's devices (see sbench preflight).")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--host", default=None)
    ap.add_argument("--cpu", action="store_true", help="measure the CPU (a CPU partition), not the GPUs")
    ap.add_argument("--seconds", type=float, default=2.0, help="time per figure and device")
    ap.add_argument("--look", type=int, choices=(1, 2), default=1, help="2: the second look at a node found slow")
    args = ap.parse_args(argv)
    doc = preflight_node(args.host, gpu=not args.cpu, budget_s=args.seconds, look=args.look)
    write_json(Path(args.out_dir) / f"preflight.{doc['host']}.json", doc, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
