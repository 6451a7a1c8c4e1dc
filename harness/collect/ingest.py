"""One collect: discover job directories, ask the scheduler, parse what changed, write it all in one
transaction.

Incremental and idempotent: each run stores a fingerprint of its job directory's files (name, size,
mtime) and its scheduler state. A run whose fingerprint and state are unchanged is skipped, so a
second collect writes nothing; a run that was still going is re-read when either changes, and its
rows are replaced as a whole. Everything a collect writes is one DuckDB transaction: killed half-way,
the database stays as it was.

Runs come from ``<workdir>/*/manifest.jsonl`` (re-recorded only when the file changed) and from
``<workdir>/<campaign>/*/spec.json`` (job dirs rendered and submitted by hand; a dir that was only
rendered, with nothing submitted or run, is skipped). SLURM runs are looked up with one batched
``sacct`` call (``squeue`` when sacct cannot answer); local runs by their process id; the files decide
the rest. Samples are bulk-loaded by DuckDB's CSV reader in one scan over all new files, in a helper
thread that runs while the job dirs are parsed (same connection, same transaction; the parse does not
use the database).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from ..catalog import EXPERIMENTS
from ..errors import CollectError
from ..flops import run_flops
from ..paths import JobPaths
from . import aggregate
from .discover import (
    Attempt,
    Manifest,
    discover,
    names_like,
    rendered_names,
    sample_files_of,
    scan,
    spec_exec,
    spec_rows,
)
from .parse import (
    StageLog,
    csv_tail,
    nccl_transport,
    parse_stages,
    read_json,
    summarize_transports,
)
from .sacct import (
    FINAL_STATES,
    JobAccounting,
    Runner,
    query_sacct,
    query_squeue,
    scheduler_verdict,
)
from .store import (
    entity_values,
    open_store,
    stage,
    to_json,
    utc,
)

Progress = Callable[[str, int, int], None]
PAUSE_ENV = "SBENCH_COLLECT_PAUSE_AT"  # tests: pause at a phase (inside the transaction) to be killed there


@dataclass
class CollectReport:
    db: str
    workdir: str
    runs: int = 0
    new: int = 0
    updated: int = 0
    unchanged: int = 0
    sample_rows: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    accounting: dict[str, int] = field(default_factory=dict)
    sacct: str | None = None
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    # Seconds per phase, in order (they add up to elapsed_s): discover, decide, delete, parse (the sample
    # load runs meanwhile), samples (what is left of the load after parsing), measure, write, commit;
    # plus samples_load, the load's own duration (it overlaps parse, so it is not part of the sum).
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Sched:
    source: str  # sacct | executor | files
    state: str | None = None  # None: the files decide
    job: JobAccounting | None = None
    gone: bool = False  # the executor/queue no longer knows the job: it is over


class _Clock:
    def __init__(self, report: CollectReport) -> None:
        self.report, self.t = report, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.report.timings[name] = round(self.report.timings.get(name, 0.0) + now - self.t, 3)
        self.t = now


def _pause(phase: str) -> None:
    if os.environ.get(PAUSE_ENV) == phase:
        sys.stderr.write(f"sbench-collect: paused at {phase}\n")
        sys.stderr.flush()
        time.sleep(float(os.environ.get("SBENCH_COLLECT_PAUSE_S", "60")))



# -- per-run analysis ------------------------------------------------------------------------------------
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
    sample_files: list[tuple[str, Path]] = field(default_factory=list)
    rank0: dict[str, Any] | None = None
    entity: dict[str, Any] = field(default_factory=dict)
    experiment: str | None = None
    world_size: int = 1
    window: tuple[float | None, float | None] = (None, None)
    over: bool = False
    workload: str = "train"
    peak: float | None = None  # one device's peak TFLOP/s from spec.json (MFU's denominator)


def _slurm_tail(paths: JobPaths) -> str | None:
    """The last line of the batch script's output: why a job that never started its runner failed."""
    for out in reversed(paths.slurm_outputs()):
        try:
            with out.open("rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - 4096))
                lines = [x for x in fh.read().decode("utf-8", errors="replace").splitlines() if x.strip()]
        except OSError:
            continue
        if lines:
            return f"{out.name}: {_first_line(lines[-1])}"
    return None


def _first_line(text: Any, limit: int = 300) -> str:
    s = str(text or "").strip().splitlines()
    line = s[0] if s else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _count(value: Any, minimum: int = 1, maximum: int = 2**31 - 1) -> int | None:
    """A count or index from a runner file (an integer in [minimum, maximum]); None for anything else."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        return None
    return value


def _provenance(doc: Any) -> dict[str, Any]:
    """environment.<host>.json's provenance block as the environment table's columns."""
    doc = doc if isinstance(doc, dict) else {}
    out = {k: None if doc.get(src) is None else str(doc.get(src))
           for k, src in (("driver_version", "driver"), ("cuda_driver", "cuda_driver"), ("cuda_runtime", "cuda_runtime"),
                          ("nccl", "nccl"), ("cudnn", "cudnn"), ("flash_attn", "flash_attn"))}
    out["hca_firmware"] = to_json(doc.get("hcas")) if isinstance(doc.get("hcas"), list) and doc["hcas"] else None
    return out


def _local_alive(job_id: str | None) -> bool | None:
    """Whether the local executor's job (submitit's local job id is its process id) still runs."""
    try:
        pid = int(str(job_id))
    except (TypeError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def analyze(att: Attempt, sched: Sched, cancel_requested: bool,
            known_point: Mapping[str, Any] | None = None) -> RunData:
    """Read one job directory and decide its outcome; never raises on bad content."""
    jd = att.job_dir
    paths = JobPaths(jd) if jd is not None else None
    man = att.manifest or {}
    warnings: list[str] = []
    spec, sp = (read_json(paths.spec) if paths else (None, None))
    if sp:
        warnings.append(sp)
    spec = spec if isinstance(spec, dict) else {}
    js = spec.get("jobspec") or {}
    point = spec.get("point") or {}
    kp = known_point or {}
    entity = dict(point.get("entity") or js.get("entity") or kp.get("entity") or {})
    experiment = point.get("experiment") or js.get("experiment") or man.get("experiment") or kp.get("experiment")
    submitted, sub_p = (read_json(paths.submitted) if paths else (None, None))
    submitted = submitted if isinstance(submitted, dict) else {}
    if sub_p:
        warnings.append(sub_p)
    num_machines = _count(js.get("num_machines")) or _count(entity.get("number_nodes")) or 1
    exp = EXPERIMENTS.get(str(experiment)) if experiment else None
    expected_trials = _count(js.get("trials")) or (exp.trials if exp else 1)

    # -- per-host files ------------------------------------------------------------------------------------
    hosts_all: set[str] = set()
    stage_logs: dict[str, StageLog] = {}
    results: dict[str, dict[str, Any]] = {}
    envs: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    names: list[str] = []
    if paths is not None:
        names = att.files if att.files is not None else (scan(jd)[1] or [])
        for h in names_like(names, paths.stages):
            stage_logs[h] = parse_stages(paths.stages(h), h)
            problems += stage_logs[h].problems
        result_hosts = names_like(names, paths.result)
        for h in result_hosts:
            doc, p = read_json(paths.result(h))
            if p:
                problems.append(p)
            if isinstance(doc, dict):
                results[h] = doc
            elif doc is not None:
                problems.append(f"{paths.result(h).name}: not a JSON object")
        for h in names_like(names, paths.environment):
            doc, p = read_json(paths.environment(h))
            if p:
                problems.append(p)
            if isinstance(doc, dict):
                envs[h] = doc
        sample_hosts = names_like(names, paths.samples)
        log_hosts = names_like(names, paths.train_log)
        hosts_all = set(stage_logs) | set(result_hosts) | set(sample_hosts) | set(envs) | set(log_hosts)
    else:
        sample_hosts, log_hosts = [], []

    # -- ranks and errors ------------------------------------------------------------------------------------
    ranks: dict[int, dict[str, Any]] = {}
    if paths is not None:
        for r in names_like(names, paths.rank_result):
            doc, p = read_json(paths.rank_result(r))
            if p:
                problems.append(p)
            if isinstance(doc, dict) and (rk := _count(doc.get("rank"), 0)) is not None:
                ranks[rk] = doc
    for res in results.values():
        for doc in res.get("ranks") or []:
            if isinstance(doc, dict) and (rk := _count(doc.get("rank"), 0)) is not None:
                ranks.setdefault(rk, doc)
    rank0 = ranks.get(0)
    if rank0 is None:
        for res in results.values():
            if isinstance(res.get("training"), dict):
                rank0 = res["training"]
    errors: list[dict[str, Any]] = []
    if paths is not None:
        for r in names_like(names, paths.error):
            doc, p = read_json(paths.error(r))
            if p:
                problems.append(p)
            if isinstance(doc, dict):
                errors.append({**doc, "_rank": r})

    # -- scheduler facts -------------------------------------------------------------------------------------
    if sched.source == "executor" and sched.job is None and sched.state == "RUNNING" and \
            len(results) >= num_machines:
        # Every node runner wrote its result: the run is over even if a (local) process id is still alive
        # (tearing down, or reused by another process).
        sched = Sched("executor", None, gone=True)
    job = sched.job
    sched_hosts = job.hosts if job else []
    hosts_expected = sched_hosts or (sorted(hosts_all) if len(hosts_all) == num_machines else [])
    over = False
    if sched.state is not None:
        verdict, _ = scheduler_verdict(sched.state)
        over = verdict != "pending"
    else:
        over = bool(results) or cancel_requested or sched.gone

    # -- outcome ---------------------------------------------------------------------------------------------
    reasons: list[str] = []
    crash: list[str] = []
    for h, log in sorted(stage_logs.items()):
        seen_pairs: set[tuple[str, str]] = set()
        for row in log.rows:
            if row.restart != log.last_restart:
                continue
            if row.status == "incomplete" and (row.stage, h) not in seen_pairs:
                seen_pairs.add((row.stage, h))
                crash.append(f"crashed during {row.stage} on {h}: start without end")
            elif row.status in ("error", "killed") and (row.stage, h) not in seen_pairs:
                seen_pairs.add((row.stage, h))
                crash.append(f"{row.stage} {'failed' if row.status == 'error' else 'killed'} on {h}"
                             + (f": {_first_line(row.error)}" if row.error else ""))
    missing: list[str] = []
    exp_text = ",".join(hosts_expected)
    for h in hosts_expected:
        if h not in stage_logs:
            missing.append(f"node {h}: no stages file (expected hosts {exp_text})")
        elif h not in results:
            missing.append(f"node {h}: no result file")
    if not hosts_expected and len(hosts_all) < num_machines and over:
        plural = "s" if num_machines != 1 else ""
        missing.append(f"expected {num_machines} host{plural}, found files from {len(hosts_all)}"
                       f" ({', '.join(sorted(hosts_all)) or 'none'})")
    extra = sorted(hosts_all - set(hosts_expected)) if sched_hosts else []
    if extra:
        warnings.append(f"files from hosts outside the allocation ({job.node_list if job else ''}): "
                        f"{', '.join(extra)}")
    invalid_errs = [e for e in errors if e.get("kind") == "invalid"]
    failed_errs = [e for e in errors if e.get("kind") != "invalid"]

    def err_text(e: Mapping[str, Any]) -> str:
        where = f"rank {e.get('rank', e['_rank'])} on {e.get('host') or '?'}"
        if e.get("stage"):
            where += f" during {e['stage']}"
        return f"{e.get('error_type') or 'error'}: {_first_line(e.get('message'))} ({where})"

    is_stability = exp is not None and exp.trials > 1
    trials_doc: list[dict[str, Any]] = []
    for res in results.values():
        if isinstance(res.get("trials"), list) and res["trials"]:
            trials_doc = [t for t in res["trials"] if isinstance(t, dict)]
    # The signal that ended a run no scheduler accounts for (local executor): the node runner's, else
    # launch.sh's as the local executor recorded it.
    killed_by = next((_count(r.get("terminated_by") or r.get("signal"), 1, 255) for r in results.values()
                      if r.get("terminated_by") or r.get("signal")), None) or _count(submitted.get("exit_signal"), 1, 255)
    outcome: str | None = None
    state = sched.state
    if not over:
        outcome = None
        if state is None:
            state = "RUNNING" if hosts_all else "SUBMITTED"
    else:
        sched_fail_reason = None
        if sched.state is not None:
            verdict, why = scheduler_verdict(sched.state)
            if verdict == "failed":
                sched_fail_reason = why
                if job and job.elapsed_s is not None and sched.state == "TIMEOUT":
                    sched_fail_reason = f"timeout after {job.elapsed_s:g} s"
        elif cancel_requested and not (results and len(results) >= max(1, len(hosts_expected) or num_machines)
                                       and all(r.get("outcome") == "ok" for r in results.values())):
            # A cancel that arrived in time: the node runners stopped on its signal (or never started).
            sched_fail_reason = "cancelled"
            state = "CANCELLED"
        host_fail = [f"node {h}: {r.get('reason')}" for h, r in sorted(results.items())
                     if r.get("outcome") == "failed" and r.get("reason")]
        host_invalid = [f"node {h}: {r.get('reason')}" for h, r in sorted(results.items())
                        if r.get("outcome") == "invalid"]
        all_results = bool(results) and all(h in results for h in (hosts_expected or results)) and \
            len(results) >= num_machines
        if is_stability and not sched_fail_reason:
            if len(trials_doc) >= expected_trials and all_results:
                outcome = "ok"
            else:
                outcome = "failed"
                reasons.append(f"stability: {len(trials_doc)} of {expected_trials} trials recorded")
        elif invalid_errs or (host_invalid and not sched_fail_reason):
            outcome = "invalid"
            reasons += [f"GPU out of memory: {err_text(e)}" for e in invalid_errs] or host_invalid
            if sched_fail_reason:
                reasons.append(f"then {sched_fail_reason}")
        elif sched_fail_reason:
            outcome = "failed"
            reasons.append(sched_fail_reason)
        elif all_results and all(r.get("outcome") == "ok" for r in results.values()) and not failed_errs \
                and rank0 is not None and not missing:
            outcome = "ok"
        else:
            outcome = "failed"
        if outcome != "ok":
            reasons += [err_text(e) for e in failed_errs]
            reasons += [r for r in host_fail if r not in reasons]
            reasons += crash + missing
            if outcome == "failed" and rank0 is None and not reasons and all_results:
                reasons.append("no training measurements from rank 0 (no rank.0.json)")
            if outcome == "failed" and not reasons:
                if job and job.exit_code:
                    reasons.append(f"job exited with code {job.exit_code}:{job.exit_signal or 0}")
                elif sched.gone and not hosts_all:
                    reasons.append("the job left the queue without writing any file")
                else:
                    reasons.append("no result from the runner")
            if outcome == "failed" and not hosts_all and paths is not None:
                tail = _slurm_tail(paths)
                if tail:
                    reasons.append(tail)
            reasons += problems
        if state is None:
            if sched.gone and not hosts_all or killed_by:
                state = "FAILED"
            else:
                codes = [r.get("exit_code") for r in results.values()]
                state = "COMPLETED" if all_results and all(c in (0, None) for c in codes) else "FAILED"
    if outcome in (None, "ok"):
        warnings += problems
    # -- transport, environment, hosts -------------------------------------------------------------------
    transports: dict[str, str | None] = {}
    nccl_lines: dict[str, str | None] = {}
    if paths is not None:
        for h in log_hosts:
            transports[h], nccl_lines[h] = nccl_transport(paths.train_log(h))
    summary, detail = summarize_transports({h: transports.get(h) for h in sorted(hosts_all)})
    run_id = att.run_id
    host_rows = []
    for h in sorted(hosts_all | set(hosts_expected)):
        res = results.get(h, {})
        env = envs.get(h, {})
        host_rows.append({
            "run_id": run_id, "host": h,
            "machine_rank": res.get("machine_rank", env.get("machine_rank")),
            "expected": h in hosts_expected if hosts_expected else None, "seen": h in hosts_all,
            "has_stages": h in stage_logs, "has_samples": h in sample_hosts, "has_result": h in results,
            "has_environment": h in envs, "has_log": h in log_hosts, "outcome": res.get("outcome"),
            "exit_code": res.get("exit_code"), "signal": None if res.get("signal") is None else str(res["signal"]),
            "reason": res.get("reason"), "started_wall": res.get("started_wall"), "ended_wall": res.get("ended_wall"),
            "transport": transports.get(h), "nccl_net": nccl_lines.get(h)})

    stage_rows = []
    for h, log in sorted(stage_logs.items()):
        for r in log.rows:
            stage_rows.append({"run_id": run_id, "host": h, "rank": r.rank, "stage": r.stage, "trial": r.trial,
                               "restart": r.restart, "pid": r.pid, "start_wall": r.start_wall, "end_wall": r.end_wall,
                               "started_at": utc(r.start_wall), "ended_at": utc(r.end_wall),
                               "duration_s": r.duration_s, "status": r.status, "error": r.error,
                               "info": to_json(r.info)})
    rank_rows = []
    for rk, doc in sorted(ranks.items()):
        m = doc.get("metrics") if isinstance(doc.get("metrics"), dict) else {}
        rank_rows.append({
            "run_id": run_id, "rank": rk, "host": doc.get("host"), "local_rank": doc.get("local_rank"),
            "world_size": doc.get("world_size"),
            "device": None if doc.get("device") is None else (doc["device"] if isinstance(doc["device"], str)
                                                              else json.dumps(doc["device"], sort_keys=True)),
            "global_step": doc.get("global_step"), "train_start_wall": doc.get("train_start_wall"),
            "train_end_wall": doc.get("train_end_wall"), "warmup_end_wall": doc.get("warmup_end_wall"),
            "stopped_by": doc.get("stopped_by"),
            **{k: aggregate._f(m.get(k)) for k in ("train_runtime", "train_samples_per_second",
                                                   "train_steps_per_second", "train_tokens_per_second",
                                                   "dataset_tokens_per_second")},
            "dataset_tokens": _count(m.get("dataset_tokens"), 0, 2**63 - 1),
            "notes": [str(n) for n in doc.get("notes") or []] if isinstance(doc.get("notes"), list) else None,
            "metrics": to_json(m or None)})
    err_rows = [{"run_id": run_id, "rank": str(e.get("rank", e["_rank"])), "host": e.get("host"),
                 "kind": e.get("kind"), "error_type": e.get("error_type"), "message": e.get("message"),
                 "traceback": e.get("traceback"), "stage": e.get("stage"),
                 "trial": e.get("trial") if isinstance(e.get("trial"), int) else None,
                 "t_wall": aggregate._f(e.get("t_wall"))} for e in errors]
    trial_stage = {(r["trial"]): r for r in stage_rows if r["stage"] == "trial" and r["trial"] is not None}
    trial_host = next((h for h, r in results.items() if r.get("trials")), None)
    trial_rows = []
    for t in trials_doc:
        tn = t.get("trial")
        st = trial_stage.get(tn) if isinstance(tn, int) else None
        trial_rows.append({"run_id": run_id, "trial": tn if isinstance(tn, int) else None, "host": trial_host,
                           "exit_code": t.get("exit_code"), "outcome": t.get("outcome"), "reason": t.get("reason"),
                           "start_wall": st["start_wall"] if st else None, "end_wall": st["end_wall"] if st else None,
                           "duration_s": st["duration_s"] if st else None})
    env_rows = []
    for h, doc in sorted(envs.items()):
        pk = doc.get("packages") if isinstance(doc.get("packages"), dict) else doc
        gpus = doc.get("gpus") if isinstance(doc.get("gpus"), list) else []
        env_rows.append({
            "run_id": run_id, "host": h, "machine_rank": doc.get("machine_rank"),
            "python": None if doc.get("python") is None else str(doc["python"]),
            **{k: (None if pk.get(k) is None else str(pk.get(k)))
               for k in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "submitit", "duckdb")},
            "nvidia_ml_py": None if (pk.get("nvidia-ml-py") or pk.get("nvidia_ml_py")) is None
            else str(pk.get("nvidia-ml-py") or pk.get("nvidia_ml_py")),
            "sbench_version": doc.get("sbench_version"), "git_commit": doc.get("git_commit"),
            "gpu_count": len(gpus), "gpu_names": [str(g.get("name")) for g in gpus if isinstance(g, dict)],
            "gpus": to_json(gpus), "cpu_count": doc.get("cpu_count"),
            "memory_total_mb": aggregate._f(doc.get("memory_total_mb")), "env": to_json(doc.get("env")),
            "packages": to_json(doc.get("packages")),
            **_provenance(doc.get("provenance"))})

    # -- times, the run row ----------------------------------------------------------------------------------
    starts = [aggregate._f(r.get("started_wall")) for r in results.values()] + \
        [r["start_wall"] for r in stage_rows if r["start_wall"] is not None]
    ends = [aggregate._f(r.get("ended_wall")) for r in results.values()]
    started = min((s for s in starts if s is not None), default=None)
    ended = max((e for e in ends if e is not None), default=None)
    if outcome is not None and ended is None:
        ended = max((r["end_wall"] for r in stage_rows if r["end_wall"] is not None), default=None)
    auto = entity.get("auto_stop_method")
    window = aggregate.measured_window(rank0, auto)
    train_start = aggregate._f((rank0 or {}).get("train_start_wall"))
    if train_start is None:
        train_starts = [r["start_wall"] for r in stage_rows if r["stage"] == "train" and r["start_wall"] is not None]
        train_start = min(train_starts) if train_starts else None
    world = (_count((rank0 or {}).get("world_size")) or _count(js.get("num_processes"))
             or max(1, _count(entity.get("number_gpus"), 0) or 0))
    executor = man.get("executor") or submitted.get("executor")
    job_id = man.get("job_id") or submitted.get("job_id")
    restarts = max([log.last_restart for log in stage_logs.values()] + [0])
    elapsed = job.elapsed_s if job and job.elapsed_s is not None else (
        ended - started if ended is not None and started is not None else None)
    run = {
        "run_id": run_id, "campaign": att.campaign, "point_id": att.point_id, "repeat": att.repeat,
        "attempt": att.attempt, "experiment": experiment, "job_dir": str(jd) if jd else None,
        "executor": executor, "job_id": None if job_id is None else str(job_id),
        "array_job_id": None if man.get("array_job_id") is None else str(man.get("array_job_id")),
        "array_task_id": man.get("array_task_id"), "submit_reason": man.get("reason"),
        "submitted_at": utc(man.get("submitted_at") or submitted.get("submitted_at") or submitted.get("submit_time")),
        "state": state, "exit_code": job.exit_code if job else (
            max((r.get("exit_code") for r in results.values() if isinstance(r.get("exit_code"), int)), default=None)),
        "exit_signal": job.exit_signal if job else killed_by, "elapsed_s": elapsed,
        "node_list": job.node_list if job else None, "hosts_expected": hosts_expected or None,
        "hosts_seen": sorted(hosts_all), "num_machines": num_machines,
        "max_rss_mb": job.max_rss_mb if job else None, "outcome": outcome,
        "reason": "; ".join(dict.fromkeys(reasons)) if reasons else None,
        "warnings": list(dict.fromkeys(warnings)) or None, "accounting_source": sched.source,
        "started_at": (job.start if job and job.start else utc(started)),
        "ended_at": (job.end if job and job.end else utc(ended)) if outcome is not None else None,
        "restarts": restarts, "transport": summary, "transport_by_host": detail,
        "train_start_wall": train_start, "train_end_wall": aggregate._f((rank0 or {}).get("train_end_wall")),
        "warmup_end_wall": aggregate._f((rank0 or {}).get("warmup_end_wall")),
        "global_step": (rank0 or {}).get("global_step"), "stopped_by": (rank0 or {}).get("stopped_by"),
        "fingerprint": att.fingerprint,
    }
    data = RunData(run=run, hosts=host_rows, stages=stage_rows, ranks=rank_rows, errors=err_rows, trials=trial_rows,
                   environment=env_rows, rank0=rank0, entity=entity, experiment=experiment, world_size=world,
                   window=window, over=over, workload=str(js.get("workload") or "train"),
                   peak=aggregate._f(js.get("peak_tflops")))
    if paths is not None:
        data.sample_files = [(h, paths.samples(h)) for h in sample_hosts]
    return data


def analyze_isolated(att: Attempt, sched: Sched, cancel_requested: bool,
                     known_point: Mapping[str, Any] | None = None) -> RunData:
    """:func:`analyze`, with any failure confined to this run: it is recorded as failed, with the reason,
    and every other run of the collect goes on."""
    try:
        return analyze(att, sched, cancel_requested, known_point)
    except Exception as exc:  # noqa: BLE001 - one unreadable job dir must not stop the others
        why = f"collect could not read this job directory: {type(exc).__name__}: {_first_line(exc)}"
        run = {"run_id": att.run_id, "campaign": att.campaign, "point_id": att.point_id, "repeat": att.repeat,
               "attempt": att.attempt, "job_dir": str(att.job_dir) if att.job_dir else None,
               "state": sched.state or "FAILED", "outcome": "failed", "reason": why, "warnings": None,
               "accounting_source": sched.source, "fingerprint": att.fingerprint, "max_rss_mb": None,
               "train_start_wall": None, "hosts_seen": [], "num_machines": None}
        man = att.manifest or {}
        for k in ("executor", "job_id", "array_job_id", "array_task_id", "experiment"):
            run[k] = man.get(k)
        run["submit_reason"] = man.get("reason")
        run["submitted_at"] = utc(man.get("submitted_at"))
        return RunData(run=run, over=True)


def measurement_row(d: RunData, stats: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measurements row of an ok or invalid run (None otherwise)."""
    run = d.run
    if run["outcome"] not in ("ok", "invalid"):
        return None  # failed runs record no properties (seeds: "Failed measurements do not record any")
    if d.workload != "train":
        return None  # a dry run of the harness (runner.workload: idle) measured no training
    exp = EXPERIMENTS.get(str(d.experiment)) if d.experiment else None
    row: dict[str, Any] = {k: run[k] for k in ("run_id", "campaign", "point_id", "repeat", "attempt", "experiment")}
    row["ended_at"] = run["ended_at"]
    row.update(entity_values(d.entity))
    row["transport"] = run["transport"]
    row["world_size"] = d.world_size
    if run["outcome"] == "invalid":
        # An invalid run (GPU OOM / illegal memory access) is a measurement of the point: is_valid=false
        # with every property NULL (nothing it measured before running out of memory is comparable).
        row["is_valid"] = False
        return row
    row["is_valid"] = True
    if exp is not None and exp.trials > 1:
        outcomes = [t.get("outcome") for t in d.trials]
        row.update(aggregate.stability_properties(outcomes, exp.trials))
        row["trials_run"] = len(outcomes)
        return row
    start, end = d.window
    devices, procs, had_gpu = aggregate.run_stats(stats, run["run_id"])
    stop_after = aggregate._f(d.entity.get("stop_after_seconds"))
    row.update(aggregate.benchmark_properties(devices, procs, had_gpu, d.rank0, d.world_size, stop_after))
    row.update(run_flops(d.rank0, d.peak))
    notes = []
    if not d.sample_files and (aggregate._f(d.entity.get("number_gpus")) or 0) > 0:
        # No sampler output at all is not "no GPU": leave the GPU properties unknown rather than 0.0.
        row.update({p: None for p in aggregate.GPU_PROPERTIES})
        notes.append("no samples file: GPU and CPU utilisation unknown")
    if start is None or end is None:
        notes.append("no training window from rank 0: averaged over every sample")
    if had_gpu and not devices:
        notes.append("no GPU sample inside the measured window")
    row.update({"window_start_wall": start, "window_end_wall": end,
                "window_s": end - start if start is not None and end is not None else None,
                "gpu_devices": len(devices), "gpu_samples": sum(x.samples for x in devices),
                "proc_samples": sum(x.samples for x in procs), "notes": notes or None})
    return row


