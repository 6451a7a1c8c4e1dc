"""Several points per allocation (``slurm.pack``) against one job per point, on the SLURM test cluster.

An 8-point batch-size scan of one shape (the tiny model, full fine-tuning, one process on the ``cpu``
partition of ``tests/fixtures/inventory/testcluster.yaml``), submitted through the CLI as a user would, in
the order UNPACKED, PACKED, PACKED, UNPACKED (so that a drift of the machine's load weighs on both alike):

* PACKED: ``slurm.pack: 8``: one allocation runs the eight points one after another, in ascending batch size;
* UNPACKED: ``slurm.pack: 1`` and ``slurm.max_parallel: 1``: eight array tasks, one at a time (so that no two
  points share the machine, as none does in the pack).

Reported, from SLURM's accounting (``sacct``: each allocation's ElapsedRaw) and the results database:

* allocation seconds per measured point, packed and unpacked, and their ratio (goal: >= 2x less packed);
* the campaign's wall time from submit to the last job's end;
* per point: the throughput (dataset tokens per second over the measured window: by default the precision
  auto-stop's steady window, so that the first steps of a fresh process do not weigh in) packed / unpacked,
  and each one's start-up (node runner start to the first train stage, ``run_overhead.startup_s``) and
  measured seconds.

    .venv/bin/python bench/packing.py                     # about 8 minutes on a 2-core machine
    .venv/bin/python bench/packing.py --rel-ci 0 --steps 20 --out /tmp/packing.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATASET = "news-chars-512-entries-4096"
INVENTORY = ROOT / "tests" / "fixtures" / "inventory" / "testcluster.yaml"
SBENCH = [sys.executable, "-m", "harness"]
BATCHES = [1, 2, 3, 4, 5, 6, 7, 8]


def prepare(work: Path, entries: int) -> tuple[Path, Path]:
    from harness.data.datagen import generate_dataset
    from harness.data.tinymodel import make_tiny_model

    model = make_tiny_model(work / "model")
    gen = work / "gen" / f"{DATASET}.jsonl"
    generate_dataset(DATASET, gen, entries=entries)
    data = work / "data"
    data.mkdir()
    shutil.copy(gen, data / gen.name)  # no sidecar: used as is (an "external" dataset)
    return model, data


def sweep(path: Path, campaign: str, model: Path, data: Path, args: argparse.Namespace, pack: int) -> Path:
    slurm = {"pack": pack} if pack > 1 else {"pack": 1, "max_parallel": 1}
    entity: dict[str, Any] = {"model_name": "tiny", "model_max_length": 64, "dataset_id": DATASET, "number_gpus": 1,
                              "gradient_accumulation_steps": 1, "max_steps": args.steps}
    runner: dict[str, Any] = {"sample_interval_s": 0.5}
    if args.rel_ci:
        # the precision auto-stop: each point's throughput over its steady window (MSER-5), not its warm-up
        entity.update(max_steps=10**8, auto_stop_method="WARMUP_60S_STABLE_120S_OR_10_STEPS")
        runner["auto_stop"] = {"method": "precision", "rel_ci": args.rel_ci, "min_steps": 10,
                               "max_seconds": args.max_seconds}
    doc = {"campaign": campaign, "experiment": "finetune_full_benchmark-v1.0.0", "partition": "cpu",
           "entity": entity, "grid": {"batch_size": BATCHES}, "model_map": {"tiny": str(model)},
           "data_dir": str(data), "runner": runner, "slurm": slurm}
    path.write_text(json.dumps(doc, indent=1))
    return path


def sbench(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(SBENCH + argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sbench {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def allocations(job_ids: set[str]) -> dict[str, dict[str, Any]]:
    """sacct's word on each allocation: elapsed seconds, start and end (epoch)."""
    out: dict[str, dict[str, Any]] = {}
    for _ in range(20):  # sacct trails slurmctld
        res = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,ElapsedRaw,Start,End,State", "-j",
                              ",".join(sorted(job_ids))], capture_output=True, text=True)
        out = {}
        for line in res.stdout.splitlines():
            jid, el, start, end, state = line.split("|")[:5]
            if jid in job_ids and end not in ("Unknown", "None", ""):
                out[jid] = {"elapsed_s": int(el), "start": start, "end": end, "state": state}
        if len(out) == len(job_ids):
            return out
        time.sleep(1)
    sys.exit(f"sacct did not report every allocation: {sorted(job_ids - set(out))}")


