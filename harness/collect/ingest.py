"""One collect: discover job directories, ask the scheduler, parse what changed, write it all in one
transaction.

Incremental and idempotent: each run stores a fingerprint of its job directory's files (name, size,
mtime) and its scheduler state. A run whose fingerprint and state are unchanged is skipped, so a
second collect writes nothing; a run that was still going is re-read when either changes, and its
rows are replaced as a whole. Everything a collect writes is one DuckDB transaction: killed half-way,
the database stays as it was.

Runs come from ``<workdir>/*/manifest.jsonl`` (re-recorded only when the file changed) and from
``<workdir>/<campaign>/*/spec.json`` (job dirs rendered and submitted by hand; a dir that was only
rendered, with nothing submitted or run, is skipped). SLURM runs are looked up with one batched
``sacct`` call (``squeue`` when sacct cannot answer); local runs by their process id; the files decide
the rest. Samples are bulk-loaded by DuckDB's CSV reader in one scan over all new files, in a helper
thread that runs while the job dirs are parsed (same connection, same transaction; the parse does not
use the database).
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from ..errors import CollectError
from ..paths import JobPaths
from . import rows
from .discover import Attempt, Manifest, discover, rendered_names, sample_files_of, scan, spec_exec, spec_rows
from .jobdir import read_job
from .outcome import Sched, decide
from .parse import csv_tail
from ..references import refresh_checks
from .rows import RunData
from .sacct import FINAL_STATES, JobAccounting, Runner, query_sacct, query_squeue
from .store import open_store, stage, utc

Progress = Callable[[str, int, int], None]
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
    # Seconds per phase, in order (they add up to elapsed_s): discover, decide, delete, parse (the sample
    # load runs meanwhile), samples (what is left of the load after parsing), measure, write, commit;
    # plus samples_load, the load's own duration (it overlaps parse, so it is not part of the sum).
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



def _local_alive(job_id: str | None) -> bool | None:
    """Whether the local executor's job (submitit's local job id is its process id) still runs."""
    try:
        pid = int(str(job_id))
    except (TypeError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def analyze(att: Attempt, sched: Sched, cancel_requested: bool,
            known_point: Mapping[str, Any] | None = None) -> RunData:
    """Read one job directory, decide its outcome, build its rows; never raises on bad content."""
    files = read_job(att, known_point)
    return rows.build(files, decide(files, sched, cancel_requested))


def analyze_isolated(att: Attempt, sched: Sched, cancel_requested: bool,
                     known_point: Mapping[str, Any] | None = None) -> RunData:
    """:func:`analyze`, with any failure confined to this run: it is recorded as failed, with the reason,
    and every other run of the collect goes on."""
    try:
        return analyze(att, sched, cancel_requested, known_point)
    except Exception as exc:  # noqa: BLE001 - one unreadable job dir must not stop the others
        return rows.unreadable(att, sched, exc)


# -- scheduler --------------------------------------------------------------------------------------------
def scheduler_states(todo: list[tuple[Attempt, dict[str, Any]]], runner: Runner | None,
                     report: CollectReport) -> dict[str, Sched]:
    """One batched sacct call (squeue as a fallback) for the SLURM runs that may have changed."""
    out: dict[str, Sched] = {}
    slurm = {a.run_id: str(info["job_id"]) for a, info in todo
             if info.get("executor") == "slurm" and info.get("job_id")}
    acct: dict[str, JobAccounting] | None = None
    queue = None
    if slurm:
        acct, why = query_sacct(slurm.values(), **({"runner": runner} if runner else {}))
        report.sacct = why or "ok"
        missing = [j for j in slurm.values() if acct is None or j not in acct]
        if missing:
            queue = query_squeue(**({"runner": runner} if runner else {}))
    for a, info in todo:
        if a.run_id in slurm:
            jid = slurm[a.run_id]
            if acct is not None and jid in acct:
                out[a.run_id] = Sched("sacct", acct[jid].state, acct[jid])
            elif queue is not None and jid in queue:
                out[a.run_id] = Sched("executor", queue[jid][0])
            elif queue is not None:
                out[a.run_id] = Sched("files", None, gone=True)
            else:
                out[a.run_id] = Sched("files")
        elif info.get("executor") == "local":
            alive = _local_alive(info.get("job_id"))
            out[a.run_id] = Sched("executor", "RUNNING" if alive else None, gone=alive is False)
        else:
            out[a.run_id] = Sched("files")
    return out


# -- the collect -------------------------------------------------------------------------------------------
def collect(db: str | Path, workdir: str | Path, campaign: str | None = None, *, progress: Progress | None = None,
            sacct_runner: Runner | None = None, wait_s: float | None = None,
            run_ids: Collection[str] | None = None) -> CollectReport:
    """Collect every run under *workdir* into *db*; see the module docstring. With *run_ids*, only those
    runs are looked at (manifests are still recorded): submit's refresh of what changed."""
    t0 = time.monotonic()
    wd = Path(workdir)
    report = CollectReport(db=str(db), workdir=str(wd))
    prog = progress or (lambda phase, done, total: None)
    clock = _Clock(report)
    prog("discover", 0, 1)
    manifests, attempts, warns = discover(wd, campaign)
    if run_ids is not None:
        keep = set(run_ids)
        attempts = {rid: a for rid, a in attempts.items() if rid in keep}
    report.warnings += warns
    if not wd.is_dir():
        report.warnings.append(f"{wd}: no such directory; nothing to collect (pass --workdir)")
    for a in attempts.values():
        a.fingerprint, a.files = scan(a.job_dir)
    # A job dir that was only rendered (a preview: no manifest line, never submitted, nothing ran) is no run.
    previews = [rid for rid, a in attempts.items() if a.manifest is None and a.job_dir is not None
                and set(a.files or ()) <= rendered_names(JobPaths(a.job_dir))]
    for rid in previews:
        del attempts[rid]
    prog("discover", 1, 1)
    clock.lap("discover")
    tmpdir = Path(tempfile.mkdtemp(prefix="sbench-collect-"))
    # The parse makes ~100 small objects per job dir and frees none of them until the end: the cyclic
    # collector would rescan them all again and again (a quarter of the parse's time) and find nothing.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        _collect(db, wait_s, report, manifests, attempts, sacct_runner, prog, clock, tmpdir)
    except duckdb.Error as exc:
        raise CollectError(f"{db}: collect failed and changed nothing (rolled back): {exc}") from None
    finally:
        if gc_was_on:
            gc.enable()
        shutil.rmtree(tmpdir, ignore_errors=True)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


