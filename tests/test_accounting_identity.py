"""Accounting that cannot pick a stranger's job: sacct is asked from the attempt's submit time with every
record (``-S``, ``-D``), and of the records sharing an id the one of the job sbench submitted (its name, its
submit time) wins; a requeued job's latest run wins, wherever sacct lists it.

The answers are recorded sacct text (``sacct -P -n -D --format=<SACCT_FORMAT>``): ``requeue_testcluster.txt``
is the test cluster's answer about a job requeued with ``scontrol requeue``; the others are written in its
shape (a controller whose ids started again, a preemption with requeue, an array task whose id came back).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from harness.campaign.executors.slurm import SlurmBackend
from harness.collect import collect
from harness.slurm.client import Slurm
from harness.slurm.sacct import (
    SACCT_FORMAT,
    SUBMIT_SLACK,
    JobKey,
    parse_sacct,
    parse_sacct_records,
    parse_time,
    pick,
    sacct_argv,
    sacct_time,
)

from .kit import one
from .kit.jobdirs import CAMPAIGN, write_attempt

SACCT = Path(__file__).parent / "fixtures" / "collect" / "sacct"


def text(name: str) -> str:
    return (SACCT / name).read_text()


def key(submitted: str, name: str | None) -> JobKey:
    """What sbench recorded: *submitted* is in sacct's own (local) time, as the recorded answers are."""
    return JobKey(parse_time(submitted), name)


def reversed_records(body: str) -> str:
    """The same records listed in the other order, each job record still followed by its steps."""
    blocks: list[list[str]] = []
    for line in body.splitlines():
        if "." in line.split("|")[0] and blocks:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return "\n".join(line for block in reversed(blocks) for line in block) + "\n"


# -- a reused id ---------------------------------------------------------------------------------------------
OURS_5012 = key("2026-11-20T10:00:03", "sbench.scan.ae86a3e4")


@pytest.mark.parametrize("order", ["listed", "reversed"])
def test_a_reused_id_answers_with_our_job_not_the_stranger_that_had_it_first(order) -> None:
    body = text("reused_id.txt") if order == "listed" else reversed_records(text("reused_id.txt"))
    assert [r.state for r in parse_sacct_records(body)["5012"]] == (
        ["COMPLETED", "FAILED"] if order == "listed" else ["FAILED", "COMPLETED"])
    rec = parse_sacct(body, {"5012": OURS_5012})["5012"]
    assert (rec.state, rec.exit_code, rec.hosts, rec.name) == ("FAILED", 1, ["node2"], "sbench.scan.ae86a3e4")
    # its own steps, not the stranger's (8800M): MaxRSS is the larger of its two steps, 2 GiB
    assert [s.step_id for s in rec.steps] == ["batch", "0"] and rec.max_rss_mb == 2048.0


def test_the_name_alone_and_the_submit_time_alone_each_refuse_the_stranger() -> None:
    recs = parse_sacct_records(reversed_records(text("reused_id.txt")))["5012"]
    assert pick(recs, JobKey(None, "sbench.scan.ae86a3e4")).state == "FAILED"  # the name
    assert pick(recs, key("2026-11-20T10:00:03", None)).state == "FAILED"  # the time
    # a key that is neither job's: nothing, not a stranger's record
    assert pick(recs, key("2026-11-20T10:00:03", "sbench.other.12345678")) is None
    assert pick(recs, key("2026-11-25T00:00:00", "sbench.scan.ae86a3e4")) is None
    # no key (an attempt recorded before sbench kept one): the latest record, as sacct -j alone would give
    assert pick(recs).state == "FAILED"


def test_a_later_job_given_our_id_under_our_name_is_not_ours() -> None:
    """The same campaign made again after the controller's ids started again: its job has our id and our
    name, and was submitted after ours ended. Ours did not end requeued, so the later record is another job."""
    later = ("5012|COMPLETED|0:0|00:05:00||node1|2026-11-24T09:00:05|2026-11-24T09:05:05|2026-11-24T09:00:00|"
             "sbench.scan.ae86a3e4\n")
    for body in (text("reused_id.txt") + later, later + text("reused_id.txt")):
        assert parse_sacct(body, {"5012": OURS_5012})["5012"].state == "FAILED"
        assert parse_sacct(body, {"5012": key("2026-11-24T09:00:01", "sbench.scan.ae86a3e4")})["5012"].state == (
            "COMPLETED")


# -- a requeue after preemption --------------------------------------------------------------------------------
OURS_6100 = key("2026-11-20T10:00:01", "sbench.scan.0badc0de")


