"""What a campaign already has: attempts and their outcomes, and which points are measured.

The results database is the index (collect classifies every attempt from its
files and SLURM accounting); submit brings it up to date for the campaign
first, so decisions never rest on a stale view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StoreBusyError, SubmitError


@dataclass
class AttemptState:
    attempt: int
    job_id: str | None
    state: str | None
    outcome: str | None  # ok | invalid | failed | None (queued/running)
    reason: str | None = None
    cancelled: bool = False  # the user cancelled it (sbench cancel): retry leaves it alone


@dataclass
class PointHistory:
    by_run: dict[tuple[str, str, int], list[AttemptState]] = field(default_factory=dict)
    measured_counts: dict[str, int] = field(default_factory=dict)

    def attempts(self, campaign: str, point_id: str, repeat: int) -> list[AttemptState]:
        return sorted(self.by_run.get((campaign, point_id, repeat), []), key=lambda a: a.attempt)

    def measured(self, point_id: str) -> int:
        return self.measured_counts.get(point_id, 0)


def campaign_history(db: Path, workdir: Path, campaign: str, point_ids: list[str]) -> tuple[PointHistory, str | None]:
    """Collect the campaign (incremental: a no-op when nothing changed), then read its attempts and how often
    each point was measured in any campaign."""
    from ..collect.ingest import collect
    from ..collect.store import open_store

    try:
        collect(db, workdir, campaign)
    except StoreBusyError as exc:
        raise SubmitError(f"{exc}; nothing was submitted - run submit again once it is free") from None
    history = PointHistory()
    with open_store(db, read_only=True) as st:
        for row in st.attempt_rows(campaign):
            key = (row["campaign"], row["point_id"], int(row["repeat"]))
            history.by_run.setdefault(key, []).append(AttemptState(
                attempt=int(row["attempt"]), job_id=row.get("job_id"), state=row.get("state"),
                outcome=row.get("outcome"), reason=row.get("reason"),
                cancelled=row.get("cancel_requested_at") is not None and row.get("outcome") == "failed"))
        for pid, st_ in st.point_status(point_ids=point_ids).items():
            history.measured_counts[pid] = st_.ok + st_.invalid
    return history, None


def record_events(db: Path, events: list[dict[str, Any]]) -> str | None:
    """Record manifest events in the DB; when it is busy, say so - the manifest already has them."""
    if not events:
        return None
    from ..collect.store import open_store

    try:
        with open_store(db) as st:
            st.record_manifest(events)
    except StoreBusyError as exc:
        return f"{exc}; the submission is in the campaign manifest and the next 'sbench collect' records it"
    return None
