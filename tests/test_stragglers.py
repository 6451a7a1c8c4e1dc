"""Stragglers: each rank's own step times scored against the fastest rank's and against its own best
(harness.collect.stragglers); collect's rank_scores rows, measurements.straggler with a note and a run warning
(status); compare, check and the repeats' CV leave a straggler run out and say why. The injected faults that
make one (SBENCH_FAULT step ranges, host=) are checked here too."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import pytest

from harness.cluster.preflight import rank_devices
from harness.collect import collect
from harness.collect.stragglers import rank_scores
from harness.contract.errors import InputError
from harness.db.cluster import record_preflight
from harness.db.store import open_store
from harness.report.compare import STRAGGLER, excluded_text, left_out_why
from harness.runner.faults import FaultSpecError, parse_faults
from harness.slurm.client import Slurm
from harness.spec.references import Reference, check_rows
from harness.spec.sweep import load_sweep

from .kit import jobdirs, sql_rows
from .kit.jobdirs import FakeSlurm, campaign_workdir, write_attempt


def doc(rank: int, host: str, own: list[float], global_step: int | None = None) -> dict:
    return {"rank": rank, "host": host, "step_own_s": own,
            "global_step": len(own) if global_step is None else global_step}


def test_relative_score_is_the_fastest_ranks_median_over_this_ranks() -> None:
    fast, slow = [0.10, 0.12, 0.11, 0.10, 0.13, 0.11, 0.10, 0.12], [0.40, 0.42, 0.41, 0.40, 0.43, 0.41, 0.40, 0.44]
    got = {s.rank: s for s in rank_scores({0: doc(0, "a", fast), 1: doc(1, "b", slow)}, None, None, 0.7)}
    assert got[0].relative == 1.0 and not got[0].flagged
    assert got[1].relative == pytest.approx(median(fast) / median(slow))
    assert got[1].flagged and got[1].host == "b" and got[1].steps == 8
    # the threshold decides: a lenient one flags nothing
    assert not any(s.flagged for s in rank_scores({0: doc(0, "a", fast), 1: doc(1, "b", slow)}, None, None, 0.2))


def test_individual_score_compares_the_last_part_with_the_best() -> None:
    # rank 1 as fast as rank 0, then four times as slow in the last quarter
    base = [0.1] * 12
    late = [0.1] * 9 + [0.4] * 3
    got = {s.rank: s for s in rank_scores({0: doc(0, "a", base), 1: doc(1, "b", late)}, None, None, 0.7)}
    assert got[1].best_step_s == pytest.approx(0.1) and got[1].current_step_s == pytest.approx(0.4)
    assert got[1].individual == pytest.approx(0.25) and got[1].flagged
    assert got[1].relative == pytest.approx(1.0)  # its median is still the fastest's
    assert "individual score 0.25" in got[1].why(0.1, 0.7)
    # one slow step is no trend: a part's median, not one step
    blip = [0.1] * 5 + [0.9] + [0.1] * 6
    (s,) = [x for x in rank_scores({0: doc(0, "a", base), 1: doc(1, "b", blip)}, None, None, 0.7) if x.rank == 1]
    assert s.individual == pytest.approx(1.0) and not s.flagged


def test_the_individual_score_sets_medians_of_parts_side_by_side_and_needs_enough_steps() -> None:
    # a loaded host's clean 12-step run (rank 0 of the unslowed 2-node run flagged before): one lucky pair of fast
    # steps is no baseline, so the last part is held against the median of the earlier parts
    loaded = [0.26, 0.12, 0.121, 0.25, 0.24, 0.27, 0.23, 0.26, 0.25, 0.247, 0.24, 0.26]
    (s,) = [x for x in rank_scores({0: doc(0, "a", loaded), 1: doc(1, "b", loaded)}, None, None, 0.7) if x.rank == 0]
    assert s.best_step_s == pytest.approx(0.25) and s.individual > 0.9 and not s.flagged, s
    # fewer than two parts of 3 steps: not judged (1), whatever the steps
    short = [0.1, 0.1, 0.1, 0.1, 0.9]
    (s,) = [x for x in rank_scores({0: doc(0, "a", short), 1: doc(1, "b", [0.1] * 5)}, None, None, 0.7)
            if x.rank == 0]
    assert s.individual == 1.0 and s.best_step_s == s.current_step_s == pytest.approx(0.1) and not s.flagged


def test_noise_of_a_few_milliseconds_on_tiny_steps_is_no_straggler() -> None:
    # own step times of a clean 2-node run of the tiny model on a shared machine: the last part's median is
    # twice the best part's, but within the steps' own spread; against the median of the earlier parts (like with
    # like, not the luckiest part) it is no drop at all
    a = [0.025, 0.013, 0.005, 0.009, 0.009, 0.006, 0.011, 0.009, 0.005, 0.005, 0.005, 0.004, 0.004, 0.007, 0.013, 0.01]
    b = [0.019, 0.01, 0.005, 0.005, 0.005, 0.007, 0.011, 0.015, 0.005, 0.006, 0.004, 0.004, 0.01, 0.01, 0.009, 0.012]
    got = rank_scores({0: doc(0, "a", a), 1: doc(1, "b", b)}, None, None, 0.7)
    assert min(s.individual for s in got) >= 0.7 and not any(s.flagged for s in got)
    # and where the score does fall under the threshold, the noise guard holds it: a last part twice the usual,
    # within the rank's own spread
    c = [0.004, 0.02, 0.005, 0.018, 0.006, 0.021, 0.005, 0.019, 0.004, 0.02, 0.006, 0.02, 0.03, 0.012, 0.025, 0.016]
    (s,) = [x for x in rank_scores({0: doc(0, "a", a), 1: doc(1, "b", c)}, None, None, 0.7) if x.rank == 1]
    assert s.individual < 0.7 and not s.flagged, s
    # the same spread around steps half a second longer on one rank is one
    slow = [x + 0.5 for x in b]
    (s1,) = [s for s in rank_scores({0: doc(0, "a", a), 1: doc(1, "b", slow)}, None, None, 0.7) if s.rank == 1]
    assert s1.flagged and s1.relative < 0.05


def test_only_the_measured_windows_steps_are_scored() -> None:
    # steps 1-4 are warm-up (rank 1 slow there); the window is steps 5..8
    r0 = doc(0, "a", [0.1] * 8)
    r1 = doc(1, "b", [0.9] * 4 + [0.1] * 4)
    inside = {s.rank: s for s in rank_scores({0: r0, 1: r1}, 4, 8, 0.7)}
    assert inside[1].steps == 4 and inside[1].relative == pytest.approx(1.0) and not inside[1].flagged
    whole = {s.rank: s for s in rank_scores({0: r0, 1: r1}, None, None, 0.7)}
    assert whole[1].steps == 8


def test_a_run_of_one_rank_or_without_own_times_has_no_scores() -> None:
    assert rank_scores({0: doc(0, "a", [0.1, 0.1])}, None, None, 0.7) == []
    assert rank_scores({0: doc(0, "a", [0.1, 0.1]), 1: {"rank": 1, "host": "b", "global_step": 2}}, None, None,
                       0.7) == []
    assert rank_scores({0: doc(0, "a", [0.1]), 1: doc(1, "b", ["x"])}, None, None, 0.7) == []  # type: ignore[list-item]


def test_fault_conditions_for_stragglers_and_slow_devices() -> None:
    (f,) = parse_faults("sleep@step=3..5,rank=1:0.5")
    assert [s for s in range(1, 8) if f.applies(rank=1, trial=None, step=s)] == [3, 4, 5]
    assert not f.applies(rank=0, trial=None, step=4)
    (g,) = parse_faults("sleep@step=2..,host=node2:1")
    assert g.applies(rank=0, trial=None, step=99, host="node2")
    assert not g.applies(rank=0, trial=None, step=99, host="node1") and not g.applies(rank=0, trial=None, step=1,
                                                                                       host="node2")
    (s,) = parse_faults("slow@stage=preflight,host=node2:4")
    assert s.factor == 4.0 and s.applies(rank=0, trial=None, stage="preflight", host="node2")
    assert parse_faults("slow@stage=preflight")[0].factor == 4.0
    for bad, says in (("sleep@step=5..3", "ends before it starts"), ("sleep@step=a..", "N..M"),
                      ("slow@step=1", "only slows the preflight"), ("slow@stage=preflight:0.5", "from 1 to"),
                      ("error@step=1,host=", "needs a value")):
        with pytest.raises(FaultSpecError, match=says):
            parse_faults(bad)


def test_straggler_score_comes_from_the_sweep_else_the_environment(tmp_path: Path, monkeypatch) -> None:
    sweep = tmp_path / "s.yaml"

    def write(runner: dict) -> None:
        sweep.write_text(json.dumps({"campaign": "c", "experiment": "finetune_full_benchmark-v1.0.0",
                                     "entity": {"model_name": "smollm2-135m"}, "runner": runner}))

    write({})
    monkeypatch.setenv("SBENCH_STRAGGLER_SCORE", "0.5")
    assert load_sweep(sweep).runner.straggler_score == 0.5
    write({"straggler_score": 0.8, "rank_timing": False})
    got = load_sweep(sweep).runner
    assert got.straggler_score == 0.8 and got.rank_timing is False
    write({"straggler_score": 1.5})
    with pytest.raises(InputError, match=r"runner\.straggler_score.*between 0 and 1"):
        load_sweep(sweep)
    write({})
    monkeypatch.setenv("SBENCH_STRAGGLER_SCORE", "high")
    with pytest.raises(InputError, match="SBENCH_STRAGGLER_SCORE must be a number"):
        load_sweep(sweep)


# -- collect -------------------------------------------------------------------------------------------------

def two_node_run(wd: Path, idx: int, slow_factor: float, threshold: float | None = None) -> dict:
    """A 2-node run, one rank a node, whose rank 1 (node2) took *slow_factor* times rank 0's own time a step."""
    r = write_attempt(wd, idx, hosts=("node1", "node2"), gpus_per_host=1)
    for rank in (0, 1):
        path = r["paths"].rank_result(rank)
        d = json.loads(path.read_text())
        d["step_own_s"] = [round(0.1 * (slow_factor if rank == 1 else 1.0) * (1 + 0.01 * (i % 3)), 6)
                           for i in range(d["global_step"])]
        path.write_text(json.dumps(d))
    if threshold is not None:
        spec = json.loads(r["paths"].spec.read_text())
        spec["jobspec"]["runner"]["straggler_score"] = threshold
        r["paths"].spec.write_text(json.dumps(spec))
    return r


