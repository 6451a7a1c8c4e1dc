"""sbench compare: pairing by point, Welch's test with the runs' step times, verdicts, a real slowdown caught;
the stability rating of a point's throughput across repeats. (The method's promises over random traces:
tests/test_verdicts.py.)"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from statistics import median, stdev

import duckdb
import pytest

from harness.contract.errors import InputError
from harness.contract.stability import rating, rating_sql
from harness.contract.stats import t_quantile, t_sf
from harness.report.compare import compare, parse_side

from . import kit
from .kit import sbench, write_yaml


def side(values: dict[str, list[float]], metric: str = "dataset_tokens_per_second", step_cv: float | None = None,
         steps: int = 16) -> dict[str, list[dict]]:
    return {pid: [{metric: v, "model_name": "tiny", "number_gpus": 1, "batch_size": 2, "step_time_cv": step_cv,
                   "steps_timed": steps if step_cv is not None else None} for v in vs]
            for pid, vs in values.items()}


def gm(xs: list[float]) -> float:
    """The geometric mean: each side's centre in compare's test."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def test_student_t_is_exact() -> None:
    # published two-sided 95 % and 99 % critical values, and the distribution's symmetry
    for df, q in ((1, 12.706204736174707), (2, 4.302652729749464), (3, 3.182446305284263),
                  (5, 2.570581835636314), (10, 2.228138851986274), (30, 2.042272456301238)):
        assert t_quantile(0.975, df) == pytest.approx(q, rel=1e-11)
        assert t_sf(q, df) == pytest.approx(0.025, rel=1e-10)
    assert t_quantile(0.995, 1) == pytest.approx(63.65674116287399, rel=1e-11)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959963984540054, rel=1e-11)
    assert t_sf(0.0, 3) == 0.5 and t_sf(-1.0, 1) == pytest.approx(0.75, rel=1e-12)  # Cauchy: atan
    assert t_quantile(0.025, 4) == -t_quantile(0.975, 4)
    # Welch's degrees of freedom are not whole: the tail is continuous between them
    assert t_quantile(0.975, 2) < t_quantile(0.975, 1.5) < t_quantile(0.975, 1)


def test_verdicts_follow_size_and_spread() -> None:
    base = side({"a": [100, 102, 98, 101], "b": [50, 51, 49, 50], "c": [10, 10.5, 9.5], "d": [7.0]})
    cand = side({"a": [70, 71, 69, 72], "b": [50.2, 50.8, 49.6, 50], "c": [14, 13.5, 14.5], "d": [5.0], "e": [1.0]})
    rows = {r.point_id: r for r in compare(base, cand, ["dataset_tokens_per_second"], 0.05)}
    assert set(rows) == {"a", "b", "c", "d"}  # e is only in CAND: nothing to pair
    assert rows["a"].verdict == "regression"
    assert rows["a"].ratio == pytest.approx(gm([70, 71, 69, 72]) / gm([100, 102, 98, 101]))
    assert rows["a"].high is not None and rows["a"].high < 1 and rows["a"].n_base == 4 and rows["a"].p_value < 0.05
    assert rows["b"].verdict == "same" and 0.95 <= rows["b"].low <= 1 <= rows["b"].high <= 1.05
    assert rows["c"].verdict == "improvement"
    # one run a side: no spread to judge by, whatever the ratio
    assert rows["d"].verdict == "insufficient repeats" and rows["d"].ratio == pytest.approx(5 / 7)
    # the ratio is the test's own estimate: the sides' geometric means, and it lies inside its interval
    for r in rows.values():
        assert r.ratio == pytest.approx(r.cand / r.base, rel=1e-12)
        assert r.low is None or r.low <= r.ratio <= r.high
    assert rows["d"].low is None and rows["d"].p_value is None


