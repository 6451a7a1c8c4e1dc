"""The one scheduler client: every question sbench asks SLURM, and every command it gives it.

One :class:`Slurm` per sbench command, made where the command starts (``submit_sweep``, ``status``,
``cancel``, ``collect``, ``run_probe``, ``run_fabric``, ``submit_prepare_job``) and handed down to
everything that needs the scheduler. It remembers its answers, so within one command each question
is asked at most once:

- accounting (``sacct``) per job id: only ids not asked yet go to sacct, in batches (and, for array
  tasks it has no record of, their arrays, once: tasks that never left the queue are one record of it).
  It keeps every record of an id (``-D``: each run of a requeued job, and other jobs that had the id) and
  answers with the one of the job sbench submitted (:func:`harness.slurm.sacct.pick`, by the job's
  :class:`~harness.slurm.sacct.JobKey`: its name and when it was submitted); an id asked about again with an
  earlier submit time is asked again, from that time;
- the queue (``squeue``): once;
- a partition's nodes (``sinfo``): once per partition;
- the per-job limits' sources: the user's associations and the QOS (``scontrol show assoc_mgr``: once until
  the client submits), a partition's own QOS (``scontrol show partition``: once per partition), the default
  QOS (``sacctmgr``).

An answer tells the world as it was when it was asked. A loop that must see states move (``wait``)
asks again with :meth:`Slurm.forget`; so does every command this client gives (``sbatch``,
``scancel``), since it changes what the scheduler would answer about jobs. ``srun`` runs a step and is never
remembered. Submission goes through submitit (``sbatch`` of a script sbench made).

Tests hand it a fake command runner (``argv -> CompletedProcess``) in place of ``subprocess.run``.
One thread at a time uses an instance.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import getpass
import io
import pwd
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.contract.errors import RunnerError, SubmitError

from .limits import (
    JobLimit,
    SubmitLimits,
    default_qos,
    has_over_part_qos,
    job_association,
    job_limits,
    max_array_size,
    parse_assoc_mgr,
    parse_config,
    parse_partition_qos,
    parse_records,
    qos_limits,
    refusal_kind,
)
from .nodes import NODES_ARGV, PARTITIONS_ARGV, SlurmNode, SlurmPartition, parse_nodes, parse_partitions
from .sacct import JobAccounting, JobKey, Queued, parse_sacct_records, parse_squeue, pick, sacct_argv, squeue_argv
from .sinfo import NodeInfo, parse_sinfo, sinfo_argv

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
CHUNK = 200  # job ids per sacct call (keeps the command line short)
ASK_TIMEOUT_S = 120  # sacct and squeue on a busy controller
SINFO_TIMEOUT_S = 15  # a partition's nodes: render and submit go on without them


class SbatchRefused(SubmitError):
    """sbatch refused a submission; *kind* says whether a limit did (:func:`harness.slurm.limits.refusal_kind`)."""

    def __init__(self, message: str, kind: str | None) -> None:
        super().__init__(message)
        self.kind = kind


class Slurm:
    """SLURM as one sbench command sees it; see the module docstring."""

    def __init__(self, runner: Runner | None = None, *, chunk: int = CHUNK) -> None:
        self._runner = runner
        self._chunk = chunk
        self._nodes: dict[str, tuple[dict[str, NodeInfo] | None, str]] = {}
        self._config: dict[str, str] | None = None
        self._partition_qos: dict[str, str | None] = {}
        self.forget()

    def forget(self) -> None:
        """Drop what SLURM said about jobs (accounting, the queue): the next question about them goes to
        SLURM again. A partition's nodes do not move with the jobs; they stay remembered."""
        self._records: dict[str, list[JobAccounting]] = {}  # every record sacct gave of each id
        # ids sacct was asked about (it may not know them all), with the -S time asked (None: since ever)
        self._accounted: dict[str, _dt.datetime | None] = {}
        self._sacct_down: str | None = None  # why sacct could not answer, once it could not
        self._queue: dict[str, Queued] | None = None
        self._queue_asked = False
        self._assoc: str | None = None  # scontrol show assoc_mgr: the quotas' use moves with the jobs

    def _call(self, argv: Sequence[str], timeout: float | None, env: dict[str, str] | None = None,
              ) -> subprocess.CompletedProcess[str]:
        if self._runner is not None:
            return self._runner(list(argv))
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False)

    def _to_ask(self, ids: Iterable[str], since: Mapping[str, _dt.datetime | None]) -> list[list[str]]:
        """The batches of *ids* sacct must be asked about: not asked yet, or asked from a later time than
        *since* now needs. Ids with no time first (asked since ever), then by time, so that each batch's
        ``-S`` (its earliest) is close to all of its ids'."""
        new = [j for j in ids if j not in self._accounted or _earlier(since.get(j), self._accounted[j])]
        new.sort(key=lambda j: (since.get(j) is not None, since.get(j) or _dt.datetime.min, j))
        return [new[i:i + self._chunk] for i in range(0, len(new), self._chunk)]

    def _ask(self, part: list[str], since: Mapping[str, _dt.datetime | None]) -> subprocess.CompletedProcess[str]:
        times = [since.get(j) for j in part]
        start = None if any(t is None for t in times) else min(t for t in times if t is not None)
        res = self._call(sacct_argv(part, start), ASK_TIMEOUT_S)
        if res.returncode == 0:
            self._accounted.update({j: start for j in part})
        return res

    # -- questions (remembered) ----------------------------------------------------------------------------
    def accounting(self, job_ids: Iterable[str], keys: Mapping[str, JobKey] | None = None,
                   ) -> tuple[dict[str, JobAccounting] | None, str | None]:
        """sacct's records of *job_ids* (those it knows), asking only about ids not asked yet.

        *keys*: what sbench knows of each job (:class:`JobKey`); sacct is asked from the earliest time
        a record of it may carry, and each id's answer is the record :func:`harness.slurm.sacct.pick`
        takes for its key. An id without a key is asked about since ever and answered with its latest record.
        Returns (jobs, None), or (None, why) when sacct cannot answer at all (no binary, accounting
        storage disabled, controller down); the caller then falls back to the queue and the files.
        """
        keys = keys or {}
        ids = sorted({str(j) for j in job_ids if j})
        since = {j: keys[j].since if j in keys else None for j in ids}
        asked: list[str] = []
        for part in self._to_ask(ids, since):
            if self._sacct_down is not None:
                break
            try:
                res = self._ask(part, since)
            except FileNotFoundError:
                self._sacct_down = "no sacct command"
                break
            except (OSError, subprocess.SubprocessError) as exc:
                self._sacct_down = f"sacct failed: {exc}"
                break
            if res.returncode != 0:
                msg = (res.stderr or res.stdout or "").strip().splitlines()
                self._sacct_down = f"sacct failed: {msg[-1] if msg else f'exit {res.returncode}'}"
                break
            self._records.update(parse_sacct_records(res.stdout))  # asked again: from an earlier time, all anew
            asked += part
        if self._sacct_down is not None:
            return None, self._sacct_down
        self._unsplit_tasks([j for j in asked if not self._records.get(j)], since)
        out = {j: self.record(j, keys.get(j)) for j in ids}
        return {j: rec for j, rec in out.items() if rec is not None}, None

    def record(self, job_id: str, key: JobKey | None = None) -> JobAccounting | None:
        """The record of the job *key* describes among those sacct already gave of *job_id* (asks nothing:
        :meth:`accounting` asked). Two attempts that had the same id each find their own."""
        return pick(self._records.get(str(job_id), []), key)

    def _unsplit_tasks(self, tasks: Sequence[str], since: Mapping[str, _dt.datetime | None]) -> None:
        """Array tasks sacct has no record of by their own ids: the tasks that never left the queue are one
        record of their array (``123_[2-4]``, or ``123`` just after the array was cancelled), which sacct
        gives only to a question about the array. Asks about each such array once; each task takes its
        array's records that never ran, so a task cancelled while pending reads CANCELLED, not unknown; a
        task whose own record accounting has not written yet stays unknown (the queue and its files speak)."""
        arrays: dict[str, list[str]] = {}
        for j in tasks:
            base, sep, task = j.partition("_")
            if sep and base.isdigit() and task.isdigit():
                arrays.setdefault(base, []).append(j)
        base_since: dict[str, _dt.datetime | None] = {}
        for base, members in arrays.items():
            times = [since.get(j) for j in members]
            base_since[base] = None if any(t is None for t in times) else min(t for t in times if t is not None)
        for part in self._to_ask(sorted(arrays), base_since):
            try:
                res = self._ask(part, base_since)
            except (OSError, subprocess.SubprocessError):
                return  # the tasks stay unknown: the queue and the files speak for them
            if res.returncode != 0:
                return
            for k, recs in parse_sacct_records(res.stdout).items():  # records already known (a task's own) stay
                if not self._records.get(k):
                    self._records[k] = recs
        for base, members in arrays.items():
            # The array's own record speaks for its tasks only while it never ran (cancelled pending: no node).
            # One that ran is one task's (the array's first job, before accounting names its task): another
            # task that took it would read that task's nodes and state.
            whole = [r for r in self._records.get(base, []) if not r.ranged and r.node_list is None]
            for j in members:
                if not self._records.get(j) and whole:
                    self._records[j] = [replace(r, job_id=j, steps=[], ranged=True) for r in whole]

    def queue(self) -> dict[str, Queued] | None:
        """Every job the queue holds (one entry per array task), or None when squeue cannot answer."""
        if not self._queue_asked:
            self._queue_asked = True
            try:
                res = self._call(squeue_argv(), ASK_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError):
                res = None
            self._queue = parse_squeue(res.stdout) if res is not None and res.returncode == 0 else None
        return self._queue

    def states(self, job_ids: Iterable[str], keys: Mapping[str, JobKey] | None = None) -> dict[str, str]:
        """Job id -> SLURM's word on it now: the queue's for live jobs (a pending one with why it waits),
        sacct's for the others (the record of the job *keys* describes). Ids neither knows are left out."""
        ids = [str(j) for j in job_ids if j]
        if not ids:
            return {}
        answered = self.queue()
        queue = answered or {}
        out = {j: queue[j].word for j in ids if j in queue and queue[j].belongs((keys or {}).get(j))}
        gone = [j for j in ids if j not in out]
        if gone:
            acct, _why = self.accounting(gone, keys)
            for j in gone:
                if acct is None or j not in acct:
                    continue
                # A queue that answered without the job (every partition's, hidden ones too) has no pending job
                # of that id: a PENDING record is accounting that has not caught up (slurmdbd trails slurmctld;
                # an array task cancelled while pending keeps its array's pending record a while). Nobody knows
                # the job then. (A REQUEUED record stands: the job's own run before it went back.)
                if answered is not None and acct[j].state == "PENDING":
                    continue
                out[j] = acct[j].state
        return {j: out[j] for j in ids if j in out}

    def config(self) -> dict[str, str]:
        """``scontrol show config`` (asked once; {} when it cannot answer)."""
        if self._config is None:
            try:
                res = self._call(["scontrol", "show", "config"], SINFO_TIMEOUT_S)
                self._config = parse_config(res.stdout) if res.returncode == 0 else {}
            except (OSError, subprocess.SubprocessError):
                self._config = {}
        return self._config

    def submit_limits(self, qos: set[str] | None = None) -> SubmitLimits:
        """The array size limit and how many jobs this user may submit now (asked afresh after every submission
        of this client: the use moves with it). A quota nobody can read is unknown (``free`` None)."""
        size = max_array_size(self.config())
        user = getpass.getuser()
        text = self._assoc_mgr(user)
        if text is None:
            return SubmitLimits(size)
        free, limit, source = parse_assoc_mgr(text, user, qos, _uid(user))
        return SubmitLimits(size, free, limit, source)

    def _assoc_mgr(self, user: str) -> str | None:
        """The controller's view of *user*'s associations and the QOS (``scontrol show assoc_mgr``, asked once until
        this client submits or forgets); None when it does not answer (no accounting, no controller)."""
        if self._assoc is None:
            try:
                res = self._call(["scontrol", "show", "assoc_mgr", f"users={user}", "flags=assoc,qos"],
                                 ASK_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError):
                return None
            self._assoc = res.stdout if res.returncode == 0 else None
        return self._assoc

    def job_limits(self, account: str | None, partition: str | None, qos: str | None) -> list[JobLimit]:
        """The per-job limits (wall time, nodes, CPUs, GPUs) of the association and QOS a job of this user with
        *account* and *qos* (None: the defaults) runs under; [] when none is set or nobody answers. The default
        QOS is asked of ``sacctmgr``; where it cannot say, only the association's limits are read."""
        user = getpass.getuser()
        text = self._assoc_mgr(user)
        if text is None:
            return []
        records = parse_records(text)
        if qos is None:
            assoc = job_association(records, user, account, partition)
            qos = self._default_qos(user, assoc.account, partition) if assoc is not None else None
        # (a controller that lists no QOS enforces none: the partition's is not asked then)
        own = self.partition_qos(partition) if partition and any(r.kind == "qos" for r in records) else None
        # whose limits come first where both QOS set one: the partition's, unless the job's QOS says OverPartQOS
        over = bool(own and qos and qos != own and qos_limits(records, own) and qos_limits(records, qos)
                    and self._over_partition_qos(qos))
        return job_limits(records, user, account=account, partition=partition, qos=qos, partition_qos=own,
                          over_partition_qos=over)

    def partition_qos(self, slurm_partition: str) -> str | None:
        """The QOS SLURM's partition gives every job in it (``QoS=`` of ``scontrol show partition``, asked once per
        partition); None where it has none (``N/A``) or nobody answers."""
        if slurm_partition not in self._partition_qos:
            found = None
            try:
                res = self._call(["scontrol", "show", "partition", "-o", slurm_partition], SINFO_TIMEOUT_S)
                found = parse_partition_qos(res.stdout) if res.returncode == 0 else None
            except (OSError, subprocess.SubprocessError):
                pass
            self._partition_qos[slurm_partition] = found
        return self._partition_qos[slurm_partition]

    def _over_partition_qos(self, qos: str) -> bool:
        """Whether the QOS *qos* has the ``OverPartQOS`` flag (its limits then come before the partition QOS's);
        False where sacctmgr cannot say."""
        try:
            res = self._call(["sacctmgr", "-nP", "show", "qos", qos, "format=flags"], SINFO_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return False
        return res.returncode == 0 and has_over_part_qos(res.stdout)

    def _default_qos(self, user: str, account: str, partition: str | None) -> str | None:
        argv = ["sacctmgr", "-nP", "show", "assoc", "where", f"user={user}", f"account={account}"]
        cluster = self.config().get("ClusterName")
        argv += [f"cluster={cluster}"] if cluster else []
        try:
            res = self._call([*argv, "format=partition,qos,defaultqos"], SINFO_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None
        return default_qos(res.stdout, partition) if res.returncode == 0 else None

    def partition_nodes(self, slurm_partition: str) -> tuple[dict[str, NodeInfo] | None, str]:
        """(the nodes of the SLURM partition, or None when nobody answers; and why not)."""
        if slurm_partition not in self._nodes:
            self._nodes[slurm_partition] = self._ask_nodes(slurm_partition)
        return self._nodes[slurm_partition]

    def _ask_nodes(self, slurm_partition: str) -> tuple[dict[str, NodeInfo] | None, str]:
        try:
            res = self._call(sinfo_argv(slurm_partition), SINFO_TIMEOUT_S)
        except FileNotFoundError:
            return None, "sinfo is not on PATH"
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"sinfo failed: {exc}"
        if res.returncode != 0:
            return None, f"sinfo failed: {(res.stderr or '').strip()[:200]}"
        nodes = parse_sinfo(res.stdout)
        if not nodes:
            return None, f"SLURM partition {slurm_partition!r} has no nodes (or does not exist)"
        return nodes, ""

    def cluster_nodes(self) -> tuple[dict[str, SlurmPartition], dict[str, SlurmNode]]:
        """Every partition (``sinfo``) and every node (``scontrol show node``), one call each; a command that
        cannot answer is a :class:`RunnerError` that says which."""
        return parse_partitions(self._read(PARTITIONS_ARGV)), parse_nodes(self._read(NODES_ARGV))

    def _read(self, argv: list[str]) -> str:
        """The output of *argv*, or a :class:`RunnerError` naming it."""
        try:
            res = self._call(argv, ASK_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            raise RunnerError(f"{argv[0]} failed: {exc}; run on a SLURM login node") from None
        if res.returncode != 0:
            why = (res.stderr or "").strip()[:300]
            raise RunnerError(f"{' '.join(argv)} failed (exit {res.returncode}): {why}")
        return res.stdout

    # -- commands (never remembered) -----------------------------------------------------------------------
    def sbatch(self, script: str, folder: Path, *, hold: bool = False, after: str | None = None,
               after_any: str | None = None, begin: str | None = None) -> str:
        """Submit *script* (its text) through submitit, held, after a job succeeded (*after*: ``afterok``),
        after a job ended however it ended (*after_any*: ``afterany``), or not before *begin* (sbatch's
        ``--begin``); its job id. A refusal is :class:`SbatchRefused`."""
        args = ["--hold"] if hold else []
        deps = [f"afterok:{after}"] if after else []
        deps += [f"afterany:{after_any}"] if after_any else []
        if deps:
            args += [f"--dependency={','.join(deps)}", "--kill-on-invalid-dep=yes"]
        if begin:
            args.append(f"--begin={begin}")
        try:
            job = _script_executor()(folder, script, args).submit_script()
        finally:
            self.forget()
        return str(job.job_id)

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` *job_ids*; a refusal it explains is a :class:`SubmitError`."""
        try:
            proc = self._call(["scancel", *job_ids], None)
        except OSError as exc:
            raise SubmitError(f"scancel failed: {exc}") from None
        finally:
            self.forget()
        if proc.returncode != 0 and proc.stderr.strip():
            raise SubmitError(f"scancel failed: {proc.stderr.strip()}")

    def srun(self, argv: Sequence[str], *, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``srun argv`` (a step of its own allocation) to its end, with *env*."""
        return self._call(["srun", *argv], timeout, env=env)


def _uid(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _earlier(need: _dt.datetime | None, asked: _dt.datetime | None) -> bool:
    """Whether records from *need* on (None: since ever) go back further than a question from *asked*."""
    return asked is not None and (need is None or need < asked)


@functools.cache
def _script_executor() -> Any:
    """submitit's SLURM executor submitting a script sbench made instead of its pickling wrapper."""
    import submitit  # 0.1 s of imports that only a submission needs, kept off every command's start-up

    class ScriptExecutor(submitit.SlurmExecutor):
        def __init__(self, folder: Path, script: str, args: list[str]) -> None:
            super().__init__(folder=folder)
            submitit.core.utils.JobPaths.get_first_id_independent_folder(self.folder).mkdir(parents=True,
                                                                                           exist_ok=True)
            self._script = script
            self._args = args

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return self._script

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            return ["sbatch", *self._args, str(submission_file_path)]

        def submit_script(self) -> Any:
            try:
                # submitit prints sbatch's stderr on a refusal; the refusal carries it, said once by sbench
                with contextlib.redirect_stderr(io.StringIO()):
                    return self._submit_command("")
            except subprocess.CalledProcessError as exc:  # raised by submitit's CommandFunction
                raise SbatchRefused(f"sbatch refused the submission: {exc}", refusal_kind(str(exc))) from None
            except Exception as exc:  # noqa: BLE001 - submitit wraps sbatch failures in several types
                raise SbatchRefused(f"sbatch failed: {exc}", refusal_kind(str(exc))) from None

    return ScriptExecutor
