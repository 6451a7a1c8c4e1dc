"""One training process's frame, shared by both trainers (:mod:`harness.runner.train`, :mod:`harness.runner.fms`).

- :class:`Context`: who the process is (rank, host, trial), its job dir, the spec's runner settings, its
  stage log and the faults injected into it;
- the ``launch`` stage: from the moment the node runner started the training command to the end of the
  rendezvous (the launcher, the interpreter, sbench's imports, the training libraries' imports and the
  process group, each timed);
- :func:`main`: runs a trainer's ``run(args, ctx)`` inside signal handling and error classification, and
  writes ``rank.<rank>.json`` (and ``error.<rank>.json`` when it failed).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import envvars
from harness.contract.atomic import write_json
from harness.contract.defaults import RunnerSettings
from harness.contract.formats import Stage
from harness.contract.paths import JobPaths, pack_dirs

from . import LOADED_WALL
from .classify import error_record
from .cmdline import parse_args
from .envcapture import relevant_env
from .faults import Fault, faults_from_env
from .stages import StageLog, Terminated, note_signal, process_start_wall

Runner = Callable[[argparse.Namespace, "Context"], dict[str, Any]]


@dataclass
class Context:
    rank: int
    local_rank: int
    world_size: int
    host: str
    trial: int | None
    paths: JobPaths | None
    runner: RunnerSettings
    data_dir: Path
    log: StageLog
    faults: list[Fault]
    doc: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    launch: dict[str, float] = field(default_factory=dict)  # the open launch stage's clock readings
    asked: dict[str, Any] = field(default_factory=dict)  # spec.json's "asked": what the point asks of the trainer
    batch: int | None = None  # the point's per-device batch size (a fault's batch= condition)

    @classmethod
    def from_env(cls, args: argparse.Namespace) -> Context:
        env = os.environ
        rank = int(env.get("RANK", "0"))
        trial_s = envvars.TRIAL.get()
        host = envvars.host()
        paths = JobPaths(args.job_dir) if args.job_dir else None
        runner = RunnerSettings()
        data_dir = Path(args.training_data_path).resolve().parent
        # Without a rendered spec.json (the trainer run by hand), what its own command line asks.
        asked = {"torch_dtype": args.torch_dtype, "bf16": bool(args.bf16), "fp16": bool(args.fp16),
                 "attn_implementation": "flash_attention_2" if args.use_flash_attn else "sdpa"}
        if paths is not None and paths.spec.is_file():
            js = json.loads(paths.spec.read_text()).get("jobspec", {})
            runner = RunnerSettings.from_dict(js.get("runner"))
            if js.get("data_dir"):
                data_dir = Path(js["data_dir"])
            if isinstance(js.get("asked"), dict) and js["asked"]:
                asked = js["asked"]
        if paths is not None:
            paths.root.mkdir(parents=True, exist_ok=True)
        # SBENCH_STAGE_LOG=0 turns stage events off (bench/overhead.py measures what they cost).
        log = StageLog(paths.stages(host) if paths else "/dev/null", host, rank=rank,
                       trial=int(trial_s) if trial_s else None,
                       enabled=paths is not None and envvars.STAGE_LOG.get() != "0")
        return cls(rank=rank, local_rank=int(env.get("LOCAL_RANK", "0")), world_size=int(env.get("WORLD_SIZE", "1")),
                   host=host, trial=int(trial_s) if trial_s else None, paths=paths, runner=runner,
                   data_dir=data_dir, log=log, faults=faults_from_env(), asked=asked,
                   batch=getattr(args, "per_device_train_batch_size", None))

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"sbench[rank {self.rank}]: {text}", file=sys.stderr, flush=True)

    def record_ran(self, ran: dict[str, Any], adjustments: list[dict[str, Any]]) -> None:
        """What this rank ran with (``ran``) and each setting that differs from what was asked (``adjustments``,
        each also a note)."""
        self.doc["ran"], self.doc["adjustments"] = ran, adjustments
        for a in adjustments:
            self.note(f"{a['setting']} {a['asked']} -> {a['used']}: {a['why']}")

    @property
    def job_name(self) -> str:
        """The job dir's name (``<point_id>.r<repeat>.a<attempt>``), which a fault's ``job=`` matches."""
        return self.paths.root.name if self.paths else ""

    def fault_at_stage(self, stage: str) -> None:
        for f in self.faults:
            if f.applies(rank=self.rank, trial=self.trial, stage=stage, job=self.job_name, batch=self.batch,
                         host=self.host):
                f.fire(f"at the start of stage {stage}")

    def fault_at_step(self, step: int) -> None:
        for f in self.faults:
            if f.applies(rank=self.rank, trial=self.trial, step=step, job=self.job_name, batch=self.batch,
                         host=self.host):
                f.fire(f"at the end of step {step}")

    def fault_before_optimizer(self, step: int) -> None:
        """The faults of ``before=optimizer`` for step *step* (the step whose optimizer is about to run)."""
        for f in self.faults:
            if f.applies(rank=self.rank, trial=self.trial, step=step, job=self.job_name, batch=self.batch,
                         before="optimizer"):
                f.fire(f"before the optimizer step of step {step}")


# -- the launch stage ---------------------------------------------------------------------------------------

def launch_start(ctx: Context) -> None:
    """Open the rank's ``launch`` stage at the moment the node runner started the training command
    (``SBENCH_LAUNCHED_WALL``), else when this process started: the launcher, the interpreter, the imports
    and the rendezvous are start-up time like any other, and the stages should say where it went. Called
    when sbench's own modules are loaded, before the training libraries are imported."""
    now = time.time()
    born = process_start_wall() or LOADED_WALL
    try:
        launched = min(float(envvars.LAUNCHED_WALL.get()), LOADED_WALL)
    except ValueError:
        launched = min(born, LOADED_WALL)
    # the process start is read to a 10 ms clock tick: it is kept between the launch and the package's loading
    ctx.launch = {"launched_wall": launched, "process_start_wall": min(max(born, launched), LOADED_WALL),
                  "loaded_wall": LOADED_WALL, "frame_wall": now}
    ctx.log.start(Stage.LAUNCH, at=ctx.launch["launched_wall"])