# -- scheduler --------------------------------------------------------------------------------------------
def scheduler_states(todo: list[tuple[Attempt, dict[str, Any]]], runner: Runner | None,
                     report: CollectReport) -> dict[str, Sched]:
    """One batched sacct call (squeue as a fallback) for the SLURM runs that may have changed."""
    out: dict[str, Sched] = {}
    slurm = {a.run_id: str(info["job_id"]) for a, info in todo
             if info.get("executor") == "slurm" and info.get("job_id")}
    acct: dict[str, JobAccounting] | None = None
    queue = None
    if slurm:
        acct, why = query_sacct(slurm.values(), **({"runner": runner} if runner else {}))
        report.sacct = why or "ok"
        missing = [j for j in slurm.values() if acct is None or j not in acct]
        if missing:
            queue = query_squeue(**({"runner": runner} if runner else {}))
    for a, info in todo:
        if a.run_id in slurm:
            jid = slurm[a.run_id]
            if acct is not None and jid in acct:
                out[a.run_id] = Sched("sacct", acct[jid].state, acct[jid])
            elif queue is not None and jid in queue:
                out[a.run_id] = Sched("executor", queue[jid][0])
            elif queue is not None:
                out[a.run_id] = Sched("files", None, gone=True)
            else:
                out[a.run_id] = Sched("files")
        elif info.get("executor") == "local":
            alive = _local_alive(info.get("job_id"))
            out[a.run_id] = Sched("executor", "RUNNING" if alive else None, gone=alive is False)
        else:
            out[a.run_id] = Sched("files")
    return out


