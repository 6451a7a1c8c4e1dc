"""One collect: discover job directories, ask the scheduler, parse what changed, write it all in one
transaction.

Incremental and idempotent: each run stores a fingerprint of its job directory's files (name, size,
mtime) and its scheduler state. A run whose fingerprint and state are unchanged is skipped, so a
second collect writes nothing; a run that was still going is re-read when either changes, and its
rows are replaced as a whole. Everything a collect writes is one DuckDB transaction: killed half-way,
the database stays as it was.

Runs come from ``<workdir>/*/manifest.jsonl`` (re-recorded only when the file changed) and from
``<workdir>/<campaign>/*/spec.json`` (job dirs rendered and submitted by hand; a dir that was only
rendered, with nothing submitted or run, is skipped). The scheduler is asked on a thread of its own
(``scheduler``: one batched ``sacct`` call for SLURM runs, the process id for local ones) while the job
dirs whose files changed are read; the files decide the rest. The database work runs on a worker thread
of its own (``loading``: the same connection and transaction, one statement at a time): samples are
bulk-loaded by DuckDB's CSV reader, in one scan over all the files that changed, while this thread scans
the job dirs and parses them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb

from harness.contract.errors import CollectError
from harness.contract.paths import JobPaths
from harness.db.store import Store, arrow, open_store, stage, utc
from harness.slurm.client import Slurm
from harness.spec.references import refresh_checks

from . import rows, scheduler
from .discover import Attempt, Manifest, discover, rendered_names, scan, spec_rows
from .jobdir import JobFiles, read_job
from .loading import SampleLoads, Worker, in_thread
from .outcome import Sched, decide
from .rows import RunData

Progress = Callable[[str, int, int], None]
FIRST_LOAD_RUNS = 64  # changed runs whose samples start loading before the other job dirs are scanned
PAUSE_ENV = "SBENCH_COLLECT_PAUSE_AT"  # tests: pause at a phase (inside the transaction) to be killed there


@dataclass
class CollectReport:
    db: str
    workdir: str
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
    # Seconds per phase (they add up to elapsed_s): discover (the manifests are recorded meanwhile),
    # parse (reading the changed job dirs while the scheduler is asked, then deciding outcomes and
    # building rows; the samples load meanwhile), decide (waiting for the scheduler's answer), samples
    # (what is left of the load after parsing), measure, write, commit; plus samples_load, the load's own
    # duration (it overlaps the phases before it, so it is not part of the sum).
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
    if os.environ.get(PAUSE_ENV) == phase:
        sys.stderr.write(f"sbench-collect: paused at {phase}\n")
        sys.stderr.flush()
        time.sleep(float(os.environ.get("SBENCH_COLLECT_PAUSE_S", "60")))



def analyze(att: Attempt, sched: Sched, cancel_requested: bool,
            known_point: Mapping[str, Any] | None = None, early: JobFiles | None = None) -> RunData:
    """Read one job directory, decide its outcome, build its rows; never raises on bad content.

    *early*: its files as read before the scheduler answered. They stand unless the scheduler's word ends
    a run they show unfinished or failed: it may have ended in between, so a dir changed since it was
    scanned is read again (its fingerprint stays the scan's: the next collect reads it all again)."""
    files = early if early is not None else read_job(att, known_point)
    verdict = decide(files, sched, cancel_requested)
    if early is not None and verdict.over and verdict.outcome != "ok":
        fp, names = scan(att.job_dir)
        if fp != att.fingerprint:
            files = read_job(replace(att, files=names), known_point)
            verdict = decide(files, sched, cancel_requested)
    return rows.build(files, verdict)


def analyze_isolated(att: Attempt, sched: Sched, cancel_requested: bool,
                     known_point: Mapping[str, Any] | None = None, early: JobFiles | None = None) -> RunData:
    """:func:`analyze`, with any failure confined to this run: it is recorded as failed, with the reason,
    and every other run of the collect goes on."""
    try:
        return analyze(att, sched, cancel_requested, known_point, early)
    except Exception as exc:  # noqa: BLE001 - one unreadable job dir must not stop the others
        return rows.unreadable(att, sched, exc)


def read_early(att: Attempt, known_point: Mapping[str, Any] | None) -> JobFiles | None:
    """*att*'s files, read while the scheduler is being asked (None if reading fails: :func:`analyze`
    reads again, and confines the failure to the run)."""
    try:
        return read_job(att, known_point)
    except Exception:  # noqa: BLE001 - reported by the second read
        return None


# -- the collect -------------------------------------------------------------------------------------------
def collect(db: str | Path, workdir: str | Path, campaign: str | None = None, *, progress: Progress | None = None,
            slurm: Slurm | None = None, wait_s: float | None = None,
            run_ids: Collection[str] | None = None) -> CollectReport:
    """Collect every run under *workdir* into *db*; see the module docstring. With *run_ids*, only those
    runs are looked at (manifests are still recorded): submit's refresh of what changed."""
    t0 = time.monotonic()
    wd = Path(workdir)
    report = CollectReport(db=str(db), workdir=str(wd))
    prog = progress or (lambda phase, done, total: None)
    clock = _Clock(report)
    prog("discover", 0, 1)
    # The database opens (and its schema is checked) on a thread of its own while the work dir is scanned.
    opening = in_thread(lambda: open_store(db, wait_s=wait_s))
    try:
        manifests, attempts, warns = discover(wd, campaign)
    except BaseException:
        with contextlib.suppress(Exception):
            opening.result().close()
        raise
    if run_ids is not None:
        keep = set(run_ids)
        attempts = {rid: a for rid, a in attempts.items() if rid in keep}
    report.warnings += warns
    if not wd.is_dir():
        report.warnings.append(f"{wd}: no such directory; nothing to collect (pass --workdir)")
    tmpdir = Path(tempfile.mkdtemp(prefix="sbench-collect-"))
    # The parse makes ~100 small objects per job dir and frees none of them until the end: the cyclic
    # collector would rescan them all again and again (a quarter of the parse's time) and find nothing.
    gc_was_on = gc.isenabled()
    gc.disable()
    # Two threads share the interpreter: while this one runs Python, the worker waits for it after every
    # database call, up to a switch interval each time (5 ms by default, more than most small inserts take).
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        with opening.result() as store:
            with store.transaction():
                worker = Worker(store)
                try:
                    _collect(store, worker, report, manifests, attempts, slurm, prog, clock, tmpdir)
                except BaseException:
                    worker.abort()
                    raise
                worker.close()
            clock.lap("commit")
            report.outcomes, report.accounting = store.run_counts()
    except duckdb.Error as exc:
        raise CollectError(f"{db}: collect failed and changed nothing (rolled back): {exc}") from None
    finally:
        if gc_was_on:
            gc.enable()
        sys.setswitchinterval(switch)
        shutil.rmtree(tmpdir, ignore_errors=True)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


def _record(store: Store, manifests: list[Manifest], attempts: dict[str, Attempt],
            index: dict[str, dict[str, Any]]) -> tuple[bool, list[str], dict[str, dict[str, Any]]]:
    """The manifests (those changed since the last collect) and the job dirs submitted by hand: whether any
    manifest changed, the problems found, and the runs as recorded now. On the worker thread."""
    changed, problems = False, []
    for man in manifests:
        # The manifest is append-only: one unchanged since the last collect is recorded already.
        key = f"manifest:{os.path.abspath(man.path)}"
        if store.get_metadata(key) != man.fingerprint:
            changed = True
            problems += store.record_manifest(man.events, strict=False, source=str(man.path))
            store.set_metadata(key, man.fingerprint)
    for a in attempts.values():
        if a.manifest is None and a.run_id not in index:
            camp, prow, link, run = spec_rows(a)
            store.ensure_spec_rows(camp, prow, link, run)
    return changed, problems, store.run_index()


def _collect(store: Store, worker: Worker, report: CollectReport, manifests: list[Manifest],
             attempts: dict[str, Attempt], slurm: Slurm | None, prog: Progress, clock: _Clock,
             tmpdir: Path) -> None:
    # The database's work is queued on the worker in order; this thread scans, asks the scheduler and
    # parses meanwhile, and waits for an answer only where it needs one.
    # A job dir that was only rendered (a preview: no manifest line, never submitted, nothing ran) is no run.
    for rid, a in list(attempts.items()):
        if a.manifest is None:
            a.fingerprint, a.files = scan(a.job_dir)
            if a.job_dir is not None and set(a.files or ()) <= rendered_names(JobPaths(a.job_dir)):
                del attempts[rid]
    before = store.run_index()
    loads = SampleLoads(store, store.next_sample_file_id(), tmpdir)
    loaded: list[Future[None]] = []

    def reread(batch: list[Attempt]) -> None:
        """Queue the replacement of *batch*'s rows: the old ones deleted, the samples loaded again. (A run
        collect has not seen has no rows: they are only ever written together with its ``runs`` row.)"""
        old = [a.run_id for a in batch if a.run_id in before]
        if old:
            worker.submit(store.delete_runs, old)
        loaded.append(worker.submit(loads.load, loads.prepare(batch)))

    # Runs whose files changed are re-read whatever the scheduler says: their samples load at once. The
    # first few are queued as soon as they are scanned, so the load is under way (ahead of recording the
    # manifests) while the rest are.
    refiled: list[Attempt] = []
    queued = 0
    recorded = None
    for a in attempts.values():
        if a.manifest is not None:
            a.fingerprint, a.files = scan(a.job_dir)
        if (before.get(a.run_id) or {}).get("fingerprint") != a.fingerprint:
            refiled.append(a)
            if not queued and len(refiled) == FIRST_LOAD_RUNS:
                reread(refiled)
                queued = len(refiled)
                # The writes need Arrow: imported now, while the samples load, not by the next step.
                arrow()
                recorded = worker.submit(_record, store, manifests, attempts, before)
    if recorded is None:
        recorded = worker.submit(_record, store, manifests, attempts, before)
    reread(refiled[queued:])
    prog("discover", 1, 1)
    clock.lap("discover")
    _pause("parse")
    known_points = {str(ev.get("point_id")): ev for man in manifests for ev in man.events
                    if ev.get("type") == "point"}
    # The scheduler is asked on a thread of its own, once the manifests are recorded; until it answers,
    # this one reads the job dirs whose files changed (they are re-read whatever it says). The rest are
    # read one by one with their verdict: each run's files are freed as soon as its rows are built.
    asked = in_thread(scheduler.ask, recorded, attempts, slurm)
    early: dict[str, JobFiles | None] = {}
    for a in refiled:
        if asked.done():
            break
        early[a.run_id] = read_early(a, known_points.get(a.point_id))
        if len(early) % 25 == 0:
            prog("parse", len(early), len(refiled))
    clock.lap("parse")
    answer = asked.result()
    report.warnings += answer.problems
    report.sacct = answer.sacct
    changed: list[tuple[Attempt, Sched, dict[str, Any]]] = []
    for a, info in answer.todo:
        s = answer.scheds[a.run_id]
        new_state = s.state if s.state is not None else ("GONE" if s.gone else None)
        state_moved = new_state is not None and new_state != info.get("state")
        if info.get("fingerprint") != a.fingerprint or state_moved:
            changed.append((a, s, info))
    report.runs = len(attempts)
    report.unchanged = len(attempts) - len(changed)
    # A run whose state moved but whose files did not is re-read too: its rows are replaced as a whole.
    refiled_ids = {a.run_id for a in refiled}
    moved = [a for a, _s, _i in changed if a.run_id not in refiled_ids]
    if moved:
        reread(moved)
    clock.lap("decide")
    _pause("samples")
    datas: list[RunData] = []
    read_before = len(early)
    for i, (a, s, info) in enumerate(changed):
        d = analyze_isolated(a, s, info.get("cancel_requested_at") is not None, known_points.get(a.point_id),
                             early.pop(a.run_id, None))
        # The cancel request comes from the manifest, not from the files: keep it.
        if d.run.get("cancel_requested_at") is None:
            d.run["cancel_requested_at"] = info.get("cancel_requested_at")
        datas.append(d)
        if i % 25 == 0 and i > read_before:
            prog("parse", min(i, len(refiled)), len(refiled))
    prog("parse", len(refiled), len(refiled))
    # Typed columns of the run's child rows, while the worker still loads samples.
    staged = [stage(table, [r for d in datas for r in getattr(d, attr)])
              for table, attr in (("run_hosts", "hosts"), ("stages", "stages"), ("ranks", "ranks"),
                                  ("errors", "errors"), ("trials", "trials"), ("environment", "environment"),
                                  ("memory", "memory"))]
    for d in datas:  # staged: free the row dicts now, while the samples load, not after the commit's wait
        d.hosts, d.stages, d.ranks, d.errors, d.environment = [], [], [], [], []
    clock.lap("parse")
    prog("samples", 0, 1)
    # Queued behind the loads: the files' rows and their statistics, then the child rows, which the worker
    # writes while this thread builds the measurements from those statistics.
    by_run = {d.run["run_id"]: d for d in datas}
    files = [{"file_id": f.file_id, "run_id": f.run_id, "host": f.host, "path": str(f.path),
              "t0": by_run[f.run_id].run["train_start_wall"]} for f in loads.files]
    windows = [{"run_id": d.run["run_id"], "start": d.window[0], "end": d.window[1]} for d in datas if d.sample_files]
    stats = worker.submit(_file_stats, store, files, windows)
    children = worker.submit(lambda: [store.insert(part.table, part) for part in staged])
    for f in loaded:
        f.result()
    report.timings["samples_load"] = round(loads.seconds, 3)
    clock.lap("samples")
    prog("samples", 1, 1)
    _pause("measure")
    sample_stats = stats.result()
    again = loads.miscounted(by_run, sample_stats)
    if again:
        worker.submit(loads.recheck, again).result()
    loads.warn(by_run)
    measurements = _measure(datas, sample_stats)
    clock.lap("measure")
    now = utc(time.time())
    for d in datas:
        d.run["collected_at"] = now
        if (answer.index.get(d.run["run_id"]) or {}).get("fingerprint") is not None:
            report.updated += 1
        else:
            report.new += 1
    report.sample_rows = loads.rows
    _pause("write")
    children.result()
    store.replace_runs([d.run for d in datas])
    store.insert("measurements", measurements)
    if datas or answer.manifests_changed:
        refresh_checks(store, now)
    clock.lap("write")
    _pause("commit")


def _file_stats(store: Store, files: list[dict[str, Any]], windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    store.insert("sample_files", files)
    return store.sample_stats(windows)


def _measure(datas: list[RunData], stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's sample counts, its peak RSS when the scheduler gave none, and its measurements row."""
    stats_by_run: dict[str, list[dict[str, Any]]] = {}
    for s in stats:
        stats_by_run.setdefault(s["run_id"], []).append(s)
    measurements = []
    for d in datas:
        mine = stats_by_run.get(d.run["run_id"], [])
        d.run["sample_rows"] = sum(int(s["rows_all"]) for s in mine)
        if d.run["max_rss_mb"] is None:
            d.run["max_rss_mb"] = max((s["rss_mb_max"] for s in mine if s["rss_mb_max"] is not None), default=None)
        m = rows.measurement_row(d, mine)
        if m is not None:
            measurements.append(m)
    return measurements


__all__ = ["CollectReport", "analyze", "collect", "discover"]
