"""The false alarms and the power of ``sbench compare``'s method, on synthetic step times and on real runs.

Every trial builds the measurement rows collect would store for a few runs a side (``steps_timed``,
``step_time_cv``, ... from :func:`harness.collect.aggregate.step_time_properties` over each run's step end
times; the throughput is the window's tokens over its seconds), and asks
:func:`harness.report.compare.compare_point` for its verdict, exactly as ``sbench compare`` does, at its
default threshold (10 %).

Traces:

* SYNTHETIC ``cv=C tau=T``: a run of ``--steps`` steps whose step times are log-normal around 0.1 s with a
  coefficient of variation C, the whole run scaled by a log-normal factor of spread T (what differs from one
  run to the next: the machine's state, the placement, the load).
* REAL RUNS: step times of real runs of one point (the tiny model, full fine-tuning, one process on this
  machine's CPU, run by ``launch.sh`` as the local executor runs it), recorded by this script
  (``--record N``) or read from a file it wrote before (``--traces FILE``). A trial takes distinct runs of
  the pool at random for each side, so the spread between runs is the real one, step by step as recorded.
  Reported twice: every recorded run, and only the runs compare keeps (those whose host's other load over
  the window, measured as collect measures it, stayed within the default ``runner.host_busy_cpu``).
* REAL STEPS: runs made of blocks of 4 consecutive steps drawn from all recorded runs (their first step, the
  warm-up, left out): the real steps' distribution, stalls and bursts included, without the between-run swings
  a shared machine's load adds.

Changes applied to the candidate's runs: ``uniform x S`` (every step S times longer) and ``stalls every
k-th step`` (every k-th step, from a random phase, longer by a fixed stall that makes the mean step S times
longer: ``(S - 1) * k`` times the pool's mean step time, as an injected sleep does).

Reported per trace source:

* the false alarms on identical configurations (no change): the share of ``regression`` verdicts (what
  fails a CI gate; goal <= 5 %) and of any verdict that flags (regression or improvement);
* the detection rate (``regression``) of a 2x slowdown with 2 runs a side, uniform and as stalls every
  3rd and every 6th step (goal >= 95 %);
* the smallest uniform slowdown detected in 80 % of the trials with 2, 3 and 5 runs a side (a grid from
  1.02x to 5x).

    .venv/bin/python bench/compare_power.py                          # records 12 real runs first (~4 min)
    .venv/bin/python bench/compare_power.py --traces /tmp/traces.json --trials 2000 --out /tmp/power.json
    .venv/bin/python bench/compare_power.py --traces /tmp/traces.json --variant blend   # the method not chosen

``--variant blend`` measures the alternative docs/results.md weighs against compare's method: a side's variance
of one run the between-run variance ``max(0, s^2 - mean w^2)`` plus the mean within-run ``w^2``, with
Satterthwaite's degrees of freedom for that sum (compare takes the larger of ``s^2`` and ``mean w^2``, each
with its own degrees of freedom).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.collect.aggregate import step_durations, step_time_properties  # noqa: E402
from harness.contract.defaults import RunnerSettings  # noqa: E402
from harness.report.compare import Verdict, compare_point  # noqa: E402

DATASET = "news-chars-512-entries-4096"
METRIC = "dataset_tokens_per_second"
THRESHOLD = 0.10  # compare's default
HOST_BUSY_CPU = RunnerSettings().host_busy_cpu  # the default share of a host's CPU other work may use
TOKENS_PER_STEP = 1000.0
GRID = (1.02, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0)

Trace = list[float]  # one run's step times (s), in order
Draw = Callable[[random.Random, int], list[Trace]]  # k runs of one configuration


# -- the rows compare reads --------------------------------------------------------------------------------

def row(durations: Sequence[float]) -> dict[str, Any]:
    """The measurement row collect stores for a run with these step times (its window starting at 0)."""
    ends, t = [], 0.0
    for d in durations:
        t += d
        ends.append(t)
    rank0 = {"step_end_wall": ends}
    props = step_time_properties(rank0, 0.0, t)
    return {METRIC: TOKENS_PER_STEP * len(durations) / t, **props, "model_name": "bench"}


def verdict_of(base: list[Trace], cand: list[Trace]) -> str:
    r = compare_point("p", METRIC, [row(d) for d in base], [row(d) for d in cand], THRESHOLD)
    assert r is not None
    assert r.low is None or r.low <= r.ratio <= r.high, r  # the method's promise, checked on every trial
    return r.verdict


# -- changes ------------------------------------------------------------------------------------------------

def uniform(trace: Trace, s: float, _mean: float, _rnd: random.Random) -> Trace:
    return [d * s for d in trace]


def stalls(k: int) -> Callable[[Trace, float, float, random.Random], Trace]:
    def apply(trace: Trace, s: float, mean: float, rnd: random.Random) -> Trace:
        stall, phase = (s - 1.0) * k * mean, rnd.randrange(k)
        return [d + (stall if (i + phase) % k == k - 1 else 0.0) for i, d in enumerate(trace)]
    return apply


# -- trace sources ------------------------------------------------------------------------------------------

def synthetic(steps: int, cv: float, tau: float) -> tuple[Draw, float]:
    sigma = math.sqrt(math.log1p(cv * cv))  # a log-normal with this coefficient of variation

    def draw(rnd: random.Random, k: int) -> list[Trace]:
        out = []
        for _ in range(k):
            f = math.exp(rnd.gauss(0.0, tau))
            out.append([0.1 * f * math.exp(rnd.gauss(-sigma * sigma / 2, sigma)) for _ in range(steps)])
        return out
    return draw, 0.1


def pooled(traces: list[Trace]) -> tuple[Draw, float]:
    mean = sum(sum(t) for t in traces) / sum(len(t) for t in traces)

    def draw(rnd: random.Random, k: int) -> list[Trace]:
        return [list(t) for t in rnd.sample(traces, k)]
    return draw, mean


BLOCK = 4  # consecutive steps kept together: neighbouring steps that move together stay together


def blocks(traces: list[Trace], steps: int) -> tuple[Draw, float]:
    runs = [t[1:] for t in traces if len(t) > BLOCK]
    starts = [(i, j) for i, t in enumerate(runs) for j in range(len(t) - BLOCK + 1)]
    mean = sum(sum(t) for t in runs) / sum(len(t) for t in runs)

    def draw(rnd: random.Random, k: int) -> list[Trace]:
        out = []
        for _ in range(k):
            d: Trace = []
            while len(d) < steps:
                i, j = rnd.choice(starts)
                d += runs[i][j:j + BLOCK]
            out.append(d[:steps])
        return out
    return draw, mean


# -- rates --------------------------------------------------------------------------------------------------

def rates(draw: Draw, mean: float, n: int, s: float, change: Callable[..., Trace], trials: int,
          seed: int) -> dict[str, float]:
    rnd = random.Random(seed)
    counts = {v: 0 for v in (Verdict.REGRESSION, Verdict.IMPROVEMENT, Verdict.SAME, Verdict.INSUFFICIENT)}
    for _ in range(trials):
        runs = draw(rnd, 2 * n)
        base, cand = runs[:n], [change(t, s, mean, rnd) for t in runs[n:]]
        counts[verdict_of(base, cand)] += 1
    return {v: c / trials for v, c in counts.items()}


def smallest(draw: Draw, mean: float, n: int, trials: int, seed: int) -> float | None:
    """The smallest uniform slowdown of :data:`GRID` detected in 80 % of the trials (None: not even 5x)."""
    for s in GRID:
        if rates(draw, mean, n, s, uniform, trials, seed)[Verdict.REGRESSION] >= 0.8:
            return s
    return None


def table(draw: Draw, mean: float, trials: int, seed: int, max_n: int) -> dict[str, Any]:
    null = rates(draw, mean, 2, 1.0, uniform, trials, seed)
    out: dict[str, Any] = {
        "false_regression_2v2": null[Verdict.REGRESSION],
        "false_flag_2v2": null[Verdict.REGRESSION] + null[Verdict.IMPROVEMENT],
        "detect_2x_uniform_2v2": rates(draw, mean, 2, 2.0, uniform, trials, seed + 1)[Verdict.REGRESSION],
        "detect_2x_stalls_k3_2v2": rates(draw, mean, 2, 2.0, stalls(3), trials, seed + 2)[Verdict.REGRESSION],
        "detect_2x_stalls_k6_2v2": rates(draw, mean, 2, 2.0, stalls(6), trials, seed + 3)[Verdict.REGRESSION],
    }
    for n in (3, 5):
        if 2 * n <= max_n:
            null_n = rates(draw, mean, n, 1.0, uniform, trials, seed + 10 + n)
            out[f"false_regression_{n}v{n}"] = null_n[Verdict.REGRESSION]
    for n in (2, 3, 5):
        out[f"smallest_80pct_{n}v{n}"] = smallest(draw, mean, n, trials, seed + 20 + n) if 2 * n <= max_n else None
    return out


# -- real runs ----------------------------------------------------------------------------------------------

def host_other(job: Path, start: float, end: float) -> float | None:
    """The host's other load over the window (percent of its CPU capacity): the time average of the samples'
    host rows, each standing for the sampler's period before it (as collect weighs them)."""
    rows = [r for p in job.glob("samples.*.csv") for r in csv.DictReader(p.open()) if r["kind"] == "host"]
    period = float(json.loads((job / "spec.json").read_text())["jobspec"]["runner"]["sample_interval_s"])
    num = den = 0.0
    for r in rows:
        t = float(r["t_wall"])
        w = max(0.0, min(t, end) - max(t - period, start))
        num, den = num + w * float(r["cpu_pct"]), den + w
    return num / den if den > 0 else None