# -- the collect -------------------------------------------------------------------------------------------
def collect(db: str | Path, workdir: str | Path, campaign: str | None = None, *, progress: Progress | None = None,
            sacct_runner: Runner | None = None, wait_s: float | None = None) -> CollectReport:
    """Collect every run under *workdir* into *db*; see the module docstring."""
    t0 = time.monotonic()
    wd = Path(workdir)
    report = CollectReport(db=str(db), workdir=str(wd))
    prog = progress or (lambda phase, done, total: None)
    clock = _Clock(report)
    prog("discover", 0, 1)
    manifests, attempts, warns = discover(wd, campaign)
    report.warnings += warns
    if not wd.is_dir():
        report.warnings.append(f"{wd}: no such directory; nothing to collect (pass --workdir)")
    for a in attempts.values():
        a.fingerprint, a.files = scan(a.job_dir)
    # A job dir that was only rendered (a preview: no manifest line, never submitted, nothing ran) is no run.
    previews = [rid for rid, a in attempts.items() if a.manifest is None and a.job_dir is not None
                and set(a.files or ()) <= rendered_names(JobPaths(a.job_dir))]
    for rid in previews:
        del attempts[rid]
    prog("discover", 1, 1)
    clock.lap("discover")
    tmpdir = Path(tempfile.mkdtemp(prefix="sbench-collect-"))
    try:
        _collect(db, wait_s, report, manifests, attempts, sacct_runner, prog, clock, tmpdir)
    except duckdb.Error as exc:
        raise CollectError(f"{db}: collect failed and changed nothing (rolled back): {exc}") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


