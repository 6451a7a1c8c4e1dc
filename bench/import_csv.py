"""A published CSV of a million rows: ``sbench import --format ado-csv`` in bounded memory and time.

It writes a CSV of ``--rows`` rows with the published columns (the reference's column names; made-up values,
with ``--points`` distinct points, so most rows are repeats, and one row in 50 bad: a negative throughput, a
batch_size the is_valid rules refuse, a word where a number goes), then imports it as a user does, a fresh
``sbench`` process into a fresh database, and reads back what it wrote. It reports the file's size, the wall
seconds, the process's peak resident memory (``ru_maxrss`` of the child) and the rows written and skipped, and
checks the counts against what it wrote.

Goals (a 2-core machine): a million rows in at most 60 s and 1 GiB.

Usage: .venv/bin/python bench/import_csv.py [--rows 1000000] [--points 2000] [--dir /tmp/imp] [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

ROOT = Path(__file__).resolve().parents[1]
SBENCH = [sys.executable, "-m", "harness"]
HEADER = ["model_name", "method", "number_gpus", "number_nodes", "gpu_model", "tokens_per_sample", "batch_size",
          "enable_roce", "torch_dtype", "is_valid", "dataset_tokens_per_second", "train_tokens_per_second",
          "gpu_compute_utilization_avg", "gpu_power_watts_avg", "model_load_time", "train_runtime",
          "cpu_compute_utilization", "identifier"]
GOAL_S, GOAL_MB = 60.0, 1024.0
BAD_EVERY = 50


def write_csv(path: Path, rows: int, points: int) -> int:
    """The file; returns how many of its rows are bad on purpose."""
    bad = 0
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        for i in range(rows):
            p = i % points
            gpus = 1 << (p % 4)
            batch = gpus * (1 + p // 4 % 64)
            tps = 1000.0 + (i * 7919) % 5000
            row = ["smollm2-135m", "full", gpus, 1, "NVIDIA-A100-80GB-PCIe", 512, batch, "False", "bfloat16", "True",
                   tps, tps * 0.97, 88.5, 310.0, 1.5, 12.25, 87.5, f"id-{i}"]
            if i % BAD_EVERY == BAD_EVERY - 1:
                bad += 1
                kind = i // BAD_EVERY % 3
                if kind == 0:
                    row[10] = -tps  # a negative throughput
                elif kind == 1:
                    row[6] = -4  # a batch size the is_valid rules refuse (rule 4), said valid
                else:
                    row[2] = "two"  # not a number
            w.writerow(row)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="sbench-import-"))
    work.mkdir(parents=True, exist_ok=True)
    src, db = work / "published.csv", work / "r.duckdb"
    db.unlink(missing_ok=True)
    bad = write_csv(src, args.rows, args.points)
    t0 = time.monotonic()
    proc = subprocess.run([*SBENCH, "import", "--format", "ado-csv", str(src), "--campaign", "published",
                           "--db", str(db), "--json"], cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return 1
    rep = json.loads(proc.stdout)
    con = duckdb.connect(str(db), read_only=True)
    stored = con.execute("SELECT count(*) FROM measurements WHERE campaign = 'published'").fetchone()
    con.close()
    out: dict[str, Any] = {"rows": args.rows, "file_mb": round(src.stat().st_size / 2**20, 1), "wall_s": round(wall, 1),
                           "peak_rss_mb": round(peak_mb), "imported": rep["imported"],
                           "skipped": rep["skipped_count"], "stored": stored[0] if stored else None,
                           "goal": {"wall_s": GOAL_S, "peak_rss_mb": GOAL_MB}}
    out["ok"] = (rep["imported"] == out["stored"] == args.rows - bad and rep["skipped_count"] == bad
                 and wall <= GOAL_S and peak_mb <= GOAL_MB)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.rows} rows ({out['file_mb']} MiB): {out['wall_s']} s, peak {out['peak_rss_mb']} MiB; "
              f"imported {out['imported']}, skipped {out['skipped']} (wrote {bad} bad); "
              f"goal <= {GOAL_S:.0f} s and <= {GOAL_MB:.0f} MiB: {'met' if out['ok'] else 'NOT met'}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
