"""The one way the tests run ``sbench``: :func:`sbench`.

By default a process of its own, as a user runs it: its exit code, stdout and stderr are the program's, and a
traceback or an "internal error" (the CLI's word for a bug) fails the test. ``in_process=True`` runs the same
command line through click's test runner in the test's own process instead: several times faster, which the
suite's time depends on (hundreds of ``plan``, ``render`` and ``query`` calls), but it shares the test's
process (its environment, its imported modules). The ``cli`` fixture is :func:`sbench` with ``in_process=True,
ok=None``. :func:`command` is the argv of the process, for a test that must hold the process (signals, pipes,
several at once) and so starts it itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .paths import ROOT


def command(*args: Any) -> list[str]:
    """``sbench ARGS`` as a process of this checkout (``python -m harness``): what :func:`sbench` runs."""
    return [sys.executable, "-m", "harness", *map(str, args)]


def sbench(*args: Any, in_process: bool = False, ok: tuple[int, ...] | None = (0,),
           env: dict[str, str | None] | None = None, cwd: Path | None = None, timeout: float = 600,
           input: str | None = None, color: bool = False) -> Any:
    """Run ``sbench ARGS``; its exit code must be one of *ok* (None: any, the test asserts it).

    *env* is laid over the environment (a None value unsets the variable); *input* goes to its stdin.

    A process of its own (the default): it runs from *cwd* (the checkout) with this checkout's ``harness``,
    without the test's ``SBENCH_FAULT`` unless *env* sets it; a traceback, an "internal error" or a hang past
    *timeout* fails the test. Returns the :class:`subprocess.CompletedProcess` (``returncode``, ``stdout``,
    ``stderr``).

    ``in_process=True``: click's runner in this process (*cwd* and *timeout* do not apply; *color* keeps the
    output's colours); an exception that escapes the command fails the test. Returns click's ``Result``
    (``exit_code``, ``output``, ``stdout``, ``stderr``).
    """
    if in_process:
        if cwd is not None:
            raise ValueError("in_process runs in the test's own working directory: cwd= needs a process")
        from click.testing import CliRunner

        from harness.cli import main

        res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, env=env, input=input,
                                 color=color)
        if ok is not None:
            assert res.exit_code in ok, f"exit {res.exit_code}\n{res.output}"
        return res
    base = {k: v for k, v in os.environ.items() if k != "SBENCH_FAULT"}
    child = {**base, "PYTHONPATH": str(ROOT), **(env or {})}
    started = time.monotonic()
    try:
        proc = subprocess.run(command(*args), cwd=cwd or ROOT, capture_output=True, encoding="utf-8",
                              errors="replace", timeout=timeout, input=input,
                              stdin=subprocess.DEVNULL if input is None else None,
                              env={k: v for k, v in child.items() if v is not None})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"sbench {' '.join(map(str, args))} did not finish within {timeout:g} s") from None
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "internal error" not in out, out
    assert time.monotonic() - started < timeout
    if ok is not None:
        assert proc.returncode in ok, f"exit {proc.returncode}\n{out}"
    return proc
