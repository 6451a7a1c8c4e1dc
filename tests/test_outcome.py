"""The outcome rules (collect/outcome.py), one at a time, on hand-made JobFiles: no files, no scheduler."""

from __future__ import annotations

import pytest

from harness.collect.discover import Attempt
from harness.collect.jobdir import JobFiles
from harness.collect.outcome import Sched, decide
from harness.collect.parse import StageLog, StageRow
from harness.slurm.sacct import JobAccounting


def files(hosts=("n1",), *, ok=True, rank0=True, machines=None, **kw) -> JobFiles:
    f = JobFiles(attempt=Attempt("c/p/r0/a0", "c", "p", 0, 0, None), paths=None,
                 num_machines=machines or len(hosts), experiment="finetune_full_benchmark-v1.0.0")
    for h in hosts:
        f.stage_logs[h] = StageLog(host=h, rows=[StageRow(h, None, "train", None, 0, 1, 1.0, 2.0, 1.0, "ok", None)])
        f.results[h] = {"outcome": "ok" if ok else "failed", "exit_code": 0 if ok else 1,
                        **({} if ok else {"reason": "trainer exited 1"})}
    f.rank0 = {"rank": 0} if rank0 else None
    for k, v in kw.items():
        setattr(f, k, v)
    return f


def acct(state: str, hosts: str = "n1", elapsed: float | None = 30.0) -> JobAccounting:
    return JobAccounting("7", state, state, 0, 0, elapsed, hosts, None, None)


def test_every_host_ok_with_rank0_is_ok_and_completed() -> None:
    v = decide(files(("n1", "n2")), Sched("files"), False)
    assert (v.outcome, v.state, v.reasons) == ("ok", "COMPLETED", [])


def test_a_running_job_has_no_outcome_yet() -> None:
    v = decide(files(), Sched("sacct", "RUNNING", acct("RUNNING")), False)
    assert v.outcome is None and v.state == "RUNNING" and not v.over
    assert decide(JobFiles(attempt=files().attempt, paths=None), Sched("files"), False).state == "SUBMITTED"


def test_a_finished_local_run_with_a_live_pid_is_over() -> None:
    v = decide(files(), Sched("executor", "RUNNING"), False)
    assert v.over and v.outcome == "ok" and v.sched.gone


def test_no_rank0_measurements_fails_with_that_reason() -> None:
    v = decide(files(rank0=False), Sched("files"), False)
    assert v.outcome == "failed" and v.reasons == ["no training measurements from rank 0 (no rank.0.json)"]


def test_a_missing_host_fails_and_is_named() -> None:
    f = files(("n1",), machines=2)
    v = decide(f, Sched("sacct", "COMPLETED", acct("COMPLETED", "n[1-2]")), False)
    assert v.outcome == "failed" and "node n2: no stages file (expected hosts n1,n2)" in v.reasons


def test_timeout_is_failed_with_the_elapsed_time() -> None:
    v = decide(files(), Sched("sacct", "TIMEOUT", acct("TIMEOUT", elapsed=3600.0)), False)
    assert v.outcome == "failed" and v.reasons[0] == "timeout after 3600 s" and v.state == "TIMEOUT"


def test_out_of_memory_is_invalid_even_when_the_scheduler_then_failed_the_job() -> None:
    err = {"kind": "invalid", "error_type": "OutOfMemoryError", "message": "CUDA out of memory", "_rank": "0",
           "host": "n1", "stage": "train"}
    v = decide(files(ok=False, errors=[err]), Sched("sacct", "TIMEOUT", acct("TIMEOUT")), False)
    assert v.outcome == "invalid"
    assert v.reasons[0].startswith("GPU out of memory: OutOfMemoryError: CUDA out of memory (rank 0 on n1")
    assert v.reasons[1] == "then timeout after 30 s"


def test_a_cancel_before_the_runners_finished_is_cancelled() -> None:
    f = files(ok=False)
    v = decide(f, Sched("executor", None, gone=True), True)
    assert (v.outcome, v.state, v.reasons[0]) == ("failed", "CANCELLED", "cancelled")
    # ... but a cancel that came after every runner finished ok changes nothing
    assert decide(files(), Sched("executor", None, gone=True), True).outcome == "ok"


