"""The precision auto-stop method's statistics (harness.runner.steady) on fixed sequences, and its settings in the
sweep (runner.auto_stop: method precision, rel_ci, max_seconds).

The sequences are generated with fixed seeds, so every assertion is deterministic; what they assert is a
property of the method (where the truncation lands, that the interval narrows to the target, that noise keeps
it open), not a copied result.
"""

from __future__ import annotations

import math
import random
from itertools import accumulate
from pathlib import Path
from statistics import fmean, stdev

import pytest

from harness.collect.aggregate import measured_window, window_properties
from harness.contract.defaults import AUTO_STOP, RunnerSettings
from harness.contract.errors import SweepError
from harness.contract.stats import t_cdf, t_quantile
from harness.runner.measure import StopPolicy, _set_window, measurements, step_times
from harness.runner.steady import (
    PrecisionRule,
    batch_means,
    mser5,
    steady_state,
    window_stats,
)
from harness.spec.sweep import parse_sweep

from .kit import sbench


def ramp_then_plateau(ramp: int, plateau: int, *, seed: int, noise: float = 0.02) -> list[float]:
    """A warm-up whose step times fall linearly from 1.0 s to 0.2 s over *ramp* steps, then a plateau at 0.1 s
    with Gaussian noise of relative size *noise*."""
    rnd = random.Random(seed)
    warm = [1.0 - 0.8 * i / max(1, ramp - 1) for i in range(ramp)]
    return warm + [0.1 * (1 + noise * rnd.gauss(0, 1)) for _ in range(plateau)]


def simulate(rule: PrecisionRule, times: list[float]) -> tuple[int, str | None, object]:
    """Feed *times* to the rule step by step as the callback does: (steps run, reason, window)."""
    for n, elapsed in enumerate(accumulate(times), start=1):
        stop, reason, window = rule.decide(times[:n], elapsed)
        if stop:
            return n, reason, window
    return len(times), None, None


# -- Student's t ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(p) -> None:
    # df=1 is Cauchy: tan(pi (p - 1/2)); df=2: (2p - 1) / sqrt(2 p (1 - p)).
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)


