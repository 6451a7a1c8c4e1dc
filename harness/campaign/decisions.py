"""What a submission decided and did: a :class:`Decision` per point (its :class:`DecisionKind`: submit or skip, and
why) and the :class:`SubmitReport` that ``submit``, ``retry`` and ``collect``'s next runs return. Its own module,
apart from the submit path (rendering, executors), so that a command that only reads a report (``collect`` finding
nothing to send) starts without that path."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.spec.plan import PlannedPoint

from .repeats import RepeatsVerdict
from .state import MeasuredRun

if TYPE_CHECKING:
    from harness.campaign.executors.base import Submitted


class DecisionKind(enum.Enum):
    """What a decision is, for the code that filters decisions (retry, collect's next runs): the reason says it
    to a reader, and is never compared."""

    # submitted
    NEW = "new"  # never run in this campaign
    RETRY = "retry"  # its last attempt failed (--retry-failed, sbench retry)
    FORCE = "force"  # run again although measured or in flight (--force)
    MORE_REPEATS = "more repeats"  # the next repeat adaptive repeats ask for (harness.campaign.repeats)
    SEARCH = "search"  # a run the search asks for (harness.spec.search)
    # skipped
    INVALID = "invalid"  # the plan's rules reject the point
    IN_FLIGHT = "in flight"  # an attempt is queued or running
    MEASURED = "measured"  # this campaign measured it (ok or invalid)
    REUSED = "reused"  # it takes another campaign's measured run (reuse)
    CANCELLED = "cancelled"  # its last attempt was cancelled with sbench cancel
    FAILED = "failed"  # its last attempt failed, and retrying was not asked for
    NOT_FAILED = "not failed"  # sbench retry: a run that would be submitted, but never failed
    PREDICTED_OOM = "predicted oom"  # --skip-predicted-oom: predicted not to fit
    OVER_BUDGET = "over budget"  # a running campaign's next run that would pass the sweep's budget: (not sent)
    NOT_NEEDED = "not needed"  # a failed run of a point the search skips (its scan's pack did not start it)

    @property
    def submits(self) -> bool:
        return self in SUBMITTING


SUBMITTING = frozenset({DecisionKind.NEW, DecisionKind.RETRY, DecisionKind.FORCE, DecisionKind.MORE_REPEATS,
                        DecisionKind.SEARCH})


@dataclass
class Decision:
    point: PlannedPoint
    kind: DecisionKind
    reason: str  # what the manifest, the report and the CLI show
    attempt: int = 0
    reused: MeasuredRun | None = None  # skipped because it takes this run of another campaign (reuse)
    scale: float = 1.0  # a search's short run: this share of the sweep's run length (harness.spec.search)

    @property
    def action(self) -> str:
        """submit | skip"""
        return "submit" if self.kind.submits else "skip"


@dataclass
class SubmitReport:
    campaign: str
    executor: str
    campaign_dir: Path
    decisions: list[Decision]
    submitted: list[Submitted] = field(default_factory=list)
    sbatch_calls: int = 0
    db_note: str | None = None
    warnings: list[str] = field(default_factory=list)
    preflight: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)  # submit --preflight: each partition's device check
    excluded_slow: list[str] = field(default_factory=list)  # hosts left out for a slow device (--exclude-slow)
    prepare: list[dict[str, Any]] = field(default_factory=list)
    prepare_job: str | None = None
    held_back: int = 0  # attempts sbench holds back for the campaign's feeder job (harness.campaign.executors.feed)
    feed: dict[str, Any] = field(default_factory=dict)  # the feeder job, the limits of the last wave
    # repeats: {min, max, cv}: each point's verdict once this submission is made (harness.campaign.repeats), and
    # the verdicts it was decided on (before it)
    repeats: list[RepeatsVerdict] = field(default_factory=list)
    repeats_before: list[RepeatsVerdict] = field(default_factory=list)
    search: dict[str, Any] = field(default_factory=dict)  # search: what it decided before this submission
    # what the runs sent are predicted to hold (harness.spec.predict: totals), what the campaign spent, its budget
    prediction: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        by_key = {(s.spec.point_id, s.spec.repeat): s for s in self.submitted}
        rows = []
        for d in self.decisions:
            sub = by_key.get((d.point.point_id, d.point.repeat))
            rows.append({"point_id": d.point.point_id, "repeat": d.point.repeat, "action": d.action,
                         "reason": d.reason, "attempt": d.attempt or None,
                         "job_id": sub.job_id if sub else None, "job_dir": sub.spec.job_dir if sub else None,
                         "reused_from": d.reused.to_dict() if d.reused else None})
        return {"campaign": self.campaign, "executor": self.executor, "campaign_dir": str(self.campaign_dir),
                "sbatch_calls": self.sbatch_calls, "submitted": len(self.submitted), "points": rows,
                "reused": sum(1 for d in self.decisions if d.reused),
                "db_note": self.db_note, "warnings": self.warnings, "preflight": self.preflight,
                "devices": self.devices, "excluded_slow": self.excluded_slow,
                "prepare": self.prepare, "prepare_job": self.prepare_job, "held_back": self.held_back,
                "feed": self.feed, "repeats": [v.to_dict() for v in self.repeats],
                "repeats_before": [v.to_dict() for v in self.repeats_before], "search": self.search,
                "prediction": self.prediction}
