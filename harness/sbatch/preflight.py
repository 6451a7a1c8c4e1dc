"""``sbench preflight``: every device of a partition's nodes measured and ranked against the partition's median.

On each node :mod:`harness.runner.preflight` times a dense matmul at the partition's dtype (bf16 on GPUs, fp32
on a CPU partition) and a device memory copy, a few seconds each, in repetitions (their spread is kept). Here
each figure of each device is divided by the partition's median of that figure; a device under the threshold
(default :data:`~harness.contract.defaults.PREFLIGHT_THRESHOLD`) is slow. The rows land in the ``preflight``
table; a device's matmul figure is its measured peak (the ``measured_peaks`` view). ``sbench submit
--preflight`` runs it first and refuses to submit while a device is slow, or with ``--exclude-slow`` leaves
the slow devices' hosts out (sbatch ``--exclude``).

With ``--on slurm`` the scheduler client runs the workload with ``srun``, one task on every inventory host of the
partition (one allocation); locally it measures this machine as the partition's one host.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from harness.contract import envvars
from harness.contract.defaults import PREFLIGHT_SECONDS, PREFLIGHT_THRESHOLD
from harness.contract.errors import InputError
from harness.runner.preflight import UNITS, preflight_node
from harness.slurm.client import Slurm
from harness.spec.inventory import Inventory, Partition

from .probe import local_host, on_each_host


@dataclass
class PreflightResult:
    preflight_id: str
    partition: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # inventory hosts that wrote no result

    @property
    def slow(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["flagged"]]

    @property
    def slow_hosts(self) -> list[str]:
        return sorted({r["host"] for r in self.slow})

    def summary(self) -> str:
        """One line per slow device, or the line that says none is."""
        if not self.slow:
            return (f"preflight {self.preflight_id}: {len({r['host'] for r in self.rows})} host(s), "
                    f"{len({(r['host'], r['device']) for r in self.rows})} device(s), none slow")
        return "\n".join(f"slow: {r['host']} {r['device']} {r['figure']} {r['value']:.4g} {r['unit']} is "
                         f"{r['ratio']:.2f} of the partition's median {r['partition_median']:.4g} (under "
                         f"{r['threshold']:g})" for r in self.slow)


def default_threshold() -> float:
    """``$SBENCH_PREFLIGHT_THRESHOLD``, else :data:`PREFLIGHT_THRESHOLD`."""
    raw = envvars.PREFLIGHT_THRESHOLD.get()
    if not raw:
        return PREFLIGHT_THRESHOLD
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise InputError(f"{envvars.PREFLIGHT_THRESHOLD.name} must be a share of the partition's median in (0, 1], "
                         f"got {raw!r}")
    return value


def rank_devices(docs: dict[str, dict[str, Any]], preflight_id: str, cluster: str | None, partition: str,
         threshold: float = PREFLIGHT_THRESHOLD) -> list[dict[str, Any]]:
    """The ``preflight`` rows of the nodes' results (host -> preflight.<host>.json): each device's figure over
    the partition's median of that figure, flagged under *threshold*."""
    rows: list[dict[str, Any]] = []
    for host, doc in sorted(docs.items()):
        for dev in doc.get("devices") or []:
            for fig, f in sorted((dev.get("figures") or {}).items()):
                value = f.get("value") if isinstance(f, dict) else None
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                rows.append({"preflight_id": preflight_id, "cluster": cluster, "partition": partition, "host": host,
                             "device": str(dev.get("device")), "device_name": dev.get("name"),
                             "dtype": dev.get("dtype"), "figure": fig, "unit": UNITS.get(fig), "value": float(value),
                             "spread": f.get("spread"), "reps": [float(x) for x in f.get("reps") or []],
                             "elapsed_s": doc.get("elapsed_s"), "measured_at": doc.get("t_wall")})
    medians = {fig: median(r["value"] for r in rows if r["figure"] == fig) for fig in {r["figure"] for r in rows}}
    for r in rows:
        mid = medians[r["figure"]]
        r["partition_median"], r["threshold"] = mid, threshold
        r["ratio"] = r["value"] / mid if mid else None
        r["flagged"] = r["ratio"] is not None and r["ratio"] < threshold
    return rows


def _run_local(part: Partition, host: str | None, seconds: float) -> dict[str, dict[str, Any]]:
    me = local_host(part, host)
    return {me: preflight_node(me, gpu=not part.is_cpu, budget_s=seconds)}


def _run_slurm(inv: Inventory, part: Partition, workdir: Path, seconds: float,
               slurm: Slurm | None) -> dict[str, dict[str, Any]]:
    opts = [f"--partition={part.slurm_partition}", *([] if part.is_cpu else [f"--gpus-per-node={part.gpus_per_node}"]),
            *([f"--account={part.account}"] if part.account else []), *([f"--qos={part.qos}"] if part.qos else [])]
    return on_each_host("preflight", sorted(part.hosts), opts, part.python or inv.python or sys.executable,
                        ["--seconds", f"{seconds:g}", *(["--cpu"] if part.is_cpu else [])], workdir, slurm)


def run_preflight(inv: Inventory, partition: str | None, on_slurm: bool, workdir: Path, *,
                  threshold: float | None = None, seconds: float = PREFLIGHT_SECONDS,
                  host: str | None = None, slurm: Slurm | None = None) -> PreflightResult:
    """Measure the partition's devices (through SLURM, or this machine as *host*) and rank them against
    *threshold* (None: :func:`default_threshold`)."""
    threshold = default_threshold() if threshold is None else threshold
    if not 0 < threshold <= 1:
        raise InputError(f"preflight: the threshold is a share of the partition's median in (0, 1], got {threshold:g}")
    part = inv.partition(partition, choose="--partition")
    docs = _run_slurm(inv, part, workdir, seconds, slurm) if on_slurm else _run_local(part, host, seconds)
    pid = time.strftime("%Y%m%dT%H%M%S") + f"-{part.name}"
    return PreflightResult(pid, part.name, rank_devices(docs, pid, inv.cluster, part.name, threshold),
                           missing=sorted(set(part.hosts) - set(docs)) if on_slurm else [])
