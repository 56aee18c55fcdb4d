"""Subprocess clients: their records as history events (pure), and one that exited on
its own stopping the ordered cycle that would pause it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from understudy_harness.drill import DrillError, Status, ordered_event
from understudy_harness.history import Deliver, Own
from understudy_harness.subclients import SubClient, consumer_events


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


def test_a_client_that_exited_on_its_own_stops_the_ordered_cycle_saying_why(
        tmp_path: Path) -> None:
    """The ordered scenario pauses its subprocess clients; one that already exited (not
    killed by the drill) makes the cycle fail with its exit code and last output instead
    of quietly pausing the others. One the drill killed itself (a crash cycle) does not."""
    log = tmp_path / "cg2.sub.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('consume ━━━ 40/150'); "
             "print('consume: no broker of group g1 reachable'); sys.exit(1)"],
            stdout=out, stderr=subprocess.STDOUT)
    proc.wait(10)
    gone = SubClient("cg2.sub", "consumer", "t", "cg2", tmp_path / "cg2.sub.jsonl", proc)
    assert gone.log_tail() == "consume: no broker of group g1 reachable"
    target = SimpleNamespace(targets=[None])
    with pytest.raises(DrillError, match=r"cycle 1: cg2\.sub exited \(code 1\) before its "
                                         r"pause: consume: no broker of group g1 reachable"):
        asyncio.run(ordered_event(1, target, None, Status(), [gone], 500))  # type: ignore[arg-type]
    gone.stopped_at = 1  # killed by the drill (a crash cycle): nothing left to pause
    status = Status()
    asyncio.run(ordered_event(4, target, None, status, [gone], 500))  # type: ignore[arg-type]
    assert status.phase == "cycle 4: no subprocess client to pause"
