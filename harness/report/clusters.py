"""The report's view across clusters: the points a page shows, as every campaign in the database measured them
(this cluster's, those imported from other clusters' databases, and the reference's published measurements),
side by side, grouped by ``gpu_model`` and cluster, each point's reference measurement as a line of its own.

Campaigns are matched by point id, published measurements on the entity fields their file gives
(:func:`harness.spec.published.matches`). The section appears when some point of the page was measured by
more than one cluster, or by a reference campaign.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract.exchange import ORIGIN_ADO_CSV
from harness.db.reportdata import across_campaigns, across_clusters, published_measurements
from harness.db.schema import ENTITY_FIELDS
from harness.db.store import Store
from harness.spec.published import matches

REFERENCE = "reference"  # the cluster column's word for a published measurement


def load_clusters(store: Store, measurements: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (point, campaign) measuring a point of *measurements*: its median dataset tok/s over its valid
    runs, how many, its gpu_model and cluster, and its ratio to the point's reference (the median of the
    reference campaigns' matching measurements); empty when no point has more than one cluster or a reference."""
    points: dict[str, dict[str, Any]] = {}
    for m in measurements:
        points.setdefault(str(m["point_id"]), {**{k: m.get(k) for k in ENTITY_FIELDS},
                                               "experiment": m.get("experiment")})
    if not points or not across_clusters(store, list(points)):
        return []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in across_campaigns(store, list(points)):
        if r.get("origin") != ORIGIN_ADO_CSV:
            groups.setdefault((str(r["point_id"]), str(r["campaign"])), []).append(r)
    for ref in published_measurements(store):
        for pid, entity in points.items():
            if matches(ref["given"], entity):
                groups.setdefault((pid, str(ref["campaign"])), []).append({**ref, "cluster": REFERENCE})
    out = []
    for (pid, camp), rows in groups.items():
        p = points[pid]
        out.append({"point_id": pid, "campaign": camp, "cluster": rows[0].get("cluster") or "?",
                    "gpu_model": p.get("gpu_model"), "model_name": p.get("model_name"),
                    "experiment": p.get("experiment"), "number_gpus": p.get("number_gpus"),
                    "number_nodes": p.get("number_nodes"), "batch_size": p.get("batch_size"),
                    "model_max_length": p.get("model_max_length"), "n": len(rows),
                    "dataset_tokens_per_second": statistics.median(float(r["dataset_tokens_per_second"])
                                                                   for r in rows)})
    refs = {r["point_id"]: r["dataset_tokens_per_second"] for r in out if r["cluster"] == REFERENCE}
    by_point: dict[str, set[str]] = {}
    for r in out:
        by_point.setdefault(r["point_id"], set()).add(r["cluster"])
    if not refs and all(len(c) < 2 for c in by_point.values()):
        return []
    for r in out:
        base = refs.get(r["point_id"])
        r["vs_reference"] = r["dataset_tokens_per_second"] / base if base and r["cluster"] != REFERENCE else None
    order = {REFERENCE: 0}
    return sorted(out, key=lambda r: (str(r["gpu_model"]), str(r["model_name"]), str(r["experiment"]),
                                      r["number_gpus"] or 0, r["batch_size"] or 0, r["model_max_length"] or 0,
                                      order.get(r["cluster"], 1), str(r["cluster"]), r["campaign"]))
