"""Replication end to end with broker processes: byte-identical segment files, a slave
restarted mid-stream catches up, and in synchronous mode a master killed right after
its acknowledgements loses nothing (invariant 3)."""

from __future__ import annotations

import asyncio
import contextlib
import filecmp
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Connection, Consumer, Producer, create_topic
from understudy_broker.model import Permission
from understudy_harness.testing import eventually, raw_request, wait_caught_up

pytestmark = pytest.mark.integration

SEGMENT = str(1 << 20)
MAX_FRAME = str(512 << 10)
BODY = 1000


async def _produce(address: str, topic: str, count: int, *, tag: bytes) -> dict[tuple[int, int], bytes]:
    """Produce ``count`` messages with a 256-message window; return acked (queue, offset) -> body."""
    acked: dict[tuple[int, int], bytes] = {}
    window = asyncio.Semaphore(256)
    async with Producer([address], batch_size=64, linger_ms=1) as prod:
        for i in range(count):
            await window.acquire()
            body = tag + b"-%06d-" % i + b"x" * BODY
            fut = await prod.send(topic, body)

            def done(f: asyncio.Future[tuple[int, int]], body: bytes = body) -> None:
                window.release()
                if not f.cancelled() and f.exception() is None:
                    acked[f.result()] = body

            fut.add_done_callback(done)
        await prod.flush()
    return acked


async def _read_all(address: str, topic: str, want: int) -> dict[tuple[int, int], bytes]:
    got: dict[tuple[int, int], bytes] = {}
    c = Consumer([address], group="verify", topic=topic, max_wait_ms=200)
    try:
        while len(got) < want:
            recs = await c.getmany(timeout_s=5)
            if not recs:
                break
            for r in recs:
                got[(r.queue, r.offset)] = r.body
    finally:
        await c.close()
    return got


def _segments(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "commitlog").iterdir())


async def test_slave_restarted_mid_stream_catches_up_byte_identical(brokers: Any) -> None:
    master = brokers.master(
        extra=["--sync", "--auto-degrade", "--segment-bytes", SEGMENT, "--max-frame-bytes", MAX_FRAME]
    )
    slave = brokers.slave(master, extra=["--segment-bytes", SEGMENT, "--max-frame-bytes", MAX_FRAME])
    await create_topic([master.address], topic="rep", queues=3)

    stream = asyncio.create_task(_produce(master.address, "rep", 4000, tag=b"a"))
    # Kill the slave while the stream runs, then bring it back.
    while not stream.done():
        frame = await raw_request(slave.address, p.Op.HEARTBEAT, b"{}")
        if p.HeartbeatResponse.decode(frame.body).max_phys > 1_500_000:
            break
        await asyncio.sleep(0.02)
    assert not stream.done()
    slave.kill9()
    await asyncio.sleep(0.3)
    slave.start()
    acked = await stream
    assert len(acked) == 4000

    end = await wait_caught_up(master.address, slave.address)
    assert end > 4_000_000  # several 1 MiB segments, so EOF markers were replicated too
    assert slave.starts == 2
    assert master.stop() == 0
    assert slave.stop() == 0

    names = _segments(master.data_dir)
    assert len(names) >= 4
    assert names == _segments(slave.data_dir)
    match, mismatch, errors = filecmp.cmpfiles(
        master.data_dir / "commitlog", slave.data_dir / "commitlog", names, shallow=False
    )
    assert (mismatch, errors) == ([], [])
    assert match == names


async def test_sync_master_killed_after_acks_loses_nothing(brokers: Any) -> None:
    master = brokers.master(start=False)
    # The slave holds READ (static mode) so clients can read what it persisted.
    slave = brokers.slave(master, start=False)
    master.extra += ["--sync", "--no-auto-degrade", "--peer", f"s={slave.address}"]
    slave.extra += ["--permission", "READ", "--peer", f"m={master.address}"]
    master.start()
    slave.start()
    await create_topic([master.address], topic="ha", queues=4)

    # A consumer that starts on the master (FULL) before the crash; small pulls and a
    # one-batch buffer, and nothing taken before the crash, so most records must come
    # from the slave after it.
    consumer = Consumer(
        [master.address], group="live", topic="ha", max_wait_ms=200, max_bytes=4096,
        prefetch_batches=1,
    )
    await consumer.start()
    try:
        assert consumer.router.address_for(Permission.READ) == master.address
        acked = await _produce(master.address, "ha", 3000, tag=b"h")
        master.kill9()  # right after the last acknowledgement
        assert len(acked) == 3000

        # Every acknowledged record is on the slave...
        got = await _read_all(slave.address, "ha", len(acked))
        assert [k for k in acked if got.get(k) != acked[k]] == []

        # ...and the running consumer loses its connection, re-reads the route and
        # carries on from the slave without a gap.
        seen: dict[tuple[int, int], bytes] = {}
        while len(seen) < len(acked):
            recs = await consumer.getmany(timeout_s=15)
            assert recs, f"consumer stalled after {len(seen)} records"
            seen.update({(r.queue, r.offset): r.body for r in recs})
        assert seen == acked
        assert consumer.router.address_for(Permission.READ) == slave.address
    finally:
        await consumer.close()


