"""SLURM end to end on the project's real test cluster: job arrays, 2-node DDP and FSDP v2 across
network namespaces, RoCE env per host, and the faults clusters inflict — each followed by a collect.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from harness.contract.paths import JobPaths
from harness.slurm.client import Slurm
from harness.slurm.sacct import JobKey, parse_sacct_records, sacct_time

from .kit import CLUSTER_SCRIPT, SMALL_DATASET, TEST_INVENTORY, sbench, sql_rows, write_yaml
from .kit.cli import command

pytestmark = [pytest.mark.slurm, pytest.mark.train]


@pytest.fixture
def env(tmp_path_factory, tiny_model, small_data_dir, slurm_cluster):
    """A work dir and database of the test's own: each test is a campaign of its own, so the tests run on any
    worker, side by side."""
    root = tmp_path_factory.mktemp("slurm-e2e")
    return {"root": root, "workdir": root / "runs", "db": root / "results.duckdb", "model": tiny_model,
            "data": small_data_dir}


@pytest.fixture(scope="module")
def sb():
    def run(env, *args, ok=True, db_only=False):
        extra = ["--db", env["db"]] if db_only else ["--workdir", env["workdir"], "--db", env["db"]]
        return sbench(*args, *extra, in_process=True, ok=(0,) if ok else None)

    return run


def sweep(env, name: str, entity: dict, grid: dict | None = None, slurm: dict | None = None,
          experiment: str = "finetune_lora_benchmark-v1.0.0") -> Path:
    doc = {"campaign": name, "experiment": experiment, "partition": "cpu",
           "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET,
                      "gradient_accumulation_steps": 1, "batch_size": 2, **entity},
           "grid": grid or {}, "model_map": {"tiny": str(env["model"])}, "data_dir": str(env["data"]),
           "runner": {"sample_interval_s": 0.5}}
    if slurm:
        doc["slurm"] = slurm
    return write_yaml(env["root"] / f"{name}.yaml", doc)


def submit(sb, env, path: Path, *flags: str, ok: bool = True) -> dict:
    res = sb(env, "submit", path, "-i", TEST_INVENTORY, "--executor", "slurm", "--json", *flags, ok=ok)
    return json.loads(res.stdout)


def sql(env, query: str, params=None) -> list[dict]:
    return sql_rows(env["db"], query, params)


def wait_for(cond, timeout: float, what: str, every: float = 1.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def training_started(job_dir: str, hosts: list[str]) -> bool:
    paths = JobPaths(job_dir)
    for h in hosts:
        p = paths.stages(h)
        if not p.exists() or '"stage":"train"' not in p.read_text().replace(" ", ""):
            return False
    return True


def squeue_gone(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id.split("_")[0]], capture_output=True, text=True).stdout
    return not out.strip()


def collect(sb, env) -> dict:
    # sacct trails slurmctld by about a second
    time.sleep(2)
    return json.loads(sb(env, "collect", "--json").stdout)


@pytest.mark.slow(65)
def test_arrays_two_node_ddp_fsdp_and_roce_env_per_host(sb, env, lake) -> None:
    path = sweep(env, "arrays", {"number_gpus": 2, "max_steps": 3, "enable_roce": True},
                 {"number_nodes": [1, 2], "distributed_backend": ["DDP", "FSDP"]})
    rep = submit(sb, env, path, "--wait")
    # two resource shapes (1 node, 2 nodes) -> two sbatch calls for four points, each a job array
    assert rep["submitted"] == 4 and rep["sbatch_calls"] == 2
    arrays = {p["job_id"].split("_")[0] for p in rep["points"]}
    assert len(arrays) == 2 and all("_" in p["job_id"] for p in rep["points"])
    collect(sb, env)
    runs = sql(env, "SELECT r.*, p.number_nodes, p.distributed_backend FROM runs r JOIN points p USING (point_id) "
                    "WHERE campaign = 'arrays' ORDER BY p.number_nodes, p.distributed_backend")
    assert [r["outcome"] for r in runs] == ["ok"] * 4, [(r["outcome"], r["reason"]) for r in runs]
    for r in runs:
        assert r["accounting_source"] == "sacct" and r["state"] == "COMPLETED" and r["exit_code"] == 0
        assert r["elapsed_s"] > 0 and r["max_rss_mb"] and r["max_rss_mb"] > 0
        if r["number_nodes"] == 2:
            assert r["node_list"] == "node[1-2]"
            # per-host stages and samples, one run
            hosts = sql(env, "SELECT DISTINCT host FROM stages WHERE run_id = ? ORDER BY 1", [r["run_id"]])
            assert [h["host"] for h in hosts] == ["node1", "node2"]
            shosts = sql(env, "SELECT host, count(*) AS n FROM samples WHERE run_id = ? GROUP BY 1 ORDER BY 1",
                         [r["run_id"]])
            assert [h["host"] for h in shosts] == ["node1", "node2"] and all(h["n"] > 0 for h in shosts)
            (m,) = sql(env, "SELECT * FROM measurements WHERE run_id = ?", [r["run_id"]])
            assert m["is_valid"] and m["train_runtime"] > 0 and m["dataset_tokens_per_second"] > 0
            assert m["world_size"] == 2
            # each node's training process ran with its own host's RoCE settings
            paths = JobPaths(r["job_dir"])
            seen = {}
            for rank in (0, 1):
                rank_doc = json.loads(paths.rank_result(rank).read_text())
                seen[rank_doc["host"]] = rank_doc["env"]
                assert rank_doc["world_size"] == 2
                dist = rank_doc["distributed"]
                if r["distributed_backend"] == "FSDP":
                    assert dist["distributed_type"] == "FSDP" and dist["fsdp_version"] == 2
                else:
                    assert dist["wrapped_class"] == "DistributedDataParallel"
            assert seen["node1"]["NCCL_IB_HCA"] == "=mlx5_0,mlx5_3" and seen["node1"]["NCCL_IB_GID_INDEX"] == "3"
            assert seen["node2"]["NCCL_IB_HCA"] == "=mlx5_1" and seen["node2"]["NCCL_IB_GID_INDEX"] == "1"
            for e in seen.values():
                assert e["NCCL_IB_DISABLE"] == "0" and e["NCCL_SOCKET_IFNAME"] == "eth0"
                assert e["NCCL_DEBUG"] == "INFO"
                # The inventory sets no GLOO_SOCKET_IFNAME and the nodes' shared hostname resolves to
                # 127.0.0.1: launch.sh found the interface that holds each node's inventory address.
                assert e["GLOO_SOCKET_IFNAME"] == "eth0"
            assert seen["node1"]["SLURMD_NODENAME"] == "node1" and seen["node2"]["SLURMD_NODENAME"] == "node2"
        else:
            assert r["node_list"] in ("node1", "node2")
            env0 = json.loads(JobPaths(r["job_dir"]).rank_result(0).read_text())["env"]
            assert env0["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env0  # RoCE is multi-node only
    st = json.loads(sb(env, "status", "--campaign", "arrays", "--json").stdout)
    assert st["counts"] == {"ok": 4}
    # The same campaign collected into a shared store by two processes at once (as two login nodes would):
    # each run once, with the scheduler's accounting, as in the file.
    db, data = lake
    procs = [subprocess.Popen(command("collect", "--workdir", env["workdir"], "--db", db, "--db-data", data, "--json"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [pr.communicate(timeout=600) for pr in procs]
    assert [pr.returncode for pr in procs] == [0, 0], outs
    assert sum(json.loads(o)["new"] for o, _ in outs) == 4
    shown = "SELECT run_id, outcome, state, exit_code, accounting_source, node_list FROM runs ORDER BY run_id"
    lake_rows = json.loads(sbench("query", shown, "--db", db, "--format", "json").stdout)
    assert lake_rows == json.loads(sbench("query", shown, "--db", env["db"], "--format", "json").stdout)
    assert len(lake_rows) == 4 and {r["accounting_source"] for r in lake_rows} == {"sacct"}


@pytest.mark.slow(10)
def test_held_and_running_jobs_show_in_status_and_cancel(sb, env) -> None:
    long_run = sweep(env, "cancelme", {"number_gpus": 1, "max_steps": 100000})
    held = sweep(env, "heldme", {"number_gpus": 1, "max_steps": 3})
    run_rep = submit(sb, env, long_run)
    held_rep = submit(sb, env, held, "--hold")
    (running,) = [p for p in run_rep["points"] if p["action"] == "submit"]
    (pending,) = [p for p in held_rep["points"] if p["action"] == "submit"]
    wait_for(lambda: training_started(running["job_dir"], ["node1"]) or training_started(running["job_dir"], ["node2"]),
             120, "training to start")
    st = json.loads(sb(env, "status", "--json").stdout)
    phases = {r["campaign"]: r["phase"] for r in st["rows"] if r["campaign"] in ("cancelme", "heldme")}
    assert phases == {"cancelme": "running", "heldme": "pending"}
    out = sb(env, "cancel", "--campaign", "cancelme").stdout
    assert running["job_id"] in out
    sb(env, "cancel", "--campaign", "heldme")
    wait_for(lambda: squeue_gone(running["job_id"]) and squeue_gone(pending["job_id"]), 60, "jobs to leave the queue")
    collect(sb, env)
    rows = {r["campaign"]: r for r in sql(env, "SELECT * FROM runs WHERE campaign IN ('cancelme', 'heldme')")}
    for camp in ("cancelme", "heldme"):
        assert rows[camp]["outcome"] == "failed" and rows[camp]["state"].startswith("CANCELLED")
        assert "cancel" in rows[camp]["reason"].lower()
        assert rows[camp]["cancel_requested_at"] is not None
    # the runner recorded the SIGTERM it got mid-training
    res = json.loads(Path(running["job_dir"], f"result.{rows['cancelme']['node_list']}.json").read_text())
    assert res["outcome"] == "failed" and res["terminated_by"]


@pytest.mark.slow(95)
def test_time_limit_is_a_timeout_failure(sb, env) -> None:
    path = sweep(env, "timeout", {"number_gpus": 1, "max_steps": 1000000}, slurm={"time": "00:01:00"})
    rep = submit(sb, env, path)
    (p,) = [x for x in rep["points"] if x["action"] == "submit"]
    wait_for(lambda: squeue_gone(p["job_id"]), 240, "the time limit to end the job", every=3)
    collect(sb, env)
    (run,) = sql(env, "SELECT * FROM runs WHERE campaign = 'timeout'")
    assert run["outcome"] == "failed" and run["state"] == "TIMEOUT" and "timeout" in run["reason"].lower()
    assert run["elapsed_s"] >= 60
    assert not sql(env, "SELECT * FROM measurements WHERE run_id = ?", [run["run_id"]])


@pytest.mark.alone
@pytest.mark.slow(50)
def test_killed_slurmd_is_a_node_failure(sb, env) -> None:
    path = sweep(env, "nodefail", {"number_gpus": 2, "number_nodes": 2, "max_steps": 1000000,
                                   "distributed_backend": "DDP"})
    rep = submit(sb, env, path)
    (p,) = [x for x in rep["points"] if x["action"] == "submit"]
    try:
        wait_for(lambda: training_started(p["job_dir"], ["node1", "node2"]), 180, "training on both nodes")
        subprocess.run(["bash", str(CLUSTER_SCRIPT), "kill-node", "node2"], check=True, capture_output=True)
        wait_for(lambda: squeue_gone(p["job_id"]), 240, "the controller to fail the job", every=3)
    finally:
        subprocess.run(["bash", str(CLUSTER_SCRIPT), "start-node", "node2"], check=True, capture_output=True)
    collect(sb, env)
    (run,) = sql(env, "SELECT * FROM runs WHERE campaign = 'nodefail'")
    assert run["outcome"] == "failed" and run["state"] == "NODE_FAIL" and "node failure" in run["reason"].lower()
    assert not sql(env, "SELECT * FROM measurements WHERE run_id = ?", [run["run_id"]])
    # nothing lost: the attempt is there once, and a retry makes a second attempt
    rep2 = json.loads(sb(env, "retry", "nodefail", "--executor", "slurm", "--json").stdout)
    assert rep2["submitted"] == 1 and rep2["points"][0]["attempt"] == 2
    sb(env, "cancel", "--campaign", "nodefail")


@pytest.mark.slow(40)
def test_requeued_job_is_one_attempt_that_continued(sb, env, monkeypatch) -> None:
    monkeypatch.setenv("SBENCH_FAULT", "sleep@step=2:20")  # hold the first execution mid-training
    path = sweep(env, "requeue", {"number_gpus": 1, "max_steps": 4}, slurm={"requeue": True})
    rep = submit(sb, env, path)
    monkeypatch.delenv("SBENCH_FAULT")
    (p,) = [x for x in rep["points"] if x["action"] == "submit"]
    job = p["job_id"]
    wait_for(lambda: training_started(p["job_dir"], ["node1"]) or training_started(p["job_dir"], ["node2"]),
             120, "training to start")
    subprocess.run(["scontrol", "requeue", job], check=True)
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    wait_for(lambda: squeue_gone(job), 240, "the requeued job to finish", every=2)
    collect(sb, env)
    runs = sql(env, "SELECT * FROM runs WHERE campaign = 'requeue'")
    assert len(runs) == 1  # one attempt, continued - not lost, not duplicated
    (run,) = runs
    assert run["outcome"] == "ok" and run["restarts"] == 1, (run["outcome"], run["reason"], run["restarts"])
    restarts = sql(env, "SELECT DISTINCT restart FROM stages WHERE run_id = ? ORDER BY 1", [run["run_id"]])
    assert [r["restart"] for r in restarts] == [0, 1]
    (m,) = sql(env, "SELECT * FROM measurements WHERE run_id = ?", [run["run_id"]])
    assert m["is_valid"]
    # sacct is asked from the submit time submit recorded, for every record (-D): both runs of the job, under
    # the job name submit recorded; the run stored is the last one (COMPLETED), not the requeued first
    sub = json.loads(Path(p["job_dir"], "submitted.json").read_text())
    calls: list[list[str]] = []

    def asked(argv):
        calls.append(list(argv))
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    k = JobKey.of(sub["submitted_at"], sub["job_name"])
    acct, why = Slurm(asked).accounting([job], {job: k})
    assert why is None and acct[job].state == "COMPLETED" and acct[job].name == sub["job_name"]
    assert "-D" in calls[0] and calls[0][calls[0].index("-S") + 1] == sacct_time(k.since)
    runs_of_job = parse_sacct_records(asked(calls[0]).stdout)[job]
    assert [r.state for r in runs_of_job] == ["REQUEUED", "COMPLETED"]
    assert {r.name for r in runs_of_job} == {sub["job_name"]} and sub["job_name"].startswith("sbench.requeue.")
    assert run["state"] == "COMPLETED" and run["elapsed_s"] == runs_of_job[1].elapsed_s


@pytest.mark.slow(25)
def test_prepare_on_slurm_runs_first_and_the_array_waits_for_it(sb, env) -> None:
    from harness.data.prepared import PREP_DIR

    data = env["root"] / "prep-on-slurm-data"  # fresh: nothing generated or tokenized yet
    path = sweep(env, "prep-slurm", {"number_gpus": 1}, {"max_steps": [2, 3]})
    doc = path.read_text().replace(str(env["data"]), str(data))
    path.write_text(doc)
    rep = submit(sb, env, path, "--prepare-on", "slurm", "--wait")
    prep_job = rep["prepare_job"]
    assert prep_job and rep["submitted"] == 2 and rep["prepare"] == []
    collect(sb, env)
    acct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,JobName,State,Start,End", "-j",
                           ",".join([prep_job] + sorted({p["job_id"].split("_")[0] for p in rep["points"]}))],
                          capture_output=True, text=True, check=True).stdout
    jobs = {line.split("|")[0]: line.split("|") for line in acct.splitlines() if line.strip()}
    _, name, state, _, prep_end = jobs[prep_job]
    assert name.endswith(".prepare") and state == "COMPLETED", jobs
    tasks = [j for jid, j in jobs.items() if jid != prep_job]
    assert len(tasks) == 2 and all(t[2] == "COMPLETED" and t[3] >= prep_end for t in tasks), jobs
    # The preparation job made the dataset and the training data; the tasks only mapped them.
    log = Path(rep["campaign_dir"]) / ".slurm" / f"prepare-{prep_job}.out"
    assert "data     built" in log.read_text() and (data / PREP_DIR / "encoded").is_dir()
    rows = sql(env, """SELECT r.outcome, o.prepared_in_job, s.info FROM runs r JOIN run_overhead o USING (run_id)
                       JOIN stages s USING (run_id) WHERE r.campaign = 'prep-slurm' AND s.stage = 'dataset'
                       AND s.rank = 0""")
    assert len(rows) == 2
    for r in rows:
        assert r["outcome"] == "ok" and r["prepared_in_job"] is False
        assert json.loads(r["info"])["prepared"]["status"] == "hit"


def test_a_failed_prepare_job_cancels_its_arrays_and_status_says_why(sb, env) -> None:
    import shutil

    broken = env["root"] / "model-without-weights"
    shutil.copytree(env["model"], broken)
    for w in broken.glob("*.safetensors"):
        w.unlink()
    path = sweep(env, "prep-fail", {"number_gpus": 1, "max_steps": 2})
    path.write_text(path.read_text().replace(str(env["model"]), str(broken)))
    # --force: the same point may already be measured by another test of this module
    rep = submit(sb, env, path, "--prepare-on", "slurm", "--wait", "--force", ok=False)
    assert rep["submitted"] == 1
    assert rep["summary"]["counts"]["failed"] == 1  # submit --wait exited 1 and said so
    prep_job = rep["prepare_job"]
    log = Path(rep["campaign_dir"]) / ".slurm" / f"prepare-{prep_job}.out"
    assert "lacks weights" in log.read_text()
    status = sb(env, "status", "--campaign", "prep-fail", db_only=False)
    assert f"prepare job {prep_job} ended FAILED" in status.output and "sbench retry prep-fail" in status.output
    # the cancelled array task's accounting record may come after it left the queue: GONE until then
    deadline = time.monotonic() + 60
    while True:
        collect(sb, env)
        (run,) = sql(env, "SELECT * FROM runs WHERE campaign = 'prep-fail'")
        if run["state"] != "GONE" or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert run["state"] == "CANCELLED" and run["outcome"] == "failed", run


@pytest.mark.slow(135)
def test_deepspeed_zero3_across_two_nodes(sb, env) -> None:
    """DeepSpeed ZeRO-3 with the optimizer offloaded, one process on each of two nodes (network namespaces):
    accelerate's "standard" multi-node launcher on every node, deepspeed's CPU accelerator over gloo."""
    pytest.importorskip("deepspeed")
    path = sweep(env, "zero3", {"number_gpus": 2, "number_nodes": 2, "max_steps": 3,
                                "distributed_backend": "DEEPSPEED", "deepspeed_zero_stage": 3,
                                "deepspeed_offload_optimizer": True})
    rep = submit(sb, env, path, "--wait")
    assert rep["submitted"] == 1
    collect(sb, env)
    (r,) = sql(env, "SELECT r.*, m.world_size, m.params_bytes, m.optimizer_bytes, m.predicted_host_bytes "
                    "FROM runs r JOIN measurements m USING (run_id) WHERE r.campaign = 'zero3'")
    assert r["outcome"] == "ok", (r["outcome"], r["reason"])
    assert r["node_list"] == "node[1-2]" and r["world_size"] == 2
    for rank in (0, 1):
        doc = json.loads(JobPaths(r["job_dir"]).rank_result(rank).read_text())
        assert doc["distributed"]["distributed_type"] == "DEEPSPEED" and doc["distributed"]["zero_stage"] == 3
    ranks = sql(env, "SELECT rank, host, max(optimizer_bytes) AS opt FROM memory WHERE run_id = ? "
                     "GROUP BY ALL ORDER BY rank", [r["run_id"]])
    # each node's rank holds its own half of the fp32 master and AdamW state
    assert [x["host"] for x in ranks] == ["node1", "node2"]
    assert ranks[0]["opt"] == pytest.approx(ranks[1]["opt"], rel=0.01) and r["predicted_host_bytes"] > 0


@pytest.mark.slow(40)
def test_fms_hf_tuning_lora_across_two_nodes(sb, env) -> None:
    """The fms-hf-tuning trainer (its own 3.2.2 environment, built by `make test`) on both test-cluster nodes:
    one process each, FSDP v2 over gloo, measurements in the same tables with trainer = fms-hf-tuning."""
    from harness.data.trainerenv import build
    from harness.spec.envs import envs_root

    build("3.2.2", envs_root(None), extras=("fms-accel",))
    path = sweep(env, "fms2n", {"number_gpus": 2, "number_nodes": 2, "max_steps": 3, "trainer": "fms-hf-tuning",
                                "fms_hf_tuning_version": "3.2.2", "distributed_backend": "FSDP"})
    rep = submit(sb, env, path, "--wait")
    assert rep["submitted"] == 1
    collect(sb, env)
    (r,) = sql(env, "SELECT r.*, m.world_size, m.trainer, m.is_valid, m.train_runtime, m.dataset_tokens_per_second "
                    "FROM runs r JOIN measurements m USING (run_id) WHERE r.campaign = 'fms2n'")
    assert r["outcome"] == "ok", (r["outcome"], r["reason"])
    assert r["node_list"] == "node[1-2]" and r["world_size"] == 2 and r["trainer"] == "fms-hf-tuning"
    assert r["is_valid"] and r["train_runtime"] > 0 and r["dataset_tokens_per_second"] > 0
    hosts = []
    for rank in (0, 1):
        doc = json.loads(JobPaths(r["job_dir"]).rank_result(rank).read_text())
        hosts.append(doc["host"])
        assert doc["trainer"]["packages"]["transformers"].startswith("4.55")
        assert doc["distributed"]["distributed_type"] == "FSDP" and doc["distributed"]["sharded_parameters"] > 0
        assert doc["global_step"] == 3
    assert hosts == ["node1", "node2"]
    (e,) = sql(env, "SELECT DISTINCT trainer, transformers FROM environment WHERE run_id = ?", [r["run_id"]])
    assert e["trainer"] == "fms-hf-tuning" and e["transformers"].startswith("4.55")


def one_worker_inventory(env, name: str, hosts: tuple[str, ...] = ("node1", "node2")) -> Path:
    """The test cluster's cpu partition as an inventory that, like many, says less than SLURM knows: one worker
    and 4 cores per node (SLURM: CPUs=96, RealMemory=1000000), on *hosts* only."""
    doc = yaml.safe_load(TEST_INVENTORY.read_text())
    part = doc["partitions"]["cpu"]
    part.update(gpus_per_node=1, cpus_per_node=4)
    part["hosts"] = {h: v for h, v in part["hosts"].items() if h in hosts}
    doc["partitions"] = {"cpu": part}
    return write_yaml(env["root"] / f"{name}.yaml", doc)


def sacct_spans(job_ids: list[str]) -> dict[str, tuple[str, dt.datetime, dt.datetime]]:
    """Job id -> (node list, start, end), asked of sacct here, independently of sbench."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,NodeList,Start,End", "-j", ",".join(job_ids)],
                         capture_output=True, text=True, check=True).stdout
    spans = {}
    for line in out.splitlines():
        jid, nodes, start, end = line.split("|")
        if jid in job_ids:
            spans[jid] = (nodes, dt.datetime.fromisoformat(start), dt.datetime.fromisoformat(end))
    return spans