def record(n: int, steps: int, batch: int, seq: int, threads: int) -> list[dict[str, Any]]:
    """*n* real runs of one point through ``launch.sh``, one after the other; each one's step times over its
    measured window (as collect reads them from ``rank.0.json``) and its host's other load over it."""
    from harness.build.render import render_points
    from harness.data.datagen import generate_dataset
    from harness.data.tinymodel import make_tiny_model
    from harness.spec.inventory import local_inventory
    from harness.spec.plan import plan_sweep
    from harness.spec.sweep import parse_sweep

    work = Path(tempfile.mkdtemp(prefix="sbench-compare-power-"))
    try:
        model = make_tiny_model(work / "model")
        gen = work / "gen" / f"{DATASET}.jsonl"
        generate_dataset(DATASET, gen, entries=max(64, batch * steps))
        data = work / "data"
        data.mkdir()
        shutil.copy(gen, data / gen.name)  # no sidecar: used as is
        inv = local_inventory()
        host = next(iter(next(iter(inv.partitions.values())).hosts))
        traces = []
        for i in range(n):
            doc = {"campaign": "compare-power", "experiment": "finetune_full_benchmark-v1.0.0",
                   "entity": {"model_name": "tiny", "model_max_length": seq, "dataset_id": DATASET, "number_gpus": 1,
                              "batch_size": batch, "max_steps": steps, "gradient_accumulation_steps": 1},
                   "model_map": {"tiny": str(model)}, "data_dir": str(data), "runner": {"sample_interval_s": 0.25}}
            sweep = parse_sweep(doc, "<compare_power>", work)
            (spec,) = render_points(sweep, inv, plan_sweep(sweep, inv), work / f"run{i}")
            job = Path(spec.job_dir)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBENCH_"))}
            env.update({"SBENCH_HOST": host, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads)})
            proc = subprocess.run(["bash", str(job / "launch.sh")], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"run {i} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            r0 = json.loads((job / "rank.0.json").read_text())
            start, end = float(r0["train_start_wall"]), float(r0["train_end_wall"])
            d = step_durations(r0, start, end)
            other = host_other(job, start, end)
            traces.append({"steps": d, "host_other_cpu_pct": other})
            print(f"recorded run {i}: {len(d)} steps, mean {sum(d) / len(d):.4f} s, host's other load "
                  f"{'?' if other is None else f'{other:.0f} %'}, load average {os.getloadavg()[0]:.2f}", flush=True)
        return traces
    finally:
        shutil.rmtree(work, ignore_errors=True)


def markdown(results: dict[str, dict[str, Any]], trials: int) -> str:
    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f} %"

    def times(v: Any) -> str:
        return "-" if v is None else f"{v:g}x"

    head = ("| traces | false regressions 2v2 | any flag 2v2 | 2x uniform 2v2 | 2x stalls every 3rd 2v2 | "
            "2x stalls every 6th 2v2 | smallest at 80 %: 2v2 / 3v3 / 5v5 |")
    lines = [head, "|" + "---|" * 7]
    for name, r in results.items():
        lines.append(f"| {name} | {pct(r['false_regression_2v2'])} | {pct(r['false_flag_2v2'])} | "
                     f"{pct(r['detect_2x_uniform_2v2'])} | {pct(r['detect_2x_stalls_k3_2v2'])} | "
                     f"{pct(r['detect_2x_stalls_k6_2v2'])} | {times(r['smallest_80pct_2v2'])} / "
                     f"{times(r['smallest_80pct_3v3'])} / {times(r['smallest_80pct_5v5'])} |")
    lines.append(f"\n{trials} trials per cell; threshold {THRESHOLD:.0%}; 'NvN': N runs a side.")
    return "\n".join(lines)


