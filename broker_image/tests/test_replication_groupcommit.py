"""Group commit on the slave and push_metadata_now, over real loopback sockets.

Durability contract under test: with ``FlushPolicy("batch")`` a slave acknowledges
(heartbeats) only bytes it has fdatasynced, even though the fsync now runs in a worker
thread and covers many pushes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from understudy_broker.replication.master import ReplicationServer
from understudy_broker.replication.slave import ReplicationClient
from understudy_broker.storage.commitlog import CommitLog, FlushPolicy
from understudy_broker.storage.records import Message
from understudy_harness.testing import eventually

SEG = 64 << 10


class FlushRecorder:
    """Wraps a slave log's ``flush`` to record what each fsync covered."""

    def __init__(self, log: CommitLog) -> None:
        self.log = log
        self.calls = 0
        self._flush = log.flush
        log.flush = self.flush  # type: ignore[method-assign]

    def flush(self) -> None:
        self.calls += 1
        self._flush()


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """A sync master and one slave whose log uses the ``batch`` flush policy."""
    master = CommitLog.open(tmp_path / "m", segment_bytes=SEG, flush=FlushPolicy("interval"))
    slave = CommitLog.open(tmp_path / "s", segment_bytes=SEG, flush=FlushPolicy("batch"))
    meta: dict[str, Any] = {"version": 0}
    seen: list[dict[str, Any]] = []
    server = ReplicationServer(
        master,
        host="127.0.0.1",
        port=0,
        sync=True,
        auto_degrade=False,
        metadata=lambda: dict(meta),
        metadata_interval_s=3600.0,
    )
    await server.start()
    recorder = FlushRecorder(slave)
    client = ReplicationClient(
        slave,
        master_host="127.0.0.1",
        master_port=server.port,
        name="s",
        on_metadata=seen.append,
        on_append=lambda: None,
        backoff_initial_s=0.05,
    )
    task = asyncio.create_task(client.run())
    try:
        await eventually(lambda: any(lk.in_sync for lk in server.links()), "slave in sync")
        yield {
            "master": master,
            "slave": slave,
            "server": server,
            "client": client,
            "meta": meta,
            "seen": seen,
            "flushes": recorder,
        }
    finally:
        await client.stop()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                await task
        await server.stop()
        master.close()
        slave.close()


def messages(rng: random.Random, n: int) -> list[Message]:
    return [Message("t", rng.randrange(4), None, rng.randbytes(1024), 0) for _ in range(n)]


async def test_sync_acks_cover_only_fsynced_slave_bytes(pair: dict[str, Any]) -> None:
    master: CommitLog = pair["master"]
    slave: CommitLog = pair["slave"]
    server: ReplicationServer = pair["server"]
    rng = random.Random(5)
    acked_ends: list[int] = []

    async def produce_one() -> None:
        end = master.append(messages(rng, 16)).end_phys
        server.notify_appended()
        await server.wait_replicated(end)
        # The acknowledgement was released: the slave must have fsynced this far.
        assert slave.flushed_phys >= end
        acked_ends.append(end)

    # Many concurrent batches, as concurrent producers would send them.
    for _ in range(5):
        await asyncio.gather(*(produce_one() for _ in range(8)))
    assert len(acked_ends) == 40
    assert slave.flushed_phys == slave.max_phys == master.max_phys
    assert all(lk.acked_offset <= slave.flushed_phys for lk in server.links())
    # Every push was fsynced by some flush: there were flushes, and never more than pushes.
    assert 1 <= pair["flushes"].calls <= 40


async def test_a_slave_reconnecting_with_unsynced_bytes_fsyncs_before_its_hello(
    pair: dict[str, Any],
) -> None:
    master: CommitLog = pair["master"]
    slave: CommitLog = pair["slave"]
    server: ReplicationServer = pair["server"]
    client: ReplicationClient = pair["client"]
    rng = random.Random(9)
    end = master.append(messages(rng, 8)).end_phys
    server.notify_appended()
    await server.wait_replicated(end)
    # Append bytes on the slave without syncing them (as a session that died between
    # its append and its fsync would), then force a reconnect.
    data = master.append(messages(rng, 4))
    raw = master.read_raw(data.start_phys, data.end_phys - data.start_phys)
    await client.stop()  # the fixture's run() task ends; start a fresh client below
    slave.append_replicated(slave.max_phys, raw, defer_sync=True)
    assert slave.flushed_phys < slave.max_phys
    again = ReplicationClient(
        slave,
        master_host="127.0.0.1",
        master_port=server.port,
        name="s",
        on_metadata=lambda _d: None,
        on_append=lambda: None,
    )
    task = asyncio.create_task(again.run())
    try:
        await eventually(
            lambda: any(lk.connected and lk.acked_offset == data.end_phys for lk in server.links()),
            "the reconnected slave acknowledging its whole log",
        )
        assert slave.flushed_phys == slave.max_phys == data.end_phys
    finally:
        await again.stop()
        async with asyncio.timeout(10):
            await task


async def test_push_metadata_now_reaches_the_slave_before_the_interval(
    pair: dict[str, Any],
) -> None:
    server: ReplicationServer = pair["server"]
    seen: list[dict[str, Any]] = pair["seen"]
    await eventually(lambda: bool(seen), "the metadata frame sent on connect")
    assert seen[-1] == {"version": 0}
    pair["meta"]["version"] = 1
    server.push_metadata_now()
    # The interval is an hour: only push_metadata_now can deliver this.
    await eventually(lambda: seen[-1] == {"version": 1}, "metadata pushed on demand")


async def test_a_failed_slave_fsync_drops_the_link_acks_nothing_unsynced_and_recovers(
    pair: dict[str, Any],
) -> None:
    master: CommitLog = pair["master"]
    slave: CommitLog = pair["slave"]
    server: ReplicationServer = pair["server"]
    client: ReplicationClient = pair["client"]
    recorder: FlushRecorder = pair["flushes"]
    rng = random.Random(11)
    real_flush = recorder._flush
    failures = 0

    def failing_flush() -> None:
        nonlocal failures
        failures += 1
        raise OSError(5, "Input/output error (injected)")

    recorder._flush = failing_flush  # type: ignore[method-assign]
    sessions = client.sessions
    end = master.append(messages(rng, 8)).end_phys
    server.notify_appended()
    await eventually(lambda: failures >= 1, "the injected fsync failure")
    await eventually(lambda: client.last_error is not None, "the link dropping")
    assert "fsync of replicated bytes failed" in (client.last_error or "")
    # Nothing beyond what was really fsynced was acknowledged.
    assert all(lk.acked_offset <= slave.flushed_phys for lk in server.links())
    assert slave.flushed_phys < end
    recorder._flush = real_flush  # type: ignore[method-assign]
    await eventually(lambda: client.sessions > sessions, "a new session")
    await server.wait_replicated(end)
    assert slave.flushed_phys >= end
