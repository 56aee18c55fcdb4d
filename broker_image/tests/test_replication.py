"""Replication over real loopback sockets: byte-identical slaves, catch-up, gaps, sync acks."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from understudy_broker.replication.isr import (
    AckPolicy,
    NotEnoughReplicasError,
    ReplicationTimeoutError,
)
from understudy_broker.replication.master import ReplicationServer
from understudy_broker.replication.slave import ReplicationClient
from understudy_broker.replication.wire import HEARTBEAT, METADATA_OFFSET, PUSH_HEADER, encode_hello
from understudy_broker.storage.commitlog import (
    CommitLog,
    DamagedRecordError,
    FlushPolicy,
    ReplicationCorruptError,
    ReplicationGapError,
)
from understudy_broker.storage.records import Message
from understudy_broker.tasks import stop_tasks
from understudy_harness.testing import eventually

SEG = 8 << 10


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and (p.parts[-2] == "commitlog" or "index" in p.relative_to(root).parts)
    }


def batch(rng: random.Random, n: int) -> list[Message]:
    return [
        Message(
            rng.choice(["a", "b"]),
            rng.randrange(3),
            rng.choice([None, b"key"]),
            rng.randbytes(rng.randrange(1, 1500)),
            rng.randrange(1 << 40),
        )
        for _ in range(n)
    ]


@dataclass
class Slave:
    root: Path
    name: str
    log: CommitLog
    client: ReplicationClient
    task: asyncio.Task[None]
    metadata: list[dict[str, Any]] = field(default_factory=list)

    async def stop(self) -> None:
        await self.client.stop()
        try:
            async with asyncio.timeout(10):
                await self.task
        finally:
            self.log.close()


class Cluster:
    """One master log + ReplicationServer and any number of slaves; stops all on exit."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = CommitLog.open(root / "master", segment_bytes=SEG)
        self.server: ReplicationServer | None = None
        self.slaves: list[Slave] = []

    async def start_master(self, *, epoch: list[int] | None = None,
                           extra: Callable[[], dict[str, Any]] = dict, **kw: Any
                           ) -> ReplicationServer:
        """``epoch``: a one-item list the test changes, named in every metadata frame;
        ``extra()``: more fields for each metadata frame."""
        kw.setdefault("sync", True)
        self.server = ReplicationServer(
            self.log,
            host="127.0.0.1",
            port=0,
            metadata=lambda: {"topics": self.log.topics(), "next_seq": self.log.next_seq,
                              **({"epoch": epoch[0]} if epoch is not None else {}), **extra()},
            metadata_interval_s=0.2,
            **kw,
        )
        await self.server.start()
        return self.server

    async def start_slave(self, name: str, *, flush: FlushPolicy | None = None,
                          epoch: list[int] | None = None,
                          on_probe: Callable[[int, float], int | None] | None = None) -> Slave:
        assert self.server is not None
        root = self.root / name
        log = CommitLog.open(root, segment_bytes=SEG, flush=flush or FlushPolicy())
        seen: list[dict[str, Any]] = []
        client = ReplicationClient(
            log,
            master_host="127.0.0.1",
            master_port=self.server.port,
            name=name,
            on_metadata=seen.append,
            on_append=lambda: None,
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            epoch=(lambda: 0) if epoch is None else (lambda: epoch[0]),
            on_probe=on_probe,
        )
        slave = Slave(root, name, log, client, asyncio.create_task(client.run()), seen)
        self.slaves.append(slave)
        return slave

    async def produce(self, messages: list[Message]) -> int:
        assert self.server is not None
        result = self.log.append(messages)
        self.server.notify_appended()
        await self.server.wait_replicated(result.end_phys)
        return result.end_phys

    async def close(self) -> None:
        for slave in self.slaves:
            with contextlib.suppress(Exception):
                await slave.stop()
        if self.server is not None:
            await self.server.stop()
        self.log.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()


