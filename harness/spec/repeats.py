"""The verdict of one point under ``repeats: {min, max, cv}`` (:class:`harness.spec.sweep.AdaptiveRepeats`): its
state and its next repeat, from how many of its repeats were submitted, are in flight and were measured, and
their throughput's CV. Pure: ``campaign.repeats`` decides what to submit with it, the report shows it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .sweep import AdaptiveRepeats

# A point's state, as status and submit say it.
MORE = "more"  # its CV is above the target and it may have another repeat: the next one is submitted
PRECISE = "precise"  # its CV is at or below the target
AT_MAX = "max reached"  # its CV is above the target with max repeats submitted
WAITING = "waiting"  # repeats of it are queued or running
NO_CV = "no cv"  # fewer than two measured repeats (failed ones do not count): retry them to go on
STATES = (MORE, PRECISE, AT_MAX, WAITING, NO_CV)


@dataclass(frozen=True)
class RepeatsVerdict:
    """What the repeats of one point say: how many were submitted (*submitted*: repeat numbers with an
    attempt), how many are in flight and measured, their CV, the state and the next repeat to submit."""

    point_id: str
    submitted: int
    in_flight: int
    measured: int
    cv: float | None
    target: float
    max: int
    state: str
    next_repeat: int | None = None

    @property
    def below_precision(self) -> bool:
        """Its CV is not (yet) known to be within the target."""
        return self.state != PRECISE

    @property
    def open(self) -> bool:
        """More is to come without anyone's help: its next repeat is due, or repeats of it are in flight."""
        return self.state in (MORE, WAITING)

    def text(self) -> str:
        cv = "no CV" if self.cv is None else f"CV {100 * self.cv:.2f} %"
        have = f"{self.submitted} of at most {self.max} repeats"
        if self.state == MORE:
            return f"{cv} > {100 * self.target:g} % with {have}: repeat {self.next_repeat} is next"
        if self.state == PRECISE:
            return f"{cv} <= {100 * self.target:g} % with {self.measured} measured repeat(s): precise enough"
        if self.state == AT_MAX:
            return f"{cv} > {100 * self.target:g} % with {have}: no more repeats (max reached)"
        if self.state == WAITING:
            return f"{self.in_flight} repeat(s) queued or running ({have}); the CV is judged once they end"
        return (f"{self.measured} measured repeat(s) ({have}): no CV yet; sbench retry runs the failed ones again, "
                "then the CV decides")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "below_precision": self.below_precision, "open": self.open, "text": self.text()}


def verdict(spec: AdaptiveRepeats, point_id: str, repeats_submitted: set[int], in_flight: int, measured: int,
            cv: float | None) -> RepeatsVerdict:
    """The state of one point: *repeats_submitted* are its repeat numbers that have an attempt, *in_flight*
    how many of them are queued or running, *measured* and *cv* its ``point_stability`` figures."""
    n = len(repeats_submitted)
    nxt = next((r for r in range(spec.max) if r not in repeats_submitted), None)

    def said(state: str, next_repeat: int | None = None) -> RepeatsVerdict:
        return RepeatsVerdict(point_id, n, in_flight, measured, cv, spec.cv, spec.max, state, next_repeat)

    if in_flight or n < spec.min:
        return said(WAITING)
    if cv is None or measured < 2:
        return said(NO_CV)
    if cv <= spec.cv:
        return said(PRECISE)
    if nxt is None:
        return said(AT_MAX)
    return said(MORE, nxt)
