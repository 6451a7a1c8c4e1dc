"""A run's outcome and state, decided from its files and the scheduler's record.

:func:`decide` is a pure function of a :class:`~.jobdir.JobFiles` and a :class:`Sched` (it reads no
file and asks no scheduler), so each rule can be tested on its own. The rules, in order:

1. Not over (the scheduler says pending/running, or neither a result, a cancel nor the executor's word
   says it ended): no outcome yet; state RUNNING once a host wrote a file, else SUBMITTED.
2. The stability experiment: ok when every trial was recorded and every host has its result.
3. GPU out of memory (an ``invalid`` error file, or a host result ``invalid``): outcome ``invalid``,
   a measurement of the point (is_valid = false), even if the scheduler then failed the job.
4. The scheduler failed the job (FAILED, TIMEOUT, NODE_FAIL, CANCELLED, ...), or a local cancel came in
   before the runners finished: ``failed`` with the scheduler's reason.
5. A point of a pack: its own files decide once its node runners wrote their results (the pack's job goes
   on with the next point); the job's state counts only for a point it ended before its runners did.
6. ``ok`` needs every expected host's result with outcome ok, no error file, rank 0's measurements and
   no missing file; anything else is ``failed``, with every reason found (errors, crashed stages,
   missing files, the batch output's last line when no runner file exists, unreadable files).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.contract import jobstate
from harness.slurm.sacct import JobAccounting

from .jobdir import JobFiles, first_line


@dataclass
class Sched:
    """What the scheduler (or the executor) knows about one job."""

    source: str  # sacct | executor | files
    state: str | None = None  # None: the files decide
    job: JobAccounting | None = None
    gone: bool = False  # the executor/queue no longer knows the job: it is over
    note: str | None = None  # the executor's own word on why (a local job its queue never started)


@dataclass
class Verdict:
    outcome: str | None  # ok | failed | invalid; None while the run is not over
    state: str | None
    over: bool
    sched: Sched  # the record the verdict used (a finished local run's live pid is ignored)
    hosts_expected: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _crashes(f: JobFiles) -> list[str]:
    """Stages of the last restart that ended in error, were killed, or never ended."""
    out: list[str] = []
    for h, log in sorted(f.stage_logs.items()):
        seen: set[str] = set()
        for row in log.rows:
            if row.restart != log.last_restart or row.stage in seen:
                continue
            if row.status == "incomplete":
                seen.add(row.stage)
                out.append(f"crashed during {row.stage} on {h}: start without end")
            elif row.status in ("error", "killed"):
                seen.add(row.stage)
                out.append(f"{row.stage} {'failed' if row.status == 'error' else 'killed'} on {h}"
                           + (f": {first_line(row.error)}" if row.error else ""))
    return out


def error_text(e: Mapping[str, object]) -> str:
    where = f"rank {e.get('rank', e['_rank'])} on {e.get('host') or '?'}"
    if e.get("stage"):
        where += f" during {e['stage']}"
    return f"{e.get('error_type') or 'error'}: {first_line(e.get('message'))} ({where})"


def _missing(f: JobFiles, hosts_expected: list[str], over: bool) -> list[str]:
    out: list[str] = []
    exp_text = ",".join(hosts_expected)
    for h in hosts_expected:
        if h not in f.stage_logs:
            out.append(f"node {h}: no stages file (expected hosts {exp_text})")
        elif h not in f.results:
            out.append(f"node {h}: no result file")
    seen = f.hosts_all
    if not hosts_expected and len(seen) < f.num_machines and over:
        plural = "s" if f.num_machines != 1 else ""
        out.append(f"expected {f.num_machines} host{plural}, found files from {len(seen)}"
                   f" ({', '.join(sorted(seen)) or 'none'})")
    return out


def _scheduler_failure(f: JobFiles, sched: Sched, cancel_requested: bool,
                       hosts_expected: list[str]) -> tuple[str | None, str | None]:
    """(why the scheduler, or a cancel, ended the run; the state that implies) or (None, None)."""
    if sched.state is not None:
        verdict, why = jobstate.verdict(sched.state)
        if verdict != "failed":
            return None, None
        if sched.state in jobstate.NEVER_RAN_STATES and sched.source == "executor" and sched.job is None:
            # a local job that never started: cancelled (sbench cancel) or stranded by its queue
            if cancel_requested or sched.state == "CANCELLED":
                return "cancelled before it started", "CANCELLED"
            return sched.note or why, None
        if sched.job and sched.job.elapsed_s is not None and sched.state == "TIMEOUT":
            why = f"timeout after {sched.job.elapsed_s:g} s"
        return why, None
    finished_ok = bool(f.results) and len(f.results) >= max(1, len(hosts_expected) or f.num_machines) and \
        all(r.get("outcome") == "ok" for r in f.results.values())
    if cancel_requested and not finished_ok:
        return "cancelled", "CANCELLED"  # a cancel that arrived in time: the runners stopped on its signal
    return None, None


def packed(f: JobFiles, sched: Sched) -> Sched:
    """A point of a pack (``slurm.pack``: ``pack`` in its ``submitted.json``) shares its job with the pack's
    other points: a point whose every node runner wrote its result is over, decided by its files, whatever
    the job (still running the next point, or cancelled later) says. On SLURM the job's times are the pack's,
    not the point's, so they are left to the files, and a point not started while the pack runs is pending."""
    if not f.submitted.get("pack"):
        return sched
    if f.results and len(f.results) >= max(1, f.num_machines):
        return Sched("files")
    if sched.source != "sacct":
        return sched
    if sched.state is not None and jobstate.lookup(sched.state).phase == "running" and not f.hosts_all:
        return Sched(sched.source, "PENDING")
    if sched.state is not None and jobstate.is_done(sched.state) and not f.hosts_all and \
            f.submitted.get("cancelled_at"):
        return Sched("executor", "CANCELLED")  # sbench cancel marked it: the pack never started it
    if sched.state is not None and jobstate.is_done(sched.state) and not f.hosts_all and \
            f.submitted.get("not_started_at"):
        # the pack left it out (a search's scan after a smaller batch's OOM): never started, and why
        return Sched("executor", "NOT_STARTED", note=f.submitted.get("not_started_reason"))
    return Sched(sched.source, sched.state, gone=sched.gone, note=sched.note)


