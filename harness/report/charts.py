"""SVG chart primitives for the report: a line/scatter chart, a horizontal stacked bar chart and a ratio chart.

Pure functions from series to SVG text, with the small helpers they share (escaping, short numbers,
byte sizes, counted words, round ticks, the no-data panel). An axis ticks at values that exist (the
caller's, powers of two, or round numbers) and labels only as many as fit without overlapping. They know
nothing of sbench: colours, labels and tooltips come from the caller (harness.report.sections).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 worker``, ``2 workers`` (*words*: an irregular plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def human_bytes(v: float) -> str:
    """A byte count in binary units, short: 512, 1K, 64K, 1M, 1.5G (K = 1024)."""
    for unit, size in (("T", 2.0 ** 40), ("G", 2.0 ** 30), ("M", 2.0 ** 20), ("K", 2.0 ** 10)):
        if abs(v) >= size:
            return f"{v / size:.3g}{unit}"
    return fmt(v)


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> tuple[list[float], float, float]:
    """About *n* round ticks covering [lo, hi], and the widened domain they span; with *integer*, whole
    numbers only (a step of at least 1, never 2.5)."""
    if not hi > lo:
        lo, hi = (lo - 1, hi + 1) if lo != 0 else (0.0, 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    steps = [m * mag for m in (1, 2, 2.5, 5, 10)]
    if integer:
        steps = sorted({*[s for s in steps if float(s).is_integer()], 1.0})
    step = next(s for s in steps if s >= raw * 0.999)
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


TICK_CHAR_PX = 6.6  # a tick label's width per character at the charts' 11 px font (digits are ~6.1 px)
TICK_GAP_PX = 6.0  # the least space between two tick labels


def spaced_ticks(ticks: Sequence[float], pos: Callable[[float], float],
                 label: Callable[[float], str]) -> list[float]:
    """The ticks, left to right, whose labels do not overlap those kept before them (the first is kept)."""
    kept: list[float] = []
    right = -math.inf
    for t in sorted(ticks):
        half = TICK_CHAR_PX * len(label(t)) / 2
        if pos(t) - half >= right + TICK_GAP_PX:
            kept.append(t)
            right = pos(t) + half
    return kept


def log2_ticks(lo: float, hi: float, pos: Callable[[float], float], label: Callable[[float], str]) -> list[float]:
    """Powers of two in [2**lo, 2**hi], every 1st, 2nd, 5th or 10th power: the densest whose labels fit
    side by side (each keeps 1K and 1M: 1K, 4K, 16K, ... or 32, 1K, 32K, ...)."""
    exps = range(math.ceil(lo), math.floor(hi) + 1)
    ticks: list[float] = []
    for stride in (1, 2, 5, 10):
        ticks = [float(2 ** e) for e in exps if e % stride == 0]
        if len(spaced_ticks(ticks, pos, label)) == len(ticks):
            return ticks
    return spaced_ticks(ticks, pos, label)


def line_chart(series: Sequence[Series], *, x_label: str, y_label: str, log2_x: bool = False,
               y_range: tuple[float, float] | None = None, bands: Sequence[tuple[float, float, str, str]] = (),
               width: int = 660, height: int = 300, empty: str = "nothing to plot",
               x_ticks: Sequence[float] | None = None, x_fmt: Callable[[float], str] = fmt,
               integer_x: bool = False) -> str:
    """An SVG line/scatter chart with axes, ticks, optional shaded x bands (x0, x1, label, colour)
    and a legend on the right. Markers carry their tooltip as <title>.

    X ticks: *x_ticks* if given (e.g. the values measured), else powers of two (*log2_x*) or round numbers
    (whole ones with *integer_x*); labelled with *x_fmt*, and thinned so that no two labels overlap. Each
    x tick label carries its value as ``data-x``."""
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
    else:
        fx += [v for b in bands for v in b[:2]]
        round_ticks, lo, hi = nice_ticks(min(fx), max(fx), 8, integer=integer_x)
        if x_ticks is not None:  # the data and the given ticks, with a margin so that no marker sits on the axis
            lo, hi = min([*fx, *map(f, x_ticks)]), max([*fx, *map(f, x_ticks)])
            pad = (hi - lo) * 0.04 or 0.5
            lo, hi = lo - pad, hi + pad
    ys = [y for _, y in pts if y is not None]
    if y_range is not None:
        yticks, ylo, yhi = nice_ticks(*y_range, 5)
    else:
        yticks, ylo, yhi = nice_ticks(0.0, max(ys) if ys and max(ys) > 0 else 1.0, 5)

    def sx(v: float) -> float:
        return ml + (f(v) - lo) / (hi - lo) * pw

    def sy(v: float | None) -> float:
        return mt + 7 if v is None else mt + ph - (v - ylo) / (yhi - ylo) * ph

    if x_ticks is not None:
        xticks = spaced_ticks([float(t) for t in x_ticks if (t > 0 or not log2_x) and lo <= f(t) <= hi], sx, x_fmt)
    elif log2_x:
        xticks = log2_ticks(lo, hi, sx, x_fmt)
    else:
        xticks = spaced_ticks(round_ticks, sx, x_fmt)

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
                 f'<text class="tick xtick" data-x="{int(t) if float(t).is_integer() else t}" x="{x:.1f}" '
                 f'y="{mt + ph + 17}" text-anchor="middle">{esc(x_fmt(t))}</text>')
    o.append(f'<path class="axis" d="M{ml},{mt}V{mt + ph}H{ml + pw}"/>'
             f'<text class="label" x="{ml + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">{esc(x_label)}</text>'
             f'<text class="label" transform="translate(14,{mt + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
             f"{esc(y_label)}</text>")
    for s in series:
        if s.line and len(s.points) > 1:
            by_x: dict[float, list[float]] = {}
            for px, py, _ in s.points:
                if py is not None:
                    by_x.setdefault(px, []).append(py)
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


@dataclass(frozen=True)
class Ratio:
    """One line of a ratio chart: its label, the ratio, its interval (None when there is none), colour and tip."""

    label: str
    ratio: float
    low: float | None
    high: float | None
    color: str
    tip: str


def ratio_chart(rows: Sequence[Ratio], threshold: float, axis_label: str, width: int = 1100) -> str:
    """One line per row: the ratio as a dot, its interval as a whisker, the ±*threshold* band around 1.0 shaded
    and 1.0 marked. *rows* must not be empty (the caller says why there is nothing to draw)."""
    lo = min([r.low if r.low is not None else r.ratio for r in rows] + [1 - threshold]) * 0.97
    hi = max([r.high if r.high is not None else r.ratio for r in rows] + [1 + threshold]) * 1.03
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
        whisker = "" if r.low is None or r.high is None else (
            f'<line x1="{sx(r.low):.1f}" x2="{sx(r.high):.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{r.color}" '
            'stroke-width="2"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end" class="tick">{esc(r.label)}</text>'
                   f'{whisker}<circle cx="{sx(r.ratio):.1f}" cy="{y:.1f}" r="4.5" fill="{r.color}">'
                   f"<title>{esc(r.tip)}</title></circle>")
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 1}" text-anchor="middle" class="tick">'
               f"{html.escape(axis_label, quote=False)}</text></svg>")  # text, not an attribute: quotes stay
    return "".join(out)