def launch_end(ctx: Context, imported_wall: float) -> None:
    """Close the launch stage once the process group is up; *imported_wall*: when the training libraries
    (torch, transformers, accelerate, trl, peft) were imported. Its ``info`` splits the stage into parts that
    add up to it: ``launcher_s`` (the launcher, until it had this rank's process started), ``interpreter_s``
    (Python's own start-up), ``runner_imports_s`` (sbench's modules), ``imports_s`` (the training libraries,
    and the settings resolved before them) and ``rendezvous_s`` (the process group)."""
    if not ctx.launch:
        return
    now = time.time()
    c = ctx.launch
    marks = [c["launched_wall"], c["process_start_wall"], c["loaded_wall"], c["frame_wall"], imported_wall, now]
    for k in range(1, len(marks)):  # clocks read in order; a 10 ms process start tick may round past the next
        marks[k] = max(marks[k], marks[k - 1])
    parts = ("launcher_s", "interpreter_s", "runner_imports_s", "imports_s", "rendezvous_s")
    ctx.log.end(Stage.LAUNCH, info={p: round(marks[k + 1] - marks[k], 3) for k, p in enumerate(parts)})
    ctx.launch = {}


def launch_failed(ctx: Context, status: str, error: str) -> None:
    """End a launch stage an exception escaped from (imports, settings, the process group)."""
    if ctx.launch:
        ctx.launch = {}
        ctx.log.last_failed = Stage.LAUNCH
        ctx.log.end(Stage.LAUNCH, status, error)


# -- the frame ----------------------------------------------------------------------------------------------

class _Signals:
    """The first SIGTERM/SIGINT aborts the run (once: a second one never interrupts the winding up), and
    whatever the abort sets off (an import left half done, a library's cleanup), the rank is recorded as
    stopped by that signal, never with an error from wherever the signal landed."""

    signum: int | None = None
    raising = False

    @classmethod
    def handler(cls, signum: int, frame: Any) -> None:
        if cls.signum is not None:
            return
        cls.signum = signum
        note_signal(signum)
        if cls.raising:
            raise Terminated(signum)


