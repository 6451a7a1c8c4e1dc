"""``sbench compare BASE CAND``: the same points measured twice, per point and metric, with a verdict the repeats
can back.

A side is a campaign name, or filters over runs such as ``git_commit=3f2a1c`` or
``torch=2.13.0,campaign=nightly`` (columns of ``runs`` and of ``environment``: the package versions
and the commit recorded on the nodes). Runs are paired by ``point_id``; each side's valid
measurements of a point are its repeats.

Per point and metric: the ratio of the medians (candidate / base), and Welch's t-test on the log values
(:mod:`harness.report.stats`: exact Student-t quantiles), whose 95 % interval of the difference of the
mean logs gives the interval of the ratio. For a metric measured over the training window (the rates,
``train_runtime``, MFU) each run is judged robustly (:func:`run_evidence`): its value is the metric as if
every step had taken rank 0's median step time, with the variance of the log median step time from the
steps' median absolute deviation, so a few long steps of one run move neither. A side's spread is the
larger of its runs' spread and that, so two runs a side that agree within their steps' spread decide
with the steps' degrees of freedom; runs that differ by more decide with their own few. The verdict,
``threshold`` being the smallest change that counts:

- ``regression``: worse by more than ``threshold`` (ratio below 1 - threshold for a
  higher-is-better metric, above 1 + threshold for a lower-is-better one) **and** the test finds the
  change (p < 0.05: the interval lies on the worse side of 1);
- ``improvement``: the same, the other way;
- ``same``: the interval lies within 1 ± threshold: any change is smaller than the threshold;
- ``insufficient repeats``: the data cannot decide, either way: fewer than two repeats on a side (no
  spread to judge by), or a change beyond the threshold the test does not find, or an interval that
  reaches past the threshold. The ratio still says which way it leans; more repeats decide.

A run that shared a host with another sbench run (``measurements.shared_host``) measured noise, not its
point: it is left out of its side, and :class:`Comparison` says how many were (``include_shared`` keeps
them).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from harness.contract.errors import InputError
from harness.db.store import Store
from harness.spec.schema import is_name

from .queries import compare_side
from .stats import welch

# metric -> True when higher is better
METRICS: dict[str, bool] = {
    "dataset_tokens_per_second": True, "train_tokens_per_second": True, "train_tokens_per_second_exact": True,
    "train_samples_per_second": True, "train_tokens_per_gpu_per_second": True,
    "dataset_tokens_per_second_per_gpu": True, "mfu": True, "model_tflops_per_gpu": True, "train_runtime": False,
    "gpu_memory_utilization_peak": False, "cpu_memory_utilization": False,
}
# the metrics measured over rank 0's training window: their runs' step times are evidence of their spread
WINDOW_METRICS = frozenset({
    "dataset_tokens_per_second", "train_tokens_per_second", "train_tokens_per_second_exact",
    "train_samples_per_second", "train_tokens_per_gpu_per_second", "dataset_tokens_per_second_per_gpu", "mfu",
    "model_tflops_per_gpu", "train_runtime"})
DEFAULT_METRICS = ("dataset_tokens_per_second",)
SIGNIFICANCE = 0.05  # the test's two-sided level: a 95 % interval


class Verdict:
    """The verdicts of a compare row."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SAME = "same"
    INSUFFICIENT = "insufficient repeats"


@dataclass
class Row:
    """One point and metric: each side's repeats and median, the ratio of the medians, the test's 95 %
    interval of the ratio (None without a test), its p-value and degrees of freedom, which spread each side
    used (``runs`` or ``steps``; None without a test), and the verdict (:class:`Verdict`)."""

    point_id: str
    metric: str
    n_base: int
    n_cand: int
    base: float
    cand: float
    ratio: float
    low: float | None
    high: float | None
    verdict: str
    labels: dict[str, Any]
    p_value: float | None = None
    df: float | None = None
    spread: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_side(text: str) -> tuple[str | None, dict[str, str]]:
    """``(campaign, filters)`` of one side; a bare word is a campaign name."""
    text = text.strip()
    if "=" not in text:
        if not is_name(text):
            raise InputError(f"{text!r} is neither a campaign name nor filters like git_commit=abc,torch=2.13.0")
        return text, {}
    filters: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise InputError(f"{part!r} in {text!r} is not KEY=VALUE")
        filters[key] = value
    return filters.pop("campaign", None), filters


def verdict(ratio: float, low: float | None, high: float | None, higher_better: bool, threshold: float) -> str:
    """The verdict of a ratio of medians and the test's interval of the ratio (None: no test possible)."""
    if low is None or high is None:
        return Verdict.INSUFFICIENT
    worse = ratio < 1 - threshold if higher_better else ratio > 1 + threshold
    better = ratio > 1 + threshold if higher_better else ratio < 1 - threshold
    # the test finds the change only on the side the ratio says (the interval may rest on the runs' robust
    # values, which a ratio of medians can disagree with)
    below, above = high < 1.0, low > 1.0
    if worse and (below if higher_better else above):
        return Verdict.REGRESSION
    if better and (above if higher_better else below):
        return Verdict.IMPROVEMENT
    if 1 - threshold <= low and high <= 1 + threshold:
        return Verdict.SAME
    return Verdict.INSUFFICIENT


MAD_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
MEDIAN_VAR = math.pi / 2  # the variance of the median of m normal values, in units of sigma^2 / m


def _steps(r: dict[str, Any]) -> tuple[int, float, float, float] | None:
    """A run's steps, median, mean and MAD of its step times, where collect stored them all (else None)."""
    m, mid, mean, mad = (r.get(k) for k in ("steps_timed", "step_time_median", "step_time_mean", "step_time_mad"))
    if m is None or mid is None or mean is None or mad is None or int(m) < 2:
        return None
    vals = (float(mid), float(mean), float(mad))
    if not all(math.isfinite(v) for v in vals) or vals[0] <= 0 or vals[1] <= 0:
        return None
    return int(m), *vals


