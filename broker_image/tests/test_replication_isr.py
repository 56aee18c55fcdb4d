"""The in-sync set (ISR) of ReplicationServer over real loopback sockets, with an
in-memory record standing in for ZooKeeper (the ZooKeeper store itself is exercised by
tests/test_broker_ha_isr.py). The rule under test: nothing is acknowledged without an ISR
member before the record stops naming it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from understudy_broker.replication.isr import (
    IsrConflictError,
    NotEnoughReplicasError,
    ReplicationTimeoutError,
)
from understudy_broker.replication.master import ReplicationServer
from understudy_broker.replication.slave import ReplicationClient
from understudy_broker.replication.wire import HEARTBEAT, encode_hello
from understudy_broker.storage.commitlog import CommitLog, FlushPolicy
from understudy_broker.storage.records import Message
from understudy_harness.testing import eventually

SEG = 8 << 10


class MemoryIsr:
    """An IsrStore with versions; ``down`` makes it fail like an unreachable ZooKeeper."""

    def __init__(self, members: frozenset[str] | None = None) -> None:
        self.members = members
        self.version = -1 if members is None else 0
        self.writes: list[frozenset[str]] = []
        self.down = False
        self.initial = frozenset({"s1", "s2"})

    async def load(self) -> tuple[frozenset[str], int]:
        if self.down:
            raise ConnectionError("store down")
        if self.members is None:
            return self.initial, -1
        return self.members, self.version

    async def store(self, members: frozenset[str], *, version: int) -> int:
        await asyncio.sleep(0.01)  # a round trip: waiters must not slip through meanwhile
        if self.down:
            raise ConnectionError("store down")
        if version != (self.version if self.members is not None else -1):
            raise IsrConflictError(f"at {self.version}, not {version}")
        self.members, self.version = members, self.version + 1
        self.writes.append(members)
        return self.version


class Group:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = CommitLog.open(root / "master", segment_bytes=SEG)
        self.server: ReplicationServer | None = None
        self.clients: list[tuple[ReplicationClient, asyncio.Task[None], CommitLog]] = []

    async def master(self, store: MemoryIsr, **kw: Any) -> ReplicationServer:
        kw.setdefault("isr_lag_s", 1.0)  # long enough for a healthy slave under load
        self.server = ReplicationServer(self.log, host="127.0.0.1", port=0, sync=True,
                                        metadata=dict, isr=store, isr_retry_s=0.02, **kw)
        await self.server.start()
        return self.server

    def slave(self, name: str) -> ReplicationClient:
        assert self.server is not None
        log = CommitLog.open(self.root / name, segment_bytes=SEG, flush=FlushPolicy())
        client = ReplicationClient(log, master_host="127.0.0.1", master_port=self.server.port,
                                   name=name, on_metadata=lambda _d: None, on_append=lambda: None,
                                   backoff_initial_s=0.05, backoff_max_s=0.2)
        self.clients.append((client, asyncio.create_task(client.run()), log))
        return client

    def append(self, body: bytes) -> int:
        assert self.server is not None
        end = self.log.append([Message("t", 0, None, body, 1)]).end_phys
        self.server.notify_appended()
        return end

    async def close(self) -> None:
        for client, task, log in self.clients:
            await client.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
            log.close()
        if self.server is not None:
            await self.server.stop()
        self.log.close()


@pytest.fixture
async def group(tmp_path: Path) -> AsyncIterator[Group]:
    g = Group(tmp_path)
    try:
        yield g
    finally:
        await g.close()


def linked(server: ReplicationServer) -> int:
    return sum(1 for lk in server.links() if lk.connected)


async def silent_slave(server: ReplicationServer, name: str) -> asyncio.StreamWriter:
    """A slave that says hello at offset 0 and then never acknowledges anything."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode_hello(name) + HEARTBEAT.pack(0))
    await writer.drain()
    return writer


async def test_absent_record_is_created_and_caught_up_slaves_stay_in_it(group: Group) -> None:
    store = MemoryIsr()
    # A generous lag bound: on a loaded machine a healthy slave must not be evicted here.
    server = await group.master(store, min_insync=1, auto_degrade=False, isr_lag_s=10.0)
    group.slave("s1")
    group.slave("s2")
    await eventually(lambda: store.members == {"s1", "s2"} and server.isr == {"s1", "s2"}
                     and linked(server) == 2, "record created with the configured slaves")
    for i in range(10):
        await server.wait_replicated(group.append(f"m{i}".encode()))
    assert store.writes == [frozenset({"s1", "s2"})]  # nothing left, nothing re-written
    assert [lk.in_sync for lk in server.links()] == [True, True]


