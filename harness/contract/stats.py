"""The statistics every layer shares: Student's t distribution, a mean's confidence interval, Welch's test.

Pure Python, no third-party libraries (the in-job runner of every trainer environment and the CLI's read
commands import it).

- :func:`betainc`: the regularized incomplete beta function ``I_x(a, b)`` (Lentz's continued fraction, to
  double precision).
- :func:`t_sf` and :func:`t_cdf`: the upper tail and the CDF of Student's t with any positive degrees of
  freedom (integer or not, as Welch-Satterthwaite gives; ``math.inf``: the normal), through :func:`betainc`.
  :func:`t_quantile` inverts :func:`t_cdf` by bisection to the last representable digit
  (``t_quantile(0.975, 1) = 12.7062...``).
- :func:`mean_half_width`: the half-width of the Student-t interval of the mean of independent values,
  ``t((1 + confidence) / 2, n - 1) * s / sqrt(n)``.
- :class:`Interval`: a confidence interval of a mean, ``mean ± half``, from ``n`` values (a window's batch
  means, a search point's runs).
- :func:`welch` compares two samples of log values. A side with fewer than two values has no spread to
  judge by, so no test (the caller says ``insufficient repeats``). A side may bring *within-run* evidence:
  each run's own variance from the spread of its step times (``w_i^2``) with its degrees of freedom. The
  side's variance of one run's value is then the larger of the runs' spread (``s^2``, ``n - 1`` degrees of
  freedom) and the mean within-run variance (``mean(w_i^2)``, ``sum(steps_i - 1)`` degrees of freedom):
  when the runs agree within what their steps' spread predicts, the steps measured that side's noise and
  bring their degrees of freedom; when the runs differ by more, the runs' spread alone decides, with its
  few degrees of freedom. Either way the variance used is never below the runs' own spread.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# -- Student's t ----------------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with *df* degrees of freedom (df > 0; ``math.inf``: the normal)."""
    if df <= 0:
        raise ValueError(f"t_sf: degrees of freedom must be positive, got {df}")
    if math.isinf(df):
        return 0.5 * math.erfc(t / math.sqrt(2.0))
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with *df* degrees of freedom (df > 0; ``math.inf``: the normal)."""
    return 1.0 - t_sf(t, df) if t > 0 else t_sf(-t, df)


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The *p* quantile of Student's t with *df* > 0 degrees of freedom (bisection of :func:`t_cdf` to the last
    representable digit)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# -- a mean's confidence interval ----------------------------------------------------------------

def mean_half_width(values: Sequence[float], confidence: float = 0.95) -> float:
    """The half-width of the Student-t *confidence* interval of the mean of two or more independent *values*."""
    n = len(values)
    return t_quantile(0.5 + confidence / 2.0, n - 1) * statistics.stdev(values) / math.sqrt(n)


@dataclass(frozen=True)
class Interval:
    """A confidence interval of a mean: ``mean ± half``."""

    mean: float  # a step window's: the mean step time of every step given (s); a search point's: its runs' goal
    half: float  # half-width, in the mean's unit
    n: int  # the values it is from: a window's batch means, a search point's ok runs
    batch_size: int = 1  # observations per value (a window's steps per batch)

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    @property
    def rel(self) -> float:
        """The half-width relative to the mean (inf unless the mean is positive)."""
        return self.half / self.mean if self.mean > 0 else math.inf

    def text(self) -> str:
        return f"{_num(self.mean, 4)} ± {_num(self.half, 2)}"


def _num(x: float, digits: int) -> str:
    """A figure as a reader takes it: *digits* significant (1,204; 9.1), whole where it has more (11,776; 512)."""
    return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:,.{digits}g}"


# -- Welch's test ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SideSpread:
    """One side's variance of a single run's (log) value, its degrees of freedom, and where it came from
    (``runs``: the runs' spread; ``steps``: the runs' step times)."""

    var: float
    df: float
    source: str


def side_spread(values: Sequence[float], within: Sequence[tuple[float, int]] = ()) -> SideSpread:
    """The spread of a side of >= 2 *values*; *within*: per run ``(variance of its value, steps)`` from
    its step times, where known for every run (else the runs' spread alone)."""
    n = len(values)
    if n < 2:
        raise ValueError("side_spread needs two values or more")
    s2 = statistics.variance(values)
    if len(within) == n and all(m >= 2 for _, m in within):
        w2 = statistics.fmean(v for v, _ in within)
        df_w = float(sum(m - 1 for _, m in within))
        if w2 >= s2 and df_w > n - 1:
            return SideSpread(w2, df_w, "steps")
    return SideSpread(s2, float(n - 1), "runs")


@dataclass(frozen=True)
class Welch:
    """Welch's test of mean(cand) - mean(base): the difference, its standard error, the Welch-Satterthwaite
    degrees of freedom, t, the two-sided p-value and the 95 % interval of the difference."""

    diff: float
    se: float
    df: float
    t: float
    p: float
    low: float
    high: float
    base: SideSpread
    cand: SideSpread


def welch(base: Sequence[float], cand: Sequence[float], base_within: Sequence[tuple[float, int]] = (),
          cand_within: Sequence[tuple[float, int]] = (), level: float = 0.95) -> Welch | None:
    """Welch's two-sided test on two samples (log values); None when a side has fewer than two values."""
    if len(base) < 2 or len(cand) < 2:
        return None
    sb, sc = side_spread(base, base_within), side_spread(cand, cand_within)
    vb, vc = sb.var / len(base), sc.var / len(cand)
    diff = statistics.fmean(cand) - statistics.fmean(base)
    se2 = vb + vc
    if se2 <= 0:  # no spread at all on either side: any difference is certain, none is none
        p = 1.0 if diff == 0 else 0.0
        return Welch(diff, 0.0, math.inf, math.copysign(math.inf, diff) if diff else 0.0, p, diff, diff, sb, sc)
    df = se2 ** 2 / ((vb ** 2 / sb.df if vb else 0.0) + (vc ** 2 / sc.df if vc else 0.0))
    se = math.sqrt(se2)
    t = diff / se
    p = min(1.0, 2.0 * t_sf(abs(t), df))
    q = t_quantile(0.5 + level / 2.0, df)
    return Welch(diff, se, df, t, p, diff - q * se, diff + q * se, sb, sc)
