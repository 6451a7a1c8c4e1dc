"""The seeds' measured properties, as pure functions (usable without a database).

Definitions (ado-sfttrainer-experiments.md, "Measured properties" and notes 1-3):

* **Window.** Everything is measured over rank 0's training window,
  ``train_start_wall``..``train_end_wall``; under ``auto_stop_method`` it starts at
  ``warmup_end_wall`` instead (warm-up excluded; under the precision method that is where MSER-5's
  steady window begins, rank 0's ``window`` ``steady_state``). Samples on the bounds count.
* **GPU metrics** (note 1): for each in-use device (host, device) the time average of its samples
  inside the window; then min / avg / max across devices. Memory utilisation is
  ``100 * mem_used_mb / mem_total_mb``; power is reported in W and as ``100 * power_w /
  power_limit_w`` (the enforced limit). ``gpu_memory_utilization_peak`` is the highest single
  sample over all devices in the window. A run without any GPU sample row reports 0.0 for all of
  them (seeds: "0.0 if not using any GPUs").
* **CPU metrics** (note 2): the training process tree's ``cpu_pct`` (100 = one full core) and
  ``mem_pct`` (of host memory), time-averaged in the window per host, then averaged over hosts
  (one process tree per node).
* **Throughput**: ``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second`` are
  rank 0's (the trainer reports them for the whole run). ``train_tokens_per_gpu_per_second`` is rank
  0's ``train_tokens_per_second``; ``train_tokens_per_second`` is ``world_size *`` that (the seeds'
  FSDP estimate; equal to the per-GPU value on one device). Both are omitted (None) when
  ``stop_after_seconds > 0``. ``dataset_tokens_per_second`` is the run's rate of exact dataset tokens
  (note 3; rank 0 reports it for the run), ``dataset_tokens_per_second_per_gpu`` that divided by
  ``world_size`` unless rank 0 reports it.
* **Stability**: ``f_gpu_oom`` / ``f_other_error`` / ``f_no_error`` are the fractions of the trials
  whose outcome was ``invalid`` / ``failed`` / ``ok``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

GPU_PROPERTIES = (
    "gpu_compute_utilization_min", "gpu_compute_utilization_avg", "gpu_compute_utilization_max",
    "gpu_memory_utilization_min", "gpu_memory_utilization_avg", "gpu_memory_utilization_max",
    "gpu_power_percent_min", "gpu_power_percent_avg", "gpu_power_percent_max",
    "gpu_power_watts_min", "gpu_power_watts_avg", "gpu_power_watts_max", "gpu_memory_utilization_peak",
)


@dataclass(frozen=True)
class DeviceStats:
    """Time averages of one GPU's samples inside the window."""

    host: str
    device: int
    samples: int
    gpu_util: float | None
    mem_util: float | None
    mem_util_peak: float | None
    power_w: float | None
    power_pct: float | None


@dataclass(frozen=True)
class ProcStats:
    """Time averages of one host's training process tree inside the window."""

    host: str
    samples: int
    cpu_pct: float | None
    mem_pct: float | None


def _f(v: Any) -> float | None:
    if v is None or v == "" or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _mean(vals: Iterable[float | None]) -> float | None:
    xs = [v for v in vals if v is not None]
    return fmean(xs) if xs else None


def _pct(num: Any, den: Any) -> float | None:
    a, b = _f(num), _f(den)
    if a is None or not b:
        return None
    return 100.0 * a / b


def measured_window(rank0: Mapping[str, Any] | None, auto_stop_method: str | None) -> tuple[float | None, float | None]:
    """(start, end) wall times of the measured window; None where unknown."""
    if not rank0:
        return None, None
    start, end = _f(rank0.get("train_start_wall")), _f(rank0.get("train_end_wall"))
    warm = _f(rank0.get("warmup_end_wall"))
    auto = bool(auto_stop_method and auto_stop_method != "None") or rank0.get("window") == "steady_state"
    if auto and warm is not None:
        start = warm
    return start, end


def _in(t: Any, start: float | None, end: float | None) -> bool:
    x = _f(t)
    if x is None:
        return False
    return (start is None or x >= start) and (end is None or x <= end)


