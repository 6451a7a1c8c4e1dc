"""The ``sbench`` command line. Each command parses, calls one library function, and prints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import SbenchError


class SbenchGroup(click.Group):
    """Turns domain errors into one clean line and the documented exit code (2 input, 1 runtime)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SbenchError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug, not the user's mistake: one line, unless asked
            if os.environ.get("SBENCH_DEBUG"):
                raise
            click.echo(f"Error: internal error: {type(exc).__name__}: {exc} (this is a bug in sbench; "
                       "SBENCH_DEBUG=1 shows the traceback)", err=True)
            ctx.exit(1)


def campaign_name(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """Click callback: a campaign name is an identifier (never a path such as ../x)."""
    from .schema import is_name

    if value is not None and not is_name(value):
        shown = repr(value) if len(value) <= 80 else repr(value[:77] + "...")
        raise click.BadParameter(f"{shown} is not a campaign name (letters, digits, '.', '_', '-'; at most 100)")
    return value


def inventory_option(f: Any) -> Any:
    return click.option("-i", "--inventory", "inventory", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, envvar="SBENCH_INVENTORY", show_envvar=True,
                        help="Inventory YAML (default: the built-in local inventory).")(f)


def json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def model_map_option(f: Any) -> Any:
    return click.option("--model-map", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                        envvar="SBENCH_MODEL_MAP", help="YAML of model name -> HF id or local path.")(f)


def db_option(f: Any) -> Any:
    return click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        envvar="SBENCH_DB", help="DuckDB file (default: results/results.duckdb).")(f)


def workdir_option(f: Any) -> Any:
    return click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        envvar="SBENCH_WORKDIR", help="Where job directories live (default: results/runs).")(f)


def sweep_argument(f: Any) -> Any:
    return click.argument("sweep", type=click.Path(exists=True, dir_okay=False, path_type=Path))(f)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


