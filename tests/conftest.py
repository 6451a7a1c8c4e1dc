"""Fixtures and hooks only (pytest_* functions, @pytest.fixture); what they and the tests share lives in tests/kit.
Tests read like the README: real CLI, real files, real cluster."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .kit import CLUSTER_SCRIPT, SMALL_DATASET, TEST_INVENTORY, Trained, build_trained, sbench
from .kit.lake import PgServer, start_server
from .kit.session import built_once, cluster_ok, cost, module_group

try:
    from . import schedule
except ImportError:  # no pytest-xdist: the suite runs in one process, in the order collected
    schedule = None  # type: ignore[assignment]

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


@pytest.fixture
def cli():
    """``sbench`` in-process (:func:`tests.kit.cli.sbench` with ``in_process=True``): returns click's Result; the
    test asserts the exit code."""
    return functools.partial(sbench, in_process=True, ok=None)


@pytest.fixture(scope="module")
def cli_module():
    """The same, for module-scoped fixtures."""
    return functools.partial(sbench, in_process=True, ok=None)


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Path]:
    """A test's own corner: where its inventory, sweep, model dir, work dir, database and rendered output go.
    A test file whose tests want more in it (files written, runs made) extends this fixture by the same name."""
    (tmp_path / "model").mkdir()
    return {"root": tmp_path, "inv": tmp_path / "inv.yaml", "sweep": tmp_path / "sweep.yaml",
            "config": tmp_path / "model" / "config.json", "workdir": tmp_path / "runs",
            "db": tmp_path / "results.duckdb", "out": tmp_path / "out"}


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A directory whose name has spaces, quotes and a dollar sign: quoting bugs show up here."""
    p = tmp_path / "we ird 'q' \"dq\" $HOME `x`"
    p.mkdir()
    return p


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, str]:
    """The project's real test cluster (slurmctld, two slurmd in namespaces, slurmdbd).

    Started by ``make test`` before pytest; started here if it is not up. Set
    SBENCH_SKIP_SLURM=1 to skip cluster tests on a machine that cannot run it.
    """
    if os.environ.get("SBENCH_SKIP_SLURM") == "1":
        pytest.skip("SBENCH_SKIP_SLURM=1")
    if not cluster_ok():
        proc = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True)
        if proc.returncode != 0 or not cluster_ok():
            pytest.fail(f"test SLURM cluster is not running and could not be started:\n{proc.stdout}\n{proc.stderr}")
    return {"inventory": str(TEST_INVENTORY), "partition_cpu": "cpu", "partition_gpu": "gpu"}


@pytest.fixture(scope="session")
def pg_server() -> PgServer:
    """The project's real test Postgres (tests/pg/pg.sh), which holds the shared stores' catalogs: started by
    ``make test`` before pytest, started here if it is not up. Its client files (PGPASSFILE, PGSERVICEFILE) go
    into this process's environment, so the commands a test starts find the passwords where libpq looks."""
    try:
        server = start_server()
    except RuntimeError as exc:
        pytest.fail(f"the test Postgres is not running and could not be started: {exc}")
    os.environ.update(server.env)
    return server


@pytest.fixture
def lake(pg_server: PgServer, tmp_path: Path) -> tuple[str, Path]:
    """A new, empty shared store: its --db text (ducklake:postgres:..., the writer role) and data directory."""
    return pg_server.new_lake(tmp_path / "lake-data")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a locally trained tokenizer (no download)."""
    from harness.data.tinymodel import make_tiny_model

    return built_once(tmp_path_factory, "models", lambda d: make_tiny_model(d / "tiny")) / "tiny"


@pytest.fixture(scope="session")
def tiny_vision(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaVA-NeXT (SigLIP and Llama) with its processor (no download)."""
    from harness.data.tinymodel import make_tiny_vision_model

    return built_once(tmp_path_factory, "vision-models", lambda d: make_tiny_vision_model(d / "tiny-vision")) \
        / "tiny-vision"


@pytest.fixture(scope="session")
def small_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose news-chars-512 file holds 64 generated entries and no sidecar.

    Without the sidecar the runner treats the file as external data and uses it as it is,
    so runs start in seconds instead of encoding 4096 entries.
    """
    from harness.data.datagen import generate_dataset

    def build(d: Path) -> None:
        (d / "gen").mkdir()
        src = d / "gen" / f"{SMALL_DATASET}.jsonl"
        generate_dataset(SMALL_DATASET, src, entries=64)
        (d / "data").mkdir()
        shutil.copy(src, d / "data" / f"{SMALL_DATASET}.jsonl")

    return built_once(tmp_path_factory, "small-data", build) / "data"


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, small_data_dir: Path) -> Trained:
    """The session's trained, collected campaigns (:class:`tests.kit.Trained`), made once for all workers:
    a test that only reads a collected campaign reads these instead of training its own. A developer rerunning a
    few tests may point SBENCH_TEST_TRAINED at a tree an earlier session built (tests/kit: build_trained)."""
    reuse = os.environ.get("SBENCH_TEST_TRAINED")
    if reuse:
        return Trained(Path(reuse))
    return Trained(built_once(tmp_path_factory, "trained", lambda d: build_trained(d, tiny_model, small_data_dir)))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark the users of an expensive module fixture with their module's group as each is collected."""
    if item.get_closest_marker("xdist_group") is None:
        group = module_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the costliest groups (and lone tests) first, so that the last worker to finish is not the one that
    drew a long test at the end; under xdist, tell the controller each test's group (``tests/schedule.py``)."""
    total: dict[str, float] = {}
    first: dict[str, int] = {}
    group_of: dict[str, str] = {}
    for k, item in enumerate(items):
        marked = item.get_closest_marker("xdist_group")
        key = group_of[item.nodeid] = str(marked.args[0]) if marked is not None and marked.args else item.nodeid
        total[key] = total.get(key, 0.0) + cost(item)
        first.setdefault(key, k)
    alone = {group_of[i.nodeid] for i in items if i.get_closest_marker("alone") is not None}
    # the tests that need the cluster to themselves first, while no other group uses it yet
    items.sort(key=lambda i: (group_of[i.nodeid] not in alone, -total[group_of[i.nodeid]], first[group_of[i.nodeid]]))
    if hasattr(config, "workerinput"):
        schedule.write_plan(items, group_of)


def pytest_configure(config: pytest.Config) -> None:
    if schedule is not None and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(schedule.Plugin(), "sbench-schedule")
        if not hasattr(config, "workerinput"):  # the controller: where the workers tell it what they collected
            os.environ[schedule.SCHEDULE_ENV] = tempfile.mkstemp(prefix="sbench-test-schedule-", suffix=".json")[1]