@pytest.mark.parametrize("df", [3, 7, 29, 200])
def test_t_quantile_inverts_the_cdf_and_tends_to_the_normal(df) -> None:
    q = t_quantile(0.975, df)
    assert t_cdf(q, df) == pytest.approx(0.975, abs=1e-13)
    assert t_quantile(0.025, df) == -q
    normal = 1.959963984540054  # the standard normal's 0.975 quantile, which t exceeds for every df
    assert normal < q < t_quantile(0.975, df - 1)
    # the t quantile's excess over the normal's, by its first two terms in 1/df (Cornish-Fisher)
    z = normal
    excess = (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    if df >= 7:
        assert q - normal == pytest.approx(excess, rel=0.05)


# -- MSER-5 ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ramp,seed", [(20, 1), (35, 2), (50, 3)])
def test_mser5_truncation_lands_after_the_warmup_ramp(ramp, seed) -> None:
    times = ramp_then_plateau(ramp, 300, seed=seed)
    d = mser5(times)
    assert d % 5 == 0
    # after the ramp (its last batch is already near the plateau), and never past the first half
    assert ramp - 5 <= d <= len(times) // 2, d
    s = steady_state(times)
    assert s is not None and s.start == d and s.steps == len(times) - d
    assert s.mean_s == pytest.approx(0.1, rel=0.01)  # the plateau's level, not pulled up by the ramp


def test_mser5_keeps_a_steady_sequence_whole_and_never_cuts_more_than_half() -> None:
    flat = [0.1 * (1 + 0.01 * random.Random(5).gauss(0, 1)) for _ in range(200)]
    assert mser5(flat) <= 20  # no warm-up to find: at most a batch or so by chance
    assert mser5([1.0] * 100 + [0.1] * 40) <= 70  # a "warm-up" longer than half: capped at half
    assert mser5([0.5] * 9) == 0  # fewer than two batches


# -- batch means --------------------------------------------------------------------------------------------

def ar1(n: int, phi: float, seed: int, mean: float = 0.1, sd: float = 0.005) -> list[float]:
    rnd, x, out = random.Random(seed), 0.0, []
    for _ in range(n):
        x = phi * x + rnd.gauss(0, sd * math.sqrt(1 - phi * phi))
        out.append(mean + x)
    return out


def test_batch_means_are_not_fooled_by_correlated_steps() -> None:
    # Strongly correlated step times (AR(1), phi 0.9): the naive iid interval is far too narrow; the batch
    # means' one is wider and covers the true mean about 95 % of the time.
    n, reps, covered, wider = 900, 100, 0, 0
    for seed in range(reps):
        xs = ar1(n, 0.9, seed)
        ci = batch_means(xs)
        assert ci is not None and ci.n == 30 and ci.batch_size == 30
        naive = 1.96 * stdev(xs) / math.sqrt(n)
        wider += ci.half > 2 * naive
        covered += abs(ci.mean - 0.1) <= ci.half
    assert wider >= 0.9 * reps
    assert 0.85 * reps <= covered <= reps


def test_batch_means_interval_by_hand_on_a_tiny_sequence() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]  # isqrt 3 batches of 3; the oldest step dropped
    ci = batch_means(xs)
    assert ci is not None and (ci.n, ci.batch_size) == (3, 3)
    means = [3.0, 6.0, 9.0]
    # the interval is relative to the mean of every step (the window's, stored beside it), not the batched ones'
    assert ci.mean == fmean(xs) != fmean(means) and ci.rel == ci.half / fmean(xs)
    batched = t_quantile(0.975, 2) * stdev(means) / math.sqrt(3)
    steps = t_quantile(0.975, 8) * stdev(xs[1:]) / math.sqrt(9)
    assert ci.half == pytest.approx(max(batched, steps), rel=1e-15) and batched > steps
    # batch means that agree by chance while the steps are spread: the interval of the steps is the floor
    spread = [1.0, 3.0, 2.0, 2.0, 3.0, 1.0, 3.0, 1.0, 2.0]
    ci = batch_means(spread)
    assert ci is not None and ci.half == pytest.approx(t_quantile(0.975, 8) * stdev(spread) / 3, rel=1e-15)
    assert ci.rel == ci.half / ci.mean
    assert batch_means([1.0, 2.0, 3.0]) is None
    w = window_stats(xs, 4)
    assert w is not None and w.steps == 6 and w.cv == pytest.approx(stdev(xs[4:]) / fmean(xs[4:]), rel=1e-15)


# -- the rule ------------------------------------------------------------------------------------------------

def test_a_ramp_then_a_steady_plateau_stops_by_precision_after_the_ramp() -> None:
    times = ramp_then_plateau(30, 5000, seed=11)
    rule = PrecisionRule(rel_ci=0.02, min_steps=10, max_seconds=600)
    n, reason, window = simulate(rule, times)
    assert reason == "precision" and n < 1000
    assert window is not None
    assert 25 <= window.start <= 40 and window.steps == n - window.start >= 10
    assert window.rel <= 0.02
    # the interval it stopped with holds the plateau's true mean step time (0.1 s)
    assert abs(window.interval.mean - 0.1) <= window.interval.half


def test_min_steps_holds_the_stop_back() -> None:
    times = [0.1] * 10 + [0.1 * (1 + 0.001 * ((-1) ** i)) for i in range(400)]
    quick = simulate(PrecisionRule(rel_ci=0.02, min_steps=10, max_seconds=600), times)
    held = simulate(PrecisionRule(rel_ci=0.02, min_steps=300, max_seconds=600), times)
    assert quick[1] == held[1] == "precision"
    assert quick[0] < 300 <= held[2].steps


def test_a_wildly_noisy_sequence_runs_to_max_seconds() -> None:
    rnd = random.Random(3)
    times = [0.1 * math.exp(2.0 * rnd.gauss(0, 1)) for _ in range(20000)]  # lognormal, sigma 2: CV about 7
    rule = PrecisionRule(rel_ci=0.02, min_steps=10, max_seconds=120)
    n, reason, window = simulate(rule, times)
    assert reason == "max_seconds"
    assert sum(times[:n]) >= 120 > sum(times[:n - 1])
    assert window is not None and window.rel > 0.02  # still measured, its width says how well