def main(run: Runner, argv: list[str] | None = None) -> int:
    """Run one rank: *run* trains; everything around it (signals, the launch stage, error classification,
    ``rank.<r>.json``) is shared by both trainers. In a pack (``SBENCH_PACK``, set by the pack's job for the
    sbench trainer) the process trains each of the pack's points in turn, each with its own command line (its
    job dir's ``spec.json``), context, stages and ``rank.<r>.json``; the imports, the launcher and the process
    group are the first point's. It stops at the first point that does not end ok: the points after it go
    back to the queue as their own jobs (``harness.campaign.executors.pack``)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _Signals.handler)
    pack = pack_dirs(envvars.PACK.get())
    if pack and os.path.abspath(parse_args(argv).job_dir or "") != os.path.abspath(pack[0]):
        pack = []  # a pack names the job dir launched first: a process of another job dir trains its own point
    code = _one(run, argv, first=True)
    for job_dir in pack[1:]:
        if code != 0 or _Signals.signum is not None:
            break
        _release_memory()
        code = _one(run, member_argv(Path(job_dir)), first=False)
    return code


def member_argv(job_dir: Path) -> list[str]:
    """A pack's later point's training command line: its job dir's rendered one (``spec.json``)."""
    js = json.loads(JobPaths(job_dir).spec.read_text(encoding="utf-8")).get("jobspec") or {}
    return [str(a) for a in js.get("train_argv") or []]


def _release_memory() -> None:
    """Between a pack's points: what the point before held goes back (Python's garbage, the CUDA cache), and the
    allocator's peak starts again, so that the next point's ``cuda_peak_bytes`` is its own, not the larger of its
    peak and the points' before it."""
    gc.collect()
    try:
        import torch  # heavy: only where a model was trained

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    except ImportError:
        pass


def _one(run: Runner, argv: list[str] | None, first: bool) -> int:
    """One point of this rank (the launch stage timed from the node runner's start for the first point of
    the process; from now for a pack's later point, whose launcher and imports the first point paid)."""
    args = parse_args(argv)
    ctx = Context.from_env(args)
    doc = ctx.doc
    doc.update(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size, host=ctx.host, trial=ctx.trial,
               pid=os.getpid(), status="running", env=relevant_env(), device=None, notes=ctx.notes,
               argv=sys.argv[1:] if argv is None else list(argv), started_wall=time.time())
    code = 0
    if first:
        launch_start(ctx)
    else:
        now = time.time()
        ctx.launch = {"launched_wall": now, "process_start_wall": now, "loaded_wall": now, "frame_wall": now}
        ctx.log.start(Stage.LAUNCH, at=now)
    try:
        try:
            _Signals.raising = True
            run(args, ctx)
            doc["status"] = "ok"
        except BaseException as exc:  # noqa: BLE001 - every failure is classified and recorded
            _Signals.raising = False
            if _Signals.signum is None and not isinstance(exc, Terminated):
                code = _failed(ctx, exc)
        finally:
            _Signals.raising = False
    except Terminated:  # the first signal landed while the run was being wound up
        pass
    if _Signals.signum is not None and doc.get("status") != "ok":
        stopped = f"terminated by signal {_Signals.signum}"
        launch_failed(ctx, "killed", stopped)
        doc["status"], doc["error"] = "killed", stopped
        code = 128 + _Signals.signum
    doc["ended_wall"] = time.time()
    if ctx.paths is not None:
        write_json(ctx.paths.rank_result(ctx.rank), doc)
    return code


def _failed(ctx: Context, exc: BaseException) -> int:
    """Record an exception that ended the run (``error.<rank>.json``); returns the exit code."""
    doc = ctx.doc
    launch_failed(ctx, "error", f"{type(exc).__name__}: {exc}"[:2000])
    rec = error_record(exc, rank=ctx.rank, host=ctx.host, stage=ctx.log.last_failed, trial=ctx.trial,
                       t_wall=time.time())
    doc["status"], doc["error"] = "error", {k: rec[k] for k in ("kind", "error_type", "message", "stage")}
    if ctx.paths is not None:
        write_json(ctx.paths.error(ctx.rank), rec)
    traceback.print_exc()
    print(f"sbench[rank {ctx.rank}]: {rec['kind']}: {rec['error_type']}: {rec['message']}", file=sys.stderr,
          flush=True)
    return 1


def exit_now(code: int) -> None:
    """End the process with *code* at once, once its output is flushed: interpreter teardown (process-group and
    thread joins) can hang after a peer died."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