async def test_two_slaves_end_byte_identical_over_several_rolls(cluster: Cluster) -> None:
    server = await cluster.start_master(min_insync=2, auto_degrade=False)
    s1 = await cluster.start_slave("s1")
    s2 = await cluster.start_slave("s2")
    await eventually(lambda: sum(lk.in_sync for lk in server.links()) == 2, "two in-sync slaves")
    rng = random.Random(7)
    for _ in range(40):
        end = await cluster.produce(batch(rng, rng.randrange(1, 6)))
        # Synchronous with min_insync=2: both slaves hold the bytes when the wait returns.
        assert s1.log.max_phys >= end
        assert s2.log.max_phys >= end
    assert len(list((cluster.root / "master" / "commitlog").iterdir())) >= 4
    for log in (cluster.log, s1.log, s2.log):
        log.flush_indexes()  # indexes are written behind the log (storage/index.py)
    master_files = files_of(cluster.root / "master")
    assert files_of(s1.root) == master_files
    assert files_of(s2.root) == master_files
    topics = cluster.log.topics()
    await eventually(
        lambda: all(s.metadata and s.metadata[-1]["topics"] == topics for s in (s1, s2)),
        "metadata frames carrying the master's topics",
    )
    assert s1.client.lag_bytes == 0
    assert server.degraded_acks == 0
    assert {lk.name for lk in server.links()} == {"s1", "s2"}


async def test_late_and_restarted_slaves_catch_up(cluster: Cluster) -> None:
    await cluster.start_master(sync=False)
    rng = random.Random(3)
    for _ in range(15):
        await cluster.produce(batch(rng, 3))
    late = await cluster.start_slave("late")
    await eventually(lambda: late.log.max_phys == cluster.log.max_phys, "late slave catch-up")

    # Restart mid-stream: stop the slave while the master keeps producing.
    async def keep_producing() -> None:
        for _ in range(30):
            await cluster.produce(batch(rng, 2))
            await asyncio.sleep(0)

    producer = asyncio.create_task(keep_producing())
    await eventually(lambda: late.log.max_phys > 0, "some replication")
    cluster.slaves.remove(late)
    await late.stop()
    await producer
    again = await cluster.start_slave("late")
    await eventually(lambda: again.log.max_phys == cluster.log.max_phys, "restarted slave catch-up")
    for log in (cluster.log, again.log):
        log.flush_indexes()  # indexes are written behind the log (storage/index.py)
    assert files_of(again.root) == files_of(cluster.root / "master")
    assert again.log.next_seq == cluster.log.next_seq


