"""Imports that cannot poison a store: a partial export, files that are not regular files or are too large, a
schema version that is not a number, a symbolic link in an export, and published rows whose values a planned
point would never have. Each is refused (exit 2, the file and the fix named, nothing written) or, for published
rows, skipped and listed; an import of the full export completes what a partial one left."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import duckdb
import pytest

from harness.contract.exchange import PROVENANCE, ExportPaths

from .conftest import sql_rows, table_contents
from .helpers import Trained, sbench
from .test_exchange import BAD_ROWS, CLUSTER, PUBLISHED, TABLES, copy_export, exported, nothing_written, reseal

__all__ = ["exported"]  # the module's export fixture, shared with test_exchange


# -- files that are no regular files, or too large ------------------------------------------------------------
def test_a_provenance_that_is_a_device_a_fifo_or_too_large_is_refused_at_once(tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    cases = {"zero": lambda p: p.symlink_to("/dev/zero"), "fifo": lambda p: os.mkfifo(p),
             "large": lambda p: p.write_bytes(b" " * (17 << 20))}
    for name, make in cases.items():
        src = tmp_path / name
        src.mkdir()
        make(src / PROVENANCE)
        proc = sbench("import", src, "--db", db, ok=(2,), timeout=120)  # a FIFO would hang it: the timeout fails
        assert str(src / PROVENANCE) in proc.stderr and "not read" in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr
    nothing_written(db, None)


def test_a_published_csv_that_is_a_fifo_or_a_device_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    fifo = tmp_path / "published.csv"
    os.mkfifo(fifo)
    link = tmp_path / "zero.csv"
    link.symlink_to("/dev/zero")
    for path in (fifo, link):
        proc = sbench("import", "--format", "ado-csv", path, "--campaign", "x", "--db", db, ok=(2,), timeout=60)
        assert str(path) in proc.stderr and "not read" in proc.stderr and "regular" in proc.stderr, proc.stderr
    nothing_written(db, None)


# -- published values a planned point would never have -----------------------------------------------------------
def test_published_rows_with_impossible_values_are_skipped_and_listed(tmp_path: Path) -> None:
    lines = PUBLISHED.read_text().splitlines()
    header, good = lines[0], lines[1]
    cols = header.split(",")
    negative = good.split(",")
    negative[cols.index("dataset_tokens_per_second")] = "-4000.0"
    bad_batch = good.split(",")
    bad_batch[cols.index("batch_size")] = "-4"
    src = tmp_path / "hostile.csv"
    src.write_text("\n".join([header, good, ",".join(negative), ",".join(bad_batch)]) + "\n")
    db = tmp_path / "r.duckdb"
    rep = json.loads(sbench("import", "--format", "ado-csv", src, "--campaign", "h", "--db", db, "--json").stdout)
    assert (rep["rows"], rep["imported"], rep["skipped_count"]) == (3, 1, 2)
    reasons = {s["line"]: s["reason"] for s in rep["skipped"]}
    assert "dataset_tokens_per_second -4000" in reasons[3] and "never negative" in reasons[3]
    assert "rule 4" in reasons[4] and "batch_size" in reasons[4]
    got = sql_rows(db, "SELECT batch_size, dataset_tokens_per_second FROM measurements")
    assert len(got) == 1 and got[0]["batch_size"] > 0 and got[0]["dataset_tokens_per_second"] > 0
    text = sbench("import", "--format", "ado-csv", BAD_ROWS, "--campaign", "b", "--db", db)
    assert "skipped 4 row(s)" in text.stderr


# -- hostile exports (from the session's trained campaigns) --------------------------------------------------------
@pytest.mark.train
@pytest.mark.parametrize("table", ["measurements", "campaigns"])
def test_a_partial_export_is_refused_naming_what_it_lacks(exported: Path, tmp_path: Path, table: str) -> None:
    paths = copy_export(exported, tmp_path / "partial")
    reseal(paths, lambda doc: doc["tables"].pop(table))
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert str(paths.provenance) in proc.stderr and f"lists no {table}" in proc.stderr and "partial" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_campaign_rows_missing_from_the_file_are_refused(exported: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    paths = copy_export(exported, tmp_path / "lost")
    data = pq.read_table(paths.table("campaigns"))
    pq.write_table(data.slice(0, data.num_rows - 1), paths.table("campaigns"))
    lost = data.column("campaign").to_pylist()[-1]
    reseal(paths, lambda doc: doc["tables"]["campaigns"].update(rows=data.num_rows - 1))
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert lost in proc.stderr and "no row in campaigns.parquet" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_a_schema_version_that_is_text_is_named_as_such(exported: Path, tmp_path: Path) -> None:
    paths = copy_export(exported, tmp_path / "text")
    reseal(paths, lambda doc: doc.update(schema_version=str(doc["schema_version"])))
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert "schema_version '" in proc.stderr and "not a number" in proc.stderr and "newer sbench" not in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_a_symbolic_link_in_an_export_is_refused_even_with_matching_bytes(exported: Path, tmp_path: Path) -> None:
    paths = copy_export(exported, tmp_path / "linked")
    target = paths.table("runs")
    moved = tmp_path / "elsewhere.parquet"
    shutil.move(target, moved)
    target.symlink_to(moved)
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert str(target) in proc.stderr and "symbolic link" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_a_full_import_completes_what_a_partial_one_left(exported: Path, trained: Trained, tmp_path: Path) -> None:
    """A store into which an older sbench imported a partial export (runs without their measurements, or without
    their campaign row): importing the full export again repairs it to exactly what a fresh import writes."""
    fresh = tmp_path / "fresh.duckdb"
    sbench("import", exported, "--db", fresh)
    whole = table_contents(fresh, TABLES)
    damaged = tmp_path / "damaged.duckdb"
    shutil.copy(fresh, damaged)
    first, second = sorted(r["campaign"] for r in sql_rows(fresh, "SELECT campaign FROM campaigns"))
    con = duckdb.connect(str(damaged))
    # the state an older import of a partial export left: measurements gone and no record of the tables it had ...
    con.execute("DELETE FROM measurements WHERE campaign = ?", [first])
    con.execute("UPDATE campaigns SET imported = json_object('sha256', json_extract_string(imported, '$.sha256')) "
                "WHERE campaign = ?", [first])
    # ... or the campaign row itself gone
    con.execute("DELETE FROM campaigns WHERE campaign = ?", [second])
    con.close()
    assert first.startswith(f"{CLUSTER}/") and second.startswith(f"{CLUSTER}/")
    out = json.loads(sbench("import", exported, "--db", damaged, "--json").stdout)
    assert out["campaigns"] == {first: "repaired", second: "repaired"}
    assert _without_times(table_contents(damaged, TABLES)) == _without_times(whole)
    again = json.loads(sbench("import", exported, "--db", damaged, "--json").stdout)
    assert set(again["campaigns"].values()) == {"unchanged"}


def _without_times(tables: dict[str, list[str]]) -> dict[str, list[str]]:
    """The tables with the import's own time (campaigns.imported's imported_at) left out."""
    return {**tables, "campaigns": sorted(re.sub(r'"imported_at": ?"[^"]*"', "", row) for row in tables["campaigns"])}


def test_the_export_paths_name_one_file_per_table() -> None:
    assert ExportPaths(Path("/x")).table("runs").name == "runs.parquet"
