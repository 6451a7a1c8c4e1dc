"""``sbench import --format ado-csv FILE --campaign NAME``: the reference's published measurements as a campaign.

Each row that parses (:func:`harness.spec.published.parse_row`) is one measurement of one point: a ``points``
row whose entity holds the fields the row gives (and whose id is the hash of those, :func:`harness.spec.plan.
point_id`), a ``runs`` row (``executor`` and ``submit_reason`` say where it came from, ``outcome`` is ``ok`` or
``invalid`` by ``is_valid``) and a ``measurements`` row (the properties sbench has columns for; the other
columns in ``extra``, JSON). Rows of the same point are its repeats, in file order. A row that does not parse is
counted and listed (``campaigns.imported``: ``skipped`` and ``skipped_rows``), never guessed.

The campaign is marked ``origin = 'ado-csv'``; importing the same file again changes nothing, another file
under the same name needs ``--replace``. Campaigns whose references take their values from it
(``references: {from_campaign: NAME}``) are checked again.
"""

from __future__ import annotations

import csv
import datetime as _dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import __version__
from harness.contract.errors import InputError
from harness.contract.exchange import ORIGIN_ADO_CSV, sha256_file
from harness.contract.paths import run_id
from harness.db.checks import referencing, refresh_checks
from harness.db.exchange import delete_campaign, imported_campaigns, insert_rows
from harness.db.manifest import point_row
from harness.db.status import campaign_names
from harness.db.store import open_store
from harness.db.values import entity_values, to_json
from harness.spec.plan import point_id
from harness.spec.published import PublishedRow, missing_columns, parse_row
from harness.spec.schema import is_name

LISTED = 200  # skipped rows kept in campaigns.imported (every one is counted)


@dataclass
class AdoReport:
    db: str
    source: str
    campaign: str
    status: str  # imported | replaced | unchanged
    rows: int = 0  # rows read (the header not counted)
    imported: int = 0
    points: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {line, reason} of each row that did not parse
    checks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_rows(path: Path) -> Iterator[tuple[int, dict[Any, Any]]]:
    """The CSV's rows with their line numbers; ``InputError`` for a file that is no CSV with the columns."""
    try:
        fh = path.open(newline="", encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a directory; --format ado-csv reads one CSV file") from None
    with fh:
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


def published_rows(path: Path) -> tuple[list[PublishedRow], list[dict[str, Any]], int]:
    """The rows of *path* that parse, and ``{line, reason}`` of those that do not, and how many rows in all."""
    good, bad, n = [], [], 0
    for line, row in read_rows(path):
        n += 1
        if None in row:  # more cells than the header has columns
            bad.append({"line": line, "reason": f"{len(row[None] or [])} cell(s) more than the header's columns"})
            continue
        try:
            good.append(parse_row(line, row))
        except ValueError as exc:
            bad.append({"line": line, "reason": str(exc)})
    return good, bad, n


def campaign_rows(campaign: str, path: Path, rows: list[PublishedRow], imported: dict[str, Any],
                  cluster: str | None) -> dict[str, list[dict[str, Any]]]:
    """The campaign's rows of every table, one run and measurement per published row."""
    now = _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)
    points: dict[str, dict[str, Any]] = {}
    links, runs, measurements = [], [], []
    repeats: dict[str, int] = {}
    for r in rows:
        pid = point_id(r.experiment, r.entity)
        if pid not in points:
            points[pid] = point_row(pid, r.experiment, r.entity, None, [], [
                f"published measurement ({path.name}): its entity holds the fields the file gives"])
        repeat = repeats[pid] = repeats.get(pid, -1) + 1
        rid = run_id(campaign, pid, repeat, 1)
        where = f"{path.name} line {r.line}"
        links.append({"campaign": campaign, "point_id": pid, "repeat": repeat})
        runs.append({"run_id": rid, "campaign": campaign, "point_id": pid, "repeat": repeat, "attempt": 1,
                     "experiment": r.experiment, "executor": ORIGIN_ADO_CSV, "submit_reason": f"published: {where}",
                     "state": "COMPLETED", "outcome": "ok" if r.is_valid else "invalid",
                     "reason": None if r.is_valid else f"is_valid False in {where}", "collected_at": now})
        measurements.append({"run_id": rid, "campaign": campaign, "point_id": pid, "repeat": repeat, "attempt": 1,
                             "experiment": r.experiment, "is_valid": r.is_valid, **r.values,
                             **entity_values(r.entity), "extra": to_json(r.extra) if r.extra else None,
                             "notes": [where]})
    experiments = sorted({r.experiment for r in rows})
    camp = {"campaign": campaign, "experiment": experiments[0] if len(experiments) == 1 else None,
            "executor": ORIGIN_ADO_CSV, "created_at": now, "sbench_version": __version__, "source": str(path),
            "references_spec": to_json([]), "cluster": cluster, "origin": ORIGIN_ADO_CSV,
            "imported": to_json(imported)}
    return {"campaigns": [camp], "points": list(points.values()), "campaign_points": links, "runs": runs,
            "measurements": measurements}


def import_ado_csv(db: Path, path: Path, campaign: str, cluster: str | None = None,
                   replace: bool = False) -> AdoReport:
    """Import the published CSV *path* as *campaign* into the database *db* (see the module docstring)."""
    if not is_name(campaign):
        raise InputError(f"--campaign {campaign!r} is not a campaign name (letters, digits, '.', '_', '-'; at most "
                         "100)")
    if cluster is not None and not is_name(cluster):
        raise InputError(f"--cluster {cluster!r} is not a name (letters, digits, '.', '_', '-')")
    rows, bad, n = published_rows(path)
    report = AdoReport(str(db), str(path), campaign, "imported", n, len(rows), skipped=bad)
    if not rows:
        shown = "; ".join(f"line {b['line']}: {b['reason']}" for b in bad[:3])
        raise InputError(f"{path}: no row parses ({n} row(s)){': ' + shown if shown else ''}; nothing was imported")
    digest = sha256_file(path)
    meta = {"format": ORIGIN_ADO_CSV, "source": str(path.resolve()), "sha256": digest, "rows": n,
            "imported_rows": len(rows), "skipped": len(bad), "skipped_rows": bad[:LISTED],
            "imported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    tables = campaign_rows(campaign, path, rows, meta, cluster)
    report.points = len(tables["points"])
    with open_store(db) as store:
        here = imported_campaigns(store)
        before = here.get(campaign)
        if before is None and campaign in campaign_names(store):
            raise InputError(f"--campaign {campaign}: {db} has a campaign of that name submitted there; name the "
                             "published measurements another campaign")
        if before is not None and before.get("sha256") == digest:
            report.status = "unchanged"
            return report
        if before is not None and not replace:
            raise InputError(f"--campaign {campaign}: {db} has it already, imported from {before.get('source')} "
                             f"(sha256 {str(before.get('sha256'))[:12]}): --replace takes {path.name} instead, or "
                             "name another campaign")
        with store.transaction():
            if before is not None:
                delete_campaign(store, campaign)
                report.status = "replaced"
            insert_rows(store, tables)
            again = referencing(store, [campaign])
            if again:
                report.checks = refresh_checks(store, _dt.datetime.now(_dt.timezone.utc), again)
    return report
