"""The report's sections: from the loaded data (:mod:`harness.report.data`) to HTML.

Each function turns rows into one section's chart, table or whole ``<section>``; the page
(:mod:`harness.report.page`) puts them in order. The charts themselves are :mod:`harness.report.charts`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.contract.formats import Stage
from harness.db.values import from_json

from .charts import (
    HUMAN_BYTES_EXPR,
    bars_spec,
    clean,
    embed,
    esc,
    fmt,
    human_bytes,
    log2_ticks,
    no_data,
    plural,
    ratio_spec,
    xy_spec,
)
from .clusters import REFERENCE
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


# The rows a table shows as the page opens; the rest wait in a <template> (parsed, but not styled or laid out)
# until the table comes near the window or its filter or sort is used (the page's TABLE_JS). A 1,000-run page's
# tables are 50,000 elements: laid out at once they took as long as every chart together.
TABLE_FIRST_ROWS = 40


def table(head: Sequence[str], rows: Sequence[tuple[Sequence[Any], str]], css: str = "") -> str:
    """One table in the page's shared style: *head*, and rows of (cells, the row's class: "", ``ok``, or
    ``oom``/``fail`` for a row that reads in red). Cells are text (escaped here; None is empty). *css*
    adds a class to the table (``latest``: the wide table of measurements). Numbers are right-aligned. Rows past
    the first :data:`TABLE_FIRST_ROWS` join the table when it comes into view."""
    def td(c: Any) -> str:
        text = "" if c is None else str(c)
        return f'<td class="n">{esc(text)}</td>' if _NUMBER.fullmatch(text) else f"<td>{esc(text)}</td>"

    def tr(cells: Sequence[Any], row_class: str) -> str:
        attr = f' class="{esc(row_class)}"' if row_class else ""
        return f"<tr{attr}>" + "".join(td(c) for c in cells) + "</tr>"

    classes = f"{TABLE_CLASS} {css}".strip()
    shown, later = rows[:TABLE_FIRST_ROWS], rows[TABLE_FIRST_ROWS:]
    more = f"<template class=\"more-rows\">{''.join(tr(c, rc) for c, rc in later)}</template>" if later else ""
    return (f'<table class="{classes}"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{''.join(tr(c, rc) for c, rc in shown)}{more}</tbody></table>")


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


def rel_interval(m: Mapping[str, Any]) -> float | None:
    """The relative half-width of a run's 95 % interval of its window rates: the precision auto-stop's own
    (``ci_rel_halfwidth``), else from its steps (``1.96 · step_time_cv / sqrt(steps_timed)``, the interval compare's
    within-run evidence gives); None when neither is known."""
    if m.get("ci_rel_halfwidth") is not None:
        return float(m["ci_rel_halfwidth"])
    cv, n = m.get("step_time_cv"), m.get("steps_timed")
    if cv is None or not n or int(n) < 2 or not math.isfinite(float(cv)):
        return None
    return 1.96 * float(cv) / math.sqrt(int(n))


RATE_METRICS = ("dataset_tokens_per_second", "model_tflops_per_gpu", "mfu")  # measured over the window: an interval
POINT_METRICS = (*RATE_METRICS, "gpu_memory_utilization_peak", "cpu_memory_utilization")


def measurement_points(measurements: Sequence[Mapping[str, Any]], word: str = "GPU",
                       by_campaign: bool = False) -> list[dict[str, Any]]:
    """The page's shared rows of measurements (the dataset ``measurements`` every measurement chart reads): one per
    measurement with a batch size: its run, series, entity fields, whether it is valid (an invalid run is out of
    memory: its reason), its figures and the interval of its rates."""
    rows = []
    for m in measurements:
        if m.get("batch_size") is None:
            continue
        key = _series_key(m, by_campaign)
        rel = rel_interval(m)
        row: dict[str, Any] = {
            "run": m["run_id"], "series": _series_name(key, word),
            "campaign": m.get("campaign") if by_campaign else None,
            "model": m.get("model_name"), "method": m.get("method"), "devices": _count(m.get("number_gpus"), word),
            "nodes": m.get("number_nodes"), "batch": m["batch_size"], "max_len": m.get("model_max_length"),
            "trainer": m.get("trainer") or "sbench", "valid": m.get("is_valid") is not False,
            "reason": None if m.get("is_valid") is not False else (m.get("run_reason") or "invalid run"),
            "interval": "unknown" if rel is None else f"+-{100 * rel:.1f} % (95 %)",
        }
        row.update((k, clean(float(m[k]))) for k in POINT_METRICS if m.get(k) is not None)
        rows.append({k: v for k, v in row.items() if v is not None})  # a missing field is no value: the page's size
    return rows


def series_colors(points: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each series of valid rows, in order, with its colour (the palette in turn; red is kept for OOM)."""
    names = sorted({p["series"] for p in points if p["valid"]})
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


OOM_NAME = "OOM (invalid run)"


