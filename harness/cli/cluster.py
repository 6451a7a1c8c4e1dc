"""CLI: probe the cluster's nodes and compare them with the inventory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import yaml

from harness.contract.errors import RunnerError
from harness.contract.paths import resolve_db, resolve_workdir
from harness.db.cluster import record_fabric, record_probes
from harness.db.store import open_store
from harness.db.values import to_json, utc
from harness.runner.fabric import parse_size
from harness.sbatch.backends import resolve_executor
from harness.sbatch.fabric import run_fabric
from harness.sbatch.probe import compare, fragment, run_probe
from harness.spec.inventory import load_inventory

from .base import db_option, echo_json, inventory_option, json_option, main, say, table, workdir_option


@main.command()
@inventory_option
@click.option("--partition", default=None, help="Partition to probe (default: the inventory's only one).")
@click.option("--on", "where", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
              help="local: this machine, as one host of the partition; slurm: one task on every inventory host.")
@click.option("--host", default=None, help="With --on local: the inventory host this machine is.")
@click.option("--write", "write_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write an inventory fragment of what the nodes have to this file.")
@workdir_option
@db_option
@json_option
def probe(inventory: Path | None, partition: str | None, where: str, host: str | None, write_to: Path | None,
          workdir: Path | None, db: Path | None, as_json: bool) -> None:
    """Probe GPUs, RDMA devices and GID tables, memlock, cores and memory; print what differs from the inventory.

    Example: sbench probe -i cluster.yaml --partition a100 --on slurm --write probed.yaml
    """
    inv = load_inventory(inventory)
    part = inv.partition(partition, choose="--partition")
    probes = run_probe(inv, part.name, where == "slurm", resolve_workdir(workdir), host)
    probe_id = time.strftime("%Y%m%dT%H%M%S") + f"-{part.name}"
    rows: list[dict[str, Any]] = []
    diffs: list[str] = []
    for name, pr in sorted(probes.items()):
        found = compare(part, part.hosts[name], pr) if name in part.hosts else [f"{name}: not an inventory host"]
        diffs += found
        rows.append({"probe_id": probe_id, "host": name, "cluster": inv.cluster, "partition": part.name,
                     "probed_at": utc(pr.get("t_wall")), "gpu_count": pr.get("gpu_count"),
                     "gpu_names": [g.get("name") for g in pr.get("gpus") or []], "driver_version": pr.get("driver"),
                     "cuda_driver": pr.get("cuda_driver"), "cores": pr.get("cores"), "memory_gb": pr.get("memory_gb"),
                     "memlock": pr.get("memlock"), "hcas": to_json(pr.get("hcas")), "differences": found,
                     "doc": to_json(pr)})
    with open_store(resolve_db(db)) as st:
        record_probes(st, rows)
    if write_to is not None:
        frag = fragment(part.name, probes, {h: part.hosts[h].address for h in probes if h in part.hosts}, part)
        write_to.write_text(f"# sbench probe {probe_id}: what the nodes of partition {part.name} have\n"
                            + yaml.safe_dump(frag, sort_keys=False))
    if as_json:
        echo_json({"probe_id": probe_id, "probes": probes, "differences": diffs})
        return
    out = [{"host": r["host"], "gpus": r["gpu_count"], "driver": r["driver_version"] or "-", "cores": r["cores"],
            "memory_gb": r["memory_gb"], "memlock": r["memlock"],
            "hcas": " ".join(f"{d['name']}:{p['port']}({(p.get('state') or '?').split(':')[-1].strip()},"
                             f"{p.get('link_layer') or '?'})" for d in probes[r["host"]].get("hcas") or []
                             for p in d["ports"]) or "none"} for r in rows]
    click.echo(table(out, list(out[0])))
    click.echo(f"\nprobe {probe_id}: {len(rows)} host(s) recorded in {resolve_db(db)}")
    for d in diffs:
        say(f"differs: {d}")
    if not diffs:
        click.echo("the inventory matches the nodes")
    if write_to is not None:
        click.echo(f"wrote an inventory fragment to {write_to}")


def _sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        sizes = [parse_size(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give sizes like 1K,64K,1M,256M") from None
    if not sizes or any(s < 4 or s > 8 * 1024**3 for s in sizes):
        raise click.BadParameter("each size must be between 4 bytes and 8G")
    return sizes


@main.command()
@inventory_option
@click.option("--partition", default=None, help="Partition (default: the inventory's only one).")
@click.option("--nodes", type=click.IntRange(min=1, max=4096), default=2, show_default=True,
              help="Whole nodes to span (one process per device).")
@click.option("--roce/--no-roce", default=None,
              help="Use the hosts' RoCE settings (default: when every host has them).")
@click.option("--sizes", callback=_sizes, default=None, help="Message sizes, e.g. 1K,1M,64M (default: 1K..256M; "
                                                             "1K..16M on CPU partitions).")
@click.option("--iters", type=click.IntRange(min=1, max=10000), default=20, show_default=True)
@click.option("--executor", type=click.Choice(["auto", "slurm", "local"]), default="auto", show_default=True)
@workdir_option
@db_option
@json_option
def fabric(inventory: Path | None, partition: str | None, nodes: int, roce: bool | None, sizes: list[int] | None,
           iters: int, executor: str, workdir: Path | None, db: Path | None, as_json: bool) -> None:
    """All-reduce and all-gather bandwidth across nodes, with exactly a benchmark point's per-host environment.

    Example: sbench fabric -i cluster.yaml --partition a100 --nodes 2
    """
    inv = load_inventory(inventory)
    partition = inv.partition(partition, choose="--partition").name
    res = run_fabric(inv, partition, nodes, resolve_workdir(workdir), executor=resolve_executor(executor),
                     roce=roce, sizes=sizes, iters=iters)
    with open_store(resolve_db(db)) as st:
        record_fabric(st, res.rows)
    if as_json:
        echo_json(res.to_dict())
    else:
        rows = [{"op": r["op"], "bytes": r["bytes"], "time_us": f"{r['time_us']:.1f}",
                 "algbw_GB/s": f"{r['algbw_gbps']:.3f}", "busbw_GB/s": f"{r['busbw_gbps']:.3f}"}
                for r in res.rows if r.get("bytes")]
        if rows:
            click.echo(table(rows, list(rows[0])))
        transports = ", ".join(f"{h}={t or '-'}" for h, t in res.transports.items()) or "-"
        say(f"\nfabric {res.fabric_id}: {res.backend or '?'} over {nodes} node(s), world {res.world_size}; "
            f"NCCL transport per host: {transports}; recorded in {resolve_db(db)}")
    if not res.ok:
        raise RunnerError(f"fabric failed: {res.reason}")


