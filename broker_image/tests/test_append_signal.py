"""The long poll's wake-ups (requests.AppendSignal), as a pure unit: a queue's growth
wakes the polls of that queue only; anything else wakes every poll."""

from __future__ import annotations

import asyncio

from understudy_broker.server.requests import AppendSignal


async def _settle() -> None:
    """Let every ready callback and task step run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_queue_growing_wakes_only_the_polls_of_that_queue() -> None:
    signal = AppendSignal()
    on_0 = asyncio.create_task(signal.wait(60, [("t", 0)]))
    on_1_and_2 = asyncio.create_task(signal.wait(60, [("t", 1), ("t", 2)]))
    other_topic = asyncio.create_task(signal.wait(60, [("u", 0)]))
    await _settle()
    signal.grew({("t", 2), ("t", 3)})
    await _settle()
    assert on_1_and_2.done()
    assert not on_0.done()
    assert not other_topic.done()
    signal.grew({("t", 0)})
    await _settle()
    assert on_0.done()
    assert not other_topic.done()
    signal.fire()
    await _settle()
    assert other_topic.done()


async def test_fire_wakes_every_poll_with_or_without_queues() -> None:
    signal = AppendSignal()
    waits = [asyncio.create_task(signal.wait(60, q)) for q in ([("t", 0)], [], [("t", 0), ("t", 1)])]
    await _settle()
    assert not any(w.done() for w in waits)
    signal.fire()
    await _settle()
    assert all(w.done() for w in waits)
    # A poll that starts after the fire waits for the next one.
    late = asyncio.create_task(signal.wait(60, [("t", 0)]))
    await _settle()
    assert not late.done()
    signal.grew([("t", 0)])
    await _settle()
    assert late.done()


async def test_a_wait_ends_at_its_time_and_leaves_nothing_registered() -> None:
    signal = AppendSignal()
    await signal.wait(0.01, [("t", 0), ("t", 1)])  # nothing grew: the time ends it
    cancelled = asyncio.create_task(signal.wait(60, [("t", 5)]))
    await _settle()
    cancelled.cancel()
    await _settle()
    assert cancelled.cancelled()
    woken = asyncio.create_task(signal.wait(60, [("t", 6)]))
    await _settle()
    signal.grew([("t", 6)])
    await woken
    # No waiter is left behind for a queue nobody polls any more (a broker with many
    # idle queues would otherwise keep one entry per queue ever polled).
    assert not signal._by_queue
    assert not signal._every
