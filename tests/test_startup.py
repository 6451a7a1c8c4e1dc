"""Commands that answer at once: every read command, ``--help`` and a ``collect`` that finds nothing to do import
none of the libraries that only training, rendering, submitting, Parquet or a chart need (``tests/budget.py``:
:data:`~tests.budget.FORBIDDEN`). Each command runs as a user runs it, in a fresh interpreter, on the session's
collected campaigns; a breach names the module and the chain of sbench's frames that imported it. (How long each
command takes is measured by ``bench/startup.py``, not asserted here: this machine's load would decide that.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .budget import FORBIDDEN, run
from .conftest import sql_rows
from .helpers import Trained, invoke

pytestmark = pytest.mark.train  # reads the session's trained campaigns (trained once, shared)


@pytest.fixture(scope="module")
def copied(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """A collected copy of the session's two campaigns, for the commands that write (a no-op collect does)."""
    copy = trained.copy(tmp_path_factory.mktemp("startup") / "nightly")
    assert invoke("collect", *copy.common).exit_code == 0
    return copy


def _held(argv: list[str], ok: tuple[int, ...] = (0,)) -> str:
    """Run ``sbench ARGV`` watched; the budget must hold and the exit code be one of *ok*. Its stdout."""
    w = run(argv)
    assert w.returncode in ok, f"sbench {' '.join(w.argv)}: exit {w.returncode}\n{w.stdout}\n{w.stderr}"
    assert "Traceback" not in w.stderr, w.stderr
    assert not w.hits, w.broken()
    return w.stdout


def test_help_and_version_import_nothing_of_the_budget_and_list_every_command() -> None:
    out = _held(["--help"])
    listed = [line.split()[0] for line in out.split("Commands:", 1)[1].splitlines() if line.startswith("  ")
              and not line.startswith("   ")]
    assert listed == sorted(listed) and {"status", "collect", "query", "submit", "import"} <= set(listed)
    assert _held(["--version"]).startswith("sbench, version ")


@pytest.mark.parametrize("command", ["status", "query", "best", "hosts", "compare", "check", "profile", "collect"])
def test_a_read_commands_help_imports_nothing_of_the_budget(command: str) -> None:
    assert "Example:" in _held([command, "--help"])


def test_every_read_command_and_a_no_op_collect_import_nothing_of_the_budget(copied: Trained) -> None:
    db, wd = ["--db", str(copied.db)], ["--workdir", str(copied.workdir)]
    run_id = sql_rows(copied.db, "SELECT run_id FROM runs WHERE campaign = 'nightly-1' ORDER BY run_id")[0]["run_id"]
    assert "nightly-1" in _held(["status", "--campaign", "nightly-1", *wd, *db])
    _held(["status", *wd, *db, "--json"])
    assert json.loads(_held(["query", "SELECT count(*) AS n FROM runs", *db, "--format", "json"]))[0]["n"] == 4
    _held(["compare", "nightly-1", "nightly-2", *db, "--json"], ok=(0, 1))
    _held(["check", "nightly-1", *db, "--allow-missing"], ok=(0, 1, 2))  # 2: its sweep declares no references
    _held(["hosts", *db])
    assert "hosts" in json.loads(_held(["hosts", *db, "--json"]))
    _held(["profile", run_id, *db], ok=(0, 2))  # these runs were not profiled: an answer that says so
    _held(["best", "nightly-1", *db, *wd], ok=(0, 2))  # not a search: an answer that says so
    # a collect that finds nothing to do: nothing new, nothing sent, and no submit machinery loaded
    noop = json.loads(_held(["collect", *db, *wd, "--json"]))
    assert (noop["new"], noop["updated"], noop["more_repeats"]) == (0, 0, [])


def test_the_watch_names_the_module_and_the_chain_that_imported_it(tmp_path: Path) -> None:
    # the budget's detector, on a command that must import one: render draws its files with Jinja2
    w = run(["render", "sweeps/demo-cpu.yaml", "-o", str(tmp_path / "rendered")])
    assert w.returncode == 0, w.stderr
    assert set(w.hits) == {"jinja2"} and "jinja2" in FORBIDDEN
    chain = w.hits["jinja2"]
    assert chain[0].startswith("harness/cli/base.py:") and any("harness/cli/inputs.py:" in c for c in chain)
    assert chain[-1].startswith("harness/build/render.py:"), chain
    assert "imported jinja2, by:\n    harness/cli/base.py:" in w.broken()
