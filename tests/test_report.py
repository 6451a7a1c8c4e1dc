"""sbench report: synthetic job dirs -> the real collect -> the HTML page, checked as text and as pixels.

The campaign is written by tests/kit/report.py's writers in the job-directory format, so the
database the report reads is the one collect really builds (measurements, OOM runs, stage times,
samples). Expected counts come from the rows each test wrote, not from the report's own queries.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .kit import LORA, jobdirs, rows_of, sbench
from .kit.browser import (
    CHROMIUM,
    FLAGS,
    MARK_JS,
    SYMBOLS,
    click_legend,
    hover_tooltip,
    open_report,
    png_pixels,
    screenshot,
    settle,
)
from .kit.report import build_campaign, collect_into, html_only, write_run


def section(page: str, name: str) -> str:
    m = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert m, f"no section {name}"
    return m.group(1)


def specs(text: str) -> list[dict[str, Any]]:
    """The Vega-Lite specs of the charts in *text*, in page order (each with ``_datasets``: the shared rows it reads
    by name)."""
    out = []
    for names, body in re.findall(r'<script type="application/json" class="vl-spec" data-for="[^"]+" '
                                  r'data-datasets="([^"]*)">(.*?)</script>', text, re.S):
        spec = json.loads(body)
        spec["_datasets"] = names.split()
        out.append(spec)
    return out


def shared(page: str) -> dict[str, list[dict[str, Any]]]:
    """The rows the page's charts share (its ``sbench-data`` script)."""
    m = re.search(r'<script type="application/json" id="sbench-data">(.*?)</script>', page, re.S)
    assert m, "no shared data"
    packed = json.loads(m.group(1))  # by columns (charts.pack_rows): the rows as the page's script makes them again
    return {name: [{f: v for f, v in zip(p["fields"], r) if v is not None} for r in p["rows"]]
            for name, p in packed.items()}


