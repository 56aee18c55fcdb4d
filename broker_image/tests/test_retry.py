"""The one backoff: jittered so that clients do not retry in lockstep, and still bounded."""

from __future__ import annotations

import itertools

import pytest

from understudy_broker.retry import Backoff, backoff_delay


def test_each_wait_lies_in_the_upper_half_of_its_doubling_step() -> None:
    for attempt, draw in itertools.product(range(8), (0.0, 0.3, 0.999)):
        step = min(0.05 * 2**attempt, 1.0)
        delay = backoff_delay(attempt, initial_s=0.05, max_s=1.0, draw=draw)
        assert step / 2 <= delay <= step


def test_waits_never_exceed_the_cap_even_after_many_attempts() -> None:
    assert backoff_delay(10_000, initial_s=0.1, max_s=2.0, draw=0.999) <= 2.0


def test_different_draws_spread_clients_apart() -> None:
    """Two clients that failed at the same moment do not come back at the same moment."""
    a = Backoff(0.1, 2.0, draw=lambda: 0.1)
    b = Backoff(0.1, 2.0, draw=lambda: 0.9)
    assert [a.next() for _ in range(3)] != [b.next() for _ in range(3)]


def test_reset_starts_from_the_first_step_again() -> None:
    b = Backoff(0.1, 2.0, draw=lambda: 1.0)
    first = b.next()
    for _ in range(5):
        b.next()
    b.reset()
    assert b.next() == first


def test_nonsense_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(2.0, 1.0)
