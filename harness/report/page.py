"""The HTML report: one self-contained page (inline CSS and SVG, no scripts, fonts or network).

``build_report(db, campaign=None, run_id=None)`` reads the results database read-only and returns a
:class:`Report` whose ``html`` is the page. It shows, in this order:

1. throughput (``dataset_tokens_per_second``) vs batch size, one line per model x method x GPUs;
2. GPU memory peak vs batch size, OOM (``is_valid = false``) runs as red crosses, with process
   memory (``cpu_memory_utilization``) beside it; a banner when no GPU sample exists;
3. stage times per run as horizontal stacked bars;
4. GPU utilisation / memory per device and process CPU over time for one run (``--run``, default
   the longest ok run), the warm-up and the measured window shaded;

then the latest measurement of every point as a table. Loading (:func:`harness.report.data.load_report_data`)
and rendering (:func:`render_report`, a pure function of the data) are separate. This module is the page
itself (header, style, the order of the sections); the sections are :mod:`harness.report.sections` and the
generic SVG charts they draw with are :mod:`harness.report.charts`.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from harness.db.store import open_store

from .charts import esc
from .data import ReportData, load_compare, load_report_data
from .sections import (
    checks_section,
    compare_section,
    efficiency_section,
    fabric_charts,
    latest_table,
    memory_section,
    metric_chart,
    overhead_table,
    section,
    stage_chart,
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
        return (f"{runs} run(s), {len(d.measurements)} measurement(s)"
                + (f"; utilisation of {d.run['run_id']}" if d.run else "; no run for the utilisation panels"))


def build_report(db: str | Path, campaign: str | None = None, run_id: str | None = None,
                 now: _dt.datetime | None = None, compare_to: tuple[str, str] | None = None,
                 threshold: float = 0.10) -> Report:
    """Open *db* read-only, load and render; see the module docstring. *compare_to* (BASE, CAND) adds
    the compare section."""
    with open_store(db, read_only=True) as store:
        data = load_report_data(store, campaign, run_id, now)
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
svg.chart{max-width:100%;height:auto;font-size:11px;display:block}
svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axis{stroke:#555;fill:none}svg .tickmark{stroke:#555}
svg .tick{fill:#444}svg .label{fill:#222;font-size:12px}svg text{fill:#333}
svg .band-label{fill:#555;font-size:10.5px;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-opacity:.8}
svg .rowlabel.invalid{fill:#d62728}svg .rowlabel.failed{fill:#e65100}
.nodata{border:1px dashed #bbb;background:#fafafa;color:#666;padding:28px;text-align:center;font-size:14px;
margin:6px 0;border-radius:4px}
table.latest{border-collapse:collapse;font-size:11.5px;margin-top:6px}
table.latest th,table.latest td{border:1px solid #ddd;padding:2px 5px;text-align:right;white-space:nowrap}
table.latest th{background:#f3f3f3;position:sticky;top:0;white-space:normal;vertical-align:bottom;max-width:70px}
table.latest td:first-child,table.latest td:nth-child(2),table.latest td:last-child{text-align:left}
table.latest tr.oom td{color:#d62728;background:#fff5f5}
.wide{overflow-x:auto}
"""


def _header(data: ReportData) -> str:
    camps = ", ".join(f"<b>{esc(c['campaign'])}</b> ({esc(c.get('experiment') or '?')}"
                      f"{', ' + esc(c['executor']) if c.get('executor') else ''}"
                      f"{', partition ' + esc(c['partition']) if c.get('partition') else ''})"
                      for c in data.campaigns) or "<i>none recorded</i>"
    main_four = ("ok", "invalid", "failed", "pending")
    order = [*main_four, *sorted(set(data.outcomes) - set(main_four))]
    counts = "".join(f'<span class="c-{esc(o)}"><b>{data.outcomes.get(o, 0)}</b> {esc(o)}</span>' for o in order
                     if o in data.outcomes or o in ("ok", "invalid", "failed"))
    return (f'<h1>sbench report</h1><div class="meta">Campaign{"s" if len(data.campaigns) != 1 else ""}: {camps}'
            f'{" (selected with --campaign)" if data.campaign else ""}<br>'
            f'<span class="counts">Runs: {counts}</span> · {len(data.measurements)} measurement(s)<br>'
            f"Database <code>{esc(data.db)}</code> · generated "
            f"{esc(data.generated_at.strftime('%Y-%m-%d %H:%M:%S %Z'))}</div>")


def render_report(data: ReportData) -> str:
    """The page for *data*: a pure function of it."""
    ms = data.measurements
    word = "GPU" if data.gpu_samples else "worker"  # without GPUs, number_gpus counts CPU worker processes
    no_gpu = "" if data.gpu_samples else (
        '<div class="banner"><b>No GPUs were sampled.</b> The database has no GPU sample rows for these runs '
        "(a CPU-only run, or no NVML): every GPU metric is reported as 0.0 and the GPU plots show those zeros. "
        "Process memory and CPU are shown beside them.</div>")
    stages, stage_note = stage_chart(data.stage_runs, word)
    memory = ('<div class="row"><div class="panel"><h3>GPU memory peak (% of device)</h3>'
              + metric_chart(ms, "gpu_memory_utilization_peak", "GPU memory peak (%)", "%", (0.0, 100.0), word)
              + '</div><div class="panel"><h3>process memory (% of host)</h3>'
              + metric_chart(ms, "cpu_memory_utilization", "process memory (% of host)", "%", word=word)
              + "</div></div>")
    title = "sbench report" + (f" — {esc(data.campaign)}" if data.campaign else "")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{title}</title><style>{CSS}</style></head><body>", _header(data), no_gpu,
        section("throughput", "1. Throughput vs batch size",
                "dataset_tokens_per_second of every valid measurement (one marker each); the line joins the mean "
                f"at each batch size, one line per model × method × number of {word}s. Red × = out of GPU memory "
                "(invalid run, no throughput), drawn at the top edge.",
                metric_chart(ms, "dataset_tokens_per_second", "dataset tokens / s", word=word, width=1300,
                             height=360)),
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
        memory_section(ms, word), efficiency_section(ms, word), checks_section(data.checks),
        compare_section(data.compare),
        section("latest", "Latest measurement per point",
                "The newest measurement of each point (OOM rows in red) and how many measurements the point has.",
                f'<div class="wide">{latest_table(ms)}</div>'),
        "</body></html>"])