def rows(page: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a chart draws from: the page's shared rows it names, or its own."""
    data = spec["data"]
    return shared(page)[data["name"]] if "name" in data else data["values"]


def layer(spec: dict[str, Any], mark: str, **props: Any) -> dict[str, Any]:
    """The one layer of *spec* with this mark type (and these mark properties)."""
    found = [x for x in spec["layer"] if x["mark"]["type"] == mark and all(x["mark"].get(k) == v
                                                                           for k, v in props.items())]
    assert len(found) == 1, (mark, props, [x["mark"] for x in spec["layer"]])
    return found[0]


def drawn(page: str, spec: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    """The valid measurements a metric chart draws as markers (its point layer keeps the valid rows with a value)."""
    pts = layer(spec, "point", filled=True, size=48)
    assert pts["transform"][0] == {"filter": "datum.valid"} and pts["encoding"]["y"]["field"] == metric
    return [r for r in rows(page, spec) if r["valid"] and r.get(metric) is not None]


def crosses(page: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a metric chart draws as red crosses at its top edge: the invalid rows, with the cross layer's look."""
    x = layer(spec, "point", shape="cross")
    assert x["mark"]["angle"] == 45 and x["mark"]["color"] == "#d62728"
    assert x["transform"][0] == {"filter": "!datum.valid"}
    return [r for r in rows(page, spec) if not r["valid"]]


def lines(page: str, spec: dict[str, Any], metric: str) -> dict[str, int]:
    """Per series, how many batch sizes its mean line joins (the line layer aggregates the drawn markers)."""
    line = layer(spec, "line")
    assert line["encoding"]["y"]["aggregate"] == "mean" and line["encoding"]["color"]["field"] == "series"
    by: dict[str, set[int]] = {}
    for r in drawn(page, spec, metric):
        by.setdefault(r["series"], set()).add(r["batch"])
    return {k: len(v) for k, v in by.items()}


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
    out = tmp_path_factory.mktemp("page") / "report.html"
    sbench("report", "--db", gpu_db[0], "-o", out, in_process=True)
    return out.read_text(), out


# -- the page ------------------------------------------------------------------------------------------------
def test_report_command_writes_the_page_and_says_what_it_holds(cli, gpu_db, tmp_path):
    db, runs = gpu_db
    out = tmp_path / "r.html"
    res = cli("report", "--db", db, "-o", out)
    assert res.exit_code == 0
    n_meas = rows_of(db, "SELECT count(*) FROM measurements")[0][0]
    longest = rows_of(db, "SELECT run_id FROM runs WHERE outcome = 'ok' ORDER BY elapsed_s DESC, run_id LIMIT 1")[0][0]
    assert res.output == (f"wrote {out}: campaign scan: {len(runs)} runs, {n_meas} measurements; "
                          f"utilisation of {longest}\n")
    assert out.read_text().startswith("<!DOCTYPE html>")


NAMESPACES = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink", "http://www.w3.org/2000/xmlns/"}


def test_page_is_self_contained(gpu_page):
    page, _ = gpu_page
    assert re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I) == []
    assert re.findall(r"<script\b[^>]*\bsrc\s*=", page, re.I) == []  # every script is inline
    assert "<link" not in page.lower() and "@import" not in page and "url(http" not in page
    # the only web addresses left are XML namespace names (which no browser loads), in the inlined library
    assert set(re.findall(r"https?://[^\"' )]*", page)) <= NAMESPACES
    # the charts' specs, then the shared data, the library, the embedding and the tables' script
    assert page.count("<script") == len(specs(page)) + 4 and "window.vegaEmbed=" in page
    assert len(page.encode()) < 2 * 2 ** 20


def test_header_counts_runs_by_outcome(gpu_page, gpu_db):
    page, _ = gpu_page
    counts = dict(rows_of(gpu_db[0], "SELECT outcome, count(*) FROM runs GROUP BY 1"))
    assert counts == {"ok": 12, "invalid": 1, "failed": 1}
    for outcome, n in counts.items():
        assert f'<span class="c-{outcome}"><b>{n}</b> {outcome}</span>' in page
    assert "<b>scan</b> (finetune_lora_benchmark-v1.0.0, slurm, partition a100)" in page
    assert re.search(r"generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)


def test_throughput_plots_one_marker_per_valid_measurement_and_a_line_per_series(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "throughput")
    (spec,) = specs(sec)
    n_valid = rows_of(gpu_db[0], "SELECT count(*) FROM measurements WHERE is_valid AND dataset_tokens_per_second "
                             "IS NOT NULL")[0][0]
    metric = "dataset_tokens_per_second"
    assert n_valid == 12 and len(drawn(page, spec, metric)) == n_valid
    assert len(crosses(page, spec)) == 1
    # 2 models x 2 methods x 1 GPU count: four lines; the granite full line has two points (bs 8 was OOM)
    assert sorted(lines(page, spec, metric).values()) == [2, 3, 3, 3]
    x = layer(spec, "point", filled=True, size=48)["encoding"]["x"]
    assert x["axis"]["title"] == "batch size (log2 scale)" and x["scale"] == {"type": "log", "base": 2,
                                                                              "domain": x["scale"]["domain"]}
    legend = spec["layer"][0]["encoding"]["color"]["scale"]["domain"]
    for name in ("smollm2-135m · lora · 1 GPU", "granite-3b-1.5 · full · 1 GPU", "OOM (invalid run)"):
        assert name in legend
    # the tallest marker is the highest throughput, and its tooltip names its run
    best = rows_of(gpu_db[0], "SELECT run_id, dataset_tokens_per_second FROM measurements "
                          "ORDER BY dataset_tokens_per_second DESC NULLS LAST LIMIT 1")[0]
    top = max(drawn(page, spec, metric), key=lambda r: r[metric])
    assert top["run"] == best[0] and top[metric] == pytest.approx(best[1], rel=1e-5)
    tips = [t["field"] for t in layer(spec, "point", filled=True, size=48)["encoding"]["tooltip"]]
    assert tips[:4] == ["run", "series", "batch", metric] and "interval" in tips


def test_memory_panels_mark_oom_runs_with_a_red_cross(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "memory")
    gpu_spec, proc_spec = specs(sec)
    n_valid = rows_of(gpu_db[0], "SELECT count(*) FROM measurements WHERE is_valid")[0][0]
    assert len(drawn(page, gpu_spec, "gpu_memory_utilization_peak")) == n_valid
    assert len(drawn(page, proc_spec, "cpu_memory_utilization")) == n_valid
    (oom,) = crosses(page, gpu_spec)
    oom_run = rows_of(gpu_db[0], "SELECT run_id FROM measurements WHERE NOT is_valid")[0][0]
    assert (oom["series"], oom["batch"], oom["run"]) == ("granite-3b-1.5 · full · 1 GPU", 8, oom_run)
    assert "CUDA out of memory" in oom["reason"]
    tips = [t["field"] for t in layer(gpu_spec, "point", shape="cross")["encoding"]["tooltip"]]
    assert tips == ["run", "series", "batch", "reason"]
    # drawn at the top edge: the cross's height is the top of the axis (100 %)
    assert layer(gpu_spec, "point", shape="cross")["transform"][2] == {"calculate": "100.0", "as": "_top"}
    assert gpu_spec["layer"][0]["encoding"]["y"]["scale"] == {"domain": [0.0, 100.0]}
    assert "No GPUs were sampled" not in page


def test_stage_breakdown_has_one_bar_per_run_with_stages(gpu_page, gpu_db):
    page, _ = gpu_page
    (spec,) = specs(section(page, "stages"))
    bars = rows(page, spec)
    runs_with_stages = rows_of(gpu_db[0], "SELECT count(DISTINCT run_id) FROM stages")[0][0]
    assert runs_with_stages == 14
    assert len({b["label"] for b in bars}) == len({b["run"] for b in bars}) == runs_with_stages
    assert spec["encoding"]["y"]["sort"] == list(dict.fromkeys(b["label"] for b in bars))
    per_stage = dict(rows_of(gpu_db[0], "SELECT stage, count(DISTINCT run_id) FILTER (WHERE status <> 'incomplete') "
                                    "FROM stages GROUP BY 1"))
    assert per_stage == {"setup": 14, "dataset": 14, "tokens": 14, "model_load": 14, "train": 13, "teardown": 13}
    for stage, n in per_stage.items():
        assert sum(1 for b in bars if b["stage"] == stage) == n, stage
    # OOM runs' labels in red, failed runs' in orange
    assert sum(1 for lab in spec["encoding"]["y"]["sort"] if lab.startswith("OOM ")) == 1
    assert sum(1 for lab in spec["encoding"]["y"]["sort"] if lab.startswith("FAILED ")) == 1
    expr = spec["encoding"]["y"]["axis"]["labelColor"]["expr"]
    assert "'OOM ') == 0 ? '#d62728'" in expr and "'FAILED ') == 0 ? '#e65100'" in expr
    # the timed-out run died in training: an unfinished train segment, up to its last sample, shorter
    # than every ok run's train segment
    (unfinished,) = [b["seconds"] for b in bars if b["stage"] == "train (unfinished)" and b["outcome"] == "failed"]
    ok = [b["seconds"] for b in bars if b["stage"] == "train" and b["outcome"] == "ok"]
    assert len(ok) == 12 and unfinished < min(ok)
    assert "train (unfinished)" in spec["encoding"]["color"]["scale"]["domain"]  # in the legend


def bands_of(spec: dict[str, Any]) -> list[str]:
    return [x["data"]["values"][0]["band"] for x in spec["layer"] if x["mark"]["type"] == "rect"]


def test_utilisation_defaults_to_the_longest_ok_run_and_shades_its_windows(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "utilisation")
    longest = rows_of(gpu_db[0], "SELECT run_id FROM runs WHERE outcome = 'ok' ORDER BY elapsed_s DESC LIMIT 1")[0][0]
    assert longest.endswith(".r1.a1")  # the extra repeat ran longest
    assert f"Run <code>{longest}</code>" in sec and "the longest ok run" in sec
    util, mem, cpu = specs(sec)
    n_gpu = rows_of(gpu_db[0], "SELECT count(*) FROM samples WHERE run_id = ? AND kind = 'gpu'", [longest])[0][0]
    n_proc = rows_of(gpu_db[0], "SELECT count(*) FROM samples WHERE run_id = ? AND kind = 'proc'", [longest])[0][0]
    traces = rows(page, util)
    assert sum(1 for t in traces if t["kind"] == "gpu" and t["gpu_util"] is not None) == n_gpu == 48
    assert sum(1 for t in traces if t["kind"] == "proc" and t["cpu_pct"] is not None) == n_proc == 48
    assert util["usermeta"] == {"run": longest, "samples": 48} and cpu["usermeta"]["samples"] == 48
    assert "measured window" in bands_of(util) and bands_of(cpu)
    # repeat 1 runs have no warm-up; repeat 0 runs do
    assert "warm-up" not in bands_of(util)


def test_run_option_picks_the_run_and_shows_its_warmup(cli, gpu_db, tmp_path):
    db, runs = gpu_db
    run = next(r for r in runs if r["outcome"] == "ok" and ".r0." in r["run_id"])
    out = tmp_path / "r.html"
    assert cli("report", "--db", db, "--run", run["run_id"], "-o", out).exit_code == 0
    sec = section(out.read_text(), "utilisation")
    assert f"Run <code>{run['run_id']}</code>" in sec and "chosen with --run" in sec
    assert [bands_of(x) for x in specs(sec)] == [["measured window", "warm-up"]] * 3


def test_latest_table_has_one_row_per_measured_point(gpu_page, gpu_db):
    page, _ = gpu_page
    sec = section(page, "latest")
    points = rows_of(gpu_db[0], "SELECT count(DISTINCT point_id) FROM measurements")[0][0]
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
    assert rows_of(db, "SELECT DISTINCT gpu_memory_utilization_peak FROM measurements") == [(0.0,)]
    gpu_spec, proc_spec = specs(section(page, "memory"))
    # the zeros are plotted, all on the x axis, and process memory is beside them
    zeros = drawn(page, gpu_spec, "gpu_memory_utilization_peak")
    assert len(zeros) == len(runs) and {r["gpu_memory_utilization_peak"] for r in zeros} == {0.0}
    assert len(drawn(page, proc_spec, "cpu_memory_utilization")) == len(runs)
    util = section(page, "utilisation")
    assert util.count("No data: no GPU samples for this run (no GPU was sampled)") == 2
    assert len(specs(util)) == 1  # the process CPU panel


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
def test_xy_spec_scales_log2_ticks_where_asked_and_pins_crosses_to_the_top():
    from harness.report.charts import xy_spec

    values = [{"b": 1, "v": 0.0, "s": "a", "ok": True}, {"b": 16, "v": 50.0, "s": "a", "ok": True},
              {"b": 32, "v": None, "s": "a", "ok": False}]
    spec = xy_spec(data={"values": values},
                   x="b", y="v", series="s", colors={"a": "#123456"}, tips=[("b", "batch")], x_title="batch",
                   y_title="v", keep="datum.ok", log2_x=True, x_values=[1, 16, 32], y_domain=(0.0, 100.0),
                   crosses={"filter": "!datum.ok", "y": 100.0, "name": "oom", "color": "#d62728", "tips": []})
    x = layer(spec, "point", filled=True, size=48)["encoding"]["x"]
    assert x["scale"]["type"] == "log" and x["scale"]["base"] == 2  # equal steps per doubling
    assert x["axis"]["values"] == [1, 16, 32] and x["axis"]["labelOverlap"] is True
    assert x["scale"]["domain"][0] < 1 and x["scale"]["domain"][1] > 32  # no marker on the axis
    cross = layer(spec, "point", shape="cross")
    assert cross["transform"] == [{"filter": "!datum.ok"}, {"calculate": '"oom"', "as": "s"},
                                  {"calculate": "100.0", "as": "_top"}]
    assert spec["layer"][0]["encoding"]["y"]["scale"] == {"domain": [0.0, 100.0]}
    # the legend's selection on the first layer that draws the legend (the mean line), zoom on the markers
    assert [(p["name"], p["bind"]) for p in layer(spec, "line")["params"]] == [("pick", "legend")]
    assert [(p["name"], p["bind"]) for p in layer(spec, "point", filled=True, size=48)["params"]] == [
        ("zoom", "scales")]
    no_line = xy_spec(data={"values": values}, x="b", y="v", series="s", colors={"a": "#123456"}, tips=[],
                      x_title="b", y_title="v", mean_line=False)
    assert [p["name"] for p in no_line["layer"][0]["params"]] == ["pick", "zoom"]  # no line: both on the markers


def test_empty_charts_are_no_data_panels():
    from harness.report.sections import metric_chart, stage_chart

    assert metric_chart("c", [], "mfu", "MFU") == (
        '<div class="nodata">No data: no measurement with mfu and a batch size in this selection</div>')
    assert stage_chart([])[0] == '<div class="nodata">No data: no stage timings recorded for these ' \
                                               'runs</div>'


def test_spec_json_cannot_end_its_script_element():
    from harness.report.charts import embed

    html = embed("c", {"data": {"values": [{"run": "</script><script>alert(1)</script><!--"}]}})
    assert html.count("</script>") == 1 and "<!--" not in html
    body = re.search(r">(\{.*\})</script>", html).group(1)
    assert json.loads(body)["data"]["values"][0]["run"] == "</script><script>alert(1)</script><!--"


def test_the_drawing_library_is_kept_in_the_users_cache_and_read_back_only_when_it_is_theirs_alone(
        tmp_path, monkeypatch):
    from harness.report import charts

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    charts.vega_bundle.cache_clear()
    made = charts.vega_bundle()
    kept = list((tmp_path / "cache" / "sbench").glob("vega-bundle-*.js"))
    assert len(kept) == 1 and kept[0].stat().st_mode & 0o777 == 0o600
    assert "window.vegaEmbed" in made and "</script" not in made

    kept[0].write_text("window.vegaEmbed = 1;" + charts._BUNDLE_END)  # a kept one is what the page gets
    charts.vega_bundle.cache_clear()
    assert charts.vega_bundle() == "window.vegaEmbed = 1;"
    kept[0].write_text("window.vegaEmbed = 1;")  # cut short: made again, and kept whole
    charts.vega_bundle.cache_clear()
    assert charts.vega_bundle() == made and kept[0].read_text().endswith(charts._BUNDLE_END)

    home = tmp_path / "cache" / "sbench"
    cases = [lambda: kept[0].chmod(0o666), lambda: home.chmod(0o777)]  # another user may write either
    if os.getuid() == 0:
        cases.append(lambda: os.chown(kept[0], 65534, 65534))  # another user's file
    for make_theirs in cases:
        home.chmod(0o700)
        kept[0].write_text("alert(1);" + charts._BUNDLE_END)
        make_theirs()
        charts.vega_bundle.cache_clear()
        assert charts.vega_bundle() == made  # never read: the library made anew
    charts.vega_bundle.cache_clear()


def test_a_campaign_without_measurements_gets_no_data_panels(tmp_path, cli):
    wd = tmp_path / "runs"
    runs = [write_run(wd, "broken", LORA, "smollm2-135m", 1, 4, outcome="failed", seed=1)]
    jobdirs.append_manifest(wd, "broken", [jobdirs.manifest_events("broken", LORA)])
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
    assert len(specs(section(page, "stages"))) == 1  # the failed run still has stage times
    util = section(page, "utilisation")  # and samples until it died
    assert f"Run <code>{runs[0]['run_id']}</code>" in util and "no ok run: the run with the most samples" in util
    assert len(specs(util)) == 3


def test_shared_rows_are_packed_by_column_and_come_back_whole(gpu_page, gpu_db):
    from harness.report.charts import pack_rows

    rows_in = [{"run": "a", "batch": 2, "x": None}, {"run": "b", "valid": False}, {"batch": 4}]
    packed = pack_rows(rows_in)
    assert packed == {"fields": ["run", "batch", "x", "valid"], "rows": [["a", 2], ["b", None, None, False], [None, 4]]}
    page, _ = gpu_page
    raw = re.search(r'id="sbench-data">(.*?)</script>', page, re.S)
    assert raw and raw.group(1).count('"dataset_tokens_per_second"') == 1  # a field's name once, not once a row
    assert len(shared(page)["measurements"]) == rows_of(gpu_db[0], "SELECT count(*) FROM measurements")[0][0]


def _legends(vega: dict[str, Any]) -> list[dict[str, Any]]:
    """Every legend of a compiled Vega spec, its nested groups' too."""
    return list(vega.get("legends") or []) + [x for m in vega.get("marks") or [] for x in _legends(m)]


def test_every_chart_with_a_series_has_a_legend_that_clicks(gpu_page, two_db, cli, tmp_path):
    """Vega-Lite makes a layered chart's legend clickable only from the first layer that draws it, and a layer
    that hides it hides it for all: each spec, compiled as the page's library compiles it, has legends and every
    one of them is interactive (the browser test clicks one)."""
    import vl_convert

    compared, _ = render(cli, two_db, tmp_path / "c.html", "--compare", OLDER, NEWER)
    assert 'id="chart-compare"' in compared
    for page in (gpu_page[0], compared):
        data = shared(page)
        for spec in specs(page):
            names = spec.pop("_datasets")
            if names:
                spec["datasets"] = {n: data[n] for n in names}
            views = [spec, *spec.get("layer", [])]
            picks = [p for x in views for p in x.get("params", []) if p.get("bind") == "legend"]
            legends = _legends(vl_convert.vegalite_to_vega(spec))
            assert len(picks) == 1 and legends, spec.get("description")
            assert all(leg["encode"]["symbols"].get("interactive") for leg in legends), spec.get("description")


# -- the page in a browser -------------------------------------------------------------------------------------
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "report.png"  # the picture of the report in docs/results.md
RUN_ID = re.compile(r"[\w.-]+/[0-9a-f]{16}\.r\d+\.a\d+")


DOMAINS_JS = "['x', 'y'].map(a => document.getElementById('chart-throughput').vegaView.scale(a).domain())"
# The opacity of each valid-measurement marker of the throughput chart (its filled points, not the OOM crosses)
OPACITY_JS = ("[...document.querySelectorAll('#chart-throughput g.mark-symbol.role-mark path')]"
              ".filter(p => p.getAttribute('opacity') !== '0.7').map(p => p.getAttribute('opacity'))")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_in_a_browser_with_the_network_blocked_the_page_draws_every_chart_and_a_hover_names_the_run(gpu_page, gpu_db):
    """Headless Chromium over the DevTools protocol, every remote URL blocked: the page asks for nothing but itself,
    logs no error, draws every chart, and a mouse over a throughput marker shows its tooltip with the run's id.
    The screenshot (the tooltip in it) must be a real picture; SBENCH_UPDATE_SCREENSHOT=1 writes it to
    docs/report.png."""
    page, html_path = gpu_page
    runs = {r["run_id"] for r in gpu_db[1]}
    (spec,) = specs(section(page, "throughput"))
    first = spec["layer"][0]["encoding"]["color"]["scale"]["domain"][0]  # the legend's first entry
    markers = [r["series"] for r in drawn(page, spec, "dataset_tokens_per_second")]
    with open_report(html_path, width=1400, height=1000) as (browser, check):
        charts = browser.evaluate("[Number(document.body.getAttribute('data-charts')), "
                                  "document.querySelectorAll('.vchart svg.marks').length]")
        tip = hover_tooltip(browser, "chart-throughput")
        shot = screenshot(browser)
        assert sorted(browser.evaluate(OPACITY_JS)) == ["1"] * len(markers)  # every series shown
        # the wheel zooms in on both axes (the mouse is on the plot, where the tooltip's marker was)
        before = browser.evaluate(DOMAINS_JS)
        x, y = browser.evaluate(f"{MARK_JS}('chart-throughput', '{SYMBOLS}')")
        browser.send("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x + 60, "y": y - 40, "deltaX": 0,
                                                  "deltaY": -300})
        after = browser.wait_for(f"(function (b) {{ const d = {DOMAINS_JS}; "
                                 "return d.flat().every((v, i) => v === b.flat()[i]) ? null : d; })"
                                 f"({json.dumps(before)})")
        for (lo0, hi0), (lo1, hi1) in zip(before, after):
            assert lo0 < lo1 < hi1 < hi0, (before, after)
        click_legend(browser, "chart-throughput")  # shows that series alone: the others' markers fade
        shown = browser.wait_for(f"(function () {{ const o = {OPACITY_JS}; "
                                 "return o.includes('0.07') ? o.filter(x => x === '1').length : null; })()")
        settle(browser, check)
    assert shown == markers.count(first) > 0
    assert check.requests == [html_path.as_uri()]  # the page itself; no script, style, font or image from elsewhere
    assert check.errors == []
    assert charts == [len(specs(page)), len(specs(page))] and charts[0] >= 5
    found = RUN_ID.findall(tip)
    assert len(found) == 1 and found[0] in runs, tip  # the run under the mouse, one of the campaign's
    for field in ("series", "batch size", "dataset tokens / s", "interval", "max length", "nodes", "trainer"):
        assert field in tip, tip
    width, height, values = png_pixels(shot)
    assert (width, height) == (1400, 1000) and len(shot) > 20_000
    # a blank or error page has a handful of colours; plots, anti-aliased text and the tooltip have many
    assert len(values) > 200, len(values)
    if os.environ.get("SBENCH_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.write_bytes(shot)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_browser_check_sees_a_remote_script_and_a_console_error(gpu_page, tmp_path):
    """The check above can fail: a page that asks for a remote script and logs an error is caught on both."""
    page, _ = gpu_page
    bad = tmp_path / "bad.html"
    head, tail = page.rsplit("</body>", 1)
    bad.write_text(f'{head}<script src="https://cdn.example.org/x.js"></script>'
                   f"<script>console.error('boom')</script></body>{tail}")
    with open_report(bad) as (browser, check):
        settle(browser, check, 0.5)
    assert "https://cdn.example.org/x.js" in check.requests
    assert any("boom" in e for e in check.errors) and any("cdn.example.org" in e for e in check.errors), check.errors


ROWS_JS = "[...document.querySelectorAll('#latest table.tbl, #repeats table.tbl')].map(t => t.tBodies[0].rows.length)"
FILTER_JS = """(function (q) {
  const box = document.querySelector('#latest input.tfilter');
  box.value = q; box.dispatchEvent(new Event('input'));
  return [...document.querySelectorAll('#latest table.tbl tbody tr')].filter(r => r.style.display !== 'none').length;
})"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_in_a_browser_rows_past_the_first_join_their_table_when_it_is_filtered_or_comes_into_view(
        cli, gpu_db, tmp_path, monkeypatch):
    import harness.report.sections as sections

    monkeypatch.setattr(sections, "TABLE_FIRST_ROWS", 3)
    page, _ = render(cli, gpu_db[0], tmp_path / "r.html")
    total = [section(page, sid).count("<tr") - 1 for sid in ("latest", "repeats")]  # less the header row
    assert min(total) > 3 and all(section(page, sid).count('<template class="more-rows">') == 1
                                  for sid in ("latest", "repeats"))
    granite = sum(">granite-3b-1.5<" in r for r in section(page, "latest").split("<tr")[1:])
    assert 3 < granite < total[0]
    with open_report(tmp_path / "r.html", height=700) as (browser, check):
        assert browser.evaluate(ROWS_JS) == [3, 3]  # both tables far below the window: three rows each
        # a filter searches every row: the kept-back ones join first
        assert browser.evaluate(f"{FILTER_JS}('granite-3b-1.5')") == granite
        assert browser.evaluate(ROWS_JS)[0] == total[0]
        browser.evaluate("document.querySelector('#repeats table.tbl').scrollIntoView()")
        assert browser.wait_for(f"({ROWS_JS})[1] === {total[1]}")  # in view: all of its rows
        settle(browser, check)
    assert check.errors == []


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


def marker_runs(page: str, spec: dict[str, Any]) -> list[str]:
    """The run of each valid-measurement marker of the throughput chart (its tooltip's first line)."""
    return [r["run"] for r in drawn(page, spec, "dataset_tokens_per_second")]


def x_ticks(spec: dict[str, Any]) -> list[float]:
    """The values the x axis of a chart ticks at."""
    return layer(spec, "point", filled=True, size=48)["encoding"]["x"]["axis"]["values"]


def test_report_shows_the_latest_campaign_by_default_and_names_the_others(cli, two_db, tmp_path):
    page, said = render(cli, two_db, tmp_path / "r.html")
    newer_runs = {r for (r,) in rows_of(two_db, "SELECT run_id FROM measurements WHERE campaign = ? AND is_valid",
                                        [NEWER])}
    assert len(newer_runs) == 16 and rows_of(two_db, "SELECT count(*) FROM measurements WHERE campaign = ?",
                                             [OLDER])[0][0] == 12
    (spec,) = specs(section(page, "throughput"))
    assert sorted(marker_runs(page, spec)) == sorted(newer_runs)  # one marker per newer measurement, none of older
    assert OLDER + "/" not in page  # no run of the older campaign anywhere: plots, stages, tables
    # a line per method x worker count, each through the newer campaign's batch sizes only
    assert sorted(lines(page, spec, "dataset_tokens_per_second").values()) == [4, 4, 4, 4]
    assert f"<title>sbench report — {NEWER}</title>" in page
    assert "the latest campaign by creation time" in page
    assert f"<b>{OLDER}</b> (created 2025-11-20 10:00, 12 runs): <code>sbench report --db {two_db} --campaign " \
           f"{OLDER}</code>" in page
    assert f"sbench report --db {two_db} --all-campaigns" in page
    n_runs = rows_of(two_db, "SELECT count(*) FROM runs WHERE campaign = ?", [NEWER])[0][0]
    assert said.startswith(f"wrote {tmp_path / 'r.html'}: campaign {NEWER} (the latest of 2; the others: "
                           f"--campaign NAME or --all-campaigns): {n_runs} runs, 16 measurements; ")
    # the checks are the shown campaign's
    assert f"<h3>{NEWER}: " in section(page, "checks")


def test_campaign_option_shows_that_campaign_and_all_campaigns_every_one_by_line(cli, two_db, tmp_path):
    page, _ = render(cli, two_db, tmp_path / "old.html", "--campaign", OLDER)
    (spec,) = specs(section(page, "throughput"))
    older_runs = [r for (r,) in rows_of(two_db, "SELECT run_id FROM measurements WHERE campaign = ?", [OLDER])]
    assert sorted(marker_runs(page, spec)) == sorted(older_runs) and NEWER + "/" not in page
    assert "chosen with --campaign" in page and f"--campaign {NEWER}</code>" in page
    assert 'id="checks"' not in page  # the older campaign declares no references

    page, said = render(cli, two_db, tmp_path / "all.html", "--all-campaigns")
    (spec,) = specs(section(page, "throughput"))
    assert len(marker_runs(page, spec)) == rows_of(two_db, "SELECT count(*) FROM measurements")[0][0] == 28
    # a line per campaign x method x worker count, each named with its campaign
    assert sorted(lines(page, spec, "dataset_tokens_per_second").values()) == [3] * 4 + [4] * 4
    legend = spec["layer"][0]["encoding"]["color"]["scale"]["domain"]
    for camp in (OLDER, NEWER):
        for n in ("1 worker", "2 workers"):
            assert f"{camp} · tiny · lora · {n}" in legend
    latest = section(page, "latest")  # the points both measured: a row per campaign
    assert latest.count("<tr class=") == 28 and "<th>campaign</th>" in latest
    assert said.startswith(f"wrote {tmp_path / 'all.html'}: 2 campaigns: ")
    assert "<title>sbench report — every campaign</title>" in page

    res = cli("report", "--db", two_db, "--campaign", OLDER, "--all-campaigns", "-o", tmp_path / "x.html")
    assert res.exit_code == 2 and "--campaign and --all-campaigns: give one of them" in res.output
    assert not (tmp_path / "x.html").exists()


def test_run_option_without_campaign_shows_the_runs_campaign(cli, two_db, tmp_path):
    run = rows_of(two_db, "SELECT run_id FROM runs WHERE campaign = ? AND outcome = 'ok' ORDER BY run_id LIMIT 1",
                  [OLDER])[0][0]
    page, said = render(cli, two_db, tmp_path / "r.html", "--run", run)
    assert f"<title>sbench report — {OLDER}</title>" in page and "the campaign of --run" in page
    assert f"Run <code>{run}</code>" in section(page, "utilisation") and NEWER + "/" not in page
    assert f"campaign {OLDER} (the campaign of --run)" in said


# -- axes, labels, tables ---------------------------------------------------------------------------------------
def test_batch_size_axes_tick_at_the_batch_sizes_measured(cli, two_db, gpu_page, tmp_path):
    page, _ = render(cli, two_db, tmp_path / "r.html")
    for sid in ("throughput", "memory"):
        for spec in specs(section(page, sid)):
            x = layer(spec, "point", filled=True, size=48)["encoding"]["x"]
            assert x["axis"]["title"] == "batch size" and "type" not in x["scale"]  # linear: 3, 6 no powers of 2
            assert x_ticks(spec) == list(NEWER_SIZES)  # never 2.5 or 3.5
            assert x["axis"]["format"] == "~g"  # labelled as the numbers they are
    gpu_sizes = sorted({b for (b,) in rows_of(gpu_page_db(gpu_page), "SELECT batch_size FROM measurements")})
    (spec,) = specs(section(gpu_page[0], "throughput"))
    x = layer(spec, "point", filled=True, size=48)["encoding"]["x"]
    assert x["axis"]["title"] == "batch size (log2 scale)" and x_ticks(spec) == gpu_sizes == [2, 4, 8]


def gpu_page_db(gpu_page: tuple[str, Path]) -> Path:
    m = re.search(r"Database <code>([^<]+)</code>", gpu_page[0])
    assert m
    return Path(m.group(1))


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
    from harness.report.charts import HUMAN_BYTES_EXPR

    page, _ = render(cli, fabric_db, tmp_path / "r.html")
    panels = specs(section(page, "fabric"))
    assert len(panels) == 2
    for spec in panels:
        x = layer(spec, "point", filled=True, size=48)["encoding"]["x"]
        ticks = x_ticks(spec)
        assert set(ticks) < set(FABRIC_SIZES) and 4 <= len(ticks) and {2 ** 10, 2 ** 20} <= set(ticks)
        assert x["scale"]["type"] == "log" and x["scale"]["base"] == 2
        assert x["axis"]["labelOverlap"] is True  # thinned where labels would overlap (the browser test measures)
        assert x["axis"]["labelExpr"] == HUMAN_BYTES_EXPR  # binary units: 1K is 1024 bytes
        assert x["axis"]["title"] == "message size (log2 scale; 1K = 1024 bytes)"
        tips = rows(page, spec)
        assert len(tips) == len(FABRIC_SIZES) and {"1K", "1M"} <= {t["size"].split("B")[0] for t in tips}


def test_every_table_has_the_shared_style(cli, two_db, gpu_page, tmp_path):
    from harness.report.page import CSS
    from harness.report.sections import TABLE_CLASS, memory_section

    page, _ = render(cli, two_db, tmp_path / "r.html")
    assert 'id="checks"' in page and "<table" in section(page, "checks")
    for p, n in ((page, 6), (gpu_page[0], 4)):
        tags = re.findall(r"<table\b[^>]*>", html_only(p))
        # the overhead, checks and scaling (two_db only: its campaign has shapes of 1 and 2 devices), host health,
        # points and attempts tables
        assert len(tags) == n, tags
        assert all(re.fullmatch(rf'<table class="{TABLE_CLASS}( [\w-]+)*">', t) for t in tags), tags
    assert f"table.{TABLE_CLASS} th,table.{TABLE_CLASS} td{{" in CSS
    # a failed check reads in red like an OOM row
    fails = rows_of(two_db, "SELECT count(*) FROM checks WHERE campaign = ? AND status = 'fail'", [NEWER])[0][0]
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
    (spec,) = specs(section(page, "throughput"))
    legend = spec["layer"][0]["encoding"]["color"]["scale"]["domain"]
    assert "tiny · lora · 1 worker" in legend and "tiny · lora · 2 workers" in legend
    text = re.sub(r"<[^>]+>", " ", html_only(page))
    assert re.findall(r"\b(?:[02-9]|\d\d+) (?:worker|GPU|run|measurement)\b(?!s|-hours)", text) == []
    assert re.findall(r"\b1 (?:workers|GPUs|runs|measurements)\b", text) == []
    assert "(s)" not in text
    assert "2 workers · bs 8" in section(page, "stages")


MEASURE_JS = """
function measure() {
  if (!document.body.getAttribute('data-charts')) { setTimeout(measure, 50); return; }
  const res = {charts: Number(document.body.getAttribute('data-charts')), axes: [], overlaps: [], tables: []};
  for (const axis of document.querySelectorAll('.vchart g.role-axis[aria-label^="X-axis"]')) {
    const boxes = [...axis.querySelectorAll('.role-axis-label text')]
      .filter(t => t.getAttribute('opacity') !== '0' && getComputedStyle(t).opacity !== '0')
      .map(t => [t.textContent, t.getBoundingClientRect()]).sort((p, q) => p[1].left - q[1].left);
    res.axes.push(boxes.map(b => b[0]));
    for (let i = 1; i < boxes.length; i++)
      if (boxes[i][1].left < boxes[i - 1][1].right) res.overlaps.push([boxes[i - 1][0], boxes[i][0]]);
  }
  for (const t of document.querySelectorAll('table')) {
    const th = getComputedStyle(t.querySelector('th')), td = getComputedStyle(t.querySelector('td'));
    res.tables.push([getComputedStyle(t).borderCollapse, th.backgroundColor, td.borderTopStyle, td.borderTopColor]);
  }
  document.body.setAttribute('data-measured', JSON.stringify(res));
}
measure();
"""


def browser_measure(page: str, tmp_path: Path) -> dict[str, Any]:
    """Lay the page out in headless Chromium once its charts are drawn, with a script added to measure it: each x
    axis's visible labels (pairs that overlap) and every table's computed style."""
    import html as _html

    probe = tmp_path / "measure.html"
    head, tail = page.rsplit("</body>", 1)
    probe.write_text(f"{head}<script>{MEASURE_JS}</script></body>{tail}")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1400,2600",
             "--virtual-time-budget=30000", "--dump-dom", probe.as_uri()],
            capture_output=True, text=True, timeout=120)
    m = re.search(r'data-measured="([^"]*)"', proc.stdout)
    assert m, proc.stderr[-2000:]
    return json.loads(_html.unescape(m.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_in_a_real_browser_tick_labels_stand_apart_and_every_table_has_one_style(cli, fabric_db, two_db, tmp_path):
    for db in (fabric_db, two_db):
        page, _ = render(cli, db, tmp_path / "r.html")
        got = browser_measure(page, tmp_path)
        assert got["charts"] == len(specs(page)) == len(got["axes"]) > 0  # every chart drawn, each with an x axis
        assert got["overlaps"] == []
        assert len(got["tables"]) == html_only(page).count("<table") >= 2
        assert {tuple(t) for t in got["tables"]} == {("collapse", "rgb(243, 243, 243)", "solid", "rgb(221, 221, 221)")}
        if db == fabric_db:  # the byte axes: thinned, in binary units, 1K and 1M kept
            for labels in got["axes"][-2:]:
                assert 4 <= len(labels) < len(FABRIC_SIZES) and {"1K", "1M"} <= set(labels), labels
                assert all(re.fullmatch(r"\d+[KMG]?", x) for x in labels), labels
        else:  # the batch-size axes: exactly the sizes measured
            assert [int(x) for x in got["axes"][0]] == list(NEWER_SIZES)
