"""Campaigns beyond one results database: ``sbench export``, ``sbench import DIR`` and ``sbench import --format
ado-csv``, with real DuckDB files and the real command line, and ``compare``'s list of what changed in the
recorded environments.

The campaigns are the session's trained ones (``nightly-1``, ``nightly-2`` of cluster ``secrets``): exported once
per module, imported into fresh databases. Hostile exports are made from that export by changing its bytes."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from harness.contract.exchange import PROVENANCE, SEAL_KEY, ExportPaths, seal, sha256_file, unseal
from harness.db.schema import SCHEMA_VERSION, UPGRADE_FROM
from harness.report import envdiff
from harness.runner.envcapture import container
from harness.spec.published import RENAMED, matches, parse_row

from .kit import TRAINED_CAMPAIGNS, Trained, sbench, sql_rows, table_contents, write_yaml
from .kit.secrets import NEVER

FIXTURES = Path(__file__).parent / "fixtures" / "published"
PUBLISHED = FIXTURES / "ado-small.csv"  # the published column names, made-up values
BAD_ROWS = FIXTURES / "ado-bad-rows.csv"
CLUSTER = "secrets"  # the trained campaigns' inventory's cluster: their namespace once exported
TABLES = ["campaigns", "points", "campaign_points", "runs", "measurements", "stages", "sample_files", "sample_rows",
          "environment", "checks", "fabric", "probes", "metadata"]


def _ns(name: str) -> str:
    return f"{CLUSTER}/{name}"


@pytest.fixture(scope="module")
def exported(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained campaigns exported once for the module (read, never changed: tests copy it)."""
    out = tmp_path_factory.mktemp("export") / "nightly"
    sbench("export", *TRAINED_CAMPAIGNS, "-o", out, "--db", trained.db)
    return out


def copy_export(src: Path, dst: Path) -> ExportPaths:
    shutil.copytree(src, dst)
    return ExportPaths(dst)


def reseal(paths: ExportPaths, change: Any) -> None:
    """Rewrite provenance.json as an exporter would have written it after *change* (its doc): every listed
    file's sha256 recomputed, the seal made again, so that only what *change* did differs."""
    doc = json.loads(paths.provenance.read_bytes())
    change(doc)
    for table, entry in doc["tables"].items():
        entry["sha256"] = sha256_file(paths.table(table))
    doc[SEAL_KEY] = "0" * 64
    paths.provenance.write_bytes(seal(json.dumps(doc, indent=1, sort_keys=True) + "\n"))


def nothing_written(db: Path, before: dict[str, list[tuple]] | None) -> None:
    if before is None:
        assert not db.exists(), f"{db} was created"
    else:
        assert table_contents(db, TABLES) == before


