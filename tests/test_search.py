"""An adaptive campaign (``search:``): the sweep's checks, and searches on the local executor with the tiny model,
where the answer is known by construction (SBENCH_FAULT: OOM above a chosen batch, sleeps on every step of every
point but one), compared with what the campaign measured."""

from __future__ import annotations

import html
import importlib.util
import json
import time
from pathlib import Path

import duckdb
import pytest

from harness.campaign.executors.feed import FEEDER
from harness.campaign.search import scaled_sweep
from harness.campaign.state import AttemptState, PointHistory
from harness.campaign.submit import SEARCH, SEARCH_FEEDER, decide
from harness.db.manifest import record_manifest
from harness.db.search import search_evidence
from harness.db.store import open_store
from harness.runner.measure import StopPolicy
from harness.spec.inventory import load_inventory
from harness.spec.plan import PlannedPoint, plan_sweep
from harness.spec.search import (
    DEFAULT_ETA,
    MIN_STEPS,
    RecordedSearch,
    SearchDecision,
    SearchSpec,
    SearchState,
    answer,
)
from harness.spec.sweep import load_sweep

from .kit import SMALL_DATASET, sbench
from .kit import inventory as one_host_inventory
from .kit import write_yaml as write_sweep

BASE = {"campaign": "s", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 1, "max_steps": 4},
        "grid": {"batch_size": [1, 2, 4], "gradient_accumulation_steps": [1, 2]},
        "search": {"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit", "method": "halving"}}


@pytest.mark.parametrize("search,grid,key,fix", [
    ({"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit", "budget": 3}, None, "search.budget",
     "valid keys"),
    ({"goal": {"maximize": "tokens"}, "method": "halving"}, None, "search.goal.maximize",
     "must be a numeric measurements column"),
    ({"goal": {"largest": "dataset_tokens_per_second"}, "method": "halving"}, None, "search.goal.largest",
     "valid keys: maximize, minimize"),
    ({"goal": {"maximize": ["dataset_tokens_per_second", "tokens"]}, "method": "halving"}, None,
     "search.goal.maximize", "got 'tokens'"),
    ({"goal": {"maximize": "dataset_tokens_per_second", "minimize": "dataset_tokens_per_second"},
      "method": "halving"}, None, "search.goal.minimize", "names dataset_tokens_per_second twice"),
    ({"goal": {}, "method": "halving"}, None, "search.goal", "must name one of maximize, minimize"),
    ({"goal": {"maximize": "dataset_tokens_per_second"}, "method": "annealing"}, None, "search.method", "halving"),
    ({"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit"}, {"gradient_accumulation_steps": [1, 2]},
     "search.batch_size", "grid.batch_size two or more values"),
    ({"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit", "method": "halving"},
     {"batch_size": [1, 2]}, "search.method", "the grid has one shape"),
    ({"goal": {"maximize": "dataset_tokens_per_second"}}, None, "search", "asks for nothing"),
    ({"batch_size": "fit"}, None, "search.goal", "required"),
])
def test_bad_search_exits_2_naming_the_key(tmp_path: Path, cli, search, grid, key, fix) -> None:
    sw = write_sweep(tmp_path / "sweep.yaml", {**BASE, "search": search, "grid": grid or BASE["grid"]})
    res = cli("plan", sw)
    assert res.exit_code == 2, res.output
    assert str(sw) in res.output and key in res.output and fix in res.output and "Traceback" not in res.output


def test_a_search_sweep_plans_a_repeat_per_rung_and_the_campaigns_repeats(tmp_path: Path) -> None:
    sw = load_sweep(write_sweep(tmp_path / "a.yaml", {**BASE, "repeats": 2}))
    assert sw.search is not None and sw.search.metric == "dataset_tokens_per_second" and sw.search.eta == 3
    # two shapes: one halving rung after rung 0, then the campaign's 2 repeats, and a spare (a third run of a point
    # whose runs disagree)
    assert sw.search_repeats == 2 and sw.repeats == 1 + 1 + 2 + 1
    plain = load_sweep(write_sweep(tmp_path / "p.yaml", {k: v for k, v in BASE.items() if k != "search"}))
    assert plain.search is None and plain.repeats == 1


