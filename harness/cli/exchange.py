"""CLI: export and import (campaigns beyond one results database)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.contract.errors import InputError
from harness.contract.paths import DbArg, resolve_db
from harness.exchange.adocsv import REPORTED, import_ado_csv
from harness.exchange.export import export_campaigns
from harness.exchange.importer import import_export

from .base import campaign_ref, db_option, echo_json, json_option, main, say, table

SKIPPED_SHOWN = 20  # rows of a published file that did not parse, printed (--json lists them all)


@main.command()
@click.argument("campaigns", nargs=-1, required=True, callback=campaign_ref)
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True,
              help="A new (or empty) directory for the Parquet files and provenance.json.")
@db_option
@click.option("--cluster", default=None, help="The cluster the campaigns ran on, where the database recorded none "
              "(campaigns recorded before sbench recorded it; `sbench collect` records it from the manifest).")
@json_option
def export(campaigns: tuple[str, ...], out: Path, db: DbArg | None, cluster: str | None, as_json: bool) -> None:
    """Export campaigns as Parquet files and a provenance.json, for another results database.

    Every table's rows of the campaigns (runs, measurements, stages, samples, environment, checks, fabric and
    probes of their partitions), the same bytes for the same campaigns, and a provenance.json with sbench's
    version and schema, the cluster and its partitions (never an env value), the sweep, the time span and the
    sha256 of every file. `sbench import DIR` reads it.

    Example: sbench export nightly-1122 nightly-1123 -o exports/nightly
    """
    report = export_campaigns(resolve_db(db), campaigns, out, cluster)
    if as_json:
        echo_json(report.to_dict())
        return
    rows = sum(t["rows"] for t in report.tables.values())
    say(f"exported {len(report.campaigns)} campaign(s) of cluster {report.namespace} to {report.out}: "
        f"{len(report.tables)} tables, {rows} rows ({', '.join(c['campaign'] for c in report.campaigns)})")
    say(f"import it elsewhere: sbench import {report.out}  (campaigns become {report.namespace}/NAME)")


@main.command("import")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@db_option
@click.option("--format", "fmt", type=click.Choice(["export", "ado-csv"]), default="export", show_default=True,
              help="export: a directory sbench export wrote; ado-csv: a CSV of the reference's published "
                   "measurements (ibm-research/LLMFineTuningBench), imported as --campaign.")
@click.option("--campaign", default=None, help="--format ado-csv: the name of the campaign the measurements become.")
@click.option("--as", "namespace", default=None, metavar="NAME",
              help="The namespace of an export's campaigns (default: the cluster that measured them).")
@click.option("--cluster", default=None, help="--format ado-csv: a cluster name to record for the measurements.")
@click.option("--replace", is_flag=True, help="Take this export's (or file's) rows instead of those of the same "
                                              "campaign imported before from other rows.")
@json_option
def import_(source: Path, db: DbArg | None, fmt: str, campaign: str | None, namespace: str | None,
            cluster: str | None, replace: bool, as_json: bool) -> None:
    """Import another database's export, or published measurements, into the results database.

    An export's campaigns keep their names and run ids under their cluster's: clusterA/nightly-1123. Every file's
    sha256 and the schema are checked first; a file that fails is named and nothing is written. The same export
    twice changes nothing. Imported campaigns are read by query, report, compare and check like any other;
    status, retry and cancel never act on them.

    Example: sbench import exports/nightly; sbench import --format ado-csv bench.csv --campaign ado-published
    """
    dbp = resolve_db(db)
    if fmt == "ado-csv":
        if campaign is None:
            raise InputError("--format ado-csv needs --campaign NAME: the campaign its measurements become")
        if namespace is not None:
            raise InputError("--as names the namespace of an export's campaigns; with --format ado-csv, --campaign "
                             "names the campaign")
        rep = import_ado_csv(dbp, source, campaign, cluster, replace)
        if as_json:
            echo_json(rep.to_dict())
            return
        if rep.status == "unchanged":
            say(f"{rep.campaign}: unchanged ({source} was imported already; nothing written)")
        else:
            say(f"{rep.status} {rep.imported} of {rep.rows} row(s) of {source} as campaign {rep.campaign} "
                f"({rep.points} point(s), one measurement a row) into {dbp}")
        if rep.skipped_count:
            say(f"skipped {rep.skipped_count} row(s) that do not parse or do not pass sbench's checks (nothing "
                "guessed):", err=True)
            for b in rep.skipped[:SKIPPED_SHOWN]:
                say(f"  line {b['line']}: {b['reason']}", err=True)
            if rep.skipped_count > SKIPPED_SHOWN:
                say(f"  ... and {rep.skipped_count - SKIPPED_SHOWN} more (--json lists the first {REPORTED})",
                    err=True)
        if rep.checks:
            say(f"checked again: {rep.checks} check(s) of campaigns whose references come from {rep.campaign}")
        return
    if campaign is not None or cluster is not None:
        raise InputError("--campaign and --cluster belong to --format ado-csv; an export's campaigns keep their names "
                         "(--as NAME puts them under another namespace)")
    report = import_export(dbp, source, namespace, replace)
    if as_json:
        echo_json(report.to_dict())
        return
    click.echo(table([{"campaign": c, "status": s} for c, s in report.campaigns.items()], ["campaign", "status"]))
    written = sum(report.rows.values())
    if written:
        say(f"\nimported {written} rows into {dbp} (namespace {report.namespace})")
    else:
        say(f"\nnothing written: every campaign of {source} is in {dbp} already, from the same rows")
    if report.checks:
        say(f"checked again: {report.checks} check(s) of campaigns whose references come from an imported one")
