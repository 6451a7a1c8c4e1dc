"""What ``sbench scaling`` reads: a campaign's measured runs by shape, their profiled communication, and the
fabric's bus bandwidth per node count (the SQL; :mod:`harness.report.scaling` assembles the view)."""

from __future__ import annotations

from typing import Any

from .store import Store


def scaling_runs(store: Store, campaign: str) -> list[dict[str, Any]]:
    """The campaign's valid measured runs (the profiled ones left out: the profiler slows them) with what the
    scaling view sets beside their throughput."""
    return store.fetch_dicts("""
        SELECT m.run_id, m.point_id, m.experiment, m.model_name, m.batch_size, m.number_gpus,
               coalesce(m.number_nodes, 1) AS number_nodes, m.dataset_tokens_per_second, m.mfu, m.mfu_peak_source,
               coalesce(m.straggler, false) AS straggler, m.straggler_ranks, coalesce(m.host_busy, false) AS host_busy,
               coalesce(m.shared_host, false) AS shared_host, c.partition
        FROM measurements m JOIN runs r USING (run_id) LEFT JOIN campaigns c ON c.campaign = m.campaign
        WHERE m.campaign = ? AND m.is_valid AND NOT coalesce(m.profiled, false)
              AND m.dataset_tokens_per_second IS NOT NULL
        ORDER BY m.point_id, m.run_id""", [campaign])


def exposed_communication(store: Store, campaign: str) -> list[dict[str, Any]]:
    """Per point of *campaign* with a profiled run: the mean over its profiled ranks of the exposed and overlapped
    communication's shares of the step (``profile_ops``)."""
    return store.fetch_dicts("""
        SELECT m.point_id,
               avg(p.share) FILTER (WHERE p.name = 'communication_exposed') AS exposed_share,
               avg(p.share) FILTER (WHERE p.name = 'communication_overlapped') AS overlapped_share
        FROM profile_ops p JOIN measurements m USING (run_id)
        WHERE m.campaign = ? AND p.kind = 'phase'
        GROUP BY m.point_id""", [campaign])


def fabric_busbw(store: Store) -> list[dict[str, Any]]:
    """Per partition and node count: the latest sbench fabric run's all-reduce bus bandwidth at its largest
    message (GB/s)."""
    return store.fetch_dicts("""
        WITH latest AS (SELECT partition, nodes, max(measured_at) AS at FROM fabric
                        WHERE ok AND op = 'all_reduce' GROUP BY partition, nodes)
        SELECT f.partition, f.nodes, arg_max(f.busbw_gbps, f.bytes) AS busbw_gbps
        FROM fabric f JOIN latest l ON f.partition = l.partition AND f.nodes = l.nodes AND f.measured_at = l.at
        WHERE f.ok AND f.op = 'all_reduce'
        GROUP BY f.partition, f.nodes""")
