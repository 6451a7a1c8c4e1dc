"""The database rows of one run, built from its files (:mod:`.jobdir`) and its verdict (:mod:`.outcome`):
the ``runs`` row, its child rows (hosts, stages, ranks, errors, trials, environment) and, once the
sample statistics are known, its ``measurements`` row."""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from harness.contract.defaults import RunnerSettings, sample_interval
from harness.contract.formats import Stage
from harness.contract.paths import JobPaths
from harness.contract.records import prediction_columns
from harness.db.values import entity_values, to_json, utc
from harness.spec.catalog import EXPERIMENTS
from harness.spec.cost import cost_per_million_tokens
from harness.spec.flops import run_flops

from . import aggregate, stragglers
from .discover import Attempt
from .jobdir import JobFiles, as_dict, as_list, count, first_line
from .outcome import Sched, Verdict
from .parse import read_file, summarize_transports
from .profile import profile_rows, read_trace, summarise

PROFILE_MAX = 1 << 30  # a gzipped trace larger than this is not read (profile fewer steps)

_f = aggregate._f
_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "submitit", "duckdb")
_RANK_RATES = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second",
               "dataset_tokens_per_second", "cpu_util_pct")


@dataclass
class RunData:
    """Everything parsed from one job dir, ready to write."""

    run: dict[str, Any]
    hosts: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    environment: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    profile_ops: list[dict[str, Any]] = field(default_factory=list)  # runner.profile's traces (collect.profile)
    rank_scores: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[str] = field(default_factory=list)  # a note per flagged rank (stragglers.RankScore.why)
    straggler_ranks: list[str] = field(default_factory=list)  # host:rank of each flagged rank
    sample_files: list[tuple[str, Path]] = field(default_factory=list)
    samples_written: dict[str, int | None] = field(default_factory=dict)  # host -> rows its sampler recorded
    rank0: dict[str, Any] | None = None
    entity: dict[str, Any] = field(default_factory=dict)
    experiment: str | None = None
    world_size: int = 1
    window: tuple[float | None, float | None] = (None, None)
    sample_interval_s: float = 1.0  # the sampler's period (spec.json's runner block): each sample's span
    host_busy_cpu: float = RunnerSettings().host_busy_cpu  # spec.json's runner block: when a host is busy
    over: bool = False
    workload: str = "train"
    peak: float | None = None  # one device's peak TFLOP/s from spec.json (the datasheet's or the inventory's)
    peak_source: str | None = None  # spec.json's: inventory | gpu_peaks.yaml | unknown
    compute_dtype: str | None = None  # spec.json's: the dtype the peak is read for (bf16, fp16, fp32)
    seen_hosts: list[str] = field(default_factory=list)  # the hosts the run was seen on
    measured_peak: float | None = None  # its hosts' measured peak at that dtype (preflight), where there is one
    gpu_partition: bool | None = None  # from spec.json's cpu_partition; None when unknown
    memory_prediction: dict[str, Any] | None = None  # spec.json's (harness.spec.memory)
    ran: dict[str, Any] = field(default_factory=dict)  # measurements' what-ran columns (aggregate.ran_properties)
    slurm_energy_j: float | None = None  # sacct's ConsumedEnergyRaw of the job (None: not recorded)
    price_per_gpu_hour: float | None = None  # spec.json's: the partition's price of a device an hour

    def warn(self, text: str) -> None:
        """A problem found after the verdict: a warning of an ok run, part of the reason otherwise."""
        if self.run["outcome"] in (None, "ok"):
            self.run["warnings"] = list(dict.fromkeys([*(self.run["warnings"] or []), text]))
        else:
            parts = [p for p in (self.run["reason"] or "").split("; ") if p]
            self.run["reason"] = "; ".join(dict.fromkeys([*parts, text]))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _provenance(doc: Any) -> dict[str, Any]:
    """environment.<host>.json's provenance block as the environment table's columns."""
    doc = doc if isinstance(doc, dict) else {}
    out = {k: _text(doc.get(src)) for k, src in (("driver_version", "driver"), ("cuda_driver", "cuda_driver"),
                                                  ("cuda_runtime", "cuda_runtime"), ("nccl", "nccl"),
                                                  ("cudnn", "cudnn"), ("flash_attn", "flash_attn"))}
    out["hca_firmware"] = to_json(doc.get("hcas")) if isinstance(doc.get("hcas"), list) and doc["hcas"] else None
    return out


