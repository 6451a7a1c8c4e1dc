"""Why N devices are not N times faster: a campaign's shapes of one model, method and per-device batch side by side.

For each group (model × experiment × per-device batch) and each shape in it (number of GPUs, or CPU worker
processes, and nodes), one row: the shape's ``dataset_tokens_per_second`` (the mean of its runs, with a 95 %
Student-t interval from the runs' spread where it has two or more), and its **scaling efficiency**: its
throughput over the smallest shape's times the ratio of devices (1 = perfectly linear). Beside it, what may
explain a loss: the **exposed communication**'s share of the step (where one of the shape's points was profiled:
``profile_ops``), the fabric's measured all-reduce **bus bandwidth** at that node count (``sbench fabric``), the
runs flagged as **stragglers**, and the **MFU**.

``explained_by``, for a shape whose efficiency is under the threshold (default :data:`EFFICIENCY_THRESHOLD`):

- ``straggler``: one of its runs had a straggler rank (the slowest rank sets every rank's pace);
- ``communication``: the step's exposed communication accounts for the loss: without it the efficiency would be
  back above the threshold (``efficiency / (1 - exposed share) >= threshold``);
- ``unexplained``: none of these does (profile the shape: ``runner.profile``, or measure the fabric).

A shape at or above the threshold has none; the smallest shape is the baseline.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract.stats import mean_half_width
from harness.spec.resources import per_device_batch

EFFICIENCY_THRESHOLD = 0.9  # a shape under this share of linear scaling gets an explanation


def _interval(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The 95 % Student-t interval of the mean of *values* (None, None for fewer than two)."""
    if len(values) < 2:
        return None, None
    mean, half = statistics.fmean(values), mean_half_width(values)
    return mean - half, mean + half


def scaling_rows(runs: Sequence[Mapping[str, Any]], exposed: Sequence[Mapping[str, Any]],
                 fabric: Sequence[Mapping[str, Any]], threshold: float = EFFICIENCY_THRESHOLD) -> list[dict[str, Any]]:
    """One row per group and shape, groups in order, shapes by devices then nodes (see the module doc)."""
    comm = {str(e["point_id"]): e for e in exposed}
    bw = {(f.get("partition"), int(f["nodes"])): f.get("busbw_gbps") for f in fabric if f.get("nodes") is not None}
    groups: dict[tuple[Any, ...], dict[tuple[int, int], list[Mapping[str, Any]]]] = {}
    for r in runs:
        key = (r.get("model_name"), r.get("experiment"), None if r.get("batch_size") is None else per_device_batch(r))
        shape = (max(1, int(r.get("number_gpus") or 0)), max(1, int(r.get("number_nodes") or 1)))
        groups.setdefault(key, {}).setdefault(shape, []).append(r)
    out: list[dict[str, Any]] = []
    for (model, experiment, per_device), shapes in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        ordered = sorted(shapes)
        base_gpus, _ = ordered[0]
        base_tps = statistics.fmean(float(r["dataset_tokens_per_second"]) for r in shapes[ordered[0]])
        for gpus, nodes in ordered:
            mine = shapes[(gpus, nodes)]
            tps = [float(r["dataset_tokens_per_second"]) for r in mine]
            mean = statistics.fmean(tps)
            low, high = _interval(tps)
            eff = mean / (base_tps * gpus / base_gpus) if base_tps > 0 else None
            shares = [comm[str(r["point_id"])]["exposed_share"] for r in mine
                      if str(r["point_id"]) in comm and comm[str(r["point_id"])]["exposed_share"] is not None]
            exposed_share = statistics.fmean(shares) if shares else None
            stragglers = sorted({s for r in mine if r.get("straggler") for s in (r.get("straggler_ranks") or [])})
            mfus = [float(r["mfu"]) for r in mine if r.get("mfu") is not None]
            partitions = {r.get("partition") for r in mine}
            busbw = bw.get((next(iter(partitions)), nodes)) if len(partitions) == 1 and nodes > 1 else None
            why = None
            if eff is not None and (gpus, nodes) != ordered[0] and eff < threshold:
                if stragglers:
                    why = "straggler"
                elif exposed_share is not None and exposed_share < 1 and eff / (1 - exposed_share) >= threshold:
                    why = "communication"
                else:
                    why = "unexplained"
            out.append({"model_name": model, "experiment": experiment, "per_device_batch_size": per_device,
                        "number_gpus": gpus, "number_nodes": nodes, "runs": len(mine),
                        "dataset_tokens_per_second": mean, "low": low, "high": high, "efficiency": eff,
                        "exposed_communication_share": exposed_share, "fabric_busbw_gbps": busbw,
                        "stragglers": stragglers, "straggler_runs": sum(1 for r in mine if r.get("straggler")),
                        "busy_runs": sum(1 for r in mine if r.get("host_busy") or r.get("shared_host")),
                        "mfu": statistics.fmean(mfus) if mfus else None, "explained_by": why})
    return out