@pytest.fixture()
def tc_wd(tmp_path: Path) -> Path:
    return campaign_workdir(tmp_path)


def test_collect_scores_ranks_and_flags_a_straggler_run(tc_wd: Path, tmp_path: Path, cli) -> None:
    slow = two_node_run(tc_wd, 80, 4.0)
    clean = two_node_run(tc_wd, 81, 1.0)
    lenient = two_node_run(tc_wd, 82, 4.0, threshold=0.2)
    db = tmp_path / "r.duckdb"
    runs = (slow, clean, lenient)
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({r["job_id"]: ("COMPLETED", "0:0", "node[1-2]") for r in runs})))
    scores = {(s["run_id"], s["rank"]): s for s in sql_rows(db, "SELECT * FROM rank_scores")}
    assert len(scores) == 6
    s1 = scores[(slow["run_id"], 1)]
    assert s1["host"] == "node2" and s1["flagged"] is True and s1["threshold"] == 0.7
    assert s1["relative_score"] == pytest.approx(scores[(slow["run_id"], 0)]["own_step_s"] / s1["own_step_s"])
    assert s1["relative_score"] < 0.3 and scores[(slow["run_id"], 0)]["flagged"] is False
    assert not any(s["flagged"] for (rid, _), s in scores.items() if rid == clean["run_id"])
    assert scores[(lenient["run_id"], 1)]["flagged"] is False  # its sweep's threshold is 0.2
    got = {m["run_id"]: m for m in sql_rows(db, "SELECT m.run_id, m.straggler, m.straggler_ranks, m.notes, "
                                                "r.warnings FROM measurements m JOIN runs r USING (run_id)")}
    m = got[slow["run_id"]]
    assert m["straggler"] is True and m["straggler_ranks"] == ["node2:1"]
    (note,) = [n for n in m["notes"] if n.startswith("straggler")]
    assert "rank 1 on node2" in note and "runner.straggler_score 0.7" in note and note in m["warnings"]
    assert got[clean["run_id"]]["straggler"] is False and got[clean["run_id"]]["straggler_ranks"] is None
    assert sql_rows(db, "SELECT sum(repeats_measured) AS n FROM point_stability") == [{"n": 2}]
    # status shows the straggler among the run's notes
    out = cli("status", "--db", db, "--workdir", tc_wd).output
    assert "straggler: rank 1 on node2" in out
    # host_health: node2's rank was the straggler of one of its three scored runs
    health = {h["host"]: h for h in sql_rows(db, "SELECT * FROM host_health")}
    assert (health["node2"]["runs_scored"], health["node2"]["straggler_runs"]) == (3, 1)
    assert health["node1"]["straggler_runs"] == 0 and health["node2"]["runs"] == 3
    assert health["node2"]["median_relative_score"] == pytest.approx(median(
        s["relative_score"] for (_, rk), s in scores.items() if rk == 1))
    # the report's host section: a bar per scored host, and the evidence
    page = tmp_path / "report.html"
    assert cli("report", "--db", db, "-o", page).exit_code == 0
    html = page.read_text()
    assert 'id="hosts"' in html and "node2 (1/3 straggler)" in html and "no preflight yet" in html


