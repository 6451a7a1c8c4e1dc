"""``sbench compare BASE CAND``: the same points measured twice, per point and metric, noise taken into account.

A side is a campaign name, or filters over runs such as ``git_commit=3f2a1c`` or
``torch=2.13.0,campaign=nightly`` (columns of ``runs`` and of ``environment``: the package versions
and the commit recorded on the nodes). Runs are paired by ``point_id``; each side's valid
measurements of a point are its repeats.

Per point and metric: the ratio of the medians (candidate / base) and a 95 % interval for it by
bootstrap (both sides resampled with replacement, ``BOOTSTRAP`` times, fixed seed, so the same
data always gives the same answer). The verdict:

- ``regression``: worse by more than ``threshold`` (ratio below 1 - threshold for a
  higher-is-better metric, above 1 + threshold for a lower-is-better one) **and** the interval
  does not reach 1: the change is both large and not explained by the repeats' spread;
- ``improvement``: the same, the other way;
- ``noise``: anything else. With one run a side there is no spread to judge by: the threshold alone
  decides, and the verdict says ``(1 run)``. (With repeats on one side only, the interval carries that
  side's spread.)

A run that shared a host with another sbench run (``measurements.shared_host``) measured noise, not its
point: it is left out of its side, and :class:`Comparison` says how many were (``include_shared`` keeps
them).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from harness.contract.errors import InputError
from harness.db.store import Store
from harness.spec.schema import is_name

from .queries import compare_side

# metric -> True when higher is better
METRICS: dict[str, bool] = {
    "dataset_tokens_per_second": True, "train_tokens_per_second": True, "train_tokens_per_second_exact": True,
    "train_samples_per_second": True, "train_tokens_per_gpu_per_second": True,
    "dataset_tokens_per_second_per_gpu": True, "mfu": True, "model_tflops_per_gpu": True, "train_runtime": False,
    "gpu_memory_utilization_peak": False, "cpu_memory_utilization": False,
}
DEFAULT_METRICS = ("dataset_tokens_per_second",)
BOOTSTRAP = 2000
SEED = 20261123


@dataclass
class Row:
    point_id: str
    metric: str
    n_base: int
    n_cand: int
    base: float
    cand: float
    ratio: float
    low: float
    high: float
    verdict: str
    labels: dict[str, Any]

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


def ratio_interval(base: list[float], cand: list[float], rng: random.Random) -> tuple[float, float]:
    """95 % bootstrap percentile interval of median(cand) / median(base)."""
    if len(base) < 2 and len(cand) < 2:
        r = statistics.median(cand) / statistics.median(base)
        return r, r
    ratios = []
    for _ in range(BOOTSTRAP):
        b = statistics.median(rng.choices(base, k=len(base)))
        c = statistics.median(rng.choices(cand, k=len(cand)))
        if b:
            ratios.append(c / b)
    ratios.sort()
    return ratios[int(0.025 * (len(ratios) - 1))], ratios[int(0.975 * (len(ratios) - 1))]


def verdict(ratio: float, low: float, high: float, higher_better: bool, threshold: float, single: bool) -> str:
    worse = ratio < 1 - threshold if higher_better else ratio > 1 + threshold
    better = ratio > 1 + threshold if higher_better else ratio < 1 - threshold
    clear = not (low <= 1.0 <= high) or single
    tag = " (1 run)" if single else ""
    if worse and clear:
        return "regression" + tag
    if better and clear:
        return "improvement" + tag
    return "noise" + tag


def compare(base: dict[str, list[dict[str, Any]]], cand: dict[str, list[dict[str, Any]]], metrics: list[str],
            threshold: float) -> list[Row]:
    """Rows per point in both sides and metric; *base*/*cand* map point_id -> measurement rows."""
    for m in metrics:
        if m not in METRICS:
            raise InputError(f"--metric {m}: not comparable; choose from {', '.join(METRICS)}")
    if not 0 < threshold < 1:
        raise InputError(f"--threshold must be between 0 and 1 (a fraction, 0.05 = 5 %), got {threshold}")
    rng = random.Random(SEED)
    out: list[Row] = []
    for pid in sorted(set(base) & set(cand)):
        for m in metrics:
            b = [float(r[m]) for r in base[pid] if r.get(m) is not None]
            c = [float(r[m]) for r in cand[pid] if r.get(m) is not None]
            if not b or not c or statistics.median(b) == 0:
                continue
            mb, mc = statistics.median(b), statistics.median(c)
            low, high = ratio_interval(b, c, rng)
            single = len(b) < 2 and len(c) < 2
            first = base[pid][0]
            labels = {k: first.get(k) for k in ("model_name", "number_gpus", "number_nodes", "batch_size",
                                                  "model_max_length", "experiment")}
            out.append(Row(pid, m, len(b), len(c), mb, mc, mc / mb, low, high,
                           verdict(mc / mb, low, high, METRICS[m], threshold, single), labels))
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
