"""The HTML report: one self-contained, interactive page (inline CSS, data and scripts; no font, style or script
from the network: it works offline).

``build_report(db, campaign=None, run_id=None)`` reads the results database read-only and returns a
:class:`Report` whose ``html`` is the page. The page is one campaign's: *campaign*, else the campaign of
*run_id*, else the latest campaign by creation time; its header names every other campaign with the
command that renders it (``--campaign NAME``, or ``--all-campaigns`` for one page of all, with a line per
campaign). It shows, in this order:

1. throughput (``dataset_tokens_per_second``) vs batch size, one line per model x method x GPUs;
2. GPU memory peak vs batch size, OOM (``is_valid = false``) runs as red crosses, with process
   memory (``cpu_memory_utilization``) beside it; a banner when no GPU sample exists;
3. stage times per run as horizontal stacked bars;
4. GPU utilisation / memory per device and process CPU over time for one run (``--run``, default
   the longest ok run), the warm-up and the measured window shaded;

then the latest measurement of every point as a table. Every chart has a tooltip (the run, its point's fields,
the value and its interval), zoom and pan, and a legend that shows one series (campaign, model, method, size)
alone; every table sorts by a click on its header and filters its rows. Loading
(:func:`harness.report.data.load_report_data`) and rendering (:func:`render_report`, a pure function of the data
and the inlined drawing library) are separate. This module is the page itself (header, style, the order of the
sections, the rows several charts share); the sections are :mod:`harness.report.sections` and the Vega-Lite
charts they draw with are :mod:`harness.report.charts`.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.contract.paths import DbTarget
from harness.contract.stability import bands_text
from harness.db.store import open_store
from harness.db.values import from_json

from .charts import esc, library_versions, page_scripts, plural
from .compare import parse_side
from .data import SCOPES, ReportData, load_compare, load_report_data
from .sections import (
    attempts_table,
    checks_section,
    clusters_section,
    compare_section,
    efficiency_section,
    fabric_charts,
    hosts_section,
    latest_table,
    measurement_points,
    memory_section,
    metric_chart,
    overhead_table,
    profile_section,
    scaling_section,
    search_section,
    section,
    stage_chart,
    trace_points,
    utilisation_charts,
    utilisation_note,
)


@dataclass
class Report:
    html: str
    data: ReportData

    def summary(self) -> str:
        d = self.data
        runs = sum(d.outcomes.values())
        return (f"{_scope_words(d)}: {plural(runs, 'run')}, {plural(len(d.measurements), 'measurement')}"
                + (f"; utilisation of {d.run['run_id']}" if d.run else "; no run for the utilisation panels"))


def _scope_words(d: ReportData) -> str:
    """``campaign X (the latest of 3; the others: --campaign NAME or --all-campaigns)``, ``2 campaigns``."""
    if d.campaign is None and d.shown:
        return f"campaigns {' and '.join(d.shown)} (the two of --compare)"
    if d.campaign is None:
        return plural(len(d.campaign_index), "campaign")
    others = len(d.campaign_index) - 1
    if d.scope == "latest" and others:
        return (f"campaign {d.campaign} (the latest of {len(d.campaign_index)}; the others: --campaign NAME "
                "or --all-campaigns)")
    return f"campaign {d.campaign}" + (" (the campaign of --run)" if d.scope == "run" else "")


def build_report(db: DbTarget | str, campaign: str | None = None, run_id: str | None = None,
                 now: _dt.datetime | None = None, compare_to: tuple[str, str] | None = None,
                 threshold: float = 0.10, all_campaigns: bool = False, at: str | None = None) -> Report:
    """Open *db* read-only (as the snapshot *at* left it, for a lake), load and render; see the module
    docstring. *compare_to* (BASE, CAND) adds the compare section; *all_campaigns* shows every campaign."""
    around = [c for c, _ in map(parse_side, compare_to) if c] if compare_to is not None else []
    with open_store(db, read_only=True, at=at) as store:
        # with --compare A B (campaigns) and no --campaign, the page is A's and B's, not the latest campaign's
        data = load_report_data(store, campaign, run_id, now, all_campaigns=all_campaigns, around=around)
        if compare_to is not None:
            data.compare = load_compare(store, compare_to[0], compare_to[1], threshold)
    return Report(render_report(data), data)


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:20px 28px;
color:#222;background:#fff;max-width:1360px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:26px 0 4px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:13px;margin:8px 0 2px;color:#444}p.note{color:#555;font-size:12.5px;margin:2px 0 8px}
.meta{font-size:13px;color:#444}.meta b{color:#222}.counts span{display:inline-block;margin-right:14px}
.c-ok{color:#2e7d32}.c-invalid{color:#d62728}.c-failed{color:#e65100}.c-pending{color:#666}
.banner{background:#fff4e5;border:1px solid #f0b35a;border-radius:4px;padding:8px 12px;margin:10px 0;font-size:13.5px}
.row{display:flex;flex-wrap:wrap;gap:10px}.panel{flex:1 1 640px}
.vchart{max-width:100%;overflow-x:auto;margin:4px 0}.vchart svg{display:block}
.tfilter{font-size:12px;margin:6px 0 0;padding:2px 6px;width:260px;border:1px solid #ccc;border-radius:3px}
th.sortable{cursor:pointer}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
.foot{font-size:11.5px;color:#777;margin:28px 0 0}
.nodata{border:1px dashed #bbb;background:#fafafa;color:#666;padding:28px;text-align:center;font-size:14px;
margin:6px 0;border-radius:4px}
table.tbl{border-collapse:collapse;font-size:11.5px;margin:6px 0}
table.tbl th,table.tbl td{border:1px solid #ddd;padding:2px 5px;text-align:left;white-space:nowrap}
table.tbl td.n{text-align:right;font-variant-numeric:tabular-nums}
table.tbl th{background:#f3f3f3;position:sticky;top:0;white-space:normal;vertical-align:bottom}
table.tbl tbody tr:nth-child(even) td{background:#fafafa}
table.tbl tr.oom td,table.tbl tr.fail td{color:#d62728;background:#fff5f5}
table.latest th{max-width:70px}
.wide{overflow-x:auto}
.campaigns{font-size:12.5px;color:#444;margin:4px 0 0}.campaigns code{background:#f3f3f3;padding:0 3px}
"""