def test_hosts_names_a_host_slow_again_and_again(tc_wd: Path, tmp_path: Path, cli) -> None:
    runs = [two_node_run(tc_wd, 90 + i, 4.0 if i < 2 else 1.0) for i in range(3)]
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({r["job_id"]: ("COMPLETED", "0:0", "node[1-2]") for r in runs})))
    res = cli("hosts", "--db", db, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    (cand,) = doc["drain_candidates"]
    assert cand["host"] == "node2" and cand["straggler_runs"] == 2 and cand["runs_scored"] == 3
    assert cand["why"].startswith("a straggler in 2 of 3 scored run(s) (median relative score")
    assert {h["host"] for h in doc["hosts"]} == {"node1", "node2"}
    text = cli("hosts", "--db", db).output
    assert "drain candidate: node2: a straggler in 2 of 3" in text
    # three flags asked: two are not enough
    assert "no drain candidate among 2 host(s)" in cli("hosts", "--db", db, "--min-flags", "3").output
    # a straggler run measured on a host busy with other work is no evidence against the host: left out
    (busy,) = sql_rows(db, "SELECT run_id FROM runs WHERE job_id = ?", [runs[0]["job_id"]])
    with open_store(db) as st:
        st.con.execute("UPDATE measurements SET host_busy = true WHERE run_id = ?", [busy["run_id"]])
    doc = json.loads(cli("hosts", "--db", db, "--json").output)
    node2 = {h["host"]: h for h in doc["hosts"]}["node2"]
    assert (node2["straggler_runs"], node2["runs_scored"]) == (1, 2) and doc["drain_candidates"] == []


def test_a_straggler_on_a_busy_host_says_so(tc_wd: Path, tmp_path: Path) -> None:
    import csv

    run = two_node_run(tc_wd, 97, 4.0)
    path = run["paths"].samples("node2")
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    with path.open("a", newline="") as fh:  # other work took 60 % of node2's CPU at every tick
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        w.writerows({**{k: "" for k in rows[0]}, "t_wall": r["t_wall"], "t_mono": r["t_mono"], "kind": "host",
                     "device": "-1", "cpu_pct": "60"} for r in rows if r["kind"] == "proc")
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node[1-2]")})))
    (m,) = sql_rows(db, "SELECT straggler, host_busy, notes FROM measurements")
    assert m["straggler"] is True and m["host_busy"] is True
    assert any("straggler measured on a host busy with other work" in n and "does not count toward drain "
               "candidates" in n for n in m["notes"]), m["notes"]
    (h,) = [h for h in sql_rows(db, "SELECT * FROM host_health") if h["host"] == "node2"]
    assert h["straggler_runs"] == 0 and h["runs_scored"] == 0


def test_check_does_not_judge_a_straggler_run() -> None:
    ref = Reference(metric="dataset_tokens_per_second", value=100.0, lower=0.1, upper=None, unit=None, where={})
    point = {"point_id": "p", "repeat": 0, "entity": {}, "run_id": "c/p.r0.a1", "outcome": "ok",
             "overlapped_with": None, "host_busy": False, "straggler": True, "straggler_ranks": ["node2:1"],
             "values": {"dataset_tokens_per_second": 10.0}}
    (row,) = check_rows("c", [ref], [point])
    assert row["status"] == "shared" and "straggler rank" in row["reason"] and "node2:1" in row["reason"]
    (ok,) = check_rows("c", [ref], [{**point, "straggler": False}])
    assert ok["status"] == "fail"


def test_compare_leaves_a_straggler_run_out_and_says_why() -> None:
    assert left_out_why({"straggler": True}) == STRAGGLER
    assert left_out_why({"straggler": False}) is None and left_out_why({}) is None
    assert left_out_why({"straggler": True, "host_busy": True}) == "busy host"  # the first reason found
    text = excluded_text({"BASE": [], "CAND": [("c/p.r0.a1", STRAGGLER)]})
    assert text.startswith("excluded 1 run(s) (BASE 0, CAND 1): 1 with a straggler rank (measurements.straggler")
    assert "c/p.r0.a1" in text


def _flops_run(wd: Path, idx: int) -> dict:
    """A 2-node run whose rank 0 counted its FLOPs (model TFLOP/s per device: 4e9 FLOPs/token x 25,000 tokens/s
    = 100) and whose spec.json read a bf16 datasheet peak of 989 TFLOP/s."""
    r = two_node_run(wd, idx, 1.0)
    path = r["paths"].rank_result(0)
    d = json.loads(path.read_text())
    d["flops"] = {"matmul_params": 1e9, "trainable_matmul_params": 0.0, "layers": 1, "attn_dim": 1,
                  "gradient_checkpointing": False}
    d["metrics"].update(rank_train_samples=10, train_tokens=10, train_tokens_per_second=25000.0)
    path.write_text(json.dumps(d))
    spec = json.loads(r["paths"].spec.read_text())
    spec["jobspec"].update(compute_dtype="bf16", peak_tflops=989.0, peak_source="gpu_peaks.yaml")
    r["paths"].spec.write_text(json.dumps(spec))
    return r


def test_mfu_is_set_against_the_hosts_measured_peak_where_preflight_measured_them(tc_wd: Path, tmp_path: Path,
                                                                                   cli) -> None:
    db = tmp_path / "r.duckdb"
    before = _flops_run(tc_wd, 98)
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({before["job_id"]: ("COMPLETED", "0:0", "node[1-2]")})))
    (m,) = sql_rows(db, "SELECT model_tflops_per_gpu, peak_tflops, mfu, mfu_peak_source FROM measurements")
    tflops = m["model_tflops_per_gpu"]
    assert tflops == pytest.approx(100.0, rel=1e-3)
    assert (m["peak_tflops"], m["mfu_peak_source"]) == (989.0, "datasheet") and m["mfu"] == pytest.approx(tflops / 989)
    # node1 and node2 measured at bf16 (600 and 200 TFLOP/s), node3 too, and at fp32 (never the run's dtype)
    docs = {h: {"host": h, "t_wall": jobdirs.T0 + k, "elapsed_s": 3.0, "devices": [
        {"device": "cuda:0", "name": "NVIDIA H100", "dtype": dtype,
         "figures": {"matmul_tflops": {"value": v, "reps": [v], "spread": 0.0}}}]}
        for k, (h, v, dtype) in enumerate((("node1", 600.0, "bf16"), ("node2", 200.0, "bf16"),
                                            ("node3", 580.0, "bf16")))}
    with open_store(db) as st:
        record_preflight(st, rank_devices(docs, "pf1", None, "gpu", 0.1))
        record_preflight(st, rank_devices({"node1": {**docs["node1"], "devices": [
            {**docs["node1"]["devices"][0], "device": "cpu", "dtype": "fp32"}]}}, "pf2", None, "cpu", 0.1))
    after = _flops_run(tc_wd, 99)
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({after["job_id"]: ("COMPLETED", "0:0", "node[1-2]")})))
    got = {r["job_id"]: r for r in sql_rows(db, "SELECT r.job_id, m.peak_tflops, m.mfu, m.mfu_peak_source "
                                                "FROM measurements m JOIN runs r USING (run_id)")}
    # the run held node1 and node2: the median of their measured bf16 peaks
    a = got[after["job_id"]]
    assert (a["peak_tflops"], a["mfu_peak_source"]) == (400.0, "measured") and a["mfu"] == pytest.approx(tflops / 400)
    assert got[before["job_id"]]["mfu_peak_source"] == "datasheet"  # collected before: as it was
    (view,) = [r for r in sql_rows(db, "SELECT run_id, mfu, mfu_measured FROM measured_mfu")
               if r["run_id"] == after["run_id"]]
    assert view["mfu"] == pytest.approx(view["mfu_measured"])  # the view's figure and the column agree
    page = tmp_path / "r.html"
    assert cli("report", "--db", db, "-o", page).exit_code == 0
    html = page.read_text()
    assert "MFU here: 1 run(s) against the datasheet" in html and "1 run(s) against its hosts' measured peak" in html


