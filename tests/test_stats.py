"""harness.contract.stats against scipy (a test dependency only: the harness itself stays pure Python).

Tolerance: 1e-9 relative throughout. The incomplete beta function and Student's t CDF agree with scipy to about
1e-15 for small degrees of freedom and 2e-13 at df = 1000 (``lgamma``'s cancellation grows with df); the quantile
inverts that CDF, so where it is small (p just above 0.5) its relative error is the CDF's over the density
there: 2e-11 at df = 1000, p = 0.51. Past df = 1e5 the quantile near p = 0.5 drifts to about 2e-9, which is why
the degrees of freedom checked stop at 1000 (and the normal, ``math.inf``, which goes through ``erfc``).
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
import scipy.special
import scipy.stats

from harness.contract.stats import (
    Interval,
    betainc,
    mean_half_width,
    side_spread,
    t_cdf,
    t_quantile,
    t_sf,
    welch,
)
from harness.runner.steady import batch_means

REL = 1e-9
DFS = (1, 2, 5, 30, 1000, 1.5, 2.7)  # whole, and Welch-Satterthwaite's fractional ones
PS = (0.5, 0.55, 0.6, 0.75, 0.9, 0.95, 0.975, 0.99, 0.995, 0.999)
TS = (-40.0, -5.0, -1.0, -0.1, 0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0, 300.0)


@pytest.mark.parametrize("a,b", [(0.5, 0.5), (1.0, 0.5), (2.5, 0.5), (15.0, 0.5), (500.0, 0.5), (2.0, 3.0),
                                 (0.7, 5.0), (10.0, 10.0), (0.3, 0.2), (50.0, 80.0)])
def test_betainc_matches_scipy(a, b) -> None:
    for x in (1e-6, 1e-3, 0.1, 0.3, 0.5, 0.7, 0.9, 0.999, 1 - 1e-6):
        assert betainc(a, b, x) == pytest.approx(scipy.special.betainc(a, b, x), rel=REL, abs=0), (a, b, x)
    assert betainc(a, b, 0.0) == 0.0 and betainc(a, b, 1.0) == 1.0
    assert betainc(a, b, -0.5) == 0.0 and betainc(a, b, 1.5) == 1.0


@pytest.mark.parametrize("df", DFS)
def test_t_cdf_and_tail_match_scipy(df) -> None:
    for t in TS:
        assert t_cdf(t, df) == pytest.approx(scipy.stats.t.cdf(t, df), rel=REL, abs=0), (t, df)
        assert t_sf(t, df) == pytest.approx(scipy.stats.t.sf(t, df), rel=REL, abs=0), (t, df)
    assert t_cdf(0.0, df) == t_sf(0.0, df) == 0.5


def test_the_normal_is_infinite_degrees_of_freedom() -> None:
    for t in TS:
        assert t_cdf(t, math.inf) == pytest.approx(scipy.stats.norm.cdf(t), rel=REL, abs=0), t
        assert t_sf(t, math.inf) == pytest.approx(scipy.stats.norm.sf(t), rel=REL, abs=0), t
    for p in PS[1:]:
        assert t_quantile(p, math.inf) == pytest.approx(scipy.stats.norm.ppf(p), rel=REL), p


@pytest.mark.parametrize("df", DFS)
def test_t_quantile_matches_scipy(df) -> None:
    assert t_quantile(0.5, df) == 0.0
    for p in PS[1:]:
        q = t_quantile(p, df)
        assert q == pytest.approx(scipy.stats.t.ppf(p, df), rel=REL), (p, df)
        assert t_quantile(1.0 - p, df) == -q  # symmetric, exactly


@pytest.mark.parametrize("p,df", [(0.0, 3), (1.0, 3), (-0.1, 3), (0.975, 0), (0.975, -1)])
def test_t_quantile_refuses_what_has_no_quantile(p, df) -> None:
    with pytest.raises(ValueError, match="t_quantile needs"):
        t_quantile(p, df)
    with pytest.raises(ValueError, match="degrees of freedom must be positive"):
        t_sf(1.0, 0)


def _samples(seed: int, n: int, mu: float, sd: float) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(mu, sd) for _ in range(n)]


@pytest.mark.parametrize("nb,nc,sb,sc,shift", [(2, 2, 0.05, 0.05, 0.0), (3, 5, 0.02, 0.2, 0.1),
                                               (10, 4, 0.3, 0.01, -0.05), (30, 30, 0.1, 0.1, 0.02)])
def test_welch_matches_scipy(nb, nc, sb, sc, shift) -> None:
    base = _samples(nb * 31 + nc, nb, 2.0, sb)
    cand = _samples(nc * 17 + nb, nc, 2.0 + shift, sc)
    w = welch(base, cand)
    ref = scipy.stats.ttest_ind(cand, base, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert w is not None and w.base.source == w.cand.source == "runs"
    assert w.diff == pytest.approx(statistics.fmean(cand) - statistics.fmean(base), rel=1e-12)
    assert w.t == pytest.approx(ref.statistic, rel=REL)
    assert w.df == pytest.approx(ref.df, rel=REL)
    assert w.p == pytest.approx(ref.pvalue, rel=REL)
    assert w.low == pytest.approx(ci.low, rel=REL) and w.high == pytest.approx(ci.high, rel=REL)
    w99 = welch(base, cand, level=0.99)
    ci99 = ref.confidence_interval(0.99)
    assert w99 is not None and w99.low == pytest.approx(ci99.low, rel=REL)
    assert w99.high == pytest.approx(ci99.high, rel=REL)


def test_welch_with_the_steps_evidence_is_the_t_test_of_that_variance() -> None:
    base, cand = [1.00, 1.01], [1.05, 1.06]
    within = [(0.01 ** 2, 50), (0.012 ** 2, 40)]  # each run's own variance from its steps, and its steps
    w = welch(base, cand, within, within)
    assert w is not None and w.base.source == w.cand.source == "steps"
    var = statistics.fmean(v for v, _ in within)
    assert w.base == side_spread(base, within) and w.base.var == var and w.base.df == 88.0
    se = math.sqrt(var / 2 + var / 2)
    df = (var / 2 + var / 2) ** 2 / (2 * (var / 2) ** 2 / 88.0)
    assert w.se == pytest.approx(se, rel=1e-12) and w.df == pytest.approx(df, rel=1e-12)
    assert w.p == pytest.approx(2 * scipy.stats.t.sf(abs(w.t), df), rel=REL)
    lo, hi = scipy.stats.t.interval(0.95, df, loc=w.diff, scale=se)
    assert w.low == pytest.approx(lo, rel=REL) and w.high == pytest.approx(hi, rel=REL)
    # runs that differ by more than their steps predict: the runs' spread, with its one degree of freedom
    wide = welch([1.0, 1.2], cand, within, within)
    assert wide is not None and wide.base.source == "runs" and wide.base.df == 1.0


def test_welch_without_two_values_or_without_spread() -> None:
    assert welch([1.0], [1.0, 2.0]) is None and welch([1.0, 2.0], []) is None
    same = welch([1.0, 1.0], [1.0, 1.0])
    assert same is not None and (same.p, same.t, same.low, same.high) == (1.0, 0.0, 0.0, 0.0)
    apart = welch([1.0, 1.0], [2.0, 2.0])
    assert apart is not None and (apart.p, apart.t, apart.low, apart.high) == (0.0, math.inf, 1.0, 1.0)


@pytest.mark.parametrize("n", [2, 3, 6, 31, 1001])
def test_mean_half_width_is_scipys_t_interval(n) -> None:
    xs = _samples(n, n, 10.0, 0.7)
    sem = statistics.stdev(xs) / math.sqrt(n)
    for confidence in (0.5, 0.9, 0.95, 0.998):
        lo, hi = scipy.stats.t.interval(confidence, n - 1, loc=statistics.fmean(xs), scale=sem)
        assert mean_half_width(xs, confidence) == pytest.approx((hi - lo) / 2, rel=REL), (n, confidence)


def test_batch_means_interval_against_scipy() -> None:
    xs = [0.1 + 0.01 * math.sin(i) + 0.002 * (i % 7) for i in range(103)]  # isqrt 10 batches of 10; 3 left out
    ci = batch_means(xs)
    assert ci is not None and (ci.n, ci.batch_size) == (10, 10)
    used = xs[3:]
    means = [statistics.fmean(used[i * 10:(i + 1) * 10]) for i in range(10)]
    batched = scipy.stats.t.ppf(0.975, 9) * statistics.stdev(means) / math.sqrt(10)
    steps = scipy.stats.t.ppf(0.975, 99) * statistics.stdev(used) / 10
    assert ci.half == pytest.approx(max(batched, steps), rel=REL)
    assert ci.mean == statistics.fmean(xs) and ci.rel == ci.half / ci.mean


def test_interval_ends_relative_width_and_text() -> None:
    iv = Interval(11776.4, 123.45, 3)
    assert (iv.lo, iv.hi) == (11776.4 - 123.45, 11776.4 + 123.45) and iv.batch_size == 1
    assert iv.rel == 123.45 / 11776.4
    assert iv.text() == "11,776 ± 123"
    assert Interval(9.1234, 0.0456, 2).text() == "9.123 ± 0.046"
    assert Interval(0.0, 1.0, 2).rel == math.inf and Interval(-1.0, 1.0, 2).rel == math.inf