@dataclass
class SampleFile:
    """One samples CSV to load: where the reader reads it (``use``: the file, or a link/trimmed copy in
    the temp dir) and what it belongs to."""

    file_id: int
    run_id: str
    host: str
    path: Path
    use: str
    truncated_line: int | None = None  # 1-based number of a last line cut mid-write (not loaded)


def _sample_inputs(changed: list[tuple[Attempt, Sched, dict[str, Any]]], first_id: int,
                   tmpdir: Path) -> list[SampleFile]:
    """The sample CSVs of the changed runs, numbered from *first_id*. A file whose last line was cut
    mid-write (no final newline) is loaded from a copy without that line, so a half-written number
    never gets in. Needs only the directory listings, so the load can start before the runs are parsed."""
    files: list[SampleFile] = []
    for a, _s, _info in changed:
        for host, path in sample_files_of(a):
            i = len(files)
            use = str(path)
            if any(c in use for c in "*?[{"):
                # DuckDB's reader expands glob characters in file names: read such a file via a plain link.
                link = tmpdir / f"{i}.link.csv"
                link.symlink_to(path)
                use = str(link)
            sf = SampleFile(first_id + i, a.run_id, host, path, use)
            tail = csv_tail(path)
            if tail is not None:
                cut, sf.truncated_line = tail
                copy = tmpdir / f"{i}.csv"
                with path.open("rb") as src, copy.open("wb") as dst:
                    dst.write(src.read(cut))
                sf.use = str(copy)
            files.append(sf)
    return files


