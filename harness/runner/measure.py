"""What a training run measured, counted the same way by both trainers.

- :class:`Meter` and :class:`CountingCollator`: the entries, exact dataset tokens and train tokens (padding
  included) of every micro-batch a training step consumed;
- :class:`StopPolicy`: ``--stop_after_seconds`` and auto-stop, by the sweep's ``runner.auto_stop.method``:
  ``fixed`` (the reference's: warm-up, then a stable window of at least ``min_steps`` steps) or
  ``precision`` (:mod:`harness.runner.steady`: MSER-5's steady window, stopped once its 95 % interval is
  within ``rel_ci``, or at ``max_seconds``);
- :func:`make_callback`: the Trainer callback that times the steps, takes the stop decision (rank 0 decides
  and broadcasts it every step, with the precision window's first step, so all ranks stop together and
  measure the same steps), fires injected faults and takes the memory snapshots;
- :class:`RankClock`: this rank's own time per optimizer step (``runner.rank_timing``), which collect scores
  the ranks by (stragglers);
- :func:`measurements` and :func:`run_totals`: the rank's numbers over the measured window, and the run's.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from harness.contract.defaults import AUTO_STOP, RunnerSettings

from .memsnap import MemoryRecorder
from .profile import StepProfiler
from .rank import Context
from .steady import PrecisionRule, Steady, steady_state, window_stats

# index = the code rank 0 broadcasts; "precision" and "max_seconds" are the precision method's
STOP_REASONS = (None, "stop_after_seconds", "auto_stop", "precision", "max_seconds", "run_steps")


class Meter:
    """Counts what the training steps consumed, micro-batch by micro-batch.

    The collator wrapper measures each batch it builds (entries, exact non-padding tokens,
    tokens incl. padding) and queues the numbers; each training step takes the next one off
    the queue. Batches the data loader prefetched but training never used are not counted.
    """

    def __init__(self) -> None:
        # (entries, dataset tokens, tokens incl. padding, image tokens among the dataset tokens)
        self.pending: deque[tuple[int, int, int, int]] = deque()
        self.samples = 0
        self.dataset_tokens = 0
        self.image_tokens = 0
        self.train_tokens = 0
        self.micro_batches = 0
        self.mismatches = 0

    def collated(self, examples: list[dict[str, Any]], batch: dict[str, Any]) -> None:
        real = sum(len(e["input_ids"]) for e in examples)
        self.pending.append((len(examples), real, int(batch["input_ids"].numel()), 0))

    def consumed(self, inputs: dict[str, Any]) -> None:
        padded_now = int(inputs["input_ids"].numel())
        if self.pending:
            n, real, padded, images = self.pending.popleft()
            if padded != padded_now:
                self.mismatches += 1
        else:  # not built by our collator: count from the batch itself
            self.mismatches += 1
            n, real, padded = int(inputs["input_ids"].shape[0]), int(inputs["attention_mask"].sum()), padded_now
            images = 0
        self.samples += n
        self.dataset_tokens += real
        self.image_tokens += images
        self.train_tokens += padded
        self.micro_batches += 1

    def snapshot(self) -> dict[str, float]:
        # cpu_s: this rank's process CPU time (every thread), so its CPU utilisation over the measured
        # window is exact and its own (the sampler sees the node's whole process tree).
        return {"samples": self.samples, "dataset_tokens": self.dataset_tokens, "image_tokens": self.image_tokens,
                "train_tokens": self.train_tokens,
                "micro_batches": self.micro_batches, "cpu_s": time.process_time()}


class CountingCollator:
    """Wraps a collator; reports every batch it builds to a :class:`Meter`."""

    def __init__(self, inner: Any, meter: Meter) -> None:
        self.inner, self.meter = inner, meter

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if examples and "completion_mask" in examples[0]:
            # Completion-only loss, as the reference's response-template collator: prompt tokens are -100.
            examples = [{"input_ids": e["input_ids"],
                         "labels": [t if m else -100 for t, m in zip(e["input_ids"], e["completion_mask"])]}
                        for e in examples]
        batch = self.inner(examples)
        self.meter.collated(examples, batch)
        return batch


@dataclass
class StopPolicy:
    stop_after_seconds: float = -1.0
    auto_stop: bool = False
    warmup_seconds: float = RunnerSettings.warmup_seconds
    stable_seconds: float = RunnerSettings.stable_seconds
    min_steps: int = RunnerSettings.min_steps
    stop_method: str = RunnerSettings.stop_method
    rel_ci: float = RunnerSettings.rel_ci
    max_seconds: float = RunnerSettings.max_seconds
    max_run_steps: int = RunnerSettings.max_run_steps  # a search's short run: stop after this many steps

    @classmethod
    def of(cls, args: argparse.Namespace, runner: RunnerSettings) -> StopPolicy:
        """The command line's stop flags with the spec's auto-stop settings."""
        return cls(stop_after_seconds=args.stop_after_seconds, auto_stop=args.auto_stop_method == AUTO_STOP,
                   warmup_seconds=runner.warmup_seconds, stable_seconds=runner.stable_seconds,
                   min_steps=runner.min_steps, stop_method=runner.stop_method, rel_ci=runner.rel_ci,
                   max_seconds=runner.max_seconds, max_run_steps=runner.max_run_steps)

    @property
    def precision(self) -> PrecisionRule | None:
        """The precision rule when auto-stop is on and its method is ``precision``."""
        if not (self.auto_stop and self.stop_method == "precision"):
            return None
        return PrecisionRule(rel_ci=self.rel_ci, min_steps=self.min_steps, max_seconds=self.max_seconds)

    def record(self, doc: dict[str, Any], args: argparse.Namespace, ctx: Context) -> None:
        """Say in the rank's document how the run was to stop, once ``doc`` holds its measurements."""
        rule = self.precision
        if rule is not None:
            doc["auto_stop"] = {"method": args.auto_stop_method, "rule": "precision", "rel_ci": rule.rel_ci,
                                "min_steps": rule.min_steps, "max_seconds": rule.max_seconds}
        else:
            doc["auto_stop"] = ({"method": args.auto_stop_method, "warmup_seconds": self.warmup_seconds,
                                 "stable_seconds": self.stable_seconds, "min_steps": self.min_steps}
                                if self.auto_stop else None)
        doc["stop_after_seconds"] = args.stop_after_seconds
        if rule is not None:
            st = doc.get("steady_state")
            if doc.get("window") != "steady_state" or not st:
                ctx.note("auto-stop (precision): training ended before a steady state was found (fewer than 10 "
                         "steps); metrics include warm-up")
            elif st.get("ci_rel_halfwidth") is None or st["ci_rel_halfwidth"] > rule.rel_ci:
                width = "unknown" if st.get("ci_rel_halfwidth") is None else f"+-{100 * st['ci_rel_halfwidth']:.2f} %"
                ctx.note(f"auto-stop (precision): the throughput's 95 % interval is {width}, wider than the "
                         f"+-{100 * rule.rel_ci:g} % asked (stopped by {doc.get('stopped_by')})")
            elif st["steps"] < rule.min_steps:
                ctx.note(f"auto-stop (precision): the steady window holds {st['steps']} steps, fewer than "
                         f"min_steps {rule.min_steps} (stopped by {doc.get('stopped_by')})")
        elif self.auto_stop and doc.get("window") != "after_warmup":
            ctx.note("auto-stop: training ended before warm-up did; metrics include warm-up")

    @property
    def active(self) -> bool:
        return self.auto_stop or self.stop_after_seconds > 0 or self.max_run_steps > 0

    def decide(self, *, elapsed: float, step: int, warm: bool, warm_elapsed: float | None,
               warm_step: int | None) -> tuple[bool, bool, str | None]:
        """``(stop, warm, reason)`` after a step that ended ``elapsed`` seconds into training."""
        if self.stop_after_seconds > 0 and elapsed >= self.stop_after_seconds:
            return True, warm, "stop_after_seconds"
        if 0 < self.max_run_steps <= step:
            return True, warm, "run_steps"
        if self.auto_stop:
            if not warm:
                if elapsed >= self.warmup_seconds:
                    return False, True, None
                return False, False, None
            assert warm_elapsed is not None and warm_step is not None
            if elapsed - warm_elapsed >= self.stable_seconds and step - warm_step >= self.min_steps:
                return True, True, "auto_stop"
        return False, warm, None

    def decide_precision(self, times: list[float], elapsed: float) -> tuple[bool, str | None, int]:
        """``(stop, reason, start)`` under the precision method, after a step that ended ``elapsed`` seconds into
        training; *times* are the step times so far. *start*: the steps of warm-up the measured window leaves out
        when the run stops here, else -1."""
        rule = self.precision
        assert rule is not None
        if self.stop_after_seconds > 0 and elapsed >= self.stop_after_seconds:
            found = steady_state(times)
            return True, "stop_after_seconds", found.start if found is not None else -1
        if 0 < self.max_run_steps <= len(times):
            found = steady_state(times)
            return True, "run_steps", found.start if found is not None else -1
        stop, reason, found = rule.decide(times, elapsed)
        return stop, reason, found.start if found is not None else -1


