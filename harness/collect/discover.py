"""Finding runs: campaign manifests, the attempts they name, job dirs submitted by hand (found by their
``spec.json``), a cheap fingerprint of each job dir's files, and the stamp that proves a dir unchanged
without listing it (:func:`scan_stamped`, :func:`stamp_holds`).

A ``spec.json`` that sbench did not write (another schema, another tool, a stray file) is refused with a
warning: it never becomes a run. Every file is read through harness.contract.safefile, inside its campaign
directory; before a job dir the manifest names is read, :func:`verify` checks that it lies inside its
campaign directory and that its ``spec.json`` is that attempt's (campaign, point, repeat, attempt): a job
dir that is not is recorded as failed with the reason, and nothing of it is stored.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import jobstate, records, safefile
from harness.contract.paths import SPEC_SCHEMA, CampaignPaths, JobPaths, parse_job_dir_name, run_id
from harness.contract.records import ManifestLine, SubmittedInfo, read_submitted
from harness.db.manifest import attempt_row, point_row
from harness.db.values import utc

from .parse import read_json

# spec.json's "schema" is SPEC_SCHEMA; files rendered before it existed are recognised by their shape.


def spec_problem(doc: Any, pid: str, rep: int, att: int) -> str | None:
    """Why *doc* (a parsed spec.json) is not a spec this sbench wrote for the job dir of point *pid*, repeat
    *rep*, attempt *att* (from the dir's name); None if it is."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    schema = doc.get("schema")
    if schema is not None and schema != SPEC_SCHEMA:
        return f"schema {str(schema)[:60]!r} is not {SPEC_SCHEMA!r}"
    point, js = doc.get("point"), doc.get("jobspec")
    if not isinstance(point, dict) or not isinstance(js, dict):
        return "has no 'point' and 'jobspec' objects"
    if point.get("point_id") != pid or js.get("point_id") != pid:
        return f"names point {str(point.get('point_id'))[:40]!r}, but the directory is of point {pid}"
    if js.get("repeat") != rep or js.get("attempt") != att:
        return f"is repeat {js.get('repeat')!r} attempt {js.get('attempt')!r}, but the directory says r{rep}.a{att}"
    camp = doc.get("campaign")
    if not isinstance(camp, str) or not camp or camp != js.get("campaign"):
        return "has no campaign name"
    if not isinstance(point.get("entity"), dict) or not isinstance(point.get("experiment"), str):
        return "has no entity or experiment"
    return None


@dataclass
class Attempt:
    """A run found on disk and/or in a manifest."""

    run_id: str
    campaign: str
    point_id: str
    repeat: int
    attempt: int
    job_dir: Path | None
    manifest: Mapping[str, Any] | None = None  # the attempt line (a copy)
    fingerprint: str = "missing"
    files: list[str] | None = None  # names of the job dir's regular top-level files (from the fingerprint scan)
    # Its other top-level entries but directories: links, FIFOs, devices. :func:`verify` admits a link to a
    # regular file inside the campaign directory into *files*; any other of sbench's file names is a line of
    # *unread* (harness.contract.safefile says why), a warning or reason of the run.
    odd: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    root: str | None = None  # its campaign directory: every file read must resolve inside it
    spec: dict[str, Any] | None = None  # its spec.json, once :func:`verify` read it
    refused: str | None = None  # why its job dir is not read (:func:`verify`): the run's reason
    # Its manifest line is not read yet (:func:`hydrate`): *manifest* holds only the index's key fields.
    partial: bool = False

    @property
    def top(self) -> str | None:
        """The directory its files must resolve inside: its campaign directory."""
        return self.root or (str(self.job_dir.parent) if self.job_dir is not None else None)


_SENTINEL = "SBENCHHOSTSENTINEL"
_PATTERNS: dict[Any, tuple[str, str]] = {}


def named(names: list[str], make: Callable[[str], Path]) -> list[tuple[str, str]]:
    """(part, file name) for the *names* that match JobPaths's naming *make* (e.g. ``paths.stages``), by
    part: the host (or rank) the file is of. Works on one directory listing, so a job dir is listed once
    instead of once per file kind."""
    key = getattr(make, "__func__", make)
    pattern = _PATTERNS.get(key)
    if pattern is None:
        pre, suf = make(_SENTINEL).name.split(_SENTINEL)
        pattern = _PATTERNS[key] = (pre, suf)
    pre, suf = pattern
    a, b, n = len(pre), len(suf), len(pre) + len(suf)
    return sorted((x[a:len(x) - b], x) for x in names if len(x) > n and x.startswith(pre) and x.endswith(suf))


def names_like(names: list[str], make: Callable[[str], Path]) -> list[str]:
    """The host (or rank) parts of *names* that match JobPaths's naming *make*, e.g. ``paths.stages``."""
    return [part for part, _ in named(names, make)]


# -- discovery -------------------------------------------------------------------------------------------
def read_manifest(path: Path) -> tuple[list[ManifestLine], list[str]]:
    """The lines of the campaign manifest *path* and the problems of those refused, each naming the campaign,
    the file and the line (``harness.contract.records``); a manifest not read is one problem."""
    camp = CampaignPaths(path.parent)
    try:
        events, problems = records.read_manifest(camp)
    except OSError as exc:
        events, problems = [], [safefile.not_read_problem(path, exc)]
    return events, [f"{camp.name}/{p}" for p in problems]


def scan(job_dir: Path | None) -> tuple[str, list[str] | None, list[str]]:
    """A cheap digest of the job dir's top-level entries other than directories (name, size, mtime_ns,
    without following links); the names of its regular files; the names of its other entries (links,
    FIFOs, devices: see :attr:`Attempt.odd`)."""
    fingerprint, names, odd, _stamp = scan_stamped(job_dir, None)
    return fingerprint, names, odd


# -- the stamp: a finished run's dir proved unchanged without listing it -------------------------------------
# A job dir's own mtime moves whenever an entry is created, removed or renamed in it: every file sbench's
# writers write whole (spec, submitted, result, rank, error, environment files: written under a temporary
# name and renamed into place, or created once) changes it. The files written in place (appended) do not:
# those are stat'ed one by one. See docs/performance.md, "The no-op re-collect's rule".
STAMP_SETTLE_NS = 5_000_000_000  # a stamp is taken only of a dir and files untouched this long before the scan


def settled_before() -> int:
    """The time (ns since the epoch) before which a dir and its in-place files must have last changed for a
    stamp of them to be taken now."""
    return time.time_ns() - STAMP_SETTLE_NS


def in_place_kinds(paths: JobPaths) -> list[Callable[[str], Path]]:
    """JobPaths's namings of the files sbench's writers change in place (appended): the node runner's stage
    log, the sampler's CSV, the training log, the batch output."""
    return [paths.stages, paths.samples, paths.train_log, paths.slurm_out]


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def scan_stamped(job_dir: Path | None, settled_ns: int | None) -> tuple[str, list[str] | None, list[str], str | None]:
    """:func:`scan`, plus the dir's *stamp* (see :func:`stamp_holds`): the dir's device, inode, mtime and
    ctime, and the size, mtime and ctime of each file written in place. None when no stamp may be taken:
    *settled_ns* is None, the dir has entries that are neither regular files nor directories, or the dir or
    one of those files changed at or after *settled_ns* (a change in the same clock tick as the scan could
    leave the same times behind)."""
    if job_dir is None:
        return "missing", None, [], None
    entries, odd = [], []
    stats: dict[str, os.stat_result] = {}
    try:
        dst = os.stat(job_dir)
        for e in os.scandir(job_dir):
            if not e.is_file(follow_symlinks=False):
                if e.is_dir(follow_symlinks=False):
                    continue
                odd.append(e.name)
            st = e.stat(follow_symlinks=False)
            stats[e.name] = st
            entries.append((e.name, st.st_size, st.st_mtime_ns))
    except OSError:
        return "missing", None, [], None
    entries.sort()
    names = [e[0] for e in entries]
    if odd:
        others = set(odd)
        names = [n for n in names if n not in others]
        odd.sort()
    fingerprint = hashlib.sha1(repr(entries).encode()).hexdigest()[:20]
    stamp = None
    if settled_ns is not None and not odd and dst.st_ctime_ns < settled_ns:
        paths = JobPaths(job_dir)
        in_place = sorted({n for make in in_place_kinds(paths) for _, n in named(names, make)})
        if all(stats[n].st_ctime_ns < settled_ns for n in in_place):
            stamp = "/".join([f"{dst.st_dev}:{dst.st_ino}:{dst.st_mtime_ns}:{dst.st_ctime_ns}",
                              *(f"{n}:{_stat_key(stats[n])}" for n in in_place)])
    return fingerprint, names, odd, stamp


def stamp_holds(job_dir: Path, stamp: str) -> bool:
    """Whether *job_dir* is as it was when *stamp* was taken (:func:`scan_stamped`): the same dir (device,
    inode), no entry created, removed or renamed in it (its mtime and ctime), and each file written in
    place of the same size, mtime and ctime. One ``stat`` of the dir and one ``lstat`` per such file."""
    head, *files = stamp.split("/")
    base = os.fspath(job_dir)
    try:
        st = os.stat(base)
        if f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}" != head:
            return False
        base += os.sep
        for item in files:
            name = item.rsplit(":", 3)[0]  # a name may hold ':', never '/'
            st = os.lstat(base + name)
            if f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}" != item[len(name) + 1:]:
                return False
    except OSError:
        return False
    return True


