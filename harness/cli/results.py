"""CLI: query, check and compare (readers of the results database)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from harness.campaign.search import best as search_best
from harness.contract.errors import InputError
from harness.contract.paths import DbArg, resolve_db
from harness.db.checks import check_results, references_of
from harness.db.reportdata import run_profile
from harness.db.scaling import exposed_communication, fabric_busbw, scaling_runs
from harness.db.status import campaign_names
from harness.db.store import open_store
from harness.report.compare import Verdict, compare_in
from harness.report.envdiff import EnvDiff
from harness.report.scaling import EFFICIENCY_THRESHOLD, scaling_rows

from .base import (
    FiniteFloat,
    at_option,
    campaign_name,
    campaign_ref,
    db_option,
    echo_json,
    json_option,
    main,
    printable,
    say,
    table,
    workdir_option,
)


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


TERMINAL_LIMIT = 10_000  # rows `sbench query` prints to a terminal unless --limit says otherwise
TABLE_BLOCK = 10_000  # rows whose widths set the table's columns when the table is streamed


@main.command()
@click.argument("sql")
@db_option
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="Output format.")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help=f"Print at most this many rows, then say how many there were in all (0: every row). Default: "
                   f"{TERMINAL_LIMIT:,} to a terminal, every row (streamed) to a pipe or file.")
@at_option
def query(sql: str, db: DbArg | None, fmt: str, limit: int | None, at: str | None) -> None:
    """Run SQL against the results database (read-only) and print the rows.

    Rows are streamed: a result of any size is printed without holding it in memory.

    Example: sbench query "select model_name, batch_size, dataset_tokens_per_second from measurements"
    """
    if limit is None:
        limit = TERMINAL_LIMIT if sys.stdout.isatty() else 0
    with open_store(resolve_db(db), read_only=True, at=at) as store:
        cols, stream = store.query(sql)
        rows: Iterator[tuple[Any, ...]] = itertools.islice(stream, limit) if limit else stream
        shown = _print_rows(cols, rows, fmt)
        total: int | None = shown
        if limit and shown == limit and next(stream, None) is not None:
            total = store.count_rows(sql)
    if fmt == "table" and cols:
        click.echo(f"({shown} row{'s' if shown != 1 else ''})" if total == shown else
                   f"({shown} of {'more' if total is None else total} rows)")
    if total != shown:
        click.echo(f"note: printed the first {shown:,} of {'more' if total is None else f'{total:,}'} rows; "
                   "--limit 0 prints every row (streamed), e.g. --format csv > rows.csv", err=True)


def _print_rows(cols: list[str], rows: Iterator[tuple[Any, ...]], fmt: str) -> int:
    """Print *rows* as they come, in blocks; returns how many were printed."""
    n = 0
    if fmt == "json":
        click.echo("[", nl=False)
        for block in _blocks(rows):
            items = [textwrap.indent(json.dumps(dict(zip(cols, r)), indent=2, default=str), "  ") for r in block]
            click.echo(("," if n else "") + "\n" + ",\n".join(items), nl=False)
            n += len(block)
        click.echo("\n]" if n else "]")
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for block in _blocks(rows):
            w.writerows(block)
            n += len(block)
            click.echo(buf.getvalue(), nl=False)
            buf.seek(0)
            buf.truncate()
        click.echo(buf.getvalue(), nl=False)
    else:
        if not cols:
            click.echo("(no result)")
            return 0
        widths: list[int] | None = None
        for block in _blocks(rows, TABLE_BLOCK):
            cells = [{c: _cell(v) for c, v in zip(cols, r)} for r in block]
            if widths is None:  # the first block sets the widths; a later, wider cell just runs on
                text, widths = table(cells, cols), _widths(cells, cols)
            else:
                text = "\n".join(_line(r, cols, widths) for r in cells)
            click.echo(text)
            n += len(block)
        if widths is None:
            click.echo(table([], cols))
    return n


def _blocks(rows: Iterator[tuple[Any, ...]], size: int = 1000) -> Iterator[list[tuple[Any, ...]]]:
    while block := list(itertools.islice(rows, size)):
        yield block


def _widths(cells: list[dict[str, Any]], cols: list[str]) -> list[int]:
    return [max([len(c)] + [len("" if r.get(c) is None else str(r.get(c))) for r in cells]) for c in cols]


def _line(row: dict[str, Any], cols: list[str], widths: list[int]) -> str:
    return "  ".join(("" if row.get(c) is None else str(row.get(c))).ljust(w) for c, w in zip(cols, widths)).rstrip()


@main.command()
@click.argument("base")
@click.argument("cand")
@db_option
@click.option("--metric", "metrics", multiple=True, help="Metric to compare (repeatable; default "
              "dataset_tokens_per_second).")
@click.option("--threshold", type=FiniteFloat(), default=0.10, show_default=True,
              help="Smallest change that counts, as a fraction (0.05 = 5 %).")
@click.option("--include-shared", is_flag=True, help="Keep runs that shared a host with another sbench run at the "
                                                    "same time (measurements.shared_host) or ran on a host busy "
                                                    "with other work (measurements.host_busy); left out by default.")
@at_option
@json_option
def compare(base: str, cand: str, db: DbArg | None, metrics: tuple[str, ...], threshold: float, include_shared: bool,
            at: str | None, as_json: bool) -> None:
    """Compare two campaigns (or run filters) point by point; exit 1 on a regression.

    BASE and CAND are campaign names or filters such as git_commit=3f2a1c,torch=2.13.0. Per point: each
    side's geometric mean over its runs (a run's value is its window's mean, stalls included), their ratio,
    its 95 % interval from Welch's t-test on the log values (with each run's step-time spread), and a
    verdict: regression, improvement, same, or insufficient repeats (the data cannot decide; needs two runs
    a side). Runs measured on a host another sbench run used at the same time, or on a host busy with other
    work, are left out, and the output says how many and why.

    Example: sbench compare nightly-1122 nightly-1123 --threshold 0.05 --metric train_runtime
    """
    with open_store(resolve_db(db), read_only=True, at=at) as st:
        cmp = compare_in(st, base, cand, list(metrics), threshold, include_shared)
    rows = cmp.rows
    regressions = [r for r in rows if r.verdict == Verdict.REGRESSION]
    undecided = [r for r in rows if r.verdict == Verdict.INSUFFICIENT]
    single = [r for r in rows if r.verdict == Verdict.SINGLE]
    if as_json:
        echo_json({"threshold": threshold, "rows": [r.to_dict() for r in rows], "regressions": len(regressions),
                   "insufficient": len(undecided), "single_measurement": len(single),
                   "excluded_shared": cmp.excluded,
                   "excluded": {side: [{"run_id": rid, "why": why} for rid, why in out]
                                for side, out in cmp.left_out.items()},
                   "kept": {side: [{"run_id": rid, "why": why} for rid, why in out] for side, out in cmp.kept.items()},
                   "references": cmp.references, "environment": cmp.env.to_dict()})
    else:
        click.echo(table([{"point_id": r.point_id, "model": r.labels.get("model_name"),
                           "gpus": r.labels.get("number_gpus"), "batch": r.labels.get("batch_size"),
                           "metric": r.metric, "n": f"{r.n_base}/{r.n_cand}", "base": f"{r.base:.4g}",
                           "cand": f"{r.cand:.4g}", "ratio": f"{r.ratio:.3f}", "95% interval":
                           "-" if r.low is None or r.high is None else f"{r.low:.3f}-{r.high:.3f}",
                           "verdict": r.verdict, "changed": _changed(r.changes)} for r in rows],
                         ["point_id", "model", "gpus", "batch", "metric", "n", "base", "cand", "ratio",
                          "95% interval", "verdict", "changed"]))
        counts = {v: sum(1 for r in rows if r.verdict == v) for v in (Verdict.IMPROVEMENT, Verdict.SAME)}
        click.echo(f"\n{len(rows)} comparison(s): {len(regressions)} regression(s) beyond {threshold:.0%}, "
                   f"{counts[Verdict.IMPROVEMENT]} improvement(s), {counts[Verdict.SAME]} same, "
                   f"{len(undecided)} {Verdict.INSUFFICIENT}" + (f", {len(single)} {Verdict.SINGLE}" if single else ""))
        for r in regressions:
            said = "; ".join(c["text"] for c in r.changes) or "nothing in the recorded environments"
            say(f"regression {r.point_id[:12]} {r.metric} ratio {r.ratio:.3f}: changed under it: {said}")
        if undecided:
            shown = ", ".join(f"{r.point_id[:12]} {r.metric} ratio {r.ratio:.3f} ({r.n_base}/{r.n_cand} runs)"
                              for r in undecided[:5])
            click.echo(f"{Verdict.INSUFFICIENT} to decide: {shown}{' ...' if len(undecided) > 5 else ''}; "
                       "measure more repeats (the sweep's repeats:) to tell a change from the runs' spread")
        for side, camp in cmp.references.items():
            say(f"{side} {camp} is a reference campaign (published measurements): its points are paired with the "
                f"other side's on the entity fields it recorded, and with one measurement of a point and no spread "
                f"a row says {Verdict.SINGLE} (the ratio stands, no verdict is drawn)")
        click.echo(cmp.excluded_text)
        _print_changes(cmp.env)
    if regressions:
        click.get_current_context().exit(1)


def _changed(changes: list[dict[str, Any]], n: int = 2) -> str:
    names = [c["name"] for c in changes]
    return ", ".join(names[:n]) + (f" +{len(names) - n}" if len(names) > n else "")


def _print_changes(env: EnvDiff) -> None:
    """What changed between the sides' recorded environments, one line each."""
    if env.changes:
        say(f"what changed under the numbers (BASE -> CAND, {len(env.changes)}):")
        for c in env.changes:
            say(f"  {c.kind:<15} {c.text()}")
    else:
        say("what changed under the numbers: nothing in the recorded environments (packages, drivers, NCCL, "
            "firmware, variables, container, hosts, what ran)")
    if env.note:
        say(f"note: {env.note}")