# -- export ----------------------------------------------------------------------------------------------------
@pytest.mark.train
def test_export_writes_parquet_and_a_sealed_provenance_the_same_bytes_every_time(trained: Trained, exported: Path,
                                                                                   tmp_path: Path) -> None:
    again = tmp_path / "again"
    proc = sbench("export", *TRAINED_CAMPAIGNS, "-o", again, "--db", trained.db)
    assert f"campaigns become {CLUSTER}/NAME" in proc.stdout
    names = sorted(p.name for p in exported.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:  # deterministic: byte-identical
        assert (exported / name).read_bytes() == (again / name).read_bytes(), name
    for table in ("runs", "measurements", "stages", "sample_rows", "environment", "checks", "points"):
        assert f"{table}.parquet" in names
    raw = (exported / PROVENANCE).read_bytes()
    assert unseal(raw) is None
    doc = json.loads(raw)
    assert doc["schema_version"] == SCHEMA_VERSION and doc["cluster"] == CLUSTER and doc["sbench_version"]
    for table, entry in doc["tables"].items():  # every file's sha256, and its row count
        assert entry["sha256"] == sha256_file(exported / entry["file"]), table
    runs = sql_rows(trained.db, "SELECT campaign, count(*) AS n FROM runs GROUP BY campaign")
    assert doc["tables"]["runs"]["rows"] == sum(r["n"] for r in runs)
    camps = {c["campaign"]: c for c in doc["campaigns"]}
    assert set(camps) == set(TRAINED_CAMPAIGNS)
    for c in camps.values():
        assert c["cluster"] == CLUSTER and c["partitions"] and c["sweep"] and c["first_submitted"] and c["last_ended"]
    # the inventory's secrets never leave: not in provenance.json, not in any Parquet file's bytes
    for p in exported.iterdir():
        data = p.read_bytes()
        assert not [s for s in NEVER if s.encode() in data], p.name


@pytest.mark.train
def test_export_refuses_an_unknown_campaign_and_a_used_directory(trained: Trained, exported: Path,
                                                                 tmp_path: Path) -> None:
    proc = sbench("export", "nightly-404", "-o", tmp_path / "x", "--db", trained.db, ok=(2,))
    assert "nightly-404" in proc.stderr and "nightly-1" in proc.stderr
    assert not (tmp_path / "x").exists()
    proc = sbench("export", "nightly-1", "-o", exported, "--db", trained.db, ok=(2,))
    assert "not an empty directory" in proc.stderr


# -- import ----------------------------------------------------------------------------------------------------
@pytest.mark.train
def test_import_keeps_every_row_under_the_cluster_namespace_and_a_second_import_changes_nothing(
        trained: Trained, exported: Path, tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    first = sbench("import", exported, "--db", db)
    assert f"{_ns('nightly-1')}  imported" in first.stdout
    for camp in TRAINED_CAMPAIGNS:
        here = trained.campaign(camp).measurements()
        there = sql_rows(db, "SELECT * FROM measurements WHERE campaign = ? ORDER BY run_id", [_ns(camp)])
        assert here and len(here) == len(there)
        for a, b in zip(here, there, strict=True):
            assert b["campaign"] == _ns(a["campaign"]) and b["run_id"] == _ns(a["run_id"])
            assert {k: v for k, v in b.items() if k not in ("campaign", "run_id")} == \
                   {k: v for k, v in a.items() if k not in ("campaign", "run_id")}
        for table in ("stages", "environment", "sample_files"):
            n_here = sql_rows(trained.db, f"SELECT count(*) AS n FROM {table} WHERE run_id LIKE ?", [f"{camp}/%"])
            n_there = sql_rows(db, f"SELECT count(*) AS n FROM {table} WHERE run_id LIKE ?", [f"{_ns(camp)}/%"])
            assert n_here == n_there and n_here[0]["n"] > 0, table
    samples = "SELECT count(*) AS n FROM sample_rows"  # every sample of the campaigns, under their new file ids
    assert sql_rows(db, samples) == sql_rows(trained.db, samples)
    marked = sql_rows(db, "SELECT campaign, origin, cluster, imported FROM campaigns ORDER BY campaign")
    assert [(r["campaign"], r["origin"], r["cluster"]) for r in marked] == \
           [(_ns(c), "export", CLUSTER) for c in sorted(TRAINED_CAMPAIGNS)]
    assert all(json.loads(r["imported"])["source"] == str(exported.resolve()) for r in marked)
    before = table_contents(db, TABLES)
    second = sbench("import", exported, "--db", db)
    assert "nothing written" in second.stdout and f"{_ns('nightly-2')}  unchanged" in second.stdout
    assert table_contents(db, TABLES) == before


@pytest.mark.train
def test_compare_of_imported_campaigns_says_what_it_says_where_they_were_measured(trained: Trained, exported: Path,
                                                                                 tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    sbench("import", exported, "--db", db)
    here = sbench("compare", *TRAINED_CAMPAIGNS, "--db", trained.db)
    there = sbench("compare", *map(_ns, TRAINED_CAMPAIGNS), "--db", db)
    assert there.stdout == here.stdout and there.stderr == here.stderr
    j_here = json.loads(sbench("compare", *TRAINED_CAMPAIGNS, "--db", trained.db, "--json").stdout)
    j_there = json.loads(sbench("compare", *map(_ns, TRAINED_CAMPAIGNS), "--db", db, "--json").stdout)
    assert j_there["rows"] == j_here["rows"] and len(j_here["rows"]) == 2
    # an imported campaign against one of this database: the same points, paired by id
    both = tmp_path / "both.duckdb"
    shutil.copy(trained.db, both)
    sbench("import", exported, "--db", both)
    mixed = json.loads(sbench("compare", "nightly-1", _ns("nightly-2"), "--db", both, "--json").stdout)
    assert mixed["rows"] == j_here["rows"]


@pytest.mark.train
def test_two_clusters_campaigns_of_the_same_name_do_not_collide(trained: Trained, exported: Path,
                                                                tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    sbench("import", exported, "--db", db)
    sbench("import", exported, "--db", db, "--as", "other-cluster")
    camps = [r["campaign"] for r in sql_rows(db, "SELECT campaign FROM campaigns ORDER BY campaign")]
    assert camps == sorted([*map(_ns, TRAINED_CAMPAIGNS), *(f"other-cluster/{c}" for c in TRAINED_CAMPAIGNS)])
    n = sql_rows(db, "SELECT count(DISTINCT run_id) AS n, count(*) AS rows FROM measurements")[0]
    assert n["n"] == n["rows"] == 2 * len(sql_rows(trained.db, "SELECT run_id FROM measurements"))


@pytest.mark.train
def test_imported_campaigns_are_read_but_never_acted_on(trained: Trained, exported: Path, tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    sbench("import", exported, "--db", db)
    before = table_contents(db, TABLES)
    name = _ns("nightly-1")
    for args in (("status", "--campaign", name), ("retry", name), ("cancel", "--campaign", name)):
        proc = sbench(*args, "--db", db, ok=(2,))
        assert "imported from another database" in proc.stderr, args
    assert table_contents(db, TABLES) == before
    q = json.loads(sbench("query", f"SELECT count(*) AS n FROM measurements WHERE campaign = '{name}'", "--db", db,
                          "--format", "json").stdout)
    assert q[0]["n"] == len(sql_rows(trained.db, "SELECT 1 FROM measurements WHERE campaign = 'nightly-1'"))
    html = tmp_path / "r.html"
    sbench("report", "--db", db, "--campaign", name, "-o", html)
    assert name in html.read_text()


# -- hostile exports: refused, the file named, nothing written ---------------------------------------------------
@pytest.mark.train
def test_an_export_with_one_byte_altered_is_refused_naming_the_file(exported: Path, tmp_path: Path) -> None:
    paths = copy_export(exported, tmp_path / "altered")
    target = paths.table("measurements")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert str(target) in proc.stderr and "sha256" in proc.stderr and "nothing was imported" in proc.stderr
    nothing_written(db, None)
    # into a database that holds campaigns already: it stays as it was
    good = tmp_path / "good.duckdb"
    sbench("import", exported, "--db", good, "--as", "elsewhere")
    before = table_contents(good, TABLES)
    sbench("import", paths.root, "--db", good, ok=(2,))
    nothing_written(good, before)


@pytest.mark.train
def test_an_altered_provenance_is_refused(exported: Path, tmp_path: Path) -> None:
    paths = copy_export(exported, tmp_path / "altered")
    text = paths.provenance.read_text()
    paths.provenance.write_text(text.replace(f'"cluster": "{CLUSTER}"', '"cluster": "secretz"', 1))
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert str(paths.provenance) in proc.stderr and "does not match its bytes" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_a_truncated_parquet_file_is_refused_even_with_matching_digests(exported: Path, tmp_path: Path) -> None:
    paths = copy_export(exported, tmp_path / "cut")
    target = paths.table("stages")
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))  # the listed sha256 no longer holds
    assert str(target) in proc.stderr and "sha256" in proc.stderr
    reseal(paths, lambda doc: None)  # digests that match the cut file: the Parquet reader refuses it
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert str(target) in proc.stderr and "not a Parquet file" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_a_missing_file_is_refused(exported: Path, tmp_path: Path) -> None:
    paths = copy_export(exported, tmp_path / "gone")
    paths.table("runs").unlink()
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert str(paths.table("runs")) in proc.stderr and "missing" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_an_export_of_a_newer_schema_is_refused_naming_the_version(exported: Path, tmp_path: Path) -> None:
    paths = copy_export(exported, tmp_path / "newer")
    reseal(paths, lambda doc: doc.update(schema_version=SCHEMA_VERSION + 1))
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert f"results schema {SCHEMA_VERSION + 1}" in proc.stderr and "newer sbench" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_an_export_of_an_older_schema_is_upgraded(exported: Path, tmp_path: Path) -> None:
    """An export as the previous schema wrote it (without the columns this one added): imported, those NULL."""
    import pyarrow.parquet as pq

    paths = copy_export(exported, tmp_path / "older")
    added = {"campaigns": ["cluster", "partitions", "origin", "imported"], "measurements": ["extra"],
             "environment": ["container_runtime", "container_image", "container_digest"]}
    for table, cols in added.items():
        data = pq.read_table(paths.table(table))
        pq.write_table(data.drop_columns([c for c in cols if c in data.column_names]), paths.table(table))
    reseal(paths, lambda doc: doc.update(schema_version=UPGRADE_FROM))
    db = tmp_path / "fresh.duckdb"
    sbench("import", paths.root, "--db", db)
    rows = sql_rows(db, "SELECT run_id, extra FROM measurements ORDER BY run_id")
    assert len(rows) == 4 and all(r["extra"] is None and r["run_id"].startswith(f"{CLUSTER}/") for r in rows)
    assert {r["origin"] for r in sql_rows(db, "SELECT origin FROM campaigns")} == {"export"}


@pytest.mark.train
def test_an_export_with_a_column_this_schema_lacks_is_refused(exported: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = copy_export(exported, tmp_path / "foreign")
    data = pq.read_table(paths.table("runs"))
    pq.write_table(data.append_column("colour", pa.array(["teal"] * data.num_rows)), paths.table("runs"))
    reseal(paths, lambda doc: None)
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", paths.root, "--db", db, ok=(2,))
    assert str(paths.table("runs")) in proc.stderr and "colour" in proc.stderr
    nothing_written(db, None)


def test_not_an_export(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    db = tmp_path / "fresh.duckdb"
    proc = sbench("import", tmp_path / "empty", "--db", db, ok=(2,))
    assert PROVENANCE in proc.stderr
    nothing_written(db, None)


# -- the reference's published measurements ---------------------------------------------------------------------
def _published_rows() -> list[dict[str, str]]:
    import csv

    with PUBLISHED.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_published_csv_imports_as_a_campaign_of_one_measurement_per_row(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    proc = sbench("import", "--format", "ado-csv", PUBLISHED, "--campaign", "ado-published", "--db", db)
    rows = _published_rows()
    assert f"{len(rows)} of {len(rows)} row(s)" in proc.stdout
    camp = sql_rows(db, "SELECT origin, imported FROM campaigns WHERE campaign = 'ado-published'")
    assert camp[0]["origin"] == "ado-csv" and json.loads(camp[0]["imported"])["sha256"] == sha256_file(PUBLISHED)
    got = sql_rows(db, "SELECT * FROM measurements WHERE campaign = 'ado-published' ORDER BY run_id")
    assert len(got) == len(rows)
    by_id = {json.loads(m["extra"])["identifier"]: m for m in got}
    assert set(by_id) == {r["identifier"] for r in rows}
    for r in rows:  # the mapping: method -> experiment, tokens_per_sample -> model_max_length, the rest by name
        m = by_id[r["identifier"]]
        assert m["experiment"] == f"finetune_{r['method']}_benchmark-v1.0.0"
        assert m[RENAMED["tokens_per_sample"]] == int(r["tokens_per_sample"])
        assert (m["model_name"], m["gpu_model"], m["number_gpus"], m["batch_size"]) == \
               (r["model_name"], r["gpu_model"], int(r["number_gpus"]), int(r["batch_size"]))
        assert m["is_valid"] == (r["is_valid"] == "True")
        if r["dataset_tokens_per_second"]:
            assert m["dataset_tokens_per_second"] == float(r["dataset_tokens_per_second"])
            assert m["train_runtime"] == float(r["train_runtime"])
        else:
            assert m["dataset_tokens_per_second"] is None
        extra = json.loads(m["extra"])  # columns sbench has none for: kept, as the file has them
        if r["model_load_time"]:
            assert extra["model_load_time"] == float(r["model_load_time"])
    # importing the same file again changes nothing
    before = table_contents(db, TABLES)
    again = sbench("import", "--format", "ado-csv", PUBLISHED, "--campaign", "ado-published", "--db", db)
    assert "unchanged" in again.stdout
    assert table_contents(db, TABLES) == before
    # marked: status, retry and cancel never act on it
    for args in (("status", "--campaign", "ado-published"), ("retry", "ado-published"),
                 ("cancel", "--campaign", "ado-published")):
        proc = sbench(*args, "--db", db, "--workdir", tmp_path / "runs", ok=(2,))
        assert "an imported campaign (ado-csv" in proc.stderr, args
    assert table_contents(db, TABLES) == before
    # another file under the name: refused without --replace
    other = tmp_path / "other.csv"
    other.write_text(PUBLISHED.read_text().replace("4000.0", "4100.0"))
    proc = sbench("import", "--format", "ado-csv", other, "--campaign", "ado-published", "--db", db, ok=(2,))
    assert "--replace" in proc.stderr
    assert table_contents(db, TABLES) == before


def test_rows_that_do_not_parse_are_counted_and_listed_not_guessed(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    proc = sbench("import", "--format", "ado-csv", BAD_ROWS, "--campaign", "bad-rows", "--db", db, "--json")
    rep = json.loads(proc.stdout)
    assert rep["rows"] == 5 and rep["imported"] == 1
    assert [s["line"] for s in rep["skipped"]] == [3, 4, 5, 6]
    reasons = " | ".join(s["reason"] for s in rep["skipped"])
    for word in ("sideways", "'two'", "'maybe'", "'fast'"):
        assert word in reasons
    (m,) = sql_rows(db, "SELECT extra FROM measurements WHERE campaign = 'bad-rows'")
    assert json.loads(m["extra"]) == {"favourite_colour": "teal"}
    meta = json.loads(sql_rows(db, "SELECT imported FROM campaigns")[0]["imported"])
    assert meta["skipped"] == 4 and len(meta["skipped_rows"]) == 4
    text = sbench("import", "--format", "ado-csv", BAD_ROWS, "--campaign", "bad-rows-2", "--db", db)
    assert "skipped 4 row(s)" in text.stderr and "line 4: number_gpus 'two' is not a number" in text.stderr


@pytest.mark.parametrize(("args", "said"), [
    (("--format", "ado-csv", PUBLISHED), "--campaign"),
    (("--format", "parquet", PUBLISHED, "--campaign", "x"), "--format"),
    (("--format", "ado-csv", PUBLISHED, "--campaign", "no spaces"), "--campaign"),
    (("--format", "ado-csv", FIXTURES, "--campaign", "x"), "directory"),
])
def test_bad_import_options_exit_2_and_write_nothing(tmp_path: Path, args: tuple[Any, ...], said: str) -> None:
    db = tmp_path / "r.duckdb"
    proc = sbench("import", *args, "--db", db, ok=(2,))
    assert said in proc.stderr
    nothing_written(db, None)


def test_a_csv_without_the_published_columns_is_refused(tmp_path: Path) -> None:
    csv_path = tmp_path / "no-method.csv"
    lines = PUBLISHED.read_text().splitlines()
    csv_path.write_text("\n".join(line.split(",", 2)[0] + "," + line.split(",", 2)[2] for line in lines) + "\n")
    db = tmp_path / "r.duckdb"
    proc = sbench("import", "--format", "ado-csv", csv_path, "--campaign", "x", "--db", db, ok=(2,))
    assert str(csv_path) in proc.stderr and "method" in proc.stderr
    nothing_written(db, None)
    every_row_bad = tmp_path / "all-bad.csv"
    every_row_bad.write_text(BAD_ROWS.read_text().splitlines()[0] + "\n" + BAD_ROWS.read_text().splitlines()[2] + "\n")
    proc = sbench("import", "--format", "ado-csv", every_row_bad, "--campaign", "x", "--db", db, ok=(2,))
    assert "no row parses" in proc.stderr and "sideways" in proc.stderr
    nothing_written(db, None)


@pytest.mark.train
def test_compare_against_published_measurements_pairs_on_entity_fields_and_says_single_measurement(
        trained: Trained, tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    shutil.copy(trained.db, db)
    sbench("import", "--format", "ado-csv", PUBLISHED, "--campaign", "ado-published", "--db", db)
    published = {int(r["batch_size"]): float(r["dataset_tokens_per_second"]) for r in _published_rows()
                 if r["model_name"] == "tiny"}
    local = {m["batch_size"]: (m["point_id"], m["dataset_tokens_per_second"]) for m in sql_rows(
        db, "SELECT point_id, batch_size, dataset_tokens_per_second FROM measurements WHERE campaign = 'nightly-1'")}
    out = json.loads(sbench("compare", "nightly-1", "ado-published", "--db", db, "--json").stdout)
    rows = {r["point_id"]: r for r in out["rows"] if r["metric"] == "dataset_tokens_per_second"}
    assert set(rows) == {pid for pid, _ in local.values()}  # the local point ids: paired on the entity fields
    for batch, (pid, value) in local.items():
        r = rows[pid]
        assert r["verdict"] == "single measurement" and r["matched"]
        assert r["ratio"] == pytest.approx(published[batch] / value, rel=1e-9)
    assert out["references"] == {"CAND": "ado-published"} and out["single_measurement"] == len(out["rows"])
    assert out["environment"]["note"]  # the published side recorded no environment: said, not a difference
    text = sbench("compare", "nightly-1", "ado-published", "--db", db)
    assert "single measurement" in text.stdout and "reference campaign" in text.stderr + text.stdout
    # exported (it names no cluster of its own: --cluster) and imported elsewhere, it stays a reference campaign
    proc = sbench("export", "ado-published", "-o", tmp_path / "x", "--db", db, ok=(2,))
    assert "--cluster" in proc.stderr
    sbench("export", "ado-published", "-o", tmp_path / "x", "--db", db, "--cluster", "reference")
    other = tmp_path / "other.duckdb"
    shutil.copy(trained.db, other)
    sbench("import", tmp_path / "x", "--db", other)
    moved = json.loads(sbench("compare", "nightly-1", "reference/ado-published", "--db", other, "--json").stdout)
    assert moved["rows"] == out["rows"] and moved["references"] == {"CAND": "reference/ado-published"}


@pytest.mark.train
def test_report_shows_the_points_across_clusters_with_the_reference_as_a_line(trained: Trained, exported: Path,
                                                                              tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    shutil.copy(trained.db, db)
    html = tmp_path / "r.html"
    sbench("report", "--db", db, "--campaign", "nightly-1", "-o", html)  # one cluster, no reference: no section
    assert 'id="clusters"' not in html.read_text()
    sbench("import", exported, "--db", db, "--as", "cluster-b")
    # the same points, as if measured on a second cluster (this export is this cluster's own): a section
    con = duckdb.connect(str(db))
    con.execute("UPDATE campaigns SET cluster = 'cluster-b' WHERE starts_with(campaign, 'cluster-b/')")
    con.close()
    sbench("report", "--db", db, "--campaign", "nightly-1", "-o", html)
    assert "cluster-b/nightly-1" in html.read_text()[html.read_text().index('id="clusters"'):]
    sbench("import", "--format", "ado-csv", PUBLISHED, "--campaign", "ado-published", "--db", db)
    sbench("report", "--db", db, "--campaign", "nightly-1", "-o", html)
    page = html.read_text()
    assert 'id="clusters"' in page and "Across clusters" in page
    section = page[page.index('id="clusters"'):]
    assert "cluster-b/nightly-1" in section and "ado-published" in section and "reference line" in section


# -- check against a campaign's values, compare's environment differences (these change a copy) ------------------
@pytest.mark.train
@pytest.mark.slow(15)
def test_check_takes_its_reference_values_from_a_published_campaign(trained: Trained, tmp_path: Path) -> None:
    t = trained.copy(tmp_path / "t")
    sbench("collect", *t.common)
    doc = yaml.safe_load(t.sweep.read_text())
    doc["references"] = {"from_campaign": "ado-published", "dataset_tokens_per_second": {"lower": 0.10}}
    write_yaml(t.sweep, doc)
    # the same points again: nothing is resubmitted, the campaign records its references
    proc = sbench("submit", t.sweep, "--campaign", "nightly-1", *t.local)
    assert "0 attempt(s) submitted" in proc.stdout
    sbench("import", "--format", "ado-csv", PUBLISHED, "--campaign", "ado-published", "--db", t.db)
    out = json.loads(sbench("check", "nightly-1", "--db", t.db, "--json", ok=(0, 1)).stdout)
    published = {int(r["batch_size"]): float(r["dataset_tokens_per_second"]) for r in _published_rows()
                 if r["model_name"] == "tiny"}
    checks = sql_rows(t.db, "SELECT c.*, m.batch_size, m.dataset_tokens_per_second AS measured FROM checks c "
                            "JOIN measurements m USING (run_id) WHERE c.campaign = 'nightly-1'")
    assert len(checks) == 2, out
    for c in checks:
        assert c["reference"] == published[c["batch_size"]]
        assert c["status"] == ("pass" if c["measured"] >= 0.9 * published[c["batch_size"]] else "fail")


@pytest.mark.train
@pytest.mark.slow(15)
def test_compare_names_what_changed_in_the_recorded_environments(trained: Trained, tmp_path: Path) -> None:
    """nightly-2's nodes as if they had another transformers, another OMP_NUM_THREADS and an NCCL: their
    recorded environment files say so, collect reads them, compare names each change, beside each point too."""
    t = trained.copy(tmp_path / "t")
    changed = 0
    for env_file in sorted((t.workdir / "nightly-2").glob("*/environment.*.json")):
        doc = json.loads(env_file.read_text())
        doc["packages"]["transformers"] = "9.9.9"
        doc["env"]["OMP_NUM_THREADS"] = "7"
        doc["provenance"]["nccl"] = "2.99.1"
        env_file.write_text(json.dumps(doc))
        changed += 1
    assert changed == 2
    sbench("collect", *t.common)
    old = {r["transformers"] for r in sql_rows(t.db, "SELECT e.transformers FROM environment e JOIN runs USING "
                                                     "(run_id) WHERE campaign = 'nightly-1'")}
    (old_tf,) = old
    out = json.loads(sbench("compare", *TRAINED_CAMPAIGNS, "--db", t.db, "--json").stdout)
    changes = {(c["kind"], c["name"]): (c["base"], c["cand"]) for c in out["environment"]["changes"]}
    assert changes[("package", "transformers")] == ([old_tf], ["9.9.9"])
    assert changes[("env", "OMP_NUM_THREADS")] == (["1"], ["7"])
    assert changes[("driver", "NCCL")] == ([], ["2.99.1"])
    for row in out["rows"]:  # each point's own changes beside its verdict
        assert {c["name"] for c in row["changes"]} >= {"transformers", "OMP_NUM_THREADS", "NCCL"}
    text = sbench("compare", *TRAINED_CAMPAIGNS, "--db", t.db)
    said = text.stdout + text.stderr
    assert f"transformers {old_tf} -> 9.9.9" in said and "OMP_NUM_THREADS 1 -> 7" in said
    html = tmp_path / "r.html"
    sbench("report", "--db", t.db, "--compare", *TRAINED_CAMPAIGNS, "-o", html)
    page = html.read_text()
    assert "What changed under the numbers" in page and "OMP_NUM_THREADS" in page and "9.9.9" in page
    # before the change: the same environments, nothing named
    same = json.loads(sbench("compare", *TRAINED_CAMPAIGNS, "--db", trained.db, "--json").stdout)
    assert same["environment"]["changes"] == []


# -- the container a run ran in, recorded with its environment -------------------------------------------------
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("asked", "environ", "podman", "want"), [
    (f"nvcr.io#nvidia/pytorch:24.05-py3@{DIGEST}", {}, None,
     {"runtime": "pyxis", "image": f"nvcr.io#nvidia/pytorch:24.05-py3@{DIGEST}", "digest": DIGEST}),
    (None, {"APPTAINER_CONTAINER": "/shared/images/train.sif"}, None,
     {"runtime": "apptainer", "image": "/shared/images/train.sif", "digest": None}),
    (None, {}, 'engine="podman-4.9"\nimage="quay.io/x/train:1"\nimageid="0123abcd"\n',
     {"runtime": "podman", "image": "quay.io/x/train:1", "digest": "0123abcd"}),
    (None, {}, None, {"runtime": None, "image": None, "digest": None}),
])
def test_the_container_is_recorded_from_pyxis_apptainer_or_podman(tmp_path: Path, asked: str | None,
                                                                  environ: dict[str, str], podman: str | None,
                                                                  want: dict[str, Any]) -> None:
    containerenv = tmp_path / ".containerenv"
    if podman is not None:
        containerenv.write_text(podman)
    assert container(asked, environ, containerenv, tmp_path / "no-dockerenv") == want


@pytest.mark.train
def test_a_campaign_recorded_without_its_cluster_is_exported_under_cluster(trained: Trained, tmp_path: Path) -> None:
    """A database upgraded from the schema before clusters were recorded holds campaigns with no cluster: the
    export asks for --cluster, and with it the campaigns import under that namespace."""
    import duckdb

    db = tmp_path / "old.duckdb"
    shutil.copy(trained.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE campaigns SET cluster = NULL")
    proc = sbench("export", "nightly-1", "-o", tmp_path / "x", "--db", db, ok=(2,))
    assert "nightly-1" in proc.stderr and "--cluster" in proc.stderr
    assert not (tmp_path / "x").exists()
    proc = sbench("export", "nightly-1", "-o", tmp_path / "x", "--db", db, "--cluster", "vela", ok=(0,))
    assert json.loads((tmp_path / "x" / PROVENANCE).read_text())["cluster"] == "vela"
    fresh = tmp_path / "fresh.duckdb"
    sbench("import", tmp_path / "x", "--db", fresh)
    assert [r["campaign"] for r in sql_rows(fresh, "SELECT campaign FROM campaigns")] == ["vela/nightly-1"]


def test_a_published_row_pairs_on_the_fields_it_gives() -> None:
    """Every field the row gives must equal the point's; the reference trainer's release only where the point ran
    that trainer (sbench's own carries the field's default and runs no release of it)."""
    row = parse_row(2, {"method": "full", "model_name": "tiny", "number_gpus": "1", "gpu_model": "cpu",
                        "tokens_per_sample": "256", "batch_size": "4", "fms_hf_tuning_version": "2.0.1",
                        "is_valid": "True", "dataset_tokens_per_second": "10.5"})
    given = {**row.entity, "experiment": row.experiment}
    point = {"experiment": row.experiment, "model_name": "tiny", "number_gpus": 1, "gpu_model": "cpu",
             "model_max_length": 256, "batch_size": 4, "fms_hf_tuning_version": "2.1.2", "dataset_id": "any"}
    assert matches(given, {**point, "trainer": "sbench"})
    assert not matches(given, {**point, "trainer": "fms-hf-tuning"})
    assert matches(given, {**point, "trainer": "fms-hf-tuning", "fms_hf_tuning_version": "2.0.1"})
    assert not matches(given, {**point, "trainer": "sbench", "batch_size": 2})
    assert not matches(given, {**point, "trainer": "sbench", "experiment": "finetune_lora_benchmark-v1.0.0"})


@pytest.mark.train
@pytest.mark.slow(60)
def test_a_variable_the_cluster_sets_is_recorded_and_compare_names_it(trained: Trained, tmp_path: Path) -> None:
    """The inventory of a copy sets OMP_NUM_THREADS; a campaign submitted with it records the value its nodes
    ran with, and compare against the campaign that ran without it names the variable and both values."""
    t = trained.copy(tmp_path / "t")
    sbench("collect", *t.common)
    inv = yaml.safe_load(t.inventory.read_text())
    inv.setdefault("defaults", {}).setdefault("env", {})["OMP_NUM_THREADS"] = "2"
    write_yaml(t.inventory, inv)
    sbench("submit", t.sweep, "--campaign", "nightly-3", "--wait", *t.local)
    sbench("collect", *t.common)
    ran = {json.loads(r["env"])["OMP_NUM_THREADS"] for r in sql_rows(
        t.db, "SELECT env FROM environment JOIN runs USING (run_id) WHERE campaign = 'nightly-3'")}
    assert ran == {"2"}
    before = {json.loads(r["env"])["OMP_NUM_THREADS"] for r in sql_rows(
        t.db, "SELECT env FROM environment JOIN runs USING (run_id) WHERE campaign = 'nightly-1'")}
    (old,) = before
    out = json.loads(sbench("compare", "nightly-1", "nightly-3", "--db", t.db, "--json", ok=(0, 1)).stdout)
    changes = {(c["kind"], c["name"]): (c["base"], c["cand"]) for c in out["environment"]["changes"]}
    assert changes[("env", "OMP_NUM_THREADS")] == ([old], ["2"])
    text = sbench("compare", "nightly-1", "nightly-3", "--db", t.db, ok=(0, 1))
    assert f"OMP_NUM_THREADS {old} -> 2" in text.stdout



def test_envdiff_names_what_differs_and_not_what_names_the_attempt() -> None:
    """Packages (a column, or the packages JSON where the column is empty), drivers, variables, the container:
    named when they differ; the variables that name the attempt (its campaign, its port) never; a side with no
    recorded environment (published measurements) is said in a note, not counted as differences."""
    def run(rid: str, job_dir: str, **env_row: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return ({"run_id": rid, "effective_torch_dtype": "float32"},
                {"host": "n1", "job_dir": job_dir, "torch": "2.8.0", **env_row})

    b_m, b_env = run("a/p.r0.a1", "/w/a/p", packages=json.dumps({"transformers": "5.24.0", "peft": "0.17"}),
                     nccl="2.27.3", env=json.dumps({"OMP_NUM_THREADS": "1", "SBENCH_CAMPAIGN": "a",
                                                    "NCCL_TOPO_FILE": "/w/a/p/topo.xml"}))
    c_m, c_env = run("b/p.r0.a1", "/w/b/p", packages=json.dumps({"transformers": "5.25.0", "peft": "0.17"}),
                     nccl="2.28.1", container_runtime="pyxis", container_image="nvcr.io#x:1",
                     env=json.dumps({"OMP_NUM_THREADS": "4", "SBENCH_CAMPAIGN": "b",
                                     "NCCL_TOPO_FILE": "/w/b/p/topo.xml"}))
    base = envdiff.side([b_m], {"a/p.r0.a1": [b_env]})
    cand = envdiff.side([c_m], {"b/p.r0.a1": [c_env]})
    got = {(c.kind, c.name): (c.base, c.cand) for c in envdiff.diff(base, cand).changes}
    assert got == {("package", "transformers"): (["5.24.0"], ["5.25.0"]), ("driver", "NCCL"): (["2.27.3"], ["2.28.1"]),
                   ("env", "OMP_NUM_THREADS"): (["1"], ["4"]), ("container", "container runtime"): ([], ["pyxis"]),
                   ("container", "container image"): ([], ["nvcr.io#x:1"])}
    published = envdiff.side([{"run_id": "ref/x"}], {})
    one_sided = envdiff.diff(base, published)
    assert one_sided.changes == [] and one_sided.note and "CAND" in one_sided.note


# -- imports that cannot poison a store: refused (exit 2, the file and the fix named, nothing written), published
# rows skipped and listed; an import of the full export completes what a partial one left ----------------------
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
