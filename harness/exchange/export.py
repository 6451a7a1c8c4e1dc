"""``sbench export CAMPAIGN... -o DIR``: the campaigns' rows of every table as Parquet, and ``provenance.json``.

The same campaigns export the same bytes: rows are in a total order (``harness.db.exchange``), the Parquet
writer's settings are fixed (:data:`PARQUET`), and provenance.json holds no time of its own making, no path of
this machine but what the database recorded, and its keys sorted. It holds sbench's version and schema, each
campaign's cluster, partitions (their public description: hardware and host names, never an env value or a
setup line), sweep and time span, and every table's file, row count and sha256; it is sealed with its own digest
(:func:`harness.contract.exchange.seal`). The files are written beside DIR and renamed into place, so a failed
export leaves no half-written DIR.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import __version__
from harness.contract.errors import InputError
from harness.contract.exchange import FORMAT, NAMESPACE_SEP, ORIGIN_ADO_CSV, SEAL_KEY, ExportPaths, seal, sha256_file
from harness.contract.paths import DbTarget
from harness.db.exchange import EXPORTED, CampaignRecord, campaign_records, export_table
from harness.db.schema import SCHEMA_VERSION
from harness.db.status import campaign_names
from harness.db.store import open_store
from harness.spec.schema import is_name

# pyarrow.parquet.write_table's settings: fixed, so that the same rows are the same bytes
PARQUET: dict[str, Any] = {"compression": "zstd", "compression_level": 3, "use_dictionary": True,
                           "write_statistics": True, "version": "2.6", "data_page_version": "1.0",
                           "row_group_size": 1 << 17, "store_schema": True}


@dataclass
class ExportReport:
    out: str
    namespace: str
    campaigns: list[dict[str, Any]]
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def namespace_of(records: Sequence[CampaignRecord], cluster: str | None) -> str:
    """The cluster the exported campaigns were measured on: their recorded one (``--cluster`` where the database
    recorded none); campaigns already namespaced (imported here) keep theirs."""
    own = [r for r in records if NAMESPACE_SEP not in r.campaign]
    found = sorted({r.cluster for r in own if r.cluster})
    if cluster is not None:
        if not is_name(cluster):
            raise InputError(f"--cluster {cluster!r} is not a name (letters, digits, '.', '_', '-')")
        if found and found != [cluster]:
            raise InputError(f"--cluster {cluster}: the database records the campaigns' cluster as "
                             f"{', '.join(found)}; leave --cluster out")
        return cluster
    if len(found) > 1:
        raise InputError("the campaigns were measured on several clusters (" + ", ".join(
            f"{r.campaign}: {r.cluster}" for r in own if r.cluster) + "); export each cluster's campaigns apart")
    published = [r.campaign for r in own if not r.cluster and r.origin == ORIGIN_ADO_CSV]
    if published:
        raise InputError(f"{', '.join(published)}: published measurements imported without --cluster; pass --cluster "
                         "NAME to name the namespace they are exported under")
    unknown = [r.campaign for r in own if not r.cluster]
    if unknown:
        raise InputError(f"the database does not say which cluster ran {', '.join(unknown)} (it was recorded before "
                         "sbench recorded clusters): `sbench collect` records it from the campaign's manifest, or "
                         "pass --cluster NAME (the inventory's cluster:)")
    if found:
        return found[0]
    return records[0].campaign.split(NAMESPACE_SEP, 1)[0]


def export_campaigns(db: DbTarget, campaigns: Sequence[str], out: Path, cluster: str | None = None) -> ExportReport:
    """Write *campaigns* of the database *db* to the new directory *out* (see the module docstring)."""
    import pyarrow.parquet as pq  # heavy: only an export writes Parquet

    names = list(dict.fromkeys(campaigns))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"-o {out}: exists and is not an empty directory; name a new directory for the export")
    with open_store(db, read_only=True) as store:
        known = campaign_names(store)
        missing = [c for c in names if c not in known]
        if missing:
            listed = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
            raise InputError(f"{db}: no campaign {', '.join(repr(c) for c in missing)}; "
                             + (f"its campaigns: {listed}" if known else "it holds no campaign"))
        records = campaign_records(store, names)
        namespace = namespace_of(records, cluster)
        tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        paths = ExportPaths(tmp)
        tables: dict[str, dict[str, Any]] = {}
        try:
            for table in EXPORTED:
                data = export_table(store, table, names, records)
                pq.write_table(data, paths.table(table), **PARQUET)
                tables[table] = {"file": paths.file_name(table), "rows": data.num_rows,
                                 "sha256": sha256_file(paths.table(table))}
            doc = {"format": FORMAT, "sbench_version": __version__, "schema_version": SCHEMA_VERSION,
                   "cluster": namespace, "campaigns": [r.to_dict() for r in records], "tables": tables,
                   SEAL_KEY: "0" * 64}
            paths.provenance.write_bytes(seal(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n"))
            if out.exists():
                out.rmdir()
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return ExportReport(str(out), namespace, [r.to_dict() for r in records], tables)
