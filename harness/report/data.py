"""What the report shows, read from the results database: :class:`ReportData` and its loaders.

:func:`load_report_data` picks the campaign the page shows (the one asked for, the one of ``--run``, else
the latest by creation time; or every campaign), asks :mod:`harness.db.reportdata` for every row the page
needs in that scope, picks the run of the utilisation panels and averages its samples into time buckets;
:func:`load_compare` adds the compare section's rows. Nothing here writes HTML.
"""

from __future__ import annotations

import datetime as _dt
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.contract.errors import InputError, SbenchError
from harness.contract.paths import resolve_db
from harness.db import reportdata
from harness.db.checks import check_results, references_of
from harness.db.hosts import drain_reason, host_health
from harness.db.scaling import exposed_communication, fabric_busbw, scaling_runs
from harness.db.search import search_evidence
from harness.db.store import Store
from harness.db.values import from_json
from harness.spec.catalog import EXPERIMENTS
from harness.spec.repeats import verdict
from harness.spec.search import answer as search_answer
from harness.spec.sweep import AdaptiveRepeats

from .charts import plural
from .clusters import load_clusters
from .compare import PROFILED, compare_in, left_out_why
from .scaling import scaling_rows

MAX_TRACE_POINTS = 600  # per series: long runs are averaged into this many time buckets


class ReportError(SbenchError):
    """The database holds nothing to report (exit 1)."""


@dataclass
class ReportData:
    """Everything one page shows: rows read from the DB, nothing rendered."""

    db: str
    generated_at: _dt.datetime
    campaign: str | None  # the campaign shown; None: every campaign (--all-campaigns), or those of ``shown``
    campaigns: list[dict[str, Any]]  # the campaigns rows in scope
    outcomes: dict[str, int]
    measurements: list[dict[str, Any]]  # every measurement in scope, with ``method`` and ``run_reason``,
    # except those of runs that shared a host with another run: they are in ``shared``, shown only as such
    stage_runs: list[dict[str, Any]]  # per run: label fields, ``outcome`` and ``stages`` {stage: seconds}
    gpu_samples: int  # GPU sample rows in scope (0: no GPU was sampled)
    run: dict[str, Any] | None = None  # the run of the utilisation panels
    run_choice: str = ""
    traces: list[dict[str, Any]] = field(default_factory=list)  # bucketed samples of that run
    run_offset: float | None = None  # t_wall - x of the traces (to place window bounds)
    fabric: list[dict[str, Any]] = field(default_factory=list)  # rows of the latest sbench fabric runs
    hosts: list[dict[str, Any]] = field(default_factory=list)  # host_health, across campaigns, with drain reasons
    preflight: list[dict[str, Any]] = field(default_factory=list)  # rows of the latest sbench preflight runs
    overhead: list[dict[str, Any]] = field(default_factory=list)  # run_overhead rows, most outside-train first
    checks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # campaign -> its checks rows
    compare: dict[str, Any] | None = None  # base, cand, threshold, rows (harness.report.compare.Row dicts)
    scope: str = "chosen"  # how the campaign was picked: SCOPES
    campaign_index: list[dict[str, Any]] = field(default_factory=list)  # every campaign, oldest first
    db_option: str = ""  # " --db PATH" when the DB is not the default one (for the commands the page gives)
    shared: list[dict[str, Any]] = field(default_factory=list)  # measurements left out: shared_host true
    stability: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (campaign, point_id) ->
    # its point_stability row: the throughput's CV across repeats and its rating
    shown: list[str] = field(default_factory=list)  # the campaigns of a page around two (report --compare A B)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # every attempt: why it was sent, what it measured
    repeats: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (campaign, point_id) -> its
    # repeats: how many, the target, the state (point_repeats)
    clusters: list[dict[str, Any]] = field(default_factory=list)  # the points across clusters (report.clusters)
    profiles: list[dict[str, Any]] = field(default_factory=list)  # profiled runs with their profile_ops rows
    searches: list[dict[str, Any]] = field(default_factory=list)  # each search campaign's answer (sbench best's)
    # each campaign's scaling view (sbench scaling's rows), for those with more than one shape of a group
    scaling: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def by_campaign(self) -> bool:
        """Every campaign on one page, more than one there: lines and rows are per campaign too."""
        return (self.scope == "all" and len(self.campaign_index) > 1) or (self.scope == "compare"
                                                                          and len(self.shown) > 1)


