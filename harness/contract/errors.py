"""Domain errors. The library raises these; ``cli.py`` translates them once.

``InputError`` subclasses are the user's mistake (exit 2); everything else that
derives from ``SbenchError`` is a runtime failure (exit 1).
"""

from __future__ import annotations


class SbenchError(Exception):
    """Base class of every error sbench reports without a traceback."""

    exit_code = 1


class InputError(SbenchError):
    """Bad input: a file, key or option the user can fix."""

    exit_code = 2


class InventoryError(InputError):
    pass


class SweepError(InputError):
    pass


class CatalogError(InputError):
    pass


class RenderError(SbenchError):
    pass


class SubmitError(SbenchError):
    pass


class CollectError(SbenchError):
    pass


class StoreBusyError(SbenchError):
    """Another sbench process holds the DuckDB write lock."""


class SchemaMismatchError(SbenchError):
    pass


class RunnerError(SbenchError):
    pass