@pytest.mark.parametrize("order", ["listed", "reversed"])
def test_a_job_preempted_and_requeued_reads_as_its_last_run(order) -> None:
    body = text("preempt_requeue.txt") if order == "listed" else reversed_records(text("preempt_requeue.txt"))
    assert parse_sacct_records(body)["6100"][0 if order == "listed" else -1].state == "COMPLETED"  # listed first
    for k in (OURS_6100, None):
        rec = parse_sacct(body, {"6100": k} if k else None)["6100"]
        assert (rec.state, rec.hosts, rec.elapsed_s) == ("COMPLETED", ["node2"], 1200.0)
        assert rec.start == parse_time("2026-11-20T11:05:00") and rec.max_rss_mb == 3072.0  # its run's step


def test_the_test_clusters_requeued_job_reads_completed() -> None:
    rec = parse_sacct(text("requeue_testcluster.txt"), {"420": key("2026-11-25T04:43:35", "acctexp.req")})["420"]
    assert (rec.state, rec.elapsed_s, rec.submit) == ("COMPLETED", 4.0, parse_time("2026-11-25T04:43:37"))
    assert rec.max_rss_mb == pytest.approx(3140 / 1024)  # the step of the run that completed, not the requeued one


# -- an array task whose id came back --------------------------------------------------------------------------
def test_array_tasks_with_a_reused_id_read_as_our_array() -> None:
    ours = key("2026-11-20T12:00:01", "sbench.scan.5ca1ab1e")
    got = parse_sacct(text("array_reused.txt"), {j: ours for j in ("7300_2", "7300_3", "7300_4", "7300_5")})
    assert {j: r.state for j, r in got.items()} == {
        "7300_2": "OUT_OF_MEMORY", "7300_3": "RUNNING", "7300_4": "PENDING", "7300_5": "PENDING"}
    assert got["7300_2"].max_rss_mb == 4096.0 and got["7300_4"].ranged and not got["7300_3"].ranged
    # the stranger's array's record of its queued tasks (cancelled in February) is refused by its time
    stranger = key("2026-02-01T08:59:30", "stranger.sweep")
    assert pick(parse_sacct_records(text("array_reused.txt"))["7300_5"][:1], stranger).state == "CANCELLED"
    assert pick(parse_sacct_records(text("array_reused.txt"))["7300_5"][:1], ours) is None


def test_an_array_cancelled_while_pending_reads_cancelled_under_the_name_slurm_gave_it() -> None:
    """The test cluster's record of a held array cancelled with scancel: one record of the array, named
    'allocation', not the name it was submitted under. Its tasks take it (matched on time)."""
    fake = Recorded("678|CANCELLED by 0|0:0|00:00:00||None assigned|2026-11-25T05:19:43|2026-11-25T05:19:43|"
                    "2026-11-25T05:19:43|allocation\n")
    ours = key("2026-11-25T05:19:44", "sbench.held.d601623b")
    jobs, _ = Slurm(fake).accounting(["678_0", "678_1"], {"678_0": ours, "678_1": ours})
    assert {j: r.state for j, r in jobs.items()} == {"678_0": "CANCELLED", "678_1": "CANCELLED"}
    assert [c[2] for c in fake.calls] == ["678_0,678_1", "678"]
    # a stranger's cancelled array from before ours is not taken
    assert Slurm(fake).accounting(["678_0"], {"678_0": key("2026-11-25T09:00:00", None)})[0] == {}


