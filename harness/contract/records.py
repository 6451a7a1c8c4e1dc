"""The records of a campaign directory, each a type with one writer and one reader: a line of the campaign's
manifest (``CampaignPaths.manifest``) and a job dir's ``submitted.json`` (``JobPaths.submitted``).

**Manifest lines.** The manifest is JSON lines, appended and never rewritten, so that nothing is known only to
the database. A line's ``type`` says which record it is:

- :class:`CampaignLine` (``campaign``): the campaign's first line: its sweep, inventory, executor, references;
- :class:`ReferencesLine`, :class:`RepeatsLine`, :class:`BudgetLine`: the sweep's ``references:``, ``repeats:``
  or ``budget:`` changed since;
- :class:`PointLine` (``point``): a planned point, valid or not, with its entity;
- :class:`AttemptLine` (``attempt``): an attempt handed to an executor: its job dir and the scheduler's ids, and
  what submit predicted of it;
- :class:`CancelLine` (``cancel``): what ``sbench cancel`` cancelled;
- :class:`SearchLine` (``search``): a search's decision about one point (``search:``), when it changes.

Each type lists its keys: those of its ``_...Keys`` base are required, the others optional. :func:`check_line`
refuses a line of another type, one without a required key, and one with a key its type does not list, naming
the key. :func:`append_manifest`, the one writer, writes only lines it accepts (``type`` first);
:func:`read_manifest`, the one reader, returns only those, each line it refuses a problem that names the file,
the line and the key. A line an older release wrote still reads: the keys it lacks are optional (an attempt
line without ``repeat`` is repeat 0).

**submitted.json** (:class:`SubmittedInfo`): the scheduler's word on one attempt, written whole (to a temporary
name, then renamed) by :func:`write_submitted` and read by :func:`read_submitted`. Submit writes it first (no
job id yet); the executor replaces it (the job id, or the queue that holds it, or that sbench holds it back);
the local queue, the launch and cancel update it under the job dir's lock (``harness.slurm.localjob``).

Both readers are fast on large campaigns: a manifest is decoded in one call of orjson
(``harness.contract.jsonfile``) and each line's keys are checked against two sets.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, Union, cast

from . import safefile
from .atomic import write_json
from .errors import RecordError, SubmitError
from .jsonfile import decode_json, decode_jsonl
from .paths import CampaignPaths, JobPaths


def now_iso() -> str:
    """The time of a record (local time with its UTC offset), as every record of the work dir writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# -- manifest lines ---------------------------------------------------------------------------------------------
class _CampaignKeys(TypedDict):
    type: Literal["campaign"]
    campaign: str


class CampaignLine(_CampaignKeys, total=False):
    experiment: str
    sweep: str  # the sweep file, absolute
    sweep_campaign: str  # what the sweep's campaign: said at submission (submit --campaign may name another)
    inventory: str  # the inventory file, absolute ("<built-in ...>" for the built-in one)
    cluster: str | None
    partition: str | None
    partitions: dict[str, Any]  # each partition's public description (Partition.public: never a secret)
    executor: str
    description: str | None
    created_at: str
    sbench_version: str
    references: list[dict[str, Any]]
    repeats: dict[str, Any] | None  # repeats: {min, max, cv}; None for a plain repeats: N
    search: dict[str, Any] | None  # the sweep's search: (harness.spec.search); absent or None: a plain campaign
    budget: dict[str, Any] | None  # the sweep's budget: {gpu_hours, allocation_hours}; absent or None: none


class _ReferencesKeys(TypedDict):
    type: Literal["references"]
    campaign: str
    references: list[dict[str, Any]]


class ReferencesLine(_ReferencesKeys, total=False):
    at: str


class _RepeatsKeys(TypedDict):
    type: Literal["repeats"]
    campaign: str


class RepeatsLine(_RepeatsKeys, total=False):
    at: str
    repeats: dict[str, Any] | None


class _BudgetKeys(TypedDict):
    type: Literal["budget"]
    campaign: str


class BudgetLine(_BudgetKeys, total=False):
    """The sweep's ``budget:`` changed since the campaign line (or the last budget line): the newest word."""

    at: str
    budget: dict[str, Any] | None


class _PointId(TypedDict):
    point_id: str


class PointFields(_PointId, total=False):
    """A planned point as the manifest keeps it: ``harness.spec.plan.PlannedPoint.to_dict()``, its one writer
    (tests/test_manifest_lines.py holds the two to the same fields)."""

    repeat: int
    experiment: str
    entity: dict[str, Any]
    valid: bool
    reasons: list[str]
    notes: list[str]
    partition: str
    model_source: str | None
    warnings: list[str]
    memory: dict[str, Any] | None  # plan --memory's prediction
    predicted_oom: bool | None


class _PointKeys(TypedDict):
    type: Literal["point"]
    campaign: str


