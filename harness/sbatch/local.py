"""The local executor: submitit's LocalExecutor on this machine, through a small queue.

submitit starts every local job at once; a benchmark on one machine must not
run its points concurrently unless asked, so a queue feeds submitit at most
``max_parallel`` jobs at a time. With ``--wait`` the queue runs in the
foreground; otherwise a detached queue process runs it and sbench returns.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import submitit

from ..errors import SubmitError
from ..jobspec import JobSpec
from ..paths import JobPaths
from .executors import SubmitOptions, Submitted, register
from .manifest import now_iso, write_submitted

QUEUE_DIR = ".local"


def slurm_time_minutes(text: str) -> float:
    """SLURM time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in minutes."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(p) for p in text.split(":")] + [0, 0]
        h, m, s = parts[0], parts[1], parts[2]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts[0], parts[1], parts[2]
    return days * 1440 + h * 60 + m + s / 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalLaunch:
    """What submitit runs: this job dir's launch.sh as the one node of the allocation."""

    job_dir: str
    host: str

    def __call__(self) -> int:
        paths = JobPaths(self.job_dir)
        env = dict(os.environ)
        env["SBENCH_HOST"] = self.host
        env["SBENCH_MAIN_PORT"] = str(free_port())
        job_id = os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getppid())
        if not env.get("CUDA_VISIBLE_DEVICES"):
            env.pop("CUDA_VISIBLE_DEVICES", None)  # submitit sets "" when no GPUs were asked for
        with paths.slurm_out(f"local-{job_id}").open("ab") as out:
            proc = subprocess.Popen(["bash", str(paths.launch)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            _update_submitted(paths, {"pid": proc.pid, "started_at": now_iso()})

            def forward(signum, _frame):  # noqa: ANN001 - signal handler signature
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
                signal.signal(sig, forward)
            rc = proc.wait()
        _update_submitted(paths, {"exit_code": rc, "ended_at": now_iso()})
        if rc != 0:
            raise RuntimeError(f"launch.sh exited with {rc}; see {self.job_dir}")
        return rc


def _update_submitted(paths: JobPaths, fields: dict) -> None:
    try:
        info = json.loads(paths.submitted.read_text())
    except (OSError, ValueError):
        info = {}
    info.update(fields)
    write_submitted(paths.root, info)


def local_host(spec: JobSpec) -> str:
    """The inventory host that stands for this machine."""
    me = socket.gethostname().split(".")[0]
    return me if me in spec.host_env else sorted(spec.host_env)[0]


def run_queue(queue_file: Path, progress: Callable[[int, int], None] | None = None) -> int:
    """Run the queued job dirs through submitit's LocalExecutor, at most max_parallel at a time."""
    q = json.loads(queue_file.read_text())
    folder = Path(q["submitit_folder"])
    max_parallel = max(1, int(q.get("max_parallel") or 1))
    pending = list(q["jobs"])
    total = len(pending)
    running: list[tuple[dict, submitit.local.local.LocalJob]] = []
    failed = 0
    executor = submitit.LocalExecutor(folder=folder)
    stop = {"now": False}

    def on_term(signum, _frame):  # noqa: ANN001
        stop["now"] = True
        for item, _job in running:
            kill_launch(item["job_dir"])

    signal.signal(signal.SIGTERM, on_term)
    if progress:
        progress(0, total)
    while (pending and not stop["now"]) or running:
        while pending and len(running) < max_parallel and not stop["now"]:
            item = pending.pop(0)
            executor.update_parameters(timeout_min=item["timeout_min"], gpus_per_node=item["gpus"])
            job = executor.submit(LocalLaunch(item["job_dir"], item["host"]))
            _update_submitted(JobPaths(item["job_dir"]), {"job_id": job.job_id, "queued_at": q["created_at"]})
            running.append((item, job))
        time.sleep(0.3)
        still = []
        for item, job in running:
            if job.done():
                try:
                    job.result()
                except Exception:  # noqa: BLE001 - the job's files hold the real outcome
                    failed += 1
            else:
                still.append((item, job))
        running = still
        if progress:
            progress(total - len(pending) - len(running), total)
    for item in pending:  # cancelled before they started
        _update_submitted(JobPaths(item["job_dir"]), {"cancelled_at": now_iso(), "state": "CANCELLED"})
    return failed


def kill_launch(job_dir: str) -> bool:
    """SIGTERM the process group of a running local launch.sh (the node runner records the cancel)."""
    try:
        info = json.loads(JobPaths(job_dir).submitted.read_text())
        os.killpg(int(info["pid"]), signal.SIGTERM)
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


@register("local")
class LocalBackend:
    name = "local"

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]:
        multi = [s.point_id for s in specs if s.num_machines > 1]
        if multi:
            raise SubmitError(f"the local executor runs on one machine; {len(multi)} point(s) need several nodes "
                              f"(e.g. {multi[0]}); use --executor slurm or number_nodes: 1")
        qdir = campaign_dir / QUEUE_DIR
        qdir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
        queue = {
            "created_at": now_iso(),
            "submitit_folder": str(qdir / "submitit"),
            "max_parallel": opts.max_parallel or 1,
            "jobs": [{"job_dir": s.job_dir, "host": local_host(s),
                      "timeout_min": slurm_time_minutes(str(s.resources.get("time", "01:00:00"))),
                      "gpus": 0 if s.cpu_partition else s.processes_per_node} for s in specs],
        }
        qfile = qdir / f"queue-{stamp}.json"
        qfile.write_text(json.dumps(queue, indent=2))
        out = []
        for s in specs:
            write_submitted(Path(s.job_dir), {"executor": "local", "job_id": None, "queue": str(qfile),
                                              "submitted_at": now_iso()})
            out.append(Submitted(spec=s, job_id=None, extra={"queue": str(qfile)}))
        if not opts.wait:
            log = (qdir / f"queue-{stamp}.log").open("ab")
            proc = subprocess.Popen([sys.executable, "-m", "harness.sbatch.local", str(qfile)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            (qdir / f"queue-{stamp}.pid").write_text(str(proc.pid))
        self._queue = qfile
        return out

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None:
        queues = sorted({s.extra["queue"] for s in submitted if s.extra.get("queue")})
        for q in queues:
            pidfile = Path(q).with_suffix(".pid")
            if pidfile.exists():  # a detached queue runs it: wait for its jobs' files
                _wait_files([s for s in submitted if s.extra.get("queue") == q], progress)
            else:
                run_queue(Path(q), progress)

    def cancel(self, attempts: list[dict]) -> list[str]:
        """Stop the detached queues that feed these attempts, then the attempts' running launches."""
        queues = {a.get("queue") for a in attempts if a.get("queue")}
        for q in queues:
            pidfile = Path(q).with_suffix(".pid")
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        done = []
        for a in attempts:
            if kill_launch(a["job_dir"]) or a.get("queue"):
                done.append(a["job_dir"])
        return done

    def live_states(self, attempts: list[dict]) -> dict[str, str]:
        """RUNNING / PENDING / done, from submitted.json and whether the launch process lives."""
        out = {}
        for a in attempts:
            try:
                info = json.loads(JobPaths(a["job_dir"]).submitted.read_text())
            except (OSError, ValueError):
                continue
            if info.get("ended_at"):
                out[a["job_dir"]] = "COMPLETED" if info.get("exit_code") == 0 else "FAILED"
            elif info.get("cancelled_at"):
                out[a["job_dir"]] = "CANCELLED"
            elif info.get("pid"):
                try:
                    os.kill(int(info["pid"]), 0)
                    out[a["job_dir"]] = "RUNNING"
                except OSError:
                    out[a["job_dir"]] = "LOST"
            else:
                out[a["job_dir"]] = "PENDING"
        return out


def _wait_files(submitted: list[Submitted], progress: Callable[[int, int], None] | None) -> None:
    total = len(submitted)
    while True:
        done = 0
        for s in submitted:
            try:
                info = json.loads(JobPaths(s.spec.job_dir).submitted.read_text())
            except (OSError, ValueError):
                info = {}
            done += bool(info.get("ended_at") or info.get("cancelled_at"))
        if progress:
            progress(done, total)
        if done >= total:
            return
        time.sleep(1.0)


if __name__ == "__main__":  # the detached queue process
    sys.exit(1 if run_queue(Path(sys.argv[1])) < 0 else 0)