def job_file_names(paths: JobPaths) -> list[Callable[[str], Path]]:
    """JobPaths's namings of the files collect reads by pattern."""
    return [paths.stages, paths.samples, paths.result, paths.environment, paths.train_log, paths.error,
            paths.rank_result, paths.slurm_out]


def admit(att: Attempt) -> None:
    """Sort :attr:`Attempt.odd`: a link to a regular file inside the campaign directory joins *files*; any
    other entry that bears one of sbench's file names is a line of *unread* (its reason); others are no
    concern of sbench's."""
    if not att.odd or att.job_dir is None or att.files is None:
        return
    paths = JobPaths(att.job_dir)
    kinds = job_file_names(paths)
    files = list(att.files)
    for name in att.odd:
        if name in (paths.spec.name, paths.submitted.name):
            continue  # read by name (verify, jobdir.read_job), which says why when they are not
        if not any(named([name], make) for make in kinds):
            continue
        try:
            os.close(safefile.open_regular(paths.root / name, att.top, None)[0])
        except OSError as exc:
            att.unread.append(str(exc) if isinstance(exc, safefile.Refused) else f"{name}: unreadable ({exc.strerror})")
            continue
        files.append(name)
    att.files, att.odd = sorted(files), []


def verify(att: Attempt) -> None:
    """Before anything of *att*'s job dir is read: that it lies inside its campaign directory, and that its
    ``spec.json`` is this attempt's (campaign, point, repeat, attempt). A job dir that is not (replaced by
    a link to another campaign's, or a copy of another attempt's) gets :attr:`Attempt.refused`, the
    reason recorded for its run; none of its files is read."""
    if att.job_dir is None or att.refused is not None or att.spec is not None or att.files is None:
        return  # no job dir on disk: nothing will be read
    root = att.top or str(att.job_dir.parent)
    try:
        safefile.check_dir(att.job_dir, root)
    except OSError as exc:
        att.refused = f"job directory {att.job_dir} not read: {getattr(exc, 'why', None) or exc.strerror}"
        return
    doc, problem = read_json(JobPaths(att.job_dir).spec, root, safefile.SPEC_MAX)
    if doc is None:
        att.refused = f"job directory {att.job_dir} not read: {problem or 'it has no spec.json'}"
        return
    why = spec_problem(doc, att.point_id, att.repeat, att.attempt)
    if why is None and doc.get("campaign") != att.campaign:
        why = f"names campaign {str(doc.get('campaign'))[:60]!r}, not {att.campaign!r}"
    if why is not None:
        att.refused = f"job directory {att.job_dir} not read: its spec.json is not this attempt's ({why})"
        return
    att.spec = doc
    admit(att)


