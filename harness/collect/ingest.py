"""One collect: find the runs, ask the scheduler, read what changed, write it all in one transaction.

Incremental and idempotent: each run stores a fingerprint of its job directory's files (name, size,
mtime) and its scheduler state. A run whose fingerprint and state are unchanged is skipped, so a second
collect writes nothing. A finished run whose dir its *stamp* proves unchanged (the dir's own times and
those of the files written in place: :func:`~.discover.stamp_holds`, docs/performance.md) keeps its
fingerprint without its dir being listed; a run that was still going is read again when either changes, and its rows are
replaced as a whole. Everything a collect writes is one DuckDB transaction: killed half-way, the database
stays as it was.

Runs come from each campaign's manifest (``CampaignPaths.manifest``; recorded again only when it changed) and from
``<workdir>/<campaign>/*/spec.json`` (job dirs rendered and submitted by hand; a dir that was only
rendered, with nothing submitted or run, is no run).

The steps, in order:

1. *discover*: the manifests, the job dirs, a fingerprint of each (or its stamp checked); the manifests are
   recorded.
2. the samples of the runs whose files changed start loading on the loader's worker (``loading``): the
   sampler's CSVs are most of a collect's bytes, and DuckDB's reader loads them on every core.
3. meanwhile, this thread asks the scheduler about the runs that may have changed (``scheduler``: one
   batched sacct call), reads their job dirs *after* it answered (so a run the scheduler calls ended is
   read with the files it ended with), decides their outcomes and stages their rows in memory;
4. once the samples are loaded, this thread writes the rows, the sample statistics and the measurements,
   then flags the runs that held a host at the same time as another run (``db.overlaps``: the runs
   written now and every run they overlap, now or before).

The threading rule is ``loading``'s: between the loader's ``start`` and ``join`` this thread makes no
database call.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
import orjson

from harness.contract import envvars
from harness.contract.errors import CollectError
from harness.contract.jobstate import FINAL_STATES
from harness.contract.paths import DbTarget, JobPaths
from harness.db.checks import refresh_checks
from harness.db.hosts import measured_peaks_by_host
from harness.db.lake import is_conflict
from harness.db.manifest import ensure_spec_rows, record_manifest
from harness.db.overlaps import refresh_overlaps
from harness.db.runs import replace_runs, run_counts, run_index
from harness.db.samples import next_sample_file_id, sample_stats
from harness.db.schema import RUN_CHILD_TABLES
from harness.db.staging import Staged, stage
from harness.db.store import Store, open_store
from harness.db.values import from_json, utc
from harness.slurm.client import Slurm

from . import rows, scheduler
from .discover import (
    INDEX_FIELDS,
    Attempt,
    Manifest,
    admit,
    discover,
    hydrate,
    rendered_names,
    scan,
    scan_stamped,
    settled_before,
    spec_rows,
    stamp_holds,
    verify,
)
from .jobdir import read_job
from .loading import SampleLoader
from .outcome import Sched, decide
from .rows import RunData

Progress = Callable[[str, int, int], None]
MANIFEST_KEY = "manifest:"  # metadata: + a manifest's absolute path -> its size:mtime_ns when last recorded
INDEX_KEY = "manifest-index:"  # metadata: + a manifest's absolute path -> JSON {key, rows}: discover's index
STAMPS_KEY = "stamps:"  # metadata: + a campaign directory's absolute path -> JSON {run id: [fingerprint, stamp]}
CHILD_ROWS = (("run_hosts", "hosts"), ("stages", "stages"), ("ranks", "ranks"), ("errors", "errors"),
              ("trials", "trials"), ("environment", "environment"), ("memory", "memory"),
              ("profile_ops", "profile_ops"), ("rank_scores", "rank_scores"))


@dataclass
class CollectReport:
    db: str
    workdir: str
    campaign: str | None = None  # collected one campaign: runs, outcomes and accounting are that campaign's
    runs: int = 0
    new: int = 0
    updated: int = 0
    unchanged: int = 0
    sample_rows: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    accounting: dict[str, int] = field(default_factory=dict)
    sacct: str | None = None
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    conflicts: int = 0  # a shared store's commits refused because another writer committed first (each redone)
    # Seconds per phase (they add up to elapsed_s): discover (the manifests recorded), scheduler, parse (the
    # changed job dirs read, their outcomes decided and rows staged), samples (what is left of the load after
    # parsing), measure, write, commit; plus samples_load, the load's own duration (it overlaps the scheduler
    # and parse phases, so it is not part of the sum).
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Clock:
    def __init__(self, report: CollectReport) -> None:
        self.report, self.t = report, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.report.timings[name] = round(self.report.timings.get(name, 0.0) + now - self.t, 3)
        self.t = now


def _pause(phase: str) -> None:
    """Tests: stop here, inside the transaction, long enough to be killed (envvars.COLLECT_PAUSE_AT)."""
    if envvars.COLLECT_PAUSE_AT.get() == phase:
        sys.stderr.write(f"sbench-collect: paused at {phase}\n")
        sys.stderr.flush()
        time.sleep(float(envvars.COLLECT_PAUSE_S.get()))


def analyze(att: Attempt, sched: Sched, cancel_requested: bool,
            known_point: Mapping[str, Any] | None = None) -> RunData:
    """Read one job directory, decide its outcome, build its rows; never raises on bad content.

    The files are those of the fingerprint's scan, taken before the scheduler was asked. When the
    scheduler's word ends a run they show unfinished or failed, the run may have ended in between: a dir
    that changed since the scan is read again (its fingerprint stays the scan's, so the next collect reads
    all of it again). A job dir :func:`~.discover.verify` refused is a failed run with that reason."""
    if att.refused is not None:
        return rows.failed_unread(att, sched, att.refused)
    files = read_job(att, known_point)
    verdict = decide(files, sched, cancel_requested)
    if verdict.over and verdict.outcome != "ok":
        fp, names, odd = scan(att.job_dir)
        if fp != att.fingerprint:
            again = replace(att, files=names, odd=odd, unread=[])
            admit(again)
            files = read_job(again, known_point)
            verdict = decide(files, sched, cancel_requested)
    return rows.build(files, verdict)


def analyze_isolated(att: Attempt, sched: Sched, cancel_requested: bool,
                     known_point: Mapping[str, Any] | None = None) -> RunData:
    """:func:`analyze`, with any failure confined to this run: it is recorded as failed, with the reason,
    and every other run of the collect goes on."""
    try:
        return analyze(att, sched, cancel_requested, known_point)
    except Exception as exc:  # noqa: BLE001 - one unreadable job dir must not stop the others
        return rows.unreadable(att, sched, exc)


def collect(db: DbTarget | str, workdir: str | Path, campaign: str | None = None, *, progress: Progress | None = None,
            slurm: Slurm | None = None, wait_s: float | None = None,
            run_ids: Collection[str] | None = None) -> CollectReport:
    """Collect every run under *workdir* into *db*; see the module docstring. With *run_ids*, only those
    runs are looked at (manifests are still recorded): submit's refresh of what changed. On a shared store, a
    commit refused because another writer committed first changed nothing: the collect runs again (up to
    :data:`CONFLICT_RETRIES` times), on what that writer left."""
    t0 = time.monotonic()
    for turn in range(CONFLICT_RETRIES + 1):
        try:
            report = _collect_once(db, workdir, campaign, progress, slurm, wait_s, run_ids)
        except _Conflict as exc:
            if turn == CONFLICT_RETRIES:
                raise CollectError(f"{db}: collect changed nothing: {CONFLICT_RETRIES + 1} commits in a row met "
                                   f"another writer's ({exc}); run it again") from None
            time.sleep(min(2.0, 0.1 * 2 ** turn))
            continue
        report.elapsed_s = round(time.monotonic() - t0, 3)
        report.conflicts = turn
        return report
    raise AssertionError("unreachable")


CONFLICT_RETRIES = 5


class _Conflict(Exception):
    pass


def _collect_once(db: DbTarget | str, workdir: str | Path, campaign: str | None, progress: Progress | None,
                  slurm: Slurm | None, wait_s: float | None, run_ids: Collection[str] | None) -> CollectReport:
    wd = Path(workdir)
    report = CollectReport(db=str(db), workdir=str(wd), campaign=campaign)
    prog = progress or (lambda phase, done, total: None)
    clock = _Clock(report)
    prog("discover", 0, 1)
    tmpdir = Path(tempfile.mkdtemp(prefix="sbench-collect-"))
    try:
        with open_store(db, wait_s=wait_s) as store:
            manifests, attempts, warns = discover(wd, campaign, lambda path, key: _indexed(store, path, key))
            if run_ids is not None:
                keep = set(run_ids)
                attempts = {rid: a for rid, a in attempts.items() if rid in keep}
            report.warnings += warns
            if not wd.is_dir():
                report.warnings.append(f"{wd}: no such directory; nothing to collect (pass --workdir)")
            store.note_campaigns({a.campaign for a in attempts.values()} | ({campaign} if campaign else set()))
            with store.transaction():
                _collect(store, report, manifests, attempts, slurm or Slurm(), prog, clock, tmpdir)
            clock.lap("commit")
            report.outcomes, report.accounting = run_counts(store, campaign)
    except duckdb.Error as exc:
        if is_conflict(exc):
            raise _Conflict(str(exc).splitlines()[-1]) from None
        raise CollectError(f"{db}: collect failed and changed nothing (rolled back): {one_line(exc)}") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return report


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An error's message on one line (a shared store's commit says why on the lines under its first), at most
    *limit* characters."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _record(store: Store, manifests: list[Manifest], attempts: Mapping[str, Attempt],
            recorded: Collection[str]) -> tuple[bool, list[str]]:
    """The manifests changed since the last collect, and the job dirs submitted by hand that are new:
    whether any manifest changed, and the problems found in their lines."""
    changed, problems = False, []
    for man in manifests:
        # The manifest is append-only: one unchanged since the last collect is recorded already.
        key = MANIFEST_KEY + os.path.abspath(man.path)
        if store.get_metadata(key) != man.fingerprint:
            changed = True
            if man.events is None:  # its index was recorded, its fingerprint not (a database put back by hand)
                problems += hydrate([man], attempts)
            assert man.events is not None
            problems += record_manifest(store, man.events, strict=False, source=str(man.path))
            store.set_metadata(key, man.fingerprint)
        if man.index is not None:  # read now: the next collect need not read it while it stays as it is
            store.set_metadata(INDEX_KEY + os.path.abspath(man.path),
                               orjson.dumps({"key": man.key, "rows": man.index}).decode())
    for a in attempts.values():
        if a.manifest is None and a.run_id not in recorded:
            ensure_spec_rows(store, *spec_rows(a))
    return changed, problems


def _indexed(store: Store, path: str, key: str) -> list[list[Any]] | None:
    """The index of the manifest at *path* recorded when it had identity *key* (see :func:`_record`), or
    None when it has not been recorded so."""
    doc = from_json(store.get_metadata(INDEX_KEY + path))
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("rows"), list):
        return None
    rows = doc["rows"]
    width = len(INDEX_FIELDS)
    if not all(isinstance(r, list) and len(r) == width for r in rows):
        return None
    return rows


def _load_stamps(store: Store, roots: Collection[str]) -> dict[str, dict[str, Any]]:
    """The stamps recorded per campaign directory: run id -> [fingerprint, stamp] (see :func:`_scan`)."""
    out: dict[str, dict[str, Any]] = {}
    for root in roots:
        doc = from_json(store.get_metadata(STAMPS_KEY + root))
        out[root] = doc if isinstance(doc, dict) else {}
    return out


def _scan(attempts: dict[str, Attempt], before: Mapping[str, Mapping[str, Any]],
          stamps: dict[str, dict[str, Any]]) -> set[str]:
    """Each attempt's fingerprint, and the names of its files when they may be read.

    A run recorded in a final state whose dir the stamp recorded with its fingerprint proves unchanged
    (:func:`~.discover.stamp_holds`) keeps that fingerprint and is not listed: it will not be read. Any
    other job dir is listed in full (:func:`~.discover.scan_stamped`), and its new stamp replaces the old
    one. Returns the campaign directories whose stamps changed."""
    settled = settled_before()
    changed: set[str] = set()
    for rid, a in list(attempts.items()):
        mine = stamps.setdefault(a.top or "", {})
        old, info = mine.get(rid), before.get(rid) or {}
        if (a.job_dir is not None and isinstance(old, list) and len(old) == 2 and info.get("state") in FINAL_STATES
                and info.get("fingerprint") == old[0] and isinstance(old[1], str) and stamp_holds(a.job_dir, old[1])):
            a.fingerprint = old[0]
            continue
        a.fingerprint, a.files, a.odd, stamp = scan_stamped(a.job_dir, settled)
        # A job dir that was only rendered (a preview: no manifest line, never submitted, nothing ran) is no run.
        if a.manifest is None and a.job_dir is not None and set(a.files or ()) <= rendered_names(JobPaths(a.job_dir)):
            del attempts[rid]
            stamp = None
        new = [a.fingerprint, stamp] if stamp is not None else None
        if new != old:
            if new is None:
                mine.pop(rid, None)
            else:
                mine[rid] = new
            changed.add(a.top or "")
    return changed


def _collect(store: Store, report: CollectReport, manifests: list[Manifest], attempts: dict[str, Attempt],
             slurm: Slurm, prog: Progress, clock: _Clock, tmpdir: Path) -> None:
    before = run_index(store)
    stamps = _load_stamps(store, {a.top or "" for a in attempts.values()})
    stamps_changed = _scan(attempts, before, stamps)
    manifests_changed, problems = _record(store, manifests, attempts, before)
    report.warnings += problems
    index = run_index(store) if manifests_changed or len(before) < len(attempts) else before
    refiled = [a for a in attempts.values() if (before.get(a.run_id) or {}).get("fingerprint") != a.fingerprint]
    prog("discover", 1, 1)
    clock.lap("discover")
    _pause("parse")
    # Runs whose files changed are read again whatever the scheduler says: their samples start loading now,
    # once their job dirs are known to be theirs.
    for a in refiled:
        verify(a)
    loader = SampleLoader(store, next_sample_file_id(store), tmpdir, before)
    loader.start(refiled)
    try:
        datas, staged = _read(report, manifests, attempts, index, refiled, loader, slurm, prog, clock)
        _pause("samples")
        prog("samples", 0, 1)
        loader.join()
    except BaseException:
        loader.abort()
        raise
    report.timings["samples_load"] = round(loader.seconds, 3)
    clock.lap("samples")
    prog("samples", 1, 1)
    _pause("measure")
    by_run = {d.run["run_id"]: d for d in datas}
    store.insert("sample_files", loader.file_rows({rid: d.run["train_start_wall"] for rid, d in by_run.items()}))
    stats = sample_stats(store, [{"run_id": d.run["run_id"], "start": d.window[0], "end": d.window[1],
                                  "interval": d.sample_interval_s} for d in datas if d.sample_files])
    again = loader.miscounted(by_run, stats)
    if again:
        loader.recheck(again)
    loader.warn(by_run)
    measurements = _measure(datas, stats, measured_peaks_by_host(store))
    clock.lap("measure")
    now = utc(time.time())
    for d in datas:
        d.run["collected_at"] = now
        if (index.get(d.run["run_id"]) or {}).get("fingerprint") is not None:
            report.updated += 1
        else:
            report.new += 1
    report.sample_rows = loader.rows
    _pause("write")
    store.delete_runs([rid for rid in by_run if rid in before], [t for t in RUN_CHILD_TABLES if t != "sample_files"])
    for part in staged:
        store.insert(part.table, part)
    replace_runs(store, [d.run for d in datas])
    store.insert("measurements", measurements)
    # Runs that held a host at the same time: the runs written now and every run they overlap (db.overlaps).
    refresh_overlaps(store, list(by_run))
    for root in sorted(stamps_changed):
        store.set_metadata(STAMPS_KEY + root, json.dumps(stamps[root], separators=(",", ":")))
    if datas or manifests_changed:
        refresh_checks(store, now)
    clock.lap("write")
    _pause("commit")


def _read(report: CollectReport, manifests: list[Manifest], attempts: Mapping[str, Attempt],
          index: Mapping[str, Mapping[str, Any]], refiled: list[Attempt], loader: SampleLoader,
          slurm: Slurm, prog: Progress, clock: _Clock) -> tuple[list[RunData], list[Staged]]:
    """While the samples load: the scheduler's word, then the changed job dirs read and their rows staged.
    No database call here (the loader owns the connection)."""
    todo = scheduler.unsettled(attempts.values(), index)
    if todo:  # a run may be read: its manifest line is needed (the scheduler's key, the run's rows)
        report.warnings += hydrate(manifests, attempts)
    scheds, report.sacct = scheduler.states(todo, slurm)
    clock.lap("scheduler")
    changed: list[tuple[Attempt, Sched, dict[str, Any]]] = []
    for a, info in todo:
        s = scheds[a.run_id]
        new_state = s.state if s.state is not None else ("GONE" if s.gone else None)
        state_moved = new_state is not None and new_state != info.get("state")
        if info.get("fingerprint") != a.fingerprint or state_moved:
            changed.append((a, s, info))
    report.runs = len(attempts)
    report.unchanged = len(attempts) - len(changed)
    # A run whose state moved but whose files did not is read again too: its rows are replaced as a whole.
    refiled_ids = {a.run_id for a in refiled}
    for a, _s, _i in changed:
        if a.files is None and a.job_dir is not None:  # proved unchanged by its stamp, yet read: list it first
            a.fingerprint, a.files, a.odd = scan(a.job_dir)
        verify(a)
    loader.add(a for a, _s, _i in changed if a.run_id not in refiled_ids)
    known_points = {str(ev.get("point_id")): ev for man in manifests for ev in man.events or ()
                    if ev.get("type") == "point"}
    datas: list[RunData] = []
    for i, (a, s, info) in enumerate(changed):
        d = analyze_isolated(a, s, info.get("cancel_requested_at") is not None, known_points.get(a.point_id))
        # The cancel request comes from the manifest, not from the files: keep it.
        if d.run.get("cancel_requested_at") is None:
            d.run["cancel_requested_at"] = info.get("cancel_requested_at")
        datas.append(d)
        if i % 25 == 0:
            prog("parse", i, len(changed))
    prog("parse", len(changed), len(changed))
    staged = [stage(table, [r for d in datas for r in getattr(d, attr)]) for table, attr in CHILD_ROWS]
    for d in datas:  # staged: their row dicts are not needed any more
        d.hosts, d.stages, d.ranks, d.errors, d.environment = [], [], [], [], []
    clock.lap("parse")
    return datas, staged


def _measure(datas: list[RunData], stats: list[dict[str, Any]],
             peaks: dict[tuple[str, str], list[float]]) -> list[dict[str, Any]]:
    """Each run's sample counts, its peak RSS when the scheduler gave none, and its measurements row (MFU against
    its hosts' measured *peaks* where there are)."""
    stats_by_run: dict[str, list[dict[str, Any]]] = {}
    for s in stats:
        stats_by_run.setdefault(s["run_id"], []).append(s)
    measurements = []
    for d in datas:
        mine = stats_by_run.get(d.run["run_id"], [])
        d.run["sample_rows"] = sum(int(s["rows_all"]) for s in mine)
        if d.run["max_rss_mb"] is None:
            d.run["max_rss_mb"] = max((s["rss_mb_max"] for s in mine if s["rss_mb_max"] is not None), default=None)
        d.measured_peak = rows.mfu_peak(d, peaks)
        m = rows.measurement_row(d, mine)
        if m is not None:
            measurements.append(m)
    return measurements


__all__ = ["CollectReport", "analyze", "collect", "discover"]