def device_stats(rows: Iterable[Mapping[str, Any]], start: float | None, end: float | None) -> list[DeviceStats]:
    """Per-device averages of ``kind=gpu`` sample rows (dicts keyed like the CSV, plus ``host``)."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("kind") != "gpu" or not _in(r.get("t_wall"), start, end):
            continue
        groups.setdefault((str(r.get("host")), int(float(r["device"]))), []).append(r)
    out = []
    for (host, dev), rs in sorted(groups.items()):
        mem = [_pct(r.get("mem_used_mb"), r.get("mem_total_mb")) for r in rs]
        mem_vals = [m for m in mem if m is not None]
        out.append(DeviceStats(
            host=host, device=dev, samples=len(rs), gpu_util=_mean(_f(r.get("gpu_util")) for r in rs),
            mem_util=_mean(mem), mem_util_peak=max(mem_vals) if mem_vals else None,
            power_w=_mean(_f(r.get("power_w")) for r in rs),
            power_pct=_mean(_pct(r.get("power_w"), r.get("power_limit_w")) for r in rs)))
    return out


def proc_stats(rows: Iterable[Mapping[str, Any]], start: float | None, end: float | None) -> list[ProcStats]:
    """Per-host averages of ``kind=proc`` sample rows."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("kind") != "proc" or not _in(r.get("t_wall"), start, end):
            continue
        groups.setdefault(str(r.get("host")), []).append(r)
    return [ProcStats(host=h, samples=len(rs), cpu_pct=_mean(_f(r.get("cpu_pct")) for r in rs),
                      mem_pct=_mean(_f(r.get("mem_pct")) for r in rs)) for h, rs in sorted(groups.items())]


def run_stats(stats: Iterable[Mapping[str, Any]], run_id: str) -> tuple[list[DeviceStats], list[ProcStats], bool]:
    """One run's per-device and per-host rows of the samples' window statistics, and whether any GPU row
    was sampled at all (inside the window or not)."""
    mine = [s for s in stats if s["run_id"] == run_id]
    devices = [DeviceStats(s["host"], int(s["device"]), int(s["samples"]), s["gpu_util"], s["mem_util"],
                           s["mem_util_peak"], s["power_w"], s["power_pct"])
               for s in mine if s["kind"] == "gpu" and s["samples"]]
    procs = [ProcStats(s["host"], int(s["samples"]), s["cpu_pct"], s["mem_pct"])
             for s in mine if s["kind"] == "proc" and s["samples"]]
    return devices, procs, any(s["kind"] == "gpu" and s["rows_all"] for s in mine)


def _mma(prefix: str, vals: Sequence[float | None]) -> dict[str, float | None]:
    xs = [v for v in vals if v is not None]
    if not xs:
        return {f"{prefix}_min": None, f"{prefix}_avg": None, f"{prefix}_max": None}
    return {f"{prefix}_min": min(xs), f"{prefix}_avg": fmean(xs), f"{prefix}_max": max(xs)}


def gpu_properties(devices: Sequence[DeviceStats], had_gpu_rows: bool) -> dict[str, float | None]:
    """The 13 GPU properties. No GPU rows at all -> 0.0 each; GPU rows but none in the window -> None."""
    if not had_gpu_rows:
        return {p: 0.0 for p in GPU_PROPERTIES}
    out: dict[str, float | None] = {}
    out.update(_mma("gpu_compute_utilization", [d.gpu_util for d in devices]))
    out.update(_mma("gpu_memory_utilization", [d.mem_util for d in devices]))
    out.update(_mma("gpu_power_percent", [d.power_pct for d in devices]))
    out.update(_mma("gpu_power_watts", [d.power_w for d in devices]))
    peaks = [d.mem_util_peak for d in devices if d.mem_util_peak is not None]
    out["gpu_memory_utilization_peak"] = max(peaks) if peaks else None
    return out


def cpu_properties(procs: Sequence[ProcStats]) -> dict[str, float | None]:
    return {"cpu_compute_utilization": _mean(p.cpu_pct for p in procs),
            "cpu_memory_utilization": _mean(p.mem_pct for p in procs)}


def throughput_properties(rank0: Mapping[str, Any] | None, world_size: int,
                          stop_after_seconds: float | None) -> dict[str, float | None]:
    """Throughput properties from rank 0's measurements (``metrics`` of rank.0.json)."""
    m: Mapping[str, Any] = (rank0 or {}).get("metrics") or {}
    n = max(1, int(world_size or 1))
    out: dict[str, float | None] = {
        "train_runtime": _f(m.get("train_runtime")),
        "train_samples_per_second": _f(m.get("train_samples_per_second")),
        "train_steps_per_second": _f(m.get("train_steps_per_second")),
    }
    tps = _f(m.get("train_tokens_per_second"))
    if stop_after_seconds is not None and stop_after_seconds > 0:
        out["train_tokens_per_second"] = None  # seeds: omitted when stop_after_seconds > 0
        out["train_tokens_per_gpu_per_second"] = None
    else:
        out["train_tokens_per_second"] = None if tps is None else n * tps
        out["train_tokens_per_gpu_per_second"] = tps
    dtps = _f(m.get("dataset_tokens_per_second"))
    if dtps is None:
        tokens, runtime = _f(m.get("dataset_tokens")), out["train_runtime"]
        dtps = tokens / runtime if tokens is not None and runtime else None
    out["dataset_tokens_per_second"] = dtps
    per_gpu = _f(m.get("dataset_tokens_per_second_per_gpu"))
    out["dataset_tokens_per_second_per_gpu"] = per_gpu if per_gpu is not None else (
        None if dtps is None else dtps / n)
    return out


