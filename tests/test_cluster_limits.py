"""A cluster's limits: ``MaxArraySize`` and the user's submit quota (``MaxSubmitJobs``).

The parsers and the wave planner are checked on SLURM's own words (recorded from the test cluster, SLURM
22.05); the campaign tests run on the real test cluster, whose ``MaxArraySize`` is 20, with an association
limit of ``MaxSubmitJobs=15`` set for the test: a 60-point campaign is submitted with one ``sbench submit``
and runs to the end with nothing lost or duplicated, and ``sbench cancel`` in the middle stops both the
arrays and the feeding.
"""

from __future__ import annotations

import concurrent.futures
import getpass
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from harness.campaign.executors import feed
from harness.contract.jobstate import STUCK_REASONS
from harness.slurm.client import SbatchRefused
from harness.slurm.held import read_feed
from harness.slurm.limits import (
    SubmitLimits,
    default_qos,
    max_array_size,
    parse_assoc_mgr,
    parse_config,
    parse_job_limits,
    parse_records,
    refusal_kind,
)

from .kit import TEST_INVENTORY, sbench, sql_rows, write_yaml

ASSOC_MGR = """Current Association Manager state

Association Records

ClusterName=sbench Account=root UserName= Partition= Priority=0 ID=1
    SharesRaw/Norm/Level/Factor=1/18446744073709551616.00/1/0.00
    GrpJobs=N(0) GrpJobsAccrue=N(0)
    GrpSubmitJobs=N(0) GrpWall=N(0.00)
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs= MaxWallPJ=
ClusterName=sbench Account=root UserName=root(0) Partition= Priority=0 ID=2
    GrpJobs=N(0) GrpJobsAccrue=N(0)
    GrpSubmitJobs=N(0) GrpWall=N(0.00)
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs=15(3) MaxWallPJ=

QOS Records

QOS=normal(1)
    UsageRaw=0.000000
    GrpJobs=N(0) GrpJobsAccrue=N(0) GrpSubmitJobs=N(0) GrpWall=N(0.00)
    Account Limits
        No Accounts
    User Limits
        No Users
"""


def test_the_submit_quota_is_read_with_its_use() -> None:
    assert parse_assoc_mgr(ASSOC_MGR, "root") == (12, 15, "association root/root MaxSubmitJobs=15(3)")
    # another user's association does not bind this one; no limit set anywhere is no limit
    assert parse_assoc_mgr(ASSOC_MGR, "alice") == (None, None, "")
    assert parse_assoc_mgr(ASSOC_MGR.replace("MaxSubmitJobs=15(3)", "MaxSubmitJobs="), "root") == (None, None, "")
    # a QOS's group limit and its per-user limit bind too, the tightest wins; a QOS the jobs do not use does not
    qos = ASSOC_MGR.replace("GrpSubmitJobs=N(0) GrpWall=N(0.00)\n    Account",
                            "GrpSubmitJobs=40(38) GrpWall=N(0.00)\n    Account")
    qos = qos.replace("        No Users", "        [root] MaxJobsPU=N(2) MaxSubmitJobsPU=9(2)")
    assert parse_assoc_mgr(qos, "root") == (2, 40, "QOS normal GrpSubmitJobs=40(38)")
    assert parse_assoc_mgr(qos, "root", {"high"}) == (12, 15, "association root/root MaxSubmitJobs=15(3)")
    assert parse_assoc_mgr(qos.replace("GrpSubmitJobs=40(38)", "GrpSubmitJobs=N(38)"), "root")[:2] == (7, 9)


# a site's hierarchy: account physics under root, alice's default association in physics, one of her own for the
# gpu partition, and two QOS (SLURM 22.05 lists a QOS's user limits by uid, the limits on the line below)
HIERARCHY = """Current Association Manager state

Association Records

ClusterName=c Account=root UserName= Partition= Priority=0 ID=1
    ParentAccount= Lft=1 DefAssoc=No
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs= MaxWallPJ=2880
    MaxTRESPJ=
ClusterName=c Account=physics UserName= Partition= Priority=0 ID=3
    ParentAccount=root Lft=2 DefAssoc=No
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs= MaxWallPJ=
    MaxTRESPJ=node=4,gres/gpu=16
ClusterName=c Account=physics UserName=alice(1001) Partition= Priority=0 ID=4
    ParentAccount= Lft=3 DefAssoc=Yes
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs=50(10) MaxWallPJ=
    MaxTRESPJ=cpu=64
ClusterName=c Account=physics UserName=alice(1001) Partition=gpu Priority=0 ID=5
    ParentAccount= Lft=4 DefAssoc=No
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs= MaxWallPJ=600
    MaxTRESPJ=
ClusterName=c Account=chem UserName=alice(1001) Partition= Priority=0 ID=6
    ParentAccount= Lft=5 DefAssoc=No
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs= MaxWallPJ=30
    MaxTRESPJ=

QOS Records

QOS=normal(1)
    UsageRaw=0.000000
    GrpJobs=N(3) GrpJobsAccrue=N(6) GrpSubmitJobs=N(10) GrpWall=N(0.00)
    MaxWallPJ=
    MaxTRESPJ=
    Account Limits
      physics
        MaxJobsPA=N(3) MaxJobsAccruePA=N(6) MaxSubmitJobsPA=5(1)
    User Limits
      1001
        MaxJobsPU=N(3) MaxJobsAccruePU=N(6) MaxSubmitJobsPU=20(18)
      1002
        MaxJobsPU=N(0) MaxJobsAccruePU=N(0) MaxSubmitJobsPU=20(20)
QOS=debug(2)
    UsageRaw=0.000000
    GrpJobs=N(0) GrpJobsAccrue=N(0) GrpSubmitJobs=N(0) GrpWall=N(0.00)
    MaxWallPJ=15
    MaxTRESPJ=node=1
QOS=long(3)
    UsageRaw=0.000000
    MaxWallPJ=4320
    MaxTRESPJ=
"""


