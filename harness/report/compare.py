"""``sbench compare BASE CAND``: the same points measured twice, per point and metric, with a verdict the repeats
can back.

A side is a campaign name, or filters over runs such as ``git_commit=3f2a1c`` or
``torch=2.13.0,campaign=nightly`` (columns of ``runs`` and of ``environment``: the package versions
and the commit recorded on the nodes). Runs are paired by ``point_id``; each side's valid
measurements of a point are its repeats.

**One method, one piece of evidence.** Each run brings one value, the log of its metric. For the metrics
measured over the training window (the rates, ``train_runtime``, MFU) that metric is the window's *mean*
(tokens over the window's seconds), so a stall counts for exactly the time it took; and each such run also
brings its own variance from its steps, the variance of the log of a mean of ``steps_timed`` steps,
``step_time_cv^2 / steps_timed`` (:func:`run_evidence`). Welch's test on the two sides' log values
(:func:`harness.contract.stats.welch`) gives the difference of the mean logs and its 95 % interval; the ratio shown is
``exp`` of that difference (the ratio of the sides' geometric means, which are the ``base`` and ``cand``
shown) and the interval is ``exp`` of its interval, so the ratio always lies inside its interval and the
verdict reads both. A side's variance of one run's value is the larger of its runs' spread (``n - 1``
degrees of freedom) and the mean within-run variance (the steps' degrees of freedom): when the runs agree
within what their steps predict, two runs a side decide with the steps' degrees of freedom; when they
differ by more, their own spread decides, with its few. ``bench/compare_power.py`` measures the false
alarms and the power of this method (docs/performance.md). The verdict, ``threshold`` being the smallest
change that counts:

- ``regression``: worse by more than ``threshold`` (ratio below 1 - threshold for a
  higher-is-better metric, above 1 + threshold for a lower-is-better one) **and** the test finds the
  change (p < 0.05: the interval lies on the worse side of 1);
- ``improvement``: the same, the other way;
- ``same``: the interval lies within 1 ± threshold: any change is smaller than the threshold;
- ``insufficient repeats``: the data cannot decide, either way: fewer than two repeats on a side (no
  spread to judge by), or a change beyond the threshold the test does not find, or an interval that
  reaches past the threshold. The ratio still says which way it leans; more repeats decide.

A run that shared a host with another sbench run (``measurements.shared_host``), or that ran on a host busy
with other work (``measurements.host_busy``), measured its neighbours too, not only its point: it is left
out of its side, and :class:`Comparison` says how many were and why (``include_shared`` keeps them).

**A reference campaign** (the reference's published measurements, ``sbench import --format ado-csv``) records
only some entity fields of each point: its points are paired with the other side's on those fields
(:func:`harness.spec.published.matches`), not by point id. It has one measurement per point and no spread: such
a row's verdict is ``single measurement`` (:attr:`Verdict.SINGLE`), its ratio still shown; it never says
regression.

**What changed under the numbers** (:mod:`harness.report.envdiff`): the differences between the two sides'
recorded environments, over every run compared (:attr:`Comparison.env`) and per point (:attr:`Row.changes`), so
that a regression shows the NCCL version, the package or the variable that changed beside it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.contract.errors import InputError
from harness.contract.exchange import ORIGIN_ADO_CSV
from harness.contract.stats import welch
from harness.db.exchange import imported_campaigns
from harness.db.reportdata import compare_rows, environment_of, point_entities
from harness.db.schema import ENTITY_FIELDS
from harness.db.status import campaign_names
from harness.db.store import Store
from harness.spec.published import matches
from harness.spec.schema import is_campaign_ref

from . import envdiff

# metric -> True when higher is better
METRICS: dict[str, bool] = {
    "dataset_tokens_per_second": True, "train_tokens_per_second": True, "train_tokens_per_second_exact": True,
    "train_samples_per_second": True, "train_tokens_per_gpu_per_second": True,
    "dataset_tokens_per_second_per_gpu": True, "mfu": True, "model_tflops_per_gpu": True, "train_runtime": False,
    "gpu_memory_utilization_peak": False, "cpu_memory_utilization": False, "cost_per_million_tokens": False,
    "dataset_tokens_per_joule": True,
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
    SINGLE = "single measurement"  # against a reference campaign's one measurement of the point: no spread


@dataclass
class Row:
    """One point and metric: each side's repeats and its centre (the geometric mean of its runs' values, which
    the test compares), the ratio of the centres (candidate / base), the test's 95 % interval of that ratio
    (None without a test), its p-value and degrees of freedom, which spread each side used (``runs`` or
    ``steps``; None without a test), the verdict (:class:`Verdict`) and each side's median, for reading."""

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
    base_median: float | None = None
    cand_median: float | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)  # envdiff.Change dicts of this point's runs
    matched: list[str] | None = None  # a reference side's point ids paired with this one on their entity fields

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_side(text: str) -> tuple[str | None, dict[str, str]]:
    """``(campaign, filters)`` of one side; a bare word is a campaign name."""
    text = text.strip()
    if "=" not in text:
        if not is_campaign_ref(text):
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
    """The verdict of a ratio and the test's interval around it (None: no test possible)."""
    if low is None or high is None:
        return Verdict.INSUFFICIENT
    worse = ratio < 1 - threshold if higher_better else ratio > 1 + threshold
    better = ratio > 1 + threshold if higher_better else ratio < 1 - threshold
    below, above = high < 1.0, low > 1.0
    if worse and (below if higher_better else above):
        return Verdict.REGRESSION
    if better and (above if higher_better else below):
        return Verdict.IMPROVEMENT
    if 1 - threshold <= low and high <= 1 + threshold:
        return Verdict.SAME
    return Verdict.INSUFFICIENT