def exact_properties(rank0: Mapping[str, Any] | None) -> dict[str, float | None]:
    """sbench's exact figures beside the reference's (see catalog.DERIVED_PROPERTIES): the all-rank train
    token total over rank 0's runtime, and rank 0's own CPU utilisation."""
    m: Mapping[str, Any] = (rank0 or {}).get("metrics") or {}
    tokens, runtime = _f(m.get("run_train_tokens")), _f(m.get("train_runtime"))
    return {"train_tokens_per_second_exact": tokens / runtime if tokens is not None and runtime else None,
            "cpu_compute_utilization_rank0": _f(m.get("cpu_util_pct"))}


def window_properties(rank0: Mapping[str, Any] | None) -> dict[str, Any]:
    """The measured window in steps (rank 0's; every run), and under the precision auto-stop method the
    statistics of its steady window: the step times' coefficient of variation and the 95 % interval's
    half-width relative to the mean (``rank.0.json`` ``steady_state``)."""
    doc: Mapping[str, Any] = rank0 or {}
    m: Mapping[str, Any] = doc.get("metrics") or {}
    st: Mapping[str, Any] = doc.get("steady_state") or {}
    end, steps = count_or_none(doc.get("global_step")), count_or_none(m.get("train_steps"))
    return {"window_steps": steps,
            "window_start_step": end - steps if end is not None and steps is not None else None,
            "window_end_step": end if steps is not None else None,
            "step_time_cv": _f(st.get("step_time_cv")), "ci_rel_halfwidth": _f(st.get("ci_rel_halfwidth"))}


def count_or_none(v: Any) -> int | None:
    x = _f(v)
    return int(x) if x is not None and x == int(x) else None


def ran_properties(ranks: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """What the run ran with, from its ranks' files (``rank.<r>.json``): the effective dtype and attention
    implementation (rank 0's, else the first rank's that says), and every rank's adjustments and notes, once
    each, in rank order."""
    docs = [d for _, d in sorted(ranks.items()) if isinstance(d, Mapping)]
    ran: Mapping[str, Any] = next((d["ran"] for d in docs if isinstance(d.get("ran"), Mapping)), {})
    adjustments: list[Any] = []
    notes: list[str] = []
    for d in docs:
        adj, said = d.get("adjustments"), d.get("notes")
        for a in adj if isinstance(adj, list) else []:
            if isinstance(a, Mapping) and a not in adjustments:
                adjustments.append(a)
        for n in said if isinstance(said, list) else []:
            if str(n) not in notes:
                notes.append(str(n))
    text = {k: str(ran[k]) if ran.get(k) is not None else None for k in ("torch_dtype", "attn_implementation")}
    return {"effective_torch_dtype": text["torch_dtype"], "attn_implementation": text["attn_implementation"],
            "adjustments": adjustments, "notes": notes}


def stability_properties(trial_outcomes: Sequence[str | None], expected: int | None = None) -> dict[str, float | None]:
    """Fractions of trials that ran out of GPU memory (``invalid``), failed otherwise, or completed."""
    n = max(len(trial_outcomes), int(expected or 0))
    if n == 0:
        return {"f_gpu_oom": None, "f_other_error": None, "f_no_error": None}
    oom = sum(1 for o in trial_outcomes if o == "invalid")
    ok = sum(1 for o in trial_outcomes if o == "ok")
    return {"f_gpu_oom": oom / n, "f_other_error": (n - oom - ok) / n, "f_no_error": ok / n}


def benchmark_properties(devices: Sequence[DeviceStats], procs: Sequence[ProcStats], had_gpu_rows: bool,
                         rank0: Mapping[str, Any] | None, world_size: int,
                         stop_after_seconds: float | None) -> dict[str, float | None]:
    """Every benchmark property (is_valid aside) of one ok run."""
    out = gpu_properties(devices, had_gpu_rows)
    out.update(cpu_properties(procs))
    out.update(throughput_properties(rank0, world_size, stop_after_seconds))
    return out
