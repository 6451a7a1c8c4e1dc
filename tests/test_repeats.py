"""Repeats to a precision: ``repeats: {min, max, cv}``. The decision (units), the sweep's checks, and a
campaign on the local executor where one point's repeats disagree by injected sleeps and get more repeats,
while a steady point does not."""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import stdev

import duckdb
import pytest
import yaml

from harness.campaign.repeats import AT_MAX, MORE, NO_CV, PRECISE, WAITING, verdict
from harness.campaign.state import AttemptState, PointHistory
from harness.campaign.submit import decide
from harness.runner.faults import parse_faults
from harness.spec.inventory import load_inventory
from harness.spec.plan import PlannedPoint, plan_sweep
from harness.spec.sweep import AdaptiveRepeats, load_sweep

from . import kit
from .kit import sbench, write_yaml

SPEC = AdaptiveRepeats(min=2, max=4, cv=0.02)


def test_verdict_above_below_and_max() -> None:
    # above the target with room: the lowest repeat never submitted is next
    v = verdict(SPEC, "p", {0, 1}, 0, 2, 0.05)
    assert (v.state, v.next_repeat, v.below_precision) == (MORE, 2, True)
    assert "CV 5.00 % > 2 %" in v.text() and "2 of at most 4 repeats" in v.text()
    # at or below the target: precise, nothing next
    for cv in (0.02, 0.001):
        v = verdict(SPEC, "p", {0, 1}, 0, 2, cv)
        assert (v.state, v.next_repeat, v.below_precision) == (PRECISE, None, False)
    # max repeats submitted (whatever became of them): no more
    v = verdict(SPEC, "p", {0, 1, 2, 3}, 0, 3, 0.3)
    assert (v.state, v.next_repeat) == (AT_MAX, None) and "max reached" in v.text()
    # a repeat still queued or running: judged once it ends
    assert verdict(SPEC, "p", {0, 1, 2}, 1, 2, 0.3).state == WAITING
    # what moves on by itself is open (a user's loop waits on it); precise, max reached and no CV are not
    assert [verdict(SPEC, "p", s, f, n, cv).open for s, f, n, cv in (
        ({0, 1}, 0, 2, 0.05), ({0, 1, 2}, 1, 2, 0.3), ({0, 1}, 0, 2, 0.01), ({0, 1, 2, 3}, 0, 4, 0.3),
        ({0, 1}, 0, 1, None))] == [True, True, False, False, False]
    assert verdict(SPEC, "p", {0}, 0, 1, None).state == WAITING  # min not submitted yet
    # a gap (repeat 2 never submitted, 3 was): the gap is next
    assert verdict(SPEC, "p", {0, 1, 3}, 0, 3, 0.3).next_repeat == 2


def test_failed_repeats_are_not_counted() -> None:
    # Two repeats submitted, one failed: one measured value has no CV; nothing more is submitted for it
    # (retry runs the failed one again), and it still counts toward max.
    v = verdict(SPEC, "p", {0, 1}, 0, 1, None)
    assert v.state == NO_CV and v.next_repeat is None and "sbench retry" in v.text()
    # Three submitted, one failed, the two measured ones disagree: the fourth (last) one is next.
    assert verdict(SPEC, "p", {0, 1, 2}, 0, 2, 0.1).next_repeat == 3


def _point(pid: str, repeat: int) -> PlannedPoint:
    return PlannedPoint(point_id=pid, repeat=repeat, experiment="e", entity={}, valid=True, reasons=[], notes=[],
                        partition="p", model_source="m")


def test_decide_submits_the_next_repeat_only_where_the_cv_asks() -> None:
    pts = [_point(pid, r) for pid in ("noisy", "steady", "failing", "fresh", "busy") for r in range(4)]
    h = PointHistory(stability={"noisy": (2, 0.2), "steady": (2, 0.005), "failing": (1, None), "busy": (2, 0.2)})
    ok = [AttemptState(1, "j", "COMPLETED", "ok")]
    for pid in ("noisy", "steady", "busy"):
        h.by_run[("c", pid, 0)] = h.by_run[("c", pid, 1)] = ok
    h.by_run[("c", "failing", 0)] = ok
    h.by_run[("c", "failing", 1)] = [AttemptState(1, "j", "FAILED", "failed", "x")]
    h.by_run[("c", "busy", 2)] = [AttemptState(1, "j", "RUNNING", None)]
    d = decide(pts, h, "c", force=False, retry_failed=False, adaptive=SPEC)
    got = {(x.point.point_id, x.point.repeat): (x.action, x.reason) for x in d}
    # one more repeat of the noisy point, and only one (its next), as attempt 1
    assert got[("noisy", 2)][0] == "submit" and got[("noisy", 2)][1].startswith("more repeats: CV 20.00 %")
    assert ("noisy", 3) not in got and [x.attempt for x in d if x.point.point_id == "noisy" and x.point.repeat == 2] \
        == [1]
    # the steady one, the one with a failed repeat and the one with a repeat in flight: no extra repeat
    assert not any(k[0] in ("steady", "failing", "busy") and k[1] >= 2 and v[0] == "submit" for k, v in got.items())
    assert got[("busy", 2)][0] == "skip"  # its own repeat, in flight: as any attempt
    # the first min repeats of a point never submitted are plain new ones
    assert got[("fresh", 0)] == ("submit", "new") and got[("fresh", 1)] == ("submit", "new")
    assert ("fresh", 2) not in got
    # a plain sweep (no adaptive) decides every repeat as before
    plain = decide(pts, h, "c", force=False, retry_failed=False)
    assert len(plain) == len(pts) and {x.reason for x in plain if x.point.point_id == "fresh"} == {"new"}


