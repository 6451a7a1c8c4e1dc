"""CLI: collect (job directories and the scheduler's accounting into the results database).

Its own module, apart from the readers': ``sbench query``, ``compare`` and ``check`` start without the
collect layer; and a collect that has no next runs to send starts and ends without the submit path."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from harness.campaign import nextruns
from harness.campaign.decisions import SubmitReport
from harness.collect import collect as run_collect
from harness.contract.errors import InputError
from harness.contract.lazy import lazy_module
from harness.contract.paths import CampaignPaths, DbArg, resolve_db, resolve_workdir

if TYPE_CHECKING:
    from harness.campaign import submit
else:  # the submit path loads only when a campaign's next runs are due (harness.contract.lazy)
    submit = lazy_module("harness.campaign.submit")

from .base import Progress, campaign_name, db_option, echo_json, json_option, main, print_repeats, say, workdir_option

COLLECT_PHASES = {"discover": "finding runs", "parse": "reading job dirs", "samples": "loading samples"}


@main.command()
@db_option
@workdir_option
@click.option("--campaign", default=None, callback=campaign_name, help="Only this campaign's runs.")
@click.option("--no-more-repeats", is_flag=True, help="Only collect: do not submit the next repeats of points whose "
              "campaign says repeats: {min, max, cv} and whose CV is still above it.")
@json_option
def collect(db: DbArg | None, workdir: Path | None, campaign: str | None, no_more_repeats: bool,
            as_json: bool) -> None:
    """Read job directories and SLURM accounting into the results database.

    A campaign whose sweep says repeats: {min, max, cv} then gets the next repeat of each point whose
    throughput CV is still above cv (up to max repeats), unless --no-more-repeats.

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
    more = [] if no_more_repeats else _more_repeats(wd, db, campaign)
    if as_json:
        echo_json({**report.to_dict(), "more_repeats": [m.to_dict() for m in more]})
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
    for m in more:
        print_repeats(m.campaign, [v.to_dict() for v in m.repeats], len(m.submitted))


def _more_repeats(wd: Path, db: DbArg | None, campaign: str | None) -> list[SubmitReport]:
    """The next repeats of the adaptive campaigns' points that need them (``harness.campaign.repeats``)."""
    names = [campaign] if campaign else [c.name for c in CampaignPaths.listed(wd, submitted=True)]
    out = []
    for name in names:
        rep = nextruns.settled(name, wd, db)
        if rep is nextruns.DUE:
            rep = submit.send_due(name, wd, db)
        if rep is not None:
            out.append(rep)
    return out