class _Background(threading.Thread):
    """Runs one call in a helper thread; :meth:`result` joins it and returns (or raises) its outcome."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__(name="sbench-collect-samples", daemon=True)
        self.fn, self.args = fn, args
        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        t = time.perf_counter()
        try:
            self.value = self.fn(*self.args)
        except BaseException as exc:  # handed to the caller by result()
            self.error = exc
        self.seconds = time.perf_counter() - t

    def result(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


def _collect(db: str | Path, wait_s: float | None, report: CollectReport, manifests: list[Manifest],
             attempts: dict[str, Attempt], sacct_runner: Runner | None, prog: Progress, clock: _Clock,
             tmpdir: Path) -> None:
    with open_store(db, wait_s=wait_s) as store:
        with store.transaction():
            manifests_changed = False
            for man in manifests:
                # The manifest is append-only: one unchanged since the last collect is recorded already.
                key = f"manifest:{os.path.abspath(man.path)}"
                if store.get_metadata(key) != man.fingerprint:
                    manifests_changed = True
                    report.warnings += store.record_manifest(man.events, strict=False, source=str(man.path))
                    store.set_metadata(key, man.fingerprint)
            known_points = {str(ev.get("point_id")): ev for man in manifests for ev in man.events
                            if ev.get("type") == "point"}
            index = store.run_index()
            for a in attempts.values():
                if a.manifest is None and a.run_id not in index:
                    camp, prow, link, run = spec_rows(a)
                    store.ensure_spec_rows(camp, prow, link, run)
            index = store.run_index()
            # Which runs may have changed: new, files changed, or a state that can still change.
            todo: list[tuple[Attempt, dict[str, Any]]] = []
            for a in attempts.values():
                info = dict(index.get(a.run_id) or {})
                if not info.get("executor") or not info.get("job_id"):
                    sub = spec_exec(a)
                    info.setdefault("executor", None)
                    info["executor"] = info.get("executor") or sub.get("executor")
                    info["job_id"] = info.get("job_id") or sub.get("job_id")
                if info.get("fingerprint") != a.fingerprint or info.get("state") not in FINAL_STATES:
                    todo.append((a, info))
            report.runs = len(attempts)
            scheds = scheduler_states(todo, sacct_runner, report)
            changed: list[tuple[Attempt, Sched, dict[str, Any]]] = []
            for a, info in todo:
                s = scheds[a.run_id]
                new_state = s.state if s.state is not None else ("GONE" if s.gone else None)
                state_moved = new_state is not None and new_state != info.get("state")
                if info.get("fingerprint") != a.fingerprint or state_moved:
                    changed.append((a, s, info))
            report.unchanged = len(attempts) - len(changed)
            clock.lap("decide")
            _pause("parse")
            ids = [a.run_id for a, _s, _info in changed]
            store.delete_runs(ids)
            files = _sample_inputs(changed, store.next_sample_file_id(), tmpdir)
            clock.lap("delete")
            _pause("samples")
            # The sample load (DuckDB, both cores, GIL released) runs in a helper thread while this one
            # parses the job dirs (Python); nothing else touches the connection until it is joined.
            loader = _Background(store.load_samples, [f.use for f in files], files[0].file_id) if files else None
            if loader is not None:
                loader.start()
            try:
                datas: list[RunData] = []
                for i, (a, s, info) in enumerate(changed):
                    d = analyze_isolated(a, s, info.get("cancel_requested_at") is not None,
                                         known_points.get(a.point_id))
                    # The cancel request comes from the manifest, not from the files: keep it.
                    if d.run.get("cancel_requested_at") is None:
                        d.run["cancel_requested_at"] = info.get("cancel_requested_at")
                    datas.append(d)
                    if i % 25 == 0:
                        prog("parse", i, len(changed))
                prog("parse", len(changed), len(changed))
                # Typed columns of the run's child rows, while the load still has the connection.
                staged = [stage(table, [r for d in datas for r in getattr(d, attr)])
                          for table, attr in (("run_hosts", "hosts"), ("stages", "stages"), ("ranks", "ranks"),
                                              ("errors", "errors"), ("trials", "trials"),
                                              ("environment", "environment"), ("memory", "memory"))]
                clock.lap("parse")
                prog("samples", 0, 1)
                n, rejects = loader.result() if loader is not None else (0, [])
            except BaseException:
                if loader is not None and loader.is_alive():
                    store.con.interrupt()
                    loader.join()
                raise
            if loader is not None:
                report.timings["samples_load"] = round(loader.seconds, 3)
            clock.lap("samples")
            prog("samples", 1, 1)
            for d in datas:
                if d.run["run_id"] in index and index[d.run["run_id"]].get("fingerprint") is not None:
                    report.updated += 1
                else:
                    report.new += 1
            by_run = {d.run["run_id"]: d for d in datas}
            report.sample_rows = n
            for f in files:
                d = by_run[f.run_id]
                if f.truncated_line is not None and d.over:
                    d.warn(f"{f.path.name} line {f.truncated_line}: truncated last line (ignored)")
            by_use = {f.use: f for f in files}
            for fpath, line, msg in rejects:
                hit = by_use.get(fpath)
                if hit:
                    by_run[hit.run_id].warn(f"{hit.path.name} line {line}: {msg} (row skipped)")
            store.insert("sample_files", [{"file_id": f.file_id, "run_id": f.run_id, "host": f.host,
                                           "path": str(f.path), "t0": by_run[f.run_id].run["train_start_wall"]}
                                          for f in files])
            _pause("measure")
            stats = store.sample_stats([{"run_id": d.run["run_id"], "start": d.window[0], "end": d.window[1]}
                                        for d in datas if d.sample_files])
            per_run_rows: Counter[str] = Counter()
            per_run_rss: dict[str, float] = {}
            for s in stats:
                per_run_rows[s["run_id"]] += int(s["rows_all"])
                if s["rss_mb_max"] is not None:
                    per_run_rss[s["run_id"]] = max(per_run_rss.get(s["run_id"], 0.0), s["rss_mb_max"])
            stats_by_run: dict[str, list[dict[str, Any]]] = {}
            for s in stats:
                stats_by_run.setdefault(s["run_id"], []).append(s)
            measurements = []
            for d in datas:
                rid = d.run["run_id"]
                d.run["sample_rows"] = per_run_rows.get(rid, 0)
                if d.run["max_rss_mb"] is None:
                    d.run["max_rss_mb"] = per_run_rss.get(rid)
                m = rows.measurement_row(d, stats_by_run.get(rid, []))
                if m is not None:
                    measurements.append(m)
            clock.lap("measure")
            now = utc(time.time())
            for d in datas:
                d.run["collected_at"] = now
            _pause("write")
            store.replace_runs([d.run for d in datas])
            for part in staged:
                store.insert(part.table, part)
            store.insert("measurements", measurements)
            if datas or manifests_changed:
                refresh_checks(store, now)
            clock.lap("write")
            _pause("commit")
        clock.lap("commit")
        report.outcomes, report.accounting = store.run_counts()


__all__ = ["CollectReport", "analyze", "collect", "discover"]
