"""Stragglers: each rank of a multi-process run scored against the others and against itself (pure functions).

Each rank records its own time per optimizer step (``rank.<r>.json`` ``step_own_s``, aligned with its
``step_end_wall``; :class:`harness.runner.measure.RankClock`: the work it does alone, without the time it
waits for the other ranks). Over the measured window's steps (rank 0's ``window_start_step`` to
``window_end_step``; every step when the window is unknown):

* **relative score**: the fastest rank's median own step time / this rank's (1 = as fast as the fastest);
* **individual score**: the rank's usual / its current, where the window's steps are cut into up to four
  consecutive parts of at least :data:`MIN_PART_STEPS` steps, its current is the last part's median and its
  usual the median of the earlier parts' medians (1 = as fast now as it was in the window before; medians of
  parts on both sides, like with like: one slow step is no trend, and one fast step is no baseline). A window
  too short for two such parts is not judged (1);
* **flagged**: either score below ``runner.straggler_score`` (default 0.7: a rank that takes more than
  1 / 0.7 = 1.43 times as long), by more than the noise: the two medians that score compares differ by more than
  :data:`NOISE_SE` standard errors of their difference, each median's standard error taken from the rank's own
  steps (1.2533 x 1.4826 x their median absolute deviation / sqrt(steps it is the median of)). A few
  milliseconds of scheduler noise on a step of a few milliseconds is no straggler; a rank that sleeps half a
  second a step is.

A run with a flagged rank is a straggler run (``measurements.straggler``): ``compare``, ``check`` and the
repeats' CV leave it out and say why, as they do a run on a shared or busy host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

PARTS = 4  # the individual score's parts of the window (at most)
MIN_PART_STEPS = 3  # the fewest steps of one part: a median of fewer is one step's noise
NOISE_SE = 3.0  # how many standard errors apart two medians must be for a score under the threshold to flag
_MEDIAN_SE = 1.2533 * 1.4826  # a median's standard error over sigma/sqrt(n), and sigma over the MAD (normal)


@dataclass(frozen=True)
class RankScore:
    rank: int
    host: str | None
    steps: int  # the window's steps this rank timed
    own_step_s: float  # its median own step time over them
    best_step_s: float  # its usual step: the median of its earlier parts' medians (its current when not judged)
    current_step_s: float  # its last part's median
    relative: float
    individual: float
    flagged: bool

    def why(self, fastest_s: float, threshold: float) -> str:
        """The note that says why this rank is a straggler."""
        parts = []
        if self.relative < threshold:
            parts.append(f"relative score {self.relative:.2f}: its median own step time {self.own_step_s:.3g} s "
                         f"against the fastest rank's {fastest_s:.3g} s")
        if self.individual < threshold:
            parts.append(f"individual score {self.individual:.2f}: {self.current_step_s:.3g} s a step at the end "
                         f"of the window against its usual {self.best_step_s:.3g} s before")
        return (f"straggler: rank {self.rank} on {self.host or '?'} ({'; '.join(parts)}; under "
                f"runner.straggler_score {threshold:g}; rank_scores)")


def _own_times(doc: Mapping[str, Any], first: int | None, last: int | None) -> list[float]:
    """The rank's own step times of the steps first+1..last (global step numbers; all when unknown)."""
    own = doc.get("step_own_s")
    if not isinstance(own, list) or not own:
        return []
    end = doc.get("global_step")
    times = [float(x) for x in own if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0]
    if len(times) != len(own):
        return []
    if not isinstance(end, int) or isinstance(end, bool) or first is None or last is None:
        return times
    start = end - len(times)  # the step before the first one timed
    return [t for i, t in enumerate(times, start=start + 1) if first < i <= last]


def _parts(times: list[float]) -> tuple[float, float, int, int] | None:
    """(usual, current, steps of the earlier parts, steps of the last part): the median of the earlier parts'
    medians and the last part's median, of up to PARTS consecutive parts of at least MIN_PART_STEPS steps; None
    when the window holds fewer than two such parts."""
    n = min(PARTS, len(times) // MIN_PART_STEPS)
    if n < 2:
        return None
    size = len(times) / n
    chunks = [times[round(i * size):round((i + 1) * size)] for i in range(n)]
    return median(median(c) for c in chunks[:-1]), median(chunks[-1]), sum(map(len, chunks[:-1])), len(chunks[-1])


def _se(times: list[float], n: int) -> float:
    """The standard error of a median of *n* of these steps, from their median absolute deviation."""
    mid = median(times)
    return _MEDIAN_SE * median(abs(t - mid) for t in times) / n ** 0.5


def _apart(slow: float, fast: float, se_slow: float, se_fast: float) -> bool:
    """Whether *slow* is above *fast* by more than NOISE_SE standard errors of their difference."""
    return slow - fast > NOISE_SE * (se_slow**2 + se_fast**2) ** 0.5


def rank_scores(ranks: Mapping[int, Mapping[str, Any]], first: int | None, last: int | None,
                threshold: float) -> list[RankScore]:
    """The scores of a run's ranks (none for a run of one process, or when fewer than two ranks timed steps)."""
    timed = {rk: (doc, _own_times(doc, first, last)) for rk, doc in sorted(ranks.items()) if isinstance(doc, Mapping)}
    timed = {rk: (doc, t) for rk, (doc, t) in timed.items() if t}
    if len(timed) < 2:
        return []
    meds = {rk: median(t) for rk, (_, t) in timed.items()}
    first = min(meds, key=lambda rk: meds[rk])
    fastest, fast_se = meds[first], _se(timed[first][1], len(timed[first][1]))
    out = []
    for rk, (doc, times) in timed.items():
        parts = _parts(times)
        relative = fastest / meds[rk] if meds[rk] > 0 else 1.0
        slow_rel = relative < threshold and _apart(meds[rk], fastest, _se(times, len(times)), fast_se)
        if parts is None:  # too few steps to tell a trend from noise: not judged
            best = current = meds[rk]
            individual, slow_ind = 1.0, False
        else:
            best, current, n_before, n_last = parts
            individual = best / current if current > 0 else 1.0
            slow_ind = individual < threshold and _apart(current, best, _se(times, n_last), _se(times, n_before))
        host = doc.get("host")
        out.append(RankScore(rank=rk, host=str(host) if host is not None else None, steps=len(times),
                             own_step_s=meds[rk], best_step_s=best, current_step_s=current, relative=relative,
                             individual=individual, flagged=slow_rel or slow_ind))
    return out


def fastest_s(scores: list[RankScore]) -> float:
    return min(s.own_step_s for s in scores)