def run_evidence(r: dict[str, Any], metric: str, steps: bool) -> tuple[float, tuple[float, int] | None]:
    """One run's log value for the test, and its within-run variance with its step count (None: none).

    For a metric measured over the training window (*steps*), where the run's step times are known, the
    value is robust: the metric as if every step had taken the median step time (rates x mean/median,
    ``train_runtime`` x median/mean), and its variance is that of the log median step time,
    ``(pi/2) (1.4826 MAD / median)^2 / steps``. A few long steps (a busy neighbour's burst) move neither,
    so they cannot make the runs of one configuration disagree. Otherwise the log value itself, and the
    variance ``cv^2 / steps`` of its steps' coefficient of variation where known."""
    x = math.log(float(r[metric]))
    if not steps:
        return x, None
    st = _steps(r)
    if st is not None:
        m, mid, mean, mad = st
        shift = math.log(mean / mid)
        return (x + shift if METRICS[metric] else x - shift), (MEDIAN_VAR * (MAD_SIGMA * mad / mid) ** 2 / m, m)
    cv, m_ = r.get("step_time_cv"), r.get("steps_timed")
    if cv is not None and m_ is not None and int(m_) >= 2 and math.isfinite(float(cv)):
        return x, (float(cv) ** 2 / int(m_), int(m_))
    return x, None


def compare_point(pid: str, metric: str, base: list[dict[str, Any]], cand: list[dict[str, Any]],
                  threshold: float) -> Row | None:
    """The row of one point and metric from each side's measurement rows; None when a side has no value."""
    b_rows = [r for r in base if r.get(metric) is not None]
    c_rows = [r for r in cand if r.get(metric) is not None]
    b, c = [float(r[metric]) for r in b_rows], [float(r[metric]) for r in c_rows]
    if not b or not c or statistics.median(b) == 0:
        return None
    mb, mc = statistics.median(b), statistics.median(c)
    ratio = mc / mb
    low = high = p = df = None
    spread = None
    if min(b + c) > 0:
        steps = metric in WINDOW_METRICS
        be = [run_evidence(r, metric, steps) for r in b_rows]
        ce = [run_evidence(r, metric, steps) for r in c_rows]
        test = welch([v for v, _ in be], [v for v, _ in ce], [w for _, w in be if w is not None],
                     [w for _, w in ce if w is not None], 1 - SIGNIFICANCE)
        if test is not None:
            low, high, p, df = math.exp(test.low), math.exp(test.high), test.p, test.df
            spread = {"base": test.base.source, "cand": test.cand.source}
    first = base[0]
    labels = {k: first.get(k) for k in ("model_name", "number_gpus", "number_nodes", "batch_size",
                                          "model_max_length", "experiment")}
    return Row(pid, metric, len(b), len(c), mb, mc, ratio, low, high,
               verdict(ratio, low, high, METRICS[metric], threshold), labels, p, df, spread)


def compare(base: dict[str, list[dict[str, Any]]], cand: dict[str, list[dict[str, Any]]], metrics: list[str],
            threshold: float) -> list[Row]:
    """Rows per point in both sides and metric; *base*/*cand* map point_id -> measurement rows."""
    for m in metrics:
        if m not in METRICS:
            raise InputError(f"--metric {m}: not comparable; choose from {', '.join(METRICS)}")
    if not 0 < threshold < 1:
        raise InputError(f"--threshold must be between 0 and 1 (a fraction, 0.05 = 5 %), got {threshold}")
    out: list[Row] = []
    for pid in sorted(set(base) & set(cand)):
        for m in metrics:
            row = compare_point(pid, m, base[pid], cand[pid], threshold)
            if row is not None:
                out.append(row)
    return out


@dataclass
class Comparison:
    """The rows of one compare, and per side (``BASE``, ``CAND``) the runs left out for a shared host."""

    rows: list[Row]
    excluded: dict[str, list[str]]

    @property
    def excluded_text(self) -> str:
        """``excluded 2 run(s) measured on a shared host (BASE 0, CAND 2): ...``, or empty."""
        n = sum(len(v) for v in self.excluded.values())
        if not n:
            return ""
        ids = [r for v in self.excluded.values() for r in v]
        return (f"excluded {n} run(s) measured on a host another sbench run used at the same time (BASE "
                f"{len(self.excluded.get('BASE', []))}, CAND {len(self.excluded.get('CAND', []))}): "
                f"{', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}; see runs.overlapped_with, or --include-shared")


def compare_in(store: Store, base: str, cand: str, metrics: list[str], threshold: float,
               include_shared: bool = False) -> Comparison:
    """:func:`compare` of two sides (campaign names or run filters) read from an open results store; runs
    that shared a host are left out unless *include_shared*."""
    sides = [parse_side(base), parse_side(cand)]
    (b, b_out), (c, c_out) = (compare_side(store, camp, filters, include_shared) for camp, filters in sides)
    excluded = {"BASE": b_out, "CAND": c_out}
    for name, text, side, out in (("BASE", base, b, b_out), ("CAND", cand, c, c_out)):
        if not side:
            why = (f" ({len(out)} were measured on a shared host and left out: see runs.overlapped_with, or pass "
                   "--include-shared)" if out else "")
            raise InputError(f"{name} {text!r}: no valid measurements match{why}")
    rows = compare(b, c, metrics or list(DEFAULT_METRICS), threshold)
    if not rows:
        raise InputError(f"BASE and CAND share no measured point ({len(b)} and {len(c)} point(s)); compare pairs "
                         "runs by point_id")
    return Comparison(rows, excluded)
