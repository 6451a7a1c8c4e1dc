"""``sbench import --format ado-csv FILE --campaign NAME``: the reference's published measurements as a campaign.

Each row that parses (:func:`harness.spec.published.parse_row`) is one measurement of one point: a ``points``
row whose entity holds the fields the row gives (and whose id is the hash of those, :func:`harness.spec.plan.
point_id`), a ``runs`` row (``executor`` and ``submit_reason`` say where it came from, ``outcome`` is ``ok`` or
``invalid`` by ``is_valid``) and a ``measurements`` row (the properties sbench has columns for; the other
columns in ``extra``, JSON). Rows of the same point are its repeats, in file order. A row is checked as sbench
checks a planned point and its measurements: a row that does not parse, a negative measured value, or a row that
says is_valid True of a point the reference's is_valid rules make invalid is skipped, counted and listed
(``campaigns.imported``: ``skipped`` and ``skipped_rows``), never guessed. The file is read as a regular file only
(a FIFO or a device is refused), streamed a chunk of rows at a time into one transaction, so memory stays bounded
whatever its length.

The campaign is marked ``origin = 'ado-csv'``; importing the same file again changes nothing, another file
under the same name needs ``--replace``. Campaigns whose references take their values from it
(``references: {from_campaign: NAME}``) are checked again.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import __version__
from harness.contract import safefile
from harness.contract.errors import InputError
from harness.contract.exchange import CSV_MAX, ORIGIN_ADO_CSV, sha256_fd
from harness.contract.paths import DbTarget, run_id
from harness.db.checks import referencing, refresh_checks
from harness.db.exchange import delete_campaign, imported_campaigns, insert_rows, point_ids
from harness.db.manifest import point_row
from harness.db.schema import COLUMN_NAMES
from harness.db.status import campaign_names
from harness.db.store import Store, open_store
from harness.db.values import entity_values, to_json
from harness.spec.catalog import EXPERIMENTS
from harness.spec.plan import point_id
from harness.spec.published import PublishedRow, missing_columns, parse_row
from harness.spec.rules import validity_reasons
from harness.spec.schema import is_name

LISTED = 200  # skipped rows kept in campaigns.imported (every one is counted)
REPORTED = 10_000  # skipped rows the report (--json) lists; every one is counted
# every column of a measurement row, so the rows stage at C speed (each has every key)
BLANK_MEASUREMENT: dict[str, Any] = dict.fromkeys(COLUMN_NAMES["measurements"])
DB_MEMORY = "400MB"  # the database's memory while it imports (the rows of one transaction beyond it spill to disk)
CHUNK = 20_000  # published rows parsed and written at a time: memory stays bounded whatever the file's length


@dataclass
class AdoReport:
    db: str
    source: str
    campaign: str
    status: str  # imported | replaced | unchanged
    rows: int = 0  # rows read (the header not counted)
    imported: int = 0
    points: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {line, reason}: the first REPORTED rows skipped
    checks: int = 0
    skipped_count: int = 0  # every row skipped

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def open_csv(path: Path) -> int:
    """A file descriptor of the published CSV *path*: a regular file within :data:`CSV_MAX` (a link the user
    named is followed; a FIFO, a device or a directory is refused, never read)."""
    real = os.path.realpath(path)
    try:
        return safefile.open_regular(real, None, CSV_MAX)[0]
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except safefile.Refused as exc:
        if os.path.isdir(real):
            raise InputError(f"{path}: a directory; --format ado-csv reads one CSV file") from None
        raise InputError(f"{path}: not read ({exc.why}); --format ado-csv reads one regular CSV file") from None
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror})") from None


def read_rows(path: Path, fd: int) -> Iterator[tuple[int, dict[Any, Any]]]:
    """The CSV's rows (of the open file *fd*, from its start) with their line numbers, streamed; ``InputError``
    for a file that is no CSV with the columns, raised before the first row."""
    os.lseek(fd, 0, os.SEEK_SET)
    with open(os.dup(fd), newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        try:
            header = reader.fieldnames or []
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: not a CSV file sbench can read ({exc})") from None
        dupes = sorted({c for c in header if header.count(c) > 1})
        if dupes:
            raise InputError(f"{path}: column(s) {', '.join(dupes)} appear twice in the header; keep one of each")
        missing = missing_columns(header)
        if missing:
            raise InputError(f"{path}: column(s) {', '.join(missing)} missing from the header (found: "
                             f"{', '.join(header[:30]) or 'none'}); a published file names each measurement's "
                             "method, model_name, number_gpus, batch_size, gpu_model, tokens_per_sample and is_valid")
        try:
            for row in reader:
                yield reader.line_num, row
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: line {reader.line_num}: not CSV ({exc})") from None


def first_problems(path: Path, fd: int) -> None:
    """Before the database is opened: the header, and at least one row that passes (read up to the first that
    does); ``InputError`` otherwise, so a file that imports nothing writes nothing."""
    bad: list[str] = []
    n = 0
    for line, row in read_rows(path, fd):
        n += 1
        try:
            checked_row(line, row)
            return
        except ValueError as exc:
            if len(bad) < 3:
                bad.append(f"line {line}: {exc}")
    shown = "; ".join(bad)
    raise InputError(f"{path}: no row parses ({n} row(s)){': ' + shown if shown else ''}; nothing was imported")


def checked_row(line: int, row: dict[Any, Any]) -> PublishedRow:
    """One row as a measurement, checked as sbench checks a planned point and its measured values:
    ``ValueError`` says why it is skipped."""
    if None in row:  # more cells than the header has columns
        raise ValueError(f"{len(row[None] or [])} cell(s) more than the header's columns")
    r = parse_row(line, row)
    negative = [f"{k} {v:g}" for k, v in r.values.items() if v is not None and v < 0]
    if negative:
        raise ValueError(f"{', '.join(negative)}: a measured value is never negative")
    if r.is_valid:
        exp = EXPERIMENTS[r.experiment]
        entity = {f.name: f.default for f in exp.fields if not f.required} | r.entity
        reasons, _notes = validity_reasons(exp, entity, None, None)
        if reasons:
            raise ValueError(f"is_valid True, but the point is invalid: {'; '.join(reasons)}")
    return r


def entity_key(entity: dict[str, Any]) -> tuple[Any, ...]:
    """The entity as a dict key: its items in the file's column order (every row of a file has the same)."""
    items = tuple(entity.items())
    try:
        hash(items)
    except TypeError:  # a list value
        items = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in items)
    return items


