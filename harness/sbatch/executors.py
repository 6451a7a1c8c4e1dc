"""Executor backends behind a small registry: ``local`` and ``slurm`` (``auto`` picks one)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.build.jobspec import JobSpec
from harness.contract.errors import InputError, SubmitError


@dataclass
class Submitted:
    """One attempt handed to a scheduler."""

    spec: JobSpec
    job_id: str | None
    array_job_id: str | None = None
    array_task_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SubmitOptions:
    max_parallel: int | None = None
    hold: bool = False
    wait: bool = False
    dependency: str | None = None  # a SLURM job id every submitted job waits for (afterok)


class Backend(Protocol):
    name: str

    def check(self, specs: list[JobSpec]) -> None: ...

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]: ...

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None: ...

    def cancel(self, attempts: list[dict[str, Any]]) -> list[str]: ...

    def live_states(self, attempts: list[dict[str, Any]]) -> dict[str, str]: ...


_REGISTRY: dict[str, Callable[[], Backend]] = {}


def register(name: str) -> Callable[[Callable[[], Backend]], Callable[[], Backend]]:
    def deco(factory: Callable[[], Backend]) -> Callable[[], Backend]:
        _REGISTRY[name] = factory
        return factory

    return deco


def resolve_executor(name: str) -> str:
    """``auto`` means SLURM when ``sbatch`` is on PATH, else the local executor."""
    if name == "auto":
        return "slurm" if shutil.which("sbatch") else "local"
    if name not in ("slurm", "local"):
        raise InputError(f"unknown executor {name!r}; use auto, slurm or local")
    if name == "slurm" and not shutil.which("sbatch"):
        raise SubmitError("executor slurm: sbatch is not on PATH; run on a SLURM login node or use --executor local")
    return name


def get_backend(name: str) -> Backend:
    from . import local, slurm  # noqa: F401 - registers the backends

    return _REGISTRY[resolve_executor(name)]()