@dataclass
class SampleFile:
    """One samples CSV to load: where the reader reads it (``use``: the file, or a link/trimmed copy in
    the temp dir) and what it belongs to."""

    file_id: int
    run_id: str
    host: str
    path: Path
    use: str
    truncated_line: int | None = None  # 1-based number of a last line cut mid-write (not loaded)


def _sample_inputs(changed: list[tuple[Attempt, Sched, dict[str, Any]]], first_id: int,
                   tmpdir: Path) -> list[SampleFile]:
    """The sample CSVs of the changed runs, numbered from *first_id*. A file whose last line was cut
    mid-write (no final newline) is loaded from a copy without that line, so a half-written number
    never gets in. Needs only the directory listings, so the load can start before the runs are parsed."""
    files: list[SampleFile] = []
    for a, _s, _info in changed:
        for host, path in sample_files_of(a):
            i = len(files)
            use = str(path)
            if any(c in use for c in "*?[{"):
                # DuckDB's reader expands glob characters in file names: read such a file via a plain link.
                link = tmpdir / f"{i}.link.csv"
                link.symlink_to(path)
                use = str(link)
            sf = SampleFile(first_id + i, a.run_id, host, path, use)
            tail = csv_tail(path)
            if tail is not None:
                cut, sf.truncated_line = tail
                copy = tmpdir / f"{i}.csv"
                with path.open("rb") as src, copy.open("wb") as dst:
                    dst.write(src.read(cut))
                sf.use = str(copy)
            files.append(sf)
    return files


