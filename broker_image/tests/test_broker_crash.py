"""Crash recovery with a real process: ``kill -9`` in the middle of a produce stream;
after restart every acknowledged record is readable at its offset, the torn tail is
gone, and new records continue the offsets without overlap."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from understudy_broker.client import Consumer, Producer, create_topic

pytestmark = pytest.mark.integration


async def test_kill9_mid_stream_keeps_every_acknowledged_record(brokers: Any) -> None:
    # A lone master with asynchronous replication: acknowledgement = local fsync
    # (--flush batch, group commit), which is what this test checks.
    master = brokers.master(extra=["--async", "--flush", "batch"])
    await create_topic([master.address], topic="crash", queues=3)

    acked: dict[tuple[int, int], bytes] = {}
    enough = asyncio.Event()
    window = asyncio.Semaphore(256)
    prod = Producer([master.address], batch_size=32, linger_ms=0.5, retries=0)

    async def stream() -> None:
        for i in range(1_000_000):
            await window.acquire()
            body = b"rec-%07d-" % i + b"y" * 300
            try:
                fut = await prod.send("crash", body)
            except (ConnectionError, OSError):
                return

            def done(f: asyncio.Future[tuple[int, int]], body: bytes = body) -> None:
                window.release()
                if not f.cancelled() and f.exception() is None:
                    acked[f.result()] = body
                    if len(acked) >= 3000:
                        enough.set()

            fut.add_done_callback(done)

    task = asyncio.create_task(stream())
    async with asyncio.timeout(60):
        await enough.wait()
    master.kill9()  # mid-stream: batches are in flight, some half-written
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    with contextlib.suppress(Exception):
        async with asyncio.timeout(10):
            await prod.flush()
    with contextlib.suppress(Exception):
        await prod.router.close()
    snapshot = dict(acked)
    assert len(snapshot) >= 3000

    master.start()
    got: dict[tuple[int, int], bytes] = {}
    c = Consumer([master.address], group="after-crash", topic="crash", max_wait_ms=100)
    try:
        while True:
            recs = await c.getmany(timeout_s=2)
            if not recs:
                break
            for r in recs:
                assert (r.queue, r.offset) not in got
                got[(r.queue, r.offset)] = r.body
        ends = dict(c.positions)
    finally:
        await c.close()

    lost = [k for k, body in snapshot.items() if got.get(k) != body]
    assert lost == []
    # Offsets are dense per queue: nothing torn remains inside the readable range.
    for q in range(3):
        offsets = sorted(o for (qq, o) in got if qq == q)
        assert offsets == list(range(len(offsets)))
        assert ends[q] == len(offsets)

    # New writes continue each queue right after the recovered end.
    async with Producer([master.address]) as prod2:
        futs = [await prod2.send("crash", b"after", queue=q) for q in range(3)]
        await prod2.flush()
    assert [f.result() for f in futs] == [(q, ends[q]) for q in range(3)]
