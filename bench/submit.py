"""Benchmark `sbench submit` on a 1,000-point sweep against the project's test cluster.

Everything is submitted held (`--hold`), so nothing runs; the jobs are cancelled at the end.
Reports the number of sbatch calls (one per resource shape, not one per point) and the
wall time of plan, render and submit, measured in one run.

Usage: .venv/bin/python bench/submit.py [--points 1000] [--keep]
Needs the test cluster: bash tests/cluster/cluster.sh start
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "tests" / "fixtures" / "inventory" / "testcluster.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=1000, help="number of points (a multiple of 4)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    args = ap.parse_args()
    if shutil.which("sbatch") is None:
        raise SystemExit("sbatch not found: start the test cluster (bash tests/cluster/cluster.sh start)")
    from harness.build.render import render_points
    from harness.campaign.submit import SubmitRequest, submit_sweep
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import load_sweep

    tmp = Path(tempfile.mkdtemp(prefix="sbench-bench-submit-"))
    per_shape = args.points // 4
    sweep = tmp / "sweep.yaml"
    campaign = f"bench-submit-{int(time.time())}"
    sweep.write_text(yaml.safe_dump({
        "campaign": campaign, "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "gpu",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 1024, "max_steps": 10},
        "grid": {"number_gpus": [1, 2, 4, 8], "batch_size": [8 * k for k in range(1, per_shape + 1)]},
    }))
    t0 = time.perf_counter()
    inv = load_inventory(INVENTORY)
    points = plan_sweep(load_sweep(sweep), inv)
    t_plan = time.perf_counter() - t0
    t0 = time.perf_counter()
    render_points(load_sweep(sweep), inv, points, tmp / "preview")
    t_render = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = submit_sweep(SubmitRequest(sweep, INVENTORY, "slurm", tmp / "runs", tmp / "results.duckdb", hold=True))
    t_submit = time.perf_counter() - t0
    ids = sorted({s.job_id.split("_")[0] for s in report.submitted if s.job_id})
    held = subprocess.run(["squeue", "-h", "-r", "-t", "PD", "-o", "%i %r", "-j", ",".join(ids)],
                          capture_output=True, text=True).stdout.splitlines()
    subprocess.run(["scancel", *ids], check=False)
    out = {
        "points": len(points), "valid": sum(p.valid for p in points), "submitted": len(report.submitted),
        "shapes": len(ids), "sbatch_calls": report.sbatch_calls,
        "held_array_tasks_seen_in_squeue": sum("JobHeldUser" in line for line in held),
        "plan_s": round(t_plan, 3), "render_s": round(t_render, 3),
        "submit_total_s": round(t_submit, 3),
        "submit_per_point_ms": round(1000 * t_submit / max(1, len(report.submitted)), 2),
    }
    print(json.dumps(out, indent=2))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"work dir kept: {tmp}")


if __name__ == "__main__":
    main()
