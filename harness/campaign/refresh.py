"""A campaign's history brought up to date before a decision: the runs whose state may have moved since the
last collect are collected (incremental: a no-op when nothing changed), then the history is read
(:mod:`harness.campaign.state`). Its own module, so that the readers of a history (``status``, a collect deciding
an adaptive campaign's next repeats) start without the collect layer's refresh and the executors' queues."""

from __future__ import annotations

from pathlib import Path

from harness.campaign.executors.registry import live_states
from harness.collect.ingest import collect
from harness.contract import jobstate
from harness.contract.errors import SbenchError, StoreBusyError, SubmitError
from harness.contract.paths import DbTarget, parse_job_dir_name, run_id
from harness.contract.records import AttemptLine
from harness.db.status import attempt_rows
from harness.db.store import open_store, store_exists
from harness.slurm.client import Slurm

from . import manifest
from .state import PointHistory, read_history


def campaign_history(db: DbTarget, workdir: Path, campaign: str, point_ids: list[str],
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


def runs_to_refresh(db: DbTarget, workdir: Path, campaign: str, slurm: Slurm) -> list[str] | None:
    """The runs of *campaign* whose state may have moved since the last collect: attempts in the
    manifest the database lacks, and attempts it has not seen end that the scheduler no longer
    reports queued or running. None: no usable database yet (collect everything)."""
    if not store_exists(db):
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
