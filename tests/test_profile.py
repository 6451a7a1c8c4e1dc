"""runner.profile: the last repeat of a point profiled with torch.profiler, its trace summarised by collect into
profile_ops, shown by sbench profile and the report, and left out of compare, check and the repeats' CV."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from harness.collect.profile import PHASES, summarise
from harness.contract.paths import JobPaths
from harness.runner.faults import FaultSpecError, parse_faults

from . import kit
from .kit import sbench, sql_rows, write_yaml
from .kit.browser import BARS, CHROMIUM, hover_tooltip, open_report, settle


def X(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_a_step_is_split_into_parts_that_add_up_and_ops_by_self_time():
    # one 100 us step: data 10, compute 60 (a backward function 20..50 of it, a gloo collective 40..55 on another
    # thread), optimizer 20, other 10
    doc = {"traceEvents": [
        X("sbench:step", 0, 100, cat="user_annotation"), X("sbench:data", 0, 10, cat="user_annotation"),
        X("sbench:compute", 10, 60, cat="user_annotation"), X("sbench:optimizer", 70, 20, cat="user_annotation"),
        X("sbench:other", 90, 10, cat="user_annotation"),
        X("aten::linear", 12, 8), X("aten::addmm", 13, 6),  # linear calls addmm: its self time is 8 - 6
        X("autograd::engine::evaluate_function: AddmmBackward0", 20, 30),
        X("gloo:all_reduce", 40, 15, tid=2, cat="user_annotation"), X("Optimizer.step#AdamW.step", 71, 18),
        X("not in a step", 200, 50)]}
    s = summarise(doc)
    assert s.steps == 1 and s.step_s == pytest.approx(100e-6)
    # compute 10..70: backward 20..40; the collective 40..55 on gloo's thread, hidden behind the step thread's
    # backward until 50 (overlapped), then waited for (exposed: the step thread runs nothing until 55); forward
    # 10..20 and 55..70
    assert s.phases == pytest.approx({"data": 10e-6, "forward": 25e-6, "backward": 20e-6, "optimizer": 20e-6,
                                      "communication_exposed": 5e-6, "communication_overlapped": 10e-6,
                                      "idle": 0.0, "other": 10e-6})
    assert sum(s.phases.values()) == pytest.approx(s.step_s)
    ops = {o["name"]: o for o in s.ops}
    assert ops["aten::linear"]["self_s"] == pytest.approx(2e-6)
    assert ops["aten::linear"]["total_s"] == pytest.approx(8e-6)
    assert ops["aten::addmm"]["self_s"] == pytest.approx(6e-6) and "not in a step" not in ops
    assert ops["gloo:all_reduce"]["kind"] == "collective" and ops["gloo:all_reduce"]["calls"] == 1


def test_communication_is_exposed_where_the_step_waits_and_overlapped_where_it_works():
    # one 100 us step, all compute: the step thread runs a backward function 0..40, then waits in a c10d wait 40..60
    # (exposed, though a gloo range is in flight on another thread 30..60: 30..40 is overlapped), computes 60..80
    # while an FSDP-style copy-out runs (a local copy: no communication), and is between its ranges 90..100 (idle)
    doc = {"traceEvents": [
        X("sbench:step", 0, 100, cat="user_annotation"), X("sbench:compute", 0, 90, cat="user_annotation"),
        X("autograd::engine::evaluate_function: MmBackward0", 0, 40),
        X("gloo:all_reduce", 30, 30, tid=2, cat="user_annotation"),
        X("_c10d_functional::wait_tensor", 40, 20), X("aten::mm", 60, 20),
        X("FSDP::all_gather_copy_out", 60, 10), X("fsdp::all_gather_copy_in", 70, 5, tid=3),
        X("aten::broadcast_tensors", 80, 5)]}
    s = summarise(doc)
    assert s.phases == pytest.approx({"data": 0.0, "forward": 30e-6, "backward": 30e-6, "optimizer": 0.0,
                                      "communication_exposed": 20e-6, "communication_overlapped": 10e-6,
                                      "idle": 10e-6, "other": 0.0}), s.phases
    assert sum(s.phases.values()) == pytest.approx(s.step_s)


def test_the_name_rule_counts_waits_and_collectives_not_copies_or_broadcast_tensors():
    from harness.collect.profile import is_comm

    for name in ("nccl:all_reduce", "gloo:all_reduce", "c10d::allreduce_", "_c10d_functional::wait_tensor",
                 "ncclDevKernel_AllGather_RING_LL", "record_param_comms", "c10d::broadcast_", "nccl:broadcast",
                 "ProcessGroupGloo::allgather", "c10d::reduce_scatter_tensor_coalesced_", "barrier",
                 "FSDP::post_backward_rs_wait (model.layers.0)"):
        assert is_comm(name), name
    for name in ("FSDP::all_gather_copy_out", "fsdp::all_gather_copy_in", "aten::broadcast_tensors", "aten::mm",
                 "sbench:compute", "aten::copy_", "Optimizer.step#AdamW.step", "FSDP::all_gather (model.layers.0)",
                 "FSDP::post_backward_reduce (model.layers.0)", "cudaStreamWaitEvent"):
        assert not is_comm(name), name


def test_a_gpu_trace_splits_communication_on_the_device_as_holistic_trace_analysis_does():
    # kernels on streams 7 (compute) and 8 (NCCL): the all-reduce kernel 40..70 runs beside a GEMM until 55
    doc = {"traceEvents": [
        X("sbench:step", 0, 100, cat="user_annotation"), X("sbench:compute", 0, 100, cat="user_annotation"),
        X("aten::mm", 0, 5), X("ampere_sgemm_128x64_nn", 10, 45, tid=7, cat="kernel"),
        X("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 30, tid=8, cat="kernel"),
        X("nccl:all_reduce", 38, 3, cat="user_annotation")]}
    s = summarise(doc)
    assert s.phases["communication_overlapped"] == pytest.approx(15e-6)  # 40..55 under the GEMM
    assert s.phases["communication_exposed"] == pytest.approx(15e-6)  # 55..70: the device only communicates
    assert sum(s.phases.values()) == pytest.approx(s.step_s)


def test_before_optimizer_faults_are_checked_like_the_others():
    (f,) = parse_faults("sleep@step=3,before=optimizer:0.5")
    assert (f.step, f.before, f.arg) == (3, "optimizer", "0.5")
    assert f.applies(rank=0, trial=None, step=3, before="optimizer")
    assert not f.applies(rank=0, trial=None, step=3)  # not at the step's end
    for bad, said in (("sleep@stage=train,before=optimizer", "before= needs step=N"),
                      ("sleep@step=1,before=forward", "before='forward'")):
        with pytest.raises(FaultSpecError, match=said):
            parse_faults(bad)


def test_profile_settings_are_checked_and_one_repeat_gets_a_second(tmp_path, cli):
    base = {"campaign": "p", "experiment": "finetune_lora_benchmark-v1.0.0",
            "entity": {"model_name": "smollm2-135m", "model_max_length": 256}, "grid": {"batch_size": [2]}}
    for profile, said in (({"steps": [5, 3]}, "runner.profile.steps must be [first, last]"),
                          ({"steps": [1, 2], "ranks": [-1]}, "runner.profile.ranks"),
                          ({"tool": "perf"}, "runner.profile.tool")):
        res = cli("plan", write_yaml(tmp_path / "s.yaml", {**base, "runner": {"profile": profile}}))
        assert res.exit_code == 2 and said in res.output, res.output
    res = cli("plan", write_yaml(tmp_path / "s.yaml", {**base, "repeats": {"min": 2, "max": 4, "cv": 0.02},
                                                       "runner": {"profile": {"steps": [1, 2]}}}))
    assert res.exit_code == 2 and "cannot profile with repeats: {min, max, cv}" in res.output
    from harness.spec.sweep import load_sweep

    sw = load_sweep(write_yaml(tmp_path / "s.yaml", base), profile=True)
    assert sw.repeats == 2 and sw.runner.profile_repeat == 1
    assert (sw.runner.profile_start, sw.runner.profile_end) == (3, 5)
    assert not sw.runner.for_repeat(0).profiled and sw.runner.for_repeat(1).profiled
    sw = load_sweep(write_yaml(tmp_path / "s.yaml", {**base, "repeats": 3}))
    assert sw.repeats == 3 and not sw.runner.profiled


def test_profile_steps_past_max_steps_and_ranks_past_the_processes_are_refused_before_anything_runs(tmp_path, cli):
    # a profiled repeat that could profile nothing is an input error at plan and submit time, naming the key
    base = {"campaign": "p", "experiment": "finetune_lora_benchmark-v1.0.0",
            "entity": {"model_name": "smollm2-135m", "model_max_length": 256, "max_steps": 8},
            "grid": {"batch_size": [2], "number_gpus": [1, 2]}}
    cases = (({"steps": [9, 10]}, ["runner.profile.steps: [9, 10] goes past max_steps: 8", "profile nothing"]),
             ({"steps": [7, 9]}, ["runner.profile.steps: [7, 9] goes past max_steps: 8", "fewer steps"]),
             ({"steps": [1, 2], "ranks": [0, 2]}, ["runner.profile.ranks: [2] is past the 1 process(es)",
                                                   "global ranks 0 to 0"]))
    for profile, said in cases:
        sweep = write_yaml(tmp_path / "s.yaml", {**base, "runner": {"profile": profile}})
        for command in (["plan", sweep], ["submit", sweep, "--executor", "local", "--workdir", tmp_path / "runs",
                                           "--db", tmp_path / "r.duckdb"]):
            res = cli(*command)
            assert res.exit_code == 2 and all(w in res.output for w in said), res.output
            assert "Traceback" not in res.output
    assert not (tmp_path / "runs").exists() and not (tmp_path / "r.duckdb").exists()  # nothing written
    # within both: planned; the 2-process point may profile rank 1
    ok = write_yaml(tmp_path / "s.yaml", {**base, "grid": {"batch_size": [2], "number_gpus": [2]},
                                          "runner": {"profile": {"steps": [7, 8], "ranks": [0, 1]}}})
    assert cli("plan", ok).exit_code == 0


@pytest.mark.train
@pytest.mark.slow(120)
def test_a_profiled_ddp_point_shows_gloo_and_a_slow_optimizer(tmp_path, tiny_model, small_data_dir):
    inv = write_yaml(tmp_path / "inv.yaml", kit.inventory("prof", gpus=2, memory_gb=16,
                                                          defaults={"env": {"OMP_NUM_THREADS": "1"}}))
    sweep = write_yaml(tmp_path / "s.yaml", kit.sweep(
        tiny_model, small_data_dir, campaign="prof", partition="cpu",
        entity={"model_max_length": 128, "number_gpus": 2, "distributed_backend": "DDP", "max_steps": 4},
        # (two ranks sharing two loaded cores can score a straggler without a fault: a lenient score keeps repeat 0
        # among the measured repeats; test_stragglers tests the flag)
        runner={"sample_interval_s": 0.2, "profile": {"steps": [2, 3], "ranks": [0, 1]}, "straggler_score": 0.05}))
    common = ["--workdir", tmp_path / "runs", "--db", tmp_path / "r.duckdb"]
    # the profiled repeat (r1) is slow in its optimizer: 0.3 s before each optimizer step of the profiled steps
    slow = "sleep@step=2,before=optimizer,job=.r1.:0.3;sleep@step=3,before=optimizer,job=.r1.:0.3"
    sbench("submit", sweep, "-i", inv, "--executor", "local", "--wait", *common, env={"SBENCH_FAULT": slow},
           timeout=900)
    sbench("collect", *common)
    db = tmp_path / "r.duckdb"
    runs = sql_rows(db, "SELECT run_id, repeat, outcome, profiled, profile_files, job_dir FROM runs ORDER BY repeat")
    assert [(r["repeat"], r["outcome"], r["profiled"]) for r in runs] == [(0, "ok", False), (1, "ok", True)], runs
    prof = runs[1]
    assert sorted(prof["profile_files"]) == ["profile.h1.rank0.pt.trace.json.gz", "profile.h1.rank1.pt.trace.json.gz"]
    trace = json.loads(gzip.decompress((Path(prof["job_dir"]) / prof["profile_files"][0]).read_bytes()))
    assert sum(1 for e in trace["traceEvents"] if e.get("name") == "sbench:step") == 2
    for rank in (0, 1):
        parts = {r["name"]: r for r in sql_rows(db, "SELECT * FROM profile_ops WHERE run_id = ? AND rank = ? AND "
                                                    "kind = 'phase'", [prof["run_id"], rank])}
        assert set(parts) == set(PHASES) and all(p["steps"] == 2 for p in parts.values())
        assert sum(p["share"] for p in parts.values()) == pytest.approx(1.0, abs=1e-6)
        assert sum(p["self_s"] for p in parts.values()) == pytest.approx(parts["data"]["step_s"] * 2, rel=1e-6)
        comm = parts["communication_exposed"]["share"] + parts["communication_overlapped"]["share"]
        assert comm > 0  # DDP's gradient all-reduce over gloo
        if rank == 0:  # the slow optimizer: 0.3 s of each step, the largest part
            assert parts["optimizer"]["self_s"] / 2 >= 0.28
            assert max(parts.values(), key=lambda p: p["share"])["name"] == "optimizer"
    gloo = sql_rows(db, "SELECT name FROM profile_ops WHERE run_id = ? AND kind = 'collective'", [prof["run_id"]])
    assert "gloo:all_reduce" in {g["name"] for g in gloo}, gloo  # DDP's gradients, by gloo's own ranges
    # the profiled run is marked and left out of the repeats' CV (and of compare and check: left_out_why)
    m = sql_rows(db, "SELECT repeat, profiled, is_valid, shared_host, host_busy, straggler FROM measurements "
                     "ORDER BY repeat")
    assert [(x["repeat"], x["profiled"]) for x in m] == [(0, False), (1, True)]
    assert sql_rows(db, "SELECT repeats_measured FROM point_stability") == [{"repeats_measured": 1}], m
    out = sbench("profile", prof["run_id"], "--db", db).stdout
    assert f"{prof['run_id']} rank 0 (h1): 2 profiled steps" in out and "optimizer" in out and "gloo" in out
    page = tmp_path / "r.html"
    sbench("report", "--db", db, "-o", page)
    text = page.read_text()
    assert 'id="profile"' in text and prof["run_id"] + "</h3>" not in text.split('id="profile"')[0]
    assert (Path(prof["job_dir"]) / prof["profile_files"][0]).as_uri() in text


@pytest.mark.train
@pytest.mark.slow(30)
def test_a_packed_campaign_with_repeats_and_profiled_points_reports_offline_and_compares_without_them(
        tmp_path, tiny_model, small_data_dir):
    """Two points of two repeats, packed two by two (slurm.pack, run by the local executor), the last repeat of each
    profiled: every profiled run has its trace in its job dir and parts that add up to its step; compare counts
    only the other repeat; the report loads in headless Chromium with the network blocked, logs no error, and a
    hover over a throughput marker and over a profile bar shows the run."""
    inv = write_yaml(tmp_path / "inv.yaml", kit.inventory("packed", gpus=2, memory_gb=16,
                                                          defaults={"env": {"OMP_NUM_THREADS": "1"}}))
    sweep = write_yaml(tmp_path / "s.yaml", kit.sweep(
        tiny_model, small_data_dir, campaign="packed", partition="cpu",
        entity={"model_max_length": 128, "max_steps": 4}, grid={"batch_size": [2, 4]}, repeats=2, slurm={"pack": 2},
        runner={"sample_interval_s": 0.1, "profile": {"steps": [2, 3], "ranks": [0]}}))
    db = tmp_path / "r.duckdb"
    common = ["--workdir", tmp_path / "runs", "--db", db]
    sbench("submit", sweep, "-i", inv, "--executor", "local", "--wait", *common, timeout=600)
    runs = sql_rows(db, "SELECT run_id, point_id, repeat, outcome, profiled, profile_files, job_dir FROM runs "
                        "ORDER BY point_id, repeat")
    assert [(r["repeat"], r["outcome"], r["profiled"]) for r in runs] == [(0, "ok", False), (1, "ok", True)] * 2
    packs = [json.loads(JobPaths(r["job_dir"]).submitted.read_text())["pack"] for r in runs]
    assert all(p["size"] == 2 for p in packs)  # two allocations of two runs each
    profiled = [r for r in runs if r["profiled"]]
    for r in profiled:
        (trace,) = r["profile_files"]
        assert (Path(r["job_dir"]) / trace).stat().st_size > 1000
        parts = sql_rows(db, "SELECT * FROM profile_ops WHERE run_id = ? AND kind = 'phase'", [r["run_id"]])
        assert {p["name"] for p in parts} == set(PHASES)
        assert sum(p["share"] for p in parts) == pytest.approx(1.0, abs=1e-6)
        assert sum(p["self_s"] for p in parts) == pytest.approx(parts[0]["step_s"] * parts[0]["steps"], rel=1e-6)
    # compare (the same runs on both sides, named two ways): one run a side per point, the profiled one left out;
    # --include-shared, so that a host made busy by other work on this machine leaves the unprofiled run in
    res = json.loads(sbench("compare", "campaign=packed", "campaign=packed,trainer=sbench", "--include-shared",
                            "--json", "--db", db).stdout)
    assert sorted((x["n_base"], x["n_cand"]) for x in res["rows"]) == [(1, 1), (1, 1)]
    assert sorted(x["run_id"] for x in res["excluded"]["BASE"]) == sorted(r["run_id"] for r in profiled)
    assert {x["why"] for x in res["excluded"]["BASE"]} == {"profiled"}
    page = tmp_path / "r.html"
    sbench("report", "--db", db, "-o", page)
    text = page.read_text()
    assert len(text.encode()) < 2 * 2 ** 20 and re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", text) == []
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    # The throughput plot leaves out a run measured on a host busy with other work, which this shared machine may
    # be: hovered only where it is drawn; the stage and profile bars are always there.
    plotted = 'id="chart-throughput"' in text
    with open_report(page) as (browser, check):
        throughput = hover_tooltip(browser, "chart-throughput") if plotted else ""
        stages = hover_tooltip(browser, "chart-stages", BARS)
        bars = hover_tooltip(browser, "chart-profile", BARS)
        settle(browser, check)
    assert check.requests == [page.as_uri()] and check.errors == []
    assert any(r["run_id"] in stages for r in runs) and "seconds" in stages, stages
    assert any(r["run_id"] in bars for r in profiled) and "share of the step" in bars, bars
    if plotted:  # the plots show the unprofiled runs only
        assert any(r["run_id"] in throughput for r in runs if not r["profiled"]), throughput


def _measure(spans: list[tuple[float, float]], steps: list[tuple[float, float]]) -> float:
    """Seconds of the union of *spans* inside *steps* (microsecond spans), counted on its own."""
    total, merged = 0.0, []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    for a, b in merged:
        total += sum(max(0.0, min(b, s1) - max(a, s0)) for s0, s1 in steps)
    return total / 1e6


def test_a_recorded_fsdp_trace_counts_the_collectives_and_their_waits_not_fsdps_copies_or_its_ranges():
    # rank 0 of a real 2-process FSDP step over gloo (tests/fixtures/traces/trim.py says how it was recorded): FSDP's
    # own FSDP::all_gather range holds the copy-in (fsdp::all_gather_copy_in) and the c10d all-gather's launch
    doc = json.loads(gzip.decompress((Path(__file__).parent / "fixtures/traces/fsdp-gloo-rank0.json.gz").read_bytes()))
    s = summarise(doc)
    events = doc["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "sbench:step")
    assert s.steps == 2 and sum(s.phases.values()) == pytest.approx(s.step_s, rel=1e-9)
    names = {e["name"].split(" (")[0] for e in events}
    assert {"FSDP::all_gather", "fsdp::all_gather_copy_in", "FSDP::all_gather_copy_out", "gloo:all_gather",
            "c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "_c10d_functional::wait_tensor"} <= names

    # communication is the backend's events and the waits, recounted here by a rule of their own
    def backend(n: str) -> bool:
        return n.startswith(("gloo:", "c10d::", "_c10d_functional::")) or n.startswith("FSDP::") and "wait" in n

    comm = _measure([(e["ts"], e["ts"] + e["dur"]) for e in events if backend(e["name"])], steps)
    assert s.phases["communication_exposed"] + s.phases["communication_overlapped"] == pytest.approx(comm, rel=1e-9)
    # counting FSDP's ranges too would add their copy-ins (and the rest they wrap) to communication
    wrapped = _measure([(e["ts"], e["ts"] + e["dur"]) for e in events
                        if backend(e["name"]) or e["name"].startswith("FSDP::all_gather (")], steps)
    copy_in = sum(e["dur"] for e in events if e["name"] == "fsdp::all_gather_copy_in") / 1e6
    assert wrapped - comm >= copy_in > 0
    assert comm > 0.1 * s.step_s  # gathers and reduce-scatters over gloo: a real share of the step
    collectives = {o["name"] for o in s.ops if o["kind"] == "collective"}
    assert {"gloo:all_gather", "gloo:all_reduce"} <= collectives and not any("FSDP" in n for n in collectives)
