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
- none: nothing measured resembles it (the plan says so; a budget counts it as unknown, never as free).

GPU-hours are the allocation's seconds times its devices (``number_gpus``; one for a CPU point without GPUs).
``bench/predict.py`` measures the error of these figures on a campaign's second run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

HISTORY = "history"
SHAPE_FIELDS = ("number_gpus", "number_nodes", "gpu_model", "model_max_length")


@dataclass(frozen=True)
class Seen:
    """One ok run the database holds, as a prediction reads it."""

    point_id: str
    experiment: str
    entity: Mapping[str, Any]  # its entity columns (model_name, batch_size, the shape, max_steps)
    elapsed_s: float  # the allocation's seconds
    train_s: float | None  # its training stage's seconds (train_end_wall - train_start_wall)


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


def devices_of(entity: Mapping[str, Any]) -> int:
    return max(1, int(entity.get("number_gpus") or 0))


def predict(point_id: str, repeat: int, experiment: str, entity: Mapping[str, Any], seen: Sequence[Seen]
            ) -> Prediction:
    """The prediction of one planned point from *seen* (every ok run of its model and experiment)."""
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
