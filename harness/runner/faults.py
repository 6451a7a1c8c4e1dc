"""``SBENCH_FAULT``: injected failures, for tests.

Syntax: one or more faults separated by ``;``, each ``KIND@COND[,COND...][:ARG]``.

- ``KIND``: ``oom`` (raise ``torch.OutOfMemoryError``), ``illegal`` (raise the CUDA "an illegal
  memory access was encountered" ``RuntimeError``), ``error`` (raise ``RuntimeError``),
  ``sigkill`` (``os.kill(os.getpid(), SIGKILL)``: a crash nothing can catch), ``sleep``
  (hang for ARG seconds, default 3600), ``exit`` (``os._exit(ARG)``, default 1), ``slow`` (only with
  ``stage=preflight``: the device check's matmul and memory copy take ARG times as long, default 4: a
  slow device).
- ``COND``: ``step=N`` (at the end of optimiser step N; with ``before=optimizer``, just before its optimizer
  step: a slow optimizer), ``step=N..M`` or ``step=N..`` (at the end of every step from N to M, or from N on:
  a rank that is slow again and again, a straggler), ``step=*`` (at the end of every step, as ``step=1..``: with
  ``sleep``, a point made slower by a known amount) or ``stage=NAME`` (at the start of a trainer stage: dataset,
  tokens, model_load, train; or ``preflight``, the device check of ``sbench preflight``), optionally restricted
  with ``rank=R`` (global rank), ``host=NAME`` (the SLURM node name), ``trial=T`` (stability trial),
  ``job=TEXT`` (a job dir whose name contains TEXT, e.g. ``job=<point_id>.r1.``: one repeat of one point) and
  ``batch=B`` (the point's per-device batch size: one point of a pack, ``slurm.pack``); with ``stage=preflight``,
  ``look=1`` or ``look=2`` (the device check's first look, or the second look it takes at a device found slow:
  a burst from a neighbour that has passed by then).

Examples: ``oom@step=2``, ``error@step=1``, ``sigkill@step=2``, ``sleep@step=1:30``,
``oom@step=2,rank=1``, ``error@stage=model_load``, ``oom@step=1,trial=2``, ``sleep@step=3,job=.r1.:2``,
``oom@step=1,batch=4``, ``sleep@step=3,before=optimizer:0.5``, ``sleep@step=1..,rank=1:0.5`` (rank 1 half a
second late at every step: a straggler), ``sleep@step=*,job=<point_id>.:0.3``, ``slow@stage=preflight,host=node2:4``
(node2's devices compute at a quarter of their speed), ``slow@stage=preflight,host=node2,look=1:4`` (node2 slow at the
first look only: the second look clears it).
"""

from __future__ import annotations

import difflib
import os
import signal
import time
from dataclasses import dataclass

from harness.contract import envvars
from harness.contract.formats import Stage

