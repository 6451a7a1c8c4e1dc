"""``sbench preflight``: every device of a partition's nodes measured and ranked against the partition's median.

On each node :mod:`harness.runner.preflight` times a dense matmul at the partition's dtype (bf16 on GPUs, fp32
on a CPU partition) and a device memory copy, a few seconds each, in repetitions (their spread is kept). Here
each figure of each device is divided by the partition's median of that figure; a device under the threshold
(default :data:`~harness.contract.defaults.PREFLIGHT_THRESHOLD`) looks slow. One measurement never condemns a
node: when a device looks slow, every host is measured again, in a fresh process, after a pause
(:data:`~harness.contract.defaults.PREFLIGHT_SECOND_LOOK_PAUSE_S`: a neighbour's burst passes), and the second
look's figures are ranked among themselves as the first's were; a device is slow (``flagged``) only when it is
under the threshold at both looks. Both looks' rows land in the ``preflight`` table (the second's
``preflight_id`` ends in ``-again``); a device's matmul figure is its measured peak (the ``measured_peaks`` view:
its latest). ``sbench submit --preflight`` runs it first and refuses to submit while a device is slow, or with
``--exclude-slow`` leaves the slow devices' hosts out (sbatch ``--exclude``).

With ``--on slurm`` the scheduler client runs the workload with ``srun``, one task on every inventory host of the
partition (one allocation); locally it measures this machine as the partition's one host.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from harness.contract import envvars, safefile
from harness.contract.defaults import PREFLIGHT_SECOND_LOOK_PAUSE_S, PREFLIGHT_SECONDS, PREFLIGHT_THRESHOLD
from harness.contract.errors import InputError, RunnerError, SbenchError, SubmitError
from harness.contract.paths import DbTarget
from harness.db.cluster import record_fabric, record_preflight
from harness.db.store import open_store
from harness.runner.preflight import UNITS, preflight_node
from harness.slurm.client import Slurm
from harness.spec.inventory import Inventory, Partition
from harness.spec.plan import PlannedPoint

from .fabric import FabricResult, JobRunner, run_fabric
from .probe import local_host, on_each_host, runner_env


@dataclass
class PreflightResult:
    preflight_id: str
    partition: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # the first look: every device
    missing: list[str] = field(default_factory=list)  # inventory hosts that wrote no result
    again: list[dict[str, Any]] = field(default_factory=list)  # the second look: the hosts that looked slow

    @property
    def recorded(self) -> list[dict[str, Any]]:
        """The ``preflight`` table's rows: both looks."""
        return [*self.rows, *self.again]

    @property
    def slow(self) -> list[dict[str, Any]]:
        """The first look's rows of the devices slow at both looks."""
        return [r for r in self.rows if r["flagged"]]

    @property
    def slow_hosts(self) -> list[str]:
        return sorted({r["host"] for r in self.slow})

    @property
    def cleared(self) -> list[dict[str, Any]]:
        """The first look's rows under the threshold whose device the second look found within it."""
        return [r for r in self.rows if not r["flagged"] and r["ratio"] is not None and r["ratio"] < r["threshold"]]

    def summary(self) -> str:
        """One line per slow device figure (both looks' figures) and per one the second look cleared, or the line
        that says none is slow."""
        second = {(r["host"], r["device"], r["figure"]): r for r in self.again}

        def then(r: dict[str, Any]) -> str:
            a = second.get((r["host"], r["device"], r["figure"]))
            return f", then {a['ratio']:.2f} at the second look" if a and a["ratio"] is not None else ""

        lines = [f"slow: {r['host']} {r['device']} {r['figure']} {r['value']:.4g} {r['unit']} is {r['ratio']:.2f} of "
                 f"the partition's median {r['partition_median']:.4g}{then(r)} (under {r['threshold']:g})"
                 for r in self.slow]
        lines += [f"cleared by a second look: {r['host']} {r['device']} {r['figure']} was {r['ratio']:.2f} of the "
                  f"partition's median{then(r)}" for r in self.cleared]
        if not self.slow:
            lines.insert(0, f"preflight {self.preflight_id}: {len({r['host'] for r in self.rows})} host(s), "
                            f"{len({(r['host'], r['device']) for r in self.rows})} device(s), none slow")
        return "\n".join(lines)


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


def confirm(first: list[dict[str, Any]], again: list[dict[str, Any]]) -> None:
    """Condemn only a device slow at both looks: a first-look row stays flagged only when the second look found
    its device under the threshold too (in any figure)."""
    slow_again = {(r["host"], r["device"]) for r in again if r["flagged"]}
    looked = {(r["host"], r["device"]) for r in again}  # a device the second look has no figure of stays as it was
    for r in first:
        key = (r["host"], r["device"])
        r["flagged"] = bool(r["flagged"] and (key in slow_again or key not in looked))


def _run_local(part: Partition, host: str | None, seconds: float) -> dict[str, dict[str, Any]]:
    me = local_host(part, host)
    return {me: preflight_node(me, gpu=not part.is_cpu, budget_s=seconds)}