@dataclass
class Manifest:
    path: Path
    fingerprint: str  # size:mtime_ns; an unchanged manifest need not be recorded again
    # Its events (of the campaign collected), or None while it is *unread*: its attempts came from the index
    # recorded at the last collect (:func:`discover`'s *indexed*) and :func:`hydrate` reads it when needed.
    events: list[ManifestLine] | None
    campaign: str | None = None  # the campaign filter it was read with
    # The identity it was read at (device, inode, size, mtime) and every attempt it names, one row each
    # (:data:`INDEX_FIELDS`, the last line of a run winning): what the next collect needs to skip reading it.
    key: str = ""
    index: list[list[Any]] | None = None


INDEX_FIELDS = ("run_id", "campaign", "point_id", "repeat", "attempt", "job_dir")
Indexed = Callable[[str, str], "list[list[Any]] | None"]  # (manifest's absolute path, key) -> its recorded index


def hydrate(manifests: list[Manifest], attempts: Mapping[str, Attempt]) -> list[str]:
    """Read the manifests that :func:`discover` left unread, and give each of their attempts its manifest line
    (the attempts named in the index, :attr:`Attempt.manifest` being only their key fields until then). Returns
    the problems of their lines (already reported when they were recorded)."""
    problems: list[str] = []
    for man in manifests:
        if man.events is not None:
            continue
        evs, probs = read_manifest(man.path)
        problems += probs
        man.events = [ev for ev in evs if man.campaign is None or ev.get("campaign") == man.campaign]
        for ev in man.events:
            if ev.get("type") != "attempt":
                continue
            try:
                rid = attempt_row(ev)["run_id"]
            except (KeyError, TypeError, ValueError):
                continue
            a = attempts.get(rid)
            if a is not None and a.partial:
                a.manifest, a.partial = dict(ev), False
    return problems


