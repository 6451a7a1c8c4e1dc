"""The one scheduler client: within one command each question to SLURM is asked at most once.

With a fake command runner: what the client remembers, and how a waiting loop asks again. On the
test cluster: logging shims for every SLURM command first on PATH, and each of ``sbench submit``,
``status``, ``cancel`` and ``collect`` run as a user runs it; no command asks a question twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from harness.campaign.executors import slurm as slurm_backend
from harness.campaign.executors.base import Submitted
from harness.contract import poll
from harness.slurm.client import Slurm

from .kit import ROOT, TEST_INVENTORY, command

SACCT_LINE = "{}|{}|0:0|00:01:00||node1|2026-11-22T00:00:00|2026-11-22T00:01:00"


class Recorder:
    """A fake SLURM: the queue and sacct answer from dicts (changeable between questions); every argv is kept."""

    def __init__(self, queue: dict[str, str] | None = None, acct: dict[str, str] | None = None) -> None:
        self.queue = dict(queue or {})
        self.acct = dict(acct or {})
        self.arrays = False
        self.unran: set[str] = set()  # ids whose records name no node (cancelled before they ran)
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[0] == "squeue":
            out = "".join(f"{j}|{s}|{'Resources' if s == 'PENDING' else 'None'}|\n" for j, s in self.queue.items())
        elif argv[0] == "sacct":
            ids = argv[argv.index("-j") + 1].split(",")
            # a question about an array (when self.arrays) returns every record of it, as sacct does
            node = {j: "|None assigned|" if j in self.unran else "|node1|" for j in self.acct}
            out = "".join(SACCT_LINE.format(j, s).replace("|node1|", node[j]) + "\n" for j, s in self.acct.items()
                          if j in ids or self.arrays and j.split("_")[0] in ids)
        elif argv[0] == "sinfo":
            out = "node[1-2]|96|1000000|(null)\n"
        else:
            out = ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    def asked(self, cmd: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == cmd]


def test_each_question_is_asked_once() -> None:
    fake = Recorder(queue={"10": "PENDING", "11_0": "RUNNING"}, acct={"12": "COMPLETED", "13": "CANCELLED by 0"})
    slurm = Slurm(fake)
    assert slurm.states(["10", "11_0", "12"]) == {"10": "PENDING (Resources)", "11_0": "RUNNING", "12": "COMPLETED"}
    # the queue is asked once; sacct only about the id the queue does not hold
    assert len(fake.asked("squeue")) == 1 and [c[2] for c in fake.asked("sacct")] == ["12"]
    # a second view (collect after submit's refresh) asks sacct only about the ids not asked yet
    acct, why = slurm.accounting(["12", "13", "14"])
    assert why is None and sorted(acct) == ["12", "13"] and acct["13"].state == "CANCELLED"
    assert [c[2] for c in fake.asked("sacct")] == ["12", "13,14"]
    assert slurm.states(["10", "12", "13", "14"]) == {"10": "PENDING (Resources)", "12": "COMPLETED",
                                                       "13": "CANCELLED"}
    assert slurm.queue() is slurm.queue() and len(fake.asked("squeue")) == 1 and len(fake.asked("sacct")) == 2
    # a partition's nodes: once per partition
    assert slurm.partition_nodes("cpu") == slurm.partition_nodes("cpu")
    slurm.partition_nodes("gpu")
    assert [c[4] for c in fake.asked("sinfo")] == ["cpu", "gpu"]
    # forget(): the next question about jobs goes to SLURM again; the partitions' nodes do not move with them
    slurm.forget()
    slurm.states(["12"])
    slurm.partition_nodes("cpu")
    assert len(fake.asked("squeue")) == 2 and [c[2] for c in fake.asked("sacct")] == ["12", "13,14", "12"]
    assert len(fake.asked("sinfo")) == 2


def test_array_tasks_cancelled_while_pending_read_cancelled() -> None:
    """sacct keeps an array's tasks that never left the queue as one record of the array, which only a
    question about the array returns: each such task takes it; a task's own record wins over it."""
    fake = Recorder(acct={"40_0": "COMPLETED", "40_[0-3]": "CANCELLED by 0", "41": "CANCELLED by 0"})
    fake.arrays, fake.unran = True, {"40_[0-3]", "41"}
    slurm = Slurm(fake)
    assert slurm.states(["40_0", "40_2", "41_0", "41_1", "42_0"]) == {
        "40_0": "COMPLETED", "40_2": "CANCELLED", "41_0": "CANCELLED", "41_1": "CANCELLED"}
    # the tasks, then once the arrays of those sacct had no record of
    assert [c[2] for c in fake.asked("sacct")] == ["40_0,40_2,41_0,41_1,42_0", "40,41,42"]
    acct, _ = slurm.accounting(["40_3", "41_1"])
    assert {j: a.state for j, a in acct.items()} == {"40_3": "CANCELLED", "41_1": "CANCELLED"}
    assert [c[2] for c in fake.asked("sacct")][2:] == ["40_3"]  # only the new id; no array asked twice