@pytest.mark.slow(15)
def test_whole_node_points_of_a_campaign_never_share_a_host(sb, env) -> None:
    """Nodes of 96 cores and 1 TB that the inventory calls 4 cores, and a sweep that asks for 1 GB: only
    --exclusive keeps a second whole-node point off a node that runs one. Three points on two nodes."""
    inv = one_worker_inventory(env, "iso-inv")
    path = sweep(env, "whole", {"number_gpus": 1, "model_max_length": 48}, {"max_steps": [2, 3, 4]},
                 slurm={"mem_gb": 1})
    rep = json.loads(sb(env, "submit", path, "-i", inv, "--executor", "slurm", "--json", "--wait").stdout)
    assert rep["submitted"] == 3
    assert any("disagree about node1, node2: the inventory says 4 cores" in w and "CPUTot=96" in w
               for w in rep["warnings"]), rep["warnings"]
    for p in rep["points"]:
        assert "#SBATCH --exclusive" in (Path(p["job_dir"]) / "job.sbatch").read_text()
    spans = sacct_spans([p["job_id"] for p in rep["points"]])
    assert len(spans) == 3 and {s[0] for s in spans.values()} <= {"node1", "node2"}
    ids = sorted(spans)
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            (na, a0, a1), (nb, b0, b1) = spans[a], spans[b]
            assert na != nb or a1 <= b0 or b1 <= a0, (a, spans[a], b, spans[b])  # one host: one after the other
    collect(sb, env)
    runs = sql(env, "SELECT r.outcome, r.overlapped_with, m.shared_host FROM runs r JOIN measurements m "
                    "USING (run_id) WHERE r.campaign = 'whole'")
    assert [(r["outcome"], r["overlapped_with"], r["shared_host"]) for r in runs] == [("ok", [], False)] * 3


