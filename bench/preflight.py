"""Benchmark the cluster-health checks: how long ``sbench preflight`` takes per node, and what scoring the ranks
(stragglers) adds to ``sbench collect``.

* preflight: the device check of one node (``harness.runner.preflight.preflight_node``: every device's matmul and
  memory copy, ``--seconds`` each) on this machine, timed whole (the torch import included), ``--repeat`` times;
  the goal is under 30 s a node. With ``--on slurm -i INV --partition P`` it times ``sbench preflight`` over the
  partition's nodes through srun instead (one allocation; the scheduler's start-up included).
* scoring: two work dirs of ``--runs`` synthetic 2-node runs (one rank a node, ``--steps`` steps), identical but
  for the ranks' own step times (``step_own_s``, what ``runner.rank_timing`` writes): a full collect of each into
  a fresh DB, each in a fresh process, alternated ``--repeat`` times, best kept. The overhead is the difference
  over the collect without them (it reads bigger rank files and writes ``rank_scores``); the goal is under 5 %.

Usage: .venv/bin/python bench/preflight.py [--runs 10000] [--steps 100] [--seconds 2] [--repeat 3] [--json]
Quick: .venv/bin/python bench/preflight.py --runs 500 --repeat 2 --seconds 1
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.collect import child_collect  # noqa: E402
from harness.contract.paths import JobPaths  # noqa: E402
from tests.kit import jobdirs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = "bench"
PREFLIGHT_GOAL_S = 30.0
SCORING_GOAL = 0.05


def time_node(seconds: float, repeat: int) -> dict[str, Any]:
    """The device check of this machine in a fresh process each time: wall seconds, best and every one."""
    code = ("import sys, time; t = time.perf_counter(); sys.path.insert(0, sys.argv[1]); "
            "from harness.runner.preflight import preflight_node; "
            "d = preflight_node('bench', budget_s=float(sys.argv[2])); "
            "print(time.perf_counter() - t, len(d['devices']))")
    walls, devices = [], 0
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(seconds)], capture_output=True, text=True,
                             check=True).stdout.split()
        walls.append(float(out[0]))
        devices = int(out[1])
    return {"node_s": min(walls), "all_s": walls, "devices": devices, "seconds_per_figure": seconds,
            "goal_s": PREFLIGHT_GOAL_S, "met": min(walls) < PREFLIGHT_GOAL_S}


def time_slurm(inventory: str, partition: str, seconds: float) -> dict[str, Any]:
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "harness", "preflight", "-i", inventory, "--partition", partition,
                          "--on", "slurm", "--seconds", str(seconds), "--json", "--db",
                          str(Path(tempfile.mkdtemp()) / "r.duckdb")], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    hosts = len({r["host"] for r in json.loads(res.stdout)["rows"]}) if res.stdout.strip().startswith("{") else 0
    return {"wall_s": wall, "hosts": hosts, "exit": res.returncode, "goal_s": PREFLIGHT_GOAL_S,
            "met": wall < PREFLIGHT_GOAL_S}


def generate(workdir: Path, runs: int, steps: int) -> None:
    hosts = ("node1", "node2")
    events = [jobdirs.manifest_events(CAMPAIGN, "finetune_full_benchmark-v1.0.0")]
    for i in range(runs):
        r = jobdirs.make_run(workdir, CAMPAIGN, i, hosts=hosts, gpus_per_host=1, ticks=20)
        events += r["events"]
    jobdirs.append_manifest(workdir, CAMPAIGN, events)


def add_own_times(workdir: Path, steps: int) -> int:
    """Give every rank file of *workdir* ``steps`` own step times (and a matching global step); returns how many."""
    rng = random.Random(7)
    n = 0
    for job in (workdir / CAMPAIGN).iterdir():
        if not job.is_dir():
            continue
        paths = JobPaths(job)
        for rank in (0, 1):
            f = paths.rank_result(rank)
            if not f.exists():
                continue
            doc = json.loads(f.read_text())
            doc["global_step"] = steps
            doc["step_own_s"] = [round(0.1 * (1 + 0.05 * rng.random()), 6) for _ in range(steps)]
            f.write_text(json.dumps(doc))
            n += 1
    return n


def scoring(runs: int, steps: int, repeat: int, base: Path) -> dict[str, Any]:
    plain, timed = base / "plain", base / "timed"
    for wd in (plain, timed):  # each generated in place: a manifest names its job dirs by absolute path
        generate(wd, runs, steps)
        for job in (wd / CAMPAIGN).iterdir():  # the same step count in both, own times only in one
            if job.is_dir():
                for rank in (0, 1):
                    f = JobPaths(job).rank_result(rank)
                    if f.exists():
                        doc = json.loads(f.read_text())
                        doc["global_step"] = steps
                        f.write_text(json.dumps(doc))
    ranks = add_own_times(timed, steps)
    best: dict[str, dict[str, Any]] = {}
    walls: dict[str, list[float]] = {"plain": [], "timed": []}
    child_collect(ROOT, base / "warm.duckdb", plain)  # a first collect warms the file cache for both
    for i in range(repeat):
        order = (("plain", plain), ("timed", timed)) if i % 2 == 0 else (("timed", timed), ("plain", plain))
        for name, wd in order:
            db = base / f"{name}.duckdb"
            db.unlink(missing_ok=True)
            got = child_collect(ROOT, db, wd)
            walls[name].append(got["wall_s"])
            if name not in best or got["wall_s"] < best[name]["wall_s"]:
                best[name] = got
    over = best["timed"]["wall_s"] / best["plain"]["wall_s"] - 1
    return {"runs": runs, "ranks_scored": ranks, "steps": steps, "plain_s": best["plain"]["wall_s"],
            "timed_s": best["timed"]["wall_s"], "plain_cpu_s": best["plain"]["cpu_s"],
            "timed_cpu_s": best["timed"]["cpu_s"], "walls_s": walls, "sample_rows": best["timed"]["sample_rows"],
            "overhead": over, "goal": SCORING_GOAL, "met": over < SCORING_GOAL}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=2.0, help="preflight: seconds per figure and device")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--on", choices=["local", "slurm"], default="local")
    ap.add_argument("-i", "--inventory", default=None)
    ap.add_argument("--partition", default=None)
    ap.add_argument("--skip-scoring", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    if args.on == "slurm":
        if not args.inventory or not args.partition:
            ap.error("--on slurm needs -i INVENTORY and --partition P")
        out["preflight"] = time_slurm(args.inventory, args.partition, args.seconds)
    else:
        out["preflight"] = time_node(args.seconds, args.repeat)
    if not args.skip_scoring:
        base = Path(tempfile.mkdtemp(prefix="sbench-bench-preflight-"))
        try:
            out["scoring"] = scoring(args.runs, args.steps, args.repeat, base)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        p = out["preflight"]
        if "node_s" in p:
            print(f"preflight: {p['node_s']:.1f} s for one node ({p['devices']} device(s), "
                  f"{p['seconds_per_figure']:g} s a figure; goal < {p['goal_s']:g} s: "
                  f"{'met' if p['met'] else 'NOT met'})")
        else:
            print(f"preflight over {p['hosts']} node(s) through srun: {p['wall_s']:.1f} s (exit {p['exit']}; goal < "
                  f"{p['goal_s']:g} s: {'met' if p['met'] else 'NOT met'})")
        s = out.get("scoring")
        if s:
            print(f"rank scoring on collect: {s['runs']} runs, {s['ranks_scored']} ranks x {s['steps']} steps: "
                  f"{s['plain_s']:.2f} s without own step times, {s['timed_s']:.2f} s with: "
                  f"{100 * s['overhead']:+.1f} % (goal < {100 * s['goal']:g} %: {'met' if s['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
