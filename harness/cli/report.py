"""CLI: the HTML report."""

from __future__ import annotations

from pathlib import Path

import click

from harness.contract.paths import DbArg, resolve_db
from harness.report.page import build_report

from .base import FiniteFloat, at_option, campaign_ref, db_option, main


@main.command()
@db_option
@click.option("--campaign", default=None, callback=campaign_ref,
              help="The campaign to show (default: the latest by creation time; the page lists the others).")
@click.option("--all-campaigns", is_flag=True,
              help="Every campaign on one page, a line per campaign (not with --campaign).")
@click.option("--run", "run_id", default=None, metavar="RUN_ID",
              help="Run for the utilisation-over-time panels (default: the longest ok run); without --campaign, "
                   "the page shows this run's campaign.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="HTML file to write ('-' for stdout).")
@click.option("--compare", "compare_to", nargs=2, default=None, metavar="BASE CAND",
              help="Add a compare section: BASE and CAND as for sbench compare.")
@click.option("--threshold", type=FiniteFloat(), default=0.10, show_default=True,
              help="The compare section's regression threshold (fraction).")
@at_option
def report(db: DbArg | None, campaign: str | None, all_campaigns: bool, run_id: str | None, out: Path,
           compare_to: tuple[str, str] | None, threshold: float, at: str | None) -> None:
    """Write one self-contained HTML page of plots and tables from the results database: one campaign's,
    the latest unless --campaign names another (or --all-campaigns).

    Example: sbench report --campaign lora-scan -o report.html
    """
    rep = build_report(resolve_db(db), campaign=campaign, run_id=run_id, compare_to=compare_to or None,
                       threshold=threshold, all_campaigns=all_campaigns, at=at)
    if str(out) == "-":
        click.echo(rep.html)
        return
    try:
        out.write_text(rep.html, encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(f"wrote {out}: {rep.summary()}")
