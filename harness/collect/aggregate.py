"""The seeds' measured properties, as pure functions (usable without a database).

Definitions (ado-sfttrainer-experiments.md, "Measured properties" and notes 1-3):

* **Window.** Everything is measured over rank 0's training window,
  ``train_start_wall``..``train_end_wall``; under ``auto_stop_method`` it starts at
  ``warmup_end_wall`` instead (warm-up excluded).
* **Time averages.** A sample taken at ``t`` stands for the sampler's period before it, ``[t - d, t]``
  (``d`` = ``runner.sample_interval_s``; the CPU figure is the average over that period). An average over
  the window weighs each sample by the length of its period inside the window (:func:`overlap`), so it
  covers exactly the window's time. The sample counts (``gpu_samples``, ``proc_samples``) and the memory
  peak are the samples whose time falls inside the window, bounds included.
  ``warmup_end_wall`` instead (warm-up excluded; under the precision method that is where MSER-5's
  steady window begins, rank 0's ``window`` ``steady_state``). Samples on the bounds count.
* **GPU metrics** (note 1): for each in-use device (host, device) the time average of its samples
  in the window; then min / avg / max across devices. Memory utilisation is
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
* **Step times**: rank 0's ``step_end_wall`` (the wall time each optimizer step ended) inside the window
  give the steps' durations, the first from the window's start: ``steps_timed`` (how many),
  ``step_time_median`` and ``step_time_mean`` (s), ``step_time_cv`` (sample stdev / mean; None below two
  steps) and ``step_time_mad`` (the median absolute deviation from the median, s). ``compare`` reads them
  as each run's own spread, robustly: one long step moves neither the median nor the MAD.
* **Energy**: each device's ``energy_j`` (the sampler's running total of its energy counter) at the
  window's start and end, each linearly interpolated between the last reading at or before the edge and
  the first at or after it (a reading on the edge is taken as it is); the device's energy is the
  difference. ``energy_joules`` sums the GPUs in use (``energy_source`` nvml) or, on a run without GPU
  rows, the CPU packages (``cpu`` rows, RAPL: ``rapl``). It is NULL (with a note) when the window is
  unknown, when a device has no counter reading, or when a device's readings do not reach both edges.
  ``gpu_energy_joules`` is the same figure when it is the GPUs' (nvml), NULL when it is RAPL's or none.
  ``dataset_tokens_per_joule`` is rank 0's ``dataset_tokens`` (the window's) over ``energy_joules``.
* **Stability**: ``f_gpu_oom`` / ``f_other_error`` / ``f_no_error`` are the fractions of the trials
  whose outcome was ``invalid`` / ``failed`` / ``ok``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, median, stdev
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


@dataclass(frozen=True)
class EnergyStats:
    """One device's energy counter over the window: its total interpolated at the window's start and end
    (None where its readings do not reach that edge)."""

    host: str
    kind: str  # gpu | cpu
    device: int
    readings: int  # rows with an energy reading (inside the window or not)
    start: float | None
    end: float | None

    @property
    def joules(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start

    @property
    def name(self) -> str:
        return f"{'GPU' if self.kind == 'gpu' else 'CPU package'} {self.host}:{self.device}"


ENERGY_SOURCES = {"gpu": "nvml", "cpu": "rapl"}


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


def overlap(t: Any, interval: float, start: float | None, end: float | None) -> float:
    """The weight of a sample taken at *t*: the length of its period ``[t - interval, t]`` inside the window
    (None bounds: unbounded); 0.0 for a sample without a time."""
    x = _f(t)
    if x is None:
        return 0.0
    hi = x if end is None else min(x, end)
    lo = x - interval if start is None else max(x - interval, start)
    return max(hi - lo, 0.0)


def _wmean(pairs: Iterable[tuple[float, float | None]]) -> float | None:
    """The weighted mean of (weight, value) pairs with a value and a positive weight; None without any."""
    xs = [(w, v) for w, v in pairs if v is not None and w > 0]
    total = sum(w for w, _ in xs)
    return sum(w * v for w, v in xs) / total if xs and total > 0 else None


def device_stats(rows: Iterable[Mapping[str, Any]], start: float | None, end: float | None,
                 interval: float) -> list[DeviceStats]:
    """Per-device time averages of ``kind=gpu`` sample rows (dicts keyed like the CSV, plus ``host``) in the
    window, each sample spanning *interval* seconds before its time."""
    groups: dict[tuple[str, int], list[tuple[float, Mapping[str, Any]]]] = {}
    for r in rows:
        if r.get("kind") != "gpu":
            continue
        groups.setdefault((str(r.get("host")), int(float(r["device"]))), []).append(
            (overlap(r.get("t_wall"), interval, start, end), r))
    out = []
    for (host, dev), rs in sorted(groups.items()):
        inside = [r for _, r in rs if _in(r.get("t_wall"), start, end)]
        if not inside:
            continue
        mem_vals = [m for m in (_pct(r.get("mem_used_mb"), r.get("mem_total_mb")) for r in inside) if m is not None]
        out.append(DeviceStats(
            host=host, device=dev, samples=len(inside), gpu_util=_wmean((w, _f(r.get("gpu_util"))) for w, r in rs),
            mem_util=_wmean((w, _pct(r.get("mem_used_mb"), r.get("mem_total_mb"))) for w, r in rs),
            mem_util_peak=max(mem_vals) if mem_vals else None,
            power_w=_wmean((w, _f(r.get("power_w"))) for w, r in rs),
            power_pct=_wmean((w, _pct(r.get("power_w"), r.get("power_limit_w"))) for w, r in rs)))
    return out


def proc_stats(rows: Iterable[Mapping[str, Any]], start: float | None, end: float | None,
               interval: float) -> list[ProcStats]:
    """Per-host time averages of ``kind=proc`` sample rows in the window (see :func:`device_stats`)."""
    groups: dict[str, list[tuple[float, Mapping[str, Any]]]] = {}
    for r in rows:
        if r.get("kind") == "proc":
            groups.setdefault(str(r.get("host")), []).append((overlap(r.get("t_wall"), interval, start, end), r))
    out = []
    for h, rs in sorted(groups.items()):
        n = sum(1 for _, r in rs if _in(r.get("t_wall"), start, end))
        if n:
            out.append(ProcStats(host=h, samples=n, cpu_pct=_wmean((w, _f(r.get("cpu_pct"))) for w, r in rs),
                                 mem_pct=_wmean((w, _f(r.get("mem_pct"))) for w, r in rs)))
    return out


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


def busy_devices(stats: Iterable[Mapping[str, Any]], run_id: str) -> set[tuple[str, str, int]]:
    """``(kind, host, device)`` of the run's energy-counting devices that were busy in the window: a GPU that drew
    power or computed, every CPU package of a host whose training process tree used CPU."""
    mine = [s for s in stats if s["run_id"] == run_id]
    working = {str(s["host"]) for s in mine if s["kind"] == "proc" and (_f(s.get("cpu_pct")) or 0.0) > 0}
    out = set()
    for s in mine:
        if s["kind"] == "gpu" and ((_f(s.get("power_w")) or 0.0) > 0 or (_f(s.get("gpu_util")) or 0.0) > 0):
            out.add(("gpu", str(s["host"]), int(s["device"])))
        elif s["kind"] == "cpu" and str(s["host"]) in working:
            out.add(("cpu", str(s["host"]), int(s["device"])))
    return out


COVER_SLACK_S = 0.05  # the clocks of one host disagree by less than this


def coverage_notes(stats: Iterable[Mapping[str, Any]], run_id: str, start: float, end: float,
                   interval: float) -> list[str]:
    """A note per host whose process samples leave part of the measured window without a CPU figure (each sample
    stands for the sampler's period before it): how much, so that nobody reads the average as covering all."""
    out = []
    span = end - start
    for s in stats:
        if s["run_id"] != run_id or s["kind"] != "proc":
            continue
        cover = _f(s.get("cpu_cover")) or 0.0
        if span > 0 and span - cover > max(COVER_SLACK_S, 0.01 * span):
            out.append(f"process samples on {s['host']} cover {cover:.2f} s of the {span:.2f} s measured window "
                       f"({span - cover:.2f} s without a CPU sample, at a {interval:g} s period): "
                       "cpu_compute_utilization averages what they cover")
    return out


def host_load(stats: Iterable[Mapping[str, Any]], run_id: str, threshold: float, start: float | None = None,
              end: float | None = None) -> tuple[dict[str, Any], list[str]]:
    """``host_other_cpu_pct`` (the busiest host's other load over the window, percent of its CPU capacity: the
    time average of its ``host`` rows), ``host_window_coverage`` (the share of the window ``[start, end]`` the
    host rows cover, the least of the hosts': each row stands for the sampler's period before it), and
    ``gpu_foreign_processes`` (the most processes not the run's that one of its GPUs' samples in the window saw)
    and ``host_busy`` (the first above ``100 * threshold``, or the second above 0), with the note that says why a
    run is flagged, and one when the host rows leave part of the window uncovered. None each where the samples
    do not say."""
    mine = [s for s in stats if s["run_id"] == run_id]
    other = {str(s["host"]): v for s in mine if s["kind"] == "host" and (v := _f(s.get("cpu_pct"))) is not None}
    foreign = {f"{s['host']}:{s['device']}": int(v) for s in mine
               if s["kind"] == "gpu" and (v := _f(s.get("foreign_max"))) is not None}
    out: dict[str, Any] = {"host_other_cpu_pct": max(other.values()) if other else None,
                           "gpu_foreign_processes": max(foreign.values()) if foreign else None, "host_busy": None,
                           "host_window_coverage": None}
    if not other and not foreign:
        return out, []
    notes = []
    span = (end - start) if start is not None and end is not None else None
    if other and span is not None and span > 0:
        covers = {str(s["host"]): min(1.0, (_f(s.get("cpu_cover")) or 0.0) / span)
                  for s in mine if s["kind"] == "host" and str(s["host"]) in other}
        out["host_window_coverage"] = min(covers.values())
        short = {h: c for h, c in covers.items() if span * (1.0 - c) > max(COVER_SLACK_S, 0.01 * span)}
        if short:
            notes.append("host samples cover " + ", ".join(f"{100 * c:.1f} % of {h}'s" for h, c in
                                                           sorted(short.items()))
                         + f" measured window of {span:.2f} s: host_other_cpu_pct averages what they cover "
                           "(measurements.host_window_coverage)")
    loud = {h: v for h, v in other.items() if v > 100.0 * threshold}
    if loud:
        notes.append(f"host busy: other work used {', '.join(f'{v:.0f} % of {h}' for h, v in sorted(loud.items()))}'s "
                     f"CPU over the measured window (more than runner.host_busy_cpu {threshold:g}): the run measured "
                     "its neighbours too; compare, check and the repeats' CV leave it out")
    crowded = {d: n for d, n in foreign.items() if n > 0}
    if crowded:
        on = ", ".join(f"{n} on GPU {d}" for d, n in sorted(crowded.items()))
        notes.append(f"host busy: processes not the run's ({on}) during the measured window; compare, check and "
                     "the repeats' CV leave it out")
    out["host_busy"] = bool(loud or crowded)
    return out, notes


def energy_at(t: float, before: tuple[Any, Any], after: tuple[Any, Any]) -> float | None:
    """A counter's running total at *t*, from the reading at or before it and the one at or after it
    (``(t_wall, energy_j)``, either None where there is none): a reading at *t* itself as it is, else the
    linear interpolation between the two; None without both."""
    t0, e0 = _f(before[0]), _f(before[1])
    t1, e1 = _f(after[0]), _f(after[1])
    if t0 is not None and e0 is not None and t0 == t:
        return e0
    if t1 is not None and e1 is not None and t1 == t:
        return e1
    if t0 is None or e0 is None or t1 is None or e1 is None or t1 <= t0:
        return None
    return e0 + (e1 - e0) * (t - t0) / (t1 - t0)


def energy_stats(stats: Iterable[Mapping[str, Any]], run_id: str, start: float | None,
                 end: float | None) -> list[EnergyStats]:
    """One run's energy per GPU and CPU package, from the sample statistics' edge readings
    (:func:`harness.db.samples.sample_stats`) of the window *start*..*end*."""
    out = []
    for s in stats:
        if s["run_id"] != run_id or s["kind"] not in ENERGY_SOURCES:
            continue
        lo = None if start is None else energy_at(start, (s.get("e_lo_t0"), s.get("e_lo_e0")),
                                                  (s.get("e_lo_t1"), s.get("e_lo_e1")))
        hi = None if end is None else energy_at(end, (s.get("e_hi_t0"), s.get("e_hi_e0")),
                                                (s.get("e_hi_t1"), s.get("e_hi_e1")))
        out.append(EnergyStats(str(s["host"]), str(s["kind"]), int(s["device"]), int(s.get("energy_rows") or 0),
                               lo, hi))
    return sorted(out, key=lambda e: (e.kind, e.host, e.device))


# How long a counter may stay still while its device draws power: RAPL counts about every millisecond (0.1 s is a
# hundred updates), NVML's total energy at least with each power reading (up to a second on some boards). A counter
# that stayed still longer while its device was busy is stuck (a virtual machine's RAPL that is never updated, a
# driver that does not count), not a device that used nothing.
COUNTER_STILL_S = {"cpu": 0.1, "gpu": 1.0}


def energy_properties(energy: Sequence[EnergyStats], had_gpu_rows: bool,
                      rank0: Mapping[str, Any] | None, window_s: float | None = None,
                      busy: frozenset[tuple[str, str, int]] | set[tuple[str, str, int]] = frozenset(),
                      ) -> tuple[dict[str, Any], list[str]]:
    """``energy_joules``, ``gpu_energy_joules``, ``energy_source`` and ``dataset_tokens_per_joule`` of one run,
    and the notes that say why a figure is NULL: the GPUs' energy when the run sampled GPUs, else the CPU packages'.
    A device's counter that did not move over a window longer than its :data:`COUNTER_STILL_S` while the device was
    busy (*busy*: ``(kind, host, device)``) gives NULL with a note, never 0 J."""
    kind = "gpu" if had_gpu_rows else "cpu"
    devices = [e for e in energy if e.kind == kind]
    out: dict[str, Any] = {"energy_joules": None, "gpu_energy_joules": None,
                           "energy_source": ENERGY_SOURCES[kind] if devices else None, "dataset_tokens_per_joule": None}
    if not devices:
        return out, []
    notes = []
    missing = [e.name for e in devices if not e.readings]
    if missing:
        what = "NVML reports no counter" if kind == "gpu" else "RAPL gave no reading"
        notes.append(f"{', '.join(missing)}: no energy reading ({what}, or the samples file predates energy_j); "
                     "energy_joules NULL")
    short = [e.name for e in devices if e.readings and e.joules is None]
    if short:
        notes.append(f"{', '.join(short)}: the energy readings do not reach both ends of the measured window; "
                     "energy_joules NULL")
    still = [e.name for e in devices if e.joules is not None and e.joules <= 0 and window_s is not None
             and window_s > COUNTER_STILL_S[e.kind] and (e.kind, e.host, e.device) in busy]
    if still:
        what = "NVML's total-energy counter" if kind == "gpu" else "the RAPL counter"
        notes.append(f"{', '.join(still)}: {what} did not move over the {window_s:.1f} s measured window while the "
                     f"{'GPU' if kind == 'gpu' else 'host'} was busy: a counter that does not count, not 0 J; "
                     "energy_joules NULL")
    if missing or short or still:
        return out, notes
    total = sum(e.joules for e in devices if e.joules is not None)
    out["energy_joules"] = total
    # the GPUs' own counter (NVML) only: NULL where the figure is the CPU packages' (RAPL)
    out["gpu_energy_joules"] = total if kind == "gpu" else None
    tokens = _f(((rank0 or {}).get("metrics") or {}).get("dataset_tokens"))
    out["dataset_tokens_per_joule"] = tokens / total if tokens is not None and total > 0 else None
    return out, notes


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


def token_counts(rank0: Mapping[str, Any] | None) -> dict[str, int | None]:
    """The run's exact dataset tokens over the window (rank 0 reports them for all ranks) and the image tokens
    among them (a vision dataset's; 0 for text, None from a runner that did not count them)."""
    m: Mapping[str, Any] = (rank0 or {}).get("metrics") or {}

    def whole(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 else None

    return {"dataset_tokens": whole(m.get("dataset_tokens")),
            "dataset_image_tokens": whole(m.get("dataset_image_tokens"))}


def exact_properties(rank0: Mapping[str, Any] | None) -> dict[str, float | None]:
    """sbench's exact figures beside the reference's (see catalog.DERIVED_PROPERTIES): the all-rank train
    token total over rank 0's runtime, and rank 0's own CPU utilisation."""
    m: Mapping[str, Any] = (rank0 or {}).get("metrics") or {}
    tokens, runtime = _f(m.get("run_train_tokens")), _f(m.get("train_runtime"))
    return {"train_tokens_per_second_exact": tokens / runtime if tokens is not None and runtime else None,
            "cpu_compute_utilization_rank0": _f(m.get("cpu_util_pct"))}


def step_durations(rank0: Mapping[str, Any] | None, start: float | None, end: float | None) -> list[float]:
    """The durations of rank 0's steps that ended inside the window (start, end], each from the previous
    step's end (the first from *start*)."""
    if not rank0 or start is None:
        return []
    raw = rank0.get("step_end_wall")
    ends = sorted(x for x in (_f(v) for v in (raw if isinstance(raw, list) else []))
                  if x is not None and x > start and (end is None or x <= end))
    return [b - a for a, b in zip([start, *ends], ends)]


def step_time_properties(rank0: Mapping[str, Any] | None, start: float | None,
                         end: float | None) -> dict[str, float | int | None]:
    """``steps_timed``, ``step_time_median``, ``step_time_mean``, ``step_time_cv`` and ``step_time_mad`` (the
    median absolute deviation from the median, s) of :func:`step_durations`."""
    d = step_durations(rank0, start, end)
    mean = fmean(d) if d else None
    mid = median(d) if d else None
    return {"steps_timed": len(d), "step_time_median": mid, "step_time_mean": mean,
            "step_time_cv": stdev(d) / mean if len(d) >= 2 and mean else None,
            "step_time_mad": median(abs(x - mid) for x in d) if d and mid is not None else None}
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
            "steady_step_time_cv": _f(st.get("step_time_cv")), "ci_rel_halfwidth": _f(st.get("ci_rel_halfwidth"))}


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
