"""What a campaign will cost before it runs: each valid point's allocation seconds and GPU-hours, from what the
results database measured before (pure: the database's rows come in as :class:`Seen`).

A point's prediction has a source:

- ``history``, the same point measured before (any campaign): the median of its runs' allocation seconds
  (``runs.elapsed_s``), the least and the most of them its range;
- ``history``, the same model, experiment and shape (GPUs, nodes, GPU model, sequence length, max_steps) at other
  batch sizes: where the point trains a fixed number of steps and two batches or more were measured, the shape's
  median start-up (allocation seconds less training seconds) plus training seconds fitted as a + b x batch (a
  step's fixed cost and its cost per sample; a tiny model's step is mostly fixed cost, a large one's mostly per
  sample); with one batch measured, each of its runs' start-up plus its training seconds scaled by the batch
  ratio; where the point trains for a time, the nearest batch's seconds as they are;
- ``model``, where nothing of its shape was measured: the FLOP model (:mod:`harness.spec.flops`, counted from the
  architecture by :func:`harness.spec.memory.flop_counts`). Training is ``max_steps`` x ``batch_size`` x
  ``gradient_accumulation_steps`` x ``model_max_length`` tokens (every sequence counted at its full length: an
  upper bound where the entries are shorter) x the model FLOPs per token, over MFU x the peak x the devices;
  capped at ``stop_after_seconds``. The peak is the partition's measured one (the median of ``measured_peaks``
  at the compute dtype, from ``sbench preflight``), else the inventory's or the datasheet's. The MFU is the
  median of this model's measured runs on the same GPU model (their least and most give the range), else
  :data:`DEFAULT_MFU` (range :data:`DEFAULT_MFU_RANGE`). The start-up (allocation seconds less training seconds)
  is the median of this model's runs, else of every run on the same GPU model, else not counted (said so). A
  point that trains by epochs has no token count before it runs: not predicted this way;
- none: nothing measured resembles it and the FLOP model lacks a figure (the plan says which; a budget counts it
  as unknown, never as free).

GPU-hours are the allocation's seconds times its devices (``number_gpus``; one for a CPU point without GPUs).
``bench/predict.py`` measures the error of these figures on a campaign's second run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from harness.contract.records import Predicted

from .schema import slurm_time_key

HISTORY = "history"
MODEL = "model"
DEFAULT_MFU = 0.25  # a fine-tuning step's usual share of the peak on a GPU where none of the model was measured
DEFAULT_MFU_RANGE = (0.15, 0.40)
SHAPE_FIELDS = ("number_gpus", "number_nodes", "gpu_model", "model_max_length")


@dataclass(frozen=True)
class Seen:
    """One ok run the database holds, as a prediction reads it."""

    point_id: str
    experiment: str
    entity: Mapping[str, Any]  # its entity columns (model_name, batch_size, the shape, max_steps)
    elapsed_s: float  # the allocation's seconds
    train_s: float | None  # its training stage's seconds (train_end_wall - train_start_wall)
    mfu: float | None = None  # its measured MFU


@dataclass(frozen=True)
class Compute:
    """What the FLOP model knows of a planned point before it runs (:func:`harness.spec.plan.plan_sweep`)."""

    flops_per_token: float | None  # model FLOPs per token at model_max_length; None: *missing* says why
    dtype: str  # the compute dtype its peak is read for
    peak_tflops: float | None  # one device's peak from the inventory or the datasheet
    peak_source: str
    missing: str | None = None


@dataclass(frozen=True)
class Fleet:
    """What the database knows beyond a point's own model: each partition's measured peak per compute dtype, and
    each GPU model's start-up seconds (allocation less training) over every ok run."""

    peaks: Mapping[tuple[str, str], float]  # (partition, dtype) -> median measured peak TFLOP/s
    startups: Mapping[str, Sequence[float]]  # gpu_model -> start-up seconds of its runs


@dataclass(frozen=True)
class Prediction:
    point_id: str
    repeat: int
    seconds: float | None
    low: float | None
    high: float | None
    devices: int
    source: str | None  # history, or None: nothing measured resembles it
    basis: str  # what it was predicted from, in words

    @property
    def gpu_hours(self) -> float | None:
        return None if self.seconds is None else self.seconds * self.devices / 3600

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_seconds": self.seconds, "predicted_low_s": self.low, "predicted_high_s": self.high,
                "predicted_gpu_hours": self.gpu_hours, "devices": self.devices, "prediction_source": self.source,
                "prediction_basis": self.basis}

    def recorded(self) -> Predicted:
        """What an attempt's manifest line keeps of it (the ``runs`` columns of the same names)."""
        return Predicted(predicted_seconds=self.seconds, predicted_low_s=self.low, predicted_high_s=self.high,
                         prediction_source=self.source, prediction_basis=self.basis)


def devices_of(entity: Mapping[str, Any]) -> int:
    return max(1, int(entity.get("number_gpus") or 0))