def _epoch(t: _dt.datetime | None) -> float | None:
    """sacct's naive UTC time as epoch seconds."""
    return None if t is None else t.replace(tzinfo=_dt.timezone.utc).timestamp()


def held(f: JobFiles, v: Verdict, stages: list[dict[str, Any]]) -> dict[str, tuple[float, float | None]]:
    """Per host, when the run held it: sacct's start and end on every node of its node list, else the host's
    stage events and result (first start to last end). The end is None while the run is not over. Collect
    compares these across runs (``db.overlaps``): two runs on one host at the same time share it."""
    spans: dict[str, list[float]] = {}
    for r in stages:
        for t in (r["start_wall"], r["end_wall"]):
            if t is not None:
                spans.setdefault(r["host"], []).append(t)
    for h, res in f.results.items():
        for t in (_f(res.get("started_wall")), _f(res.get("ended_wall"))):
            if t is not None:
                spans.setdefault(h, []).append(t)
    out: dict[str, tuple[float, float | None]] = {h: (min(ts), max(ts) if v.over else None)
                                                   for h, ts in spans.items()}
    job = v.sched.job
    start = _epoch(job.start) if job else None
    if job is None or start is None:
        return out
    sacct: dict[str, tuple[float, float | None]] = {}
    for h in job.hosts:  # the scheduler's word on where and when, when it has one
        end = _epoch(job.end)
        if end is None and v.over:  # over, and sacct has no end: the files' last word, or the start
            end = max(start, out[h][1] or start) if h in out else start
        sacct[h] = (start, end if v.over else None)
    return sacct


