"""A consumer loop cancelled just as records arrive stops, and the records stay unread.

Found by the cluster benchmark: a member's consume task, cancelled after ``close()``,
hung the run. ``getmany`` waited with ``asyncio.wait_for``, which on Python 3.11 returns
the item instead of raising when the cancellation lands in the same loop iteration as
the item (the task runs on: a consumer loop that never stops, a ``gather`` that never
returns). The project now bans ``asyncio.wait_for`` (ruff TID251); this pins the user-
visible behaviour on the one path users cancel most.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import Consumer, Record
from understudy_broker.model import Permission
from understudy_broker.tasks import stop_tasks


async def test_getmany_cancelled_as_a_batch_arrives_raises_and_keeps_the_batch() -> None:
    # No broker: the consumer is put in the state start() leaves a plain (non-group)
    # consumer in, pulling queue 0 with token 1; only the hand-out path runs.
    c = Consumer(["127.0.0.1:1"], group="g", topic="t", membership=False)
    c._started = True
    pulling = asyncio.create_task(asyncio.sleep(3600))
    c._loops[0] = (1, pulling)
    try:
        waiting = asyncio.create_task(c.getmany(timeout_s=30))
        await asyncio.sleep(0.01)  # parked on the buffer
        batch = [Record("t", 0, 7, 0, None, b"x")]
        c._buffer.put_nowait((0, 1, batch))  # the batch arrives...
        waiting.cancel()  # ...and the cancellation, in the same loop iteration
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert c.positions == {}  # nothing was handed out
        assert c._buffer.get_nowait() == (0, 1, batch)  # the next getmany gets it
    finally:
        pulling.cancel()
        await asyncio.gather(pulling, return_exceptions=True)


async def test_a_queue_lost_past_the_lease_is_logged_released_when_the_lease_ended() -> None:
    """Found by the ordered drill: a member paused (SIGSTOP) past its session wakes to a
    heartbeat answer saying its queue is gone, and logged the release on waking, after
    the next owner had taken it: two members on one queue, by the log. It stopped pulling
    and handing out when its lease ended (both check the lease), so that is the release."""
    c = Consumer(["127.0.0.1:1"], group="g", topic="t", membership=True)
    c._started = True
    c._loops[0] = (1, asyncio.create_task(asyncio.sleep(3600)))
    c._holding.add(0)
    c._lease_until = time.monotonic() - 5.0  # the lease ended 5 s ago
    await c._stop_queue(0)
    (at, what, queue), = c.ownership_log
    assert (what, queue) == ("release", 0)
    assert time.time() - 5.5 < at < time.time() - 4.5
    # Within the lease, a queue given up is released now.
    c._loops[1] = (2, asyncio.create_task(asyncio.sleep(3600)))
    c._holding.add(1)
    c._lease_until = time.monotonic() + 5.0
    await c._stop_queue(1)
    assert abs(c.ownership_log[-1][0] - time.time()) < 0.5


async def test_a_lapsed_release_stays_dated_at_the_lease_end_when_a_renewal_lands_meanwhile(
        ) -> None:
    """Found by the partition suite (a member cut from every broker, then healed): two
    heartbeats were answered at the heal, the heartbeat loop's and a settle's. The first
    began stopping the queue (the lease had lapsed); while its pull loop was being
    cancelled, the second answer renewed the lease, and the release was then judged
    within the lease and logged at that moment: 0.2 s after the other member had taken
    the queue. Hand-outs ended with the lease, so that is the release."""
    c = Consumer(["127.0.0.1:1"], group="g", topic="t", membership=True)
    c._started = True

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            c._lease_until = time.monotonic() + 1.6  # the other answer renews the lease
            await asyncio.sleep(0.05)
            raise

    c._loops[0] = (1, asyncio.create_task(slow_to_stop()))
    await asyncio.sleep(0)
    c._holding.add(0)
    c._lease_until = time.monotonic() - 1.0  # the lease ended a second ago
    await c._stop_queue(0)
    (at, what, queue), = c.ownership_log
    assert (what, queue) == ("release", 0)
    assert time.time() - 1.5 < at < time.time() - 0.5  # when the lease ended, not now


async def test_a_member_stops_its_queues_when_its_lease_ends_with_no_heartbeat_answered(
        ) -> None:
    """Found by the partition suite: a member cut from every broker had its heartbeat loop
    stuck connecting to a cut-off broker past its lease. It neither pulled nor handed out
    (both check the lease), but it released its queue only when a heartbeat was answered
    again; the test stopped it before that, and the harness dated the release at the stop,
    after the other member had taken the queue. The queues now stop at the lease's end."""
    c = Consumer(["127.0.0.1:1"], group="g", topic="t", membership=True)
    c._started = True
    c._loops[0] = (1, asyncio.create_task(asyncio.sleep(3600)))
    c._holding.add(0)
    c._lease_until = time.monotonic() + 0.1  # no heartbeat will be answered
    ends = time.time() + 0.1
    watch = asyncio.create_task(c._lease_watch())
    try:
        await asyncio.sleep(0.4)
        (at, what, queue), = c.ownership_log
        assert (what, queue) == ("release", 0)
        assert abs(at - ends) < 0.05
        assert c._loops == {}
    finally:
        await stop_tasks([watch])