class Progress:
    """Progress of a long command, by phase: a bar per phase on a terminal, one plain line per phase
    (and per change of count) otherwise, nothing when quiet. Call it as ``progress(phase, done, total)``."""

    def __init__(self, prefix: str, labels: dict[str, str] | None = None, quiet: bool = False) -> None:
        self.prefix, self.labels, self.quiet = prefix, labels or {}, quiet
        self.tty = sys.stderr.isatty()
        self.phase: str | None = None
        self.bar: Any = None
        self.done = 0

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.quiet:
            return
        label = f"{self.prefix}: {self.labels.get(phase, phase)}"
        if phase != self.phase:
            self.close()
            self.phase, self.done = phase, 0
            if self.tty:
                self.bar = click.progressbar(length=max(total, 1), label=label, file=sys.stderr, show_pos=True)
                self.bar.__enter__()
            else:
                click.echo(label + (f" ({total})" if total > 1 else ""), err=True)
        if self.bar is not None:
            if done > self.done:
                self.bar.update(done - self.done)
        elif done != self.done and total > 1 and not self.tty:
            click.echo(f"{label}: {done}/{total}", err=True)
        self.done = max(self.done, done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain aligned text table."""
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


@click.group(cls=SbenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sbench")
def main() -> None:
    """sbench: benchmark LLM fine-tuning on SLURM or bare metal, then analyse it with SQL.

    Example: sbench plan sweeps/demo-cpu.yaml
    """


# -- inventory ---------------------------------------------------------------------------------------------
@main.group()
def inventory() -> None:
    """Inspect the cluster description.

    Example: sbench inventory check -i inventory/example-roce.yaml
    """


@inventory.command("check")
@inventory_option
@json_option
def inventory_check(inventory: Path | None, as_json: bool) -> None:
    """Validate an inventory and print partitions, hosts, GPUs and RoCE settings.

    Example: sbench inventory check -i inventory/example-roce.yaml --json
    """
    from .inventory import describe, load_inventory

    inv = load_inventory(inventory)
    desc = describe(inv)
    if as_json:
        echo_json(desc)
        return
    click.echo(f"cluster {inv.cluster}  ({inv.source})")
    for name, p in desc["partitions"].items():
        kind = "CPU partition: workers" if p["cpu_partition"] else f"GPUs {p['gpu_model']}"
        click.echo(f"\npartition {name} (slurm: {p['slurm_partition']}): {kind} x{p['gpus_per_node']} per node, "
                   f"{p['cpus_per_node']} CPUs, {p['memory_gb']:g} GB")
        rows = []
        for h, hv in p["hosts"].items():
            roce = hv["roce"]
            rows.append({"host": h, "address": hv["address"],
                         "roce_hcas": " ".join(roce["hcas"]) if roce else "-",
                         "NCCL_IB_HCA": roce["nccl_ib_hca"] if roce else "-",
                         "gid_index": roce["gid_index"] if roce else "-",
                         "socket_ifname": (roce or {}).get("socket_ifname") or "-",
                         "topo_file": hv["nccl_topo_file"] or "-"})
        click.echo(table(rows, list(rows[0])))
    for w in desc["warnings"]:
        click.echo(f"warning: {w}", err=True)


# -- experiments -------------------------------------------------------------------------------------------
@main.group()
def experiments() -> None:
    """The experiment catalog.

    Example: sbench experiments show finetune_lora_benchmark-v1.0.0
    """


@experiments.command("list")
@json_option
def experiments_list(as_json: bool) -> None:
    """List the experiments sbench can run.

    Example: sbench experiments list
    """
    from .catalog import EXPERIMENTS

    rows = [{"id": e.id, "method": e.method, "summary": e.summary} for e in EXPERIMENTS.values()]
    if as_json:
        echo_json(rows)
    else:
        click.echo(table(rows, ["id", "method", "summary"]))


@experiments.command("show")
@click.argument("experiment_id")
@json_option
def experiments_show(experiment_id: str, as_json: bool) -> None:
    """Show an experiment's entity space, defaults, domains and hardcoded values.

    Example: sbench experiments show finetune_full_benchmark-v1.0.0 --json
    """
    from .catalog import get_experiment

    exp = get_experiment(experiment_id)
    d = exp.to_dict()
    if as_json:
        echo_json(d)
        return
    click.echo(f"{exp.id}  ({exp.method})\n{exp.summary}\n")
    rows = [{"field": f["name"], "type": f["type"], "required": "yes" if f["required"] else "",
             "default": f["default"], "domain": _short_domain(f["domain"])} for f in d["required"] + d["optional"]]
    click.echo(table(rows, ["field", "type", "required", "default", "domain"]))
    click.echo("\nhardcoded: " + ", ".join(f"{k}={v}" for k, v in d["hardcoded"].items()))
    click.echo("measured: " + ", ".join(d["measured_properties"]))
    if d["target_modules"]:
        click.echo("\nLoRA target_modules:")
        for m, t in d["target_modules"].items():
            click.echo(f"  {m}: {' '.join(t)}")


def _short_domain(domain: list[Any] | None) -> str:
    if not domain:
        return ""
    text = ", ".join(str(x) for x in domain)
    return text if len(text) <= 60 else text[:57] + "..."


# -- plan / render -----------------------------------------------------------------------------------------
def _plan(sweep_path: Path, inventory_path: Path | None, model_map: Path | None):  # type: ignore[no-untyped-def]
    from .inventory import load_inventory
    from .plan import load_sweep, plan_sweep

    inv = load_inventory(inventory_path)
    sweep = load_sweep(sweep_path, model_map)
    return inv, sweep, plan_sweep(sweep, inv)


@main.command()
@sweep_argument
@inventory_option
@model_map_option
@json_option
def plan(sweep: Path, inventory: Path | None, model_map: Path | None, as_json: bool) -> None:
    """Expand a sweep into points and say which are valid and why not.

    Example: sbench plan sweeps/demo-cpu.yaml --json
    """
    inv, sw, points = _plan(sweep, inventory, model_map)
    if as_json:
        echo_json([p.to_dict() for p in points])
        return
    varying = list(sw.grid)
    rows = []
    for p in points:
        row: dict[str, Any] = {"point_id": p.point_id, "rep": p.repeat, "valid": "yes" if p.valid else "NO"}
        for k in varying:
            row[k] = p.entity.get(k)
        row["reasons"] = "; ".join(p.reasons)
        rows.append(row)
    click.echo(f"campaign {sw.campaign}: {sw.experiment.id} on partition {points[0].partition if points else '-'}")
    click.echo(table(rows, ["point_id", "rep", "valid", *varying, "reasons"]))
    n_valid = sum(p.valid for p in points)
    click.echo(f"\n{len(points)} run(s): {n_valid} valid, {len(points) - n_valid} invalid")
    notes = sorted({n for p in points for n in p.notes})
    for n in notes:
        click.echo(f"note: {n}")
    for w in inv.warnings:
        click.echo(f"warning: {w}", err=True)


@main.command()
@sweep_argument
@inventory_option
@model_map_option
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory to write one job directory per valid point into.")
def render(sweep: Path, inventory: Path | None, model_map: Path | None, out_dir: Path) -> None:
    """Dry run: write the exact sbatch scripts, launch scripts and configs submit would use.

    Example: sbench render sweeps/demo-cpu.yaml -o /tmp/preview
    """
    from .render import ClusterFit, cluster_fit, render_points

    inv, sw, points = _plan(sweep, inventory, model_map)
    fit = cluster_fit(inv, [p for p in points if p.valid]) if inventory is not None else ClusterFit()
    specs = render_points(sw, inv, points, out_dir, fit=fit)
    for note in fit.check(specs, inv):
        click.echo(f"warning: {note}", err=True)
    for s in specs:
        click.echo(s.job_dir)
    invalid = [p for p in points if not p.valid]
    for p in invalid:
        click.echo(f"skipped invalid point {p.point_id} r{p.repeat}: {'; '.join(p.reasons)}", err=True)
    click.echo(f"rendered {len(specs)} job director{'y' if len(specs) == 1 else 'ies'} under {out_dir}"
               + (f"; {len(invalid)} invalid point(s) not rendered" if invalid else ""), err=True)



# Command groups that live in their own modules register themselves on ``main``.
from . import cli_cluster, cli_data, cli_jobs, cli_report, cli_results  # noqa: E402,F401

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
