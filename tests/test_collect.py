"""Collect end to end: job dirs written per docs/job-directory.md -> results DB.

Expected values are recomputed here from the raw rows each test writes, independently of
harness.collect.aggregate.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean

import duckdb
import pytest

from harness.collect import aggregate, collect, ingest
from harness.collect import discover as discover_mod
from harness.contract.paths import JobPaths, job_dir_name
from harness.slurm.client import Slurm
from harness.spec.plan import point_id as make_point_id

from .kit import FULL, ROOT, command, dump, jobdirs, one, rows_of, sbench
from .kit.jobdirs import CAMPAIGN, FakeSlurm, campaign_workdir, write_attempt


@pytest.fixture()
def wd(tmp_path):
    return campaign_workdir(tmp_path)


# -- aggregation --------------------------------------------------------------------------------------------
def sample_interval(paths: JobPaths) -> float:
    """The sampler's period, as the job dir's spec.json gives it to the runner."""
    return float(json.loads(paths.spec.read_text())["jobspec"]["runner"]["sample_interval_s"])


def span_mean(rows, value, start, end, d):
    """The time average over [start, end] of samples that each stand for the *d* seconds before their time:
    a sample's weight is the length of [t - d, t] inside the window (rows without the value are left out)."""
    num = den = 0.0
    for r in rows:
        v = value(r)
        lo, hi = max(r["t_wall"] - d, start), min(r["t_wall"], end)
        if v is not None and hi > lo:
            num, den = num + (hi - lo) * v, den + (hi - lo)
    return num / den


def expected_gpu(rows_by_host, start, end, d):
    per_dev = {}
    for h, rows in rows_by_host.items():
        for r in rows:
            if r["kind"] == "gpu":
                per_dev.setdefault((h, r["device"]), []).append(r)
    util = [span_mean(rs, lambda r: r["gpu_util"], start, end, d) for rs in per_dev.values()]
    mem = [span_mean(rs, lambda r: 100 * r["mem_used_mb"] / r["mem_total_mb"], start, end, d)
           for rs in per_dev.values()]
    pw = [span_mean(rs, lambda r: r["power_w"], start, end, d) for rs in per_dev.values()]
    pct = [span_mean(rs, lambda r: 100 * r["power_w"] / r["power_limit_w"], start, end, d) for rs in per_dev.values()]
    # the peak is the highest single reading taken inside the window
    peak = max(100 * r["mem_used_mb"] / r["mem_total_mb"] for rs in per_dev.values() for r in rs
               if start <= r["t_wall"] <= end)
    out = {"gpu_memory_utilization_peak": peak}
    for name, vals in (("gpu_compute_utilization", util), ("gpu_memory_utilization", mem),
                       ("gpu_power_watts", pw), ("gpu_power_percent", pct)):
        out.update({f"{name}_min": min(vals), f"{name}_avg": mean(vals), f"{name}_max": max(vals)})
    procs = [[r for r in rows if r["kind"] == "proc"] for rows in rows_by_host.values()]
    out["cpu_compute_utilization"] = mean(span_mean(rs, lambda r: r["cpu_pct"], start, end, d) for rs in procs)
    out["cpu_memory_utilization"] = mean(span_mean(rs, lambda r: r["mem_pct"], start, end, d) for rs in procs)
    return out, len(per_dev)


def test_measurements_match_an_independent_recomputation(wd, tmp_path):
    run = write_attempt(wd, 1, hosts=("node1", "node2"), gpus_per_host=3, ticks=40)
    db = tmp_path / "r.duckdb"
    rep = collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node[1-2]")})))
    assert rep.outcomes == {"ok": 1} and rep.sample_rows == 2 * 40 * 4
    m = one(db, "SELECT * FROM measurements")
    exp, ndev = expected_gpu(run["rows"], run["t_train0"], run["t_train1"], sample_interval(run["paths"]))
    assert ndev == 6 and m["gpu_devices"] == 6
    for k, v in exp.items():
        assert m[k] == pytest.approx(v, rel=1e-9), k
    # samples outside the window (setup, model load) really were excluded
    all_util = [r["gpu_util"] for rows in run["rows"].values() for r in rows if r["kind"] == "gpu"]
    assert m["gpu_compute_utilization_max"] != pytest.approx(max(all_util))
    assert m["is_valid"] is True
    assert m["train_tokens_per_gpu_per_second"] == 1000.0  # rank 0's value
    assert m["train_tokens_per_second"] == 6 * 1000.0  # num_gpus x rank 0 (seeds: FSDP estimate)
    runtime = run["t_train1"] - run["t_train0"]
    assert m["train_runtime"] == runtime
    assert m["dataset_tokens_per_second"] == pytest.approx(50000 / runtime)
    assert m["dataset_tokens_per_second_per_gpu"] == pytest.approx(50000 / runtime / 6)
    # entity values sit beside the properties, typed
    assert m["number_gpus"] == 6 and m["model_max_length"] == 101 and m["gradient_checkpointing"] is True
    r = one(db, "SELECT * FROM runs")
    assert r["accounting_source"] == "sacct" and r["state"] == "COMPLETED" and r["max_rss_mb"] == 2048.0
    assert r["hosts_expected"] == ["node1", "node2"] and r["hosts_seen"] == ["node1", "node2"]
    # t_rel counts from train start
    t_rel = rows_of(db, "SELECT min(t_rel) FROM samples")[0][0]
    assert t_rel == pytest.approx(jobdirs.T0 - run["t_train0"])


def test_window_averages_weigh_each_sample_by_its_period_inside_the_window(wd, tmp_path):
    """A sample stands for the sampler's period before it: one taken just after the window's start counts
    for the part of its period inside the window, the first one after the end for the part before the end.
    Ramps make the per-sample mean of the samples taken inside the window visibly wrong."""
    t0 = jobdirs.T0
    rows = jobdirs.gen_samples(t0, 20, 2, seed=5)
    for r in rows:
        k = r["t_wall"] - t0
        r.update({"cpu_pct": 10.0 * k, "mem_pct": 1.0 + k} if r["kind"] == "proc" else
                 {"gpu_util": 5.0 * k + r["device"], "power_w": 100.0 + 10 * k})
    start, end = t0 + 5.25, t0 + 12.6
    run = write_attempt(wd, 21, samples={"node1": rows}, t_train0=start, t_train1=end)
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT * FROM measurements")
    d = sample_interval(run["paths"])
    exp, ndev = expected_gpu({"node1": rows}, start, end, d)
    for k, v in exp.items():
        assert m[k] == pytest.approx(v, rel=1e-9), k
    inside = [r for r in rows if start <= r["t_wall"] <= end]
    old = mean(r["cpu_pct"] for r in inside if r["kind"] == "proc")
    assert abs(m["cpu_compute_utilization"] - old) > 0.02 * old  # the rule moves the mean by more than 2 %
    assert (m["gpu_devices"], m["gpu_samples"], m["proc_samples"]) == (
        ndev, sum(r["kind"] == "gpu" for r in inside), sum(r["kind"] == "proc" for r in inside))
    # the pure functions follow the same rule
    tagged = [{**r, "host": "node1"} for r in rows]
    devs = aggregate.device_stats(tagged, start, end, d)
    assert aggregate.gpu_properties(devs, True) == pytest.approx({k: exp[k] for k in aggregate.GPU_PROPERTIES})
    assert aggregate.cpu_properties(aggregate.proc_stats(tagged, start, end, d))["cpu_compute_utilization"] == \
        pytest.approx(m["cpu_compute_utilization"], rel=1e-9)