def test_two_runs_a_side_decide_a_large_change_and_one_run_does_not() -> None:
    (slower,) = compare(side({"a": [100, 102]}), side({"a": [25, 25.5]}), ["dataset_tokens_per_second"], 0.1)
    assert slower.verdict == "regression" and slower.ratio == pytest.approx(gm([25, 25.5]) / gm([100, 102]))
    assert slower.high < 1 and slower.df == pytest.approx(2.0) and slower.spread == {"base": "runs", "cand": "runs"}
    (same,) = compare(side({"a": [100, 102]}), side({"a": [100, 102]}), ["dataset_tokens_per_second"], 0.1)
    assert same.verdict == "same" and same.ratio == 1 and 0.9 <= same.low < 1 < same.high <= 1.1
    (faster,) = compare(side({"a": [100, 102]}), side({"a": [400, 404]}), ["dataset_tokens_per_second"], 0.1)
    assert faster.verdict == "improvement"
    for b, c in (([100], [25]), ([100], [100]), ([100], [25, 25.5, 25.2])):
        (row,) = compare(side({"a": b}), side({"a": c}), ["dataset_tokens_per_second"], 0.1)
        assert row.verdict == "insufficient repeats" and row.ratio == pytest.approx(gm(c) / gm(b))
    # lower is better: a longer runtime is the regression
    (rt,) = compare(side({"a": [10.0, 10.2, 9.9]}, "train_runtime"), side({"a": [13.0, 13.1, 12.8]}, "train_runtime"),
                    ["train_runtime"], 0.05)
    assert rt.ratio > 1.2 and rt.verdict == "regression"


def test_step_times_let_two_runs_that_agree_within_them_decide() -> None:
    # Two base runs 30 % apart: alone (one degree of freedom) they cannot tell a 4x change from their spread.
    base, cand = {"a": [1.0, 1.3]}, {"a": [0.29, 0.30]}
    (alone,) = compare(side(base), side(cand), ["dataset_tokens_per_second"], 0.1)
    assert alone.verdict == "insufficient repeats" and alone.low < 1 < alone.high and alone.ratio < 0.3
    # Each run's 16 steps spread by a CV of 0.8: a run's value varies by 0.8 / 4 = 0.2 in log, more than the
    # two runs differ. The steps then measure the side's spread, with their 30 degrees of freedom: decided.
    (steps,) = compare(side(base, step_cv=0.8), side(cand, step_cv=0.05), ["dataset_tokens_per_second"], 0.1)
    assert steps.spread == {"base": "steps", "cand": "runs"} and steps.df > 29
    assert steps.verdict == "regression" and steps.high < 1 and steps.p_value < 1e-6
    # Steps steady to 5 % predict far less than the runs' 30 %: the runs differ by more than their steps
    # say, so the runs' own spread decides, and cannot.
    (steady,) = compare(side(base, step_cv=0.05), side(cand, step_cv=0.05), ["dataset_tokens_per_second"], 0.1)
    assert steady.spread == {"base": "runs", "cand": "runs"} and steady.verdict == "insufficient repeats"
    # Step times say nothing of a metric not measured over the training window.
    (mem,) = compare(side(base, "gpu_memory_utilization_peak", step_cv=0.8),
                     side(cand, "gpu_memory_utilization_peak", step_cv=0.8), ["gpu_memory_utilization_peak"], 0.1)
    assert mem.spread == {"base": "runs", "cand": "runs"} and mem.verdict == "insufficient repeats"


def _run(step: float, stall: float = 0.0, m: int = 16, every: int = 0) -> dict:
    """A measurement row of *m* steps of about *step* s (one of them, or with *every* each every-th one,
    *stall* s longer), with the throughput (1000 tokens a step over the window) and the step statistics
    collect stores for them."""
    d = [step * (1 + 0.02 * ((i % 3) - 1)) for i in range(m)]
    for i in range(m):
        if (every and i % every == every - 1) or (not every and i == 5):
            d[i] += stall
    mean = sum(d) / m
    return {"dataset_tokens_per_second": 1000 / mean, "model_name": "tiny", "number_gpus": 1, "batch_size": 2,
            "steps_timed": m, "step_time_median": median(d), "step_time_mean": mean,
            "step_time_cv": stdev(d) / mean}


