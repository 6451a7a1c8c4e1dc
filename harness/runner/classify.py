"""Error classification, as in the reference experiments' ``is_valid`` logic.

``invalid``: the point does not fit the device — ``torch.OutOfMemoryError`` (which
``torch.cuda.OutOfMemoryError`` is) or a ``RuntimeError`` containing "an illegal memory access
was encountered". Everything else is ``failed`` (the measurement can be repeated), including
for example a ``RuntimeError`` mentioning "NCCL Error".
"""

from __future__ import annotations

import re
import signal as _signal
import traceback as _tb
from typing import Any

INVALID, FAILED, OK = "invalid", "failed", "ok"
ILLEGAL_ACCESS = "an illegal memory access was encountered"
# What a training process prints for these errors when it could not write error.<rank>.json.
_INVALID_TEXT = re.compile(r"(torch\.(cuda\.)?OutOfMemoryError|CUDA out of memory|" + re.escape(ILLEGAL_ACCESS) + ")")


def _is_oom(exc: BaseException) -> bool:
    try:
        import torch  # heavy: only where a model is built or trained
    except ImportError:  # pragma: no cover - torch is a dependency
        return type(exc).__name__ == "OutOfMemoryError"
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, (oom, torch.cuda.OutOfMemoryError))


def classify_exception(exc: BaseException) -> str:
    """``invalid`` or ``failed``, following the chain of causes (a wrapped OOM is still an OOM)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if _is_oom(e):
            return INVALID
        if isinstance(e, RuntimeError) and ILLEGAL_ACCESS in str(e):
            return INVALID
        e = e.__cause__ or e.__context__
    return FAILED


def error_type(exc: BaseException) -> str:
    t = type(exc)
    mod = t.__module__
    return t.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{t.__qualname__}"


def error_record(exc: BaseException, *, rank: int, host: str, stage: str | None, trial: int | None,
                 t_wall: float) -> dict[str, Any]:
    """The body of ``error.<rank>.json``."""
    return {
        "rank": rank, "host": host, "kind": classify_exception(exc), "error_type": error_type(exc),
        "message": str(exc)[:4000],
        "traceback": "".join(_tb.format_exception(type(exc), exc, exc.__traceback__))[-20000:],
        "stage": stage, "trial": trial, "t_wall": t_wall,
    }


def classify_text(text: str) -> str | None:
    """``invalid`` when a log shows an OOM / illegal memory access; None otherwise (unknown)."""
    return INVALID if _INVALID_TEXT.search(text) else None


_ELASTIC_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)")


def elastic_failures(log_text: str) -> dict[int, int]:
    """``{global rank: exit code}`` from torch elastic's failure summary (negative = killed by signal).

    When ``accelerate launch`` runs the ranks, the node runner only sees the launcher's exit code;
    the summary is how a rank killed by SIGKILL (host OOM, ``sigkill`` fault) shows up.
    """
    return {int(m["rank"]): int(m["code"]) for m in _ELASTIC_FAILURE.finditer(log_text)}


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def cancelled(signum: int, what: str) -> str:
    """The reason of a run a signal stopped (scancel, sbench cancel, a stopped queue, the time limit):
    ``cancelled by signal 15 (SIGTERM); training stopped``."""
    return f"cancelled by signal {signum} ({_signame(signum)}); {what}"


def node_outcome(*, exit_code: int | None, signal: int | None, errors: list[dict[str, Any]],
                 expected_ranks: list[int], rank_docs: dict[int, dict[str, Any]],
                 rank_exit: dict[int, int] | None = None, terminated_by: int | None = None,
                 log_tail: str = "") -> tuple[str, str]:
    """``(outcome, reason)`` of one host's training command.

    An invalid error anywhere on the host wins over failures, because when one rank runs out of
    memory its peers fail in the collective that rank never joins: the OOM is the cause.
    """
    rank_exit = rank_exit or {}
    invalid = [e for e in errors if e.get("kind") == INVALID]
    if invalid:
        e = min(invalid, key=lambda d: d.get("t_wall") or 0)
        return INVALID, f"rank {e.get('rank')}: {e.get('error_type')}: {e.get('message')}"[:1000]
    if terminated_by is not None:
        return FAILED, cancelled(terminated_by, "training stopped")
    # A rank killed by a signal is the root cause; its peers then fail in collectives it never joins.
    errored = {e.get("rank") for e in errors}
    killed = {r: -c for r, c in rank_exit.items() if c < 0 and r not in errored}
    if killed or signal is not None:
        parts = [f"rank {r} killed by signal {s} ({_signame(s)})" for r, s in sorted(killed.items())]
        if signal is not None:
            parts.append(f"training command killed by signal {signal} ({_signame(signal)})")
        reason = "; ".join(parts) + " (host OOM killer, scancel or a crash; see train log)"
        if errors:
            e = min(errors, key=lambda d: d.get("t_wall") or 0)
            reason += f"; then rank {e.get('rank')}: {e.get('error_type')}: {e.get('message')}"
        return FAILED, reason[:1000]
    if errors:
        e = min(errors, key=lambda d: d.get("t_wall") or 0)
        return FAILED, f"rank {e.get('rank')}: {e.get('error_type')}: {e.get('message')}"[:1000]
    if exit_code not in (0, None):
        if classify_text(log_tail) == INVALID:
            return INVALID, f"exit code {exit_code}; the train log shows GPU out of memory / illegal memory access"
        return FAILED, f"training command exited with code {exit_code} and no error file"
    missing = [r for r in expected_ranks if r not in rank_docs]
    if missing:
        return FAILED, f"training command exited 0 but rank(s) {missing} wrote no rank.<rank>.json"
    bad = [r for r, d in rank_docs.items() if d.get("status") not in (None, OK)]
    if bad:
        return FAILED, f"rank(s) {bad} did not finish training"
    return OK, "training finished"
