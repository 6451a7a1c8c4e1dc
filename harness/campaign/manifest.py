"""A campaign's manifest as the login-node commands ask about it: what it holds (:func:`read`), every
campaign's attempts (:func:`attempts`), its adaptive repeats, the job dirs ``sbench cancel`` cancelled, and its
lines recorded in the database (:func:`record_events`).

Nothing is known only to the database: ``collect`` can rebuild campaigns, points and attempts from these lines
and the job directories. The lines are records of ``harness.contract.records``, which writes and reads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.contract import safefile
from harness.contract.errors import InputError, StoreBusyError, SubmitError
from harness.contract.paths import CampaignPaths, DbTarget, resolve_workdir
from harness.contract.records import AttemptLine, CampaignLine, ManifestLine, SearchLine, not_read, read_manifest
from harness.db.manifest import record_manifest
from harness.db.store import open_store


def read(campaign_dir: Path, problems: list[str] | None = None) -> list[ManifestLine]:
    """The lines of a campaign's manifest (a line it refuses, a torn last line included, is left out: see
    ``harness.contract.records``). A manifest that is not read (a FIFO, a link out of the campaign directory,
    larger than its bound) is a line of *problems*; without that list, a :class:`SubmitError` (a command that
    writes to the campaign must know what it holds)."""
    camp = CampaignPaths(campaign_dir)
    try:
        return read_manifest(camp)[0]
    except OSError as exc:
        if problems is None:
            raise SubmitError(f"{camp.manifest}: the campaign manifest was not read ({not_read(exc)}); move it "
                              "aside and run the command again") from None
        problems.append(f"{camp.manifest}: not read ({not_read(exc)})")
        return []


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
        return f"job dir {jd}: {not_read(exc)}"
    return None


def attempts(workdir: Path, campaign: str | None, problems: list[str] | None = None, *,
             outside: bool = False) -> list[AttemptLine]:
    """Every attempt line of every (or one) campaign manifest, newest state of each job dir. A manifest not
    read is a line of *problems* (dropped without that list); so is a local attempt whose job dir is not in
    its campaign directory (:func:`job_dir_problem`), which is left out unless *outside*: its
    ``submitted.json`` is not its own, and must not say which process to signal. (A SLURM attempt is
    known by the job id its line records; its job dir is not read.)"""
    camps = [c.root for c in CampaignPaths.listed(workdir, campaign, submitted=True)]
    out: dict[str, AttemptLine] = {}
    found = [] if problems is None else problems
    for cdir in camps:
        try:  # a campaign directory that is a link leading out of the work dir is not read
            safefile.check_dir(cdir, workdir)
        except OSError as exc:
            found.append(f"{cdir}: not read ({not_read(exc)})")
            continue
        for ev in read(cdir, found):
            if ev["type"] == "attempt" and ev.get("job_dir"):
                jd = str(ev.get("job_dir"))
                why = None if outside or ev.get("executor") == "slurm" else job_dir_problem(jd, cdir)
                if why is not None:
                    found.append(f"{cdir.name}: attempt {ev.get('point_id')}.r{ev.get('repeat')}.a{ev.get('attempt')}"
                                 f" left out: {why}")
                    continue
                out[jd] = ev
    return list(out.values())


def search_spec(campaign_dir: Path) -> dict[str, Any] | None:
    """The campaign's ``search:`` as its campaign line recorded it (None: no search, or no manifest read)."""
    try:
        lines = read_manifest(CampaignPaths(campaign_dir), ("campaign",))[0]
    except OSError:
        return None
    spec = next((ev.get("search") for ev in lines if ev["type"] == "campaign"), None)
    return spec if isinstance(spec, dict) else None


def search_lines(campaign_dir: Path) -> dict[str, SearchLine]:
    """The newest search line about each point of the campaign (what the search decided last)."""
    try:
        lines = read_manifest(CampaignPaths(campaign_dir), ("search",))[0]
    except OSError:
        return {}
    return {ev["point_id"]: ev for ev in lines if ev["type"] == "search"}


def _newest_word(campaign_dir: Path, kind: str) -> dict[str, Any] | None:
    """The sweep's *kind* section (``repeats``, ``budget``) as the campaign's newest campaign or *kind* line says it
    (None: none, or a manifest that is not read). Only those lines are decoded: ``collect`` asks this of every
    campaign, and a large campaign's manifest is mostly attempt lines."""
    try:
        lines = read_manifest(CampaignPaths(campaign_dir), ("campaign", kind))[0]
    except OSError:
        return None
    out = None
    for ev in lines:
        spec = ev.get(kind)
        out = spec if isinstance(spec, dict) else None
    return out


def budget(campaign_dir: Path) -> dict[str, Any] | None:
    """The campaign's ``budget:`` as its newest campaign or budget line says it."""
    return _newest_word(campaign_dir, "budget")


def adaptive_repeats(campaign_dir: Path) -> dict[str, Any] | None:
    """The campaign's ``repeats: {min, max, cv}`` as its newest campaign or repeats line says it (None: a plain
    ``repeats: N``)."""
    return _newest_word(campaign_dir, "repeats")


def cancelled_dirs(workdir: Path, campaign: str | None) -> set[str]:
    """The job dirs ``sbench cancel`` cancelled, in every (or one) campaign manifest."""
    camps = [c.root for c in CampaignPaths.listed(workdir, campaign, submitted=True)]
    return {str(d) for cdir in camps for ev in read(cdir) if ev["type"] == "cancel"
            for d in ev.get("job_dirs") or [] if isinstance(d, str)}


def record_events(db: DbTarget, events: list[ManifestLine]) -> str | None:
    """Record manifest events in the DB; when it is busy, say so - the manifest already has them."""
    if not events:
        return None
    try:
        with open_store(db) as st:
            record_manifest(st, events)
    except StoreBusyError as exc:
        return f"{exc}; the submission is in the campaign manifest and the next 'sbench collect' records it"
    return None


def campaign_record(workdir: Path | None, campaign: str) -> CampaignLine:
    """The line a campaign's first submission wrote: its sweep, inventory and executor."""
    workdir = resolve_workdir(workdir)
    for ev in read(workdir / campaign):
        if ev["type"] == "campaign":
            return ev

    raise InputError(f"no campaign {campaign!r} under {workdir} (no {CampaignPaths.of(workdir, campaign).manifest})")
