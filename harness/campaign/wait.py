"""``submit --wait`` and ``retry --wait``: wait until every attempt of the campaign still queued or running is
over (those this command submitted, and those an earlier command left in flight: a second ``submit --wait``
after Ctrl-C resumes the wait), then say what became of each (ok, invalid or failed, from a collect of those
attempts), and whether the campaign as a whole is done: every point's last attempt ended, none failed
(:func:`campaign_outcome`).

SIGINT or SIGTERM while waiting stops the waiting only: the attempts go on (the local queue runs detached,
SLURM has its own), and :class:`~harness.contract.errors.Interrupted` (exit 130 or 143) lists those still
queued or running with the command that cancels them.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.campaign.executors.base import Submitted
from harness.campaign.executors.pack import scan_skipped
from harness.campaign.executors.registry import get_backend, live_states
from harness.collect.ingest import collect
from harness.contract import jobstate
from harness.contract.errors import Interrupted, SbenchError
from harness.contract.paths import DbRef, resolve_db, resolve_workdir, run_id
from harness.contract.poll import poll_until
from harness.db.status import attempt_rows
from harness.db.store import open_store
from harness.slurm.client import Slurm

from . import manifest

OUTCOMES = ("ok", "invalid", "failed")
NOT_NEEDED = "not needed"  # a count of runs a search's scan did not start (failed by their outcome)
NOT_NEEDED_WHY = "not started by a search's scan"
STUCK = "stuck"  # a wait's count of attempts pending for a reason that does not pass by itself
# An attempt the scheduler reports over may lack its final accounting for a moment (sacct trails
# slurmctld): collect again, this often, before calling an outcome unknown.
SETTLE_TRIES, SETTLE_WAIT_S = 5, 2.0


@dataclass(frozen=True)
class AttemptRef:
    """One attempt to wait for: its point, repeat and attempt, job dir, and the scheduler's handle on it
    (executor, job id; a SLURM pack's fields, the feeder's held-back flag)."""

    point_id: str
    repeat: int
    attempt: int
    job_dir: str
    executor: str
    job_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def live(self) -> dict[str, Any]:
        """The attempt as :func:`harness.campaign.executors.registry.live_states` asks about it."""
        return {**self.extra, "point_id": self.point_id, "repeat": self.repeat, "attempt": self.attempt,
                "job_dir": self.job_dir, "executor": self.executor, "job_id": self.job_id}


def refs(submitted: list[Submitted], executor: str) -> list[AttemptRef]:
    return [AttemptRef(s.spec.point_id, s.spec.repeat, s.spec.attempt, s.spec.job_dir, executor, s.job_id,
                       dict(s.extra)) for s in submitted]


@dataclass
class WaitSummary:
    """What became of the attempts one submit waited for, and of the campaign as a whole."""

    # each outcome, "unknown", and "not needed": a run a search's scan did not start (a failure by its outcome)
    # and "stuck": pending in SLURM's queue for a reason that does not pass by itself (jobstate.stuck)
    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in (*OUTCOMES, "unknown", NOT_NEEDED,
                                                                          STUCK)})
    runs: list[dict[str, Any]] = field(default_factory=list)  # run_id, point_id, repeat, attempt, outcome, ...
    note: str | None = None
    campaign: CampaignOutcome | None = None  # every point's last attempt, once the waiting is over

    @property
    def all_fine(self) -> bool:
        """No attempt failed, every outcome is known, and every point of the campaign has a final outcome that
        is not a failure (exit 0 of ``submit --wait``)."""
        return self.counts["failed"] == 0 and self.counts["unknown"] == 0 and self.counts[STUCK] == 0 and (
            self.campaign is None or self.campaign.done)

    def add(self, other: WaitSummary) -> None:
        """Count *other*'s attempts in this summary too (a later wait of the same command)."""
        for k, v in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + v
        self.runs.extend(other.runs)
        self.note = "; ".join(n for n in (self.note, other.note) if n) or None

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "runs": self.runs, "note": self.note,
                "campaign": self.campaign.to_dict() if self.campaign else None}


@dataclass
class CampaignOutcome:
    """Every run (point and repeat) of a campaign by its last attempt: how many ended ok or invalid, which
    failed, and which have not ended (or whose outcome is not known)."""

    name: str
    ended: dict[str, int] = field(default_factory=lambda: {"ok": 0, "invalid": 0})
    failed: list[dict[str, Any]] = field(default_factory=list)
    open: list[dict[str, Any]] = field(default_factory=list)
    not_needed: list[dict[str, Any]] = field(default_factory=list)  # runs a search's scan did not start

    @property
    def done(self) -> bool:
        return not self.failed and not self.open

    def text(self) -> str:
        n = sum(self.ended.values()) + len(self.failed) + len(self.open) + len(self.not_needed)
        head = (f"campaign {self.name}: {n} run(s) by their last attempt: {self.ended['ok']} ok, "
                f"{self.ended['invalid']} invalid, {len(self.failed)} failed, {len(self.open)} not ended"
                + (f", {len(self.not_needed)} {NOT_NEEDED} ({NOT_NEEDED_WHY})" if self.not_needed
                   else ""))
        if self.failed:
            head += f"; sbench retry {self.name} runs the failed ones again"
        return head

    def to_dict(self) -> dict[str, Any]:
        return {"campaign": self.name, "ended": dict(self.ended), "failed": self.failed, "open": self.open,
                "not_needed": self.not_needed, "done": self.done}


