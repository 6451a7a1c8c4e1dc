"""Benchmark the re-check of data that is already prepared (what every `sbench prepare` and `sbench submit`
does before it submits): the full check against the stamped one, side by side.

- **full check**: the stamps removed, so the check loads the tokenizer (importing transformers), hashes the
  dataset file and the prepared entry, and reads the token counts: what every re-check did before stamps;
- **stamped check**: sizes and mtimes unchanged since the last full check, so nothing is loaded or hashed.

Each measurement is a fresh `python -m harness prepare SWEEP --json` process; "check" is the sum of the
seconds its items report (the re-check itself), "command" the process's wall time (Python start-up and
sbench's imports included). Prints the median of --repeats runs of each.

Usage: .venv/bin/python bench/prepare_check.py [--dataset news-tokens-16384plus-entries-4096] [--repeats 3]
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
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def prepare(sweep: Path) -> tuple[float, float, list[dict]]:
    """(check seconds, command seconds, items) of one `sbench prepare` process."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "harness", "prepare", str(sweep), "--json"], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sbench prepare failed:\n{proc.stdout}\n{proc.stderr}")
    items = json.loads(proc.stdout)["items"]
    return sum(i["seconds"] for i in items), wall, items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="news-tokens-16384plus-entries-4096", help="a catalog dataset id")
    ap.add_argument("--max-seq-length", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = ap.parse_args()
    from harness.data.prepared import PREP_DIR, STAMP_DIR
    from harness.data.tinymodel import make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="sbench-bench-prepare-"))
    try:
        model = make_tiny_model(tmp / "tiny")
        data = tmp / "data"
        sweep = tmp / "sweep.yaml"
        sweep.write_text(yaml.safe_dump({
            "campaign": "bench-prepare", "experiment": "finetune_lora_benchmark-v1.0.0",
            "entity": {"model_name": "tiny", "model_max_length": args.max_seq_length, "number_gpus": 1,
                       "batch_size": 1, "dataset_id": args.dataset},
            "model_map": {"tiny": str(model)}, "data_dir": str(data)}))
        t0 = time.perf_counter()
        _, _, items = prepare(sweep)
        size = next(i["size_bytes"] for i in items if i["kind"] == "dataset")
        print(f"first prepare (generate + tokenize {args.dataset}, {size / 1e6:.0f} MB): "
              f"{time.perf_counter() - t0:.1f} s")
        results: dict[str, list[tuple[float, float]]] = {"full": [], "stamped": []}
        for _ in range(args.repeats):
            for mode in ("full", "stamped"):
                if mode == "full":  # the stamped run that follows finds the stamp this one writes
                    shutil.rmtree(data / PREP_DIR / STAMP_DIR, ignore_errors=True)
                check, wall, items = prepare(sweep)
                stamp = {i.get("stamp") for i in items if i["kind"] == "training_data"}
                assert stamp == ({"hit"} if mode == "stamped" else {"no stamp yet"}), (mode, stamp)
                assert {i["status"] for i in items} == {"ready"}, items
                results[mode].append((check, wall))
        print(f"\nre-check of prepared data, median of {args.repeats} (seconds):")
        print(f"{'':28s}{'check':>10s}{'command':>10s}")
        for mode, label in (("full", "full check (before stamps)"), ("stamped", "stamped check")):
            check = statistics.median(c for c, _ in results[mode])
            wall = statistics.median(w for _, w in results[mode])
            print(f"{label:28s}{check:10.3f}{wall:10.2f}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
