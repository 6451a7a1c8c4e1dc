"""How good a prediction is: a campaign run twice, the second predicted from the first.

The tiny model on the local executor, one sweep of batch sizes (``--batches``, default 2 4 8 16) at a fixed step
count. The first campaign runs the even-indexed batches only (2 and 8) and is collected; ``sbench plan --db``
then predicts every point of the sweep (2 and 8 from their own runs, 4 and 16 from the nearest measured batch,
scaled), and the second campaign runs them all. Per point: the predicted allocation seconds, the measured ones
(``runs.elapsed_s``) and the relative error; the summary gives the median and the largest error for each source
of prediction (the same point, another batch scaled).

Goal: within +-25 % for ``history``. Both campaigns run on the same machine one after the other, so a load that
comes or goes between them is part of the error measured (run it on a quiet machine, and quote the load).

Usage: .venv/bin/python bench/predict.py [--dir /tmp/pred] [--batches 2 4 8 16] [--steps 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.data.datagen import generate_dataset  # noqa: E402
from harness.data.tinymodel import make_tiny_model  # noqa: E402

DATASET = "news-chars-512-entries-4096"  # 256 entries of it (bench/search.py's)
GOAL = 0.25


def sbench(*args: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"sbench {' '.join(map(str, args[:2]))} failed ({proc.returncode})")
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="sbench-predict-"))
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(work / "model")
    gen = work / "gen" / f"{DATASET}.jsonl"
    generate_dataset(DATASET, gen, entries=256)
    data = work / "data"
    data.mkdir(exist_ok=True)
    shutil.copy(gen, data / gen.name)  # no sidecar: used as is
    inv = work / "inv.yaml"
    inv.write_text(yaml.safe_dump({"cluster": "bench", "partitions": {"cpu": {
        "gpu_model": "cpu", "gpus_per_node": 1, "cpus_per_node": 2, "memory_gb": 8,
        "hosts": {"h1": {"address": "127.0.0.1"}}}}}))
    db, runs = work / "r.duckdb", work / "runs"
    common = ["-i", inv, "--executor", "local", "--workdir", runs, "--db", db]

    def sweep(campaign: str, batches: list[int]) -> Path:
        path = work / f"{campaign}.yaml"
        path.write_text(yaml.safe_dump({
            "campaign": campaign, "experiment": "finetune_full_benchmark-v1.0.0", "partition": "cpu",
            "entity": {"model_name": "tiny", "model_max_length": 128, "dataset_id": DATASET, "number_gpus": 1,
                       "gradient_accumulation_steps": 1, "max_steps": args.steps},
            "grid": {"batch_size": batches}, "model_map": {"tiny": str(model)}, "data_dir": str(data)}))
        return path

    first = args.batches[::2]
    sbench("submit", sweep("first", first), *common, "--wait")
    sbench("collect", "--workdir", runs, "--db", db)
    planned = json.loads(sbench("plan", sweep("second", args.batches), "-i", inv, "--db", db, "--json").stdout)
    predicted = {p["entity"]["batch_size"]: p["prediction"] for p in planned if p.get("prediction")}
    sbench("submit", sweep("second", args.batches), *common, "--wait")
    sbench("collect", "--workdir", runs, "--db", db)
    con = duckdb.connect(str(db), read_only=True)
    measured = dict(con.execute("SELECT p.batch_size, r.elapsed_s FROM runs r JOIN points p USING (point_id) "
                                "WHERE r.campaign = 'second' AND r.outcome = 'ok'").fetchall())
    con.close()
    rows = []
    for b in args.batches:
        pred = predicted.get(b) or {}
        got = measured.get(b)
        secs = pred.get("predicted_seconds")
        err = (secs - got) / got if secs is not None and got else None
        rows.append({"batch_size": b, "measured_in_first": b in first, "basis": pred.get("prediction_basis"),
                     "predicted_s": secs, "measured_s": got, "error": err})
    by: dict[str, list[float]] = {}
    for r in rows:
        if r["error"] is not None:
            by.setdefault("same point" if r["measured_in_first"] else "another batch, scaled", []).append(r["error"])
    summary = {k: {"n": len(v), "median_abs_error": statistics.median(abs(x) for x in v),
                   "max_abs_error": max(abs(x) for x in v)} for k, v in by.items()}
    ok = bool(by) and all(s["max_abs_error"] <= GOAL for s in summary.values())
    out = {"rows": rows, "summary": summary, "goal": GOAL, "ok": ok, "load": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in rows:
            e = "-" if r["error"] is None else f"{100 * r['error']:+.1f} %"
            print(f"batch {r['batch_size']:>3}: predicted {r['predicted_s'] or 0:7.1f} s, measured "
                  f"{r['measured_s'] or 0:7.1f} s, error {e:>8}  ({r['basis']})")
        for k, s in summary.items():
            print(f"{k}: {s['n']} point(s), median |error| {100 * s['median_abs_error']:.1f} %, largest "
                  f"{100 * s['max_abs_error']:.1f} %")
        print(f"goal +-{100 * GOAL:.0f} %: {'met' if ok else 'NOT met'} (load {out['load']:.1f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