def test_startup_is_timed_from_the_node_runners_start(wd, tmp_path):
    """run_overhead counts startup (and the host's span) from the runner's start that the setup stage records,
    1.7 s before the stage itself here; a host whose setup stage does not say counts from its first event."""
    t0 = jobdirs.T0
    events = jobdirs.normal_stages("node1", t0, t0 + 5, t0 + 15, [0, 1])
    for ev in events:
        if ev["stage"] == "setup" and ev["event"] == "end":
            ev["info"] = {"runner_start_wall": t0 - 1.7}
    text = "\n".join(json.dumps(e) for e in events) + "\n"
    run = write_attempt(wd, 22, hosts=("node1", "node2"), gpus_per_host=2, t_train0=t0 + 5, t_train1=t0 + 15,
                        stages={"node1": text})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node[1-2]")})))
    got = {r[0]: r[1:] for r in rows_of(db, "SELECT host, startup_s, allocation_s FROM run_overhead")}
    for host in ("node1", "node2"):
        evs = [json.loads(line) for line in run["paths"].stages(host).read_text().splitlines()]
        setup = [e for e in evs if e["stage"] == "setup" and e["event"] == "end"][0]
        begin = (setup.get("info") or {}).get("runner_start_wall") or min(e["t_wall"] for e in evs)
        first_train = min(e["t_wall"] for e in evs if e["stage"] == "train" and e["event"] == "start")
        last = max(e["t_wall"] for e in evs)
        assert got[host] == (pytest.approx(first_train - begin, rel=1e-12), pytest.approx(last - begin, rel=1e-12))
    assert got["node1"][0] == pytest.approx(got["node2"][0] + 1.7)


def test_pure_aggregation_functions_agree(wd):
    rows = [
        {"kind": "gpu", "host": "a", "device": 0, "t_wall": 1.0, "gpu_util": 10, "mem_used_mb": 10, "mem_total_mb": 100,
         "power_w": 100, "power_limit_w": 400},  # on the start: its period lies before the window
        {"kind": "gpu", "host": "a", "device": 0, "t_wall": 2.5, "gpu_util": 30, "mem_used_mb": 30, "mem_total_mb": 100,
         "power_w": 300, "power_limit_w": 400},
        {"kind": "gpu", "host": "a", "device": 1, "t_wall": 2.0, "gpu_util": 90, "mem_used_mb": 50, "mem_total_mb": 100,
         "power_w": 200, "power_limit_w": 250},
        {"kind": "gpu", "host": "a", "device": 1, "t_wall": 5.5, "gpu_util": 0, "mem_used_mb": 99, "mem_total_mb": 100,
         "power_w": 0, "power_limit_w": 250},  # after the end: half of its period is inside
        {"kind": "gpu", "host": "a", "device": 1, "t_wall": 9.0, "gpu_util": 70, "mem_used_mb": 99, "mem_total_mb": 100,
         "power_w": 0, "power_limit_w": 250},  # outside the window
    ]
    start, end, d = 1.0, 5.0, 1.0
    devs = aggregate.device_stats(rows, start, end, d)
    assert [(x.device, x.samples) for x in devs] == [(0, 2), (1, 1)]  # samples: those taken inside the window
    by = {dev: [r for r in rows if r["device"] == dev] for dev in (0, 1)}
    util = [span_mean(by[dev], lambda r: r["gpu_util"], start, end, d) for dev in (0, 1)]
    props = aggregate.gpu_properties(devs, True)
    assert (props["gpu_compute_utilization_min"], props["gpu_compute_utilization_max"]) == (min(util), max(util))
    assert props["gpu_compute_utilization_avg"] == pytest.approx(mean(util))
    assert props["gpu_compute_utilization_avg"] != pytest.approx((mean([10, 30]) + 90) / 2)  # the old, per-sample mean
    mem = [span_mean(by[dev], lambda r: r["mem_used_mb"] / r["mem_total_mb"] * 100, start, end, d) for dev in (0, 1)]
    assert props["gpu_memory_utilization_avg"] == pytest.approx(mean(mem))
    assert props["gpu_memory_utilization_peak"] == 50  # the highest reading taken inside the window
    pct = [span_mean(by[dev], lambda r: 100 * r["power_w"] / r["power_limit_w"], start, end, d) for dev in (0, 1)]
    assert props["gpu_power_percent_max"] == pytest.approx(max(pct))
    assert props["gpu_power_watts_avg"] == pytest.approx(mean(span_mean(by[dev], lambda r: r["power_w"], start, end, d)
                                                              for dev in (0, 1)))
    procs = [{"kind": "proc", "host": "a", "device": -1, "t_wall": t, "cpu_pct": c, "mem_pct": None}
             for t, c in ((0.5, 500.0), (1.5, 100.0), (5.2, 300.0))]
    (p,) = aggregate.proc_stats(procs, start, end, d)
    assert p.samples == 1 and p.mem_pct is None
    assert p.cpu_pct == pytest.approx(span_mean(procs, lambda r: r["cpu_pct"], start, end, d))
    assert all(v == 0.0 for v in aggregate.gpu_properties([], False).values())
    assert aggregate.measured_window({"train_start_wall": 1, "train_end_wall": 9, "warmup_end_wall": 4},
                                     "WARMUP_60S_STABLE_120S_OR_10_STEPS") == (4.0, 9.0)
    rank0 = {"train_start_wall": 1, "train_end_wall": 9, "warmup_end_wall": 4}
    assert aggregate.measured_window(rank0, None) == (1.0, 9.0)
    assert aggregate.stability_properties(["ok", "invalid", "invalid", "failed", "ok"], 5) == {
        "f_gpu_oom": 0.4, "f_other_error": 0.2, "f_no_error": 0.4}


def test_auto_stop_excludes_warmup_and_stop_after_seconds_omits_tokens(wd, tmp_path):
    warm = jobdirs.T0 + 15
    run = write_attempt(wd, 2, ticks=40, warmup_end=warm,
                        entity_over={"auto_stop_method": "WARMUP_60S_STABLE_120S_OR_10_STEPS",
                                     "stop_after_seconds": 30.0})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT * FROM measurements")
    exp, _ = expected_gpu(run["rows"], warm, run["t_train1"], sample_interval(run["paths"]))
    assert m["window_start_wall"] == warm
    assert m["gpu_compute_utilization_avg"] == pytest.approx(exp["gpu_compute_utilization_avg"], rel=1e-9)
    assert m["cpu_compute_utilization"] == pytest.approx(exp["cpu_compute_utilization"], rel=1e-9)
    assert m["train_tokens_per_second"] is None and m["train_tokens_per_gpu_per_second"] is None
    assert m["dataset_tokens_per_second"] is not None


def test_cpu_only_run_reports_zero_gpu_values(wd, tmp_path):
    rows = [r for r in jobdirs.gen_samples(jobdirs.T0, 20, 0)]
    assert all(r["kind"] == "proc" for r in rows)
    run = write_attempt(wd, 3, gpus_per_host=1, samples={"node1": rows}, entity_over={"number_gpus": 0})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT * FROM measurements")
    for p in aggregate.GPU_PROPERTIES:
        assert m[p] == 0.0, p
    assert m["cpu_compute_utilization"] == pytest.approx(
        span_mean(rows, lambda r: r["cpu_pct"], run["t_train0"], run["t_train1"], sample_interval(run["paths"])),
        rel=1e-9)


