"""Commands that answer at once: every read command, ``--help`` and a ``collect`` that finds nothing to do import
none of the libraries that only training, rendering, submitting, Parquet or a chart need (``tests/kit/budget.py``:
:data:`~tests.kit.budget.FORBIDDEN`). Each command runs as a user runs it, in a fresh interpreter, on the session's
collected campaigns; a breach names the module and the chain of sbench's frames that imported it. (How long each
command takes is measured by ``bench/startup.py``, not asserted here: this machine's load would decide that.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.contract.lazy import lazy_module

from .kit import Trained, sbench, sql_rows, write_yaml
from .kit.budget import FORBIDDEN, run

# What only a submission runs: planning, rendering, the executors' queues.
SUBMIT_PATH = ("harness.campaign.submit", "harness.build.render", "harness.campaign.executors.base",
               "harness.campaign.refresh")


@pytest.fixture(scope="module")
def copied(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """A collected copy of the session's two campaigns, for the commands that write (a no-op collect does)."""
    copy = trained.copy(tmp_path_factory.mktemp("startup") / "nightly")
    sbench("collect", *copy.common, in_process=True)
    return copy


def _held(argv: list[str], ok: tuple[int, ...] = (0,),
          not_ran: tuple[str, ...] = ()) -> str:
    """Run ``sbench ARGV`` watched; the budget must hold and the exit code be one of *ok*; the code of every
    module of *not_ran* must not have run. Its stdout."""
    w = run(argv, watch=not_ran)
    assert not w.executed, f"sbench {' '.join(w.argv)} ran {w.executed}"
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


@pytest.mark.parametrize("command", ["status", "query", "best", "hosts", "compare", "check", "profile", "scaling",
                                     "collect"])
def test_a_read_commands_help_imports_nothing_of_the_budget(command: str) -> None:
    assert "Example:" in _held([command, "--help"])


@pytest.mark.train  # reads the session's trained campaigns (trained once, shared)
def test_every_read_command_and_a_no_op_collect_import_nothing_of_the_budget(copied: Trained) -> None:
    db, wd = ["--db", str(copied.db)], ["--workdir", str(copied.workdir)]
    run_id = sql_rows(copied.db, "SELECT run_id FROM runs WHERE campaign = 'nightly-1' ORDER BY run_id")[0]["run_id"]
    assert "nightly-1" in _held(["status", "--campaign", "nightly-1", *wd, *db], not_ran=("harness.collect.ingest",))
    _held(["status", *wd, *db, "--json"])
    assert json.loads(_held(["query", "SELECT count(*) AS n FROM runs", *db, "--format", "json"]))[0]["n"] == 4
    _held(["compare", "nightly-1", "nightly-2", *db, "--json"], ok=(0, 1))
    _held(["check", "nightly-1", *db, "--allow-missing"], ok=(0, 1, 2))  # 2: its sweep declares no references
    _held(["hosts", *db])
    assert "hosts" in json.loads(_held(["hosts", *db, "--json"]))
    _held(["profile", run_id, *db], ok=(0, 2))  # these runs were not profiled: an answer that says so
    _held(["best", "nightly-1", *db, *wd], ok=(0, 2))  # not a search: an answer that says so
    assert json.loads(_held(["scaling", "nightly-1", *db, "--json"]))["rows"]
    # a collect that finds nothing to do: nothing new, nothing sent, and no submit machinery loaded
    noop = json.loads(_held(["collect", *db, *wd, "--json"], not_ran=SUBMIT_PATH))
    assert (noop["new"], noop["updated"], noop["more_repeats"]) == (0, 0, [])


def test_the_watch_names_the_module_and_the_chain_that_imported_it(tmp_path: Path) -> None:
    # the budget's detector, on a command that must import one: render draws its files with Jinja2
    sweep = write_yaml(tmp_path / "s.yaml", {"campaign": "w", "experiment": "finetune_lora_benchmark-v1.0.0",
                                             "entity": {"model_name": "smollm2-135m", "model_max_length": 256,
                                                        "number_gpus": 1},
                                             "grid": {"batch_size": [2]}})
    w = run(["render", str(sweep), "-o", str(tmp_path / "rendered")])
    assert w.returncode == 0, w.stderr
    assert set(w.hits) == {"jinja2"} and "jinja2" in FORBIDDEN
    chain = w.hits["jinja2"]
    assert chain[0].startswith("harness/cli/base.py:") and any("harness/cli/inputs.py:" in c for c in chain)
    assert chain[-1].startswith("harness/build/render.py:"), chain
    assert "imported jinja2, by:\n    harness/cli/base.py:" in w.broken()


def test_a_lazy_module_runs_its_code_at_the_first_read_and_is_the_module_every_import_gets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("import builtins\nbuiltins.lazy_ran = getattr(builtins, 'lazy_ran', 0) + 1\n"
                                  "VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    try:
        mod = lazy_module("lazypkg.heavy")
        assert getattr(builtins, "lazy_ran", 0) == 0 and sys.modules["lazypkg.heavy"] is mod
        from lazypkg import heavy  # an ordinary import elsewhere gets the same module, still not run

        assert heavy is mod and getattr(builtins, "lazy_ran", 0) == 0
        assert mod.VALUE == 42 and builtins.lazy_ran == 1  # the first read ran it, once
        assert heavy.VALUE == 42 and builtins.lazy_ran == 1 and lazy_module("lazypkg.heavy") is mod
        with pytest.raises(ImportError, match="no module named"):
            lazy_module("lazypkg.no_such_module")
    finally:
        for name in ("lazypkg.heavy", "lazypkg"):
            sys.modules.pop(name, None)
        if hasattr(builtins, "lazy_ran"):
            del builtins.lazy_ran
