"""The HTML report: one self-contained page (inline CSS and SVG, no scripts, fonts or network).

``build_report(db, campaign=None, run_id=None)`` reads the results database read-only and returns a
:class:`Report` whose ``html`` is the page. It shows, in this order:

1. throughput (``dataset_tokens_per_second``) vs batch size, one line per model x method x GPUs;
2. GPU memory peak vs batch size, OOM (``is_valid = false``) runs as red crosses, with process
   memory (``cpu_memory_utilization``) beside it; a banner when no GPU sample exists;
3. stage times per run as horizontal stacked bars;
4. GPU utilisation / memory per device and process CPU over time for one run (``--run``, default
   the longest ok run), the warm-up and the measured window shaded;

then the latest measurement of every point as a table. Loading (:func:`load_report_data`) and
rendering (:func:`render_report`, a pure function of the data) are separate; the two chart
functions (:func:`line_chart`, :func:`bar_chart`) are generic and know nothing of sbench.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract.errors import InputError, SbenchError
from harness.db.checks import check_results, references_of
from harness.db.store import Store, open_store
from harness.spec.catalog import EXPERIMENTS

from .compare import compare_in

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
           "#17becf", "#8c564b", "#bcbd22", "#7f7f7f")
OOM_COLOR = "#d62728"  # reserved: no series uses red
STAGE_ORDER = ("setup", "launch", "dataset", "tokens", "model_load", "train", "teardown")
STAGE_COLORS = {"setup": "#bab0ac", "dataset": "#76b7b2", "tokens": "#59a14f", "model_load": "#edc948",
                "train": "#4e79a7", "teardown": "#9c755f"}
MAX_STAGE_BARS = 80  # more bars than this are unreadable; the page says how many were left out
MAX_TRACE_POINTS = 600  # per series: long runs are averaged into this many time buckets


class ReportError(SbenchError):
    """The database holds nothing to report (exit 1)."""


# -- data ----------------------------------------------------------------------------------------------------
@dataclass
class ReportData:
    db: str
    generated_at: _dt.datetime
    campaign: str | None
    campaigns: list[dict[str, Any]]
    outcomes: dict[str, int]
    measurements: list[dict[str, Any]]  # every measurement in scope, with ``method`` and ``run_reason``
    stage_runs: list[dict[str, Any]]  # per run: label fields, ``outcome`` and ``stages`` {stage: seconds}
    gpu_samples: int  # GPU sample rows in scope (0: no GPU was sampled)
    run: dict[str, Any] | None = None  # the run of the utilisation panels
    run_choice: str = ""
    traces: list[dict[str, Any]] = field(default_factory=list)  # bucketed samples of that run
    run_offset: float | None = None  # t_wall - x of the traces (to place window bounds)
    fabric: list[dict[str, Any]] = field(default_factory=list)  # rows of the latest sbench fabric runs
    overhead: list[dict[str, Any]] = field(default_factory=list)  # run_overhead rows, most outside-train first
    checks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # campaign -> its checks rows
    compare: dict[str, Any] | None = None  # base, cand, threshold, rows (harness.compare.Row dicts)


@dataclass
class Report:
    html: str
    data: ReportData

    def summary(self) -> str:
        d = self.data
        runs = sum(d.outcomes.values())
        return (f"{runs} run(s), {len(d.measurements)} measurement(s)"
                + (f"; utilisation of {d.run['run_id']}" if d.run else "; no run for the utilisation panels"))


def method_of(experiment: str | None) -> str:
    exp = EXPERIMENTS.get(str(experiment)) if experiment else None
    return exp.method if exp is not None else str(experiment or "?")


def load_report_data(store: Store, campaign: str | None = None, run_id: str | None = None,
                     now: _dt.datetime | None = None) -> ReportData:
    """Everything the page shows, from an open (read-only) store."""
    known = store.campaign_names()
    if store.run_total() == 0 and not known:
        raise ReportError(f"{store.path} has no runs: nothing to report. Run `sbench collect` first "
                          f"(or pass --db with another results database).")
    if campaign is not None and campaign not in known:
        raise InputError(f"--campaign {campaign!r}: not in {store.path}; campaigns there: {', '.join(known)}")
    measurements = store.report_measurements(campaign)
    for m in measurements:
        m["method"] = method_of(m["experiment"])
    per_run: dict[str, dict[str, float]] = {}
    for s in store.stage_seconds(campaign):
        name = f"{s['stage']} (unfinished)" if s["unfinished"] else s["stage"]
        per_run.setdefault(s["run_id"], {})[name] = max(float(s["seconds"]), 0.0)
    stage_runs = [dict(r, method=method_of(r["experiment"]), stages=per_run[r["run_id"]])
                  for r in store.report_runs(campaign) if r["run_id"] in per_run]
    data = ReportData(db=str(store.path), generated_at=now or _dt.datetime.now(_dt.timezone.utc),
                      campaign=campaign, campaigns=store.campaign_rows(campaign),
                      outcomes=store.outcome_counts(campaign), measurements=measurements,
                      stage_runs=stage_runs, gpu_samples=store.gpu_sample_count(campaign))
    _load_run(store, data, campaign, run_id)
    data.fabric = store.fabric_rows()
    data.overhead = store.overhead_rows(campaign)
    data.checks = {c: check_results(store, c) for c in sorted(references_of(store)) if campaign in (None, c)}
    return data


def load_compare(store: Store, base: str, cand: str, threshold: float,
                 metrics: Sequence[str] = ()) -> dict[str, Any]:
    """The compare section's data: ``sbench compare BASE CAND`` over the same store."""
    rows = compare_in(store, base, cand, list(metrics), threshold)
    return {"base": base, "cand": cand, "threshold": threshold, "rows": [r.to_dict() for r in rows]}


