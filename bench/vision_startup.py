"""Start-up of a prepared vision job against a prepared text job, side by side.

Two points of the full fine-tuning benchmark with sbench's trainer, the local executor and the seed's
datasets as ``sbench dataset generate`` writes them, run through the CLI exactly as a user would:

* TEXT: the tiny text model on ``news-tokens-16384plus-entries-4096`` (the seed's default dataset);
* VISION: the tiny vision-language model (``sbench model tiny --vision``) on
  ``vision-384x384-16384plus-entries-4096``.

Both are prepared first (``sbench prepare``, timed), then run alternately TEXT, VISION, TEXT, VISION
(``submit --force`` for the second round), so that a drift of the machine's load weighs on both alike. A
third mode, VISION IN-JOB, runs the vision point on a fresh data dir without preparing (``--no-prepare``):
the job prepares its own data, as every job did before vision data was prepared.

Per run it reports, from the ``run_overhead`` view and the ``stages`` table: the node runner's start to the
first train stage (``startup_s``), and the dataset, tokens and model_load stages. The goal: a prepared
vision job starts in about the same time as a prepared text job.

    .venv/bin/python bench/vision_startup.py                 # about 4 minutes on a 2-core machine
    .venv/bin/python bench/vision_startup.py --out /tmp/vision_startup.json
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

TEXT_ID = "news-tokens-16384plus-entries-4096"
VISION_ID = "vision-384x384-16384plus-entries-4096"
SBENCH = [sys.executable, "-m", "harness"]


def sweep(path: Path, campaign: str, data_dir: Path, model: Path, dataset: str, max_len: int, steps: int) -> Path:
    doc = {"campaign": campaign, "experiment": "finetune_full_benchmark-v1.0.0",
           "entity": {"model_name": "tiny", "model_max_length": max_len, "dataset_id": dataset, "number_gpus": 1,
                      "batch_size": 1, "gradient_accumulation_steps": 1, "max_steps": steps},
           "model_map": {"tiny": str(model)}, "data_dir": str(data_dir), "runner": {"sample_interval_s": 0.5}}
    path.write_text(json.dumps(doc, indent=1))
    return path


def run(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(SBENCH + argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sbench {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-seq-length", type=int, default=2048, help="the text point's (default 2048)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: a temporary dir)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="sbench-vision-startup-"))
    if work.exists() and args.keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    db = work / "results.duckdb"
    env = dict(os.environ, SBENCH_WORKDIR=str(work / "runs"), SBENCH_DB=str(db), PYTHONPATH=str(ROOT),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("SBENCH_INVENTORY", None)
    text_model, vision_model = work / "models" / "tiny", work / "models" / "tiny-vision"
    run(["model", "tiny", "-o", str(text_model)], env)
    run(["model", "tiny", "--vision", "-o", str(vision_model)], env)
    data = work / "data"
    text = sweep(work / "text.json", "startup-text", data, text_model, TEXT_ID, args.max_seq_length, args.steps)
    # vision entries are never truncated (an image's tokens cannot be cut): the length only bounds text
    vision = sweep(work / "vision.json", "startup-vision", data, vision_model, VISION_ID, 512, args.steps)
    cold = sweep(work / "cold.json", "startup-vision-in-job", work / "data-cold", vision_model, VISION_ID, 512,
                 args.steps)
    prepare_s = {"text": run(["prepare", str(text)], env), "vision": run(["prepare", str(vision)], env)}
    load = os.getloadavg()
    for rnd in range(2):
        extra = ["--force"] if rnd else []
        run(["submit", str(text), "--executor", "local", "--no-prepare", "--wait", *extra], env)
        run(["submit", str(vision), "--executor", "local", "--no-prepare", "--wait", *extra], env)
    run(["submit", str(cold), "--executor", "local", "--no-prepare", "--wait"], env)
    run(["collect"], env)

    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("""
            SELECT r.campaign, r.attempt, o.startup_s, o.prepared_in_job,
                   (SELECT max(duration_s) FROM stages s WHERE s.run_id = r.run_id AND s.stage = 'dataset'
                        AND s.rank IS NOT NULL) AS dataset_s,
                   (SELECT max(duration_s) FROM stages s WHERE s.run_id = r.run_id AND s.stage = 'tokens') AS tokens_s,
                   (SELECT max(duration_s) FROM stages s WHERE s.run_id = r.run_id AND s.stage = 'model_load')
                        AS load_s,
                   m.dataset_tokens, m.dataset_image_tokens, r.outcome
            FROM runs r JOIN run_overhead o USING (run_id) LEFT JOIN measurements m USING (run_id)
            ORDER BY r.campaign, r.attempt""").fetchall()
    finally:
        con.close()
    names = {"startup-text": "text, prepared", "startup-vision": "vision, prepared",
             "startup-vision-in-job": "vision, in-job"}
    out: dict[str, Any] = {"load_before": load, "load_after": os.getloadavg(), "prepare_s": prepare_s, "runs": []}
    print(f"full fine-tuning, tiny models, {args.steps} steps, local executor, {os.cpu_count()} cores; "
          f"load {load[0]:.2f} before, {out['load_after'][0]:.2f} after")
    print(f"sbench prepare: text {prepare_s['text']:.1f} s, vision {prepare_s['vision']:.1f} s\n")
    head = (f"{'mode':<18} {'attempt':>7} {'start->train s':>14} {'dataset s':>9} {'tokens s':>8} "
            f"{'model_load s':>12} {'in-job prep':>11} {'tokens':>9} {'image tok':>9} {'outcome':>8}")
    print(head)
    print("-" * len(head))
    for camp, att, start, in_job, ds, tok, ld, tokens, image, outcome in rows:
        mode = names.get(camp, camp)
        out["runs"].append({"mode": mode, "attempt": att, "startup_s": start, "prepared_in_job": in_job,
                            "dataset_s": ds, "tokens_s": tok, "model_load_s": ld, "dataset_tokens": tokens,
                            "dataset_image_tokens": image, "outcome": outcome})
        print(f"{mode:<18} {att:>7} {start or 0:>14.2f} {ds or 0:>9.2f} {tok or 0:>8.2f} {ld or 0:>12.2f} "
              f"{'yes' if in_job else 'no':>11} {tokens or 0:>9} {image or 0:>9} {outcome:>8}")

    def mean(mode: str) -> float:
        xs = [r["startup_s"] for r in out["runs"] if r["mode"] == mode and r["startup_s"] is not None]
        return sum(xs) / len(xs) if xs else float("nan")

    t, v = mean("text, prepared"), mean("vision, prepared")
    out["startup_vision_over_text"] = v / t
    print(f"\nprepared start-up, mean of 2: text {t:.2f} s, vision {v:.2f} s: vision / text {v / t:.2f}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