def run_evidence(r: dict[str, Any], metric: str, steps: bool) -> tuple[float, tuple[float, int] | None]:
    """One run's log value for the test, and its within-run variance with its step count (None: none known).

    The value is the log of the metric as measured: for a rate over the training window, the window's mean
    (a stall counts for the time it took). For a metric measured over the training window (*steps*), where
    the run's step times are known, its variance is that of the log of the mean of ``steps_timed`` step
    times, ``step_time_cv^2 / steps_timed`` (the delta method; the steps taken as independent: neighbouring
    steps that move together show as runs that disagree, and then the runs' spread decides)."""
    x = math.log(float(r[metric]))
    if not steps:
        return x, None
    cv, m = r.get("step_time_cv"), r.get("steps_timed")
    if cv is None or m is None or int(m) < 2 or not math.isfinite(float(cv)) or float(cv) < 0:
        return x, None
    return x, (float(cv) ** 2 / int(m), int(m))


def compare_point(pid: str, metric: str, base: list[dict[str, Any]], cand: list[dict[str, Any]],
                  threshold: float) -> Row | None:
    """The row of one point and metric from each side's measurement rows; None when a side has no positive
    value (a ratio of logs needs them)."""
    b_rows = [r for r in base if r.get(metric) is not None and float(r[metric]) > 0]
    c_rows = [r for r in cand if r.get(metric) is not None and float(r[metric]) > 0]
    if not b_rows or not c_rows:
        return None
    steps = metric in WINDOW_METRICS
    be = [run_evidence(r, metric, steps) for r in b_rows]
    ce = [run_evidence(r, metric, steps) for r in c_rows]
    lb, lc = statistics.fmean(v for v, _ in be), statistics.fmean(v for v, _ in ce)
    # the ratio is the test's own estimate, exp(mean log cand - mean log base): its interval is around it
    ratio = math.exp(lc - lb)
    low = high = p = df = None
    spread = None
    test = welch([v for v, _ in be], [v for v, _ in ce], [w for _, w in be if w is not None],
                 [w for _, w in ce if w is not None], 1 - SIGNIFICANCE)
    if test is not None:
        # the test's difference is lc - lb, computed alike: exp is monotone, so low <= ratio <= high
        low, high, p, df = math.exp(test.low), math.exp(test.high), test.p, test.df
        spread = {"base": test.base.source, "cand": test.cand.source}
    first = base[0]
    labels = {k: first.get(k) for k in ("model_name", "number_gpus", "number_nodes", "batch_size",
                                          "model_max_length", "experiment")}
    return Row(pid, metric, len(b_rows), len(c_rows), math.exp(lb), math.exp(lc), ratio, low, high,
               verdict(ratio, low, high, METRICS[metric], threshold), labels, p, df, spread,
               statistics.median(float(r[metric]) for r in b_rows), statistics.median(float(r[metric]) for r in c_rows))


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
    """The rows of one compare, and per side (``BASE``, ``CAND``) the runs left out, each with why: ``shared
    host`` (another sbench run held one of its hosts) or ``busy host`` (other work kept its host busy); what
    changed between the sides' recorded environments (*env*); and the sides that are reference campaigns
    (*references*: ``BASE``/``CAND`` -> the campaign), paired on entity fields."""

    rows: list[Row]
    left_out: dict[str, list[tuple[str, str]]]
    env: envdiff.EnvDiff = field(default_factory=envdiff.EnvDiff)
    references: dict[str, str] = field(default_factory=dict)
    kept: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # (run id, why) --include-shared kept

    @property
    def excluded(self) -> dict[str, list[str]]:
        """Per side, the run ids left out (whatever the reason)."""
        return {side: [rid for rid, _ in out] for side, out in self.left_out.items()}

    @property
    def excluded_text(self) -> str:
        """``excluded 2 run(s) (BASE 0, CAND 2): 1 measured on a host another sbench run used at the same time,
        1 on a host busy with other work: ...``, or the line that says none was."""
        every = [x for out in self.left_out.values() for x in out]
        kept = [x for out in self.kept.values() for x in out]
        if kept:
            sides = ", ".join(f"{side} {len(out)}" for side, out in self.kept.items())
            counts = {why: sum(1 for _, w in kept if w == why) for why in dict.fromkeys(w for _, w in kept)}
            said = (f"{'excluded ' + str(len(every)) + ' profiled run(s); ' if every else ''}--include-shared kept "
                    f"{len(kept)} run(s) compare would leave out ({sides}): "
                    + ", ".join(f"{n} {KEPT_WORDS.get(why, why)}" for why, n in counts.items()))
            return said
        if not every:
            return ("excluded 0 runs (none shared its host with another run, none ran on a host busy with other "
                    "work, none had a straggler rank)")
        return excluded_text(self.left_out)


