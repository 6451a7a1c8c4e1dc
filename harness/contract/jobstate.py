"""The one job-state model: what every SLURM (and local executor) state means to sbench.

``submit --wait`` (is the attempt over?), ``status`` (pending, running or done?), ``cancel`` (is
there anything to cancel?) and ``collect`` (what outcome does the scheduler dictate, and can the
state still change?) all read this table, so they cannot disagree.

Each state has
- ``phase``: ``pending`` (queued, held, requeued), ``running`` or ``done`` (the attempt no
  longer executes; it may be released or requeued later, see ``final``);
- ``verdict``: ``pending`` (no outcome yet), ``files`` (it ended on its own: the job dir's files
  say ok, invalid or failed) or ``failed`` (the scheduler ended it, for ``reason``);
- ``final``: the state never changes again, so collect need not ask about it twice;
- ``requeue``: SLURM leaves a job's record in it when the job goes back to the queue: a later record with
  the same id and name is the same job run again (``harness.slurm.sacct.pick``).

A preempted job without requeue stays PREEMPTED (failed); with requeue it goes back to PENDING
under the same job id and is the same attempt. SPECIAL_EXIT is a job held for requeue by an
exit-code rule: its execution is over (done, judged by its files) but it may be released.

The local executor (``harness.slurm.localjob``) adds LOST (its process is gone without recording an
end: the files decide) and NOT_STARTED (its queue ended before starting it: failed, and retried as a
new attempt by ``retry`` and ``submit --retry-failed``).

sbench itself adds HELD: an attempt it holds back from SLURM until the submit quota has room
(``harness.slurm.held``); its feeder job submits it later, so it is pending; and SUBMITTED (:data:`INITIAL`):
an attempt handed to its executor that nobody has seen since.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobState:
    name: str
    phase: str  # pending | running | done
    verdict: str  # pending | files | failed
    reason: str | None = None
    final: bool = False
    requeue: bool = False


INITIAL = "SUBMITTED"  # the state of an attempt handed to its executor and not seen since (a new runs row's)
REQUEUE = ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PREEMPTED", "NODE_FAIL")


def _table() -> dict[str, JobState]:
    rows = [JobState(s, "pending", "pending", requeue=s in REQUEUE) for s in (
        "PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", INITIAL,
        "UNKNOWN", "HELD")]
    rows += [JobState(s, "running", "pending") for s in (
        "RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED", "POWER_UP_NODE",
        "UPDATE_DB")]
    rows += [JobState("COMPLETED", "done", "files", final=True), JobState("FAILED", "done", "files", final=True),
             JobState("SPECIAL_EXIT", "done", "files"),
             # LOST: a local job's process is gone without recording an end; GONE: a job that left the
             # scheduler without an accounting record (an array task cancelled while pending leaves none)
             JobState("LOST", "done", "files"), JobState("GONE", "done", "files")]
    # the local executor: the queue that held it ended (signal, SIGKILL, an interrupted submit) before starting
    # it; nothing will start it now, and retry or submit --retry-failed runs it as a new attempt
    rows += [JobState("NOT_STARTED", "done", "failed", "not started: its local queue ended before starting it")]
    rows += [JobState(s, "done", "failed", why, final=s != "PREEMPTED", requeue=s in REQUEUE) for s, why in (
        ("CANCELLED", "cancelled"), ("TIMEOUT", "timeout"), ("NODE_FAIL", "node failure"),
        ("OUT_OF_MEMORY", "host OOM"), ("PREEMPTED", "preempted"), ("BOOT_FAIL", "node boot failure"),
        ("DEADLINE", "deadline reached"), ("REVOKED", "revoked"))]
    return {r.name: r for r in rows}


STATES: dict[str, JobState] = _table()
UNKNOWN = STATES["UNKNOWN"]


def normalise(raw: str | None) -> str:
    """SLURM's text to a state name: ``CANCELLED by 0`` -> ``CANCELLED``, ``COMPLETED+`` ->
    ``COMPLETED``, ``PENDING (Resources)`` -> ``PENDING``; empty -> ``UNKNOWN``."""
    text = (raw or "").strip()
    return text.split()[0].rstrip("+").upper() if text else "UNKNOWN"


def lookup(raw: str | None) -> JobState:
    """The state of *raw*; a name sbench does not know is pending (asked about again, never lost)."""
    name = normalise(raw)
    return STATES.get(name) or JobState(name, "pending", "pending")


# Why a pending job waits, where the wait does not end by itself: the request is over a limit of its partition,
# QOS or association, or asks for what no node has; nothing starts it until its owner cancels it and asks for
# less, or an administrator changes the limit. (Resources, Priority, a full quota, nodes down: those pass.)
STUCK_REASONS: dict[str, str] = {
    "PartitionTimeLimit": "its time limit is above the partition's MaxTime",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows (MinNodes/MaxNodes) or has",
    "PartitionConfig": "it asks for more than the partition's configuration allows (cores, memory, GPUs)",
    "BadConstraints": "its constraints, features or counts match no node",
    "DependencyNeverSatisfied": "the job it depends on ended in a way that never satisfies its dependency",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above its QOS's MaxWall",
    "AssocMaxWallDurationPerJobLimit": "its time limit is above its association's MaxWall",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than its QOS allows a job",
    "AssocMaxNodesPerJobLimit": "it asks for more nodes than its association allows a job",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than its QOS allows a job",
    "AssocMaxCpuPerJobLimit": "it asks for more CPUs than its association allows a job",
    "QOSMaxGRESPerJob": "it asks for more GPUs (GRES) than its QOS allows a job",
    "AssocMaxGRESPerJob": "it asks for more GPUs (GRES) than its association allows a job",
    "QOSMaxMemoryPerJob": "it asks for more memory than its QOS allows a job",
    "AssocMaxMemoryPerJob": "it asks for more memory than its association allows a job",
}


def stuck(raw: str | None) -> tuple[str, str] | None:
    """(SLURM's reason, what it means) when *raw* (``PENDING (PartitionTimeLimit)``, as the queue words a pending
    job) is a wait that does not end by itself; None otherwise."""
    text = (raw or "").strip()
    if normalise(text) != "PENDING" or "(" not in text:
        return None
    reason = text[text.index("(") + 1:].rstrip(")").split(",")[0].strip()
    why = STUCK_REASONS.get(reason)
    return (reason, why) if why else None


def stuck_text(reason: str, why: str) -> str:
    """The words status, submit --wait and collect use for a stuck job."""
    return (f"pending for ever: {reason} ({why}); nothing starts it until it is cancelled (sbench cancel) and "
            "asked again within the limit, or the limit changes")


def waits(raw: str | None) -> bool:
    """Whether a wait for this attempt may still end on its own: pending (but not stuck) or running."""
    return lookup(raw).phase in ("pending", "running") and stuck(raw) is None


def is_done(raw: str | None) -> bool:
    return lookup(raw).phase == "done"


def verdict(raw: str | None) -> tuple[str, str | None]:
    """('pending' | 'failed' | 'files', reason): what the state says about a run's outcome."""
    st = lookup(raw)
    return st.verdict, st.reason


PENDING_STATES = frozenset(n for n, s in STATES.items() if s.verdict == "pending")
FAILURE_STATES = {n: s.reason for n, s in STATES.items() if s.verdict == "failed"}
ENDED_STATES = frozenset(n for n, s in STATES.items() if s.verdict == "files")
FINAL_STATES = frozenset(n for n, s in STATES.items() if s.final)
DONE_STATES = frozenset(n for n, s in STATES.items() if s.phase == "done")
# The states a record of a job is left in when the job goes back to the queue: after any other state, a later
# record with the same id is another job.
REQUEUE_STATES = frozenset(n for n, s in STATES.items() if s.requeue)
# The states in which an attempt that the executor itself answers for (no scheduler record of a job) never ran:
# its local queue (or sbench's feed) ended before starting it, or sbench cancel marked it first.
NEVER_RAN_STATES = frozenset({"NOT_STARTED", "CANCELLED"})
