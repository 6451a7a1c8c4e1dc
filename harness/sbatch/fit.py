"""The SLURM partition of a sweep as its controller describes it, for ``render`` and ``submit``.

Allocations stay on inventory hosts: the partition's other nodes are excluded from every request that
does not name its hosts. Requests that do not fit the nodes as SLURM configured them (cores, memory,
GPUs) are named (:func:`harness.slurm.sinfo.misfits`). Without ``sinfo`` or a controller this says so
and goes on: the rendered requests are still the ones the inventory implies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.build.jobspec import JobSpec
from harness.slurm.client import Slurm
from harness.slurm.sinfo import NodeInfo, misfits
from harness.spec.inventory import Inventory
from harness.spec.plan import PlannedPoint


@dataclass
class ClusterFit:
    """The SLURM partition as its controller describes it, for one sweep's partition."""

    exclude: list[str] | None = None  # partition nodes that are not inventory hosts
    notes: list[str] = field(default_factory=list)  # what does not fit, or why nothing was checked
    nodes: dict[str, NodeInfo] | None = None

    def check(self, specs: list[JobSpec], inv: Inventory) -> list[str]:
        """The notes, then each point's requests that do not fit the nodes (each line once)."""
        out = list(self.notes)
        nodes = self.nodes
        if nodes is not None:
            for spec in specs:
                part = inv.partition(spec.partition)
                out += [f"point {spec.point_id}: {m}"
                        for m in misfits(sorted(part.hosts), nodes, spec.resources, part.slurm_partition)]
        return list(dict.fromkeys(out))


def cluster_fit(inv: Inventory, points: list[PlannedPoint], slurm: Slurm) -> ClusterFit:
    """Ask the controller (``sinfo``) about the sweep's SLURM partition; an empty fit when none answers."""
    names = {p.partition for p in points}
    if len(names) != 1:
        return ClusterFit()
    part = inv.partition(names.pop())
    nodes, why = slurm.partition_nodes(part.slurm_partition)
    if nodes is None:
        return ClusterFit(notes=[f"requests not checked against SLURM ({why}); allocations of fewer nodes than the "
                                 f"partition has hosts are not restricted to inventory hosts"])
    others = sorted(set(nodes) - set(part.hosts))
    return ClusterFit(exclude=others or None, nodes=nodes)
