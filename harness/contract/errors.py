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


class EmptyStoreError(InputError):
    """A results database with nothing in it yet (an empty file, a lake whose schema no writer made)."""


class RenderError(SbenchError):
    pass


class SubmitError(SbenchError):
    pass


class CollectError(SbenchError):
    pass


class RecordError(SbenchError):
    """A manifest line or ``submitted.json`` that is not one sbench writes (``harness.contract.records``); the
    message names the key."""


class StoreBusyError(SbenchError):
    """Another sbench process holds the DuckDB write lock."""


class SchemaMismatchError(SbenchError):
    pass


class RunnerError(SbenchError):
    pass


class CampaignBusyError(SbenchError):
    """Another sbench process holds the campaign's lock (a submit, retry or cancel of the same campaign)."""


class Interrupted(BaseException):  # noqa: N818 - not an error: the user stopped the command
    """SIGINT or SIGTERM stopped a command at a point where it could stop cleanly; exit 128 + the signal.

    ``note`` says what was left behind (attempts still queued, and the command that stops them); ``result``
    is what the command had done when the signal took effect (a submit's report), for the CLI to show."""

    def __init__(self, signum: int, note: str | None = None, result: object = None) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.note = note
        self.result = result

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