def test_the_rule_is_evaluated_every_step_at_first_then_at_one_percent_growth() -> None:
    assert all(PrecisionRule.due(n) for n in range(1, 200))
    due = [n for n in range(200, 20000) if PrecisionRule.due(n)]
    assert 200 in due and len(due) < 700
    assert max(b - a for a, b in zip(due, due[1:])) <= 199  # never more than 1 % of the steps late


# -- the sweep ------------------------------------------------------------------------------------------------

def sweep(tmp_path: Path, auto_stop: dict, **entity) -> dict:
    (tmp_path / "m").mkdir(exist_ok=True)
    return {"campaign": "p", "experiment": "finetune_lora_benchmark-v1.0.0",
            "entity": {"model_name": "tiny", "model_max_length": 64, **entity}, "grid": {},
            "model_map": {"tiny": str(tmp_path / "m")}, "runner": {"auto_stop": auto_stop}}


def test_precision_settings_reach_the_runner_settings(tmp_path) -> None:
    doc = sweep(tmp_path, {"method": "precision", "rel_ci": 0.05, "min_steps": 20, "max_seconds": 90},
                auto_stop_method=AUTO_STOP)
    r = parse_sweep(doc, "s.yaml", tmp_path).runner
    assert (r.stop_method, r.rel_ci, r.min_steps, r.max_seconds) == ("precision", 0.05, 20, 90.0)
    assert RunnerSettings.from_dict(r.to_dict()) == r  # spec.json round trip
    fixed = parse_sweep(sweep(tmp_path, {"warmup_seconds": 5}), "s.yaml", tmp_path).runner
    assert fixed.stop_method == "fixed" and fixed.warmup_seconds == 5.0
    doc = sweep(tmp_path, {"method": "precision"})
    doc["grid"] = {"auto_stop_method": [None, AUTO_STOP]}
    assert parse_sweep(doc, "s.yaml", tmp_path).runner.stop_method == "precision"