def _look_again_local(part: Partition, host: str, seconds: float) -> dict[str, dict[str, Any]]:
    """The second look at this machine: a fresh process (nothing of the first look's process state carries over)."""
    with tempfile.TemporaryDirectory(prefix="sbench-preflight-") as out:
        proc = subprocess.run([sys.executable, "-m", "harness.runner.preflight", "--out-dir", out, "--host", host,
                               "--seconds", f"{seconds:g}", "--look", "2", *(["--cpu"] if part.is_cpu else [])],
                              env=runner_env(), capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        try:
            return {host: safefile.read_json(Path(out) / f"preflight.{host}.json", Path(out), safefile.RUNNER_MAX)}
        except (OSError, ValueError):
            raise RunnerError(f"preflight: the second look at {host} wrote nothing (exit {proc.returncode}): "
                              f"{proc.stderr.strip()[-500:]}") from None


def _run_slurm(inv: Inventory, part: Partition, workdir: Path, seconds: float, slurm: Slurm | None,
               hosts: list[str] | None = None, look: int = 1) -> dict[str, dict[str, Any]]:
    opts = [f"--partition={part.slurm_partition}", *([] if part.is_cpu else [f"--gpus-per-node={part.gpus_per_node}"]),
            *([f"--account={part.account}"] if part.account else []), *([f"--qos={part.qos}"] if part.qos else [])]
    return on_each_host("preflight", sorted(hosts or part.hosts), opts, part.python or inv.python or sys.executable,
                        ["--seconds", f"{seconds:g}", "--look", str(look), *(["--cpu"] if part.is_cpu else [])],
                        workdir, slurm)


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
    rows = rank_devices(docs, pid, inv.cluster, part.name, threshold)
    res = PreflightResult(pid, part.name, rows, missing=sorted(set(part.hosts) - set(docs)) if on_slurm else [])
    looked_slow = sorted({r["host"] for r in rows if r["flagged"]})
    if looked_slow:
        # the second look measures every host again, together as the first did, and ranks them among themselves:
        # a host measured alone would have the cores to itself and look faster than the first look's median
        time.sleep(PREFLIGHT_SECOND_LOOK_PAUSE_S)
        docs2 = (_run_slurm(inv, part, workdir, seconds, slurm, hosts=sorted(docs), look=2) if on_slurm
                 else _look_again_local(part, looked_slow[0], seconds))
        res.again = rank_devices(docs2, f"{pid}-again", inv.cluster, part.name, threshold)
        confirm(rows, res.again)
    return res


# -- sbench submit --preflight: the gate before anything is submitted -------------------------------------------
def check_fabric(inv: Inventory, points: list[PlannedPoint], workdir: Path, db: DbTarget, runner: JobRunner,
                 fabric: Callable[..., FabricResult] = run_fabric) -> list[dict[str, Any]]:
    """``--preflight``: one fabric job per partition and node count of the sweep's multi-node points,
    before anything is submitted. Refuses (SubmitError) when one fails, or when RoCE points would run
    over Socket. Each fabric run lands in the ``fabric`` table."""
    shapes: dict[tuple[str, int], bool] = {}
    for p in points:
        n = int(p.entity.get("number_nodes") or 1)
        if p.valid and n > 1:
            shapes[(p.partition, n)] = shapes.get((p.partition, n), False) or bool(p.entity.get("enable_roce"))
    out = []
    for (part, n), roce in sorted(shapes.items()):
        res = fabric(inv, part, n, workdir, runner, roce=True if roce else None)
        try:
            with open_store(db) as st:
                record_fabric(st, res.rows)
        except SbenchError:  # a busy or foreign DB must not hide the verdict; the job dir keeps the files
            pass
        out.append({"partition": part, "nodes": n, "fabric_id": res.fabric_id, "ok": res.ok,
                    "transports": res.transports})
        if not res.ok:
            raise SubmitError(f"preflight: fabric on partition {part} over {n} nodes failed: {res.reason}; "
                              f"nothing was submitted (job dir {res.job_dir})")
        if roce and res.socket_hosts:
            raise SubmitError(f"preflight: RoCE points on partition {part} over {n} nodes would run over Socket "
                              f"(NCCL chose Socket on {', '.join(res.socket_hosts)}); check the hosts' roce: HCAs and "
                              f"GID index (sbench probe), nothing was submitted")
    return out


def check_devices(inv: Inventory, points: list[PlannedPoint], on_nodes: bool, workdir: Path, db: DbTarget,
                  exclude_slow: bool, slurm: Slurm) -> tuple[list[dict[str, Any]], list[str]]:
    """``--preflight``: each device of the valid points' partitions measured (:func:`run_preflight`), before
    anything is submitted. A slow device refuses the submission (SubmitError), or with ``--exclude-slow`` its host
    is left out of every request. Returns each partition's check and the hosts to leave out."""
    out: list[dict[str, Any]] = []
    slow: list[str] = []
    for part in sorted({p.partition for p in points if p.valid}):
        res = run_preflight(inv, part, on_nodes, workdir, slurm=slurm)
        try:
            with open_store(db) as st:
                record_preflight(st, res.recorded)
        except SbenchError:  # a busy or foreign DB must not hide the verdict
            pass
        out.append({"partition": part, "preflight_id": res.preflight_id, "slow_hosts": res.slow_hosts,
                    "missing": res.missing, "summary": res.summary()})
        if res.slow and not exclude_slow:
            raise SubmitError(f"preflight: {res.summary()}\nnothing was submitted; --exclude-slow leaves "
                              f"{', '.join(res.slow_hosts)} out (sbatch --exclude), or drain it")
        slow += res.slow_hosts
    return out, sorted(set(slow))
