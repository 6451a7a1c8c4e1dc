"""CLI: the results store itself (``sbench db ...``): a shared store's snapshots (who wrote what, when), its
maintenance, and a whole store copied into another."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from harness.contract.errors import InputError
from harness.contract.paths import DbArg, resolve_db
from harness.db import lake as lakes
from harness.db.copy import copy_store
from harness.db.store import open_store

from .base import DbParam, db_option, echo_json, json_option, main, say, table


@main.group("db")
def db_group() -> None:
    """The results store: a DuckDB file, or a shared store (ducklake:postgres:<conninfo> with --db-data)."""


@db_group.command("snapshots")
@db_option
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Show the newest this many (0: all).")
@json_option
def snapshots(db: DbArg | None, limit: int, as_json: bool) -> None:
    """A shared store's history: each commit (a collect, an import, a submit's record), who made it (user@host),
    the command, and the campaigns it touched. Read any of them again with --at SNAPSHOT on query, report and
    compare.

    Example: sbench db snapshots --db ducklake:postgres:service=sbench
    """
    target = resolve_db(db)
    with open_store(target, read_only=True) as st:
        if not st.lake:
            raise InputError(f"{target} is a DuckDB file, which keeps no history: snapshots are a shared store's "
                             "(--db ducklake:postgres:<conninfo>)")
        rows = lakes.snapshots(st.con, limit or None)
    if as_json:
        echo_json(rows)
        return
    click.echo(table([{**r, "campaigns": ",".join(r["campaigns"]) or "-", "command": r["command"] or "-",
                       "author": r["author"] or "-"} for r in rows],
                     ["snapshot", "time", "author", "command", "campaigns"]))


@db_group.command("maintain")
@db_option
@click.option("--expire-older-than", "days", type=click.FloatRange(min=0), default=None, metavar="DAYS",
              help="Also forget the snapshots older than DAYS (--at can no longer read them) and delete the files "
                   "only they read. Without it no snapshot is lost.")
@json_option
def maintain(db: DbArg | None, days: float | None, as_json: bool) -> None:
    """Compact the store: a shared store's small Parquet files (each collect writes its own) merged into fewer,
    and the files no snapshot reads deleted; a DuckDB file checkpointed. Says the files (or bytes) before and
    after.

    Example: sbench db maintain --db ducklake:postgres:service=sbench --expire-older-than 90
    """
    target = resolve_db(db)
    t0 = time.monotonic()
    with open_store(target) as st:
        if st.lake:
            with st.writers_turn():  # no collect writes while the files are merged
                result = lakes.maintain(st.con, days)
        else:
            if days is not None:
                raise InputError("--expire-older-than: a DuckDB file keeps no snapshots")
            before = os.path.getsize(target) if isinstance(target, Path) else 0
            st.con.execute("CHECKPOINT")
            result = {"bytes_before": before, "bytes_after": os.path.getsize(target) if isinstance(target, Path)
                      else 0}
    result["seconds"] = round(time.monotonic() - t0, 3)
    if as_json:
        echo_json(result)
        return
    if "files_before" in result:
        say(f"{target}: {result['files_before']} data file(s) before, {result['files_after']} after; "
            f"{result['snapshots_expired']} snapshot(s) expired ({result['seconds']} s)")
    else:
        say(f"{target}: {result['bytes_before']:,} bytes before, {result['bytes_after']:,} after "
            f"({result['seconds']} s)")


@db_group.command("copy")
@click.argument("source", type=DbParam())
@db_option
@json_option
def copy(source: DbArg, db: DbArg | None, as_json: bool) -> None:
    """Copy a whole store's history (SOURCE: a DuckDB file, or a shared store) into the --db store, which must
    hold no results yet: the same rows, so the same counts and compare answers. This is how a team moves its
    files into one shared store (copy the first; export and import the others' campaigns).

    Example: sbench db copy results.duckdb --db ducklake:postgres:service=sbench --db-data /shared/sbench-lake
    """
    src_target, dst_target = resolve_db(source), resolve_db(db)
    if isinstance(src_target, Path) and not src_target.is_file():
        raise InputError(f"{src_target}: no results database there")
    with open_store(src_target, read_only=True) as src, open_store(dst_target) as dst:
        report = copy_store(src, dst)
    if as_json:
        echo_json(report.to_dict())
        return
    say(f"copied {sum(report.rows.values()):,} rows ({report.rows.get('runs', 0):,} runs, "
        f"{len(report.campaigns)} campaign(s)) from {src_target} into {dst_target}")