@pytest.mark.slow(25)
def test_forced_sharing_is_flagged_in_the_db(sb, env, monkeypatch) -> None:
    """slurm.exclusive: false and an inventory of one host: both whole-node points run on node1 at once (it has
    the cores and memory SLURM knows of); collect flags both, naming the other, and compare leaves them out."""
    inv = one_worker_inventory(env, "iso-one", hosts=("node1",))
    monkeypatch.setenv("SBENCH_FAULT", "sleep@step=1:15")  # each holds node1 for 15 s more
    path = sweep(env, "forced", {"number_gpus": 1, "model_max_length": 40}, {"max_steps": [2, 3]},
                 slurm={"exclusive": False})
    rep = json.loads(sb(env, "submit", path, "-i", inv, "--executor", "slurm", "--json", "--wait").stdout)
    monkeypatch.delenv("SBENCH_FAULT")
    assert rep["submitted"] == 2
    for p in rep["points"]:
        text = (Path(p["job_dir"]) / "job.sbatch").read_text()
        assert "--exclusive" not in text and "--nodelist=node1" in text and "--mem=15200M" in text
    spans = sacct_spans([p["job_id"] for p in rep["points"]])
    (na, a0, a1), (nb, b0, b1) = spans.values()
    assert na == nb == "node1" and a0 < b1 and b0 < a1, spans  # sacct: they did share the node
    collect(sb, env)
    runs = {r["run_id"]: r for r in sql(env, "SELECT r.run_id, r.outcome, r.warnings, r.overlapped_with, "
                                             "m.shared_host, m.overlapped_with AS m_with FROM runs r "
                                             "JOIN measurements m USING (run_id) WHERE r.campaign = 'forced'")}
    assert len(runs) == 2
    for rid, r in runs.items():
        (other,) = set(runs) - {rid}
        assert r["outcome"] == "ok" and r["overlapped_with"] == [other] and r["m_with"] == [other]
        assert r["shared_host"] is True
        assert any(w.startswith("shared host:") and other in w and "node1" in w for w in r["warnings"])
    # each point against itself (two sides that select the same runs): both sides' runs shared a host, so
    # nothing is left to compare, and compare says why
    res = sb(env, "compare", "campaign=forced", "campaign=forced,model_name=tiny", ok=False, db_only=True)
    assert res.exit_code == 2, res.output
    assert "2 measured on a host another sbench run used at the same time" in res.output, res.output