SCOPES = {"latest": "the latest campaign by creation time", "chosen": "chosen with --campaign",
          "run": "the campaign of --run", "all": "every campaign (--all-campaigns)",
          "compare": "the two campaigns of --compare"}


def method_of(experiment: str | None) -> str:
    exp = EXPERIMENTS.get(str(experiment)) if experiment else None
    return exp.method if exp is not None else str(experiment or "?")


def load_report_data(store: Store, campaign: str | None = None, run_id: str | None = None,
                     now: _dt.datetime | None = None, all_campaigns: bool = False,
                     around: Sequence[str] = ()) -> ReportData:
    """Everything the page shows, from an open (read-only) store: *campaign*'s; without it, the campaign of
    *run_id*, else the campaigns *around* (``report --compare A B``: both), else the latest campaign (by
    creation time); with *all_campaigns*, every campaign's."""
    index = reportdata.campaign_list(store)
    known = [c["campaign"] for c in index]
    if reportdata.run_total(store) == 0 and not known:
        raise ReportError(f"{store.path} has no runs: nothing to report. Run `sbench collect` first "
                          f"(or pass --db with another results database).")
    if campaign is not None and all_campaigns:
        raise InputError("--campaign and --all-campaigns: give one of them (one campaign, or every campaign)")
    if campaign is not None and campaign not in known:
        raise InputError(f"--campaign {campaign!r}: not in {store.path}; campaigns there: {', '.join(known)}")
    scope = "chosen" if campaign is not None else "all" if all_campaigns else "latest"
    shown = [c for c in dict.fromkeys(around) if c in known]
    if scope == "latest" and run_id is not None and reportdata.run_campaign(store, run_id) is not None:
        campaign, scope = reportdata.run_campaign(store, run_id), "run"
    elif scope == "latest" and len(shown) == 1:
        campaign, scope = shown[0], "compare"
    elif scope == "latest" and shown:
        scope = "compare"
    elif scope == "latest":
        campaign = known[-1] if known else None
    where: reportdata.Scope = shown if scope == "compare" and campaign is None else campaign
    measurements: list[dict[str, Any]] = []
    shared: list[dict[str, Any]] = []
    for m in reportdata.measurement_rows(store, where):
        m["method"] = method_of(m["experiment"])
        why = left_out_why(m)
        if why != PROFILED:  # a profiled run's figures measured the profiler too: the profile section shows it
            (shared if why else measurements).append(m)
    per_run: dict[str, dict[str, float]] = {}
    for s in reportdata.stage_seconds(store, where):
        name = f"{s['stage']} (unfinished)" if s["unfinished"] else s["stage"]
        per_run.setdefault(s["run_id"], {})[name] = max(float(s["seconds"]), 0.0)
    stage_runs = [dict(r, method=method_of(r["experiment"]), stages=per_run[r["run_id"]])
                  for r in reportdata.run_rows(store, where) if r["run_id"] in per_run]
    data = ReportData(db=str(store.path), generated_at=now or _dt.datetime.now(_dt.timezone.utc),
                      campaign=campaign, campaigns=reportdata.campaign_rows(store, where),
                      outcomes=reportdata.outcome_counts(store, where), measurements=measurements,
                      stage_runs=stage_runs, gpu_samples=reportdata.gpu_sample_count(store, where),
                      scope=scope, campaign_index=index, shared=shared,
                      db_option="" if str(store.path) == str(resolve_db()) else f" --db {shlex.quote(str(store.path))}")
    data.shown = shown if scope == "compare" else []
    _load_run(store, data, where, run_id)
    data.fabric = reportdata.fabric_rows(store)
    data.hosts = [{**h, "why": drain_reason(h)} for h in host_health(store)]
    data.preflight = reportdata.preflight_rows(store)
    data.overhead = reportdata.overhead_rows(store, where)
    data.stability = reportdata.stability_rows(store, where)
    data.checks = {c: check_results(store, c) for c in sorted(references_of(store))
                   if (campaign in (None, c) and not data.shown) or c in data.shown}
    data.attempts = reportdata.attempt_rows(store, where)
    data.profiles = reportdata.profile_runs(store, where)
    data.repeats = point_repeats(data.campaigns, data.attempts, data.stability,
                                 reportdata.planned_repeats(store, where))
    data.clusters = load_clusters(store, measurements)
    data.searches = [search_answer(ev) for ev in (search_evidence(store, c["campaign"]) for c in data.campaigns)
                     if ev is not None]
    for c in data.campaigns:
        rows = scaling_rows(scaling_runs(store, c["campaign"]), exposed_communication(store, c["campaign"]),
                            fabric_busbw(store))
        groups = {(r["model_name"], r["experiment"], r["per_device_batch_size"]) for r in rows}
        if len(rows) > len(groups):  # some group has more than one shape: something to set side by side
            data.scaling[str(c["campaign"])] = rows
    return data


