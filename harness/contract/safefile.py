"""The one way sbench reads a file of a work dir (a job dir's files, a campaign's manifest, the local
queue's files): whoever can write to a shared work dir must not be able to hang sbench, exhaust its memory,
or make it read a file from elsewhere.

A file is read only when

- it is a regular file: it is opened with ``O_NONBLOCK | O_NOFOLLOW`` and checked with ``fstat`` after
  the open, so a FIFO, a socket or a device never blocks a read and is never read;
- it resolves inside its *root* (the campaign directory): a symbolic link is followed only to a file
  inside the root; a directory is checked once with :func:`check_dir` before its files are read;
- it is within the size bound of its kind (the ``*_MAX`` constants below); a log is read from its end
  (or its start) up to its bound instead.

Anything else raises :class:`Refused` (an ``OSError``): the caller turns it into a warning or a recorded
reason of the run, never into an abort of the whole command.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

# The size bound of each kind of file (bytes). A file larger than its bound is not read (logs: only their
# last or first bytes are).
SPEC_MAX = 16 << 20  # spec.json (a few KiB when rendered)
SMALL_MAX = 1 << 20  # submitted.json, the local queue's files, CampaignPaths.prepare_job
MANIFEST_MAX = 512 << 20  # a campaign's manifest (CampaignPaths.manifest: about 1 KiB per attempt)
RUNNER_MAX = 256 << 20  # a runner's JSON or JSON-lines file (stages, result, rank, error, environment)
LOG_TAIL = 4096  # the end of a batch output (slurm-<job>.out), read for its last line
TRAIN_LOG_HEAD = 64 << 20  # the start of a training log, read for NCCL's transport lines (written at startup)
SAMPLES_MAX = 32 << 30  # a sampler's CSV, handed to the database's CSV reader once checked

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


class Refused(OSError):
    """A file sbench does not read: not a regular file, outside its root, or larger than its bound."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(errno.EPERM, why, os.fspath(path))
        self.why = why

    def __str__(self) -> str:
        return f"{os.path.basename(str(self.filename))}: not read ({self.why})"


def size_text(n: int) -> str:
    """*n* bytes as people read it: 4096 -> '4 KiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether *path* resolves to *root* or to something under it (both resolved, symbolic links followed)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def check_dir(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> None:
    """Raise :class:`Refused` unless the directory *path* resolves inside *root*. A directory that is not a
    link and sits directly in *root* is inside whatever *root* resolves to (one ``lstat``); anything else
    is resolved. A missing *path* passes: reading its files finds it missing."""
    p, r = os.path.abspath(path), os.path.abspath(root)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if os.path.dirname(p) == r and stat.S_ISDIR(st.st_mode):
        return
    if not inside(p, r):
        raise Refused(p, f"it resolves to {os.path.realpath(p)}, outside {r}")


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str], root: str | os.PathLike[str] | None,
                 limit: int | None) -> tuple[int, int]:
    """(a file descriptor, the size) of the regular file *path*, at most *limit* bytes long (None: any
    length). A symbolic link is followed only to a file inside *root* (None: never). Raises
    ``FileNotFoundError``, :class:`Refused` or another ``OSError``; never blocks. The caller closes it."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        target = os.path.realpath(path)
        if root is None or not inside(target, root):
            where = f"outside {os.path.abspath(root)}" if root is not None else "not followed"
            raise Refused(path, f"a symbolic link to {target}, {where}") from None
        fd = os.open(target, _FLAGS)  # a link put there meanwhile is not followed
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(path, f"{_kind(st.st_mode)}, not a regular file")
        if limit is not None and st.st_size > limit:
            raise Refused(path, f"{st.st_size} bytes, larger than the {size_text(limit)} this file may be")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_fd(fd: int, size: int, limit: int) -> bytes | None:
    """The content of the open regular file *fd* of *size* bytes (its ``st_size``), or None when it grew
    past *limit* while being read."""
    data = os.read(fd, size + 1)
    if len(data) == size:
        return data
    parts = [data]
    n = len(data)
    while n <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - n))):
        parts.append(chunk)
        n += len(chunk)
    return None if n > limit else b"".join(parts)


def read_bytes(path: str | os.PathLike[str], root: str | os.PathLike[str] | None, limit: int, *,
               part: str = "all") -> bytes:
    """The bytes of the regular file *path* (see :func:`open_regular`). ``part="all"``: the whole file,
    refused when larger than *limit*; ``"tail"`` / ``"head"``: its last / first *limit* bytes at most."""
    fd, size = open_regular(path, root, None if part != "all" else limit)
    try:
        if part == "tail":
            if size > limit:
                os.lseek(fd, size - limit, os.SEEK_SET)
            return os.read(fd, min(size, limit))
        if part == "head":
            return os.read(fd, min(size, limit))
        data = read_fd(fd, size, limit)
    finally:
        os.close(fd)
    if data is None:
        raise Refused(path, f"grew past the {size_text(limit)} this file may be while being read")
    return data


def read_or_problem(path: str | os.PathLike[str], root: str | os.PathLike[str] | None, limit: int, *,
                    part: str = "all") -> tuple[bytes | None, str | None]:
    """:func:`read_bytes` for a reader that reports instead of raising: (bytes, None); (None, problem) for a
    file that is not read (a FIFO, a device, a link leading out of *root*, larger than *limit*) or unreadable;
    (None, None) when it is missing."""
    try:
        return read_bytes(path, root, limit, part=part), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, not_read_problem(path, exc)


def not_read_problem(path: str | os.PathLike[str], exc: OSError) -> str:
    """The problem line of a file that was not read: ``<name>: not read (<why>)`` for a file refused,
    ``<name>: unreadable (<error>)`` otherwise."""
    return str(exc) if isinstance(exc, Refused) else f"{os.path.basename(path)}: unreadable ({exc.strerror})"


def regular_path(path: str | os.PathLike[str], root: str | os.PathLike[str] | None, limit: int) -> str:
    """*path* checked like :func:`open_regular`, for a reader that opens the file itself (the database's
    CSV reader): the path to give it, with a link inside *root* resolved."""
    os.close(open_regular(path, root, limit)[0])
    return os.path.realpath(path) if os.path.islink(path) else os.fspath(path)


def read_json(path: str | os.PathLike[str], root: str | os.PathLike[str] | None, limit: int = SMALL_MAX) -> Any:
    """The JSON document of *path*, read by :func:`read_bytes`. Raises ``FileNotFoundError``,
    :class:`Refused`, another ``OSError``, or ``ValueError`` for content that is not JSON."""
    data = read_bytes(path, root, limit)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{os.path.basename(path)}: not JSON ({exc})") from None


__all__ = ["LOG_TAIL", "MANIFEST_MAX", "RUNNER_MAX", "SAMPLES_MAX", "SMALL_MAX", "SPEC_MAX", "TRAIN_LOG_HEAD",
           "Refused", "check_dir", "inside", "open_regular", "read_bytes", "read_fd", "read_json", "read_or_problem",
           "not_read_problem", "regular_path", "size_text"]