# why a measurement is left out of compare, check and the repeats' CV
SHARED, BUSY, PROFILED, STRAGGLER = "shared host", "busy host", "profiled", "straggler"


def left_out_why(m: Mapping[str, Any]) -> str | None:
    """Why a measurement row measured more than its point: it ran under the profiler (``profiled``: runner.profile),
    another sbench run held one of its hosts at the same time (``overlapped_with``), other work kept its host
    busy (``host_busy``), or one of its ranks was a straggler (``straggler``: the run measured its slowest rank,
    not its point); None when none of these."""
    if m.get("profiled"):
        return PROFILED
    if m.get("overlapped_with"):
        return SHARED
    if m.get("host_busy"):
        return BUSY
    if m.get("straggler"):
        return STRAGGLER
    return None


def compare_side(store: Store, campaign: str | None, filters: Mapping[str, str], include_shared: bool = False,
                 ) -> tuple[dict[str, list[dict[str, Any]]], list[tuple[str, str]]]:
    """Valid measurements of ok runs selected by *campaign* and *filters*, by point_id
    (:func:`harness.db.reportdata.compare_rows`), and ``(run id, why)`` of those left out because another run
    shared a host with them (``runs.overlapped_with``) or other work kept their host busy
    (``measurements.host_busy``), unless *include_shared*."""
    out: dict[str, list[dict[str, Any]]] = {}
    left_out: list[tuple[str, str]] = []
    for r in compare_rows(store, campaign, filters):
        why = left_out_why(r)
        if why is not None and (not include_shared or why == PROFILED):  # a profiled run never counts
            left_out.append((r["run_id"], why))
            continue
        if why is not None:  # kept by include_shared: said so, with why it would have been left out
            r = {**r, "kept_why": why}
        out.setdefault(r["point_id"], []).append(r)
    return out, left_out


KEPT_WORDS = {SHARED: "on a host another sbench run used at the same time", BUSY: "on a host busy with other work",
              STRAGGLER: "with a straggler rank"}


def excluded_text(left_out: dict[str, list[tuple[str, str]]]) -> str:
    every = [x for out in left_out.values() for x in out]
    shared = [rid for rid, why in every if why == SHARED]
    busy = [rid for rid, why in every if why == BUSY]
    profiled = [rid for rid, why in every if why == PROFILED]
    slow = [rid for rid, why in every if why == STRAGGLER]
    parts = ([f"{len(shared)} measured on a host another sbench run used at the same time (runs.overlapped_with)"]
             if shared else []) + ([f"{len(busy)} measured on a host busy with other work (measurements.host_busy, "
                                   "host_other_cpu_pct)"] if busy else []) + (
        [f"{len(profiled)} measured under the profiler (measurements.profiled)"] if profiled else []) + (
        [f"{len(slow)} with a straggler rank (measurements.straggler, rank_scores)"] if slow else [])
    ids = [rid for rid, _ in every]
    sides = ", ".join(f"{side} {len(out)}" for side, out in left_out.items())
    return (f"excluded {len(every)} run(s) ({sides}): {'; '.join(parts)}: {', '.join(ids[:5])}"
            f"{' ...' if len(ids) > 5 else ''}; --include-shared keeps them")


