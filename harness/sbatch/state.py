"""What a campaign already has: attempts and their outcomes, and which points are measured.

The results database is the index (collect classifies every attempt from its
files and SLURM accounting); submit brings it up to date for the campaign
first, so decisions never rest on a stale view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class AttemptState:
    attempt: int
    job_id: str | None
    state: str | None
    outcome: str | None  # ok | invalid | failed | None (queued/running)
    reason: str | None = None


@dataclass
class PointHistory:
    by_run: dict[tuple[str, str, int], list[AttemptState]] = field(default_factory=dict)
    measured_counts: dict[str, int] = field(default_factory=dict)

    def attempts(self, campaign: str, point_id: str, repeat: int) -> list[AttemptState]:
        return sorted(self.by_run.get((campaign, point_id, repeat), []), key=lambda a: a.attempt)

    def measured(self, point_id: str) -> int:
        return self.measured_counts.get(point_id, 0)


def campaign_history(db: Path, workdir: Path, campaign: str, point_ids: list[str]) -> tuple[PointHistory, str | None]:
    raise NotImplementedError  # replaced once the store lands


def record_events(db: Path, events: list[dict[str, Any]]) -> str | None:
    raise NotImplementedError