def _campaign_choices(data: ReportData) -> str:
    """The campaigns this page does not show, each with the command that renders it."""
    cmd = f"sbench report{data.db_option}"
    if data.campaign is None:
        return (f'<div class="campaigns">One campaign per page: <code>{esc(cmd)} --campaign NAME</code> '
                "(without it, the latest campaign).</div>") if len(data.campaign_index) > 1 else ""
    others = [c for c in reversed(data.campaign_index) if c["campaign"] != data.campaign]
    if not others:
        return ""
    items = "".join(
        f"<li><b>{esc(c['campaign'])}</b> (created "
        f"{esc(c['created_at'].strftime('%Y-%m-%d %H:%M') if c.get('created_at') else 'at an unknown time')}, "
        f"{esc(plural(int(c['runs']), 'run'))}): <code>{esc(cmd)} --campaign {esc(c['campaign'])}</code></li>"
        for c in others)
    return (f'<div class="campaigns">{esc(plural(len(others), "other campaign"))} in this database, newest first '
            f"(every campaign on one page, a line per campaign: <code>{esc(cmd)} --all-campaigns</code>):"
            f"<ul>{items}</ul></div>")


def _header(data: ReportData) -> str:
    camps = ", ".join(f"<b>{esc(c['campaign'])}</b> ({esc(c.get('experiment') or '?')}"
                      f"{', ' + esc(c['executor']) if c.get('executor') else ''}"
                      f"{', partition ' + esc(c['partition']) if c.get('partition') else ''})"
                      for c in data.campaigns) or (f"<b>{esc(data.campaign)}</b>" if data.campaign
                                                   else "<i>none recorded</i>")
    main_four = ("ok", "invalid", "failed", "pending")
    order = [*main_four, *sorted(set(data.outcomes) - set(main_four))]
    counts = "".join(f'<span class="c-{esc(o)}"><b>{data.outcomes.get(o, 0)}</b> {esc(o)}</span>' for o in order
                     if o in data.outcomes or o in ("ok", "invalid", "failed"))
    spends = [line for c in data.campaigns if (line := spend_text(c))]
    return (f'<h1>sbench report</h1><div class="meta">Campaign{"s" if len(data.campaigns) > 1 else ""}: {camps}'
            f" · {esc(SCOPES[data.scope])}<br>"
            f'<span class="counts">Runs: {counts}</span> · {esc(plural(len(data.measurements), "measurement"))}<br>'
            + "".join(f'<span class="spend">{line}</span><br>' for line in spends)
            + f"Database <code>{esc(data.db)}</code> · generated "
            f"{esc(data.generated_at.strftime('%Y-%m-%d %H:%M:%S %Z'))}</div>{_campaign_choices(data)}")