class _Background(threading.Thread):
    """Runs one call in a helper thread; :meth:`result` joins it and returns (or raises) its outcome."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__(name="sbench-collect-samples", daemon=True)
        self.fn, self.args = fn, args
        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        t = time.perf_counter()
        try:
            self.value = self.fn(*self.args)
        except BaseException as exc:  # handed to the caller by result()
            self.error = exc
        self.seconds = time.perf_counter() - t

    def result(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


def _collect(db: str | Path, wait_s: float | None, report: CollectReport, manifests: list[Manifest],
             attempts: dict[str, Attempt], sacct_runner: Runner | None, prog: Progress, clock: _Clock,
             tmpdir: Path) -> None:
    with open_store(db, wait_s=wait_s) as store:
        with store.transaction():
            for man in manifests:
                # The manifest is append-only: one unchanged since the last collect is recorded already.
                key = f"manifest:{os.path.abspath(man.path)}"
                if store.get_metadata(key) != man.fingerprint:
                    report.warnings += store.record_manifest(man.events, strict=False, source=str(man.path))
                    store.set_metadata(key, man.fingerprint)
            known_points = {str(ev.get("point_id")): ev for man in manifests for ev in man.events
                            if ev.get("type") == "point"}
            index = store.run_index()
            for a in attempts.values():
                if a.manifest is None and a.run_id not in index:
                    camp, prow, link, run = spec_rows(a)
                    store.ensure_spec_rows(camp, prow, link, run)
            index = store.run_index()
            # Which runs may have changed: new, files changed, or a state that can still change.
            todo: list[tuple[Attempt, dict[str, Any]]] = []
            for a in attempts.values():
                info = dict(index.get(a.run_id) or {})
                if not info.get("executor") or not info.get("job_id"):
                    sub = spec_exec(a)
                    info.setdefault("executor", None)
                    info["executor"] = info.get("executor") or sub.get("executor")
                    info["job_id"] = info.get("job_id") or sub.get("job_id")
                if info.get("fingerprint") != a.fingerprint or info.get("state") not in FINAL_STATES:
                    todo.append((a, info))
            report.runs = len(attempts)
            scheds = scheduler_states(todo, sacct_runner, report)
            changed: list[tuple[Attempt, Sched, dict[str, Any]]] = []
            for a, info in todo:
                s = scheds[a.run_id]
                new_state = s.state if s.state is not None else ("GONE" if s.gone else None)
                state_moved = new_state is not None and new_state != info.get("state")
                if info.get("fingerprint") != a.fingerprint or state_moved:
                    changed.append((a, s, info))
            report.unchanged = len(attempts) - len(changed)
            clock.lap("decide")
            _pause("parse")
            ids = [a.run_id for a, _s, _info in changed]
            store.delete_runs(ids)
            files = _sample_inputs(changed, store.next_sample_file_id(), tmpdir)
            clock.lap("delete")
            _pause("samples")
            # The sample load (DuckDB, both cores, GIL released) runs in a helper thread while this one
            # parses the job dirs (Python); nothing else touches the connection until it is joined.
            loader = _Background(store.load_samples, [f.use for f in files], files[0].file_id) if files else None
            if loader is not None:
                loader.start()
            try:
                datas: list[RunData] = []
                for i, (a, s, info) in enumerate(changed):
                    d = analyze_isolated(a, s, info.get("cancel_requested_at") is not None,
                                         known_points.get(a.point_id))
                    # The cancel request comes from the manifest, not from the files: keep it.
                    if d.run.get("cancel_requested_at") is None:
                        d.run["cancel_requested_at"] = info.get("cancel_requested_at")
                    datas.append(d)
                    if i % 25 == 0:
                        prog("parse", i, len(changed))
                prog("parse", len(changed), len(changed))
                # Typed columns of the run's child rows, while the load still has the connection.
                staged = [stage(table, [r for d in datas for r in getattr(d, attr)])
                          for table, attr in (("run_hosts", "hosts"), ("stages", "stages"), ("ranks", "ranks"),
                                              ("errors", "errors"), ("trials", "trials"),
                                              ("environment", "environment"))]
                clock.lap("parse")
                prog("samples", 0, 1)
                n, rejects = loader.result() if loader is not None else (0, [])
            except BaseException:
                if loader is not None and loader.is_alive():
                    store.con.interrupt()
                    loader.join()
                raise
            if loader is not None:
                report.timings["samples_load"] = round(loader.seconds, 3)
            clock.lap("samples")
            prog("samples", 1, 1)
            for d in datas:
                if d.run["run_id"] in index and index[d.run["run_id"]].get("fingerprint") is not None:
                    report.updated += 1
                else:
                    report.new += 1
            by_run = {d.run["run_id"]: d for d in datas}
            report.sample_rows = n
            for f in files:
                d = by_run[f.run_id]
                if f.truncated_line is not None and d.over:
                    _warn(d, f"{f.path.name} line {f.truncated_line}: truncated last line (ignored)")
            by_use = {f.use: f for f in files}
            for fpath, line, msg in rejects:
                hit = by_use.get(fpath)
                if hit:
                    _warn(by_run[hit.run_id], f"{hit.path.name} line {line}: {msg} (row skipped)")
            store.insert("sample_files", [{"file_id": f.file_id, "run_id": f.run_id, "host": f.host,
                                           "path": str(f.path), "t0": by_run[f.run_id].run["train_start_wall"]}
                                          for f in files])
            _pause("measure")
            stats = store.sample_stats([{"run_id": d.run["run_id"], "start": d.window[0], "end": d.window[1]}
                                        for d in datas if d.sample_files])
            per_run_rows: Counter[str] = Counter()
            per_run_rss: dict[str, float] = {}
            for s in stats:
                per_run_rows[s["run_id"]] += int(s["rows_all"])
                if s["rss_mb_max"] is not None:
                    per_run_rss[s["run_id"]] = max(per_run_rss.get(s["run_id"], 0.0), s["rss_mb_max"])
            stats_by_run: dict[str, list[dict[str, Any]]] = {}
            for s in stats:
                stats_by_run.setdefault(s["run_id"], []).append(s)
            measurements = []
            for d in datas:
                rid = d.run["run_id"]
                d.run["sample_rows"] = per_run_rows.get(rid, 0)
                if d.run["max_rss_mb"] is None:
                    d.run["max_rss_mb"] = per_run_rss.get(rid)
                m = measurement_row(d, stats_by_run.get(rid, []))
                if m is not None:
                    measurements.append(m)
            clock.lap("measure")
            now = utc(time.time())
            for d in datas:
                d.run["collected_at"] = now
            _pause("write")
            store.replace_runs([d.run for d in datas])
            for rows in staged:
                store.insert(rows.table, rows)
            store.insert("measurements", measurements)
            clock.lap("write")
            _pause("commit")
        clock.lap("commit")
        counts = store.con.execute(
            "SELECT coalesce(outcome, 'pending'), count(*) FROM runs GROUP BY ALL ORDER BY 1").fetchall()
        report.outcomes = {k: int(v) for k, v in counts}
        acc = store.con.execute("SELECT coalesce(accounting_source, 'none'), count(*) FROM runs GROUP BY ALL "
                                "ORDER BY 1").fetchall()
        report.accounting = {k: int(v) for k, v in acc}


def _warn(d: RunData, text: str) -> None:
    """A problem found while loading samples: a warning of an ok run, part of the reason otherwise."""
    if d.run["outcome"] in (None, "ok"):
        d.run["warnings"] = list(dict.fromkeys([*(d.run["warnings"] or []), text]))
    else:
        parts = [p for p in (d.run["reason"] or "").split("; ") if p]
        d.run["reason"] = "; ".join(dict.fromkeys([*parts, text]))


__all__ = ["CollectReport", "analyze", "collect", "discover", "measurement_row"]