class _Campaign:
    """The rows of one published file's campaign, built and written a chunk at a time."""

    def __init__(self, campaign: str, path: Path, have_points: set[str]) -> None:
        self.campaign, self.path = campaign, path
        self.now = _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)
        self.points = have_points  # every point id the database has, and those written since
        self.repeats: dict[str, int] = {}
        self.experiments: set[str] = set()
        self.ids: dict[tuple[str, tuple[Any, ...]], str] = {}  # (experiment, entity) -> point id: hashed once
        self.columns: dict[str, dict[str, Any]] = {}  # point id -> its entity's columns, each made once
        self.new_points = 0
        self.in_campaign: set[str] = set()

    def tables(self, rows: list[PublishedRow]) -> dict[str, list[dict[str, Any]]]:
        points, links, runs, measurements = [], [], [], []
        for r in rows:
            key = (r.experiment, entity_key(r.entity))
            pid = self.ids.get(key)
            if pid is None:
                pid = self.ids[key] = point_id(r.experiment, r.entity)
            if pid not in self.points:
                self.points.add(pid)
                points.append(point_row(pid, r.experiment, r.entity, None, [], [
                    f"published measurement ({self.path.name}): its entity holds the fields the file gives"]))
            self.in_campaign.add(pid)
            repeat = self.repeats[pid] = self.repeats.get(pid, -1) + 1
            rid = run_id(self.campaign, pid, repeat, 1)
            where = f"{self.path.name} line {r.line}"
            self.experiments.add(r.experiment)
            links.append({"campaign": self.campaign, "point_id": pid, "repeat": repeat})
            runs.append({"run_id": rid, "campaign": self.campaign, "point_id": pid, "repeat": repeat, "attempt": 1,
                         "experiment": r.experiment, "executor": ORIGIN_ADO_CSV,
                         "submit_reason": f"published: {where}", "state": "COMPLETED",
                         "outcome": "ok" if r.is_valid else "invalid",
                         "reason": None if r.is_valid else f"is_valid False in {where}", "collected_at": self.now})
            measurements.append({**BLANK_MEASUREMENT, "run_id": rid, "campaign": self.campaign, "point_id": pid,
                                 "repeat": repeat, "attempt": 1, "experiment": r.experiment, "is_valid": r.is_valid,
                                 **r.values,
                                 **self.entity_columns(pid, r.entity),
                                 "extra": to_json(r.extra) if r.extra else None,
                                 "notes": [where]})
        return {"points": points, "campaign_points": links, "runs": runs, "measurements": measurements}

    def entity_columns(self, pid: str, entity: dict[str, Any]) -> dict[str, Any]:
        cols = self.columns.get(pid)
        if cols is None:
            cols = self.columns[pid] = entity_values(entity)
        return cols

    def campaign_row(self, imported: dict[str, Any], cluster: str | None) -> dict[str, Any]:
        experiments = sorted(self.experiments)
        return {"campaign": self.campaign, "experiment": experiments[0] if len(experiments) == 1 else None,
                "executor": ORIGIN_ADO_CSV, "created_at": self.now, "sbench_version": __version__,
                "source": str(self.path), "references_spec": to_json([]), "cluster": cluster,
                "origin": ORIGIN_ADO_CSV, "imported": to_json(imported)}