@main.command()
@click.argument("campaign", callback=campaign_ref)
@db_option
@click.option("--allow-missing", is_flag=True, help="Do not fail on points that have no value to check "
                                                    "(failed, pending or never run) or whose value was measured "
                                                    "on a shared host.")
@json_option
def check(campaign: str, db: DbArg | None, allow_missing: bool, as_json: bool) -> None:
    """Check a campaign's runs against the sweep's references; exit 1 on a failure.

    Collect computes the checks; run it first. Points whose run failed or has not ended are
    'missing', and points measured while another sbench run held the same host are 'shared' (not
    judged); both fail the check too, unless --allow-missing.

    Example: sbench check nightly-1123 --db results.duckdb
    """
    with open_store(resolve_db(db), read_only=True) as st:
        if campaign not in campaign_names(st):
            raise InputError(f"campaign {campaign!r} is not in {st.path}; run `sbench collect` first")
        if campaign not in references_of(st):
            raise InputError(f"campaign {campaign!r} declares no references: add a references: block to its sweep, "
                             "run `sbench submit` with it again (nothing is resubmitted) and `sbench collect`")
        rows = check_results(st, campaign)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("pass", "fail", "missing", "shared")}
    failed = counts["fail"] > 0 or (counts["missing"] + counts["shared"] > 0 and not allow_missing)
    if as_json:
        echo_json({"campaign": campaign, "counts": counts, "ok": not failed, "checks": rows})
    else:
        click.echo(table([{"status": r["status"], "metric": r["metric"], "model": r["model_name"],
                           "gpus": r["number_gpus"], "batch": r["batch_size"], "point_id": r["point_id"],
                           "repeat": r["repeat"], "value": "" if r["value"] is None else f"{r['value']:.4g}",
                           "reference": f"{r['reference']:.4g}",
                           "bounds": f"{_bound(r['lower_bound'])}..{_bound(r['upper_bound'])}",
                           "reason": r["reason"] or ""} for r in rows],
                         ["status", "metric", "model", "gpus", "batch", "point_id", "repeat", "value", "reference",
                          "bounds", "reason"]))
        click.echo(f"\n{campaign}: {counts['pass']} pass, {counts['fail']} fail, {counts['missing']} missing, "
                   f"{counts['shared']} shared (measured on a shared host, not judged)")
    if failed:
        click.get_current_context().exit(1)


