"""The node runner: ``python -m harness.runner node --job-dir D --host H -- CMD...``.

One per node (``launch.sh`` execs it). In order it

1. ``setup``: writes ``environment.<host>.json`` and starts the node's one sampler;
2. ``dataset``: makes sure the dataset file exists (``harness.data.datagen.make_dataset``), with a
   note when the job had to generate it (``sbench prepare`` does that before submission);
3. runs CMD (the training command) as a child in its own process group, with a parent-death
   signal (SIGTERM) so it cannot outlive a runner killed with SIGKILL, stdout and stderr
   appended to ``train.<host>.log``; for the stability experiment (``trials > 1`` in
   spec.json) it runs CMD once per trial, each a ``trial`` stage with ``SBENCH_TRIAL=i`` and
   its own rendezvous port;
4. ``teardown``: stops the sampler and writes ``result.<host>.json``.

SIGTERM/SIGINT (scancel, sbench cancel, the time limit) are forwarded to the training processes;
after ``runner.stop_grace_s`` whatever is left is killed. ``result.<host>.json`` is written at once
on the signal and again when the training processes are gone. Outside training the first signal
aborts the current stage (once: a second one never interrupts the winding up), and whatever that
abort sets off, the recorded reason is "cancelled by signal N", never an error from wherever the
signal landed.

Exit status: 0 ok, 1 failed, 2 invalid (GPU out of memory / illegal memory access), 3 bad
invocation, 128+N when stopped by signal N. Stability runs exit 0 once every trial ran, whatever
each trial's outcome (those outcomes are the measurement).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from harness.build.trainargs import pack_in_one_process
from harness.contract import envvars
from harness.contract.atomic import write_json
from harness.contract.defaults import RunnerSettings
from harness.contract.formats import Stage
from harness.contract.paths import JobPaths, pack_dirs
from harness.data.datagen import dataset_status, make_dataset

from . import classify, pdeath
from .envcapture import capture
from .sampler import RaplReader, Sampler, open_backend
from .stages import StageLog, Terminated, note_signal, open_stages, process_start_wall, read_stages

EXIT = {"ok": 0, "failed": 1, "invalid": 2}
LOG_TAIL_BYTES = 256 * 1024
PACK_POLL_S = 0.1  # how often a pack's runner looks for the end of the point being trained


def _become_subreaper() -> bool:
    """PR_SET_CHILD_SUBREAPER: orphaned descendants are reparented to this process, not to init."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # 36 = PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _log_tail(path: Path, start: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def with_port(cmd: list[str], port: int) -> list[str]:
    """CMD with its ``--main_process_port`` replaced (a fresh rendezvous port per trial)."""
    out = list(cmd)
    for i, tok in enumerate(out[:-1]):
        if tok == "--main_process_port":
            out[i + 1] = str(port)
    for i, tok in enumerate(out):
        if tok.startswith("--main_process_port="):
            out[i] = f"--main_process_port={port}"
    return out


def cmd_port(cmd: list[str]) -> int | None:
    for i, tok in enumerate(cmd[:-1]):
        if tok == "--main_process_port":
            try:
                return int(cmd[i + 1])
            except ValueError:
                return None
    return None


def trial_port(base: int, trial: int) -> int:
    """Distinct per trial (TIME_WAIT sockets of the previous rendezvous may still hold the old port)."""
    return 20000 + (base - 20000 + 7 * trial) % 12000 if 20000 <= base < 32000 else base + 7 * trial


# What result.<host>.json's "training" block keeps of rank 0's rank.0.json.
TRAINING_KEYS = ("global_step", "train_start_wall", "train_end_wall", "warmup_end_wall", "stopped_by", "window",
                 "metrics", "totals", "hf_metrics", "dataset_token_counts", "world_size", "distributed", "notes",
                 "ran", "adjustments", "status")