def test_status_reads_a_task_slurm_forgot(tmp_path: Path, monkeypatch) -> None:
    """A task neither the queue nor sacct knows (both answered) left the scheduler without a record: status
    shows it gone, or cancelled when sbench cancel asked for it (as collect will record it); nothing is
    shown as SUBMITTED. When sacct cannot answer, nothing is inferred."""
    from harness.campaign import control
    from harness.campaign.executors import registry as backends
    from harness.contract.paths import CampaignPaths
    from harness.contract.records import append_manifest

    monkeypatch.setattr(backends.shutil, "which", lambda name: f"/usr/bin/{name}")
    wd = tmp_path / "runs"
    dirs = [str(wd / "c" / f"{i:016x}.r0.a1") for i in range(3)]
    camp = CampaignPaths(wd / "c")
    append_manifest(camp, [{"type": "attempt", "campaign": "c", "point_id": f"{i:016x}", "repeat": 0, "attempt": 1,
                            "job_dir": d, "executor": "slurm", "job_id": f"50_{i}"} for i, d in enumerate(dirs)])
    append_manifest(camp, [{"type": "cancel", "campaign": "c", "job_ids": ["50_1"], "job_dirs": [dirs[1]]}])
    fake = Recorder(queue={"50_2": "PENDING"})
    rep = control.status(wd, tmp_path / "none.duckdb", "c", slurm=Slurm(fake))
    got = {r["job_dir"]: (r["phase"], r["live_state"]) for r in rep.rows}
    assert got == {dirs[0]: ("gone (not collected)", "GONE"), dirs[1]: ("cancelled (not collected)", "CANCELLED"),
                   dirs[2]: ("pending", "PENDING (Resources)")}
    assert rep.counts == {"gone (not collected)": 1, "cancelled (not collected)": 1, "pending": 1}
    assert "without an accounting record" in next(r["reason"] for r in rep.rows if r["job_dir"] == dirs[0])

    def no_sacct(argv):
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 1, "", "sacct: error: accounting storage is disabled\n")
        return fake(argv)

    rep = control.status(wd, tmp_path / "none.duckdb", "c", slurm=Slurm(no_sacct))
    assert [r["phase"] for r in rep.rows] == ["submitted", "submitted", "pending"]


def test_a_pending_record_of_a_job_the_queue_no_longer_holds_is_stale() -> None:
    # An array task cancelled while pending: the queue that answered no longer lists it, and accounting still
    # has its array's pending record. It is not pending; nobody knows it (status: gone), and a finished
    # record is taken as it is.
    fake = Recorder(queue={"60_1": "PENDING"}, acct={"60_0": "PENDING", "61": "COMPLETED"})
    slurm = Slurm(fake)
    assert slurm.states(["60_0", "60_1", "61"]) == {"60_1": "PENDING (Resources)", "61": "COMPLETED"}
    assert slurm_backend.SlurmBackend(slurm).live_states([{"job_id": "60_0"}, {"job_id": "61"}]) == {
        "60_0": "GONE", "61": "COMPLETED"}
    # a queue that did not answer leaves accounting's word standing
    down = Slurm(lambda argv: subprocess.CompletedProcess(argv, 1, "", "timeout") if argv[0] == "squeue"
                 else fake(argv))
    assert down.states(["60_0"]) == {"60_0": "PENDING"}


