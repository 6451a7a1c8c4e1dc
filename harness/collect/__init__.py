"""Collect: job directories + SLURM accounting -> the results database (DuckDB).

``discover`` finds the runs, ``jobdir`` reads one job directory, ``outcome`` decides its outcome by pure
rules, ``rows`` builds its rows and ``aggregate`` the seeds' measured properties, ``scheduler`` asks the
scheduler, ``loading`` loads the samples on the one worker thread, and ``ingest`` runs the transaction.
"""

from __future__ import annotations

from .ingest import CollectReport, collect

__all__ = ["CollectReport", "collect"]
