"""``sbench env``: trainer environments (one per fms-hf-tuning release, harness.trainerenv)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from harness.data.trainerenv import build, parse_spec, read_pins
from harness.spec.envs import envs_root, list_envs
from harness.spec.inventory import load_inventory

from .base import echo_json, inventory_option, json_option, main


@main.group("env")
def env_group() -> None:
    """Trainer environments: fms-hf-tuning releases, each in its own virtual environment."""


def _root(inventory: Path | None, root: Path | None) -> Path:
    if root is not None:
        return root.resolve()

    return envs_root(load_inventory(inventory))


@env_group.command("build")
@click.argument("spec", metavar="fms-hf-tuning==VERSION")
@click.option("--extras", "extras", default=None, metavar="fms-accel",
              help="fms-accel: also the acceleration plugins (GPTQ-LoRA, fast_kernels, fast_moe).")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where environments live (default: the inventory's defaults.envs_dir, else $SBENCH_ENVS_DIR, "
              "else ~/.cache/sbench/envs). The compute nodes must see it.")
@click.option("--requirements", "requirements", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Packages to install with the release (name or name==version per line), e.g. the "
              "exact package list of a reference run, for a release whose own pins no longer resolve to a working "
              "set.")
@click.option("--force", is_flag=True, help="Build again from nothing.")
@click.option("--refresh", is_flag=True, help="Read a built environment's packages again (after installing "
              "flash-attn into it by hand, say).")
@inventory_option
@json_option
def env_build(spec: str, extras: str | None, root: Path | None, requirements: Path | None, force: bool, refresh: bool,
              inventory: Path | None, as_json: bool) -> None:
    """Build (once) the environment of one fms-hf-tuning release, exactly as that release pins it.

    Example: sbench env build fms-hf-tuning==3.2.2 --extras fms-accel
    """
    version = parse_spec(spec)
    pins = read_pins(requirements) if requirements else None
    ex = tuple(x.strip() for x in extras.split(",") if x.strip()) if extras else ()
    env, status = build(version, _root(inventory, root), extras=ex, force=force, refresh=refresh, pins=pins,
                        log=lambda s: click.echo(s, err=True) if not as_json else None)
    man = env.manifest or {}
    if as_json:
        echo_json({"status": status, "path": str(env.path), "python": str(env.python), **man})
        return
    pk = man.get("trainer_packages") or {}
    click.echo(f"{status}: {env.path} ({', '.join(f'{k} {v}' for k, v in pk.items() if v)}"
               f"{'; plugins: ' + ', '.join(man.get('plugins') or {}) if man.get('plugins') else ''}"
               f"; built in {man.get('build_seconds')} s)")


@env_group.command("list")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where environments live (default as for env build).")
@inventory_option
@json_option
def env_list(root: Path | None, inventory: Path | None, as_json: bool) -> None:
    """The trainer environments that are built (or failed to build), and what they hold.

    Example: sbench env list -i cluster.yaml
    """
    r = _root(inventory, root)
    envs = list_envs(r)
    rows: list[dict[str, Any]] = [{"version": e.version, "path": str(e.path), "built": e.built,
             "packages": (e.manifest or {}).get("trainer_packages"), "plugins": (e.manifest or {}).get("plugins"),
             "failed": (e.failure or {}).get("reason")} for e in envs]
    if as_json:
        echo_json({"root": str(r), "envs": rows})
        return
    if not rows:
        click.echo(f"no trainer environments in {r}; build one: sbench env build fms-hf-tuning==3.2.2")
        return
    for row in rows:
        state = "built" if row["built"] else "missing"
        pk = row["packages"] or {}
        click.echo(f"fms-hf-tuning {row['version']:<8} {state:<8} {row['path']}"
                   + (f"  ({', '.join(f'{k} {v}' for k, v in pk.items() if v)})" if pk else "")
                   + (f"  plugins: {', '.join(row['plugins'])}" if row["plugins"] else "")
                   + (f"\n    last build failed: {row['failed']}" if row["failed"] else ""), file=sys.stdout)
