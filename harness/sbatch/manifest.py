"""The campaign manifest: an append-only JSON-lines record of what was submitted.

Nothing is known only to the database: ``collect`` can rebuild campaigns,
points and attempts from these lines and the job directories.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

MANIFEST = "manifest.jsonl"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def manifest_path(campaign_dir: Path) -> Path:
    return Path(campaign_dir) / MANIFEST


def append(campaign_dir: Path, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append *events* under an exclusive lock, each as one line written and fsynced at once."""
    events = list(events)
    if not events:
        return events
    path = manifest_path(campaign_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(e, sort_keys=False, default=str) + "\n" for e in events).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return events


def read(campaign_dir: Path) -> Iterator[dict[str, Any]]:
    """The events of a manifest; a torn last line (crash mid-write) is skipped."""
    path = manifest_path(campaign_dir)
    if not path.exists():
        return
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def write_submitted(job_dir: Path, info: dict[str, Any]) -> None:
    """``submitted.json`` in the job dir: the scheduler's id for this attempt."""
    path = Path(job_dir) / "submitted.json"
    tmp = path.with_name(f".submitted.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(info, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def attempts(workdir: Path, campaign: str | None) -> list[dict[str, Any]]:
    """Every attempt line of every (or one) campaign manifest, newest state of each job dir."""
    camps = [workdir / campaign] if campaign else sorted(p.parent for p in workdir.glob(f"*/{MANIFEST}"))
    out: dict[str, dict[str, Any]] = {}
    for cdir in camps:
        for ev in read(cdir):
            if ev.get("type") == "attempt" and ev.get("job_dir"):
                out[ev["job_dir"]] = ev
    return list(out.values())


def cancelled_dirs(workdir: Path, campaign: str | None) -> set[str]:
    """The job dirs ``sbench cancel`` cancelled, in every (or one) campaign manifest."""
    camps = [workdir / campaign] if campaign else sorted(p.parent for p in workdir.glob(f"*/{MANIFEST}"))
    return {str(d) for cdir in camps for ev in read(cdir) if ev.get("type") == "cancel"
            for d in ev.get("job_dirs") or [] if isinstance(d, str)}
