"""The executor backends by name: ``local`` and ``slurm`` (``auto`` picks one), and what they say about
attempts right now."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.build.jobspec import JobSpec
from harness.cluster.fit import ClusterFit
from harness.contract import jobstate
from harness.contract.errors import InputError, SubmitError
from harness.contract.paths import JobPaths
from harness.slurm.client import Slurm
from harness.spec.inventory import Inventory
from harness.spec.plan import PlannedPoint
from harness.spec.sweep import Sweep

from .base import Backend, SubmitOptions
from .local import LocalBackend
from .slurm import SlurmBackend

# Each makes its backend for one command, with that command's scheduler client.
BACKENDS: dict[str, Callable[[Slurm], Backend]] = {"local": lambda slurm: LocalBackend(), "slurm": SlurmBackend}


def resolve_executor(name: str) -> str:
    """``auto`` means SLURM when ``sbatch`` is on PATH, else the local executor."""
    if name == "auto":
        return "slurm" if shutil.which("sbatch") else "local"
    if name not in BACKENDS:
        raise InputError(f"unknown executor {name!r}; use auto, {', '.join(BACKENDS)}")
    if name == "slurm" and not shutil.which("sbatch"):
        raise SubmitError("executor slurm: sbatch is not on PATH; run on a SLURM login node or use --executor local")
    return name


def recorded_or(asked: str, recorded: str | None) -> str:
    """The executor a command on an existing campaign uses: the one *asked* for, unless that is ``auto`` and
    the campaign recorded the one it was submitted with."""
    return recorded if asked == "auto" and recorded else asked


def get_backend(name: str, slurm: Slurm) -> Backend:
    return BACKENDS[resolve_executor(name)](slurm)


@dataclass
class OneJob:
    """A backend as a check of the cluster uses it (``harness.cluster.fabric.JobRunner``): one job, to its end."""

    backend: Backend

    def fit(self, inv: Inventory, sweep: Sweep, points: list[PlannedPoint]) -> ClusterFit:
        return self.backend.fit(inv, sweep, points)

    def run(self, out: Path, spec: JobSpec) -> None:
        self.backend.check([spec])
        self.backend.wait(self.backend.submit(out, [spec], SubmitOptions()))


def job_runner(name: str, slurm: Slurm) -> OneJob:
    return OneJob(get_backend(name, slurm))


def live_states(attempts: Sequence[Mapping[str, Any]], slurm: Slurm) -> dict[str, str]:
    """Keyed by job_dir: the scheduler's current word on each attempt."""
    out: dict[str, str] = {}
    for executor in ("slurm", "local"):
        group = [a for a in attempts if a.get("executor") == executor]
        if not group:
            continue
        try:
            backend = get_backend(executor, slurm)
        except Exception:  # noqa: BLE001 - no sbatch here: the scheduler cannot be asked
            continue
        states = backend.live_states(group)
        for a in group:
            key = a.get("job_dir") if executor == "local" or not a.get("job_id") else str(a.get("job_id"))
            if key in states:
                out[a["job_dir"]] = waiting_in_pack(a, states[key])
    return out


def waiting_in_pack(attempt: Mapping[str, Any], state: str) -> str:
    """A point of a SLURM pack (``slurm.pack``) that its running pack has not started yet is pending."""
    if attempt.get("executor") == "slurm" and attempt.get("pack_size") and jobstate.lookup(state).phase == "running" \
            and attempt.get("job_dir") and not JobPaths(attempt["job_dir"]).stage_hosts():
        return "PENDING"
    return state