def metric_chart(cid: str, points: Sequence[Mapping[str, Any]], metric: str, y_label: str, unit: str = "",
                 y_range: tuple[float, float] | None = None, width: int = 560, height: int = 280) -> str:
    """One marker per valid measurement of *metric* vs batch size (the page's ``measurements`` rows, *points*),
    a line per series through the means; OOM runs as red crosses at the top edge. The x axis ticks at the batch
    sizes drawn (log2 when they are all powers of two)."""
    drawn = [p for p in points if (p["valid"] and p.get(metric) is not None) or not p["valid"]]
    if not drawn:
        return no_data(f"no measurement with {metric} and a batch size in this selection")
    colors = series_colors([p for p in drawn if p["valid"]])
    xs = sorted({p["batch"] for p in drawn})
    log2 = all(map(_is_pow2, xs))
    values = [float(p[metric]) for p in drawn if p["valid"]]
    top = y_range[1] if y_range else (max(values) * 1.06 if values and max(values) > 0 else 1.0)
    interval = [("interval", "interval")] if metric in RATE_METRICS else []
    tips: list[Any] = [("run", "run"), ("series", "series"), ("batch", "batch size"),
                       (metric, f"{y_label}", ",.4~g"), *interval, ("max_len", "max length"), ("nodes", "nodes"),
                       ("trainer", "trainer")]
    if any(not p["valid"] for p in drawn):
        colors[OOM_NAME] = OOM_COLOR
    crosses = {"filter": "!datum.valid", "y": clean(top), "name": OOM_NAME, "color": OOM_COLOR,
               "tips": [("run", "run (out of memory)"), ("series", "series"), ("batch", "batch size"),
                        ("reason", "reason")]} if OOM_NAME in colors else None
    spec = xy_spec(data={"name": "measurements"}, x="batch", y=metric, series="series", colors=colors, tips=tips,
                   keep="datum.valid", x_title="batch size" + (" (log2 scale)" if log2 else ""),
                   y_title=y_label + (f" ({unit})" if unit and unit not in y_label else ""), log2_x=log2,
                   x_values=xs, y_domain=y_range or (0.0, clean(top)), crosses=crosses, width=width, height=height)
    spec["description"] = f"{metric} vs batch size"
    return embed(cid, spec, ["measurements"])


def _count(n: Any, word: str) -> str:
    """``2 workers``; ``? worker`` when the count is unknown."""
    return plural(int(n), word) if isinstance(n, int) else f"{n if n is not None else '?'} {word}"


def _lighter(color: str, keep: float = 0.45) -> str:
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - c) * keep):02x}" for c in rgb)


OUTCOME_LABEL_COLOR = ("indexof(datum.label, 'OOM ') == 0 ? '#d62728' : indexof(datum.label, 'FAILED ') == 0 ? "
                       "'#e65100' : '#333'")  # a bar's label: OOM runs in red, failed runs in orange


def stage_chart(stage_runs: Sequence[Mapping[str, Any]], word: str = "GPU",
                by_campaign: bool = False) -> tuple[str, str]:
    """One bar per run: its stages' wall seconds stacked (an unfinished stage lighter); OOM runs' labels in red,
    failed runs' in orange."""
    seen = {s for r in stage_runs for s in r["stages"]}
    bases = list(dict.fromkeys([*STAGE_ORDER, *sorted({s.removesuffix(" (unfinished)") for s in seen})]))
    colors = dict(STAGE_COLORS)
    colors.update({n: PALETTE[(i + 3) % len(PALETTE)] for i, n in enumerate(n for n in bases if n not in colors)})
    names = [n for b in bases for n in (b, f"{b} (unfinished)")]
    colors.update({f"{b} (unfinished)": _lighter(colors[b]) for b in bases})
    rows, labels = [], []
    for r in stage_runs[:MAX_STAGE_BARS]:
        tag = {"invalid": "OOM ", "failed": "FAILED ", None: "PENDING "}.get(r["outcome"], "")
        label = (f"{tag}{r['campaign'] + ' · ' if by_campaign else ''}{r['model_name'] or '?'} · {r['method']} · "
                 f"{_count(r['number_gpus'], word)} · bs {r['batch_size']}"
                 f" · {str(r['point_id'])[:8]}.r{r['repeat']}a{r['attempt']}")
        labels.append(label)
        for i, n in enumerate(names):
            if n in r["stages"]:
                rows.append({"label": label, "run": r["run_id"], "stage": n, "order": i,
                             "seconds": clean(float(r["stages"][n])), "outcome": r["outcome"] or "pending"})
    note = (f"Showing the first {MAX_STAGE_BARS} of {len(stage_runs)} runs; narrow with --campaign."
            if len(stage_runs) > MAX_STAGE_BARS else "")
    if not rows:
        return no_data("no stage timings recorded for these runs"), note
    used = {r["stage"] for r in rows}
    spec = bars_spec(data={"values": rows}, label="label", value="seconds", segment="stage", order="order",
                     colors={n: colors[n] for n in names if n in used}, labels=labels,
                     tips=[("run", "run"), ("stage", "stage"), ("seconds", "seconds", ",.3~f"),
                           ("outcome", "outcome")],
                     x_title="seconds (per stage: the slowest host/rank, summed over trials)",
                     label_color_expr=OUTCOME_LABEL_COLOR)
    spec["description"] = "stage seconds per run"
    return embed("chart-stages", spec), note


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


