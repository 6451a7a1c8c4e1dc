"""Stage events: ``stages.<host>.jsonl``, one JSON object per line, appended with a single ``write()``.

A ``start`` without an ``end`` means the process died inside that stage (SIGKILL, host OOM,
node failure); that is the only trace such a crash can leave, so every event is written and
flushed to the kernel before the stage's work begins. The stage names are
:class:`harness.contract.formats.Stage`'s.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Terminated(BaseException):
    """Raised by a SIGTERM/SIGINT handler so that open stages end with status ``killed``."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


_SIGNAL: list[int] = []  # the first SIGTERM/SIGINT this process received (its handler calls note_signal)


def note_signal(signum: int) -> None:
    """Remember the first stopping signal: a stage that fails from then on was killed, whatever it raised."""
    if not _SIGNAL:
        _SIGNAL.append(signum)


def signalled() -> int | None:
    return _SIGNAL[0] if _SIGNAL else None


def restart_count() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def process_start_wall() -> float | None:
    """When this process started, on the wall clock: Linux's start time of the process (clock ticks since
    boot, ``/proc/self/stat``) against ``CLOCK_BOOTTIME``, to a tick (10 ms). ``launch.sh`` execs the node
    runner, so for the node runner this is when the node's task started: launch.sh's lines, the interpreter
    and its imports come before the runner's first stage; for a rank, when the launcher had its process
    started. None where the system cannot say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime; fields[0] is field 3
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age if age >= 0 else None


def append_line(path: Path, obj: dict[str, Any]) -> None:
    """Append one JSON line with one ``write()`` on an ``O_APPEND`` descriptor.

    Several processes (node runner and ranks) append to the same file; O_APPEND makes each
    single write land whole at the end, so lines never interleave.
    """
    data = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class StageLog:
    """Writes start/end events of one process (the node runner: ``rank=None``; or one rank)."""

    def __init__(self, path: str | Path, host: str, rank: int | None = None, trial: int | None = None,
                 enabled: bool = True) -> None:
        self.path = Path(path)
        self.host = host
        self.rank = rank
        self.trial = trial
        self.enabled = enabled
        self.restart = restart_count()
        self.current: str | None = None
        self.last_failed: str | None = None  # the stage an exception last escaped from

    def _event(self, event: str, stage: str, trial: int | None, at: float | None = None,
               **extra: Any) -> dict[str, Any]:
        now_wall, now_mono = time.time(), time.monotonic()
        if at is not None:  # an event that happened earlier (wall clock): place it on both clocks
            now_mono -= now_wall - at
            now_wall = at
        obj: dict[str, Any] = {
            "event": event, "stage": stage, "host": self.host, "rank": self.rank,
            "trial": self.trial if trial is None else trial,
            "t_wall": now_wall, "t_mono": now_mono, "restart": self.restart, "pid": os.getpid(),
        }
        obj.update(extra)
        if self.enabled:
            append_line(self.path, obj)
        return obj

    def start(self, stage: str, trial: int | None = None, at: float | None = None) -> dict[str, Any]:
        """*at*: the wall time the stage began, when that was before this call (e.g. the process start)."""
        self.current = stage
        return self._event("start", stage, trial, at)

    def end(self, stage: str, status: str = "ok", error: str | None = None, info: dict[str, Any] | None = None,
            trial: int | None = None) -> dict[str, Any]:
        if self.current == stage:
            self.current = None
        return self._event("end", stage, trial, status=status, error=error, info=info or {})

    @contextmanager
    def stage(self, stage: str, info: dict[str, Any] | None = None,
              trial: int | None = None) -> Iterator[dict[str, Any]]:
        """``with log.stage("train", info) as info:`` — fill *info* inside; the end event carries it.

        An exception ends the stage with ``error`` and propagates; ``killed`` for :class:`Terminated`, and for
        any exception once the process received a stopping signal (:func:`note_signal`): what a signal sets
        off is not the stage's error.
        """
        info = {} if info is None else info
        self.start(stage, trial)
        try:
            yield info
        except Terminated as exc:
            self.last_failed = stage
            self.end(stage, "killed", str(exc), info, trial)
            raise
        except BaseException as exc:
            self.last_failed = stage
            sig = signalled()
            if sig is not None:
                self.end(stage, "killed", f"terminated by signal {sig}", info, trial)
            else:
                status = "killed" if isinstance(exc, KeyboardInterrupt) else "error"
                self.end(stage, status, f"{type(exc).__name__}: {exc}"[:2000], info, trial)
            raise
        self.end(stage, "ok", None, info, trial)


def read_stages(path: str | Path) -> list[dict[str, Any]]:
    """All events of a stages file; a torn last line (a process killed mid-write) is skipped."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def open_stages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start events without a matching end (same pid, stage and trial): where processes died."""
    open_: dict[tuple[Any, ...], dict[str, Any]] = {}
    for ev in events:
        key = (ev.get("pid"), ev.get("stage"), ev.get("trial"), ev.get("restart"))
        if ev.get("event") == "start":
            open_[key] = ev
        elif ev.get("event") == "end":
            open_.pop(key, None)
    return list(open_.values())
