"""The report's sections: from the loaded data (:mod:`harness.report.data`) to HTML.

Each function turns rows into one section's chart, table or whole ``<section>``; the page
(:mod:`harness.report.page`) puts them in order. The charts themselves are :mod:`harness.report.charts`.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.contract.formats import Stage

from .charts import (
    Ratio,
    Series,
    bar_chart,
    esc,
    fmt,
    human_bytes,
    line_chart,
    no_data,
    plural,
    ratio_chart,
)
from .compare import Verdict
from .data import ReportData, method_of

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
           "#17becf", "#8c564b", "#bcbd22", "#7f7f7f")
OOM_COLOR = "#d62728"  # reserved: no series uses red
STAGE_ORDER = (Stage.SETUP, Stage.LAUNCH, Stage.DATASET, Stage.TOKENS, Stage.MODEL_LOAD, Stage.TRAIN, Stage.TEARDOWN)
STAGE_COLORS = {Stage.SETUP: "#bab0ac", Stage.DATASET: "#76b7b2", Stage.TOKENS: "#59a14f", Stage.MODEL_LOAD: "#edc948",
                Stage.TRAIN: "#4e79a7", Stage.TEARDOWN: "#9c755f"}
MAX_STAGE_BARS = 80  # more bars than this are unreadable; the page says how many were left out


def section(sid: str, title: str, note: str, body: str) -> str:
    """One ``<section>`` of the page: its anchor, heading, note (HTML) and body."""
    return f'<section id="{sid}"><h2>{esc(title)}</h2><p class="note">{note}</p>{body}</section>'


TABLE_CLASS = "tbl"  # every table of the page has it: one style (the page's CSS)
_NUMBER = re.compile(r"[−+-]?\d[\d.,]*\s*(?:[kKMGT%]|[KMG]?B|s)?")  # a cell read as a number: right-aligned


def table(head: Sequence[str], rows: Sequence[tuple[Sequence[Any], str]], css: str = "") -> str:
    """One table in the page's shared style: *head*, and rows of (cells, the row's class: "", ``ok``, or
    ``oom``/``fail`` for a row that reads in red). Cells are text (escaped here; None is empty). *css*
    adds a class to the table (``latest``: the wide table of measurements). Numbers are right-aligned."""
    def td(c: Any) -> str:
        text = "" if c is None else str(c)
        return f'<td class="n">{esc(text)}</td>' if _NUMBER.fullmatch(text) else f"<td>{esc(text)}</td>"

    def tr(cells: Sequence[Any], row_class: str) -> str:
        attr = f' class="{esc(row_class)}"' if row_class else ""
        return f"<tr{attr}>" + "".join(td(c) for c in cells) + "</tr>"

    classes = f"{TABLE_CLASS} {css}".strip()
    return (f'<table class="{classes}"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{''.join(tr(c, rc) for c, rc in rows)}</tbody></table>")


SeriesKey = tuple[str, str, str, int, str]  # campaign ("" on a one-campaign page), model, method, number_gpus, trainer


def _series_key(m: Mapping[str, Any], by_campaign: bool = False) -> SeriesKey:
    return (str(m.get("campaign") or "?") if by_campaign else "", str(m.get("model_name") or "?"),
            str(m.get("method") or "?"), int(m.get("number_gpus") or 0), str(m.get("trainer") or "sbench"))


def _series_name(key: SeriesKey, word: str = "GPU") -> str:
    # The sbench trainer is the default: only the other trainer is named.
    return ((f"{key[0]} · " if key[0] else "") + f"{key[1]} · {key[2]} · {plural(key[3], word)}"
            + (f" · {key[4]}" if key[4] != "sbench" else ""))


def _is_pow2(v: Any) -> bool:
    return isinstance(v, int) and v > 0 and v & (v - 1) == 0


def metric_chart(measurements: Sequence[Mapping[str, Any]], metric: str, y_label: str, unit: str = "",
                 y_range: tuple[float, float] | None = None, word: str = "GPU", width: int = 660,
                 height: int = 300, by_campaign: bool = False) -> str:
    """One marker per valid measurement of *metric* vs batch size, lines through the means; OOM crosses.
    *word* names what ``number_gpus`` counts (GPUs, or worker processes on a CPU-only run); *by_campaign*
    draws one line per campaign too (a page of every campaign). The x axis ticks at the batch sizes drawn."""
    colors: dict[SeriesKey, str] = {}
    groups: dict[SeriesKey, list[tuple[float, float | None, str]]] = {}
    ooms: list[tuple[float, float | None, str]] = []
    for m in measurements:
        if m.get("batch_size") is None:
            continue
        key = _series_key(m, by_campaign)
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
                      log2_x=log2, y_range=y_range, width=width, height=height, x_ticks=sorted(set(xs)),
                      integer_x=True,
                      empty=f"no measurement with {metric} and a batch size in this selection")


def _count(n: Any, word: str) -> str:
    """``2 workers``; ``? worker`` when the count is unknown."""
    return plural(int(n), word) if isinstance(n, int) else f"{n if n is not None else '?'} {word}"


def _lighter(color: str, keep: float = 0.45) -> str:
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - c) * keep):02x}" for c in rgb)


def stage_chart(stage_runs: Sequence[Mapping[str, Any]], word: str = "GPU",
                by_campaign: bool = False) -> tuple[str, str]:
    seen = {s for r in stage_runs for s in r["stages"]}
    bases = list(dict.fromkeys([*STAGE_ORDER, *sorted({s.removesuffix(" (unfinished)") for s in seen})]))
    colors = dict(STAGE_COLORS)
    colors.update({n: PALETTE[(i + 3) % len(PALETTE)] for i, n in enumerate(n for n in bases if n not in colors)})
    names = [n for b in bases for n in (b, f"{b} (unfinished)")]
    colors.update({f"{b} (unfinished)": _lighter(colors[b]) for b in bases})
    rows = []
    for r in stage_runs[:MAX_STAGE_BARS]:
        tag = {"invalid": "OOM ", "failed": "FAILED ", None: "PENDING "}.get(r["outcome"], "")
        label = (f"{tag}{r['campaign'] + ' · ' if by_campaign else ''}{r['model_name'] or '?'} · {r['method']} · "
                 f"{_count(r['number_gpus'], word)} · bs {r['batch_size']}"
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
    for kind, metric, title, _unit, y_range in (
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


def _pct(v: Any) -> str:
    return "" if v is None else f"+-{100 * float(v):.1f} %"


TABLE_COLUMNS = (  # (header, key, format): each number the median of the point's measurements
    ("model", "model_name", str), ("method", "method", str), ("GPUs", "number_gpus", str),
    ("nodes", "number_nodes", str), ("batch", "batch_size", str), ("max len", "model_max_length", str),
    ("valid", "is_valid", lambda v: "yes" if v else "OOM"),
    ("repeats", "repeats", str), ("target", "target", str), ("state", "state", str),
    ("dataset tok/s (median)", "dataset_tokens_per_second", fmt), ("spread (min-max)", "spread", str),
    ("precision", "ci_rel_halfwidth", _pct), ("stopped by", "stopped_by", str),
    ("dataset tok/s per GPU", "dataset_tokens_per_second_per_gpu", fmt),
    ("train tok/s", "train_tokens_per_second", fmt), ("GPU util avg %", "gpu_compute_utilization_avg", fmt),
    ("GPU mem peak %", "gpu_memory_utilization_peak", fmt), ("CPU %", "cpu_compute_utilization", fmt),
    ("CPU mem %", "cpu_memory_utilization", fmt), ("runtime s", "train_runtime", fmt),
    ("energy J", "energy_joules", fmt), ("tok/J", "dataset_tokens_per_joule", fmt),
    ("notes", "notes", lambda v: "; ".join(v)),  # what ran otherwise than asked, and the runs' other notes
    ("# meas.", "n", str), ("stability", "stability", str), ("latest run", "run_id", str),
)
MEDIAN_KEYS = ("dataset_tokens_per_second", "ci_rel_halfwidth", "dataset_tokens_per_second_per_gpu",
               "train_tokens_per_second", "gpu_compute_utilization_avg", "gpu_memory_utilization_peak",
               "cpu_compute_utilization", "cpu_memory_utilization", "train_runtime", "energy_joules",
               "dataset_tokens_per_joule")


def _median(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


def latest_table(measurements: Sequence[Mapping[str, Any]], word: str = "GPU", by_campaign: bool = False,
                 stability: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
                 repeats: Mapping[tuple[str, str], Mapping[str, Any]] | None = None) -> str:
    """One row per point (of each campaign with *by_campaign*): its repeats (how many, the target, the state:
    *repeats*, :func:`harness.report.data.point_repeats`), the median of each figure over its valid
    measurements and their spread, the precision interval and what stopped its runs, energy where measured,
    every run's notes, how many measurements it has and, from *stability* (``point_stability`` rows by campaign
    and point), how stable its throughput is across them. A point with no valid measurement is its latest
    (invalid) one. *word* names what ``number_gpus`` counts."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for m in measurements:
        groups.setdefault((str(m.get("campaign")) if by_campaign else "", m["point_id"]), []).append(m)
    if not groups:
        return no_data("no measurements in this selection")
    epoch = _dt.datetime.min
    rows: list[dict[str, Any]] = []
    for ms in groups.values():
        latest = max(ms, key=lambda m: ((m["ended_at"] or epoch), m["run_id"]))
        valid = [m for m in ms if m.get("is_valid")]
        row = dict(latest, n=len(ms))
        if valid:
            row["is_valid"] = True
            for k in MEDIAN_KEYS:
                row[k] = _median([float(m[k]) for m in valid if m.get(k) is not None])
            xs = [float(m["dataset_tokens_per_second"]) for m in valid if m.get("dataset_tokens_per_second")]
            row["spread"] = f"{fmt(min(xs))}-{fmt(max(xs))}" if len(xs) > 1 else None
            row["stopped_by"] = ", ".join(sorted({str(m["stopped_by"]) for m in valid if m.get("stopped_by")})) or None
            row["notes"] = list(dict.fromkeys(n for m in ms for n in (m.get("notes") or []))) or None
        camp = str(latest.get("campaign"))
        row.update((repeats or {}).get((camp, str(latest["point_id"]))) or {})
        st = (stability or {}).get((camp, str(latest["point_id"]))) or {}
        cv = st.get("throughput_cv")
        row["stability"] = None if cv is None else f"{st.get('throughput_stability')} ({100 * cv:.1f} %)"
        rows.append(row)
    rows.sort(key=lambda m: (_series_key(m, by_campaign), m.get("batch_size") or 0, m["run_id"]))
    columns: list[tuple[str, str, Callable[[Any], str]]] = [
        *([("campaign", "campaign", str)] if by_campaign else []), *TABLE_COLUMNS]
    head = [(h.replace("GPU", word) if k in ("number_gpus", "dataset_tokens_per_second_per_gpu") else h)
            for h, k, _ in columns]
    return table(head, [([None if m.get(k) is None and k != "is_valid" else fn(m.get(k)) for _, k, fn in columns],
                         "ok" if m.get("is_valid") else "oom") for m in rows], css="latest")