def test_a_qos_user_limit_listed_by_uid_binds_only_that_user() -> None:
    # uid 1001's line binds alice (2 free of 20); uid 1002's (none free) does not; account limits are not hers
    assert parse_assoc_mgr(HIERARCHY, "alice", {"normal"}, 1001) == (2, 20, "QOS normal MaxSubmitJobsPU=20(18)")
    assert parse_assoc_mgr(HIERARCHY, "alice", {"debug"}, 1001) == (40, 50,
                                                                   "association physics/alice MaxSubmitJobs=50(10)")


def test_per_job_limits_come_from_the_jobs_association_its_accounts_and_its_qos() -> None:
    def limits(**kw) -> dict:
        return {lim.tres: (lim.most, lim.where, lim.reason) for lim in parse_job_limits(HIERARCHY, "alice", **kw)}

    # her default association (physics): its own cpu, its account's nodes and GPUs, root's two days
    assert limits() == {"cpu": (64, "association physics/alice", "AssocMaxCpuPerJobLimit"),
                        "node": (4, "account physics", "AssocMaxNodesPerJobLimit"),
                        "gres/gpu": (16, "account physics", "AssocMaxGRESPerJob"),
                        "wall": (2880, "account root", "AssocMaxWallDurationPerJobLimit")}
    # her association for the gpu partition sets its own wall; another account's association its own
    assert limits(partition="gpu")["wall"][:2] == (600, "association physics/alice")
    assert limits(account="chem") == {"wall": (30, "association chem/alice", "AssocMaxWallDurationPerJobLimit")}
    # a QOS's limits take the place of the association's where it sets them
    debug = limits(qos="debug")
    assert debug["wall"] == (15, "QOS debug", "QOSMaxWallDurationPerJobLimit")
    assert debug["node"] == (1, "QOS debug", "QOSMaxNodePerJobLimit") and debug["cpu"][0] == 64
    assert limits(qos="normal") == limits()
    # each reason is one the queue's stuck rule knows (a job over the limit that got in anyway is named stuck)
    assert {lim.reason for lim in parse_job_limits(HIERARCHY, "alice", qos="debug")} <= set(STUCK_REASONS)
    # a user with no association here, and an account she has none in: nothing known, nothing refused
    assert parse_job_limits(HIERARCHY, "bob") == [] and limits(account="biology") == {}
    # the QOS SLURM's partition gives its jobs comes before the job's own (unless that one says OverPartQOS)
    part = limits(partition="short", qos="normal", partition_qos="debug")
    assert part["wall"] == (15, "partition short's QOS debug", "QOSMaxWallDurationPerJobLimit")
    assert part["node"][:2] == (1, "partition short's QOS debug") and part["cpu"][0] == 64
    assert all(lim.partition == (lim.tres in ("wall", "node")) for lim in parse_job_limits(
        HIERARCHY, "alice", partition="short", qos="normal", partition_qos="debug"))
    assert limits(qos="debug", partition_qos="normal") == limits(qos="debug")  # the partition's sets none
    assert limits(partition="short", qos="long", partition_qos="debug")["wall"][:2] == (15, "partition short's "
                                                                                       "QOS debug")
    assert limits(partition="short", qos="long", partition_qos="debug", over_partition_qos=True)["wall"] == (
        4320, "QOS long", "QOSMaxWallDurationPerJobLimit")
    # the QOS a job gets when it names none: DefaultQOS, else the only one allowed, else normal where allowed
    assert default_qos("|normal,debug|debug\n") == "debug" and default_qos("|debug|\n") == "debug"
    assert default_qos("|debug,normal|\n") == "normal" and default_qos("|debug,high|\n") is None
    assert default_qos("|normal||\ngpu|debug,high|high\n", "gpu") == "high" and default_qos("") is None


