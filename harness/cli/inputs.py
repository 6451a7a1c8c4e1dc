"""Commands that read the inputs: inventory check and discover, experiments, plan, render."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from harness.build.jobspec import JobSpec, request_time
from harness.build.render import prepare_points, render_points
from harness.campaign.grouping import make_packs, pack_labels
from harness.cluster import discover as discovery
from harness.cluster.faultcheck import check_faults
from harness.cluster.fit import ClusterFit, cluster_fit, within_slurms_time
from harness.contract.errors import InputError, RunnerError
from harness.contract.lazy import lazy_module
from harness.contract.paths import resolve_db, resolve_workdir
from harness.data.lengths import length_warnings
from harness.data.prepared import masked_warnings
from harness.slurm.client import Slurm
from harness.spec.catalog import EXPERIMENTS, get_experiment
from harness.spec.inventory import Inventory, describe, load_inventory
from harness.spec.plan import PlannedPoint, plan_sweep, plan_warnings
from harness.spec.predict import Prediction, beyond_time, over_budget, totals, unseen_by_budget
from harness.spec.resources import Share, point_share
from harness.spec.sweep import Sweep, load_sweep

from .base import (
    db_option,
    echo_json,
    inventory_option,
    json_option,
    main,
    model_map_option,
    prediction_line,
    say,
    sweep_argument,
    table,
    workdir_option,
)

if TYPE_CHECKING:
    from harness.db import predict
else:  # the database loads only for plan --db: render and plan without it start without DuckDB
    predict = lazy_module("harness.db.predict")


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


@inventory.command("discover")
@click.option("--partition", "partitions", multiple=True, help="A SLURM partition to describe (repeatable; default: "
              "every partition sinfo lists).")
@click.option("--on", "where", type=click.Choice(["slurm", "none"]), default="slurm", show_default=True,
              help="slurm: probe every usable node through srun (GPUs by NVML, HCAs, GID tables); none: SLURM's "
              "word only.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the inventory here (default: print it).")
@click.option("--against", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="An earlier inventory: print what changed (hosts gone or new, HCAs down, GID indices moved).")
@workdir_option
def inventory_discover(partitions: tuple[str, ...], where: str, output: Path | None, against: Path | None,
                       workdir: Path | None) -> None:
    """Write an inventory from sinfo, scontrol show node and a probe of every node.

    Example: sbench inventory discover --on slurm -o cluster.yaml --against old.yaml
    """
    old = load_inventory(against) if against is not None else None
    found = discovery.discover(Slurm(), list(partitions), where == "slurm", resolve_workdir(workdir))
    text = discovery.render(found)
    if output is not None:
        output.write_text(text)
        say(f"wrote {output}: {len(found.partitions)} partition(s), "
            f"{len({n for p in found.partitions.values() for n in p.nodes})} node(s), {len(found.probes)} probed"
            + (f"; not probed: {', '.join(f'{n} ({why})' for n, why in sorted(found.not_probed.items()))}"
               if found.not_probed else ""), err=True)
    else:
        click.echo(text, nl=False)
    if old is not None:
        moved = discovery.changes(old, found)
        for line in moved:
            say(f"changed: {line}", err=True)
        if not moved:
            say(f"no change against {against}", err=True)
    if where == "slurm" and not found.probes:
        raise RunnerError("no node could be probed")


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
def _plan(sweep_path: Path, inventory_path: Path | None, model_map: Path | None,
          memory: bool = False) -> tuple[Inventory, Sweep, list[PlannedPoint]]:
    inv = load_inventory(inventory_path)
    sweep = load_sweep(sweep_path, model_map)
    return inv, sweep, plan_sweep(sweep, inv, memory=memory)


def _packs(inv: Inventory, sw: Sweep, specs: list[JobSpec]) -> list[list[JobSpec]]:
    return make_packs(specs, sw.slurm.pack, inv.partition(sw.partition).time_limit)


def planned_packs(inv: Inventory, sw: Sweep, points: list[PlannedPoint]) -> dict[tuple[str, int], str]:
    """With ``slurm.pack``, which points of the first submission share an allocation (built in memory as submit
    builds them; with ``repeats: {min, ...}`` the first *min* repeats); empty without packing."""
    if sw.slurm.pack == 1:
        return {}
    first = [p for p in points if p.valid and (sw.adaptive is None or p.repeat < sw.adaptive.min)]
    specs = [spec for spec, _ in prepare_points(sw, inv, first, Path("results/runs") / sw.campaign)]
    return pack_labels(_packs(inv, sw, specs))


def _gb(v: Any) -> str:
    return "" if v is None else f"{v / 1e9:.3g}"


def _share(inv: Inventory, sw: Sweep, p: PlannedPoint) -> Share:
    return point_share(inv.partition(p.partition), p.entity, sw.slurm.exclusive, sw.slurm.mem_gb)


def share_summary(shares: list[Share]) -> list[str]:
    """What the valid runs ask of their nodes, one line per kind of share: whole nodes or a stated part."""
    counts: dict[str, int] = {}
    for s in shares:
        counts[s.text] = counts.get(s.text, 0) + 1
    out = [f"node share of {n} run(s): {text}" for text, n in counts.items()]
    if any(not s.exclusive and s.fraction < 1.0 for s in shares) and not any(
            s.why.startswith("slurm.exclusive") for s in shares):
        out.append("note: partial-node runs share their node with other jobs; slurm.exclusive: true in the sweep "
                   "gives each one its nodes to itself")
    return out


def memory_summary(points: list[PlannedPoint]) -> str:
    """``plan --memory``'s count of the valid runs: predicted to fit, predicted not to fit, and not predicted
    (no architecture known, or no device memory), each counted once."""
    valid = [p for p in points if p.valid]
    oom = sum(1 for p in valid if p.memory and p.memory.get("predicted_oom") is True)
    fit = sum(1 for p in valid if p.memory and p.memory.get("predicted_oom") is False)
    unknown = len(valid) - oom - fit
    text = (f"memory of {len(valid)} valid run(s): {fit} predicted to fit, {oom} predicted not to fit"
            + (" (sbench submit --skip-predicted-oom skips them)" if oom else "")
            + f", {unknown} not predicted" + (" (the reasons column says why)" if unknown else ""))
    return text


@main.command()
@sweep_argument
@inventory_option
@model_map_option
@click.option("--memory", is_flag=True, help="Predict each valid point's memory per device and flag the ones "
                                           "that will not fit (predicted_oom).")
@functools.partial(db_option, from_env=False,
                   help="Predict each valid point's allocation seconds and GPU-hours from what this results database "
                        "measured (and the campaign's totals, against the sweep's budget:).")
@json_option
def plan(sweep: Path, inventory: Path | None, model_map: Path | None, memory: bool, db: str | Path | None,
         as_json: bool) -> None:
    """Expand a sweep into points and say which are valid and why not.

    Example: sbench plan sweeps/demo-cpu.yaml --memory --json
    """
    inv, sw, points = _plan(sweep, inventory, model_map, memory)
    target = resolve_db(db) if db is not None else None
    if isinstance(target, Path) and not target.is_file():
        raise InputError(f"--db {db}: no results database there; predictions read what one measured (sbench "
                         "collect writes it)")
    preds: dict[tuple[str, int], Prediction] = {}
    if target is not None:
        found, _spent = predict.predictions(target, points, cluster=inv.cluster)
        preds = {(p.point_id, p.repeat): p for p in found}
    check_faults(inv, {p.partition for p in points})
    masked_warnings(sw, inv, points)
    length_warnings(sw, inv, points)
    shares = {p.point_id: _share(inv, sw, p) for p in points}
    packs = planned_packs(inv, sw, points)
    if as_json:
        echo_json([{**p.to_dict(), "node_share": shares[p.point_id].to_dict(),
                    **({"pack": packs.get((p.point_id, p.repeat))} if packs else {}),
                    **({"prediction": preds[(p.point_id, p.repeat)].to_dict()}
                       if (p.point_id, p.repeat) in preds else {})} for p in points])
        return
    varying = list(sw.grid)
    rows = []
    for p in points:
        row: dict[str, Any] = {"point_id": p.point_id, "rep": p.repeat, "valid": "yes" if p.valid else "NO"}
        for k in varying:
            row[k] = p.entity.get(k)
        row["node share"] = shares[p.point_id].short if p.valid else ""
        if packs:
            row["pack"] = packs.get((p.point_id, p.repeat), "")
        pred = preds.get((p.point_id, p.repeat))
        if pred is not None:
            row.update({"predicted s": "" if pred.seconds is None else f"{pred.seconds:,.0f}",
                        "GPU-h": "" if pred.gpu_hours is None else f"{pred.gpu_hours:,.3g}",
                        "from": pred.basis if pred.source else "not predicted"})
        mem_cols: list[str] = []
        if memory:
            m = p.memory or {}
            row.update({"params GB": _gb(m.get("param_bytes")), "grads GB": _gb(m.get("grad_bytes")),
                        "optim GB": _gb(m.get("optimizer_bytes")), "acts GB": _gb(m.get("activation_bytes")),
                        "total GB": _gb(m.get("total_bytes")), "device GB": _gb(m.get("device_bytes")),
                        "fits": "" if not p.valid else "not predicted" if m.get("predicted_oom") is None else
                        ("NO (predicted OOM)" if m["predicted_oom"] else "yes")})
            mem_cols = ["params GB", "grads GB", "optim GB", "acts GB", "total GB", "device GB", "fits"]
            if p.valid and m.get("status") == "unknown":
                row["reasons"] = f"memory not predicted: {m.get('reason')}"
            elif p.valid and m.get("predicted_oom") is None:
                row["reasons"] = f"fit not predicted: device memory {m.get('device_source')}"
        row.setdefault("reasons", "; ".join(p.reasons))
        rows.append(row)
    click.echo(f"campaign {sw.campaign}: {sw.experiment.id} on partition {points[0].partition if points else '-'}")
    click.echo(table(rows, ["point_id", "rep", "valid", *varying, "node share", *(["pack"] if packs else []),
                            *(mem_cols if memory and points else []),
                            *(["predicted s", "GPU-h", "from"] if preds else []), "reasons"]))
    if memory:
        click.echo("\n" + memory_summary(points))
    n_valid = sum(p.valid for p in points)
    click.echo(f"\n{len(points)} run(s): {n_valid} valid, {len(points) - n_valid} invalid")
    if preds:
        listed = list(preds.values())
        click.echo(prediction_line({**totals(listed).to_dict(), "budget": sw.budget.to_dict() if sw.budget else None})
                   or "")
        over = over_budget(sw.budget, listed) if sw.budget else None
        if over:
            say(f"warning: the campaign would pass its budget: {over}; sbench submit refuses it", err=True)
        unseen = unseen_by_budget(listed) if sw.budget else None
        if unseen:
            say(f"warning: {unseen}", err=True)
        late = beyond_time(listed, request_time(sw, inv.partition(sw.partition)))
        if late:
            say(f"warning: {late}", err=True)
    if sw.adaptive:
        a = sw.adaptive
        click.echo(f"repeats: {a.min} per point, then one more at a time while its throughput CV is above "
                   f"{100 * a.cv:g} %, up to {a.max} (listed: every repeat a point may get)")
    if sw.search:
        sr = sw.search
        goal = ", ".join(f"{sense} {metric}" for sense, metric in sr.objectives)
        click.echo(f"search: {goal}{' (a Pareto front)' if sr.pareto else ''}; "
                   + (("the largest batch that fits per shape by a scan (slurm.pack: every batch at once, in "
                       "ascending order in one pack, none started after its shape's first OOM); " if sr.scan else
                       "the largest batch that fits per shape by bisection; ") if sr.batch_size else "")
                   + (f"successive halving (eta {sr.eta}); " if sr.method else "")
                   + f"the best point gets {sw.search_repeats} repeat(s) (listed: every repeat a point may get; "
                   "the search runs only those it needs)")
    for line in share_summary([shares[p.point_id] for p in points if p.valid]):
        click.echo(line)
    if packs:
        n_packs = len({t.split(",")[0] for t in packs.values() if t != "alone"})
        click.echo(f"slurm.pack {sw.slurm.pack}: {sum(t != 'alone' for t in packs.values())} run(s) share "
                   f"{n_packs} allocation(s), {sum(t == 'alone' for t in packs.values())} run alone (the pack "
                   "column; a later repeat packs with what goes out with it)")
    notes = sorted({n for p in points for n in p.notes})
    for n in notes:
        click.echo(f"note: {n}")
    for w in plan_warnings(sw, inv, points):  # once per cause, however many points share it
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
    inv, sw, points = _plan(sweep, inventory, model_map)
    fit = cluster_fit(inv, sw, [p for p in points if p.valid], Slurm()) if inventory is not None else ClusterFit()
    inv = within_slurms_time(inv, sw, fit)
    specs = render_points(sw, inv, points, out_dir, exclude=fit.exclude)
    for note in fit.check(specs, inv):
        click.echo(f"warning: {note}", err=True)
    for s in specs:
        click.echo(s.job_dir)
    if sw.slurm.pack != 1:  # which of them share an allocation (stdout stays one job dir a line)
        for i, members in enumerate([m for m in _packs(inv, sw, specs) if len(m) > 1], 1):
            click.echo(f"pack {i}: {len(members)} points in one allocation, in this order: "
                       f"{', '.join(Path(m.job_dir).name for m in members)}", err=True)
    shown: set[str] = set()
    for s in specs:
        te = s.trainer_env
        if te and te["version"] not in shown:
            shown.add(te["version"])
            pk = ", ".join(f"{k} {v}" for k, v in (te.get("packages") or {}).items() if v)
            click.echo(f"trainer fms-hf-tuning {te['version']}: {te['python']} -m harness.runner.fms "
                       + (f"({pk})" if te["built"] else "(environment not built yet: sbench env build "
                          f"fms-hf-tuning=={te['version']}, or sbench prepare)"), err=True)
    for line in share_summary([_share(inv, sw, p) for p in points if p.valid]):
        click.echo(line, err=True)
    invalid = [p for p in points if not p.valid]
    for p in invalid:
        click.echo(f"skipped invalid point {p.point_id} r{p.repeat}: {'; '.join(p.reasons)}", err=True)
    click.echo(f"rendered {len(specs)} job director{'y' if len(specs) == 1 else 'ies'} under {out_dir}"
               + (f"; {len(invalid)} invalid point(s) not rendered" if invalid else ""), err=True)