ATTEMPT_COLUMNS = (  # (header, key, format)
    ("model", "model_name", str), ("GPUs", "number_gpus", str), ("batch", "batch_size", str),
    ("repeat", "repeat", str), ("attempt", "attempt", str), ("sent because", "submit_reason", str),
    ("outcome", "outcome", str), ("dataset tok/s", "dataset_tokens_per_second", fmt),
    ("precision", "ci_rel_halfwidth", _pct), ("stopped by", "stopped_by", str), ("energy J", "energy_joules", fmt),
    ("tok/J", "dataset_tokens_per_joule", fmt), ("excluded", "left_out", str), ("reason", "reason", str),
    ("run", "run_id", str),
)


def attempts_table(attempts: Sequence[Mapping[str, Any]], word: str = "GPU", by_campaign: bool = False) -> str:
    """Every attempt of the points shown: why it was sent (``runs.submit_reason``: new, retry, ``more repeats:
    CV ... > target``), how it ended and what it measured; a run compare and the CV exclude says why."""
    if not attempts:
        return no_data("no attempts in this selection")
    rows = []
    for a in attempts:
        r = dict(a)
        r["outcome"] = a.get("outcome") or (str(a.get("state") or "submitted").lower() + " (not over)")
        r["left_out"] = ("shared host" if a.get("shared_host") else
                         f"busy host ({fmt(a.get('host_other_cpu_pct'))} % other CPU)" if a.get("host_busy") else None)
        r["reason"] = None if a.get("outcome") == "ok" else a.get("reason")
        rows.append(r)
    columns: list[tuple[str, str, Callable[[Any], str]]] = [
        *([("campaign", "campaign", str)] if by_campaign else []), *ATTEMPT_COLUMNS]
    head = [h.replace("GPU", word) if k == "number_gpus" else h for h, k, _ in columns]
    return table(head, [([None if r.get(k) is None else fn(r.get(k)) for _, k, fn in columns],
                         "ok" if r.get("outcome") in ("ok", None) else "oom" if r.get("outcome") == "invalid"
                         else "fail") for r in rows])