def test_the_array_limit_and_sbatchs_refusals_are_read() -> None:
    assert max_array_size(parse_config("ClusterName             = sbench\nMaxArraySize            = 20\n")) == 20
    assert max_array_size(parse_config("ClusterName = x\n")) == 1001  # SLURM's default when it does not say
    assert refusal_kind("sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job submission failed: Job "
                        "violates accounting/QOS policy (job submit limit, user's size and/or time limits)") == "quota"
    assert refusal_kind("sbatch: error: Batch job submission failed: Invalid job array specification") == "array"
    # a per-job limit (a QOS with DenyOnLimit) comes with the quota's words, but no room in the queue lets it in
    assert refusal_kind("sbatch: error: QOSMaxWallDurationPerJobLimit\nsbatch: error: Batch job submission failed: "
                        "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)") is None
    assert refusal_kind("sbatch: error: AssocMaxNodesPerJobLimit\nsbatch: error: Batch job submission failed: Job "
                        "violates accounting/QOS policy (job submit limit, user's size and/or time limits)") is None
    assert refusal_kind("sbatch: error: Batch job submission failed: Invalid partition name specified") is None


class FakeSlurm:
    """sbatch as a cluster with a hidden limit: arrays of more than *cap* tasks are refused as over quota."""

    def __init__(self, cap: int, quota: int) -> None:
        self.cap, self.quota, self.calls, self.next = cap, quota, [], 100

    def sbatch(self, script: str, folder: Path, *, hold: bool = False, after: str | None = None,
               after_any: str | None = None, begin: str | None = None) -> str:
        n = script.count("\n  /")  # one line per job dir in the array's list
        self.calls.append((n, after_any))
        if n > self.cap or n > self.quota:
            raise SbatchRefused("sbatch: error: AssocMaxSubmitJobLimit", "quota")
        self.quota -= n
        self.next += 1
        return str(self.next)


def _groups(tmp_path: Path, n: int, max_parallel: int | None) -> list[dict]:
    held = [{"job_dir": str(tmp_path / f"p{i}.r0.a1"), "point_id": f"p{i}", "repeat": 0, "attempt": 1}
            for i in range(n)]
    return [{"name": "sbench.c.x", "shape": {"partition": "cpu"}, "max_parallel": max_parallel, "after": None,
             "hold": False, "last_array": None, "single": False, "held": held}]


def test_arrays_are_split_at_the_array_limit_and_chained_for_max_parallel(tmp_path: Path) -> None:
    slurm = FakeSlurm(cap=1000, quota=1000)
    groups = _groups(tmp_path, 45, max_parallel=4)
    done, stopped = feed.submit_groups(slurm, tmp_path, "c", groups, SubmitLimits(20), None)  # type: ignore[arg-type]
    assert stopped is None and len(done) == 45 and not groups[0]["held"]
    # 20 + 20 + 5, each array after the one before it (max_parallel holds for the whole shape)
    assert slurm.calls == [(20, None), (20, "101"), (5, "102")]
    assert [jid for _h, jid, _a in done][:2] == ["101_0", "101_1"] and done[-1][1] == "103_4"
    assert len({h["job_dir"] for h, _j, _a in done}) == 45


def test_a_limit_learnt_from_sbatchs_refusal_halves_the_array_and_holds_back_the_rest(tmp_path: Path) -> None:
    slurm = FakeSlurm(cap=6, quota=13)  # neither limit could be read: both are learnt from refusals
    groups = _groups(tmp_path, 45, max_parallel=None)
    done, stopped = feed.submit_groups(slurm, tmp_path, "c", groups, SubmitLimits(20), None)  # type: ignore[arg-type]
    assert len(done) == 13 and len(groups[0]["held"]) == 32
    assert [n for n, _a in slurm.calls] == [20, 10, 5, 5, 5, 2, 2, 1, 1]  # halved on each refusal, never grown
    assert stopped and "AssocMaxSubmitJobLimit" in stopped
    # the held ones are the ones not submitted, in order
    assert [h["point_id"] for h in groups[0]["held"]][0] == "p13"
    # a known quota is never exceeded: no refusal at all
    slurm = FakeSlurm(cap=1000, quota=10)
    groups = _groups(tmp_path, 45, max_parallel=None)
    done, stopped = feed.submit_groups(slurm, tmp_path, "c", groups, SubmitLimits(20, free=10, limit=10),
                                       feed.budget_for(SubmitLimits(20, free=10, limit=10), 45))  # type: ignore[arg-type]
    assert stopped is None and len(done) == 9 and slurm.calls == [(9, None)]  # one job's room kept for the feeder