def predict(point_id: str, repeat: int, experiment: str, entity: Mapping[str, Any], seen: Sequence[Seen],
            compute: Compute | None = None, fleet: Fleet | None = None, partition: str | None = None
            ) -> Prediction:
    """The prediction of one planned point from *seen* (every ok run of its model), else from the FLOP model
    (*compute*, with the *fleet*'s measured peak of its *partition*)."""
    found = _from_history(point_id, repeat, experiment, entity, seen)
    if found.source is not None or compute is None:
        return found
    return _from_model(point_id, repeat, entity, seen, compute, fleet or Fleet({}, {}), partition)


def _from_history(point_id: str, repeat: int, experiment: str, entity: Mapping[str, Any], seen: Sequence[Seen]
                  ) -> Prediction:
    devices = devices_of(entity)
    same = [s.elapsed_s for s in seen if s.point_id == point_id]
    if same:
        return Prediction(point_id, repeat, median(same), min(same), max(same), devices, HISTORY,
                          f"this point, {len(same)} run(s)")
    shape = [s for s in seen if s.experiment == experiment and s.train_s is not None
             and s.entity.get("model_name") == entity.get("model_name")
             and all(s.entity.get(k) == entity.get(k) for k in SHAPE_FIELDS)
             and s.entity.get("max_steps") == entity.get("max_steps") and s.entity.get("batch_size")]
    batch = float(entity.get("batch_size") or 0)
    fixed_steps = int(entity.get("max_steps") or -1) > 0
    batches = sorted({float(s.entity["batch_size"]) for s in shape})
    if fixed_steps and len(batches) >= 2 and batch > 0:
        # two batches or more of the shape: a fixed number of steps trains in a + b x batch seconds (a step's
        # fixed cost and its cost per sample), fitted to each batch's median; the start-up is the shape's median
        per = {bs: median(s.train_s or 0.0 for s in shape if float(s.entity["batch_size"]) == bs) for bs in batches}
        slope, icept = _line(list(per), list(per.values()))
        startup = median(s.elapsed_s - (s.train_s or 0.0) for s in shape)
        train = max(icept + slope * batch, min(per.values()) if batch >= batches[0] else 0.0)
        got = [startup + train]
        spread = [s.elapsed_s - (s.train_s or 0.0) + train for s in shape]
        return Prediction(point_id, repeat, got[0], min(spread), max(spread), devices, HISTORY,
                          f"batches {', '.join(f'{bs:g}' for bs in batches)} of this shape ({len(shape)} run(s)), "
                          "training fitted as a + b x batch")
    if shape and batch > 0:
        nearest = min(batches, key=lambda b: (abs(b - batch), b))
        runs = [s for s in shape if float(s.entity["batch_size"]) == nearest]
        ratio = batch / nearest if fixed_steps else 1.0
        got = [(s.elapsed_s - (s.train_s or 0.0)) + (s.train_s or 0.0) * ratio for s in runs]
        return Prediction(point_id, repeat, median(got), min(got), max(got), devices, HISTORY,
                          f"batch {nearest:g} of this shape, {len(runs)} run(s)"
                          + (f", training scaled x{ratio:.3g}" if ratio != 1.0 else ""))
    return Prediction(point_id, repeat, None, None, None, devices, None,
                      "nothing measured of this model and shape (collect a run of it, or predict from a similar "
                      "campaign's database with --db)")


def _from_model(point_id: str, repeat: int, entity: Mapping[str, Any], seen: Sequence[Seen], compute: Compute,
                fleet: Fleet, partition: str | None) -> Prediction:
    devices = devices_of(entity)

    def none(why: str) -> Prediction:
        return Prediction(point_id, repeat, None, None, None, devices, None,
                          f"nothing measured of this model and shape, and no FLOP model: {why}")

    steps = int(entity.get("max_steps") or -1)
    if compute.flops_per_token is None:
        return none(compute.missing or "no FLOP count for this architecture")
    if steps <= 0:
        return none("it trains by epochs, whose tokens are not known before it runs")
    measured = fleet.peaks.get((partition or "", compute.dtype))
    peak, peak_from = ((measured, f"the partition's measured peak {measured:,.4g} TFLOP/s ({compute.dtype})")
                       if measured else (compute.peak_tflops, f"the {compute.peak_source} peak "
                                         f"{compute.peak_tflops or 0:,.4g} TFLOP/s ({compute.dtype})"))
    if not peak:
        return none(f"no peak TFLOP/s for {entity.get('gpu_model') or 'its devices'} at {compute.dtype} (run sbench "
                    "preflight on the partition, or set the partition's peak_tflops)")
    gpu = str(entity.get("gpu_model") or "")
    mfus = [s.mfu for s in seen if s.mfu and s.mfu > 0 and s.entity.get("model_name") == entity.get("model_name")
            and str(s.entity.get("gpu_model") or "") == gpu]
    if mfus:
        mfu, mfu_lo, mfu_hi = median(mfus), min(mfus), max(mfus)
        mfu_from = f"MFU {mfu:.3g} ({len(mfus)} run(s) of this model on {gpu or 'these devices'})"
    else:
        mfu, (mfu_lo, mfu_hi) = DEFAULT_MFU, DEFAULT_MFU_RANGE
        mfu_from = f"MFU {mfu:g} assumed ({mfu_lo:g} to {mfu_hi:g}: nothing of this model measured on {gpu or 'them'})"
    tokens = (steps * int(entity.get("batch_size") or 0) * int(entity.get("gradient_accumulation_steps") or 1)
              * int(entity.get("model_max_length") or 0))
    if tokens <= 0:
        return none("no token count (batch_size or model_max_length missing)")
    work = tokens * compute.flops_per_token / (peak * 1e12 * devices)
    cap = float(entity.get("stop_after_seconds") or 0)

    def train(m: float) -> float:
        return min(work / m, cap) if cap > 0 else work / m

    own = [s.elapsed_s - s.train_s for s in seen if s.train_s is not None
           and s.entity.get("model_name") == entity.get("model_name")]
    startups, start_from = (own, "this model's") if own else (list(fleet.startups.get(gpu, ())), f"{gpu}'s")
    startup = median(startups) if startups else 0.0
    start_words = (f"start-up {startup:,.0f} s ({start_from} {len(startups)} run(s))" if startups
                   else "no start-up measured (not counted)")
    low = min(startups, default=0.0) + train(mfu_hi)
    high = max(startups, default=0.0) + train(mfu_lo)
    return Prediction(point_id, repeat, startup + train(mfu), low, high, devices, MODEL,
                      f"FLOP model: {tokens:,} tokens x {compute.flops_per_token:,.4g} FLOP at {mfu_from} of "
                      f"{peak_from}; {start_words}" + (f"; capped at stop_after_seconds {cap:g}" if cap > 0 and
                                                       work / mfu > cap else ""))


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares (slope, intercept), the slope at least 0 (a larger batch never trains faster per step)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var) if var else 0.0
    return slope, my - slope * mx