def utilisation_note(data: ReportData, word: str) -> str:
    run = data.run
    if run is None:
        return ""
    shaded = [b[2] for b in run_bands(run, 0.0)]
    return (f"Run <code>{esc(run['run_id'])}</code> ({esc(run.get('model_name') or '?')}, "
            f"{esc(method_of(run.get('experiment')))}, {esc(_count(run.get('number_gpus'), word))}, batch "
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
                    f"{f}: {op} {human_bytes(r['bytes'])}B ({int(r['bytes'])} bytes), {r['time_us']:.1f} us, "
                    f"busbw {r['busbw_gbps']:.3f} GB/s")
                   for r in rows if r["fabric_id"] == f and r["op"] == op and r.get("bytes") and r.get("busbw_gbps")]
            if pts:
                first = next(r for r in rows if r["fabric_id"] == f)
                tr = first.get("transport_by_host")
                tr = json.loads(tr) if isinstance(tr, str) else (tr or {})
                kinds = ",".join(sorted({t for t in tr.values() if t})) or first.get("backend") or "?"
                series.append(Series(f"{first['partition']} x{first['nodes']} ({kinds}) {f[:15]}", pts, colors[f]))
        panels.append(f'<div class="panel"><h3>{op.replace("_", "-")} bus bandwidth</h3>'
                      + line_chart(series, x_label="message size (log2 scale; 1K = 1024 bytes)",
                                   y_label="busbw (GB/s)", log2_x=True, x_fmt=human_bytes, empty=f"no {op} rows")
                      + "</div>")
    return '<div class="row">' + "".join(panels) + "</div>"


