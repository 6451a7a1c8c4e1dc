"""Steady state and its precision, from a run's step times: the ``precision`` auto-stop rule.

- :func:`mser5`: the end of warm-up by MSER-5. The step times are averaged in batches of 5; the
  truncation point ``d`` (in batches, at most half of them, and leaving at least two) minimises the
  marginal standard error ``sum((z_j - mean_d)^2) / (k - d)^2`` of the batch means that remain. The
  first minimum wins a tie. Warm-up ends after ``5 * d`` steps.
- :func:`batch_means`: the 95 % confidence interval of the mean step time by non-overlapping batch
  means (``b = isqrt(n)`` batches, between 2 and 30, of ``n // b`` steps; the oldest steps left over
  are dropped), so correlated neighbouring steps do not make the interval look narrower than it is.
  The half-width is ``t(0.975, b - 1) * s_b / sqrt(b)`` with the exact Student-t quantile
  (:func:`harness.contract.stats.t_quantile`), and never less than the interval of independent steps,
  ``t(0.975, m*b - 1) * s / sqrt(m*b)`` over the same steps: with few batches (a short window) the batch
  means can agree by chance while the steps themselves are spread wide, and a rule that looks after every
  step would stop on that chance. Correlated steps only widen the batch means' interval, so the floor
  costs nothing when batching matters. Its relative half-width is ``h`` over the mean of every step given (the
  window's mean step time, not the batched steps' mean when a few oldest steps are left out of the batches):
  the throughput's, to first order (throughput is steps or tokens per second, the inverse of the mean step
  time).
- :class:`PrecisionRule`: stop once the steady window holds ``min_steps`` steps and its interval is
  within ``rel_ci``, or once ``max_seconds`` have passed.

Pure Python (no numpy, no scipy): the in-job runner of every trainer environment imports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, stdev

from harness.contract.stats import Interval, mean_half_width

MSER_BATCH = 5  # MSER-5
MIN_BATCHES = 2  # batch means need two batches for a variance
MAX_BATCHES = 30  # enough degrees of freedom; beyond it, longer batches decorrelate better
CONFIDENCE = 0.95
EVERY_STEP_UNTIL = 200  # below this many steps the rule is evaluated after every step, then at ~1 % growth


# -- steady state --------------------------------------------------------------------------------

def mser5(times: Sequence[float]) -> int:
    """Steps of warm-up to truncate by MSER-5 (a multiple of 5; 0 for fewer than two batches)."""
    k = len(times) // MSER_BATCH
    if k < 2:
        return 0
    z = [fmean(times[j * MSER_BATCH:(j + 1) * MSER_BATCH]) for j in range(k)]
    shift = fmean(z)  # centred sums keep the subtraction below exact enough for near-constant times
    s = s2 = 0.0
    suffix: list[tuple[float, float]] = [(0.0, 0.0)] * (k + 1)
    for j in range(k - 1, -1, -1):
        v = z[j] - shift
        s, s2 = s + v, s2 + v * v
        suffix[j] = (s, s2)
    best_d, best = 0, math.inf
    for d in range(0, min(k // 2, k - 2) + 1):
        n = k - d
        s, s2 = suffix[d]
        stat = max(0.0, s2 - s * s / n) / (n * n)
        if stat < best:
            best_d, best = d, stat
    return best_d * MSER_BATCH


def batch_means(times: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """The interval of the mean of *times* by non-overlapping batch means; None with fewer than 4 times."""
    n = len(times)
    b = min(MAX_BATCHES, max(MIN_BATCHES, math.isqrt(n)))
    m = n // b
    if m < 2:
        return None
    used = times[n - b * m:]  # the oldest leftover steps are dropped from the batches
    means = [fmean(used[i * m:(i + 1) * m]) for i in range(b)]
    half = max(mean_half_width(means, confidence), mean_half_width(used, confidence))
    # relative to the mean of every step given (the window's mean step time, which measurements store as
    # step_time_mean and the throughput is the inverse of), not to the batched steps' own mean
    mu = fmean(times)
    return Interval(mean=mu, half=half, n=b, batch_size=m)


@dataclass(frozen=True)
class Steady:
    """The steady-state window of a sequence of step times and its statistics."""

    start: int  # steps truncated as warm-up: the window is times[start:]
    steps: int
    mean_s: float
    cv: float  # sample standard deviation / mean of the window's step times
    interval: Interval | None

    @property
    def rel(self) -> float:
        return self.interval.rel if self.interval is not None else math.inf


def window_stats(times: Sequence[float], start: int) -> Steady | None:
    """The statistics of the window ``times[start:]``; None when it holds fewer than two steps."""
    w = times[start:]
    if len(w) < 2:
        return None
    mean = fmean(w)
    return Steady(start=start, steps=len(w), mean_s=mean, cv=stdev(w) / mean if mean > 0 else math.inf,
                  interval=batch_means(w))


def steady_state(times: Sequence[float]) -> Steady | None:
    """MSER-5's window and its interval; None until there are two MSER batches (10 steps)."""
    if len(times) < 2 * MSER_BATCH:
        return None
    return window_stats(times, mser5(times))


@dataclass(frozen=True)
class PrecisionRule:
    """Stop once the steady window has ``min_steps`` steps and a relative half-width <= ``rel_ci``, or at
    ``max_seconds``."""

    rel_ci: float
    min_steps: int
    max_seconds: float

    @staticmethod
    def due(n: int) -> bool:
        """Whether to evaluate after the *n*-th step: every step at first, then whenever n grew by about 1 %,
        so a long run spends O(n) on the rule in all (each evaluation is O(n))."""
        return n < EVERY_STEP_UNTIL or n % max(1, n // 100) == 0

    def decide(self, times: Sequence[float], elapsed: float) -> tuple[bool, str | None, Steady | None]:
        """``(stop, reason, window)`` after a step that ended *elapsed* seconds into training, *times* being the
        step times so far; *window* is the steady window when the run stops here, else None. *reason*:
        ``precision`` or ``max_seconds``."""
        if elapsed >= self.max_seconds:
            return True, "max_seconds", steady_state(times)
        if not self.due(len(times)):
            return False, None, None
        s = steady_state(times)
        if s is not None and s.steps >= self.min_steps and s.rel <= self.rel_ci:
            return True, "precision", s
        return False, None, None