async def test_a_slave_with_a_divergent_tail_is_dropped_with_a_clear_log_line(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    server = await cluster.start_master(sync=False)
    rng = random.Random(5)
    await cluster.produce(batch(rng, 4))
    # The slave holds more than the master: e.g. the master lost an unflushed tail.
    diverged = CommitLog.open(cluster.root / "bad", segment_bytes=SEG)
    diverged.append(batch(rng, 20))
    diverged.close()
    caplog.set_level(logging.INFO, logger="understudy_broker.replication")
    bad = await cluster.start_slave("bad")
    await eventually(
        lambda: "divergent tail" in caplog.text and bad.client.sessions >= 2,
        "divergent-tail rejection and a reconnect attempt",
    )
    assert "slave bad reports offset" in caplog.text
    assert not any(lk.connected for lk in server.links())
    assert bad.log.max_phys > cluster.log.max_phys  # nothing of the slave was destroyed


async def test_wait_replicated_resolves_only_after_the_slave_acknowledges(
    cluster: Cluster,
) -> None:
    """A hand-driven slave on a raw socket decides when to acknowledge."""
    server = await cluster.start_master(min_insync=1, auto_degrade=False, ack_timeout_s=30)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(encode_hello("manual") + HEARTBEAT.pack(0))
        await writer.drain()
        await eventually(lambda: server.slave_connected, "manual slave link")
        result = cluster.log.append([Message("t", 0, None, b"payload", 1)])
        server.notify_appended()
        waiter = asyncio.create_task(server.wait_replicated(result.end_phys))
        pushed = b""
        while len(pushed) < result.end_phys:
            start, length = PUSH_HEADER.unpack(await reader.readexactly(PUSH_HEADER.size))
            body = await reader.readexactly(length)
            if start != METADATA_OFFSET:
                assert start == len(pushed)
                pushed += body
        assert pushed == cluster.log.read_raw(0, 1 << 20)
        assert not waiter.done()  # bytes were sent, but nobody acknowledged them
        writer.write(HEARTBEAT.pack(result.end_phys))
        await writer.drain()
        async with asyncio.timeout(10):
            await waiter
        assert server.links()[0].acked_offset == result.end_phys
    finally:
        writer.close()


async def test_wait_replicated_times_out_without_an_ack(cluster: Cluster) -> None:
    server = await cluster.start_master(min_insync=1, auto_degrade=False, ack_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(encode_hello("silent") + HEARTBEAT.pack(0))
        await writer.drain()
        await eventually(lambda: server.slave_connected, "silent slave link")
        result = cluster.log.append([Message("t", 0, None, b"x", 1)])
        server.notify_appended()
        with pytest.raises(ReplicationTimeoutError, match="acknowledged offset"):
            await server.wait_replicated(result.end_phys)
    finally:
        writer.close()
        del reader


async def test_sync_acks_imply_the_slave_log_holds_the_records(cluster: Cluster) -> None:
    await cluster.start_master(min_insync=1, auto_degrade=False)
    slave = await cluster.start_slave("s1", flush=FlushPolicy(mode="batch"))
    await eventually(lambda: cluster.server is not None and cluster.server.slave_connected, "link")
    for i in range(20):
        await cluster.produce([Message("t", 0, None, f"m{i}".encode(), i)])
        got = slave.log.read("t", 0, i, max_bytes=1 << 20, max_records=1)
        assert [r.body for r in got] == [f"m{i}".encode()]


async def test_static_quorum_follows_the_ack_policy(cluster: Cluster) -> None:
    # No ZooKeeper record: the seed's quorum rule, slaves within max_lag_bytes count.
    server = await cluster.start_master(min_insync=0, auto_degrade=True, in_sync_replicas=2)
    result = cluster.log.append([Message("t", 0, None, b"x", 1)])
    await server.wait_replicated(result.end_phys)  # no slave: degrade to the floor (master)
    assert server.degraded
    assert server.degraded_acks == 1
    server.policy = AckPolicy.of(min_insync=1, auto_degrade=False)
    with pytest.raises(NotEnoughReplicasError, match="the write needs 2"):
        await server.wait_replicated(result.end_phys)

    server.policy = AckPolicy.of(min_insync=1, auto_degrade=False, in_sync_replicas=3)
    slave = await cluster.start_slave("only")
    await eventually(lambda: server.slave_connected, "one slave")
    result = cluster.log.append([Message("t", 0, None, b"y", 1)])
    server.notify_appended()
    with pytest.raises(NotEnoughReplicasError, match=r"2 in sync \(the master, only\), the "
                       "write needs 3"):
        await server.wait_replicated(result.end_phys)
    # autoDegrade: the need falls to the two copies in sync (the floor is one slave).
    server.policy = AckPolicy.of(min_insync=1, auto_degrade=True, in_sync_replicas=3)
    await server.wait_replicated(result.end_phys)
    assert slave.log.max_phys >= result.end_phys
    assert server.degraded_acks == 2


async def test_waiters_fail_when_the_last_in_sync_slave_goes_away(cluster: Cluster) -> None:
    server = await cluster.start_master(min_insync=1, auto_degrade=False, ack_timeout_s=30)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode_hello("leaver") + HEARTBEAT.pack(0))
    await writer.drain()
    await eventually(lambda: server.slave_connected, "link")
    result = cluster.log.append([Message("t", 0, None, b"x", 1)])
    server.notify_appended()
    waiter = asyncio.create_task(server.wait_replicated(result.end_phys))
    await reader.readexactly(PUSH_HEADER.size)
    writer.close()
    with pytest.raises(NotEnoughReplicasError, match=r"the write needs 2 .*; offset [0-9]+ was waiting"):
        async with asyncio.timeout(10):
            await waiter


async def test_garbage_on_the_replication_port_does_not_hurt_real_slaves(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    server = await cluster.start_master(sync=False)
    caplog.set_level(logging.INFO, logger="understudy_broker.replication")
    for junk in [b"GET / HTTP/1.1\r\n\r\n", encode_hello("x")[:-1] + b"\xff" + HEARTBEAT.pack(0)]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(junk)
        await writer.drain()
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # the master closed it
        writer.close()
    assert "not a replication hello" in caplog.text
    slave = await cluster.start_slave("good")
    await cluster.produce(batch(random.Random(1), 5))
    await eventually(lambda: slave.log.max_phys == cluster.log.max_phys, "good slave")


async def test_a_failing_metadata_callback_does_not_stop_replication(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    try:
        server = await c.start_master(sync=True, auto_degrade=False)

        def broken() -> dict[str, Any]:
            raise RuntimeError("metadata source broke")

        server.metadata = broken
        slave = await c.start_slave("s1")
        await eventually(lambda: server.slave_connected, "link")
        await c.produce(batch(random.Random(2), 5))
        assert slave.log.max_phys == c.log.max_phys
        assert slave.metadata == []
    finally:
        await c.close()


class FakeMaster:
    """A master that sends exactly the frames a test gives it."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await reader.readexactly(len(encode_hello("slave")) + HEARTBEAT.size)
            for frame in self.frames:
                writer.write(frame)
            await writer.drain()
            await reader.read()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def client_of(handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any],
                    log: CommitLog, **options: Any) -> AsyncIterator[ReplicationClient]:
    """A running slave client named ``slave`` whose master is a server calling ``handle``
    on each connection; the client stopped and the server closed at the end."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = ReplicationClient(log, master_host="127.0.0.1",
                               master_port=server.sockets[0].getsockname()[1], name="slave",
                               on_metadata=lambda _d: None, on_append=lambda: None,
                               backoff_initial_s=0.05, **options)
    task = asyncio.create_task(client.run())
    try:
        yield client
    finally:
        await client.stop()
        async with asyncio.timeout(10):
            await task
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("frames", "error"),
    [
        ([PUSH_HEADER.pack(100, 4) + b"abcd"], "gap"),
        ([PUSH_HEADER.pack(0, 64 << 20)], "exceeds"),
        ([PUSH_HEADER.pack(METADATA_OFFSET, 5) + b"nope!"], "bad metadata"),
        ([PUSH_HEADER.pack(0, 40) + b"\x00\x00\x00\x28\x12\x34\x56\x78" + bytes(32)], "bad magic"),
    ],
)
async def test_bad_frames_from_the_master_drop_the_link_and_write_nothing(
    tmp_path: Path, frames: list[bytes], error: str
) -> None:
    fake = FakeMaster(frames)
    log = CommitLog.open(tmp_path / "slave", segment_bytes=SEG)
    try:
        async with client_of(fake.handle, log) as client:
            await eventually(lambda: fake.connections >= 2, "a reconnect after the bad frame")
            assert client.last_error is not None
            assert error in client.last_error
            assert log.max_phys == 0
    finally:
        log.close()


def test_append_replicated_takes_whole_records_and_rejects_bad_ones(tmp_path: Path) -> None:
    master = CommitLog.open(tmp_path / "m", segment_bytes=SEG)
    slave = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
    try:
        for i in range(12):
            master.append([Message("t", i % 2, None, bytes([i]) * 900, i)])
        data = master.read_raw(0, 1 << 20)
        with pytest.raises(ReplicationGapError, match="ends at 0"):
            slave.append_replicated(10, data)
        # A push that ends mid-record: only whole records are taken.
        first = slave.append_replicated(0, data[:2500])
        assert 0 < first < 2500
        assert slave.read("t", 0, 0, max_bytes=1 << 20, max_records=10)[0].body == bytes(900)
        # A corrupt record after a good one: the good one is kept, the bad one is not.
        rest = bytearray(data[first:])
        size = master.read("t", 1, 0, max_bytes=1, max_records=1)[0].size
        rest[size + 50] ^= 0xFF  # inside the record after the next one
        with pytest.raises(ReplicationCorruptError, match="CRC"):
            slave.append_replicated(first, bytes(rest))
        assert slave.max_phys == first + size
        seg = sorted((tmp_path / "s" / "commitlog").iterdir())[0]
        assert seg.stat().st_size == slave.max_phys
    finally:
        master.close()
        slave.close()


async def test_wake_reconnects_a_slave_at_once_instead_of_after_its_backoff(
    tmp_path: Path,
) -> None:
    """A master that comes back is linked at once when the broker wakes the client (it does
    when the master's ``live`` node reappears), not after the backoff: a failback waits for
    this link."""
    master_log = CommitLog.open(tmp_path / "m", segment_bytes=SEG)
    slave_log = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
    first = ReplicationServer(master_log, host="127.0.0.1", port=0, sync=False, metadata=dict)
    await first.start()
    port = first.port
    await first.stop()  # the master is down: the slave's first connect is refused
    client = ReplicationClient(slave_log, master_host="127.0.0.1", master_port=port, name="s",
                               on_metadata=lambda _d: None, on_append=lambda: None,
                               backoff_initial_s=600.0, backoff_max_s=600.0)
    task = asyncio.create_task(client.run())
    server = ReplicationServer(master_log, host="127.0.0.1", port=port, sync=False,
                               metadata=dict)
    try:
        await eventually(lambda: client.last_error is not None, "the refused connect")
        await server.start()  # back; without a wake the slave would wait ~10 minutes
        await asyncio.sleep(0.2)
        assert not server.slave_connected
        client.wake()
        await eventually(lambda: server.slave_connected, "the link after wake()", within_s=10)
    finally:
        await client.stop()
        async with asyncio.timeout(10):
            await task
        await server.stop()
        master_log.close()
        slave_log.close()


class SlowFront:
    """A TCP front for a master that holds each new connection ``hold_s`` before piping
    it through (``None``: for ever), as a lossy link holds a handshake whose packets are
    sent again."""

    def __init__(self, port: int, hold_s: float | None) -> None:
        self.port = port
        self.hold_s = hold_s
        self.connections = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.hold_s is None:
                await reader.read()  # until the slave gives up
                return
            await asyncio.sleep(self.hold_s)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
                dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


async def test_a_handshake_slower_than_the_link_timeout_still_links(tmp_path: Path) -> None:
    """A connection whose group-secret handshake takes longer than the 1 s link timeout (on
    a lossy link a lost SYN alone costs 1 s) still links: connecting has its own, longer
    limit. With the link timeout as the limit, every attempt was given up."""
    master_log = CommitLog.open(tmp_path / "m", segment_bytes=SEG)
    slave_log = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
    server = ReplicationServer(master_log, host="127.0.0.1", port=0, sync=False,
                               metadata=dict, group="g1", secret=b"s3cret")
    await server.start()
    try:
        async with client_of(SlowFront(server.port, hold_s=1.5).handle, slave_log,
                             link_timeout_s=1.0, group="g1", secret=b"s3cret") as client:
            await eventually(lambda: server.slave_connected, "the link through the slow front",
                             within_s=20)
            assert client.connect_timeout_s > 1.5
    finally:
        await server.stop()
        master_log.close()
        slave_log.close()


async def test_wake_gives_up_a_connection_attempt_that_hangs(tmp_path: Path) -> None:
    """An attempt that hangs (an address the master has left) is given up when the master
    comes back (wake), not after the connect timeout: a failback waits for this link."""
    slave_log = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
    front = SlowFront(0, hold_s=None)
    try:
        async with client_of(front.handle, slave_log, connect_timeout_s=600.0, group="g1",
                             secret=b"s3cret") as client:
            await eventually(lambda: front.connections == 1, "the first attempt")
            await asyncio.sleep(0.2)
            assert front.connections == 1  # it hangs: a 600 s limit
            client.wake()
            await eventually(lambda: front.connections == 2, "a new attempt after wake()",
                             within_s=10)
            assert "came back" in (client.last_error or "")
    finally:
        slave_log.close()


async def test_stop_gives_up_a_connect_nobody_answers(tmp_path: Path) -> None:
    """A connect whose SYN nobody answers (here: a listener whose accept queue is full
    drops it) ends at stop(), not after the connect timeout: a broker stops at once."""
    slave_log = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = [socket.create_connection(listener.getsockname(), timeout=5)]  # the queue full
    client = ReplicationClient(slave_log, master_host="127.0.0.1",
                               master_port=listener.getsockname()[1], name="s",
                               on_metadata=lambda _d: None, on_append=lambda: None,
                               connect_timeout_s=600.0)
    task = asyncio.create_task(client.run())
    try:
        await asyncio.sleep(0.3)
        assert not task.done()
        assert client.sessions == 0  # still connecting
        await client.stop()
        async with asyncio.timeout(5):
            await task
    finally:
        if not task.done():
            await stop_tasks([task])
        for s in (*fillers, listener):
            s.close()
        slave_log.close()


async def test_stopping_a_master_with_linked_slaves_logs_no_asyncio_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker's clean shutdown cancels its replication links; that must not look like a
    crash in the log (Python 3.11's stream server logged "Exception in callback" for every
    cancelled link)."""
    c = Cluster(tmp_path)
    try:
        server = await c.start_master(sync=True, auto_degrade=False)
        await c.start_slave("s1")
        await eventually(lambda: server.slave_connected, "link")
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            await server.stop()
            await asyncio.sleep(0.05)  # the stream server's done-callbacks run
        assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    finally:
        await c.close()


async def test_a_slave_takes_nothing_from_a_master_behind_its_epoch(cluster: Cluster) -> None:
    """A master woken from a pause (or back from a partition) still writes at the epoch it
    knew while the group moved on: its slave, at the newer epoch, must not take (and so
    not acknowledge) those bytes, or the write is acknowledged by a master the group has
    fenced. Once the master names the slave's epoch, replication goes on."""
    master_epoch, slave_epoch = [3], [3]
    server = await cluster.start_master(epoch=master_epoch, ack_timeout_s=0.5,
                                        min_insync=1, auto_degrade=False)
    slave = await cluster.start_slave("s", epoch=slave_epoch)
    await eventually(lambda: sum(lk.in_sync for lk in server.links()) == 1, "in sync")
    rng = random.Random(3)
    before = await cluster.produce(batch(rng, 3))  # same epoch: taken and acknowledged
    assert slave.log.max_phys == before
    slave_epoch[0] = 5  # the group failed over; the master has not heard yet
    result = cluster.log.append(batch(rng, 2))
    server.notify_appended()
    with pytest.raises((ReplicationTimeoutError, NotEnoughReplicasError)):
        await server.wait_replicated(result.end_phys)
    assert slave.log.max_phys == before  # nothing taken, nothing acknowledged
    assert slave.client.last_error is not None
    assert "this slave applied epoch 5" in slave.client.last_error
    master_epoch[0] = 6  # it applied the group's newer state
    server.push_metadata_now()
    await eventually(lambda: slave.log.max_phys == result.end_phys, "the slave caught up", 10)


async def test_each_slave_that_agrees_echoes_the_masters_probes(cluster: Cluster) -> None:
    """The slave route's wire (docs/failover.md, "A master cut off from ZooKeeper only"): a
    probe rides in the master's metadata frames; a slave echoes it with the epoch its
    broker names, and only if the broker agrees; replication goes on alongside."""
    echoes: list[tuple[str, int, int]] = []
    seqs = itertools.count(1)
    server = await cluster.start_master(
        epoch=[7], extra=lambda: {"probe": {"seq": next(seqs), "hold_ms": 700}},
        on_echo=lambda name, seq, epoch: echoes.append((name, seq, epoch)))
    asked: list[tuple[int, float]] = []

    def agree(master_epoch: int, hold_s: float) -> int:
        asked.append((master_epoch, hold_s))
        return master_epoch

    await cluster.start_slave("s1", on_probe=agree)
    await cluster.start_slave("s2", on_probe=lambda _e, _h: None)
    await eventually(lambda: len(echoes) >= 3, "three echoes from s1")
    assert {name for name, _s, _e in echoes} == {"s1"}
    assert {epoch for _n, _s, epoch in echoes} == {7}
    assert [seq for _n, seq, _e in echoes] == sorted(seq for _n, seq, _e in echoes)
    assert asked[0] == (7, 0.7)
    await eventually(lambda: sum(lk.in_sync for lk in server.links()) == 2, "two in-sync slaves")
    end = await cluster.produce(batch(random.Random(1), 5))
    assert all(s.log.max_phys >= end for s in cluster.slaves)


async def test_a_malformed_probe_drops_the_link_with_a_clear_error(cluster: Cluster) -> None:
    await cluster.start_master(extra=lambda: {"probe": {"seq": "one", "hold_ms": 700}})
    slave = await cluster.start_slave("s1", on_probe=lambda e, _h: e)
    await eventually(lambda: "probe" in (slave.client.last_error or ""), "the link dropped")
    assert "bad metadata frame" in (slave.client.last_error or "")


async def test_a_slave_mends_a_record_damaged_in_its_copy_with_the_masters(cluster: Cluster) -> None:
    """A byte flipped in the middle of an old segment of the slave's copy: the slave finds
    the record damaged (a read reports it), asks its master for that record, checks the
    master's copy is intact and the same record, and writes it over its own in place: the
    read serves it again and the slave's files are byte-identical to the master's. A
    record the master cannot send intact stays damaged (reported, never served)."""
    server = await cluster.start_master(sync=True)
    slave = await cluster.start_slave("s1")
    await eventually(lambda: sum(lk.in_sync for lk in server.links()) == 1, "an in-sync slave")
    rng = random.Random(5)
    for _ in range(30):
        await cluster.produce(batch(rng, 4))
    target = cluster.log.read("a", 0, 2, max_bytes=1, max_records=1)[0]
    assert target.phys_offset < cluster.log.max_phys - 2 * SEG  # an old, sealed segment
    await slave.stop()
    cluster.slaves.remove(slave)
    base = target.phys_offset - target.phys_offset % SEG
    segment = cluster.root / "s1" / "commitlog" / f"{base:020d}"
    raw = bytearray(segment.read_bytes())
    raw[target.phys_offset - base + target.size - 1] ^= 0xFF  # the body's last byte
    segment.write_bytes(bytes(raw))

    slave = await cluster.start_slave("s1")
    with pytest.raises(DamagedRecordError):
        slave.log.read("a", 0, 2, max_bytes=1, max_records=1)
    await eventually(lambda: slave.client.repaired == 1, "the slave to mend the record")
    (mended,) = slave.log.read("a", 0, 2, max_bytes=1, max_records=1)
    assert (mended.body, mended.phys_offset) == (target.body, target.phys_offset)
    for log in (cluster.log, slave.log):
        log.flush_indexes()  # indexes are written behind the log (storage/index.py)
    assert files_of(cluster.root / "s1") == files_of(cluster.root / "master")


def test_a_repair_is_refused_when_the_copy_is_not_that_record(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        log.append(batch(random.Random(2), 40))
        first = log.read("a", 0, 0, max_bytes=1, max_records=1)[0]
        other = log.read("b", 0, 0, max_bytes=1, max_records=1)[0]
        assert log.repair(first.phys_offset, b"x") == "no damaged record known there"
        intact = log.record_bytes(first.phys_offset)
        assert intact is not None
        assert len(intact) == first.size
        assert log.record_bytes(first.phys_offset + 1) is None  # not a record's start
    finally:
        log.close()
    raw = bytearray((tmp_path / "commitlog" / f"{0:020d}").read_bytes())
    raw[first.phys_offset + first.size - 1] ^= 0xFF
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(bytes(raw))
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        with pytest.raises(DamagedRecordError):
            log.read("a", 0, 0, max_bytes=1, max_records=1)
        assert log.record_bytes(first.phys_offset) is None  # this copy is not intact
        wrong = log.record_bytes(other.phys_offset)
        assert wrong is not None
        assert "not a/0 offset 0" in (log.repair(first.phys_offset, wrong) or "")
        assert "not intact either" in (log.repair(first.phys_offset, intact[:-1] + b"?") or "")
        assert log.repair(first.phys_offset, intact) is None
        assert log.read("a", 0, 0, max_bytes=1, max_records=1)[0].body == first.body
    finally:
        log.close()