def _unchanged(report: AdoReport, before: dict[str, Any]) -> AdoReport:
    report.status = "unchanged"
    report.rows, report.imported = int(before.get("rows") or 0), int(before.get("imported_rows") or 0)
    report.skipped_count = int(before.get("skipped") or 0)
    report.skipped = list(before.get("skipped_rows") or [])
    return report


def import_ado_csv(db: DbTarget, path: Path, campaign: str, cluster: str | None = None,
                   replace: bool = False) -> AdoReport:
    """Import the published CSV *path* as *campaign* into the database *db* (see the module docstring): streamed,
    a chunk of rows at a time, in one transaction."""
    if not is_name(campaign):
        raise InputError(f"--campaign {campaign!r} is not a campaign name (letters, digits, '.', '_', '-'; at most "
                         "100)")
    if cluster is not None and not is_name(cluster):
        raise InputError(f"--cluster {cluster!r} is not a name (letters, digits, '.', '_', '-')")
    fd = open_csv(path)
    try:
        digest = sha256_fd(fd)
        first_problems(path, fd)
        report = AdoReport(str(db), str(path), campaign, "imported")
        with open_store(db) as store:
            here = imported_campaigns(store)
            before = here.get(campaign)
            if before is None and campaign in campaign_names(store):
                raise InputError(f"--campaign {campaign}: {db} has a campaign of that name submitted there; name the "
                                 "published measurements another campaign")
            if before is not None and before.get("sha256") == digest:
                return _unchanged(report, before)
            if before is not None and not replace:
                raise InputError(f"--campaign {campaign}: {db} has it already, imported from {before.get('source')} "
                                 f"(sha256 {str(before.get('sha256'))[:12]}): --replace takes {path.name} instead, or "
                                 "name another campaign")
            with store.transaction():
                if before is not None:
                    delete_campaign(store, campaign)
                    report.status = "replaced"
                # the transaction's rows spill to disk past this, so a file of any length imports in bounded memory
                store.con.execute(f"SET memory_limit = '{DB_MEMORY}'")
                camp = _Campaign(campaign, path, point_ids(store))
                _write_rows(store, camp, path, fd, report)
                meta = {"format": ORIGIN_ADO_CSV, "source": str(path.resolve()), "sha256": digest,
                        "rows": report.rows, "imported_rows": report.imported, "skipped": report.skipped_count,
                        "skipped_rows": report.skipped[:LISTED],
                        "imported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
                insert_rows(store, {"campaigns": [camp.campaign_row(meta, cluster)]})
                report.points = len(camp.in_campaign)
                again = referencing(store, [campaign])
                if again:
                    report.checks = refresh_checks(store, _dt.datetime.now(_dt.timezone.utc), again)
    finally:
        os.close(fd)
    return report


def _write_rows(store: Store, camp: _Campaign, path: Path, fd: int, report: AdoReport) -> None:
    """Every row of the file: those that pass written a chunk at a time, those that do not counted and listed;
    ``InputError`` (the caller's transaction rolls back) when none passes (the file changed since
    :func:`first_problems` read it)."""
    chunk: list[PublishedRow] = []
    for line, row in read_rows(path, fd):
        report.rows += 1
        try:
            chunk.append(checked_row(line, row))
        except ValueError as exc:
            report.skipped_count += 1
            if len(report.skipped) < REPORTED:
                report.skipped.append({"line": line, "reason": str(exc)})
            continue
        if len(chunk) >= CHUNK:
            report.imported += len(chunk)
            insert_rows(store, camp.tables(chunk))
            chunk = []
    if chunk:
        report.imported += len(chunk)
        insert_rows(store, camp.tables(chunk))
    if not report.imported:
        shown = "; ".join(f"line {b['line']}: {b['reason']}" for b in report.skipped[:3])
        raise InputError(f"{path}: no row parses ({report.rows} row(s)){': ' + shown if shown else ''}; nothing "
                         "was imported")
