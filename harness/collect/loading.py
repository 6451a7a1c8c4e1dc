"""The database side of a collect, run on one worker thread while the main thread reads job dirs.

A collect is CPU-bound on both sides: DuckDB's CSV reader loads the samples on every core, Python
parses the job directories. So the connection gets a worker thread of its own, and every database
step is queued on it in order (record the manifests, delete what is re-read, load samples); the main
thread scans, asks the scheduler and parses meanwhile, and waits only where it needs an answer. One
connection, one transaction: the worker only ever runs one statement at a time, in queue order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract.paths import JobPaths
from harness.db.store import Store

from .discover import Attempt, sample_files_of
from .parse import csv_tail
from .rows import RunData


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
    # Its host's runner left a result file, which records the rows the sampler wrote: the rows loaded are
    # checked against that count (see :meth:`SampleLoads.load`).
    counted: bool = False


class Worker:
    """The store's connection, driven by one thread: :meth:`submit` queues a call and returns its future.
    :meth:`abort` stops it (the running statement interrupted, queued calls dropped) so the caller can
    roll back."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sbench-collect-db")
        self._aborted = threading.Event()
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        def call() -> Any:
            if self._aborted.is_set():
                raise RuntimeError("collect aborted")
            self._idle.clear()
            try:
                return fn(*args)
            finally:
                self._idle.set()
        return self._pool.submit(call)

    def abort(self) -> None:
        self._aborted.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        while not self._idle.wait(0.01):  # a call between two statements starts the next: interrupt again
            self.store.con.interrupt()
        self._pool.shutdown(wait=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def in_thread(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """*fn(*args)* on a daemon thread of its own (an interrupted collect does not wait for it to end)."""
    fut: Future[Any] = Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the result
            fut.set_exception(exc)
    threading.Thread(target=run, name="sbench-collect-helper", daemon=True).start()
    return fut


class SampleLoads:
    """The sample CSVs of the runs being re-read, numbered from the first unused file id in the order
    they are loaded. Its :meth:`load` runs on the worker thread."""

    def __init__(self, store: Store, first_id: int, tmpdir: Path) -> None:
        self.store, self.next_id, self.tmpdir = store, first_id, tmpdir
        self.files: list[SampleFile] = []
        self.rows = 0
        self.rejects: list[tuple[str, int, str]] = []
        self.seconds = 0.0

    def load(self, files: list[SampleFile]) -> None:
        """Load *files* (from :meth:`prepare`) with DuckDB's CSV reader; on the worker thread. The files of
        hosts that finished are read without recording rejected lines (a bad line is skipped all the
        same): :meth:`recheck` later asks why for those whose rows differ from the count their runner
        recorded. The others are read in a second scan that records them at once."""
        t = time.perf_counter()
        for part in ([f for f in files if f.counted], [f for f in files if not f.counted]):
            if part:
                n, rejects = self.store.load_samples([f.use for f in part], part[0].file_id,
                                                     rejects=not part[0].counted)
                self.rows += n
                self.rejects += rejects
        self.seconds += time.perf_counter() - t

    def miscounted(self, by_run: Mapping[str, RunData], stats: Iterable[Mapping[str, Any]]) -> list[SampleFile]:
        """The files loaded without recording rejected lines whose rows (``rows_all`` of the sample
        statistics) differ from what their sampler recorded writing, or whose count is unknown."""
        loaded: dict[tuple[str, str], int] = {}
        for s in stats:
            key = (s["run_id"], s["host"])
            loaded[key] = loaded.get(key, 0) + int(s["rows_all"])
        return [f for f in self.files if f.counted and
                by_run[f.run_id].samples_written.get(f.host) != loaded.get((f.run_id, f.host), 0)]

    def recheck(self, files: list[SampleFile]) -> None:
        """Why lines of *files* (loaded without recording rejects) were skipped; on the worker thread."""
        self.rejects += self.store.sample_rejects([f.use for f in files])

    def warn(self, by_run: Mapping[str, RunData]) -> None:
        """A cut last line or a rejected line of a samples file is a warning of its run."""
        for f in self.files:
            d = by_run[f.run_id]
            if f.truncated_line is not None and d.over:
                d.warn(f"{f.path.name} line {f.truncated_line}: truncated last line (ignored)")
        by_use = {f.use: f for f in self.files}
        for fpath, line, msg in self.rejects:
            hit = by_use.get(fpath)
            if hit:
                by_run[hit.run_id].warn(f"{hit.path.name} line {line}: {msg} (row skipped)")

    def prepare(self, attempts: Iterable[Attempt]) -> list[SampleFile]:
        """The sample files of *attempts*, numbered next. Needs no database. A file whose last line was cut
        mid-write (no final newline) is loaded from a copy without that line, so a half-written number
        never gets in."""
        files: list[SampleFile] = []
        todo: list[tuple[Attempt, str, Path, bool]] = []
        for a in attempts:
            names = set(a.files or ())
            todo += [(a, host, path, JobPaths(path.parent).result(host).name in names)
                     for host, path in sample_files_of(a)]
        todo.sort(key=lambda x: not x[3])  # counted files first: each of load's two scans gets one run of ids
        for a, host, path, counted in todo:
            fid = self.next_id
            self.next_id += 1
            use = str(path)
            if any(c in use for c in "*?[{"):
                # DuckDB's reader expands glob characters in file names: read such a file via a link.
                link = self.tmpdir / f"{fid}.link.csv"
                link.symlink_to(path)
                use = str(link)
            sf = SampleFile(fid, a.run_id, host, path, use, counted=counted)
            tail = csv_tail(path)
            if tail is not None:
                cut, sf.truncated_line = tail
                copy = self.tmpdir / f"{fid}.csv"
                with path.open("rb") as src, copy.open("wb") as dst:
                    dst.write(src.read(cut))
                sf.use = str(copy)
            files.append(sf)
        self.files += files
        return files


__all__ = ["SampleFile", "SampleLoads", "Worker", "in_thread"]
