"""The search's decisions (harness.spec.search.step), from made-up histories: no training.

A simulated campaign answers each run the search asks for from a known truth (which batches fit per shape, each
point's throughput), so every test checks the search against what a full grid would find."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import pytest

from harness.campaign.executors.pack import SCAN_SKIP
from harness.report.sections import search_section
from harness.spec.search import (
    AGREE_RUNS,
    FINAL,
    KEEP,
    MIN_STEPS,
    RUN,
    SKIP,
    STOP,
    Candidate,
    RecordedSearch,
    RunSeen,
    SearchEvidence,
    SearchSpec,
    answer,
    disagreement,
    grid_estimate,
    interval,
    objective_intervals,
    ratio_bounds,
    short_run_steps,
    spread_rel_ci,
    step,
)

GB = 1e9
SPEC = SearchSpec("dataset_tokens_per_second", "maximize", "fit", "halving", 3)


def grid(models: list[str], batches: list[int], memory: Callable[[str, int], float | None] | None = None,
         device: float = 80 * GB) -> list[Candidate]:
    out = []
    for m, b in itertools.product(models, batches):
        total = memory(m, b) if memory else None
        out.append(Candidate(f"{m}-b{b}", {"model_name": m, "batch_size": b}, total,
                             device if total is not None else None, None if total is None else total > device))
    return out


def simulate(spec: SearchSpec, cands: list[Candidate], fits: Callable[[Candidate], bool],
             speed: Callable[[Candidate], float], repeats: int = 1, rel_ci: float = 0.01,
             fail: set[tuple[str, int]] | None = None, limit: int = 50,
             busy: set[tuple[str, int]] | None = None, at: Callable[[Candidate, int], float] | None = None,
             also: Callable[[Candidate], dict[str, float]] | None = None):
    """Run the search to its end: each step's runs end at once as the truth says (*at*: a repeat's own value, where
    repeats differ; *busy*: the runs measured on a busy host; *also*: the further objectives' values). Returns the
    last state and the runs made, in order."""
    runs: dict[str, list[RunSeen]] = {}
    made: list[tuple[str, int]] = []
    for _ in range(limit):
        st = step(spec, cands, runs, repeats)
        if not st.todo:
            return st, made, runs
        for pid, rep in st.todo:
            assert (pid, rep) not in made, f"{pid} repeat {rep} asked for twice"
            made.append((pid, rep))
            c = next(c for c in cands if c.point_id == pid)
            if fail and (pid, rep) in fail:
                runs.setdefault(pid, []).append(RunSeen(rep, "failed", reason="node died"))
            elif fits(c):
                runs.setdefault(pid, []).append(RunSeen(rep, "ok", at(c, rep) if at else speed(c), rel_ci,
                                                        busy=bool(busy and (pid, rep) in busy),
                                                        values=also(c) if also else {}))
            else:
                runs.setdefault(pid, []).append(RunSeen(rep, "invalid", reason="CUDA out of memory"))
    raise AssertionError("the search did not end")


def grid_answer(cands: list[Candidate], fits: Callable[[Candidate], bool], speed: Callable[[Candidate], float]):
    ok = [c for c in cands if fits(c)]
    best = max(ok, key=speed).point_id if ok else None
    per_shape: dict[str, int | None] = {}
    for c in cands:
        m = c.entity["model_name"]
        per_shape.setdefault(m, None)
        if fits(c):
            per_shape[m] = max(per_shape[m] or 0, c.batch)
    return best, per_shape


LIMIT = {"a": 24, "b": 48, "c": 8, "d": 64}
BATCHES = [1, 2, 4, 8, 16, 24, 32, 48, 64]


def fits_of(c: Candidate) -> bool:
    return c.batch <= LIMIT[c.entity["model_name"]]


@pytest.mark.parametrize("fastest", ["a", "b", "c", "d"])
def test_search_finds_the_grid_answer_with_fewer_runs(fastest):
    # throughput grows with the batch; one model is three times faster than the others (a sleep on the rest)
    def speed(c: Candidate) -> float:
        return (3000.0 if c.entity["model_name"] == fastest else 1000.0) * (1 + math.log(c.batch))

    cands = grid(list(LIMIT), BATCHES)
    st, made, _ = simulate(SPEC, cands, fits_of, speed, repeats=2)
    best, per_shape = grid_answer(cands, fits_of, speed)
    assert st.done and st.best == best
    assert {f.shape["model_name"]: f.batch_size for f in st.fits} == per_shape
    assert len({p for p, _ in made}) < len(cands) / 2  # most of the grid is never run
    assert st.decisions[best].phase == FINAL and st.decisions[best].action == KEEP
    # every point of the grid has a decision with its reason
    assert set(st.decisions) == {c.point_id for c in cands}
    for f in st.fits:
        assert f.largest_ok == f.batch_size and (f.smallest_oom is None or f.smallest_oom > f.largest_ok)


def test_the_first_run_of_a_shape_is_the_largest_batch_predicted_to_fit_and_far_ooms_are_never_run():
    # predicted 10 GB per batch unit: 8 fits an 80 GB device (80 GB), 16 is far over (160 GB)
    cands = grid(["a"], [2, 4, 8, 16, 32], memory=lambda m, b: 10 * GB * b)
    st = step(SPEC, cands, {}, 1)
    assert st.todo == [("a-b8", 0)]
    assert "predicted 80 GB <= 80 GB" in st.decisions["a-b8"].reason

    def fits(c: Candidate) -> bool:
        return c.batch <= 8

    st, made, _ = simulate(SPEC, cands, fits, lambda c: 100.0 * c.batch)
    assert [p for p, r in made if r == 0] == ["a-b8"]  # the prediction was right: one run decides the shape
    assert st.fits[0].batch_size == 8 and st.fits[0].smallest_oom is None
    for pid in ("a-b16", "a-b32"):
        assert st.decisions[pid].action == SKIP
        assert st.decisions[pid].reason.startswith("predicted OOM (160 GB > 80 GB" if pid == "a-b16"
                                                   else "predicted OOM (320 GB > 80 GB")
    assert st.decisions["a-b2"].action == SKIP and "bounded below by batch 8" in st.decisions["a-b2"].reason


def test_a_narrow_predicted_oom_is_run_when_the_bisection_needs_it():
    # 16 predicted at 88 GB (> 80, within the margin): it is tried after 8 fits, and it does fit
    cands = grid(["a"], [4, 8, 16], memory=lambda m, b: 5.5 * GB * b)
    st, made, _ = simulate(SPEC, cands, lambda c: True, lambda c: 100.0 * c.batch)
    assert [p for p, _ in made][:2] == ["a-b8", "a-b16"]
    assert st.fits[0].batch_size == 16


def test_a_far_predicted_oom_is_run_when_nothing_below_is_known_to_fit():
    cands = grid(["a"], [16, 32], memory=lambda m, b: 10 * GB * b)  # both far over
    st = step(SearchSpec("dataset_tokens_per_second", "maximize", "fit"), cands, {}, 1)
    assert st.todo == [("a-b16", 0)]


def test_a_shape_where_every_batch_ooms_and_one_where_none_does():
    cands = grid(["never", "always"], [2, 4, 8, 16])

    def fits(c: Candidate) -> bool:
        return c.entity["model_name"] == "always"

    st, made, _ = simulate(SPEC, cands, fits, lambda c: 10.0 * c.batch)
    by = {f.shape["model_name"]: f for f in st.fits}
    assert by["never"].batch_size is None and by["never"].smallest_oom == 2 and by["never"].largest_ok is None
    assert by["always"].batch_size == 16 and by["always"].smallest_oom is None
    assert st.best == "always-b16"
    assert "never-b16" not in {p for p, _ in made} or "never-b2" in {p for p, _ in made}


def test_halving_drops_points_whose_interval_is_below_the_best_and_says_so():
    models = [f"m{i}" for i in range(9)]
    cands = grid(models, [4])
    spec = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)
    st, made, _ = simulate(spec, cands, lambda c: True, lambda c: 100.0 + 100 * int(c.entity["model_name"][1:]))
    assert st.best == "m8-b4"
    rung0 = [p for p, r in made if r == 0]
    assert len(rung0) == 9 and len([p for p, r in made if r == 1]) <= 3
    reason = st.decisions["m0-b4"].reason
    assert st.decisions["m0-b4"].action == STOP and reason.startswith("halved out at rung 0: 100 ± 1 < best 900 ± 9")


def test_runners_up_that_overlap_the_best_get_the_repeats():
    cands = grid(["x", "y", "z"], [4])
    spec = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)
    speeds = {"x": 1000.0, "y": 1005.0, "z": 500.0}  # x and y overlap with 2 % intervals
    st, made, _ = simulate(spec, cands, lambda c: True, lambda c: speeds[c.entity["model_name"]], repeats=2,
                           rel_ci=0.02)
    finals = {p for p, r in made if r >= 2}
    assert finals == {"x-b4", "y-b4"} and st.best == "y-b4" and st.runners_up == ["x-b4"]
    assert st.decisions["z-b4"].action == STOP


def test_a_search_resumes_from_its_history_and_never_runs_a_decided_point_again():
    cands = grid(list(LIMIT), BATCHES)

    def speed(c: Candidate) -> float:
        return 100.0 * c.batch

    whole, made, runs = simulate(SPEC, cands, fits_of, speed, repeats=1)
    # interrupted after half of its runs: the same history gives the same next runs, none already made
    half = made[: len(made) // 2]
    partial = {pid: [r for r in rs if (pid, r.repeat) in half] for pid, rs in runs.items()}
    st = step(SPEC, cands, partial, 1)
    assert st.todo and not set(st.todo) & set(half)
    assert step(SPEC, cands, partial, 1).todo == st.todo  # deterministic


def test_a_run_in_flight_is_waited_for_and_a_failed_one_waits_for_retry():
    cands = grid(["a"], [2, 4, 8])
    st = step(SPEC, cands, {"a-b4": [RunSeen(0, None)]}, 1)
    assert not st.todo and st.waiting and not st.done
    st = step(SPEC, cands, {"a-b4": [RunSeen(0, "failed", reason="node died")]}, 1)
    assert not st.todo and st.stuck == ["a-b4"] and "sbench retry" in st.decisions["a-b4"].reason


def test_the_best_points_failed_repeat_leaves_the_answer_from_its_runs():
    cands = grid(["a", "b"], [4])
    spec = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)
    st, made, _ = simulate(spec, cands, lambda c: True, lambda c: 2000.0 if c.entity["model_name"] == "a" else 1000,
                           repeats=1, fail={("a-b4", 1)})
    assert ("a-b4", 1) in made and st.best == "a-b4" and st.stuck == ["a-b4"]
    assert st.decisions["a-b4"].action in (KEEP, RUN) and "sbench retry" in st.decisions["a-b4"].reason


def test_minimize_picks_the_smallest():
    cands = grid(["a", "b", "c"], [4])
    spec = SearchSpec("train_runtime", "minimize", None, "halving", 3)
    st, _, _ = simulate(spec, cands, lambda c: True, lambda c: {"a": 30.0, "b": 10.0, "c": 20.0}[c.entity[
        "model_name"]])
    assert st.best == "b-b4"


def test_interval_combines_the_runs_half_widths():
    iv = interval([RunSeen(0, "ok", 100.0, 0.1), RunSeen(1, "ok", 300.0, 0.1), RunSeen(2, "failed")])
    assert iv is not None and iv.mean == 200.0 and iv.n == 2
    assert iv.half == pytest.approx(math.sqrt(10.0 ** 2 + 30.0 ** 2) / 2)
    assert interval([RunSeen(0, "invalid")]) is None


def test_first_step_runs_rung_zero_of_every_entrant_without_fit():
    cands = grid(["a", "b"], [4, 8])
    spec = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)
    st = step(spec, cands, {}, 1)
    assert sorted(st.todo) == sorted((c.point_id, 0) for c in cands)
    assert all(d.action == RUN for d in st.decisions.values())


def test_rung_runs_are_short_and_the_final_repeats_full():
    cands = grid(list(LIMIT), BATCHES)
    st, made, _ = simulate(SPEC, cands, fits_of, lambda c: 100.0 * c.batch, repeats=1)
    # four shapes: two rungs of halving at most, so a bisection's (first rung's) run is 1/9 of the full length
    assert SPEC.rungs(4) == 2
    assert {st.scale[(p, r)] for p, r in made if r == 0} == {1 / 9}
    assert {st.scale[(p, r)] for p, r in made if r > 0 and st.decisions[p].phase == FINAL} == {1.0}
    first = step(SPEC, cands, {}, 1)
    assert all("0.11 of the campaign's run length" in first.decisions[p].reason for p, _ in first.todo)


def test_a_run_without_a_precision_interval_gets_one_from_its_step_times():
    assert spread_rel_ci(0.1, 4) == pytest.approx(0.1)  # 2 x 0.1 / sqrt(4)
    assert spread_rel_ci(0.1, 1) is None and spread_rel_ci(None, 9) is None


def test_while_a_rungs_run_waits_for_retry_best_names_the_point_ahead_so_far():
    # nine points, the fastest's rung 1 run fails: the halving waits for sbench retry, and best says who leads
    models = [f"m{i}" for i in range(9)]
    cands = grid(models, [4])
    spec = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)
    st, made, runs = simulate(spec, cands, lambda c: True, lambda c: 100.0 + 100 * int(c.entity["model_name"][1:]),
                              fail={("m8-b4", 1)})
    assert ("m8-b4", 1) in made and st.stuck == ["m8-b4"] and not st.todo
    assert st.best == "m8-b4" and st.best_interval is not None and st.best_interval.n == 1
    assert "sbench retry" in st.decisions["m8-b4"].reason
    # nothing ran yet: no point is ahead
    assert step(spec, cands, {}, 1).best is None


def test_the_answer_is_the_fastest_point_measured_not_only_the_largest_batch_that_fits():
    # Two shapes (1 and 2 workers, batches 1 to 64), OOM above 12 per worker; every point sleeps but (w2, 8), which
    # the bisection of w2 measures on its way to 16 (8 ok, then 32 OOM, then 16 ok). It is the answer, not (w2, 16).
    limit = {"w1": 12, "w2": 24}
    cands = grid(["w1", "w2"], [1, 2, 4, 8, 16, 32, 64])

    def fits(c: Candidate) -> bool:
        return c.batch <= limit[c.entity["model_name"]]

    def speed(c: Candidate) -> float:
        return 9000.0 if c.point_id == "w2-b8" else 1000.0 * (1 + math.log(c.batch))

    st, made, _ = simulate(SPEC, cands, fits, speed, repeats=1)
    assert {f.shape["model_name"]: f.batch_size for f in st.fits} == {"w1": 8, "w2": 16}
    assert ("w2-b8", 0) in made and st.done and st.best == "w2-b8"
    assert grid_answer(cands, fits, speed)[0] == "w2-b8"
    # the fitted batches were its rivals, and left on the evidence of their runs
    assert st.decisions["w2-b16"].action == STOP and "best 9,000" in st.decisions["w2-b16"].reason
    assert len({p for p, _ in made}) < len(cands) / 2


def test_busy_host_runs_are_left_out_where_a_quiet_one_exists_and_used_with_a_note_where_not():
    quiet, loud = RunSeen(0, "ok", 1000.0, 0.01), RunSeen(1, "ok", 300.0, 0.01, busy=True)
    iv = interval([quiet, loud])
    assert iv is not None and iv.mean == 1000.0 and iv.n == 1
    iv = interval([loud])
    assert iv is not None and iv.mean == 300.0
    # three shapes; the fastest's rung 0 run was measured on a busy host at a third of its speed: without the
    # rule it would be halved out at rung 0; with it, its busy run is all it has, so it is used (and said so) ...
    cands = grid(["a", "b", "c"], [4])
    spec = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)
    speeds = {"a": 1000.0, "b": 1500.0, "c": 3000.0}

    def at(c: Candidate, rep: int) -> float:
        v = speeds[c.entity["model_name"]]
        return v / 3 if (c.point_id, rep) in busy else v

    busy = {("c-b4", 0)}
    st, made, runs = simulate(spec, cands, lambda c: True, lambda c: 0.0, at=at, busy=busy)
    assert st.best == "b-b4" and "c-b4" not in {p for p, r in made if r > 0}
    assert "all on a busy host: used" in st.decisions["c-b4"].reason
    # ... and where the point has a quiet run too, the busy one is left out of every decision
    busy = {("c-b4", 1)}
    st, made, runs = simulate(spec, cands, lambda c: True, lambda c: 0.0, at=at, busy=busy)
    assert ("c-b4", 1) in made and st.best == "c-b4" and st.best_interval is not None
    assert st.best_interval.mean == 3000.0 and "1 run(s) on a busy host left out" in st.decisions["c-b4"].reason


def test_two_runs_that_disagree_get_a_third_before_the_point_is_cut_or_ranked():
    # b's rung 1 run reads 3x its rung 0 run (intervals far apart): it leads on that, but cuts no one and gets the
    # campaign's repeat as a third look before it is ranked; a goes on beside it; c (slower, agreeing) is cut.
    cands = grid(["a", "b", "c"], [4])
    spec = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)

    def at(c: Candidate, rep: int) -> float:
        m = c.entity["model_name"]
        if m == "b":
            return {0: 1000.0, 1: 3000.0}.get(rep, 1100.0)
        return {"a": 1000.0, "c": 200.0}[m]

    st, made, runs = simulate(spec, cands, lambda c: True, lambda c: 0.0, at=at, repeats=1)
    assert disagreement(runs["b-b4"][:2]) is not None and ("c-b4", 1) not in made
    assert ("b-b4", 2) in made and ("a-b4", 2) in made
    assert len(runs["b-b4"]) >= AGREE_RUNS and st.decisions["b-b4"].phase == FINAL
    assert "kept, as the best's runs disagree" in st.decisions["a-b4"].reason
    assert st.best == "b-b4" and st.best_interval is not None and st.best_interval.mean == pytest.approx(1700.0)
    # with one shape and one repeat (two runs planned), two that disagree get the spare repeat
    one = grid(["a"], [4])
    spec1 = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3)
    st, made, runs = simulate(spec1, one, lambda c: True, lambda c: 0.0,
                              at=lambda c, rep: {0: 1000.0, 1: 3000.0}.get(rep, 2000.0), repeats=1)
    assert made == [("a-b4", 0), ("a-b4", 1), ("a-b4", 2)] and st.done and st.best == "a-b4"
    assert "a third, repeat 2" in st.decisions["a-b4"].reason
    assert st.best_interval is not None and st.best_interval.mean == pytest.approx(2000.0)


def test_the_grids_estimate_counts_full_length_runs_and_every_grid_point():
    # two shapes; the bisection's runs are short (1/3 of the run length); only the final repeats are full
    cands = grid(["a", "b"], [2, 4, 8])
    st, made, runs = simulate(SPEC, cands, lambda c: c.batch <= 4, lambda c: 100.0 * c.batch, repeats=1)
    spent = []
    for pid, rep in made:
        r = next(x for x in runs[pid] if x.repeat == rep)
        share = st.scale[(pid, rep)]
        # a full run trains 90 s (allocation 100 s); a short run its share of it; an OOM run 5 s (allocation 15 s)
        train = 90.0 * share if r.outcome == "ok" else 5.0
        spent.append({"point_id": pid, "repeat": rep, "outcome": r.outcome, "train_s": train,
                      "allocation_s": train + 10.0, "number_gpus": 2})
    assert any(st.scale[k] < 1 for k in made) and any(st.scale[k] == 1 for k in made)
    ev = SearchEvidence("s", RecordedSearch(SPEC, ("model_name", "batch_size"), 1, tuple(cands)), runs, spent, [],
                        {c.point_id: {**c.entity, "number_gpus": 2} for c in cands})
    ans = answer(ev)
    # 4 points fit (each 90 s of training from the full runs), 2 do not (each 5 s, the OOM runs' mean)
    assert ans["grid_estimate_from"] == ("own full-length runs (2 points), the campaign's full-length runs (2 points), "
                                         "own OOM runs (2 points)")
    assert ans["grid_train_s_estimate"] == pytest.approx(4 * 90.0 + 2 * 5.0)
    assert ans["grid_allocation_s_estimate"] == pytest.approx(4 * 100.0 + 2 * 15.0)
    assert ans["grid_gpu_s_estimate"] == pytest.approx(2 * ans["grid_allocation_s_estimate"])
    assert ans["runs"] == len(made) and ans["train_s"] == pytest.approx(sum(r["train_s"] for r in spent))
    # before any run ended: nothing to estimate from
    empty = answer(SearchEvidence("s", ev.recorded, {}, [], [], {}))
    assert empty["grid_estimate_from"] is None and empty["grid_train_s_estimate"] == 0
    # a point measured only by a short run (a scan's, or a rung's before it left) is estimated from that run,
    # stretched (its training over the share, its start-up once), not from the other points' full runs: here a
    # slowed point, 60 s of training in a third of the run length
    slow = [{"point_id": "a-b2", "repeat": 0, "outcome": "ok", "train_s": 60.0, "allocation_s": 70.0}]
    fits = {c.point_id: c.batch <= 4 for c in cands}
    est, basis = grid_estimate(cands, fits, {}, [*spent, *slow], {**st.scale, ("a-b2", 0): 1 / 3})
    assert est["train_s"] == pytest.approx(2 * 90.0 + 180.0 + 90.0 + 2 * 5.0)
    assert est["allocation_s"] == pytest.approx(2 * 100.0 + 190.0 + 100.0 + 2 * 15.0)
    assert basis == ("own full-length runs (2 points), own short runs, stretched (1 point), the campaign's "
                     "full-length runs (1 point), own OOM runs (2 points)")
    # where the point stops at max_steps, its short run's share is of the steps it trained: a third of 3 steps is
    # 2 (MIN_STEPS), so the 60 s were two thirds of the run
    est, _ = grid_estimate(cands, fits, {}, [*spent, *slow], {**st.scale, ("a-b2", 0): 1 / 3}, {"a-b2": 3})
    assert short_run_steps(3, 1 / 3) == MIN_STEPS == 2
    assert est["train_s"] == pytest.approx(2 * 90.0 + 90.0 + 90.0 + 2 * 5.0)


def test_the_reports_answer_says_when_the_best_point_was_measured_on_a_busy_host_only():
    base = {"campaign": "s", "goal": {"maximize": "dataset_tokens_per_second"}, "done": True, "runs": 3,
            "objectives": [{"sense": "maximize", "metric": "dataset_tokens_per_second"}], "pareto": [],
            "grid_points": 6, "train_s": 10.0, "allocation_s": 12.0, "gpu_s": 12.0, "grid_train_s_estimate": 30.0,
            "grid_allocation_s_estimate": 36.0, "grid_gpu_s_estimate": 36.0,
            "grid_estimate_from": "own full-length runs (3 points)",
            "max_batch_size": [], "decisions": []}
    best = {"point_id": "p1", "value": 100.0, "interval": [90.0, 110.0], "runs": 2}
    quiet = search_section([{**base, "best": {**best, "busy_runs_left_out": 0, "busy_host_only": False}}])
    loud = search_section([{**base, "best": {**best, "busy_runs_left_out": 0, "busy_host_only": True}}])
    some = search_section([{**base, "best": {**best, "busy_runs_left_out": 1, "busy_host_only": False}}])
    assert "busy" not in quiet and "estimated from: own full-length runs (3 points)" in quiet
    assert "every run of it on a host busy with other work" in loud
    assert "1 run of it on a busy host left out" in some


PARETO = SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3,
                    (("minimize", "cost_per_million_tokens"),))


def test_a_pareto_search_keeps_every_point_that_may_be_on_the_front():
    # Nine points: throughput and cost per million tokens trade off along a front (more GPUs: faster and dearer);
    # the others are worse on both than some front point. Only the dominated ones leave, each naming who beat it.
    truth = {f"m{i}": (1000.0 * (i + 1), 1.0 + 0.5 * i) for i in range(5)}  # the front: faster is dearer
    truth |= {"x1": (1500.0, 2.0), "x2": (800.0, 4.0), "x3": (3500.0, 5.0), "x4": (400.0, 1.5)}
    cands = grid(list(truth), [4])

    def speed(c: Candidate) -> float:
        return truth[c.entity["model_name"]][0]

    def also(c: Candidate) -> dict[str, float]:
        tps, cost = truth[c.entity["model_name"]]
        return {"dataset_tokens_per_second": tps, "cost_per_million_tokens": cost}

    st, made, runs = simulate(PARETO, cands, lambda c: True, speed, also=also, repeats=1)
    front = {f"m{i}-b4" for i in range(5)}
    assert st.done and set(st.pareto) == front and st.best == "m4-b4"
    for x in ("x1", "x2", "x3", "x4"):
        d = st.decisions[f"{x}-b4"]
        assert d.action == STOP and "dominated by m" in d.reason and "cost_per_million_tokens" in d.reason, d
    # every front point got the campaign's repeat (the rungs never cut one)
    assert {p for p, r in made if r >= 1} >= front
    # one objective: the same grid keeps only the fastest and those overlapping it
    single, _, _ = simulate(SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3), cands,
                            lambda c: True, speed, repeats=1)
    assert single.best == "m4-b4" and not single.pareto


def test_a_pareto_point_leaves_only_when_another_is_better_on_every_objective_beyond_the_intervals():
    # b is cheaper than a within their intervals' overlap (2 % each): a does not dominate it, and both stay
    cands = grid(["a", "b", "c"], [4])
    truth = {"a": (2000.0, 1.00), "b": (1000.0, 1.01), "c": (900.0, 3.0)}

    def also(c: Candidate) -> dict[str, float]:
        tps, cost = truth[c.entity["model_name"]]
        return {"dataset_tokens_per_second": tps, "cost_per_million_tokens": cost}

    st, _, runs = simulate(PARETO, cands, lambda c: True, lambda c: truth[c.entity["model_name"]][0], also=also,
                           rel_ci=0.02)
    assert st.pareto == ["a-b4", "b-b4"] and st.decisions["c-b4"].action == STOP
    # a goal's round trip through what a campaign records, and the sweep's way of saying it
    assert SearchSpec.from_dict(PARETO.to_dict()) == PARETO
    assert PARETO.goal() == {"maximize": "dataset_tokens_per_second", "minimize": "cost_per_million_tokens"}


def test_a_pareto_objective_and_its_reciprocal_cut_alike_where_a_noisy_run_would_reach_below_zero():
    # One GPU a point: a million tokens' cost is the price over the throughput. The slow point's two runs are noisy
    # (relative half-widths 1.9 and 0.96, a short run's), so its cost's mean ± half would reach 0.05, under the fast
    # point's cost, and keep it on the front; as a factor either side of the value, its cost and its throughput lie
    # apart from the fast point's alike, as they do with throughput alone
    price = 2.5 * 1e6 / 3600

    def seen(rep: int, tps: float, rel: float) -> RunSeen:
        return RunSeen(rep, "ok", tps, rel, values={"dataset_tokens_per_second": tps,
                                                   "cost_per_million_tokens": price / tps})

    slow = [seen(0, 245.0, 1.9), seen(1, 186.0, 0.96)]
    fast = [seen(0, 7004.0, 0.67), seen(1, 8660.0, 0.30)]
    cost = interval(slow, "cost_per_million_tokens")
    assert cost is not None and cost.lo < interval(fast, "cost_per_million_tokens").hi  # type: ignore[union-attr]
    ivs = {p: objective_intervals(PARETO, rs) for p, rs in (("slow", slow), ("fast", fast))}
    lo_slow, _ = ratio_bounds(ivs["slow"]["cost_per_million_tokens"])  # type: ignore[arg-type]
    _, hi_fast = ratio_bounds(ivs["fast"]["cost_per_million_tokens"])  # type: ignore[arg-type]
    assert hi_fast < lo_slow
    for name in ("dataset_tokens_per_second", "cost_per_million_tokens"):  # the same factor on both
        a, b = ivs["slow"][name], ivs["slow"]["dataset_tokens_per_second"]
        assert a is not None and b is not None and a.rel == pytest.approx(b.rel, rel=1e-12)
        lo, hi = ratio_bounds(a)
        assert lo > 0 and lo * hi == pytest.approx(a.mean**2, rel=1e-12)
    cands = grid(["fast", "slow"], [4])
    runs = {"fast-b4": fast, "slow-b4": slow}
    st = step(PARETO, cands, runs, 1)
    assert st.decisions["slow-b4"].action == STOP and "dominated by fast-b4" in st.decisions["slow-b4"].reason
    one = step(SearchSpec("dataset_tokens_per_second", "maximize", None, "halving", 3), cands, runs, 1)
    assert one.decisions["slow-b4"].action == STOP


def test_a_packed_fit_scans_every_batch_in_one_wave_and_finds_a_faster_batch_the_bisection_never_runs():
    # The two shapes (1 and 2 workers, batches 1 to 64, OOM above 12 per worker), the fast point (w2, 2): a
    # batch the bisection of w2 never measures (it runs 64, 16... or 8, 32, 16: never 2). Packed (slurm.pack), the
    # fit scans each shape's batches in ascending order in one pack; the pack does not start a batch after its
    # shape's first OOM (not_needed_after_oom), which the search bounds above.
    limit = {"w1": 12, "w2": 24}
    cands = grid(["w1", "w2"], [1, 2, 4, 8, 16, 32, 64])
    scan = dataclasses.replace(SPEC, scan=True)

    def fits(c: Candidate) -> bool:
        return c.batch <= limit[c.entity["model_name"]]

    def speed(c: Candidate) -> float:
        return 9000.0 if c.point_id == "w2-b2" else 1000.0 * (1 + math.log(c.batch))

    runs: dict[str, list[RunSeen]] = {}
    waves = []
    for _ in range(20):
        st = step(scan, cands, runs, 1)
        if not st.todo:
            break
        waves.append(st.todo)
        oom: dict[str, int] = {}
        for pid, rep in sorted(st.todo, key=lambda t: next(c.batch for c in cands if c.point_id == t[0])):
            c = next(c for c in cands if c.point_id == pid)
            m = c.entity["model_name"]
            if rep == 0 and m in oom:  # its pack does not start it
                runs.setdefault(pid, []).append(RunSeen(rep, "failed", reason=SCAN_SKIP.format(oom=oom[m])))
            elif fits(c):
                runs.setdefault(pid, []).append(RunSeen(rep, "ok", speed(c), 0.01))
            else:
                oom.setdefault(m, c.batch)
                runs.setdefault(pid, []).append(RunSeen(rep, "invalid", reason="CUDA out of memory"))
    # the first wave is every batch of both shapes; the fit is decided after it
    assert sorted(waves[0]) == sorted((c.point_id, 0) for c in cands)
    assert "scan:" in step(scan, cands, {}, 1).decisions["w1-b4"].reason
    assert st.done and st.best == "w2-b2" and {f.shape["model_name"]: f.batch_size for f in st.fits} == {
        "w1": 8, "w2": 16}
    # the batches its pack did not start are bounded above by the OOM before them, never waited on or retried
    for pid in ("w1-b32", "w1-b64", "w2-b64"):
        d = st.decisions[pid]
        assert d.action == SKIP and "bounded above by batch" in d.reason and pid not in st.stuck, d
    # the bisection, wave by wave, never measures (w2, 2): it names a slower point
    bis, made, _ = simulate(SPEC, cands, fits, speed, repeats=1)
    assert ("w2-b2", 0) not in made and bis.best != "w2-b2"
    # what a packed sweep records, and reads back
    assert SearchSpec.from_dict(scan.to_dict()) == scan and "scan" not in SPEC.to_dict()
