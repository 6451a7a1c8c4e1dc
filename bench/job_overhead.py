"""Job start-up, side by side: cold, after ``sbench prepare``, and a prepared re-run.

One point of the full fine-tuning benchmark with the seed's default dataset
(``news-tokens-16384plus-entries-4096``, about 420 MB) and the tiny model, run through the CLI
with the local executor exactly as a user would, in three modes in one run of this script:

* cold: a fresh data dir and ``sbench submit --no-prepare``: the job generates the dataset
  and tokenizes it itself;
* after prepare: a fresh data dir, ``sbench prepare`` (timed), then ``sbench submit``;
* prepared re-run: ``sbench submit --force`` of the same point on the prepared data dir.

Per mode it reports, from the ``run_overhead`` view and the ``stages`` table of one DuckDB
file: job start (the node runner's first event) to the first train stage, the time outside
the train stage, and the dataset / tokens / model_load stages. Also: the dataset generation
rate and the token-counting rate (both cores, no cache) measured on the generated file.

Then, per mode, where the rank's start-up went: its ``launch`` stage's parts (the launcher, the
interpreter, sbench's own imports, the training libraries' imports, the process group), then the data
stages and model_load.

Goal: after prepare, start to first train step <= 12 s on a 2-core machine.

    .venv/bin/python bench/job_overhead.py                 # about 3 minutes
    .venv/bin/python bench/job_overhead.py --keep /tmp/jo  # keep the work dir
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATASET = "news-tokens-16384plus-entries-4096"
SBENCH = [sys.executable, "-m", "harness"]
GOAL_S = 12.0  # after prepare: the node's task start to the first train stage


def sweep(path: Path, campaign: str, data_dir: Path, model: Path, max_len: int, steps: int) -> Path:
    path.write_text(f"""campaign: {campaign}
experiment: finetune_full_benchmark-v1.0.0
entity:
  model_name: tiny
  model_max_length: {max_len}
  dataset_id: {DATASET}
  number_gpus: 1
  batch_size: 1
  gradient_accumulation_steps: 1
  max_steps: {steps}
model_map:
  tiny: {model}
data_dir: {data_dir}
runner:
  sample_interval_s: 0.5
