"""The SLURM partition of a sweep as its controller describes it, for ``render`` and ``submit``.

Allocations stay on inventory hosts: the partition's other nodes are excluded from every request that
does not name its hosts. Requests that do not fit the nodes as SLURM configured them (cores, memory,
GPUs) are named (:func:`harness.slurm.sinfo.misfits`), and so is every host where the inventory and
SLURM disagree about the node's cores, memory or GPUs, in either direction (:func:`disagreements`): a
node with more cores than the inventory says can run other jobs beside a point that asked for the
inventory's cores. Without ``sinfo`` or a controller this says so and goes on: the rendered requests
are still the ones the inventory implies.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.build.jobspec import DEFAULT_TIME, JobSpec, scheduling
from harness.slurm.client import Slurm
from harness.slurm.limits import JobLimit
from harness.slurm.sinfo import NodeInfo, misfits
from harness.spec.inventory import Inventory, Partition
from harness.spec.plan import PlannedPoint
from harness.spec.resources import MB_PER_GB
from harness.spec.schema import minutes_text, slurm_time_key
from harness.spec.sweep import Sweep

MEMORY_TOLERANCE = 0.10  # RealMemory is often a little below the spec sheet's figure: a larger gap is a disagreement


@dataclass
class ClusterFit:
    """The SLURM partition as its controller describes it, for one sweep's partition."""

    exclude: list[str] | None = None  # partition nodes that are not inventory hosts
    notes: list[str] = field(default_factory=list)  # what does not fit, or why nothing was checked
    nodes: dict[str, NodeInfo] | None = None
    # the per-job limits of the association and QOS the sweep's jobs run under (scontrol show assoc_mgr)
    job_limits: list[JobLimit] = field(default_factory=list)

    @property
    def time_limit(self) -> str | None:
        """The longest time a job may ask for, as SLURM words it: the partition's ``MaxTime`` (the tightest its
        nodes' lines give) or the association's or QOS's ``MaxWall``, whichever is tighter; None when neither
        sets one or SLURM did not answer."""
        limit = self.tightest_time()
        return limit[1] if limit else None

    def tightest_time(self) -> tuple[float, str, str, JobLimit | None] | None:
        """(minutes, SLURM's words, what sets it and where it was read, the association's or QOS's limit or None
        for the partition's) of the tightest time limit."""
        found: list[tuple[float, str, str, JobLimit | None]] = []
        for n in (self.nodes or {}).values():
            try:
                found += [(slurm_time_key(n.time_limit), n.time_limit, "MaxTime, sinfo", None)] if n.time_limit else []
            except ValueError:
                continue  # a word of sinfo's this does not read: no limit known from it
        found += [(float(lim.most), minutes_text(lim.most), f"{lim.where} {lim.name}, scontrol show assoc_mgr", lim)
                  for lim in self.job_limits if lim.tres == "wall"]
        limit = min(found, default=None, key=lambda f: f[0])
        return limit if limit and limit[0] != float("inf") else None

    def within(self, time_limit: str | None) -> str | None:
        """The tighter of *time_limit* (the inventory's) and SLURM's: what a pack's time stays within."""
        ours = self.time_limit
        if not ours or not time_limit:
            return ours or time_limit
        return min((slurm_time_key(t), t) for t in (time_limit, ours))[1]

    def over_time(self, specs: list[JobSpec]) -> str | None:
        """Why some of *specs* ask for more time than SLURM's partition allows (sbatch refuses them, or, with
        ``EnforcePartLimits=NO``, they pend for ever: ``PartitionTimeLimit``); None when all fit."""
        found = self.tightest_time()
        if found is None:
            return None
        most, limit, source, wall = found
        over: dict[str, int] = {}
        for spec in specs:
            asked = str(spec.resources["time"])  # (always rendered: harness.build.jobspec.request_time)
            if slurm_time_key(asked) > most:
                over[asked] = over.get(asked, 0) + 1
        if not over:
            return None
        part = specs[0].partition
        asks = ", ".join(f"--time={t} ({n} point(s))" for t, n in over.items())
        if wall is not None:
            whose = f"the {wall.where} lets one job have at most {limit} ({source})"
            reason = wall.reason
        else:
            whose = f"SLURM's partition for {part!r} allows at most {limit} ({source})"
            reason = "PartitionTimeLimit"
        return (f"{asks} but {whose}: sbatch would refuse them or leave them pending for ever ({reason}); ask for "
                f"at most {limit} (slurm.time), and set partitions.{part}.time_limit: \"{limit}\" in the inventory")

    def over_job_limits(self, specs: list[JobSpec]) -> list[str]:
        """Why some of *specs* ask for more nodes, CPUs or GPUs than the association or QOS lets one job have
        (``MaxTRESPerJob``: they pend for ever); [] when all fit. A whole-node (exclusive) point is counted at
        its nodes' CPUs where SLURM said them."""
        out = []
        for lim in self.job_limits:
            if lim.tres == "wall":
                continue
            over: dict[int, int] = {}
            for spec in specs:
                asked = self._asked(spec, lim.tres)
                if asked is not None and asked > lim.most:
                    over[asked] = over.get(asked, 0) + 1
            if over:
                what = {"node": "node(s)", "cpu": "CPU(s)", "gres/gpu": "GPU(s)"}[lim.tres]
                asks = ", ".join(f"{n} {what} ({k} point(s))" for n, k in sorted(over.items()))
                fix = ("use another partition (its QOS binds every job in it, unless the job's QOS has the "
                       "OverPartQOS flag)" if lim.partition else
                       "run under an account or QOS that allows them (slurm.account, slurm.qos)")
                out.append(f"{asks} asked, but the {lim.where} lets one job have at most {lim.most} {what} "
                           f"({lim.name}, scontrol show assoc_mgr): they would pend for ever ({lim.reason}); leave "
                           f"those points out of the sweep, or {fix}")
        return out

    def _asked(self, spec: JobSpec, tres: str) -> int | None:
        """What *spec* asks of *tres* in all (None: not known)."""
        res = spec.resources
        nodes = int(res.get("nodes") or 1)
        if tres == "node":
            return nodes
        if tres == "gres/gpu":
            return nodes * int(res.get("gpus_per_node") or 0)
        if res.get("exclusive"):  # the job holds its nodes' every CPU
            cpus = [n.cpus for n in (self.nodes or {}).values() if n.cpus]
            return nodes * max(cpus) if cpus else None
        return nodes * int(res.get("ntasks_per_node") or 1) * int(res.get("cpus_per_task") or 1)

    def over_nodes(self, specs: list[JobSpec]) -> str | None:
        """Why some of *specs* ask for more nodes than SLURM's partition lets one job have (``MaxNodes``: they
        pend for ever, ``PartitionNodeLimit``); None when all fit."""
        limits = [n.max_nodes for n in (self.nodes or {}).values() if n.max_nodes is not None]
        if not limits or not specs:
            return None
        most = min(limits)
        over: dict[int, int] = {}
        for spec in specs:
            n = int(spec.resources.get("nodes") or 1)
            if n > most:
                over[n] = over.get(n, 0) + 1
        if not over:
            return None
        asks = ", ".join(f"--nodes={n} ({k} point(s))" for n, k in sorted(over.items()))
        return (f"{asks} but SLURM's partition for {specs[0].partition!r} lets one job have at most {most} node(s) "
                "(MaxNodes, sinfo): they would pend for ever (PartitionNodeLimit); leave those number_nodes out "
                "of the sweep, or use a partition that allows them")

    def refusals(self, specs: list[JobSpec]) -> list[str]:
        """What SLURM's partition would never run of *specs*: submit refuses them (render warns)."""
        return [r for r in (self.over_time(specs), self.over_nodes(specs)) if r] + self.over_job_limits(specs)

    def check(self, specs: list[JobSpec], inv: Inventory) -> list[str]:
        """The notes, then each point's requests that do not fit the nodes (each line once)."""
        out = list(self.notes) + self.refusals(specs)
        nodes = self.nodes
        if nodes is not None:
            for name in dict.fromkeys(spec.partition for spec in specs):
                out += disagreements(inv.partition(name), nodes)
            for spec in specs:
                part = inv.partition(spec.partition)
                out += [f"point {spec.point_id}: {m}"
                        for m in misfits(sorted(part.hosts), nodes, spec.resources, part.slurm_partition)]
        return list(dict.fromkeys(out))