@pytest.mark.parametrize("cpu_partition, expect_null", [(False, True), (True, False)])
def test_a_gpu_partition_without_gpu_samples_gets_null_gpu_values_and_a_warning(wd, tmp_path, cpu_partition,
                                                                               expect_null):
    rows = list(jobdirs.gen_samples(jobdirs.T0, 20, 0))  # the sampler wrote process rows only
    run = write_attempt(wd, 4, gpus_per_host=1, samples={"node1": rows})
    spec_path = run["paths"].spec
    spec = json.loads(spec_path.read_text())
    spec["jobspec"]["cpu_partition"] = cpu_partition
    spec_path.write_text(json.dumps(spec))
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT m.*, r.warnings FROM measurements m JOIN runs r USING (run_id)")
    for p in aggregate.GPU_PROPERTIES:
        assert (m[p] is None) if expect_null else (m[p] == 0.0), p
    warned = any("no GPU sample" in w for w in m["warnings"] or [])
    assert warned == expect_null
    assert m["cpu_compute_utilization"] is not None  # the process rows still count


def test_stability_fractions(wd, tmp_path):
    exp = "finetune_full_stability-v1.0.0"
    trials = [{"trial": i, "exit_code": c, "outcome": o, "reason": None}
              for i, (c, o) in enumerate([(0, "ok"), (1, "invalid"), (1, "invalid"), (1, "failed"), (0, "ok")])]
    run = write_attempt(wd, 4, experiment=exp, trials=trials,
                        errors=[{"rank": 0, "host": "node1", "kind": "invalid", "error_type": "torch.OutOfMemoryError",
                                 "message": "CUDA out of memory", "stage": "train", "trial": 2, "t_wall": jobdirs.T0}])
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT * FROM measurements")
    assert (m["f_gpu_oom"], m["f_other_error"], m["f_no_error"]) == (0.4, 0.2, 0.4)
    assert m["is_valid"] is True and m["trials_run"] == 5 and m["train_runtime"] is None
    assert rows_of(db, "SELECT trial, outcome FROM trials ORDER BY trial") == [
        (0, "ok"), (1, "invalid"), (2, "invalid"), (3, "failed"), (4, "ok")]


# -- outcomes and reasons ----------------------------------------------------------------------------------
def test_invalid_run_gets_measurement_with_null_properties(wd, tmp_path):
    run = write_attempt(wd, 5, results={"node1": {"outcome": "invalid", "reason": "GPU out of memory", "exit_code": 1}},
                        errors=[{"rank": 1, "host": "node1", "kind": "invalid", "error_type": "torch.OutOfMemoryError",
                                 "message": "CUDA out of memory. Tried to allocate 2.00 GiB\nmore", "traceback": "tb",
                                 "stage": "train", "trial": None, "t_wall": jobdirs.T0 + 7}])
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("FAILED", "1:0", "node1")})))
    r = one(db, "SELECT outcome, reason FROM runs")
    assert r["outcome"] == "invalid"
    assert r["reason"].startswith("GPU out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                  "2.00 GiB (rank 1 on node1 during train)")
    m = one(db, "SELECT * FROM measurements")
    assert m["is_valid"] is False and m["gpu_compute_utilization_avg"] is None and m["train_runtime"] is None
    assert m["model_name"] == "smollm2-135m"
    assert one(db, "SELECT kind, error_type FROM errors") == {"kind": "invalid", "error_type": "torch.OutOfMemoryError"}


@pytest.mark.parametrize("state,reason", [("CANCELLED by 0", "cancelled"), ("TIMEOUT", "timeout after 600 s"),
                                          ("NODE_FAIL", "node failure"), ("OUT_OF_MEMORY", "host OOM")])
def test_scheduler_failures_are_failed_runs_without_measurement(wd, tmp_path, state, reason):
    run = write_attempt(wd, 6, results=False,
                        stages={"node1": json.dumps(jobdirs.stage_event("start", "train", "node1", jobdirs.T0 + 5, 0))
                                + "\n"})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: (state, "0:9", "node1")})))
    r = one(db, "SELECT state, outcome, reason FROM runs")
    assert r["outcome"] == "failed" and r["state"] == state.split()[0]
    assert r["reason"].split("; ")[0] == reason
    assert "crashed during train on node1: start without end" in r["reason"]
    assert rows_of(db, "SELECT count(*) FROM measurements") == [(0,)]


def test_a_job_gone_before_its_accounting_record_is_written_takes_the_records_state_later(wd, tmp_path):
    """slurmdbd trails slurmctld: a job can leave the queue before sacct has its record (an array task
    cancelled while pending gets its record late). Collect then says GONE (failed for now, not final) and a
    later collect takes the record's state and reason; once final, it is not asked about again."""
    run = write_attempt(wd, 7, results=False, stages={"node1": None}, samples={"node1": None})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({})))  # neither the queue nor accounting knows the job
    r = one(db, "SELECT state, outcome FROM runs")
    assert (r["state"], r["outcome"]) == ("GONE", "failed")
    late = FakeSlurm({run["job_id"]: ("CANCELLED by 0", "0:0", "None assigned")})
    collect(db, wd, slurm=Slurm(late))
    r = one(db, "SELECT state, outcome, reason FROM runs")
    assert (r["state"], r["outcome"], r["reason"].split("; ")[0]) == ("CANCELLED", "failed", "cancelled")
    again = FakeSlurm({run["job_id"]: ("CANCELLED by 0", "0:0", "None assigned")})
    collect(db, wd, slurm=Slurm(again))
    assert not [c for c in again.calls if c[0] == "sacct"]  # settled: not asked again


def test_missing_node_and_truncated_stages_give_precise_reasons(wd, tmp_path):
    h = "node1"
    evs = jobdirs.normal_stages(h, jobdirs.T0, jobdirs.T0 + 5, jobdirs.T0 + 15, [0])
    lines = [json.dumps(e) for e in evs]
    # the train 'end' line was cut mid-write (the node died): line 7 is truncated
    idx = next(i for i, e in enumerate(evs) if e["stage"] == "train" and e["event"] == "end")
    text = "\n".join(lines[:idx]) + "\n" + lines[idx][:25]
    run = write_attempt(wd, 7, hosts=("node1", "node2"), gpus_per_host=1, results={},
                        stages={"node1": text, "node2": None})
    os.remove(run["paths"].samples("node2"))
    os.remove(run["paths"].root / "environment.node2.json")
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("FAILED", "1:0", "node[1-2]")})))
    r = one(db, "SELECT outcome, reason, hosts_expected, hosts_seen FROM runs")
    assert r["outcome"] == "failed"
    parts = r["reason"].split("; ")
    assert f"stages.node1.jsonl line {idx + 1}: truncated JSON" in parts
    assert "crashed during train on node1: start without end" in parts
    assert "node node2: no stages file (expected hosts node1,node2)" in parts
    assert "node node1: no result file" in parts
    assert r["hosts_expected"] == ["node1", "node2"] and r["hosts_seen"] == ["node1"]
    assert one(db, "SELECT seen, has_stages FROM run_hosts WHERE host = 'node2'") == {"seen": False,
                                                                                        "has_stages": False}


def test_corrupt_and_truncated_csv_lines(wd, tmp_path):
    rows = jobdirs.gen_samples(jobdirs.T0, 20, 2)
    run = write_attempt(wd, 8, samples={"node1": rows})
    p = run["paths"].samples("node1")
    lines = p.read_text().splitlines()
    lines.insert(5, "GARBAGE,x")  # becomes line 6
    p.write_text("\n".join(lines) + "\n" + "1763769700.0,5100.0,gpu,0,55")  # truncated last line, no newline
    total_lines = len(lines) + 1
    db = tmp_path / "r.duckdb"
    rep = collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    assert rep.sample_rows == len(rows)  # neither the garbage nor the truncated row got in
    r = one(db, "SELECT outcome, warnings FROM runs")
    assert r["outcome"] == "ok"
    assert f"samples.node1.csv line {total_lines}: truncated last line (ignored)" in r["warnings"]
    assert any(w.startswith("samples.node1.csv line 6: MISSING COLUMNS") for w in r["warnings"])