def test_stalls_count_for_the_time_they_took() -> None:
    # every third step stalls by 2 s in both candidate runs: the throughput falls to a fraction, and the
    # runs' own steps (their CV over 16 steps) back it with their degrees of freedom: a regression
    base = {"a": [_run(0.5), _run(0.52)]}
    stalled = {"a": [_run(0.5, 2.0, every=3), _run(0.5, 2.0, every=3)]}
    (row,) = compare(base, stalled, ["dataset_tokens_per_second"], 0.1)
    want = gm([r["dataset_tokens_per_second"] for r in stalled["a"]]) / gm([r["dataset_tokens_per_second"]
                                                                          for r in base["a"]])
    assert row.ratio == pytest.approx(want, rel=1e-12) and row.ratio < 0.5
    assert row.verdict == "regression" and row.low <= row.ratio <= row.high < 1
    # one run of the base had one long step (a neighbour's burst): it counts, the two base runs then
    # disagree by more than their steps say, and the runs' own spread decides: not a regression of a
    # rerun of the same configuration, whichever side the long step fell on
    burst = {"a": [_run(0.05), _run(0.05, stall=0.8)]}
    clean = {"a": [_run(0.05), _run(0.05)]}
    for b, c in ((burst, clean), (clean, burst)):
        (rerun,) = compare(b, c, ["dataset_tokens_per_second"], 0.05)
        assert rerun.verdict == "insufficient repeats" and rerun.low <= 1 <= rerun.high, rerun
    # lower is better: train_runtime the same way (a longer window is the regression)
    rt = {"a": [dict(r, train_runtime=16 * r["step_time_mean"]) for r in base["a"]]}
    rt_slow = {"a": [dict(r, train_runtime=16 * r["step_time_mean"]) for r in stalled["a"]]}
    (longer,) = compare(rt, rt_slow, ["train_runtime"], 0.05)
    assert longer.verdict == "regression" and longer.low > 1.5 and longer.ratio == pytest.approx(1 / row.ratio)


def test_a_large_but_unclear_change_is_insufficient_repeats() -> None:
    # medians differ by 10 %, but the repeats spread far wider than that: not a regression, and not "same"
    base = side({"a": [100, 60, 140, 90, 120]})
    cand = side({"a": [90, 150, 55, 85, 110]})
    (row,) = compare(base, cand, ["dataset_tokens_per_second"], 0.05)
    assert row.ratio < 0.95 and row.verdict == "insufficient repeats" and row.low < 0.95 and row.high > 1.05


def test_stability_bands() -> None:
    cases = [(0.0, "excellent"), (0.0099, "excellent"), (0.01, "good"), (0.0199, "good"), (0.02, "moderate"),
             (0.0499, "moderate"), (0.05, "fair"), (0.0999, "fair"), (0.1, "poor"), (3.0, "poor"), (None, None)]
    assert [rating(cv) for cv, _ in cases] == [want for _, want in cases]
    # the SQL the database rates with says the same at every edge
    with duckdb.connect() as con:
        got = [con.execute(f"SELECT {rating_sql('x')} FROM (SELECT ?::DOUBLE AS x)", [cv]).fetchall()[0][0]
               for cv, _ in cases]
    assert got == [want for _, want in cases]


def test_bad_arguments_are_input_errors() -> None:
    assert parse_side("nightly-1") == ("nightly-1", {})
    assert parse_side("git_commit=abc,torch=2.13.0,campaign=n") == ("n", {"git_commit": "abc", "torch": "2.13.0"})
    for text in ("../x", "git_commit=", "a=b,=c"):
        with pytest.raises(InputError):
            parse_side(text)
    with pytest.raises(InputError, match="not comparable"):
        compare(side({"a": [1]}), side({"a": [1]}), ["loss"], 0.05)
    with pytest.raises(InputError, match="threshold"):
        compare(side({"a": [1]}), side({"a": [1]}), ["dataset_tokens_per_second"], 5)