def compare_in(store: Store, base: str, cand: str, metrics: list[str], threshold: float,
               include_shared: bool = False) -> Comparison:
    """:func:`compare` of two sides (campaign names or run filters) read from an open results store; runs
    that shared a host are left out unless *include_shared*. The same side twice is refused (a campaign
    compared with itself says nothing), and a campaign the database does not hold is named with those it
    does."""
    sides = [parse_side(base), parse_side(cand)]
    if sides[0] == sides[1]:
        raise InputError(f"BASE and CAND are the same ({base.strip()!r}): compare measures one campaign (or set of "
                         "runs) against another; name two, e.g. sbench compare nightly-1122 nightly-1123")
    known = campaign_names(store)
    for name, (camp, _) in zip(("BASE", "CAND"), sides, strict=True):
        if camp is not None and camp not in known:
            listed = ", ".join(known[:20]) + (f" ... ({len(known)} in all)" if len(known) > 20 else "")
            raise InputError(f"{name}: campaign {camp!r} is not in {store.path}; "
                             + (f"its campaigns: {listed}" if known else "it holds no campaign yet (sbench collect "
                                                                          "reads the work dir)"))
    (b, b_out), (c, c_out) = (compare_side(store, camp, filters, include_shared) for camp, filters in sides)
    left_out = {"BASE": b_out, "CAND": c_out}
    for name, text, side, out in (("BASE", base, b, b_out), ("CAND", cand, c, c_out)):
        if not side:
            why = f" ({excluded_text({name: out})})" if out else ""
            raise InputError(f"{name} {text!r}: no valid measurements match{why}")
    origins = {k: v.get("origin") for k, v in imported_campaigns(store).items()}
    refs = {name: str(camp) for name, (camp, _) in zip(("BASE", "CAND"), sides, strict=True)
            if camp is not None and origins.get(camp) == ORIGIN_ADO_CSV}
    matched: dict[str, list[str]] = {}
    if len(refs) == 1:  # a reference side: its points paired with the other side's on the fields it recorded
        if "BASE" in refs:
            b, matched = pair_on_entity(store, b, c)
        else:
            c, matched = pair_on_entity(store, c, b)
    rows = compare(b, c, metrics or list(DEFAULT_METRICS), threshold)
    if not rows:
        how = ("on the entity fields the reference recorded" if len(refs) == 1 else "by point_id")
        raise InputError(f"BASE and CAND share no measured point ({len(b)} and {len(c)} point(s)); compare pairs "
                         f"runs {how}")
    for r in rows:
        r.matched = matched.get(r.point_id)
        if any((r.n_base if side == "BASE" else r.n_cand) == 1 for side in refs) and r.verdict in (
                Verdict.INSUFFICIENT, Verdict.SAME):
            r.verdict = Verdict.SINGLE
    env = environment_changes(store, b, c, rows)
    kept = {name: [(r["run_id"], r["kept_why"]) for rows_ in side.values() for r in rows_ if r.get("kept_why")]
            for name, side in (("BASE", b), ("CAND", c))}
    return Comparison(rows, left_out, env, refs, {k: v for k, v in kept.items() if v})


def pair_on_entity(store: Store, ref: dict[str, list[dict[str, Any]]], other: dict[str, list[dict[str, Any]]],
                   ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    """A reference side's rows keyed by the other side's point ids: each of the other side's points takes the
    rows of every reference point whose recorded entity fields all match it; and, per point, those reference
    points' ids."""
    given = point_entities(store, list(ref))
    out: dict[str, list[dict[str, Any]]] = {}
    which: dict[str, list[str]] = {}
    for pid, rows in other.items():
        entity = {**{k: rows[0].get(k) for k in ENTITY_FIELDS}, "experiment": rows[0].get("experiment")}
        found = [rpid for rpid in sorted(ref) if rpid in given and matches(given[rpid], entity)]
        if found:
            out[pid] = [r for rpid in found for r in ref[rpid]]
            which[pid] = found
    return out, which


def environment_changes(store: Store, base: dict[str, list[dict[str, Any]]], cand: dict[str, list[dict[str, Any]]],
                        rows: list[Row]) -> envdiff.EnvDiff:
    """What changed between the sides' recorded environments over the points compared, and on each *rows*'
    point (written into its ``changes``)."""
    pids = {r.point_id for r in rows}
    b_runs = [m for pid in pids for m in base.get(pid, [])]
    c_runs = [m for pid in pids for m in cand.get(pid, [])]
    env = environment_of(store, [str(m["run_id"]) for m in b_runs + c_runs])
    per_point: dict[str, list[dict[str, Any]]] = {}
    for pid in pids:
        changes = envdiff.differences(envdiff.side(base.get(pid, []), env), envdiff.side(cand.get(pid, []), env))
        per_point[pid] = [ch.to_dict() for ch in changes]
    for r in rows:
        r.changes = per_point.get(r.point_id, [])
    return envdiff.diff(envdiff.side(b_runs, env), envdiff.side(c_runs, env))
