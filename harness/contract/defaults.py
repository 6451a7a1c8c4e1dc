"""Defaults that more than one part of sbench needs, in one place.

The planner fills a sweep's ``runner:`` block from :data:`RUNNER_DEFAULTS`, the in-job trainer
falls back to them when a spec.json lacks a key, and collect, the catalog and the trainer share
the auto-stop method's name. (Paths and their environment variables live in ``paths.py``.)
"""

from __future__ import annotations

from typing import Any

# The reference's auto-stop method: warm-up ends at the first step end after warmup_seconds; the run
# stops once stable_seconds have passed after it and min_steps steps were done.
AUTO_STOP = "WARMUP_60S_STABLE_120S_OR_10_STEPS"

RUNNER_DEFAULTS: dict[str, Any] = {
    "sample_interval_s": 1.0,  # sampler period
    "warmup_seconds": 60.0,  # auto-stop warm-up
    "stable_seconds": 120.0,  # auto-stop measured window after warm-up
    "min_steps": 10,  # auto-stop: at least this many steps after warm-up
    "stop_grace_s": 30.0,  # SIGTERM -> SIGKILL grace for the training processes
    "token_cache": True,  # use the shared prepared data and token counts
    "workload": "train",  # train | idle (a dry run of the harness)
    "idle_seconds": 1.0,  # the idle workload's stand-in duration
    "memory_every_steps": 50,  # memory snapshots at steps 0 and 1, then every this many steps
}

# DeepSpeed ZeRO settings sbench renders into deepspeed.json and the memory prediction assumes:
# communication bucket sizes (elements), and the size under which ZeRO-3 keeps a parameter whole.
DEEPSPEED_BUCKET = 50_000_000
ZERO3_PERSISTENCE = 100_000
