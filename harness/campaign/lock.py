"""The campaign lock: ``submit``, ``retry`` and ``cancel`` of one campaign run one at a time.

Each holds the campaign directory's lock file (``CampaignPaths.lock``; ``fcntl.flock``, exclusive) from the
moment it reads what the campaign has until its attempts are written, handed to the executor and recorded, so
two of them never both find "no attempt yet" and start the same attempt twice. The holder writes its PID, host
and command into the file; another waits up to ``$SBENCH_CAMPAIGN_WAIT`` seconds (default 5), then exits 1
naming them. The kernel drops the lock when its holder dies, however it dies, so a lock is never left stale.

While a command holds a campaign lock, SIGINT and SIGTERM are held back: the command finishes what it is
writing (job dirs, the queue, the manifest lines), releases the lock, and only then stops with
:class:`~harness.contract.errors.Interrupted` (exit 128 + the signal), so no attempt is ever half-submitted.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from harness.contract import envvars
from harness.contract.errors import CampaignBusyError, Interrupted, SubmitError
from harness.contract.paths import CampaignPaths
from harness.contract.records import now_iso
from harness.slurm.localjob import read_json

P = ParamSpec("P")
R = TypeVar("R")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def wait_seconds() -> float:
    try:
        return max(0.0, float(envvars.CAMPAIGN_WAIT.get()))
    except ValueError:
        return float(envvars.CAMPAIGN_WAIT.default)


def holder(campaign_dir: Path) -> dict[str, Any]:
    """What the lock's holder wrote: pid, host, command, since ({} when nobody holds it or it has not yet)."""
    return read_json(CampaignPaths(campaign_dir).lock, campaign_dir)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        # Some cluster file systems (Lustre without -o flock) refuse flock but take POSIX locks.
        if exc.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise


class CampaignLocks:
    """The campaign locks one command holds; :func:`holding_campaign_locks` releases them when it returns."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.held: dict[Path, int] = {}
        self.signum: int | None = None
        self._handlers: dict[int, Any] = {}

    def acquire(self, campaign_dir: Path, command: str | None = None, wait_s: float | None = None) -> None:
        """Hold *campaign_dir*'s lock (made if absent), waiting up to *wait_s* (default ``$SBENCH_CAMPAIGN_WAIT``);
        *command* is what the lock file says holds it (default: this object's)."""
        campaign_dir = Path(campaign_dir)
        if campaign_dir in self.held:
            return
        path = CampaignPaths(campaign_dir).lock
        try:
            campaign_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise SubmitError(f"cannot open the campaign lock {path}: {exc.strerror}; is the work dir "
                              "writable?") from None
        wait = wait_seconds() if wait_s is None else wait_s
        deadline = time.monotonic() + wait
        try:
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    who = holder(campaign_dir)
                    by = (f"PID {who.get('pid', '?')} on {who.get('host', '?')}, since {who.get('since', '?')}"
                          if who else "a process that has not said who it is yet")
                    raise CampaignBusyError(
                        f"campaign {campaign_dir.name!r} is in use by another sbench {who.get('command', 'command')} "
                        f"({by}); waited {wait:g} s. Run this again once it has finished "
                        f"({envvars.CAMPAIGN_WAIT.name}=<seconds> waits longer); the lock is {path}")
                time.sleep(0.1)
        except BaseException:
            os.close(fd)
            raise
        doc = {"pid": os.getpid(), "host": socket.gethostname(), "command": command or self.command,
               "since": now_iso()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(doc).encode(), 0)
        if not self.held:
            self._hold_signals()
        self.held[campaign_dir] = fd

    def release_all(self) -> int | None:
        """Release every lock, then let the signals through again; returns the signal held back, if any."""
        for fd in self.held.values():
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            os.close(fd)
        self.held.clear()
        for sig, old in self._handlers.items():
            signal.signal(sig, old)
        self._handlers.clear()
        return self.signum

    def _hold_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def hold(signum: int, _frame: Any) -> None:
            if self.signum is None:
                self.signum = signum
                sys.stderr.write(f"sbench: signal {signum} received; finishing this {self.command} first so that "
                                 "no attempt is left half-submitted\n")

        for sig in SIGNALS:
            self._handlers[sig] = signal.signal(sig, hold)


def holding_campaign_locks(command: str) -> Callable[[Callable[Concatenate[CampaignLocks, P], R]], Callable[P, R]]:
    """Decorate a function that takes a :class:`CampaignLocks` first: it acquires the campaign locks it needs,
    and they are released when it returns or raises. A SIGINT or SIGTERM held back meanwhile is raised then,
    as :class:`Interrupted` carrying the function's result (what was done before the signal took effect)."""

    def decorate(fn: Callable[Concatenate[CampaignLocks, P], R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            locks = CampaignLocks(command)
            try:
                result = fn(locks, *args, **kwargs)
            except BaseException:
                locks.release_all()
                raise
            signum = locks.release_all()
            if signum is not None:
                raise Interrupted(signum, result=result)
            return result

        return wrapper

    return decorate


__all__ = ["CampaignLocks", "holder", "holding_campaign_locks", "wait_seconds"]