class RankClock:
    """This rank's own time per optimizer step: the time of its forward passes (hooks on the top module, inside
    DDP's wrapper, so its buffer broadcast is outside) plus the time from its optimizer step to the end of its
    step-end callbacks (the optimizer, the scheduler, zeroing the gradients, injected faults), before the stop
    decision's broadcast. What it leaves out is where a rank waits for the others: the batch's token count
    gathered across ranks, the backward pass (the gradient all-reduce), gradient clipping and the broadcast. In
    a synchronous run every rank's step takes as long as the slowest rank's; its own time does not, so a rank
    that is slow stands out against the others (``collect.stragglers``). A straggler's delay is waited for where
    the ranks first meet in the next step, the token count gathered across ranks (the Trainer's
    ``average_tokens_across_devices``, on by default), which is outside; without it, FSDP's parameter gathers in
    the forward pass wait for the straggler inside the others' forward time, and the scores understate it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.own: list[float] = []  # per optimizer step, in step order
        self._forward_s = 0.0
        self._forward_t: float | None = None
        self._local_t: float | None = None
        self._hooked = False

    def hook(self, model: Any) -> None:
        if not self.enabled or self._hooked or model is None:
            return
        self._hooked = True

        def before(module: Any, args: Any) -> None:
            self._forward_t = time.perf_counter()

        def after(module: Any, args: Any, output: Any) -> None:
            if self._forward_t is not None and module.training:
                self._forward_s += time.perf_counter() - self._forward_t
            self._forward_t = None

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after)

    def optimizer_begins(self) -> None:
        if self.enabled:
            self._local_t = time.perf_counter()

    def step_ends(self) -> None:
        """The step's local work is done (call it after the faults, before any collective)."""
        if not self.enabled:
            return
        local = time.perf_counter() - self._local_t if self._local_t is not None else 0.0
        self.own.append(round(self._forward_s + local, 6))
        self._forward_s, self._local_t = 0.0, None