async def test_a_heartbeat_answered_after_the_lease_ended_drops_the_queues_first() -> None:
    """Found by the partition suite: a member cut from every broker re-joined on the heal
    (its heartbeat said UNKNOWN_MEMBER), the join's answer renewed its lease, and only
    then did it stop the queue the group had handed on: the release was logged on the
    answer, after the other member had taken the queue. The answer to a heartbeat sent
    after the lease ended must not renew it over what was held: those queues ended with
    the lease (and what was handed out goes back to the committed offset)."""
    c = Consumer(["127.0.0.1:1"], group="g", topic="t", membership=True,
                 session_timeout_ms=2000)
    c._started = True
    c._loops[0] = (1, asyncio.create_task(asyncio.sleep(3600)))
    c._holding.add(0)
    c._positions[0] = 42
    c._lease_until = time.monotonic() - 5.0

    class Answering:
        address = "127.0.0.1:1"

        async def request(self, op: p.Op, body: bytes, *, timeout_s: float) -> bytes:
            return p.MemberHeartbeatResponse(7, [], [], "b").encode()

    async def connection(_perm: Permission, _group: str | None = None) -> Answering:
        return Answering()

    c.router.connection = connection  # type: ignore[method-assign,assignment]
    resp = await c._beat(join=True)
    (at, what, queue), = c.ownership_log
    assert (what, queue) == ("release", 0)
    assert time.time() - 5.5 < at < time.time() - 4.5  # when the lease ended, not now
    assert c._loops == {}
    assert 0 not in c._positions  # from the committed offset next time
    assert c._lease_valid()  # the answer starts a new lease
    assert resp.generation == 7


async def test_a_producers_buffer_room_is_first_come_first_served_and_survives_cancels(
) -> None:
    """The producer's room for unacknowledged messages (``max_buffered``): a send finding
    none waits in order; a place given back goes to the first still waiting; a waiter
    cancelled as its place arrives passes the place on, so none is lost."""
    from understudy_broker.client import _Room

    room = _Room(2)
    await room.take()
    await room.take()
    order: list[str] = []

    async def send(name: str) -> None:
        await room.take()
        order.append(name)

    a = asyncio.create_task(send("a"))
    b = asyncio.create_task(send("b"))
    c = asyncio.create_task(send("c"))
    await asyncio.sleep(0)
    assert order == []  # no room
    b.cancel()  # gives up while waiting
    room.give()
    await asyncio.sleep(0)
    assert order == ["a"]
    room.give()  # handed to c as c is cancelled: c passes it on
    c.cancel()
    await asyncio.gather(a, b, c, return_exceptions=True)
    assert order == ["a"]
    await room.take()  # the place c passed on
    late = asyncio.create_task(send("late"))
    await asyncio.sleep(0)
    assert order == ["a"]  # every place taken again
    room.give()
    await late
    assert order == ["a", "late"]
