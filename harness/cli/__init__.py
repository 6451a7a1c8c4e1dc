"""The ``sbench`` command line. Each command parses, calls one library function, and prints.

``base`` holds the group and shared options, and loads each command's module (which registers it on the
group) when the command runs.
"""

from .base import main

__all__ = ["main"]