def trace_points(data: ReportData) -> list[dict[str, Any]]:
    """The page's shared rows of the utilisation run's samples (the dataset ``traces``): per time bucket, host,
    kind and device its mean figures, and the series it belongs to."""
    return [{"x": clean(t["x"]), "kind": t["kind"],
             "name": f"{t['host']} gpu{t['device']}" if t["kind"] == "gpu" else f"{t['host']} process tree",
             "gpu_util": clean(t["gpu_util"]), "gpu_mem_pct": clean(t["gpu_mem_pct"]), "cpu_pct": clean(t["cpu_pct"])}
            for t in data.traces]


def utilisation_charts(data: ReportData) -> str:
    run = data.run
    if run is None:
        return no_data("no run with samples in this selection")
    if not data.traces:
        return no_data(f"run {run['run_id']} has no samples")
    shaded = run_bands(run, data.run_offset or 0.0)
    bands = [{"x0": clean(a), "x1": clean(b), "band": label} for a, b, label, _ in shaded]
    band_colors = {label: color for _, _, label, color in shaded}
    points = trace_points(data)
    out = []
    for kind, metric, title, y_range in (
            ("gpu", "gpu_util", "GPU utilisation (%)", (0.0, 100.0)),
            ("gpu", "gpu_mem_pct", "GPU memory used (% of device)", (0.0, 100.0)),
            ("proc", "cpu_pct", "process CPU (%; 100 = one core)", None)):
        mine = [p for p in points if p["kind"] == kind and p[metric] is not None]
        if not mine:
            empty = ("no GPU samples for this run (no GPU was sampled)" if kind == "gpu"
                     else "no process samples for this run")
            out.append(f'<div class="panel"><h3>{esc(title)}</h3>{no_data(empty)}</div>')
            continue
        names = sorted({p["name"] for p in mine})
        spec = xy_spec(data={"name": "traces"}, x="x", y=metric, series="name",
                       colors={n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)},
                       tips=[("name", "series"), ("x", "seconds since training start", ",.1f"),
                             (metric, title, ",.1f")],
                       keep=f"datum.kind === {json.dumps(kind)}", x_title="seconds since training start",
                       y_title=title, y_domain=y_range, mean_line=True, points=False, bands=bands,
                       band_colors=band_colors, width=1060, height=200)
        spec["description"] = f"{metric} of run {run['run_id']} over time"
        spec["usermeta"] = {"run": run["run_id"], "samples": len(mine)}
        out.append(f'<div class="panel"><h3>{esc(title)}</h3>{embed(f"chart-util-{metric}", spec, ["traces"])}</div>')
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
    ("cost / M tok", "cost_per_million_tokens", fmt),  # the partition's price_per_gpu_hour over the throughput
    ("notes", "notes", lambda v: "; ".join(v)),  # what ran otherwise than asked, and the runs' other notes
    ("# meas.", "n", str), ("stability", "stability", str), ("latest run", "run_id", str),
)
MEDIAN_KEYS = ("dataset_tokens_per_second", "ci_rel_halfwidth", "dataset_tokens_per_second_per_gpu",
               "train_tokens_per_second", "gpu_compute_utilization_avg", "gpu_memory_utilization_peak",
               "cpu_compute_utilization", "cpu_memory_utilization", "train_runtime", "energy_joules",
               "dataset_tokens_per_joule", "cost_per_million_tokens")


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
    ("outcome", "outcome", str), ("alloc s", "elapsed_s", fmt), ("predicted s", "predicted", str),
    ("dataset tok/s", "dataset_tokens_per_second", fmt),
    ("precision", "ci_rel_halfwidth", _pct), ("stopped by", "stopped_by", str), ("energy J", "energy_joules", fmt),
    ("tok/J", "dataset_tokens_per_joule", fmt), ("excluded", "left_out", str), ("reason", "reason", str),
    ("run", "run_id", str),
)