def _bound(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


@main.command()
@click.argument("campaign", callback=campaign_ref)
@db_option
@click.option("--threshold", type=FiniteFloat(min=0, max=1, min_open=True), default=EFFICIENCY_THRESHOLD,
              show_default=True, help="A shape under this share of linear scaling gets an explanation.")
@json_option
def scaling(campaign: str, db: DbArg | None, threshold: float, as_json: bool) -> None:
    """Why N devices are not N times faster: each shape's throughput, its efficiency against linear scaling
    from the smallest shape, and what accounts for a loss (stragglers, exposed communication, or unexplained).

    One row per model x experiment x per-device batch x shape (devices, nodes), from the campaign's valid runs
    (profiled runs left out), with the exposed communication's share where the point was profiled, the fabric's
    all-reduce bus bandwidth at that node count (sbench fabric) and the MFU beside it.

    Example: sbench scaling lora-scan --json
    """
    with open_store(resolve_db(db), read_only=True) as st:
        if campaign not in campaign_names(st):
            raise InputError(f"campaign {campaign!r} is not in {st.path}; run `sbench collect` first")
        rows = scaling_rows(scaling_runs(st, campaign), exposed_communication(st, campaign), fabric_busbw(st),
                            threshold)
    if as_json:
        echo_json({"campaign": campaign, "threshold": threshold, "rows": rows})
        return
    if not rows:
        click.echo(f"{campaign}: no valid measured run to set side by side")
        return

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f} %"

    click.echo(table([{"model": r["model_name"], "experiment": r["experiment"], "bs/dev": r["per_device_batch_size"],
                       "gpus": r["number_gpus"], "nodes": r["number_nodes"], "runs": r["runs"],
                       "tok/s": f"{r['dataset_tokens_per_second']:,.1f}",
                       "95 % interval": "-" if r["low"] is None else f"{r['low']:,.1f}..{r['high']:,.1f}",
                       "efficiency": pct(r["efficiency"]), "exposed comm": pct(r["exposed_communication_share"]),
                       "busbw GB/s": "-" if r["fabric_busbw_gbps"] is None else f"{r['fabric_busbw_gbps']:.3g}",
                       "stragglers": ", ".join(r["stragglers"]) or "-", "mfu": pct(r["mfu"]),
                       "explained by": r["explained_by"] or ""} for r in rows],
                     ["model", "experiment", "bs/dev", "gpus", "nodes", "runs", "tok/s", "95 % interval", "efficiency",
                      "exposed comm", "busbw GB/s", "stragglers", "mfu", "explained by"]))
    lost = [r for r in rows if r["explained_by"]]
    click.echo(f"\n{len(lost)} shape(s) under {threshold:.0%} of linear scaling"
               + "".join(f"\n  {r['number_gpus']} device(s) on {r['number_nodes']} node(s): "
                         f"{pct(r['efficiency'])} of linear: "
                         + ("no measured cause (unexplained: profile the shape, or measure the fabric)"
                            if r["explained_by"] == "unexplained" else f"explained by {r['explained_by']}")
                         for r in lost))