@dataclass(frozen=True)
class Totals:
    seconds: float  # of the points with a prediction
    gpu_hours: float
    predicted: int
    unknown: int  # valid points without one

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_seconds": self.seconds, "predicted_gpu_hours": self.gpu_hours,
                "points_predicted": self.predicted, "points_unknown": self.unknown}


def totals(preds: Sequence[Prediction]) -> Totals:
    known = [p for p in preds if p.seconds is not None]
    return Totals(sum(p.seconds or 0.0 for p in known), sum(p.gpu_hours or 0.0 for p in known), len(known),
                  len(preds) - len(known))


def unseen_by_budget(preds: Sequence[Prediction]) -> str | None:
    """What a budget cannot see: the runs with no prediction, which count as nothing against it (None: none)."""
    unknown = sum(p.seconds is None for p in preds)
    if not unknown:
        return None
    return (f"budget: {unknown} run(s) have no prediction (nothing like them measured, and no peak for the FLOP "
            "model: preflight, or the partition's peak_tflops) and count as nothing against it")


def beyond_time(preds: Sequence[Prediction], limit: str) -> str | None:
    """The runs predicted to take longer than their time limit *limit* (SLURM ends them at TIMEOUT, with
    nothing measured); None when none is."""
    most_s = slurm_time_key(limit) * 60  # (a validated time: the sweep's, the inventory's, or the default)
    over = [p for p in preds if p.seconds is not None and p.seconds > most_s]
    if not over:
        return None
    worst = max(over, key=lambda p: p.seconds or 0.0)
    return (f"{len(over)} run(s) are predicted to take longer than their time limit {limit}: the longest, "
            f"{worst.point_id} r{worst.repeat}, about {(worst.seconds or 0.0) / 60:,.0f} min ({worst.basis}); SLURM "
            "would end them at TIMEOUT before they finish: raise slurm.time (within the partition's time_limit) or "
            "lower max_steps")


def over_budget(budget: Any, preds: Sequence[Prediction], spent_gpu_hours: float = 0.0,
                spent_allocation_hours: float = 0.0) -> str | None:
    """Why the campaign would pass its *budget* (``harness.spec.sweep.Budget``): what it spent so far plus the
    predicted runs, with the largest of them; None when it stays within (points without a prediction count as
    nothing here: the caller says how many there are)."""
    t = totals(preds)
    gpu, alloc = spent_gpu_hours + t.gpu_hours, spent_allocation_hours + t.seconds / 3600
    over = []
    if budget.gpu_hours is not None and gpu > budget.gpu_hours:
        over.append(f"{gpu:,.3g} GPU-hours predicted, budget.gpu_hours {budget.gpu_hours:g}")
    if budget.allocation_hours is not None and alloc > budget.allocation_hours:
        over.append(f"{alloc:,.3g} allocation hours predicted, budget.allocation_hours {budget.allocation_hours:g}")
    if not over:
        return None
    largest = sorted((p for p in preds if p.seconds is not None), key=lambda p: -(p.gpu_hours or 0.0))[:5]
    spent = (f" ({spent_gpu_hours:,.3g} GPU-hours spent already)" if spent_gpu_hours else "")
    return ("; ".join(over) + spent + "; the largest runs: "
            + ", ".join(f"{p.point_id} r{p.repeat} {p.gpu_hours:,.3g} GPU-h ({p.basis})" for p in largest))