def _load_run(store: Store, data: ReportData, campaign: str | None, run_id: str | None) -> None:
    """Pick the run of the utilisation panels and load its samples, averaged into time buckets."""
    if run_id is not None:
        row = store.report_run(run_id)
        if row is None:
            some = store.some_run_ids(3)
            raise InputError(f"--run {run_id!r}: no such run in {store.path}; run ids look like "
                             f"{', '.join(some)} (list them: sbench query \"SELECT run_id FROM runs\")")
        choice = "chosen with --run"
    else:
        row = store.report_run(campaign=campaign, pick="longest_ok")
        choice = "the longest ok run; pick another with --run RUN_ID"
        if row is None:  # no ok run: the one with the most samples, if any has samples
            row = store.report_run(campaign=campaign, pick="most_samples")
            choice = "no ok run: the run with the most samples; pick another with --run RUN_ID"
    if row is None:
        return
    data.run, data.run_choice = row, choice
    data.traces = store.run_traces(row["run_id"], MAX_TRACE_POINTS)
    offsets = [t["offset"] for t in data.traces if t["offset"] is not None]
    data.run_offset = sum(offsets) / len(offsets) if offsets else None


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


# -- charts --------------------------------------------------------------------------------------------------
@dataclass
class Series:
    """One legend entry. ``points`` are (x, y, tooltip); y None is drawn pinned to the top edge."""

    name: str
    points: list[tuple[float, float | None, str]]
    color: str
    marker: str = "o"  # "o" circle, "x" cross, "" none
    line: bool = True  # through the mean y at each x, in x order
    css: str = "pt"  # class of each marker
    dash: str = ""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(v: float | None) -> str:
    """A short human number: 1.23M, 45.6k, 12, 0.5."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 100 or float(v).is_integer():
        return str(int(round(v)))
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> tuple[list[float], float, float]:
    """About *n* round ticks covering [lo, hi], and the widened domain they span."""
    if not hi > lo:
        lo, hi = (lo - 1, hi + 1) if lo != 0 else (0.0, 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first, last = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    count = int(round((last - first) / step))
    return [first + i * step for i in range(count + 1)], first, last


def no_data(message: str) -> str:
    return f'<div class="nodata">No data: {esc(message)}</div>'


def _legend(entries: Sequence[tuple[str, str, str, str]], x: float, y: float) -> str:
    """Entries (name, colour, marker, dash) in a column starting at (x, y)."""
    out = []
    for i, (name, color, marker, dash) in enumerate(entries):
        yy = y + i * 18
        short = name if len(name) <= 34 else name[:33] + "…"
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        sym = "" if marker == "x" else (f'<line x1="{x}" y1="{yy}" x2="{x + 22}" y2="{yy}" stroke="{color}" '
                                        f'stroke-width="2"{dash_attr}/>')
        sym += _marker(marker, x + 11, yy, color, "")
        out.append(f'<g class="legend-item">{sym}<text x="{x + 28}" y="{yy + 4}"><title>{esc(name)}</title>'
                   f"{esc(short)}</text></g>")
    return "".join(out)


def _marker(kind: str, cx: float, cy: float, color: str, css: str, tip: str = "") -> str:
    title = f"<title>{esc(tip)}</title>" if tip else ""
    cls = f' class="{css}"' if css else ""
    if kind == "o":
        return (f'<circle{cls} cx="{cx:.1f}" cy="{cy:.1f}" r="3.6" fill="{color}" stroke="#fff" '
                f'stroke-width="1">{title}</circle>')
    if kind == "x":
        a, b, c, d_ = cx - 4.5, cx + 4.5, cy - 4.5, cy + 4.5
        d = f"M{a:.1f},{c:.1f}L{b:.1f},{d_:.1f}M{a:.1f},{d_:.1f}L{b:.1f},{c:.1f}"
        return f'<path{cls} d="{d}" stroke="{color}" stroke-width="2.4" fill="none">{title}</path>'
    return ""


def line_chart(series: Sequence[Series], *, x_label: str, y_label: str, log2_x: bool = False,
               y_range: tuple[float, float] | None = None, bands: Sequence[tuple[float, float, str, str]] = (),
               width: int = 660, height: int = 300, empty: str = "nothing to plot") -> str:
    """An SVG line/scatter chart with axes, ticks, optional shaded x bands (x0, x1, label, colour)
    and a legend on the right. Markers carry their tooltip as <title>."""
    pts = [(x, y) for s in series for x, y, _ in s.points]
    if not pts:
        return no_data(empty)
    legend_w = 230
    ml, mr, mt, mb = 62, legend_w, 14, 46
    height = max(height, mt + 18 * len(series) + 24)
    pw, ph = width - ml - mr, height - mt - mb
    f = (lambda v: math.log2(v)) if log2_x else (lambda v: float(v))
    fx = [f(x) for x, _ in pts]
    if log2_x:
        lo, hi = min(fx) - 0.35, max(fx) + 0.35
        xticks = [float(2 ** k) for k in range(math.ceil(lo), math.floor(hi) + 1)]
    else:
        fx += [v for b in bands for v in b[:2]]
        xticks, lo, hi = nice_ticks(min(fx), max(fx), 8)
    ys = [y for _, y in pts if y is not None]
    if y_range is not None:
        yticks, ylo, yhi = nice_ticks(*y_range, 5)
    else:
        yticks, ylo, yhi = nice_ticks(0.0, max(ys) if ys and max(ys) > 0 else 1.0, 5)

    def sx(v: float) -> float:
        return ml + (f(v) - lo) / (hi - lo) * pw

    def sy(v: float | None) -> float:
        return mt + 7 if v is None else mt + ph - (v - ylo) / (yhi - ylo) * ph

    o = [f'<svg class="chart" viewBox="0 0 {width} {height}" '
         f'width="{width}" height="{height}" role="img" aria-label="{esc(y_label)} vs {esc(x_label)}">']
    labels = []
    for i, (x0, x1, label, color) in enumerate(bands):  # later bands on top, labels above all, one per line
        a, b = max(sx(x0), ml), min(sx(x1), ml + pw)
        if b > a:
            o.append(f'<rect class="band" x="{a:.1f}" y="{mt}" width="{b - a:.1f}" height="{ph}" fill="{color}">'
                     f"<title>{esc(label)}</title></rect>")
            labels.append(f'<text class="band-label" x="{a + 4:.1f}" y="{mt + 12 + 13 * i}">{esc(label)}</text>')
    o += labels
    for t in yticks:
        y = sy(t)
        o.append(f'<line class="grid" x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                 f'<text class="tick" x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    for t in xticks:
        x = sx(t)
        o.append(f'<line class="tickmark" x1="{x:.1f}" x2="{x:.1f}" y1="{mt + ph}" y2="{mt + ph + 5}"/>'
                 f'<text class="tick" x="{x:.1f}" y="{mt + ph + 17}" text-anchor="middle">{fmt(t)}</text>')
    o.append(f'<path class="axis" d="M{ml},{mt}V{mt + ph}H{ml + pw}"/>'
             f'<text class="label" x="{ml + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">{esc(x_label)}</text>'
             f'<text class="label" transform="translate(14,{mt + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
             f"{esc(y_label)}</text>")
    for s in series:
        if s.line and len(s.points) > 1:
            by_x: dict[float, list[float]] = {}
            for x, y, _ in s.points:
                if y is not None:
                    by_x.setdefault(x, []).append(y)
            line = " ".join(f"{sx(x):.1f},{sy(sum(v) / len(v)):.1f}" for x, v in sorted(by_x.items()))
            dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
            o.append(f'<polyline class="trace" data-n="{len(by_x)}" points="{line}" fill="none" '
                     f'stroke="{s.color}" stroke-width="1.8"{dash}><title>{esc(s.name)}</title></polyline>')
        o += [_marker(s.marker, sx(x), sy(y), s.color, s.css, tip) for x, y, tip in s.points]
    o.append(_legend([(s.name, s.color, s.marker, s.dash) for s in series], ml + pw + 18, mt + 8))
    o.append("</svg>")
    return "".join(o)


def bar_chart(rows: Sequence[tuple[str, Sequence[tuple[str, float]], str]], colors: Mapping[str, str], *,
              x_label: str, width: int = 1300, bar_h: int = 15, label_w: int = 380,
              empty: str = "nothing to plot", unit: str = "s") -> str:
    """Horizontal stacked bars: rows of (label, [(segment, value)], label css class); a legend on top."""
    rows = [r for r in rows if r[1]]
    if not rows:
        return no_data(empty)
    names = list(dict.fromkeys(n for _, segs, _ in rows for n, _ in segs))
    mt, mb, mr, gap = 30, 40, 60, 5
    pw = width - label_w - mr
    height = mt + len(rows) * (bar_h + gap) + mb
    ticks, _, hi = nice_ticks(0.0, max(sum(v for _, v in segs) for _, segs, _ in rows) or 1.0, 8)

    def sx(v: float) -> float:
        return label_w + v / hi * pw

    o = [f'<svg class="chart" viewBox="0 0 {width} {height}" '
         f'width="{width}" height="{height}" role="img" aria-label="{esc(x_label)}">']
    x = label_w
    for n in names:  # legend
        o.append(f'<rect x="{x}" y="6" width="12" height="12" fill="{colors.get(n, "#999")}"/>'
                 f'<text x="{x + 16}" y="16">{esc(n)}</text>')
        x += 28 + 7 * len(n)
    base = mt + len(rows) * (bar_h + gap)
    for t in ticks:
        o.append(f'<line class="grid" x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{mt - 4}" y2="{base}"/>'
                 f'<text class="tick" x="{sx(t):.1f}" y="{base + 15}" text-anchor="middle">{fmt(t)}</text>')
    for i, (label, segs, css) in enumerate(rows):
        y = mt + i * (bar_h + gap)
        short = label if len(label) <= 62 else label[:61] + "…"
        o.append(f'<text class="rowlabel {esc(css)}" x="{label_w - 8}" y="{y + bar_h - 3}" text-anchor="end">'
                 f"<title>{esc(label)}</title>{esc(short)}</text>")
        acc = 0.0
        for n, v in segs:
            w = max(sx(acc + v) - sx(acc), 0.0)
            o.append(f'<rect class="seg" data-seg="{esc(n)}" x="{sx(acc):.2f}" y="{y}" width="{w:.2f}" '
                     f'height="{bar_h}" fill="{colors.get(n, "#999")}"><title>{esc(label)}: {esc(n)} '
                     f"{v:.3g} {esc(unit)}</title></rect>")
            acc += v
        o.append(f'<text class="tick" x="{sx(acc) + 4:.1f}" y="{y + bar_h - 3}">{fmt(round(acc, 1))}</text>')
    o.append(f'<path class="axis" d="M{label_w},{mt - 4}V{base}H{label_w + pw}"/>'
             f'<text class="label" x="{label_w + pw / 2:.1f}" y="{height - 6}" text-anchor="middle">'
             f"{esc(x_label)}</text></svg>")
    return "".join(o)


# -- the page ------------------------------------------------------------------------------------------------
SeriesKey = tuple[str, str, int, str]  # model, method, number_gpus, trainer


def _series_key(m: Mapping[str, Any]) -> SeriesKey:
    return (str(m.get("model_name") or "?"), str(m.get("method") or "?"), int(m.get("number_gpus") or 0),
            str(m.get("trainer") or "sbench"))


def _series_name(key: SeriesKey, word: str = "GPU") -> str:
    # The sbench trainer is the default: only the other trainer is named.
    return f"{key[0]} · {key[1]} · {key[2]} {word}" + (f" · {key[3]}" if key[3] != "sbench" else "")


def _is_pow2(v: Any) -> bool:
    return isinstance(v, int) and v > 0 and v & (v - 1) == 0


def metric_chart(measurements: Sequence[Mapping[str, Any]], metric: str, y_label: str, unit: str = "",
                 y_range: tuple[float, float] | None = None, word: str = "GPU", width: int = 660,
                 height: int = 300) -> str:
    """One marker per valid measurement of *metric* vs batch size, lines through the means; OOM crosses.
    *word* names what ``number_gpus`` counts (GPUs, or worker processes on a CPU-only run)."""
    colors: dict[SeriesKey, str] = {}
    groups: dict[SeriesKey, list[tuple[float, float | None, str]]] = {}
    ooms: list[tuple[float, float | None, str]] = []
    for m in measurements:
        if m.get("batch_size") is None:
            continue
        key = _series_key(m)
        name = _series_name(key, word)
        if m.get("is_valid") is False:
            ooms.append((m["batch_size"], None, f"OOM / invalid: {name}, batch {m['batch_size']}\n"
                                              f"run {m['run_id']}\n{m.get('run_reason') or ''}".strip()))
        elif m.get(metric) is not None:
            groups.setdefault(key, []).append((m["batch_size"], float(m[metric]),
                                               f"{name}, batch {m['batch_size']}: {fmt(m[metric])}{unit}\n"
                                               f"run {m['run_id']}"))
    for i, key in enumerate(sorted({*groups})):
        colors[key] = PALETTE[i % len(PALETTE)]
    series = [Series(_series_name(k, word), pts, colors[k], dash="" if i < len(PALETTE) else "5,3")
              for i, (k, pts) in enumerate(sorted(groups.items()))]
    if ooms:
        series.append(Series("OOM (invalid run)", ooms, OOM_COLOR, marker="x", line=False, css="oom"))
    xs = [x for s in series for x, _, _ in s.points]
    log2 = bool(xs) and all(map(_is_pow2, xs))
    return line_chart(series, x_label="batch size" + (" (log2 scale)" if log2 else ""), y_label=y_label,
                      log2_x=log2, y_range=y_range, width=width, height=height,
                      empty=f"no measurement with {metric} and a batch size in this selection")


def _lighter(color: str, keep: float = 0.45) -> str:
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - c) * keep):02x}" for c in rgb)


def stage_chart(stage_runs: Sequence[Mapping[str, Any]], word: str = "GPU") -> tuple[str, str]:
    seen = {s for r in stage_runs for s in r["stages"]}
    bases = list(dict.fromkeys([*STAGE_ORDER, *sorted({s.removesuffix(" (unfinished)") for s in seen})]))
    colors = dict(STAGE_COLORS)
    colors.update({n: PALETTE[(i + 3) % len(PALETTE)] for i, n in enumerate(n for n in bases if n not in colors)})
    names = [n for b in bases for n in (b, f"{b} (unfinished)")]
    colors.update({f"{b} (unfinished)": _lighter(colors[b]) for b in bases})
    rows = []
    for r in stage_runs[:MAX_STAGE_BARS]:
        tag = {"invalid": "OOM ", "failed": "FAILED ", None: "PENDING "}.get(r["outcome"], "")
        label = (f"{tag}{r['model_name'] or '?'} · {r['method']} · {r['number_gpus']} {word} · bs {r['batch_size']}"
                 f" · {str(r['point_id'])[:8]}.r{r['repeat']}a{r['attempt']}")
        segs = [(n, r["stages"][n]) for n in names if n in r["stages"]]
        rows.append((label, segs, r["outcome"] or "pending"))
    note = (f"Showing the first {MAX_STAGE_BARS} of {len(stage_runs)} runs; narrow with --campaign."
            if len(stage_runs) > MAX_STAGE_BARS else "")
    return bar_chart(rows, colors, x_label="seconds (per stage: the slowest host/rank, summed over trials)",
                     empty="no stage timings recorded for these runs"), note


def run_bands(run: Mapping[str, Any], offset: float) -> list[tuple[float, float, str, str]]:
    """The measured window (the measurement's, else training) and the warm-up, on the traces' x axis."""
    bands = []
    t0, t1, warm = run.get("train_start_wall"), run.get("train_end_wall"), run.get("warmup_end_wall")
    w0 = run.get("window_start_wall") or t0
    w1 = run.get("window_end_wall") or t1
    if w0 is not None and w1 is not None and w1 > w0:
        bands.append((w0 - offset, w1 - offset, "measured window", "#dcefd9"))
    if t0 is not None and warm is not None and warm > t0:
        bands.append((t0 - offset, warm - offset, "warm-up", "#f1dcb0"))
    return bands


def utilisation_charts(data: ReportData) -> str:
    run = data.run
    if run is None:
        return no_data("no run with samples in this selection")
    if not data.traces:
        return no_data(f"run {run['run_id']} has no samples")
    bands = run_bands(run, data.run_offset or 0.0)
    out = []
    for kind, metric, title, unit, y_range in (
            ("gpu", "gpu_util", "GPU utilisation (%)", "%", (0.0, 100.0)),
            ("gpu", "gpu_mem_pct", "GPU memory used (% of device)", "%", (0.0, 100.0)),
            ("proc", "cpu_pct", "process CPU (%; 100 = one core)", "%", None)):
        keys = sorted({(t["host"], t["device"]) for t in data.traces if t["kind"] == kind})
        series = []
        for i, (host, dev) in enumerate(keys):
            name = f"{host} gpu{dev}" if kind == "gpu" else f"{host} process tree"
            pts = [(t["x"], t[metric], "") for t in data.traces
                   if t["kind"] == kind and (t["host"], t["device"]) == (host, dev) and t[metric] is not None]
            if pts:
                series.append(Series(name, pts, PALETTE[i % len(PALETTE)], marker="",
                                     dash="" if i < len(PALETTE) else "5,3"))
        empty = ("no GPU samples for this run (no GPU was sampled)" if kind == "gpu"
                 else "no process samples for this run")
        out.append(f'<div class="panel"><h3>{esc(title)}</h3>'
                   + line_chart(series, x_label="seconds since training start", y_label=title, y_range=y_range,
                                bands=bands, width=1300, height=240, empty=empty) + "</div>")
    return "".join(out)


TABLE_COLUMNS = (  # (header, key, format)
    ("model", "model_name", str), ("method", "method", str), ("GPUs", "number_gpus", str),
    ("nodes", "number_nodes", str), ("batch", "batch_size", str), ("max len", "model_max_length", str),
    ("valid", "is_valid", lambda v: "yes" if v else "OOM"), ("dataset tok/s", "dataset_tokens_per_second", fmt),
    ("dataset tok/s per GPU", "dataset_tokens_per_second_per_gpu", fmt),
    ("train tok/s", "train_tokens_per_second", fmt), ("GPU util avg %", "gpu_compute_utilization_avg", fmt),
    ("GPU mem peak %", "gpu_memory_utilization_peak", fmt), ("CPU %", "cpu_compute_utilization", fmt),
    ("CPU mem %", "cpu_memory_utilization", fmt), ("runtime s", "train_runtime", fmt),
    ("# meas.", "n", str), ("latest run", "run_id", str),
)


def latest_table(measurements: Sequence[Mapping[str, Any]]) -> str:
    """The latest measurement of each point (valid or not), with how many the point has."""
    latest: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    epoch = _dt.datetime.min
    for m in measurements:
        pid = m["point_id"]
        counts[pid] = counts.get(pid, 0) + 1
        cur = latest.get(pid)
        if cur is None or ((m["ended_at"] or epoch), m["run_id"]) > ((cur["ended_at"] or epoch), cur["run_id"]):
            latest[pid] = dict(m)
    if not latest:
        return no_data("no measurements in this selection")
    rows = sorted(latest.values(), key=lambda m: (_series_key(m), m.get("batch_size") or 0, m["run_id"]))
    head = "".join(f"<th>{esc(h)}</th>" for h, _, _ in TABLE_COLUMNS)
    body = []
    for m in rows:
        m["n"] = counts[m["point_id"]]
        cells = "".join(f"<td>{esc('' if m.get(k) is None and k != 'is_valid' else fn(m.get(k)))}</td>"
                        for _, k, fn in TABLE_COLUMNS)
        body.append(f'<tr class="{"ok" if m.get("is_valid") else "oom"}">{cells}</tr>')
    return f'<table class="latest"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


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


def _section(sid: str, title: str, note: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2><p class="note">{note}</p>{body}</section>'


def _run_line(data: ReportData, word: str) -> str:
    run = data.run
    if run is None:
        return ""
    shaded = [b[2] for b in run_bands(run, 0.0)]
    return (f"Run <code>{esc(run['run_id'])}</code> ({esc(run.get('model_name') or '?')}, "
            f"{esc(method_of(run.get('experiment')))}, {run.get('number_gpus')} {word}, batch "
            f"{run.get('batch_size')}, outcome {esc(run.get('outcome') or 'pending')}): {esc(data.run_choice)}."
            + (" Shaded in green: the measured window the properties are averaged over." if "measured window"
               in shaded else "")
            + (" In sand: the warm-up." if "warm-up" in shaded else ""))


def fabric_charts(rows: Sequence[Mapping[str, Any]]) -> str:
    """Bus bandwidth vs message size, one panel per collective, one line per fabric run."""
    if not rows:
        return no_data("no fabric run yet: sbench fabric -i INVENTORY --partition P --nodes N")
    runs = sorted({r["fabric_id"] for r in rows})
    colors = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(runs)}
    panels = []
    for op in ("all_reduce", "all_gather"):
        series = []
        for f in runs:
            pts = [(float(r["bytes"]), r["busbw_gbps"],
                    f"{f}: {op} {int(r['bytes'])} B, {r['time_us']:.1f} us, busbw {r['busbw_gbps']:.3f} GB/s")
                   for r in rows if r["fabric_id"] == f and r["op"] == op and r.get("bytes") and r.get("busbw_gbps")]
            if pts:
                first = next(r for r in rows if r["fabric_id"] == f)
                tr = first.get("transport_by_host")
                tr = json.loads(tr) if isinstance(tr, str) else (tr or {})
                kinds = ",".join(sorted({t for t in tr.values() if t})) or first.get("backend") or "?"
                series.append(Series(f"{first['partition']} x{first['nodes']} ({kinds}) {f[:15]}", pts, colors[f]))
        panels.append(f'<div class="panel"><h3>{op.replace("_", "-")} bus bandwidth</h3>'
                      + line_chart(series, x_label="message size (bytes, log2)", y_label="busbw (GB/s)", log2_x=True,
                                   empty=f"no {op} rows") + "</div>")
    return '<div class="row">' + "".join(panels) + "</div>"


OVERHEAD_ROWS = 20


def overhead_table(rows: Sequence[Mapping[str, Any]], word: str = "GPU") -> str:
    """Per run and host: start-up (first event to first train stage) and time outside training."""
    if not rows:
        return no_data("no stage events collected")
    starts = sorted(r["startup_s"] for r in rows if r.get("startup_s") is not None)
    in_job = sum(1 for r in rows if r.get("prepared_in_job"))
    head = (f"<p>{len(rows)} run × host row(s); start-up median {fmt(starts[len(starts) // 2]) if starts else '–'} s, "
            f"worst {fmt(starts[-1]) if starts else '–'} s"
            + (f"; <b>{in_job} prepared their data in the job</b> (run sbench prepare before submitting)" if in_job
               else "") + ".</p>")
    cols = ["model", f"{word}s", "batch", "rep", "host", "start-up s", "outside train s", "outside train",
            "prepared in job"]
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(v)}</td>" for v in (
            r.get("model_name"), r.get("number_gpus"), r.get("batch_size"), r.get("repeat"), r.get("host"),
            fmt(r.get("startup_s")), fmt(r.get("outside_train_s")),
            "" if r.get("outside_train_fraction") is None else f"{100 * r['outside_train_fraction']:.0f}%",
            "yes" if r.get("prepared_in_job") else "")) + "</tr>"
        for r in rows[:OVERHEAD_ROWS])
    more = f"<p class=\"note\">{len(rows) - OVERHEAD_ROWS} more in the run_overhead view.</p>" \
        if len(rows) > OVERHEAD_ROWS else ""
    return (head + "<table><thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr></thead><tbody>"
            + body + "</tbody></table>" + more)


VERDICT_COLORS = {"regression": OOM_COLOR, "improvement": "#59a14f", "noise": "#7f7f7f"}


def ratio_chart(rows: Sequence[Mapping[str, Any]], threshold: float, width: int = 1100) -> str:
    """One line per point and metric: the candidate/base ratio of medians, its 95 % interval as a
    whisker, the ±threshold band shaded and 1.0 marked."""
    if not rows:
        return no_data("BASE and CAND share no measured point")
    lo = min([r["low"] for r in rows] + [1 - threshold]) * 0.97
    hi = max([r["high"] for r in rows] + [1 + threshold]) * 1.03
    ticks, lo, hi = nice_ticks(lo, hi)
    left, right, top, row_h = 330, 30, 26, 22
    height = top + row_h * len(rows) + 34
    plot_w = width - left - right

    def sx(v: float) -> float:
        return left + (v - lo) / (hi - lo) * plot_w if hi > lo else left

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">',
           f'<rect x="{sx(1 - threshold):.1f}" y="{top - 6}" width="{sx(1 + threshold) - sx(1 - threshold):.1f}" '
           f'height="{row_h * len(rows) + 6}" fill="#eeeeee"/>']
    for t in ticks:
        out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top - 6}" y2="{height - 30}" stroke="#ddd"/>'
                   f'<text x="{sx(t):.1f}" y="{height - 14}" text-anchor="middle" class="tick">{fmt(t)}</text>')
    out.append(f'<line x1="{sx(1):.1f}" x2="{sx(1):.1f}" y1="{top - 6}" y2="{height - 30}" stroke="#333"/>')
    for i, r in enumerate(rows):
        y = top + row_h * i + row_h / 2
        lab = r.get("labels") or {}
        name = f"{lab.get('model_name', '?')} ×{lab.get('number_gpus', '?')} b{lab.get('batch_size', '?')} {r['metric']}"
        color = VERDICT_COLORS.get(str(r["verdict"]).split(" ")[0], "#7f7f7f")
        tip = (f"{r['point_id']} {r['metric']}: ratio {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}], "
               f"n {r['n_base']}/{r['n_cand']}, {r['verdict']}")
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end" class="tick">{esc(name)}</text>'
                   f'<line x1="{sx(r["low"]):.1f}" x2="{sx(r["high"]):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="{color}" stroke-width="2"/>'
                   f'<circle cx="{sx(r["ratio"]):.1f}" cy="{y:.1f}" r="4.5" fill="{color}"><title>{esc(tip)}</title>'
                   "</circle>")
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 1}" text-anchor="middle" class="tick">'
               "candidate / base (ratio of medians, 95 % bootstrap interval)</text></svg>")
    return "".join(out)


def compare_section(cmp: Mapping[str, Any] | None) -> str:
    if not cmp:
        return ""
    rows = cmp["rows"]
    n_reg = sum(1 for r in rows if str(r["verdict"]).startswith("regression"))
    note = (f"BASE {cmp['base']} vs CAND {cmp['cand']}, paired by point; threshold {cmp['threshold']:.0%} "
            "(shaded). A regression is worse by more than the threshold with an interval that does not reach 1.0. "
            f"{len(rows)} comparison(s), {n_reg} regression(s).")
    return _section("compare", "Compare", note, f'<div class="wide">{ratio_chart(rows, cmp["threshold"])}</div>')


def checks_section(checks: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    if not checks:
        return ""
    parts = []
    for camp, rows in checks.items():
        n = {s: sum(1 for r in rows if r["status"] == s) for s in ("pass", "fail", "missing")}
        parts.append(f"<h3>{esc(camp)}: {n['pass']} pass, {n['fail']} fail, {n['missing']} missing</h3>")
        cols = ["status", "metric", "model", "gpus", "batch", "rep", "value", "reference", "bounds", "reason"]
        body = "".join(
            f'<tr class="{"oom" if r["status"] == "fail" else ""}">' + "".join(f"<td>{esc(v)}</td>" for v in (
                r["status"], r["metric"], r.get("model_name"), r.get("number_gpus"), r.get("batch_size"),
                r["repeat"], fmt(r["value"]), fmt(r["reference"]),
                f"{fmt(r['lower_bound']) or '−∞'} … {fmt(r['upper_bound']) or '∞'}", r["reason"] or "")) + "</tr>"
            for r in rows)
        parts.append("<table><thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr></thead><tbody>"
                     + body + "</tbody></table>")
    return _section("checks", "Checks against references",
                    "Each point's latest attempt against the sweep's references (sbench check exits 1 on a fail).",
                    '<div class="wide">' + "".join(parts) + "</div>")


MEMORY_COLORS = {"parameters": "#4e79a7", "gradients": "#f28e2b", "optimizer state": "#59a14f",
                 "activations (predicted)": "#bab0ac"}


def memory_section(ms: Sequence[Mapping[str, Any]], word: str) -> str:
    """Per point (newest run): rank 0's measured parameter, gradient and optimizer bytes, and the
    prediction beside it (with its activation estimate)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for m in ms:
        if m.get("params_bytes") is not None or m.get("predicted_total_bytes") is not None:
            latest[m["point_id"]] = m
    if not latest:
        return ""
    top = max(max(m.get("predicted_total_bytes") or 0, (m.get("params_bytes") or 0) + (m.get("grads_bytes") or 0)
                  + (m.get("optimizer_bytes") or 0)) for m in latest.values())
    scale, unit = (1e9, "GB") if top >= 1e9 else (1e6, "MB")
    rows = []
    for m in list(latest.values())[:MAX_STAGE_BARS // 2]:
        label = (f"{m.get('model_name') or '?'} · {m.get('method')} · {m.get('number_gpus')} {word} · "
                 f"bs {m.get('batch_size')} · {str(m['point_id'])[:8]}")
        if m.get("params_bytes") is not None:
            rows.append((f"{label} measured", [(n, (m.get(k) or 0) / scale) for n, k in (
                ("parameters", "params_bytes"), ("gradients", "grads_bytes"),
                ("optimizer state", "optimizer_bytes"))], "ok"))
        if m.get("predicted_total_bytes") is not None:
            css = "invalid" if m.get("predicted_oom") else "ok"
            rows.append((f"{label} predicted", [(n, (m.get(k) or 0) / scale) for n, k in (
                ("parameters", "predicted_params_bytes"), ("gradients", "predicted_grads_bytes"),
                ("optimizer state", "predicted_optimizer_bytes"),
                ("activations (predicted)", "predicted_activation_bytes"))], css))
    chart = bar_chart(rows, MEMORY_COLORS, x_label=f"{unit} per device (rank 0)", unit=unit,
                      empty="no memory snapshots")
    measured = [m for m in latest.values() if m.get("activation_bytes")]
    if measured:
        def row(m: Mapping[str, Any]) -> str:
            err = m.get("activation_error")
            return (f"<tr><td>{esc(str(m['point_id'])[:8])}</td><td>{m['activation_bytes'] / scale:.3g} {unit}</td>"
                    f"<td>{(m.get('predicted_activation_bytes') or 0) / scale:.3g} {unit}</td>"
                    f"<td>{'' if err is None else f'{err:+.1%}'}</td></tr>")

        acts = ('<table class="small"><tr><th>point</th><th>activations measured</th><th>predicted</th>'
                '<th>estimate error</th></tr>' + "".join(row(m) for m in measured) + "</table>")
    else:
        acts = ("<p>Activation estimate error: not measurable in these runs (no CUDA allocator figures; "
                "on CUDA it is the forward pass's growth of allocated memory, compared with the estimate).</p>")
    return _section("memory-breakdown", "Memory breakdown per point",
                    "Measured: rank 0's parameter, gradient and optimizer-state bytes after its last recorded optimizer "
                    "step, summed tensor by tensor (the local shard under FSDP, ZeRO's partitions under DeepSpeed; "
                    "the memory table has every phase). Predicted: harness/memory.py from the model's config.json, "
                    "with its activation estimate; a red label is a point predicted not to fit.",
                    f'<div class="wide">{chart}{acts}</div>')


def efficiency_section(ms: Sequence[Mapping[str, Any]], word: str) -> str:
    if not any(m.get("model_tflops_per_gpu") is not None for m in ms):
        return ""
    has_mfu = any(m.get("mfu") is not None for m in ms)
    body = ('<div class="row"><div class="panel"><h3>achieved model TFLOP/s per device</h3>'
            + metric_chart(ms, "model_tflops_per_gpu", "model TFLOP/s per device", word=word)
            + '</div><div class="panel"><h3>MFU (model FLOPs / peak)</h3>'
            + (metric_chart(ms, "mfu", "MFU", word=word) if has_mfu else
               no_data("no peak TFLOP/s known for this hardware: set peak_tflops on the partition"))
            + "</div></div>")
    return _section("efficiency", "Efficiency: achieved TFLOP/s and MFU",
                    "Model FLOPs per token from the model config (6·N plus attention; harness/flops.py) × train tokens "
                    "per second per device. MFU divides by the device's peak dense TFLOP/s for the compute dtype "
                    "(harness/spec/gpu_peaks.yaml or the inventory's peak_tflops).", body)


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
        _section("throughput", "1. Throughput vs batch size",
                 "dataset_tokens_per_second of every valid measurement (one marker each); the line joins the mean "
                 f"at each batch size, one line per model × method × number of {word}s. Red × = out of GPU memory "
                 "(invalid run, no throughput), drawn at the top edge.",
                 metric_chart(ms, "dataset_tokens_per_second", "dataset tokens / s", word=word, width=1300,
                              height=360)),
        _section("memory", "2. Memory vs batch size",
                 "Left: gpu_memory_utilization_peak, the highest GPU memory sample of any device in the measured "
                 "window. Right: cpu_memory_utilization, the training process tree's share of host memory. "
                 "Red × = OOM (invalid run), drawn at the top edge."
                 + ("" if data.gpu_samples else " <b>No GPUs were sampled: the GPU values below are 0.0.</b>"),
                 memory),
        _section("stages", "3. Stage time breakdown per run",
                 "Wall seconds per stage; OOM runs in red, failed runs in orange."
                 + (f" {esc(stage_note)}" if stage_note else "")
                 + " Below: per run and host, the seconds from the node runner's start to the first train stage "
                 "(start-up) and the time outside the train stage (run_overhead view), the slowest first.",
                 f'<div class="wide">{stages}</div><div class="wide">{overhead_table(data.overhead, word)}</div>'),
        _section("utilisation", "4. Utilisation over time", _run_line(data, word), utilisation_charts(data)),
        _section("fabric", "5. Fabric: collective bandwidth across nodes",
                 "sbench fabric runs: bus bandwidth of all-reduce (algbw × 2(n−1)/n) and all-gather (algbw × (n−1)/n) "
                 "by message size, one line per run, labelled partition × nodes and the transport NCCL chose "
                 "(gloo on CPU partitions).", fabric_charts(data.fabric)),
        memory_section(ms, word), efficiency_section(ms, word), checks_section(data.checks),
        compare_section(data.compare),
        _section("latest", "Latest measurement per point",
                 "The newest measurement of each point (OOM rows in red) and how many measurements the point has.",
                 f'<div class="wide">{latest_table(ms)}</div>'),
        "</body></html>"])