def attempts_table(attempts: Sequence[Mapping[str, Any]], word: str = "GPU", by_campaign: bool = False) -> str:
    """Every attempt of the points shown: why it was sent (``runs.submit_reason``: new, retry, ``more repeats:
    CV ... > target``), how it ended, its allocation seconds beside what submit predicted of them (and from what),
    and what it measured; a run compare and the CV exclude says why."""
    if not attempts:
        return no_data("no attempts in this selection")
    rows = []
    for a in attempts:
        r = dict(a)
        r["outcome"] = a.get("outcome") or (str(a.get("state") or "submitted").lower() + " (not over)")
        r["left_out"] = ("profiled" if a.get("profiled") else "shared host" if a.get("shared_host") else
                         f"busy host ({fmt(a.get('host_other_cpu_pct'))} % other CPU)" if a.get("host_busy") else None)
        r["reason"] = None if a.get("outcome") == "ok" else a.get("reason")
        pred = a.get("predicted_seconds")
        r["predicted"] = None if pred is None else f"{fmt(pred)} ({a.get('prediction_source') or '?'})"
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
    names: dict[str, str] = {}
    for f in runs:
        first = next(r for r in rows if r["fabric_id"] == f)
        tr = from_json(first.get("transport_by_host")) or {}
        kinds = ",".join(sorted({t for t in tr.values() if t})) or first.get("backend") or "?"
        names[f] = f"{first['partition']} x{first['nodes']} ({kinds}) {f[:15]}"
    colors = {names[f]: PALETTE[i % len(PALETTE)] for i, f in enumerate(runs)}
    panels = []
    for op in ("all_reduce", "all_gather"):
        pts = [{"run": r["fabric_id"], "series": names[r["fabric_id"]], "bytes": int(r["bytes"]),
                "size": f"{human_bytes(r['bytes'])}B ({int(r['bytes'])} bytes)", "time_us": clean(r["time_us"]),
                "busbw": clean(r["busbw_gbps"])}
               for r in rows if r["op"] == op and r.get("bytes") and r.get("busbw_gbps")]
        if not pts:
            body = no_data(f"no {op} rows")
        else:
            sizes = sorted({p["bytes"] for p in pts})
            ticks = [int(t) for t in log2_ticks(sizes[0], sizes[-1], 400)]  # the plot's width less its legend
            spec = xy_spec(data={"values": pts}, x="bytes", y="busbw", series="series", colors=colors,
                           tips=[("run", "fabric run"), ("series", "series"), ("size", "message size"),
                                 ("time_us", "time (us)", ",.1f"), ("busbw", "busbw (GB/s)", ",.3f")],
                           x_title="message size (log2 scale; 1K = 1024 bytes)", y_title="busbw (GB/s)", log2_x=True,
                           x_values=ticks, x_extent=(sizes[0], sizes[-1]), x_label_expr=HUMAN_BYTES_EXPR,
                           width=520)
            spec["description"] = f"{op} bus bandwidth by message size"
            body = embed(f"chart-fabric-{op}", spec)
        panels.append(f'<div class="panel"><h3>{op.replace("_", "-")} bus bandwidth</h3>{body}</div>')
    return '<div class="row">' + "".join(panels) + "</div>"


def hosts_section(hosts: Sequence[Mapping[str, Any]], preflight: Sequence[Mapping[str, Any]]) -> str:
    """Per host (every campaign): the median relative score of its ranks as a bar, the evidence, and the latest
    preflights' devices."""
    scored = [h for h in hosts if h.get("median_relative_score") is not None]
    bars = [{"label": f"{h['host']} ({h['straggler_runs']}/{h['runs_scored']} straggler)", "host": h["host"],
             "state": "drain candidate" if h.get("why") else "not flagged", "order": 0,
             "score": clean(float(h["median_relative_score"])), "runs": h["runs_scored"],
             "stragglers": h["straggler_runs"]} for h in scored]
    chart = no_data("no rank scores yet: a run of more than one process records them") if not bars else embed(
        "chart-hosts", bars_spec(
            data={"values": bars}, label="label", value="score", segment="state", order="order",
            colors={"not flagged": PALETTE[0], "drain candidate": OOM_COLOR}, labels=[b["label"] for b in bars],
            tips=[("host", "host"), ("score", "median relative score", ".3f"), ("runs", "runs scored"),
                  ("stragglers", "straggler runs")],
            x_title="median relative score of the host's ranks (1 = as fast as the run's fastest rank)"))
    rows = [([h["host"], h["runs"], h["campaigns"], h["runs_scored"], h["straggler_runs"],
              fmt(h.get("median_relative_score")), h["preflights"], h["slow_preflights"],
              fmt(h.get("min_preflight_ratio")), h.get("why") or ""], "fail" if h.get("why") else "") for h in hosts]
    health = table(["host", "runs", "campaigns", "scored", "straggler", "median score", "preflights", "slow",
                    "lowest ratio", "drain candidate"], rows) if rows else no_data("no host seen yet")
    pf = table(["preflight", "host", "device", "figure", "value", "unit", "spread", "ratio to median", "slow"],
               [([r["preflight_id"], r["host"], r["device"], r["figure"], fmt(r["value"]), r["unit"],
                  f"{100 * r['spread']:.0f} %" if r.get("spread") is not None else "", fmt(r.get("ratio")),
                  "slow" if r["flagged"] else ""], "fail" if r["flagged"] else "") for r in preflight]
               ) if preflight else no_data("no preflight yet: sbench preflight -i INVENTORY --partition P")
    return section("hosts", "Hosts: stragglers and slow devices",
                   "Across every campaign: each host's ranks scored against the fastest rank of their run "
                   "(rank_scores; a rank under runner.straggler_score is a straggler), and its devices against "
                   "the partition's median (preflight). A drain candidate was flagged again and again "
                   "(sbench hosts).",
                   f'<div class="wide">{chart}</div><div class="wide">{health}</div><h3>Latest preflights</h3>'
                   f'<div class="wide">{pf}</div>')


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


