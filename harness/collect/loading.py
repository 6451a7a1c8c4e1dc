"""The samples of a collect: the sampler's CSVs of the runs being re-read, loaded by DuckDB's CSV reader on
one worker thread while the collect's own thread asks the scheduler and reads job directories.

The threading rule, the only one of a collect: the store's connection belongs to the collect's thread,
except between :meth:`SampleLoader.start` and :meth:`SampleLoader.join`, when it belongs to the loader's
worker. In between, the collect's thread makes no database call (it asks the scheduler, reads files and
stages rows in memory). The worker does one kind of job, batch after batch in the order given: replace the
samples of some runs (their old sample rows deleted, their CSV files loaded). :meth:`SampleLoader.abort`
interrupts the statement that runs and waits for the worker, so that the caller can roll back.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract import safefile
from harness.contract.formats import SAMPLE_CSV_NAMES, sample_csv_names_of
from harness.contract.paths import JobPaths
from harness.db.samples import load_samples, sample_rejects
from harness.db.store import Store

from .discover import Attempt, sample_files_of
from .parse import csv_tail_fd
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
    names: tuple[str, ...] = SAMPLE_CSV_NAMES  # the columns its header names (an older file: fewer)
    # Its host's runner left a result file, which records the rows the sampler wrote: the rows loaded are
    # checked against that count (see :meth:`SampleLoader.miscounted`).
    counted: bool = False


@dataclass
class _Batch:
    runs: list[str]  # whose old sample rows go first
    files: list[SampleFile]


class SampleLoader:
    """The sample CSVs of the runs being re-read, numbered from the first unused file id in the order they
    are queued, and the one worker thread that loads them (see the module's threading rule)."""

    def __init__(self, store: Store, first_id: int, tmpdir: Path, recorded: Iterable[str]) -> None:
        self.store, self.next_id, self.tmpdir = store, first_id, tmpdir
        self.recorded = set(recorded)  # runs that have rows already: their old samples are deleted first
        self.files: list[SampleFile] = []
        self.rows = 0
        self.rejects: list[tuple[str, int, str]] = []
        self.refused: list[tuple[str, str]] = []  # (run id, why) of sample files not handed to the reader
        self.seconds = 0.0
        self._jobs: queue.Queue[_Batch | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()

    # -- the collect's thread --------------------------------------------------------------------------------
    def start(self, attempts: Iterable[Attempt]) -> None:
        """Hand the connection to the worker and queue the samples of *attempts*."""
        self._thread = threading.Thread(target=self._work, name="sbench-collect-db", daemon=True)
        self._thread.start()
        self.add(attempts)

    def add(self, attempts: Iterable[Attempt]) -> None:
        """Queue the samples of more runs, loaded after those queued before."""
        batch = list(attempts)
        if batch:
            self._jobs.put(_Batch([a.run_id for a in batch if a.run_id in self.recorded], self._prepare(batch)))

    def join(self) -> None:
        """Wait until every queued batch is loaded; the connection is this thread's again. A failure of the
        worker is raised here."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Stop the worker: the running statement interrupted, the queued batches dropped."""
        self._stop.set()
        self._jobs.put(None)
        while self._thread is not None and self._thread.is_alive():
            self.store.con.interrupt()  # DuckDB's one call that may come from another thread
            self._thread.join(0.01)
        self._thread = None

    # -- the worker ------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while (batch := self._jobs.get()) is not None:
            if self._stop.is_set() or self._error is not None:
                continue
            t = time.perf_counter()
            try:
                self._load(batch)
            except BaseException as exc:  # noqa: BLE001 - raised on the collect's thread by join()
                self._error = exc
            self.seconds += time.perf_counter() - t

    def _load(self, batch: _Batch) -> None:
        """Replace the samples of *batch*'s runs. The files of hosts that finished are read without recording
        rejected lines (a bad line is skipped all the same): :meth:`recheck` later asks why for those whose
        rows differ from the count their runner recorded. The others are read in a second scan that records
        them at once."""
        if batch.runs:
            self.store.delete_runs(batch.runs, ("sample_files",))
        for part in _scans(batch.files):
            n, rejects = load_samples(self.store, [f.use for f in part], part[0].file_id,
                                      rejects=not part[0].counted, names=part[0].names)
            self.rows += n
            self.rejects += rejects

    # -- after join(), on the collect's thread -----------------------------------------------------------------
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
        """Why lines of *files* (loaded without recording rejects) were skipped."""
        for part in _scans(files):
            self.rejects += sample_rejects(self.store, [f.use for f in part], part[0].names)

    def warn(self, by_run: Mapping[str, RunData]) -> None:
        """A cut last line or a rejected line of a samples file is a warning of its run; so is a file that was
        not read (a FIFO, a link out of the campaign directory, too large: harness.contract.safefile)."""
        for rid, why in self.refused:
            if rid in by_run:
                by_run[rid].warn(why)
        for f in self.files:
            d = by_run[f.run_id]
            if f.truncated_line is not None and d.over:
                d.warn(f"{f.path.name} line {f.truncated_line}: truncated last line (ignored)")
        by_use = {f.use: f for f in self.files}
        for fpath, line, msg in self.rejects:
            hit = by_use.get(fpath)
            if hit:
                by_run[hit.run_id].warn(f"{hit.path.name} line {line}: {msg} (row skipped)")

    def file_rows(self, train_start: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The ``sample_files`` rows of every loaded file (``t0``: its run's training start)."""
        return [{"file_id": f.file_id, "run_id": f.run_id, "host": f.host, "path": str(f.path),
                 "t0": train_start.get(f.run_id)} for f in self.files]

    def _prepare(self, attempts: list[Attempt]) -> list[SampleFile]:
        """The sample files of *attempts*, numbered next. A file whose last line was cut mid-write (no final
        newline) is loaded from a copy without that line, so a half-written number never gets in."""
        files: list[SampleFile] = []
        todo: list[tuple[Attempt, str, Path, bool]] = []
        for a in attempts:
            names = set(a.files or ())
            todo += [(a, host, path, JobPaths(path.parent).result(host).name in names)
                     for host, path in sample_files_of(a)]
        todo.sort(key=lambda x: not x[3])  # counted files first: each of _load's two scans gets one run of ids
        for a, host, path, counted in todo:
            # Checked before the reader opens it: a regular file, inside the campaign directory, within its bound.
            try:
                fd, size = safefile.open_regular(path, a.top, safefile.SAMPLES_MAX)
            except OSError as exc:
                self.refused.append((a.run_id, str(exc) if isinstance(exc, safefile.Refused) else
                                     f"{path.name}: unreadable ({exc.strerror})"))
                continue
            try:
                fid = self.next_id
                self.next_id += 1
                use = str(path) if not os.path.islink(path) else os.path.realpath(path)
                if any(c in use for c in "*?[{"):
                    # DuckDB's reader expands glob characters in file names: read such a file via a link.
                    link = self.tmpdir / f"{fid}.link.csv"
                    link.symlink_to(use)
                    use = str(link)
                head = os.pread(fd, 4096, 0).split(b"\n", 1)[0].decode("utf-8", "replace")
                sf = SampleFile(fid, a.run_id, host, path, use, counted=counted, names=sample_csv_names_of(head))
                tail = csv_tail_fd(fd, size)
                if tail is not None:
                    cut, sf.truncated_line = tail
                    sf.use = str(self.tmpdir / f"{fid}.csv")
                    _copy_head(fd, cut, sf.use)
            finally:
                os.close(fd)
            files.append(sf)
        self.files += files
        return files


def _scans(files: list[SampleFile]) -> list[list[SampleFile]]:
    """*files* (numbered in order, the counted ones first) as the reader's scans: each a run of consecutive
    file ids with one columns list and one way of reading (counted or not)."""
    out: list[list[SampleFile]] = []
    for f in files:
        last = out[-1][-1] if out else None
        if last is not None and (last.counted, last.names) == (f.counted, f.names) and f.file_id == last.file_id + 1:
            out[-1].append(f)
        else:
            out.append([f])
    return out


def _copy_head(fd: int, n: int, dest: str) -> None:
    """The first *n* bytes of the open file *fd* into a new file *dest*, in pieces."""
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        offset = 0
        while offset < n and (chunk := os.pread(fd, min(1 << 22, n - offset), offset)):
            os.write(out, chunk)
            offset += len(chunk)
    finally:
        os.close(out)


__all__ = ["SampleFile", "SampleLoader"]