def test_only_files_whose_rows_differ_from_the_samplers_count_are_read_again(wd, tmp_path, monkeypatch):
    # A finished host's result file records how many rows its sampler wrote. Its samples load without
    # DuckDB recording rejected lines (cheaper); only a file whose loaded rows differ from that count is
    # read again to say which lines were skipped and why. A host that left no result file (still running)
    # is loaded with rejects recorded at once.
    from harness.collect import loading
    n = 20 * 3  # 20 ticks x (2 GPU rows + 1 process row)
    clean = write_attempt(wd, 81, results={"node1": {"samples": n}})
    bad = write_attempt(wd, 82, results={"node1": {"samples": n}})
    running = write_attempt(wd, 83, results=False)
    for run, cut in ((bad, 2), (running, 1)):
        p = run["paths"].samples("node1")
        lines = p.read_text().splitlines()
        lines[5] = ",".join(lines[5].split(",")[:4] + ["oops"] + lines[5].split(",")[5:])  # file line 6
        if cut == 2:
            lines[10] = lines[10] + ",1"  # file line 11: one column too many
        p.write_text("\n".join(lines) + "\n")
    reread: list[list[str]] = []
    real = loading.sample_rejects

    def spy(store, paths, *rest):
        reread.append([str(x) for x in paths])
        return real(store, paths, *rest)

    monkeypatch.setattr(loading, "sample_rejects", spy)
    db = tmp_path / "r.duckdb"
    fake = FakeSlurm({clean["job_id"]: ("COMPLETED", "0:0", "node1"), bad["job_id"]: ("COMPLETED", "0:0", "node1"),
                      running["job_id"]: ("RUNNING", "0:0", "node1")})
    rep = collect(db, wd, slurm=Slurm(fake))
    assert reread == [[str(bad["paths"].samples("node1"))]]
    assert rep.sample_rows == 3 * n - 3
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT run_id, outcome, warnings, sample_rows FROM runs")
        got = {r[0]: dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()}
    finally:
        con.close()
    assert got[clean["run_id"]]["warnings"] is None and got[clean["run_id"]]["sample_rows"] == n
    assert got[bad["run_id"]]["sample_rows"] == n - 2 and got[bad["run_id"]]["outcome"] == "ok"
    warns = got[bad["run_id"]]["warnings"]
    assert any(w.startswith("samples.node1.csv line 6: CAST") and "oops" in w for w in warns), warns
    assert any(w.startswith("samples.node1.csv line 11: TOO MANY COLUMNS") for w in warns), warns
    assert got[running["run_id"]]["sample_rows"] == n - 1
    assert any(w.startswith("samples.node1.csv line 6: CAST") for w in got[running["run_id"]]["warnings"])


def test_nccl_transport_recorded_per_host(wd, tmp_path):
    fix = Path(__file__).parent / "fixtures" / "collect" / "nccl"
    run = write_attempt(wd, 9, hosts=("node1", "node2"), gpus_per_host=1,
                        logs={"node1": (fix / "roce.node1.log").read_text(),
                              "node2": (fix / "socket.node2.log").read_text()})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node[1-2]")})))
    assert rows_of(db, "SELECT host, transport FROM run_hosts ORDER BY host") == [("node1", "roce"),
                                                                                  ("node2", "socket")]
    assert one(db, "SELECT transport, transport_by_host FROM runs") == {
        "transport": "mixed", "transport_by_host": "node1=roce,node2=socket"}


# -- incremental, idempotent ------------------------------------------------------------------------------
def build_mixed(wd):
    runs = [write_attempt(wd, 10),
            write_attempt(wd, 11, results=False, stages={"node1": json.dumps(
                jobdirs.stage_event("start", "train", "node1", jobdirs.T0 + 5, 0)) + "\n"}),
            write_attempt(wd, 12, results={"node1": {"outcome": "invalid", "reason": "oom"}},
                          errors=[{"rank": 0, "host": "node1", "kind": "invalid", "error_type": "OOM",
                                   "message": "m", "stage": "train"}]),
            write_attempt(wd, 13, results=False)]
    fake = FakeSlurm({runs[0]["job_id"]: ("COMPLETED", "0:0", "node1"), runs[1]["job_id"]: ("TIMEOUT", "0:0", "node1"),
                      runs[2]["job_id"]: ("FAILED", "1:0", "node1"), runs[3]["job_id"]: ("RUNNING", "0:0", "node1")})
    return runs, fake


def test_recollect_changes_no_row(wd, tmp_path):
    runs, fake = build_mixed(wd)
    db = tmp_path / "r.duckdb"
    rep = collect(db, wd, slurm=Slurm(fake))
    assert rep.outcomes == {"failed": 1, "invalid": 1, "ok": 1, "pending": 1}
    before = dump(db)
    assert sum(len(v) for v in before.values()) > 100
    calls = len(fake.calls)
    rep2 = collect(db, wd, slurm=Slurm(fake))
    assert dump(db) == before
    assert (rep2.new, rep2.updated, rep2.unchanged, rep2.sample_rows) == (0, 0, 4, 0)
    # only the still-running job was asked about again
    assert len(fake.calls) == calls + 1 and fake.calls[-1][2] == runs[3]["job_id"]


def test_running_attempt_is_updated_when_it_finishes(wd, tmp_path):
    run = write_attempt(wd, 14, results=False)
    fake = FakeSlurm({run["job_id"]: ("RUNNING", "0:0", "node1")})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(fake))
    r = one(db, "SELECT state, outcome, ended_at FROM runs")
    assert r == {"state": "RUNNING", "outcome": None, "ended_at": None}
    assert rows_of(db, "SELECT count(*) FROM measurements") == [(0,)]
    n_samples = rows_of(db, "SELECT count(*) FROM samples")[0][0]
    # the job finishes: more samples, result and rank files appear, sacct says COMPLETED
    paths = run["paths"]
    extra = jobdirs.gen_samples(jobdirs.T0 + 20, 5, 2, seed=99)
    with paths.samples("node1").open("a") as fh:
        fh.write("".join(jobdirs.sample_line(r) + "\n" for r in extra))
    jobdirs.write_json(paths.result("node1"), jobdirs.result_doc("node1", 0, jobdirs.T0, jobdirs.T0 + 16))
    for rk in (0, 1):
        jobdirs.write_json(paths.rank_result(rk), jobdirs.rank_doc(rk, "node1", 2, run["t_train0"], run["t_train1"]))
    fake.jobs[run["job_id"]] = ("COMPLETED", "0:0", "node1")
    rep = collect(db, wd, slurm=Slurm(fake))
    assert (rep.new, rep.updated) == (0, 1)
    r = one(db, "SELECT state, outcome FROM runs")
    assert r == {"state": "COMPLETED", "outcome": "ok"}
    assert rows_of(db, "SELECT count(*) FROM samples")[0][0] == n_samples + len(extra)
    assert rows_of(db, "SELECT count(*), count(DISTINCT run_id) FROM measurements") == [(1, 1)]
    assert rows_of(db, "SELECT count(*) FROM runs") == [(1,)]


def test_requeued_job_stays_one_run(wd, tmp_path):
    run = write_attempt(wd, 15, results=False)
    fake = FakeSlurm({run["job_id"]: ("PREEMPTED", "0:0", "node1")})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(fake))
    assert one(db, "SELECT outcome, reason FROM runs")["reason"].startswith("preempted")
    fake.jobs[run["job_id"]] = ("RUNNING", "0:0", "node2")  # requeued under the same job id
    collect(db, wd, slurm=Slurm(fake))
    assert rows_of(db, "SELECT count(*), any_value(state), any_value(outcome) FROM runs") == [(1, "RUNNING", None)]