def ratio_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Compare's rows (one per point and metric) as the lines of a ratio chart: label, ratio, interval, verdict."""
    out = []
    for r in rows:
        lab = r.get("labels") or {}
        no_test = r["low"] is None or r["high"] is None
        out.append({"label": f"{lab.get('model_name', '?')} ×{lab.get('number_gpus', '?')} "
                             f"b{lab.get('batch_size', '?')} {r['metric']} · {str(r['point_id'])[:8]}",
                    "point": r["point_id"], "metric": r["metric"], "ratio": clean(r["ratio"]),
                    "low": clean(r["low"]), "high": clean(r["high"]), "verdict": str(r["verdict"]),
                    "interval": ("no interval (no test: a side has fewer than two runs)" if no_test
                                 else f"[{r['low']:.3f}, {r['high']:.3f}] (95 %)"),
                    "runs": f"{r['n_base']} base, {r['n_cand']} cand"})
    return out


RATIO_AXIS = "candidate / base (ratio of centres, 95 % interval of Welch's t on the logs)"


def ratio_chart(rows: Sequence[Mapping[str, Any]], threshold: float) -> str:
    """Compare's rows as a ratio chart (:func:`harness.report.charts.ratio_spec`), coloured by verdict."""
    if not rows:
        return no_data("BASE and CAND share no measured point")
    pts = ratio_rows(rows)
    spec = ratio_spec(data={"values": pts}, label="label", ratio="ratio", low="low", high="high", group="verdict",
                      colors={str(v): c for v, c in VERDICT_COLORS.items() if any(p["verdict"] == v for p in pts)},
                      labels=[p["label"] for p in pts], threshold=threshold, x_title=RATIO_AXIS,
                      tips=[("point", "point"), ("metric", "metric"), ("ratio", "ratio", ".3f"),
                            ("interval", "interval"), ("runs", "runs"), ("verdict", "verdict")])
    spec["description"] = "compare: ratio per point and metric"
    return embed("chart-compare", spec)


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
    n_single = sum(1 for r in rows if r["verdict"] == Verdict.SINGLE)
    if n_single:
        note += (f" {n_single} against a reference's single measurement (published: one measurement a point, no "
                 "spread), paired on the entity fields it recorded: the ratio stands, no verdict is drawn.")
    if cmp.get("excluded_text"):
        note += f" Left out: {cmp['excluded_text']}."
    return section("compare", "Compare", note, f'<div class="wide">{ratio_chart(rows, cmp["threshold"])}</div>'
                   + changes_table(cmp.get("environment") or {}, rows))