OVERHEAD_ROWS = 20


def overhead_table(rows: Sequence[Mapping[str, Any]], word: str = "GPU") -> str:
    """Per run and host: start-up (first event to first train stage) and time outside training."""
    if not rows:
        return no_data("no stage events collected")
    starts = sorted(r["startup_s"] for r in rows if r.get("startup_s") is not None)
    in_job = sum(1 for r in rows if r.get("prepared_in_job"))
    head = (f"<p>{plural(len(rows), 'row')} (one per run and host); "
            f"start-up median {fmt(starts[len(starts) // 2]) if starts else '–'} s, "
            f"worst {fmt(starts[-1]) if starts else '–'} s"
            + (f"; <b>{in_job} prepared their data in the job</b> (run sbench prepare before submitting)" if in_job
               else "") + ".</p>")
    cols = ["model", f"{word}s", "batch", "rep", "host", "start-up s", "outside train s", "outside train",
            "prepared in job"]
    body = [((r.get("model_name"), r.get("number_gpus"), r.get("batch_size"), r.get("repeat"), r.get("host"),
              fmt(r.get("startup_s")), fmt(r.get("outside_train_s")),
              "" if r.get("outside_train_fraction") is None else f"{100 * r['outside_train_fraction']:.0f}%",
              "yes" if r.get("prepared_in_job") else ""), "") for r in rows[:OVERHEAD_ROWS]]
    more = f"<p class=\"note\">{len(rows) - OVERHEAD_ROWS} more in the run_overhead view.</p>" \
        if len(rows) > OVERHEAD_ROWS else ""
    return head + table(cols, body) + more