def step_times(timeline: dict[str, Any]) -> list[float]:
    """Each step's duration (perf_counter): from the previous step's end, the first from the start of training."""
    ends = timeline.get("step_t", [])
    return [b - a for a, b in zip([timeline["t0"], *ends[:-1]], ends)]


def _set_window(timeline: dict[str, Any], start: int) -> None:
    """The precision window leaves out the first *start* steps: it begins where step *start* ended."""
    timeline["window_start"] = start
    if start == 0:
        timeline["warm_t"], timeline["warmup_end_wall"] = timeline["t0"], timeline["train_start_wall"]
        timeline["warm_counts"] = timeline["start_counts"]
    else:
        timeline["warm_t"], timeline["warmup_end_wall"] = timeline["step_t"][start - 1], \
            timeline["step_end_wall"][start - 1]
        timeline["warm_counts"] = timeline["step_counts"][start - 1]
    timeline["warm_step"] = timeline["start_step"] + start


def timed_log_level(level: str) -> str | None:
    """Make logging no more verbose than *level* (``runner.train_log_level``) from here on: the root logger,
    every logger set more verbose, and transformers' own verbosity. Returns a note when that changed something
    (the seed's ``--log_level debug`` holds for start-up; inside the timed steps a debug line per decoded image
    costs time the throughput would count), else None."""
    import transformers  # heavy: only where a model is trained

    want = logging.getLevelName(level.upper())
    if not isinstance(want, int):
        return None
    lowered: list[str] = []
    loggers = [logging.getLogger(), *(x for x in list(logging.root.manager.loggerDict.values())
                                      if isinstance(x, logging.Logger))]
    for lg in loggers:
        if lg.level != logging.NOTSET and lg.level < want:
            lowered.append(lg.name)
            lg.setLevel(want)
    if transformers.utils.logging.get_verbosity() < want:
        lowered.append("transformers")
        transformers.utils.logging.set_verbosity(want)
    if not lowered:
        return None
    return (f"logging at most {level} in the timed steps (runner.train_log_level), lowered from the command line's "
            f"for {len(lowered)} logger(s): a line logged per step or per image costs time the throughput counts; "
            "runner.train_log_level: debug keeps it")