def within_slurms_time(inv: Inventory, sweep: Sweep, fit: ClusterFit) -> Inventory:
    """*inv* with SLURM's time limit (``MaxTime``, or the association's or QOS's ``MaxWall`` where tighter) as the
    sweep's partition's ``time_limit`` where the inventory names none and
    the sweep asks for no time, and the default request (:data:`DEFAULT_TIME`) would pass it: the points then ask
    for what the partition allows instead of being refused for a time the user never asked for (said in
    ``fit.notes``)."""
    part = inv.partition(sweep.partition)
    found = fit.tightest_time()
    if part.time_limit or sweep.slurm.time or not found:
        return inv
    most, limit, source, _wall = found
    if most >= slurm_time_key(DEFAULT_TIME):
        return inv
    fit.notes.append(f"partition {part.name!r}: the inventory names no time_limit and the sweep no slurm.time; "
                     f"the points ask for SLURM's limit, {limit} ({source}), not the default {DEFAULT_TIME}")
    return replace(inv, partitions={**inv.partitions, part.name: replace(part, time_limit=limit)})


def cluster_fit(inv: Inventory, sweep: Sweep, points: list[PlannedPoint], slurm: Slurm) -> ClusterFit:
    """Ask the controller about the sweep's SLURM partition (``sinfo``) and the per-job limits of the account and
    QOS its jobs run under (``scontrol show assoc_mgr``); an empty fit when none answers."""
    names = {p.partition for p in points}
    if len(names) != 1:
        return ClusterFit()
    part = inv.partition(names.pop())
    nodes, why = slurm.partition_nodes(part.slurm_partition)
    if nodes is None:
        return ClusterFit(notes=[f"requests not checked against SLURM ({why}); allocations of fewer nodes than the "
                                 f"partition has hosts are not restricted to inventory hosts"])
    others = sorted(set(nodes) - set(part.hosts))
    asks = scheduling(sweep, part)
    limits = slurm.job_limits(asks.get("account"), part.slurm_partition, asks.get("qos"))
    return ClusterFit(exclude=others or None, nodes=nodes, job_limits=limits)


