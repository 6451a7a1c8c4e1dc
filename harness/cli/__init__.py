"""The ``sbench`` command line. Each command parses, calls one library function, and prints.

``base`` holds the group and shared options; each other module registers its commands on it.
"""

from . import cluster, data, envs, inputs, jobs, report, results  # noqa: F401 - registers the commands
from .base import main

__all__ = ["main"]