def discover(workdir: Path, campaign: str | None,
             indexed: Indexed | None = None) -> tuple[list[Manifest], dict[str, Attempt], list[str]]:
    """Manifests and the attempts they name, plus job dirs found by their ``spec.json``.

    *indexed* gives the index a manifest had when it was last recorded: a manifest whose identity (device,
    inode, size, mtime: it is only ever appended to) is the same is not read, and its attempts come from
    that index, each :attr:`Attempt.partial` until :func:`hydrate` reads the manifest."""
    manifests: list[Manifest] = []
    attempts: dict[str, Attempt] = {}
    warnings: list[str] = []
    if not workdir.is_dir():
        return manifests, attempts, warnings
    known: set[str] = set()
    for camp in CampaignPaths.listed(workdir, campaign):
        cdir = camp.root
        try:  # a campaign directory that is a link leading out of the work dir is not read
            safefile.check_dir(cdir, workdir)
        except OSError as exc:
            warnings.append(f"{cdir}: not a campaign directory of this work dir ({getattr(exc, 'why', exc)}); ignored")
            continue
        mpath = camp.manifest
        root = os.path.abspath(cdir)
        cpath, base = Path(root), root + os.sep  # job dirs directly in it are made as children (cheaper)
        if os.path.lexists(mpath):
            try:
                st = mpath.stat()
            except OSError:  # a link to nothing: read_manifest says what it is
                st = os.lstat(mpath)
            key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
            index = indexed(os.path.abspath(mpath), key) if indexed is not None else None
            man = Manifest(mpath, f"{st.st_size}:{st.st_mtime_ns}", None, campaign, key)
            lines: dict[str, ManifestLine] = {}
            if index is None:
                evs, probs = read_manifest(mpath)
                warnings += probs
                man.events = [ev for ev in evs if campaign is None or ev.get("campaign") == campaign]
                rows: dict[str, list[Any]] = {}
                for ev in evs:
                    if ev.get("type") == "attempt":
                        try:
                            row = attempt_row(ev)
                        except (KeyError, TypeError, ValueError):
                            continue  # reported by record_manifest
                        rows[row["run_id"]] = [row[f] for f in INDEX_FIELDS]
                        lines[row["run_id"]] = ev
                index = list(rows.values())
                # A manifest with a bad line (or unreadable) is read, and its problems said, every time.
                man.index = None if probs else index
            manifests.append(man)
            for rid, camp, pid, rep, att, job_dir in index:
                if campaign is not None and camp != campaign:
                    continue
                jd = (cpath / job_dir[len(base):] if job_dir.startswith(base) and "/" not in job_dir[len(base):]
                      else Path(job_dir)) if job_dir else None
                line = lines.get(rid)
                a = Attempt(rid, camp, pid, rep, att, jd, dict(zip(INDEX_FIELDS, (rid, camp, pid, rep, att, job_dir)))
                            if line is None else dict(line), root=root, partial=line is None)
                attempts[rid] = a
                if job_dir:
                    known.add(os.path.abspath(job_dir))
        for spec in unlisted_specs(cdir, known):
            jd = spec.parent
            parsed = parse_job_dir_name(jd.name)
            if parsed is None:
                continue
            pid, rep, att = parsed
            try:
                safefile.check_dir(jd, root)
            except OSError as exc:
                warnings.append(f"{jd}: not a job directory of this campaign ({getattr(exc, 'why', exc)}); ignored")
                continue
            doc, problem = read_json(spec, root, safefile.SPEC_MAX)
            problem = problem or spec_problem(doc, pid, rep, att)
            if problem is not None:
                warnings.append(f"{spec}: not a job directory of this sbench ({problem}); ignored")
                continue
            camp = doc["campaign"]
            rid = run_id(str(camp), pid, rep, att)
            if rid in attempts:
                other = attempts[rid].job_dir
                if other is None:
                    attempts[rid].job_dir = jd
                elif not same_dir(other, jd):
                    warnings.append(f"{jd}: same run as {other}; ignored")
                continue
            attempts[rid] = Attempt(rid, str(camp), pid, rep, att, jd, None, root=root)
    return manifests, attempts, warnings


