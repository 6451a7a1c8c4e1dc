"""Defaults that more than one part of sbench needs, in one place.

:class:`RunnerSettings` is the sweep's ``runner:`` block: the planner fills it from the sweep (its
field defaults are the defaults), render writes it into spec.json, and the in-job runner reads it back
with :meth:`RunnerSettings.from_dict`. Collect, the catalog and the trainer share the auto-stop
method's name. (Paths live in ``paths.py``, environment variables in ``env.py``.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The reference's auto-stop method: warm-up ends at the first step end after warmup_seconds; the run
# stops once stable_seconds have passed after it and min_steps steps were done.
AUTO_STOP = "WARMUP_60S_STABLE_120S_OR_10_STEPS"

# How a point with that auto_stop_method stops (the sweep's runner.auto_stop.method): "fixed" is the
# reference's rule above; "precision" finds the end of warm-up from the step times (MSER-5) and stops once
# the steady-state throughput's 95 % interval is within +-rel_ci (harness.runner.steady).
STOP_METHODS = ("fixed", "precision")
TRAIN_LOG_LEVELS = ("debug", "info", "warning", "error")  # runner.train_log_level


@dataclass(frozen=True)
class RunnerSettings:
    """How the in-job runner measures; recorded with every attempt (not part of the point's identity)."""

    sample_interval_s: float = 1.0  # sampler period
    warmup_seconds: float = 60.0  # auto-stop warm-up
    stable_seconds: float = 120.0  # auto-stop measured window after warm-up
    min_steps: int = 10  # auto-stop: at least this many steps after warm-up (precision: steady steps)
    stop_method: str = "fixed"  # auto-stop rule: one of STOP_METHODS
    rel_ci: float = 0.02  # precision: the interval's half-width as a fraction of the mean
    max_seconds: float = 600.0  # precision: stop after this many seconds of training however wide the interval
    stop_grace_s: float = 30.0  # SIGTERM -> SIGKILL grace for the training processes
    token_cache: bool = True  # use the shared prepared data and token counts
    workload: str = "train"  # train | idle (a dry run of the harness: harness.runner.idle)
    idle_seconds: float = 1.0  # the idle workload's stand-in duration
    memory_every_steps: int = 50  # memory snapshots at steps 0 and 1, then every this many steps
    # the trainers' logging from the first timed step on: the seed's --log_level debug holds for start-up, but
    # debug lines inside the steps (an image decoder's, per image) cost time the throughput would count
    train_log_level: str = "info"
    # a host is busy when other work (outside the run's processes) used more than this share of its CPU capacity
    # over the measured window, or another process ran on one of its GPUs: the run is flagged host_busy
    host_busy_cpu: float = 0.25
    # runner.profile: optimizer steps profile_start..profile_end (1-based, both included; 0: no profile) of the
    # repeat profile_repeat only (-1: none), on the global ranks profile_ranks ("0,1"), with profile_tool (one of
    # PROFILE_TOOLS); harness.runner.profile. A job's spec.json carries them only when it is that repeat.
    profile_start: int = 0
    profile_end: int = 0
    profile_ranks: str = "0"
    profile_tool: str = "torch"
    profile_repeat: int = -1
    # each rank of a multi-process run times its own work per step (its forward pass, and its optimizer step and
    # step-end callbacks after the gradient synchronisation): collect scores the ranks against each other
    rank_timing: bool = True
    # a rank whose relative or individual score (0 to 1) is below this is a straggler (collect.aggregate)
    straggler_score: float = 0.7
    # a search's short run (harness.spec.search: a rung's): stop after this many optimizer steps; 0: no such cap
    max_run_steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def profiled(self) -> bool:
        """Whether a job with these settings profiles some of its steps."""
        return self.profile_start > 0 and self.profile_end >= self.profile_start

    def for_repeat(self, repeat: int) -> RunnerSettings:
        """The settings one repeat's job runs with: the profile only on the repeat it is for."""
        if self.profiled and repeat == self.profile_repeat:
            return self
        return dataclasses.replace(self, profile_start=0, profile_end=0)

    def profile_rank_list(self) -> list[int]:
        return [int(r) for r in self.profile_ranks.split(",") if r.strip().isdigit()]

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> RunnerSettings:
        """The settings of a spec.json's ``runner`` block. Tolerant, as a job must run whichever sbench
        rendered it: a key missing, null or of the wrong type takes its default, and unknown keys are ignored."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = (doc or {}).get(f.name)
            default: Any = f.default
            if raw is None or isinstance(raw, bool) != isinstance(default, bool):
                continue
            try:
                values[f.name] = type(default)(raw)
            except (TypeError, ValueError):
                continue
        return cls(**values)


PROFILE_TOOLS = ("torch", "nsys")  # runner.profile.tool: torch.profiler in the trainer, or Nsight Systems around it
DEFAULT_PROFILE_STEPS = (3, 5)  # sbench submit --profile without a runner.profile of the sweep's
MAX_PROFILE_STEPS = 50  # a trace of more steps is too large to read, and the steps it covers are alike


# The sampler's shortest period (the sweep's lower bound; the sampler never ticks faster).
MIN_SAMPLE_INTERVAL_S = 0.01


def sample_interval(value: Any) -> float:
    """The period a sampler set to *value* ticks at: at least :data:`MIN_SAMPLE_INTERVAL_S`; a value that is
    not a finite number takes the default. Each sample covers the period before it (``[t - d, t]``)."""
    try:
        d = float(value)
    except (TypeError, ValueError):
        d = RunnerSettings.sample_interval_s
    if not math.isfinite(d):
        d = RunnerSettings.sample_interval_s
    return max(MIN_SAMPLE_INTERVAL_S, d)


# DeepSpeed ZeRO settings sbench renders into deepspeed.json and the memory prediction assumes:
# communication bucket sizes (elements), and the size under which ZeRO-3 keeps a parameter whole.
DEEPSPEED_BUCKET = 50_000_000
ZERO3_PERSISTENCE = 100_000


# sbench preflight: a device whose figure is under this share of its partition's median is slow; the seconds each
# figure takes per device. sbench hosts: a host flagged (a straggler run or a slow preflight) at least this many
# times, in at least this share of the runs and preflights that judged it, is a drain candidate.
PREFLIGHT_THRESHOLD = 0.9
PREFLIGHT_SECONDS = 2.0
# a device preflight finds slow is measured again, in a fresh process, after this pause (a neighbour's burst passes)
# before it is condemned: only a device slow at both looks is
PREFLIGHT_SECOND_LOOK_PAUSE_S = 3.0
DRAIN_MIN_FLAGS = 2
DRAIN_MIN_SHARE = 0.5
