"""``runner.profile``: a profiler over a few optimizer steps of one repeat's job (the last repeat of each point,
so that its cost never reaches a measured repeat).

:class:`StepProfiler` is driven by the trainers' callback (:func:`harness.runner.measure.make_callback`). On the
ranks ``runner.profile.ranks`` names it starts ``torch.profiler`` (CPU and CUDA activities, memory, shapes) just
before step ``profile_start`` and stops it after step ``profile_end``, and marks the parts of each step it
covers with ``record_function`` ranges (``sbench:step``, and inside it ``sbench:data``, ``sbench:compute`` (forward
and backward), ``sbench:optimizer`` and ``sbench:other``), from which collect tells where a step's time went
(:mod:`harness.collect.profile`). The Chrome trace goes, gzipped, to ``profile.<host>.rank<r>.pt.trace.json.gz``
in the job dir. Under Nsight Systems (``runner.profile.tool: nsys``, where the node has ``nsys``: the node
runner runs the training under it and sets ``SBENCH_PROFILE_TOOL=nsys``) the same steps are its capture range
(``cudaProfilerStart``/``Stop``) and Nsight writes ``profile.<host>.nsys-rep``.
"""

from __future__ import annotations

import gzip
import os
import shutil
from typing import Any

from harness.contract import envvars

from .rank import Context

STEP, DATA, COMPUTE, OPTIMIZER, OTHER = "sbench:step", "sbench:data", "sbench:compute", "sbench:optimizer", \
    "sbench:other"


class StepProfiler:
    """Profiles steps ``profile_start``..``profile_end`` of this rank, if the job and the rank are profiled."""

    def __init__(self, ctx: Context) -> None:
        r = ctx.runner
        self.ctx = ctx
        self.start, self.end = r.profile_start, r.profile_end
        self.active = r.profiled and ctx.rank in r.profile_rank_list()
        self.tool = "nsys" if envvars.PROFILE_TOOL.get() == "nsys" else "torch"
        self.prof: Any = None
        self.running = False
        self.ranges: list[Any] = []  # the open record_function ranges, innermost last
        self.steps = 0
        if r.profiled and r.profile_tool == "nsys" and self.tool != "nsys" and ctx.rank == 0:
            ctx.note("runner.profile.tool nsys: nsys is not on this node's PATH; torch.profiler profiles instead")

    # -- the ranges ----------------------------------------------------------------------------------------------
    def _open(self, name: str) -> None:
        if not self.running or self.tool != "torch":
            return
        from torch.autograd.profiler import record_function  # heavy: only where a model is trained

        rf = record_function(name)
        rf.__enter__()
        self.ranges.append(rf)

    def _close(self, keep: int = 0) -> None:
        """Close the open ranges down to *keep* of them."""
        while len(self.ranges) > keep:
            self.ranges.pop().__exit__(None, None, None)

    # -- the callback's moments ------------------------------------------------------------------------------------
    def train_begin(self) -> None:
        if self.active and self.start == 1:
            self._begin()

    def step_begin(self) -> None:
        self._close(1)  # the data range ends: the step's batches are loaded
        self._open(COMPUTE)

    def before_optimizer(self) -> None:
        self._close(1)
        self._open(OPTIMIZER)

    def after_optimizer(self) -> None:
        self._close(1)
        self._open(OTHER)

    def step_end(self, step: int) -> None:
        """After optimizer step *step* (counted from 1)."""
        if not self.active:
            return
        if self.running:
            self._close(0)
            self.steps += 1
            if step >= self.end:
                self.finish()
                return
            self._open(STEP)
            self._open(DATA)
        elif step == self.start - 1:
            self._begin()

    def train_end(self) -> None:
        if self.running:
            self._close(0)
            self.ctx.note(f"runner.profile: training ended after {self.steps} of the profiled steps "
                          f"{self.start}-{self.end}; the trace holds those")
            self.finish()

    # -- the profiler --------------------------------------------------------------------------------------------
    def _begin(self) -> None:
        import torch  # heavy: only where a model is trained

        if self.tool == "nsys":
            torch.cuda.profiler.start()
        else:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=acts, record_shapes=True, profile_memory=True,
                                               with_stack=False)
            self.prof.start()
        self.running = True
        self._open(STEP)
        self._open(DATA)

    def finish(self) -> None:
        import torch  # heavy: as above

        self.running = False
        doc: dict[str, Any] = {"steps": [self.start, self.end], "steps_profiled": self.steps, "tool": self.tool,
                               "rank": self.ctx.rank}
        if self.tool == "nsys":
            torch.cuda.profiler.stop()
        else:
            self.prof.stop()
            paths = self.ctx.paths
            if paths is not None:
                out = paths.profile_trace(self.ctx.host, self.ctx.rank)
                raw = out.with_name(f".{out.name}.{os.getpid()}.json")
                self.prof.export_chrome_trace(str(raw))
                tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
                with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(tmp, out)
                raw.unlink()
                doc["file"] = out.name
            self.prof = None
        self.ctx.doc["profile"] = doc
