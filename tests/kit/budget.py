"""The import budget of sbench's commands, and a fresh interpreter that shows who broke it.

A login-node command is run in loops and scripts; its start-up is Python's plus its imports. Every read command
(and a ``collect`` that finds nothing to do) imports none of :data:`FORBIDDEN`: the libraries that only training,
rendering, submitting, Parquet or a chart need. :func:`run` runs one ``sbench`` command line in a fresh
interpreter that watches the imports: for each forbidden module imported, it records the first import's chain,
the stack of sbench's own frames (module loads and function calls) that led to it, so a failure names the
module and the line of sbench that pulled it in.

Used by ``tests/test_startup.py`` (the budget, asserted) and ``bench/startup.py`` (the times, measured).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .paths import ROOT

# What a read command never imports (the top-level package names).
FORBIDDEN: tuple[str, ...] = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "jinja2",
                              "submitit", "vl_convert", "pyarrow")

# The child: a finder first on sys.meta_path sees every import before it happens; the first import of each
# forbidden package records the stack (the module loads and calls of the tree's harness package, file:line and the
# function, outermost first). The record is written when the interpreter exits, however the command ended.
_CHILD = r"""
import atexit, json, os, sys, traceback
_forbidden = set(sys.argv[1].split(","))
_watched = [m for m in os.environ.get("SBENCH_WATCH_MODULES", "").split(",") if m]
_out = sys.argv[2]
_root = os.path.realpath(sys.argv[3]) + os.sep
_own = os.path.join(_root, "harness") + os.sep
_hits = {}

class _Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _forbidden and top not in _hits:
            _hits[top] = [f"{os.path.relpath(f.filename, _root)}:{f.lineno} ({f.name})"
                          for f in traceback.extract_stack()[:-1]
                          if os.path.isabs(f.filename) and os.path.realpath(f.filename).startswith(_own)]
        return None

sys.meta_path.insert(0, _Watch())

def _dump():
    executed = [m for m in _watched if m in sys.modules and type(sys.modules[m]).__name__ != "_LazyModule"]
    with open(_out, "w") as fh:
        json.dump({"hits": _hits, "executed": executed}, fh)

atexit.register(_dump)
sys.argv = ["sbench", *sys.argv[4:]]
from harness.cli import main
main()
"""


@dataclass
class Watched:
    """One command's run: exit status, output, wall and CPU seconds (user + system, every thread), and the
    forbidden packages it imported, each with the chain that imported it first."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    hits: dict[str, list[str]] = field(default_factory=dict)
    executed: list[str] = field(default_factory=list)  # those of *watch* whose code ran (a lazy one not read: not)

    def broken(self) -> str:
        """The budget's breaches as text (empty when it holds): each module and the chain that imported it."""
        lines = []
        for mod, chain in sorted(self.hits.items()):
            lines.append(f"sbench {' '.join(self.argv)} imported {mod}, by:")
            lines += [f"    {c}" for c in chain] or ["    (no frame of this tree: the interpreter's start-up)"]
        return "\n".join(lines)


def run(argv: list[str], *, env: dict[str, str] | None = None, root: Path = ROOT, cwd: Path | None = None,
        forbidden: tuple[str, ...] = FORBIDDEN, watch: tuple[str, ...] = ()) -> Watched:
    """Run ``sbench ARGV`` in a fresh interpreter with *root*'s ``harness`` (another checkout's, to compare),
    watching its imports; *watch*: modules (of sbench's own) to say whether their code ran."""
    with tempfile.TemporaryDirectory(prefix="sbench-imports-") as tmp:
        out = Path(tmp) / "imports.json"
        child_env = {**os.environ, **(env or {}), "PYTHONPATH": str(root), "SBENCH_WATCH_MODULES": ",".join(watch)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", _CHILD, ",".join(forbidden), str(out), str(root), *map(str, argv)],
                             capture_output=True, text=True, cwd=cwd or root, env=child_env, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        seen = json.loads(out.read_text()) if out.exists() else {"hits": {}, "executed": []}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Watched([str(a) for a in argv], res.returncode, res.stdout, res.stderr, wall, cpu, seen["hits"],
                   seen["executed"])
