"""The report's one way of drawing: Vega-Lite specs, drawn in the page by Vega, inlined from a PyPI package.

The specs are pure functions from rows to JSON-able dicts (:func:`xy_spec`: a scatter with lines, :func:`bars_spec`:
stacked horizontal bars, :func:`ratio_spec`: ratios with their intervals around 1.0); :func:`embed`
places one in the page (a ``<div>`` and its spec as ``application/json``), and :func:`page_scripts` gives the
page's scripts: the rows several charts share (``datasets``, once per page), Vega, Vega-Lite and Vega-Embed
(:func:`vega_bundle`, from ``vl-convert-python``, which ships them), the few lines that embed every spec, and
the tables' sorting and filtering. Nothing is fetched: the page works with the network off.

Every chart has a tooltip (the caller names its fields), zoom and pan on dense axes (drag and wheel; a double
click resets) and, where it has series, a legend whose click shows one series (shift-click adds more, a
double click on the plot shows all again). The helpers the report's text shares (escaping, short numbers, byte
sizes, counted words, the no-data panel) live here too. Nothing here knows of sbench: colours, titles and
tooltips come from the caller (:mod:`harness.report.sections`).
"""

from __future__ import annotations

import contextlib
import functools
import html
import importlib.metadata
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract import usercache

# The JavaScript's own strings that name a web address without ever fetching it; the page carries none of them
# (vega-embed's editor link, which actions: false never shows, the compiled spec's schema, an error's issue link).
# What stays are XML namespace names (http://www.w3.org/2000/svg...), which a browser never loads.
_UNUSED_URLS = ("https://vega.github.io/editor/", "https://vega.github.io/schema/vega/v6.json",
                "https://github.com/vega/vega-lite/issues/2415")


BUNDLE_MAX = 16 << 20  # the bundle is about 0.9 MB
# The kept bundle's form (raise it when vega_bundle changes what it makes from the package's) and the line that
# ends a whole one (a file cut short is made again).
_BUNDLE_FORM = 1
_BUNDLE_END = "\n/* sbench: end of the bundle */\n"


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed (with vega-tooltip) as one script that defines ``vegaEmbed``: the bundle
    vl-convert-python ships (its versions: ``vl_convert.get_vega_version()``...). Making it takes about a second,
    so it is kept in the user's cache (:mod:`harness.contract.usercache`) under the package's version and made
    again only for another version, or where the cache is missing or not the user's alone."""
    name = f"vega-bundle-{importlib.metadata.version('vl-convert-python')}-{_BUNDLE_FORM}.js"
    kept = usercache.read(name, BUNDLE_MAX)
    if kept is not None:
        with contextlib.suppress(UnicodeDecodeError):
            text = kept.decode()
            if text.endswith(_BUNDLE_END):
                return text[:-len(_BUNDLE_END)]
    import vl_convert  # heavy (an 80 MB native module): only when a report is drawn

    text = vl_convert.javascript_bundle("window.vegaEmbed = vegaEmbed;")
    for url in _UNUSED_URLS:
        text = text.replace(url, "")
    text = text.replace("</script", "<\\/script")
    usercache.write(name, text + _BUNDLE_END)
    return text



def library_versions() -> dict[str, str]:
    """The versions of the drawing library inlined into the page (the page's footer names them)."""
    import vl_convert  # heavy: as in vega_bundle

    return {"vega": vl_convert.get_vega_version(), "vega-lite": vl_convert.get_vegalite_versions()[-1],
            "vega-embed": vl_convert.get_vega_embed_version()}


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


# A byte axis's labels in the page, as human_bytes writes them (Vega's expression language).
HUMAN_BYTES_EXPR = ("datum.value >= 1099511627776 ? format(datum.value / 1099511627776, '.3~g') + 'T' : "
                    "datum.value >= 1073741824 ? format(datum.value / 1073741824, '.3~g') + 'G' : "
                    "datum.value >= 1048576 ? format(datum.value / 1048576, '.3~g') + 'M' : "
                    "datum.value >= 1024 ? format(datum.value / 1024, '.3~g') + 'K' : format(datum.value, '~g')")


TICK_CHAR_PX = 6.6  # a tick label's width per character at the charts' 11 px font (digits are ~6.1 px)
TICK_GAP_PX = 6.0  # the least space between two tick labels