KINDS = ("oom", "illegal", "error", "sigkill", "sleep", "exit", "slow")
ENV = envvars.FAULT.name
# the stages at whose start a trainer looks for a fault (both trainers; harness.runner.rank.fault_at_stage), and
# the preflight's device check (harness.runner.preflight: a slow fault there scales its figures' time)
FAULT_STAGES = (Stage.DATASET, Stage.TOKENS, Stage.MODEL_LOAD, Stage.TRAIN, Stage.PREFLIGHT)
MAX_SLEEP_S = 86400.0
BEFORE = ("optimizer",)  # where in a step a before= fault fires (harness.runner.measure: on_pre_optimizer_step)
MAX_SLOW = 1000.0
DEFAULT_SLOW = 4.0


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int | None = None
    stage: str | None = None
    rank: int | None = None
    trial: int | None = None
    arg: str | None = None
    job: str | None = None
    batch: int | None = None
    before: str | None = None
    host: str | None = None
    look: int | None = None  # stage=preflight: the device check's first look (1) or its second look (2) only
    step_range: bool = False  # step=N..M or step=N..: every step from step to step_last
    step_last: int | None = None  # None with step_range: no last step

    @property
    def every_step(self) -> bool:
        """``step=*`` (the same as ``step=1..``): at the end of every step."""
        return self.step_range and self.step == 1 and self.step_last is None

    def applies(self, *, rank: int, trial: int | None, step: int | None = None, stage: str | None = None,
                job: str = "", batch: int | None = None, before: str | None = None,
                host: str | None = None, look: int | None = None) -> bool:
        if self.rank is not None and self.rank != rank:
            return False
        if self.host is not None and self.host != host:
            return False
        if self.job is not None and self.job not in job:
            return False
        if self.batch is not None and self.batch != batch:
            return False
        if self.trial is not None and self.trial != trial:
            return False
        if self.look is not None and self.look != look:
            return False
        if step is not None:
            if self.step is None or self.before != before:
                return False
            if self.step_range:
                return self.step <= step and (self.step_last is None or step <= self.step_last)
            return self.step == step
        return stage is not None and self.stage == stage

    @property
    def factor(self) -> float:
        """A ``slow`` fault's factor: how many times as long the slowed work takes."""
        return float(self.arg or DEFAULT_SLOW)

    def fire(self, where: str) -> None:
        msg = f"{ENV} {self.kind} injected {where}"
        if self.kind == "oom":
            import torch  # heavy: only where a model is built or trained

            raise torch.OutOfMemoryError(f"CUDA out of memory. ({msg})")
        if self.kind == "illegal":
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered ({msg})")
        if self.kind == "error":
            raise RuntimeError(msg)
        if self.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # pragma: no cover - the signal arrives first
        if self.kind == "sleep":
            time.sleep(float(self.arg or 3600))
            return
        if self.kind == "exit":
            os._exit(int(self.arg or 1))
        # slow: the work it slows asks for its factor (harness.runner.preflight); firing it does nothing


