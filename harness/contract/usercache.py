"""Files sbench keeps for this user outside every work dir: ``$XDG_CACHE_HOME/sbench/`` (else
``~/.cache/sbench/``), then a private directory under the system's temporary directory.

A place is used only when it is a directory of this user that no one else may write to (made 0700 when absent),
and a file is read back only when it is a regular file of this user that no one else may write to: what is kept
here goes into what sbench writes (the report page inlines the drawing library from here), so nobody but the
user may be able to change it. Anything unusable is passed over silently; a reader then makes the content
anew.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from harness.contract import atomic, safefile


def dirs() -> list[Path]:
    """The places, in order of preference."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return [Path(base) / "sbench", Path(tempfile.gettempdir()) / f"sbench-{os.getuid()}"]


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def private_dir() -> Path | None:
    """The first place that is (or is made) a directory of this user's alone; None when none is."""
    for d in dirs():
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(d, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and _private(st):
            return d
    return None


def read(name: str, limit: int) -> bytes | None:
    """The content of the kept file *name*, or None: absent, larger than *limit*, or not this user's alone."""
    d = private_dir()
    if d is None:
        return None
    try:
        fd, size = safefile.open_regular(d / name, None, limit)
    except OSError:
        return None
    try:
        if not _private(os.fstat(fd)):
            return None
        return safefile.read_fd(fd, size, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def write(name: str, text: str) -> Path | None:
    """Keep *text* as *name* (whole or not at all, readable by this user only); None when no place is usable."""
    d = private_dir()
    if d is None:
        return None
    try:
        atomic.write_text(d / name, text, mode=0o600)
    except OSError:
        return None
    return d / name


__all__ = ["dirs", "private_dir", "read", "write"]