@pytest.mark.parametrize("auto_stop,entity,key,fix", [
    ({"method": "mser"}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop.method", "precision"),
    ({"method": "precision", "rel_ci": 0}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop.rel_ci", "0.02"),
    ({"method": "precision", "rel_ci": 1.5}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop.rel_ci", "at most 0.5"),
    ({"method": "precision", "rel_ci": "2%"}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop.rel_ci", "number"),
    ({"method": "precision", "max_seconds": 0}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop.max_seconds",
     "> 0"),
    ({"method": "precision", "min_steps": 0}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop.min_steps", ">= 1"),
    ({"method": "precision", "warmup_seconds": 60}, {"auto_stop_method": AUTO_STOP},
     "runner.auto_stop.warmup_seconds", "method: fixed"),
    ({"rel_ci": 0.02}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop.rel_ci", "method: precision"),
    ({"method": "precision"}, {}, "runner.auto_stop.method", f"auto_stop_method: {AUTO_STOP}"),
    ({"method": "precision", "confidence": 0.9}, {"auto_stop_method": AUTO_STOP}, "runner.auto_stop", "rel_ci"),
])
def test_bad_precision_settings_name_the_key_and_the_fix(tmp_path, auto_stop, entity, key, fix) -> None:
    with pytest.raises(SweepError) as exc:
        parse_sweep(sweep(tmp_path, auto_stop, **entity), "sweeps/s.yaml", tmp_path)
    msg = str(exc.value)
    assert msg.startswith("sweeps/s.yaml") and key in msg and fix in msg, msg


def test_the_cli_refuses_a_bad_rel_ci_with_exit_2_naming_file_and_key(tmp_path) -> None:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep(tmp_path, {"method": "precision", "rel_ci": -0.1},
                                         auto_stop_method=AUTO_STOP)))
    res = sbench("plan", path, in_process=True, ok=None)
    assert res.exit_code == 2, res.output
    assert "s.yaml" in res.output and "runner.auto_stop.rel_ci" in res.output and "Traceback" not in res.output


# -- collect ---------------------------------------------------------------------------------------------------

def test_collect_takes_the_window_and_its_statistics_from_rank_0() -> None:

    rank0 = {"train_start_wall": 100.0, "warmup_end_wall": 104.5, "train_end_wall": 130.0, "window": "steady_state",
             "global_step": 60, "metrics": {"train_steps": 45},
             "steady_state": {"start_step": 15, "end_step": 60, "steps": 45, "step_time_cv": 0.031,
                              "ci_rel_halfwidth": 0.0125}}
    assert measured_window(rank0, AUTO_STOP) == (104.5, 130.0)
    assert measured_window(rank0, None) == (104.5, 130.0)  # the rank's own word: a steady window
    assert measured_window({**rank0, "window": "whole_run"}, None) == (100.0, 130.0)
    assert window_properties(rank0) == {"window_steps": 45, "window_start_step": 15, "window_end_step": 60,
                                        "steady_step_time_cv": 0.031, "ci_rel_halfwidth": 0.0125}
    fixed = window_properties({**rank0, "steady_state": None})
    assert fixed["window_steps"] == 45 and fixed["steady_step_time_cv"] is None and fixed["ci_rel_halfwidth"] is None
    assert window_properties(None)["window_steps"] is None


# -- the runner's bookkeeping, without a model --------------------------------------------------------------

def test_the_runner_measures_the_steady_window_it_stopped_on() -> None:
    # The timeline the Trainer callback keeps, filled step by step from a fixed sequence (8 slow warm-up
    # steps, then a noisy plateau), with the stop decision taken after each step as rank 0 takes it.
    import argparse


    times = [2.0] * 8 + [0.5 * (1 + 0.05 * random.Random(9).gauss(0, 1)) for _ in range(2000)]
    policy = StopPolicy.of(argparse.Namespace(stop_after_seconds=-1.0, auto_stop_method=AUTO_STOP),
                           RunnerSettings(stop_method="precision", rel_ci=0.02, min_steps=10, max_seconds=600))
    t0, wall0 = 50.0, 1000.0
    tl: dict = {"t0": t0, "train_start_wall": wall0, "start_step": 0,
                "start_counts": {"samples": 0, "dataset_tokens": 0, "train_tokens": 0, "micro_batches": 0,
                                 "cpu_s": 0.0}}
    now = t0
    for step, dt in enumerate(times, start=1):
        now += dt
        counts = {"samples": 4 * step, "dataset_tokens": 100 * step, "train_tokens": 128 * step,
                  "micro_batches": step, "cpu_s": 0.9 * (now - t0)}
        tl.update(end_wall=wall0 + now - t0, t_end=now, end_step=step, end_counts=counts)
        tl.setdefault("step_end_wall", []).append(wall0 + now - t0)
        tl.setdefault("step_t", []).append(now)
        tl.setdefault("step_counts", []).append(counts)
        stop, reason, start = policy.decide_precision(step_times(tl), now - t0)
        if start >= 0:
            _set_window(tl, start)
        if stop:
            tl["stopped_by"] = reason
            break
    out = measurements(tl, policy, max_steps=-1)
    st, m = out["steady_state"], out["metrics"]
    assert out["stopped_by"] == "precision" and out["window"] == "steady_state"
    assert st["warmup_steps"] >= 8 and st["warmup_steps"] % 5 == 0 and st["ci_rel_halfwidth"] <= 0.02
    n, w = out["global_step"], st["warmup_steps"]
    assert st["steps"] == m["train_steps"] == n - w >= 10
    assert out["warmup_end_wall"] == tl["step_end_wall"][w - 1]  # the window starts where step w ended
    assert m["train_runtime"] == pytest.approx(sum(times[w:n]), rel=1e-12)
    assert m["rank_dataset_tokens"] == 100 * (n - w) and m["train_tokens"] == 128 * (n - w)
    assert m["train_steps_per_second"] == pytest.approx((n - w) / sum(times[w:n]), rel=1e-12)
    assert st["step_time_cv"] == pytest.approx(stdev(times[w:n]) / fmean(times[w:n]), rel=1e-9)