class PointLine(PointFields, _PointKeys):
    """The manifest's ``point`` line: the campaign's name and the planned point."""


class AttemptExtra(TypedDict, total=False):
    """What an executor adds to an attempt's line (``harness.campaign.executors.base.Submitted.extra``)."""

    submitted_at: str  # when the scheduler took it, when the executor knows it better than submit does
    job_name: str | None  # its SLURM job's name: tells its accounting from another job's that had its id
    queue: str  # the local queue file that holds it
    held_back: bool  # sbench holds it back for the campaign's feeder job (harness.slurm.held)
    fed: bool  # the feeder job submitted it
    requeued_from: str | None  # the job of the pack that put it back in the queue as its own job
    requeued_at: str  # when its local pack put it back in its queue (no job id until the queue starts it)
    pack_index: int  # slurm.pack: its place in its pack, the pack's size and first job dir
    pack_size: int
    pack_lead: str


class _AttemptKeys(TypedDict):
    type: Literal["attempt"]
    campaign: str
    point_id: str
    attempt: int


class Predicted(TypedDict, total=False):
    """What submit predicted of an attempt before sending it (``harness.spec.predict``): the ``runs`` columns of
    the same names (:func:`prediction_columns`)."""

    predicted_seconds: float | None
    predicted_low_s: float | None
    predicted_high_s: float | None
    prediction_source: str | None  # history, model; None: not predicted
    prediction_basis: str


PREDICTION_COLUMNS = ("predicted_seconds", "predicted_low_s", "predicted_high_s", "prediction_source",
                      "prediction_basis")


class AttemptLine(_AttemptKeys, AttemptExtra, total=False):
    repeat: int  # 0 when an older line lacks it
    prediction: Predicted  # submit's prediction of its allocation seconds (absent: sent without one)
    job_dir: str
    executor: str
    job_id: str | None  # None while it waits in a local queue or sbench holds it back
    array_job_id: str | None
    array_task_id: int | None
    reason: str | None  # why it was submitted: new, retry, force, more repeats, ...


class _CancelKeys(TypedDict):
    type: Literal["cancel"]
    campaign: str


class CancelLine(_CancelKeys, total=False):
    job_ids: list[str]  # SLURM attempts, by job id
    job_dirs: list[str]  # every attempt cancelled, by job dir (a local one has no job id while queued)
    at: str


class _SearchKeys(TypedDict):
    type: Literal["search"]
    campaign: str
    point_id: str


class SearchLine(_SearchKeys, total=False):
    """A search's decision about one point (harness.spec.search): written when it changes, newest last."""

    at: str
    phase: str  # fit | halving | final
    action: str  # run | skipped | stopped | waiting | kept
    reason: str
    repeat: int | None


ManifestLine = Union[CampaignLine, ReferencesLine, RepeatsLine, BudgetLine, PointLine, AttemptLine,  # noqa: UP007
                     CancelLine, SearchLine]

LINE_TYPES: dict[str, Any] = {"campaign": CampaignLine, "point": PointLine, "attempt": AttemptLine,
                              "cancel": CancelLine, "references": ReferencesLine, "repeats": RepeatsLine,
                              "budget": BudgetLine, "search": SearchLine}
# type -> (its required keys, every key it may have)
_KEYS = {kind: (frozenset(t.__required_keys__), frozenset(t.__required_keys__ | t.__optional_keys__))
         for kind, t in LINE_TYPES.items()}
_KINDS_TEXT = ", ".join(list(LINE_TYPES)[:-1]) + " or " + list(LINE_TYPES)[-1]
# How each line begins as append_manifest writes it ("type" first): a reader of a few kinds decodes only those.
_PREFIX = {kind: f'{{"type": "{kind}"'.encode() for kind in LINE_TYPES}


def check_line(obj: Any) -> ManifestLine:
    """*obj* as the manifest line it is; :class:`RecordError` naming what is wrong when it is none: not an
    object, of no known type, without a key its type requires, or with a key its type does not list."""
    if not isinstance(obj, Mapping):
        raise RecordError("not a JSON object")
    kind = obj.get("type")
    keys = _KEYS.get(kind) if isinstance(kind, str) else None
    if keys is None:
        raise RecordError(f"unknown type {kind!r} (expected {_KINDS_TEXT})")
    required, known = keys
    have = obj.keys()
    if have >= required and have <= known:
        return cast(ManifestLine, obj)
    missing = sorted(required - have)
    if missing:
        raise RecordError(f"{kind} line is malformed: it lacks the key {missing[0]!r}")
    unknown = sorted(str(k) for k in have - known)
    raise RecordError(f"{kind} line is malformed: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def attempt_line(campaign: str, point_id: str, repeat: int, attempt: int, job_dir: str, executor: str,
                 job_id: str | None, submitted_at: str, reason: str | None, *, array_job_id: str | None = None,
                 array_task_id: int | None = None, extra: AttemptExtra | None = None,
                 prediction: Predicted | None = None) -> AttemptLine:
    """The line of one attempt handed to an executor (submit, the feeder job, a pack's requeue make it here);
    *extra* is what the executor adds, and wins; *prediction*, what submit predicted of it."""
    line = AttemptLine(type="attempt", campaign=campaign, point_id=point_id, repeat=repeat, attempt=attempt,
                       job_dir=job_dir, executor=executor, job_id=job_id, array_job_id=array_job_id,
                       array_task_id=array_task_id, submitted_at=submitted_at, reason=reason)
    if prediction is not None:
        line["prediction"] = prediction
    line.update(extra or {})
    return line