def test_state_change_alone_rereads_the_run_with_one_copy_of_its_samples(wd, tmp_path):
    # Same files, new scheduler state: the run is re-read (its samples deleted and loaded again, after the
    # loads of the runs whose files changed), never doubled.
    run = write_attempt(wd, 17)
    other = write_attempt(wd, 18, results=False)
    fake = FakeSlurm({run["job_id"]: ("RUNNING", "0:0", "node1"), other["job_id"]: ("RUNNING", "0:0", "node1")})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(fake))
    n_rows = sum(len(r) for r in run["rows"].values())
    rid = run["run_id"]
    assert rows_of(db, "SELECT count(*) FROM samples WHERE run_id = ?", [rid]) == [(n_rows,)]
    fake.jobs[run["job_id"]] = ("COMPLETED", "0:0", "node1")
    with other["paths"].samples("node1").open("a") as fh:  # the other run's files change meanwhile
        fh.write(jobdirs.sample_line(jobdirs.gen_samples(jobdirs.T0 + 20, 1, 2, seed=7)[0]) + "\n")
    rep = collect(db, wd, slurm=Slurm(fake))
    assert (rep.new, rep.updated) == (0, 2)
    assert one(db, "SELECT state, outcome, sample_rows FROM runs WHERE run_id = ?", [rid]) == {
        "state": "COMPLETED", "outcome": "ok", "sample_rows": n_rows}
    assert rows_of(db, "SELECT count(*) FROM samples WHERE run_id = ?", [rid]) == [(n_rows,)]
    assert rows_of(db, "SELECT count(*), count(DISTINCT file_id) FROM sample_files") == [(2, 2)]
    # every sample row belongs to a recorded file
    assert rows_of(db, "SELECT count(*) FROM sample_rows WHERE file_id NOT IN (SELECT file_id FROM sample_files)") \
        == [(0,)]


def test_changed_and_new_runs_each_load_their_rows_once_in_their_own_file(wd, tmp_path):
    # Every file must get its own rows, once, also when old runs (their old samples deleted first) and new
    # ones are mixed in one load.
    runs = {i: write_attempt(wd, i, hosts=("node1", "node2"), ticks=10 + i) for i in range(30, 33)}
    db = tmp_path / "r.duckdb"
    fake = FakeSlurm()
    collect(db, wd, slurm=Slurm(fake))
    for i in (30, 31):  # two old runs change, three new ones come
        with runs[i]["paths"].samples("node2").open("a") as fh:
            extra = jobdirs.gen_samples(jobdirs.T0 + 100, 1, 2, seed=i)
            fh.write("".join(jobdirs.sample_line(r) + "\n" for r in extra))
            runs[i]["rows"]["node2"] = runs[i]["rows"]["node2"] + extra
    runs.update({i: write_attempt(wd, i, hosts=("node1", "node2"), ticks=10 + i) for i in range(33, 36)})
    rep = collect(db, wd, slurm=Slurm(fake))
    assert (rep.new, rep.updated, rep.unchanged) == (3, 2, 1)
    for run in runs.values():
        for host, rows in run["rows"].items():
            got = rows_of(db, "SELECT count(*), max(t_wall), round(sum(gpu_util), 3) FROM samples "
                              "WHERE run_id = ? AND host = ?", [run["run_id"], host])
            want = (len(rows), max(r["t_wall"] for r in rows),
                    round(sum(r["gpu_util"] for r in rows if r.get("gpu_util") is not None), 3))
            assert got == [want], (run["run_id"], host)
    assert rows_of(db, "SELECT count(*), count(DISTINCT file_id), count(DISTINCT path) FROM sample_files") == \
        [(12, 12, 12)]


def test_an_interrupted_collect_stops_its_database_worker_and_changes_nothing(wd, tmp_path, monkeypatch):
    # Ctrl-C while the samples load: the load is interrupted, the transaction rolled back, no thread left.
    import threading

    write_attempt(wd, 19)
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm()))
    before = dump(db)
    for i in range(60, 64):
        write_attempt(wd, i, ticks=400)

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ingest, "stage", interrupted)
    with pytest.raises(KeyboardInterrupt):
        collect(db, wd, slurm=Slurm(FakeSlurm()))
    assert not [t for t in threading.enumerate() if t.name.startswith("sbench-collect-db")]
    assert dump(db) == before
    monkeypatch.undo()
    rep = collect(db, wd, slurm=Slurm(FakeSlurm()))
    assert rep.new == 4 and rows_of(db, "SELECT count(*) FROM runs") == [(5,)]


def test_samples_load_while_the_scheduler_is_asked(wd, tmp_path, monkeypatch):
    # On a big cluster sacct can take seconds: the samples of runs whose files changed are already loading
    # by then. This sacct answers only once a load has begun (it would wait in vain for a collect that
    # loaded after asking it).
    import threading

    from harness.collect import loading
    runs = [write_attempt(wd, i) for i in (70, 71)]
    loading_began = threading.Event()
    real_load = loading.load_samples

    def load(*a, **kw):
        loading_began.set()
        return real_load(*a, **kw)

    class WaitingSlurm(FakeSlurm):
        def __call__(self, argv):
            if argv[0] == "sacct":
                assert loading_began.wait(60), "sacct was asked before any sample was loading"
            return super().__call__(argv)

    monkeypatch.setattr(loading, "load_samples", load)
    jobs = {r["job_id"]: ("COMPLETED", "0:0", "node1") for r in runs}
    rep = collect(tmp_path / "r.duckdb", wd, slurm=Slurm(WaitingSlurm(jobs)))
    assert rep.outcomes == {"ok": 2} and rep.accounting == {"sacct": 2}


def test_job_dirs_are_read_after_the_scheduler_answered(wd, tmp_path, monkeypatch):
    # A job dir is read once the scheduler has given its word, so a run it calls ended is read with the
    # files it ended with (never with files from before its end).
    runs = [write_attempt(wd, i) for i in (72, 73)]
    events: list[str] = []
    real_read = ingest.read_job

    def read_job(att, *a):
        events.append(f"read {att.run_id}")
        return real_read(att, *a)

    class LoggingSlurm(FakeSlurm):
        def __call__(self, argv):
            events.append(argv[0])
            return super().__call__(argv)

    monkeypatch.setattr(ingest, "read_job", read_job)
    jobs = {r["job_id"]: ("COMPLETED", "0:0", "node1") for r in runs}
    rep = collect(tmp_path / "r.duckdb", wd, slurm=Slurm(LoggingSlurm(jobs)))
    assert rep.outcomes == {"ok": 2}
    assert events[0] == "sacct" and sorted(events[1:]) == sorted(f"read {r['run_id']}" for r in runs), events


def test_a_run_that_ends_while_the_scheduler_is_asked_is_read_again(wd, tmp_path):
    # The job ends while sacct is being asked: its files were scanned before, as unfinished; it is read with
    # the files it ended with, and its fingerprint stays the one scanned before, so the next collect reads all
    # of it (samples included) once more.
    run = write_attempt(wd, 74, results=False)
    paths = run["paths"]

    class EndingSlurm(FakeSlurm):
        def __call__(self, argv):
            if argv[0] == "sacct":
                # the job ends after its files were scanned, before sacct answers
                jobdirs.write_json(paths.result("node1"), jobdirs.result_doc("node1", 0, jobdirs.T0, jobdirs.T0 + 16))
                for rk in (0, 1):
                    jobdirs.write_json(paths.rank_result(rk),
                                     jobdirs.rank_doc(rk, "node1", 2, run["t_train0"], run["t_train1"]))
            return super().__call__(argv)

    db = tmp_path / "r.duckdb"
    fake = EndingSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})
    rep = collect(db, wd, slurm=Slurm(fake))
    assert rep.outcomes == {"ok": 1}
    assert one(db, "SELECT state, outcome, reason FROM runs") == {"state": "COMPLETED", "outcome": "ok", "reason": None}
    assert rows_of(db, "SELECT count(*) FROM measurements") == [(1,)]
    n = rows_of(db, "SELECT count(*) FROM samples")[0][0]
    again = collect(db, wd, slurm=Slurm(FakeSlurm(fake.jobs)))
    assert (again.new, again.updated) == (0, 1)
    assert one(db, "SELECT outcome FROM runs") == {"outcome": "ok"}
    assert rows_of(db, "SELECT count(*) FROM samples")[0][0] == n
    third = collect(db, wd, slurm=Slurm(FakeSlurm(fake.jobs)))
    assert (third.new, third.updated) == (0, 0)