def make_callback(ctx: Context, meter: Meter, policy: StopPolicy, timeline: dict[str, Any],
                   memory: MemoryRecorder | None = None) -> Any:
    import torch  # heavy: only where a model is built or trained
    from transformers import TrainerCallback  # heavy: only where a model is built or trained

    rule = policy.precision
    profiler = StepProfiler(ctx)  # runner.profile: a few steps of one repeat, on the ranks it names
    clock = RankClock(ctx.runner.rank_timing)
    timeline["clock"] = clock

    def distributed() -> bool:
        return bool(ctx.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized())

    class BenchCallback(TrainerCallback):
        """Times steps, takes the stop decision (rank 0, broadcast), fires injected faults and takes the
        memory snapshots (harness.runner.memsnap)."""

        def on_train_begin(self, args, state, control, **kw):
            said = timed_log_level(ctx.runner.train_log_level)
            if said is not None:
                ctx.note(said)
            timeline["train_start_wall"], timeline["t0"] = time.time(), time.perf_counter()
            timeline["start_step"] = state.global_step
            timeline["start_counts"] = meter.snapshot()
            clock.hook(kw.get("model"))  # before the memory recorder's hook: its snapshots are not the rank's work
            if memory is not None:
                memory.device, memory.optimizer = args.device, kw.get("optimizer")
                memory.hook(kw.get("model"), lambda: state.global_step)
                memory.attach_deepspeed(kw.get("model"), lambda: state.global_step)
            profiler.train_begin()

        def on_step_begin(self, args, state, control, **kw):
            profiler.step_begin()
            if memory is not None:
                memory.take(kw.get("model"), state.global_step, "before_forward")

        def on_pre_optimizer_step(self, args, state, control, **kw):
            clock.optimizer_begins()
            if memory is not None and not memory.deepspeed:
                memory.optimizer = kw.get("optimizer") or memory.optimizer
                memory.take(kw.get("model"), state.global_step, "after_backward")
            profiler.before_optimizer()
            ctx.fault_before_optimizer(state.global_step + 1)  # the step whose optimizer runs next

        def on_optimizer_step(self, args, state, control, **kw):
            if memory is not None and not memory.deepspeed:
                memory.take(kw.get("model"), state.global_step, "after_optimizer")
            profiler.after_optimizer()

        def on_step_end(self, args, state, control, **kw):
            self._step_end(args, state, control)
            profiler.step_end(state.global_step)  # after the stop decision: its broadcast is the step's too
            return control

        def _step_end(self, args, state, control):
            now_wall, now = time.time(), time.perf_counter()
            timeline["end_wall"], timeline["t_end"], timeline["end_step"] = now_wall, now, state.global_step
            timeline.setdefault("step_end_wall", []).append(now_wall)  # step-time distribution, stragglers
            timeline["end_counts"] = meter.snapshot()
            if rule is not None:  # the precision window may begin after any step: keep each one's clock and counts
                timeline.setdefault("step_t", []).append(now)
                timeline.setdefault("step_counts", []).append(timeline["end_counts"])
            ctx.fault_at_step(state.global_step)
            clock.step_ends()
            if not policy.active:
                return control
            warm = timeline.get("warm_t") is not None
            start = -1
            if rule is not None:  # rank 0's decision is the one broadcast: the others need not compute it
                stop, reason, start = (policy.decide_precision(step_times(timeline), now - timeline["t0"])
                                       if ctx.rank == 0 or not distributed() else (False, None, -1))
                warm_now = False
            else:
                stop, warm_now, reason = policy.decide(
                    elapsed=now - timeline["t0"], step=state.global_step, warm=warm,
                    warm_elapsed=None if not warm else timeline["warm_t"] - timeline["t0"],
                    warm_step=timeline.get("warm_step"))
            if distributed():
                code = STOP_REASONS.index(reason) if stop else 0
                flags = torch.tensor([code, int(warm_now), start], dtype=torch.int64, device=args.device)
                torch.distributed.broadcast(flags, src=0)  # rank 0 decides for everyone
                code, warm_now, start = int(flags[0].item()), bool(flags[1].item()), int(flags[2].item())
                stop, reason = code > 0, STOP_REASONS[code]
            if start >= 0:
                _set_window(timeline, start)
            if warm_now and not warm:
                timeline["warm_t"], timeline["warmup_end_wall"] = now, now_wall
                timeline["warm_step"], timeline["warm_counts"] = state.global_step, meter.snapshot()
            if stop:
                timeline["stopped_by"] = reason
                control.should_training_stop = True
            return control

        def on_train_end(self, args, state, control, **kw):
            profiler.train_end()
            # Training ended without the precision rule stopping it (max_steps, epochs): the window is still
            # MSER-5's, found by rank 0 and shared, as every rank reaches this point.
            if rule is None or "window_start" in timeline or not timeline.get("step_t"):
                return control
            found = steady_state(step_times(timeline)) if ctx.rank == 0 else None
            start = found.start if found is not None else -1
            if distributed():
                flags = torch.tensor([start], dtype=torch.int64, device=args.device)
                torch.distributed.broadcast(flags, src=0)
                start = int(flags[0].item())
            if start >= 0:
                _set_window(timeline, start)
            return control

    return BenchCallback()


