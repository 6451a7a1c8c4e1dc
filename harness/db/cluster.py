"""What ``sbench probe`` and ``sbench fabric`` record: a probe's hosts, a fabric run's measurements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .store import Store
from .values import to_json, utc


def record_probes(store: Store, rows: Sequence[Mapping[str, Any]]) -> None:
    """Store one ``sbench probe`` (rows of the ``probes`` table) in one transaction."""
    with store.transaction():
        store.insert("probes", rows)


def record_fabric(store: Store, rows: Sequence[Mapping[str, Any]]) -> None:
    """Store one ``sbench fabric`` run (rows of the ``fabric`` table) in one transaction."""
    with store.transaction():
        store.insert("fabric", [{**r, "measured_at": utc(r.get("measured_at"))} for r in rows])


def record_preflight(store: Store, rows: Sequence[Mapping[str, Any]]) -> None:
    """Store one ``sbench preflight`` (rows of the ``preflight`` table) in one transaction."""
    with store.transaction():
        store.insert("preflight", [{**r, "reps": to_json(r.get("reps")), "measured_at": utc(r.get("measured_at"))}
                                   for r in rows])
