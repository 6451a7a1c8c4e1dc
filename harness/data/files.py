"""What the data layer does with its files: content digests, durable writes, and locks that hold across
processes and nodes (datasets, token counts and prepared data are shared by every job of a cluster)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from harness.contract.errors import SbenchError


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            h.update(block)
    return h.hexdigest()


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (works across processes and, on NFS, across nodes)."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o664)
    except OSError as exc:
        raise SbenchError(f"cannot create lock file {lock_path}: {exc.strerror}; is the directory writable?") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            # Some cluster filesystems (Lustre without -o flock) refuse flock but take POSIX locks.
            if exc.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock; the lock file stays (deleting it would race)