def host_rows(f: JobFiles, v: Verdict, run_id: str, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen = f.hosts_all
    spans = held(f, v, stages)
    rows = []
    for h in sorted(seen | set(v.hosts_expected) | set(spans)):
        res, env = f.results.get(h, {}), f.envs.get(h, {})
        rows.append({
            "run_id": run_id, "host": h, "machine_rank": res.get("machine_rank", env.get("machine_rank")),
            "expected": h in v.hosts_expected if v.hosts_expected else None, "seen": h in seen,
            "has_stages": h in f.stage_logs, "has_samples": h in f.sample_hosts, "has_result": h in f.results,
            "has_environment": h in f.envs, "has_log": h in f.log_hosts, "outcome": res.get("outcome"),
            "exit_code": res.get("exit_code"), "signal": _text(res.get("signal")), "reason": res.get("reason"),
            "started_wall": res.get("started_wall"), "ended_wall": res.get("ended_wall"),
            "transport": f.transports.get(h), "nccl_net": f.nccl_lines.get(h),
            "held_start_wall": spans[h][0] if h in spans else None,
            "held_end_wall": spans[h][1] if h in spans else None})
    return rows


def stage_rows(f: JobFiles, run_id: str) -> list[dict[str, Any]]:
    # started_at/ended_at are given as epoch seconds: the TIMESTAMP column converts them all at once
    return [{"run_id": run_id, "host": h, "rank": r.rank, "stage": r.stage, "trial": r.trial, "restart": r.restart,
             "pid": r.pid, "start_wall": r.start_wall, "end_wall": r.end_wall, "started_at": r.start_wall,
             "ended_at": r.end_wall, "duration_s": r.duration_s, "status": r.status, "error": r.error,
             "info": to_json(r.info)}
            for h, log in sorted(f.stage_logs.items()) for r in log.rows]


def rank_rows(f: JobFiles, run_id: str) -> list[dict[str, Any]]:
    rows = []
    for rk, doc in sorted(f.ranks.items()):
        m = as_dict(doc.get("metrics"))
        dev = doc.get("device")
        rows.append({
            "run_id": run_id, "rank": rk, "host": doc.get("host"), "local_rank": doc.get("local_rank"),
            "world_size": doc.get("world_size"),
            "device": dev if dev is None or isinstance(dev, str) else json.dumps(dev, sort_keys=True),
            "global_step": doc.get("global_step"), "train_start_wall": doc.get("train_start_wall"),
            "train_end_wall": doc.get("train_end_wall"), "warmup_end_wall": doc.get("warmup_end_wall"),
            "stopped_by": doc.get("stopped_by"), **{k: _f(m.get(k)) for k in _RANK_RATES},
            "dataset_tokens": count(m.get("dataset_tokens"), 0, 2**63 - 1),
            "notes": [str(n) for n in as_list(doc.get("notes"))] if isinstance(doc.get("notes"), list) else None,
            "metrics": to_json(m or None)})
    return rows


def score_rows(f: JobFiles, run_id: str, campaign: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``rank_scores`` rows of a multi-process run, and a note per straggler (:mod:`.stragglers`)."""
    threshold = RunnerSettings.from_dict(as_dict(f.jobspec.get("runner"))).straggler_score
    win = aggregate.window_properties(f.rank0)
    scores = stragglers.rank_scores(f.ranks, win["window_start_step"], win["window_end_step"], threshold)
    rows = [{"run_id": run_id, "campaign": campaign, "host": s.host, "rank": s.rank, "steps": s.steps,
             "own_step_s": s.own_step_s, "best_step_s": s.best_step_s, "current_step_s": s.current_step_s,
             "relative_score": s.relative, "individual_score": s.individual, "threshold": threshold,
             "flagged": s.flagged} for s in scores]
    notes = [s.why(stragglers.fastest_s(scores), threshold) for s in scores if s.flagged]
    return rows, notes


def error_rows(f: JobFiles, run_id: str) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "rank": str(e.get("rank", e["_rank"])), "host": e.get("host"), "kind": e.get("kind"),
             "error_type": e.get("error_type"), "message": e.get("message"), "traceback": e.get("traceback"),
             "stage": e.get("stage"), "trial": e.get("trial") if isinstance(e.get("trial"), int) else None,
             "t_wall": _f(e.get("t_wall"))} for e in f.errors]


def trial_rows(f: JobFiles, run_id: str, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_trial = {r["trial"]: r for r in stages if r["stage"] == Stage.TRIAL and r["trial"] is not None}
    host = next((h for h, r in f.results.items() if r.get("trials")), None)
    rows = []
    for t in f.trials:
        tn = t.get("trial") if isinstance(t.get("trial"), int) else None
        st = by_trial.get(tn) if tn is not None else None
        rows.append({"run_id": run_id, "trial": tn, "host": host, "exit_code": t.get("exit_code"),
                     "outcome": t.get("outcome"), "reason": t.get("reason"),
                     "start_wall": st["start_wall"] if st else None, "end_wall": st["end_wall"] if st else None,
                     "duration_s": st["duration_s"] if st else None})
    return rows


_MEM_KEYS = ("params_bytes", "trainable_bytes", "grads_bytes", "optimizer_bytes", "cuda_allocated_bytes",
             "cuda_peak_bytes", "cuda_reserved_bytes", "rss_bytes")


def memory_rows(f: JobFiles, run_id: str) -> list[dict[str, Any]]:
    rows = []
    for rk, doc in sorted(f.ranks.items()):
        snaps = as_list(doc.get("memory"))
        for s in snaps:
            if isinstance(s, dict):
                rows.append({"run_id": run_id, "rank": rk, "host": doc.get("host"), "step": s.get("step"),
                             "phase": s.get("phase"), "t_wall": _f(s.get("t_wall")),
                             **{k: count(s.get(k), 0, 2**63 - 1) for k in _MEM_KEYS}})
    return rows


def activation_bytes(snaps: list[dict[str, Any]]) -> int | None:
    """Activation memory measured on CUDA: what the forward pass of a recorded step added to the
    allocator (after_forward - before_forward, the tensors saved for backward plus the logits), the
    largest over the steps. None without CUDA figures: the CPU has no allocator to ask."""
    before = {r["step"]: r["cuda_allocated_bytes"] for r in snaps if r["phase"] == "before_forward"}
    grown = [r["cuda_allocated_bytes"] - before[r["step"]] for r in snaps
             if r["phase"] == "after_forward" and isinstance(r.get("cuda_allocated_bytes"), int)
             and isinstance(before.get(r["step"]), int)]
    return max(grown) if grown and max(grown) > 0 else None


def memory_properties(d: RunData) -> dict[str, Any]:
    """Measured memory of the run beside its prediction (see store's measurements columns)."""
    rank0 = [r for r in d.memory if r["rank"] == 0]
    last = next((r for r in reversed(rank0) if r["phase"] == "after_optimizer"), None)
    peaks = [r["cuda_peak_bytes"] for r in d.memory if r["cuda_peak_bytes"] is not None]
    p = d.memory_prediction if isinstance(d.memory_prediction, dict) else {}
    # Gradients at their largest in that step (after backward): DeepSpeed frees its partitions in the step.
    grads = [r["grads_bytes"] for r in rank0 if last and r["step"] == last["step"] and r["grads_bytes"] is not None]
    acts = activation_bytes(rank0)
    pa = p.get("activation_bytes")
    return {"memory_peak_bytes": max(peaks) if peaks else None,
            "activation_bytes": acts,
            "activation_error": (pa / acts - 1) if acts and isinstance(pa, (int, float)) else None,
            **{k: (last or {}).get(k) for k in ("params_bytes", "optimizer_bytes")},
            "grads_bytes": max(grads) if grads else (last or {}).get("grads_bytes"),
            "predicted_params_bytes": p.get("param_bytes"), "predicted_grads_bytes": p.get("grad_bytes"),
            "predicted_optimizer_bytes": p.get("optimizer_bytes"),
            "predicted_activation_bytes": p.get("activation_bytes"), "predicted_total_bytes": p.get("total_bytes"),
            "predicted_host_bytes": sum(v for v in (p.get("host") or {}).values() if isinstance(v, int)) or None,
            "device_bytes": p.get("device_bytes"), "predicted_oom": p.get("predicted_oom")}


def environment_rows(f: JobFiles, run_id: str) -> list[dict[str, Any]]:
    rows = []
    tr = (f.rank0 or {}).get("trainer")
    tr = tr if isinstance(tr, dict) and isinstance(tr.get("packages"), dict) else {}
    for h, doc in sorted(f.envs.items()):
        pk = as_dict(doc.get("packages")) if isinstance(doc.get("packages"), dict) else doc
        # The training processes' own packages when a trainer environment ran them (fms-hf-tuning).
        pk = {**pk, **{k: v for k, v in (tr.get("packages") or {}).items() if v}}
        gpus = as_list(doc.get("gpus"))
        rows.append({
            "run_id": run_id, "host": h, "machine_rank": doc.get("machine_rank"),
            "python": _text(as_dict(doc.get("python")).get("version")),
            **{k: _text(pk.get(k)) for k in _PACKAGES},
            "nvidia_ml_py": _text(pk.get("nvidia-ml-py") or pk.get("nvidia_ml_py")),
            "sbench_version": doc.get("sbench_version"), "git_commit": doc.get("git_commit"),
            "gpu_count": len(gpus), "gpu_names": [str(g.get("name")) for g in gpus if isinstance(g, dict)],
            "gpus": to_json(gpus), "cpu_count": doc.get("cpu_count"),
            "memory_total_mb": _f(doc.get("memory_total_mb")), "env": to_json(doc.get("env")),
            "packages": to_json(doc.get("packages")), **_provenance(doc.get("provenance")),
            "trainer": _text(tr.get("name")) or "sbench", "trainer_packages": to_json(tr.get("packages")),
            **{f"container_{k}": _text(v) for k, v in as_dict(doc.get("container")).items()
               if k in ("runtime", "image", "digest")}})
    return rows


def run_row(f: JobFiles, v: Verdict, stages: list[dict[str, Any]]) -> dict[str, Any]:
    att, man, job, rank0 = f.attempt, f.attempt.manifest or {}, v.sched.job, f.rank0 or {}
    results = f.results.values()
    starts = [_f(r.get("started_wall")) for r in results] + [r["start_wall"] for r in stages]
    started = min((s for s in starts if s is not None), default=None)
    ended = max((e for e in (_f(r.get("ended_wall")) for r in results) if e is not None), default=None)
    if v.outcome is not None and ended is None:
        ended = max((r["end_wall"] for r in stages if r["end_wall"] is not None), default=None)
    train_start = _f(rank0.get("train_start_wall"))
    if train_start is None:
        train_start = min((r["start_wall"] for r in stages
                           if r["stage"] == Stage.TRAIN and r["start_wall"] is not None),
                          default=None)
    job_id = man.get("job_id") or f.submitted.get("job_id")
    elapsed = job.elapsed_s if job and job.elapsed_s is not None else (
        ended - started if ended is not None and started is not None else None)
    return {
        "run_id": att.run_id, "campaign": att.campaign, "point_id": att.point_id, "repeat": att.repeat,
        "attempt": att.attempt, "experiment": f.experiment, "job_dir": _text(att.job_dir),
        "executor": man.get("executor") or f.submitted.get("executor"), "job_id": _text(job_id),
        "array_job_id": _text(man.get("array_job_id")), "array_task_id": man.get("array_task_id"),
        "submit_reason": man.get("reason"), **prediction_columns(man),
        "submitted_at": utc(man.get("submitted_at") or f.submitted.get("submitted_at")
                            or f.submitted.get("submit_time")),
        "state": v.state, "exit_code": job.exit_code if job else (
            max((code for r in results if isinstance(code := r.get("exit_code"), int)), default=None)),
        "exit_signal": job.exit_signal if job else f.killed_by, "elapsed_s": elapsed,
        "node_list": job.node_list if job else None, "hosts_expected": v.hosts_expected or None,
        "hosts_seen": sorted(f.hosts_all), "num_machines": f.num_machines,
        "max_rss_mb": job.max_rss_mb if job else None, "outcome": v.outcome,
        "reason": "; ".join(dict.fromkeys(v.reasons)) if v.reasons else None,
        "warnings": list(dict.fromkeys(v.warnings)) or None, "accounting_source": v.sched.source,
        "started_at": job.start if job and job.start else utc(started),
        "ended_at": (job.end if job and job.end else utc(ended)) if v.outcome is not None else None,
        "restarts": max([log.last_restart for log in f.stage_logs.values()] + [0]),
        "train_start_wall": train_start, "train_end_wall": _f(rank0.get("train_end_wall")),
        "warmup_end_wall": _f(rank0.get("warmup_end_wall")), "global_step": rank0.get("global_step"),
        "stopped_by": rank0.get("stopped_by"), "fingerprint": att.fingerprint,
    }


# What measurements.mfu_peak_source says of the peak MFU is set against (spec.json's peak_source, or a preflight's)
PEAK_SOURCES = {"inventory": "inventory", "gpu_peaks.yaml": "datasheet"}


def mfu_peak(d: RunData, measured: dict[tuple[str, str], list[float]]) -> float | None:
    """The median of the measured peaks of the devices of the hosts *d* ran on, at its compute dtype (the
    ``measured_peaks`` view, as ``measured_mfu`` reads it); None where none of its hosts was measured."""
    got = [p for h in d.seen_hosts for p in measured.get((h, d.compute_dtype or ""), [])]
    return median(got) if got else None


def mfu_properties(d: RunData) -> dict[str, Any]:
    """The FLOP columns of a run, MFU set against its hosts' measured peak where ``sbench preflight`` measured
    them at the run's dtype (``mfu_peak_source`` measured), else the inventory's or the datasheet's peak."""
    if d.measured_peak is not None:
        return {**run_flops(d.rank0, d.measured_peak), "mfu_peak_source": "measured", "mfu_peak_dtype": d.compute_dtype}
    out = run_flops(d.rank0, d.peak)
    return {**out, "mfu_peak_source": PEAK_SOURCES.get(d.peak_source or "") if d.peak else None,
            "mfu_peak_dtype": d.compute_dtype}


def build(f: JobFiles, v: Verdict) -> RunData:
    """The run's rows from its files and verdict."""
    rid = f.attempt.run_id
    stages = stage_rows(f, rid)
    run = run_row(f, v, stages)
    ran = aggregate.ran_properties(f.ranks)  # the runner's notes (adjustments among them) are the run's warnings
    run["warnings"] = list(dict.fromkeys([*(run["warnings"] or []), *ran["notes"]])) or None
    run["transport"], run["transport_by_host"] = summarize_transports(
        {h: f.transports.get(h) for h in sorted(f.hosts_all)})
    world = (count((f.rank0 or {}).get("world_size")) or count(f.jobspec.get("num_processes"))
             or max(1, count(f.entity.get("number_gpus"), 0) or 0))
    d = RunData(run=run, hosts=host_rows(f, v, rid, stages), stages=stages, ranks=rank_rows(f, rid),
                errors=error_rows(f, rid), trials=trial_rows(f, rid, stages), environment=environment_rows(f, rid),
                memory=memory_rows(f, rid),
                memory_prediction=f.jobspec.get("memory_prediction"),
                rank0=f.rank0, entity=f.entity, experiment=f.experiment, world_size=world,
                window=aggregate.measured_window(f.rank0, f.entity.get("auto_stop_method")), over=v.over,
                sample_interval_s=sample_interval(as_dict(f.jobspec.get("runner")).get("sample_interval_s")),
                host_busy_cpu=RunnerSettings.from_dict(as_dict(f.jobspec.get("runner"))).host_busy_cpu,
                workload=str(f.jobspec.get("workload") or "train"), peak=_f(f.jobspec.get("peak_tflops")),
                peak_source=_text(f.jobspec.get("peak_source")), compute_dtype=_text(f.jobspec.get("compute_dtype")),
                gpu_partition=None if not isinstance(f.jobspec.get("cpu_partition"), bool)
                else not f.jobspec["cpu_partition"],
                ran={**ran, "adjustments": to_json(ran["adjustments"] or None), "notes": ran["notes"] or None},
                slurm_energy_j=v.sched.job.consumed_energy_j if v.sched.job else None,
                price_per_gpu_hour=_f(f.jobspec.get("price_per_gpu_hour")))
    run["profiled"] = RunnerSettings.from_dict(as_dict(f.jobspec.get("runner"))).profiled
    d.seen_hosts = sorted(h["host"] for h in d.hosts if h.get("seen"))
    d.rank_scores, d.stragglers = score_rows(f, rid, run.get("campaign"))
    d.straggler_ranks = [f"{r['host']}:{r['rank']}" for r in d.rank_scores if r["flagged"]]
    if f.paths is not None:
        profile_data(d, f.paths)
        d.sample_files = [(h, f.paths.samples(h)) for h in f.sample_hosts]
        d.samples_written = {h: count(r.get("samples"), 0) for h, r in f.results.items()}
    drawn = [i for r in f.ranks.values() if isinstance(r.get("entries_consumed"), list) for i in r["entries_consumed"]]
    if len(f.ranks) > 1 and len(set(drawn)) < len(drawn):
        d.warn(f"the ranks' steps drew {len(drawn) - len(set(drawn))} of {len(drawn)} samples from entries another "
               "step had drawn already: the trainer seeded its ranks apart, so they did not partition the data "
               "(entries_consumed in rank.<r>.json)")
    return d


def unreadable(att: Attempt, sched: Sched, exc: BaseException) -> RunData:
    """The run of a job dir whose reading crashed: failed, with the reason; the collect goes on."""
    return failed_unread(att, sched, f"collect could not read this job directory: {type(exc).__name__}: "
                                     f"{first_line(exc)}")


def failed_unread(att: Attempt, sched: Sched, why: str) -> RunData:
    """The run of a job dir that was not read (why: :attr:`Attempt.refused`, or a crash of the reader):
    failed with that reason, from the manifest's line alone; nothing of the job dir is stored."""
    man = att.manifest or {}
    run: dict[str, Any] = {
           "run_id": att.run_id, "campaign": att.campaign, "point_id": att.point_id, "repeat": att.repeat,
           "attempt": att.attempt, "job_dir": _text(att.job_dir), "state": sched.state or "FAILED",
           "outcome": "failed", "reason": why, "warnings": None, "accounting_source": sched.source,
           "fingerprint": att.fingerprint, "max_rss_mb": None, "train_start_wall": None, "hosts_seen": [],
           "num_machines": None, "submit_reason": man.get("reason"), "submitted_at": utc(man.get("submitted_at")),
           **prediction_columns(man),
           **{k: man.get(k) for k in ("executor", "job_id", "array_job_id", "array_task_id", "experiment")}}
    return RunData(run=run, over=True)


TRACE_NAME = re.compile(r"profile\.(.+)\.rank(\d+)\.pt\.trace\.json\.gz")


def profile_data(d: RunData, paths: JobPaths) -> None:
    """A profiled run's files (``runs.profile_files``) and each rank trace's summary (``profile_ops``)."""
    files = paths.profile_files()
    d.run["profile_files"] = [p.name for p in files] or None
    for p in files:
        m = TRACE_NAME.fullmatch(p.name)
        if m is None:
            continue
        data, problem = read_file(p, paths.root, PROFILE_MAX)
        if data is None:
            d.warn(problem or f"{p.name}: missing")
            continue
        try:
            summary = summarise(read_trace(data))
        except (ValueError, OSError, EOFError) as exc:
            d.warn(f"{p.name}: not a readable trace ({exc})")
            continue
        if not summary.steps:
            d.warn(f"{p.name}: no profiled step (sbench:step range) in the trace")
        d.profile_ops += profile_rows(d.run["run_id"], m.group(1), int(m.group(2)), summary)


def measurement_row(d: RunData, stats: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measurements row of an ok or invalid run (None otherwise)."""
    run = d.run
    if run["outcome"] not in ("ok", "invalid"):
        return None  # failed runs record no properties (seeds: "Failed measurements do not record any")
    if d.workload != "train":
        return None  # a dry run of the harness (runner.workload: idle) measured no training
    exp = EXPERIMENTS.get(str(d.experiment)) if d.experiment else None
    row: dict[str, Any] = {k: run[k] for k in ("run_id", "campaign", "point_id", "repeat", "attempt", "experiment",
                                               "ended_at")}
    row.update(entity_values(d.entity))
    row["transport"] = run["transport"]
    row["world_size"] = d.world_size
    row["profiled"] = bool(run.get("profiled"))
    row.update(d.ran)  # what ran beside what was asked (torch_dtype is the point's), and the runner's notes
    if run["outcome"] == "invalid":
        # An invalid run (GPU OOM / illegal memory access) is a measurement of the point: is_valid=false
        # with every property NULL (nothing it measured before running out of memory is comparable).
        row["is_valid"] = False
        return row
    row["is_valid"] = True
    row["slurm_consumed_energy_joules"] = d.slurm_energy_j
    if exp is not None and exp.trials > 1:
        outcomes = [t.get("outcome") for t in d.trials]
        row.update(aggregate.stability_properties(outcomes, exp.trials))
        row["trials_run"] = len(outcomes)
        return row
    start, end = d.window
    devices, procs, had_gpu = aggregate.run_stats(stats, run["run_id"])
    stop_after = _f(d.entity.get("stop_after_seconds"))
    row.update(aggregate.benchmark_properties(devices, procs, had_gpu, d.rank0, d.world_size, stop_after))
    row.update(mfu_properties(d))
    row["price_per_gpu_hour"] = d.price_per_gpu_hour
    row["cost_per_million_tokens"] = cost_per_million_tokens(d.price_per_gpu_hour, d.world_size,
                                                             row.get("dataset_tokens_per_second"))
    row.update(aggregate.exact_properties(d.rank0))
    row.update(aggregate.token_counts(d.rank0))
    row.update(aggregate.step_time_properties(d.rank0, start, end))
    row.update(aggregate.window_properties(d.rank0))
    row.update(memory_properties(d))
    notes = list(d.ran.get("notes") or [])
    if not d.sample_files and (d.gpu_partition or (d.gpu_partition is None and
                                                   (_f(d.entity.get("number_gpus")) or 0) > 0)):
        # No sampler output at all is not "no GPU": leave the GPU properties unknown rather than 0.0.
        row.update({p: None for p in aggregate.GPU_PROPERTIES})
        notes.append("no samples file: GPU and CPU utilisation unknown")
    elif d.gpu_partition and not had_gpu:
        # A GPU partition whose sampler recorded no GPU at all: the sampler failed (NVML missing, no
        # permission), which is not 0 % utilisation.
        row.update({p: None for p in aggregate.GPU_PROPERTIES})
        d.warn("GPU partition but no GPU sample: the sampler could not read the GPUs (GPU metrics left NULL;"
               " see samples.<host>.csv and train.<host>.log)")
    if start is None or end is None:
        notes.append("no training window from rank 0: averaged over every sample")
    if had_gpu and not devices:
        notes.append("no GPU sample inside the measured window")
    if start is not None and end is not None and d.sample_files:
        energy, why = aggregate.energy_properties(aggregate.energy_stats(stats, run["run_id"], start, end), had_gpu,
                                                  d.rank0, end - start, aggregate.busy_devices(stats, run["run_id"]))
        row.update(energy)
        notes += why
        if energy["energy_source"] is None and d.gpu_partition is False:
            notes.append("no readable RAPL energy counter on the hosts: energy_joules NULL")
        notes += aggregate.coverage_notes(stats, run["run_id"], start, end, d.sample_interval_s)
    load, why = aggregate.host_load(stats, run["run_id"], d.host_busy_cpu, start, end)
    row.update(load)
    notes += why
    if d.rank_scores:
        row["straggler"], row["straggler_ranks"] = bool(d.straggler_ranks), d.straggler_ranks or None
        notes += d.stragglers
        if d.stragglers and row.get("host_busy"):
            notes.append("straggler measured on a host busy with other work: its neighbours may have slowed it, so "
                         "it does not count toward drain candidates (sbench hosts, host_health)")
    row.update({"window_start_wall": start, "window_end_wall": end,
                "window_s": end - start if start is not None and end is not None else None,
                "gpu_devices": len(devices), "gpu_samples": sum(x.samples for x in devices),
                "proc_samples": sum(x.samples for x in procs), "notes": notes or None})
    for n in notes[len(d.ran.get("notes") or []):]:  # what collect found is the run's warning too (status counts it)
        d.warn(n)
    return row
