"""``python -m harness.runner.pdeath PARENT_PID -- CMD...``: exec CMD so that it gets SIGTERM when its
parent dies.

Linux's parent-death signal (``PR_SET_PDEATHSIG``) survives ``exec``, so a training command started
through this wrapper cannot outlive a node runner that was killed with SIGKILL: it gets SIGTERM and
stops as it would on ``scancel`` (torch's elastic agent passes that on to every rank). Setting it from
a wrapper rather than a ``preexec_fn`` keeps the parent's fork free of Python code, which is unsafe while
its sampler thread runs. Where ``prctl`` is unavailable (not Linux) CMD simply runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send *sig* to this process when its parent thread exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def wrap(cmd: list[str], parent_pid: int | None = None) -> list[str]:
    """CMD behind this wrapper, bound to *parent_pid* (default: the calling process)."""
    return [sys.executable, "-m", "harness.runner.pdeath", str(parent_pid or os.getpid()), "--", *cmd]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m harness.runner.pdeath PARENT_PID -- COMMAND...\n")
        return 3
    parent = int(argv[0])
    cmd = argv[2:]
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the signal was armed
        sys.stderr.write(f"sbench: parent process {parent} is gone; not starting {cmd[0]}\n")
        return 128 + signal.SIGTERM
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        sys.stderr.write(f"sbench: cannot run {cmd[0]}: {exc}\n")
        return 127


if __name__ == "__main__":
    sys.exit(main())
