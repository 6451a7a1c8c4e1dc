"""The scaling view (harness.report.scaling): each shape's efficiency against linear scaling from the smallest
shape of its model, experiment and per-device batch, with the interval from its runs and what explains a loss.
(sbench scaling on the test cluster, with a slowed rank: tests/test_cluster_health.py.)"""

from __future__ import annotations

import statistics

import pytest

from harness.contract.stats import t_quantile
from harness.report.scaling import scaling_rows


def test_the_scaling_view_sets_shapes_side_by_side_and_names_what_explains_a_loss() -> None:
    def run(pid: str, gpus: int, nodes: int, tps: float, **more) -> dict:
        return {"run_id": f"c/{pid}.{tps}", "point_id": pid, "experiment": "lora", "model_name": "tiny",
                "batch_size": 2 * gpus, "number_gpus": gpus, "number_nodes": nodes, "dataset_tokens_per_second": tps,
                "mfu": 0.1, "straggler": False, "straggler_ranks": None, "host_busy": False, "shared_host": False,
                "partition": "cpu", **more}

    runs = [run("p1", 1, 1, 1000.0), run("p1", 1, 1, 1010.0),
            run("p2", 2, 2, 1200.0), run("p2", 2, 2, 1220.0),  # 60 % of linear; profiled: 35 % exposed
            run("p4", 4, 2, 1000.0, straggler=True, straggler_ranks=["node2:3"]),
            run("p8", 8, 2, 4000.0), run("p8s", 8, 2, 8000.0, batch_size=32)]  # another per-device batch
    rows = scaling_rows(runs, [{"point_id": "p2", "exposed_share": 0.35, "overlapped_share": 0.1}],
                        [{"partition": "cpu", "nodes": 2, "busbw_gbps": 1.5}])
    by = {(r["per_device_batch_size"], r["number_gpus"]): r for r in rows}
    base, two, four, eight = by[(2, 1)], by[(2, 2)], by[(2, 4)], by[(2, 8)]
    assert base["efficiency"] == 1.0 and base["explained_by"] is None and base["fabric_busbw_gbps"] is None
    half = t_quantile(0.975, 1) * statistics.stdev([1000.0, 1010.0]) / 2 ** 0.5  # Student's t, one degree of freedom
    assert (base["low"], base["high"]) == pytest.approx((1005.0 - half, 1005.0 + half), rel=1e-12)
    assert half == pytest.approx(63.53, abs=0.01)
    assert two["efficiency"] == pytest.approx(1210.0 / 2010.0) and two["explained_by"] == "communication"
    assert two["exposed_communication_share"] == 0.35 and two["fabric_busbw_gbps"] == 1.5
    assert four["explained_by"] == "straggler" and four["stragglers"] == ["node2:3"] and four["low"] is None
    assert eight["efficiency"] == pytest.approx(4000.0 / (1005.0 * 8)) and eight["explained_by"] == "unexplained"
    assert by[(4, 8)]["efficiency"] == 1.0 and by[(4, 8)]["explained_by"] is None  # its own group's baseline
