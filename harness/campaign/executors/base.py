"""What every executor backend offers (``backends`` names them): submit, wait, cancel, its word on attempts, and
the answers a submission asks of its executor (:class:`Backend`); a caller asks the backend, never its name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.build.jobspec import JobSpec
from harness.cluster.fit import ClusterFit
from harness.contract.records import AttemptExtra
from harness.spec.inventory import Inventory
from harness.spec.plan import PlannedPoint
from harness.spec.sweep import Sweep


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
    # the feeder job of what the submit quota holds back (harness.campaign.executors.feed)
    feeder_script: str | None = None
    feeder_module: str | None = None  # the module the feeder job runs, where not feed (a search's: its caller names it)
    reasons: dict[str, str] = field(default_factory=dict)  # job dir -> why it is submitted (new, retry, force)
    pack: int | str = 1  # the sweep's slurm.pack: points per allocation (harness.campaign.executors.pack)
    pack_time_limit: str | None = None  # the partition's time limit, which a pack's time stays within
    requeue_command: str | None = None  # the shell function a SLURM pack calls after an OOM
    # a search campaign (search:): its results database; on SLURM its feeder job goes on with the search
    # (harness.campaign.searchfeed) until it is over, with nothing held back too
    search_db: str | None = None


class Backend(Protocol):
    name: str  # what the manifest and the report call it
    sbatch_calls: int  # how many times it ran sbatch for this command
    on_nodes: bool  # its jobs run on the scheduler's nodes: a check of them (preflight) runs there through srun

    def check(self, specs: list[JobSpec]) -> None:
        """Refuse, before anything is written, what this executor cannot run."""

    def fit(self, inv: Inventory, sweep: Sweep, points: list[PlannedPoint]) -> ClusterFit:
        """What the cluster says of the points' partition: the nodes to keep out of their requests, and what
        does not fit (an empty fit where no scheduler places the jobs)."""

    def complete(self, opts: SubmitOptions, sweep: Sweep, inv: Inventory, campaign_dir: Path) -> SubmitOptions:
        """*opts* with what this executor adds for the campaign's submission (the SLURM feeder job's script,
        the command a pack runs to put its points back in the queue)."""

    def live_prepare_job(self, campaign_dir: Path) -> str | None:
        """The campaign's preparation job while it is queued or running (the arrays then depend on it)."""

    def prepare_job(self, sweep: Sweep, inv: Inventory, sweep_path: Path, inventory_path: Path | None,
                    model_map: Path | None, campaign_dir: Path) -> str:
        """Submit a job that prepares what the points read (``--prepare-on slurm``) and record it; its job id.
        :class:`~harness.contract.errors.InputError` where the executor runs no such job."""

    def feed_summary(self, campaign_dir: Path) -> dict[str, Any]:
        """What this executor still holds back of the campaign and feeds in waves ({} when nothing)."""

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]: ...

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None: ...

    def cancel(self, attempts: Sequence[Mapping[str, Any]]) -> list[str]: ...

    def live_states(self, attempts: Sequence[Mapping[str, Any]]) -> dict[str, str]: ...


