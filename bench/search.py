"""An adaptive campaign (``search:``) against the full grid of the same sweep, side by side in one bench run.

The tiny model on the local executor, one sweep of three shapes (gradient accumulation 1 to 3) x five batch sizes
(1 to 16), run twice: as a GRID (every point, ``search:`` left out) and as a SEARCH (``batch_size: fit``, ``method:
halving``). The answer is known by construction, from the inventory's ``SBENCH_FAULT``: ``oom@step=1`` on every
batch above a chosen limit per shape (one shape has none), and ``sleep@step=*`` on every step of every point but
one: the fastest, (3, 4), is *not* its shape's largest fitting batch (8), but a batch the bisection measures on
its way there (each shape's first run is its largest batch predicted to fit, 16; then the middle of what is left),
so the search must take the points it measured into the halving to find it. The sleep must
dominate a step (on two loaded cores a step of the tiny model takes up to a second or two): 2 s by default. The
search does not read the faults.

Reported: each campaign's best point (``sbench best`` for the search; the fastest ok point of the grid, from its
measurements) and its largest batch per shape (the grid's largest ok batch); the training seconds of each (the
sum of its runs' train stages) and their ratio (goal: the search at most 35 % of the grid), with the allocation
seconds (the runs' elapsed time) beside; and the error of the search's estimate of the grid's training and
allocation seconds against what the grid took.

    .venv/bin/python bench/search.py                      # about 10 minutes on two loaded cores
    .venv/bin/python bench/search.py --out /tmp/search.json --sleep 3
    .venv/bin/python bench/search.py --fast 2,4 --no-grid  # another fastest point; the search alone
    .venv/bin/python bench/search.py --fast 2,4 --pack 8   # and the same search packed: its fit a scan

With ``--pack N`` the same search runs a second time, packed (``slurm: {pack: N}``, campaign ``scan``): its fit
scans each shape's batches in ascending order in one pack, a batch after its shape's first OOM not started, so
every batch that fits is measured and enters the halving.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATASET = "news-chars-512-entries-4096"
AUTO = "WARMUP_60S_STABLE_120S_OR_10_STEPS"
SHAPES = [1, 2, 3]  # gradient_accumulation_steps
BATCHES = [1, 2, 4, 8, 16]
LIMITS = {1: 4, 2: 16, 3: 8}  # the largest batch that fits, per shape (16: none OOMs)
FAST = (3, 4)  # the one point without sleeps: below its shape's largest fitting batch, measured on the way


def prepare(work: Path) -> tuple[Path, Path]:
    from harness.data.datagen import generate_dataset
    from harness.data.tinymodel import make_tiny_model

    model = make_tiny_model(work / "model")
    gen = work / "gen" / f"{DATASET}.jsonl"
    generate_dataset(DATASET, gen, entries=256)
    data = work / "data"
    data.mkdir()
    shutil.copy(gen, data / gen.name)  # no sidecar: used as is
    return model, data


def sweep_doc(campaign: str, model: Path, data: Path, search: bool, pack: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "campaign": campaign, "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "tiny", "model_max_length": 16, "dataset_id": DATASET, "number_gpus": 1,
                   "max_steps": 400, "auto_stop_method": AUTO},
        "grid": {"batch_size": BATCHES, "gradient_accumulation_steps": SHAPES},
        "runner": {"sample_interval_s": 0.5,
                   "auto_stop": {"method": "precision", "rel_ci": 0.05, "min_steps": 6, "max_seconds": 20}},
        "model_map": {"tiny": str(model)}, "data_dir": str(data)}
    if search:
        doc["search"] = {"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit", "method": "halving"}
    if pack != 1:  # packed: the fit scans each shape's batches in ascending order in one pack
        doc["slurm"] = {"pack": pack}
    return doc


def sbench(*args: Any) -> str:
    proc = subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"sbench {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def spent(db: Path, campaign: str) -> dict[str, float]:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        train = con.execute("SELECT coalesce(sum(d), 0) FROM (SELECT max(s.duration_s) AS d FROM stages s JOIN runs r "
                            "USING (run_id) WHERE r.campaign = ? AND s.stage = 'train' GROUP BY s.run_id)",
                            [campaign]).fetchone()[0]
        alloc, runs = con.execute("SELECT coalesce(sum(elapsed_s), 0), count(*) FROM runs WHERE campaign = ?",
                                  [campaign]).fetchone()
    return {"train_s": float(train), "allocation_s": float(alloc), "runs": int(runs)}


def grid_answer(db: Path, campaign: str) -> dict[str, Any]:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT r.point_id, p.gradient_accumulation_steps, p.batch_size, r.outcome, "
                           "m.dataset_tokens_per_second FROM runs r JOIN points p USING (point_id) LEFT JOIN "
                           "measurements m USING (run_id) WHERE r.campaign = ?", [campaign]).fetchall()
    ok = [r for r in rows if r[3] == "ok" and r[4] is not None]
    best = max(ok, key=lambda r: r[4])
    fits: dict[int, int | None] = {g: None for g in SHAPES}
    for r in ok:
        fits[r[1]] = max(fits[r[1]] or 0, r[2])
    return {"best": best[0], "best_value": best[4], "max_batch_size": fits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sleep", type=float, default=2.0, help="seconds slept after each step of the slow points")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--fast", default=",".join(map(str, FAST)),
                    help="the point without sleeps, as gradient_accumulation_steps,batch_size")
    ap.add_argument("--no-grid", action="store_true", help="run the search alone (its answer against the truth)")
    ap.add_argument("--pack", type=int, default=0,
                    help="also run the search packed (slurm.pack: N, its fit a scan), as campaign 'scan'")
    args = ap.parse_args()
    fast = tuple(int(x) for x in args.fast.split(","))
    from harness.spec.inventory import load_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import load_sweep

    work = Path(tempfile.mkdtemp(prefix="sbench-search-bench-"))
    try:
        model, data = prepare(work)
        runs, db = work / "runs", work / "results.duckdb"
        common = ["--workdir", runs, "--db", db]
        inv_doc: dict[str, Any] = {"cluster": "bench", "partitions": {"cpu": {
            "gpu_model": "cpu", "gpus_per_node": 1, "cpus_per_node": 2, "memory_gb": 8,
            "hosts": {"h1": {"address": "127.0.0.1"}}}}}
        inv = work / "inventory.yaml"
        inv.write_text(yaml.safe_dump(inv_doc))
        sweeps = {}
        searches = ["search", *(["scan"] if args.pack else [])]
        for name, search in (("grid", False), ("search", True), ("scan", True)):
            sweeps[name] = work / f"{name}.yaml"
            sweeps[name].write_text(yaml.safe_dump(sweep_doc(name, model, data, search, args.pack if name == "scan"
                                                             else 1), sort_keys=False))
        points = {(p.entity["gradient_accumulation_steps"], p.entity["batch_size"]): p.point_id
                  for p in plan_sweep(load_sweep(sweeps["grid"]), load_inventory(inv)) if p.repeat == 0}
        faults = [f"oom@step=1,job={pid}." for (g, b), pid in points.items() if b > LIMITS[g]]
        faults += [f"sleep@step=*,job={pid}.:{args.sleep:g}" for (g, b), pid in points.items()
                   if (g, b) != fast and b <= LIMITS[g]]
        inv_doc["partitions"]["cpu"]["env"] = {"SBENCH_FAULT": ";".join(faults)}
        inv.write_text(yaml.safe_dump(inv_doc))

        for name in searches if args.no_grid else ["grid", *searches]:
            print(f"{name}: submit --wait ...", flush=True)
            sbench("submit", sweeps[name], "-i", inv, "--executor", "local", "--wait", *common)
        grid = None if args.no_grid else grid_answer(db, "grid")
        cost = {name: spent(db, name) for name in (searches if args.no_grid else ["grid", *searches])}
        out: dict[str, Any] = {"truth": {"best": points[fast], "max_batch_size": LIMITS}}
        if grid is not None:
            out["grid"] = {**grid, **cost["grid"]}
        for name in searches:
            best = json.loads(sbench("best", name, "--json", *common))
            fits = {m["shape"]["gradient_accumulation_steps"]: m["batch_size"] for m in best["max_batch_size"]}
            ran = {r["point_id"] for r in best["decisions"] if r["action"] != "skipped"}
            row: dict[str, Any] = {
                "best": best["best"]["point_id"] if best["best"] else None,
                "best_value": best["best"]["value"] if best["best"] else None,
                "max_batch_size": fits, "done": best["done"], **cost[name],
                "same_best": bool(best["best"]) and best["best"]["point_id"] == points[fast],
                "fast_measured": points[fast] in ran, "grid_estimate_from": best["grid_estimate_from"]}
            if grid is not None:
                g = cost["grid"]
                row.update({
                    "same_max_batch_size": fits == grid["max_batch_size"],
                    "train_ratio": cost[name]["train_s"] / g["train_s"] if g["train_s"] else None,
                    "allocation_ratio": cost[name]["allocation_s"] / g["allocation_s"] if g["allocation_s"] else None,
                    # its estimate of the grid against the grid itself (estimate / measured - 1)
                    "grid_train_estimate_error": (best["grid_train_s_estimate"] / g["train_s"] - 1
                                                  if g["train_s"] else None),
                    "grid_allocation_estimate_error": (best["grid_allocation_s_estimate"] / g["allocation_s"] - 1
                                                       if g["allocation_s"] else None)})
            out[name] = row
        print(json.dumps(out, indent=2, default=str))
        if grid is not None:
            print(f"\nthe grid: best {grid['best']} at {grid['best_value']:,.0f} tok/s; largest batch per shape "
                  f"{grid['max_batch_size']}; training {cost['grid']['train_s']:.1f} s, allocations "
                  f"{cost['grid']['allocation_s']:.1f} s, {cost['grid']['runs']} runs")
        for name in searches:
            r = out[name]
            line = (f"{name}{' (packed: a scan)' if name == 'scan' else ' (bisection)'}: best {r['best']} (the "
                    f"truth: {points[fast]}, same: {r['same_best']}; measured the truth: {r['fast_measured']}); "
                    f"largest batch per shape {r['max_batch_size']}; training {r['train_s']:.1f} s, allocations "
                    f"{r['allocation_s']:.1f} s in {r['runs']} runs")
            if grid is not None:
                line += (f"; training {100 * (r['train_ratio'] or 0):.1f} % of the grid's, allocations "
                         f"{100 * (r['allocation_ratio'] or 0):.1f} %; its estimate of the grid: training "
                         f"{100 * (r['grid_train_estimate_error'] or 0):+.1f} %, allocations "
                         f"{100 * (r['grid_allocation_estimate_error'] or 0):+.1f} % (each point from: "
                         f"{r['grid_estimate_from']})")
            print(line)
        if args.out:
            args.out.write_text(json.dumps(out, indent=2, default=str))
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
