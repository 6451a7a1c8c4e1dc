"""Parsers for the job-directory files (docs/job-directory.md). Pure: they read files and return
values plus *problems* (precise, human-readable strings); they never raise on bad content."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.contract import safefile
from harness.contract.jsonfile import decode_json, decode_jsonl

STAGE_KEYS = ("event", "stage", "t_wall")


MAX_FILE_BYTES = safefile.RUNNER_MAX  # a runner's JSON or JSON-lines file larger than this is not read

Root = str | os.PathLike[str] | None


def _name(path: str | os.PathLike[str]) -> str:
    return os.path.basename(path)


def read_file(path: str | os.PathLike[str], root: Root = None, limit: int = MAX_FILE_BYTES,
              part: str = "all") -> tuple[bytes | None, str | None]:
    """(bytes, None); (None, problem) for a file that is not read (a FIFO, a device, a link leading out of
    *root*, larger than *limit*: see harness.contract.safefile) or unreadable; (None, None) when missing."""
    return safefile.read_or_problem(path, root, limit, part=part)


def read_json(path: str | os.PathLike[str], root: Root = None, limit: int = MAX_FILE_BYTES) -> tuple[Any, str | None]:
    """(document, None), (None, problem) for unreadable/corrupt content or a file not read (see
    :func:`read_file`), (None, None) when missing."""
    data, problem = read_file(path, root, limit)
    if data is None:
        return None, problem
    return decode_json(data, _name(path))


def read_jsonl(path: str | os.PathLike[str], required: Iterable[str] = (), root: Root = None,
               limit: int = MAX_FILE_BYTES) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """Objects of a JSON-lines file with their line numbers, and a problem per bad line.

    A last line without its newline that does not parse is "truncated JSON" (the writer died or is
    still writing); any other line that does not parse is "invalid JSON".
    """
    data, problem = read_file(path, root, limit)
    if data is None:
        return [], [problem] if problem else []
    return decode_jsonl(data, _name(path), required)


# -- stages -----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class StageRow:
    host: str
    rank: int | None
    stage: str
    trial: int | None
    restart: int
    pid: int | None
    start_wall: float | None
    end_wall: float | None
    duration_s: float | None
    status: str  # ok | error | killed | incomplete
    error: str | None
    info: Any = None

    def key(self) -> tuple[Any, ...]:
        return (self.host, self.rank, self.stage, self.trial)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


@dataclass
class StageLog:
    """One host's stages: paired rows, problems, and the restart they ended in."""

    host: str
    rows: list[StageRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    last_restart: int = 0


def parse_stages(path: str | os.PathLike[str], host: str, root: Root = None) -> StageLog:
    """Pair ``start``/``end`` events by (rank, stage, trial, restart, pid), in file order."""
    log = StageLog(host)
    events, problems = read_jsonl(path, STAGE_KEYS, root)
    log.problems.extend(problems)
    open_: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    rows = log.rows
    last_restart = 0
    for lineno, ev in events:
        # The runner writes ints (or null) here; anything else goes through _int. Inlined: this loop runs
        # for every event of every run a collect reads.
        get = ev.get
        restart, rank, trial, pid = get("restart"), get("rank"), get("trial"), get("pid")
        if restart.__class__ is not int:
            restart = _int(restart) or 0
        if rank is not None and rank.__class__ is not int:
            rank = _int(rank)
        if trial is not None and trial.__class__ is not int:
            trial = _int(trial)
        if pid is not None and pid.__class__ is not int:
            pid = _int(pid)
        if restart > last_restart:
            last_restart = restart
        stage = ev["stage"]
        key = (rank, stage if stage.__class__ is str else str(stage), trial, restart, pid)
        event = ev["event"]
        if event == "start":
            if key in open_:
                open_[key].append(ev)
            else:
                open_[key] = [ev]
        elif event == "end":
            starts = open_.get(key)
            start = starts.pop(0) if starts else None
            if start is None:
                log.problems.append(f"{_name(path)} line {lineno}: end of {key[1]} without a start")
            rows.append(_stage_row(host, key, start, ev))
        else:
            log.problems.append(f"{_name(path)} line {lineno}: unknown event {event!r}")
    log.last_restart = last_restart
    for key, starts in open_.items():
        for ev in starts:
            rows.append(_stage_row(host, key, ev, None))
    rows.sort(key=lambda r: (r.restart, r.start_wall if r.start_wall is not None else float("inf"),
                             r.rank if r.rank is not None else -1, r.stage, r.trial or 0))
    return log


def _stage_row(host: str, key: tuple[Any, ...], start: Mapping[str, Any] | None,
               end: Mapping[str, Any] | None) -> StageRow:
    rank, stage, trial, restart, pid = key
    sw = ew = sm = em = None
    if start is not None:
        sw, sm = start.get("t_wall"), start.get("t_mono")
        if sw.__class__ is not float:
            sw = _num(sw)
    if end is None:
        return StageRow(host, rank, stage, trial, restart, pid, sw, None, None, "incomplete", None, None)
    ew = end.get("t_wall")
    if ew.__class__ is not float:
        ew = _num(ew)
    dur = None
    if start is not None:
        em = end.get("t_mono")
        if sm.__class__ is not float:
            sm = _num(sm)
        if em.__class__ is not float:
            em = _num(em)
        dur = em - sm if sm is not None and em is not None else (ew - sw if sw is not None and ew is not None else None)
    status = end.get("status")
    err = end.get("error")
    return StageRow(host, rank, stage, trial, restart, pid, sw, ew, dur,
                    status if status.__class__ is str and status else str(status or "ok"),
                    None if err is None else str(err), end.get("info"))


# -- NCCL transport -----------------------------------------------------------------------------------------
_NCCL = re.compile(
    rb"NCCL INFO (?:(NET/IB) : (Using [^\n]*|No device found[^\n]*)|(NET/Socket) : Using[^\n]*|"
    rb"Using network (\w+)|Channel [^\n]* via (NET/\w+)[^\n]*)")


def nccl_transport(path: str | os.PathLike[str], root: Root = None,
                   problems: list[str] | None = None) -> tuple[str | None, str | None]:
    """The inter-node transport NCCL chose in a training log: ``'roce'``, ``'ib'``, ``'socket'`` or
    None (no NCCL network line: a single-node run, NCCL_DEBUG off, or no log), with the line that
    says so.

    ``Using network IB|Socket`` is NCCL's final word; ``NET/IB : Using [0]mlx5_0:1/RoCE`` tells RoCE
    from InfiniBand (``/IB``); ``NET/Socket : Using`` and channels ``via NET/Socket`` mean TCP.
    """
    data, problem = read_file(path, root, safefile.TRAIN_LOG_HEAD, part="head")  # NCCL says it at startup
    if problem and problems is not None:
        problems.append(problem)
    if data is None:
        return None, None
    ib_line = ib_kind = None
    socket_line = network = network_line = channel = channel_line = None
    for m in _NCCL.finditer(data):
        line = m.group(0).decode("utf-8", errors="replace")
        if m.group(1):
            what = m.group(2)
            if what.startswith(b"Using"):
                ib_line = line
                ib_kind = "roce" if b"/RoCE" in what else "ib"
        elif m.group(3):
            socket_line = line
        elif m.group(4):
            network, network_line = m.group(4).decode().lower(), line
        elif m.group(5):
            channel, channel_line = m.group(5).decode(), line
    if network == "ib":
        return ib_kind or "ib", ib_line or network_line
    if network == "socket":
        return "socket", network_line
    if channel == "NET/IB":
        return ib_kind or "ib", ib_line or channel_line
    if channel == "NET/Socket":
        return "socket", channel_line
    if ib_line:
        return ib_kind, ib_line
    if socket_line:
        return "socket", socket_line
    return None, None


def summarize_transports(by_host: Mapping[str, str | None]) -> tuple[str | None, str | None]:
    """(one value when every host that reported agrees, else 'mixed'; 'host=transport,...')."""
    seen = {t for t in by_host.values() if t}
    summary = None if not seen else (seen.pop() if len(seen) == 1 else "mixed")
    detail = ",".join(f"{h}={t or '-'}" for h, t in sorted(by_host.items())) or None
    return summary, detail


# -- CSV tails ----------------------------------------------------------------------------------------------
def csv_tail(path: str | os.PathLike[str], root: Root = None) -> tuple[int, int] | None:
    """None when the file ends with a newline (or is empty, or is not read: see harness.contract.safefile);
    else (bytes up to the last newline, 1-based number of the truncated last line)."""
    try:
        fd, size = safefile.open_regular(path, root, safefile.SAMPLES_MAX)
    except OSError:
        return None
    try:
        return csv_tail_fd(fd, size)
    finally:
        os.close(fd)


def csv_tail_fd(fd: int, size: int) -> tuple[int, int] | None:
    """:func:`csv_tail` of an open file of *size* bytes, read in pieces (never whole into memory)."""
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return None
    lines, cut, offset = 0, 0, 0
    while offset < size:
        chunk = os.pread(fd, min(1 << 22, size - offset), offset)
        if not chunk:
            break
        n = chunk.count(b"\n")
        if n:
            lines += n
            cut = offset + chunk.rfind(b"\n") + 1
        offset += len(chunk)
    return cut, lines + 1