def point_repeats(campaigns: Sequence[Mapping[str, Any]], attempts: Sequence[Mapping[str, Any]],
                  stability: Mapping[tuple[str, str], Mapping[str, Any]],
                  planned: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (campaign, point): its repeats (submitted, and of how many: ``repeats: N``'s, or adaptive repeats'
    bounds and CV target), its state (adaptive: :func:`harness.spec.repeats.verdict`, as status says it; else
    ``done``, ``waiting`` or ``failed``) and the verdict's words."""
    specs: dict[str, AdaptiveRepeats] = {}
    for c in campaigns:
        doc = c.get("repeats_spec")
        try:
            d = from_json(doc)
            if isinstance(d, dict):
                specs[str(c["campaign"])] = AdaptiveRepeats(int(d["min"]), int(d["max"]), float(d["cv"]))
        except (ValueError, KeyError, TypeError):
            continue
    last: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for a in attempts:
        key = (str(a["campaign"]), str(a["point_id"]), int(a["repeat"]))
        if key not in last or int(a["attempt"]) > int(last[key]["attempt"]):
            last[key] = a
    by_point: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for (camp, pid, _rep), a in last.items():
        by_point.setdefault((camp, pid), []).append(a)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (camp, pid), runs in by_point.items():
        in_flight = sum(1 for a in runs if a.get("outcome") is None)
        failed = sum(1 for a in runs if a.get("outcome") == "failed")
        st = stability.get((camp, pid)) or {}
        spec = specs.get(camp)
        if spec is not None:
            v = verdict(spec, pid, {int(a["repeat"]) for a in runs}, in_flight, int(st.get("repeats_measured") or 0),
                        st.get("throughput_cv"))
            out[(camp, pid)] = {"repeats": f"{v.submitted} (min {spec.min}, max {spec.max})",
                                "target": f"CV <= {100 * spec.cv:g} %", "state": v.state, "text": v.text()}
        else:
            n = planned.get((camp, pid), len(runs))
            state = "waiting" if in_flight else "failed" if failed else "done"
            out[(camp, pid)] = {"repeats": f"{len(runs)} of {n}", "target": plural(n, "repeat"), "state": state,
                                "text": f"{in_flight} in flight, {failed} failed" if in_flight or failed else ""}
    return out


def load_compare(store: Store, base: str, cand: str, threshold: float,
                 metrics: Sequence[str] = ()) -> dict[str, Any]:
    """The compare section's data: ``sbench compare BASE CAND`` over the same store."""
    cmp = compare_in(store, base, cand, list(metrics), threshold)
    return {"base": base, "cand": cand, "threshold": threshold, "rows": [r.to_dict() for r in cmp.rows],
            "excluded": cmp.excluded, "excluded_text": cmp.excluded_text if any(cmp.excluded.values()) else "",
            "environment": cmp.env.to_dict(), "references": cmp.references}


def _load_run(store: Store, data: ReportData, campaign: reportdata.Scope, run_id: str | None) -> None:
    """Pick the run of the utilisation panels and load its samples, averaged into time buckets."""
    if run_id is not None:
        row = reportdata.utilisation_run(store, run_id)
        if row is None:
            some = reportdata.some_run_ids(store, 3)
            raise InputError(f"--run {run_id!r}: no such run in {store.path}; run ids look like "
                             f"{', '.join(some)} (list them: sbench query \"SELECT run_id FROM runs\")")
        choice = "chosen with --run"
    else:
        row = reportdata.utilisation_run(store, campaign=campaign, pick="longest_ok")
        choice = "the longest ok run; pick another with --run RUN_ID"
        if row is None:  # no ok run: the one with the most samples, if any has samples
            row = reportdata.utilisation_run(store, campaign=campaign, pick="most_samples")
            choice = "no ok run: the run with the most samples; pick another with --run RUN_ID"
    if row is None:
        return
    data.run, data.run_choice = row, choice
    data.traces = reportdata.run_traces(store, row["run_id"], MAX_TRACE_POINTS)
    offsets = [t["offset"] for t in data.traces if t["offset"] is not None]
    data.run_offset = sum(offsets) / len(offsets) if offsets else None

