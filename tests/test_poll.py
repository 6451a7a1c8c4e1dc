"""The one poller with back-off every wait loop uses (``harness.contract.poll``)."""

from __future__ import annotations

import inspect

import pytest

from harness.campaign import wait
from harness.campaign.executors import local, slurm
from harness.contract import poll
from harness.contract.poll import Backoff, poll_until


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 1000.0}
    slept: list[float] = []
    monkeypatch.setattr(poll.time, "monotonic", lambda: now["t"])

    def sleep(s: float) -> None:
        slept.append(s)
        now["t"] += s

    monkeypatch.setattr(poll.time, "sleep", sleep)
    return now, slept


def test_the_pause_grows_with_the_time_nothing_ended_between_its_bounds(clock) -> None:
    now, slept = clock
    b = Backoff(first=0.5, cap=60.0)
    b.saw(0)
    for _ in range(8):
        b.pause()
    assert slept[0] == 0.5  # a fresh wait asks again soon
    assert all(b_ >= a for a, b_ in zip(slept, slept[1:]))  # never shorter while nothing ends
    now["t"] += 3600  # an hour with nothing over: once a minute, not more
    assert b.next_pause() == 60.0
    b.saw(0)  # the same count: no progress, the pause stays long
    assert b.next_pause() == 60.0


def test_an_attempt_that_ends_starts_the_growth_again(clock) -> None:
    now, _ = clock
    b = Backoff(first=0.2, cap=5.0, fraction=0.1)
    b.saw(0)
    now["t"] += 30
    assert b.next_pause() == pytest.approx(3.0)  # a tenth of the 30 s seen without progress
    b.saw(1)
    assert b.next_pause() == 0.2
    now["t"] += 10
    assert b.next_pause() == pytest.approx(1.0)


def test_the_wait_loops_use_it() -> None:
    for first, cap in (local.WAIT_POLL_S, local.QUEUE_POLL_S, slurm.WAIT_POLL_S, wait.POLL_S):
        assert 0 < first < cap <= 60


def test_one_loop_waits_until_every_attempt_is_over(clock) -> None:
    """poll_until asks until the count reaches the total, tells progress each time, and its pause starts again
    when something ends (the three waits, local, SLURM and --wait of others' attempts, all use it)."""
    counts, seen = iter([0, 0, 1, 3]), []
    poll_until(lambda: next(counts), 3, (0.5, 60.0), lambda done, total: seen.append((done, total)))
    assert seen == [(0, 3), (0, 3), (1, 3), (3, 3)]
    for mod in (local, slurm, wait):
        assert "poll_until(" in inspect.getsource(mod), mod.__name__
