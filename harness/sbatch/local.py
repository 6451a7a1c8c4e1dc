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

import psutil
import submitit

from harness.build.jobspec import JobSpec
from harness.contract import envvars, safefile
from harness.contract.errors import InputError
from harness.contract.paths import JobPaths
from harness.runner import pdeath
from harness.spec.schema import slurm_time_minutes

from .executors import SubmitOptions, Submitted
from .manifest import now_iso, read_submitted, write_submitted

QUEUE_DIR = ".local"
NO_LIMIT_MIN = 365 * 24 * 60  # submitit's local timeout for a time limit of UNLIMITED


def timeout_minutes(time_text: str) -> float:
    minutes = slurm_time_minutes(time_text)
    return NO_LIMIT_MIN if minutes is None else max(minutes, 1.0)


def identity(pid: int, needle: str) -> dict:
    """What makes a process ours beyond its pid: start time and a string its command line holds (the
    pid survives ``exec``, so the command line may be any of wrapper, bash or node runner)."""
    try:
        ct = psutil.Process(pid).create_time()
    except psutil.Error:
        ct = None
    return {"pid": pid, "create_time": ct, "needle": needle}


def verified(ident: dict | None) -> psutil.Process | None:
    """The process *ident* recorded, if that very process still runs; None for a pid now used by
    another process (or none at all)."""
    if not isinstance(ident, dict):
        return None
    try:
        proc = psutil.Process(int(ident["pid"]))
        if ident.get("create_time") is None or abs(proc.create_time() - float(ident["create_time"])) > 0.05:
            return None
        if str(ident.get("needle") or "\0") not in " ".join(proc.cmdline()):
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


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
        env[envvars.HOST.name] = self.host
        env[envvars.MAIN_PORT.name] = str(free_port())
        job_id = os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getppid())
        if not env.get("CUDA_VISIBLE_DEVICES"):
            env.pop("CUDA_VISIBLE_DEVICES", None)  # submitit sets "" when no GPUs were asked for
        with paths.slurm_out(f"local-{job_id}").open("ab") as out:
            # launch.sh in a session of its own (cancel signals the group), bound to this process by a
            # parent-death signal: killing the local job process stops the node runner and its training.
            proc = subprocess.Popen(pdeath.wrap(["bash", str(paths.launch)]), env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            _update_submitted(paths, {"pid": proc.pid, "process": identity(proc.pid, str(paths.root)),
                                      "started_at": now_iso()})

            def forward(signum, _frame):  # noqa: ANN001 - signal handler signature
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
                signal.signal(sig, forward)
            rc = proc.wait()
        fields = {"exit_code": rc, "ended_at": now_iso()}
        if rc < 0:
            fields["exit_signal"] = -rc
        elif rc > 128:
            fields["exit_signal"] = rc - 128
        _update_submitted(paths, fields)
        if rc != 0:
            raise RuntimeError(f"launch.sh exited with {rc}; see {self.job_dir}")
        return rc


def _update_submitted(paths: JobPaths, fields: dict) -> None:
    info = read_submitted(paths.root)
    info.update(fields)
    write_submitted(paths.root, info)


def local_host(spec: JobSpec) -> str:
    """The inventory host that stands for this machine."""
    me = socket.gethostname().split(".")[0]
    return me if me in spec.host_env else sorted(spec.host_env)[0]


def run_queue(queue_file: Path, progress: Callable[[int, int], None] | None = None) -> int:
    """Run the queued job dirs through submitit's LocalExecutor, at most max_parallel at a time."""
    q = safefile.read_json(queue_file, queue_file.parent, safefile.SMALL_MAX)
    folder = Path(q["submitit_folder"])
    max_parallel = max(1, int(q.get("max_parallel") or 1))
    pending = list(q["jobs"])
    total = len(pending)
    running: list[tuple[dict, submitit.Job]] = []
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
    """SIGTERM the process group of a running local launch.sh (the node runner records the cancel),
    only once the recorded process is verified to be that launch (start time and command line)."""
    proc = verified(read_submitted(job_dir).get("process"))
    if proc is None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return True
    except OSError:
        return False


class LocalBackend:
    name = "local"

    def check(self, specs: list[JobSpec]) -> None:
        """Refuse, before anything is written, what this executor cannot run."""
        multi = [s.point_id for s in specs if s.num_machines > 1]
        if multi:
            raise InputError(f"the local executor runs on one machine; {len(multi)} point(s) need several nodes "
                             f"(e.g. {multi[0]}); use --executor slurm or number_nodes: 1")

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]:
        self.check(specs)
        qdir = campaign_dir / QUEUE_DIR
        qdir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
        queue = {
            "created_at": now_iso(),
            "submitit_folder": str(qdir / "submitit"),
            "max_parallel": opts.max_parallel or 1,
            "jobs": [{"job_dir": s.job_dir, "host": local_host(s),
                      "timeout_min": timeout_minutes(str(s.resources.get("time", "01:00:00"))),
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
            (qdir / f"queue-{stamp}.pid").write_text(json.dumps(identity(proc.pid, str(qfile))))
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
        queues = {(str(a["queue"]), str(Path(a["job_dir"]).parent)) for a in attempts if a.get("queue")}
        for q, campaign_dir in sorted(queues):
            pidfile = Path(q).with_suffix(".pid")
            try:  # the queue's files lie in its campaign directory
                safefile.check_dir(pidfile.parent, campaign_dir)
                ident = safefile.read_json(pidfile, campaign_dir, safefile.SMALL_MAX)
            except (OSError, ValueError):
                continue
            proc = verified(ident)  # never signal a pid that now belongs to another process
            if proc is not None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except psutil.Error:
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
            info = read_submitted(a["job_dir"])
            if not info:
                continue
            if info.get("ended_at"):
                out[a["job_dir"]] = "COMPLETED" if info.get("exit_code") == 0 else (
                "CANCELLED" if info.get("cancelled_at") else "FAILED")
            elif info.get("cancelled_at"):
                out[a["job_dir"]] = "CANCELLED"
            elif info.get("pid"):
                out[a["job_dir"]] = "RUNNING" if verified(info.get("process")) is not None else "LOST"
            else:
                out[a["job_dir"]] = "PENDING"
        return out


def _wait_files(submitted: list[Submitted], progress: Callable[[int, int], None] | None) -> None:
    total = len(submitted)
    while True:
        done = 0
        for s in submitted:
            info = read_submitted(s.spec.job_dir)
            done += bool(info.get("ended_at") or info.get("cancelled_at"))
        if progress:
            progress(done, total)
        if done >= total:
            return
        time.sleep(1.0)


if __name__ == "__main__":  # the detached queue process
    sys.exit(1 if run_queue(Path(sys.argv[1])) < 0 else 0)
