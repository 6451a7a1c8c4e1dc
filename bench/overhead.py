"""What the runner's instruments cost: training throughput with and without them, side by side.

A = the job as ``launch.sh`` runs it: the node runner, its sampler and stage logging at their
    default settings (``runner:`` left out of the sweep, so ``sample_interval_s`` is 1.0).
B = the very same training command run directly: no node runner, so no sampler, and stage
    logging off (``SBENCH_STAGE_LOG=0``).

Two ways of putting A and B side by side:

* ``--mode inrun`` (default): ONE long training run under ``launch.sh``. The bench alternately
  freezes (SIGSTOP) and resumes (SIGCONT) the node runner every ``--block`` seconds; the trainer,
  its child, keeps going. Resumed blocks are A (sampler and stage logging live), frozen blocks are
  B (no instrument runs at all). The trainer's per-step end times (``rank.0.json``
  ``step_end_wall``) give the step rate of every block; A and B interleave many times inside one
  process, so machine drift and start-up noise cancel. Reports sum(A steps)/sum(A time) over the
  same for B.
* ``--mode separate``: whole runs alternated (ABAB..., then BABA...): A through ``launch.sh``, B the
  very same training command alone with stage logging off. Honest too, but run-to-run noise on a
  shared 2-core VM (+-15 %) swamps a 1 % effect unless reps are very many.

Target: ratio >= 0.99.

    .venv/bin/python bench/overhead.py                          # in-run, about 4 minutes
    .venv/bin/python bench/overhead.py --mode separate --reps 8 --steps 300
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
    from harness.data.datagen import generate_dataset
    from harness.data.tinymodel import make_tiny_model

    model = make_tiny_model(work / "model")
    gen = work / "gen" / f"{DATASET}.jsonl"
    generate_dataset(DATASET, gen, entries=entries)
    data = work / "data"
    data.mkdir()
    shutil.copy(gen, data / gen.name)  # no sidecar: used as is (an "external" dataset)
    return model, data


def render(work: Path, name: str, model: Path, data: Path, args: argparse.Namespace):
    from harness.build.render import render_points
    from harness.spec.inventory import local_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import parse_sweep

    doc = {"campaign": "overhead", "experiment": "finetune_lora_benchmark-v1.0.0",
           "entity": {"model_name": "tiny", "model_max_length": args.seq, "dataset_id": DATASET, "number_gpus": 1,
                      "batch_size": args.batch, "max_steps": args.steps, "gradient_accumulation_steps": 1},
           "model_map": {"tiny": str(model)}, "data_dir": str(data)}
    sweep = parse_sweep(doc, "<overhead>", work)
    inv = local_inventory()
    (spec,) = render_points(sweep, inv, plan_sweep(sweep, inv), work / name)
    return spec, next(iter(next(iter(inv.partitions.values())).hosts))


THREADS = {"n": 1}


def env_base(host: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBENCH_"))}
    env.update({"SBENCH_HOST": host, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(THREADS["n"])})
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


def in_run(work: Path, model: Path, data: Path, args: argparse.Namespace) -> dict:
    """One run; freeze/resume the node runner in alternating blocks; compare step rates."""
    import signal

    spec, host = render(work, "inrun", model, data, args)
    job = Path(spec.job_dir)
    proc = subprocess.Popen(["bash", str(job / "launch.sh")], env=env_base(host), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # launch.sh execs the node runner: proc.pid is it
    stages = job / f"stages.{host}.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if stages.exists() and '"stage":"train"' in stages.read_text().replace(" ", ""):
            break
        time.sleep(0.2)
    time.sleep(args.block)  # past the first steps
    import psutil

    runner = psutil.Process(proc.pid)
    cpu0, wall0 = sum(runner.cpu_times()[:2]), time.time()
    cpu_last, wall_last = cpu0, wall0
    blocks: list[tuple[str, float, float]] = []
    state = "A"
    try:
        while proc.poll() is None:
            try:
                cpu_last, wall_last = sum(runner.cpu_times()[:2]), time.time()
            except psutil.Error:
                pass
            t0 = time.time()
            if state == "B":
                os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(args.block)
            if state == "B":
                os.kill(proc.pid, signal.SIGCONT)
            blocks.append((state, t0, time.time()))
            state = "B" if state == "A" else "A"
    finally:
        try:
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        proc.wait()
    rank0 = json.loads((job / "rank.0.json").read_text())
    ends = rank0["step_end_wall"]
    per = {"A": [0, 0.0], "B": [0, 0.0]}
    rates = {"A": [], "B": []}
    last_end = ends[-1] if ends else 0
    for which, b0, b1 in blocks:
        if b1 > last_end:  # the run ended inside this block
            break
        n = sum(1 for t in ends if b0 <= t < b1)
        per[which][0] += n
        per[which][1] += b1 - b0
        rates[which].append(n / (b1 - b0))
    a = per["A"][0] / per["A"][1]
    b = per["B"][0] / per["B"][1]
    pairs = [ra / rb for ra, rb in zip(rates["A"], rates["B"]) if rb > 0]  # neighbours: A then B
    return {"mode": "inrun", "blocks": {k: len(v) for k, v in rates.items()}, "block_s": args.block,
            "steps_a": per["A"][0], "steps_b": per["B"][0], "rate_a": a, "rate_b": b, "ratio": a / b,
            "median_block_rate_a": statistics.median(rates["A"]), "median_block_rate_b": statistics.median(rates["B"]),
            "ratio_of_block_medians": statistics.median(rates["A"]) / statistics.median(rates["B"]),
            "median_pair_ratio": statistics.median(pairs), "block_rates": rates,
            "samples_rows": sum(1 for _ in (job / f"samples.{host}.csv").open()) - 1,
            # The instruments' own CPU (node runner: sampler thread + wait loop), as a share of one core.
            "runner_cpu_s": round(cpu_last - cpu0, 3), "runner_cpu_share_of_a_core":
                (cpu_last - cpu0) / max(1e-9, wall_last - wall0) * 2}  # frozen half the time: x2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["inrun", "separate"], default="inrun")
    ap.add_argument("--block", type=float, default=3.0, help="in-run: seconds per A or B block (default 3)")
    ap.add_argument("--reps", type=int, default=4, help="separate: A/B pairs (default 4)")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimiser steps per run (default: 4000 in-run, 60 separate)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128, help="model_max_length (default 128)")
    ap.add_argument("--entries", type=int, default=512, help="dataset entries (default 512)")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP/torch threads of the trainer in both arms (default 1: on a 2-core machine a trainer "
                         "using every core turns any other activity into noise larger than the effect measured; "
                         "on GPU nodes the trainer leaves CPU cores to spare, as here)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    THREADS["n"] = args.threads

    work = Path(tempfile.mkdtemp(prefix="sbench-overhead-"))
    t0 = time.time()
    if args.steps is None:
        args.steps = 4000 if args.mode == "inrun" else 60
    try:
        model, data = prepare(work, args.entries)
        if args.mode == "inrun":
            report = in_run(work, model, data, args)
            report.update({"what": "steps/s of one training run while the node runner (sampler + stage logging at "
                                   "defaults) runs (A) vs while it is frozen (B), alternating blocks",
                           "settings": {"steps": args.steps, "batch": args.batch, "seq": args.seq,
                                        "sample_interval_s": 1.0, "threads": args.threads},
                           "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(),
                           "elapsed_s": round(time.time() - t0, 1)})
            text = json.dumps(report, indent=2)
            print(text)
            if args.out:
                args.out.write_text(text + "\n")
            return 0
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
                         "entries": args.entries, "sample_interval_s": 1.0, "threads": args.threads},
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
