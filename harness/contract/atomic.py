"""Writing a file whole or not at all, the one way every part of sbench does it (the runner on the compute
nodes, submit, the feeder): the content goes to a temporary file beside the target, named after it and this
process, which is then renamed into place. A reader on any node sees the old file or the whole new one, never
half of one, and two writers never share a temporary file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str) -> None:
    """Write *text* to *path* whole (UTF-8)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, doc: Any, *, indent: int | None = 2) -> None:
    """Write *doc* as JSON (a value JSON has no word for as its ``str``) and a newline, whole."""
    write_text(path, json.dumps(doc, indent=indent, default=str) + "\n")


__all__ = ["write_json", "write_text"]