class NodeRunner:
    def __init__(self, job_dir: str | Path, host: str, cmd: list[str], pack: bool = True) -> None:
        self.paths = JobPaths(job_dir)
        self.host = host
        self.cmd = cmd
        doc = _read_json(self.paths.spec)
        if not isinstance(doc, dict) or "jobspec" not in doc:
            raise SystemExit(f"sbench runner: {self.paths.spec} is missing or not a rendered spec.json")
        self.spec: dict[str, Any] = doc["jobspec"]
        self.settings = RunnerSettings.from_dict(self.spec.get("runner"))
        self.trials = int(self.spec.get("trials") or 1)
        self.machine_rank = int(envvars.MACHINE_RANK.get() or os.environ.get("SLURM_NODEID") or 0)
        ppn = int(self.spec.get("processes_per_node") or 1)
        self.expected_ranks = list(range(self.machine_rank * ppn, (self.machine_rank + 1) * ppn))
        self.log = StageLog(self.paths.stages(host), host, rank=None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.terminated_by: int | None = None
        self.kill_deadline: float | None = None
        self.sampler: Sampler | None = None
        self.phase = "init"
        self.raising = False  # a first signal outside training aborts the current stage (main's stages only)
        self.process_start_wall = process_start_wall()  # the runner's start (startup is timed from it)
        self.result: dict[str, Any] = {
            "host": host, "machine_rank": self.machine_rank, "exit_code": None, "signal": None, "outcome": None,
            "reason": None, "started_wall": time.time(), "ended_wall": None, "samples": 0,
            "sample_interval_s": self.settings.sample_interval_s, "trials": [], "ranks": [],
            "expected_ranks": self.expected_ranks, "command": cmd, "pid": os.getpid(),
        }
        # A pack (slurm.pack) in one training process: the points after this one, each its own runner record
        # (its job dir's stages, samples, result), begun when the point before it ended ok.
        self.cur: NodeRunner = self
        self.members: list[NodeRunner] = []
        self.env_doc: dict[str, Any] = {}
        dirs = pack_dirs(envvars.PACK.get()) if pack else []
        if len(dirs) > 1 and os.path.abspath(dirs[0]) == os.path.abspath(self.paths.root) and \
                pack_in_one_process(self.spec.get("trainer"), self.spec.get("workload"), self.spec.get("trials")):
            self.members = [NodeRunner.member(d, host, cmd) for d in dirs[1:]]
            self.result["pack"] = {"index": 0, "job_dirs": dirs}

    @classmethod
    def member(cls, job_dir: str, host: str, cmd: list[str]) -> NodeRunner:
        """A later point of this runner's pack: it runs in the same training process, and has no process
        start of its own (its start-up is timed from its setup stage)."""
        m = cls(job_dir, host, cmd, pack=False)
        m.process_start_wall = None
        return m

    # -- signals ---------------------------------------------------------------------------------
    def _descendants(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def _signal_tree(self, sig: int) -> None:
        """Signal the child's process group and every descendant (torch elastic puts ranks in sessions of their own)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        kids = self._descendants()
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in kids:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        note_signal(signum)
        first = self.terminated_by is None
        self.terminated_by = self.terminated_by or signum
        cur = self.cur  # the point being trained (a pack's later point, else this one)
        cur.terminated_by = cur.terminated_by or signum
        if self.proc is not None and self.proc.poll() is None:
            if first:
                print(f"sbench runner: signal {signum}: stopping training (grace {self.settings.stop_grace_s} s)",
                      file=sys.stderr, flush=True)
                self._signal_tree(signal.SIGTERM)
                self.kill_deadline = time.monotonic() + self.settings.stop_grace_s
                # On disk at once: SLURM's SIGKILL may follow before the training processes are gone.
                cur.result.update(outcome="failed", signal=None, ended_wall=time.time(),
                                  reason=classify.cancelled(signum, "stopping training"))
                cur.result["samples"] = cur.sampler.rows if cur.sampler else 0
                write_json(cur.paths.result(cur.host), cur.result)
            else:
                self._signal_tree(signal.SIGKILL)  # a second signal: no more grace
            return
        if first and self.raising and self.phase != Stage.TEARDOWN:
            raise Terminated(signum)  # not training: abort the current stage
        # Already stopping, or finishing anyway: result.<host>.json records the signal.

    # -- stages ----------------------------------------------------------------------------------
    def setup(self) -> None:
        with self.log.stage(Stage.SETUP) as info:
            if self.process_start_wall is not None:
                info["runner_start_wall"] = self.process_start_wall
            env = capture(self.host, self.machine_rank, (self.spec.get("resources") or {}).get("container_image"))
            self.env_doc = env
            write_json(self.paths.environment(self.host), env)
            per_node = None if self.spec.get("cpu_partition") else len(self.expected_ranks)
            backend, note = open_backend(max_devices=per_node)
            # CPU partitions: the packages' RAPL counters give the energy (GPU partitions: NVML's, per GPU).
            rapl = RaplReader() if self.spec.get("cpu_partition") else None
            self.sampler = Sampler(self.paths.samples(self.host), self.settings.sample_interval_s, backend,
                                   rapl=rapl).start()
            info.update(sampler_backend=backend.name, gpus_sampled=len(backend.devices()),
                        sample_interval_s=self.sampler.interval_s, note=note)
            if rapl is not None:
                info.update(rapl_packages=len(rapl.zones), rapl_note=rapl.note())

    def dataset(self) -> None:
        dataset_id, path = self.spec["dataset_id"], self.spec["dataset_path"]
        with self.log.stage(Stage.DATASET) as info:
            status = dataset_status(dataset_id, path)
            # Tokenizer-free: the file is the same for every model, so one prepare serves them all (the
            # length guarantee of news-tokens ids is by word count; see harness.data.datagen).
            _, made = make_dataset(dataset_id, path)
            info.update(dataset_id=dataset_id, path=str(path), status_before=status, generated=made)
            if status not in ("complete", "external"):
                info["note"] = (f"dataset file was {status} when the job started"
                                + (" and was generated in the job" if made else ", and another job generated it")
                                + "; run 'sbench prepare SWEEP' before submitting")

    def _stale_rank_files(self) -> None:
        for r in self.expected_ranks:
            for p in (self.paths.rank_result(r), self.paths.error(r)):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
        if 0 in self.expected_ranks:
            try:
                self.paths.log_history.unlink()
            except FileNotFoundError:
                pass

    def run_child(self, cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
        """Run one training command to its end; returns exit code/signal and what the ranks wrote (of the
        pack's point being trained when it ended, in a pack)."""
        self._stale_rank_files()
        for m in self.members:
            m._stale_rank_files()
        log_path = self.paths.train_log(self.host)
        start_at = log_path.stat().st_size if log_path.exists() else 0
        started = time.time()
        with open(log_path, "ab", buffering=0) as log:
            log.write(f"==> sbench {time.strftime('%Y-%m-%dT%H:%M:%S%z')} host {self.host}: {' '.join(cmd)}\n"
                      .encode())
            # Behind the parent-death wrapper: a node runner killed with SIGKILL takes its training with it.
            # The ranks time their "launch" stage from here (launcher, imports, rendezvous).
            env = {**env, envvars.LAUNCHED_WALL.name: repr(time.time())}
            self.proc = subprocess.Popen(pdeath.wrap(cmd), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        if self.sampler is not None:
            self.sampler.set_root(self.proc.pid)
        known: dict[int, psutil.Process] = {}  # descendants seen, to find orphans once the launcher is gone
        # As a child subreaper the runner inherits orphaned ranks, so one scan at the end finds them; the
        # periodic scan is only the fallback where prctl is refused. Waking rarely keeps the runner's own
        # CPU use out of the training's way (bench/overhead.py).
        scan_every = None if _become_subreaper() else 2.0
        last_scan = 0.0
        while True:
            try:
                self.proc.wait(timeout=PACK_POLL_S if self.members else 0.5)
                break
            except subprocess.TimeoutExpired:
                if self.members:
                    self._next_point(started)
                if scan_every is not None and time.monotonic() - last_scan > scan_every:
                    known.update((p.pid, p) for p in self._descendants())
                    last_scan = time.monotonic()
                if self.kill_deadline is not None and time.monotonic() > self.kill_deadline:
                    print("sbench runner: grace period over; killing the training processes", file=sys.stderr,
                          flush=True)
                    self._signal_tree(signal.SIGKILL)
                    self.kill_deadline = None
        # Stragglers (ranks in sessions of their own whose launcher died) must not outlive the job step.
        # psutil's is_running() compares create times, so a reused pid is never hit.
        try:
            known.update((p.pid, p) for p in psutil.Process().children(recursive=True))
        except psutil.Error:
            pass
        for p in known.values():
            try:
                if p.is_running():
                    p.kill()
            except psutil.Error:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything left in the training command's process group
        except (ProcessLookupError, PermissionError):
            pass
        rc = self.proc.returncode
        cur = self.cur
        if cur.sampler is not None:
            cur.sampler.end_tree()  # the tree's last CPU seconds, up to its end: the window's end has a sample
        tail = _log_tail(log_path, start_at)
        rank_docs = {r: d for r in self.expected_ranks if isinstance(d := _read_json(cur.paths.rank_result(r)), dict)}
        errors = [d for r in self.expected_ranks if isinstance(d := _read_json(cur.paths.error(r)), dict)]
        rank_exit = classify.elastic_failures(tail)
        events = [e for e in read_stages(cur.paths.stages(self.host))
                  if e.get("rank") is not None and (e.get("t_wall") or 0) >= started]
        exit_code = rc if rc >= 0 else None
        sig = -rc if rc < 0 else None
        out: dict[str, Any] = {
            "open_stages": [{k: e.get(k) for k in ("stage", "rank", "pid", "trial", "t_wall")}
                            for e in open_stages(events)],
            "exit_code": exit_code,
            "signal": sig,
            "rank_exit_codes": {str(k): v for k, v in sorted(rank_exit.items())},
            "rank_docs": rank_docs, "errors": errors,
        }
        out["outcome"], out["reason"] = classify.node_outcome(
            exit_code=exit_code, signal=sig, errors=errors, expected_ranks=self.expected_ranks,
            rank_docs=rank_docs, rank_exit=rank_exit, terminated_by=self.terminated_by, log_tail=tail)
        self.proc = None
        return out

    # -- a pack in one training process --------------------------------------------------------------------
    def _next_point(self, started: float) -> None:
        """When every rank of this node wrote the current point's ``rank.<r>.json`` with status ok, that point
        is over: its result is written (its sampler stopped) and the next point begins (its setup stage, its
        own sampler on the same training process). A point a rank ended otherwise is the last: the process
        exits, and run_child's end records it."""
        cur = self.cur
        k = 0 if cur is self else self.members.index(cur) + 1
        if k >= len(self.members) or self.proc is None or self.terminated_by is not None:
            return
        docs = {r: _read_json(cur.paths.rank_result(r)) for r in self.expected_ranks}
        if not all(isinstance(d, dict) and d.get("status") == "ok" and (d.get("ended_wall") or 0) >= started
                   for d in docs.values()):
            return
        ok_docs = {r: d for r, d in docs.items() if isinstance(d, dict)}
        outcome, reason = classify.node_outcome(
            exit_code=0, signal=None, errors=[], expected_ranks=self.expected_ranks, rank_docs=ok_docs, rank_exit={},
            terminated_by=None, log_tail="")
        cur.finish({"exit_code": 0, "signal": None, "rank_exit_codes": {}, "open_stages": [], "rank_docs": ok_docs,
                    "errors": [], "outcome": outcome, "reason": reason})
        nxt = self.members[k]
        nxt.begin(self, k + 1)
        self.cur = nxt

    def begin(self, lead: NodeRunner, index: int) -> None:
        """A later point of *lead*'s pack begins: its setup stage (the node's environment as the lead captured
        it, its own sampler following the training process)."""
        self.result["started_wall"] = time.time()
        self.result["pack"] = {"index": index, "job_dirs": [str(lead.paths.root)] + [str(m.paths.root)
                                                                                    for m in lead.members]}
        with self.log.stage(Stage.SETUP) as info:
            write_json(self.paths.environment(self.host), lead.env_doc)
            per_node = None if self.spec.get("cpu_partition") else len(self.expected_ranks)
            backend, note = open_backend(max_devices=per_node)
            rapl = RaplReader() if self.spec.get("cpu_partition") else None
            self.sampler = Sampler(self.paths.samples(self.host), self.settings.sample_interval_s, backend,
                                   rapl=rapl).start()
            if lead.proc is not None:
                self.sampler.set_root(lead.proc.pid)
            info.update(sampler_backend=backend.name, gpus_sampled=len(backend.devices()),
                        sample_interval_s=self.sampler.interval_s, note=note, pack_index=index,
                        pack_lead=str(lead.paths.root))

    def profiled_cmd(self, env: dict[str, str]) -> list[str]:
        """The training command, under Nsight Systems when this job profiles with ``runner.profile.tool: nsys``
        and the node has ``nsys`` (its capture range is the profiled steps: the trainer calls cudaProfilerStart and
        Stop); else as it is (the trainer then profiles with torch.profiler, and says so)."""
        s = self.settings
        nsys = shutil.which("nsys") if s.profiled and s.profile_tool == "nsys" else None
        if nsys is None:
            return self.cmd
        env[envvars.PROFILE_TOOL.name] = "nsys"
        return [nsys, "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                "--trace=cuda,nvtx,osrt", "--force-overwrite=true", "-o", str(self.paths.profile_nsys(self.host)),
                *self.cmd]

    def train(self) -> dict[str, Any]:
        env = dict(os.environ)
        if self.trials <= 1:
            return self.run_child(self.profiled_cmd(env), env)
        base = cmd_port(self.cmd) or int(envvars.MAIN_PORT.get())
        last: dict[str, Any] = {}
        for i in range(self.trials):
            if self.terminated_by is not None:
                break
            port = trial_port(base, i)
            tenv = {**env, envvars.TRIAL.name: str(i), envvars.MAIN_PORT.name: str(port)}
            with self.log.stage(Stage.TRIAL, trial=i) as info:
                last = self.run_child(with_port(self.cmd, port), tenv)
                rec = {"trial": i, "exit_code": last["exit_code"], "signal": last["signal"],
                       "rank_exit_codes": last["rank_exit_codes"], "open_stages": last["open_stages"],
                       "outcome": last["outcome"], "reason": last["reason"], "port": port,
                       "errors": [{k: e.get(k) for k in ("rank", "kind", "error_type", "message", "stage")}
                                  for e in last["errors"]]}
                self.result["trials"].append(rec)
                info.update(outcome=rec["outcome"], exit_code=rec["exit_code"], signal=rec["signal"], port=port)
        return last

    def finish(self, run: dict[str, Any] | None, failure: str | None = None) -> dict[str, Any]:
        res = self.result
        self.phase = Stage.TEARDOWN
        with self.log.stage(Stage.TEARDOWN) as info:
            res["samples"] = self.sampler.stop() if self.sampler else 0
            if self.sampler is not None:
                res["sampler"] = {"backend": self.sampler.backend.name, "ticks": self.sampler.ticks,
                                  "errors": self.sampler.errors, "last_error": self.sampler.last_error}
            run = run or {}
            res["exit_code"], res["signal"] = run.get("exit_code"), run.get("signal")
            res["rank_exit_codes"] = run.get("rank_exit_codes", {})
            res["open_stages"] = run.get("open_stages", [])
            docs = run.get("rank_docs", {})
            res["ranks"] = [docs[r] for r in sorted(docs)]
            if failure is not None:
                res["outcome"], res["reason"] = "failed", failure
            elif self.trials > 1:
                counts = {k: sum(1 for t in res["trials"] if t["outcome"] == k) for k in ("ok", "invalid", "failed")}
                done = len(res["trials"])
                if self.terminated_by is not None or done < self.trials:
                    res["outcome"] = "failed"
                    res["reason"] = (f"stopped by signal {self.terminated_by} after {done} of {self.trials} trials"
                                     if self.terminated_by else f"only {done} of {self.trials} trials ran")
                else:
                    res["outcome"] = "ok"
                    res["reason"] = (f"{self.trials} trials: {counts['ok']} ok, {counts['invalid']} invalid "
                                     f"(GPU OOM), {counts['failed']} failed")
                res["trial_counts"] = counts
            else:
                res["outcome"], res["reason"] = run.get("outcome", "failed"), run.get("reason", "training did not run")
            res["terminated_by"] = self.terminated_by
            if 0 in docs:
                res["training"] = {k: docs[0].get(k) for k in TRAINING_KEYS}
                res["log_history"] = _read_json(self.paths.log_history)
            res["ended_wall"] = time.time()
            write_json(self.paths.result(self.host), res)
            info.update(outcome=res["outcome"], samples=res["samples"])
        return res

    def exit_code(self) -> int:
        if self.terminated_by is not None:
            return 128 + self.terminated_by
        return EXIT.get(self.result.get("outcome") or "failed", 1)

    def main(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        run: dict[str, Any] | None = None
        failure = None
        try:
            try:
                self.raising = True
                self.setup()
                if self.spec.get("workload", "train") == "train":
                    self.dataset()
                run = self.train()
            except Terminated as exc:
                self.terminated_by = exc.signum
            except Exception as exc:  # noqa: BLE001 - recorded in result.<host>.json
                if self.terminated_by is None:  # else the signal is the cause, wherever it landed
                    stage = self.log.last_failed or "runner"
                    failure = f"{stage}: {classify.error_type(exc)}: {exc}"[:2000]
                    print(f"sbench runner: {failure}", file=sys.stderr, flush=True)
            finally:
                self.raising = False
        except Terminated as exc:  # the first signal landed while the stages were being wound up
            self.terminated_by = exc.signum
        if self.terminated_by is not None and (run is None or failure is not None):
            failure = classify.cancelled(self.terminated_by,
                                         f"stopped during {self.log.last_failed or 'start-up'}, before training")
        self.cur.finish(run, failure)  # a pack's points before it wrote theirs as each ended
        return self.cur.exit_code()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.runner node",
                                description="Run one node's share of an sbench job (see docs/job-directory.md).")
    p.add_argument("--job-dir", required=True, help="the attempt's job directory (holds spec.json)")
    p.add_argument("--host", required=True, help="this node's SLURM node name")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- followed by the training command")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        build_parser().error("no training command after --")
    try:
        runner = NodeRunner(args.job_dir, args.host, cmd)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 3
    return runner.main()