def parse_faults(text: str | None) -> list[Fault]:
    """Parse ``SBENCH_FAULT``; a malformed value is an error (a silently ignored fault hides test bugs)."""
    faults: list[Fault] = []
    for part in (text or "").split(";"):
        part = part.strip()
        if not part:
            continue
        if "@" not in part:
            raise FaultSpecError(f"{ENV}: {part!r} needs KIND@COND, e.g. oom@step=2")
        kind, rest = part.split("@", 1)
        kind = kind.strip().lower()
        if kind not in KINDS:
            raise FaultSpecError(f"{ENV}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
        arg = None
        if ":" in rest:
            rest, arg = rest.split(":", 1)
        kw: dict[str, object] = {}
        for cond in rest.split(","):
            if "=" not in cond:
                raise FaultSpecError(f"{ENV}: condition {cond!r} must be key=value "
                                     "(step, stage, rank, host, trial, job, batch, before, look)")
            k, v = (x.strip() for x in cond.split("=", 1))
            if k == "step" and "step" in kw:
                raise FaultSpecError(f"{ENV}: {part!r} names step twice")
            if k == "step" and v == "*":
                kw.update(_step_range("1.."))
            elif k == "step" and ".." in v:
                kw.update(_step_range(v))
            elif k in ("step", "rank", "trial", "batch", "look"):
                try:
                    kw[k] = int(v)
                except ValueError:
                    raise FaultSpecError(f"{ENV}: {k} must be an integer, got {v!r}") from None
            elif k == "stage":
                if v not in FAULT_STAGES:
                    close = difflib.get_close_matches(v, FAULT_STAGES, n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise FaultSpecError(f"{ENV}: stage {v!r} is not a stage a trainer looks for faults at; use one "
                                         f"of {', '.join(FAULT_STAGES)}{hint}")
                kw[k] = v
            elif k == "before":
                if v not in BEFORE:
                    raise FaultSpecError(f"{ENV}: before={v!r}: a fault fires before {', '.join(BEFORE)} only "
                                         "(e.g. sleep@step=3,before=optimizer:0.5)")
                kw[k] = v
            elif k in ("job", "host"):
                if not v:
                    raise FaultSpecError(f"{ENV}: {k}= needs a value, e.g. job=<point_id>.r1. or host=node2")
                kw[k] = v
            else:
                raise FaultSpecError(f"{ENV}: unknown condition {k!r}; use step, stage, rank, host, trial, job, "
                                     "batch, before or look")
        if ("step" in kw) == ("stage" in kw):
            raise FaultSpecError(f"{ENV}: {part!r} needs exactly one of step=N (or N..M, N..) or stage=NAME")
        if "before" in kw and "step" not in kw:
            raise FaultSpecError(f"{ENV}: {part!r}: before= needs step=N (the step whose optimizer it delays)")
        if "step" in kw and int(kw["step"]) < 1:  # type: ignore[call-overload]
            raise FaultSpecError(f"{ENV}: step counts optimizer steps from 1, got {kw['step']}")
        if kind == "slow" and kw.get("stage") != Stage.PREFLIGHT:
            raise FaultSpecError(f"{ENV}: {part!r}: slow only slows the preflight's device check: "
                                 "slow@stage=preflight[,host=NAME][:FACTOR]")
        if "look" in kw and (kw.get("stage") != Stage.PREFLIGHT or kw["look"] not in (1, 2)):
            raise FaultSpecError(f"{ENV}: {part!r}: look= names the preflight's first or second look: "
                                 "slow@stage=preflight,look=1 or look=2")
        faults.append(Fault(kind=kind, arg=_arg(kind, arg, part), **kw))  # type: ignore[arg-type]
    return faults


def _step_range(v: str) -> dict[str, object]:
    """``N..M`` or ``N..``: the steps from N to M (or on)."""
    first, _, last = (x.strip() for x in v.partition(".."))
    try:
        start, end = int(first), (int(last) if last else None)
    except ValueError:
        raise FaultSpecError(f"{ENV}: step={v!r}: a range is N..M or N.. (whole numbers)") from None
    if end is not None and end < start:
        raise FaultSpecError(f"{ENV}: step={v!r}: the range ends before it starts")
    return {"step": start, "step_range": True, "step_last": end}


# The kinds whose :ARG is a number: (what it is, its least and greatest value, how the range reads).
_NUMBER_ARGS = {"sleep": ("seconds", 0.0, MAX_SLEEP_S, "{low:g} to {high:g} seconds"),
                "slow": ("a factor", 1.0, MAX_SLOW, "a factor from {low:g} to {high:g}")}


def _arg(kind: str, arg: str | None, part: str) -> str | None:
    """A fault's ``:ARG``, checked: seconds for ``sleep`` (0 to a day), an exit code for ``exit`` (0-255); the
    other kinds take none (an argument they would ignore is a mistake in the test that wrote it)."""
    if arg is None:
        return None
    arg = arg.strip()
    if kind == "exit":
        if not arg.isdigit() or not 0 <= int(arg) <= 255:
            raise FaultSpecError(f"{ENV}: {part!r}: exit's :ARG is an exit code 0-255, got {arg!r}")
        return arg
    if kind in _NUMBER_ARGS:
        what, low, high, unit = _NUMBER_ARGS[kind]
        try:
            value = float(arg)
        except ValueError:
            raise FaultSpecError(f"{ENV}: {part!r}: {kind}'s :ARG is {what}, got {arg!r}") from None
        if not low <= value <= high:
            raise FaultSpecError(f"{ENV}: {part!r}: {kind}'s :ARG must be {unit.format(low=low, high=high)}, got {arg}")
        return arg
    raise FaultSpecError(f"{ENV}: {part!r}: {kind} takes no :ARG (only sleep, exit and slow do)")


def check(text: str | None, where: str) -> None:
    """Refuse a malformed ``SBENCH_FAULT`` before a job is submitted: ``plan`` and ``submit`` call it on the
    value their environment and the inventory give the jobs. *where* names its source in the message."""
    try:
        parse_faults(text)
    except FaultSpecError as exc:
        raise FaultSpecError(f"{where}: {exc} (the syntax: harness/runner/faults.py)") from None


def faults_from_env() -> list[Fault]:
    return parse_faults(envvars.FAULT.get())