def disagreements(part: Partition, nodes: dict[str, NodeInfo]) -> list[str]:
    """Where the inventory and SLURM describe one of *part*'s hosts differently (cores, memory, GPUs), hosts
    with the same difference on one line, with what each side says and the fix."""
    key = f"partitions.{part.name}"
    found: dict[str, list[str]] = {}
    for host in sorted(part.hosts):
        n = nodes.get(host)
        if n is None:
            continue
        if n.cpus is not None and n.cpus != part.cpus_per_node:
            more = n.cpus > part.cpus_per_node
            found.setdefault(
                f"the inventory says {part.cpus_per_node} cores ({key}.cpus_per_node), SLURM says CPUTot={n.cpus}"
                + ("; a point that asks for the inventory's cores leaves the rest to other jobs unless it is "
                   "--exclusive" if more else "; requests for the inventory's cores cannot be granted")
                + f" (fix: cpus_per_node: {n.cpus})", []).append(host)
        mem_mb = part.memory_gb * MB_PER_GB
        if n.memory_mb is not None and abs(n.memory_mb - mem_mb) > MEMORY_TOLERANCE * max(n.memory_mb, mem_mb):
            found.setdefault(
                f"the inventory says {part.memory_gb:g} GB of memory ({key}.memory_gb), SLURM says RealMemory="
                f"{n.memory_mb} MB (fix: memory_gb: {n.memory_mb / MB_PER_GB:g})", []).append(host)
        if not part.is_cpu and n.gpus is not None and n.gpus != part.gpus_per_node:
            found.setdefault(
                f"the inventory says {part.gpus_per_node} GPUs ({key}.gpus_per_node), SLURM's Gres says {n.gpus}"
                f" (fix: gpus_per_node: {n.gpus}, or the node's Gres)", []).append(host)
    return [f"inventory and SLURM disagree about {', '.join(hosts)}: {what}" for what, hosts in found.items()]