async def test_silent_member_leaves_the_record_before_the_ack(group: Group) -> None:
    store = MemoryIsr(frozenset({"s1", "silent"}))
    server = await group.master(store, min_insync=1, auto_degrade=False)
    group.slave("s1")
    writer = await silent_slave(server, "silent")
    try:
        await eventually(lambda: server.isr is not None and linked(server) == len(server.isr),
                         "record loaded, its slaves linked")
        end = group.append(b"x")
        await server.wait_replicated(end)
        # The acknowledgement came after the record stopped naming the silent slave.
        assert store.members == {"s1"}
        assert server.degraded_acks == 0
        # The silent slave acknowledges everything: it is caught up and joins again.
        writer.write(HEARTBEAT.pack(end))
        await writer.drain()
        await eventually(lambda: store.members == {"s1", "silent"}, "silent slave rejoins")
        assert store.writes == [frozenset({"s1"}), frozenset({"s1", "silent"})]
    finally:
        writer.close()


async def test_too_small_isr_refuses_or_degrades_after_shrinking(group: Group) -> None:
    store = MemoryIsr(frozenset({"silent"}))
    server = await group.master(store, min_insync=1, auto_degrade=False)
    writer = await silent_slave(server, "silent")
    try:
        await eventually(lambda: server.isr is not None and linked(server) == len(server.isr),
                         "record loaded, its slaves linked")
        with pytest.raises(NotEnoughReplicasError, match="min_insync is 1"):
            await server.wait_replicated(group.append(b"x"))
        assert store.members == frozenset()  # shrunk first, then refused
        server.auto_degrade = True
        await server.wait_replicated(group.append(b"y"))
        assert server.degraded_acks == 1
        assert server.degraded
    finally:
        writer.close()


async def test_a_disconnected_member_leaves_before_the_next_ack_not_before(group: Group) -> None:
    store = MemoryIsr(frozenset({"s1", "s2"}))
    server = await group.master(store, min_insync=1, auto_degrade=False, isr_lag_s=10.0)
    group.slave("s1")
    s2 = group.slave("s2")
    await eventually(lambda: server.isr == {"s1", "s2"} and len(server.links()) == 2, "links")
    await server.wait_replicated(group.append(b"a"))
    await s2.stop()
    await eventually(lambda: not all(lk.connected for lk in server.links()), "s2 link down")
    # No write is waiting: the record is left alone (the controller picks from it).
    await asyncio.sleep(0.2)
    assert store.members == {"s1", "s2"}
    await server.wait_replicated(group.append(b"b"))
    assert store.members == {"s1"}  # removed before that acknowledgement


async def test_unreachable_store_blocks_acks_until_it_is_back(group: Group) -> None:
    store = MemoryIsr(frozenset({"s1", "silent"}))
    server = await group.master(store, min_insync=1, auto_degrade=True, ack_timeout_s=1.5)
    group.slave("s1")
    writer = await silent_slave(server, "silent")
    try:
        await eventually(lambda: server.isr is not None and linked(server) == len(server.isr),
                         "record loaded, its slaves linked")
        store.down = True
        with pytest.raises(ReplicationTimeoutError, match="in-sync slaves"):
            await server.wait_replicated(group.append(b"x"))
        assert server.degraded_acks == 0  # never acknowledged around the record
        store.down = False
        server.ack_timeout_s = 10
        await server.wait_replicated(group.append(b"y"))
        assert store.members == {"s1"}
    finally:
        writer.close()


async def test_version_conflict_reloads_and_writes_again(group: Group) -> None:
    store = MemoryIsr(frozenset({"s1", "silent"}))
    server = await group.master(store, min_insync=1, auto_degrade=False)
    group.slave("s1")
    writer = await silent_slave(server, "silent")
    try:
        await eventually(lambda: server.isr is not None and linked(server) == len(server.isr),
                         "record loaded, its slaves linked")
        store.version += 5  # someone else wrote the record
        await server.wait_replicated(group.append(b"x"))
        assert store.members == {"s1"}
    finally:
        writer.close()
