"""CLI: probe the cluster's nodes and compare them with the inventory; measure its fabric and its devices
(preflight); say which hosts are slow again and again (hosts)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import yaml

from harness.campaign.executors.registry import job_runner
from harness.cluster.fabric import run_fabric
from harness.cluster.preflight import run_preflight
from harness.cluster.probe import compare, fragment, run_probe
from harness.contract.defaults import DRAIN_MIN_FLAGS, DRAIN_MIN_SHARE, PREFLIGHT_SECONDS, PREFLIGHT_THRESHOLD
from harness.contract.errors import RunnerError
from harness.contract.paths import DbArg, resolve_db, resolve_workdir
from harness.db.cluster import record_fabric, record_preflight, record_probes
from harness.db.hosts import drain_candidates, host_health
from harness.db.store import open_store
from harness.db.values import to_json, utc
from harness.runner.fabric import parse_size
from harness.slurm.client import Slurm
from harness.spec.inventory import load_inventory

from .base import FiniteFloat, db_option, echo_json, inventory_option, json_option, main, say, table, workdir_option


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
          workdir: Path | None, db: DbArg | None, as_json: bool) -> None:
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
           iters: int, executor: str, workdir: Path | None, db: DbArg | None, as_json: bool) -> None:
    """All-reduce and all-gather bandwidth across nodes, with exactly a benchmark point's per-host environment.

    Example: sbench fabric -i cluster.yaml --partition a100 --nodes 2
    """
    inv = load_inventory(inventory)
    partition = inv.partition(partition, choose="--partition").name
    res = run_fabric(inv, partition, nodes, resolve_workdir(workdir), job_runner(executor, Slurm()),
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




@main.command()
@inventory_option
@click.option("--partition", default=None, help="Partition to measure (default: the inventory's only one).")
@click.option("--on", "where", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
              help="local: this machine, as one host of the partition; slurm: one task on every inventory host.")
@click.option("--host", default=None, help="With --on local: the inventory host this machine is.")
@click.option("--threshold", type=FiniteFloat(min=0, max=1, min_open=True), default=None,
              help=f"A device under this share of the partition's median of a figure is slow (default "
              f"$SBENCH_PREFLIGHT_THRESHOLD, else {PREFLIGHT_THRESHOLD}).")
@click.option("--seconds", type=FiniteFloat(min=0.1, max=60), default=PREFLIGHT_SECONDS, show_default=True,
              help="Time per figure and device.")
@workdir_option
@db_option
@json_option
def preflight(inventory: Path | None, partition: str | None, where: str, host: str | None, threshold: float | None,
              seconds: float, workdir: Path | None, db: DbArg | None, as_json: bool) -> None:
    """Time a matmul (TFLOP/s) and a memory copy (GB/s) on every device; flag those under the partition's median.

    A device under it is measured again, in a fresh process after a pause (the second look, look 2), and is slow
    only when it is under it at both looks: exit 1 when a device is slow.

    Example: sbench preflight -i cluster.yaml --partition a100 --on slurm
    """
    inv = load_inventory(inventory)
    res = run_preflight(inv, partition, where == "slurm", resolve_workdir(workdir), threshold=threshold,
                        seconds=seconds, host=host)
    with open_store(resolve_db(db)) as st:
        record_preflight(st, res.recorded)
    if as_json:
        echo_json({"preflight_id": res.preflight_id, "partition": res.partition, "rows": res.rows,
                   "second_look": res.again, "slow_hosts": res.slow_hosts, "missing": res.missing})
    else:
        out = [{"look": look, "host": r["host"], "device": r["device"], "figure": r["figure"],
                "value": f"{r['value']:.4g}", "unit": r["unit"],
                "spread": f"{r['spread']:.0%}" if r["spread"] is not None else "-",
                "ratio": f"{r['ratio']:.2f}" if r["ratio"] is not None else "-",
                "slow": "SLOW" if r["flagged"] else ""} for look, rows in (("1", res.rows), ("2", res.again))
               for r in rows]
        click.echo(table(out, list(out[0])) if out else "no device measured")
        say(f"\n{res.summary()}; recorded in {resolve_db(db)}")
        for h in res.missing:
            say(f"missing: {h} wrote no result")
    if res.slow or res.missing:
        raise RunnerError(f"preflight: slow device(s) on {', '.join(res.slow_hosts) or '-'}"
                          + (f"; no result from {', '.join(res.missing)}" if res.missing else ""))


@main.command()
@click.option("--min-flags", type=click.IntRange(min=1), default=DRAIN_MIN_FLAGS, show_default=True,
              help="A drain candidate was flagged (a straggler run or a slow preflight) at least this many times.")
@click.option("--min-share", type=FiniteFloat(min=0, max=1), default=DRAIN_MIN_SHARE, show_default=True,
              help="... in at least this share of the runs and preflights that judged it.")
@click.option("--all", "show_all", is_flag=True, help="List every host, not only the drain candidates.")
@db_option
@json_option
def hosts(min_flags: int, min_share: float, show_all: bool, db: DbArg | None, as_json: bool) -> None:
    """Hosts slow again and again across campaigns (host_health): drain candidates with the evidence.

    Example: sbench hosts --json
    """
    with open_store(resolve_db(db), read_only=True) as st:
        rows = host_health(st)
    drain = drain_candidates(rows, min_flags, min_share)
    if as_json:
        echo_json({"drain_candidates": drain, "hosts": rows})
        return
    shown = rows if show_all else drain
    if shown:
        why = {d["host"]: d["why"] for d in drain}
        out = [{"host": h["host"], "runs": h["runs"], "scored": h["runs_scored"], "straggler": h["straggler_runs"],
                "median_score": f"{h['median_relative_score']:.2f}" if h["median_relative_score"] is not None
                else "-", "preflights": h["preflights"], "slow": h["slow_preflights"],
                "drain": "yes" if h["host"] in why else ""} for h in shown]
        click.echo(table(out, list(out[0])))
    for d in drain:
        say(f"drain candidate: {d['host']}: {d['why']}")
    if not drain:
        click.echo(f"no drain candidate among {len(rows)} host(s)")