@main.command()
@click.argument("run_id", metavar="RUN")
@db_option
@click.option("--top", type=click.IntRange(1, 1000), default=15, show_default=True,
              help="Operators (and kernels) shown per rank, by self time.")
@json_option
def profile(run_id: str, db: DbArg | None, top: int, as_json: bool) -> None:
    """Print where a profiled run's steps went (data, forward, backward, optimizer, exposed and overlapped
    communication, idle, other) and its top operators by self time.

    Example: sbench profile demo-cpu/6b1c0e6f2a9d4e17.r1.a1
    """
    with open_store(resolve_db(db), read_only=True) as st:
        run = run_profile(st, run_id)
    if as_json:
        echo_json(run)
        return
    if not run["ops"]:
        click.echo(f"{run_id}: profiled, but no trace was summarised (outcome {run['outcome'] or 'pending'}; "
                   f"files: {', '.join(run['profile_files'] or []) or 'none'})")
        return
    for rank in sorted({o["rank"] for o in run["ops"]}):
        ops = [o for o in run["ops"] if o["rank"] == rank]
        steps, step_s = ops[0]["steps"], ops[0]["step_s"]
        click.echo(f"{run_id} rank {rank} ({ops[0]['host']}): {steps} profiled steps, "
                   f"{(step_s or 0) * 1000:.1f} ms per step")
        click.echo(table([{"part": o["name"], "share": f"{100 * (o['share'] or 0):.1f} %",
                           "ms/step": f"{1000 * o['self_s'] / max(steps or 1, 1):.2f}"}
                          for o in ops if o["kind"] == "phase"], ["part", "share", "ms/step"]))
        click.echo("")
        click.echo(table([{"kind": o["kind"], "operator": o["name"][:70], "calls": o["calls"],
                           "self ms": f"{1000 * o['self_s']:.2f}", "total ms": f"{1000 * o['total_s']:.2f}",
                           "share": f"{100 * (o['share'] or 0):.1f} %"}
                          for o in ops if o["kind"] != "phase"][:top],
                         ["kind", "operator", "calls", "self ms", "total ms", "share"]))
        click.echo("")
    click.echo(f"trace files (in {run['job_dir']}): {', '.join(run['profile_files'] or []) or 'none'}")


