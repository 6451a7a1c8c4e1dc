"""What a submission decided and did: a :class:`Decision` per point (submit or skip, and why) and the
:class:`SubmitReport` that ``submit``, ``retry`` and ``collect``'s next runs return. Its own module, apart from
the submit path (rendering, executors), so that a command that only reads a report (``collect`` finding nothing
to send) starts without that path."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.spec.plan import PlannedPoint

from .repeats import RepeatsVerdict
from .state import MeasuredRun

if TYPE_CHECKING:
    from harness.campaign.executors.base import Submitted


@dataclass
class Decision:
    point: PlannedPoint
    action: str  # submit | skip
    reason: str
    attempt: int = 0
    reused: MeasuredRun | None = None  # skipped because it takes this run of another campaign (reuse)
    scale: float = 1.0  # a search's short run: this share of the sweep's run length (harness.spec.search)


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
                "repeats_before": [v.to_dict() for v in self.repeats_before], "search": self.search}
