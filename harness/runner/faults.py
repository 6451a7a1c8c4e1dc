"""``SBENCH_FAULT``: injected failures, for tests.

Syntax: one or more faults separated by ``;``, each ``KIND@COND[,COND...][:ARG]``.

- ``KIND``: ``oom`` (raise ``torch.OutOfMemoryError``), ``illegal`` (raise the CUDA "an illegal
  memory access was encountered" ``RuntimeError``), ``error`` (raise ``RuntimeError``),
  ``sigkill`` (``os.kill(os.getpid(), SIGKILL)``: a crash nothing can catch), ``sleep``
  (hang for ARG seconds, default 3600), ``exit`` (``os._exit(ARG)``, default 1).
- ``COND``: ``step=N`` (at the end of optimiser step N) or ``stage=NAME`` (at the start of a
  trainer stage: dataset, tokens, model_load, train), optionally restricted with ``rank=R``
  (global rank), ``trial=T`` (stability trial), ``job=TEXT`` (a job dir whose name contains TEXT,
  e.g. ``job=<point_id>.r1.``: one repeat of one point) and ``batch=B`` (the point's per-device batch
  size: one point of a pack, ``slurm.pack``).

Examples: ``oom@step=2``, ``error@step=1``, ``sigkill@step=2``, ``sleep@step=1:30``,
``oom@step=2,rank=1``, ``error@stage=model_load``, ``oom@step=1,trial=2``, ``sleep@step=3,job=.r1.:2``,
``oom@step=1,batch=4``.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from harness.contract import envvars

KINDS = ("oom", "illegal", "error", "sigkill", "sleep", "exit")
ENV = envvars.FAULT.name


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

    def applies(self, *, rank: int, trial: int | None, step: int | None = None, stage: str | None = None,
                job: str = "", batch: int | None = None) -> bool:
        if self.rank is not None and self.rank != rank:
            return False
        if self.job is not None and self.job not in job:
            return False
        if self.batch is not None and self.batch != batch:
            return False
        if self.trial is not None and self.trial != trial:
            return False
        if step is not None:
            return self.step == step
        return stage is not None and self.stage == stage

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
                                     "(step, stage, rank, trial, job, batch)")
            k, v = (x.strip() for x in cond.split("=", 1))
            if k in ("step", "rank", "trial", "batch"):
                try:
                    kw[k] = int(v)
                except ValueError:
                    raise FaultSpecError(f"{ENV}: {k} must be an integer, got {v!r}") from None
            elif k in ("stage", "job"):
                kw[k] = v
            else:
                raise FaultSpecError(f"{ENV}: unknown condition {k!r}; use step, stage, rank, trial, job or batch")
        if ("step" in kw) == ("stage" in kw):
            raise FaultSpecError(f"{ENV}: {part!r} needs exactly one of step=N or stage=NAME")
        faults.append(Fault(kind=kind, arg=arg, **kw))  # type: ignore[arg-type]
    return faults


def faults_from_env() -> list[Fault]:
    return parse_faults(envvars.FAULT.get())