def test_an_array_task_never_takes_the_record_of_the_task_that_ran_as_the_array() -> None:
    # A loaded slurmdbd: task 0 (its own job id 81) has no record yet, and the array's record (80, the job that
    # ran as task 1 on node2) does not name its task yet. Task 0 must not read node2's run as its own; a
    # cancelled pending array's record (no node) still speaks for its tasks.
    lines = {"80": "80|COMPLETED|0:0|00:00:01||node2|2026-11-22T00:00:00|2026-11-22T00:00:01|2026-11-22T00:00:00|",
             "90": "90|CANCELLED by 0|0:0|00:00:00||None assigned|Unknown|2026-11-22T00:00:01|"
                   "2026-11-22T00:00:00|"}

    def run(argv):
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, "", "")
        ids = argv[argv.index("-j") + 1].split(",")
        return subprocess.CompletedProcess(argv, 0, "".join(lines[j] + "\n" for j in ids if j in lines), "")

    slurm = Slurm(run)
    found, why = slurm.accounting(["80_0", "90_0", "90_1"])
    assert why is None and "80_0" not in found
    assert found["90_0"].state == found["90_1"].state == "CANCELLED"


def test_sacct_that_cannot_answer_is_not_asked_again() -> None:
    calls = []

    def down(argv):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "sacct: error: Slurm accounting storage is disabled\n")

    slurm = Slurm(down)
    assert slurm.accounting(["1"]) == (None, "sacct failed: sacct: error: Slurm accounting storage is disabled")
    assert slurm.accounting(["2"])[0] is None
    assert slurm.states(["3"]) == {}  # the queue failed too: nobody knows job 3
    assert [c[0] for c in calls] == ["sacct", "squeue"]


def test_a_command_tells_the_client_to_forget() -> None:
    fake = Recorder(queue={"20": "RUNNING"})
    slurm = Slurm(fake)
    assert slurm.states(["20"]) == {"20": "RUNNING"}
    slurm.cancel(["20"])
    fake.queue.clear()
    fake.acct["20"] = "CANCELLED by 0"
    assert slurm.states(["20"]) == {"20": "CANCELLED"}  # asked again: scancel changed the answer
    assert [c[0] for c in fake.calls] == ["squeue", "scancel", "squeue", "sacct"]


def test_wait_asks_afresh_at_every_poll(monkeypatch) -> None:
    fake = Recorder(queue={"30": "PENDING", "31": "RUNNING"})
    polls = []

    def sleep(_s):  # between polls the jobs move on
        polls.append(dict(fake.queue))
        if "30" in fake.queue and fake.queue["30"] == "PENDING":
            fake.queue["30"] = "RUNNING"
        else:
            fake.queue.clear()
            fake.acct.update({"30": "COMPLETED", "31": "FAILED"})

    monkeypatch.setattr(poll.Backoff, "pause", lambda self: sleep(self.next_pause()))
    backend = slurm_backend.SlurmBackend(Slurm(fake))
    seen = []
    waited = [Submitted(spec=None, job_id=j) for j in ("30", "31")]  # wait reads only the job ids
    backend.wait(waited, lambda done, total: seen.append((done, total)))
    assert seen == [(0, 2), (0, 2), (2, 2)] and len(polls) == 2
    assert len(fake.asked("squeue")) == 3


# -- on the test cluster: one sbench command, each question once ----------------------------------------------
SHIMMED = ("sacct", "squeue", "sinfo", "sbatch", "scancel", "scontrol", "srun", "sacctmgr")


def _shims(tmp_path: Path) -> tuple[Path, Path]:
    """A bin dir of logging shims (each logs its argv, then execs the real command) and the log file."""
    bindir, log = tmp_path / "shims", tmp_path / "slurm.log"
    bindir.mkdir()
    for name in SHIMMED:
        real = shutil.which(name)
        assert real, f"{name} is not on PATH"
        shim = bindir / name
        shim.write_text("#!/bin/bash\n"
                        f"{{ printf '%s' {name}; printf '\\t%s' \"$@\"; printf '\\n'; }} >> \"$SBENCH_SLURM_LOG\"\n"
                        f"exec {real} \"$@\"\n")
        shim.chmod(0o755)
    return bindir, log


def _question(argv: list[str]) -> tuple[str, str]:
    """What an SLURM command line asks: the command and what about (its job ids, partition or script).
    The queue is one question, whichever jobs a command line lists."""
    cmd, args = argv[0], argv[1:]
    if cmd == "squeue":
        return cmd, "the queue"
    for flag in ("-j", "-p"):
        if flag in args:
            return cmd, ",".join(sorted(args[args.index(flag) + 1].split(",")))
    return cmd, " ".join(args)