BASE = {"campaign": "rep", "experiment": "finetune_full_benchmark-v1.0.0",
        "entity": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 1, "batch_size": 2,
                   "max_steps": 4}}


@pytest.mark.parametrize("repeats,key,fix", [
    ({"min": 0, "max": 3, "cv": 0.02}, "repeats.min", ">= 1"),
    ({"min": 3, "max": 2, "cv": 0.02}, "repeats.max", "raise max or lower min"),
    ({"min": 2, "max": 3, "cv": 0}, "repeats.cv", "between 0 and 1"),
    ({"min": 2, "max": 3, "cv": 1}, "repeats.cv", "between 0 and 1"),
    ({"min": 2, "max": 3, "cv": 0.02, "target": 1}, "repeats.target", "valid keys: min, max, cv"),
    ({"min": 2, "cv": 0.02}, "repeats.max", "required"),
    ({"min": 2, "max": 3, "cv": "2%"}, "repeats.cv", "number"),
])
def test_bad_repeats_exit_2_naming_the_file_and_key(tmp_path: Path, cli, repeats, key, fix) -> None:
    sw = write_yaml(tmp_path / "sweep.yaml", {**BASE, "repeats": repeats})
    res = cli("plan", sw)
    assert res.exit_code == 2, res.output
    assert str(sw) in res.output and key in res.output and fix in res.output and "Traceback" not in res.output


def test_adaptive_and_plain_repeats_plan(tmp_path: Path, cli) -> None:
    path = write_yaml(tmp_path / "a.yaml", {**BASE, "repeats": {"min": 2, "max": 5, "cv": 0.03}})
    sw = load_sweep(path)
    assert sw.adaptive == AdaptiveRepeats(2, 5, 0.03) and sw.repeats == 5
    res = cli("plan", path)
    assert res.exit_code == 0 and "5 run(s): 5 valid" in res.output
    assert "repeats: 2 per point, then one more at a time while its throughput CV is above 3 %, up to 5" in res.output
    plain = load_sweep(write_yaml(tmp_path / "p.yaml", {**BASE, "repeats": 3}))
    assert plain.adaptive is None and plain.repeats == 3


def test_fault_job_condition() -> None:
    (f,) = parse_faults("sleep@step=2,job=abc.r1.:3")
    assert f.applies(rank=0, trial=None, step=2, job="abc.r1.a1")
    assert not f.applies(rank=0, trial=None, step=2, job="abc.r0.a1")
    assert not f.applies(rank=0, trial=None, step=2)