def prediction_columns(line: Mapping[str, Any]) -> dict[str, Any]:
    """The ``runs`` columns of an attempt line's prediction (each None where the line has none, or a value of
    another type: a line edited by hand)."""
    doc = line.get("prediction")
    doc = doc if isinstance(doc, Mapping) else {}
    out: dict[str, Any] = {}
    for key in PREDICTION_COLUMNS:
        v = doc.get(key)
        if key in ("prediction_source", "prediction_basis"):
            out[key] = v if isinstance(v, str) else None
        else:
            out[key] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return out


def point_line(campaign: str, point: PointFields) -> PointLine:
    """The line of a planned point (*point*: ``PlannedPoint.to_dict()``, valid or not)."""
    return {"type": "point", "campaign": campaign, **point}


def pack_extra(job_dirs: Sequence[str], index: int) -> AttemptExtra:
    """What an attempt line says of its point's pack (``slurm.pack``): its place, the pack's size and lead."""
    return AttemptExtra(pack_index=index, pack_size=len(job_dirs), pack_lead=job_dirs[0])


def _encode(line: ManifestLine) -> str:
    check_line(line)
    return json.dumps({"type": line["type"], **line}, default=str) + "\n"


def _why(exc: OSError) -> str:
    if isinstance(exc, safefile.Refused):
        return exc.why
    return {errno.ELOOP: "a symbolic link", errno.ENXIO: "a FIFO"}.get(exc.errno or 0, exc.strerror or str(exc))


def append_manifest(campaign: CampaignPaths, lines: Iterable[ManifestLine]) -> list[ManifestLine]:
    """Append *lines* to the campaign's manifest under an exclusive lock, written and fsynced at once; returns
    them. A line :func:`check_line` refuses is never written (:class:`RecordError`); a manifest that is not a
    regular file, or cannot be opened, is a :class:`SubmitError` that says so."""
    lines = list(lines)
    if not lines:
        return lines
    data = "".join(_encode(line) for line in lines).encode()
    path = campaign.manifest
    path.parent.mkdir(parents=True, exist_ok=True)
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
    return lines


def parse_manifest(data: bytes, name: str, kinds: Collection[str] | None = None) -> tuple[list[ManifestLine],
                                                                                          list[str]]:
    """The lines of a manifest's bytes (*name*: the file's name, for the problems), and a problem for each line
    that is refused (not JSON, torn by a crash mid-write, or refused by :func:`check_line`). *kinds*: only the
    lines of those types are decoded, picked by how :func:`append_manifest` begins them (a campaign's few
    campaign and repeats lines out of a large campaign's attempt lines)."""
    if kinds is not None:
        prefixes = tuple(_PREFIX[k] for k in kinds)
        data = b"".join(raw + b"\n" for raw in data.split(b"\n") if raw.startswith(prefixes))
    objs, problems = decode_jsonl(data, name)
    out: list[ManifestLine] = []
    append = out.append
    for i, obj in objs:
        kind = obj.get("type")  # the usual line, inline: a large manifest has 20,000 of them
        keys = _KEYS.get(kind) if kind.__class__ is str else None
        have = obj.keys()
        if keys is not None and have >= keys[0] and have <= keys[1]:
            append(cast(ManifestLine, obj))
            continue
        try:
            append(check_line(obj))
        except RecordError as exc:
            problems.append(f"{name} line {i}: {exc}")
    return out, problems


def read_manifest(campaign: CampaignPaths, kinds: Collection[str] | None = None) -> tuple[list[ManifestLine],
                                                                                          list[str]]:
    """The campaign's manifest lines and the problems of the lines refused (see :func:`parse_manifest`); none
    when it has no manifest yet. Raises ``OSError`` (:class:`~harness.contract.safefile.Refused`: a FIFO, a
    link out of the campaign directory, larger than its bound) when the manifest is there but not read."""
    try:
        data = safefile.read_bytes(campaign.manifest, campaign.root, safefile.MANIFEST_MAX)
    except FileNotFoundError:
        return [], []
    return parse_manifest(data, campaign.manifest.name, kinds)


