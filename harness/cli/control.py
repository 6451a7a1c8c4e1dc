"""CLI: status and cancel (what became of a campaign's attempts; stop those still queued or running).

Their own module, apart from submit's: ``sbench status`` starts without the build layer, the plan, Jinja2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from harness.campaign.control import cancel as cancel_attempts
from harness.campaign.control import status as status_report
from harness.contract.paths import DbArg

from .base import (
    campaign_name,
    db_option,
    echo_json,
    json_option,
    main,
    print_repeats,
    say,
    short,
    table,
    workdir_option,
)


@main.command()
@workdir_option
@db_option
@click.option("--campaign", default=None, callback=campaign_name, help="Only this campaign.")
@json_option
def status(workdir: Path | None, db: DbArg | None, campaign: str | None, as_json: bool) -> None:
    """Show every point and attempt: pending, running or done, from the DB and the live scheduler.

    Example: sbench status --campaign demo-cpu
    """
    rep = status_report(workdir, db, campaign)
    if as_json:
        echo_json({"rows": rep.rows, "counts": rep.counts, "note": rep.note,
                   "repeats": {c: [v.to_dict() for v in vs] for c, vs in rep.repeats.items()}})
        return
    rows = [{"campaign": r.get("campaign"), "point_id": r.get("point_id"), "rep": r.get("repeat"),
             "attempt": r.get("last_attempt"), "job_id": r.get("job_id"), "phase": r.get("phase"),
             "state": r.get("live_state") or r.get("state"), "outcome": r.get("outcome"),
             "stability": _stability(r), "startup_s": _num(r.get("startup_s")),
             "outside_train": _pct(r.get("outside_train_fraction")),
             "notes": len(r.get("warnings") or []) or "",
             "reason": short(_overhead_reason(r) or r.get("reason") or "; ".join(r.get("point_reasons") or []))}
            for r in rep.rows]
    if rows:
        click.echo(table(rows, list(rows[0])))
    click.echo("\n" + ", ".join(f"{v} {k}" for k, v in sorted(rep.counts.items())) if rep.counts else "nothing yet")
    notes: dict[str, int] = {}
    for r in rep.rows:
        for w in r.get("warnings") or []:
            notes[w] = notes.get(w, 0) + 1
    for w, n in list(notes.items())[:STATUS_NOTES]:  # each once, with how many runs it concerns
        click.echo(f"note ({n} run(s)): {w}")
    if len(notes) > STATUS_NOTES:
        click.echo(f"... and {len(notes) - STATUS_NOTES} more: sbench query \"select run_id, warnings from runs where "
                   "warnings is not null\"")
    for camp, verdicts in rep.repeats.items():
        print_repeats(camp, [v.to_dict() for v in verdicts])
    if rep.note:
        say(f"note: {rep.note}", err=True)


STATUS_NOTES = 10  # distinct run notes status prints at most


def _num(v: Any) -> str:
    return "" if v is None else f"{v:.1f}"


def _pct(v: Any) -> str:
    return "" if v is None else f"{100 * v:.0f}%"


def _stability(r: dict[str, Any]) -> str:
    """The point's throughput rating across its repeats with the CV, e.g. ``good 1.4%``."""
    cv = r.get("throughput_cv")
    return "" if cv is None else f"{r.get('throughput_stability')} {100 * cv:.1f}%"


def _overhead_reason(r: dict[str, Any]) -> str | None:
    if r.get("prepared_in_job") and r.get("outcome") == "ok":
        return "data prepared in the job (run sbench prepare first)"
    return None


@main.command()
@workdir_option
@db_option
@click.option("--campaign", default=None, callback=campaign_name, help="Only this campaign (default: every campaign).")
def cancel(workdir: Path | None, db: DbArg | None, campaign: str | None) -> None:
    """Cancel every attempt that is still queued or running.

    Example: sbench cancel --campaign lora-scan
    """
    warnings: list[str] = []
    done = cancel_attempts(workdir, db, campaign, warnings=warnings)
    say(f"cancelled {len(done)} attempt(s)" + (": " + " ".join(done) if done else ""))
    for w in warnings:
        say(f"warning: {w}", err=True)