VERDICT_COLORS = {Verdict.REGRESSION: OOM_COLOR, Verdict.IMPROVEMENT: "#59a14f", Verdict.SAME: "#7f7f7f",
                  Verdict.INSUFFICIENT: "#f28e2b"}


def ratio_rows(rows: Sequence[Mapping[str, Any]]) -> list[Ratio]:
    """Compare's rows (one per point and metric) as the lines of a ratio chart, coloured by verdict."""
    out = []
    for r in rows:
        lab = r.get("labels") or {}
        name = (f"{lab.get('model_name', '?')} ×{lab.get('number_gpus', '?')} b{lab.get('batch_size', '?')} "
                f"{r['metric']}")
        no_test = r["low"] is None or r["high"] is None
        interval = ("no interval (no test: a side has fewer than two runs)" if no_test
                    else f"[{r['low']:.3f}, {r['high']:.3f}]")
        tip = (f"{r['point_id']} {r['metric']}: ratio {r['ratio']:.3f} {interval}, "
               f"n {r['n_base']}/{r['n_cand']}, {r['verdict']}")
        out.append(Ratio(name, r["ratio"], r["low"], r["high"], VERDICT_COLORS.get(str(r["verdict"]), "#7f7f7f"), tip))
    return out


RATIO_AXIS = "candidate / base (ratio of medians, 95 % interval of Welch's t on the logs)"


def compare_section(cmp: Mapping[str, Any] | None) -> str:
    if not cmp:
        return ""
    rows = cmp["rows"]
    n_reg = sum(1 for r in rows if r["verdict"] == Verdict.REGRESSION)
    n_und = sum(1 for r in rows if r["verdict"] == Verdict.INSUFFICIENT)
    note = (f"BASE {cmp['base']} vs CAND {cmp['cand']}, paired by point; threshold {cmp['threshold']:.0%} "
            "(shaded). A regression is worse by more than the threshold with an interval that does not reach 1.0; "
            "same: the interval lies inside the band; insufficient repeats (orange): the runs cannot decide. "
            f"{plural(len(rows), 'comparison')}, {n_und} with insufficient repeats, {plural(n_reg, 'regression')}.")
    if cmp.get("excluded_text"):
        note += f" Left out: {cmp['excluded_text']}."
    chart = ratio_chart(ratio_rows(rows), cmp["threshold"], RATIO_AXIS) if rows else \
        no_data("BASE and CAND share no measured point")
    return section("compare", "Compare", note, f'<div class="wide">{chart}</div>')


