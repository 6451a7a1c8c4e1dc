"""What the test session itself uses (tests/conftest.py's fixtures and hooks): the trees it builds once for all
its xdist workers, whether the test SLURM cluster is up, and the order its tests run in."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from .paths import CLUSTER_SCRIPT


# -- made once per session, whatever the number of xdist workers ----------------------------------------------
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of this whole test session: under xdist each worker's base temp is a child of it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``<session>/shared/<name>``, filled by *build* once for the session: the first worker to ask builds it
    under a lock, the others wait for it and use the same one. What is built here is read, never changed: a test
    that changes it copies it first (:meth:`tests.kit.campaigns.Trained.copy`)."""
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


def cluster_ok() -> bool:
    """Whether the test SLURM cluster answers (tests/cluster/cluster.sh status)."""
    if not CLUSTER_SCRIPT.exists() or shutil.which("sbatch") is None:
        return False
    return subprocess.run(["bash", str(CLUSTER_SCRIPT), "status"], capture_output=True).returncode == 0


# -- scheduling under xdist (make test: -n N --dist loadgroup) ---------------------------------------------------
# Module-scoped fixtures that cost nothing to make again on another worker: a test using only these goes to any
# free worker. A test that uses any other module-scoped fixture runs on the one worker that runs its module's
# other users of it, so that the fixture (a trained campaign, say) is made once.
CHEAP_MODULE_FIXTURES = frozenset({"cli", "cli_module", "inventory", "host", "sb"})


def module_group(item: pytest.Item) -> str | None:
    """*item*'s module name where it uses an expensive module-scoped fixture (its tests then run together)."""
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