def spend_text(c: Mapping[str, Any]) -> str:
    """What a campaign's runs spent (devices x allocation hours), against its ``budget:`` where it has one, and
    against what submit predicted of the runs it predicted (HTML); empty before any run held an allocation."""
    spent = c.get("spent_gpu_hours")
    if spent is None:
        return ""
    text = (f"Spent: <b>{esc(c['campaign'])}</b> {_hours(spent)} GPU-hours "
            f"({_hours(c.get('spent_allocation_hours'))} allocation hours)")
    budget = from_json(c.get("budget_spec"), None)
    if isinstance(budget, dict):
        parts = [f"{limit:g} {what} ({used / limit:.0%} spent)" for key, what, used in (
            ("gpu_hours", "GPU-hours", spent), ("allocation_hours", "allocation hours",
                                                 c.get("spent_allocation_hours") or 0.0))
            if isinstance(limit := budget.get(key), (int, float)) and limit > 0]
        if parts:
            text += "; budget: " + ", ".join(parts)
    predicted, measured, n = c.get("predicted_gpu_hours"), c.get("predicted_runs_spent"), c.get("runs_predicted")
    if predicted and measured and n:
        text += (f"; submit predicted {_hours(predicted)} GPU-hours for the {plural(int(n), 'run')} it predicted, "
                 f"which spent {_hours(measured)} ({(measured - predicted) / predicted:+.0%})")
    return text


def _hours(v: Any) -> str:
    return f"{v:,.3g}" if isinstance(v, (int, float)) else "?"


def _left_out(m: dict[str, object]) -> str:
    """Why a measurement is left out of the page's plots: the runs it shared its host with, or its host's load."""
    others = m.get("overlapped_with")
    if isinstance(others, list) and others:
        return f"shared with {', '.join(map(str, others))}"
    load = m.get("host_other_cpu_pct")
    return f"host busy with other work ({load:.0f} % of its CPU)" if isinstance(load, float) else "host busy"


