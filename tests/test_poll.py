"""The one poller with back-off every wait loop uses (``harness.contract.poll``)."""

from __future__ import annotations

import pytest

from harness.campaign import wait
from harness.campaign.executors import local, slurm
from harness.contract import poll
from harness.contract.poll import Backoff


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
