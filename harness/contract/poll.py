"""How a wait asks again: one poller with back-off for every wait loop (a backend's ``wait``, ``--wait`` for
attempts another command submitted, the local queue's watch of its jobs).

The pause grows with the time the wait has seen nothing end, by *fraction* of that time, between *first* and
*cap*: a job of twenty seconds is seen ending within two, one of an hour is asked about about once a minute,
and the scheduler is not asked every second through a night. An attempt that ended starts the growth again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Pauses of *fraction* of the time since something last ended, at least *first* and at most *cap* s."""

    first: float
    cap: float
    fraction: float = 0.1
    _since: float = field(default_factory=time.monotonic, init=False)
    _over: int = field(default=-1, init=False)

    def saw(self, over: int) -> None:
        """*over* attempts (or jobs) are over now: more than at the last look starts the growth again."""
        if over > self._over:
            self._since = time.monotonic()
        self._over = over

    def next_pause(self) -> float:
        return min(self.cap, max(self.first, self.fraction * (time.monotonic() - self._since)))

    def pause(self) -> None:
        time.sleep(self.next_pause())


def poll_until(over: Callable[[], int], total: int, pauses: tuple[float, float],
               progress: Callable[[int, int], None] | None = None) -> None:
    """The one wait loop: ask *over* how many of *total* attempts are over, tell *progress*, and until all are,
    ask again after a :class:`Backoff` pause of *pauses* (first, cap)."""
    poll = Backoff(*pauses)
    while True:
        done = over()
        if progress:
            progress(done, total)
        if done >= total:
            return
        poll.saw(done)
        poll.pause()
