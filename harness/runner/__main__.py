"""``python -m harness.runner node --job-dir D --host H -- CMD...`` (see :mod:`harness.runner.node`)."""

from __future__ import annotations

import sys

from .node import main as node_main

USAGE = "usage: python -m harness.runner node --job-dir DIR --host HOST -- COMMAND...\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 3
    if argv[0] != "node":
        sys.stderr.write(f"unknown runner command {argv[0]!r}\n" + USAGE)
        return 3

    return node_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
