"""One job-state model: recorded squeue and sacct output gives the same answer in submit --wait, status,
cancel and collect."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.campaign import control
from harness.contract import jobstate
from harness.contract.jobstate import FINAL_STATES
from harness.slurm.client import Slurm
from harness.slurm.sacct import parse_sacct

FIX = Path(__file__).resolve().parent / "fixtures" / "states"
SQUEUE = (FIX / "squeue.txt").read_text()
SACCT = (FIX / "sacct.txt").read_text()
SACCT_FULL = (FIX / "sacct_full.txt").read_text()

# What each recorded job is, as a person reading SLURM's docs would say it.
EXPECTED = {
    "5001": "pending", "5002": "pending", "5003_4": "running", "5004": "pending", "5005": "running",
    "5006": "running", "5007": "pending", "5008": "pending", "5009": "done", "5010": "running", "5011": "running",
    "5012": "pending",
    # pending for a reason that does not pass by itself (over the partition's MaxTime, the association's MaxWall);
    # nodes that are down do come back
    "5013": "stuck", "5014": "pending", "5015": "stuck",
    "6001": "done", "6002": "done", "6003": "done", "6004": "done", "6005": "done", "6006": "done", "6007": "done",
    "6008": "done", "6009": "done", "6010": "done", "6011": "done", "6012": "pending", "6013": "done",
    "6014": "running",
}
# A PENDING accounting record of a job the queue (which answered) does not hold: accounting that has not caught
# up with the controller (a job cancelled while pending); nobody knows it, so status shows it gone
STALE = "6015"
FAILED_BY_SCHEDULER = {"6003": "cancelled", "6004": "timeout", "6005": "node failure", "6006": "host OOM",
                       "6007": "preempted", "6008": "node boot failure", "6009": "deadline reached",
                       "6010": "revoked"}


@pytest.fixture
def recorded():
    """squeue answers for the live 500x jobs, sacct for the ended 600x ones, as on a real cluster."""

    def fake_run(argv):
        if argv[0] == "squeue":  # the whole queue
            return subprocess.CompletedProcess(argv, 0, SQUEUE, "")
        if argv[0] == "sacct":  # JobID and State of each asked job (the other fields empty)
            wanted = set(argv[argv.index("-j") + 1].split(","))
            out = "".join(line + "\n" for line in SACCT.splitlines() if line.split("|")[0] in wanted)
            return subprocess.CompletedProcess(argv, 0, out, "")
        raise AssertionError(argv)

    return Slurm(fake_run).states([*EXPECTED, STALE])


def test_every_recorded_job_is_seen(recorded) -> None:
    assert set(recorded) == set(EXPECTED)  # the stale one left out


@pytest.mark.parametrize("job_id", sorted(EXPECTED))
def test_submit_wait_status_cancel_and_collect_agree(recorded, job_id: str) -> None:
    live = recorded[job_id]
    expected = EXPECTED[job_id]
    # submit --wait: counts an attempt as finished exactly when it is done, and stops waiting for a stuck one
    assert jobstate.is_done(live) == (expected == "done")
    assert jobstate.waits(live) == (expected in ("pending", "running"))
    # status: the phase it shows
    phase = control._phase(live, None)
    if expected == "done":  # the scheduler's ending is shown as soon as it is seen, before a collect
        assert phase == f"{FAILED_BY_SCHEDULER.get(job_id, 'done')} (not collected)"
    else:
        assert phase == expected
    # cancel: only what is pending (stuck too) or running is cancelled
    assert (phase in ("pending", "stuck", "running")) == (expected != "done")
    # collect: an outcome is decided once the attempt is done, not before
    verdict, reason = jobstate.verdict(live)
    assert (verdict != "pending") == (expected == "done")
    if job_id in FAILED_BY_SCHEDULER:
        assert (verdict, reason) == ("failed", FAILED_BY_SCHEDULER[job_id])


def test_collect_reads_the_same_states_from_full_sacct_records() -> None:
    jobs = parse_sacct(SACCT_FULL)
    for job_id, acct in jobs.items():
        verdict, _ = jobstate.verdict(acct.state)
        # (the stale record alone, as collect reads it when the queue does not answer: pending)
        assert (verdict != "pending") == (EXPECTED.get(job_id, "pending") == "done"), job_id
        assert jobstate.is_done(acct.state_raw) == jobstate.is_done(acct.state)
    assert jobs["6003"].state == "CANCELLED" and jobs["6013"].state == "COMPLETED"


def test_states_that_may_still_change_are_asked_about_again() -> None:
    # A preempted job may be requeued, a special exit released: both are done now, but not final.
    assert {"PREEMPTED", "SPECIAL_EXIT", "REQUEUED", "PENDING", "RUNNING"}.isdisjoint(FINAL_STATES)
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "REVOKED"} <= FINAL_STATES
    # A state this sbench has never heard of is treated as still going: asked about again, never lost.
    assert jobstate.lookup("SOMETHING_NEW").phase == "pending" and not jobstate.is_done("SOMETHING_NEW")