async def test_a_consumer_reads_a_record_only_once_it_may_be_acknowledged(brokers: Any) -> None:
    """A record the master appended but a frozen slave has not acknowledged is not served
    to consumers (it could vanish with the master's unflushed page cache); it is the
    moment the slave acknowledges it (server/readable.py)."""
    master = brokers.master(extra=["--sync", "--ack-timeout", "30"])
    slave = brokers.slave(master, extra=["--link-timeout-ms", "30000"])
    await create_topic([master.address], topic="hw", queues=1)
    c = Consumer([master.address], group="hw", topic="hw", max_wait_ms=100)
    async with Producer([master.address], linger_ms=0, request_timeout_s=60,
                        send_timeout_s=60) as prod:
        try:
            assert await (await prod.send("hw", b"before")) == (0, 0)
            await wait_caught_up(master.address, slave.address)
            os.kill(slave.proc.pid, signal.SIGSTOP)
            try:
                pending = await prod.send("hw", b"pending")
                seen = [r.body for r in await c.getmany(timeout_s=5)]
                deadline = time.monotonic() + 1.5  # well past the master's append
                while time.monotonic() < deadline:
                    seen += [r.body for r in await c.getmany(timeout_s=0.2)]
                assert not pending.done(), "the slave is frozen: nothing can acknowledge it"
                assert seen == [b"before"], f"read before its acknowledgement: {seen}"
            finally:
                os.kill(slave.proc.pid, signal.SIGCONT)
            assert await pending == (0, 1)
            later: list[bytes] = []
            deadline = time.monotonic() + 10
            while not later and time.monotonic() < deadline:
                later += [r.body for r in await c.getmany(timeout_s=0.5)]
            assert later == [b"pending"]
        finally:
            await c.close()


async def test_a_producer_reads_the_offset_it_was_just_given(brokers: Any) -> None:
    """Read-your-writes: the offset a produce answers is served by the next pull, also right
    after a frozen slave came back. While the slave held writes back, the readable end's own
    task was refused again and again and sleeps in its backoff (up to a second); the
    produce's acknowledgement moves the readable end itself (server/readable.py)."""
    master = brokers.master(extra=["--sync", "--ack-timeout", "0.5"])
    slave = brokers.slave(master, extra=["--link-timeout-ms", "30000"])
    await create_topic([master.address], topic="ryw", queues=1)
    await wait_caught_up(master.address, slave.address)
    conn = await Connection.open(master.address)
    try:
        async def produce(body: bytes) -> int:
            answer = p.ProduceResponse.decode(await conn.request(
                p.Op.PRODUCE, p.encode_produce("ryw", [(0, None, body)])))
            [(_queue, offset)] = answer.offsets
            return offset

        async def pull(offset: int) -> list[bytes]:
            got = p.PullResponse.decode(await conn.request(
                p.Op.PULL, p.PullRequest("ryw", 0, offset, 1 << 20, 0).encode()))
            return [r.body for r in got.records[:1]]

        os.kill(slave.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 3  # refusals: the readable end's task backs off
            while time.monotonic() < deadline:
                with contextlib.suppress(BrokerError):
                    await produce(b"held back")
        finally:
            os.kill(slave.proc.pid, signal.SIGCONT)
        first = await eventually(lambda: produce(b"first"), "writes acknowledged again",
                                 tolerate=(BrokerError,), interval_s=0.05)
        assert await pull(first) == [b"first"], "the acknowledged offset was not served"
        for i in range(20):
            body = f"then-{i}".encode()
            assert await pull(await produce(body)) == [body]
    finally:
        await conn.close()
