"""``submit --wait`` and ``retry --wait``: wait until every submitted attempt is over, then say what became
of each (ok, invalid or failed, from a collect of those attempts).

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

from harness.collect.ingest import collect
from harness.contract import jobstate
from harness.contract.errors import Interrupted, SbenchError
from harness.contract.paths import resolve_db, resolve_workdir, run_id
from harness.db.status import attempt_rows
from harness.db.store import open_store
from harness.slurm.client import Slurm

from .backends import get_backend, live_states
from .executors import Submitted

OUTCOMES = ("ok", "invalid", "failed")
# An attempt the scheduler reports over may lack its final accounting for a moment (sacct trails
# slurmctld): collect again, this often, before calling an outcome unknown.
SETTLE_TRIES, SETTLE_WAIT_S = 5, 2.0


@dataclass
class WaitSummary:
    """What became of the attempts one submit waited for."""

    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in (*OUTCOMES, "unknown")})
    runs: list[dict[str, Any]] = field(default_factory=list)  # run_id, point_id, repeat, attempt, outcome, ...
    note: str | None = None

    @property
    def all_fine(self) -> bool:
        """No attempt failed, and every outcome is known (exit 0 of ``submit --wait``)."""
        return self.counts["failed"] == 0 and self.counts["unknown"] == 0

    def add(self, other: WaitSummary) -> None:
        """Count *other*'s attempts in this summary too (a later wait of the same command)."""
        for k, v in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + v
        self.runs.extend(other.runs)
        self.note = "; ".join(n for n in (self.note, other.note) if n) or None

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "runs": self.runs, "note": self.note}


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


def _attempt(s: Submitted, campaign: str, executor: str) -> dict[str, Any]:
    return {"campaign": campaign, "point_id": s.spec.point_id, "repeat": s.spec.repeat, "attempt": s.spec.attempt,
            "job_dir": s.spec.job_dir, "job_id": s.job_id, "executor": executor,
            "submitted_at": s.extra.get("submitted_at"), "job_name": s.extra.get("job_name")}


def cancel_command(campaign: str, workdir: Path | None, db: Path | None) -> str:
    """``sbench cancel --campaign X``, with ``--workdir`` / ``--db`` where they are not the defaults."""
    cmd = ["sbench", "cancel", "--campaign", campaign]
    wd, dbp = resolve_workdir(workdir), resolve_db(db)
    if wd != resolve_workdir(None):
        cmd += ["--workdir", str(wd)]
    if dbp != resolve_db(None):
        cmd += ["--db", str(dbp)]
    return shlex.join(cmd)


def still_queued(campaign: str, executor: str, submitted: list[Submitted], workdir: Path | None, db: Path | None,
                 slurm: Slurm) -> str:
    """Which of *submitted* are still queued or running, and the command that cancels them."""
    attempts = [_attempt(s, campaign, executor) for s in submitted]
    live = live_states(attempts, slurm)
    left = [(a, live[a["job_dir"]]) for a in attempts
            if a["job_dir"] in live and jobstate.lookup(live[a["job_dir"]]).phase in ("pending", "running")]
    if not left:
        return "no submitted attempt is still queued or running"
    lines = [f"{len(left)} attempt(s) are still queued or running and go on without this command:"]
    lines += [f"  {a['point_id']} r{a['repeat']} a{a['attempt']}  {state.lower()}  "
              f"{'job ' + str(a['job_id']) if a.get('job_id') else a['job_dir']}" for a, state in left]
    lines.append(f"stop them with: {cancel_command(campaign, workdir, db)}")
    return "\n".join(lines)


def wait_for(campaign: str, executor: str, submitted: list[Submitted], workdir: Path | None = None,
             db: Path | None = None, progress: Callable[[int, int], None] | None = None,
             slurm: Slurm | None = None) -> WaitSummary:
    """Wait for *submitted* (the attempts of one submit), then collect them and count their outcomes."""
    slurm = slurm or Slurm()
    backend = get_backend(executor, slurm)
    try:
        with interruptible():
            backend.wait(submitted, progress)
    except Interrupted as exc:
        raise Interrupted(exc.signum, note=still_queued(campaign, executor, submitted, workdir, db, slurm)) from None
    return summarise(campaign, submitted, workdir, db, slurm)


def summarise(campaign: str, submitted: list[Submitted], workdir: Path | None, db: Path | None,
              slurm: Slurm) -> WaitSummary:
    """Collect the attempts of *submitted*, then each one's outcome and reason as the database has them."""
    wd, dbp = resolve_workdir(workdir), resolve_db(db)
    ids = {run_id(campaign, s.spec.point_id, s.spec.repeat, s.spec.attempt): s for s in submitted}
    out = WaitSummary()
    rows: dict[str, dict[str, Any]] = {}
    try:
        for turn in range(SETTLE_TRIES):
            if turn:
                time.sleep(SETTLE_WAIT_S)
            with interruptible():
                collect(dbp, wd, campaign, run_ids=sorted(ids), slurm=slurm)
            with open_store(dbp, read_only=True) as st:
                rows = {r["run_id"]: r for r in attempt_rows(st, campaign) if r["run_id"] in ids}
            if all(rows.get(rid, {}).get("outcome") in OUTCOMES for rid in ids):
                break
            slurm.forget()  # SLURM's accounting trails its controller: ask afresh
    except SbenchError as exc:
        out.note = (f"the outcomes are not known: {exc}; run 'sbench collect', then "
                    f"'sbench status --campaign {campaign}'")
    except Interrupted as exc:
        raise Interrupted(exc.signum, note="every attempt is over; 'sbench collect' records them") from None
    for rid, s in sorted(ids.items()):
        r = rows.get(rid, {})
        outcome = str(r["outcome"]) if r.get("outcome") in OUTCOMES else "unknown"
        out.counts[outcome] += 1
        out.runs.append({"run_id": rid, "point_id": s.spec.point_id, "repeat": s.spec.repeat,
                         "attempt": s.spec.attempt, "outcome": outcome, "state": r.get("state"),
                         "reason": r.get("reason")})
    return out


__all__ = ["WaitSummary", "cancel_command", "interruptible", "still_queued", "summarise", "wait_for"]
