"""Repeats to a precision: ``repeats: {min: 2, max: 6, cv: 0.02}`` in a sweep.

Each point runs *min* repeats. Once none of its repeats is queued or running, the coefficient of variation
(CV) of its throughput across its measured repeats (the ``point_stability`` view's ``throughput_cv``:
valid measurements of ``dataset_tokens_per_second`` not taken on a shared host; failed and invalid repeats
do not count) decides: above *cv*, one more repeat is submitted, until the point has *max* repeats. A
repeat counts toward *max* once it was submitted, whatever became of it.

Nothing has to stay alive for it: ``sbench submit`` run again on the sweep, and ``sbench collect``
(after it has read what ended), submit the next repeat of each point that still needs one. A plain loop
(``while ...; do sbench collect --campaign X; sleep 60; done``) or a cron entry finishes a campaign;
``sbench status`` shows each adaptive point's state (:func:`verdict`).
"""

from __future__ import annotations

from harness.spec.repeats import (  # noqa: F401 - the verdict of one point lives in spec.repeats; re-exported here
    AT_MAX,
    MORE,
    NO_CV,
    PRECISE,
    STATES,
    WAITING,
    RepeatsVerdict,
    verdict,
)
from harness.spec.sweep import AdaptiveRepeats

from .state import PointHistory


def point_verdicts(spec: AdaptiveRepeats, point_ids: list[str], history: PointHistory,
                   campaign: str) -> dict[str, RepeatsVerdict]:
    """The verdict of each of *point_ids* from what *history* (``harness.campaign.state``) has of *campaign*."""
    submitted: dict[str, set[int]] = {}
    in_flight: dict[str, int] = {}
    for (c, p, r), attempts in history.by_run.items():
        if c == campaign and attempts:
            submitted.setdefault(p, set()).add(r)
            in_flight[p] = in_flight.get(p, 0) + any(a.outcome is None for a in attempts)
    out = {}
    for pid in dict.fromkeys(point_ids):
        measured, cv = history.stability.get(pid, (0, None))
        out[pid] = verdict(spec, pid, submitted.get(pid, set()), in_flight.get(pid, 0), measured, cv)
    return out