def _sbench(bindir: Path, log: Path, *args) -> tuple[dict, list[list[str]]]:
    """Run one sbench command as a user does; its JSON output and the SLURM command lines it ran."""
    log.write_text("")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "SBENCH_SLURM_LOG": str(log)}
    proc = subprocess.run(command(*args), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    questions = Counter(_question(c) for c in calls)
    assert [q for q, n in questions.items() if n > 1] == [], calls
    asked = [j for c in calls if c[0] == "sacct" for j in _question(c)[1].split(",")]
    assert len(asked) == len(set(asked)), calls  # no job id goes to sacct twice
    return json.loads(proc.stdout) if proc.stdout.strip().startswith(("{", "[")) else {}, calls


@pytest.mark.slurm
def test_one_command_asks_each_question_once(slurm_cluster, tmp_path: Path) -> None:
    bindir, log = _shims(tmp_path)
    (tmp_path / "model").mkdir()  # held jobs never load it
    sweep = tmp_path / "once.yaml"
    sweep.write_text(yaml.safe_dump({
        "campaign": "once", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny", "model_max_length": 64, "max_steps": 1},
        "grid": {"number_gpus": [1, 2], "batch_size": [2, 4]},
        "model_map": {"tiny": str(tmp_path / "model")}, "data_dir": str(tmp_path / "data")}))
    common = ["--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb"]
    submit = ["submit", sweep, "-i", TEST_INVENTORY, "--executor", "slurm", "--hold", "--no-prepare", "--json",
              *common]
    rep, calls = _sbench(bindir, log, *submit)
    ids = [p["job_id"] for p in rep["points"]]
    try:
        assert rep["submitted"] == 4 and rep["sbatch_calls"] == 2  # two resource shapes, two arrays
        assert sorted(c[0] for c in calls) == ["sacctmgr", "sbatch", "sbatch", "scontrol", "scontrol", "scontrol",
                                               "sinfo"]
        # the cluster's limits, once each: the array size, the user's per-job limits and submit quota with its
        # use (one answer for both), the partition's own QOS; the QOS the jobs get when the sweep names none
        assert sorted(" ".join(c[1:3]) for c in calls if c[0] == "scontrol") == ["show assoc_mgr", "show config",
                                                                                 "show partition"]
        assert [c[1:4] for c in calls if c[0] == "sacctmgr"] == [["-nP", "show", "assoc"]]
        # One attempt ends (cancelled from outside sbench, while pending: SLURM keeps no record of that task
        # by its own id); the others stay held in the queue.
        subprocess.run(["scancel", ids[0]], check=True)
        end = time.monotonic() + 60
        while subprocess.run(["squeue", "-h", "-r", "-j", ids[0]], capture_output=True, text=True).stdout.strip() \
                and time.monotonic() < end:
            time.sleep(1)
        # Submit again: its refresh asks the queue, then sacct about the attempt the queue no longer holds
        # (then, as sacct has no record of that task, about its array), and the collect of that attempt asks
        # nobody again.
        rep, calls = _sbench(bindir, log, *submit)
        assert rep["submitted"] == 0
        # (and, as any submit does, the partition's nodes and the per-job limits: sinfo, scontrol, sacctmgr)
        assert Counter(c[0] for c in calls) == {"sinfo": 1, "scontrol": 3, "sacctmgr": 1, "squeue": 1, "sacct": 2}
        assert [_question(c) for c in calls if c[0] == "sacct"] == [("sacct", ids[0]), ("sacct", ids[0].split("_")[0])]
        _, calls = _sbench(bindir, log, "status", "--json", *common)
        assert Counter(c[0] for c in calls)["squeue"] == 1
        _, calls = _sbench(bindir, log, "cancel", "--campaign", "once", *common)
        assert Counter(c[0] for c in calls) == {"squeue": 1, "sacct": 2, "scancel": 1}
        _, calls = _sbench(bindir, log, "collect", "--json", *common)
        # the three cancelled tasks, then (for those sacct has no record of by their own ids) their arrays
        assert 1 <= Counter(c[0] for c in calls)["sacct"] <= 2
    finally:
        subprocess.run(["scancel", *{i.split("_")[0] for i in ids if i}], check=False)
