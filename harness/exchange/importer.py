"""``sbench import DIR``: another results database's export, checked byte by byte, then written in one
transaction.

Before the database is opened: provenance.json's own digest and format, the export's schema (a newer one is
refused with its number; an older one from :data:`~harness.db.schema.UPGRADE_FROM` on is read, the columns
it lacks NULL), every listed file's sha256, and every file read as Parquet with only columns this schema
knows. A file that fails any of these is named and nothing is written.

The campaigns keep their names and run ids under the export's cluster (``--as`` names another namespace):
``clusterA/nightly-1123``. A campaign imported before from the same rows (provenance.json's per-campaign
sha256) is left as it is, so a second import of the same export changes nothing; one imported from other rows
is refused unless ``--replace``; a campaign submitted here of the same name is refused. The imported campaigns
are marked (``campaigns.origin = 'export'``, and ``campaigns.imported`` says from where); their checks are the
exporter's, and the checks of this database's campaigns whose references name one of them are computed again.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import safefile
from harness.contract.errors import InputError
from harness.contract.exchange import (
    FORMAT,
    NAMESPACE_SEP,
    PROVENANCE,
    PROVENANCE_MAX,
    TABLE_MAX,
    ExportPaths,
    namespaced,
    sha256_fd,
    unseal,
)
from harness.contract.paths import DbTarget
from harness.db.checks import referencing, refresh_checks
from harness.db.exchange import EXPORTED, ImportPlan, import_tables, imported_campaigns
from harness.db.schema import COLUMN_NAMES, SCHEMA_VERSION, UPGRADE_FROM, tables_of
from harness.db.status import campaign_names
from harness.db.store import open_store
from harness.spec.schema import is_name

UNCHANGED, IMPORTED, REPLACED, REPAIRED = "unchanged", "imported", "replaced", "repaired"


@dataclass
class ImportReport:
    db: str
    source: str
    namespace: str
    campaigns: dict[str, str] = field(default_factory=dict)  # name here -> imported | replaced | unchanged
    rows: dict[str, int] = field(default_factory=dict)
    checks: int = 0  # checks computed again (this database's campaigns whose references name an imported one)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_export(src: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """provenance.json and every table of the export *src* as Arrow tables, each checked (module docstring);
    ``InputError`` names the first file that fails."""
    import pyarrow.parquet as pq  # heavy: only an import reads Parquet

    paths = ExportPaths(src)
    if not src.is_dir():
        raise InputError(f"{src}: not a directory; sbench import reads the directory sbench export -o wrote "
                         "(or a published CSV with --format ado-csv)")
    try:
        raw = safefile.read_bytes(paths.provenance, None, PROVENANCE_MAX)
    except FileNotFoundError:
        raise InputError(f"{src}: no {PROVENANCE}: not an sbench export (sbench export CAMPAIGN -o DIR writes one)") \
            from None
    except OSError as exc:
        raise InputError(f"{paths.provenance}: {_why(exc)}; nothing was imported") from None
    problem = unseal(raw)
    if problem is not None:
        raise InputError(f"{paths.provenance}: {problem}; nothing was imported. Export the campaigns again")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise InputError(f"{paths.provenance}: not JSON ({exc}); nothing was imported") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{paths.provenance}: format {doc.get('format') if isinstance(doc, dict) else None!r} is not "
                         f"{FORMAT!r}; nothing was imported")
    schema = doc.get("schema_version")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise InputError(f"{paths.provenance}: schema_version {schema!r} is not a number as sbench export writes it "
                         "(the file was edited); nothing was imported. Export the campaigns again")
    if schema > SCHEMA_VERSION:
        raise InputError(f"{paths.provenance}: written by sbench {doc.get('sbench_version')} with results schema "
                         f"{schema}; this sbench reads exports of schema {UPGRADE_FROM} to {SCHEMA_VERSION}: import it "
                         "with a newer sbench; nothing was imported")
    if schema < UPGRADE_FROM:
        raise InputError(f"{paths.provenance}: results schema {schema} is older than this sbench reads "
                         f"({UPGRADE_FROM} to {SCHEMA_VERSION}); export it again with a newer sbench")
    listed = doc.get("tables")
    if not isinstance(listed, dict) or not isinstance(doc.get("campaigns"), list) or not doc["campaigns"]:
        raise InputError(f"{paths.provenance}: lists no tables or no campaigns; nothing was imported")
    missing = [t for t in tables_of(schema) if t in EXPORTED and t not in listed]
    if missing:
        raise InputError(f"{paths.provenance}: lists no {', '.join(missing)}: an export of schema {schema} holds every "
                         f"table of it ({', '.join(t for t in tables_of(schema) if t in EXPORTED)}), so this one is "
                         "partial; nothing was imported. Export the campaigns again")
    tables: dict[str, Any] = {}
    for table, entry in sorted(listed.items()):
        if table not in COLUMN_NAMES or table not in EXPORTED:
            raise InputError(f"{paths.provenance}: table {table!r} is not one of sbench's exported tables "
                             f"({', '.join(EXPORTED)}); nothing was imported")
        file = paths.table(table)
        if not isinstance(entry, dict) or entry.get("file") != file.name:
            raise InputError(f"{paths.provenance}: tables.{table} does not name {file.name}; nothing was imported")
        try:
            fd, _size = safefile.open_regular(file, None, TABLE_MAX)
        except FileNotFoundError:
            raise InputError(f"{file}: missing (provenance.json lists it); nothing was imported") from None
        except OSError as exc:
            raise InputError(f"{file}: {_why(exc)}; nothing was imported") from None
        with os.fdopen(fd, "rb") as fh:  # hashed and read from one open file: what was checked is what is read
            digest = sha256_fd(fh.fileno())
            if digest != entry.get("sha256"):
                raise InputError(f"{file}: its sha256 is {digest}, provenance.json says {entry.get('sha256')} (the "
                                 "file was changed or cut short); nothing was imported")
            try:  # pyarrow's own reader of the same open file (a Python file object left its threads aborting
                # the interpreter at exit); /proc/self/fd/N is this descriptor's file, even if renamed since
                data = pq.read_table(f"/proc/self/fd/{fh.fileno()}")
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is no Parquet
                raise InputError(f"{file}: not a Parquet file sbench can read ({exc}); nothing was imported") \
                    from None
        unknown = [c for c in data.column_names if c not in COLUMN_NAMES[table]]
        if unknown:
            raise InputError(f"{file}: column(s) {', '.join(unknown)} are not in this schema's {table}; nothing was "
                             "imported")
        if data.num_rows != entry.get("rows"):
            raise InputError(f"{file}: {data.num_rows} rows, provenance.json says {entry.get('rows')}; nothing was "
                             "imported")
        tables[table] = data
    _check_campaigns(paths.provenance, doc, tables)
    return doc, tables


def _why(exc: OSError) -> str:
    return f"not read ({exc.why})" if isinstance(exc, safefile.Refused) else f"unreadable ({exc.strerror})"


def _check_campaigns(where: Path, doc: dict[str, Any], tables: dict[str, Any]) -> None:
    """Every campaign provenance.json lists has its row in the campaigns table, and every run's campaign is one of
    them: a file that lost rows (an edit the seal does not catch) is refused, not imported in part."""
    listed = {str(c.get("campaign")) for c in doc["campaigns"] if isinstance(c, dict)}
    rows = set(tables["campaigns"].column("campaign").to_pylist()) if "campaign" in tables["campaigns"].column_names \
        else set()
    lacking = sorted(listed - rows)
    if lacking:
        raise InputError(f"{where}: campaign(s) {', '.join(lacking)} have no row in campaigns.parquet (a partial "
                         "export); nothing was imported. Export the campaigns again")
    runs = tables["runs"]
    strays = sorted(set(runs.column("campaign").to_pylist()) - listed) if "campaign" in runs.column_names else []
    if strays:
        raise InputError(f"{where}: runs.parquet holds runs of {', '.join(map(str, strays[:5]))}, which "
                         "provenance.json does not list; nothing was imported. Export the campaigns again")


def import_export(db: DbTarget, src: Path, namespace: str | None = None, replace: bool = False) -> ImportReport:
    """Import the export directory *src* into the database *db* (see the module docstring)."""
    doc, tables = read_export(src)
    ns = namespace or doc.get("cluster")
    if not is_name(ns):
        raise InputError(f"{src}: the export names no cluster to put its campaigns under ({ns!r}); pass --as NAME")
    records = {str(c["campaign"]): c for c in doc["campaigns"] if isinstance(c, dict) and c.get("campaign")}
    report = ImportReport(str(db), str(src), str(ns))
    with open_store(db) as store:
        here = imported_campaigns(store)
        local = set(campaign_names(store)) - set(here)
        names: dict[str, str] = {}
        meta: dict[str, dict[str, Any]] = {}
        replaced = []
        whole = sorted(t for t in tables_of(int(doc["schema_version"])) if t in EXPORTED)
        for original, rec in records.items():
            target = namespaced(str(ns), original)
            # a name with a namespace is never a campaign submitted here: its runs without a campaign row are what
            # an import of a partial export left (an older sbench took one), and this import completes them
            remnant = target in local and NAMESPACE_SEP in target
            if target in local and not remnant:
                raise InputError(f"{src}: campaign {original} would be {target} here, the name of a campaign submitted "
                                 f"to {db}; import it under another namespace with --as NAME; nothing was imported")
            before = here.get(target)
            partial = remnant or (before is not None and not set(whole) <= set(before.get("tables") or ()))
            if before is not None and before.get("sha256") == rec.get("sha256") and not partial:
                report.campaigns[target] = UNCHANGED
                continue
            if before is not None and not replace and not partial:
                raise InputError(f"{src}: {target} is in {db} already, imported from other rows "
                                 f"({before.get('source')}, sha256 {str(before.get('sha256'))[:12]}): --replace takes "
                                 "this export's instead, --as NAME imports it beside; nothing was imported")
            if before is not None or remnant:
                replaced.append(target)
            names[original] = target
            meta[original] = {"format": doc.get("format"), "source": str(src.resolve()), "name": original,
                              "cluster": rec.get("cluster"), "sha256": rec.get("sha256"),
                              "sbench_version": doc.get("sbench_version"), "schema_version": doc.get("schema_version"),
                              "provenance_sha256": doc.get("provenance_sha256"), "tables": sorted(tables),
                              "imported_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
            report.campaigns[target] = REPAIRED if partial else REPLACED if before is not None else IMPORTED
        if not names:
            return report
        with store.transaction():
            report.rows = import_tables(store, tables, ImportPlan(str(ns), names, meta, replaced))
            again = referencing(store, list(names.values()))
            if again:
                report.checks = refresh_checks(store, _dt.datetime.now(_dt.timezone.utc), again)
    return report
