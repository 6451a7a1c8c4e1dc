"""The statistics of ``sbench compare``: Student's t distribution and Welch's test on log values.

Pure functions, no third-party libraries. :func:`t_sf` is the upper tail of Student's t with any positive
degrees of freedom (integer or not, as Welch-Satterthwaite gives), through the regularized incomplete
beta function (Lentz's continued fraction, to double precision); :func:`t_quantile` inverts it by
bisection, so both are exact to about 1e-12 (``t_quantile(0.975, 1) = 12.7062...``).

:func:`welch` compares two samples of log values. A side with fewer than two values has no spread to
judge by, so no test (the caller says ``insufficient repeats``). A side may bring *within-run* evidence:
each run's own variance from the spread of its step times (``w_i^2``) with its degrees of freedom. The
side's variance of one run's value is then the larger of the runs' spread (``s^2``, ``n - 1`` degrees of
freedom) and the mean within-run variance (``mean(w_i^2)``, ``sum(steps_i - 1)`` degrees of freedom):
when the runs agree within what their steps' spread predicts, the steps measured that side's noise and
bring their degrees of freedom; when the runs differ by more, the runs' spread alone decides, with its
few degrees of freedom. Either way the variance used is never below the runs' own spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.runner.steady import betainc  # the one incomplete beta function (Student's t needs it)


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with *df* degrees of freedom (df > 0; ``math.inf``: the normal)."""
    if df <= 0:
        raise ValueError(f"t_sf: degrees of freedom must be positive, got {df}")
    if math.isinf(df):
        return 0.5 * math.erfc(t / math.sqrt(2.0))
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = *p* (0 < p < 1), by bisection on :func:`t_sf`."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > 1.0 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


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
