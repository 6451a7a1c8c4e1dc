"""Several points per allocation (``slurm.pack``): which points pack together, the pack's script, a real
local pack whose measurements are recomputed from each point's own files, an OOM in a pack (the rest go back
to the queue unpacked), and a packed scan on the real SLURM test cluster."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.build.jobspec import JobSpec
from harness.build.sbatch import pack_lines
from harness.campaign.executors.pack import AUTO_MAX, make_packs, pack_time
from harness.contract.errors import SweepError
from harness.contract.paths import JobPaths
from harness.spec.sweep import load_sweep

from . import kit
from .kit import SMALL_DATASET, TEST_INVENTORY, sql_rows, write_yaml


def spec(point: str, batch: int, *, model: str = "tiny", time: str = "00:10:00", cpus: int = 2,
         trainer: str = "sbench", dtype: str = "bfloat16", trials: int = 1, job_dir: str | None = None) -> JobSpec:
    return JobSpec(
        campaign="c", point_id=point, repeat=0, attempt=1, experiment="e", method="lora",
        entity={"model_name": model, "batch_size": batch, "torch_dtype": dtype}, job_dir=job_dir or f"/w/{point}",
        partition="p", cpu_partition=True, model_source=model, dataset_id="d", dataset_path="/d", data_dir="/d",
        resources={"job_name": point, "partition": "p", "nodes": 1, "cpus_per_task": cpus, "time": time,
                   "output": f"/w/{point}/slurm-%j.out"},
        launcher="python", num_machines=1, num_processes=1, processes_per_node=1, port=20000,
        accelerate_config=None, deepspeed_config=None, train_argv=[], python="python", setup=[], env={},
        host_env={}, host_addresses={}, trials=trials, runner={}, trainer=trainer)


# -- which points pack together ------------------------------------------------------------------------------

def test_points_of_one_shape_model_trainer_and_dtype_pack_in_ascending_batch_size() -> None:
    specs = [spec("b8", 8), spec("b2", 2), spec("other-model", 4, model="big"), spec("b4", 4),
             spec("fms", 2, trainer="fms-hf-tuning"), spec("more-cpus", 2, cpus=4), spec("fp32", 2, dtype="float32"),
             spec("b1", 1)]
    packs = make_packs(specs, 3)
    ids = [[s.point_id for s in p] for p in packs]
    # one group of four (sorted by batch size, then cut in packs of at most 3); everything else alone
    assert ids[:2] == [["b1", "b2", "b4"], ["b8"]]
    assert sorted(map(tuple, ids[2:])) == [("fms",), ("fp32",), ("more-cpus",), ("other-model",)]
    assert make_packs(specs, 1) == [[s] for s in specs]  # pack: 1 packs nothing


def test_auto_packs_what_the_partitions_time_limit_holds_and_stability_runs_alone() -> None:
    scan = [spec(f"b{b}", b, time="01:00:00") for b in (16, 1, 4, 2, 8)]
    assert [[s.point_id for s in p] for p in make_packs(scan, "auto", "03:00:00")] == [["b1", "b2", "b4"],
                                                                                       ["b8", "b16"]]
    many = [spec(f"b{b}", b) for b in range(1, 12)]
    assert [len(p) for p in make_packs(many, "auto")] == [AUTO_MAX, 11 - AUTO_MAX]  # no stated limit
    # each point asks for the partition's whole limit (no slurm.time): 8, the pack limited to the partition's
    assert [len(p) for p in make_packs(many, "auto", "00:10:00")] == [AUTO_MAX, 11 - AUTO_MAX]
    trials = [spec("s1", 1, trials=5), spec("s2", 2, trials=5)]
    assert make_packs(trials, 4) == [[trials[0]], [trials[1]]]
    # the pack's time: its points' summed, within the partition's limit
    assert pack_time(scan[:2], None) == "02:00:00" and pack_time(scan, "03:00:00") == "03:00:00"
    assert pack_time([spec("a", 1, time="1-00:00:00"), spec("b", 2, time="12:00:00")], None) == "1-12:00:00"


@pytest.mark.parametrize("value", ["0", "-1", "65", "many", "true", "2.5", "[2]"])
def test_a_bad_pack_value_is_refused_naming_the_file_the_key_and_the_fix(tmp_path: Path, cli, value: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"campaign: c\nexperiment: finetune_lora_benchmark-v1.0.0\nentity:\n  model_name: tiny\n"
                    f"  batch_size: 2\nslurm:\n  pack: {value}\n")
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    msg = str(err.value)
    assert f"{path}:7: slurm.pack" in msg and "'pack: auto'" in msg and "from 1 to 64" in msg
    res = cli("plan", path, "-i", TEST_INVENTORY)
    assert res.exit_code == 2 and "slurm.pack" in res.output and "Traceback" not in res.output


def test_good_pack_values_load(tmp_path: Path) -> None:
    for value, want in (("auto", "auto"), ("4", 4), ("1", 1)):
        path = tmp_path / f"s{want}.yaml"
        path.write_text(f"campaign: c\nexperiment: finetune_lora_benchmark-v1.0.0\nentity:\n  model_name: tiny\n"
                        f"slurm:\n  pack: {value}\n")
        assert load_sweep(path).slurm.pack == want


# -- the pack's script ---------------------------------------------------------------------------------------

def test_the_pack_script_runs_its_points_in_order_skips_a_cancelled_one_and_requeues_the_rest_after_an_oom(
        tmp_path: Path) -> None:
    """The body SLURM runs (bash, for real): each point's job.sbatch in turn; a failed point does not stop the
    pack; after an invalid (OOM) point the rest go to the requeue function; the job ends 0."""
    log = tmp_path / "ran.txt"
    dirs = []
    for name, outcome in (("a", "failed"), ("b", "ok"), ("c", "ok"), ("d", "invalid"), ("e", "ok"), ("f", "ok")):
        d = tmp_path / name
        d.mkdir()
        (d / "job.sbatch").write_text(f'echo {name} >> {log}\nprintf \'{{\\n  "outcome": "{outcome}"\\n}}\\n\' > '
                                      f'{d}/result.h.json\nexit {1 if outcome == "failed" else 0}\n')
        dirs.append(str(d))
    (tmp_path / "c" / "submitted.json").write_text(json.dumps({"cancelled_at": "2026-01-01T00:00:00"}, indent=2))
    requeue = f'sbench_requeue() (\n  echo "$@" > {tmp_path}/requeued.txt\n)'
    body = "\n".join(pack_lines([dirs[:1], dirs], requeue))
    res = subprocess.run(["bash", "-c", body], env={**os.environ, "SLURM_ARRAY_TASK_ID": "1"}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert log.read_text().split() == ["a", "b", "d"]  # c cancelled; after d's OOM nothing more ran here
    assert (tmp_path / "requeued.txt").read_text().split() == dirs[4:]
    assert "ran out of GPU memory" in res.stdout and "was cancelled with sbench cancel" in res.stdout


# -- a real local pack ---------------------------------------------------------------------------------------

def _sweep(root: Path, model: Path, data: Path, name: str, batches: list[int], pack: int | str) -> Path:
    return write_yaml(root / f"{name}.yaml", kit.sweep(model, data, campaign=name, entity={"max_steps": 3},
                                                       grid={"batch_size": batches}, runner={"sample_interval_s": 0.05},
                                                       slurm={"pack": pack}))


@pytest.fixture(scope="module")
def local_env(tmp_path_factory, tiny_model, small_data_dir):
    root = tmp_path_factory.mktemp("pack")
    return {"root": root, "workdir": root / "runs", "db": root / "results.duckdb", "model": tiny_model,
            "data": small_data_dir}


def _run(cli, env, *args, code: int = 0):
    res = cli(*args, "--workdir", env["workdir"], "--db", env["db"])
    assert res.exit_code == code, res.output
    return res


def _first_train(job_dir: str) -> float:
    rows = [json.loads(x) for x in JobPaths(job_dir).stages(JobPaths(job_dir).stage_hosts()[0]).read_text()
            .splitlines()]
    return min(r["t_wall"] for r in rows if r.get("stage") == "train")


@pytest.mark.train
def test_a_local_pack_runs_each_point_as_its_own_run_with_exact_measurements(local_env, cli) -> None:
    env = local_env
    sweep = _sweep(env["root"], env["model"], env["data"], "pack-local", [4, 2], 2)
    rep = json.loads(_run(cli, env, "submit", sweep, "--executor", "local", "--wait", "--json").stdout)
    assert rep["submitted"] == 2
    _run(cli, env, "collect")
    runs = sql_rows(env["db"], "SELECT r.*, p.batch_size FROM runs r JOIN points p USING (point_id) "
                               "WHERE r.campaign = 'pack-local' ORDER BY p.batch_size")
    assert [(r["batch_size"], r["outcome"]) for r in runs] == [(2, "ok"), (4, "ok")], [r["reason"] for r in runs]
    subs = [json.loads(JobPaths(r["job_dir"]).submitted.read_text()) for r in runs]
    # one local job (one allocation) ran both, the smaller batch first, each from its own job dir
    assert subs[0]["job_id"] == subs[1]["job_id"] and subs[0]["pack"]["size"] == 2
    assert [s["pack"]["index"] for s in subs] == [0, 1]
    assert subs[0]["pack"]["job_dirs"] == [r["job_dir"] for r in runs]
    assert _first_train(runs[0]["job_dir"]) < _first_train(runs[1]["job_dir"])
    # the sbench trainer ran both in one training process: one pid, and the second point paid no launch
    docs = [json.loads(JobPaths(r["job_dir"]).rank_result(0).read_text()) for r in runs]
    assert docs[0]["pid"] == docs[1]["pid"]
    launches = sql_rows(env["db"], "SELECT s.run_id, s.info FROM stages s WHERE s.stage = 'launch' AND s.run_id IN "
                                   "(SELECT run_id FROM runs WHERE campaign = 'pack-local')")
    by_run = {x["run_id"]: json.loads(x["info"]) if isinstance(x["info"], str) else x["info"] for x in launches}
    assert by_run[runs[1]["run_id"]]["imports_s"] < 0.5 < by_run[runs[0]["run_id"]]["imports_s"]
    for r in runs:  # each point's measurements recomputed from its own job dir's files
        paths = JobPaths(r["job_dir"])
        (m,) = sql_rows(env["db"], "SELECT * FROM measurements WHERE run_id = ?", [r["run_id"]])
        rank0 = json.loads(paths.rank_result(0).read_text())
        start, end = rank0["train_start_wall"], rank0["train_end_wall"]
        assert rank0["metrics"]["train_samples"] == 3 * r["batch_size"]
        assert m["train_runtime"] == pytest.approx(end - start, rel=1e-3)
        assert m["dataset_tokens_per_second"] == pytest.approx(rank0["metrics"]["dataset_tokens"] / (end - start),
                                                               rel=1e-3)
        d = float(json.loads(paths.spec.read_text())["jobspec"]["runner"]["sample_interval_s"])
        (host,) = paths.sample_hosts()
        with paths.samples(host).open() as fh:
            rows = [x for x in csv.DictReader(fh) if x["kind"] == "proc"]
        spans = [(min(float(x["t_wall"]), end) - max(float(x["t_wall"]) - d, start), x) for x in rows]
        spans = [(w, x) for w, x in spans if w > 0]
        assert spans
        cpu = sum(w * float(x["cpu_pct"]) for w, x in spans) / sum(w for w, _ in spans)
        assert m["cpu_compute_utilization"] == pytest.approx(cpu, rel=1e-9)
        # its samples are its own: none before its node runner started
        (res,) = [json.loads(paths.result(h).read_text()) for h in paths.result_hosts()]
        assert min(float(x["t_wall"]) for x in rows) >= res["started_wall"] - 1.0
    st = json.loads(_run(cli, env, "status", "--campaign", "pack-local", "--json").stdout)
    assert sorted(r["phase"] for r in st["rows"]) == ["ok", "ok"]


@pytest.mark.train
@pytest.mark.slow(10)
def test_after_an_oom_in_a_pack_the_rest_run_unpacked_and_earlier_results_stay(local_env, cli,
                                                                              monkeypatch) -> None:
    env = local_env
    monkeypatch.setenv("SBENCH_FAULT", "oom@step=1,batch=4")
    sweep = _sweep(env["root"], env["model"], env["data"], "pack-oom", [6, 2, 4], 3)
    out = _run(cli, env, "submit", sweep, "--executor", "local", "--wait").stdout
    assert "3 attempt(s) ended: 2 ok, 1 invalid, 0 failed" in out
    monkeypatch.delenv("SBENCH_FAULT")
    _run(cli, env, "collect")
    runs = sql_rows(env["db"], "SELECT r.*, p.batch_size FROM runs r JOIN points p USING (point_id) "
                               "WHERE r.campaign = 'pack-oom' ORDER BY p.batch_size")
    assert [(r["batch_size"], r["outcome"]) for r in runs] == [(2, "ok"), (4, "invalid"), (6, "ok")], \
        [r["reason"] for r in runs]
    subs = [json.loads(JobPaths(r["job_dir"]).submitted.read_text()) for r in runs]
    # 2 and 4 ran in the pack's job; 6 went back to the queue and ran as its own job, after 4's OOM
    assert subs[0]["job_id"] == subs[1]["job_id"] != subs[2]["job_id"]
    assert subs[2].get("requeued_at") and not subs[2].get("pack")
    assert _first_train(runs[2]["job_dir"]) > _first_train(runs[1]["job_dir"])
    assert len(sql_rows(env["db"], "SELECT * FROM measurements WHERE run_id IN (SELECT run_id FROM runs WHERE "
                                   "campaign = 'pack-oom' AND outcome = 'ok')")) == 2


@pytest.mark.train
@pytest.mark.slow(15)
def test_a_packed_search_scans_its_batches_and_does_not_start_one_after_its_shapes_oom(local_env, cli,
                                                                                      monkeypatch) -> None:
    # batch 2 "runs out of memory"; batch 4 would run if started (no fault): the pack must not start it
    env = local_env
    doc = kit.sweep(env["model"], env["data"], campaign="pack-scan", entity={"max_steps": 3},
                    grid={"batch_size": [1, 2, 4]}, runner={"sample_interval_s": 0.05}, slurm={"pack": 3},
                    search={"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit"})
    sweep = write_yaml(env["root"] / "pack-scan.yaml", doc)
    plan = cli("plan", sweep)
    assert plan.exit_code == 0 and "by a scan (slurm.pack" in plan.output, plan.output
    monkeypatch.setenv("SBENCH_FAULT", "oom@step=1,batch=2")
    out = json.loads(_run(cli, env, "submit", sweep, "--executor", "local", "--wait", "--json").stdout)
    monkeypatch.delenv("SBENCH_FAULT")
    # batch 4, not started, is no failure of the search: submit --wait ends 0, and retry does not run it
    assert out["summary"]["counts"]["not needed"] == 1 and out["summary"]["counts"]["failed"] == 0, out["summary"]
    assert out["summary"]["campaign"]["done"] and len(out["summary"]["campaign"]["not_needed"]) == 1
    again = json.loads(_run(cli, env, "retry", "pack-scan", "--executor", "local", "--json").stdout)
    assert again["submitted"] == 0 and any(p["reason"].startswith("search: not needed (bounded above by batch 2")
                                           for p in again["points"]), again["points"]
    _run(cli, env, "collect")
    runs = sql_rows(env["db"], "SELECT r.*, p.batch_size FROM runs r JOIN points p USING (point_id) "
                               "WHERE r.campaign = 'pack-scan' ORDER BY p.batch_size, r.repeat, r.attempt")
    first = {r["batch_size"]: r for r in runs if r["repeat"] == 0}
    assert {b: r["outcome"] for b, r in first.items()} == {1: "ok", 2: "invalid", 4: "failed"}, runs
    assert first[1]["job_id"] == first[2]["job_id"]  # one pack, in ascending order
    assert "a search's scan needs no larger batch" in first[4]["reason"] and "batch 2" in first[4]["reason"]
    assert not JobPaths(first[4]["job_dir"]).stage_hosts()
    assert [r["attempt"] for r in runs if r["batch_size"] == 4] == [1]  # neither requeued nor retried
    status = json.loads(_run(cli, env, "status", "--campaign", "pack-scan", "--json").stdout)
    assert status["counts"].get("not needed (search)") == 1 and "failed" not in status["counts"], status["counts"]
    ans = json.loads(_run(cli, env, "best", "pack-scan", "--json").stdout)
    assert ans["done"] and not ans["stuck"] and ans["best"]["batch_size"] == 1
    (fit,) = ans["max_batch_size"]
    assert (fit["batch_size"], fit["smallest_oom"]) == (1, 2)


# -- the real SLURM test cluster -----------------------------------------------------------------------------

@pytest.mark.slurm
@pytest.mark.train
@pytest.mark.parametrize("nodes,batches", [(1, [4, 1, 2]), (2, [4, 2])], ids=["one-node", "two-nodes"])
@pytest.mark.slow(20)
def test_a_packed_scan_on_slurm_runs_in_one_allocation_with_one_ok_run_per_point(slurm_cluster, tiny_model,
                                                                                 small_data_dir, tmp_path, cli,
                                                                                 nodes, batches):
    """One node, and a 2-node shape (one process per node, DDP across the nodes in one training process)."""
    env = {"workdir": tmp_path / "runs", "db": tmp_path / "results.duckdb"}
    entity = {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "number_gpus": nodes,
              "gradient_accumulation_steps": 1, "max_steps": 3}
    if nodes > 1:
        entity.update(number_nodes=nodes, distributed_backend="DDP")
    doc = {"campaign": "pack-slurm", "experiment": "finetune_lora_benchmark-v1.0.0", "partition": "cpu",
           "entity": entity, "grid": {"batch_size": batches}, "model_map": {"tiny": str(tiny_model)},
           "data_dir": str(small_data_dir), "runner": {"sample_interval_s": 0.5}, "slurm": {"pack": "auto"}}
    sweep = write_yaml(tmp_path / "s.yaml", doc)
    rep = json.loads(_run(cli, env, "submit", sweep, "-i", TEST_INVENTORY, "--executor", "slurm", "--wait",
                          "--json").stdout)
    assert rep["submitted"] == len(batches) and rep["sbatch_calls"] == 1
    assert len({p["job_id"] for p in rep["points"]}) == 1  # every point, one allocation
    import time

    time.sleep(2)  # sacct trails slurmctld
    _run(cli, env, "collect")
    runs = sql_rows(env["db"], "SELECT r.*, p.batch_size FROM runs r JOIN points p USING (point_id) "
                               "WHERE r.campaign = 'pack-slurm' ORDER BY p.batch_size")
    assert [(r["batch_size"], r["outcome"]) for r in runs] == [(b, "ok") for b in sorted(batches)], \
        [r["reason"] for r in runs]
    assert all(len(JobPaths(r["job_dir"]).result_hosts()) == nodes for r in runs)
    assert len({r["job_id"] for r in runs}) == 1
    starts = [_first_train(r["job_dir"]) for r in runs]
    assert starts == sorted(starts)
    for r in runs:
        (m,) = sql_rows(env["db"], "SELECT * FROM measurements WHERE run_id = ?", [r["run_id"]])
        rank0 = json.loads(JobPaths(r["job_dir"]).rank_result(0).read_text())
        runtime = rank0["train_end_wall"] - rank0["train_start_wall"]
        assert m["dataset_tokens_per_second"] == pytest.approx(rank0["metrics"]["dataset_tokens"] / runtime,
                                                               rel=1e-3)
        # the run's own time, not the pack's: its elapsed is its node runner's
        res = [json.loads(JobPaths(r["job_dir"]).result(h).read_text()) for h in JobPaths(r["job_dir"]).result_hosts()]
        assert r["elapsed_s"] == pytest.approx(max(x["ended_wall"] for x in res) - min(x["started_wall"] for x in res),
                                               abs=2.0)


@pytest.mark.slurm
@pytest.mark.train
@pytest.mark.slow(15)
def test_after_an_oom_in_a_slurm_pack_the_rest_is_requeued_from_the_node_as_its_own_job(
        slurm_cluster, tiny_model, small_data_dir, tmp_path, cli, monkeypatch):
    import time

    env = {"workdir": tmp_path / "runs", "db": tmp_path / "results.duckdb"}
    doc = {"campaign": "pack-slurm-oom", "experiment": "finetune_full_benchmark-v1.0.0", "partition": "cpu",
           "entity": {"model_name": "tiny", "model_max_length": 64, "dataset_id": SMALL_DATASET, "number_gpus": 1,
                      "gradient_accumulation_steps": 1, "max_steps": 2},
           "grid": {"batch_size": [1, 2, 4]}, "model_map": {"tiny": str(tiny_model)},
           "data_dir": str(small_data_dir), "runner": {"sample_interval_s": 0.5}, "slurm": {"pack": 3}}
    sweep = write_yaml(tmp_path / "s.yaml", doc)
    monkeypatch.setenv("SBENCH_FAULT", "oom@step=1,batch=2")
    rep = json.loads(_run(cli, env, "submit", sweep, "-i", TEST_INVENTORY, "--executor", "slurm", "--wait",
                          "--json").stdout)
    monkeypatch.delenv("SBENCH_FAULT")
    assert rep["sbatch_calls"] == 1 and len({p["job_id"] for p in rep["points"]}) == 1
    deadline = time.monotonic() + 180
    while True:  # the requeued point runs in a job of its own, which submit --wait did not know of
        time.sleep(3)
        _run(cli, env, "collect")
        runs = sql_rows(env["db"], "SELECT r.*, p.batch_size FROM runs r JOIN points p USING (point_id) "
                                   "WHERE r.campaign = 'pack-slurm-oom' ORDER BY p.batch_size")
        if len(runs) == 3 and all(r["outcome"] for r in runs) or time.monotonic() > deadline:
            break
    assert [(r["batch_size"], r["outcome"]) for r in runs] == [(1, "ok"), (2, "invalid"), (4, "ok")], \
        [(r["reason"], r["job_id"]) for r in runs]
    assert runs[0]["job_id"] == runs[1]["job_id"] != runs[2]["job_id"]
    assert runs[2]["submit_reason"].startswith("requeued unpacked")
    assert _first_train(runs[2]["job_dir"]) > _first_train(runs[1]["job_dir"])


def test_the_in_process_pack_script_requeues_only_the_points_its_process_did_not_reach(tmp_path: Path) -> None:
    dirs = [tmp_path / n for n in "abc"]
    for d in dirs:
        d.mkdir()
    # the first point's job.sbatch stands for the node runner: it reached a and b (stages), then failed
    (dirs[0] / "job.sbatch").write_text(f'echo "$SBENCH_PACK" > {tmp_path}/pack.txt\n'
                                        f'touch {dirs[0]}/stages.h.jsonl {dirs[1]}/stages.h.jsonl\nexit 1\n')
    requeue = f'sbench_requeue() (\n  echo "$@" > {tmp_path}/requeued.txt\n)'
    body = "\n".join(pack_lines([[str(d) for d in dirs]], requeue, in_process=True))
    res = subprocess.run(["bash", "-c", body], env={**os.environ, "SLURM_ARRAY_TASK_ID": "0"}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "pack.txt").read_text()) == [str(d) for d in dirs]
    assert (tmp_path / "requeued.txt").read_text().split() == [str(dirs[2])]


@pytest.mark.train
def test_cancel_and_retry_work_per_point_of_a_pack(local_env, cli, monkeypatch) -> None:
    """Cancel while the pack's second point trains: the first keeps its ok result, the second and third are
    cancelled, each its own attempt, and retry decides each point on its own."""
    import time

    env = local_env
    monkeypatch.setenv("SBENCH_FAULT", "sleep@step=1,batch=4:120")
    sweep = _sweep(env["root"], env["model"], env["data"], "pack-cancel", [2, 4, 6], 3)
    rep = json.loads(_run(cli, env, "submit", sweep, "--executor", "local", "--json").stdout)
    monkeypatch.delenv("SBENCH_FAULT")
    dirs = {p["point_id"]: p["job_dir"] for p in rep["points"]}
    order = sorted(dirs.values(), key=lambda d: json.loads(JobPaths(d).submitted.read_text())["pack"]["index"])
    second = order[1]
    deadline = time.monotonic() + 240
    while not (JobPaths(second).stage_hosts() and '"stage":"train"' in
               JobPaths(second).stages(JobPaths(second).stage_hosts()[0]).read_text().replace(" ", "")):
        assert time.monotonic() < deadline, "the pack's second point never started training"
        time.sleep(1)
    _run(cli, env, "cancel", "--campaign", "pack-cancel")
    deadline = time.monotonic() + 60
    while json.loads(_run(cli, env, "status", "--campaign", "pack-cancel", "--json").stdout)["counts"].get("running"):
        assert time.monotonic() < deadline
        time.sleep(1)
    _run(cli, env, "collect")
    runs = sql_rows(env["db"], "SELECT r.*, p.batch_size FROM runs r JOIN points p USING (point_id) "
                               "WHERE r.campaign = 'pack-cancel' ORDER BY p.batch_size")
    assert [(r["batch_size"], r["outcome"]) for r in runs] == [(2, "ok"), (4, "failed"), (6, "failed")], \
        [r["reason"] for r in runs]
    assert all("cancel" in r["reason"] for r in runs[1:])
    # retry decides per point: the measured one stays, each cancelled one is its own attempt to force
    again = json.loads(_run(cli, env, "retry", "pack-cancel", "--executor", "local", "--json").stdout)
    why = {p["point_id"]: p["reason"] for p in again["points"]}
    assert why[runs[0]["point_id"]].startswith("already measured")
    assert all("was cancelled with sbench cancel" in why[r["point_id"]] for r in runs[1:]), why
    assert again["submitted"] == 0


class QuotaSlurm:
    """sbatch with room for *free* jobs; every submitted script is kept."""

    def __init__(self, free: int) -> None:
        self.free, self.scripts, self.next = free, [], 500

    def submit_limits(self, qos=None):
        from harness.slurm.limits import SubmitLimits

        return SubmitLimits(20, free=self.free, limit=self.free)

    def states(self, ids, keys=None):
        return {}

    def sbatch(self, script: str, folder: Path, **kw) -> str:
        self.scripts.append(script)
        self.next += 1
        return str(self.next)


def test_packs_that_do_not_fit_the_submit_quota_are_held_and_fed_as_packs(tmp_path: Path) -> None:
    from harness.campaign.executors import feed
    from harness.campaign.executors.base import SubmitOptions
    from harness.slurm.held import held_count, read_feed

    cdir = tmp_path / "c"
    specs = []
    for b in (6, 1, 5, 2, 4, 3):
        d = cdir / f"b{b}.r0.a1"
        d.mkdir(parents=True)
        specs.append(spec(f"b{b}", b, job_dir=str(d)))
    packs = make_packs(specs, 2)
    slurm = QuotaSlurm(free=2)  # one task now (one job's room kept for the feeder), the rest held
    out, calls = feed.start(slurm, cdir, "c", specs, [], SubmitOptions(feeder_script="#!/bin/bash\n", pack=2),  # type: ignore[arg-type]
                            packs)
    assert calls == 1 and held_count(read_feed(cdir)) == 4
    now = [s for s in out if s.job_id]
    assert sorted(s.spec.point_id for s in now) == ["b1", "b2"] and len({s.job_id for s in now}) == 1
    assert "JOB_DIRS=(" in slurm.scripts[0] and "SBENCH_PACK=" in slurm.scripts[0]  # a pack, in one process
    first = json.loads((cdir / "b2.r0.a1" / "submitted.json").read_text())
    assert first["pack"] == {"index": 1, "size": 2, "job_dirs": [str(cdir / "b1.r0.a1"), str(cdir / "b2.r0.a1")]}
    assert json.loads((cdir / "b6.r0.a1" / "submitted.json").read_text()).get("held_back_at")
    slurm.free = 10
    doc = feed.feed(cdir, slurm=slurm)  # the feeder's turn: the held packs, still packs
    assert held_count(doc) == 0
    subs = {b: json.loads((cdir / f"b{b}.r0.a1" / "submitted.json").read_text()) for b in range(1, 7)}
    assert subs[3]["job_id"] == subs[4]["job_id"] != subs[5]["job_id"] == subs[6]["job_id"]
    assert [subs[b]["pack"]["index"] for b in (3, 4, 5, 6)] == [0, 1, 0, 1]
    lines = [json.loads(x) for x in (cdir / "manifest.jsonl").read_text().splitlines()]
    fed = [x for x in lines if x.get("fed")]
    assert sorted(x["point_id"] for x in fed) == ["b3", "b4", "b5", "b6"] and all(x["pack_size"] == 2 for x in fed)
