"""The precision auto-stop method against a long run of the same point: is its throughput right, and how much
time does it save?

One point (the tiny model, LoRA, one process on CPU, run by ``launch.sh`` as the local executor runs it), in
one bench run:

* LONG: ``runner.auto_stop`` method ``precision`` with an unreachable ``rel_ci`` (1e-9), so it trains for
  ``--long`` seconds (``max_seconds``) and measures MSER-5's steady window of that whole run: the reference
  steady-state throughput;
* PRECISION: the same point with ``rel_ci`` ``--rel-ci`` (0.02), ``min_steps`` 10, the same ``max_seconds``.

They run one after the other as PRECISION, LONG, PRECISION (``--reps`` precision runs, one before and the rest
after the long one, so a drift of the machine shows as a difference between them). Reported: each precision
run's throughput (train samples and dataset tokens per second) relative to the long run's steady-state one
(goal: within +-2 %), and its training time as a share of the long run's (goal: <= 25 %), with the window and
interval each found.

REPLAY: the same rule (``harness.runner.steady.PrecisionRule``, as the runner applies it after each step)
replayed on the long run's own step times (rank 0's ``step_end_wall``): where it would have stopped, and
its window's samples per second (batch x steps / their time) against the long run's steady window by the
same definition. Both figures come from one run, so a machine whose load changes between runs (a shared
one) cannot make them differ; only what the rule itself does can.

    .venv/bin/python bench/auto_stop.py                 # about 2 x --long seconds (default 240)
    .venv/bin/python bench/auto_stop.py --long 600 --reps 3 --out /tmp/auto_stop.json
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
AUTO = "WARMUP_60S_STABLE_120S_OR_10_STEPS"


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


def render(work: Path, name: str, model: Path, data: Path, args: argparse.Namespace, rel_ci: float) -> Any:
    from harness.build.render import render_points
    from harness.spec.inventory import local_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import parse_sweep

    doc = {"campaign": "auto-stop", "experiment": "finetune_lora_benchmark-v1.0.0",
           "entity": {"model_name": "tiny", "model_max_length": args.seq, "dataset_id": DATASET, "number_gpus": 1,
                      "batch_size": args.batch, "max_steps": 10**8, "gradient_accumulation_steps": 1,
                      "auto_stop_method": AUTO},
           "model_map": {"tiny": str(model)}, "data_dir": str(data),
           "runner": {"auto_stop": {"method": "precision", "rel_ci": rel_ci, "min_steps": 10,
                                    "max_seconds": args.long}}}
    sweep = parse_sweep(doc, "<auto_stop>", work)
    inv = local_inventory()
    (spec,) = render_points(sweep, inv, plan_sweep(sweep, inv), work / name)
    return spec, next(iter(next(iter(inv.partitions.values())).hosts))


def run(spec: Any, host: str, threads: int) -> dict[str, Any]:
    job = Path(spec.job_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBENCH_"))}
    env.update({"SBENCH_HOST": host, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads)})
    t0 = time.time()
    proc = subprocess.run(["bash", str(job / "launch.sh")], env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run {job.name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    r = json.loads((job / "rank.0.json").read_text())
    m, st = r["metrics"], r["steady_state"] or {}
    return {"job": job.name, "job_dir": str(job),
            "stopped_by": r["stopped_by"], "window": r["window"], "global_step": r["global_step"],
            "train_s": r["totals"]["runtime"], "job_wall_s": wall, "window_s": m["train_runtime"],
            "window_steps": m["train_steps"], "warmup_steps": st.get("warmup_steps"),
            "samples_per_s": m["train_samples_per_second"], "dataset_tokens_per_s": m["dataset_tokens_per_second"],
            "step_time_cv": st.get("step_time_cv"), "ci_rel_halfwidth": st.get("ci_rel_halfwidth")}


def replay(job: Path, rel_ci: float, min_steps: int, max_seconds: float, batch: int) -> dict[str, Any]:
    """The precision rule replayed on a finished run's step times (see the module's REPLAY)."""
    from harness.runner.steady import PrecisionRule, steady_state

    r = json.loads((job / "rank.0.json").read_text())
    ends = [float(x) for x in r["step_end_wall"]]
    times = [b - a for a, b in zip([float(r["train_start_wall"]), *ends[:-1]], ends)]
    full = steady_state(times)
    assert full is not None
    ref = batch * full.steps / sum(times[full.start:])
    rule = PrecisionRule(rel_ci, min_steps, max_seconds)
    elapsed = 0.0
    for k in range(1, len(times) + 1):
        elapsed += times[k - 1]
        stop, reason, found = rule.decide(times[:k], elapsed)
        if stop and found is not None:
            got = batch * found.steps / sum(times[found.start:k])
            return {"stopped_by": reason, "steps": k, "window": [found.start, k], "train_s": elapsed,
                    "ci_rel_halfwidth": found.rel, "samples_per_s": got, "long_steps": len(times),
                    "long_window": [full.start, len(times)], "long_train_s": sum(times), "long_samples_per_s": ref,
                    "samples_per_s_vs_long": got / ref - 1, "train_time_share": elapsed / sum(times)}
    return {"stopped_by": None, "long_steps": len(times), "long_samples_per_s": ref}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long", type=float, default=240.0, help="seconds of training of the long run (default 240)")
    ap.add_argument("--rel-ci", type=float, default=0.02, help="the precision runs' rel_ci (default 0.02)")
    ap.add_argument("--reps", type=int, default=2, help="precision runs: one before the long run, the rest after")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128, help="model_max_length (default 128)")
    ap.add_argument("--entries", type=int, default=512, help="dataset entries (default 512)")
    ap.add_argument("--threads", type=int, default=1, help="OMP/torch threads of the trainer (default 1)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sbench-auto-stop-"))
    try:
        model, data = prepare(work, args.entries)
        runs: list[tuple[str, dict[str, Any]]] = []
        order = ["precision"] + ["long"] + ["precision"] * max(0, args.reps - 1)
        for i, kind in enumerate(order):
            spec, host = render(work, f"{kind}{i}", model, data, args, 1e-9 if kind == "long" else args.rel_ci)
            res = run(spec, host, args.threads)
            runs.append((kind, res))
            print(kind, json.dumps(res), flush=True)
        long = next(r for k, r in runs if k == "long")
        report: dict[str, Any] = {"long": long, "precision": [], "settings": {
            "long_s": args.long, "rel_ci": args.rel_ci, "batch": args.batch, "seq": args.seq,
            "threads": args.threads, "load_avg": os.getloadavg()}}
        report["replay"] = replay(Path(long["job_dir"]), args.rel_ci, 10, args.long, args.batch)
        for kind, r in runs:
            if kind != "precision":
                continue
            report["precision"].append({
                **r, "samples_per_s_vs_long": r["samples_per_s"] / long["samples_per_s"] - 1,
                "dataset_tokens_per_s_vs_long": r["dataset_tokens_per_s"] / long["dataset_tokens_per_s"] - 1,
                "train_time_share": r["train_s"] / long["train_s"],
                "job_wall_share": r["job_wall_s"] / long["job_wall_s"]})
        text = json.dumps(report, indent=2)
        print(text)
        if args.out:
            args.out.write_text(text)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
