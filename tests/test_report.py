"""sbench report: synthetic job dirs -> the real collect -> the HTML page, checked as text and as pixels.

The campaign is written with harness.collect.synth's file writers in the job-directory format, so the
database the report reads is the one collect really builds (measurements, OOM runs, stage times,
samples). Expected counts come from the rows each test wrote, not from the report's own queries.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path
from typing import Any

import duckdb
import pytest

from harness.collect import collect
from harness.contract.paths import JobPaths, job_dir_name
from harness.slurm.client import Slurm
from harness.spec.plan import point_id as make_point_id
from tests import synth

LORA, FULL = "finetune_lora_benchmark-v1.0.0", "finetune_full_benchmark-v1.0.0"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


class FakeSacct:
    """Answers sacct for the job ids it was given: job id -> (state, elapsed seconds). The jobs ran on node1 one
    after the other, the i-th given in the i-th hour from 2025-11-22 (no host shared)."""

    def __init__(self, jobs: dict[str, tuple[str, int]]) -> None:
        self.jobs = jobs

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] != "sacct":
            return subprocess.CompletedProcess(argv, 0, "", "")
        lines = []
        for j in argv[argv.index("-j") + 1].split(","):
            if j not in self.jobs:
                continue
            state, secs = self.jobs[j]
            code = "0:0" if state == "COMPLETED" else "1:0"
            start = dt.datetime(2025, 11, 22) + dt.timedelta(hours=list(self.jobs).index(j))
            end = start + dt.timedelta(seconds=secs)
            for jid in (j, f"{j}.0"):
                lines.append(f"{jid}|{state}|{code}|00:{secs // 60:02d}:{secs % 60:02d}|1048576K|node1|"
                             f"{start.isoformat()}|{end.isoformat()}")
        return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")


DEVICE_MB = 81920.0


def gpu_memory(model: str, experiment: str) -> tuple[float, float]:
    """(MB at rest, MB per sample of per-device batch): full fine-tuning of the bigger model needs most."""
    return {("granite", FULL): (34000, 6200), ("granite", LORA): (12000, 2600)}.get(
        (model.split("-")[0], experiment), (4000, 1500))


def _samples(t0: float, ticks: int, gpus: int, bs: int, rnd: random.Random, train0: float,
             mem: tuple[float, float] = (9000, 4200)) -> list[dict[str, Any]]:
    """GPU rows that ramp up at training start (memory: base + per-sample x the per-device batch) and one
    process row a tick."""
    rows = []
    per_dev = bs / max(gpus, 1)
    for i in range(ticks):
        t = t0 + i
        training = t >= train0
        for d in range(gpus):
            rows.append({"t_wall": t, "t_mono": t - synth.T0 + 5000.0, "kind": "gpu", "device": d,
                         "gpu_util": round(rnd.uniform(70, 98) if training else rnd.uniform(0, 8), 1),
                         "mem_used_mb": round((mem[0] + mem[1] * per_dev if training else 3000)
                                              * rnd.uniform(0.97, 1.0), 1),
                         "mem_total_mb": DEVICE_MB, "power_w": round(rnd.uniform(250, 390) if training else 70, 1),
                         "power_limit_w": 400.0})
        rows.append({"t_wall": t, "t_mono": t - synth.T0 + 5000.0, "kind": "proc", "device": -1,
                     "cpu_pct": round(rnd.uniform(90, 180) if training else rnd.uniform(20, 60), 1),
                     "mem_pct": round(2 + 0.15 * bs + rnd.uniform(0, 0.3), 2), "rss_mb": round(3000 + 60 * bs, 1),
                     "nprocs": gpus + 1})
    return rows


def write_run(workdir: Path, campaign: str, experiment: str, model: str, gpus: int, bs: int, *, repeat: int = 0,
              outcome: str = "ok", ticks: int = 30, gpu_sampled: bool = True, seed: int = 0) -> dict[str, Any]:
    """One attempt's job dir in the job-directory format: ok, invalid (GPU OOM) or failed (TIMEOUT)."""
    rnd = random.Random(seed)
    ent = synth.entity_for(experiment, model_name=model, number_gpus=gpus, number_nodes=1, batch_size=bs,
                           model_max_length=1024)
    pid = make_point_id(experiment, ent)
    job_dir = workdir / campaign / job_dir_name(pid, repeat, 1)
    paths = JobPaths(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    synth.write_spec(paths, campaign, pid, repeat, 1, experiment, ent, 1, gpus)
    jid = f"{7000 + seed}"
    host, t0 = "node1", synth.T0
    tr0 = t0 + 4 + rnd.uniform(0, 2)  # dataset, tokens and model load take a few seconds
    tr1 = t0 + ticks - 3
    warm = tr0 + 4 if repeat == 0 else None
    stop = tr0 + 6 if outcome == "invalid" else (tr0 + 8 if outcome == "failed" else tr1)
    ev = [synth.stage_event("start", "setup", host, t0), synth.stage_event("end", "setup", host, t0 + 0.6)]
    for r in range(gpus):
        ev += [synth.stage_event("start", "dataset", host, t0 + 0.6, r),
               synth.stage_event("end", "dataset", host, t0 + 1.4, r),
               synth.stage_event("start", "tokens", host, t0 + 1.4, r),
               synth.stage_event("end", "tokens", host, t0 + 2.2, r),
               synth.stage_event("start", "model_load", host, t0 + 2.2, r),
               synth.stage_event("end", "model_load", host, tr0 - 0.1, r),
               synth.stage_event("start", "train", host, tr0, r)]
        if outcome == "ok":
            ev.append(synth.stage_event("end", "train", host, tr1, r, info={"global_step": 20}))
        elif outcome == "invalid":
            ev.append(synth.stage_event("end", "train", host, stop, r, status="error", error="CUDA out of memory"))
    if outcome != "failed":
        ev += [synth.stage_event("start", "teardown", host, stop + 0.2),
               synth.stage_event("end", "teardown", host, stop + 0.9)]
    synth.write_stages(paths, host, ev)
    rows = _samples(t0, int(stop - t0) + 1, gpus if gpu_sampled else 0, bs, rnd, tr0, gpu_memory(model, experiment))
    synth.write_samples(paths, host, rows)
    synth.write_json(paths.root / f"environment.{host}.json",
                     synth.environment_doc(host, 0, gpus if gpu_sampled else 0))
    tps = 900.0 * bs ** 0.7 * (1.6 if experiment == LORA else 1.0) * (0.5 if model.startswith("granite") else 1.0)
    if outcome == "ok":
        res = synth.result_doc(host, 0, t0, tr1 + 1, samples=len(rows))
        for r in range(gpus):
            rd = synth.rank_doc(r, host, gpus, tr0, tr1, tps=tps, warmup_end=warm,
                                dataset_tokens_per_second=tps * gpus * rnd.uniform(0.95, 1.05))
            synth.write_json(paths.rank_result(r), rd)
            if r == 0:
                res["training"] = rd
        synth.write_json(paths.result(host), res)
    elif outcome == "invalid":
        synth.write_json(paths.result(host), synth.result_doc(host, 0, t0, stop + 1, outcome="invalid",
                                                              reason="GPU out of memory", exit_code=1))
        synth.write_json(paths.error(0), {"rank": 0, "host": host, "kind": "invalid",
                                          "error_type": "torch.OutOfMemoryError",
                                          "message": "CUDA out of memory. Tried to allocate 4.00 GiB", "stage": "train",
                                          "trial": None, "t_wall": stop})
    events = [{"type": "point", "campaign": campaign, "point_id": pid, "repeat": repeat, "experiment": experiment,
               "entity": ent, "valid": True, "reasons": [], "notes": []},
              {"type": "attempt", "campaign": campaign, "point_id": pid, "repeat": repeat, "attempt": 1,
               "job_dir": str(job_dir), "executor": "slurm", "job_id": jid, "array_job_id": None,
               "array_task_id": None, "submitted_at": "2025-11-21T23:59:30+00:00", "reason": "new"}]
    synth.append_manifest(workdir, campaign, events)
    return {"run_id": f"{campaign}/{pid}.r{repeat}.a1", "job_id": jid, "outcome": outcome,
            "sacct": ({"ok": "COMPLETED", "invalid": "FAILED", "failed": "TIMEOUT"}[outcome], int(stop - t0) + 2)}


def build_campaign(workdir: Path, campaign: str = "scan", *, models=("smollm2-135m", "granite-3b-1.5"),
                   gpu_counts=(1,), batch_sizes=(2, 4, 8), ticks: int = 30, gpu_sampled: bool = True,
                   extras: bool = True, created_at: str | None = None, references: list[dict[str, Any]] | None = None,
                   seed: int = 0) -> list[dict[str, Any]]:
    """A batch-size scan: models x {lora, full} x GPUs x batch sizes. Runs whose modelled GPU memory
    exceeds the device run out of it (invalid; with the defaults: granite full at batch 8); with
    *extras*, one point gets a second repeat and one run times out (failed: no measurement). *created_at*
    and *references* go into the campaign's manifest line; *seed* offsets the job ids (one per campaign)."""
    event = synth.manifest_events(campaign, LORA)
    event.update({k: v for k, v in (("created_at", created_at), ("references", references)) if v is not None})
    synth.append_manifest(workdir, campaign, [event])
    runs = []
    for model in models:
        for exp in (LORA, FULL):
            for g in gpu_counts:
                for bs in batch_sizes:
                    seed += 1
                    base, per_sample = gpu_memory(model, exp)
                    oom = gpu_sampled and base + per_sample * bs / g > DEVICE_MB
                    runs.append(write_run(workdir, campaign, exp, model, g, bs, outcome="invalid" if oom else "ok",
                                          ticks=ticks, gpu_sampled=gpu_sampled, seed=seed))
    if extras:
        runs.append(write_run(workdir, campaign, LORA, models[0], gpu_counts[0], batch_sizes[0], repeat=1,
                              ticks=ticks + 20, gpu_sampled=gpu_sampled, seed=seed + 1))
        runs.append(write_run(workdir, campaign, FULL, models[0], gpu_counts[0], batch_sizes[-1], repeat=1,
                              outcome="failed", ticks=ticks, gpu_sampled=gpu_sampled, seed=seed + 2))
    return runs


def collect_into(db: Path, workdir: Path, runs: list[dict[str, Any]]) -> None:
    rep = collect(db, workdir, slurm=Slurm(FakeSacct({r["job_id"]: r["sacct"] for r in runs})))
    expected: dict[str, int] = {}
    for r in runs:
        expected[r["outcome"]] = expected.get(r["outcome"], 0) + 1
    assert rep.outcomes == expected, (rep.outcomes, rep.warnings)


def sql(db: Path, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(query, params or []).fetchall()
    finally:
        con.close()


def section(page: str, name: str) -> str:
    m = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert m, f"no section {name}"
    return m.group(1)


def svgs(text: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", text, re.S)


# -- fixtures ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    base = tmp_path_factory.mktemp("report-gpu")
    runs = build_campaign(base / "runs")
    db = base / "results.duckdb"
    collect_into(db, base / "runs", runs)
    return db, runs


@pytest.fixture(scope="module")
def cpu_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    base = tmp_path_factory.mktemp("report-cpu")
    runs = build_campaign(base / "runs", "cpu-demo", models=("tiny",), gpu_counts=(1, 2), batch_sizes=(4, 8),
                          gpu_sampled=False, extras=False)
    db = base / "results.duckdb"
    collect_into(db, base / "runs", runs)
    return db, runs


@pytest.fixture(scope="module")
def gpu_page(gpu_db, tmp_path_factory) -> tuple[str, Path]:
    from click.testing import CliRunner

    from harness.cli import main

    out = tmp_path_factory.mktemp("page") / "report.html"
    res = CliRunner().invoke(main, ["report", "--db", str(gpu_db[0]), "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out.read_text(), out


# -- the page ------------------------------------------------------------------------------------------------
def test_report_command_writes_the_page_and_says_what_it_holds(cli, gpu_db, tmp_path):
    db, runs = gpu_db
    out = tmp_path / "r.html"
    res = cli("report", "--db", db, "-o", out)
    assert res.exit_code == 0
    n_meas = sql(db, "SELECT count(*) FROM measurements")[0][0]
    longest = sql(db, "SELECT run_id FROM runs WHERE outcome = 'ok' ORDER BY elapsed_s DESC, run_id LIMIT 1")[0][0]
    assert res.output == (f"wrote {out}: campaign scan: {len(runs)} runs, {n_meas} measurements; "
                          f"utilisation of {longest}\n")
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_page_is_self_contained(gpu_page):
    page, _ = gpu_page
    assert re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I) == []
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert "url(" not in page  # no fonts or images fetched from CSS


def test_header_counts_runs_by_outcome(gpu_page, gpu_db):
    page, _ = gpu_page
    counts = dict(sql(gpu_db[0], "SELECT outcome, count(*) FROM runs GROUP BY 1"))
    assert counts == {"ok": 12, "invalid": 1, "failed": 1}
    for outcome, n in counts.items():
        assert f'<span class="c-{outcome}"><b>{n}</b> {outcome}</span>' in page
    assert "<b>scan</b> (finetune_lora_benchmark-v1.0.0, slurm, partition a100)" in page
    assert re.search(r"generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)


def test_throughput_plots_one_marker_per_valid_measurement_and_a_line_per_series(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "throughput")
    (svg,) = svgs(sec)
    n_valid = sql(gpu_db[0], "SELECT count(*) FROM measurements WHERE is_valid AND dataset_tokens_per_second "
                             "IS NOT NULL")[0][0]
    assert n_valid == 12 and svg.count('class="pt"') == n_valid
    assert svg.count('class="oom"') == 1
    # 2 models x 2 methods x 1 GPU count: four lines; the granite full line has two points (bs 8 was OOM)
    traces = re.findall(r'<polyline class="trace" data-n="(\d+)"', svg)
    assert sorted(map(int, traces)) == [2, 3, 3, 3]
    assert "batch size (log2 scale)" in svg
    for name in ("smollm2-135m · lora · 1 GPU", "granite-3b-1.5 · full · 1 GPU", "OOM (invalid run)"):
        assert f"{name}</text>" in svg
    # the tallest marker is the highest throughput (SVG y grows downwards)
    best = sql(gpu_db[0], "SELECT run_id FROM measurements "
                          "ORDER BY dataset_tokens_per_second DESC NULLS LAST LIMIT 1")[0][0]
    pts = re.findall(r'<circle class="pt" cx="[\d.]+" cy="([\d.]+)"[^>]*><title>([^<]*)</title>', svg)
    assert min(pts, key=lambda p: float(p[0]))[1].endswith(best)


def test_memory_panels_mark_oom_runs_with_a_red_cross(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "memory")
    gpu_svg, proc_svg = svgs(sec)
    n_valid = sql(gpu_db[0], "SELECT count(*) FROM measurements WHERE is_valid")[0][0]
    assert gpu_svg.count('class="pt"') == n_valid and proc_svg.count('class="pt"') == n_valid
    ooms = re.findall(r'<path class="oom" d="[^"]+" stroke="(#[0-9a-f]+)"[^>]*><title>([^<]*)</title>', gpu_svg)
    oom_run = sql(gpu_db[0], "SELECT run_id FROM measurements WHERE NOT is_valid")[0][0]
    assert len(ooms) == 1 and ooms[0][0] == "#d62728"
    assert "granite-3b-1.5 · full · 1 GPU, batch 8" in ooms[0][1] and oom_run in ooms[0][1]
    assert "CUDA out of memory" in ooms[0][1]
    assert "No GPUs were sampled" not in page


def test_stage_breakdown_has_one_bar_per_run_with_stages(gpu_page, gpu_db):
    page, _ = gpu_page
    (svg,) = svgs(section(page, "stages"))
    runs_with_stages = sql(gpu_db[0], "SELECT count(DISTINCT run_id) FROM stages")[0][0]
    assert runs_with_stages == 14
    assert len(re.findall(r'<text class="rowlabel', svg)) == runs_with_stages
    per_stage = dict(sql(gpu_db[0], "SELECT stage, count(DISTINCT run_id) FILTER (WHERE status <> 'incomplete') "
                                    "FROM stages GROUP BY 1"))
    assert per_stage == {"setup": 14, "dataset": 14, "tokens": 14, "model_load": 14, "train": 13, "teardown": 13}
    for stage, n in per_stage.items():
        assert svg.count(f'data-seg="{stage}"') == n, stage
    assert '<text class="rowlabel invalid"' in svg and '<text class="rowlabel failed"' in svg
    # the timed-out run died in training: an unfinished train segment, up to its last sample, shorter
    # than every ok run's train segment
    (unfinished,) = re.findall(r'<text class="rowlabel failed".*?data-seg="train \(unfinished\)" x="[\d.]+" '
                               r'y="\d+" width="([\d.]+)"', svg)
    ok = re.findall(r'<text class="rowlabel ok".*?data-seg="train" x="[\d.]+" y="\d+" width="([\d.]+)"', svg)
    assert len(ok) == 12 and float(unfinished) < min(map(float, ok))
    assert "train (unfinished)</text>" in svg  # in the legend


def test_utilisation_defaults_to_the_longest_ok_run_and_shades_its_windows(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "utilisation")
    longest = sql(gpu_db[0], "SELECT run_id FROM runs WHERE outcome = 'ok' ORDER BY elapsed_s DESC LIMIT 1")[0][0]
    assert longest.endswith(".r1.a1")  # the extra repeat ran longest
    assert f"Run <code>{longest}</code>" in sec and "the longest ok run" in sec
    util, mem, cpu = svgs(sec)
    n_gpu = sql(gpu_db[0], "SELECT count(*) FROM samples WHERE run_id = ? AND kind = 'gpu'", [longest])[0][0]
    n_proc = sql(gpu_db[0], "SELECT count(*) FROM samples WHERE run_id = ? AND kind = 'proc'", [longest])[0][0]
    assert sum(map(int, re.findall(r'data-n="(\d+)"', util))) == n_gpu == 48
    assert sum(map(int, re.findall(r'data-n="(\d+)"', cpu))) == n_proc == 48
    assert "measured window" in util and 'class="band"' in cpu
    # repeat 1 runs have no warm-up; repeat 0 runs do
    assert "warm-up" not in util


def test_run_option_picks_the_run_and_shows_its_warmup(cli, gpu_db, tmp_path):
    db, runs = gpu_db
    run = next(r for r in runs if r["outcome"] == "ok" and ".r0." in r["run_id"])
    out = tmp_path / "r.html"
    assert cli("report", "--db", db, "--run", run["run_id"], "-o", out).exit_code == 0
    sec = section(out.read_text(), "utilisation")
    assert f"Run <code>{run['run_id']}</code>" in sec and "chosen with --run" in sec
    assert sec.count("<title>warm-up</title>") == 3 and sec.count("<title>measured window</title>") == 3


def test_latest_table_has_one_row_per_measured_point(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "latest")
    points = sql(gpu_db[0], "SELECT count(DISTINCT point_id) FROM measurements")[0][0]
    assert points == 12 and sec.count("<tr class=") == points  # 13 measurements: one point has 2
    assert sec.count('<tr class="oom">') == 1
    # the point measured twice says so
    assert re.search(r'<td class="n">2</td><td>[^<]*</td><td>scan/[0-9a-f]{16}\.r1\.a1</td></tr>', sec)


def test_cpu_only_database_says_no_gpu_was_sampled(cli, cpu_db, tmp_path):
    db, runs = cpu_db
    out = tmp_path / "cpu.html"
    assert cli("report", "--db", db, "-o", out).exit_code == 0
    page = out.read_text()
    assert "No GPUs were sampled" in page
    assert sql(db, "SELECT DISTINCT gpu_memory_utilization_peak FROM measurements") == [(0.0,)]
    gpu_svg, proc_svg = svgs(section(page, "memory"))
    # the zeros are plotted, all on the x axis, and process memory is beside them
    cys = set(re.findall(r'<circle class="pt" cx="[\d.]+" cy="([\d.]+)"', gpu_svg))
    assert len(re.findall(r'class="pt"', gpu_svg)) == len(runs) and len(cys) == 1
    assert proc_svg.count('class="pt"') == len(runs)
    util = section(page, "utilisation")
    assert util.count("No data: no GPU samples for this run (no GPU was sampled)") == 2
    assert len(svgs(util)) == 1  # the process CPU panel


def test_campaign_option_filters_and_unknown_names_are_input_errors(cli, gpu_db, tmp_path):
    db, _ = gpu_db
    res = cli("report", "--db", db, "--campaign", "nope", "-o", tmp_path / "x.html")
    assert res.exit_code == 2
    assert res.output == f"Error: --campaign 'nope': not in {db}; campaigns there: scan\n"
    assert not (tmp_path / "x.html").exists()
    res = cli("report", "--db", db, "--run", "scan/nope.r0.a1", "-o", tmp_path / "x.html")
    assert res.exit_code == 2 and "Error: --run 'scan/nope.r0.a1': no such run in" in res.output
    assert cli("report", "--db", db, "--campaign", "scan", "-o", tmp_path / "y.html").exit_code == 0
    assert "<title>sbench report — scan</title>" in (tmp_path / "y.html").read_text()


def test_missing_and_empty_databases_are_clear_errors(cli, tmp_path):
    res = cli("report", "--db", tmp_path / "none.duckdb", "-o", tmp_path / "x.html")
    assert res.exit_code == 2
    assert res.output == (f"Error: {tmp_path / 'none.duckdb'}: no results database here; run `sbench collect` "
                          f"first (or pass --db)\n")
    from harness.db.store import open_store

    open_store(tmp_path / "empty.duckdb").close()  # schema, no rows
    res = cli("report", "--db", tmp_path / "empty.duckdb", "-o", tmp_path / "x.html")
    assert res.exit_code == 1
    assert res.output.startswith(f"Error: {tmp_path / 'empty.duckdb'} has no runs: nothing to report.")
    (tmp_path / "junk.duckdb").write_text("not a database\n")
    res = cli("report", "--db", tmp_path / "junk.duckdb", "-o", tmp_path / "x.html")
    # A file that is no DuckDB database is the user's --db mistake, said before DuckDB sees it.
    assert res.exit_code == 2 and res.output.startswith(f"Error: {tmp_path / 'junk.duckdb'}: is not a DuckDB database")
    assert not (tmp_path / "x.html").exists()


def test_help_has_an_example_and_dash_writes_to_stdout(cli, gpu_db, weird_tmp_path):
    res = cli("report", "--help")
    assert res.exit_code == 0 and "Example: sbench report " in res.output and "--run RUN_ID" in res.output
    res = cli("report", "--db", gpu_db[0], "-o", "-")
    assert res.exit_code == 0 and res.output.startswith("<!DOCTYPE html>") and res.output.rstrip().endswith("</html>")
    # a DB and an output path with spaces, quotes and $ work, and the path shown on the page is escaped
    db = weird_tmp_path / "r <b>.duckdb"
    shutil.copy(gpu_db[0], db)
    out = weird_tmp_path / "o.html"
    assert cli("report", "--db", db, "-o", out).exit_code == 0
    page = out.read_text()
    assert "r &lt;b&gt;.duckdb" in page and "r <b>.duckdb" not in page


# -- the chart functions -----------------------------------------------------------------------------------
def test_line_chart_scales_log2_and_pins_missing_values_to_the_top():
    from harness.report.charts import Series, line_chart

    svg = line_chart([Series("a", [(1, 0.0, "lo"), (16, 50.0, "hi")], "#123456"),
                      Series("oom", [(32, None, "boom")], "#d62728", marker="x", line=False, css="oom")],
                     x_label="batch", y_label="v", log2_x=True, y_range=(0.0, 100.0))
    assert [t for t in re.findall(r'<text class="tick[^"]*"[^>]*>([^<]+)</text>', svg)] == [
        "0", "20", "40", "60", "80", "100", "1", "2", "4", "8", "16", "32"]
    cx = {tip: float(x) for x, tip in re.findall(r'cx="([\d.]+)"[^>]*><title>(\w+)</title>', svg)}
    ticks = {t: float(x) for x, t in re.findall(r'<text class="tick xtick" data-x="\d+" x="([\d.]+)" '
                                                r'y="2\d\d[.\d]*" text-anchor="middle">(\d+)</text>', svg)}
    assert cx["lo"] == ticks["1"] and cx["hi"] == ticks["16"]
    assert ticks["2"] - ticks["1"] == pytest.approx(ticks["16"] - ticks["8"], abs=0.2)  # equal steps per doubling
    cy = dict((tip, float(y)) for y, tip in re.findall(r'cy="([\d.]+)"[^>]*><title>(\w+)</title>', svg))
    top = float(re.search(r'<path class="axis" d="M[\d.]+,([\d.]+)V', svg).group(1))
    oom_y = float(re.search(r'<path class="oom" d="M[\d.]+,([\d.]+)', svg).group(1)) + 4.5
    assert cy["lo"] > cy["hi"] > top and abs(oom_y - top) < 10


def test_empty_charts_are_no_data_panels():
    from harness.report.charts import bar_chart, line_chart

    assert line_chart([], x_label="x", y_label="y", empty="nothing here") == (
        '<div class="nodata">No data: nothing here</div>')
    assert bar_chart([("run", [], "ok")], {}, x_label="s", empty="no stages") == (
        '<div class="nodata">No data: no stages</div>')


def test_a_campaign_without_measurements_gets_no_data_panels(tmp_path, cli):
    wd = tmp_path / "runs"
    runs = [write_run(wd, "broken", LORA, "smollm2-135m", 1, 4, outcome="failed", seed=1)]
    synth.append_manifest(wd, "broken", [synth.manifest_events("broken", LORA)])
    collect_into(tmp_path / "r.duckdb", wd, runs)
    out = tmp_path / "r.html"
    assert cli("report", "--db", tmp_path / "r.duckdb", "-o", out).exit_code == 0
    page = out.read_text()
    # plots 1, 2 (GPU and process), the table, no fabric run, and in the hosts section no rank score, no preflight
    assert page.count('<div class="nodata">') == 7
    assert "no rank scores yet" in section(page, "hosts") and "no preflight yet" in section(page, "hosts")
    assert "no fabric run yet" in section(page, "fabric")
    assert "No data: no measurement with dataset_tokens_per_second" in section(page, "throughput")
    assert "No data: no measurements in this selection" in section(page, "latest")
    assert len(svgs(section(page, "stages"))) == 1  # the failed run still has stage times
    util = section(page, "utilisation")  # and samples until it died
    assert f"Run <code>{runs[0]['run_id']}</code>" in util and "no ok run: the run with the most samples" in util
    assert len(svgs(util)) == 3


# -- the page as pixels ----------------------------------------------------------------------------------------
def png_pixels(data: bytes) -> tuple[int, int, set[bytes]]:
    """Width, height and the distinct pixel values of an 8-bit RGB/RGBA PNG (no Pillow)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * bpp
    prev, values = bytearray(stride), set()
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        values.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp * 7))  # every 7th pixel
        prev = line
    return width, height, values


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_page_renders_in_a_real_browser(gpu_page, tmp_path):
    _, html_path = gpu_page
    png = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1400,2600", f"--screenshot={png}", html_path.as_uri()],
            capture_output=True, text=True, timeout=120)
    assert png.exists(), proc.stderr[-2000:]
    width, height, values = png_pixels(png.read_bytes())
    assert (width, height) == (1400, 2600)
    # a blank or error page has a handful of colours; plots, anti-aliased text and the table have many
    assert len(values) > 200, len(values)
    assert bytes.fromhex("d62728") in values or any(v[0] > 200 and v[1] < 80 and v[2] < 80 for v in values)


# -- one campaign by default -----------------------------------------------------------------------------------
OLDER, NEWER = "b-older", "a-newer"  # the newer sorts first by name: the page must go by creation time
NEWER_SIZES = (2, 3, 4, 6)  # not powers of two: a linear batch-size axis, where ticks fell at 2.5 and 3.5


@pytest.fixture(scope="module")
def two_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two campaigns of the same model, method and worker counts: the older at batch 2, 4, 8, the newer at
    2, 3, 4, 6 (two points in common), on 1 and 2 workers (CPU only); the newer declares references."""
    base = tmp_path_factory.mktemp("report-two")
    wd = base / "runs"
    runs = build_campaign(wd, OLDER, models=("tiny",), gpu_counts=(1, 2), batch_sizes=(2, 4, 8), gpu_sampled=False,
                          extras=False, created_at="2025-11-20T10:00:00+00:00")
    refs = [{"metric": "dataset_tokens_per_second", "value": 4000.0, "lower": 0.25, "upper": None, "unit": None,
             "where": {}, "order": 0}]
    runs += build_campaign(wd, NEWER, models=("tiny",), gpu_counts=(1, 2), batch_sizes=NEWER_SIZES,
                           gpu_sampled=False, extras=False, created_at="2025-11-22T10:00:00+00:00", references=refs,
                           seed=100)
    db = base / "results.duckdb"
    collect_into(db, wd, runs)
    return db


def render(cli, db: Path, out: Path, *args: Any) -> tuple[str, str]:
    res = cli("report", "--db", db, "-o", out, *args)
    assert res.exit_code == 0, res.output
    return out.read_text(), res.output


def marker_runs(svg: str) -> list[str]:
    """The run id in each valid-measurement marker's tooltip."""
    return re.findall(r'<circle class="pt"[^>]*><title>[^<]*\nrun ([^<\n]+)</title>', svg)


def x_ticks(svg: str) -> list[tuple[str, str]]:
    """(data-x value, label) of each x tick of one chart."""
    return re.findall(r'<text class="tick xtick" data-x="([^"]+)"[^>]*>([^<]*)</text>', svg)


def test_report_shows_the_latest_campaign_by_default_and_names_the_others(cli, two_db, tmp_path):
    page, said = render(cli, two_db, tmp_path / "r.html")
    newer_runs = {r for (r,) in sql(two_db, "SELECT run_id FROM measurements WHERE campaign = ? AND is_valid",
                                    [NEWER])}
    assert len(newer_runs) == 16 and sql(two_db, "SELECT count(*) FROM measurements WHERE campaign = ?",
                                         [OLDER])[0][0] == 12
    (svg,) = svgs(section(page, "throughput"))
    assert sorted(marker_runs(svg)) == sorted(newer_runs)  # one marker per newer measurement, none of the older
    assert OLDER + "/" not in page  # no run of the older campaign anywhere: plots, stages, tables
    # a line per method x worker count, each through the newer campaign's batch sizes only
    assert sorted(map(int, re.findall(r'<polyline class="trace" data-n="(\d+)"', svg))) == [4, 4, 4, 4]
    assert f"<title>sbench report — {NEWER}</title>" in page
    assert "the latest campaign by creation time" in page
    assert f"<b>{OLDER}</b> (created 2025-11-20 10:00, 12 runs): <code>sbench report --db {two_db} --campaign " \
           f"{OLDER}</code>" in page
    assert f"sbench report --db {two_db} --all-campaigns" in page
    n_runs = sql(two_db, "SELECT count(*) FROM runs WHERE campaign = ?", [NEWER])[0][0]
    assert said.startswith(f"wrote {tmp_path / 'r.html'}: campaign {NEWER} (the latest of 2; the others: "
                           f"--campaign NAME or --all-campaigns): {n_runs} runs, 16 measurements; ")
    # the checks are the shown campaign's
    assert f"<h3>{NEWER}: " in section(page, "checks")


def test_campaign_option_shows_that_campaign_and_all_campaigns_every_one_by_line(cli, two_db, tmp_path):
    page, _ = render(cli, two_db, tmp_path / "old.html", "--campaign", OLDER)
    (svg,) = svgs(section(page, "throughput"))
    older_runs = [r for (r,) in sql(two_db, "SELECT run_id FROM measurements WHERE campaign = ?", [OLDER])]
    assert sorted(marker_runs(svg)) == sorted(older_runs) and NEWER + "/" not in page
    assert "chosen with --campaign" in page and f"--campaign {NEWER}</code>" in page
    assert 'id="checks"' not in page  # the older campaign declares no references

    page, said = render(cli, two_db, tmp_path / "all.html", "--all-campaigns")
    (svg,) = svgs(section(page, "throughput"))
    assert len(marker_runs(svg)) == sql(two_db, "SELECT count(*) FROM measurements")[0][0] == 28
    # a line per campaign x method x worker count, each named with its campaign
    assert sorted(map(int, re.findall(r'<polyline class="trace" data-n="(\d+)"', svg))) == [3] * 4 + [4] * 4
    for camp in (OLDER, NEWER):
        for n in ("1 worker", "2 workers"):
            assert f"<title>{camp} · tiny · lora · {n}</title>" in svg
    latest = section(page, "latest")  # the points both measured: a row per campaign
    assert latest.count("<tr class=") == 28 and "<th>campaign</th>" in latest
    assert said.startswith(f"wrote {tmp_path / 'all.html'}: 2 campaigns: ")
    assert "<title>sbench report — every campaign</title>" in page

    res = cli("report", "--db", two_db, "--campaign", OLDER, "--all-campaigns", "-o", tmp_path / "x.html")
    assert res.exit_code == 2 and "--campaign and --all-campaigns: give one of them" in res.output
    assert not (tmp_path / "x.html").exists()


def test_run_option_without_campaign_shows_the_runs_campaign(cli, two_db, tmp_path):
    run = sql(two_db, "SELECT run_id FROM runs WHERE campaign = ? AND outcome = 'ok' ORDER BY run_id LIMIT 1",
              [OLDER])[0][0]
    page, said = render(cli, two_db, tmp_path / "r.html", "--run", run)
    assert f"<title>sbench report — {OLDER}</title>" in page and "the campaign of --run" in page
    assert f"Run <code>{run}</code>" in section(page, "utilisation") and NEWER + "/" not in page
    assert f"campaign {OLDER} (the campaign of --run)" in said


# -- axes, labels, tables ---------------------------------------------------------------------------------------
def test_batch_size_axes_tick_at_the_batch_sizes_measured(cli, two_db, gpu_page, tmp_path):
    page, _ = render(cli, two_db, tmp_path / "r.html")
    for sid in ("throughput", "memory"):
        for svg in svgs(section(page, sid)):
            assert "batch size</text>" in svg  # linear: 3 and 6 are no powers of two
            ticks = x_ticks(svg)
            assert [v for v, _ in ticks] == [str(b) for b in NEWER_SIZES]  # never 2.5 or 3.5
            assert all(label == v for v, label in ticks)
    gpu_sizes = sorted({b for (b,) in sql(gpu_page_db(gpu_page), "SELECT batch_size FROM measurements")})
    (svg,) = svgs(section(gpu_page[0], "throughput"))
    assert "batch size (log2 scale)" in svg and [int(v) for v, _ in x_ticks(svg)] == gpu_sizes == [2, 4, 8]


def gpu_page_db(gpu_page: tuple[str, Path]) -> Path:
    m = re.search(r"Database <code>([^<]+)</code>", gpu_page[0])
    assert m
    return Path(m.group(1))


def test_nice_ticks_can_be_whole_numbers_only():
    from harness.report.charts import nice_ticks

    assert 2.5 in nice_ticks(2, 6, 8)[0]  # the round ticks of a continuous axis
    for lo, hi in ((2, 6), (1, 3), (0, 7), (1, 100), (3, 3)):
        ticks, first, last = nice_ticks(lo, hi, 8, integer=True)
        assert ticks and all(float(t).is_integer() for t in ticks) and first <= lo and last >= hi, (lo, hi, ticks)


FABRIC_SIZES = [2 ** k for k in range(3, 29)]  # 8 B to 256 MiB: 26 sizes


@pytest.fixture(scope="module")
def fabric_db(gpu_db, tmp_path_factory) -> Path:
    """The GPU campaign's database plus one fabric run over FABRIC_SIZES."""
    from harness.db.cluster import record_fabric
    from harness.db.store import open_store

    db = tmp_path_factory.mktemp("report-fabric") / "f.duckdb"
    shutil.copy(gpu_db[0], db)
    rows = [{"fabric_id": "fab-1", "cluster": "c", "partition": "gpu", "nodes": 2, "world_size": 16, "backend": "nccl",
             "enable_roce": True, "op": op, "bytes": b, "iters": 5, "time_us": 10.0 + b / 1e4,
             "algbw_gbps": b / (10.0 + b / 1e4) / 1e3, "busbw_gbps": b / (10.0 + b / 1e4) / 1e3 * 1.5,
             "transport_by_host": '{"n1": "IB", "n2": "IB"}', "ok": True, "reason": None, "job_dir": "/jd",
             "measured_at": "2025-11-22T00:00:00+00:00"} for op in ("all_reduce", "all_gather") for b in FABRIC_SIZES]
    with open_store(db) as store:
        record_fabric(store, rows)
    return db


def test_fabric_sizes_read_as_human_sizes_and_their_labels_do_not_overlap(cli, fabric_db, tmp_path):
    from harness.report.charts import TICK_CHAR_PX, TICK_GAP_PX

    page, _ = render(cli, fabric_db, tmp_path / "r.html")
    panels = svgs(section(page, "fabric"))
    assert len(panels) == 2
    for svg in panels:
        ticks = x_ticks(svg)
        assert 4 <= len(ticks) < len(FABRIC_SIZES)  # thinned
        assert all(int(v) in FABRIC_SIZES for v, _ in ticks)
        for v, label in ticks:  # binary units: 1K is 1024 bytes
            n, unit = re.fullmatch(r"(\d+)([KMG]?)", label).groups()
            assert int(n) * {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}[unit] == int(v)
        assert {"1K", "1M"} <= {label for _, label in ticks}
        xs = [float(x) for x in re.findall(r'<text class="tick xtick" data-x="[^"]+" x="([\d.]+)"', svg)]
        labels = [label for _, label in ticks]
        for i in range(1, len(xs)):  # the space the labels are given; the browser test measures the glyphs
            assert xs[i] - xs[i - 1] >= TICK_CHAR_PX * (len(labels[i]) + len(labels[i - 1])) / 2 + TICK_GAP_PX
        assert "message size (log2 scale; 1K = 1024 bytes)" in svg


def test_every_table_has_the_shared_style(cli, two_db, gpu_page, tmp_path):
    from harness.report.page import CSS
    from harness.report.sections import TABLE_CLASS, memory_section

    page, _ = render(cli, two_db, tmp_path / "r.html")
    assert 'id="checks"' in page and "<table" in section(page, "checks")
    for p, n in ((page, 5), (gpu_page[0], 4)):
        tags = re.findall(r"<table\b[^>]*>", p)
        assert len(tags) == n  # the overhead, checks (two_db only), host health, points and attempts tables
        assert all(re.fullmatch(rf'<table class="{TABLE_CLASS}( [\w-]+)*">', t) for t in tags), tags
    assert f"table.{TABLE_CLASS} th,table.{TABLE_CLASS} td{{" in CSS
    # a failed check reads in red like an OOM row
    fails = sql(two_db, "SELECT count(*) FROM checks WHERE campaign = ? AND status = 'fail'", [NEWER])[0][0]
    assert fails > 0 and section(page, "checks").count('<tr class="fail">') == fails
    assert f"table.{TABLE_CLASS} tr.oom td,table.{TABLE_CLASS} tr.fail td{{" in CSS
    # the activation table (CUDA runs only) too
    m = {"point_id": "p" * 16, "params_bytes": 10 ** 9, "grads_bytes": 10 ** 9, "optimizer_bytes": 2 * 10 ** 9,
         "activation_bytes": 5 * 10 ** 8, "predicted_activation_bytes": 4 * 10 ** 8, "activation_error": -0.2,
         "model_name": "m", "method": "full", "number_gpus": 2, "batch_size": 4}
    acts = memory_section([m], "GPU")
    assert re.findall(r"<table\b[^>]*>", acts) == [f'<table class="{TABLE_CLASS}">'] and "-20.0%" in acts
    assert "m · full · 2 GPUs · bs 4" in acts


def test_labels_count_workers_and_gpus_grammatically(cpu_db, cli, tmp_path):
    page, _ = render(cli, cpu_db[0], tmp_path / "r.html")
    (svg,) = svgs(section(page, "throughput"))
    assert "<title>tiny · lora · 1 worker</title>" in svg and "<title>tiny · lora · 2 workers</title>" in svg
    text = re.sub(r"<[^>]+>", " ", page)
    assert re.findall(r"\b(?:[02-9]|\d\d+) (?:worker|GPU|run|measurement)\b(?!s)", text) == []
    assert re.findall(r"\b1 (?:workers|GPUs|runs|measurements)\b", text) == []
    assert "(s)" not in text
    assert "2 workers · bs 8" in section(page, "stages")


MEASURE_JS = """
const res = {ticks: 0, overlaps: [], tables: []};
for (const svg of document.querySelectorAll('svg.chart')) {
  const boxes = [...svg.querySelectorAll('text.xtick')].map(t => [t.textContent, t.getBoundingClientRect()])
    .sort((p, q) => p[1].left - q[1].left);
  res.ticks += boxes.length;
  for (let i = 1; i < boxes.length; i++)
    if (boxes[i][1].left < boxes[i - 1][1].right) res.overlaps.push([boxes[i - 1][0], boxes[i][0]]);
}
for (const t of document.querySelectorAll('table')) {
  const th = getComputedStyle(t.querySelector('th')), td = getComputedStyle(t.querySelector('td'));
  res.tables.push([getComputedStyle(t).borderCollapse, th.backgroundColor, td.borderTopStyle, td.borderTopColor]);
}
document.body.setAttribute('data-measured', JSON.stringify(res));
"""


def browser_measure(page: str, tmp_path: Path) -> dict[str, Any]:
    """Lay the page out in headless Chromium, with a script added to measure it: the x tick labels' boxes
    (pairs that overlap) and every table's computed style."""
    import html as _html
    import json

    probe = tmp_path / "measure.html"
    probe.write_text(page.replace("</body>", f"<script>{MEASURE_JS}</script></body>"))
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1400,2600", "--dump-dom", probe.as_uri()],
            capture_output=True, text=True, timeout=120)
    m = re.search(r'data-measured="([^"]*)"', proc.stdout)
    assert m, proc.stderr[-2000:]
    return json.loads(_html.unescape(m.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_in_a_real_browser_tick_labels_stand_apart_and_every_table_has_one_style(cli, fabric_db, two_db, tmp_path):
    for db in (fabric_db, two_db):
        page, _ = render(cli, db, tmp_path / "r.html")
        got = browser_measure(page, tmp_path)
        assert got["ticks"] == len(re.findall(r'<text class="tick xtick"', page)) > 0
        assert got["overlaps"] == []
        assert len(got["tables"]) == page.count("<table") >= 2
        assert {tuple(t) for t in got["tables"]} == {("collapse", "rgb(243, 243, 243)", "solid", "rgb(221, 221, 221)")}
