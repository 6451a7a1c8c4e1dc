"""Zeros that are not measurements, and the small fidelity fixes: an energy counter that does not move while
its device is busy gives NULL with a note (RAPL and NVML alike), collect's notes are the run's warnings too,
the sampler's reading at the training process tree's end, process samples that do not cover the window are
said, and the precision interval's half-width is relative to the window's mean."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean, stdev

import pytest

from harness.collect import collect
from harness.contract.stats import t_quantile
from harness.runner.sampler import ProcessTree, Sampler
from harness.runner.steady import batch_means
from harness.slurm.client import Slurm

from .kit import FULL, jobdirs, one, sql_rows
from .kit.jobdirs import CAMPAIGN, FakeSlurm, write_attempt


@pytest.fixture()
def tc_wd(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    jobdirs.append_manifest(d, CAMPAIGN, [jobdirs.manifest_events(CAMPAIGN, FULL)])
    return d


def cpu_rows(n: int, energy_per_s: float, cpu_pct: float = 100.0, last_proc: int | None = None) -> list[dict]:
    rows = []
    for i in range(n):
        t = jobdirs.T0 + i
        if last_proc is None or i <= last_proc:
            rows.append({"t_wall": t, "t_mono": 5000.0 + i, "kind": "proc", "device": -1, "cpu_pct": cpu_pct,
                         "mem_pct": 1.0, "rss_mb": 100.0, "nprocs": 2})
        rows.append({"t_wall": t, "t_mono": 5000.0 + i, "kind": "cpu", "device": 0, "energy_j": i * energy_per_s})
    return rows


def test_a_rapl_counter_that_never_moves_on_a_busy_host_is_null_with_a_note(tc_wd: Path, tmp_path: Path) -> None:
    stuck = write_attempt(tc_wd, 90, gpus_per_host=1, samples={"node1": cpu_rows(20, 0.0)},
                             t_train0=jobdirs.T0 + 2.0, t_train1=jobdirs.T0 + 17.0)
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({stuck["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT energy_joules, energy_source, dataset_tokens_per_joule, notes, r.warnings "
                   "FROM measurements JOIN runs r USING (run_id)")
    assert m["energy_joules"] is None and m["dataset_tokens_per_joule"] is None and m["energy_source"] == "rapl"
    (note,) = [n for n in m["notes"] if "did not move" in n]
    assert "CPU package node1:0: the RAPL counter did not move over the 15.0 s measured window while the host " \
           "was busy" in note and "energy_joules NULL" in note
    assert note in m["warnings"]  # the run's warning too: status counts it


def test_a_still_counter_of_an_idle_host_or_a_short_window_is_a_measurement(tc_wd: Path, tmp_path: Path) -> None:
    idle = write_attempt(tc_wd, 91, gpus_per_host=1, samples={"node1": cpu_rows(20, 0.0, cpu_pct=0.0)},
                            t_train0=jobdirs.T0 + 2.0, t_train1=jobdirs.T0 + 17.0)
    short = write_attempt(tc_wd, 92, gpus_per_host=1, samples={"node1": cpu_rows(20, 0.0)},
                             t_train0=jobdirs.T0 + 2.0, t_train1=jobdirs.T0 + 2.05)
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({r["job_id"]: ("COMPLETED", "0:0", "node1") for r in (idle, short)})))
    for r in (idle, short):
        m = one(db, "SELECT energy_joules FROM measurements WHERE run_id = ?", [r["run_id"]])
        assert m["energy_joules"] == 0.0


def test_an_nvml_counter_that_never_moves_while_the_gpu_draws_power_is_null(tc_wd: Path, tmp_path: Path) -> None:
    rows = jobdirs.gen_samples(jobdirs.T0, 20, 2, seed=5)
    for r in rows:
        if r["kind"] == "gpu" and r["device"] == 1:
            r["energy_j"] = 0.0  # the driver answers, and never counts
    run = write_attempt(tc_wd, 93, samples={"node1": rows})
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT energy_joules, gpu_energy_joules, notes FROM measurements")
    assert m["energy_joules"] is None and m["gpu_energy_joules"] is None
    assert any(n.startswith("GPU node1:1: NVML's total-energy counter did not move") for n in m["notes"]), m["notes"]


def test_process_samples_that_leave_the_windows_end_uncovered_are_said(tc_wd: Path, tmp_path: Path) -> None:
    # the last process sample at 15 s, the window to 17 s: 2 s of it without a CPU figure
    run = write_attempt(tc_wd, 94, gpus_per_host=1, samples={"node1": cpu_rows(20, 40.0, last_proc=15)},
                           t_train0=jobdirs.T0 + 2.0, t_train1=jobdirs.T0 + 17.0)
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT notes, cpu_compute_utilization FROM measurements")
    assert "process samples on node1 cover 13.00 s of the 15.00 s measured window (2.00 s without a CPU sample, " \
           "at a 1 s period)" in " ".join(m["notes"])
    assert m["cpu_compute_utilization"] == pytest.approx(100.0)


def test_host_samples_that_leave_the_windows_end_uncovered_give_the_coverage_and_say_so(tc_wd: Path,
                                                                                      tmp_path: Path) -> None:
    # host rows every second to 14 s (as the sampler's last tick before the tree ended), the window 2 s to 17 s
    rows = cpu_rows(20, 40.0) + [{"t_wall": jobdirs.T0 + i, "t_mono": 5000.0 + i, "kind": "host", "device": -1,
                                  "cpu_pct": 10.0} for i in range(15)]
    short = write_attempt(tc_wd, 95, gpus_per_host=1, samples={"node1": rows},
                             t_train0=jobdirs.T0 + 2.0, t_train1=jobdirs.T0 + 17.0)
    # and a run whose host rows reach the window's end (the sampler's final host row at the tree's end)
    whole = write_attempt(tc_wd, 96, gpus_per_host=1, samples={"node1": cpu_rows(20, 40.0) + [
        {"t_wall": jobdirs.T0 + i, "t_mono": 5000.0 + i, "kind": "host", "device": -1, "cpu_pct": 10.0}
        for i in range(20)]}, t_train0=jobdirs.T0 + 2.0, t_train1=jobdirs.T0 + 17.0)
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({r["job_id"]: ("COMPLETED", "0:0", "node1") for r in (short, whole)})))
    got = {m["job_id"]: m for m in sql_rows(db, "SELECT r.job_id, m.host_window_coverage, m.host_other_cpu_pct, "
                                                "m.notes FROM measurements m JOIN runs r USING (run_id)")}
    m = got[short["job_id"]]
    assert m["host_window_coverage"] == pytest.approx(12.0 / 15.0) and m["host_other_cpu_pct"] == pytest.approx(10.0)
    assert "host samples cover 80.0 % of node1's measured window of 15.00 s: host_other_cpu_pct averages what they " \
           "cover" in " ".join(m["notes"])
    m = got[whole["job_id"]]
    assert m["host_window_coverage"] == pytest.approx(1.0) and not any("host samples" in n for n in m["notes"] or [])


def test_the_tree_s_last_cpu_seconds_are_sampled_when_it_ends(tmp_path: Path) -> None:
    # a process that burns CPU, read while it runs and once after it ended and was reaped: the readings
    # account for all of its CPU time (its own rusage), the last one for what it used after the reading before
    code = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    s = Sampler(tmp_path / "samples.h.csv", 0.05)
    s.set_root(proc.pid)
    time.sleep(0.2)
    assert s.tick() == 2  # the tree's row and the host's
    tree = s.tree
    assert tree is not None
    seen = sum(tree._seen.values())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = status
    total = usage.ru_utime + usage.ru_stime
    last = tree._last_mono
    assert s.end_tree() == 2 and s.tree is None  # the tree's final row and the host's
    s.stop()
    every = list(csv.DictReader((tmp_path / "samples.h.csv").open()))
    rows = [r for r in every if r["kind"] == "proc"]
    assert len(rows) == 2 and rows[-1]["nprocs"] == "0"
    # the host's rows reach the tree's end too: its final one at the same moment as the tree's final one
    host = [r for r in every if r["kind"] == "host"]
    assert len(host) == 2 and host[-1]["t_mono"] == rows[-1]["t_mono"] and 0 <= float(host[-1]["cpu_pct"]) <= 100
    left_s = float(rows[-1]["cpu_pct"]) / 100 * (float(rows[-1]["t_mono"]) - last)
    assert left_s == pytest.approx(total - seen, abs=0.02) and left_s > 0.1


def test_a_tree_not_ended_gives_no_final_reading(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        tree = ProcessTree(proc.pid)
        tree.read()
        assert tree.final() is None  # still running: a normal reading, not the end's
    finally:
        proc.kill()
        proc.wait()


def test_the_precision_interval_is_relative_to_the_windows_mean() -> None:
    # 11 steps: 3 batches of 3 leave the 2 oldest out of the batches, not out of the window's mean
    xs = [5.0, 4.0, 1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.0, 1.1]
    ci = batch_means(xs)
    assert ci is not None and ci.n * ci.batch_size == 9
    assert ci.mean == pytest.approx(fmean(xs)) and ci.rel == pytest.approx(ci.half / fmean(xs))
    assert not math.isclose(ci.mean, fmean(xs[2:]))
    steps = t_quantile(0.975, 8) * stdev(xs[2:]) / 3
    assert ci.half >= steps
