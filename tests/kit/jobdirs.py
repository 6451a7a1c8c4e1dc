"""Writers for synthetic job directories in the format of docs/job-directory.md.

Used by the collect tests (which write their own raw rows through these, most through :func:`write_attempt`,
collected with :class:`FakeSlurm` standing in for sacct) and by ``bench/collect.py`` (which builds thousands of
runs). Nothing here is used by a real run; tests/test_e2e_local.py holds these files against a real run's.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.contract.formats import SAMPLE_CSV_NAMES, Stage
from harness.contract.paths import JobPaths, job_dir_name
from harness.runner.node import TRAINING_KEYS
from harness.slurm import localjob
from harness.spec.catalog import get_experiment
from harness.spec.plan import point_id as make_point_id

from .builders import FULL

SAMPLE_HEADER = ",".join(SAMPLE_CSV_NAMES)
SAMPLE_FIELDS = list(SAMPLE_CSV_NAMES)
T0 = 1763769600.0  # 2025-11-22T00:00:00Z


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def entity_for(experiment: str = "finetune_lora_benchmark-v1.0.0", **over: Any) -> dict[str, Any]:
    """A fully resolved entity (catalog defaults plus *over*)."""
    exp = get_experiment(experiment)
    base = {"model_name": "smollm2-135m", "model_max_length": 1024, "number_gpus": 2, "batch_size": 8,
            "gpu_model": "NVIDIA-A100-SXM4-80GB", "dataset_id": "news-chars-512-entries-4096",
            "torch_dtype": "bfloat16"}
    out: dict[str, Any] = {}
    for f in exp.fields:
        out[f.name] = over.get(f.name, base.get(f.name, f.default))
    return out


def write_spec(paths: JobPaths, campaign: str, point_id: str, repeat: int, attempt: int, experiment: str,
               entity: Mapping[str, Any], num_machines: int = 1, num_processes: int = 1, trials: int = 1) -> None:
    write_json(paths.spec, {
        "sbench_version": "0.1.0", "rendered_at": "2025-11-21T23:59:00+0000", "campaign": campaign,
        "sweep": {"source": "sweeps/synthetic.yaml", "description": ""},
        "point": {"point_id": point_id, "repeat": repeat, "experiment": experiment, "entity": dict(entity),
                  "valid": True, "reasons": [], "notes": [], "partition": "a100", "model_source": "x"},
        "inventory": {"cluster": "synthetic"},
        "jobspec": {"campaign": campaign, "point_id": point_id, "repeat": repeat, "attempt": attempt,
                    "experiment": experiment, "entity": dict(entity), "job_dir": str(paths.root),
                    "num_machines": num_machines, "num_processes": num_processes, "trials": trials,
                    "partition": "a100", "runner": {"sample_interval_s": 1.0}},
    })


def stage_event(event: str, stage: str, host: str, t_wall: float, rank: int | None = None, trial: int | None = None,
                restart: int = 0, pid: int = 4242, status: str = "ok", error: str | None = None,
                info: Any = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"event": event, "stage": stage, "host": host, "rank": rank, "trial": trial,
                          "t_wall": t_wall, "t_mono": t_wall - T0 + 5000.0, "restart": restart, "pid": pid}
    if event == "end":
        ev.update({"status": status, "error": error, "info": info})
    return ev


def write_lines(path: Path, lines: Iterable[str], trailing_newline: bool = True) -> None:
    text = "\n".join(lines)
    path.write_text(text + ("\n" if trailing_newline and text else ""))


def write_stages(paths: JobPaths, host: str, events: Sequence[Mapping[str, Any]]) -> None:
    write_lines(paths.stages(host), (json.dumps(e) for e in events))


def normal_stages(host: str, t_start: float, t_train0: float, t_train1: float, ranks: Sequence[int],
                  node_runner: bool = True) -> list[dict[str, Any]]:
    """A complete, successful stage sequence for one host."""
    ev: list[dict[str, Any]] = []
    if node_runner:
        ev += [stage_event("start", Stage.SETUP, host, t_start), stage_event("end", Stage.SETUP, host, t_start + 1)]
    for r in ranks:
        ev += [stage_event("start", Stage.DATASET, host, t_start + 1, r),
               stage_event("end", Stage.DATASET, host, t_start + 2, r),
               stage_event("start", Stage.MODEL_LOAD, host, t_start + 2, r),
               stage_event("end", Stage.MODEL_LOAD, host, t_train0 - 0.5, r),
               stage_event("start", Stage.TRAIN, host, t_train0, r),
               stage_event("end", Stage.TRAIN, host, t_train1, r, info={"global_step": 20})]
    if node_runner:
        ev += [stage_event("start", Stage.TEARDOWN, host, t_train1 + 0.5),
               stage_event("end", Stage.TEARDOWN, host, t_train1 + 1)]
    return ev


def sample_line(row: Mapping[str, Any]) -> str:
    return ",".join("" if row.get(k) is None else str(row[k]) for k in SAMPLE_FIELDS)


def write_samples(paths: JobPaths, host: str, rows: Iterable[Mapping[str, Any]], trailing_newline: bool = True) -> None:
    write_lines(paths.samples(host), [SAMPLE_HEADER, *(sample_line(r) for r in rows)], trailing_newline)


def gen_samples(t_begin: float, n: int, gpus: int, seed: int = 0, interval: float = 1.0) -> list[dict[str, Any]]:
    """*n* ticks of *gpus* GPU rows plus one proc row each."""
    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []
    energy = [0.0] * gpus  # each GPU's running total (the sampler's energy_j): its power over each interval
    for i in range(n):
        t = round(t_begin + i * interval, 3)
        mono = round(t - T0 + 5000.0, 3)
        for d in range(gpus):
            row = {"t_wall": t, "t_mono": mono, "kind": "gpu", "device": d,
                   "gpu_util": round(rnd.uniform(20, 100), 1), "mem_used_mb": round(rnd.uniform(1000, 80000), 1),
                   "mem_total_mb": 81920.0, "power_w": round(rnd.uniform(80, 400), 1), "power_limit_w": 400.0}
            if i:
                energy[d] = round(energy[d] + row["power_w"] * interval, 3)
            row["energy_j"] = energy[d]
            rows.append(row)
        rows.append({"t_wall": t, "t_mono": mono, "kind": "proc", "device": -1,
                     "cpu_pct": round(rnd.uniform(50, 400), 1),
                     "mem_pct": round(rnd.uniform(1, 10), 2), "rss_mb": round(rnd.uniform(2000, 9000), 1),
                     "nprocs": gpus + 1})
    return rows


def rank_doc(rank: int, host: str, world: int, t_train0: float, t_train1: float, tps: float = 1000.0,
             warmup_end: float | None = None, **metrics: Any) -> dict[str, Any]:
    runtime = t_train1 - (warmup_end or t_train0)
    m = {"train_runtime": runtime, "train_samples_per_second": 4.0, "train_steps_per_second": 0.5,
         "train_tokens_per_second": tps, "dataset_tokens": 50000, "dataset_tokens_per_second": 50000 / runtime}
    m.update(metrics)
    return {"rank": rank, "local_rank": rank, "world_size": world, "host": host, "env": {}, "device": "cpu",
            "notes": [], "global_step": 20, "train_start_wall": t_train0, "train_end_wall": t_train1,
            "warmup_end_wall": warmup_end, "stopped_by": "max_steps", "metrics": m,
            "dataset_token_counts": {"total": 50000, "entries": 4096, "cache": "hit", "key": "k"}}


def result_doc(host: str, machine_rank: int, t_start: float, t_end: float, outcome: str = "ok",
               reason: str | None = None, exit_code: int = 0, samples: int = 0, **extra: Any) -> dict[str, Any]:
    doc = {"host": host, "machine_rank": machine_rank, "exit_code": exit_code, "signal": None, "outcome": outcome,
           "reason": reason, "started_wall": t_start, "ended_wall": t_end, "samples": samples,
           "sample_interval_s": 1.0, "trials": [], "ranks": []}
    doc.update(extra)
    return doc


def environment_doc(host: str, machine_rank: int, gpus: int) -> dict[str, Any]:
    return {"host": host, "machine_rank": machine_rank,
            "python": {"version": "3.11.7", "executable": "/usr/bin/python3", "implementation": "CPython"},
            "packages": {"torch": "2.5.1", "transformers": "5.0.0", "trl": "1.0.0", "peft": "0.17.0",
                         "accelerate": "1.10.0", "datasets": "3.0.0", "submitit": "1.5.2", "duckdb": "2.0.0",
                         "nvidia-ml-py": "12.560.30"},
            "sbench_version": "0.1.0", "git_commit": None,
            "gpus": [{"index": i, "uuid": f"GPU-{host}-{i}", "pci_bus_id": f"0000:{i:02x}:00.0",
                      "name": "NVIDIA A100-SXM4-80GB", "memory_total_mb": 81920} for i in range(gpus)],
            "cpu_count": 64, "memory_total_mb": 737280, "env": {"NCCL_DEBUG": "INFO", "HF_TOKEN": "<redacted>"}}


NCCL_ROCE_LOG = """\
{host}:4242:4242 [0] NCCL INFO Bootstrap : Using net1-0:10.0.1.11<0>
{host}:4242:4242 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.
{host}:4242:4242 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0,mlx5_3
{host}:4242:4242 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_3:1/RoCE [RO]; OOB net1-0:10.0.1.11<0>
{host}:4242:4242 [0] NCCL INFO Using non-device net plugin version 0
{host}:4242:4242 [0] NCCL INFO Using network IB
"""


def manifest_events(campaign: str, experiment: str, executor: str = "slurm") -> dict[str, Any]:
    return {"type": "campaign", "campaign": campaign, "experiment": experiment, "sweep": "/abs/sweeps/x.yaml",
            "inventory": "inventory/x.yaml", "partition": "a100", "executor": executor,
            "created_at": "2025-11-21T23:58:00+00:00", "sbench_version": "0.1.0"}


def append_manifest(workdir: Path, campaign: str, events: Iterable[Mapping[str, Any]]) -> Path:
    path = Path(workdir) / campaign / "manifest.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        for ev in events:
            fh.write(json.dumps(ev) + "\n")
    return path


def make_run(workdir: Path, campaign: str, index: int, hosts: Sequence[str] = ("node1", "node2"),
             gpus_per_host: int = 8, ticks: int = 600, experiment: str = "finetune_full_benchmark-v1.0.0",
             samples_text: Mapping[str, str] | None = None, executor: str = "slurm", job_id: str | None = None,
             log_text: str | None = None, seed: int | None = None, t0: float = T0) -> dict[str, Any]:
    """One complete, successful attempt (all files per the contract) plus its manifest lines.

    *samples_text* (host -> CSV text) lets a caller reuse pre-rendered sample files (the bench). *t0*: when
    its node runners start (the stage events' times; the runs of one call of this helper all start then).
    """
    world = len(hosts) * gpus_per_host
    entity = entity_for(experiment, number_gpus=world, number_nodes=len(hosts), batch_size=world * 2,
                        model_max_length=512 + index)
    pid = make_point_id(experiment, entity)
    job_dir = Path(workdir) / campaign / job_dir_name(pid, 0, 1)
    paths = JobPaths(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    write_spec(paths, campaign, pid, 0, 1, experiment, entity, len(hosts), world)
    jid = job_id or f"{1000 + index // 100}_{index % 100}"
    write_json(paths.submitted, {"executor": executor, "job_id": jid, "submitted_at": "2025-11-21T23:59:30+00:00"})
    t_start, t_train0 = t0, t0 + 10.0
    t_train1 = t_train0 + ticks - 15.0
    for m, host in enumerate(hosts):
        ranks = list(range(m * gpus_per_host, (m + 1) * gpus_per_host))
        write_stages(paths, host, normal_stages(host, t_start, t_train0, t_train1, ranks))
        if samples_text is not None:
            paths.samples(host).write_text(samples_text[host])
        else:
            write_samples(paths, host, gen_samples(t_start, ticks, gpus_per_host, seed=(seed or index) * 7 + m))
        for r in ranks:
            write_json(paths.rank_result(r), rank_doc(r, host, world, t_train0, t_train1))
        res = result_doc(host, m, t_start, t_train1 + 1, samples=ticks * (gpus_per_host + 1))
        if m == 0:
            rank0 = rank_doc(0, host, world, t_train0, t_train1)
            res["training"] = {k: rank0.get(k) for k in TRAINING_KEYS}
        write_json(paths.result(host), res)
        write_json(paths.root / f"environment.{host}.json", environment_doc(host, m, gpus_per_host))
        paths.train_log(host).write_text(log_text.format(host=host) if log_text is not None
                                         else NCCL_ROCE_LOG.format(host=host))
    events = [
        {"type": "point", "campaign": campaign, "point_id": pid, "repeat": 0, "experiment": experiment,
         "entity": entity, "valid": True, "reasons": [], "notes": []},
        {"type": "attempt", "campaign": campaign, "point_id": pid, "repeat": 0, "attempt": 1,
         "job_dir": str(job_dir), "executor": executor, "job_id": jid,
         "array_job_id": jid.split("_")[0] if "_" in jid else None,
         "array_task_id": int(jid.split("_")[1]) if "_" in jid else None,
         "submitted_at": "2025-11-21T23:59:30+00:00", "reason": "new"},
    ]
    return {"job_dir": job_dir, "paths": paths, "point_id": pid, "entity": entity, "job_id": jid, "events": events,
            "t_train0": t_train0, "t_train1": t_train1}


def local_process(path: str | Path, kind: str = localjob.LAUNCH) -> subprocess.Popen[bytes]:
    """A live process that stands for the local executor's launch of job dir *path* (or, with ``kind="queue"``,
    the queue of queue file *path*): it carries the token status, cancel and collect check. Kill it when done."""
    return subprocess.Popen(["sleep", "120"], start_new_session=True,
                            env={**os.environ, **localjob.environment(kind, path)})


# -- one attempt of campaign c1, and a stand-in for sacct ------------------------------------------------------
CAMPAIGN = "c1"


def sacct_slot(job_id: str) -> tuple[str, str]:
    """A job's start and end as sacct prints them: ten minutes in an hour of its own (by the job id's
    digits), so that runs given different ids never held a node at the same time."""
    n = int("".join(ch for ch in job_id if ch.isdigit()) or 0)
    start = dt.datetime(2025, 11, 22) + dt.timedelta(hours=n % 10000)
    return start.isoformat(), (start + dt.timedelta(minutes=10)).isoformat()


class FakeSlurm:
    """Stands in for sacct: answers from a dict job id -> (state, exit, nodes); counts calls. Each job ran
    in its own slot (:func:`sacct_slot`)."""

    def __init__(self, jobs: dict[str, tuple[str, str, str]] | None = None) -> None:
        self.jobs = jobs or {}
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[0] != "sacct":
            return subprocess.CompletedProcess(argv, 0, "", "")
        lines = []
        for j in argv[argv.index("-j") + 1].split(","):
            if j in self.jobs:
                state, code, nodes = self.jobs[j]
                start, end = sacct_slot(j)
                lines.append(f"{j}|{state}|{code}|00:10:00||{nodes}|{start}|{end}")
                lines.append(f"{j}.0|{state}|{code}|00:10:00|2097152K|{nodes}|{start}|{end}")
        return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")


def write_attempt(workdir: Path, idx: int, *, hosts=("node1",), gpus_per_host=2, samples=None, ticks=20,
                  t_train0=None, t_train1=None, warmup_end=None, entity_over=None, results=True, stages=None,
                  errors=(), job_id=None, executor="slurm", experiment=FULL, rank0_metrics=None, trials=None,
                  logs=None, manifest=True) -> dict[str, Any]:
    """One attempt's files, in campaign :data:`CAMPAIGN`. Defaults: a successful single-node 2-GPU run."""
    world = len(hosts) * gpus_per_host
    ent = entity_for(experiment, **{"number_gpus": world, "number_nodes": len(hosts), "batch_size": 2 * world,
                                    "model_max_length": 100 + idx, **(entity_over or {})})
    pid = make_point_id(experiment, ent)
    job_dir = workdir / CAMPAIGN / job_dir_name(pid, 0, 1)
    paths = JobPaths(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    write_spec(paths, CAMPAIGN, pid, 0, 1, experiment, ent, len(hosts), world,
               trials=5 if "stability" in experiment else 1)
    jid = job_id or f"9{idx:03d}"
    t0 = T0
    tr0 = t_train0 if t_train0 is not None else t0 + 5
    tr1 = t_train1 if t_train1 is not None else t0 + ticks - 5
    rows_by_host = {}
    for m, h in enumerate(hosts):
        ranks = list(range(m * gpus_per_host, (m + 1) * gpus_per_host))
        if stages is None or h not in stages:
            write_stages(paths, h, normal_stages(h, t0, tr0, tr1, ranks))
        elif stages[h] is not None:
            paths.stages(h).write_text(stages[h])
        rows = samples[h] if samples is not None else gen_samples(t0, ticks, gpus_per_host, seed=idx * 10 + m)
        rows_by_host[h] = rows
        if rows is not None:
            write_samples(paths, h, rows)
        if results is True or (isinstance(results, dict) and h in results):
            doc = result_doc(h, m, t0, tr1 + 1)
            if isinstance(results, dict):
                doc.update(results[h])
            if trials is not None and m == 0:
                doc["trials"] = trials
            write_json(paths.result(h), doc)
            for r in ranks:
                rd = rank_doc(r, h, world, tr0, tr1, tps=1000.0 + r, warmup_end=warmup_end,
                              **(rank0_metrics or {} if r == 0 else {}))
                write_json(paths.rank_result(r), rd)
        write_json(paths.root / f"environment.{h}.json", environment_doc(h, m, gpus_per_host))
        if logs and h in logs:
            paths.train_log(h).write_text(logs[h])
    for e in errors:
        write_json(paths.error(e["rank"]), e)
    events = [{"type": "point", "campaign": CAMPAIGN, "point_id": pid, "repeat": 0, "experiment": experiment,
               "entity": ent, "valid": True, "reasons": [], "notes": []},
              {"type": "attempt", "campaign": CAMPAIGN, "point_id": pid, "repeat": 0, "attempt": 1,
               "job_dir": str(job_dir), "executor": executor, "job_id": jid, "array_job_id": None,
               "array_task_id": None, "submitted_at": "2025-11-21T23:59:30+00:00", "reason": "new"}]
    if manifest:
        append_manifest(workdir, CAMPAIGN, events)
    return {"run_id": f"{CAMPAIGN}/{pid}.r0.a1", "paths": paths, "job_id": jid, "rows": rows_by_host,
            "t_train0": tr0, "t_train1": tr1, "entity": ent, "world": world, "point_id": pid}


def campaign_workdir(tmp_path: Path) -> Path:
    """A work dir whose manifest has campaign :data:`CAMPAIGN` (full fine-tuning), for write_attempt's runs."""
    d = tmp_path / "runs"
    d.mkdir()
    append_manifest(d, CAMPAIGN, [manifest_events(CAMPAIGN, FULL)])
    return d