def campaign(env: dict[str, str], db: Path, sweep_path: Path, name: str) -> dict[str, Any]:
    import duckdb

    t0 = time.time()
    rep = json.loads(sbench(["submit", str(sweep_path), "-i", str(INVENTORY), "--executor", "slurm", "--wait",
                             "--json"], env))
    wall = time.time() - t0
    time.sleep(2)
    sbench(["collect"], env)
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT p.batch_size, r.outcome, r.job_id, m.dataset_tokens_per_second, m.train_runtime, o.startup_s "
            "FROM runs r JOIN points p USING (point_id) LEFT JOIN measurements m USING (run_id) "
            "LEFT JOIN run_overhead o USING (run_id) WHERE r.campaign = ? ORDER BY p.batch_size", [name]).fetchall()
    finally:
        con.close()
    points = [{"batch_size": b, "outcome": o, "job_id": j, "dataset_tokens_per_second": t, "train_s": tr,
               "startup_s": s} for b, o, j, t, tr, s in rows]
    jobs = allocations({str(p["job_id"]) for p in points})
    measured = sum(1 for p in points if p["outcome"] == "ok")
    alloc = sum(j["elapsed_s"] for j in jobs.values())
    return {"campaign": name, "submitted": rep["submitted"], "sbatch_calls": rep["sbatch_calls"],
            "allocations": len(jobs), "allocation_s": alloc, "measured": measured,
            "allocation_s_per_point": alloc / measured if measured else None, "submit_to_end_s": round(wall, 1),
            "points": points, "jobs": jobs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="optimiser steps per point without --rel-ci (default 20)")
    ap.add_argument("--rel-ci", type=float, default=0.03,
                    help="the precision auto-stop's rel_ci (default 0.03; 0: --steps steps, warm-up included)")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="the precision auto-stop's max_seconds")
    ap.add_argument("--entries", type=int, default=256, help="dataset entries (default 256)")
    ap.add_argument("--rounds", type=int, default=2, choices=(1, 2),
                    help="2 (default): unpacked, packed, packed, unpacked; 1: unpacked, packed")
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: a temporary dir)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="sbench-packing-"))
    if args.keep and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    db = work / "results.duckdb"
    env = dict(os.environ, SBENCH_WORKDIR=str(work / "runs"), SBENCH_DB=str(db), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    model, data = prepare(work, args.entries)
    load = os.getloadavg()
    # ABBA: unpacked, packed, packed, unpacked (a drift of the machine's load weighs on both alike)
    runs: dict[str, list[dict[str, Any]]] = {"packed": [], "unpacked": []}
    for k, kind in enumerate(["unpacked", "packed", "packed", "unpacked"][:2 * args.rounds]):
        name = f"{kind}-{k}"
        pack = len(BATCHES) if kind == "packed" else 1
        runs[kind].append(campaign(env, db, sweep(work / f"{name}.json", name, model, data, args, pack), name))

    def mean(xs: list[Any]) -> float | None:
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None

    per_point = []
    for i, b in enumerate(BATCHES):
        tp = mean([c["points"][i]["dataset_tokens_per_second"] for c in runs["packed"]])
        tu = mean([c["points"][i]["dataset_tokens_per_second"] for c in runs["unpacked"]])
        rounds = [c["points"][i]["dataset_tokens_per_second"] for c in runs["unpacked"]]
        per_point.append({
            "batch_size": b, "tok_s_packed": tp, "tok_s_unpacked": tu,
            "throughput_packed_over_unpacked": tp / tu if tp and tu else None,
            # the noise of repeats: the two unpacked rounds against each other
            "unpacked_round_ratio": rounds[-1] / rounds[0] if len(rounds) > 1 and rounds[0] and rounds[-1] else None,
            "startup_s_packed": mean([c["points"][i]["startup_s"] for c in runs["packed"]]),
            "startup_s_unpacked": mean([c["points"][i]["startup_s"] for c in runs["unpacked"]]),
            "train_s_packed": mean([c["points"][i]["train_s"] for c in runs["packed"]]),
            "train_s_unpacked": mean([c["points"][i]["train_s"] for c in runs["unpacked"]])})
    alloc = {kind: sum(c["allocation_s"] for c in cs) / sum(c["measured"] for c in cs) for kind, cs in runs.items()}
    out = {"load_before": load, "load_after": os.getloadavg(), "steps": args.steps, "rel_ci": args.rel_ci,
           "campaigns": runs, "per_point": per_point, "allocation_s_per_point": alloc,
           "allocation_s_per_point_ratio": alloc["unpacked"] / alloc["packed"]}
    print(f"load before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: {out['load_after'][0]:.2f}")
    for c in runs["unpacked"] + runs["packed"]:
        print(f"{c['campaign']:11s} allocations {c['allocations']}, measured {c['measured']}/{len(BATCHES)}, "
              f"allocation {c['allocation_s']} s = {c['allocation_s_per_point']:.1f} s per point, "
              f"submit to end {c['submit_to_end_s']} s")
    print(f"allocation seconds per point: unpacked {alloc['unpacked']:.1f}, packed {alloc['packed']:.1f}: "
          f"{out['allocation_s_per_point_ratio']:.2f}x")
    print("batch  tok/s packed  unpacked  packed/unpacked  unpacked round2/round1  startup packed  unpacked  "
          "train packed  unpacked")
    for r in per_point:
        t, n = r["throughput_packed_over_unpacked"], r["unpacked_round_ratio"]
        print(f"{r['batch_size']:5d}  {r['tok_s_packed'] or 0:12.1f}  {r['tok_s_unpacked'] or 0:8.1f}  "
              f"{t if t is None else f'{t:.3f}':>15}  {n if n is None else f'{n:.3f}':>22}  "
              f"{r['startup_s_packed'] or 0:14.2f}  {r['startup_s_unpacked'] or 0:8.2f}  "
              f"{r['train_s_packed'] or 0:12.2f}  {r['train_s_unpacked'] or 0:8.2f}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