@main.command()
@click.argument("campaign", callback=campaign_name)
@db_option
@workdir_option
@json_option
def best(campaign: str, db: DbArg | None, workdir: Path | None, as_json: bool) -> None:
    """Say what a search campaign found: its best point and the largest batch that fits per shape.

    The campaign's sweep has a search: section; the answer is read from the results database (collect first),
    with the evidence of each decision and the seconds the search spent beside the full grid's estimate.

    Example: sbench best lora-search --json
    """
    ans = search_best(campaign, workdir, db)
    if as_json:
        echo_json(ans)
        return
    b = ans["best"]
    metric = ans["objectives"][0]["metric"]
    state = ("done" if ans["done"] else "stopped at its budget (raise budget: and run sbench submit to go on)"
             if ans.get("stopped_at_budget") else "still running (collect goes on with it)")
    goal = ", ".join(f"{o['sense']} {o['metric']}" for o in ans["objectives"])
    click.echo(f"search {printable(campaign)}: {state}; goal {goal}")
    if b:
        lo, hi = b["interval"]
        fields = {k: v for k, v in b.items()
                  if k not in ("point_id", "value", "interval", "runs", "entity", "cost_per_million_tokens",
                               "busy_runs_left_out", "busy_host_only")}
        named = f" ({', '.join(f'{k}={printable(str(v))}' for k, v in fields.items())})" if fields else ""
        cost = b.get("cost_per_million_tokens")
        click.echo(f"best: {printable(b['point_id'])}{named}  {metric} {b['value']:,.4g} (95 % interval {lo:,.4g} "
                   f".. {hi:,.4g}, {b['runs']} run(s))"
                   + (f"; {cost:,.4g} per million tokens at its partition's price_per_gpu_hour" if cost else ""))
        if b.get("busy_host_only"):
            click.echo("note: every run of the best point ran on a host busy with other work (measurements.host_busy); "
                       "its figure is what that busy host gave", err=True)
        elif b.get("busy_runs_left_out"):
            click.echo(f"note: {b['busy_runs_left_out']} run(s) of the best point on a busy host were left out")
    else:
        click.echo("best: none yet")
    if ans["pareto"]:
        click.echo(f"the Pareto front ({len(ans['pareto'])} point(s): none is better on every objective beyond the "
                   "intervals):")
        names = [o["metric"] for o in ans["objectives"]]
        rows = [{"point": p["point_id"], **{k: v for k, v in p.items() if k not in ("point_id", "objectives")},
                 **{m: "-" if (iv := p["objectives"][m]) is None else
                    f"{iv['value']:,.4g} ({iv['interval'][0]:,.4g} .. {iv['interval'][1]:,.4g})" for m in names}}
                for p in ans["pareto"]]
        click.echo(table(rows, list(rows[0])))
    if ans["max_batch_size"]:
        rows = [{"shape": ", ".join(f"{k}={v}" for k, v in m["shape"].items()), "batch_size": m["batch_size"],
                 "largest ok": m["largest_ok"], "smallest OOM": m["smallest_oom"],
                 "decided": "yes" if m["decided"] else "no"} for m in ans["max_batch_size"]]
        click.echo(table(rows, ["shape", "batch_size", "largest ok", "smallest OOM", "decided"]))
    if ans["grid_train_s_estimate"] > 0:
        click.echo(f"{ans['runs']} run(s) of {ans['grid_points']} grid point(s); training {ans['train_s']:.1f} s "
                   f"(the grid: about {ans['grid_train_s_estimate']:.1f} s), allocations {ans['allocation_s']:.1f} s "
                   f"(the grid: about {ans['grid_allocation_s_estimate']:.1f} s; each grid point from: "
                   f"{ans['grid_estimate_from']})")
    else:  # no run has ended with a measurement: nothing to estimate the grid from
        click.echo(f"{ans['runs']} run(s) of {ans['grid_points']} grid point(s); training {ans['train_s']:.1f} s, "
                   f"allocations {ans['allocation_s']:.1f} s (the grid's cost: not estimated until a run ends)")
    if ans["stuck"]:
        click.echo(f"failed runs wait for sbench retry {printable(campaign)}: {', '.join(ans['stuck'])}", err=True)
    if ans.get("stopped_at_budget"):
        left = ans["stopped_at_budget"]
        click.echo(f"left undone at the budget: the next run of {len(left)} point(s) "
                   f"({', '.join(map(printable, left))}): {next(iter(left.values()))}", err=True)