def unlisted_specs(cdir: Path, known: set[str]) -> list[Path]:
    """The ``spec.json`` of each directory of *cdir* (a link to one included) that is not one of the job dirs
    *known* (absolute paths): ``sorted(cdir.glob("*/spec.json"))`` without those, found without looking
    into the known dirs (one listing of *cdir*, one ``stat`` per other directory)."""
    out = []
    base = os.path.abspath(cdir) + os.sep
    try:
        with os.scandir(cdir) as it:
            for e in it:
                try:
                    if base + e.name in known or not e.is_dir():
                        continue
                except OSError:
                    continue
                spec = os.path.join(e.path, "spec.json")
                if os.path.exists(spec):
                    out.append(Path(spec))
    except OSError:
        return []
    return sorted(out)


def rendered_names(paths: JobPaths) -> set[str]:
    return {paths.spec.name, paths.sbatch.name, paths.launch.name, paths.accelerate.name, paths.deepspeed.name}


def same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def sample_files_of(att: Attempt) -> list[tuple[str, Path]]:
    """(host, path) of the attempt's ``samples.<host>.csv`` files, from the listing its fingerprint was
    taken from (the same one :func:`analyze` reads)."""
    if att.job_dir is None or att.files is None or att.refused is not None:
        return []
    paths = JobPaths(att.job_dir)
    return [(h, paths.samples(h)) for h in names_like(att.files, paths.samples)]


def spec_rows(att: Attempt) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    paths = JobPaths(att.job_dir) if att.job_dir and att.refused is None else None
    spec, _ = read_json(paths.spec, att.top, safefile.SPEC_MAX) if paths else (None, None)
    spec = spec if isinstance(spec, dict) else {}
    point = spec.get("point") or {}
    js = spec.get("jobspec") or {}
    sub = spec_exec(att)
    exp = point.get("experiment") or js.get("experiment")
    camp = {"campaign": att.campaign, "experiment": exp, "sweep": (spec.get("sweep") or {}).get("source"),
            "partition": js.get("partition"), "executor": sub.get("executor"),
            "created_at": utc(spec.get("rendered_at")),
            "sbench_version": spec.get("sbench_version"), "source": "spec"}
    prow = point_row(att.point_id, exp, point.get("entity") or js.get("entity"), point.get("valid", True),
                     point.get("reasons") or [], point.get("notes") or [])
    link = {"campaign": att.campaign, "point_id": att.point_id, "repeat": att.repeat}
    run = {"run_id": att.run_id, "campaign": att.campaign, "point_id": att.point_id, "repeat": att.repeat,
           "attempt": att.attempt, "experiment": exp, "job_dir": str(att.job_dir), "executor": sub.get("executor"),
           "job_id": None if sub.get("job_id") is None else str(sub.get("job_id")),
           "submitted_at": utc(sub.get("submitted_at") or sub.get("submit_time")), "state": jobstate.INITIAL}
    return camp, prow, link, run


def spec_exec(att: Attempt) -> SubmittedInfo:
    """The job dir's ``submitted.json`` (empty when missing or not read: verify() and the job dir's reader say
    why)."""
    if att.job_dir is None or att.refused is not None:
        return {}
    return read_submitted(att.job_dir, att.top)