def decide(f: JobFiles, sched: Sched, cancel_requested: bool) -> Verdict:
    """The outcome rules of the module docstring."""
    hosts_all = f.hosts_all
    sched = packed(f, sched)
    if sched.source == "executor" and sched.job is None and sched.state == "RUNNING" and \
            len(f.results) >= f.num_machines:
        # Every node runner wrote its result: over, even if a (local) process id is still alive
        # (tearing down, or reused by another process).
        sched = Sched("executor", None, gone=True)
    sched_hosts = sched.job.hosts if sched.job else []
    hosts_expected = sched_hosts or (sorted(hosts_all) if len(hosts_all) == f.num_machines else [])
    if sched.state is not None:
        over = jobstate.verdict(sched.state)[0] != "pending"
    else:
        over = bool(f.results) or cancel_requested or sched.gone
    v = Verdict(outcome=None, state=sched.state, over=over, sched=sched, hosts_expected=hosts_expected,
                warnings=list(f.warnings))
    extra = sorted(hosts_all - set(hosts_expected)) if sched_hosts else []
    if extra:
        v.warnings.append(f"files from hosts outside the allocation ({sched.job.node_list if sched.job else ''}): "
                          f"{', '.join(extra)}")
    if not over:
        if v.state is None:
            v.state = "RUNNING" if hosts_all else jobstate.INITIAL
        v.warnings += f.problems
        return v
    missing = _missing(f, hosts_expected, over)
    invalid_errs = [e for e in f.errors if e.get("kind") == "invalid"]
    failed_errs = [e for e in f.errors if e.get("kind") != "invalid"]
    sched_fail, implied_state = _scheduler_failure(f, sched, cancel_requested, hosts_expected)
    if implied_state:
        v.state = implied_state
    results = f.results
    host_fail = [f"node {h}: {r.get('reason')}" for h, r in sorted(results.items())
                 if r.get("outcome") == "failed" and r.get("reason")]
    host_invalid = [f"node {h}: {r.get('reason')}" for h, r in sorted(results.items())
                    if r.get("outcome") == "invalid"]
    all_results = bool(results) and all(h in results for h in (hosts_expected or results)) and \
        len(results) >= f.num_machines
    reasons = v.reasons
    if f.is_stability and not sched_fail:
        if len(f.trials) >= f.expected_trials and all_results:
            v.outcome = "ok"
        else:
            v.outcome = "failed"
            reasons.append(f"stability: {len(f.trials)} of {f.expected_trials} trials recorded")
    elif invalid_errs or (host_invalid and not sched_fail):
        v.outcome = "invalid"
        reasons += [f"GPU out of memory: {error_text(e)}" for e in invalid_errs] or host_invalid
        if sched_fail:
            reasons.append(f"then {sched_fail}")
    elif sched_fail:
        v.outcome = "failed"
        reasons.append(sched_fail)
    elif all_results and all(r.get("outcome") == "ok" for r in results.values()) and not failed_errs \
            and f.rank0 is not None and not missing:
        v.outcome = "ok"
    else:
        v.outcome = "failed"
    # A local job that never started: its one reason says why, and no file is missing.
    never_started = bool(sched_fail) and not hosts_all and not f.errors and sched.source == "executor" and \
        sched.state in jobstate.NEVER_RAN_STATES and sched.job is None
    if v.outcome != "ok" and not never_started:
        reasons += [error_text(e) for e in failed_errs]
        reasons += [r for r in host_fail if r not in reasons]
        if not hosts_all and f.killed_by:  # a signal stopped the launch before its node runner wrote a file
            how = "cancelled" if f.killed_by in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) else "killed"
            reasons.append(f"{how} by signal {f.killed_by} ({_signame(f.killed_by)}) before its node runner started")
        else:
            reasons += _crashes(f) + missing
        if v.outcome == "failed" and f.rank0 is None and not reasons and all_results:
            reasons.append("no training measurements from rank 0 (no rank.0.json)")
        if v.outcome == "failed" and not reasons:
            job = sched.job
            if job and job.exit_code:
                reasons.append(f"job exited with code {job.exit_code}:{job.exit_signal or 0}")
            elif sched.gone and not hosts_all:
                reasons.append("the job left the queue without writing any file")
            else:
                reasons.append("no result from the runner")
        if v.outcome == "failed" and not hosts_all and f.slurm_tail:
            reasons.append(f.slurm_tail)
        reasons += f.problems
    else:
        v.warnings += f.problems
    if v.state is None:
        codes = [r.get("exit_code") for r in results.values()]
        completed = all_results and all(c in (0, None) for c in codes)
        if f.killed_by:
            v.state = "FAILED"
        elif sched.gone and sched.source == "files" and not completed:
            # SLURM's queue no longer has the job and its accounting has no record of it yet (slurmdbd trails
            # slurmctld; a job cancelled while pending gets its record late): GONE, which is not final, so the
            # next collect asks again and takes the record's state (CANCELLED, TIMEOUT, NODE_FAIL, ...) and
            # reason once it is there
            v.state = "GONE"
        elif sched.gone and not hosts_all:
            v.state = "FAILED"
        else:
            v.state = "COMPLETED" if completed else "FAILED"
    return v