def test_an_sbatch_failure_after_a_wave_keeps_what_was_submitted(tmp_path: Path) -> None:
    class Flaky(FakeSlurm):
        def sbatch(self, script, folder, **kw):  # noqa: ANN001, ANN003, ANN201
            if len(self.calls) == 1:
                self.calls.append((0, None))
                raise SbatchRefused("sbatch failed: Socket timed out on send/recv operation", None)
            return super().sbatch(script, folder, **kw)

    slurm = Flaky(cap=1000, quota=1000)
    groups = _groups(tmp_path, 45, max_parallel=None)
    done, stopped = feed.submit_groups(slurm, tmp_path, "c", groups, SubmitLimits(20), None)  # type: ignore[arg-type]
    # the first array is kept (recorded by the caller), the rest stays held for the next turn
    assert len(done) == 20 and len(groups[0]["held"]) == 25 and "Socket timed out" in (stopped or "")


# -- the real test cluster -------------------------------------------------------------------------------------
def _set_quota(n: int) -> None:
    subprocess.run(["sacctmgr", "-i", "modify", "user", "where", f"name={getpass.getuser()}", "cluster=sbench", "set",
                    f"MaxSubmitJobs={n}"], check=True, capture_output=True)
    want = f"MaxSubmitJobs={n}(" if n >= 0 else "MaxSubmitJobs= "
    end = time.monotonic() + 30
    while want not in subprocess.run(["scontrol", "show", "assoc_mgr", f"users={getpass.getuser()}", "flags=assoc"],
                                     capture_output=True, text=True).stdout:
        assert time.monotonic() < end, "the controller did not take the submit limit"
        time.sleep(0.5)


def _clear_my_queue() -> None:
    """Cancel the user's jobs still queued: these tests have the cluster to themselves (marked alone), so any
    job of the user in the queue was left by something else and would hold slots of the limit they set."""
    def mine() -> list[str]:
        out = subprocess.run(["squeue", "-h", "-u", getpass.getuser(), "-o", "%F"], capture_output=True, text=True)
        return sorted(set(out.stdout.split()))
    left = mine()
    if left:
        print(f"cancelling job(s) left in the queue: {' '.join(left)}")
        subprocess.run(["scancel", *left], check=False, capture_output=True)
    end = time.monotonic() + 60
    while left and (left := mine()):
        assert time.monotonic() < end, f"job(s) {left} stayed in the queue after scancel"
        time.sleep(0.5)


@pytest.fixture
def quota_15(slurm_cluster, monkeypatch):
    monkeypatch.setenv("SBENCH_FEED_INTERVAL", "2")
    _clear_my_queue()
    _set_quota(15)
    yield 15
    _set_quota(-1)


def _cli(common: list[str]):
    def sb(*args, code=0):
        return sbench(*args, *common, in_process=True, ok=(code,))
    return sb


def _sweep(tmp_path: Path, campaign: str, n: int, idle_s: float) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    return write_yaml(tmp_path / f"{campaign}.yaml", {
        "campaign": campaign, "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
        "entity": {"model_name": "tiny", "model_max_length": 64, "number_gpus": 1},
        "grid": {"batch_size": list(range(1, n + 1))}, "model_map": {"tiny": str(tmp_path / "model")},
        "runner": {"workload": "idle", "idle_seconds": idle_s, "sample_interval_s": 0.5},
        "slurm": {"time": "00:10:00"}})


def _queued(prefix: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%j"], capture_output=True, text=True).stdout
    return [line.split("|")[0] for line in out.splitlines() if line.split("|")[-1].startswith(prefix)]


def _accounted(prefix: str) -> list[tuple[str, str]]:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-S", "now-1hour", "-o", "JobID,JobName,State"],
                         capture_output=True, text=True).stdout
    return [(f[0], f[2].split()[0]) for f in (line.split("|") for line in out.splitlines() if line.strip())
            if f[1].startswith(prefix) and not f[1].endswith(".feed")]


