"""``sbench hosts``: the ``host_health`` view, and which hosts are slow again and again (drain candidates)."""

from __future__ import annotations

from typing import Any

from harness.contract.defaults import DRAIN_MIN_FLAGS, DRAIN_MIN_SHARE

from .store import Store


def host_health(store: Store) -> list[dict[str, Any]]:
    """Every host the database knows (runs, rank scores, preflights), most flagged first."""
    return store.fetch_dicts("SELECT * FROM host_health ORDER BY flags DESC, median_relative_score NULLS LAST, host")


def drain_reason(h: dict[str, Any], min_flags: int = DRAIN_MIN_FLAGS, min_share: float = DRAIN_MIN_SHARE) -> str | None:
    """Why a ``host_health`` row is a drain candidate (flagged at least *min_flags* times, in at least *min_share*
    of the runs and preflights that judged it), else None."""
    judged = int(h.get("runs_scored") or 0) + int(h.get("preflights") or 0)
    flags = int(h.get("flags") or 0)
    if flags < min_flags or not judged or flags / judged < min_share:
        return None
    parts = []
    if h.get("straggler_runs"):
        score = h.get("median_relative_score")
        parts.append(f"a straggler in {h['straggler_runs']} of {h['runs_scored']} scored run(s)"
                     + (f" (median relative score {score:.2f})" if isinstance(score, float) else ""))
    if h.get("slow_preflights"):
        ratio = h.get("min_preflight_ratio")
        parts.append(f"slow in {h['slow_preflights']} of {h['preflights']} preflight(s)"
                     + (f" (lowest ratio to its partition's median {ratio:.2f})" if isinstance(ratio, float) else ""))
    return "; ".join(parts)


def drain_candidates(rows: list[dict[str, Any]], min_flags: int = DRAIN_MIN_FLAGS,
                     min_share: float = DRAIN_MIN_SHARE) -> list[dict[str, Any]]:
    """The rows of *rows* that are drain candidates, each with its ``why``."""
    out = []
    for h in rows:
        why = drain_reason(h, min_flags, min_share)
        if why is not None:
            out.append({**h, "why": why})
    return out


def measured_peaks_by_host(store: Store) -> dict[tuple[str, str], list[float]]:
    """(host, dtype) -> each of its devices' measured peak TFLOP/s (the ``measured_peaks`` view: every device's
    latest ``sbench preflight`` matmul figure): what a run's MFU is set against where its hosts were measured."""
    out: dict[tuple[str, str], list[float]] = {}
    for host, dtype, peak in store.con.execute(
            "SELECT host, dtype, peak_tflops FROM measured_peaks WHERE peak_tflops > 0 ORDER BY ALL").fetchall():
        out.setdefault((str(host), str(dtype)), []).append(float(peak))
    return out
