"""The same points through both trainers, side by side: sbench's (trl/transformers 5) and fms-hf-tuning's.

Each round submits one campaign whose grid is ``trainer: [sbench, fms-hf-tuning]`` x the points below
(full and LoRA fine-tuning, 1 and 2 CPU worker processes), through the local executor, one point after
the other; rounds alternate which trainer goes first, so drift of the shared machine falls on both.
Every run is one epoch of the same dataset file with the same tokenizer. Reported per point:

* throughput ratio fms-hf-tuning / sbench of ``train_samples_per_second`` (median over rounds), and of
  ``dataset_tokens_per_second``;
* dataset tokens: each trainer's exact count of the note-3 tokens its steps consumed. With one process
  both consume every entry once, so the counts must be equal (``tokens_agree``); with two,
  fms-hf-tuning seeds its ranks apart (``set_seed(device_specific=True)``) and the ranks draw
  overlapping entries, so the bench reports how many distinct entries it consumed instead.

Needs the fms-hf-tuning environment (``sbench env build fms-hf-tuning==3.2.2``; built if missing).

    .venv/bin/python bench/trainers.py                   # 3 rounds, 256 entries, about 10 minutes
    .venv/bin/python bench/trainers.py --rounds 1 --entries 64
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATASET = "news-chars-512-entries-4096"
VERSION = "3.2.2"
POINTS = [("finetune_full_benchmark-v1.0.0", 1, None), ("finetune_lora_benchmark-v1.0.0", 1, None),
          ("finetune_lora_benchmark-v1.0.0", 2, "DDP")]


def sbench(*args: str) -> str:
    res = subprocess.run([str(ROOT / ".venv" / "bin" / "sbench"), *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"sbench {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return res.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--entries", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from harness.data.datagen import generate_dataset
    from harness.data.tinymodel import make_tiny_model
    from harness.data.trainerenv import build
    from harness.spec.envs import envs_root

    build(VERSION, envs_root(None))
    work = Path(tempfile.mkdtemp(prefix="sbench-trainers-"))
    model = make_tiny_model(work / "model")
    gen = work / "gen" / f"{DATASET}.jsonl"
    generate_dataset(DATASET, gen, entries=a.entries)
    data = work / "data"
    data.mkdir()
    shutil.copy(gen, data / gen.name)  # no sidecar: used as it is
    db, workdir = work / "r.duckdb", work / "runs"
    for rnd in range(a.rounds):
        trainers = ["sbench", "fms-hf-tuning"] if rnd % 2 == 0 else ["fms-hf-tuning", "sbench"]
        for exp, gpus, backend in POINTS:
            for trainer in trainers:
                name = f"tr{rnd}-{exp.split('_')[1]}-{gpus}-{trainer}"
                sweep = work / f"{name}.yaml"
                entity = {"model_name": "tiny", "model_max_length": a.max_length, "dataset_id": DATASET,
                          "batch_size": 4, "gradient_accumulation_steps": 1, "number_gpus": gpus,
                          "trainer": trainer, "fms_hf_tuning_version": VERSION}
                if backend:
                    entity["distributed_backend"] = backend
                sweep.write_text(yaml.safe_dump({
                    "campaign": name, "experiment": exp, "entity": entity, "model_map": {"tiny": str(model)},
                    "data_dir": str(data), "runner": {"sample_interval_s": 1.0}}))
                sbench("submit", str(sweep), "--executor", "local", "--wait", "--workdir", str(workdir),
                       "--db", str(db))
                print(f"round {rnd + 1}/{a.rounds}: {exp} x{gpus} {trainer} done", file=sys.stderr)
    sbench("collect", "--workdir", str(workdir), "--db", str(db))
    rows = json.loads(sbench("query", "select m.experiment, m.number_gpus, m.trainer, m.train_samples_per_second, "
                                      "m.dataset_tokens_per_second, r.job_dir, r.outcome from measurements m join "
                                      "runs r using (run_id)", "--db", str(db), "--format", "json"))
    out = []
    for exp, gpus, _ in POINTS:
        sel = [r for r in rows if r["experiment"] == exp and r["number_gpus"] == gpus]
        per: dict[str, dict] = {}
        for t in ("sbench", "fms-hf-tuning"):
            mine = [r for r in sel if r["trainer"] == t]
            toks, distinct = set(), set()
            for r in mine:
                ranks = sorted(Path(r["job_dir"]).glob("rank.*.json"))
                docs = [json.loads(p.read_text()) for p in ranks]
                toks.add(docs[0]["metrics"]["dataset_tokens"])
                drawn = [i for d in docs for i in d.get("entries_consumed", [])]
                if drawn:
                    distinct.add(len(set(drawn)))
            per[t] = {"samples_per_s": statistics.median(r["train_samples_per_second"] for r in mine),
                      "dataset_tokens_per_s": statistics.median(r["dataset_tokens_per_second"] for r in mine),
                      "dataset_tokens": sorted(toks), "runs": len(mine), "distinct_entries": sorted(distinct)}
        s, f = per["sbench"], per["fms-hf-tuning"]
        out.append({"experiment": exp, "number_gpus": gpus,
                    "throughput_ratio_fms_to_sbench": round(f["samples_per_s"] / s["samples_per_s"], 3),
                    "dataset_tokens_per_s_ratio": round(f["dataset_tokens_per_s"] / s["dataset_tokens_per_s"], 3),
                    "tokens_agree": s["dataset_tokens"] == f["dataset_tokens"] and len(s["dataset_tokens"]) == 1,
                    "sbench": s, "fms-hf-tuning": f})
    if a.json:
        print(json.dumps({"rounds": a.rounds, "entries": a.entries, "points": out}, indent=2))
    else:
        print(f"{a.rounds} round(s), {a.entries} entries, one epoch per run, tiny model on CPU")
        print(f"{'experiment':<34} {'gpus':>4} {'samples/s sbench':>17} {'fms':>9} {'ratio':>6} "
              f"{'tokens sbench':>14} {'fms':>14} {'agree':>6}")
        for o in out:
            s, f = o["sbench"], o["fms-hf-tuning"]
            print(f"{o['experiment']:<34} {o['number_gpus']:>4} {s['samples_per_s']:>17.2f} {f['samples_per_s']:>9.2f} "
                  f"{o['throughput_ratio_fms_to_sbench']:>6.3f} {str(s['dataset_tokens']):>14} "
                  f"{str(f['dataset_tokens']):>14} {str(o['tokens_agree']):>6}"
                  + (f"  (fms drew {f['distinct_entries']} distinct of {a.entries})"
                     if f["distinct_entries"] and f["distinct_entries"] != [a.entries] else ""))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
