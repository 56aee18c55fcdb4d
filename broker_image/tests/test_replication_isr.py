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
    AckPolicy,
    IsrConflictError,
    NotEnoughReplicasError,
    ReplicationTimeoutError,
    write_outcome,
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
                async with asyncio.timeout(10):
                    await task
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


async def silent_slave(server: ReplicationServer, name: str, at: int = 0
                       ) -> asyncio.StreamWriter:
    """A slave that says hello at offset ``at`` and then never acknowledges anything."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode_hello(name) + HEARTBEAT.pack(at))
    await writer.drain()
    return writer


# ---- the policy, pure ---------------------------------------------------------------
@pytest.mark.parametrize(("isr", "floor", "degrade", "in_sync", "needed"), [
    (2, 1, False, 3, 2), (2, 1, False, 1, 2),          # the default: master + one slave
    (3, 1, False, 2, 3),                                # no degrade: the need stays
    (3, 1, True, 3, 3), (3, 1, True, 2, 2),             # degrade to the copies in sync...
    (3, 1, True, 1, 2),                                 # ...never below the floor
    (3, 0, True, 1, 1), (2, 0, True, 1, 1),             # floor 0: the master alone
    (1, 0, False, 3, 1),                                # asynchronous in all but name
])
def test_copies_needed_follows_seed_001(isr: int, floor: int, degrade: bool, in_sync: int,
                                        needed: int) -> None:
    policy = AckPolicy.of(in_sync_replicas=isr, min_insync=floor, auto_degrade=degrade)
    assert policy.copies_needed(in_sync) == needed


def test_policy_defaults_to_the_floor_plus_the_master_and_refuses_a_floor_above_it() -> None:
    assert AckPolicy.of(min_insync=2, auto_degrade=False).in_sync_replicas == 3
    with pytest.raises(ValueError, match=r"in_sync_replicas \(2, the master included\) must be "
                       r"at least min_insync \+ 1 \(3\)"):
        AckPolicy.of(min_insync=2, auto_degrade=True, in_sync_replicas=2)
    with pytest.raises(ValueError, match="min_insync must be >= 0"):
        AckPolicy.of(min_insync=-1, auto_degrade=False)


def test_every_member_acknowledges_even_when_fewer_copies_would_do() -> None:
    # inSyncReplicas 2 with two in-sync slaves: the write still waits for both (that is
    # what lets the controller fail over to either without a rewind).
    policy = AckPolicy.of(min_insync=1, auto_degrade=False)
    acked = {"s1": 10, "s2": 5}
    kw: dict[str, Any] = dict(recorded=frozenset({"s1", "s2"}), joining=(),
                              acked=lambda m: acked.get(m, -1), end=10, policy=policy)
    assert write_outcome(leaving=(), **kw) is None
    assert write_outcome(leaving=("s2",), **kw) is None  # not until the record drops s2
    assert write_outcome(leaving=(), **{**kw, "recorded": frozenset({"s1"})}) is True
    # Too few copies is refused at once, whoever has acknowledged.
    assert write_outcome(leaving=(), **{**kw, "recorded": frozenset()}) is False


# ---- the server -------------------------------------------------------------------
async def test_a_slave_too_many_bytes_behind_leaves_before_the_time_bound(group: Group) -> None:
    store = MemoryIsr(frozenset({"s1"}))
    server = await group.master(store, min_insync=1, auto_degrade=True, in_sync_replicas=3,
                                isr_lag_s=30.0, ack_timeout_s=30.0, max_lag_bytes=1000)
    group.slave("s1")
    await eventually(lambda: server.isr is not None and linked(server) == 1, "s1 linked")
    end = group.append(b"x" * 2000)
    await server.wait_replicated(end, start_phys=0)
    # "silent" holds every byte, joins, then never acknowledges again.
    writer = await silent_slave(server, "silent", at=end)
    writer.write(HEARTBEAT.pack(end))  # acknowledges what it said it holds: it joins
    try:
        await eventually(lambda: store.members == {"s1", "silent"}, "silent joins")
        # The write in flight is not lag: the next one waits for silent...
        first = asyncio.create_task(server.wait_replicated(group.append(b"y" * 2000),
                                                           start_phys=end))
        await asyncio.sleep(0.3)
        assert not first.done()
        assert store.members == {"s1", "silent"}
        # ...and the one after it finds silent 2 KB behind: it leaves now, not after 30 s.
        async with asyncio.timeout(5):
            await server.wait_replicated(group.append(b"z"), start_phys=group.log.max_phys - 60)
        async with asyncio.timeout(5):
            await first
        assert store.members == {"s1"}
        # Each of the three writes had two copies, not inSyncReplicas' three: autoDegrade
        # let the need fall to the copies in sync (the floor is one slave).
        assert server.degraded_acks == 3
        assert server.degraded
    finally:
        writer.close()


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
        with pytest.raises(NotEnoughReplicasError, match=r"1 in sync \(the master\), the "
                           r"write needs 2 \(inSyncReplicas 2, minInSyncReplicas 1"):
            await server.wait_replicated(group.append(b"x"))
        # Refused as soon as the need cannot be met (the producer moves on); the record
        # drops the silent slave all the same.
        await eventually(lambda: store.members == frozenset(), "silent leaves the record")
        # autoDegrade with the floor at no slave: the master alone acknowledges.
        server.policy = AckPolicy.of(min_insync=0, auto_degrade=True, in_sync_replicas=2)
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