def test_finished_runs_proved_unchanged_by_their_stamp_are_not_listed_and_every_change_is_noticed(
        wd, tmp_path, monkeypatch):
    # The no-op re-collect's rule (docs/performance.md): a finished run's dir is proved unchanged by its own
    # stat and that of the files written in place; a result written late, a file replaced whole, a file
    # appended to or rewritten in place are each noticed, and a dir with a FIFO in it is listed every time.
    monkeypatch.setattr(discover_mod, "STAMP_SETTLE_NS", 200_000_000)
    listed: list[str] = []
    real_scan = ingest.scan_stamped

    def counting_scan(job_dir, settled):
        listed.append(job_dir.name)
        return real_scan(job_dir, settled)

    monkeypatch.setattr(ingest, "scan_stamped", counting_scan)
    late = write_attempt(wd, 80, results=False)  # its result comes after the first collect
    appended, replaced, rewritten, odd = (write_attempt(wd, i) for i in (81, 82, 83, 84))
    os.mkfifo(odd["paths"].root / "notes.fifo")
    runs = [late, appended, replaced, rewritten, odd]
    fake = FakeSlurm({r["job_id"]: ("COMPLETED", "0:0", "node1") for r in runs})
    db = tmp_path / "r.duckdb"
    time.sleep(0.3)  # older than the settle time: stamps are taken
    rep = collect(db, wd, slurm=Slurm(fake))
    assert rep.outcomes == {"failed": 1, "ok": 4} and len(listed) == 5
    key = f"stamps:{os.path.abspath(wd / CAMPAIGN)}"
    stamps = json.loads(one(db, "SELECT value FROM metadata WHERE key = ?", [key])["value"])
    assert sorted(stamps) == sorted(r["run_id"] for r in runs if r is not odd)  # no stamp of a dir with a FIFO
    before = dump(db)
    listed.clear()
    rep = collect(db, wd, slurm=Slurm(fake))
    assert (rep.new, rep.updated, rep.unchanged) == (0, 0, 5) and dump(db) == before
    assert listed == [odd["paths"].root.name]  # the others are proved unchanged without a listing

    # the changes: a result (and its ranks' files) written late; a sample row appended; a rank file replaced
    # whole (written beside it and renamed, as the runner does); the stage log rewritten in place, same name
    jobdirs.write_json(late["paths"].result("node1"), jobdirs.result_doc("node1", 0, jobdirs.T0, jobdirs.T0 + 16))
    for rk in (0, 1):
        jobdirs.write_json(late["paths"].rank_result(rk), jobdirs.rank_doc(rk, "node1", 2, late["t_train0"],
                                                                      late["t_train1"]))
    extra = jobdirs.gen_samples(jobdirs.T0 + 30, 1, 2, seed=5)
    with appended["paths"].samples("node1").open("a") as fh:
        fh.write(jobdirs.sample_line(extra[0]) + "\n")
    tmp = replaced["paths"].root / ".rank.0.json.tmp"
    jobdirs.write_json(tmp, jobdirs.rank_doc(0, "node1", 2, replaced["t_train0"], replaced["t_train1"], tps=2000.0))
    os.replace(tmp, replaced["paths"].rank_result(0))
    stages = rewritten["paths"].stages("node1")
    events = [json.loads(x) for x in stages.read_text().splitlines()]
    stages.write_text("".join(json.dumps(e) + "\n" for e in events if e["stage"] != "teardown"))
    listed.clear()
    rep = collect(db, wd, slurm=Slurm(fake))
    assert (rep.new, rep.updated, rep.unchanged) == (0, 4, 1), rep
    assert len(listed) == 5
    assert one(db, "SELECT outcome FROM runs WHERE run_id = ?", [late["run_id"]]) == {"outcome": "ok"}
    n = sum(len(v) for v in appended["rows"].values()) + 1
    assert rows_of(db, "SELECT count(*) FROM samples WHERE run_id = ?", [appended["run_id"]]) == [(n,)]
    assert rows_of(db, "SELECT count(*) FROM stages WHERE run_id = ? AND stage = 'teardown'",
                   [rewritten["run_id"]]) == [(0,)]
    assert rows_of(db, "SELECT count(*) FROM ranks WHERE run_id = ? AND train_tokens_per_second = 2000",
                   [replaced["run_id"]]) == [(1,)]
    # changed just now: stamped only if they settled before that scan (load-dependent), else listed again
    # (finding nothing new); once settled, they are stamped, and later collects list only the dir with the FIFO
    listed.clear()
    rep = collect(db, wd, slurm=Slurm(fake))
    assert (rep.new, rep.updated) == (0, 0) and odd["paths"].root.name in listed
    time.sleep(0.3)
    collect(db, wd, slurm=Slurm(fake))
    listed.clear()
    after = dump(db)
    rep = collect(db, wd, slurm=Slurm(fake))
    assert (rep.new, rep.updated) == (0, 0) and listed == [odd["paths"].root.name] and dump(db) == after


def test_an_unchanged_manifest_is_not_read_again_until_a_run_needs_its_lines(wd, tmp_path, monkeypatch):
    # A manifest recorded at the last collect, unchanged since (device, inode, size, mtime), gives its attempts
    # from the index recorded with it. It is read again when it grows, and when a run must be read (its
    # manifest line holds the scheduler's key and the submit reason); what collect writes is the same either way.
    # No job dir's stamp in this test (none settles): one taken between two collects once a run's files are 5 s
    # old would change the metadata the last collect must leave as it was (under load the collects span that).
    monkeypatch.setattr(discover_mod, "STAMP_SETTLE_NS", 10**18)
    reads: list[str] = []
    real_read = discover_mod.read_manifest

    def counting_read(path):
        reads.append(path.name)
        return real_read(path)

    monkeypatch.setattr(discover_mod, "read_manifest", counting_read)
    first, second = write_attempt(wd, 85), write_attempt(wd, 86)
    fake = FakeSlurm({first["job_id"]: ("COMPLETED", "0:0", "node1"), second["job_id"]: ("RUNNING", "", "node1")})
    db = tmp_path / "r.duckdb"
    rep = collect(db, wd, slurm=Slurm(fake))
    assert rep.runs == 2 and reads == ["manifest.jsonl"]
    key = f"manifest-index:{os.path.abspath(wd / CAMPAIGN / 'manifest.jsonl')}"
    index = json.loads(one(db, "SELECT value FROM metadata WHERE key = ?", [key])["value"])
    assert sorted(r[0] for r in index["rows"]) == sorted([first["run_id"], second["run_id"]])
    # the second run is still running: it is asked about, so the manifest is read for its line
    reads.clear()
    rep = collect(db, wd, slurm=Slurm(fake))
    assert reads == ["manifest.jsonl"] and rep.runs == 2
    fake.jobs[second["job_id"]] = ("COMPLETED", "0:0", "node1")
    reads.clear()
    rep = collect(db, wd, slurm=Slurm(fake))
    assert reads == ["manifest.jsonl"] and rep.updated == 1 and rep.outcomes == {"ok": 2}
    # both final: nothing is read, and nothing changes
    before = dump(db)
    reads.clear()
    rep = collect(db, wd, slurm=Slurm(fake))
    assert reads == [] and (rep.runs, rep.new, rep.updated, rep.unchanged) == (2, 0, 0, 2) and dump(db) == before
    # the manifest grows (a new attempt): it is read, the new run is collected with its manifest line
    third = write_attempt(wd, 87)
    fake.jobs[third["job_id"]] = ("COMPLETED", "0:0", "node1")
    rep = collect(db, wd, slurm=Slurm(fake))
    assert reads == ["manifest.jsonl"] and rep.new == 1 and rep.outcomes == {"ok": 3}
    assert one(db, "SELECT job_id FROM runs WHERE run_id = ?", [third["run_id"]]) == {"job_id": third["job_id"]}
    # a collect of one campaign, and a database whose index was damaged, still see every run
    reads.clear()
    assert collect(db, wd, CAMPAIGN, slurm=Slurm(fake)).runs == 3 and reads == []
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE metadata SET value = '{\"key\": 1' WHERE key = ?", [key])
    rep = collect(db, wd, slurm=Slurm(fake))
    assert reads == ["manifest.jsonl"] and (rep.runs, rep.new, rep.updated) == (3, 0, 0)


