"""Collect: job directories + SLURM accounting -> the results database (DuckDB).

``store`` is the one module that owns SQL and the schema; ``parse`` reads the
job-directory files, ``sacct`` the scheduler's accounting, ``aggregate`` turns
samples and rank measurements into the seeds' measured properties, and
``ingest`` ties them together into one transactional, incremental collect.
"""

from __future__ import annotations

from harness.db.store import SCHEMA_VERSION, PointStatus, Store, open_store

from .ingest import CollectReport, collect

__all__ = ["SCHEMA_VERSION", "CollectReport", "PointStatus", "Store", "collect", "open_store"]