def test_a_slurm_job_gone_without_its_accounting_record_is_asked_about_again() -> None:
    from harness.contract.jobstate import FINAL_STATES

    # no file, no record yet: failed for now, but GONE (not final), so the next collect asks sacct again
    nothing = JobFiles(attempt=files().attempt, paths=None)
    v = decide(nothing, Sched("files", None, gone=True), False)
    assert (v.outcome, v.state) == ("failed", "GONE") and "GONE" not in FINAL_STATES
    assert v.reasons  # why it failed, as far as the files tell
    # once the record is there, its state and reason are the run's, and final
    later = decide(nothing, Sched("sacct", "CANCELLED", acct("CANCELLED")), False)
    assert (later.outcome, later.state, later.reasons[0]) == ("failed", "CANCELLED", "cancelled")
    assert "CANCELLED" in FINAL_STATES
    # a run whose hosts all ended ok needs no record: COMPLETED; a local job that is gone is FAILED at once
    assert decide(files(), Sched("files", None, gone=True), False).state == "COMPLETED"
    assert decide(files(ok=False), Sched("files", None, gone=True), False).state == "GONE"
    assert decide(nothing, Sched("executor", None, gone=True), False).state == "FAILED"


def test_a_crashed_stage_of_the_last_restart_is_a_reason_and_earlier_restarts_are_not() -> None:
    f = files(ok=False)
    f.stage_logs["n1"].rows += [StageRow("n1", 0, "model", None, 0, 1, 1.0, None, None, "incomplete", None),
                                StageRow("n1", 0, "dataset", None, 1, 1, 1.0, 2.0, 1.0, "error", "no such file")]
    f.stage_logs["n1"].last_restart = 1
    v = decide(f, Sched("files"), False)
    assert "dataset failed on n1: no such file" in v.reasons
    assert not any("model" in r for r in v.reasons)


def test_stability_needs_every_trial() -> None:
    f = files(experiment="finetune_full_stability-v1.0.0", expected_trials=5,
              trials=[{"trial": i, "outcome": "ok"} for i in range(3)])
    if not f.is_stability:
        pytest.skip("no stability experiment of that id in the catalog")
    v = decide(f, Sched("files"), False)
    assert v.outcome == "failed" and v.reasons == ["stability: 3 of 5 trials recorded"]


def test_a_job_that_wrote_nothing_gives_the_batch_outputs_last_line() -> None:
    f = JobFiles(attempt=files().attempt, paths=None, slurm_tail="slurm-7.out: python: command not found")
    v = decide(f, Sched("sacct", "FAILED", acct("FAILED")), False)
    assert v.outcome == "failed" and v.reasons[-1] == "slurm-7.out: python: command not found"


def test_unreadable_runner_files_are_warnings_of_an_ok_run_and_reasons_of_a_failed_one() -> None:
    ok = decide(files(problems=["rank.1.json: not JSON"]), Sched("files"), False)
    assert ok.outcome == "ok" and ok.warnings == ["rank.1.json: not JSON"]
    bad = decide(files(ok=False, problems=["rank.1.json: not JSON"]), Sched("files"), False)
    assert bad.outcome == "failed" and "rank.1.json: not JSON" in bad.reasons and not bad.warnings


PACK = {"pack": {"index": 1, "size": 3, "job_dirs": ["a", "b", "c"]}}


def test_a_point_of_a_pack_that_ended_is_decided_by_its_files_whatever_the_packs_job_says() -> None:
    # the pack's job still runs the next point, or was cancelled after this point ended: ok stays ok, and the
    # job's times (the pack's) are not this point's
    for state in ("RUNNING", "CANCELLED", "TIMEOUT", "FAILED"):
        v = decide(files(submitted=PACK), Sched("sacct", state, acct(state)), cancel_requested=state == "CANCELLED")
        assert (v.outcome, v.sched.job) == ("ok", None), state
    # a local pack's point sbench cancel marked after it ended
    assert decide(files(submitted=PACK), Sched("executor", "CANCELLED"), True).outcome == "ok"
    # the same files without a pack: the scheduler's failure wins, as for any run
    assert decide(files(), Sched("sacct", "CANCELLED", acct("CANCELLED")), True).outcome == "failed"


def test_a_point_of_a_pack_not_started_is_pending_while_the_pack_runs_and_cancelled_with_it() -> None:
    waiting = JobFiles(attempt=files().attempt, paths=None, num_machines=1, submitted=PACK)
    v = decide(waiting, Sched("sacct", "RUNNING", acct("RUNNING")), False)
    assert (v.outcome, v.state, v.over) == (None, "PENDING", False)
    v = decide(waiting, Sched("sacct", "CANCELLED", acct("CANCELLED")), True)
    assert v.outcome == "failed" and v.state == "CANCELLED"