def measurements(timeline: dict[str, Any], policy: StopPolicy, max_steps: int) -> dict[str, Any]:
    """The rank's measured window: after warm-up under auto-stop, otherwise the whole run."""
    out: dict[str, Any] = {
        "train_start_wall": timeline.get("train_start_wall"),
        "train_end_wall": timeline.get("end_wall"),
        "warmup_end_wall": timeline.get("warmup_end_wall"),
    }
    end_step = timeline.get("end_step", 0)
    stopped = timeline.get("stopped_by")
    if stopped is None:
        stopped = "max_steps" if max_steps > 0 and end_step >= max_steps else "epochs"
    out["stopped_by"] = stopped
    out["global_step"] = end_step
    out["step_end_wall"] = timeline.get("step_end_wall", [])
    clock = timeline.get("clock")
    if isinstance(clock, RankClock) and clock.enabled:
        out["step_own_s"] = list(clock.own)  # aligned with step_end_wall (collect.aggregate.rank_scores)
    if "t_end" not in timeline:
        out["metrics"] = None
        return out
    out["steady_state"] = None
    if policy.precision is not None and "window_start" in timeline:
        t_start, step0, c0 = timeline["warm_t"], timeline["warm_step"], timeline["warm_counts"]
        out["window"] = "steady_state"
        out["steady_state"] = steady_record(step_times(timeline), timeline["window_start"], timeline["start_step"])
    elif policy.auto_stop and timeline.get("warm_t") is not None:
        t_start, step0, c0 = timeline["warm_t"], timeline["warm_step"], timeline["warm_counts"]
        out["window"] = "after_warmup"
    else:
        t_start, step0, c0 = timeline["t0"], timeline["start_step"], timeline["start_counts"]
        out["window"] = "whole_run" if not policy.auto_stop else "whole_run_warmup_not_reached"
    c1 = timeline["end_counts"]
    runtime = timeline["t_end"] - t_start
    d = {k: c1[k] - c0[k] for k in c1}
    steps = end_step - step0

    def rate(x: float) -> float | None:
        return x / runtime if runtime > 0 else None

    # Rank-local numbers; run_totals() turns samples and dataset tokens into run totals (all ranks).
    out["metrics"] = {
        "train_runtime": runtime,
        "train_steps": steps,
        "train_steps_per_second": rate(steps),
        "train_tokens": d["train_tokens"],
        "train_tokens_per_second": rate(d["train_tokens"]),
        "rank_train_samples": d["samples"],
        "rank_train_samples_per_second": rate(d["samples"]),
        "rank_dataset_tokens": d["dataset_tokens"],
        "rank_dataset_tokens_per_second": rate(d["dataset_tokens"]),
        "rank_dataset_image_tokens": d.get("image_tokens", 0),
        "rank_micro_batches": d["micro_batches"],
        "cpu_seconds": d["cpu_s"],
        "cpu_util_pct": 100.0 * d["cpu_s"] / runtime if runtime > 0 else None,
    }
    tot, t0c = timeline["end_counts"], timeline["start_counts"]
    out["totals"] = {"runtime": timeline["t_end"] - timeline["t0"], "steps": end_step - timeline["start_step"],
                     **{f"rank_{k}": tot[k] - t0c[k] for k in tot}}
    return out