def test_hand_rendered_job_dir_without_manifest_is_collected(wd, tmp_path):
    run = write_attempt(wd, 16, manifest=False, executor="local")
    jobdirs.write_json(run["paths"].submitted, {"executor": "local", "job_id": "not-a-pid",
                                                "submitted_at": "2025-11-22T00:00:00+00:00"})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm()))
    r = one(db, "SELECT campaign, point_id, outcome, executor, accounting_source FROM runs")
    assert r == {"campaign": CAMPAIGN, "point_id": run["point_id"], "outcome": "ok", "executor": "local",
                 "accounting_source": "executor"}
    assert one(db, "SELECT source FROM campaigns") == {"source": "manifest"}  # the fixture's campaign line
    assert one(db, "SELECT number_gpus FROM points") == {"number_gpus": 2}


def test_no_sacct_falls_back_to_files(wd, tmp_path):
    run = write_attempt(wd, 17)

    def no_sacct(argv):
        raise FileNotFoundError(argv[0])

    db = tmp_path / "r.duckdb"
    rep = collect(db, wd, slurm=Slurm(no_sacct))
    assert rep.sacct == "no sacct command"
    assert one(db, "SELECT state, outcome, accounting_source FROM runs") == {
        "state": "COMPLETED", "outcome": "ok", "accounting_source": "files"}
    assert run["job_id"]


# -- crash safety and concurrency ---------------------------------------------------------------------------
def _collect_proc(db: Path, wd: Path, pause: str | None = None, extra_env: dict[str, str] | None = None):
    env = {**os.environ, "SBENCH_SACCT_FAKE": "1"}
    if pause:
        env.update({"SBENCH_COLLECT_PAUSE_AT": pause, "SBENCH_COLLECT_PAUSE_S": "60"})
    env.update(extra_env or {})
    code = ("import sys, subprocess\n"
            "from harness.collect import collect\n"
            "from harness.slurm.client import Slurm\n"
            "fake = lambda argv: subprocess.CompletedProcess(argv, 0, '', '')\n"
            "collect(sys.argv[1], sys.argv[2], slurm=Slurm(fake))\n")
    return subprocess.Popen([sys.executable, "-c", code, str(db), str(wd)], env=env, cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)


def _wait_paused(proc) -> None:
    line = proc.stderr.readline()
    assert "paused at" in line, line + proc.stderr.read()


@pytest.mark.parametrize("phase", ["samples", "write", "commit"])
def test_kill_9_mid_collect_leaves_db_as_before(wd, tmp_path, phase):
    write_attempt(wd, 20)
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm()))
    before = dump(db)
    for i in range(21, 24):
        write_attempt(wd, i)
    proc = _collect_proc(db, wd, pause=phase)
    _wait_paused(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert dump(db) == before  # nothing of the killed collect is visible
    rep = collect(db, wd, slurm=Slurm(FakeSlurm()))
    assert rep.new == 3
    after = dump(db)
    assert len(after["runs"]) == 4 and len(after["measurements"]) == 4


def test_second_collect_gets_a_clear_busy_message(wd, tmp_path):
    write_attempt(wd, 30)
    db = tmp_path / "r.duckdb"
    proc = _collect_proc(db, wd, pause="parse")
    try:
        _wait_paused(proc)
        env = {**os.environ, "SBENCH_DB_WAIT": "0.5"}
        t = time.monotonic()
        res = subprocess.run(command("collect", "--db", db, "--workdir", wd), capture_output=True, text=True, env=env,
                             cwd=ROOT)
        assert time.monotonic() - t < 30
        assert res.returncode == 1
        assert f"Error: {db} is in use by another process (PID {proc.pid}); waited 0.5 s" in res.stderr
        assert "Traceback" not in res.stderr
    finally:
        proc.kill()
        proc.wait()


def test_local_executor_run_is_running_while_its_process_lives_then_done(wd, tmp_path):
    run = write_attempt(wd, 40, results=False, executor="local")
    paths = run["paths"]
    launch = jobdirs.local_process(paths.root)  # the live launch: it carries the job dir's token
    try:
        jobdirs.write_json(paths.submitted, {"executor": "local", "job_id": run["job_id"], "pid": launch.pid})
        db = tmp_path / "r.duckdb"
        collect(db, wd, slurm=Slurm(FakeSlurm()))
        assert one(db, "SELECT state, outcome, accounting_source FROM runs") == {
            "state": "RUNNING", "outcome": None, "accounting_source": "executor"}
    finally:
        launch.kill()
    jobdirs.write_json(paths.result("node1"), jobdirs.result_doc("node1", 0, jobdirs.T0, jobdirs.T0 + 16))
    for rk in (0, 1):
        jobdirs.write_json(paths.rank_result(rk), jobdirs.rank_doc(rk, "node1", 2, run["t_train0"], run["t_train1"]))
    collect(db, wd, slurm=Slurm(FakeSlurm()))
    assert one(db, "SELECT state, outcome FROM runs") == {"state": "COMPLETED", "outcome": "ok"}


def test_job_that_never_started_its_runner_reports_the_batch_output(wd, tmp_path):
    run = write_attempt(wd, 41, results=False, stages={"node1": None}, samples={"node1": None})
    paths = run["paths"]
    for p in list(paths.root.glob("environment.*.json")):
        p.unlink()
    paths.slurm_out(run["job_id"]).write_text("+ source env/node1.sh\nlaunch.sh: line 12: /shared/venv/bin/python: "
                                              "No such file or directory\n")
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("FAILED", "127:0", "node1")})))
    r = one(db, "SELECT outcome, reason FROM runs")
    assert r["outcome"] == "failed"
    assert r["reason"] == ("node node1: no stages file (expected hosts node1); "
                           f"slurm-{run['job_id']}.out: launch.sh: line 12: /shared/venv/bin/python: "
                           "No such file or directory")


def test_weird_paths_are_collected(weird_tmp_path):
    wd = weird_tmp_path / "runs"
    wd.mkdir()
    jobdirs.append_manifest(wd, CAMPAIGN, [jobdirs.manifest_events(CAMPAIGN, FULL)])
    run = write_attempt(wd, 50)
    db = weird_tmp_path / "r 'x'.duckdb"
    rep = collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    assert rep.outcomes == {"ok": 1}
    assert rep.sample_rows == sum(len(r) for r in run["rows"].values())


