"""``python -m harness.runner.idle --job-dir D [--seconds S]``: a stand-in for training.

The sweep's ``runner: {workload: idle}`` runs every point through the whole harness (scheduler,
``launch.sh``, the node runner's stages and sampler, result files, collect) with this one-second
workload instead of fine-tuning: a dry run of the harness and the scheduler at scale (``bench/scale.py``),
with nothing to download and almost nothing to compute. Each rank writes its ``train`` stage and a
``rank.<rank>.json`` like a trainer's; collect records the run, and no measurement (its point id is
its own, so it never stands for a trained point).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from harness.contract import envvars
from harness.contract.atomic import write_json
from harness.contract.formats import Stage
from harness.contract.paths import JobPaths

from .stages import StageLog


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.runner.idle")
    ap.add_argument("--job-dir", required=True)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args(argv)
    paths = JobPaths(args.job_dir)
    rank = int(os.environ.get("RANK", "0"))
    host = envvars.host()
    log = StageLog(paths.stages(host), host, rank=rank)
    with log.stage(Stage.TRAIN) as info:
        t0 = time.time()
        time.sleep(max(0.0, args.seconds))
        t1 = time.time()
        info.update(workload="idle", global_step=1)
    doc = {"rank": rank, "host": host, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
           "world_size": int(os.environ.get("WORLD_SIZE", "1")), "status": "ok", "global_step": 1,
           "train_start_wall": t0, "train_end_wall": t1, "stopped_by": "idle", "workload": "idle",
           "metrics": {"train_runtime": t1 - t0}}
    write_json(paths.rank_result(rank), doc, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