""")
    return path


def run(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(SBENCH + argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sbench {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-seq-length", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: a temporary dir)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="sbench-job-overhead-"))
    if work.exists() and args.keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SBENCH_WORKDIR=str(work / "runs"), SBENCH_DB=str(work / "results.duckdb"),
               PYTHONPATH=str(ROOT))
    env.pop("SBENCH_INVENTORY", None)
    model = work / "models" / "tiny"
    run(["model", "tiny", "-o", str(model)], env)

    cold = sweep(work / "cold.yaml", "overhead-cold", work / "data-cold", model, args.max_seq_length, args.steps)
    prep = sweep(work / "prepared.yaml", "overhead-prepared", work / "data-prepared", model, args.max_seq_length,
                 args.steps)
    times = {"cold": run(["submit", str(cold), "--executor", "local", "--no-prepare", "--wait"], env)}
    t_prepare = run(["prepare", str(prep)], env)
    times["after prepare"] = run(["submit", str(prep), "--executor", "local", "--no-prepare", "--wait"], env)
    times["prepared re-run"] = run(["submit", str(prep), "--executor", "local", "--force", "--wait"], env)
    run(["collect"], env)

    import duckdb

    con = duckdb.connect(str(work / "results.duckdb"), read_only=True)
    rows = con.execute("""
        SELECT r.campaign, r.attempt, o.startup_s, o.outside_train_s, o.allocation_s, o.train_s, o.prepared_in_job,
               (SELECT max(duration_s) FROM stages s WHERE s.run_id = r.run_id AND s.stage = 'dataset'
                    AND s.rank IS NULL) AS runner_dataset_s,
               (SELECT max(duration_s) FROM stages s WHERE s.run_id = r.run_id AND s.stage = 'dataset'
                    AND s.rank IS NOT NULL) AS rank_dataset_s,
               (SELECT max(duration_s) FROM stages s WHERE s.run_id = r.run_id AND s.stage = 'tokens') AS tokens_s,
               (SELECT max(duration_s) FROM stages s WHERE s.run_id = r.run_id AND s.stage = 'model_load') AS load_s,
               r.outcome
        FROM runs r JOIN run_overhead o USING (run_id) ORDER BY r.campaign, r.attempt""").fetchall()
    modes = {("overhead-cold", 1): "cold", ("overhead-prepared", 1): "after prepare",
             ("overhead-prepared", 2): "prepared re-run"}
    print(f"one point: finetune_full_benchmark, {DATASET}, tiny model, max_seq_length {args.max_seq_length}, "
          f"{args.steps} steps, local executor, {os.cpu_count()} cores")
    print(f"sbench prepare (generate + tokenize + count, both cores): {t_prepare:.1f} s\n")
    head = (f"{'mode':<16} {'start->train s':>14} {'outside train s':>15} {'runner dataset s':>16} "
            f"{'rank dataset s':>14} {'tokens s':>8} {'model_load s':>12} {'in-job prep':>11} {'outcome':>8}")
    print(head)
    print("-" * len(head))
    result = {}
    for camp, att, start, outside, alloc, train, in_job, rds, kds, tok, load, outcome in rows:
        mode = modes.get((camp, att), f"{camp}#{att}")
        result[mode] = {"startup_s": start, "outside_train_s": outside, "allocation_s": alloc, "train_s": train,
                        "prepared_in_job": in_job, "submit_wall_s": times.get(mode)}
        print(f"{mode:<16} {start:>14.1f} {outside:>15.1f} {rds or 0:>16.2f} {kds or 0:>14.2f} {tok or 0:>8.2f} "
              f"{load or 0:>12.2f} {'yes' if in_job else 'no':>11} {outcome:>8}")
    cold_s, prep_s = result["cold"]["startup_s"], result["after prepare"]["startup_s"]
    print(f"\ncold / after prepare start-up: {cold_s / prep_s:.1f}x; after prepare {prep_s:.1f} s "
          f"({'meets' if prep_s <= GOAL_S else 'MISSES'} the {GOAL_S:g} s goal)")

    parts = ("launcher_s", "interpreter_s", "runner_imports_s", "imports_s", "rendezvous_s")
    launches = con.execute("""
        SELECT r.campaign, r.attempt, s.duration_s, s.info FROM runs r JOIN stages s USING (run_id)
        WHERE s.stage = 'launch' AND s.rank = 0 ORDER BY r.campaign, r.attempt""").fetchall()
    print("\nthe launch stage (rank 0), s: " + ", ".join(p.removesuffix("_s") for p in parts) + " = launch")
    for camp, att, dur, info in launches:
        got = json.loads(info or "{}")
        mode = modes.get((camp, att), f"{camp}#{att}")
        result[mode]["launch"] = {"launch_s": dur, **{p: got.get(p) for p in parts}}
        print(f"{mode:<16} " + " + ".join(f"{got.get(p) or 0:.2f}" for p in parts) + f" = {dur:.2f}")

    # Rates on the generated file, side by side in this run.
    from harness.data.datagen import generate_dataset
    from harness.data.tokens import dataset_token_counts, load_tokenizer

    gen = generate_dataset(DATASET, work / "gen" / f"{DATASET}.jsonl")
    print(f"dataset generation: {gen.size_bytes / 1e6:.0f} MB in {gen.elapsed_s:.1f} s = "
          f"{gen.size_bytes / 1e6 / gen.elapsed_s:.1f} MB/s")
    tok = load_tokenizer(str(model))  # loading transformers is not counting
    t0 = time.monotonic()
    counts = dataset_token_counts(tok, gen.path, max_seq_length=args.max_seq_length)
    dt = time.monotonic() - t0
    print(f"token counting (no cache, max length {counts.max_length}): {counts.total:,} tokens of {counts.entries} "
          f"entries in {dt:.1f} s = {counts.total / dt / 1e6:.2f}M tokens/s")
    result["rates"] = {"datagen_mb_s": gen.size_bytes / 1e6 / gen.elapsed_s, "count_tokens_s": counts.total / dt,
                       "prepare_s": t_prepare}
    (work / "job_overhead.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
