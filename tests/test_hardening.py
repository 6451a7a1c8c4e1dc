"""Hostile and broken input: every one gives exit 2 naming the key, with nothing written; scripts never
run a value; processes are controlled exactly; the database cannot be written through ``query``; and a
bad job directory costs its own run only.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from harness.build.jobspec import build_jobspec
from harness.build.render import render_env, render_files, render_launch
from harness.build.sbatch import job_sbatch
from harness.campaign.executors.local import LocalBackend, kill_launch, timeout_minutes
from harness.collect import collect
from harness.contract.paths import JobPaths
from harness.slurm import localjob
from harness.spec.inventory import load_inventory
from harness.spec.plan import plan_sweep
from harness.spec.sweep import load_sweep

from .kit import LAB_INVENTORY, LAB_SWEEP, ROOT, Campaign, sbench, setin, sql_rows, write_yaml
from .kit.jobdirs import T0, append_manifest, make_run, write_json


def nothing_written(lab: dict[str, Path]) -> None:
    for key in ("workdir", "db", "out"):
        assert not lab[key].exists(), f"{lab[key]} was written"


CANARY_CMD = "touch /tmp/sbench-canary"
HOSTILE = f"x$({CANARY_CMD})`{CANARY_CMD}`';{CANARY_CMD};'\"\n{CANARY_CMD}\n#"

# (which file, path to the key, value, what the message must name)
CORPUS = [
    ("sweep", ("grid", "batch_size"), [100000000000000000000001], "grid.batch_size[0]"),
    ("sweep", ("entity", "model_max_length"), 2**70, "model_max_length"),
    ("sweep", ("repeats",), 100000000, "repeats"),
    ("sweep", ("grid", "batch_size"), list(range(2, 1202)), "grid"),
    ("sweep", ("campaign",), "abc\n", "campaign"),
    ("sweep", ("campaign",), "../x", "campaign"),
    ("sweep", ("partition",), "cpu\n", "partition"),
    ("sweep", ("entity", "batch_size"), None, "batch_size"),
    ("sweep", ("entity", "num_train_epochs"), math.nan, "num_train_epochs"),
    ("sweep", ("entity", "stop_after_seconds"), math.inf, "stop_after_seconds"),
    ("sweep", ("runner", "sample_interval_s"), math.nan, "runner.sample_interval_s"),
    ("sweep", ("runner", "memory_every_steps"), 0, "runner.memory_every_steps"),
    ("sweep", ("references", "mfu"), {"value": math.inf, "lower": 0.1}, "references.mfu.value"),
    ("sweep", ("references", "mfu"), {"value": 0.4, "upper": -1}, "references.mfu.upper"),
    ("sweep", ("references", "mfu"), {"value": 0.4, "lower": 0.1, "model_name": "x\n$(id)"}, "references.mfu"),
    ("sweep", ("entity", "fsdp_offload_params"), "maybe", "fsdp_offload_params"),
    ("sweep", ("entity", "deepspeed_zero_stage"), 4, "deepspeed_zero_stage"),
    ("sweep", ("entity", "deepspeed_zero_stage"), "3; id", "deepspeed_zero_stage"),
    ("sweep", ("entity", "deepspeed_offload_optimizer"), "yes", "deepspeed_offload_optimizer"),
    ("sweep", ("entity", "use_qlora"), [True], "use_qlora"),
    ("sweep", ("entity", "optim_args"), "momentum=0.9;$(id)", "optim_args"),
    ("sweep", ("entity", "optim_args"), "momentum", "optim_args"),
    ("sweep", ("entity", "distributed_backend"), "ZERO3", "distributed_backend"),
    ("sweep", ("entity", "trainer"), "fms", "trainer"),
    ("sweep", ("grid", "trainer"), ["sbench", "fms-hf-tuning\n$(id)"], "trainer"),
    ("sweep", ("entity", "fms_hf_tuning_version"), "3.2.2 && id", "fms_hf_tuning_version"),
    ("sweep", ("entity", "fms_hf_tuning_version"), "../../x", "fms_hf_tuning_version"),
    ("sweep", ("slurm", "mem_gb"), math.inf, "slurm.mem_gb"),
    ("sweep", ("slurm", "time"), "1:00:00\n#SBATCH --wrap=id", "slurm.time"),
    ("sweep", ("slurm", "account"), "acct $(id)", "slurm.account"),
    ("sweep", ("slurm", "max_parallel"), 2**64, "slurm.max_parallel"),
    ("sweep", ("entity", "model_name"), "tiny\n$(id)", "model_name"),
    ("sweep", ("entity", "dataset_text_field"), "out\x00put", "dataset_text_field"),
    ("sweep", ("model_map", "tiny"), "./missing-model", "model_map.tiny"),
    ("sweep", ("description",), "d\x1b[31m", "description"),
    ("sweep", ("data_dir",), "/tmp/x\n", "data_dir"),
    ("inventory", ("partitions", "cpu", "memory_gb"), math.nan, "partitions.cpu.memory_gb"),
    ("inventory", ("partitions", "cpu", "gpu_memory_gb"), math.inf, "partitions.cpu.gpu_memory_gb"),
    ("inventory", ("partitions", "cpu", "gpus_per_node"), "8", "partitions.cpu.gpus_per_node"),
    ("inventory", ("partitions", "cpu", "cpus_per_node"), 2**63, "partitions.cpu.cpus_per_node"),
    ("inventory", ("partitions", "cpu", "slurm_partition"), HOSTILE, "partitions.cpu.slurm_partition"),
    ("inventory", ("partitions", "cpu", "time_limit"), "forever", "partitions.cpu.time_limit"),
    ("inventory", ("partitions", "cpu", "hosts", "h1", "address"), "1.2.3.4; id", "hosts.h1.address"),
    ("inventory", ("partitions", "cpu", "hosts", "h1\n"), {"address": "10.0.0.9"}, "hosts.h1"),
    ("inventory", ("partitions", "cpu", "hosts", "h1", "env", "A\n"), "1", "env.A"),
    ("inventory", ("partitions", "cpu", "hosts", "h1", "env", "A"), "x\ny", "env.A"),
    ("inventory", ("partitions", "cpu", "hosts", "h2", "roce", "hcas"), ["mlx5_0:1\n"], "roce.hcas[0]"),
    ("inventory", ("partitions", "cpu", "hosts", "h2", "roce", "gid_index"), 2**40, "roce.gid_index"),
    ("inventory", ("partitions", "cpu", "hosts", "h2", "roce", "socket_ifname"), "eth0 $(id)",
     "roce.socket_ifname"),
    ("inventory", ("partitions", "cpu", "setup"), [f"module load x\n{CANARY_CMD}"], "partitions.cpu.setup[0]"),
    ("inventory", ("defaults", "python"), "/usr/bin/python3\x00", "defaults.python"),
    ("inventory", ("defaults", "envs_dir"), "/shared/envs\n$(id)", "defaults.envs_dir"),
    ("inventory", ("cluster",), "lab\n", "cluster"),
]


def _corpus_id(case: tuple) -> str:
    return f"{case[0]}:{'.'.join(case[1])}"


@pytest.mark.parametrize("case", CORPUS, ids=[_corpus_id(c) for c in CORPUS])
def test_bad_input_exits_2_naming_the_key_and_writes_nothing(lab, case) -> None:
    which, dotted, value, key = case
    inv, sweep = copy.deepcopy(LAB_INVENTORY), copy.deepcopy(LAB_SWEEP)
    if which == "sweep":
        sweep = setin(sweep, dotted, value)
    else:
        inv = setin(inv, dotted, value)
    write_yaml(lab["inv"], inv)
    write_yaml(lab["sweep"], sweep)
    for cmd in (["plan"], ["render", "-o", lab["out"]],
                ["submit", "--executor", "local", "--workdir", lab["workdir"], "--db", lab["db"]]):
        res = sbench(cmd[0], lab["sweep"], "-i", lab["inv"], *cmd[1:], in_process=True, ok=None)
        assert res.exit_code == 2, (cmd, res.output)
        assert res.output.startswith("Error: ") and key in res.output, (cmd, res.output)
        assert "Traceback" not in res.output
    nothing_written(lab)
    assert not Path("/tmp/sbench-canary").exists()


def test_the_same_host_with_two_addresses_is_refused(lab) -> None:
    inv = copy.deepcopy(LAB_INVENTORY)
    inv["partitions"]["gpu"] = {"gpu_model": "NVIDIA-H100-80GB-HBM3", "gpus_per_node": 8, "cpus_per_node": 8,
                                "memory_gb": 16, "hosts": {"h1": {"address": "10.0.0.1"}}}
    res = sbench("inventory", "check", "-i", write_yaml(lab["inv"], inv), in_process=True, ok=None)
    assert res.exit_code == 2 and "partitions.gpu.hosts.h1.address" in res.output and "127.0.0.1" in res.output


@pytest.mark.parametrize("text,what", [
    ("a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9)), "expands to"),
    ("campaign: x\nbatch: " + "9" * 5000 + "\n", "invalid YAML"),
    ("x: " + "[" * 200 + "]" * 200 + "\n", "nested"),
    ("a: &a [*a]\n", "recursive"),
    ("k: v\n" * 2, "duplicate key"),
])
def test_yaml_bombs_are_refused_fast(lab, text: str, what: str) -> None:
    write_yaml(lab["inv"], LAB_INVENTORY)
    t = time.monotonic()
    res = sbench("plan", write_yaml(lab["sweep"], text), "-i", lab["inv"], in_process=True, ok=None)
    assert time.monotonic() - t < 5
    assert res.exit_code == 2 and what in res.output, res.output


def test_an_oversized_document_is_refused_before_it_is_parsed(lab) -> None:
    write_yaml(lab["inv"], LAB_INVENTORY)
    big = lab["sweep"]
    big.write_text("campaign: x\n" + "# padding\n" * 200_000)
    res = sbench("plan", big, "-i", lab["inv"], in_process=True, ok=None)
    assert res.exit_code == 2 and "at most 1048576" in res.output


def test_unlimited_time_is_legal_and_runs_without_a_local_timeout(lab) -> None:
    inv = setin(LAB_INVENTORY, ("partitions", "cpu", "time_limit"), "UNLIMITED")
    sweep = copy.deepcopy(LAB_SWEEP)
    del sweep["slurm"]
    write_yaml(lab["inv"], inv)
    write_yaml(lab["sweep"], sweep)
    res = sbench("render", lab["sweep"], "-i", lab["inv"], "-o", lab["out"], in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    sbatch = next(lab["out"].glob("*/job.sbatch")).read_text()
    assert "#SBATCH --time=UNLIMITED" in sbatch
    assert timeout_minutes("UNLIMITED") >= 365 * 24 * 60 and timeout_minutes("1-00:00:00") == 1440


# -- scripts never run a value ------------------------------------------------------------------------------

def _hostile_spec(lab: dict[str, Path]):
    write_yaml(lab["inv"], LAB_INVENTORY)
    write_yaml(lab["sweep"], LAB_SWEEP)
    inv = load_inventory(lab["inv"])
    sweep = load_sweep(lab["sweep"])
    point = next(p for p in plan_sweep(sweep, inv) if p.valid and p.entity["number_gpus"] == 2)
    job_dir = lab["root"] / f"jd {HOSTILE}".replace("\n", "_") / "0123456789abcdef.r0.a1"
    spec = build_jobspec(sweep, inv, point, 1, str(job_dir))
    bad_host = f"h$({CANARY_CMD})"
    host_env = {"h1": {**spec.host_env["h1"], "EVIL": HOSTILE}, bad_host: dict(spec.host_env["h1"])}
    return dataclasses.replace(
        spec, campaign=HOSTILE, partition=HOSTILE, experiment=HOSTILE, point_id=HOSTILE, sbench_version=HOSTILE,
        model_source=HOSTILE, train_argv=[*spec.train_argv, "--evil", HOSTILE], env={**spec.env, "E2": HOSTILE},
        host_env=host_env, host_addresses={"h1": HOSTILE, bad_host: HOSTILE},
        resources={**spec.resources, "job_name": HOSTILE.replace("\n", " ")}), inv, sweep, point


def test_every_template_with_hostile_values_parses_and_runs_no_canary(lab, tmp_path: Path) -> None:
    canary = Path("/tmp/sbench-canary")
    canary.unlink(missing_ok=True)
    spec, inv, sweep, point = _hostile_spec(lab)
    files = render_files(spec, inv, point, sweep)
    jd = Path(spec.job_dir)
    for path, (text, mode) in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    for script in [jd / "job.sbatch", jd / "launch.sh", *sorted((jd / "env").glob("*.sh"))]:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, (script, proc.stderr)
    # A stand-in srun and a python that records its argv: run job.sbatch for real, as sbatch would.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    dump = tmp_path / "argv.json"
    dumper = tmp_path / "py"
    dumper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                      f"json.dump({{'argv': sys.argv, 'env': dict(os.environ)}}, open({str(dump)!r}, 'w'))\n")
    for f in (bindir / "srun", dumper):
        f.chmod(0o755)
    launch = (jd / "launch.sh").read_text().replace(f"PY={__import__('shlex').quote(spec.python)}",
                                                   f"PY={__import__('shlex').quote(str(dumper))}")
    (jd / "launch.sh").write_text(launch)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SBENCH_HOST": "h1", "SLURM_JOB_ID": "77"}
    proc = subprocess.run(["bash", str(jd / "job.sbatch")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(dump.read_text())
    assert got["argv"][-1] == HOSTILE and got["env"]["EVIL"] == HOSTILE and got["env"]["E2"] == HOSTILE
    assert got["env"]["SBENCH_MAIN_IP"] == "127.0.0.1" or got["env"]["SBENCH_MAIN_IP"] == HOSTILE
    # A host outside the partition takes the error path, which prints the partition name.
    proc = subprocess.run(["bash", str(jd / "launch.sh")], env={**env, "SBENCH_HOST": "nobody"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and HOSTILE.split("\n")[0] in proc.stderr
    assert not canary.exists(), "a rendered script ran a value"


def test_a_line_break_in_an_sbatch_option_or_a_bad_env_name_is_refused_not_written(lab) -> None:
    spec, inv, sweep, point = _hostile_spec(lab)
    from harness.contract.errors import RenderError

    with pytest.raises(RenderError, match="line break"):
        job_sbatch(dataclasses.replace(spec, resources={**spec.resources, "job_name": "a\nb"}))
    with pytest.raises(RenderError, match="not a valid name"):
        render_env(dataclasses.replace(spec, env={"A;id": "1"}), "h1")
    assert render_launch(spec)  # the hostile values themselves render (quoted)


# -- fuzz: random values of every wrong type, size and encoding ---------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

NASTY = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**31, max_value=2**80),
    st.integers(max_value=-1), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.text(alphabet=st.characters(max_codepoint=0x1f), max_size=5),
    st.sampled_from(["", " ", "UNLIMITED", "../x", "a\n", "$(id)", "cpu", "8", "1e999", "None", "\u202e"]),
    st.lists(st.integers(min_value=-3, max_value=64), max_size=3), st.lists(st.text(max_size=4), max_size=2),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    return out


INV_PATHS = _paths(LAB_INVENTORY) + [("partitions", "cpu", "hosts", "h3"), ("partitions", "p2"), ("zzz",)]
SWEEP_PATHS = _paths(LAB_SWEEP) + [("grid", "r"), ("entity", "fsdp_sharding_strategy"), ("runner", "auto_stop"),
                                   ("runner", "memory_every_steps"), ("references", "mfu"),
                                   ("references", "mfu", "lower"),
                                   ("entity", "fast_kernels"), ("grid", "enable_roce"), ("slurm", "exclusive")]
FUZZ = hypothesis.settings(max_examples=300, deadline=None, derandomize=True, database=None,
                           suppress_health_check=list(hypothesis.HealthCheck))


def _mutate(doc: dict, paths: list[tuple], picks: list[tuple[int, Any]]) -> dict:
    out = copy.deepcopy(doc)
    for i, value in picks:
        out = setin(out, paths[i % len(paths)], value)
    return out


def _fuzz_once(tmp: Path, inv: dict, sweep: dict) -> None:
    (tmp / "model").mkdir(exist_ok=True)
    out = tmp / "out"
    try:
        write_yaml(tmp / "inv.yaml", inv)
        write_yaml(tmp / "sweep.yaml", sweep)
    except (yaml.YAMLError, ValueError, RecursionError):
        return  # not representable as YAML: nothing a user could write
    for args in (["plan", "--json"], ["render", "-o", out]):
        res = sbench(args[0], tmp / "sweep.yaml", "-i", tmp / "inv.yaml", *args[1:], in_process=True, ok=None)
        assert res.exit_code in (0, 2), res.output
        if res.exit_code == 2:
            assert res.output.startswith("Error: "), res.output
            if args[0] == "render":
                assert not out.exists(), "render wrote files for bad input"


@hypothesis.given(picks=st.lists(st.tuples(st.integers(min_value=0), NASTY), min_size=1, max_size=3))
@FUZZ
def test_fuzz_the_inventory(tmp_path_factory, picks) -> None:
    _fuzz_once(tmp_path_factory.mktemp("fz"), _mutate(LAB_INVENTORY, INV_PATHS, picks), LAB_SWEEP)


@hypothesis.given(picks=st.lists(st.tuples(st.integers(min_value=0), NASTY), min_size=1, max_size=3))
@FUZZ
def test_fuzz_the_sweep(tmp_path_factory, picks) -> None:
    _fuzz_once(tmp_path_factory.mktemp("fz"), LAB_INVENTORY, _mutate(LAB_SWEEP, SWEEP_PATHS, picks))


@hypothesis.given(text=st.one_of(st.text(max_size=300), st.binary(max_size=300).map(
    lambda b: b.decode("latin-1"))))
@FUZZ
def test_fuzz_raw_documents(tmp_path_factory, text) -> None:
    tmp = tmp_path_factory.mktemp("fz")
    (tmp / "inv.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    write_yaml(tmp / "sweep.yaml", LAB_SWEEP)
    res = sbench("plan", tmp / "sweep.yaml", "-i", tmp / "inv.yaml", in_process=True, ok=None)
    assert res.exit_code in (0, 2), res.output


# -- relative paths become absolute ----------------------------------------------------------------------

def test_the_manifest_records_absolute_paths_so_retry_works_from_anywhere(lab, monkeypatch) -> None:
    write_yaml(lab["inv"], LAB_INVENTORY)
    write_yaml(lab["sweep"], setin(LAB_SWEEP, ("entity", "model_max_length"), 64) | {
        "grid": {"batch_size": [2], "number_gpus": [1]},
        "runner": {"workload": "idle", "idle_seconds": 0.1, "sample_interval_s": 0.5}})  # a dry run: seconds
    monkeypatch.chdir(lab["root"])
    res = sbench("submit", "sweep.yaml", "-i", "inv.yaml", "--executor", "local", "--workdir", "runs",
                 "--db", "results.duckdb", "--wait", in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    camp = Campaign(lab["workdir"], lab["db"], "hard").manifest()[0]
    assert camp["inventory"] == str(lab["inv"]) and camp["sweep"] == str(lab["sweep"])
    elsewhere = lab["root"] / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res = sbench("retry", "hard", "--executor", "local", "--workdir", lab["workdir"], "--db", lab["db"],
                 in_process=True, ok=None)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("args, says", [
    (["retry", "../x"], "is not a campaign name"), (["cancel", "--campaign", "../x"], "is not a campaign name"),
    # cluster/name is an imported campaign's name (sbench import): read by query and report, never acted on
    (["status", "--campaign", "a/b"], "imported from another database"),
    (["collect", "--campaign", "x\n"], "is not a campaign name")])
def test_campaign_arguments_are_names_not_paths(lab, args, says) -> None:
    res = sbench(*args, "--workdir", lab["workdir"], "--db", lab["db"], in_process=True, ok=None)
    assert res.exit_code == 2 and says in res.output, res.output
    nothing_written(lab)


def test_collect_of_a_missing_workdir_is_an_input_error_and_creates_no_db(lab) -> None:
    res = sbench("collect", "--workdir", lab["workdir"], "--db", lab["db"], in_process=True, ok=None)
    assert res.exit_code == 2 and "--workdir" in res.output
    nothing_written(lab)


# -- process control ------------------------------------------------------------------------------------------

TRAINER = textwrap.dedent('''
    import os, sys, time
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(300)
''')


def _runner_job(tmp_path: Path) -> tuple[JobPaths, list[str], Path]:
    jd = tmp_path / "job"
    jd.mkdir()
    data = tmp_path / "news-chars-512-entries-4096.jsonl"
    data.write_text('{"output": "x\\n### Response: y"}\n')
    (jd / "spec.json").write_text(json.dumps({"jobspec": {
        "trials": 1, "processes_per_node": 1, "cpu_partition": True, "dataset_id": "news-chars-512-entries-4096",
        "dataset_path": str(data), "model_source": "/nonexistent",
        "runner": {"sample_interval_s": 0.2, "stop_grace_s": 5}}}))
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    pid_file = tmp_path / "trainer.pid"
    return JobPaths(jd), [sys.executable, str(trainer), str(pid_file)], pid_file


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_killing_the_node_runner_ends_its_training(tmp_path: Path) -> None:
    paths, cmd, pid_file = _runner_job(tmp_path)
    env = {**os.environ, "SBENCH_HOST": "n1", "PYTHONPATH": str(ROOT), "SBENCH_MACHINE_RANK": "0"}
    runner = subprocess.Popen([sys.executable, "-m", "harness.runner", "node", "--job-dir", str(paths.root),
                               "--host", "n1", "--", *cmd], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: pid_file.exists() and pid_file.read_text(), 60, "the training to start")
        trainer = int(pid_file.read_text())
        assert psutil.Process(trainer).ppid() == runner.pid  # started in its own session, as a child
        runner.kill()  # SIGKILL: no handler of the runner can run
        runner.wait()
        _wait(lambda: _gone(trainer), 10, "the orphaned training to end")
    finally:
        runner.kill()
        if pid_file.exists() and pid_file.read_text() and not _gone(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_cancel_signals_only_the_process_it_started(tmp_path: Path) -> None:
    jd = tmp_path / "runs" / "c" / "0123456789abcdef.r0.a1"
    other = tmp_path / "runs" / "c" / "0123456789abcdef.r0.a2"
    jd.mkdir(parents=True)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # Another job dir's launch: sbench started it, but not for this job dir.
    neighbour = subprocess.Popen(["sleep", "60"], start_new_session=True,
                                 env={**os.environ, **localjob.environment(localjob.LAUNCH, other)})
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            env={**os.environ, **localjob.environment(localjob.LAUNCH, jd)})
    try:
        time.sleep(0.2)
        # A submitted.json naming a process that does not carry this job dir's token: never signalled.
        for pid in (stranger.pid, neighbour.pid):
            write_json(jd / "submitted.json", {"executor": "local", "pid": pid})
            assert kill_launch(str(jd)) is False
            assert LocalBackend().cancel([{"job_dir": str(jd)}]) == []
            assert localjob.job_state(jd) == "LOST"
        assert stranger.poll() is None and neighbour.poll() is None, "cancel signalled a process it did not start"
        write_json(jd / "submitted.json", {"executor": "local", "pid": ours.pid})
        assert localjob.job_state(jd) == "RUNNING"
        assert kill_launch(str(jd)) is True
        assert ours.wait(timeout=10) == -signal.SIGTERM
    finally:
        stranger.kill()
        neighbour.kill()
        ours.kill()


@pytest.mark.train
def test_a_cancelled_local_run_is_recorded_cancelled_with_its_signal_and_not_retried(lab, tiny_model) -> None:
    """Real local executor: a long training is cancelled mid-run; collect and retry tell the truth."""
    inv = setin(LAB_INVENTORY, ("partitions", "cpu", "hosts"), {"h1": {"address": "127.0.0.1"}})
    sweep = {**LAB_SWEEP, "campaign": "cancel-local", "model_map": {"tiny": str(tiny_model)},
             "entity": {"model_name": "tiny", "model_max_length": 64, "max_steps": 100000,
                        "dataset_id": "news-chars-512-entries-4096", "gradient_accumulation_steps": 1},
             "grid": {"batch_size": [2], "number_gpus": [1]}, "data_dir": str(lab["root"] / "data")}
    write_yaml(lab["inv"], inv)
    write_yaml(lab["sweep"], sweep)
    common = ["--workdir", lab["workdir"], "--db", lab["db"]]
    rep = json.loads(sbench("submit", lab["sweep"], "-i", lab["inv"], "--executor", "local", "--json",
                            *common, in_process=True, ok=None).stdout)
    (job,) = [p for p in rep["points"] if p["action"] == "submit"]
    paths = JobPaths(job["job_dir"])
    try:
        _wait(lambda: '"stage":"train"' in (paths.stages("h1").read_text() if paths.stages("h1").exists() else ""),
              240, "training to start")
    finally:
        out = sbench("cancel", "--campaign", "cancel-local", *common, in_process=True, ok=None)
    assert out.exit_code == 0 and "cancelled 1" in out.output, out.output
    _wait(lambda: json.loads(paths.submitted.read_text()).get("ended_at"), 120, "the launch to end")
    sbench("collect", *common, in_process=True)
    (run,) = sql_rows(lab["db"], "SELECT * FROM runs WHERE campaign = 'cancel-local'")
    assert run["state"] == "CANCELLED" and run["outcome"] == "failed", run
    assert "cancel" in run["reason"] and run["cancel_requested_at"] is not None
    assert run["exit_signal"] == signal.SIGTERM
    retry = json.loads(sbench("retry", "cancel-local", "--executor", "local", "--json", *common, in_process=True,
                              ok=None).stdout)
    assert retry["submitted"] == 0 and "cancelled" in retry["points"][0]["reason"]


# -- query cannot write -----------------------------------------------------------------------------------------

@pytest.fixture
def collected(tmp_path: Path) -> dict[str, Path]:
    wd, db = tmp_path / "runs", tmp_path / "results.duckdb"
    run = make_run(wd, "good", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999999")
    append_manifest(wd, "good", run["events"])
    collect(db, wd)
    return {"workdir": wd, "db": db, "root": tmp_path}


@pytest.mark.parametrize("sql", [
    "ATTACH '{link}' AS o (READ_WRITE); DROP TABLE o.runs",
    "COPY runs TO '{root}/stolen.csv'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SET enable_external_access = true",
    "DROP TABLE runs",
    "INSTALL httpfs",
])
def test_query_is_really_read_only(collected, sql: str) -> None:
    link = collected["root"] / "hardlink.duckdb"
    if not link.exists():
        os.link(collected["db"], link)
    res = sbench("query", sql.format(link=link, root=collected["root"]), "--db", collected["db"], in_process=True,
                 ok=None)
    assert res.exit_code == 2 and "Error: SQL error" in res.output, res.output
    assert not (collected["root"] / "stolen.csv").exists()
    res = sbench("query", "select count(*) as n from runs", "--db", collected["db"], "--format", "json",
                 in_process=True, ok=None)
    assert res.exit_code == 0 and json.loads(res.output) == [{"n": 1}]
    sbench("status", "--workdir", collected["workdir"], "--db", collected["db"], in_process=True)


def test_a_database_whose_tables_were_changed_is_refused_with_a_message(collected) -> None:
    import duckdb

    con = duckdb.connect(str(collected["db"]))
    con.execute("ALTER TABLE runs DROP COLUMN reason")
    con.execute("DROP VIEW run_summary")
    con.close()
    for args in (["query", "select 1"], ["status", "--workdir", collected["workdir"]], ["report", "-o",
                                                                                         collected["root"] / "r.html"]):
        res = sbench(*args, "--db", collected["db"], in_process=True, ok=None)
        assert res.exit_code == 1 and "tables were changed" in res.output and "runs.reason is missing" in res.output
        assert "Traceback" not in res.output


# -- collect isolates bad data -----------------------------------------------------------------------------------

def test_one_bad_run_or_value_never_stops_collect_for_the_others(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "results.duckdb"
    good = make_run(wd, "good", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999999")
    append_manifest(wd, "good", good["events"])
    evil = make_run(wd, "evil", 1, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999998")
    events = copy.deepcopy(evil["events"])
    events[0]["entity"]["batch_size"] = 100000000000000000000001  # a point line past BIGINT
    bad_attempt = {**events[1], "repeat": 10**20, "job_dir": str(evil["job_dir"]) + "x"}
    append_manifest(wd, "evil", [*events, bad_attempt, {"type": "cancel", "campaign": "evil", "job_ids": 7}])
    p = evil["paths"]
    res = json.loads(p.result("node1").read_text())
    res.update(exit_code=10**30, started_wall=float("nan"), machine_rank=2**40, reason="nul\x00byte \udcff")
    p.result("node1").write_text(json.dumps(res))  # NaN and a lone surrogate: Python writes, DuckDB would choke
    rank = json.loads(p.rank_result(0).read_text())
    rank.update(global_step=10**25, world_size="two", local_rank=-(2**70))
    rank["metrics"].update(dataset_tokens=1e308 * 10, train_runtime="fast")
    p.rank_result(0).write_text(json.dumps(rank))
    with p.stages("node1").open("a") as fh:
        fh.write(json.dumps({"event": "start", "stage": "x", "t_wall": T0, "pid": 10**30, "rank": 2**40,
                             "trial": "t", "host": "node1"}) + "\n")
    (p.root / "environment.node1.json").write_text('{"cpu_count": 1e999, "gpus": [{"name": null}], "env": NaN}')
    # A job dir whose spec.json sbench did not write: refused, not turned into a run.
    foreign = wd / "evil" / "fedcba9876543210.r0.a1"
    foreign.mkdir()
    (foreign / "spec.json").write_text(json.dumps({"schema": "other/9", "campaign": "evil", "point": {},
                                                  "jobspec": {}}))
    (foreign / "stages.node1.jsonl").write_text("")
    rep = collect(db, wd)
    assert any("fedcba9876543210.r0.a1/spec.json: not a job directory" in w for w in rep.warnings), rep.warnings
    assert any("repeat must be an integer" in w for w in rep.warnings), rep.warnings
    rows = {r["campaign"]: r for r in sql_rows(db, "SELECT campaign, outcome, reason, exit_code FROM runs")}
    assert set(rows) == {"good", "evil"}
    assert rows["good"]["outcome"] == "ok"
    assert rows["evil"]["outcome"] in ("ok", "failed") and rows["evil"]["exit_code"] is None
    (pt,) = sql_rows(db, "SELECT batch_size FROM points p JOIN campaign_points c USING (point_id) "
                         "WHERE c.campaign = 'evil'")
    assert pt["batch_size"] is None  # out of range: NULL, not an aborted collect
    (rk,) = sql_rows(db, "SELECT global_step, world_size FROM ranks WHERE run_id LIKE 'evil/%'")
    assert rk == {"global_step": None, "world_size": None}
    again = collect(db, wd)
    assert again.new == 0 and again.updated == 0


def test_a_job_dir_that_crashes_the_reader_is_recorded_failed_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    from harness.collect import ingest

    wd, db = tmp_path / "runs", tmp_path / "results.duckdb"
    runs = [make_run(wd, "c", i, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local",
                     job_id=str(999990 + i)) for i in range(2)]
    for r in runs:
        append_manifest(wd, "c", r["events"])
    real = ingest.analyze

    def flaky(att, *a, **kw):
        if att.point_id == runs[1]["point_id"]:
            raise KeyError("a reader bug")
        return real(att, *a, **kw)

    monkeypatch.setattr(ingest, "analyze", flaky)
    collect(db, wd)
    rows = {r["point_id"]: r for r in sql_rows(db, "SELECT point_id, outcome, reason FROM runs")}
    assert rows[runs[0]["point_id"]]["outcome"] == "ok"
    assert rows[runs[1]["point_id"]]["outcome"] == "failed"
    assert "collect could not read this job directory: KeyError" in rows[runs[1]["point_id"]]["reason"]


def test_a_killed_local_run_keeps_its_signal_and_a_truthful_state(tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "results.duckdb"
    run = make_run(wd, "k", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999997")
    append_manifest(wd, "k", run["events"])
    p = run["paths"]
    p.result("node1").unlink()  # the node runner was killed with SIGKILL: it wrote no result
    write_json(p.submitted, {"executor": "local", "job_id": "999997", "exit_code": -9, "exit_signal": 9,
                             "ended_at": "2025-11-22T00:10:00+0000"})
    collect(db, wd)
    (row,) = sql_rows(db, "SELECT state, outcome, exit_signal FROM runs")
    assert row == {"state": "FAILED", "outcome": "failed", "exit_signal": 9}


def test_status_knows_every_collected_attempt_not_only_the_latest(tmp_path: Path) -> None:
    import shutil

    wd, db = tmp_path / "runs", tmp_path / "results.duckdb"
    run = make_run(wd, "s", 0, hosts=("node1",), gpus_per_host=1, ticks=5, executor="local", job_id="999996")
    second = Path(str(run["job_dir"]).replace(".a1", ".a2"))
    shutil.copytree(run["job_dir"], second)
    spec = json.loads((second / "spec.json").read_text())
    spec["jobspec"]["attempt"] = 2
    (second / "spec.json").write_text(json.dumps(spec))
    a2 = {**run["events"][1], "attempt": 2, "job_dir": str(second), "job_id": "999995", "reason": "retry"}
    append_manifest(wd, "s", [*run["events"], a2])
    collect(db, wd)
    res = sbench("status", "--workdir", wd, "--db", db, "--json", in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["rows"]
    assert [r["last_attempt"] for r in rows] == [2]
    assert all(r["reason"] != "not collected yet" for r in rows)
