"""Writing a file whole or not at all, the one way every part of sbench does it (the runner on the compute
nodes, submit, the feeder): the content goes to a temporary file beside the target, named after it and this
process, which is then renamed into place. A reader on any node sees the old file or the whole new one, never
half of one, and two writers never share a temporary file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Write *text* to *path* whole (UTF-8). *mode*: the file's permissions exactly (beyond the umask), and the
    temporary file is created no more open than 0600, so a secret file is never readable by others, not even
    while it is written; None: as the umask gives."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode & 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_json(path: Path, doc: Any, *, indent: int | None = 2) -> None:
    """Write *doc* as JSON (a value JSON has no word for as its ``str``) and a newline, whole."""
    write_text(path, json.dumps(doc, indent=indent, default=str) + "\n")


__all__ = ["write_json", "write_text"]
