"""CLI: sbench prepare. A module of its own, so that a re-check of prepared data loads neither the database
nor the executors (``submit`` and ``status`` do)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from harness.campaign.prepare import prepare_sweep, record_prepare_job, submit_prepare_job
from harness.contract.errors import RunnerError
from harness.contract.paths import CampaignPaths, resolve_workdir
from harness.spec.inventory import load_inventory
from harness.spec.sweep import load_sweep

from .base import echo_json, inventory_option, json_option, main, model_map_option, sweep_argument, workdir_option


def _stderr_echo(quiet: bool) -> Any:
    return (lambda line: None) if quiet else (lambda line: click.echo(line, err=True))


def _same_inputs(inventory: Path | None, model_map: Path | None) -> list[str]:
    """The options that name the inventory and the model map this command was given, for a command it advises."""
    return [*(["-i", str(inventory)] if inventory is not None else []),
            *(["--model-map", str(model_map)] if model_map is not None else [])]


@main.command()
@sweep_argument
@inventory_option
@model_map_option
@workdir_option
@click.option("--on", "on", type=click.Choice(["here", "slurm"]), default="here", show_default=True,
              help="here: on this machine; slurm: as one CPU job of the sweep's partition (sbench submit then "
              "makes the arrays wait for it).")
@json_option
def prepare(sweep: Path, inventory: Path | None, model_map: Path | None, workdir: Path | None, on: str,
            as_json: bool) -> None:
    """Make a sweep's datasets, models, training data and token counts ready, once, for every job.

    Exits 1 when something a valid point needs could not be made usable here (a model this machine does
    not see), saying what and how to prepare it on a compute node instead.

    Example: sbench prepare sweeps/demo-cpu.yaml
    """
    if on == "here":
        rep = prepare_sweep(sweep, inventory, model_map, echo=_stderr_echo(as_json))
        if as_json:
            echo_json(rep.to_dict())
        elif rep.nothing:
            click.echo(f"nothing to prepare: {rep.nothing}")
        else:
            counts: dict[str, int] = {}
            for i in rep.items:
                counts[i.status] = counts.get(i.status, 0) + 1
            total = sum(i.seconds for i in rep.items)
            click.echo(f"prepared {len(rep.items)} item(s) in {total:.1f} s: "
                       + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        problem = rep.problem()
        if problem:
            again = ["sbench", "prepare", str(sweep), *_same_inputs(inventory, model_map), "--on", "slurm"]
            raise RunnerError(f"{problem}; prepare on a compute node instead: {shlex.join(again)}")
        return

    inv = load_inventory(inventory)
    sw = load_sweep(sweep, model_map)
    campaign_dir = resolve_workdir(workdir) / sw.campaign
    job_id = submit_prepare_job(sw, inv, sweep, inventory, model_map, campaign_dir)
    record_prepare_job(campaign_dir, job_id)
    # The submit line that finds this job: the same sweep, inventory, model map and work dir.
    line = ["sbench", "submit", str(sweep), *_same_inputs(inventory, model_map),
            *(["--workdir", str(workdir)] if workdir is not None else [])]
    if as_json:
        echo_json({"job_id": job_id, "campaign_dir": str(campaign_dir), "submit": shlex.join(line)})
        return
    click.echo(f"prepare job {job_id} submitted; {shlex.join(line)} makes the job arrays wait for it (afterok). "
               f"Log: {CampaignPaths(campaign_dir).prepare_log(job_id)}")