def test_a_pareto_goal_plans_and_is_recorded_as_written(tmp_path: Path, cli) -> None:
    goal = {"maximize": "dataset_tokens_per_second", "minimize": ["cost_per_million_tokens", "energy_joules"]}
    sw = write_sweep(tmp_path / "a.yaml", {**BASE, "search": {**BASE["search"], "goal": goal}})
    spec = load_sweep(sw).search
    assert spec is not None and spec.pareto and spec.metric == "dataset_tokens_per_second"
    assert spec.objectives == (("maximize", "dataset_tokens_per_second"), ("minimize", "cost_per_million_tokens"),
                               ("minimize", "energy_joules"))
    assert SearchSpec.from_dict(spec.to_dict()) == spec and spec.to_dict()["goal"] == goal
    res = cli("plan", sw)
    assert res.exit_code == 0 and ("search: maximize dataset_tokens_per_second, minimize cost_per_million_tokens, "
                                   "minimize energy_joules (a Pareto front)") in res.output
    # the plan's inventory prices nothing: said before anything runs
    assert "names cost_per_million_tokens, but partition(s)" in res.output and "price_per_gpu_hour" in res.output


def test_search_and_adaptive_repeats_do_not_mix(tmp_path: Path, cli) -> None:
    sw = write_sweep(tmp_path / "a.yaml", {**BASE, "repeats": {"min": 2, "max": 3, "cv": 0.1}})
    res = cli("plan", sw)
    assert res.exit_code == 2 and "repeats" in res.output and "search:" in res.output


def test_best_names_a_missing_database_a_missing_campaign_and_one_without_a_search(tmp_path: Path, cli) -> None:
    """best reads the database, wherever it runs from: a campaign it does not hold is named as missing, one without
    a search as such (here a published campaign, imported: no manifest anywhere)."""
    db = tmp_path / "r.duckdb"
    res = cli("best", "nothing", "--workdir", str(tmp_path), "--db", str(db))
    assert res.exit_code == 2 and "no results database" in res.output
    published = Path(__file__).parent / "fixtures" / "published" / "ado-small.csv"
    assert cli("import", "--format", "ado-csv", str(published), "--campaign", "pub", "--db", str(db)).exit_code == 0
    res = cli("best", "nothing", "--workdir", str(tmp_path), "--db", str(db))
    assert res.exit_code == 2 and "no campaign 'nothing'" in res.output and "pub" in res.output
    res = cli("best", "pub", "--workdir", str(tmp_path / "elsewhere"), "--db", str(db))
    assert res.exit_code == 2 and "no search" in res.output and "manifest" not in res.output