@pytest.mark.train
@pytest.mark.slow(135)
def test_a_real_slowdown_is_flagged_and_the_same_configuration_is_not(tiny_model: Path, small_data_dir: Path,
                                                                      tmp_path: Path) -> None:
    runs, db = tmp_path / "runs", tmp_path / "r.duckdb"
    common = ["--workdir", str(runs), "--db", str(db)]

    # The slowdown travels in the inventory's env (rendered into env/<host>.sh), so it reaches exactly the
    # jobs of that campaign whichever local queue worker runs them. Same partition: the same points. It is
    # 3 s after each of steps 1-15 (45 s; each lands in the next step's time), inside a training window of
    # about a second: every step of the slow runs is slower, so their step times agree, and on this shared
    # machine a busy neighbour that stretches the base's window several times still leaves it far behind.
    # The base and same campaigns run interleaved, base r0, same r0, base r1, same r1: a neighbour's burst of
    # load (it has slowed a run of the tiny model tenfold for half a minute) then lands on both sides, never
    # on the two runs of one side alone, so it cannot pass for a regression of the same configuration.
    slow = ";".join(f"sleep@step={k}:3" for k in range(1, 16))
    for name, fault, repeats in (("base", None, 1), ("same", None, 1), ("base", None, 2), ("same", None, 2),
                                 ("slow", slow, 2)):
        # the slow campaign's nodes also set an NCCL variable the others do not: compare names it beside
        inv = write_yaml(tmp_path / f"{name}-inv.yaml", kit.inventory(
            env={"SBENCH_FAULT": fault, "NCCL_ALGO": "Tree"} if fault else {}))
        sw = write_yaml(tmp_path / f"{name}.yaml", kit.sweep(tiny_model, small_data_dir, campaign=name, repeats=repeats,
                                                             entity={"max_steps": 16}))
        out = sbench("submit", sw, "-i", inv, "--executor", "local", "--wait", "--json", *common)
        assert json.loads(out.stdout)["submitted"] == (2 if name == "slow" else 1)
    sbench("collect", *common)
    import duckdb
    import yaml

    # Each run's step times, as collect stored them, recomputed from rank 0's own file.
    with duckdb.connect(str(db), read_only=True) as con:
        ms = [dict(zip([d[0] for d in con.description], r)) for r in con.execute(
            "SELECT m.campaign, m.dataset_tokens_per_second, m.steps_timed, m.step_time_median, m.step_time_cv, "
            "m.step_time_mean, m.step_time_mad, r.job_dir FROM measurements m JOIN runs r USING (run_id) "
            "WHERE m.is_valid AND NOT coalesce(m.shared_host, false) ORDER BY 1").fetchall()]
        stab = {r[0]: r[1:] for r in con.execute(
            "SELECT campaign, repeats_measured, throughput_cv, throughput_stability FROM point_stability").fetchall()}
    assert sorted(m["campaign"] for m in ms) == ["base", "base", "same", "same", "slow", "slow"]
    for m in ms:
        r0 = json.loads((Path(m["job_dir"]) / "rank.0.json").read_text())
        ends = [r0["train_start_wall"], *r0["step_end_wall"]]
        durations = [b - a for a, b in zip(ends, ends[1:])]
        assert m["steps_timed"] == len(durations) == 16
        assert m["step_time_median"] == pytest.approx(median(durations), rel=1e-12)
        assert m["step_time_cv"] == pytest.approx(stdev(durations) / (sum(durations) / 16), rel=1e-12)
        assert m["step_time_mean"] == pytest.approx(sum(durations) / 16, rel=1e-12)
        assert m["step_time_mad"] == pytest.approx(median(abs(d - median(durations)) for d in durations), rel=1e-12)
        if m["campaign"] == "slow":  # the injected sleeps are in 15 of its 16 steps
            assert m["step_time_median"] > 3
    # The stability of each campaign's point across its two repeats: the CV of its two throughputs, rated.
    for camp in ("base", "same", "slow"):
        xs = [m["dataset_tokens_per_second"] for m in ms if m["campaign"] == camp]
        cv = stdev(xs) / (sum(xs) / len(xs))
        assert stab[camp][:2] == (2, pytest.approx(cv, rel=1e-9)) and stab[camp][2] == rating(cv)
    status = sbench("status", "--campaign", "slow", *common).stdout
    assert "stability" in status.splitlines()[0] and f"{stab['slow'][2]} {100 * stab['slow'][1]:.1f}%" in status

    flagged = sbench("compare", "base", "slow", "--db", db, "--json", ok=(0, 1))
    (row,) = json.loads(flagged.stdout)["rows"]
    assert row["ratio"] < 0.5 and row["n_base"] == row["n_cand"] == 2, row
    assert flagged.returncode == (1 if row["verdict"] == "regression" else 0)
    # Where the base's two repeats agree, 2 vs 2 decides it (each run's own steps back its throughput); only
    # where the load stretched one base run far from the other is the honest word "insufficient repeats",
    # never "same". Either way the ratio lies inside its interval.
    assert row["low"] <= row["ratio"] <= row["high"], row
    # What changed under the numbers, beside the row: the slow side's recorded NCCL variable, and its fault.
    beside = {c["name"]: (c["base"], c["cand"]) for c in row["changes"]}
    assert beside["NCCL_ALGO"] == ([], ["Tree"]) and "SBENCH_FAULT" in beside, row["changes"]
    text = sbench("compare", "base", "slow", "--db", db, ok=(0, 1))
    if row["verdict"] == "regression":
        (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith("regression ")]
        assert "changed under it:" in line and "NCCL_ALGO (not recorded) -> Tree" in line, text.stdout
    # Whether 2 vs 2 decides depends on how far the load spread each side's two runs (a base CV of 0.23 with
    # one degree of freedom leaves an interval wider than a tenfold change): the verdict is one of the two, and it
    # agrees with its own numbers — a regression lies wholly below 1 with p < 0.05, an undecided one reaches 1.
    assert row["verdict"] in ("regression", "insufficient repeats"), row
    assert (row["verdict"] == "regression") == (row["high"] < 1) == (row["p_value"] < 0.05), row
    # Two campaigns of the same configuration differ only by this shared 2-core machine's noise, which for
    # a tiny model's sub-second training windows can reach a factor of ten under load: run interleaved, no
    # regression at 80 % (the injected slowdown above is more than ten times).
    same = sbench("compare", "base", "same", "--db", db, "--threshold", "0.8")
    assert "0 regression(s)" in same.stdout

    # References gate a campaign: the slow one's training time against the base's slowest run plus 1.5 s
    # (the injected sleeps add 45 s), its dataset rate against nothing it could miss.
    with duckdb.connect(str(db), read_only=True) as con:
        base_rt = max(r[0] for r in con.execute("SELECT train_runtime FROM measurements WHERE campaign = 'base'")
                      .fetchall())
    refs = {"train_runtime": {"value": base_rt, "upper": 1.5 / base_rt},
            "dataset_tokens_per_second": [{"value": 1.0, "lower": 0.5, "model_name": "tiny"},
                                          {"value": 1e12, "lower": 0.01}]}
    for name in ("base", "slow"):
        doc = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
        doc["references"] = refs
        sw = write_yaml(tmp_path / f"{name}.yaml", doc)
        out = sbench("submit", sw, "-i", tmp_path / f"{name}-inv.yaml", "--executor", "local", *common)
        assert f"campaign {name}: 0 attempt(s) submitted" in out.stdout
    sbench("collect", *common)
    ok = json.loads(sbench("check", "base", "--db", db, "--json").stdout)
    assert ok["ok"] and ok["counts"] == {"pass": 4, "fail": 0, "missing": 0, "shared": 0}
    # the more specific entry (model_name: tiny) applied, not the unreachable 1e12
    assert {c["reference"] for c in ok["checks"] if c["metric"] == "dataset_tokens_per_second"} == {1.0}
    bad = sbench("check", "slow", "--db", db, ok=(1,))
    assert "2 pass, 2 fail, 0 missing" in bad.stdout
    assert all(line.startswith("fail") for line in bad.stdout.splitlines() if "train_runtime" in line)
    # The report shows both: the checks table and the compare plot (a regression marker in red).
    page = sbench("report", "--db", db, "--compare", "base", "slow", "-o", "-").stdout
    assert 'id="checks"' in page and "slow: 2 pass, 2 fail, 0 missing" in page
    assert 'id="compare"' in page
    if row["verdict"] == "regression":  # the chart's spec: the point's dot in the regression's red
        assert "1 regression." in page
        (spec,) = [json.loads(x) for x in re.findall(r'class="vl-spec" data-for="chart-compare"[^>]*>(.*?)</script>',
                                                     page, re.S)]
        scale = spec["layer"][-1]["encoding"]["color"]["scale"]
        assert dict(zip(scale["domain"], scale["range"]))["regression"] == "#d62728"
        assert [p["verdict"] for p in spec["data"]["values"]].count("regression") == 1
    # and the latest table rates each point's stability across its repeats
    assert "<th>stability</th>" in page and f"{stab['slow'][2]} ({100 * stab['slow'][1]:.1f} %)" in page
