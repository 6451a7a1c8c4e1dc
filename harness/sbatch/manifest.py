"""The campaign manifest: an append-only JSON-lines record of what was submitted.

Nothing is known only to the database: ``collect`` can rebuild campaigns,
points and attempts from these lines and the job directories.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from harness.contract import safefile
from harness.contract.errors import StoreBusyError, SubmitError
from harness.contract.paths import CampaignPaths, JobPaths
from harness.db.manifest import record_manifest
from harness.db.store import open_store


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def append(campaign_dir: Path, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append *events* under an exclusive lock, each as one line written and fsynced at once."""
    events = list(events)
    if not events:
        return events
    path = CampaignPaths(campaign_dir).manifest
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(e, sort_keys=False, default=str) + "\n" for e in events).encode()
    try:
        # Never blocks on a FIFO (no reader: ENXIO) and never follows a link put in its place.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as exc:
        raise SubmitError(f"{path}: cannot append to the campaign manifest ({_why(exc)}); move it aside and "
                          "run the command again") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SubmitError(f"{path}: the campaign manifest is not a regular file; move it aside and run the "
                              "command again")
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return events


def _why(exc: OSError) -> str:
    if isinstance(exc, safefile.Refused):
        return exc.why
    return {errno.ELOOP: "a symbolic link", errno.ENXIO: "a FIFO"}.get(exc.errno or 0, exc.strerror or str(exc))


def read(campaign_dir: Path, problems: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The events of a manifest; a torn last line (crash mid-write) is skipped. A manifest that is not read
    (a FIFO, a link out of the campaign directory, larger than its bound: harness.contract.safefile) is a
    line of *problems*; without that list, a :class:`SubmitError` (a command that writes to the campaign
    must know what it holds)."""
    path = CampaignPaths(campaign_dir).manifest
    try:
        data = safefile.read_bytes(path, campaign_dir, safefile.MANIFEST_MAX)
    except FileNotFoundError:
        return
    except OSError as exc:
        if problems is None:
            raise SubmitError(f"{path}: the campaign manifest was not read ({_why(exc)}); move it aside and run "
                              "the command again") from None
        problems.append(f"{path}: not read ({_why(exc)})")
        return
    for line in data.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict):
            yield event


def write_submitted(job_dir: Path, info: dict[str, Any]) -> None:
    """``submitted.json`` in the job dir: the scheduler's id for this attempt."""
    path = JobPaths(job_dir).submitted
    tmp = path.with_name(f".submitted.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(info, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def job_dir_problem(job_dir: str | Path, campaign_dir: Path) -> str | None:
    """Why the job dir an attempt line names is not one of its campaign's (it lies, or resolves, outside the
    campaign directory); None when it is."""
    jd = Path(job_dir)
    if os.path.abspath(jd.parent) != os.path.abspath(campaign_dir) and \
            os.path.realpath(jd.parent) != os.path.realpath(campaign_dir):
        return f"job dir {jd} is not in the campaign directory {campaign_dir}"
    try:
        safefile.check_dir(jd, campaign_dir)
    except OSError as exc:
        return f"job dir {jd}: {_why(exc)}"
    return None


def attempts(workdir: Path, campaign: str | None, problems: list[str] | None = None, *,
             outside: bool = False) -> list[dict[str, Any]]:
    """Every attempt line of every (or one) campaign manifest, newest state of each job dir. A manifest not
    read is a line of *problems* (dropped without that list); so is a local attempt whose job dir is not in
    its campaign directory (:func:`job_dir_problem`), which is left out unless *outside*: its
    ``submitted.json`` is not its own, and must not say which process to signal. (A SLURM attempt is
    known by the job id its line records; its job dir is not read.)"""
    camps = [c.root for c in CampaignPaths.listed(workdir, campaign, submitted=True)]
    out: dict[str, dict[str, Any]] = {}
    found = [] if problems is None else problems
    for cdir in camps:
        try:  # a campaign directory that is a link leading out of the work dir is not read
            safefile.check_dir(cdir, workdir)
        except OSError as exc:
            found.append(f"{cdir}: not read ({_why(exc)})")
            continue
        for ev in read(cdir, found):
            if ev.get("type") == "attempt" and ev.get("job_dir"):
                why = None if outside or ev.get("executor") == "slurm" else job_dir_problem(str(ev["job_dir"]), cdir)
                if why is not None:
                    found.append(f"{cdir.name}: attempt {ev.get('point_id')}.r{ev.get('repeat')}.a{ev.get('attempt')}"
                                 f" left out: {why}")
                    continue
                out[ev["job_dir"]] = ev
    return list(out.values())


REPEATS_LINES = (b'{"type": "campaign"', b'{"type": "repeats"')  # how append() writes those lines' start


def adaptive_repeats(campaign_dir: Path) -> dict[str, Any] | None:
    """The campaign's ``repeats: {min, max, cv}`` as its newest campaign or repeats line says it (None: a plain
    ``repeats: N``, or a manifest that is not read). Only those lines are parsed: ``collect`` asks this of
    every campaign, and a large campaign's manifest is mostly attempt lines."""
    path = CampaignPaths(campaign_dir).manifest
    try:
        data = safefile.read_bytes(path, campaign_dir, safefile.MANIFEST_MAX)
    except OSError:
        return None
    out = None
    for line in data.splitlines():
        if not line.startswith(REPEATS_LINES):
            continue
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(ev, dict):
            out = ev.get("repeats") if isinstance(ev.get("repeats"), dict) else None
    return out


def cancelled_dirs(workdir: Path, campaign: str | None) -> set[str]:
    """The job dirs ``sbench cancel`` cancelled, in every (or one) campaign manifest."""
    camps = [c.root for c in CampaignPaths.listed(workdir, campaign, submitted=True)]
    return {str(d) for cdir in camps for ev in read(cdir) if ev.get("type") == "cancel"
            for d in ev.get("job_dirs") or [] if isinstance(d, str)}


def record_events(db: Path, events: list[dict[str, Any]]) -> str | None:
    """Record manifest events in the DB; when it is busy, say so - the manifest already has them."""
    if not events:
        return None
    try:
        with open_store(db) as st:
            record_manifest(st, events)
    except StoreBusyError as exc:
        return f"{exc}; the submission is in the campaign manifest and the next 'sbench collect' records it"
    return None