def checks_section(checks: Mapping[str, Sequence[Mapping[str, Any]]], word: str = "GPU") -> str:
    if not checks:
        return ""
    parts = []
    for camp, rows in checks.items():
        n = {s: sum(1 for r in rows if r["status"] == s) for s in ("pass", "fail", "missing", "shared")}
        parts.append(f"<h3>{esc(camp)}: {n['pass']} pass, {n['fail']} fail, {n['missing']} missing"
                     + (f", {n['shared']} shared (not judged: the host was shared)" if n["shared"] else "") + "</h3>")
        cols = ["status", "metric", "model", f"{word}s", "batch", "rep", "value", "reference", "bounds", "reason"]
        parts.append(table(cols, [(
            (r["status"], r["metric"], r.get("model_name"), r.get("number_gpus"), r.get("batch_size"), r["repeat"],
             fmt(r["value"]), fmt(r["reference"]), f"{fmt(r['lower_bound']) or '−∞'} … {fmt(r['upper_bound']) or '∞'}",
             r["reason"] or ""), "fail" if r["status"] == "fail" else "") for r in rows]))
    return section("checks", "Checks against references",
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
        label = (f"{m.get('model_name') or '?'} · {m.get('method')} · {_count(m.get('number_gpus'), word)} · "
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
        acts = table(["point", "activations measured", "predicted", "estimate error"], [(
            (str(m["point_id"])[:8], f"{m['activation_bytes'] / scale:.3g} {unit}",
             f"{(m.get('predicted_activation_bytes') or 0) / scale:.3g} {unit}",
             "" if m.get("activation_error") is None else f"{m['activation_error']:+.1%}"), "")
            for m in measured])
    else:
        acts = ("<p>Activation estimate error: not measurable in these runs (no CUDA allocator figures; "
                "on CUDA it is the forward pass's growth of allocated memory, compared with the estimate).</p>")
    return section("memory-breakdown", "Memory breakdown per point",
                   "Measured: rank 0's parameter, gradient and optimizer-state bytes after its last recorded "
                   "optimizer step, summed tensor by tensor (the local shard under FSDP, ZeRO's partitions under "
                   "DeepSpeed; the memory table has every phase). Predicted: harness/memory.py from the model's "
                   "config.json, with its activation estimate; a red label is a point predicted not to fit.",
                   f'<div class="wide">{chart}{acts}</div>')


def efficiency_section(ms: Sequence[Mapping[str, Any]], word: str, by_campaign: bool = False) -> str:
    if not any(m.get("model_tflops_per_gpu") is not None for m in ms):
        return ""
    has_mfu = any(m.get("mfu") is not None for m in ms)
    body = ('<div class="row"><div class="panel"><h3>achieved model TFLOP/s per device</h3>'
            + metric_chart(ms, "model_tflops_per_gpu", "model TFLOP/s per device", word=word, by_campaign=by_campaign)
            + '</div><div class="panel"><h3>MFU (model FLOPs / peak)</h3>'
            + (metric_chart(ms, "mfu", "MFU", word=word, by_campaign=by_campaign) if has_mfu else
               no_data("no peak TFLOP/s known for this hardware: set peak_tflops on the partition"))
            + "</div></div>")
    return section("efficiency", "Efficiency: achieved TFLOP/s and MFU",
                   "Model FLOPs per token from the model config (6·N plus attention; harness/flops.py) × train tokens "
                   "per second per device. MFU divides by the device's peak dense TFLOP/s for the compute dtype "
                   "(harness/spec/gpu_peaks.yaml or the inventory's peak_tflops).", body)



def search_section(searches: Sequence[Mapping[str, Any]], word: str = "GPU") -> str:
    """A search campaign's answer (``search:``; ``sbench best`` says the same): its best point with the goal's
    interval, the largest batch that fits per shape with its evidence, and the allocation time it saved beside the
    full grid's estimate."""
    if not searches:
        return ""
    parts = []
    for a in searches:
        (sense, metric), = a["goal"].items()
        b = a["best"]
        best = ("none yet" if not b else f"{b['point_id']}: {metric} {b['value']:,.4g} (95 % interval "
                f"{b['interval'][0]:,.4g} .. {b['interval'][1]:,.4g}, {plural(int(b['runs']), 'run')})")
        saved_h = (float(a["grid_gpu_s_estimate"]) - float(a["gpu_s"])) / 3600
        fits = table(["shape", "largest batch that fits", "largest ok", "smallest OOM", "decided"],
                     [([", ".join(f"{k}={v}" for k, v in m["shape"].items()), m["batch_size"], m["largest_ok"],
                        m["smallest_oom"], "yes" if m["decided"] else "no"], "" if m["batch_size"] else "oom")
                      for m in a["max_batch_size"]])
        decisions = table(["point", "phase", "action", "reason"],
                          [([d["point_id"], d["phase"], d["action"], d["reason"]], "")
                           for d in a["decisions"]])
        parts.append(
            f"<h3>{esc(a['campaign'])}: {esc(sense)} {esc(metric)}{'' if a['done'] else ' (still running)'}</h3>"
            f"<p>Best: <b>{esc(best)}</b>. {esc(plural(int(a['runs']), 'run'))} for {a['grid_points']} grid "
            f"points; training {float(a['train_s']):.1f} s (the grid: about {float(a['grid_train_s_estimate']):.1f} "
            f"s); allocations {float(a['allocation_s']):.1f} s (the grid: about "
            f"{float(a['grid_allocation_s_estimate']):.1f} s): about {saved_h:.3g} {word}-hours saved.</p>"
            f'<div class="wide">{fits}</div><div class="wide">{decisions}</div>')
    return section("search", "Search: the best point and the largest batch that fits",
                   "What each search campaign (a sweep with search:) found, as sbench best says it, and every "
                   "point's decision with its reason; the grid's figures are estimates (each valid point once, at "
                   "the mean of the campaign's ok or OOM runs).", "".join(parts))
