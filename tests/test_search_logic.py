"""The search's decisions (harness.spec.search.step), from made-up histories: no training.

A simulated campaign answers each run the search asks for from a known truth (which batches fit per shape, each
point's throughput), so every test checks the search against what a full grid would find."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest

from harness.spec.search import (
    FINAL,
    KEEP,
    RUN,
    SKIP,
    STOP,
    Candidate,
    RunSeen,
    SearchSpec,
    interval,
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
             fail: set[tuple[str, int]] | None = None, limit: int = 50):
    """Run the search to its end: each step's runs end at once as the truth says. Returns the last state and
    the runs made, in order."""
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
                runs.setdefault(pid, []).append(RunSeen(rep, "ok", speed(c), rel_ci))
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
