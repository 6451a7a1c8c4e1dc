"""Campaigns beyond one results database: what an export directory holds, how an imported campaign is named,
and where an imported campaign came from.

An export (``sbench export CAMPAIGN... -o DIR``) is a directory of one Parquet file per table
(:meth:`ExportPaths.table`) and ``provenance.json`` (:attr:`ExportPaths.provenance`): the format
(:data:`FORMAT`), sbench's version and schema, each campaign's cluster, partitions, sweep and time span, every
table's row count, and the sha256 of every Parquet file. ``provenance.json`` carries its own digest
(:data:`SEAL_KEY`): the sha256 of the file's bytes with that digest written as 64 zeros (:func:`seal`,
:func:`unseal`), so that no byte of an export can change unnoticed, provenance.json's included.

An imported campaign keeps its name and its run ids under its cluster's name (:func:`namespaced`):
``clusterA/nightly-1123``, whose runs are ``clusterA/nightly-1123/<point>.r0.a1``. A name that already holds a
namespace (a campaign imported there, exported again) keeps it. Point ids are the same everywhere (a hash of
the point), so the same point measured on two clusters is one point.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

FORMAT = "sbench-export/1"
PROVENANCE = "provenance.json"
PARQUET_SUFFIX = ".parquet"
SEAL_KEY = "provenance_sha256"
_ZEROS = "0" * 64
_SEAL = re.compile(rb'"' + SEAL_KEY.encode() + rb'": "([0-9a-f]{64})"')

NAMESPACE_SEP = "/"

# campaigns.origin: NULL for a campaign submitted here, else how it came in
ORIGIN_EXPORT = "export"  # sbench import DIR: another results database's export
ORIGIN_ADO_CSV = "ado-csv"  # sbench import --format ado-csv FILE: the reference's published measurements
ORIGINS = (ORIGIN_EXPORT, ORIGIN_ADO_CSV)


CSV_MAX = 16 << 30  # a published CSV (the reference's file is a few MiB; a million rows about 50 MiB)
PROVENANCE_MAX = 16 << 20  # an export's provenance.json (about 1 KiB per campaign and table)
TABLE_MAX = 256 << 30  # one exported table's Parquet file, streamed: its sha256, then Arrow reads it

def namespaced(namespace: str, name: str) -> str:
    """*name* under *namespace* (``clusterA/nightly-1123``); a name that already has one keeps it."""
    return name if NAMESPACE_SEP in name else f"{namespace}{NAMESPACE_SEP}{name}"


def namespaced_run(namespace: str, run_id: str) -> str:
    """A run id (``<campaign>/<job dir name>``) under *namespace*: its campaign's part is :func:`namespaced`."""
    campaign, sep, rest = run_id.rpartition(NAMESPACE_SEP)
    if not sep:
        return run_id
    return f"{namespaced(namespace, campaign)}{NAMESPACE_SEP}{rest}"


def sha256_fd(fd: int) -> str:
    """The sha256 of the open file *fd* from its start, streamed; the file is left at its start again."""
    os.lseek(fd, 0, os.SEEK_SET)
    h = hashlib.sha256()
    while block := os.read(fd, 1 << 20):
        h.update(block)
    os.lseek(fd, 0, os.SEEK_SET)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return sha256_fd(fh.fileno())


def seal(text: str) -> bytes:
    """provenance.json's bytes with their own digest: *text* holds ``"provenance_sha256": "<64 zeros>"`` once."""
    raw, blank = text.encode("utf-8"), f'"{SEAL_KEY}": "{_ZEROS}"'.encode()
    if raw.count(blank) != 1:
        raise ValueError(f"{PROVENANCE}: the text must hold {SEAL_KEY} once, as 64 zeros")
    digest = hashlib.sha256(raw).hexdigest()
    return raw.replace(blank, f'"{SEAL_KEY}": "{digest}"'.encode(), 1)


def unseal(raw: bytes) -> str | None:
    """Why *raw* (provenance.json's bytes) is not as :func:`seal` wrote it; None when its digest holds."""
    found = _SEAL.findall(raw)
    if len(found) != 1:
        return f"it holds no {SEAL_KEY} (or more than one)"
    digest = found[0]
    blank = _SEAL.sub(f'"{SEAL_KEY}": "{_ZEROS}"'.encode(), raw, count=1)
    if hashlib.sha256(blank).hexdigest().encode() != digest:
        return f"its {SEAL_KEY} does not match its bytes (the file was changed or cut short)"
    return None


@dataclass(frozen=True)
class ExportPaths:
    """Every file of one export directory."""

    root: Path

    @property
    def provenance(self) -> Path:
        return self.root / PROVENANCE

    def table(self, name: str) -> Path:
        return self.root / f"{name}{PARQUET_SUFFIX}"

    def file_name(self, name: str) -> str:
        return self.table(name).name