def test_preflight_rows_give_measured_peaks_mfu_and_host_health(tc_wd: Path, tmp_path: Path, cli) -> None:
    run = two_node_run(tc_wd, 95, 1.0)
    db = tmp_path / "r.duckdb"
    collect(db, tc_wd, slurm=Slurm(FakeSlurm({run["job_id"]: ("COMPLETED", "0:0", "node[1-2]")})))
    docs = {h: {"host": h, "t_wall": jobdirs.T0 + k, "elapsed_s": 3.0, "devices": [
        {"device": "cuda:0", "name": "NVIDIA H100", "dtype": "bf16",
         "figures": {"matmul_tflops": {"value": v, "reps": [v, v], "spread": 0.0},
                     "memcpy_gbps": {"value": 3000.0, "reps": [3000.0], "spread": 0.0}}}]}
        for k, (h, v) in enumerate((("node1", 600.0), ("node2", 200.0), ("node3", 580.0)))}
    rows = rank_devices(docs, "pf1", "c", "gpu", 0.9)
    with open_store(db) as st:
        record_preflight(st, rows)
        st.con.execute("UPDATE measurements SET model_tflops_per_gpu = 100.0 WHERE run_id = ?", [run["run_id"]])
    mm = {r["host"]: r for r in rows if r["figure"] == "matmul_tflops"}
    assert mm["node2"]["flagged"] and mm["node2"]["ratio"] == pytest.approx(200.0 / 580.0)
    assert not mm["node1"]["flagged"] and not any(r["flagged"] for r in rows if r["figure"] == "memcpy_gbps")
    (mfu,) = sql_rows(db, "SELECT measured_peak_tflops, mfu_measured FROM measured_mfu")
    # the run held node1 and node2: the median of their measured peaks
    assert mfu["measured_peak_tflops"] == pytest.approx(400.0) and mfu["mfu_measured"] == pytest.approx(0.25)
    health = {h["host"]: h for h in sql_rows(db, "SELECT * FROM host_health")}
    assert (health["node2"]["preflights"], health["node2"]["slow_preflights"], health["node2"]["flags"]) == (1, 1, 1)
    assert health["node3"]["runs"] == 0 and health["node3"]["slow_preflights"] == 0
    doc = json.loads(cli("hosts", "--db", db, "--json", "--min-flags", "1").output)
    (cand,) = doc["drain_candidates"]
    assert cand["host"] == "node2" and "slow in 1 of 1 preflight(s) (lowest ratio to its partition's median 0.34)" \
        in cand["why"]