# -- the question ----------------------------------------------------------------------------------------------
class Recorded:
    """sacct answering from recorded text: the lines of the ids asked about (steps with their job)."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[0] != "sacct":
            return subprocess.CompletedProcess(argv, 0, "", "")
        asked = set(argv[argv.index("-j") + 1].split(","))
        lines = [ln for ln in self.body.splitlines() if ln.split("|")[0].split(".")[0] in asked]
        return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")


def test_sacct_is_asked_from_the_submit_time_for_every_record_with_name_and_submit() -> None:
    fake = Recorded(text("reused_id.txt") + text("preempt_requeue.txt"))
    slurm = Slurm(fake, chunk=1)
    jobs, why = slurm.accounting(["5012", "6100"], {"5012": OURS_5012, "6100": OURS_6100})
    assert why is None and {j: r.state for j, r in jobs.items()} == {"5012": "FAILED", "6100": "COMPLETED"}
    # one batch each (chunk=1), each from its own job's submit time less the slack, in sacct's local time
    assert [c[:3] for c in fake.calls] == [["sacct", "-j", "6100"], ["sacct", "-j", "5012"]]
    for call, k in zip(fake.calls, (OURS_6100, OURS_5012)):
        assert "-D" in call and f"--format={SACCT_FORMAT}" in call
        since = call[call.index("-S") + 1]
        assert since == sacct_time(k.submitted - SUBMIT_SLACK)
        assert parse_time(since) == k.submitted - SUBMIT_SLACK
    assert SACCT_FORMAT.endswith("Submit,ConsumedEnergyRaw,JobName")
    # asked once per command: again with the same (or a later) time asks nothing ...
    slurm.accounting(["5012"], {"5012": key("2026-11-21T00:00:00", None)})
    assert len(fake.calls) == 2
    # ... with an earlier one (another attempt that had this id) asks again, from then
    older = key("2026-11-01T00:00:00", "sbench.scan.ae86a3e4")
    slurm.accounting(["5012"], {"5012": older})
    assert len(fake.calls) == 3 and fake.calls[2][fake.calls[2].index("-S") + 1] == sacct_time(older.since)
    # each attempt that had the id takes its own job's record
    assert slurm.record("5012", OURS_5012).state == "FAILED"
    assert slurm.record("5012", key("2026-01-10T08:00:01", "train-llama")).state == "COMPLETED"
    # a batch holding an id with no key is asked since ever (no -S)
    assert "-S" not in sacct_argv(["1"]) and "-S" in sacct_argv(["1"], dt.datetime(2026, 1, 1))


def test_a_job_key_comes_from_what_submit_recorded() -> None:
    k = JobKey.of("2026-11-20T10:00:03+02:00", "sbench.scan.ae86a3e4")
    assert k == JobKey(dt.datetime(2026, 11, 20, 8, 0, 3), "sbench.scan.ae86a3e4")
    assert k.since == dt.datetime(2026, 11, 20, 7, 0, 3)
    assert JobKey.of("not a time", "") == JobKey() and JobKey.of(None, 5) == JobKey()


# -- collect ---------------------------------------------------------------------------------------------------
def test_collect_stores_our_failed_run_not_the_strangers_completed_one(tmp_path) -> None:
    """A run whose id sacct also knows from strangers' jobs, an older one listed last (so "the last record
    wins" would take it) and a newer one (so "the latest record wins" would): collect stores the run's own
    FAILED record, told apart by submitted.json's name and time."""
    wd = tmp_path / "runs"
    run = write_attempt(wd, 1, job_id="5012")
    submitted = {"executor": "slurm", "job_id": "5012", "array_job_id": None, "array_task_id": None,
                 "submitted_at": OURS_5012.submitted.replace(tzinfo=dt.timezone.utc).isoformat(),
                 "job_name": OURS_5012.name}
    Path(run["paths"].root, "submitted.json").write_text(json.dumps(submitted))
    newer = "5012|COMPLETED|0:0|00:01:00||gpu03|2026-11-22T09:00:05|2026-11-22T09:01:05|2026-11-22T09:00:00|eval\n"
    fake = Recorded(newer + reversed_records(text("reused_id.txt")))
    assert parse_sacct(fake.body)["5012"].state == "COMPLETED"  # with no key
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(fake))
    r = one(db, "SELECT campaign, state, node_list, elapsed_s, accounting_source FROM runs")
    assert r == {"campaign": CAMPAIGN, "state": "FAILED", "node_list": "node2", "elapsed_s": 180.0,
                 "accounting_source": "sacct"}
    (call,) = [c for c in fake.calls if c[0] == "sacct"]
    assert call[call.index("-S") + 1] == sacct_time(OURS_5012.since)


def test_status_and_wait_read_our_job_through_the_manifests_name_and_time() -> None:
    """status and cancel pass the manifest's attempt lines, submit --wait what submit returned: both carry
    the job's name and submit time, so a newer stranger with the id (the latest record) is not taken."""
    newer = "5012|RUNNING|0:0|00:01:00||gpu03|2026-11-22T09:00:05|Unknown|2026-11-22T09:00:00|eval\n"
    fake = Recorded(text("reused_id.txt") + newer)
    line = {"job_id": "5012", "executor": "slurm", "job_dir": "/x/p.r0.a1", "job_name": OURS_5012.name,
            "submitted_at": OURS_5012.submitted.replace(tzinfo=dt.timezone.utc).isoformat()}
    assert SlurmBackend(Slurm(fake)).live_states([line]) == {"5012": "FAILED"}
    assert SlurmBackend(Slurm(Recorded(fake.body))).live_states([{**line, "job_name": None,
                                                                  "submitted_at": None}]) == {"5012": "RUNNING"}