@pytest.mark.train
@pytest.mark.slow(260)
def test_a_noisy_point_gets_more_repeats_and_a_steady_one_does_not(tiny_model: Path, small_data_dir: Path,
                                                                    tmp_path: Path) -> None:
    runs, db = tmp_path / "runs", tmp_path / "r.duckdb"
    common = ["--workdir", str(runs), "--db", str(db)]

    # Two points (batch 2 and 4), 6 steps each. On this shared 2-core machine the same configuration's
    # training time varies by up to 10x under load (0.3-8 s for 6 steps of the tiny model), so every run
    # sleeps 3 s after each of steps 1-5 (15 s): a steady point's two repeats then differ by at most about
    # 1.5x (a CV below 0.3). One repeat of the noisy point sleeps 9 s more at each (60 s): its first two
    # repeats differ by 2.6x or more (a CV above 0.6). The target, 45 %, lies between: the noisy point gets
    # a third (max) repeat and the steady one does not.
    doc = kit.sweep(tiny_model, small_data_dir, campaign="rep", repeats={"min": 2, "max": 3, "cv": 0.45},
                    entity={"max_steps": 6}, grid={"batch_size": [2, 4]})
    sw = write_yaml(tmp_path / "sweep.yaml", doc)
    inv_doc = kit.inventory()
    inv = write_yaml(tmp_path / "inv.yaml", inv_doc)
    sweep = load_sweep(sw)
    ids = sorted({p.point_id: p.entity["batch_size"] for p in plan_sweep(sweep, load_inventory(inv))}.items(),
                 key=lambda kv: kv[1])
    noisy, steady = ids[0][0], ids[1][0]
    # The fault travels in the inventory's env, rendered into each job's env/<host>.sh: it names one repeat.
    inv_doc["partitions"]["cpu"]["env"] = {
        "SBENCH_FAULT": ";".join([f"sleep@step={k}:3" for k in range(1, 6)]
                                 + [f"sleep@step={k},job={noisy}.r{r}.:9" for k in range(1, 6) for r in (1, 3)])}
    write_yaml(inv, inv_doc)

    # submit --wait waits for the first repeats, then submits the noisy point's next repeat (its CV is above the
    # target) and waits for it too: nothing else has to run for the campaign to reach its precision.
    out = json.loads(sbench("submit", sw, "-i", inv, "--executor", "local", "--wait", "--json", *common).stdout)
    assert out["submitted"] == 4 and out["summary"]["counts"]["ok"] == 5, out["summary"]
    (more,) = out["more_repeats"]
    assert [(p["point_id"], p["repeat"], p["action"]) for p in more["points"]] == [(noisy, 2, "submit")]
    (before,) = [v for v in more["repeats_before"] if v["point_id"] == noisy]
    assert before["state"] == MORE and before["next_repeat"] == 2 and before["submitted"] == 2
    (now,) = [v for v in more["repeats"] if v["point_id"] == noisy]  # what the summary says: it is in flight
    assert now["state"] == WAITING and now["in_flight"] == 1 and now["submitted"] == 3
    st = json.loads(sbench("status", "--campaign", "rep", "--json", *common).stdout)
    by = {v["point_id"]: v for v in st["repeats"]["rep"]}
    # with its third repeat (a fast one) its CV came down to the target or not: either way, no more at max 3
    assert by[noisy]["submitted"] == 3 and by[noisy]["state"] in (AT_MAX, PRECISE)
    assert (by[steady]["state"], by[steady]["submitted"]) == (PRECISE, 2)
    assert sorted((r["point_id"], r["repeat"], r["outcome"]) for r in st["rows"]) == sorted(
        [(noisy, i, "ok") for i in range(3)] + [(steady, i, "ok") for i in range(2)])
    # The CV status judged by is the throughputs' own, recomputed from the DB's measurements.
    with duckdb.connect(str(db), read_only=True) as con:
        xs = [r[0] for r in con.execute("SELECT dataset_tokens_per_second FROM measurements WHERE point_id = ? "
                                        "AND is_valid", [noisy]).fetchall()]
    assert len(xs) == 3 and by[noisy]["cv"] == pytest.approx(stdev(xs) / (sum(xs) / 3), rel=1e-9)

    # max 5 now. submit (no --wait) sends the fourth repeat, a slow one (r3). Once it has ended, collect (what a
    # plain loop or cron runs) sends the fifth: the four throughputs (fast, slow, fast, slow) have a CV above
    # 0.6, whatever the machine's load does to the fast ones' time.
    doc["repeats"]["max"] = 5
    write_yaml(sw, doc)
    sub = json.loads(sbench("submit", sw, "-i", inv, "--executor", "local", "--json", *common).stdout)
    assert [(p["point_id"], p["repeat"]) for p in sub["points"] if p["action"] == "submit"] == [(noisy, 3)]
    # a second submit/collect while it is in flight submits nothing more
    again = sbench("submit", sw, "-i", inv, "--executor", "local", *common).stdout
    assert "campaign rep: 0 attempt(s) submitted" in again
    deadline, sent = time.monotonic() + 300, []
    while time.monotonic() < deadline:
        out = json.loads(sbench("collect", "--campaign", "rep", "--json", *common).stdout)
        sent += [(p["point_id"], p["repeat"]) for m in out["more_repeats"] for p in m["points"]
                 if p["action"] == "submit"]
        if out["outcomes"].get("ok") == 7:
            break
        time.sleep(3)
    assert sent == [(noisy, 4)]
    st = json.loads(sbench("status", "--campaign", "rep", "--json", *common).stdout)
    by = {v["point_id"]: v for v in st["repeats"]["rep"]}
    assert by[noisy]["submitted"] == 5 and by[noisy]["state"] == AT_MAX, by[noisy]
    assert (by[steady]["state"], by[steady]["submitted"]) == (PRECISE, 2)

    # the extra repeat is a repeat like any other: its job dir, its manifest line
    assert (runs / "rep" / f"{noisy}.r2.a1" / "rank.0.json").is_file()
    assert not (runs / "rep" / f"{steady}.r2.a1").exists()
    lines = [json.loads(x) for x in (runs / "rep" / "manifest.jsonl").read_text().splitlines()]
    assert lines[0]["repeats"] == {"min": 2, "max": 3, "cv": 0.45}
    assert [e["repeats"] for e in lines if e.get("type") == "repeats"] == [{"min": 2, "max": 5, "cv": 0.45}]
    assert yaml.safe_load(sw.read_text())["repeats"]["max"] == 5
    # status says it in words too
    text = sbench("status", "--campaign", "rep", *common).stdout
    assert "1 of 2 point(s) within the CV target, 1 below precision" in text and f"{noisy}: CV" in text