def steady_record(times: list[float], start: int, start_step: int) -> dict[str, Any]:
    """``rank.<r>.json``'s ``steady_state``: the precision window and its statistics over this rank's own step
    times (rank 0's are the ones the decision saw)."""
    st: Steady | None = window_stats(times, start)
    ci = st.interval if st is not None else None
    return {"start_step": start_step + start, "end_step": start_step + len(times), "steps": len(times) - start,
            "warmup_steps": start, "step_time_mean_s": st.mean_s if st else None, "step_time_cv": st.cv if st else None,
            "ci_half_s": ci.half if ci else None, "ci_rel_halfwidth": ci.rel if ci else None,
            "ci_batches": ci.n if ci else None, "ci_batch_size": ci.batch_size if ci else None}


def run_totals(metrics: dict[str, Any], world_size: int, device: Any) -> None:
    """Add the run's samples and dataset tokens (all ranks, one all-reduce) to rank-local *metrics*.

    As in the reference (HF's ``train_samples_per_second`` counts every device's samples; note 3
    counts the run's dataset tokens), ``train_samples*`` and ``dataset_tokens*`` are run totals;
    ``train_tokens*`` stay this rank's (collect scales them by world size, the seeds' FSDP estimate).
    """
    import torch  # heavy: only where a model is built or trained

    counts = [metrics["rank_train_samples"], metrics["rank_dataset_tokens"], metrics["train_tokens"],
              metrics.get("rank_dataset_image_tokens", 0)]
    if world_size > 1 and torch.distributed.is_initialized():
        t = torch.tensor(counts, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        counts = [int(x) for x in t.tolist()]
    samples, dtok, ttok, itok = counts
    rt = metrics["train_runtime"]
    metrics.update({
        "world_size": world_size,
        "train_samples": samples,
        "train_samples_per_second": samples / rt if rt > 0 else None,
        "dataset_tokens": dtok,
        "dataset_tokens_per_second": dtok / rt if rt > 0 else None,
        "dataset_tokens_per_second_per_gpu": dtok / rt / world_size if rt > 0 else None,
        # image tokens among dataset_tokens (vision datasets; 0 for text): text-only rates are the difference's
        "dataset_image_tokens": itok,
        "run_train_tokens": ttok,
    })
