"""Shared fixtures. Tests read like the README: real CLI, real files, real cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CLUSTER_SCRIPT = ROOT / "tests" / "cluster" / "cluster.sh"
TEST_INVENTORY = FIXTURES / "inventory" / "testcluster.yaml"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The suite runs its tests side by side on one machine, so every run's host is busy with the others: a run is
# flagged host_busy only where a test asks for it (tests/test_host_load.py sets runner.host_busy_cpu itself).
os.environ.setdefault("SBENCH_HOST_BUSY_CPU", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite tests/golden/* from the current renderer instead of comparing.")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def _cli():
    from harness.cli import main

    runner = CliRunner()

    def run(*args: str, **kw):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)

    return run


@pytest.fixture
def cli():
    """Invoke ``sbench`` in-process; returns the click Result."""
    return _cli()


@pytest.fixture(scope="module")
def cli_module():
    """The same, for module-scoped fixtures."""
    return _cli()


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A directory whose name has spaces, quotes and a dollar sign: quoting bugs show up here."""
    p = tmp_path / "we ird 'q' \"dq\" $HOME `x`"
    p.mkdir()
    return p


def _cluster_ok() -> bool:
    if not CLUSTER_SCRIPT.exists() or shutil.which("sbatch") is None:
        return False
    return subprocess.run(["bash", str(CLUSTER_SCRIPT), "status"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, str]:
    """The project's real test cluster (slurmctld, two slurmd in namespaces, slurmdbd).

    Started by ``make test`` before pytest; started here if it is not up. Set
    SBENCH_SKIP_SLURM=1 to skip cluster tests on a machine that cannot run it.
    """
    if os.environ.get("SBENCH_SKIP_SLURM") == "1":
        pytest.skip("SBENCH_SKIP_SLURM=1")
    if not _cluster_ok():
        proc = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True)
        if proc.returncode != 0 or not _cluster_ok():
            pytest.fail(f"test SLURM cluster is not running and could not be started:\n{proc.stdout}\n{proc.stderr}")
    return {"inventory": str(TEST_INVENTORY), "partition_cpu": "cpu", "partition_gpu": "gpu"}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a locally trained tokenizer (no download)."""
    from harness.data.tinymodel import make_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    make_tiny_model(out)
    return out


SMALL_DATASET = "news-chars-512-entries-4096"


@pytest.fixture(scope="session")
def small_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose news-chars-512 file holds 64 generated entries and no sidecar.

    Without the sidecar the runner treats the file as external data and uses it as it is,
    so runs start in seconds instead of encoding 4096 entries.
    """
    from harness.data.datagen import generate_dataset

    src = tmp_path_factory.mktemp("gen") / f"{SMALL_DATASET}.jsonl"
    generate_dataset(SMALL_DATASET, src, entries=64)
    d = tmp_path_factory.mktemp("data")
    shutil.copy(src, d / f"{SMALL_DATASET}.jsonl")
    return d


def write_sweep(path: Path, doc: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def table_contents(db: Path, tables: list[str]) -> dict[str, list[tuple]]:
    """Every row of *tables*, sorted, for before/after comparisons."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in tables}
    finally:
        con.close()


def sql_rows(db: Path, query: str, params=None) -> list[dict]:
    """Rows of *query* against the results DB, as dicts (read-only)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(query, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()