def changes_table(env: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """What changed under the numbers: the differences between the sides' recorded environments, and beside each
    regression the changes on its point (harness.report.envdiff)."""
    changes = env.get("changes") or []
    head = ('<h3>What changed under the numbers (BASE → CAND)</h3>' if changes else
            "<h3>What changed under the numbers: nothing in the recorded environments</h3>")
    body = table(["kind", "what", "BASE", "CAND"], [((c["kind"], c["name"], ", ".join(c["base"]) or "(not recorded)",
                                                     ", ".join(c["cand"]) or "(not recorded)"), "")
                                                   for c in changes]) if changes else ""
    regs = [r for r in rows if r["verdict"] == Verdict.REGRESSION]
    beside = table(["regression", "metric", "ratio", "changed under it"], [(
        (r["point_id"][:12], r["metric"], f"{r['ratio']:.3f}",
         "; ".join(c["text"] for c in r.get("changes") or []) or "nothing recorded"), "fail") for r in regs]) \
        if regs else ""
    note = f'<p class="note">{esc(env["note"])}</p>' if env.get("note") else ""
    return f'<div class="wide">{head}{body}{beside}{note}</div>'


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
    rows, labels = [], []
    parts = list(MEMORY_COLORS)
    for m in list(latest.values())[:MAX_STAGE_BARS // 2]:
        label = (f"{m.get('model_name') or '?'} · {m.get('method')} · {_count(m.get('number_gpus'), word)} · "
                 f"bs {m.get('batch_size')} · {str(m['point_id'])[:8]}")
        for kind, keys, known in (
                ("measured", (("parameters", "params_bytes"), ("gradients", "grads_bytes"),
                              ("optimizer state", "optimizer_bytes")), m.get("params_bytes") is not None),
                ("predicted", (("parameters", "predicted_params_bytes"), ("gradients", "predicted_grads_bytes"),
                               ("optimizer state", "predicted_optimizer_bytes"),
                               ("activations (predicted)", "predicted_activation_bytes")),
                 m.get("predicted_total_bytes") is not None)):
            if not known:
                continue
            bar = f"{'DOES NOT FIT ' if kind == 'predicted' and m.get('predicted_oom') else ''}{label} {kind}"
            labels.append(bar)
            rows += [{"label": bar, "run": m.get("run_id"), "part": n, "order": parts.index(n),
                      "size": clean((m.get(k) or 0) / scale)} for n, k in keys]
    spec = bars_spec(data={"values": rows}, label="label", value="size", segment="part", order="order",
                     colors=MEMORY_COLORS, labels=labels,
                     tips=[("run", "run"), ("label", "bar"), ("part", "part"), ("size", unit, ",.3~f")],
                     x_title=f"{unit} per device (rank 0)",
                     label_color_expr="indexof(datum.label, 'DOES NOT FIT ') == 0 ? '#d62728' : '#333'")
    spec["description"] = "memory per device: measured and predicted"
    chart = embed("chart-memory-breakdown", spec) if rows else no_data("no memory snapshots")
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
                   "config.json, with its activation estimate; a red label (DOES NOT FIT) is a point predicted not to "
                   "fit.",
                   f'<div class="wide">{chart}{acts}</div>')


PEAK_SOURCE_TEXT = {"measured": "its hosts' measured peak (sbench preflight, the measured_peaks view)",
                    "inventory": "the inventory's peak_tflops", "datasheet": "the datasheet's (gpu_peaks.yaml)"}


def peak_sources_text(measurements: Sequence[Mapping[str, Any]]) -> str:
    """Which peak the runs' MFU was set against (measurements.mfu_peak_source), with how many runs each."""
    counts: dict[str, int] = {}
    for m in measurements:
        if m.get("mfu") is not None:
            src = str(m.get("mfu_peak_source") or "unrecorded")
            counts[src] = counts.get(src, 0) + 1
    if not counts:
        return ""
    parts = [f"{n} run(s) against {PEAK_SOURCE_TEXT.get(src, 'a peak of unrecorded source')}"
             for src, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return " MFU here: " + "; ".join(parts) + " (measurements.mfu_peak_source)."


def efficiency_section(points: Sequence[Mapping[str, Any]], word: str,
                       measurements: Sequence[Mapping[str, Any]] = ()) -> str:
    if not any(p.get("model_tflops_per_gpu") is not None for p in points):
        return ""
    has_mfu = any(p.get("mfu") is not None for p in points)
    body = ('<div class="row"><div class="panel"><h3>achieved model TFLOP/s per device</h3>'
            + metric_chart("chart-tflops", points, "model_tflops_per_gpu", "model TFLOP/s per device")
            + '</div><div class="panel"><h3>MFU (model FLOPs / peak)</h3>'
            + (metric_chart("chart-mfu", points, "mfu", "MFU") if has_mfu else
               no_data("no peak TFLOP/s known for this hardware: set peak_tflops on the partition"))
            + "</div></div>")
    return section("efficiency", "Efficiency: achieved TFLOP/s and MFU",
                   "Model FLOPs per token from the model config (6·N plus attention; harness/flops.py) × train tokens "
                   "per second per device. MFU divides by the device's peak dense TFLOP/s for the compute dtype: "
                   "its hosts' measured peak where sbench preflight measured them at that dtype, else the "
                   "inventory's peak_tflops or harness/spec/gpu_peaks.yaml." + peak_sources_text(measurements),
                   body)


def clusters_section(rows: Sequence[Mapping[str, Any]]) -> str:
    """The section's HTML (empty without rows)."""
    if not rows:
        return ""
    head = ["gpu_model", "cluster", "campaign", "model", "method", "GPUs", "nodes", "batch", "max len", "runs",
            "dataset tok/s (median)", "vs reference"]
    body = [((r["gpu_model"], r["cluster"], r["campaign"], r["model_name"], str(r["experiment"]).split("_")[1]
              if "_" in str(r["experiment"]) else r["experiment"], r["number_gpus"], r["number_nodes"],
              r["batch_size"], r["model_max_length"], r["n"], fmt(r["dataset_tokens_per_second"]),
              "reference line" if r["cluster"] == REFERENCE else
              ("" if r["vs_reference"] is None else f"{r['vs_reference']:.3f}")), "ok" if r["cluster"] == REFERENCE
             else "") for r in rows]
    note = ("The points of this page as every campaign in the database measured them, grouped by gpu_model and "
            "cluster: this cluster's, campaigns imported from other clusters (sbench import: cluster/name), and "
            "the reference's published measurements (sbench import --format ado-csv), each point's reference "
            "first as its own line, the others' ratio to it beside. Campaigns share a point by its id, published "
            "measurements by the entity fields their file gives. Medians over each campaign's valid runs; runs on "
            "a shared or busy host left out.")
    return section("clusters", "Across clusters", esc(note), f'<div class="wide">{table(head, body)}</div>')


PHASE_COLORS = {"data": "#76b7b2", "forward": "#4e79a7", "backward": "#f28e2b", "optimizer": "#59a14f",
                "communication_exposed": "#e15759", "communication_overlapped": "#b07aa1", "idle": "#d4d4d4",
                "other": "#bab0ac", "communication": "#9c755f"}  # (communication: a database before schema 18)
PROFILE_TOP = 10  # operators shown per profiled run (sbench profile RUN --top N: more)


def profile_section(profiles: Sequence[Mapping[str, Any]], word: str = "GPU") -> str:
    """Per profiled run (``runner.profile``): where its steps' time went (rank by rank, the parts' shares adding up
    to the step), its top operators by self time, and a link to each trace file."""
    if not profiles:
        return ""
    rows, labels, parts = [], [], list(PHASE_COLORS)
    tables = []
    for p in profiles:
        ranks = sorted({o["rank"] for o in p["ops"]})
        for rank in ranks:
            phases = [o for o in p["ops"] if o["rank"] == rank and o["kind"] == "phase"]
            if not phases:
                continue
            label = (f"{p.get('model_name') or '?'} · {_count(p.get('number_gpus'), word)} · bs {p.get('batch_size')}"
                     f" · {str(p['point_id'])[:8]}.r{p['repeat']} · rank {rank}")
            labels.append(label)
            rows += [{"label": label, "run": p["run_id"], "part": o["name"], "order": parts.index(o["name"]),
                      "share": clean(100 * (o["share"] or 0)), "seconds": clean(o["self_s"] / max(o["steps"] or 1, 1)),
                      "steps": o["steps"]} for o in phases if o["name"] in PHASE_COLORS]
        ops = [o for o in p["ops"] if o["kind"] != "phase" and o["rank"] == (ranks[0] if ranks else 0)]
        links = " ".join(f'<a href="{esc(_file_uri(p.get("job_dir"), f))}">{esc(f)}</a>'
                         for f in p.get("profile_files") or [])
        tables.append(f"<h3>{esc(p['run_id'])}: top operators of rank {ranks[0] if ranks else 0} by self time</h3>"
                      f'<p class="note">Files: {links or "none collected"} (open a trace in chrome://tracing or '
                      "Perfetto; sbench profile RUN prints more).</p>"
                      + table(["kind", "operator", "calls", "self s", "total s", "share of the steps"],
                              [((o["kind"], o["name"], o["calls"], f"{o['self_s']:.4f}", f"{o['total_s']:.4f}",
                                 f"{100 * (o['share'] or 0):.1f} %"), "") for o in ops[:PROFILE_TOP]]))
    chart = no_data("no profiled step in the collected traces") if not rows else embed("chart-profile", bars_spec(
        data={"values": rows}, label="label", value="share", segment="part", order="order", colors=PHASE_COLORS,
        labels=labels, tips=[("run", "run"), ("part", "part"), ("share", "share of the step (%)", ".1f"),
                             ("seconds", "seconds per step", ",.4f"), ("steps", "steps profiled")],
        x_title="share of the step (%)"))
    return section("profile", "Profiled points: where a step's time went",
                   "Runs profiled with runner.profile (or submit --profile): the last repeat of each point, its steps "
                   "under torch.profiler. Each bar splits the profiled steps' time of one rank into data loading, "
                   "forward, backward, optimizer, exposed communication (a collective in flight that the step waited "
                   "for: its own thread inside the collective or idle; on a GPU, no compute kernel beside the "
                   "communication kernel), overlapped communication (hidden behind the step's own work), idle "
                   "(between the step's ranges) and other; the parts add up to the step. These runs are left out of "
                   "every plot above, of compare, check and the "
                   "repeats' CV: the profiler slows them.", f'<div class="wide">{chart}{"".join(tables)}</div>')


def _file_uri(job_dir: Any, name: str) -> str:
    """A link to a file of a job dir (a ``file:`` URI: the page stays offline)."""
    return (Path(str(job_dir)) / name).as_uri() if job_dir and str(job_dir).startswith("/") else name

def scaling_section(scaling: Mapping[str, Sequence[Mapping[str, Any]]], word: str = "GPU") -> str:
    """Per campaign with more than one shape of a model, method and per-device batch: sbench scaling's rows."""
    if not scaling:
        return ""

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f} %"

    tables = []
    for campaign, rows in scaling.items():
        body = [((r["model_name"], r["experiment"], r["per_device_batch_size"], _count(r["number_gpus"], word),
                  r["number_nodes"], r["runs"], f"{r['dataset_tokens_per_second']:,.1f}",
                  "-" if r["low"] is None else f"{r['low']:,.1f} .. {r['high']:,.1f}", pct(r["efficiency"]),
                  pct(r["exposed_communication_share"]),
                  "-" if r["fabric_busbw_gbps"] is None else f"{r['fabric_busbw_gbps']:.3g}",
                  ", ".join(r["stragglers"]) or "-", pct(r["mfu"]), r["explained_by"] or ""),
                 "bad" if r["explained_by"] else "") for r in rows]
        tables.append(f"<h3>{esc(campaign)}</h3>" + table(
            ["model", "experiment", "batch / device", word + "s", "nodes", "runs", "dataset tok/s", "95 % interval",
             "efficiency", "exposed communication", "fabric busbw GB/s", "stragglers", "MFU", "explained by"], body))
    return section("scaling", "Scaling: why N devices are not N times faster",
                   "Each shape's dataset tokens per second (the mean of its valid, unprofiled runs, with a 95 % "
                   "interval from their spread) and its efficiency: its throughput over the smallest shape's times "
                   "the ratio of devices (100 % = linear). Beside it: the exposed communication's share of the step "
                   "where a point of the shape was profiled, the fabric's all-reduce bus bandwidth at that node "
                   "count (sbench fabric), the straggler ranks and the MFU. A shape under 90 % of linear is "
                   "explained by a straggler, by communication (without the exposed communication it would be back "
                   "above 90 %), or unexplained. sbench scaling CAMPAIGN prints the same.",
                   f'<div class="wide">{"".join(tables)}</div>')


def _estimated_from(a: Mapping[str, Any]) -> str:
    return f"; each grid point estimated from: {esc(a['grid_estimate_from'])}" if a.get("grid_estimate_from") else ""


def search_section(searches: Sequence[Mapping[str, Any]], word: str = "GPU") -> str:
    """A search campaign's answer (``search:``; ``sbench best`` says the same): its best point with the goal's
    interval, the largest batch that fits per shape with its evidence, and the allocation time it saved beside the
    full grid's estimate."""
    if not searches:
        return ""
    parts = []
    for a in searches:
        metric = a["objectives"][0]["metric"]
        goal = ", ".join(f"{o['sense']} {o['metric']}" for o in a["objectives"])
        b = a["best"]
        best = ("none yet" if not b else f"{b['point_id']}: {metric} {b['value']:,.4g} (95 % interval "
                f"{b['interval'][0]:,.4g} .. {b['interval'][1]:,.4g}, {plural(int(b['runs']), 'run')})")
        if b and b.get("busy_host_only"):
            best += ", every run of it on a host busy with other work: its figure is what that busy host gave"
        elif b and b.get("busy_runs_left_out"):
            best += f", {plural(int(b['busy_runs_left_out']), 'run')} of it on a busy host left out"
        saved_h = (float(a["grid_gpu_s_estimate"]) - float(a["gpu_s"])) / 3600
        fits = table(["shape", "largest batch that fits", "largest ok", "smallest OOM", "decided"],
                     [([", ".join(f"{k}={v}" for k, v in m["shape"].items()), m["batch_size"], m["largest_ok"],
                        m["smallest_oom"], "yes" if m["decided"] else "no"], "" if m["batch_size"] else "oom")
                      for m in a["max_batch_size"]])
        names = [o["metric"] for o in a["objectives"]]
        front = "" if not a.get("pareto") else (
            f"<p>The Pareto front: {plural(len(a['pareto']), 'point')}, none better than another on every objective "
            "beyond the intervals.</p>" + table(
                ["point", *names], [([p["point_id"], *("-" if (iv := p["objectives"][m]) is None else
                                                        f"{iv['value']:,.4g} ({iv['interval'][0]:,.4g} .. "
                                                        f"{iv['interval'][1]:,.4g})" for m in names)], "")
                                    for p in a["pareto"]]))
        decisions = table(["point", "phase", "action", "reason"],
                          [([d["point_id"], d["phase"], d["action"], d["reason"]], "")
                           for d in a["decisions"]])
        parts.append(
            f"<h3>{esc(a['campaign'])}: {esc(goal)}{'' if a['done'] else ' (still running)'}</h3>"
            f"<p>Best: <b>{esc(best)}</b>. {esc(plural(int(a['runs']), 'run'))} for {a['grid_points']} grid "
            f"points; training {float(a['train_s']):.1f} s (the grid: about {float(a['grid_train_s_estimate']):.1f} "
            f"s); allocations {float(a['allocation_s']):.1f} s (the grid: about "
            f"{float(a['grid_allocation_s_estimate']):.1f} s{_estimated_from(a)}): about {saved_h:.3g} "
            f"{word}-hours saved.</p>"
            f'<div class="wide">{front}</div><div class="wide">{fits}</div><div class="wide">{decisions}</div>')
    return section("search", "Search: the best point and the largest batch that fits",
                   "What each search campaign (a sweep with search:) found, as sbench best says it, and every "
                   "point's decision with its reason; the grid's figures are estimates (each valid point once: "
                   "one that fits at the mean of its own full-length ok runs, else of the campaign's; one that does "
                   "not at the mean of its OOM runs, else of the campaign's).", "".join(parts))