def test_views_latest_measurement_run_summary_and_stage_durations(wd, tmp_path):
    first = write_attempt(wd, 60)
    # a second attempt of the same point, finished later, with a different rank-0 throughput
    pid, paths1 = first["point_id"], first["paths"]
    paths2 = JobPaths(paths1.root.parent / job_dir_name(pid, 0, 2))
    shutil.copytree(paths1.root, paths2.root)
    spec = json.loads(paths2.spec.read_text())
    spec["jobspec"]["attempt"] = 2  # a copy keeps attempt 1's spec.json, which collect refuses for attempt 2
    jobdirs.write_json(paths2.spec, spec)
    for rk in (0, 1):
        jobdirs.write_json(paths2.rank_result(rk),
                           jobdirs.rank_doc(rk, "node1", 2, first["t_train0"], first["t_train1"], tps=3000.0))
    jobdirs.write_json(paths2.result("node1"), jobdirs.result_doc("node1", 0, jobdirs.T0 + 100, jobdirs.T0 + 200))
    jobdirs.append_manifest(wd, CAMPAIGN, [{"type": "attempt", "campaign": CAMPAIGN, "point_id": pid, "repeat": 0,
                                            "attempt": 2, "job_dir": str(paths2.root), "executor": "slurm",
                                            "job_id": "9777", "submitted_at": "2025-11-22T01:00:00+00:00",
                                            "reason": "force"}])
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({first["job_id"]: ("COMPLETED", "0:0", "node1"),
                                            "9777": ("COMPLETED", "0:0", "node1")})))
    assert rows_of(db, "SELECT count(*) FROM measurements") == [(2,)]
    latest = one(db, "SELECT run_id, train_tokens_per_gpu_per_second FROM latest_measurements")
    assert latest == {"run_id": f"{CAMPAIGN}/{pid}.r0.a2", "train_tokens_per_gpu_per_second": 3000.0}
    summary = rows_of(db, "SELECT attempt, outcome, model_name, number_gpus FROM run_summary ORDER BY attempt")
    assert summary == [(1, "ok", "smollm2-135m", 2), (2, "ok", "smollm2-135m", 2)]
    train = one(db, "SELECT n, hosts, min_s, max_s FROM stage_durations WHERE run_id = ? AND stage = 'train'",
                [first["run_id"]])
    assert train == {"n": 2, "hosts": 1, "min_s": first["t_train1"] - first["t_train0"],
                     "max_s": first["t_train1"] - first["t_train0"]}
    assert one(db, "SELECT attempts, ok, pending FROM point_status") == {"attempts": 2, "ok": 2, "pending": 0}


def test_campaign_filter_and_plain_progress(wd, tmp_path):
    write_attempt(wd, 70, executor="local", job_id="x")
    other = tmp_path / "runs" / "other"
    jobdirs.make_run(tmp_path / "runs", "other", 1, hosts=("node1",), gpus_per_host=1, ticks=10, executor="local",
                     job_id="y")
    assert other.is_dir()
    db = tmp_path / "r.duckdb"
    res = sbench("collect", "--db", db, "--workdir", wd, "--campaign", CAMPAIGN, in_process=True, ok=None)
    assert res.exit_code == 0, res.output
    assert "collect: reading job dirs" in res.output  # not a TTY: plain progress lines, no bar
    assert rows_of(db, "SELECT DISTINCT campaign FROM runs") == [(CAMPAIGN,)]
    res = sbench("collect", "--db", db, "--workdir", wd, in_process=True, ok=None)
    assert sorted(rows_of(db, "SELECT DISTINCT campaign FROM runs")) == [(CAMPAIGN,), ("other",)]


def test_glob_characters_in_the_work_dir_path(tmp_path):
    wd = tmp_path / "we[ir]d*runs"
    wd.mkdir()
    jobdirs.append_manifest(wd, CAMPAIGN, [jobdirs.manifest_events(CAMPAIGN, FULL)])
    run = write_attempt(wd, 51)
    db = tmp_path / "r.duckdb"
    rep = collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    assert rep.sample_rows == sum(len(r) for r in run["rows"].values()) and rep.outcomes == {"ok": 1}


def test_gpu_run_without_samples_file_has_unknown_not_zero_gpu_values(wd, tmp_path):
    run = write_attempt(wd, 52, samples={"node1": None})
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT gpu_compute_utilization_avg, gpu_memory_utilization_peak, train_runtime, notes "
                "FROM measurements")
    assert m["gpu_compute_utilization_avg"] is None and m["gpu_memory_utilization_peak"] is None
    assert m["train_runtime"] == run["t_train1"] - run["t_train0"]
    assert m["notes"] == ["no samples file: GPU and CPU utilisation unknown"]


def test_rendered_only_job_dir_is_not_a_run(wd, tmp_path):
    ent = jobdirs.entity_for(FULL)
    pid = make_point_id(FULL, ent)
    paths = JobPaths(wd / CAMPAIGN / job_dir_name(pid, 0, 1))
    paths.root.mkdir(parents=True)
    jobdirs.write_spec(paths, CAMPAIGN, pid, 0, 1, FULL, ent)
    paths.sbatch.write_text("#!/bin/bash\n")
    paths.launch.write_text("#!/bin/bash\n")
    paths.accelerate.write_text("distributed_type: DEEPSPEED\n")  # a DeepSpeed point renders both
    paths.deepspeed.write_text("{}\n")
    db = tmp_path / "r.duckdb"
    rep = collect(db, wd, slurm=Slurm(FakeSlurm()))
    assert rep.runs == 0 and rows_of(db, "SELECT count(*) FROM runs") == [(0,)]
    jobdirs.write_json(paths.submitted, {"executor": "slurm", "job_id": "4444", "submitted_at": "2025-11-22T00:00:00Z"})
    rep = collect(db, wd, slurm=Slurm(FakeSlurm({"4444": ("PENDING", "0:0", "None assigned")})))
    assert rows_of(db, "SELECT job_id, state, outcome FROM runs") == [("4444", "PENDING", None)]


def test_what_ran_and_the_runners_notes_reach_measurements_and_warnings(wd, tmp_path):
    """Each rank's ``ran``/``adjustments``/``notes`` (rank.<r>.json) become the run's what-ran columns and notes:
    rank 0's effective dtype and attention, every rank's adjustments and notes once each, in rank order."""
    run = write_attempt(wd, 53, entity_over={"torch_dtype": "bfloat16"})
    adj = {"setting": "torch_dtype", "asked": "bfloat16", "used": "float32", "why": "no CUDA device"}
    extra = {0: ["torch_dtype bfloat16 -> float32: no CUDA device",
                 "3003 of 4096 entries have no response token within max_seq_length 256; their loss is masked"],
             1: ["torch_dtype bfloat16 -> float32: no CUDA device", "FSDP on CPU: switched"]}
    for r, notes in extra.items():
        doc = json.loads(run["paths"].rank_result(r).read_text())
        doc.update(ran={"torch_dtype": "float32", "bf16": False, "fp16": False, "attn_implementation": "sdpa"},
                   adjustments=[adj], notes=notes)
        jobdirs.write_json(run["paths"].rank_result(r), doc)
    db = tmp_path / "r.duckdb"
    collect(db, wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node1")})))
    m = one(db, "SELECT torch_dtype, effective_torch_dtype, attn_implementation, adjustments, notes FROM measurements")
    union = list(dict.fromkeys(extra[0] + extra[1]))
    assert (m["torch_dtype"], m["effective_torch_dtype"], m["attn_implementation"]) == ("bfloat16", "float32", "sdpa")
    assert json.loads(m["adjustments"]) == [adj] and m["notes"] == union
    assert one(db, "SELECT warnings FROM runs")["warnings"] == union