def blend_spread(values: Sequence[float], within: Sequence[tuple[float, int]] = ()) -> Any:
    """The *blend* variant of :func:`harness.contract.stats.side_spread` (see the module's docstring)."""
    import statistics

    from harness.contract.stats import SideSpread

    n = len(values)
    s2 = statistics.variance(values)
    if len(within) != n or not all(m >= 2 for _, m in within):
        return SideSpread(s2, float(n - 1), "runs")
    w2 = statistics.fmean(v for v, _ in within)
    df_w = float(sum(m - 1 for _, m in within))
    t2 = max(0.0, s2 - w2)
    v = t2 + w2
    return SideSpread(v, v * v / (t2 * t2 / (n - 1) + w2 * w2 / df_w), "steps" if t2 == 0 else "runs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=1000, help="trials per cell (default 1000)")
    ap.add_argument("--steps", type=int, default=16, help="steps per run, synthetic and recorded (default 16)")
    ap.add_argument("--record", type=int, default=12, help="real runs to record when no --traces (default 12)")
    ap.add_argument("--traces", type=Path, default=None, help="real step times written by an earlier run (--save)")
    ap.add_argument("--save", type=Path, default=None, help="write the recorded step times here")
    ap.add_argument("--no-real", action="store_true", help="synthetic traces only")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64, help="model_max_length of the recorded runs (default 64)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    ap.add_argument("--variant", choices=("compare", "blend"), default="compare",
                    help="compare's method (default) or the blend it was weighed against")
    args = ap.parse_args()
    if args.variant == "blend":
        from harness.contract import stats

        stats.side_spread = blend_spread  # welch() looks it up in its module at each call

    sources: dict[str, tuple[Draw, float, int]] = {}
    for cv, tau in ((0.1, 0.0), (0.3, 0.0), (0.1, 0.05), (0.3, 0.1)):
        draw, mean = synthetic(args.steps, cv, tau)
        sources[f"synthetic cv={cv} tau={tau}"] = (draw, mean, 10**9)
    runs: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    if not args.no_real:
        if args.traces:
            doc = json.loads(args.traces.read_text())
            runs, meta = doc["traces"], doc.get("meta", {})
            runs = [r if isinstance(r, dict) else {"steps": r, "host_other_cpu_pct": None} for r in runs]
        else:
            t0 = time.time()
            runs = record(args.record, args.steps, args.batch, args.seq, args.threads)
            meta = {"runs": len(runs), "steps": args.steps, "batch": args.batch, "seq": args.seq,
                    "threads": args.threads, "recorded_s": round(time.time() - t0, 1), "load_avg": os.getloadavg()}
            if args.save:
                args.save.write_text(json.dumps({"meta": meta, "traces": runs}))
        real = [r["steps"] for r in runs]
        means = sorted(sum(t) / len(t) for t in real)
        meta["run_mean_step_s"] = {"min": means[0], "median": means[len(means) // 2], "max": means[-1]}
        draw, mean = pooled(real)
        sources[f"real runs, all {len(real)} recorded"] = (draw, mean, len(real))
        quiet = [r["steps"] for r in runs if r.get("host_other_cpu_pct") is not None
                 and r["host_other_cpu_pct"] <= 100 * HOST_BUSY_CPU]
        meta["quiet_runs"] = len(quiet)
        if len(quiet) >= 4:
            draw, mean = pooled(quiet)
            sources[f"real runs compare keeps ({len(quiet)} of {len(real)})"] = (draw, mean, len(quiet))
        draw, mean = blocks(real, args.steps)
        sources["real steps, block-resampled"] = (draw, mean, 10**9)
    results = {}
    for name, (draw, mean, max_n) in sources.items():
        t0 = time.time()
        results[name] = table(draw, mean, args.trials, args.seed, max_n)
        print(f"{name}: {json.dumps(results[name])} ({time.time() - t0:.0f} s)", flush=True)
    report = {"trials": args.trials, "steps": args.steps, "threshold": THRESHOLD, "variant": args.variant,
              "real": meta, "results": results}
    print(markdown(results, args.trials))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
