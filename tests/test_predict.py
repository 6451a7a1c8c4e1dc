"""What a campaign will cost before it runs: ``sbench plan --db`` predicts each valid point's allocation seconds and
GPU-hours from the session's trained campaigns (read, never trained for this), and ``submit`` refuses a campaign
whose prediction passes its sweep's ``budget:``, writing nothing."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from harness.spec.predict import (
    DEFAULT_MFU,
    DEFAULT_MFU_RANGE,
    Compute,
    Fleet,
    Seen,
    beyond_time,
    over_budget,
    predict,
    totals,
)
from harness.spec.sweep import Budget

from .kit import TRAINED_PEAK_TFLOPS, Trained, sbench, sql_rows, write_yaml
from .kit import inventory as one_host_inventory
from .kit import sweep as small_sweep
from .kit.models import matmul_params


def _seen(point: str, batch: int, elapsed: float, train: float, steps: int = 4, mfu: float | None = None) -> Seen:
    return Seen(point, "e", {"model_name": "m", "batch_size": batch, "max_steps": steps, "number_gpus": 2,
                             "number_nodes": 1, "gpu_model": "g", "model_max_length": 256}, elapsed, train, mfu)


def test_a_prediction_takes_the_point_else_its_shape_fitted_or_scaled() -> None:
    seen = [_seen("p2", 2, 30.0, 10.0), _seen("p2", 2, 34.0, 12.0), _seen("p8", 8, 60.0, 40.0)]
    entity = {"model_name": "m", "batch_size": 2, "max_steps": 4, "number_gpus": 2, "number_nodes": 1,
              "gpu_model": "g", "model_max_length": 256}
    same = predict("p2", 0, "e", entity, seen)
    assert (same.source, same.seconds, same.low, same.high) == ("history", 32.0, 30.0, 34.0)
    assert same.gpu_hours == pytest.approx(32.0 * 2 / 3600)
    # batch 4, never measured, with batches 2 and 8 of its shape measured: training fitted as a + b x batch to each
    # batch's median (11 s at 2, 40 s at 8), plus the shape's median start-up (20 s)
    four = predict("p4", 0, "e", {**entity, "batch_size": 4}, seen)
    assert four.source == "history" and "batches 2, 8" in four.basis and "a + b x batch" in four.basis
    slope = (40 - 11) / 6
    assert four.seconds == pytest.approx(20 + (11 - 2 * slope) + 4 * slope)
    # one batch of the shape measured: its runs' start-up plus training scaled by the batch ratio (fixed steps)
    scaled = predict("p4", 0, "e", {**entity, "batch_size": 4}, seen[:2])
    assert "batch 2 of this shape" in scaled.basis and "scaled x2" in scaled.basis
    assert scaled.seconds == pytest.approx(((30 - 10) + 10 * 2 + (34 - 12) + 12 * 2) / 2)
    # time-bound training (no max_steps): the training seconds do not scale
    timed = predict("px", 0, "e", {**entity, "batch_size": 4, "max_steps": -1},
                    [_seen("q", 2, 30.0, 10.0, steps=-1)])
    assert timed.seconds == 30.0
    other = predict("py", 0, "e", {**entity, "number_gpus": 4}, seen)  # another shape: nothing to go on
    assert other.source is None and other.seconds is None and "nothing measured" in other.basis
    t = totals([same, four, other])
    assert (t.predicted, t.unknown) == (2, 1) and t.seconds == pytest.approx(same.seconds + four.seconds)
    assert over_budget(Budget(gpu_hours=1.0), [same, four]) is None
    said = over_budget(Budget(gpu_hours=1e-3), [same, four], spent_gpu_hours=0.5)
    assert said and "budget.gpu_hours 0.001" in said and "0.5 GPU-hours spent" in said and "p4 r0" in said
    # runs predicted past their time limit (SLURM would end them at TIMEOUT): 32 s and 40.7 s against 31 s
    late = beyond_time([same, four, other], "00:00:31") or ""
    assert late.startswith("2 run(s) are predicted to take longer than their time limit 00:00:31: the longest, p4 r0")
    assert beyond_time([same, four], "00:00:41") is None and beyond_time([same, four], "UNLIMITED") is None


def test_where_no_shape_was_measured_the_flop_model_predicts_at_the_models_mfu_and_the_measured_peak() -> None:
    entity = {"model_name": "m", "batch_size": 8, "max_steps": 10, "number_gpus": 4, "number_nodes": 1,
              "gpu_model": "g", "model_max_length": 512, "gradient_accumulation_steps": 2}
    compute = Compute(1e9, "bf16", 100.0, "gpu_peaks.yaml")
    tokens = 10 * 8 * 2 * 512
    work = tokens * 1e9 / (4 * 1e12)  # FLOPs over the devices, per TFLOP/s of each
    # another shape of the model measured (2 GPUs): its MFU (median 0.3, 0.2 to 0.4) and start-up (20 s)
    seen = [_seen("a", 2, 30.0, 10.0, mfu=0.2), _seen("b", 2, 35.0, 15.0, mfu=0.3), _seen("c", 8, 60.0, 40.0, mfu=0.4)]
    p = predict("p", 0, "e", entity, seen, compute, Fleet({}, {}), "gpu")
    assert p.source == "model" and p.seconds == pytest.approx(20.0 + work / (0.3 * 100.0))
    assert (p.low, p.high) == (pytest.approx(20.0 + work / 40.0), pytest.approx(20.0 + work / 20.0))
    assert "MFU 0.3 (3 run(s) of this model on g)" in p.basis and "gpu_peaks.yaml peak 100" in p.basis
    # the partition's measured peak wins over the datasheet's; a cap at stop_after_seconds holds
    measured = predict("p", 0, "e", entity, seen, compute, Fleet({("gpu", "bf16"): 50.0}, {}), "gpu")
    assert measured.seconds == pytest.approx(20.0 + work / (0.3 * 50.0)) and "measured peak 50" in measured.basis
    capped = predict("p", 0, "e", {**entity, "stop_after_seconds": 0.5}, seen, compute, Fleet({}, {}), "gpu")
    assert capped.seconds == pytest.approx(20.5) and "capped at stop_after_seconds 0.5" in capped.basis
    # a model never measured: the stated MFU, and the GPU model's start-up from the fleet's runs
    new = predict("p", 0, "e", {**entity, "model_name": "n"}, seen, compute, Fleet({}, {"g": [5.0, 7.0, 9.0]}), "gpu")
    assert new.seconds == pytest.approx(7.0 + work / (DEFAULT_MFU * 100.0))
    assert new.high == pytest.approx(9.0 + work / (DEFAULT_MFU_RANGE[0] * 100.0)) and "assumed" in new.basis
    # what the model cannot do: epochs, no peak, no architecture
    for ent, comp, said in (({**entity, "max_steps": -1}, compute, "trains by epochs"),
                            (entity, Compute(1e9, "bf16", None, "unknown"), "no peak TFLOP/s"),
                            (entity, Compute(None, "bf16", 100.0, "x", "no architecture known for m"),
                             "no architecture")):
        none = predict("p", 0, "e", {**ent, "model_name": "n"}, seen, comp, Fleet({}, {}), "gpu")
        assert none.source is None and none.seconds is None and said in none.basis, none.basis
    # history first: the same point measured
    assert predict("a", 0, "e", {**entity, "number_gpus": 2, "batch_size": 2, "max_steps": 4,
                                 "model_max_length": 256}, seen, compute).source == "history"


@pytest.mark.train
def test_plan_predicts_from_history_and_submit_refuses_past_the_budget(trained: Trained, tmp_path: Path) -> None:
    doc = yaml.safe_load(trained.sweep.read_text())
    doc["grid"] = {"batch_size": [2, 4, 8]}  # 2 and 4 measured twice each (nightly-1, nightly-2), 8 never
    sweep = write_yaml(tmp_path / "next.yaml", {**doc, "campaign": "next"})
    out = json.loads(sbench("plan", sweep, "-i", trained.inventory, "--db", trained.db, "--json").stdout)
    by_batch = {p["entity"]["batch_size"]: p["prediction"] for p in out}
    runs = sql_rows(trained.db, "SELECT m.batch_size, r.elapsed_s FROM runs r JOIN measurements m USING (run_id) "
                                "WHERE r.outcome = 'ok'")
    for batch in (2, 4):  # the same point measured: the median of its runs' allocation seconds
        mine = sorted(r["elapsed_s"] for r in runs if r["batch_size"] == batch)
        assert by_batch[batch]["prediction_source"] == "history" and len(mine) == 2
        assert by_batch[batch]["predicted_seconds"] == pytest.approx(sum(mine) / 2)
        assert by_batch[batch]["predicted_gpu_hours"] == pytest.approx(sum(mine) / 2 / 3600)
    assert by_batch[8]["prediction_source"] == "history" and "batches 2, 4" in by_batch[8]["prediction_basis"]
    assert by_batch[8]["predicted_seconds"] > 0 and by_batch[8]["predicted_gpu_hours"] > 0
    text = sbench("plan", sweep, "-i", trained.inventory, "--db", trained.db).stdout
    assert "predicted: " in text and "GPU-hour(s) for 3 run(s)" in text
    # a time limit the measured runs did not fit in: plan says they would time out
    short = write_yaml(tmp_path / "short.yaml", {**doc, "campaign": "short",
                                                 "slurm": {**(doc.get("slurm") or {}), "time": "00:00:05"}})
    said = sbench("plan", short, "-i", trained.inventory, "--db", trained.db).stderr
    assert "3 run(s) are predicted to take longer than their time limit 00:00:05" in said, said
    # a sequence length never measured: the FLOP model, at this model's measured MFU (median of its runs) of the
    # inventory's peak, plus its runs' median start-up, recomputed here from the checkpoint
    other = write_yaml(tmp_path / "other.yaml", {**doc, "campaign": "other", "grid": {"batch_size": [2]},
                                                 "entity": {**doc["entity"], "model_max_length": 128}})
    (got,) = [p["prediction"] for p in json.loads(sbench("plan", other, "-i", trained.inventory, "--db", trained.db,
                                                         "--json").stdout)]
    model_dir = Path(doc["model_map"][doc["entity"]["model_name"]])
    cfg = json.loads((model_dir / "config.json").read_text())
    f = 6 * matmul_params(model_dir) + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * 128
    ok = sql_rows(trained.db, "SELECT m.mfu, r.elapsed_s - (r.train_end_wall - r.train_start_wall) AS startup "
                              "FROM runs r JOIN measurements m USING (run_id) WHERE r.outcome = 'ok' AND m.is_valid")
    tokens = doc["entity"]["max_steps"] * 2 * doc["entity"]["gradient_accumulation_steps"] * 128
    train = tokens * f / (statistics.median(r["mfu"] for r in ok) * TRAINED_PEAK_TFLOPS * 1e12)
    assert got["prediction_source"] == "model" and "FLOP model" in got["prediction_basis"]
    assert got["predicted_seconds"] == pytest.approx(statistics.median(r["startup"] for r in ok) + train, rel=1e-9)
    # a budget smaller than the prediction: submit refuses, names the total and the largest runs, writes nothing
    db = tmp_path / "r.duckdb"
    shutil.copy(trained.db, db)
    tight = write_yaml(tmp_path / "tight.yaml", {**doc, "campaign": "tight", "budget": {"gpu_hours": 1e-4}})
    plan = sbench("plan", tight, "-i", trained.inventory, "--db", db)
    assert "would pass its budget" in plan.stderr and "0.0001 gpu-hours" in plan.stdout
    res = sbench("submit", tight, "-i", trained.inventory, "--executor", "local", "--workdir", tmp_path / "runs",
                 "--db", db, ok=(2,))
    assert "would pass its budget" in res.stderr and "budget.gpu_hours 0.0001" in res.stderr
    assert "the largest runs:" in res.stderr and "nothing was submitted" in res.stderr
    left = tmp_path / "runs" / "tight"  # at most the campaign's lock file: no manifest, no job dir
    assert not left.exists() or [p.name for p in left.iterdir()] == [".lock"]
    assert sql_rows(db, "SELECT count(*) AS n FROM runs WHERE campaign = 'tight'") == [{"n": 0}]


@pytest.mark.parametrize(("budget", "said"), [({}, "names no budget"), ({"gpu_hours": -1}, ">= 0"),
                                               ({"hours": 3}, "hours")])
def test_a_bad_budget_is_refused_naming_the_key(tmp_path: Path, cli, budget, said: str) -> None:
    inv = write_yaml(tmp_path / "inv.yaml", one_host_inventory())
    sweep = write_yaml(tmp_path / "s.yaml", {"campaign": "b", "experiment": "finetune_full_benchmark-v1.0.0",
                                             "entity": {"model_name": "smollm2-135m", "model_max_length": 64,
                                                        "number_gpus": 1, "batch_size": 1}, "budget": budget})
    res = cli("plan", str(sweep), "-i", str(inv))
    assert res.exit_code == 2 and "budget" in res.output and said in res.output, res.output


@pytest.mark.train
def test_each_run_keeps_what_submit_predicted_and_the_report_sets_it_beside_what_it_spent(trained: Trained,
                                                                                         tmp_path: Path) -> None:
    """The trained campaigns were submitted one after the other, each collected before the next: the first was
    predicted by the FLOP model (nothing measured yet), the second from the first's runs of the same points."""
    runs = sql_rows(trained.db, "SELECT r.campaign, r.point_id, r.elapsed_s, r.predicted_seconds, r.prediction_source, "
                                "p.number_gpus FROM runs r JOIN points p USING (point_id) ORDER BY r.run_id")
    assert {r["prediction_source"] for r in runs if r["campaign"] == "nightly-1"} == {"model"}
    first = {r["point_id"]: r["elapsed_s"] for r in runs if r["campaign"] == "nightly-1"}
    for r in (r for r in runs if r["campaign"] == "nightly-2"):  # one run of the point before: its seconds
        assert r["prediction_source"] == "history" and r["predicted_seconds"] == pytest.approx(first[r["point_id"]])
    # a budget given later is the campaign's newest word; the report sets spent against it and against the prediction
    t = trained.copy(tmp_path / "t")
    doc = yaml.safe_load(t.sweep.read_text())
    write_yaml(t.sweep, {**doc, "budget": {"gpu_hours": 2.0}})
    assert "0 attempt(s) submitted" in sbench("submit", t.sweep, "--campaign", "nightly-2", *t.local).stdout
    sbench("collect", *t.common)
    html = tmp_path / "r.html"
    sbench("report", "--db", t.db, "--campaign", "nightly-2", "-o", html)
    page = html.read_text()
    mine = [r for r in runs if r["campaign"] == "nightly-2"]
    spent = sum(r["elapsed_s"] * max(1, r["number_gpus"] or 1) for r in mine) / 3600
    predicted = sum(r["predicted_seconds"] * max(1, r["number_gpus"] or 1) for r in mine) / 3600
    assert f"Spent: <b>nightly-2</b> {spent:,.3g} GPU-hours" in page
    assert f"budget: 2 GPU-hours ({spent / 2.0:.0%} spent)" in page
    assert f"submit predicted {predicted:,.3g} GPU-hours for the {len(mine)} runs it predicted" in page
    assert "<th>predicted s</th>" in page and "(history)</td>" in page


def test_a_budget_says_which_runs_it_cannot_see(tmp_path: Path, tiny_model: Path) -> None:
    # nothing measured and no peak for the FLOP model (the built-in local inventory declares none): the runs have no
    # prediction, count as nothing against the budget, and plan says so
    sweep = write_yaml(tmp_path / "s.yaml", small_sweep(tiny_model, campaign="b",
                                                        grid={"batch_size": [1, 2]}, budget={"gpu_hours": 1}))
    db = tmp_path / "r.duckdb"
    (tmp_path / "runs").mkdir()
    sbench("collect", "--workdir", tmp_path / "runs", "--db", db)  # an empty results database
    res = sbench("plan", sweep, "--db", db)
    assert "warning: budget: 2 run(s) have no prediction" in res.stderr and "count as nothing" in res.stderr, res