def log2_ticks(lo: float, hi: float, width: float, label_chars: int = 4) -> list[float]:
    """Powers of two in [lo, hi] for a log2 axis *width* pixels wide: every 1st, 2nd, 5th or 10th power, the
    densest whose labels (about *label_chars* wide) stand apart; each keeps 1K and 1M (2^10, 2^20)."""
    exps = range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)
    span = max(math.log2(hi) - math.log2(lo), 1e-9)
    ticks: list[float] = []
    for stride in (1, 2, 5, 10):
        ticks = [float(2 ** e) for e in exps if e % stride == 0]
        step_px = width * stride / span
        if step_px >= TICK_CHAR_PX * label_chars + TICK_GAP_PX:
            return ticks
    return ticks


def no_data(message: str) -> str:
    return f'<div class="nodata">No data: {esc(message)}</div>'


def json_text(doc: Any) -> str:
    """*doc* as JSON that can sit inside a ``<script>`` element: no ``<`` (so no ``</script>``, no ``<!--``)."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=str).replace("<", "\\u003c")


def clean(value: Any) -> Any:
    """A value JSON can carry: NaN and infinities become None (null), other floats are rounded to 6 significant
    digits (the page's size), the rest unchanged."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.6g}")
    return value


def embed(cid: str, spec: Mapping[str, Any], datasets: Sequence[str] = (), css: str = "") -> str:
    """One chart in the page: its ``<div>`` and its spec (``application/json``, read by the page's script);
    *datasets* names the page's shared rows (:func:`page_scripts`) the spec reads by name."""
    names = " ".join(datasets)
    return (f'<div class="vchart{" " + esc(css) if css else ""}" id="{esc(cid)}"></div>'
            f'<script type="application/json" class="vl-spec" data-for="{esc(cid)}" data-datasets="{esc(names)}">'
            f"{json_text(spec)}</script>")


def legend_params(field: str) -> list[dict[str, Any]]:
    """A legend bound to *field*: a click shows that series alone (shift-click adds), a double click on the plot
    shows every series again; and zoom and pan on both axes (drag, wheel)."""
    return [{"name": "pick", "select": {"type": "point", "fields": [field]}, "bind": "legend"},
            {"name": "zoom", "select": "interval", "bind": "scales"}]


PICKED = {"condition": {"param": "pick", "value": 1, "empty": True}, "value": 0.07}  # a series not shown fades out


def tooltip(fields: Sequence[tuple[str, str] | tuple[str, str, str]]) -> list[dict[str, Any]]:
    """The tooltip of a mark: (field, title) or (field, title, d3 number format) per line."""
    out = []
    for f in fields:
        item: dict[str, Any] = {"field": f[0], "title": f[1]}
        if len(f) > 2:
            item.update(type="quantitative", format=f[2])
        out.append(item)
    return out


def xy_spec(*, data: Mapping[str, Any], x: str, y: str, series: str, colors: Mapping[str, str],
            tips: Sequence[tuple[str, str] | tuple[str, str, str]], x_title: str, y_title: str,
            keep: str = "true", log2_x: bool = False, x_values: Sequence[float] | None = None,
            x_label_expr: str | None = None, x_extent: tuple[float, float] | None = None,
            y_domain: tuple[float, float] | None = None,
            mean_line: bool = True, points: bool = True, crosses: Mapping[str, Any] | None = None,
            bands: Sequence[Mapping[str, Any]] = (), band_colors: Mapping[str, str] | None = None,
            width: int = 600, height: int = 280) -> dict[str, Any]:
    """A scatter of *y* against *x* (rows of *data* for which the expression *keep* holds), coloured by
    *series* (its order and colours: *colors*), with a line per series through the mean *y* at each *x*
    (*mean_line*) and a tooltip of *tips*.

    *crosses* (``{"filter": EXPR, "y": VALUE, "name": LEGEND, "color": C, "tips": [...]}``): rows drawn as
    crosses at the height VALUE (the top of the plot: runs with no value, such as out of memory).
    *bands* (``{"x0", "x1", "band"}``): shaded spans of x behind the data, coloured by *band_colors*.
    The x axis: log2 (*log2_x*), its ticks at *x_values* (e.g. the values measured), labelled by
    *x_label_expr*, over *x_extent* (default: the ticks'), with a margin; labels that would overlap are left out."""
    x_axis: dict[str, Any] = {"title": x_title, "labelOverlap": True, "grid": False}
    if x_values is not None:
        x_axis["values"] = list(x_values)
    if x_label_expr:
        x_axis["labelExpr"] = x_label_expr
    elif x_values is not None:
        x_axis["format"] = "~g"
    x_scale: dict[str, Any] = {"type": "log", "base": 2} if log2_x else {"zero": False, "nice": False}
    extent = x_extent or ((min(x_values), max(x_values)) if x_values else None)
    if extent and not log2_x:  # a margin, so that no marker sits on an axis
        pad = (extent[1] - extent[0]) * 0.04 or 0.5
        x_scale["domain"] = [extent[0] - pad, extent[1] + pad]
    if extent and log2_x:
        x_scale["domain"] = [extent[0] / 2 ** 0.35, extent[1] * 2 ** 0.35]
    y_scale: dict[str, Any] = {"domain": list(y_domain)} if y_domain else {"zero": True}
    names = list(colors)
    enc_x = {"field": x, "type": "quantitative", "scale": x_scale, "axis": x_axis}
    enc_y = {"field": y, "type": "quantitative", "title": y_title, "scale": y_scale}
    color = {"field": series, "type": "nominal", "title": None,
             "scale": {"domain": names, "range": [colors[n] for n in names]},
             "legend": {"orient": "right", "labelLimit": 260, "symbolType": "circle"}}
    kept = [{"filter": keep}, {"filter": f"isValid(datum[{json.dumps(y)}]) && isValid(datum[{json.dumps(x)}])"}]
    layers: list[dict[str, Any]] = []
    for i, b in enumerate(bands):  # behind everything, each band's label on its own line
        layers.append({"data": {"values": [dict(b)]},
                       "mark": {"type": "rect", "opacity": 0.55, "color": (band_colors or {}).get(b["band"], "#eee")},
                       "encoding": {"x": {"field": "x0", "type": "quantitative"}, "x2": {"field": "x1"},
                                    "tooltip": [{"field": "band", "title": "shaded"}]}})
        layers.append({"data": {"values": [dict(b)]}, "mark": {"type": "text", "align": "left", "baseline": "top",
                                                                 "dx": 4, "dy": 4 + 13 * i,
                                                                 "fill": "#555", "fontSize": 10.5},
                       "encoding": {"x": {"field": "x0", "type": "quantitative"}, "y": {"value": 0},
                                    "text": {"field": "band"}}})
    # Vega-Lite makes the legend clickable only from the first layer that draws it: the legend's selection sits there
    pick, zoom = legend_params(series)
    if mean_line:
        layers.append({"transform": kept, "params": [pick], "mark": {"type": "line", "strokeWidth": 1.8},
                       "encoding": {"x": enc_x, "y": {**enc_y, "aggregate": "mean"}, "color": color,
                                    "opacity": PICKED}})
    layers.append({"transform": kept, "params": [zoom] if mean_line else [pick, zoom],
                   "mark": {"type": "point", "filled": True, "size": 48 if points else 12, "stroke": "#fff",
                            "strokeWidth": 0.6 if points else 0},
                   "encoding": {"x": enc_x, "y": enc_y, "color": color, "tooltip": tooltip(tips),
                                "opacity": PICKED}})
    if crosses:
        layers.append({"transform": [{"filter": crosses["filter"]},
                                     {"calculate": json.dumps(crosses["name"]), "as": series},
                                     {"calculate": json.dumps(crosses["y"]), "as": "_top"}],
                       "mark": {"type": "point", "shape": "cross", "angle": 45, "filled": True, "size": 110,
                                "color": crosses["color"]},
                       "encoding": {"x": enc_x, "y": {"field": "_top", "type": "quantitative"},
                                    "color": color, "tooltip": tooltip(crosses["tips"])}})
    return {"width": width, "height": height, "data": dict(data), "layer": layers,
            "config": CONFIG}


def bars_spec(*, data: Mapping[str, Any], label: str, value: str, segment: str, order: str,
              colors: Mapping[str, str], labels: Sequence[str], tips: Sequence[tuple[str, str] | tuple[str, str, str]],
              x_title: str, label_color_expr: str | None = None, width: int = 900,
              bar_h: int = 16) -> dict[str, Any]:
    """Horizontal stacked bars: one bar per *label* (in the order *labels*), its segments (*segment*, stacked
    by *order*, coloured by *colors*) of length *value*; a legend of the segments that toggles them, zoom and
    pan along the values, a tooltip of *tips*. *label_color_expr* colours a bar's label (Vega's expression
    language, ``datum.label`` is its text)."""
    y_axis: dict[str, Any] = {"title": None, "labelLimit": 420}
    if label_color_expr:
        y_axis["labelColor"] = {"expr": label_color_expr}
    names = list(colors)
    return {
        "width": width, "height": {"step": bar_h + 4}, "data": dict(data),
        "params": [{"name": "pick", "select": {"type": "point", "fields": [segment]}, "bind": "legend"},
                   {"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"}],
        "mark": {"type": "bar", "height": bar_h},
        "encoding": {
            "y": {"field": label, "type": "nominal", "sort": list(labels), "axis": y_axis},
            # each row its own segment, stacked (no aggregate: zoom and pan project on x, which a sum forbids)
            "x": {"field": value, "type": "quantitative", "title": x_title, "stack": "zero"},
            "color": {"field": segment, "type": "nominal", "title": None,
                      "scale": {"domain": names, "range": [colors[n] for n in names]},
                      "legend": {"orient": "top", "columns": 8, "labelLimit": 200}},
            "order": {"field": order, "type": "quantitative"},
            "opacity": PICKED,
            "tooltip": tooltip(tips),
        },
        "config": CONFIG,
    }


def ratio_spec(*, data: Mapping[str, Any], label: str, ratio: str, low: str, high: str, group: str,
               colors: Mapping[str, str], labels: Sequence[str], tips: Sequence[tuple[str, str] | tuple[str, str, str]],
               threshold: float, x_title: str, width: int = 900) -> dict[str, Any]:
    """One line per *label* (in the order *labels*): the *ratio* as a dot, its interval [*low*, *high*] as a
    whisker (none where *low* is null), the ±*threshold* band around 1.0 shaded and 1.0 marked; *group* colours
    each line (its order and colours: *colors*), and its legend shows one group (shift-click adds), zoom and pan
    along the ratios, a tooltip of *tips*. The caller says why there is nothing to draw when there is nothing."""
    names = list(colors)
    y = {"field": label, "type": "nominal", "sort": list(labels), "axis": {"title": None, "labelLimit": 380}}
    x = {"type": "quantitative", "title": x_title, "scale": {"zero": False}}
    color = {"field": group, "type": "nominal", "title": None,
             "scale": {"domain": names, "range": [colors[n] for n in names]}, "legend": {"orient": "top"}}
    # the legend's selection sits on the first layer that draws the legend (the whiskers): Vega-Lite makes the
    # legend clickable only from there; a layer without a legend would leave the chart with none
    return {"width": width, "height": {"step": 22}, "data": dict(data),
            "layer": [
                {"data": {"values": [{"lo": 1 - threshold, "hi": 1 + threshold}]},
                 "mark": {"type": "rect", "color": "#eeeeee"},
                 "encoding": {"x": {**x, "field": "lo"}, "x2": {"field": "hi"}}},
                {"data": {"values": [{"one": 1.0}]}, "mark": {"type": "rule", "color": "#333"},
                 "encoding": {"x": {**x, "field": "one"}}},
                {"transform": [{"filter": f"isValid(datum[{json.dumps(low)}])"}],
                 "params": [{"name": "pick", "select": {"type": "point", "fields": [group]}, "bind": "legend"}],
                 "mark": {"type": "rule", "strokeWidth": 2},
                 "encoding": {"y": y, "x": {**x, "field": low}, "x2": {"field": high},
                              "color": color, "opacity": PICKED, "tooltip": tooltip(tips)}},
                {"params": [{"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"}],
                 "mark": {"type": "point", "filled": True, "size": 70},
                 "encoding": {"y": y, "x": {**x, "field": ratio}, "color": color,
                              "opacity": PICKED, "tooltip": tooltip(tips)}}],
            "config": CONFIG}


CONFIG = {"font": "system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, Arial, sans-serif",
          "axis": {"labelFontSize": 11, "titleFontSize": 12, "titleFontWeight": "normal", "gridColor": "#e6e6e6"},
          "legend": {"labelFontSize": 11}, "view": {"stroke": "#ccc"}}


# The page's script after the library: embed every spec (the shared rows put in by name), then say when every
# chart is drawn (``window.sbenchReady``: milliseconds since the page started; ``data-charts`` on <body>).
EMBED_JS = """
(function () {
  // the shared rows come as columns (pack_rows): each row is made again, its null fields left out
  const packed = JSON.parse(document.getElementById('sbench-data').textContent);
  const shared = {};
  for (const n in packed) {
    const f = packed[n].fields;
    shared[n] = packed[n].rows.map(function (r) {
      const o = {};
      for (let i = 0; i < f.length; i++) if (r[i] !== null && r[i] !== undefined) o[f[i]] = r[i];
      return o;
    });
  }
  const drawn = [];
  for (const s of document.querySelectorAll('script.vl-spec')) {
    const spec = JSON.parse(s.textContent);
    const names = (s.dataset.datasets || '').split(' ').filter(Boolean);
    if (names.length) {
      spec.datasets = {};
      for (const n of names) spec.datasets[n] = shared[n] || [];
    }
    const el = document.getElementById(s.dataset.for);
    drawn.push(vegaEmbed(el, spec, {actions: false, renderer: 'svg', tooltip: {theme: 'light'}})
      .then(function (r) { el.vegaView = r.view; }));
  }
  Promise.all(drawn).then(function () {
    window.sbenchReady = performance.now();
    document.body.setAttribute('data-charts', String(drawn.length));
  }, function (e) { console.error('sbench report: a chart could not be drawn: ' + e); });
})();
"""

# Sort a table by a column (click its header; again: the other way) and filter its rows (the box above it).
# A cell that reads as a number (1.2k, 45 %, 3M, 12 s) sorts as that number; empty cells go last.
TABLE_JS = """
(function () {
  const mult = {k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12};
  function key(cell) {
    const t = cell.textContent.trim().replace(/\\u2212/g, '-').replace(/^\\+-/, '');
    const m = t.match(/^([-+]?\\d[\\d,]*(?:\\.\\d+)?)\\s*([kKMGT])?/);
    if (m && /^[-+]?\\d[\\d,]*(?:\\.\\d+)?\\s*(?:[kKMGT%]|[KMG]?B|s)?(?:\\s.*)?$/.test(t))
      return [0, parseFloat(m[1].replace(/,/g, '')) * (m[2] ? mult[m[2]] : 1), t];
    return [t === '' ? 2 : 1, 0, t.toLowerCase()];
  }
  // the rows kept back in a <template> (sections.table) join the table when it comes near the window, or
  // before its filter or sort runs
  function whole(body) {
    const more = body.querySelector('template.more-rows');
    if (more) { body.appendChild(more.content); more.remove(); }
  }
  const near = 'IntersectionObserver' in window ? new IntersectionObserver(function (seen) {
    for (const e of seen) if (e.isIntersecting) { whole(e.target.tBodies[0]); near.unobserve(e.target); }
  }, {rootMargin: '600px 0px'}) : null;
  for (const table of document.querySelectorAll('table.tbl')) {
    const body = table.tBodies[0];
    if (!body || !table.tHead) continue;
    if (body.querySelector('template.more-rows')) {
      if (near) near.observe(table); else whole(body);
    }
    const box = document.createElement('input');
    box.type = 'search'; box.className = 'tfilter'; box.placeholder = 'filter rows';
    box.setAttribute('aria-label', 'filter the rows of the table below');
    table.parentNode.insertBefore(box, table);
    box.addEventListener('input', function () {
      whole(body);
      const q = box.value.toLowerCase();
      for (const r of body.rows) r.style.display = r.textContent.toLowerCase().includes(q) ? '' : 'none';
    });
    const heads = table.tHead.rows[0].cells;
    for (let i = 0; i < heads.length; i++) {
      const th = heads[i];
      th.classList.add('sortable'); th.title = 'sort by this column';
      th.addEventListener('click', function () {
        whole(body);
        const down = th.getAttribute('aria-sort') === 'ascending';
        for (const h of heads) h.removeAttribute('aria-sort');
        th.setAttribute('aria-sort', down ? 'descending' : 'ascending');
        const rows = Array.from(body.rows).map(function (r) { return [key(r.cells[i] || r), r]; });
        rows.sort(function (a, b) {
          const x = a[0], y = b[0];
          if (x[0] !== y[0]) return x[0] - y[0];
          const c = x[0] === 0 ? x[1] - y[1] : (x[2] < y[2] ? -1 : x[2] > y[2] ? 1 : 0);
          return down ? -c : c;
        });
        for (const r of rows) body.appendChild(r[1]);
      });
    }
  }
})();
"""


def pack_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows as ``{"fields": [names], "rows": [[values]]}``: each field's name once, not once per row (a
    1,000-run page's shared rows: 0.38 -> 0.2 MB); a field a row lacks is null, and trailing nulls are left out.
    The page's script (:data:`EMBED_JS`) makes the rows again, without their null fields."""
    fields: dict[str, None] = {}
    for r in rows:
        fields.update(dict.fromkeys(r))
    names = list(fields)
    out = []
    for r in rows:
        values = [r.get(n) for n in names]
        while values and values[-1] is None:
            values.pop()
        out.append(values)
    return {"fields": names, "rows": out}


def page_scripts(datasets: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The page's scripts, all inline: the shared rows (by name, packed: :func:`pack_rows`), the drawing library,
    the embedding, the tables."""
    packed = {name: pack_rows(rows) for name, rows in datasets.items()}
    return (f'<script type="application/json" id="sbench-data">{json_text(packed)}</script>\n'
            f"<script>{vega_bundle()}</script>\n<script>{EMBED_JS}</script>\n<script>{TABLE_JS}</script>")
