"""What a campaign already has: its attempts and their outcomes; and, when the campaign may reuse them,
the measured runs of its points in other campaigns.

The results database is the index (collect classifies every attempt from its
files and SLURM accounting); submit brings it up to date for the campaign
first, so decisions never rest on a stale view. It does so without a full
collect: the scheduler is asked about the attempts the database has not seen
end, and only those that ended since (and attempts the database does not know
yet) are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.collect.ingest import collect
from harness.contract import jobstate
from harness.contract.errors import SbenchError, StoreBusyError, SubmitError
from harness.contract.paths import parse_job_dir_name, run_id
from harness.contract.records import AttemptLine, read_submitted
from harness.db.status import attempt_rows, measured_runs, point_stability
from harness.db.store import open_store
from harness.slurm.client import Slurm

from . import manifest
from .backends import live_states


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


def campaign_history(db: Path, workdir: Path, campaign: str, point_ids: list[str],
                     slurm: Slurm, reuse: bool = False) -> tuple[PointHistory, str | None]:
    """Collect the campaign (incremental: a no-op when nothing changed), then read its attempts; with
    *reuse*, also the measured runs of *point_ids* in the other campaigns (as the database has them).
    *slurm* is the command's client: what it was told about the attempts is not asked again by the collect."""
    try:
        stale = runs_to_refresh(db, workdir, campaign, slurm)
        if stale is None or stale:
            collect(db, workdir, campaign, run_ids=stale, slurm=slurm)
    except StoreBusyError as exc:
        raise SubmitError(f"{exc}; nothing was submitted - run submit again once it is free") from None
    return read_history(db, campaign, point_ids, reuse), None


def read_history(db: Path, campaign: str, point_ids: Sequence[str] = (), reuse: bool = False) -> PointHistory:
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


def runs_to_refresh(db: Path, workdir: Path, campaign: str, slurm: Slurm) -> list[str] | None:
    """The runs of *campaign* whose state may have moved since the last collect: attempts in the
    manifest the database lacks, and attempts it has not seen end that the scheduler no longer
    reports queued or running. None: no usable database yet (collect everything)."""
    if not Path(db).is_file():
        return None
    try:
        with open_store(db, read_only=True) as st:
            known = {r["run_id"]: r for r in attempt_rows(st, campaign)}
    except SbenchError:
        return None
    out: list[str] = []
    unsettled: list[tuple[str, AttemptLine]] = []  # run id, attempt line
    for a in manifest.attempts(workdir, campaign, outside=True):
        try:
            rid = run_id(campaign, str(a["point_id"]), int(a.get("repeat") or 0), int(a["attempt"]))
        except (KeyError, TypeError, ValueError):
            continue
        row = known.get(rid)
        if manifest.job_dir_problem(str(a["job_dir"]), workdir / campaign) is not None:
            # Its job dir is not its own: nothing of it is read here, and collect records why.
            if row is None or row.get("outcome") is None:
                out.append(rid)
        elif row is None or row.get("job_id") is None and a.get("job_id"):
            out.append(rid)
        elif row.get("outcome") is None or row.get("state") not in jobstate.FINAL_STATES:
            unsettled.append((rid, a))
    live = live_states([a for _, a in unsettled], slurm) if unsettled else {}
    for rid, a in unsettled:
        word = live.get(str(a.get("job_dir")))
        if word is None or jobstate.lookup(word).phase not in ("pending", "running"):
            out.append(rid)
    # Job dirs of the campaign the manifest does not name (a submit killed between writing them and
    # recording them): collect finds them by their spec.json, so that no attempt number is used twice.
    for spec in (Path(workdir) / campaign).glob("*/spec.json"):
        parsed = parse_job_dir_name(spec.parent.name)
        if parsed is not None:
            rid = run_id(campaign, *parsed)
            if rid not in known and rid not in out:
                out.append(rid)
    return out