@pytest.mark.train
@pytest.mark.slow(420)
def test_a_search_finds_the_grids_answer_runs_less_and_explains_every_point(tiny_model: Path, small_data_dir: Path,
                                                                            tmp_path: Path) -> None:
    runs, db = tmp_path / "runs", tmp_path / "r.duckdb"
    common = ["--workdir", str(runs), "--db", str(db)]
    # Two shapes (gradient accumulation 1 and 2) x batches 1, 2, 4, 8. Batch 8 "OOMs" in both shapes and batch 4
    # too with accumulation 2 (oom@step=1 faults); every point but one sleeps 3 s after each step
    # (1 s was not enough: at load 6 the unslept point's own steps can take as long).
    doc = {"campaign": "srch", "experiment": "finetune_full_benchmark-v1.0.0",
           "entity": {"model_name": "tiny", "model_max_length": 32, "dataset_id": SMALL_DATASET, "number_gpus": 1,
                      "max_steps": 3},
           "grid": {"batch_size": [1, 2, 4, 8], "gradient_accumulation_steps": [1, 2]},
           # two objectives (a Pareto search): at one worker per point, a million tokens cost less where they come
           # faster, so the front is the fast point (and whatever its intervals cannot tell from it)
           "search": {"goal": {"maximize": "dataset_tokens_per_second", "minimize": "cost_per_million_tokens"},
                      "batch_size": "fit", "method": "halving"},
           "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir)}
    sw = write_sweep(tmp_path / "sweep.yaml", doc)
    inv_doc = one_host_inventory()
    inv_doc["partitions"]["cpu"]["price_per_gpu_hour"] = 3.0
    inv = write_sweep(tmp_path / "inv.yaml", inv_doc)
    points = {(p.entity["gradient_accumulation_steps"], p.entity["batch_size"]): p.point_id
              for p in plan_sweep(load_sweep(sw), load_inventory(inv)) if p.repeat == 0}
    fast = points[(1, 4)]
    ooms = [points[(1, 8)], points[(2, 8)], points[(2, 4)]]
    inv_doc["partitions"]["cpu"]["env"] = {"SBENCH_FAULT": ";".join(
        [f"oom@step=1,job={pid}." for pid in ooms]
        + [f"sleep@step=*,job={pid}.:3" for pid in points.values() if pid != fast and pid not in ooms]
        # the best point's first repeat after the rungs fails once (its first attempt): retry runs it again
        + [f"error@step=1,job={fast}.r1.a1"])}
    write_sweep(inv, inv_doc)

    # submit with no --wait: the first wave of the bisection (each shape's batch 8); collect, once it has read what
    # ended, submits the next wave by itself
    first = json.loads(sbench("submit", sw, "-i", inv, "--executor", "local", "--json", *common).stdout)
    assert sorted(p["point_id"] for p in first["points"] if p["action"] == "submit") == sorted(
        [points[(1, 8)], points[(2, 8)]])
    deadline, sent = time.monotonic() + 300, []
    want = {(points[(1, 2)], 0), (points[(2, 2)], 0)}
    # Each shape's bisection goes on by itself: the first to end sends its shape's next run first, and under
    # load one shape may already have sent its batch 4 (the bisection's step after 2) before the other's 8 ended.
    while time.monotonic() < deadline and not want <= set(sent):
        time.sleep(3)
        out = json.loads(sbench("collect", "--campaign", "srch", "--json", *common).stdout)
        sent += [(p["point_id"], p["repeat"]) for m in out["more_repeats"] for p in m["points"]
                 if p["action"] == "submit"]
    assert want <= set(sent) <= want | {(points[(1, 4)], 0), (points[(2, 4)], 0)}, sent
    assert len(sent) == len(set(sent)), sent  # nothing sent twice
    # interrupted here, between waves (no process of the search is left): submit --wait goes on from the database
    out = json.loads(sbench("submit", sw, "-i", inv, "--executor", "local", "--wait", "--json", *common,
                            timeout=900, ok=(0, 1)).stdout)
    assert out["summary"]["counts"].get("failed", 0) == 1, out["summary"]  # the best point's failed repeat
    ans = json.loads(sbench("best", "srch", "--json", *common).stdout)
    # (under load the halving may need a rung 1: the repeat that fails is then a rung's run, and best names the
    # point ahead so far, the other shape's entrant; after the retry below it must be the fast point)
    assert ans["stuck"] == [fast] and ans["best"]["point_id"] in (fast, points[(2, 2)]), ans["best"]
    # retry runs the failed repeat again, and the search is over
    sbench("retry", "srch", "--executor", "local", "--wait", *common, timeout=600)
    ans = json.loads(sbench("best", "srch", "--json", *common).stdout)
    # (its rung 0 run and the repeat after the rungs; a rung 1 run too if the slower shape's interval overlapped)
    assert ans["done"] and not ans["stuck"] and ans["best"]["point_id"] == fast
    assert ans["best"]["runs"] + ans["best"]["busy_runs_left_out"] >= 2
    assert ans["best"]["batch_size"] == 4 and ans["best"]["gradient_accumulation_steps"] == 1
    fits = {m["shape"]["gradient_accumulation_steps"]: m for m in ans["max_batch_size"]}
    assert (fits[1]["batch_size"], fits[1]["smallest_oom"]) == (4, 8)
    assert (fits[2]["batch_size"], fits[2]["largest_ok"], fits[2]["smallest_oom"]) == (2, 2, 4)

    with duckdb.connect(str(db), read_only=True) as con:
        ran = {r[0] for r in con.execute("SELECT DISTINCT point_id FROM runs WHERE campaign = 'srch'").fetchall()}
        rows = con.execute("SELECT point_id, action, reason FROM search_decisions WHERE campaign = 'srch'").fetchall()
        measured = con.execute("SELECT dataset_tokens_per_second, cost_per_million_tokens, host_busy FROM "
                               "measurements WHERE point_id = ? AND is_valid", [fast]).fetchall()
    # not every point ran; every point of the grid has a decision with its reason
    assert len(ran) < len(points)
    assert {r[0] for r in rows} == set(points.values()) and all(r[2] for r in rows)
    # the best's figure, recomputed: the mean of its runs on a quiet host (of all of them where none was quiet)
    used = [m for m in measured if not m[2]] or measured
    assert ans["best"]["value"] == pytest.approx(sum(m[0] for m in used) / len(used), rel=1e-9)
    assert ans["best"]["busy_host_only"] == all(m[2] for m in measured)
    assert ans["best"]["busy_runs_left_out"] == (len(measured) - len(used))
    # the front holds the fast point with both objectives' values and intervals; a million tokens at 3.0 an hour
    front = {p["point_id"]: p for p in ans["pareto"]}
    assert fast in front and ans["objectives"][1] == {"sense": "minimize", "metric": "cost_per_million_tokens"}
    cost = front[fast]["objectives"]["cost_per_million_tokens"]
    assert cost["value"] == pytest.approx(sum(m[1] for m in used) / len(used), rel=1e-9)
    assert cost["interval"][0] <= cost["value"] <= cost["interval"][1]
    assert all(m[1] == pytest.approx(3.0 * 1e6 / m[0] / 3600, rel=1e-9) for m in measured)
    never = set(points.values()) - ran
    assert never and all(dict((r[0], r[1]) for r in rows)[p] == "skipped" for p in never)
    # status lists them too, as points the search did not run, each with its decision
    listed = json.loads(sbench("status", "--campaign", "srch", "--json", *common).stdout)
    unrun = {r["point_id"]: r for r in listed["rows"] if r["phase"] == "not run (search)"}
    assert set(unrun) == never and listed["counts"]["not run (search)"] == len(never)
    assert all(r["reason"] == "skipped: " + dict((d[0], d[2]) for d in rows)[p] for p, r in unrun.items())
    assert ans["grid_points"] == len(points)
    with duckdb.connect(str(db), read_only=True) as con:
        attempts = con.execute("SELECT point_id, repeat, count(*) AS n, max(attempt) FROM runs WHERE campaign = "
                               "'srch' GROUP BY ALL").fetchall()
    # no decided point ran again: one attempt per (point, repeat), but the retried one
    assert all(n == 1 for pid, rep, n, _ in attempts if (pid, rep) != (fast, 1))
    assert [(n, a) for pid, rep, n, a in attempts if (pid, rep) == (fast, 1)] == [(2, 2)]
    assert ans["runs"] == sum(n for *_, n, _ in attempts)
    # the halving's decision about the slower shape says why it left
    slow = dict((r[0], r[2]) for r in rows)[points[(2, 2)]]
    # (under load its interval may still overlap the best's at the last rung: it is then a runner-up, and ran
    # the campaign's repeats too)
    # (or, where two runs of one of them disagreed, it is kept for a third look)
    assert slow.startswith(("halved out at rung 0: dominated by", "out at the last rung", "on the front",
                            "kept, as")), slow
    assert "dominated by" in slow or slow.startswith(("on the front", "kept, as")), slow

    text = sbench("best", "srch", *common).stdout
    assert f"best: {fast}" in text and "largest ok" in text and "the Pareto front" in text
    # the report's section says the same answer, with the time saved
    sbench("report", "--campaign", "srch", "-o", tmp_path / "r.html", "--db", db)
    page = (tmp_path / "r.html").read_text()
    assert "Search: the best point and the largest batch that fits" in page and f"Best: <b>{fast}: " in page
    assert "hours saved" in page and html.escape(slow[:18]) in page and "The Pareto front" in page


@pytest.mark.train
@pytest.mark.slow(40)
def test_a_search_stops_at_its_budget_and_says_what_it_left_undone(tiny_model: Path, small_data_dir: Path,
                                                                     tmp_path: Path) -> None:
    """A budget no run fits in: the first run goes (nothing measured, no peak to predict it from: it counts as
    nothing), and once it has spent its allocation the search's next run is not sent. Raised, the search goes on."""
    runs, db = tmp_path / "runs", tmp_path / "r.duckdb"
    common = ["--workdir", str(runs), "--db", str(db)]
    doc = {"campaign": "thrift", "experiment": "finetune_full_benchmark-v1.0.0",
           "entity": {"model_name": "tiny", "model_max_length": 32, "dataset_id": SMALL_DATASET, "number_gpus": 1,
                      "max_steps": 2},
           "grid": {"batch_size": [1, 2, 4]}, "search": {"goal": {"maximize": "dataset_tokens_per_second"},
                                                         "batch_size": "fit"},
           "budget": {"gpu_hours": 1e-6},
           "model_map": {"tiny": str(tiny_model)}, "data_dir": str(small_data_dir)}
    sw = write_sweep(tmp_path / "sweep.yaml", doc)
    inv = write_sweep(tmp_path / "inv.yaml", one_host_inventory())
    first = json.loads(sbench("submit", sw, "-i", inv, "--executor", "local", "--wait", "--json", *common,
                              timeout=600).stdout)
    assert first["submitted"] == 1, first
    out = json.loads(sbench("collect", "--campaign", "thrift", "--json", *common).stdout)
    (stop,) = out["more_repeats"]
    assert stop["submitted"] == 0 and any("were not sent: over budget" in w for w in stop["warnings"]), stop
    assert {p["action"] for p in stop["points"] if p["reason"].startswith("over budget")} == {"skip"}
    ans = json.loads(sbench("best", "thrift", "--json", *common).stdout)
    assert not ans["done"] and ans["stopped_at_budget"] and ans["runs"] == 1
    assert all(r.startswith("stopped at the budget: ") and "budget.gpu_hours 1e-06" in r
               for r in ans["stopped_at_budget"].values())
    text = sbench("best", "thrift", *common)
    assert "stopped at its budget" in text.stdout and "left undone at the budget" in text.stderr
    # raised: the next collect sends the search's next run
    write_sweep(sw, {**doc, "budget": {"gpu_hours": 10.0}})
    again = json.loads(sbench("submit", sw, "-i", inv, "--executor", "local", "--json", *common).stdout)
    assert again["submitted"] == 1 and not any("over budget" in w for w in again["warnings"]), again


def test_a_rungs_short_run_has_its_share_of_the_run_length(tmp_path: Path) -> None:
    sw = load_sweep(write_sweep(tmp_path / "a.yaml", {
        **BASE, "entity": {**BASE["entity"], "auto_stop_method": "WARMUP_60S_STABLE_120S_OR_10_STEPS"},
        "runner": {"auto_stop": {"method": "precision", "rel_ci": 0.02, "min_steps": 18, "max_seconds": 90}}}))
    short = scaled_sweep(sw, 1 / 9)
    assert short.runner.max_seconds == pytest.approx(10) and short.runner.min_steps == MIN_STEPS  # 18 / 9 = 2
    assert scaled_sweep(sw, 1 / 3).runner.min_steps == 6
    assert short.runner.rel_ci == pytest.approx(0.06) and short.runner.sample_interval_s == sw.runner.sample_interval_s
    assert scaled_sweep(sw, 1 / 10000).runner.rel_ci == 0.5  # the widest interval a sweep may ask
    assert sw.runner.max_seconds == 90  # the sweep itself is left as it was


def test_search_lines_become_the_newest_decision_per_point(tmp_path: Path) -> None:
    spec = {"goal": {"maximize": "dataset_tokens_per_second"}, "batch_size": "fit", "method": None, "eta": 3,
            "grid_fields": ["batch_size"], "repeats": 1,
            "points": [{"point_id": f"p{b}", "entity": {"batch_size": b}, "total_bytes": None, "device_bytes": None,
                        "predicted_oom": None} for b in (1, 2)]}
    lines = [{"type": "campaign", "campaign": "c", "experiment": "e", "search": spec},
             {"type": "search", "campaign": "c", "point_id": "p1", "at": "2026-01-01T00:00:00+0000", "phase": "fit",
              "action": "waiting", "reason": "not decided yet", "repeat": None},
             {"type": "search", "campaign": "c", "point_id": "p2", "at": "2026-01-01T00:00:00+0000", "phase": "fit",
              "action": "run", "reason": "bisection: runs batch 2", "repeat": 0},
             {"type": "search", "campaign": "c", "point_id": "p1", "at": "2026-01-01T00:01:00+0000", "phase": "fit",
              "action": "skipped", "reason": "bounded below by batch 2 ok", "repeat": None}]
    with open_store(tmp_path / "r.duckdb") as st:
        assert record_manifest(st, lines) == []
        rows = st.fetch_dicts("SELECT point_id, action, reason FROM search_decisions ORDER BY point_id")
        ev = search_evidence(st, "c")
        assert search_evidence(st, "other") is None
    assert ev is not None
    ans = answer(ev)
    assert [(r["point_id"], r["action"]) for r in rows] == [("p1", "skipped"), ("p2", "run")]
    assert ans is not None and ans["grid_points"] == 2 and ans["runs"] == 0 and not ans["done"]
    assert [d["reason"] for d in ans["decisions"]] == ["bounded below by batch 2 ok", "bisection: runs batch 2"]
    # the recorded search is read back as it was written, in one place (harness.spec.search.RecordedSearch)
    assert RecordedSearch.from_dict(spec).to_dict() == spec == ev.recorded.to_dict()


def test_a_recorded_search_without_eta_or_repeats_reads_the_defaults() -> None:
    doc = {"goal": {"minimize": "train_runtime"}, "method": "halving", "points": [{"point_id": "p", "entity": None}]}
    rec = RecordedSearch.from_dict(doc)
    assert rec.spec == SearchSpec("train_runtime", "minimize", None, "halving", DEFAULT_ETA)
    assert SearchSpec.from_dict(rec.spec.to_dict()) == rec.spec
    assert (rec.repeats, rec.grid_fields) == (1, ())
    assert [(c.point_id, dict(c.entity)) for c in rec.candidates] == [("p", {})]


def test_a_short_runs_step_cap_stops_training_under_either_auto_stop_method(tmp_path: Path) -> None:
    capped = StopPolicy(max_run_steps=4)
    assert capped.active and not StopPolicy().active
    assert capped.decide(elapsed=1.0, step=3, warm=False, warm_elapsed=None, warm_step=None)[0] is False
    assert capped.decide(elapsed=1.0, step=4, warm=False, warm_elapsed=None, warm_step=None) == (True, False,
                                                                                                "run_steps")
    precise = StopPolicy(auto_stop=True, stop_method="precision", rel_ci=1e-9, max_run_steps=5)
    assert precise.decide_precision([0.1] * 4, 0.4)[0] is False
    stop, reason, _ = precise.decide_precision([0.1] * 5, 0.5)
    assert stop and reason == "run_steps"
    # the sweep's points stop at max_steps 30: a ninth of a run is 4 steps, a short run at least MIN_STEPS
    sw = load_sweep(write_sweep(tmp_path / "a.yaml", {**BASE, "entity": {**BASE["entity"], "max_steps": 30}}))
    assert sw.runner.max_run_steps == 0
    assert scaled_sweep(sw, 1 / 9).runner.max_run_steps == 4
    assert scaled_sweep(sw, 1 / 27).runner.max_run_steps == MIN_STEPS


def test_decide_submits_only_what_the_search_asks_and_retry_takes_its_cancelled_runs() -> None:
    def pt(pid: str, repeat: int) -> PlannedPoint:
        return PlannedPoint(point_id=pid, repeat=repeat, experiment="e", entity={}, valid=True, reasons=[],
                            notes=[], partition="p", model_source="m")

    pts = [pt(pid, r) for pid in ("a", "b", "c") for r in range(3)]
    h = PointHistory()
    h.by_run[("s", "b", 0)] = [AttemptState(1, "j", "CANCELLED", "failed", "cancelled", cancelled=True)]
    st = SearchState(todo=[("a", 0)], decisions={"a": SearchDecision("a", "fit", "run", "bisection: runs batch 4", 0)},
                     scale={("a", 0): 1 / 9})
    got = decide(pts, h, "s", force=False, retry_failed=False, search=st)
    # the run the search asks for, with its reason and short length; the cancelled one stays; nothing else listed
    assert [(d.point.point_id, d.point.repeat, d.action) for d in got] == [("a", 0, "submit"), ("b", 0, "skip")]
    assert got[0].reason == f"{SEARCH}: bisection: runs batch 4" and got[0].scale == pytest.approx(1 / 9)
    retried = decide(pts, h, "s", force=False, retry_failed=True, search=SearchState())
    assert [(d.point.point_id, d.action, d.reason, d.attempt) for d in retried] == [("b", "submit", "retry", 2)]


def test_plan_says_what_the_search_runs(tmp_path: Path, cli) -> None:
    res = cli("plan", write_sweep(tmp_path / "a.yaml", {**BASE, "repeats": 2}))
    assert res.exit_code == 0, res.output
    assert ("search: maximize dataset_tokens_per_second; the largest batch that fits per shape by bisection; "
            "successive halving (eta 3); the best point gets 2 repeat(s)") in res.output


def test_the_search_feeder_is_named_where_it_is() -> None:
    """The SLURM feeder job of a search runs ``python -m SEARCH_FEEDER``; the name must be a module that runs."""
    spec = importlib.util.find_spec(SEARCH_FEEDER)
    assert spec is not None and spec.origin and spec.origin.endswith("searchfeed.py")
    assert FEEDER == "harness.campaign.executors.feed" and importlib.util.find_spec(FEEDER) is not None
