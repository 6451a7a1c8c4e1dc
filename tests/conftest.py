"""Shared fixtures. Tests read like the README: real CLI, real files, real cluster."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from .helpers import ROOT, SMALL_DATASET, Trained, build_trained

try:
    from . import schedule
except ImportError:  # no pytest-xdist: the suite runs in one process, in the order collected
    schedule = None  # type: ignore[assignment]

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


# -- made once per session, whatever the number of xdist workers ----------------------------------------------
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of this whole test session: under xdist each worker's base temp is a child of it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``<session>/shared/<name>``, filled by *build* once for the session: the first worker to ask builds it
    under a lock, the others wait for it and use the same one. What is built here is read, never changed:
    a test that changes it copies it first (:func:`copy_of`)."""
    root = session_dir(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    target, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)  # what a worker that failed half-way left
            target.mkdir()
            build(target)
            done.touch()
    return target


def copy_of(src: Path, dst: Path) -> Path:
    """A private copy of a shared tree, links kept as links."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


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
    """The session's trained, collected campaigns (:class:`tests.helpers.Trained`), made once for all workers:
    a test that only reads a collected campaign reads these instead of training its own."""
    return Trained(built_once(tmp_path_factory, "trained", lambda d: build_trained(d, tiny_model, small_data_dir)))


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


# -- scheduling under xdist (make test: -n N --dist loadgroup) ---------------------------------------------------
# Module-scoped fixtures that cost nothing to make again on another worker: a test using only these goes to any
# free worker. A test that uses any other module-scoped fixture runs on the one worker that runs its module's
# other users of it, so that the fixture (a trained campaign, say) is made once.
CHEAP_MODULE_FIXTURES = frozenset({"cli", "cli_module", "inventory", "host", "sb"})


def _module_group(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name, defs in info.name2fixturedefs.items():
        if name not in CHEAP_MODULE_FIXTURES and any(d.scope == "module" for d in defs):
            return item.module.__name__.rsplit(".", 1)[-1]
    return None


def cost(item: pytest.Item) -> float:
    """About how many seconds *item* takes: ``slow(seconds)``'s figure, else a guess from its markers."""
    slow = item.get_closest_marker("slow")
    if slow is not None:
        return float(slow.args[0]) if slow.args else 30.0
    if item.get_closest_marker("slurm") is not None:
        return 8.0
    return 5.0 if item.get_closest_marker("train") is not None else 0.5


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark the users of an expensive module fixture with their module's group as each is collected."""
    if item.get_closest_marker("xdist_group") is None:
        group = _module_group(item)
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
