"""Finding runs: campaign manifests, the attempts they name, job dirs submitted by hand (found by their
``spec.json``), and a cheap fingerprint of each job dir's files.

A ``spec.json`` that sbench did not write (another schema, another tool, a stray file) is refused with a
warning: it never becomes a run.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract.paths import SPEC_SCHEMA, JobPaths, parse_job_dir_name, run_id
from harness.db.manifest import attempt_row, point_row
from harness.db.values import utc

from .parse import read_json, read_jsonl

MANIFEST = "manifest.jsonl"
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
    manifest: dict[str, Any] | None = None  # the attempt line
    fingerprint: str = "missing"
    files: list[str] | None = None  # names of the job dir's top-level files (from the fingerprint scan)


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
def read_manifest(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    events, problems = read_jsonl(path, ("type",))
    return [ev for _, ev in events], [f"{path.parent.name}/{p}" for p in problems]


def scan(job_dir: Path | None) -> tuple[str, list[str] | None]:
    """A cheap digest of the job dir's top-level files (name, size, mtime_ns), and their names."""
    if job_dir is None:
        return "missing", None
    try:
        entries = sorted((e.name, st.st_size, st.st_mtime_ns) for e in os.scandir(job_dir)
                         if e.is_file(follow_symlinks=False) for st in [e.stat(follow_symlinks=False)])
    except OSError:
        return "missing", None
    return hashlib.sha1(repr(entries).encode()).hexdigest()[:20], [e[0] for e in entries]


@dataclass
class Manifest:
    path: Path
    fingerprint: str  # size:mtime_ns; an unchanged manifest need not be recorded again
    events: list[dict[str, Any]]


def discover(workdir: Path, campaign: str | None) -> tuple[list[Manifest], dict[str, Attempt], list[str]]:
    """Manifests and the attempts they name, plus job dirs found by their ``spec.json``."""
    manifests: list[Manifest] = []
    attempts: dict[str, Attempt] = {}
    warnings: list[str] = []
    if not workdir.is_dir():
        return manifests, attempts, warnings
    known: set[str] = set()
    # Dot dirs hold sbench's own jobs (.fabric, .probe), not campaigns.
    camp_dirs = sorted(p for p in workdir.iterdir() if p.is_dir() and not p.name.startswith(".")
                       and (campaign is None or p.name == campaign))
    for cdir in camp_dirs:
        mpath = cdir / MANIFEST
        if mpath.is_file():
            st = mpath.stat()
            evs, probs = read_manifest(mpath)
            warnings += probs
            mine = [ev for ev in evs if campaign is None or ev.get("campaign") == campaign]
            manifests.append(Manifest(mpath, f"{st.st_size}:{st.st_mtime_ns}", mine))
            for ev in mine:
                if ev.get("type") == "attempt":
                    try:
                        row = attempt_row(ev)
                    except (KeyError, TypeError, ValueError):
                        continue  # reported by record_manifest
                    jd = Path(row["job_dir"]) if row["job_dir"] else None
                    attempts[row["run_id"]] = Attempt(row["run_id"], row["campaign"], row["point_id"], row["repeat"],
                                                      row["attempt"], jd, dict(ev))
                    if jd is not None:
                        known.add(os.path.abspath(jd))
        for spec in sorted(cdir.glob("*/spec.json")):
            jd = spec.parent
            if os.path.abspath(jd) in known:
                continue
            parsed = parse_job_dir_name(jd.name)
            if parsed is None:
                continue
            pid, rep, att = parsed
            doc, problem = read_json(spec)
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
            attempts[rid] = Attempt(rid, str(camp), pid, rep, att, jd, None)
    return manifests, attempts, warnings


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
    if att.job_dir is None or att.files is None:
        return []
    paths = JobPaths(att.job_dir)
    return [(h, paths.samples(h)) for h in names_like(att.files, paths.samples)]


def spec_rows(att: Attempt) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    paths = JobPaths(att.job_dir) if att.job_dir else None
    spec, _ = read_json(paths.spec) if paths else (None, None)
    spec = spec if isinstance(spec, dict) else {}
    point = spec.get("point") or {}
    js = spec.get("jobspec") or {}
    sub, _ = read_json(paths.submitted) if paths else (None, None)
    sub = sub if isinstance(sub, dict) else {}
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
           "submitted_at": utc(sub.get("submitted_at") or sub.get("submit_time")), "state": "SUBMITTED"}
    return camp, prow, link, run


def spec_exec(att: Attempt) -> dict[str, Any]:
    if att.job_dir is None:
        return {}
    sub, _ = read_json(JobPaths(att.job_dir).submitted)
    return sub if isinstance(sub, dict) else {}