def not_read(exc: OSError) -> str:
    """Why a campaign file was not read or written, in a few words (``a FIFO, not a regular file``)."""
    return _why(exc)


# -- submitted.json ---------------------------------------------------------------------------------------------
class PackInfo(TypedDict):
    """slurm.pack: the point's place in its pack, and the pack's job dirs in the order they run."""

    index: int
    size: int
    job_dirs: list[str]


class SubmittedInfo(TypedDict, total=False):
    """A job dir's ``submitted.json``: every key is optional, each written by the step that knows it."""

    executor: str  # local | slurm
    job_id: str | None  # None: not handed over yet, queued locally, or held back
    array_job_id: str | None
    array_task_id: int | None
    job_name: str | None
    rendered_at: str  # submit wrote the job dir (and this file, until the executor replaces it)
    submitted_at: str
    queue: str  # the local queue file that holds it
    queued_at: str  # the local queue handed it to submitit
    held_back_at: str  # sbench holds it back for the feeder job
    fed_at: str  # the feeder job submitted it
    pid: int  # the local launch's process
    started_at: str | None
    exit_code: int
    exit_signal: int
    ended_at: str
    cancelled_at: str  # sbench cancel marked it: never started after this
    not_started_at: str  # its local queue ended before starting it
    not_started_reason: str
    requeued_at: str  # a pack put it back in the queue as its own job
    requeued_from: str | None
    pack: PackInfo | None
    pack_lead: str  # the pack's first job dir, whose training process ran this point
    submit_time: str  # an older release's submitted_at
    process: dict[str, Any]  # an older release's record of the launch's process (never trusted now)


SUBMITTED_KEYS = frozenset(SubmittedInfo.__optional_keys__)


def pack_info(job_dirs: Sequence[str], index: int) -> PackInfo:
    """What a packed job dir's ``submitted.json`` says of its pack (``pack``)."""
    return PackInfo(index=index, size=len(job_dirs), job_dirs=list(job_dirs))


def check_submitted(obj: Any) -> SubmittedInfo:
    """*obj* as a ``submitted.json`` record; :class:`RecordError` naming the key when it is not an object or has
    a key the record does not list."""
    if not isinstance(obj, dict):
        raise RecordError("not a JSON object")
    if obj.keys() <= SUBMITTED_KEYS:
        return cast(SubmittedInfo, obj)
    unknown = sorted(str(k) for k in obj.keys() - SUBMITTED_KEYS)
    raise RecordError(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(SUBMITTED_KEYS))})")


def write_submitted(job_dir: str | Path, info: SubmittedInfo) -> None:
    """Write the job dir's ``submitted.json`` whole (a temporary file renamed into place); a record
    :func:`check_submitted` refuses is never written."""
    check_submitted(info)
    write_json(JobPaths(job_dir).submitted, info)


_SUBMITTED_NAME = JobPaths("").submitted.name


def read_submitted(job_dir: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                   problems: list[str] | None = None) -> SubmittedInfo:
    """The job dir's ``submitted.json``; {} when it has none, and when it is not read: the job dir does not lie
    inside *root* (default: its campaign directory, the job dir's parent), the file is not a regular file or
    past its bound, or not a record :func:`check_submitted` accepts. Why it was not read is a line of
    *problems*. (Plain strings, not paths: collect reads one per run.)"""
    jd = os.fspath(job_dir)
    top = os.path.dirname(os.path.abspath(jd)) if root is None else os.fspath(root)
    try:
        safefile.check_dir(jd, top)
    except OSError as exc:
        if problems is not None:
            problems.append(f"{_SUBMITTED_NAME}: not read ({_why(exc)})")
        return {}
    data, problem = safefile.read_or_problem(os.path.join(jd, _SUBMITTED_NAME), top, safefile.SMALL_MAX)
    doc = None
    if data is not None:
        doc, problem = decode_json(data, _SUBMITTED_NAME)
    if problem is None and doc is not None:
        try:
            return check_submitted(doc)
        except RecordError as exc:
            problem = f"{_SUBMITTED_NAME}: {exc}"
    if problem is not None and problems is not None:
        problems.append(problem)
    return {}


__all__ = ["LINE_TYPES", "PREDICTION_COLUMNS", "SUBMITTED_KEYS", "AttemptExtra", "AttemptLine", "BudgetLine",
           "CampaignLine", "CancelLine", "ManifestLine", "PackInfo", "PointFields", "PointLine", "Predicted",
           "ReferencesLine", "RepeatsLine", "SearchLine", "SubmittedInfo",
           "append_manifest", "attempt_line", "check_line", "check_submitted", "not_read", "now_iso", "pack_extra",
           "pack_info", "parse_manifest", "point_line", "prediction_columns", "read_manifest", "read_submitted",
           "write_submitted"]
