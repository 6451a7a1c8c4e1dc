"""Expected values of a campaign's measurements, and the checks of runs against them.

A sweep declares ``references:``, one entry (or a list of entries) per metric::

    references:
      train_tokens_per_second:            # a measurements column (see catalog.METRICS)
        value: 5200
        lower: 0.10                       # at most 10 % below value; omit for no lower bound
      gpu_memory_utilization_peak:
        - {value: 62, upper: 0.05, model_name: llama3-8b, number_gpus: 8}
        - {value: 40, upper: 0.25}        # every other point

``lower`` and ``upper`` are fractions of ``value`` (ReFrame's reference tuples, without the sign):
the bounds are ``value * (1 - lower)`` and ``value * (1 + upper)``. The other keys of an entry are
entity fields that select points; the entry with the most matching selectors applies, the first in
the file on a tie, and a point no entry selects is not checked for that metric.

Another campaign can give the values instead (the reference's published measurements, imported with
``sbench import --format ado-csv``, or another cluster's campaign)::

    references:
      from_campaign: ado-published        # each point's value: that campaign's valid measurements of the point
      dataset_tokens_per_second: {lower: 0.10}

The campaign's point is found on the entity fields it recorded (all of them for a campaign measured by sbench,
those its file gives for a published one: :func:`harness.spec.published.matches`), and the value is the median of
its valid measurements. ``from_campaign`` alone checks ``dataset_tokens_per_second`` with ``lower: 0.10``
(:data:`FROM_CAMPAIGN_DEFAULT`); the entries then have no ``value:``. A point the campaign has no measurement of is
``missing``, with the reason.

Collect checks each point and repeat of the campaign, at its latest attempt, into the ``checks``
table: ``pass``, ``fail``, ``missing`` (the run failed, is not over, or did not measure the
metric), or ``shared`` (it measured while another sbench run held one of its hosts, ``runs.overlapped_with``, or
while other work kept a host busy, ``measurements.host_busy``, or while one of its ranks straggled,
``measurements.straggler``: its value is noise, not judged). ``sbench check CAMPAIGN`` prints them and exits 1
on any fail (or missing or shared, unless ``--allow-missing``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.contract.errors import InputError

from .catalog import METRICS, Experiment
from .schema import MAX_LIST, Checker, is_campaign_ref

ENTRY_KEYS = ("value", "lower", "upper", "unit")
FROM_CAMPAIGN = "from_campaign"
FROM_CAMPAIGN_DEFAULT = {"dataset_tokens_per_second": {"lower": 0.10}}  # what from_campaign alone checks


@dataclass(frozen=True)
class Reference:
    metric: str
    value: float | None  # None: from_campaign gives each point's value
    lower: float | None = None  # fraction below value allowed; None: unbounded
    upper: float | None = None  # fraction above value allowed; None: unbounded
    unit: str | None = None
    where: dict[str, Any] = field(default_factory=dict)  # entity field -> value the point must have
    order: int = 0  # position in the sweep (ties go to the first)
    from_campaign: str | None = None  # the campaign whose measurement of each point is the value

    def bounds(self, value: float | None = None) -> tuple[float | None, float | None]:
        """The lower and upper bound around *value* (default: the entry's own)."""
        v = self.value if value is None else value
        if v is None:
            return None, None
        return (None if self.lower is None else v * (1.0 - self.lower),
                None if self.upper is None else v * (1.0 + self.upper))

    @property
    def low(self) -> float | None:
        return self.bounds()[0]

    @property
    def high(self) -> float | None:
        return self.bounds()[1]

    def selects(self, entity: Mapping[str, Any]) -> bool:
        return all(_same(entity.get(k), v) for k, v in self.where.items())

    def to_dict(self) -> dict[str, Any]:
        doc = {"metric": self.metric, "value": self.value, "lower": self.lower, "upper": self.upper,
               "unit": self.unit, "where": dict(self.where), "order": self.order}
        if self.from_campaign is not None:  # (the entries of a sweep without one are recorded as before)
            doc[FROM_CAMPAIGN] = self.from_campaign
        return doc

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reference:
        return cls(metric=str(d["metric"]), value=None if d.get("value") is None else float(d["value"]),
                   lower=None if d.get("lower") is None else float(d["lower"]),
                   upper=None if d.get("upper") is None else float(d["upper"]), unit=d.get("unit"),
                   where=dict(d.get("where") or {}), order=int(d.get("order") or 0),
                   from_campaign=None if d.get(FROM_CAMPAIGN) is None else str(d[FROM_CAMPAIGN]))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return str(a) == str(b)


def parse_references(node: Any, experiment: Experiment, ck: Checker, parent: Any) -> list[Reference]:
    """The sweep's ``references:`` block (None: no references), checked key by key."""
    if node is None:
        return []
    node = ck.mapping(node, "references", parent, "references")
    ck.known_keys(node, "references", [FROM_CAMPAIGN, *METRICS])  # a metric name: the numeric measurements columns
    source = None
    if FROM_CAMPAIGN in node:
        source = ck.string(node, "references", FROM_CAMPAIGN)
        if not is_campaign_ref(source):
            ck.fail(f"references.{FROM_CAMPAIGN}", f"must name a campaign of the results database (a name, or "
                    f"cluster/name for an imported one), got {source!r}", node, FROM_CAMPAIGN)
    metrics = {k: v for k, v in node.items() if k != FROM_CAMPAIGN}
    if source is not None and not metrics:
        metrics = dict(FROM_CAMPAIGN_DEFAULT)
    out: list[Reference] = []
    fields = list(experiment.field_names)
    for metric, entries in metrics.items():
        metric = str(metric)
        dotted = f"references.{metric}"
        items = entries if isinstance(entries, list) else [entries]
        if not items or len(items) > MAX_LIST:
            ck.fail(dotted, f"must be one entry or a list of 1 to {MAX_LIST} entries", node, metric)
        for i, entry in enumerate(items):
            where = f"{dotted}[{i}]" if isinstance(entries, list) else dotted
            entry = ck.mapping(entry, where, node, metric)
            if not entry:
                ck.fail(where, "must be a mapping with value: and lower: and/or upper:", node, metric)
            ck.known_keys(entry, where, [*ENTRY_KEYS, *fields])
            if source is not None:
                if entry.get("value") is not None:
                    ck.fail(f"{where}.value", f"comes from references.{FROM_CAMPAIGN} ({source}): leave value out, "
                            "or drop from_campaign", entry, "value")
                value = None
            else:
                ck.require(entry, where, "value", "the expected value of the metric")
                value = float(ck.number(entry, where, "value"))
            lower = ck.number(entry, where, "lower", minimum=0.0)
            upper = ck.number(entry, where, "upper", minimum=0.0)
            if lower is None and upper is None:
                ck.fail(where, "needs lower: and/or upper: (fractions of value, e.g. lower: 0.1 for at most "
                               "10 % below)", entry)
            if lower is not None and lower > 1 and (value is None or value >= 0):
                ck.fail(f"{where}.lower", f"is a fraction of value (0.1 = 10 %); {lower:g} would allow a "
                                          "negative measurement", entry, "lower")
            unit = ck.string(entry, where, "unit", default=None)
            sel: dict[str, Any] = {}
            for k in entry:
                if k in ENTRY_KEYS:
                    continue
                spec = experiment.field(str(k))
                assert spec is not None
                try:
                    sel[str(k)] = spec.coerce(entry[k], f"{ck.source}: {where}")
                except InputError as exc:
                    ck.fail(f"{where}.{k}", f"is no valid value for this selector: {exc}", entry, k)
            out.append(Reference(metric, value, None if lower is None else float(lower),
                                 None if upper is None else float(upper), unit, sel, len(out), source))
    return out


def pick(refs: Iterable[Reference], metric: str, entity: Mapping[str, Any]) -> Reference | None:
    """The entry for *metric* that applies to a point: most selectors matched, then the first."""
    best: Reference | None = None
    for r in refs:
        if r.metric == metric and r.selects(entity) and (best is None or len(r.where) > len(best.where)):
            best = r
    return best


# (the campaign, the metric, the point's entity) -> the value that campaign measured of the point, or None
ValueOf = Callable[[str, str, Mapping[str, Any]], float | None]


def check_rows(campaign: str, refs: Sequence[Reference], points: Sequence[Mapping[str, Any]],
               value_of: ValueOf | None = None) -> list[dict[str, Any]]:
    """One ``checks`` row per point-repeat and metric a reference applies to; *value_of* gives the values of
    entries with ``from_campaign``.

    *points*: the campaign's point-repeats at their latest attempt, each with ``point_id``, ``repeat``,
    ``experiment``, ``entity`` (dict), ``run_id``/``outcome`` (None when never run), ``overlapped_with`` (the runs
    that shared a host with it), ``host_busy`` and ``host_other_cpu_pct`` (other work kept its host busy),
    ``straggler`` and ``straggler_ranks`` (a rank held the run back) and ``values``
    (metric -> value or None; empty without a measurements row)."""
    rows: list[dict[str, Any]] = []
    metrics = list(dict.fromkeys(r.metric for r in refs))
    for p in points:
        for metric in metrics:
            ref = pick(refs, metric, p["entity"])
            if ref is None:
                continue
            value = (p.get("values") or {}).get(metric)
            expected = ref.value
            if ref.from_campaign is not None:
                point = {**p["entity"], "experiment": p.get("experiment")}
                expected = value_of(ref.from_campaign, metric, point) if value_of is not None else None
            low, high = ref.bounds(expected)
            if expected is None:
                status, reason = "missing", (f"no reference value: {ref.from_campaign} has no valid measurement of "
                                             f"{metric} for this point (matched on the entity fields it recorded)")
            elif value is None or (isinstance(value, float) and not math.isfinite(value)):
                status = "missing"
                if p.get("run_id") is None:
                    reason = "not run yet"
                elif p.get("outcome") is None:
                    reason = "the run is not over"
                elif p.get("outcome") != "ok":
                    reason = f"the run is {p.get('outcome')}"
                else:
                    reason = f"the run measured no {metric}"
            elif p.get("overlapped_with"):
                others = list(p["overlapped_with"])
                status = "shared"
                reason = (f"not judged: measured while {', '.join(others[:3])}{' ...' if len(others) > 3 else ''} "
                          "held the same host (runs.overlapped_with); measure it again on its own")
            elif p.get("host_busy"):
                status = "shared"
                load = p.get("host_other_cpu_pct")
                reason = ("not judged: measured on a host busy with other work (measurements.host_busy"
                          + (f": {load:.0f} % of its CPU" if isinstance(load, (int, float)) else "")
                          + "); measure it again on a quiet host")
            elif p.get("straggler"):
                status = "shared"
                slow = list(p.get("straggler_ranks") or [])
                reason = ("not judged: a straggler rank (measurements.straggler"
                          + (f": {', '.join(slow[:3])}" if slow else "")
                          + "; rank_scores) held the run back; drain the host or measure it again without it")
            elif low is not None and value < low:
                status, reason = "fail", f"{value:.6g} < {low:.6g} ({expected:.6g} - {ref.lower:.0%})"
            elif high is not None and value > high:
                status, reason = "fail", f"{value:.6g} > {high:.6g} ({expected:.6g} + {ref.upper:.0%})"
            else:
                status, reason = "pass", None
            if ref.from_campaign is not None and expected is not None and status in ("pass", "fail"):
                reason = f"{reason + '; ' if reason else ''}reference: {ref.from_campaign}"
            selector = dict(ref.where) or None
            if ref.from_campaign is not None:
                selector = {**(selector or {}), FROM_CAMPAIGN: ref.from_campaign}
            rows.append({"campaign": campaign, "point_id": p["point_id"], "repeat": p["repeat"],
                         "run_id": p.get("run_id"), "metric": metric, "value": value, "reference": expected,
                         "lower_bound": low, "upper_bound": high, "unit": ref.unit,
                         "selector": selector, "status": status, "reason": reason,
                         "deviation": None if value is None or not expected else value / expected - 1.0})
    return rows