def campaign_outcome(campaign: str, db: DbRef | None) -> CampaignOutcome:
    """The campaign's runs by their last attempt, as the database has them (collect first)."""
    out = CampaignOutcome(campaign)
    last: dict[tuple[str, int], dict[str, Any]] = {}
    with open_store(resolve_db(db), read_only=True) as st:
        for r in attempt_rows(st, campaign):
            key = (str(r["point_id"]), int(r["repeat"]))
            if key not in last or int(r["attempt"]) > int(last[key]["attempt"]):
                last[key] = r
    for (pid, rep), r in sorted(last.items()):
        row = {"run_id": r["run_id"], "point_id": pid, "repeat": rep, "attempt": r["attempt"], "state": r.get("state"),
               "reason": r.get("reason")}
        if r.get("outcome") in ("ok", "invalid"):
            out.ended[str(r["outcome"])] += 1
        elif scan_skipped(r.get("outcome"), r.get("reason")):
            out.not_needed.append(row)
        elif r.get("outcome") == "failed" and (r.get("state") or "") != "GONE":
            out.failed.append(row)
        else:
            out.open.append(row)
    return out


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` (the first one; later ones are ignored while it unwinds)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if not seen:
            seen.append(signum)
            raise Interrupted(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def cancel_command(campaign: str, workdir: Path | None, db: DbRef | None) -> str:
    """``sbench cancel --campaign X``, with ``--workdir`` / ``--db`` where they are not the defaults."""
    cmd = ["sbench", "cancel", "--campaign", campaign]
    wd, dbp = resolve_workdir(workdir), resolve_db(db)
    if wd != resolve_workdir(None):
        cmd += ["--workdir", str(wd)]
    if dbp != resolve_db(None):
        cmd += ["--db", str(dbp)]
    return shlex.join(cmd)


def still_queued(campaign: str, attempts_: list[AttemptRef], workdir: Path | None, db: DbRef | None,
                 slurm: Slurm) -> str:
    """Which of *attempts_* are still queued or running, and the command that cancels them."""
    attempts = [a.live() for a in attempts_]
    live = live_states(attempts, slurm)
    left = [(a, live[a["job_dir"]]) for a in attempts
            if a["job_dir"] in live and jobstate.lookup(live[a["job_dir"]]).phase in ("pending", "running")]
    if not left:
        return "no attempt is still queued or running"
    lines = [f"{len(left)} attempt(s) are still queued or running and go on without this command:"]
    lines += [f"  {a['point_id']} r{a['repeat']} a{a['attempt']}  {state.lower()}  "
              f"{'job ' + str(a['job_id']) if a.get('job_id') else a['job_dir']}" for a, state in left]
    lines.append(f"stop them with: {cancel_command(campaign, workdir, db)}")
    return "\n".join(lines)


def in_flight(campaign: str, workdir: Path | None, slurm: Slurm,
              exclude: frozenset[str] | set[str] = frozenset()) -> list[AttemptRef]:
    """The campaign's attempts the scheduler says are still queued or running (its manifest's newest line of each
    job dir), but those whose job dir is in *exclude*: what an earlier submit, retry or collect left in flight."""
    lines = [a for a in manifest.attempts(resolve_workdir(workdir), campaign) if str(a["job_dir"]) not in exclude]
    live = live_states(lines, slurm)
    out = []
    for a in lines:
        state = live.get(a["job_dir"])
        if state is None or jobstate.lookup(state).phase not in ("pending", "running"):
            continue
        try:
            out.append(AttemptRef(str(a["point_id"]), int(a.get("repeat") or 0), int(a["attempt"]), str(a["job_dir"]),
                                  str(a.get("executor") or "local"),
                                  None if a.get("job_id") is None else str(a["job_id"]),
                                  {k: v for k, v in a.items() if k.startswith("pack_") or k == "held_back"}))
        except (KeyError, TypeError, ValueError):
            continue  # a malformed line: collect says so
    return out


POLL_S = (1.0, 60.0)  # (first, cap) of the pauses for attempts another command submitted (harness.contract.poll)


def wait_refs(attempts: list[AttemptRef], slurm: Slurm, progress: Callable[[int, int], None] | None = None) -> None:
    """Until none of *attempts* is queued or running, asking the scheduler with a growing pause (one question
    for all of them each time)."""
    def over() -> int:
        slurm.forget()
        live = live_states([a.live() for a in attempts], slurm)
        return sum(1 for a in attempts if not jobstate.waits(live.get(a.job_dir) or "NOT_STARTED"))

    poll_until(over, len(attempts), POLL_S, progress)


def wait_for(campaign: str, executor: str, submitted: list[Submitted], workdir: Path | None = None,
             db: DbRef | None = None, progress: Callable[[int, int], None] | None = None,
             slurm: Slurm | None = None, others: list[AttemptRef] | None = None) -> WaitSummary:
    """Wait for *submitted* (the attempts of one submit) and *others* (the campaign's attempts an earlier command
    left in flight), then collect them and count their outcomes."""
    slurm = slurm or Slurm()
    backend = get_backend(executor, slurm)
    others = others or []
    mine = refs(submitted, executor)
    total = len(mine) + len(others)

    def offset(base: int) -> Callable[[int, int], None] | None:
        if progress is None:
            return None
        report = progress
        return lambda done, _n: report(base + done, total)

    try:
        with interruptible():
            if others:
                wait_refs(others, slurm, offset(0))
            if submitted:
                backend.wait(submitted, offset(len(others)))
    except Interrupted as exc:
        raise Interrupted(exc.signum, note=still_queued(campaign, mine + others, workdir, db, slurm)) from None
    return summarise(campaign, mine + others, workdir, db, slurm)


def summarise(campaign: str, attempts: list[AttemptRef], workdir: Path | None, db: DbRef | None,
              slurm: Slurm) -> WaitSummary:
    """Collect *attempts*, then each one's outcome and reason as the database has them."""
    wd, dbp = resolve_workdir(workdir), resolve_db(db)
    ids = {run_id(campaign, a.point_id, a.repeat, a.attempt): a for a in attempts}
    out = WaitSummary()
    rows: dict[str, dict[str, Any]] = {}
    slurm.forget()
    live = live_states([a.live() for a in attempts], slurm)
    stuck = {rid: why for rid, a in ids.items() if (why := jobstate.stuck(live.get(a.job_dir)))}
    try:
        for turn in range(SETTLE_TRIES):
            if turn:
                time.sleep(SETTLE_WAIT_S)
            with interruptible():
                collect(dbp, wd, campaign, run_ids=sorted(ids), slurm=slurm)
            with open_store(dbp, read_only=True) as st:
                rows = {r["run_id"]: r for r in attempt_rows(st, campaign) if r["run_id"] in ids}
            if all(rows.get(rid, {}).get("outcome") in OUTCOMES for rid in ids if rid not in stuck):
                break
            slurm.forget()  # SLURM's accounting trails its controller: ask afresh
    except SbenchError as exc:
        out.note = (f"the outcomes are not known: {exc}; run 'sbench collect', then "
                    f"'sbench status --campaign {campaign}'")
    except Interrupted as exc:
        raise Interrupted(exc.signum, note="every attempt is over; 'sbench collect' records them") from None
    for rid, a in sorted(ids.items()):
        r = rows.get(rid, {})
        outcome = str(r["outcome"]) if r.get("outcome") in OUTCOMES else STUCK if rid in stuck else "unknown"
        reason = jobstate.stuck_text(*stuck[rid]) if outcome == STUCK else r.get("reason")
        out.counts[NOT_NEEDED if scan_skipped(outcome, reason) else outcome] += 1
        out.runs.append({"run_id": rid, "point_id": a.point_id, "repeat": a.repeat, "attempt": a.attempt,
                         "outcome": outcome, "state": r.get("state"), "reason": reason})
    return out


def judge_campaign(summary: WaitSummary, campaign: str, workdir: Path | None, db: DbRef | None,
                   slurm: Slurm) -> WaitSummary:
    """Once the waiting is over: every run of the campaign by its last attempt (a collect of the campaign first,
    so that what ended while nobody waited is read too), in *summary*."""
    try:
        with interruptible():
            collect(resolve_db(db), resolve_workdir(workdir), campaign, slurm=slurm)
        summary.campaign = campaign_outcome(campaign, db)
    except SbenchError as exc:
        summary.note = "; ".join(n for n in (summary.note, f"the campaign's state is not known: {exc}") if n)
        summary.campaign = CampaignOutcome(campaign, open=[{"run_id": None, "reason": str(exc)}])
    return summary


__all__ = ["AttemptRef", "CampaignOutcome", "WaitSummary", "campaign_outcome", "cancel_command", "in_flight",
           "interruptible", "judge_campaign", "refs", "still_queued", "summarise", "wait_for", "wait_refs"]
