"""The local executor: submitit's LocalExecutor on this machine, through a small detached queue.

submitit starts every local job at once; a benchmark on one machine must not run its points concurrently
unless asked, so a queue process feeds submitit at most ``max_parallel`` jobs at a time. The queue always
runs detached, in a session of its own: ``submit`` returns at once, or with ``--wait`` watches the jobs,
and a Ctrl-C of the submit stops only the watching (``sbench cancel`` stops the jobs).

Who writes what in ``submitted.json``, always under the job dir's lock (:func:`localjob.job_lock`), so that
each decides on what the others wrote:

- submit: ``executor``, ``job_id`` (None), ``queue``, ``submitted_at``;
- the queue, when it hands the job to submitit: ``job_id``, ``queued_at``; when it stops before starting
  it (a signal): ``not_started_at``, ``not_started_reason``;
- the launch: ``pid``, ``started_at``, then ``exit_code``, ``exit_signal``, ``ended_at``. It never starts a
  job that already has a ``pid`` or a ``cancelled_at``;
- cancel: ``cancelled_at``: a job not started yet is then never started.

Each launch and each queue process carries its token (:mod:`harness.slurm.localjob`); status, cancel and
collect trust a pid only when ``/proc/<pid>/environ`` carries it.

The queue waits for the line ``go`` on its stdin, which submit writes once the queue's pidfile and every
job's ``submitted.json`` exist. A submit stopped before that leaves a queue that marks its jobs not started
and exits, so nothing runs that the campaign's manifest may not name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from harness.build.jobspec import JobSpec
from harness.contract import envvars, jobstate, safefile
from harness.contract.errors import InputError, SbenchError
from harness.contract.paths import CampaignPaths, JobPaths
from harness.contract.poll import Backoff, poll_until
from harness.contract.records import (
    AttemptExtra,
    SubmittedInfo,
    now_iso,
    pack_extra,
    pack_info,
    read_submitted,
    write_submitted,
)
from harness.runner import pdeath
from harness.slurm import localjob
from harness.slurm.localjob import LAUNCH, QUEUE, SETTLED, job_lock, update_submitted
from harness.spec.inventory import Inventory
from harness.spec.plan import PlannedPoint

if TYPE_CHECKING:
    import submitit
from harness.cluster.fit import ClusterFit
from harness.spec.schema import slurm_time_minutes
from harness.spec.sweep import Sweep

from .base import SubmitOptions, Submitted
from .pack import ended_invalid, in_process, make_packs, not_needed_after_oom, requeued_locally

NO_LIMIT_MIN = 365 * 24 * 60  # submitit's local timeout for a time limit of UNLIMITED
GO = "go"
# Fields that settle a job before the queue starts it: it is never started after one of them.
# (first, cap) of the poller's pauses, in seconds (harness.contract.poll): --wait reads a few small files a look;
# the queue looks for a free slot
WAIT_POLL_S, QUEUE_POLL_S = (0.2, 5.0), (0.1, 1.0)


def timeout_minutes(time_text: str) -> float:
    minutes = slurm_time_minutes(time_text)
    return NO_LIMIT_MIN if minutes is None else max(minutes, 1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalLaunch:
    """What submitit runs: this job dir's launch.sh as the one node of the allocation."""

    job_dir: str
    host: str
    extra_env: dict[str, str] | None = None  # SBENCH_PACK for a pack in one training process

    def __call__(self) -> int:
        rc = self.run()
        if rc != 0:
            raise RuntimeError(f"launch.sh exited with {rc}; see {self.job_dir}")
        return rc

    def run(self) -> int:
        """Run launch.sh to its end (never twice, never once cancelled); its exit status."""
        paths = JobPaths(self.job_dir)
        env = dict(os.environ)
        env.update(localjob.environment(LAUNCH, self.job_dir))  # replaces the queue's token it inherited
        env[envvars.HOST.name] = self.host
        env[envvars.MAIN_PORT.name] = str(free_port())
        env.update(self.extra_env or {})
        job_id = os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getppid())
        if not env.get("CUDA_VISIBLE_DEVICES"):
            env.pop("CUDA_VISIBLE_DEVICES", None)  # submitit sets "" when no GPUs were asked for
        with paths.slurm_out(f"local-{job_id}").open("ab") as out:
            with job_lock(self.job_dir):
                info = read_submitted(self.job_dir)
                settled = [k for k in SETTLED if info.get(k)]
                if settled:  # cancelled before its turn, or started already: an attempt never runs twice
                    out.write(f"sbench: not starting {self.job_dir}: submitted.json has {settled[0]}\n".encode())
                    return 0
                # launch.sh in a session of its own (cancel signals the group), bound to this process by a
                # parent-death signal: killing the local job process stops the node runner and its training.
                proc = subprocess.Popen(pdeath.wrap(["bash", str(paths.launch)]), env=env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                info.update(SubmittedInfo(pid=proc.pid, started_at=now_iso()))
                write_submitted(paths.root, info)

            def forward(signum, _frame):  # noqa: ANN001 - signal handler signature
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
                signal.signal(sig, forward)
            rc = proc.wait()
        fields = SubmittedInfo(exit_code=rc, ended_at=now_iso())
        if rc < 0:
            fields["exit_signal"] = -rc
        elif rc > 128:
            fields["exit_signal"] = rc - 128
        update_submitted(self.job_dir, fields)
        return rc


@dataclass
class LocalPack:
    """What submitit runs for a pack (``slurm.pack``, :mod:`harness.campaign.executors.pack`). *in_process* (the sbench
    trainer): the first point's launch with ``SBENCH_PACK`` naming them all: its node runner trains every
    point in turn in one training process; the points it did not reach (a point before them did not end ok)
    are returned. Otherwise the points' launches one after another, each a :class:`LocalLaunch` with its own
    ``submitted.json``, pid and outcome (a point ``sbench cancel`` marked is skipped by its launch); after one
    ran out of GPU memory, the rest are returned. The queue runs what is returned as their own jobs."""

    launches: list[LocalLaunch]
    in_process: bool = False

    def __call__(self) -> list[str]:
        if self.in_process:
            return self._in_process()
        for k, launch in enumerate(self.launches):
            launch.run()
            rest = self.launches[k + 1:]
            if rest and ended_invalid(launch.job_dir):
                return [r.job_dir for r in rest]
        return []

    def _in_process(self) -> list[str]:
        lead, rest = self.launches[0], self.launches[1:]
        lead.extra_env = {envvars.PACK.name: json.dumps([x.job_dir for x in self.launches])}
        rc = lead.run()
        started = read_submitted(lead.job_dir).get("started_at")
        left = []
        for m in rest:  # each point the process reached ended with it; the others go back to the queue
            if JobPaths(m.job_dir).stage_hosts():
                update_submitted(m.job_dir, {"started_at": started, "ended_at": now_iso(), "exit_code": rc,
                                             "pack_lead": lead.job_dir}, unless=("ended_at", "cancelled_at"))
            else:
                left.append(m.job_dir)
        return left


def local_host(spec: JobSpec) -> str:
    """The inventory host that stands for this machine."""
    me = socket.gethostname().split(".")[0]
    return me if me in spec.host_env else sorted(spec.host_env)[0]


def _not_started(items: list[dict[str, Any]], reason: str) -> None:
    for item in items:
        update_submitted(item["job_dir"], {"not_started_at": now_iso(), "not_started_reason": reason}, unless=SETTLED)


def run_queue(queue_file: Path, handshake: IO[str] | None = None) -> int:
    """Run the queued job dirs through submitit's LocalExecutor, at most max_parallel at a time, once
    *handshake* (the queue's stdin) says ``go``. SIGTERM, SIGINT or SIGHUP stop it: the running launches are
    signalled (their runners record the signal), the jobs not started yet are marked not started, and the
    exit status is 128 + the signal."""
    # Its file lies in its campaign's CampaignPaths.local (one entry of a few hundred bytes per job).
    q = safefile.read_json(queue_file, CampaignPaths.of_queue(queue_file).root, safefile.MANIFEST_MAX)
    items: list[dict[str, Any]] = list(q["jobs"])
    stop: dict[str, int | None] = {"sig": None}

    def on_signal(signum, _frame):  # noqa: ANN001 - signal handler signature
        stop["sig"] = stop["sig"] or signum

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if handshake is not None and handshake.readline().strip() != GO:
        _not_started(items, "not started: the submit that queued it stopped before handing it over")
        return 1
    folder = Path(q["submitit_folder"])
    max_parallel = max(1, int(q.get("max_parallel") or 1))
    pending = list(items)
    running: list[tuple[dict[str, Any], submitit.Job[Any]]] = []
    signalled: set[str] = set()
    import submitit  # 0.1 s of imports that only the queue process needs, kept off every command's start-up

    executor = submitit.LocalExecutor(folder=folder)
    poll, ended = Backoff(*QUEUE_POLL_S), 0
    while (pending and stop["sig"] is None) or running:
        if stop["sig"] is not None:
            # A pack's points not started yet never start; a launch that has not recorded its pid yet is
            # signalled on a later turn, once it has.
            for i, _ in running:
                _not_started(i.get("pack") or [], f"not started: its local queue stopped on signal {stop['sig']}")
            signalled.update(d for i, _ in running for d in _dirs(i) if d not in signalled and kill_launch(d))
        while pending and len(running) < max_parallel and stop["sig"] is None:
            item = pending.pop(0)
            if item.get("pack"):
                job = _submit_pack(executor, item, q["created_at"])
                if job is not None:
                    running.append((item, job))
                continue
            with job_lock(item["job_dir"]):
                info = read_submitted(item["job_dir"])
                if any(info.get(k) for k in SETTLED):
                    continue  # cancelled before its turn
                executor.update_parameters(timeout_min=item["timeout_min"], gpus_per_node=item["gpus"])
                job = executor.submit(LocalLaunch(item["job_dir"], item["host"]))
                info.update(SubmittedInfo(job_id=job.job_id, queued_at=q["created_at"]))
                write_submitted(item["job_dir"], info)
            running.append((item, job))
        poll.pause()
        still = []
        for i, j in running:
            if not j.done():
                still.append((i, j))
            elif i.get("pack"):
                pending[:0] = _requeued(i, j)  # after an OOM: the rest of the pack, each its own job, first
        ended += len(running) - len(still)
        poll.saw(ended)
        running = still
    if stop["sig"] is not None:
        _not_started(pending, f"not started: its local queue stopped on signal {stop['sig']} first")
        return 128 + stop["sig"]
    return 0


def _dirs(item: dict[str, Any]) -> list[str]:
    return [m["job_dir"] for m in item["pack"]] if item.get("pack") else [item["job_dir"]]


def _submit_pack(executor: Any, item: dict[str, Any], queued_at: str) -> Any:
    """Hand a pack to submitit: its points not settled yet, one after another in one local job; None when
    nothing of it is left to run."""
    todo = []
    for m in item["pack"]:
        with job_lock(m["job_dir"]):
            if not any(read_submitted(m["job_dir"]).get(k) for k in SETTLED):
                todo.append(m)
    if not todo:
        return None
    executor.update_parameters(timeout_min=sum(m["timeout_min"] for m in todo), gpus_per_node=item["gpus"])
    job = executor.submit(LocalPack([LocalLaunch(m["job_dir"], m["host"]) for m in todo],
                                    in_process=bool(item.get("in_process"))))
    for m in todo:
        update_submitted(m["job_dir"], {"job_id": job.job_id, "queued_at": queued_at}, unless=SETTLED)
    return job


def _requeued(item: dict[str, Any], job: Any) -> list[dict[str, Any]]:
    """The points of a finished pack that go back to the queue as their own jobs (an OOM came before them)."""
    try:
        rest = {str(d) for d in not_needed_after_oom(job.result() or [])}  # (a search's scan skips some)
    except Exception:  # noqa: BLE001 - the pack's job failed as a whole: its points' files say how far it got
        return []
    out = []
    for m in item["pack"]:
        if m["job_dir"] in rest:
            update_submitted(m["job_dir"], {"job_id": None, "requeued_at": now_iso(), "pack": None}, unless=SETTLED)
            out.append({k: v for k, v in m.items() if k != "pack"})
    try:
        requeued_locally([Path(m["job_dir"]) for m in out])
    except SbenchError:
        pass  # the manifest cannot be written: the points still run; their reason stays the first one
    return out


def kill_launch(job_dir: str) -> bool:
    """SIGTERM the process group of a running local launch.sh (the node runner records the signal), only
    once the recorded pid is verified to be that launch (:func:`localjob.verified`: its token)."""
    proc = localjob.verified(read_submitted(job_dir).get("pid"), LAUNCH, job_dir)
    if proc is None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return True
    except OSError:
        return False


class LocalBackend:
    """This machine's executor: a detached queue feeding submitit's LocalExecutor. No scheduler places its jobs,
    it runs no preparation job and holds nothing back for later waves."""

    name = "local"
    sbatch_calls = 0
    on_nodes = False

    def check(self, specs: list[JobSpec]) -> None:
        """Refuse, before anything is written, what this executor cannot run."""
        multi = [s.point_id for s in specs if s.num_machines > 1]
        if multi:
            raise InputError(f"the local executor runs on one machine; {len(multi)} point(s) need several nodes "
                             f"(e.g. {multi[0]}); use --executor slurm or number_nodes: 1")

    def fit(self, inv: Inventory, sweep: Sweep, points: list[PlannedPoint]) -> ClusterFit:
        return ClusterFit()

    def complete(self, opts: SubmitOptions, sweep: Sweep, inv: Inventory, campaign_dir: Path) -> SubmitOptions:
        return opts

    def live_prepare_job(self, campaign_dir: Path) -> str | None:
        return None

    def prepare_job(self, sweep: Sweep, inv: Inventory, sweep_path: Path, inventory_path: Path | None,
                    model_map: Path | None, campaign_dir: Path) -> str:
        raise InputError("--prepare-on slurm needs the slurm executor; with the local executor prepare runs here")

    def feed_summary(self, campaign_dir: Path) -> dict[str, Any]:
        return {}

    def submit(self, campaign_dir: Path, specs: list[JobSpec], opts: SubmitOptions) -> list[Submitted]:
        self.check(specs)
        camp = CampaignPaths(campaign_dir)
        camp.local.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"

        def item(s: JobSpec) -> dict[str, Any]:
            return {"job_dir": s.job_dir, "host": local_host(s),
                    "timeout_min": timeout_minutes(str(s.resources.get("time", "01:00:00"))),
                    "gpus": 0 if s.cpu_partition else s.processes_per_node}

        packs = make_packs(specs, opts.pack, opts.pack_time_limit)
        pack_of = {s.job_dir: (k, p) for p in packs if len(p) > 1 for k, s in enumerate(p)}
        queue = {
            "created_at": now_iso(),
            "submitit_folder": str(camp.local_submitit),
            "max_parallel": opts.max_parallel or 1,
            "jobs": [{**item(p[0]), "pack": [item(s) for s in p], "in_process": in_process(p[0])} if len(p) > 1
                     else item(p[0]) for p in packs],
        }
        qfile = camp.queue(stamp)
        qfile.write_text(json.dumps(queue, indent=2))
        with camp.queue_log(stamp).open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "harness.campaign.executors.local", str(qfile)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.PIPE, start_new_session=True,
                                    env={**os.environ, **localjob.environment(QUEUE, qfile)})
        assert proc.stdin is not None
        try:
            CampaignPaths.queue_pidfile(qfile).write_text(json.dumps({"pid": proc.pid, "host": socket.gethostname(),
                                                           "started_at": now_iso()}))
            out = []
            for s in specs:
                k, p = pack_of.get(s.job_dir, (0, []))
                info = SubmittedInfo(executor="local", job_id=None, queue=str(qfile), submitted_at=now_iso())
                extra = AttemptExtra(queue=str(qfile))
                if p:
                    info["pack"] = pack_info([x.job_dir for x in p], k)
                    extra.update(pack_extra([x.job_dir for x in p], k))
                write_submitted(s.job_dir, info)
                out.append(Submitted(spec=s, job_id=None, extra=extra))
            proc.stdin.write(f"{GO}\n".encode())
        finally:
            proc.stdin.close()  # without "go" the queue marks its jobs not started and exits
        return out

    def wait(self, submitted: list[Submitted], progress: Callable[[int, int], None] | None = None) -> None:
        """Until every attempt is over: ended, cancelled, lost or not started (a queue that died cannot leave
        this waiting for ever)."""
        def over() -> int:
            states = self.live_states([{"job_dir": s.spec.job_dir} for s in submitted])
            return sum(1 for s in submitted if jobstate.is_done(states.get(s.spec.job_dir) or "NOT_STARTED"))

        poll_until(over, len(submitted), WAIT_POLL_S, progress)

    def cancel(self, attempts: Sequence[Mapping[str, Any]]) -> list[str]:
        """Stop the attempts' running launches and mark the others so that their queue never starts them;
        returns the job dirs that were running or waiting. A pid not verified as the launch's own is never
        signalled."""
        done = []
        for a in attempts:
            jd = str(a["job_dir"])
            with job_lock(jd):
                info = read_submitted(jd)
                if not info or info.get("ended_at") or info.get("cancelled_at"):
                    continue
                if info.get("pid"):
                    proc = localjob.verified(info["pid"], LAUNCH, jd)
                    if proc is None:
                        continue  # its process is gone (or was never ours): nothing to stop
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                    except OSError:
                        continue
                info["cancelled_at"] = now_iso()
                write_submitted(jd, info)
            done.append(jd)
        return done

    def live_states(self, attempts: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """Keyed by job dir: the state :func:`harness.slurm.localjob.job_state` gives each attempt."""
        out = {}
        for a in attempts:
            state = localjob.job_state(a["job_dir"])
            if state is not None:
                out[a["job_dir"]] = state
        return out


if __name__ == "__main__":  # the detached queue process
    sys.exit(run_queue(Path(sys.argv[1]), handshake=sys.stdin))
