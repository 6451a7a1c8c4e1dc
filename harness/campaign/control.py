"""status and cancel: what the database knows, joined with what the scheduler says right now."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.campaign.executors.feed import feed_notes
from harness.campaign.executors.pack import scan_skipped
from harness.campaign.executors.registry import get_backend, live_states
from harness.contract import jobstate
from harness.contract.errors import InputError
from harness.contract.paths import CampaignPaths, DbRef, DbTarget, resolve_db, resolve_workdir
from harness.contract.records import AttemptLine, CancelLine, ManifestLine, append_manifest, now_iso
from harness.db.search import never_run
from harness.db.status import job_dirs, status_rows
from harness.db.store import open_store, store_exists
from harness.slurm.client import Slurm
from harness.spec.sweep import AdaptiveRepeats

from . import manifest
from .lock import CampaignLocks, holding_campaign_locks
from .prepare import failed_prepare_jobs
from .repeats import RepeatsVerdict, verdict
from .state import refuse_imported


def _defaults(workdir: Path | None, db: DbRef | None) -> tuple[Path, DbTarget]:
    return resolve_workdir(workdir), resolve_db(db)


@dataclass
class StatusReport:
    rows: list[dict[str, Any]]
    counts: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    # campaign -> its points' adaptive-repeats verdicts (repeats: {min, max, cv}; harness.campaign.repeats)
    repeats: dict[str, list[RepeatsVerdict]] = field(default_factory=dict)


NOT_RUN_BY_SEARCH = "not run (search)"  # a search campaign's grid point it never ran: its decision says why
NOT_NEEDED_BY_SEARCH = "not needed (search)"  # a run its search's scan did not start (after its shape's OOM)


def status(workdir: Path | None = None, db: DbRef | None = None, campaign: str | None = None,
           slurm: Slurm | None = None) -> StatusReport:
    wd, dbp = _defaults(workdir, db)
    refuse_imported(dbp, campaign, "status")
    slurm = slurm or Slurm()
    rows: list[dict[str, Any]] = []
    note = None
    recorded: set[str] = set()
    if store_exists(dbp) or (isinstance(dbp, Path) and dbp.exists()):  # what is there but no file is refused by open
        with open_store(dbp, read_only=True) as st:
            rows = status_rows(st, campaign)
            recorded = job_dirs(st, campaign)
            # a search's grid points it never ran (decided against, or not reached yet): listed as such
            listed = {(r.get("campaign"), r.get("point_id")) for r in rows}
            rows += [{"campaign": u["campaign"], "point_id": u["point_id"], "repeat": 0, "last_attempt": None,
                      "job_id": None, "state": None, "outcome": None, "job_dir": None, "valid": True,
                      "search_never_ran": True,
                      "reason": f"{u['action']}: {u['reason']}" if u["reason"] else "not reached by the search yet"}
                     for u in never_run(st, campaign) if (u["campaign"], u["point_id"]) not in listed]
    else:
        note = f"no results database at {dbp} yet; showing the campaign manifests"
    problems: list[str] = []
    attempts = manifest.attempts(wd, campaign, problems)
    by_dir = {a["job_dir"]: a for a in attempts}
    # Every attempt the DB has (earlier attempts too, not only each point's latest) is collected.
    known = recorded | {r.get("job_dir") for r in rows if r.get("job_dir")}
    # Attempts the DB has not seen yet (submitted while it was busy, or no DB): from the manifest.
    for a in attempts:
        if a["job_dir"] not in known:
            rows.append({"campaign": a.get("campaign"), "point_id": a.get("point_id"), "repeat": a.get("repeat"),
                         "last_attempt": a.get("attempt"), "job_id": a.get("job_id"), "state": jobstate.INITIAL,
                         "outcome": None, "reason": "not collected yet", "job_dir": a["job_dir"], "valid": True})
    pending: list[Mapping[str, Any]] = [
        by_dir.get(r["job_dir"]) or {"job_dir": r["job_dir"], "job_id": r.get("job_id"), "executor": _executor_of(r)}
        for r in rows if r.get("job_dir") and r.get("outcome") is None]
    live = live_states([p for p in pending if p.get("executor")], slurm)
    if campaign and not rows:
        raise InputError(f"no campaign {campaign!r} in {dbp} or under {wd}")
    cancelled = manifest.cancelled_dirs(wd, campaign) if any(v == "GONE" for v in live.values()) else set()
    counts: dict[str, int] = {}
    for r in rows:
        if scan_skipped(r.get("outcome"), r.get("reason")):
            phase = NOT_NEEDED_BY_SEARCH
        elif r.get("outcome"):
            phase = r["outcome"]
        elif r.get("search_never_ran"):
            phase = NOT_RUN_BY_SEARCH
        elif not r.get("job_dir"):
            phase = "invalid (not run)" if r.get("valid") is False else "not submitted"
        else:
            ls = live.get(r["job_dir"])
            if ls == "GONE":
                # It left the scheduler without a record: after sbench cancel, that is the cancel (what collect
                # records too); otherwise say what is known.
                if r["job_dir"] in cancelled:
                    ls = "CANCELLED"
                elif not r.get("reason") or r.get("reason") == "not collected yet":
                    r["reason"] = GONE_REASON
            r["live_state"] = ls
            phase = _phase(ls, r.get("state"))
            why = jobstate.stuck(ls)
            if why:
                r["reason"] = jobstate.stuck_text(*why)
        r["phase"] = phase
        counts[phase] = counts.get(phase, 0) + 1
    rows.sort(key=lambda r: (str(r.get("campaign")), str(r.get("point_id")), r.get("repeat") or 0))
    failed = failed_prepare_jobs(wd, campaign, slurm) + feed_notes(wd, campaign, slurm) + problems
    if failed:
        note = "; ".join(([note] if note else []) + failed)
    return StatusReport(rows, counts, note, repeats_of(wd, rows))


def repeats_of(workdir: Path, rows: list[dict[str, Any]]) -> dict[str, list[RepeatsVerdict]]:
    """Each adaptive campaign's points, as its status *rows* have them: repeats with an attempt, those still
    queued or running, and the point's measured repeats and CV."""
    out: dict[str, list[RepeatsVerdict]] = {}
    for camp in sorted({str(r.get("campaign")) for r in rows}):
        spec = manifest.adaptive_repeats(workdir / camp)
        if spec is None:
            continue
        adaptive = AdaptiveRepeats(int(spec["min"]), int(spec["max"]), float(spec["cv"]))
        points: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r.get("campaign") == camp and r.get("valid") is not False:
                points.setdefault(str(r.get("point_id")), []).append(r)
        out[camp] = [verdict(adaptive, pid, {int(r.get("repeat") or 0) for r in prs if r.get("job_dir")},
                             sum(1 for r in prs if r.get("job_dir") and not r.get("outcome")),
                             max(int(r.get("repeats_measured") or 0) for r in prs),
                             next((r["throughput_cv"] for r in prs if r.get("throughput_cv") is not None), None))
                     for pid, prs in points.items()]
    return out


