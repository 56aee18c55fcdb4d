"""A delayed message on one real broker process (no ZooKeeper): it survives a kill -9 of
the broker before it is due (the schedule is in the log, its index rebuilt from it), and
log retention keeps the segment that holds it while it is pending (docs/delayed.md)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import Consumer, Producer, create_topic, request_once

pytestmark = pytest.mark.integration


async def test_a_pending_delayed_message_survives_kill9_and_retention(brokers: Any) -> None:
    master = brokers.master(extra=["--async", "--flush", "batch", "--segment-bytes", "65536", "--max-frame-bytes", "32768",
                                   "--retention-bytes", "200000", "--retention-check-interval", "1"])
    await create_topic([master.address], topic="t", queues=1)
    due = int(time.time() * 1000) + 7_000
    async with Producer([master.address]) as prod:
        queue, offset = await (await prod.send("t", b"later", deliver_at_ms=due))
        assert (queue, offset) == (0, -1)
    master.kill9()
    (master.data_dir / "schedule.db").unlink()  # the index is rebuilt from the log
    master.start()
    # A megabyte of ordinary traffic: retention (every second) deletes old segments, but not
    # the one holding the pending entry.
    async with Producer([master.address], max_batch_bytes=16_384) as prod:
        futs = [await prod.send("t", b"x" * 1000) for _ in range(1000)]
        for f in futs:
            await f
    deadline = time.monotonic() + 30
    start = 0
    while time.monotonic() < deadline and start == 0:  # until retention has run
        frame = await request_once(master.address, p.Op.QUEUE_STATS,
                                   p.QueueStatsRequest("t", [0]).encode(), timeout_s=5)
        start = p.QueueStatsResponse.decode(frame.body).queues[0].start
        await asyncio.sleep(0.5)
    assert start > 0, "retention never deleted a segment: the test proves nothing"
    got: list[tuple[bytes, int]] = []
    c = Consumer([master.address], group="g", topic="t", membership=False, max_wait_ms=200)
    try:
        while time.monotonic() < deadline and not any(b == b"later" for b, _ in got):
            got += [(r.body, int(time.time() * 1000)) for r in await c.getmany(timeout_s=0.5)]
    finally:
        await c.close()
    arrived = [t for b, t in got if b == b"later"]
    assert arrived, "the delayed message was lost"
    assert arrived[0] >= due
