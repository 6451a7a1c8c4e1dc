"""A synthetic batch-size scan, collected for real, as the report tests and ``bench/report_page.py`` read it; and a
rendered page's HTML without its scripts.

The scan's job dirs are written in the job-directory format (:mod:`tests.kit.jobdirs`): models x {LoRA, full} x
GPU counts x batch sizes, their GPU memory modelled so that the biggest runs run out of it, collected with
:class:`FakeSacct` standing in for sacct, so the database the report reads is the one collect really builds.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import subprocess
from pathlib import Path
from typing import Any

from harness.collect import collect
from harness.contract.paths import JobPaths, job_dir_name
from harness.slurm.client import Slurm
from harness.spec.plan import point_id as make_point_id

from . import jobdirs
from .builders import FULL, LORA


class FakeSacct:
    """Answers sacct for the job ids it was given: job id -> (state, elapsed seconds). The jobs ran on node1 one
    after the other, the i-th given in the i-th hour from 2025-11-22 (no host shared)."""

    def __init__(self, jobs: dict[str, tuple[str, int]]) -> None:
        self.jobs = jobs

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] != "sacct":
            return subprocess.CompletedProcess(argv, 0, "", "")
        lines = []
        for j in argv[argv.index("-j") + 1].split(","):
            if j not in self.jobs:
                continue
            state, secs = self.jobs[j]
            code = "0:0" if state == "COMPLETED" else "1:0"
            start = dt.datetime(2025, 11, 22) + dt.timedelta(hours=list(self.jobs).index(j))
            end = start + dt.timedelta(seconds=secs)
            for jid in (j, f"{j}.0"):
                lines.append(f"{jid}|{state}|{code}|00:{secs // 60:02d}:{secs % 60:02d}|1048576K|node1|"
                             f"{start.isoformat()}|{end.isoformat()}")
        return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")


DEVICE_MB = 81920.0


def gpu_memory(model: str, experiment: str) -> tuple[float, float]:
    """(MB at rest, MB per sample of per-device batch): full fine-tuning of the bigger model needs most."""
    return {("granite", FULL): (34000, 6200), ("granite", LORA): (12000, 2600)}.get(
        (model.split("-")[0], experiment), (4000, 1500))


def _samples(t0: float, ticks: int, gpus: int, bs: int, rnd: random.Random, train0: float,
             mem: tuple[float, float] = (9000, 4200)) -> list[dict[str, Any]]:
    """GPU rows that ramp up at training start (memory: base + per-sample x the per-device batch) and one
    process row a tick."""
    rows = []
    per_dev = bs / max(gpus, 1)
    for i in range(ticks):
        t = t0 + i
        training = t >= train0
        for d in range(gpus):
            rows.append({"t_wall": t, "t_mono": t - jobdirs.T0 + 5000.0, "kind": "gpu", "device": d,
                         "gpu_util": round(rnd.uniform(70, 98) if training else rnd.uniform(0, 8), 1),
                         "mem_used_mb": round((mem[0] + mem[1] * per_dev if training else 3000)
                                              * rnd.uniform(0.97, 1.0), 1),
                         "mem_total_mb": DEVICE_MB, "power_w": round(rnd.uniform(250, 390) if training else 70, 1),
                         "power_limit_w": 400.0})
        rows.append({"t_wall": t, "t_mono": t - jobdirs.T0 + 5000.0, "kind": "proc", "device": -1,
                     "cpu_pct": round(rnd.uniform(90, 180) if training else rnd.uniform(20, 60), 1),
                     "mem_pct": round(2 + 0.15 * bs + rnd.uniform(0, 0.3), 2), "rss_mb": round(3000 + 60 * bs, 1),
                     "nprocs": gpus + 1})
    return rows


def write_run(workdir: Path, campaign: str, experiment: str, model: str, gpus: int, bs: int, *, repeat: int = 0,
              outcome: str = "ok", ticks: int = 30, gpu_sampled: bool = True, seed: int = 0) -> dict[str, Any]:
    """One attempt's job dir in the job-directory format: ok, invalid (GPU OOM) or failed (TIMEOUT)."""
    rnd = random.Random(seed)
    ent = jobdirs.entity_for(experiment, model_name=model, number_gpus=gpus, number_nodes=1, batch_size=bs,
                           model_max_length=1024)
    pid = make_point_id(experiment, ent)
    job_dir = workdir / campaign / job_dir_name(pid, repeat, 1)
    paths = JobPaths(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    jobdirs.write_spec(paths, campaign, pid, repeat, 1, experiment, ent, 1, gpus)
    jid = f"{7000 + seed}"
    host, t0 = "node1", jobdirs.T0
    tr0 = t0 + 4 + rnd.uniform(0, 2)  # dataset, tokens and model load take a few seconds
    tr1 = t0 + ticks - 3
    warm = tr0 + 4 if repeat == 0 else None
    stop = tr0 + 6 if outcome == "invalid" else (tr0 + 8 if outcome == "failed" else tr1)
    ev = [jobdirs.stage_event("start", "setup", host, t0), jobdirs.stage_event("end", "setup", host, t0 + 0.6)]
    for r in range(gpus):
        ev += [jobdirs.stage_event("start", "dataset", host, t0 + 0.6, r),
               jobdirs.stage_event("end", "dataset", host, t0 + 1.4, r),
               jobdirs.stage_event("start", "tokens", host, t0 + 1.4, r),
               jobdirs.stage_event("end", "tokens", host, t0 + 2.2, r),
               jobdirs.stage_event("start", "model_load", host, t0 + 2.2, r),
               jobdirs.stage_event("end", "model_load", host, tr0 - 0.1, r),
               jobdirs.stage_event("start", "train", host, tr0, r)]
        if outcome == "ok":
            ev.append(jobdirs.stage_event("end", "train", host, tr1, r, info={"global_step": 20}))
        elif outcome == "invalid":
            ev.append(jobdirs.stage_event("end", "train", host, stop, r, status="error", error="CUDA out of memory"))
    if outcome != "failed":
        ev += [jobdirs.stage_event("start", "teardown", host, stop + 0.2),
               jobdirs.stage_event("end", "teardown", host, stop + 0.9)]
    jobdirs.write_stages(paths, host, ev)
    rows = _samples(t0, int(stop - t0) + 1, gpus if gpu_sampled else 0, bs, rnd, tr0, gpu_memory(model, experiment))
    jobdirs.write_samples(paths, host, rows)
    jobdirs.write_json(paths.root / f"environment.{host}.json",
                     jobdirs.environment_doc(host, 0, gpus if gpu_sampled else 0))
    tps = 900.0 * bs ** 0.7 * (1.6 if experiment == LORA else 1.0) * (0.5 if model.startswith("granite") else 1.0)
    if outcome == "ok":
        res = jobdirs.result_doc(host, 0, t0, tr1 + 1, samples=len(rows))
        for r in range(gpus):
            rd = jobdirs.rank_doc(r, host, gpus, tr0, tr1, tps=tps, warmup_end=warm,
                                dataset_tokens_per_second=tps * gpus * rnd.uniform(0.95, 1.05))
            jobdirs.write_json(paths.rank_result(r), rd)
            if r == 0:
                res["training"] = rd
        jobdirs.write_json(paths.result(host), res)
    elif outcome == "invalid":
        jobdirs.write_json(paths.result(host), jobdirs.result_doc(host, 0, t0, stop + 1, outcome="invalid",
                                                              reason="GPU out of memory", exit_code=1))
        jobdirs.write_json(paths.error(0), {"rank": 0, "host": host, "kind": "invalid",
                                          "error_type": "torch.OutOfMemoryError",
                                          "message": "CUDA out of memory. Tried to allocate 4.00 GiB", "stage": "train",
                                          "trial": None, "t_wall": stop})
    events = [{"type": "point", "campaign": campaign, "point_id": pid, "repeat": repeat, "experiment": experiment,
               "entity": ent, "valid": True, "reasons": [], "notes": []},
              {"type": "attempt", "campaign": campaign, "point_id": pid, "repeat": repeat, "attempt": 1,
               "job_dir": str(job_dir), "executor": "slurm", "job_id": jid, "array_job_id": None,
               "array_task_id": None, "submitted_at": "2025-11-21T23:59:30+00:00", "reason": "new"}]
    jobdirs.append_manifest(workdir, campaign, events)
    return {"run_id": f"{campaign}/{pid}.r{repeat}.a1", "job_id": jid, "outcome": outcome,
            "sacct": ({"ok": "COMPLETED", "invalid": "FAILED", "failed": "TIMEOUT"}[outcome], int(stop - t0) + 2)}


def build_campaign(workdir: Path, campaign: str = "scan", *, models=("smollm2-135m", "granite-3b-1.5"),
                   gpu_counts=(1,), batch_sizes=(2, 4, 8), ticks: int = 30, gpu_sampled: bool = True,
                   extras: bool = True, created_at: str | None = None, references: list[dict[str, Any]] | None = None,
                   seed: int = 0) -> list[dict[str, Any]]:
    """A batch-size scan: models x {lora, full} x GPUs x batch sizes. Runs whose modelled GPU memory
    exceeds the device run out of it (invalid; with the defaults: granite full at batch 8); with
    *extras*, one point gets a second repeat and one run times out (failed: no measurement). *created_at*
    and *references* go into the campaign's manifest line; *seed* offsets the job ids (one per campaign)."""
    event = jobdirs.manifest_events(campaign, LORA)
    event.update({k: v for k, v in (("created_at", created_at), ("references", references)) if v is not None})
    jobdirs.append_manifest(workdir, campaign, [event])
    runs = []
    for model in models:
        for exp in (LORA, FULL):
            for g in gpu_counts:
                for bs in batch_sizes:
                    seed += 1
                    base, per_sample = gpu_memory(model, exp)
                    oom = gpu_sampled and base + per_sample * bs / g > DEVICE_MB
                    runs.append(write_run(workdir, campaign, exp, model, g, bs, outcome="invalid" if oom else "ok",
                                          ticks=ticks, gpu_sampled=gpu_sampled, seed=seed))
    if extras:
        runs.append(write_run(workdir, campaign, LORA, models[0], gpu_counts[0], batch_sizes[0], repeat=1,
                              ticks=ticks + 20, gpu_sampled=gpu_sampled, seed=seed + 1))
        runs.append(write_run(workdir, campaign, FULL, models[0], gpu_counts[0], batch_sizes[-1], repeat=1,
                              outcome="failed", ticks=ticks, gpu_sampled=gpu_sampled, seed=seed + 2))
    return runs


def collect_into(db: Path, workdir: Path, runs: list[dict[str, Any]]) -> None:
    """Collect *runs* (as :func:`write_run` returned them) into *db*; each outcome must be counted as written."""
    rep = collect(db, workdir, slurm=Slurm(FakeSacct({r["job_id"]: r["sacct"] for r in runs})))
    expected: dict[str, int] = {}
    for r in runs:
        expected[r["outcome"]] = expected.get(r["outcome"], 0) + 1
    assert rep.outcomes == expected, (rep.outcomes, rep.warnings)


def html_only(page: str) -> str:
    """The page without its scripts' text (the inlined library holds HTML of its own, e.g. its tooltip's tables)."""
    return re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", page, flags=re.S)
