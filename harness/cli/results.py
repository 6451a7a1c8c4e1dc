"""CLI: collect, query and report."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import click

from harness.collect import collect as run_collect
from harness.contract.errors import InputError
from harness.contract.paths import resolve_db, resolve_workdir
from harness.db.checks import check_results, references_of
from harness.db.status import campaign_names
from harness.db.store import open_store
from harness.report.compare import compare_in

from .base import Progress, campaign_name, db_option, echo_json, json_option, main, say, table, workdir_option

COLLECT_PHASES = {"discover": "finding runs", "parse": "reading job dirs", "samples": "loading samples"}


@main.command()
@db_option
@workdir_option
@click.option("--campaign", default=None, callback=campaign_name, help="Only this campaign's runs.")
@json_option
def collect(db: Path | None, workdir: Path | None, campaign: str | None, as_json: bool) -> None:
    """Read job directories and SLURM accounting into the results database.

    Example: sbench collect --campaign lora-scan
    """
    wd = resolve_workdir(workdir)
    if not wd.is_dir():
        raise InputError(f"--workdir {wd}: no such directory; nothing to collect (submit a sweep first, or pass "
                         "--workdir / $SBENCH_WORKDIR where its job directories are)")
    if campaign and not (wd / campaign).is_dir():
        raise InputError(f"--campaign {campaign}: no campaign directory {wd / campaign}")
    prog = Progress("collect", COLLECT_PHASES, quiet=as_json)
    try:
        report = run_collect(resolve_db(db), wd, campaign, progress=prog)
    finally:
        prog.close()
    if as_json:
        echo_json(report.to_dict())
        return
    outcomes = ", ".join(f"{v} {k}" for k, v in report.outcomes.items()) or "none"
    click.echo(f"collected {report.runs} run(s) into {report.db}: {report.new} new, {report.updated} updated, "
               f"{report.unchanged} unchanged; {report.sample_rows} sample rows loaded in {report.elapsed_s:.1f} s")
    click.echo(f"runs of campaign {campaign} by outcome: {outcomes}" if campaign
               else f"runs by outcome (every campaign): {outcomes}")
    if report.sacct and report.sacct != "ok":
        click.echo(f"note: SLURM accounting unavailable ({report.sacct}); states come from squeue and the files",
                   err=True)
    for w in report.warnings:
        say(f"warning: {w}", err=True)


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


@main.command()
@click.argument("sql")
@db_option
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="Output format.")
def query(sql: str, db: Path | None, fmt: str) -> None:
    """Run SQL against the results database (read-only) and print the rows.

    Example: sbench query "select model_name, batch_size, dataset_tokens_per_second from measurements"
    """
    with open_store(resolve_db(db), read_only=True) as store:
        cols, rows = store.query(sql)
    if fmt == "json":
        click.echo(json.dumps([dict(zip(cols, r)) for r in rows], indent=2, default=str))
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(rows)
        click.echo(buf.getvalue(), nl=False)
    else:
        if not cols:
            click.echo("(no result)")
            return
        click.echo(table([{c: _cell(v) for c, v in zip(cols, r)} for r in rows], cols))
        click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


@main.command()
@click.argument("base")
@click.argument("cand")
@db_option
@click.option("--metric", "metrics", multiple=True, help="Metric to compare (repeatable; default "
              "dataset_tokens_per_second).")
@click.option("--threshold", type=float, default=0.10, show_default=True,
              help="Smallest change that counts, as a fraction (0.05 = 5 %).")
@click.option("--include-shared", is_flag=True, help="Keep runs that shared a host with another sbench run at the "
                                                    "same time (measurements.shared_host); left out by default.")
@json_option
def compare(base: str, cand: str, db: Path | None, metrics: tuple[str, ...], threshold: float, include_shared: bool,
            as_json: bool) -> None:
    """Compare two campaigns (or run filters) point by point; exit 1 on a regression.

    BASE and CAND are campaign names or filters such as git_commit=3f2a1c,torch=2.13.0. Runs measured on
    a host another sbench run used at the same time are left out, and the output says how many.

    Example: sbench compare nightly-1122 nightly-1123 --threshold 0.05 --metric train_runtime
    """
    with open_store(resolve_db(db), read_only=True) as st:
        cmp = compare_in(st, base, cand, list(metrics), threshold, include_shared)
    rows = cmp.rows
    regressions = [r for r in rows if r.verdict.startswith("regression")]
    if as_json:
        echo_json({"threshold": threshold, "rows": [r.to_dict() for r in rows], "regressions": len(regressions),
                   "excluded_shared": cmp.excluded})
    else:
        click.echo(table([{"point_id": r.point_id, "model": r.labels.get("model_name"),
                           "gpus": r.labels.get("number_gpus"), "batch": r.labels.get("batch_size"),
                           "metric": r.metric, "n": f"{r.n_base}/{r.n_cand}", "base": f"{r.base:.4g}",
                           "cand": f"{r.cand:.4g}", "ratio": f"{r.ratio:.3f}", "95% interval":
                           f"{r.low:.3f}-{r.high:.3f}", "verdict": r.verdict} for r in rows],
                         ["point_id", "model", "gpus", "batch", "metric", "n", "base", "cand", "ratio",
                          "95% interval", "verdict"]))
        click.echo(f"\n{len(rows)} comparison(s): {len(regressions)} regression(s) beyond {threshold:.0%}")
        n_out = sum(len(v) for v in cmp.excluded.values())
        click.echo(f"{cmp.excluded_text}" if n_out else "excluded 0 runs (none shared a host with another run)")
    if regressions:
        click.get_current_context().exit(1)


@main.command()
@click.argument("campaign", callback=campaign_name)
@db_option
@click.option("--allow-missing", is_flag=True, help="Do not fail on points that have no value to check "
                                                    "(failed, pending or never run) or whose value was measured "
                                                    "on a shared host.")
@json_option
def check(campaign: str, db: Path | None, allow_missing: bool, as_json: bool) -> None:
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
