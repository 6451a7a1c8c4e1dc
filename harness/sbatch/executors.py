"""What every executor backend offers (``backends`` names them): submit, wait, cancel, and its word on attempts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.build.jobspec import JobSpec
from harness.contract.records import AttemptExtra


@dataclass
class Submitted:
    """One attempt handed to a scheduler."""

    spec: JobSpec
    job_id: str | None
    array_job_id: str | None = None
    array_task_id: int | None = None
    extra: AttemptExtra = field(default_factory=lambda: AttemptExtra())  # what its manifest line adds


@dataclass
class SubmitOptions:
    max_parallel: int | None = None
    hold: bool = False
    dependency: str | None = None  # a SLURM job id every submitted job waits for (afterok)
    qos: str | None = None  # the QOS the jobs ask for: its submit limits count (harness.slurm.limits)
    feeder_script: str | None = None  # the feeder job of what the submit quota holds back (harness.sbatch.feed)
    reasons: dict[str, str] = field(default_factory=dict)  # job dir -> why it is submitted (new, retry, force)
    pack: int | str = 1  # the sweep's slurm.pack: points per allocation (harness.sbatch.pack)
    pack_time_limit: str | None = None  # the partition's time limit, which a pack's time stays within
    requeue_command: str | None = None  # the shell function a SLURM pack calls after an OOM


class Backend(Protocol):
    name: str

    def check(self, specs: list[JobSpec]) -> None: ...

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]: ...

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None: ...

    def cancel(self, attempts: Sequence[Mapping[str, Any]]) -> list[str]: ...

    def live_states(self, attempts: Sequence[Mapping[str, Any]]) -> dict[str, str]: ...