def render_report(data: ReportData) -> str:
    """The page for *data*: a pure function of it."""
    ms = data.measurements
    word = "GPU" if data.gpu_samples else "worker"  # without GPUs, number_gpus counts CPU worker processes
    no_gpu = "" if data.gpu_samples else (
        '<div class="banner"><b>No GPUs were sampled.</b> The database has no GPU sample rows for these runs '
        "(a CPU-only run, or no NVML): every GPU metric is reported as 0.0 and the GPU plots show those zeros. "
        "Process memory and CPU are shown beside them.</div>")
    per = data.by_campaign  # every campaign on one page: a line (and a table row) per campaign too
    points = measurement_points(ms, word, by_campaign=per)  # the rows every measurement chart reads, once
    stages, stage_note = stage_chart(data.stage_runs, word, by_campaign=per)
    shared = "" if not data.shared else (
        f'<div class="banner"><b>{plural(len(data.shared), "measurement")} left out: measured on a shared or busy '
        "host.</b> Another sbench run held the same host at the same time, or other work kept it busy, so these "
        "numbers are not those of the point alone (measurements.shared_host, runs.overlapped_with, "
        "measurements.host_busy): "
        + "; ".join(f"<code>{esc(m['run_id'])}</code> {esc(_left_out(m))}" for m in data.shared[:10])
        + ("; ..." if len(data.shared) > 10 else "") + ". Measure them again on their own.</div>")
    memory = ('<div class="row"><div class="panel"><h3>GPU memory peak (% of device)</h3>'
              + metric_chart("chart-gpu-memory", points, "gpu_memory_utilization_peak", "GPU memory peak (%)", "%",
                             (0.0, 100.0))
              + '</div><div class="panel"><h3>process memory (% of host)</h3>'
              + metric_chart("chart-process-memory", points, "cpu_memory_utilization", "process memory (% of host)",
                             "%")
              + "</div></div>")
    title = "sbench report — " + (esc(data.campaign) if data.campaign else esc(" vs ".join(data.shown))
                                  if data.shown else "every campaign")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{title}</title><style>{CSS}</style></head><body>", _header(data), no_gpu, shared,
        section("throughput", "1. Throughput vs batch size",
                "dataset_tokens_per_second of every valid measurement (one marker each); the line joins the mean "
                f"at each batch size, one line per {'campaign × ' if per else ''}model × method × number of "
                f"{word}s. Red × = out of GPU memory (invalid run, no throughput), drawn at the top edge. "
                + CHART_HELP,
                metric_chart("chart-throughput", points, "dataset_tokens_per_second", "dataset tokens / s",
                             width=1020, height=340)),
        section("memory", "2. Memory vs batch size",
                "Left: gpu_memory_utilization_peak, the highest GPU memory sample of any device in the measured "
                "window. Right: cpu_memory_utilization, the training process tree's share of host memory. "
                "Red × = OOM (invalid run), drawn at the top edge."
                + ("" if data.gpu_samples else " <b>No GPUs were sampled: the GPU values below are 0.0.</b>"),
                memory),
        section("stages", "3. Stage time breakdown per run",
                "Wall seconds per stage; OOM runs in red, failed runs in orange."
                + (f" {esc(stage_note)}" if stage_note else "")
                + " Below: per run and host, the seconds from the node runner's start to the first train stage "
                "(start-up) and the time outside the train stage (run_overhead view), the slowest first.",
                f'<div class="wide">{stages}</div><div class="wide">{overhead_table(data.overhead, word)}</div>'),
        section("utilisation", "4. Utilisation over time", utilisation_note(data, word), utilisation_charts(data)),
        section("fabric", "5. Fabric: collective bandwidth across nodes",
                "sbench fabric runs: bus bandwidth of all-reduce (algbw × 2(n−1)/n) and all-gather (algbw × (n−1)/n) "
                "by message size, one line per run, labelled partition × nodes and the transport NCCL chose "
                "(gloo on CPU partitions).", fabric_charts(data.fabric)),
        memory_section(ms, word), efficiency_section(points, word, ms), checks_section(data.checks, word),
        compare_section(data.compare), search_section(data.searches, word),
        scaling_section(data.scaling, word), profile_section(data.profiles, word),
        clusters_section(data.clusters), hosts_section(data.hosts, data.preflight),
        section("latest", "Each point: its repeats, median and spread",
                f"One row per {'campaign’s ' if per else ''}point (OOM rows in red): its repeats (submitted, of how "
                "many; with repeats: {min, max, cv} the bounds, the CV target and the state sbench status gives), "
                "the median of each figure over its valid measurements and their spread, the precision "
                "interval (the precision auto-stop's relative half-width) and what stopped the runs, energy and "
                "dataset tokens per joule where measured, and how stable its dataset tok/s is across the repeats: "
                f"the coefficient of variation rated {bands_text()}. Runs measured on a shared or busy host do not "
                "count here.",
                '<div class="wide">' + latest_table(ms, word, by_campaign=per, stability=data.stability,
                                                    repeats=data.repeats) + "</div>"),
        section("repeats", "Every attempt, and why it was sent",
                "Each attempt of the points above: why it was submitted (new, retry, force, or more repeats with "
                "the CV that asked for it), how it ended, its allocation seconds beside what submit predicted of "
                "them before sending it (history: measured runs; model: the FLOP model), what it measured, and "
                "whether compare and the CV "
                "exclude it (a shared or busy host).",
                f'<div class="wide">{attempts_table(data.attempts, word, by_campaign=per)}</div>'),
        _footer(), page_scripts({"measurements": points, "traces": trace_points(data)}),
        "</body></html>"])


CHART_HELP = ("Hover a marker for its run, its point and its value with the interval; drag or scroll to pan and "
              "zoom (double click: back); click a legend entry to show that line alone (shift-click adds one).")


def _footer() -> str:
    """What drew the charts: the library inlined into this page, with its versions."""
    v = library_versions()
    return (f'<div class="foot">Charts: Vega {esc(v["vega"])}, Vega-Lite {esc(v["vega-lite"])} and Vega-Embed '
            f'{esc(v["vega-embed"])} (BSD-3-Clause), inlined from the vl-convert-python package: this page loads '
            "nothing from the network. Tables: click a header to sort, type in the box above to filter.</div>")