@pytest.mark.slurm
@pytest.mark.alone
@pytest.mark.slow(55)
def test_a_campaign_several_times_the_limits_completes_from_one_submit(quota_15, tmp_path: Path) -> None:
    size = max_array_size(parse_config(subprocess.run(["scontrol", "show", "config"], capture_output=True,
                                                      text=True).stdout))
    camp = f"limits{int(time.time())}"
    sb = _cli(["--workdir", str(tmp_path / "runs"), "--db", str(tmp_path / "r.duckdb")])
    res = sb("submit", _sweep(tmp_path, camp, 60, 0.2), "-i", TEST_INVENTORY, "--executor", "slurm", "--no-prepare",
             "--json")
    rep = json.loads(res.stdout)
    assert rep["submitted"] == 60 and 0 < rep["held_back"] < 60, rep
    assert rep["feed"]["feeder_job"] and rep["feed"]["held"] == rep["held_back"]
    queued_now = [p for p in rep["points"] if p["job_id"]]
    assert len(queued_now) == 60 - rep["held_back"] <= 14  # 15 less the feeder's room
    st = json.loads(sb("status", "--campaign", camp, "--json").stdout)
    assert st["counts"].get("held", 0) > 0 and "attempt(s) back until the submit quota" in (st.get("note") or ""), st
    cdir = tmp_path / "runs" / camp
    end = time.monotonic() + 600
    while not read_feed(cdir).get("finished_at") or _queued(f"sbench.{camp}."):
        assert time.monotonic() < end, f"the campaign did not finish: {read_feed(cdir)}"
        time.sleep(3)
    doc = read_feed(cdir)
    assert len(doc["waves"]) >= 60 // 14 and not doc["groups"]
    col = json.loads(sb("collect", "--json").stdout)
    assert col["runs"] == 60
    rows = sql_rows(tmp_path / "r.duckdb", "select run_id, job_id, outcome, job_dir from runs where campaign = ?",
                    [camp])
    assert len(rows) == 60 and {r["outcome"] for r in rows} == {"ok"}
    for key in ("run_id", "job_id", "job_dir"):
        assert len({r[key] for r in rows}) == 60
    # sacct agrees: every task of the campaign's arrays, once, completed; no array above the limit
    end = time.monotonic() + 120  # slurmdbd records the last tasks' ends a moment after the queue forgets them
    acct = _accounted(f"sbench.{camp}.")
    while (len(acct) != 60 or {s for _j, s in acct} != {"COMPLETED"}) and time.monotonic() < end:
        time.sleep(2)
        acct = _accounted(f"sbench.{camp}.")
    assert len(acct) == 60 and len({j for j, _s in acct}) == 60 and {s for _j, s in acct} == {"COMPLETED"}, acct
    assert {j for j, _s in acct} == {r["job_id"] for r in rows}
    assert max(int(j.split("_")[1]) for j, _s in acct) < size
    for r in rows:
        assert len(list(Path(r["job_dir"]).glob("result.*.json"))) == 1
    # the manifest names each job dir's job id once it was fed; a second collect changes nothing
    assert json.loads(sb("collect", "--json").stdout)["new"] == 0


@pytest.mark.slurm
@pytest.mark.alone
def test_a_full_quota_queues_nothing_and_says_so_and_retry_runs_every_point(slurm_cluster, tmp_path: Path) -> None:
    """A user whose quota is already full: not one job (the feeder neither) fits. submit exits 1 naming the
    refusal and the way on, with every attempt recorded as held; once the queue has room, retry runs them all."""
    camp = f"limfull{int(time.time())}"
    sb = _cli(["--workdir", str(tmp_path / "runs"), "--db", str(tmp_path / "r.duckdb")])
    _clear_my_queue()
    _set_quota(0)
    try:
        res = sbench("submit", _sweep(tmp_path, camp, 3, 0.2), "-i", TEST_INVENTORY, "--executor", "slurm",
                     "--no-prepare", "--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb", in_process=True,
                     ok=(1,))
        assert "error: nothing will submit 3 held attempt(s)" in res.stderr, res.stderr
        assert "AssocMaxSubmitJobLimit" in res.stderr and f"sbench retry {camp}" in res.stderr
        assert "Traceback" not in res.stderr and _queued(f"sbench.{camp}.") == []
        js = sbench("submit", _sweep(tmp_path, camp, 3, 0.2), "-i", TEST_INVENTORY, "--executor", "slurm",
                    "--no-prepare", "--json", "--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb",
                    in_process=True, ok=(1,))
        assert json.loads(js.stdout)["feed"]["feeder_job"] is None  # the second submit: still nothing feeds them
    finally:
        _set_quota(-1)
    rep = json.loads(sb("retry", camp, "--wait", "--json").stdout)
    assert rep["submitted"] == 3 and rep["summary"]["counts"]["ok"] == 3, rep["summary"]
    sb("collect")
    rows = sql_rows(tmp_path / "r.duckdb", "select attempt, outcome from runs where campaign = ? order by attempt",
                    [camp])
    assert [(r["attempt"], r["outcome"]) for r in rows] == [(1, "failed")] * 3 + [(2, "ok")] * 3


def _until_assoc_mgr_says(check, what: str) -> None:
    end = time.monotonic() + 30
    while not check(subprocess.run(["scontrol", "show", "assoc_mgr", f"users={getpass.getuser()}",
                                    "flags=assoc,qos"], capture_output=True, text=True).stdout):
        assert time.monotonic() < end, f"the controller did not take {what}"
        time.sleep(0.5)


def _set_max_wall(minutes: int) -> None:
    subprocess.run(["sacctmgr", "-i", "modify", "user", "where", f"name={getpass.getuser()}", "cluster=sbench", "set",
                    f"MaxWall={minutes}"], check=True, capture_output=True)
    want = rf"MaxWallPJ={minutes}\b" if minutes >= 0 else r"MaxWallPJ=(\s|$)"
    _until_assoc_mgr_says(lambda text: re.search(want, text, re.M), "the MaxWall limit")


