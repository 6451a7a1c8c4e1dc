"""SLURM submission: one job array per resource shape, submitted through submitit.

Each array task runs one point's own ``job.sbatch`` (the file ``render``
wrote), so what was rendered is exactly what runs; the array script only adds
``--array`` and picks the job directory for ``$SLURM_ARRAY_TASK_ID``
(``harness.build.sbatch.array_sbatch``).
submitit does the submission, parses the job id and watches the jobs' states.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import SlurmJob

from harness.build.jobspec import JobSpec
from harness.build.sbatch import array_sbatch
from harness.contract import jobstate
from harness.contract.errors import SubmitError

from .executors import SubmitOptions, Submitted
from .manifest import now_iso, write_submitted


class ScriptExecutor(submitit.SlurmExecutor):
    """submitit's SLURM executor submitting a script we rendered instead of its pickling wrapper."""

    def __init__(self, folder: Path, script: str, hold: bool = False, after: str | None = None) -> None:
        super().__init__(folder=folder)
        submitit.core.utils.JobPaths.get_first_id_independent_folder(self.folder).mkdir(parents=True, exist_ok=True)
        self._script = script
        self._hold = hold
        self._after = after

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["sbatch", *(["--hold"] if self._hold else []),
                *([f"--dependency=afterok:{self._after}", "--kill-on-invalid-dep=yes"] if self._after else []),
                str(submission_file_path)]

    def submit_script(self) -> SlurmJob:
        try:
            return self._submit_command("")
        except subprocess.CalledProcessError as exc:  # raised by submitit's CommandFunction
            raise SubmitError(f"sbatch refused the submission: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - submitit wraps sbatch failures in several types
            raise SubmitError(f"sbatch failed: {exc}") from None


def group_by_shape(specs: list[JobSpec]) -> list[list[JobSpec]]:
    groups: dict[tuple, list[JobSpec]] = {}
    for s in specs:
        groups.setdefault(s.shape(), []).append(s)
    return list(groups.values())


class SlurmBackend:
    name = "slurm"

    def __init__(self) -> None:
        self.sbatch_calls = 0

    def check(self, specs: list[JobSpec]) -> None:
        """Nothing beyond what plan and render checked: SLURM places multi-node points itself."""

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]:
        folder = campaign_dir / ".submitit"
        logs = campaign_dir / ".slurm"
        logs.mkdir(parents=True, exist_ok=True)
        out: list[Submitted] = []
        for group in group_by_shape(specs):
            if len(group) == 1:
                script = Path(group[0].job_dir, "job.sbatch").read_text()
            else:
                script = array_sbatch(group[0].campaign, group, opts.max_parallel, logs)
            job = ScriptExecutor(folder, script, hold=opts.hold, after=opts.dependency).submit_script()
            self.sbatch_calls += 1
            stamp = now_iso()
            if len(group) == 1:
                subs = [Submitted(spec=group[0], job_id=str(job.job_id))]
            else:
                subs = [Submitted(spec=s, job_id=f"{job.job_id}_{i}", array_job_id=str(job.job_id), array_task_id=i)
                        for i, s in enumerate(group)]
            for sub in subs:
                write_submitted(Path(sub.spec.job_dir), {
                    "executor": "slurm", "job_id": sub.job_id, "array_job_id": sub.array_job_id,
                    "array_task_id": sub.array_task_id, "submitted_at": stamp, "held": opts.hold})
            out.extend(subs)
        return out

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None:
        ids = [s.job_id for s in submitted if s.job_id]
        total = len(ids)
        while True:
            states = self.live_states([{"job_id": i} for i in ids])
            done = sum(1 for i in ids if jobstate.is_done(states.get(i)))
            if progress:
                progress(done, total)
            if done >= total:
                return
            time.sleep(2.0)

    def cancel(self, attempts: list[dict[str, Any]]) -> list[str]:
        ids = sorted({str(a["job_id"]) for a in attempts if a.get("job_id")})
        if not ids:
            return []
        proc = subprocess.run(["scancel", *ids], capture_output=True, text=True)
        if proc.returncode != 0 and proc.stderr.strip():
            raise SubmitError(f"scancel failed: {proc.stderr.strip()}")
        return ids

    def live_states(self, attempts: list[dict[str, Any]]) -> dict[str, str]:
        """Job id -> SLURM state, from squeue for live jobs and sacct for finished ones."""
        ids = [str(a["job_id"]) for a in attempts if a.get("job_id")]
        return query_states(ids)


def query_states(ids: list[str]) -> dict[str, str]:
    if not ids:
        return {}
    states: dict[str, str] = {}
    sq = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ",".join(sorted({i.split("_")[0] for i in ids}))],
                        capture_output=True, text=True)
    if sq.returncode == 0:
        for line in sq.stdout.splitlines():
            jid, state, reason = (line.split("|") + ["", ""])[:3]
            states[jid.strip()] = state.strip() + (f" ({reason.strip()})" if state.strip() == "PENDING" else "")
    missing = [i for i in ids if i not in states]
    if missing:
        sa = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j",
                             ",".join(sorted({i.split("_")[0] for i in missing}))], capture_output=True, text=True)
        if sa.returncode == 0:
            for line in sa.stdout.splitlines():
                parts = line.split("|")
                if len(parts) >= 2:
                    states.setdefault(parts[0].strip(), parts[1].split()[0] if parts[1].strip() else "")
    return {i: states[i] for i in ids if i in states}
