"""CLI: submit, status, cancel and retry."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, NoReturn

import click

from harness.campaign.decisions import SubmitReport
from harness.campaign.submit import SubmitRequest, more_repeats, retry_campaign, submit_sweep
from harness.campaign.wait import (
    NOT_NEEDED,
    NOT_NEEDED_WHY,
    STUCK,
    WaitSummary,
    in_flight,
    judge_campaign,
    refs,
    still_queued,
    wait_for,
)
from harness.contract.errors import Interrupted
from harness.contract.paths import DbArg
from harness.slurm.client import Slurm

from .base import (
    Progress,
    campaign_name,
    db_option,
    echo_json,
    inventory_option,
    json_option,
    main,
    model_map_option,
    prediction_line,
    print_repeats,
    say,
    short,
    sweep_argument,
    table,
    workdir_option,
)


def executor_option(f: Any) -> Any:
    return click.option("--executor", type=click.Choice(["auto", "slurm", "local"]), default="auto", show_default=True,
                        help="auto = slurm when sbatch is on PATH, else local.")(f)


@main.command()
@sweep_argument
@inventory_option
@executor_option
@workdir_option
@db_option
@model_map_option
@click.option("--wait", is_flag=True, help="Print the attempts, wait until every attempt of the campaign still queued "
              "or running has finished (an earlier command's too), then print how many ended ok, invalid and failed; "
              "exit 1 unless every run of the campaign ended ok or invalid. Ctrl-C stops the waiting, not the "
              "attempts.")
@click.option("--force", is_flag=True, help="Run points again even when already measured.")
@click.option("--retry-failed", is_flag=True, help="Resubmit points whose last attempt failed, as new attempts.")
@click.option("--max-parallel", type=click.IntRange(min=1), default=None,
              help="At most this many attempts of one array run at once (SLURM %-limit; local queue width).")
@click.option("--hold", is_flag=True, help="Submit held (sbatch --hold); release with scontrol release.")
@click.option("--preflight", is_flag=True, help="First run sbench fabric for each partition and node count of the "
              "multi-node points, and sbench preflight on each partition's devices; refuse to submit when the "
              "fabric fails, RoCE points would run over Socket, or a device is slow.")
@click.option("--exclude-slow", is_flag=True, help="With --preflight: leave the hosts of slow devices out (sbatch "
              "--exclude) instead of refusing.")
@click.option("--prepare-on", "prepare_on", type=click.Choice(["here", "slurm"]), default="here", show_default=True,
              help="Where the points' datasets, models and training data are prepared before they run: here (this "
              "machine, before submitting) or slurm (one CPU job the arrays depend on).")
@click.option("--no-prepare", is_flag=True, help="Submit without preparing (each job prepares what it lacks).")
@click.option("--skip-predicted-oom", is_flag=True, help="Do not submit points that sbench plan --memory predicts "
              "will not fit in one device's memory.")
@click.option("--campaign", default=None, callback=campaign_name,
              help="Submit as this campaign instead of the sweep's campaign: (one sweep, a campaign per night).")
@click.option("--reuse-measured", is_flag=True, help="Do not measure a point again that another campaign measured: "
              "take its run (named in the reason). Also the sweep's 'reuse: measured'.")
@click.option("--profile", is_flag=True, help="Profile the last repeat of each point (a second repeat when the sweep "
              "has one) with torch.profiler: the sweep's runner.profile, else steps 3-5 of rank 0. A profiled run is "
              "left out of compare, check and the repeats' CV.")
@json_option
def submit(sweep: Path, inventory: Path | None, executor: str, workdir: Path | None, db: DbArg | None,
           model_map: Path | None, wait: bool, force: bool, retry_failed: bool, max_parallel: int | None,
           hold: bool, preflight: bool, exclude_slow: bool, prepare_on: str, no_prepare: bool, skip_predicted_oom: bool,
           campaign: str | None, reuse_measured: bool, profile: bool, as_json: bool) -> None:
    """Submit a sweep: one job array per resource shape on SLURM, or a local queue.

    A campaign measures every valid point it has not measured or queued itself; --reuse-measured takes
    the runs other campaigns measured instead.

    Example: sbench submit sweeps/demo-cpu.yaml --executor local --wait
    """
    if exclude_slow and not preflight:
        raise click.UsageError("--exclude-slow leaves out the hosts that --preflight finds slow: add --preflight")
    try:
        report = submit_sweep(SubmitRequest(
            sweep, inventory, executor, workdir, db, model_map=model_map, campaign=campaign, force=force,
            retry_failed=retry_failed, max_parallel=max_parallel, hold=hold, preflight=preflight,
            exclude_slow=exclude_slow, prepare="no" if no_prepare else prepare_on,
            skip_predicted_oom=skip_predicted_oom, reuse_measured=reuse_measured, profile=profile),
            echo=_stderr_echo(as_json))
    except Interrupted as exc:
        _interrupted(exc, as_json, workdir, db)
    _finish(report, "submit", wait, as_json, workdir, db)


def _interrupted(exc: Interrupted, as_json: bool, workdir: Path | None, db: DbArg | None) -> NoReturn:
    """A signal that came while submit held the campaign lock took effect once the submission was complete:
    show what was submitted, and how to stop it."""
    rep = exc.result
    if isinstance(rep, SubmitReport):
        _print_submit(rep.to_dict(), as_json)
        if rep.submitted:
            exc.note = still_queued(rep.campaign, refs(rep.submitted, rep.executor), workdir, db, Slurm())
    raise exc


def _finish(report: SubmitReport, command: str, wait: bool, as_json: bool, workdir: Path | None,
            db: DbArg | None) -> None:
    """Print the submission; with --wait, print it first, then wait for every attempt of the campaign still queued
    or running (this command's, and those an earlier one left in flight), then for the repeats that come due, then
    print the outcomes: exit 1 unless every run of the campaign ended ok or invalid."""
    d = report.to_dict()
    if not wait:
        _print_submit(d, as_json)
        _fail_if_unfed(d)
        return
    slurm = Slurm()
    others = in_flight(report.campaign, workdir, slurm, {s.spec.job_dir for s in report.submitted})
    if not as_json:
        _print_submit(d, False)
        resumed = f", and {len(others)} an earlier command left queued or running" if others else ""
        click.echo(f"\nwaiting for {len(report.submitted)} attempt(s) submitted now{resumed}; Ctrl-C stops the "
                   "waiting, not the attempts", err=True)
    progress = Progress(command, {"wait": "attempts finished"}, quiet=as_json)
    more: list[SubmitReport] = []
    nxt: SubmitReport | None = None
    try:
        summary = wait_for(report.campaign, report.executor, report.submitted, workdir, db,
                           progress=lambda done, total: progress("wait", done, total), slurm=slurm, others=others)
        # repeats: {min, max, cv}: once what it waited for has ended, the next repeat of each point still above
        # its CV target goes out and is waited for too, until every point is precise or at max repeats.
        while (nxt := more_repeats(report.campaign, workdir, db)) is not None and nxt.submitted:
            more.append(nxt)
            progress.close()
            progress = Progress(command, {"wait": "repeats finished"}, quiet=as_json)
            if not as_json and nxt.search:
                click.echo(f"\nsearch: {len(nxt.submitted)} more run(s) submitted ("
                           f"{', '.join(f'{s.spec.point_id} r{s.spec.repeat}' for s in nxt.submitted)}); waiting for "
                           "them", err=True)
            elif not as_json:
                click.echo(f"\nrepeats: {len(nxt.submitted)} more repeat(s) of point(s) above the CV target "
                           f"submitted ({', '.join(f'{s.spec.point_id} r{s.spec.repeat}' for s in nxt.submitted)});"
                           " waiting for them", err=True)
            summary.add(wait_for(report.campaign, nxt.executor, nxt.submitted, workdir, db,
                                 progress=functools.partial(progress, "wait"), slurm=slurm))
        judge_campaign(summary, report.campaign, workdir, db, slurm)
    finally:
        progress.close()
    if as_json:
        echo_json({**d, "summary": summary.to_dict(), "more_repeats": [m.to_dict() for m in more]})
    else:
        _print_summary(summary)
    if more and nxt is not None and not as_json:  # where the repeats stand now
        print_repeats(report.campaign, [v.to_dict() for v in nxt.repeats])
    if not summary.all_fine:
        raise click.exceptions.Exit(1)


def _fail_if_unfed(d: dict[str, Any]) -> None:
    """Exit 1 when the submission left attempts held back (or a search to go on) with no feeder job: nothing
    will run them unless the user acts, so the command did not do what was asked."""
    fed = d.get("feed") or {}
    if not fed.get("stopped"):
        return
    what = f"{fed['held']} held attempt(s)" if fed.get("held") else "the search"
    say(f"error: nothing will submit {what} of campaign {d['campaign']}: {fed['stopped']}; when the queue has "
        f"room, sbench retry {d['campaign']} runs them", err=True)
    raise click.exceptions.Exit(1)


def _print_summary(summary: WaitSummary) -> None:
    c = summary.counts
    unknown = f", {c['unknown']} not known" if c["unknown"] else ""
    skipped = f", {c[NOT_NEEDED]} {NOT_NEEDED} ({NOT_NEEDED_WHY})" if c.get(NOT_NEEDED) else ""
    stuck = f", {c[STUCK]} {STUCK} in SLURM's queue (pending for ever)" if c.get(STUCK) else ""
    click.echo(f"\n{len(summary.runs)} attempt(s) ended: {c['ok']} ok, {c['invalid']} invalid, {c['failed']} failed"
               f"{unknown}{skipped}{stuck}")
    for r in summary.runs:
        if r["outcome"] in ("failed", "unknown", STUCK):
            said = r.get("reason") or r.get("state") or "no outcome recorded"  # a stuck job's reason is its fix
            click.echo(f"  {r['outcome']:<7}  {r['point_id']} r{r['repeat']} a{r['attempt']}: "
                       f"{said if r['outcome'] == STUCK else short(said, 100)}")
    camp = summary.campaign
    if camp is not None:
        click.echo(camp.text())
        waited = {r["run_id"] for r in summary.runs}
        for r in [*camp.failed, *camp.open]:
            if r.get("run_id") not in waited:  # an earlier attempt's failure, or one still not over
                state = "failed" if r in camp.failed else "open"
                click.echo(f"  {state:<7}  {r.get('point_id')} r{r.get('repeat')} a{r.get('attempt')}: "
                           f"{short(r.get('reason') or r.get('state') or 'no outcome recorded', 100)}")
    if summary.note:
        click.echo(f"note: {summary.note}", err=True)


def _stderr_echo(quiet: bool) -> Any:
    return (lambda line: None) if quiet else (lambda line: say(line, err=True))


def _print_submit(d: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(d)
        return
    rows = [{"point_id": r["point_id"], "rep": r["repeat"], "action": r["action"], "attempt": r["attempt"],
             "job_id": r["job_id"], "reason": r["reason"]} for r in d["points"]]
    click.echo(table(rows, ["point_id", "rep", "action", "attempt", "job_id", "reason"]))
    extra = f", {d['sbatch_calls']} sbatch call(s)" if d["executor"] == "slurm" else ""
    click.echo(f"\ncampaign {d['campaign']}: {d['submitted']} attempt(s) submitted with the {d['executor']} "
               f"executor{extra}; job dirs under {d['campaign_dir']}")
    fed = d.get("feed") or {}
    if fed.get("held"):
        now = f"{d['submitted'] - d.get('held_back', 0)} in SLURM's queue now, " if d.get("held_back") else ""
        how = (f"feeder job {fed['feeder_job']} submits them in waves as the quota allows; sbench status shows "
               "them, sbench cancel stops the feeding" if fed.get("feeder_job") else
               f"nothing feeds them ({fed.get('stopped')}); sbench retry {d['campaign']} runs them as new attempts")
        click.echo(f"{now}{fed['held']} held back by sbench to fit the cluster's limits ({fed.get('limits')}); {how}")
    reused = [r["reused_from"] for r in d["points"] if r.get("reused_from")]
    if reused:
        sources = sorted({r["campaign"] for r in reused})
        click.echo(f"reused {len(reused)} measured run(s) of campaign(s) {', '.join(sources)} instead of measuring "
                   "them again (each named in its reason; --force measures them in this campaign)")
    print_repeats(d["campaign"], d.get("repeats") or [])
    line = prediction_line(d.get("prediction") or {})
    if line:
        click.echo(line)
    search = d.get("search") or {}
    if search:
        state = ("over: sbench best " + d["campaign"] + " answers" if search.get("done") else
                 "goes on as runs end (submit --wait, collect, or on SLURM the feeder job"
                 + (f" {fed['feeder_job']}" if fed.get("feeder_job") else "") + ")")
        stuck = f"; failed runs wait for sbench retry: {', '.join(search['stuck'])}" if search.get("stuck") else ""
        click.echo(f"search: {len(search.get('todo') or [])} run(s) asked for now; the search {state}{stuck}")
    if d.get("db_note"):
        say(f"note: {d['db_note']}", err=True)
    for w in d.get("warnings") or []:
        say(f"warning: {w}", err=True)
    if d.get("prepare"):
        ready = sum(1 for i in d["prepare"] if i["status"] == "ready")
        click.echo(f"prepared: {len(d['prepare'])} item(s), {ready} already ready", err=True)
    for f in d.get("preflight") or []:
        click.echo(f"preflight: fabric {f['fabric_id']} on {f['partition']} x{f['nodes']} ok "
                   f"({', '.join(f'{h}={t or chr(45)}' for h, t in f['transports'].items())})", err=True)
    for dev in d.get("devices") or []:
        click.echo(f"preflight: {dev['summary']}", err=True)
    if d.get("excluded_slow"):
        say(f"excluded: {', '.join(d['excluded_slow'])} (a slow device; sbatch --exclude)", err=True)


@main.command()
@click.argument("campaign", callback=campaign_name)
@workdir_option
@db_option
@executor_option
@click.option("--wait", is_flag=True, help="As submit --wait: print the attempts, wait for every attempt of the "
              "campaign in flight, print the outcomes; exit 1 unless every run of the campaign ended ok or invalid.")
@click.option("--max-parallel", type=click.IntRange(min=1), default=None)
@json_option
def retry(campaign: str, workdir: Path | None, db: DbArg | None, executor: str, wait: bool, max_parallel: int | None,
          as_json: bool) -> None:
    """Resubmit the failed points of a campaign (and those its local queue never started) as new attempts; ok
    and invalid ones stay as they are.

    Example: sbench retry lora-scan
    """
    try:
        report = retry_campaign(campaign, workdir, db, executor=executor, max_parallel=max_parallel)
    except Interrupted as exc:
        _interrupted(exc, as_json, workdir, db)
    _finish(report, "retry", wait, as_json, workdir, db)
