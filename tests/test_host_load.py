"""A host busy with other work is recorded and used: the sampler's host rows (the host's CPU outside the run's
processes, from /proc/stat) and GPU rows (processes on the run's GPUs that are not its own, from NVML); collect's
host_other_cpu_pct, gpu_foreign_processes and host_busy with a note; compare, check and the repeats' CV leave a
busy run out and say why."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.collect import collect
from harness.runner.sampler import FakeNvml, GpuBackend, HostLoad, NvmlBackend, Sampler
from harness.slurm.client import Slurm
from harness.spec.references import Reference, check_rows

from . import kit
from .kit import ROOT, command, jobdirs, sql_rows, write_yaml
from .kit.jobdirs import FakeSlurm, campaign_workdir, write_attempt


def stat_line(busy: int, idle: int) -> str:
    # user nice system idle iowait irq softirq steal
    return f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 {busy} 0 0 {idle} 0 0 0 0 0 0\n"


def test_the_hosts_other_load_is_its_busy_cpu_less_the_runs(tmp_path: Path, monkeypatch) -> None:
    stat = tmp_path / "stat"
    monkeypatch.setenv("SBENCH_PROC_STAT", str(stat))
    tick = os.sysconf("SC_CLK_TCK")
    stat.write_text(stat_line(1000, 5000))
    host = HostLoad()
    # 2 s of capacity went by: 1.5 s busy, of which the run's tree used 0.5 s: other work 1 s (50 %), less the
    # little CPU this process itself used in between
    stat.write_text(stat_line(1000 + int(1.5 * tick), 5000 + int(0.5 * tick)))
    got = host.read(0.5)
    assert got is not None and 45.0 < got <= 50.0
    stat.write_text(stat_line(1000 + int(1.5 * tick), 5000 + int(2.5 * tick)))
    assert host.read(None) == pytest.approx(0.0, abs=1.0)  # an idle host: nothing else
    stat.write_text("garbage")
    assert host.read(0.1) is None  # unreadable: nothing said


@pytest.mark.slow(5)
def test_two_cpu_burners_show_as_the_hosts_other_load(tmp_path: Path) -> None:
    burn = "import time\nt=time.time()\nwhile time.time()-t<3: pass\n"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    path = tmp_path / "samples.h.csv"
    try:
        s = Sampler(path, 0.25, GpuBackend(), root_pid=sleeper.pid).start()
        time.sleep(2.0)
        s.stop()
    finally:
        for p in (*burners, sleeper):
            p.kill()
            p.wait()
    host = [float(r["cpu_pct"]) for r in csv.DictReader(path.open()) if r["kind"] == "host"]
    cores = os.cpu_count() or 1
    # two busy processes are two cores' worth of other work, whatever else runs here: at least the share the
    # default threshold flags on a machine of up to 8 cores
    assert host and sum(host) / len(host) > min(100.0, 100.0 * 2 / cores) * 0.5, host


def test_processes_on_the_runs_gpus_that_are_not_its_own_are_counted(tmp_path: Path) -> None:
    me = os.getpid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        fake = FakeNvml(2, processes={0: [sleeper.pid, 424242], 1: [sleeper.pid]})
        s = Sampler(tmp_path / "s.csv", 0.05, NvmlBackend(fake, use_env=False), root_pid=sleeper.pid)
        s.tick()
        s.tick()
        s.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    gpu = [r for r in csv.DictReader((tmp_path / "s.csv").open()) if r["kind"] == "gpu"]
    assert {(r["device"], r["foreign_procs"]) for r in gpu} == {("0", "1"), ("1", "0")}
    # NVML lists none of the run's processes while the run has some: another PID namespace, nobody can tell
    other_ns = NvmlBackend(FakeNvml(1, processes={0: [7, 8]}), use_env=False)
    assert other_ns.read({me, sleeper.pid})[0]["foreign_procs"] is None


def busy_rows(other_pct: float, foreign: int | None = None) -> list[dict]:
    rows = jobdirs.gen_samples(jobdirs.T0, 20, 2, seed=9)
    for r in rows:
        if r["kind"] == "gpu":
            r["foreign_procs"] = foreign
    rows += [{"t_wall": jobdirs.T0 + i, "t_mono": 5000.0 + i, "kind": "host", "device": -1, "cpu_pct": other_pct}
             for i in range(20)]
    return rows


@pytest.fixture()
def tc_wd(tmp_path: Path) -> Path:
    return campaign_workdir(tmp_path)


def with_threshold(run: dict, share: float) -> None:
    spec = json.loads(run["paths"].spec.read_text())
    spec["jobspec"]["runner"]["host_busy_cpu"] = share
    run["paths"].spec.write_text(json.dumps(spec))


def test_collect_flags_a_busy_host_and_says_why(tc_wd: Path, tmp_path: Path) -> None:
    loud = write_attempt(tc_wd, 70, samples={"node1": busy_rows(60.0, 0)})
    quiet = write_attempt(tc_wd, 71, samples={"node1": busy_rows(3.0, 0)})
    crowded = write_attempt(tc_wd, 72, samples={"node1": busy_rows(3.0, 2)})
    lenient = write_attempt(tc_wd, 73, samples={"node1": busy_rows(60.0, 0)})
    for r in (loud, quiet, crowded):
        with_threshold(r, 0.25)
    with_threshold(lenient, 0.75)
    db = tmp_path / "r.duckdb"
    runs = (loud, quiet, crowded, lenient)
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({r["job_id"]: ("COMPLETED", "0:0", "node1") for r in runs})))
    got = {m["run_id"]: m for m in sql_rows(db, "SELECT m.run_id, host_other_cpu_pct, gpu_foreign_processes, "
                                                "host_busy, m.notes, r.warnings FROM measurements m JOIN runs r "
                                                "USING (run_id)")}
    m = got[loud["run_id"]]
    assert m["host_other_cpu_pct"] == pytest.approx(60.0) and m["host_busy"] is True
    (note,) = [n for n in m["notes"] if n.startswith("host busy")]
    assert "other work used 60 % of node1's CPU" in note and "runner.host_busy_cpu 0.25" in note
    assert note in m["warnings"]
    assert got[quiet["run_id"]]["host_busy"] is False and got[quiet["run_id"]]["gpu_foreign_processes"] == 0
    c = got[crowded["run_id"]]
    assert c["host_busy"] is True and c["gpu_foreign_processes"] == 2
    assert any("processes not the run's (2 on GPU node1:0" in n for n in c["notes"])
    assert got[lenient["run_id"]]["host_busy"] is False  # its sweep allows three quarters
    # the repeats' CV leaves busy runs out, as it does shared ones
    stab = sql_rows(db, "SELECT sum(repeats_measured) AS n FROM point_stability")
    assert stab == [{"n": 2}]


def test_compare_leaves_a_busy_run_out_and_counts_it_with_the_reason(cli, tmp_path: Path) -> None:
    wd, db = tmp_path / "runs", tmp_path / "r.duckdb"
    # one run a side, one after the other on one host; the candidate's host was busy with other work
    for k, (camp, other) in enumerate((("base", 2.0), ("cand", 80.0))):
        r = jobdirs.make_run(wd, camp, 0, hosts=("node1",), gpus_per_host=1, ticks=30, job_id=f"{camp}0",
                           t0=jobdirs.T0 + 100 * k, executor="local")
        jobdirs.append_manifest(wd, camp, [jobdirs.manifest_events(camp, "finetune_full_benchmark-v1.0.0", "local"),
                                           *r["events"]])
        rows = list(csv.DictReader(r["paths"].samples("node1").open()))
        extra = [{"t_wall": row["t_wall"], "t_mono": row["t_mono"], "kind": "host", "device": -1, "cpu_pct": other}
                 for row in rows if row["kind"] == "proc"]
        jobdirs.write_samples(r["paths"], "node1", [*rows, *extra])
        with_threshold(r, 0.25)
    collect(db, wd, None)
    res = cli("compare", "base", "cand", "--db", db)
    assert res.exit_code == 2
    assert "CAND 'cand': no valid measurements match (excluded 1 run(s) (CAND 1): 1 measured on a host busy with " \
           "other work" in res.output
    kept = cli("compare", "base", "cand", "--db", db, "--include-shared", "--json")
    assert kept.exit_code == 0 and json.loads(kept.output)["rows"]


@pytest.mark.train
@pytest.mark.slow(30)
def test_a_real_run_beside_two_cpu_burners_is_flagged_and_a_stuck_rapl_counter_is_null(
        tiny_model: Path, small_data_dir: Path, tmp_path: Path) -> None:
    pc = tmp_path / "powercap" / "intel-rapl:0"
    pc.mkdir(parents=True)
    (pc / "name").write_text("package-0\n")
    (pc / "energy_uj").write_text("123456\n")  # a counter that never moves
    inv = write_yaml(tmp_path / "inv.yaml", kit.inventory(env={"SBENCH_POWERCAP": str(tmp_path / "powercap")}))
    common = ["--workdir", str(tmp_path / "runs"), "--db", str(tmp_path / "r.duckdb")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sw = write_yaml(tmp_path / "loud.yaml", kit.sweep(tiny_model, small_data_dir, campaign="loud",
                                                      entity={"max_steps": 12},
                                                      runner={"sample_interval_s": 0.2, "host_busy_cpu": 0.25}))
    burn = "while True: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    try:
        sub = subprocess.run(command("submit", sw, "-i", inv, "--executor", "local", "--wait", *common), env=env,
                             capture_output=True, text=True, cwd=ROOT, timeout=900)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert sub.returncode == 0, sub.stdout + sub.stderr
    (m,) = sql_rows(tmp_path / "r.duckdb", "SELECT m.run_id, host_other_cpu_pct, host_busy, energy_joules, "
                                           "energy_source, host_window_coverage, m.notes, r.warnings "
                                           "FROM measurements m JOIN runs r USING (run_id)")
    assert m["host_busy"] is True and m["host_other_cpu_pct"] > 25, m
    assert m["host_window_coverage"] >= 0.98, m  # the host's rows reach the window's end (the final row)
    assert any(n.startswith("host busy: other work used") for n in m["warnings"])
    assert m["energy_source"] == "rapl" and m["energy_joules"] is None
    assert any("the RAPL counter did not move" in n for n in m["notes"])
    # compare leaves it out, and says why
    res = subprocess.run(command("compare", "loud", "loud-again", "--db", tmp_path / "r.duckdb"), env=env,
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "campaign 'loud-again' is not in" in res.stderr + res.stdout
    res = subprocess.run(command("compare", "loud", "git_commit=none", "--db", tmp_path / "r.duckdb"), env=env,
                         capture_output=True, text=True, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "1 measured on a host busy with other work" in out and m["run_id"] in out, out


def test_check_does_not_judge_a_run_of_a_busy_host() -> None:
    refs = [Reference("dataset_tokens_per_second", 1000.0, lower=0.1)]
    base = {"point_id": "p", "repeat": 0, "entity": {}, "run_id": "c/p.r0.a1", "outcome": "ok",
            "values": {"dataset_tokens_per_second": 500.0}}
    (busy,) = check_rows("c", refs, [{**base, "host_busy": True, "host_other_cpu_pct": 64.0}])
    assert busy["status"] == "shared" and "host busy with other work" in busy["reason"] and "64 %" in busy["reason"]
    (quiet,) = check_rows("c", refs, [{**base, "host_busy": False}])
    assert quiet["status"] == "fail"  # the same value on a quiet host is judged
