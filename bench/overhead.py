"""What the runner's instruments cost: training throughput with and without them, side by side.

A = the job as ``launch.sh`` runs it: the node runner, its sampler and stage logging at their
    default settings (``runner:`` left out of the sweep, so ``sample_interval_s`` is 1.0).
B = the very same training command run directly: no node runner, so no sampler, and stage
    logging off (``SBENCH_STAGE_LOG=0``).

Both measure throughput with the trainer's own step timing (``rank.0.json`` metrics), so the
instrument is identical; A and B alternate (ABAB..., then BABA...) so drifting machine load
hits both. Reports the medians and the ratio A/B (target >= 0.99).

    .venv/bin/python bench/overhead.py --reps 4 --steps 60 --out /tmp/overhead.json
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATASET = "news-chars-512-entries-4096"


def prepare(work: Path, entries: int) -> tuple[Path, Path]:
    from harness.datagen import generate_dataset
    from harness.tinymodel import make_tiny_model

    model = make_tiny_model(work / "model")
    gen = work / "gen" / f"{DATASET}.jsonl"
    generate_dataset(DATASET, gen, entries=entries)
    data = work / "data"
    data.mkdir()
    shutil.copy(gen, data / gen.name)  # no sidecar: used as is (an "external" dataset)
    return model, data


def render(work: Path, name: str, model: Path, data: Path, args: argparse.Namespace):
    from harness.inventory import local_inventory
    from harness.plan import parse_sweep, plan_sweep
    from harness.render import render_points

    doc = {"campaign": "overhead", "experiment": "finetune_lora_benchmark-v1.0.0",
           "entity": {"model_name": "tiny", "model_max_length": args.seq, "dataset_id": DATASET, "number_gpus": 1,
                      "batch_size": args.batch, "max_steps": args.steps, "gradient_accumulation_steps": 1},
           "model_map": {"tiny": str(model)}, "data_dir": str(data)}
    sweep = parse_sweep(doc, "<overhead>", work)
    inv = local_inventory()
    (spec,) = render_points(sweep, inv, plan_sweep(sweep, inv), work / name)
    return spec, next(iter(next(iter(inv.partitions.values())).hosts))


def env_base(host: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBENCH_"))}
    env.update({"SBENCH_HOST": host, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    return env


def run_a(spec, host: str) -> dict:
    job = Path(spec.job_dir)
    proc = subprocess.run(["bash", str(job / "launch.sh")], env=env_base(host), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"A run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads((job / f"result.{host}.json").read_text())
    return {"metrics": res["training"]["metrics"], "samples": res["samples"]}


def run_b(spec, host: str, work: Path, k: int) -> dict:
    job = work / f"B{k}"
    argv = list(spec.train_argv)
    argv[argv.index("--job_dir") + 1] = str(job)
    argv[argv.index("--output_dir") + 1] = str(job / "output")
    env = env_base(host)
    env["SBENCH_STAGE_LOG"] = "0"
    proc = subprocess.run([spec.python, "-m", "harness.runner.train", *argv], env=env, capture_output=True,
                          text=True, cwd=str(ROOT))
    if proc.returncode != 0:
        raise SystemExit(f"B run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if (job / f"stages.{host}.jsonl").exists():
        raise SystemExit("B run wrote stage events; SBENCH_STAGE_LOG=0 was ignored")
    return {"metrics": json.loads((job / "rank.0.json").read_text())["metrics"], "samples": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=4, help="A/B pairs (default 4)")
    ap.add_argument("--steps", type=int, default=60, help="optimiser steps per run (default 60)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128, help="model_max_length (default 128)")
    ap.add_argument("--entries", type=int, default=512, help="dataset entries (default 512)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sbench-overhead-"))
    t0 = time.time()
    try:
        model, data = prepare(work, args.entries)
        runs: list[dict] = []
        for k in range(args.reps):
            order = "AB" if k % 2 == 0 else "BA"
            for which in order:
                if which == "A":
                    spec, host = render(work, f"A{k}", model, data, args)
                    r = run_a(spec, host)
                else:
                    spec, host = render(work, f"Bspec{k}", model, data, args)
                    r = run_b(spec, host, work, k)
                m = r["metrics"]
                runs.append({"rep": k, "variant": which, "train_steps_per_second": m["train_steps_per_second"],
                             "train_tokens_per_second": m["train_tokens_per_second"],
                             "train_runtime": m["train_runtime"], "train_steps": m["train_steps"],
                             "samples_rows": r["samples"]})
                print(f"rep {k} {which}: {m['train_steps_per_second']:.3f} steps/s "
                      f"({m['train_steps']} steps in {m['train_runtime']:.2f} s)", file=sys.stderr, flush=True)
        a = [r["train_steps_per_second"] for r in runs if r["variant"] == "A"]
        b = [r["train_steps_per_second"] for r in runs if r["variant"] == "B"]
        pairs = [ra["train_steps_per_second"] / rb["train_steps_per_second"]
                 for ra, rb in zip([r for r in runs if r["variant"] == "A"], [r for r in runs if r["variant"] == "B"])]
        report = {
            "what": "train_steps_per_second with node runner + sampler + stage logging at defaults (A) "
                    "vs the same training command alone, stage logging off (B)",
            "settings": {"reps": args.reps, "steps": args.steps, "batch": args.batch, "seq": args.seq,
                         "entries": args.entries, "sample_interval_s": 1.0},
            "median_a": statistics.median(a), "median_b": statistics.median(b),
            "ratio_of_medians": statistics.median(a) / statistics.median(b),
            "median_pair_ratio": statistics.median(pairs), "pair_ratios": pairs,
            "runs": runs, "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(),
            "elapsed_s": round(time.time() - t0, 1),
        }
        text = json.dumps(report, indent=2)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