def _set_qos_max_nodes(n: int) -> None:
    """The per-job node limit of QOS normal, the QOS the test cluster's jobs get when they name none."""
    subprocess.run(["sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set", f"MaxTRESPerJob=node={n}"],
                   check=True, capture_output=True)
    want = f"node={n}" if n >= 0 else ""
    _until_assoc_mgr_says(lambda text: [r.fields.get("MaxTRESPJ") for r in parse_records(text)
                                        if r.kind == "qos" and r.name == "normal"] == [want], "the QOS's node limit")


def _set_partition_qos(name: str | None, max_wall: int = -1) -> None:
    """The QOS SLURM's partition cpu gives every job in it (None: none), with its per-job MaxWall in minutes."""
    if name:
        subprocess.run(["sacctmgr", "-i", "add", "qos", name], capture_output=True)  # (one left there: fine)
        subprocess.run(["sacctmgr", "-i", "modify", "qos", "where", f"name={name}", "set", f"MaxWall={max_wall}"],
                       check=True, capture_output=True)
        _until_assoc_mgr_says(lambda text: [r.fields.get("MaxWallPJ") for r in parse_records(text)
                                            if r.kind == "qos" and r.name == name] == [str(max_wall)],
                              "the partition's QOS")
    subprocess.run(["scontrol", "update", "PartitionName=cpu", f"QOS={name or ''}"], check=True)