def _executor_of(row: dict[str, Any]) -> str | None:
    jid = str(row.get("job_id") or "")
    return "slurm" if jid and jid.replace("_", "").isdigit() else None


GONE_REASON = ("left the queue without an accounting record (a pending array task cancelled with scancel "
               "leaves none)")


def _phase(live: str | None, db_state: str | None) -> str:
    """pending / running / done (not collected), from the scheduler's live word (harness.contract.jobstate); an
    attempt the scheduler ended says how (``cancelled (not collected)``, ``timeout (not collected)``): its
    outcome is known before a collect reads its files. A local attempt its queue never started is ``not
    started`` (retry or submit --retry-failed runs it)."""
    if live == "NOT_STARTED":
        return "not started"
    if live == "HELD":
        return "held"  # sbench holds it back until the submit quota has room (harness.campaign.executors.feed)
    if live:
        st = jobstate.lookup(live)
        if jobstate.stuck(live):
            return "stuck"  # pending, for a reason that does not pass by itself (jobstate.STUCK_REASONS)
        if st.name in ("GONE", "LOST"):
            return "gone (not collected)"
        if st.phase == "done":
            return f"{st.reason} (not collected)" if st.verdict == "failed" and st.reason else "done (not collected)"
        return st.phase
    return (db_state or "submitted").lower()


@holding_campaign_locks("cancel")
def cancel(locks: CampaignLocks, workdir: Path | None = None, db: DbRef | None = None, campaign: str | None = None,
           slurm: Slurm | None = None, warnings: list[str] | None = None) -> list[str]:
    """Cancel every attempt still queued or running (all campaigns, or one), and every local attempt its
    queue left not started; returns what was cancelled. Holds each campaign's lock (``harness.campaign.lock``),
    so an attempt a submit is starting right now is cancelled too, not missed. A manifest or job dir that
    was not read is a line of *warnings*."""
    wd, dbp = _defaults(workdir, db)
    refuse_imported(dbp, campaign, "cancel")
    slurm = slurm or Slurm()
    for cdir in CampaignPaths.listed(wd, campaign, submitted=campaign is None):
        locks.acquire(cdir.root)
    attempts = manifest.attempts(wd, campaign, warnings if warnings is not None else [])
    if campaign and not attempts and not (wd / campaign).exists():
        raise InputError(f"no campaign {campaign!r} under {wd}")
    live = live_states(attempts, slurm)
    active = [a for a in attempts if _phase(live.get(a["job_dir"]), None) in ("pending", "stuck", "running",
                                                                              "not started")
              or (a.get("executor") == "local" and live.get(a["job_dir"]) in ("PENDING", "RUNNING"))]
    done: list[str] = []
    for executor in ("slurm", "local"):
        group = [a for a in active if a.get("executor") == executor]
        if group:
            done += get_backend(executor, slurm).cancel(group)
    by_campaign: dict[str, list[AttemptLine]] = {}
    for a in active:
        by_campaign.setdefault(a["campaign"], []).append(a)
    events: list[ManifestLine] = []
    for camp, group in by_campaign.items():
        events += append_manifest(CampaignPaths.of(wd, camp), [CancelLine(
            type="cancel", campaign=camp, job_ids=[str(a["job_id"]) for a in group if a.get("job_id")],
            job_dirs=[str(a["job_dir"]) for a in group], at=now_iso())])

    manifest.record_events(dbp, events)
    return done
