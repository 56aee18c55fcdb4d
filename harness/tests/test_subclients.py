"""Turning a subprocess consumer's record into history events (pure)."""

from __future__ import annotations

from understudy_harness.history import Deliver, Own
from understudy_harness.subclients import consumer_events


def test_a_recorded_consumer_becomes_deliveries_and_ownership_closed_at_its_kill() -> None:
    lines = [
        {"t": 1.0, "kind": "acquire", "queue": 0, "member": "m"},
        {"t": 1.5, "kind": "deliver", "queue": 0, "offset": 7, "member": "m", "id": "x-1"},
        {"t": 2.0, "kind": "release", "queue": 0, "member": "m"},
        {"t": 3.0, "kind": "acquire", "queue": 1, "member": "m"},
    ]
    events = consumer_events(lines, topic="t", cgroup="cg", end_ns=4_000_000_000)
    assert events == [
        Own(1_000_000_000, "cg", "t", 0, "m", True),
        Deliver(1_500_000_000, "cg", "t", 0, 7, "x-1", "m"),
        Own(2_000_000_000, "cg", "t", 0, "m", False),
        Own(3_000_000_000, "cg", "t", 1, "m", True),
        # still held when the process was killed: the hold ends there
        Own(4_000_000_000, "cg", "t", 1, "m", False),
    ]
    # Not killed by us (it ended by itself): nothing is closed for it.
    assert len(consumer_events(lines, topic="t", cgroup="cg", end_ns=None)) == 4