@pytest.mark.slurm
@pytest.mark.alone
def test_per_job_limits_are_refused_before_submit_and_a_limit_met_later_leaves_jobs_stuck_not_waited_for(
        slurm_cluster, tmp_path: Path) -> None:
    """Per-job limits sbench reads before it submits: the association's MaxWall, the default QOS's MaxTRESPerJob
    node count, SLURM's partition MaxTime and MaxNodes, the partition's own QOS's MaxWall, each under what the sweep
    asks (the inventory knows none of
    them): submit refuses, exit 2, naming the limit and where it is set, nothing submitted. A limit set after the
    jobs were queued: they pend for ever (AssocMaxWallDurationPerJobLimit); submit --wait does not wait for them, it
    names them stuck and exits 1; status shows them stuck; cancel cancels them."""
    camp = f"limwall{int(time.time())}"
    common = ["--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb"]
    submit = ["-i", TEST_INVENTORY, "--executor", "slurm", "--no-prepare", *common]
    _clear_my_queue()
    _set_max_wall(5)  # minutes; the sweep asks for 00:10:00
    try:
        res = sbench("submit", _sweep(tmp_path, camp + "a", 2, 0.2), *submit, ok=(2,))
        assert "--time=00:10:00 (2 point(s)) but the association root/root lets one job have at most 00:05:00 " \
               "(association root/root MaxWallPJ=5, scontrol show assoc_mgr)" in res.stderr, res.stderr
        assert "AssocMaxWallDurationPerJobLimit" in res.stderr and "nothing was submitted" in res.stderr
        assert _queued(f"sbench.{camp}a.") == [] and not (tmp_path / "runs" / f"{camp}a").exists()
    finally:
        _set_max_wall(-1)
    # a limit met after submit: the partition is down while the jobs are queued, the limit comes, then it is up
    subprocess.run(["scontrol", "update", "PartitionName=cpu", "State=DOWN"], check=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            t0 = time.monotonic()
            waiting = pool.submit(sbench, "submit", _sweep(tmp_path, camp, 2, 0.2), *submit, "--wait", ok=(1,),
                                  timeout=300)
            end = time.monotonic() + 120
            while len(_queued(f"sbench.{camp}.")) < 2:
                assert time.monotonic() < end and not waiting.done(), "the campaign's jobs were not queued"
                time.sleep(0.5)
            _set_max_wall(5)
            subprocess.run(["scontrol", "update", "PartitionName=cpu", "State=UP"], check=True)
            res = waiting.result()
        assert time.monotonic() - t0 < 240
        assert "0 failed, 2 stuck in SLURM's queue (pending for ever)" in res.stdout, res.stdout
        assert "pending for ever: AssocMaxWallDurationPerJobLimit (its time limit is above its association's " \
               "MaxWall)" in res.stdout
        st = json.loads(sbench("status", "--campaign", camp, "--json", *common).stdout)
        assert st["counts"] == {"stuck": 2}, st["counts"]
        assert all(r["live_state"] == "PENDING (AssocMaxWallDurationPerJobLimit)" for r in st["rows"])
        assert "cancelled 2 attempt(s)" in sbench("cancel", "--campaign", camp, *common).stdout
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=cpu", "State=UP"], check=True)
        _set_max_wall(-1)
    end = time.monotonic() + 60
    while _queued(f"sbench.{camp}."):
        assert time.monotonic() < end, "the cancelled jobs did not leave the queue"
        time.sleep(1)
    sbench("collect", *common)
    rows = sql_rows(tmp_path / "r.duckdb", "select outcome, state from runs where campaign = ?", [camp])
    assert [(r["outcome"], r["state"]) for r in rows] == [("failed", "CANCELLED")] * 2
    # SLURM's own MaxTime under the request, which the inventory (time_limit 00:20:00) does not know
    subprocess.run(["scontrol", "update", "PartitionName=cpu", "MaxTime=00:05:00"], check=True)
    try:
        res = sbench("submit", _sweep(tmp_path, camp + "b", 2, 0.2), "-i", TEST_INVENTORY, "--executor", "slurm",
                     "--no-prepare", *common, ok=(2,))
        assert "--time=00:10:00 (2 point(s)) but SLURM's partition for 'cpu' allows at most 5:00 (MaxTime" \
            in res.stderr, res.stderr
        assert "nothing was submitted" in res.stderr and _queued(f"sbench.{camp}b.") == []
        assert not (tmp_path / "runs" / f"{camp}b" / "manifest.jsonl").exists()
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=cpu", "MaxTime=INFINITE"], check=True)
    # SLURM's MaxNodes under a point's nodes: that point would pend for ever (PartitionNodeLimit); refused too
    wide = write_yaml(tmp_path / "wide.yaml", {**yaml.safe_load(_sweep(tmp_path, camp + "c", 1, 0.2).read_text()),
                                              "grid": {"number_nodes": [1, 2]},
                                              "entity": {"model_name": "tiny", "model_max_length": 64,
                                                         "number_gpus": 2, "batch_size": 2}})
    subprocess.run(["scontrol", "update", "PartitionName=cpu", "MaxNodes=1"], check=True)
    try:
        res = sbench("submit", wide, *submit, ok=(2,))
        assert "--nodes=2 (1 point(s)) but SLURM's partition for 'cpu' lets one job have at most 1 node(s) " \
            "(MaxNodes" in res.stderr, res.stderr
        assert _queued(f"sbench.{camp}c.") == []
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=cpu", "MaxNodes=UNLIMITED"], check=True)
    # the default QOS's per-job node limit (the sweep names no QOS: sacctmgr says which the jobs get)
    _set_qos_max_nodes(1)
    try:
        res = sbench("submit", wide, *submit, ok=(2,))
        assert "2 node(s) (1 point(s)) asked, but the QOS normal lets one job have at most 1 node(s) (MaxTRESPJ " \
               "node=1, scontrol show assoc_mgr): they would pend for ever (QOSMaxNodePerJobLimit)" in res.stderr, \
            res.stderr
        assert _queued(f"sbench.{camp}c.") == []
    finally:
        _set_qos_max_nodes(-1)
    # the QOS of SLURM's partition itself: it binds every job in the partition, whatever QOS the job has
    _set_partition_qos("sbench_part", max_wall=5)
    try:
        res = sbench("submit", _sweep(tmp_path, camp + "d", 2, 0.2), *submit, ok=(2,))
        assert "--time=00:10:00 (2 point(s)) but the partition cpu's QOS sbench_part lets one job have at most " \
               "00:05:00 (partition cpu's QOS sbench_part MaxWallPJ=5, scontrol show assoc_mgr)" in res.stderr, \
            res.stderr
        assert "(QOSMaxWallDurationPerJobLimit)" in res.stderr and _queued(f"sbench.{camp}d.") == []
    finally:
        _set_partition_qos(None)


@pytest.mark.slurm
@pytest.mark.alone
def test_cancel_in_the_middle_stops_the_arrays_and_the_feeding(quota_15, tmp_path: Path) -> None:
    camp = f"limcancel{int(time.time())}"
    sb = _cli(["--workdir", str(tmp_path / "runs"), "--db", str(tmp_path / "r.duckdb")])
    rep = json.loads(sb("submit", _sweep(tmp_path, camp, 60, 30.0), "-i", TEST_INVENTORY, "--executor", "slurm",
                        "--no-prepare", "--json").stdout)
    cdir = tmp_path / "runs" / camp
    feeder = rep["feed"]["feeder_job"]
    assert rep["held_back"] >= 40 and feeder
    out = sb("cancel", "--campaign", camp).stdout
    assert "cancelled 60 attempt(s)" in out, out
    doc = read_feed(cdir)
    assert doc["cancelled_at"]
    time.sleep(6)  # three feeder intervals: nothing more may be submitted
    assert _queued(f"sbench.{camp}.") == []
    acct = _accounted(f"sbench.{camp}.")
    # no array but the first wave's was ever submitted (the quota stays full until that wave ends)
    assert {j.split("_")[0] for j, _s in acct} <= {p["job_id"].split("_")[0] for p in rep["points"] if p["job_id"]}
    col = json.loads(sb("collect", "--json").stdout)
    assert col["runs"] == 60
    rows = sql_rows(tmp_path / "r.duckdb", "select job_id, outcome, state, reason, job_dir from runs "
                    "where campaign = ?", [camp])
    assert len(rows) == 60 and {r["outcome"] for r in rows} == {"failed"}
    held = [r for r in rows if not r["job_id"]]
    assert len(held) == rep["held_back"]
    assert {r["state"] for r in held} == {"CANCELLED"} and all("cancelled" in r["reason"] for r in held)
    for r in held:  # nothing of a held attempt ever ran
        assert not list(Path(r["job_dir"]).glob("stages.*"))
    # the campaign is settled: a second submit starts nothing (cancelled points wait for --force)
    again = json.loads(sb("submit", _sweep(tmp_path, camp, 60, 30.0), "-i", TEST_INVENTORY, "--executor", "slurm",
                          "--no-prepare", "--json").stdout)
    assert again["submitted"] == 0 and not again["feed"]


@pytest.mark.slurm
@pytest.mark.alone
@pytest.mark.slow(25)
def test_a_dead_feeder_leaves_not_started_attempts_that_retry_finishes(quota_15, tmp_path: Path) -> None:
    camp = f"limdead{int(time.time())}"
    sb = _cli(["--workdir", str(tmp_path / "runs"), "--db", str(tmp_path / "r.duckdb")])
    sweep = _sweep(tmp_path, camp, 30, 0.2)
    rep = json.loads(sb("submit", sweep, "-i", TEST_INVENTORY, "--executor", "slurm", "--no-prepare",
                        "--json").stdout)
    feeder, held = rep["feed"]["feeder_job"], rep["held_back"]
    assert feeder and held >= 16
    subprocess.run(["scancel", str(feeder)], check=True)  # the feeder dies before its first turn
    end = time.monotonic() + 300
    while _queued(f"sbench.{camp}."):
        assert time.monotonic() < end, "the first wave did not end"
        time.sleep(2)
    st = json.loads(sb("status", "--campaign", camp, "--json").stdout)
    assert st["counts"].get("not started") == held, st
    assert f"feeder job {feeder} ended" in (st.get("note") or "")
    sb("collect")
    rows = sql_rows(tmp_path / "r.duckdb", "select outcome, reason from runs where campaign = ?", [camp])
    assert sorted(r["outcome"] for r in rows) == ["failed"] * held + ["ok"] * (30 - held)
    assert all(f"feeder job {feeder} ended" in r["reason"] for r in rows if r["outcome"] == "failed")
    # retry runs exactly the points never submitted, as attempt 2 (fed again: they do not all fit)
    rep2 = json.loads(sb("retry", camp, "--json").stdout)
    assert rep2["submitted"] == held and {p["attempt"] for p in rep2["points"] if p["action"] == "submit"} == {2}
    cdir = tmp_path / "runs" / camp
    end = time.monotonic() + 600
    while (read_feed(cdir).get("groups") and not read_feed(cdir).get("finished_at")) or _queued(f"sbench.{camp}."):
        assert time.monotonic() < end, f"the retry did not finish: {read_feed(cdir)}"
        time.sleep(3)
    # the last tasks may have left the queue before their accounting records are written (a loaded
    # slurmdbd): collect again until no run is still unsettled
    end = time.monotonic() + 180
    while True:
        sb("collect")
        rows = sql_rows(tmp_path / "r.duckdb", "select point_id, attempt, outcome, state, reason from runs "
                        "where campaign = ?", [camp])
        if all(r["outcome"] is not None for r in rows) or time.monotonic() > end:
            break
        time.sleep(5)
    assert len(rows) == 30 + held
    ok = [r for r in rows if r["outcome"] == "ok"]
    assert len(ok) == 30 and len({r["point_id"] for r in ok}) == 30, [
        (r["point_id"], r["attempt"], r["state"], r["reason"]) for r in rows
        if r["attempt"] == 2 and r["outcome"] != "ok"]
    # status shows each point by its latest attempt: all measured
    assert json.loads(sb("status", "--campaign", camp, "--json").stdout)["counts"] == {"ok": 30}


def test_a_bad_feed_partition_is_an_input_error_naming_the_key(tmp_path: Path) -> None:
    from harness.contract.errors import SweepError
    from harness.spec.sweep import load_sweep

    sweep = _sweep(tmp_path, "badfeed", 2, 0.2)
    text = sweep.read_text().replace("slurm:\n", "slurm:\n  feed_partition: 'cpu; rm -rf /'\n")
    sweep.write_text(text)
    with pytest.raises(SweepError, match="feed_partition"):
        load_sweep(sweep)
    sweep.write_text(text.replace("'cpu; rm -rf /'", "service"))
    assert load_sweep(sweep).slurm.feed_partition == "service"
