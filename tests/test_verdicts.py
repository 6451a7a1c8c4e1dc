"""What compare's verdicts promise, over random step-time traces: the ratio printed lies inside its own interval,
it is the ratio of the sides' centres, and the verdict agrees with both; stalls every k-th step are a
regression with two runs a side; the same configuration is not flagged. Runs are built the way collect builds
them (harness.collect.aggregate over rank 0's step end times), never from hand-typed statistics."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.collect.aggregate import step_time_properties
from harness.report.compare import METRICS, Verdict, compare_point

METRIC = "dataset_tokens_per_second"


def row(durations: list[float], tokens_per_step: float = 1000.0) -> dict:
    """The measurement row of a run with these step times (window from 0 to the last step's end)."""
    ends, t = [], 0.0
    for d in durations:
        t += d
        ends.append(t)
    props = step_time_properties({"step_end_wall": ends}, 0.0, t)
    return {METRIC: tokens_per_step * len(durations) / t, "train_runtime": t, **props, "model_name": "tiny"}


step = st.floats(min_value=1e-3, max_value=50.0, allow_nan=False, allow_infinity=False)
trace = st.lists(step, min_size=1, max_size=40)
side = st.lists(trace, min_size=1, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(side, side, st.sampled_from([METRIC, "train_runtime"]), st.sampled_from([0.02, 0.1, 0.5]))
def test_the_ratio_lies_inside_its_interval_and_the_verdict_reads_both(base: list[list[float]],
                                                                        cand: list[list[float]], metric: str,
                                                                        threshold: float) -> None:
    r = compare_point("p", metric, [row(d) for d in base], [row(d) for d in cand], threshold)
    assert r is not None
    assert r.ratio == pytest.approx(r.cand / r.base, rel=1e-9)
    if r.low is None:
        assert r.verdict == Verdict.INSUFFICIENT and min(len(base), len(cand)) < 2
        return
    assert r.low <= r.ratio <= r.high, r
    higher_better = METRICS[metric]
    worse = (r.high < 1 and r.ratio < 1 - threshold) if higher_better else (r.low > 1 and r.ratio > 1 + threshold)
    better = (r.low > 1 and r.ratio > 1 + threshold) if higher_better else (r.high < 1 and r.ratio < 1 - threshold)
    if r.verdict == Verdict.REGRESSION:
        assert worse
    elif r.verdict == Verdict.IMPROVEMENT:
        assert better
    elif r.verdict == Verdict.SAME:
        assert 1 - threshold <= r.low and r.high <= 1 + threshold
    else:
        assert not worse and not better


def noisy(rnd: random.Random, m: int, step: float, cv: float) -> list[float]:
    sigma = math.sqrt(math.log1p(cv * cv))
    return [step * math.exp(rnd.gauss(-sigma * sigma / 2, sigma)) for _ in range(m)]


def stalled(d: list[float], every: int, stall: float) -> list[float]:
    return [x + (stall if i % every == every - 1 else 0.0) for i, x in enumerate(d)]


def test_stalls_every_third_step_are_a_regression_with_two_runs_a_side() -> None:
    # 12 steps of about 0.5 s, a 2 s stall every third step (0.37x the throughput): every seed a regression,
    # the ratio inside its interval; the same point without stalls on both sides never flagged
    flagged = 0
    for seed in range(200):
        rnd = random.Random(seed)
        base = [row(noisy(rnd, 12, 0.5, 0.1)) for _ in range(2)]
        cand = [row(stalled(noisy(rnd, 12, 0.5, 0.1), 3, 2.0)) for _ in range(2)]
        same = [row(noisy(rnd, 12, 0.5, 0.1)) for _ in range(2)]
        r = compare_point("p", METRIC, base, cand, 0.1)
        assert r is not None and r.verdict == Verdict.REGRESSION and r.low <= r.ratio <= r.high < 1, (seed, r)
        assert r.ratio == pytest.approx(0.5 / (0.5 + 2.0 / 3), abs=0.06)  # the stalls' share of the time
        s = compare_point("p", METRIC, base, same, 0.1)
        assert s is not None and s.low <= s.ratio <= s.high
        flagged += s.verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT)
    assert flagged <= 10  # a 95 % interval: about 5 % of identical pairs may lean past 1, fewer past 10 %


def test_a_sleep_on_every_second_step_is_a_regression() -> None:
    # 12 steps, a 3 s sleep on every second one against the same point without it, 2 runs a side: a 6.7x
    # slowdown whose runs agree is flagged, and the ratio shown is the one the interval is around
    rnd = random.Random(7)
    base = [row(noisy(rnd, 12, 0.25, 0.15)) for _ in range(2)]
    cand = [row(stalled(noisy(rnd, 12, 0.25, 0.15), 2, 3.0)) for _ in range(2)]
    r = compare_point("p", METRIC, base, cand, 0.1)
    assert r is not None and r.verdict == Verdict.REGRESSION and r.low <= r.ratio <= r.high < 0.5
    assert r.cand / r.base == pytest.approx(r.ratio, rel=1e-12)
