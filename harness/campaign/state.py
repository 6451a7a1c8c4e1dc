"""What a campaign already has: its attempts and their outcomes; and, when the campaign may reuse them,
the measured runs of its points in other campaigns.

The results database is the index (collect classifies every attempt from its
files and SLURM accounting); submit brings it up to date for the campaign
first (:mod:`harness.campaign.refresh`), so decisions never rest on a stale view.
It does so without a full collect: the scheduler is asked about the attempts
the database has not seen end (``refresh.runs_to_refresh``), and only those that
ended since (and attempts the database does not know yet) are read. This module
only reads: ``status`` starts without the collect layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.contract import jobstate
from harness.contract.errors import InputError, SbenchError
from harness.contract.paths import DbTarget
from harness.contract.records import read_submitted
from harness.db.exchange import imported_campaigns
from harness.db.status import attempt_rows, measured_runs, point_stability
from harness.db.store import open_store, store_exists


@dataclass
class AttemptState:
    attempt: int
    job_id: str | None
    state: str | None
    outcome: str | None  # ok | invalid | failed | None (queued/running)
    reason: str | None = None
    cancelled: bool = False  # the user cancelled it (sbench cancel): retry leaves it alone


def with_submitted(history: PointHistory, campaign: str, attempts: Sequence[tuple[str, int, int, str | None]],
                   ) -> PointHistory:
    """*history* with *attempts* (``(point_id, repeat, attempt, job_id)``, just handed to the executor) added as
    queued: what the campaign has right after a submission."""
    by_run = {k: list(v) for k, v in history.by_run.items()}
    for pid, repeat, attempt, job_id in attempts:
        by_run.setdefault((campaign, pid, repeat), []).append(AttemptState(attempt, job_id, jobstate.INITIAL, None))
    return PointHistory(by_run, history.elsewhere, history.stability)


@dataclass(frozen=True)
class MeasuredRun:
    """A measured run of a point in another campaign: what ``--reuse-measured`` may take."""

    campaign: str
    run_id: str
    outcome: str  # ok | invalid

    def to_dict(self) -> dict[str, str]:
        return {"campaign": self.campaign, "run_id": self.run_id, "outcome": self.outcome}


@dataclass
class PointHistory:
    by_run: dict[tuple[str, str, int], list[AttemptState]] = field(default_factory=dict)
    # point id -> its measured runs in other campaigns, oldest first (read only when the campaign reuses them)
    elsewhere: dict[str, list[MeasuredRun]] = field(default_factory=dict)
    # point id -> (valid repeats measured, their throughput CV): what adaptive repeats decide on
    stability: dict[str, tuple[int, float | None]] = field(default_factory=dict)

    def attempts(self, campaign: str, point_id: str, repeat: int) -> list[AttemptState]:
        return sorted(self.by_run.get((campaign, point_id, repeat), []), key=lambda a: a.attempt)

    def reusable(self, point_id: str, repeat: int) -> MeasuredRun | None:
        """The run another campaign measured that repeat *repeat* of the point may take: the point's
        measured runs elsewhere, oldest first, one per repeat (so the choice holds as new ones appear)."""
        runs = self.elsewhere.get(point_id, [])
        return runs[repeat] if 0 <= repeat < len(runs) else None


def refuse_imported(db: DbTarget, campaign: str | None, command: str) -> None:
    """*command* (submit, retry, status, cancel) acts on the campaigns submitted here: one imported from another
    database (sbench import) is refused, with what reads it."""
    if campaign is None or not store_exists(db):
        return
    try:
        with open_store(db, read_only=True) as st:
            found = imported_campaigns(st).get(campaign)
    except SbenchError:
        return  # (the command says what is wrong with the database when it opens it)
    if found is not None:
        raise InputError(f"{command} {campaign}: an imported campaign ({found.get('origin')}: "
                         f"{found.get('source')}); {command} acts on the campaigns submitted here, and query, "
                         "report, compare and check read it" + (": submit the sweep under another campaign name"
                                                                 if command == "submit" else ""))


def read_history(db: DbTarget, campaign: str, point_ids: Sequence[str] = (), reuse: bool = False) -> PointHistory:
    """What the database has of *campaign* now (no collect first): its attempts, its points' stability, and
    with *reuse* the measured runs of *point_ids* in the other campaigns."""
    history = PointHistory()
    with open_store(db, read_only=True) as st:
        for row in attempt_rows(st, campaign):
            key = (row["campaign"], row["point_id"], int(row["repeat"]))
            job_id = row.get("job_id")
            if job_id is None and row.get("outcome") is None and row.get("job_dir"):
                # a local attempt's job id comes once its queue starts it: its submitted.json has it first
                job_id = read_submitted(row["job_dir"]).get("job_id")
            history.by_run.setdefault(key, []).append(AttemptState(
                attempt=int(row["attempt"]), job_id=None if job_id is None else str(job_id), state=row.get("state"),
                outcome=row.get("outcome"), reason=row.get("reason"),
                cancelled=row.get("cancel_requested_at") is not None and row.get("outcome") == "failed"))
        history.stability = point_stability(st, campaign)
        if reuse:
            for row in measured_runs(st, sorted(set(point_ids)), campaign):
                history.elsewhere.setdefault(row["point_id"], []).append(
                    MeasuredRun(row["campaign"], row["run_id"], row["outcome"]))
    return history
