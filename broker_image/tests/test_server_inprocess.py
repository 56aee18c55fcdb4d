"""The server in this process (real log, real sockets on 127.0.0.1) with an authority the
test can change: stale epochs, permission changes seen by running long-polls,
pipelining of a long-poll and another request on one connection, group commit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Connection, Producer, create_topic
from understudy_broker.config import BrokerConfig
from understudy_broker.model import Health, Permission, Role
from understudy_broker.protocol import BrokerRoute, GroupRoute
from understudy_broker.server import Broker

pytestmark = pytest.mark.integration


class SettableAuthority:
    """A real Authority whose permission and epoch the test sets (the shape the HA
    issue's ZooKeeper authority will have)."""

    def __init__(self) -> None:
        self.perm = Permission.FULL
        self._epoch = 5
        self._listeners: list[Callable[[], None]] = []
        self.address = ""

    role = Role.MASTER
    name = "m"
    group = "g"

    def effective(self) -> Permission:
        return self.perm

    def epoch(self) -> int:
        return self._epoch

    def set(self, perm: Permission, epoch: int) -> None:
        self.perm, self._epoch = perm, epoch
        for fn in self._listeners:
            fn()

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def update_health(self, health: Health) -> None:
        return None

    async def route(self) -> list[GroupRoute]:
        return [GroupRoute("g", [BrokerRoute("m", self.address, "master", int(self.perm), self._epoch)])]

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Broker, SettableAuthority, str]]:
    auth = SettableAuthority()
    cfg = BrokerConfig(data_dir=tmp_path / "d", port=0, replication_port=0, sync=False, name="m",
                       group="g")
    broker = Broker(cfg, authority=auth)
    where = await broker.start()
    auth.address = f"127.0.0.1:{where.port}"
    try:
        yield broker, auth, f"127.0.0.1:{where.port}"
    finally:
        await broker.stop()


async def test_stale_epoch_is_refused_and_unknown_epoch_accepted(served: Any) -> None:
    _broker, _auth, addr = served
    await create_topic([addr], topic="t", queues=1)
    conn = await Connection.open(addr)
    try:
        body = p.ProduceRequest("t", [p.ProduceMessage(0, None, b"x")]).encode()
        with pytest.raises(BrokerError) as info:
            await conn.request(p.Op.PRODUCE, body, epoch=4)
        assert info.value.status == p.Status.STALE_EPOCH
        for epoch in (0, 5, 6):
            resp = p.ProduceResponse.decode(await conn.request(p.Op.PRODUCE, body, epoch=epoch))
            assert len(resp.offsets) == 1
    finally:
        await conn.close()


async def test_long_poll_does_not_block_the_connection_and_wakes_on_data(served: Any) -> None:
    _broker, _auth, addr = served
    await create_topic([addr], topic="lp", queues=1)
    conn = await Connection.open(addr)
    try:
        pull = conn.send(p.Op.PULL, p.PullRequest("lp", 0, 0, 1 << 20, 30_000).encode())
        # A request pipelined behind the long-poll is answered while the poll waits.
        hb = await conn.request(p.Op.HEARTBEAT, b"{}")
        assert p.HeartbeatResponse.decode(hb).role == "master"
        assert not pull.done()
        async with Producer([addr]) as prod:
            await (await prod.send("lp", b"wake up", queue=0))
        frame = await asyncio.wait_for(pull, 20)
        resp = p.PullResponse.decode(frame.body)
        assert [r.body for r in resp.records] == [b"wake up"]
        assert resp.next_offset == 1
    finally:
        await conn.close()


async def test_losing_read_ends_a_waiting_long_poll_with_no_permission(served: Any) -> None:
    _broker, auth, addr = served
    await create_topic([addr], topic="lp2", queues=1)
    conn = await Connection.open(addr)
    try:
        pull = conn.send(p.Op.PULL, p.PullRequest("lp2", 0, 0, 1 << 20, 30_000).encode())
        await conn.request(p.Op.HEARTBEAT, b"{}")  # the pull is now waiting
        auth.set(Permission.WRITE, 6)
        frame = await asyncio.wait_for(pull, 20)
        assert frame.status == p.Status.NO_PERMISSION
    finally:
        await conn.close()


async def test_concurrent_batches_share_fsyncs(served: Any) -> None:
    broker, _auth, addr = served
    await create_topic([addr], topic="gc", queues=4)
    conns = [await Connection.open(addr) for _ in range(8)]
    try:
        body = p.ProduceRequest("gc", [p.ProduceMessage(q % 4, None, b"y" * 512) for q in range(16)]).encode()
        labels = {"group": "g", "broker": "m"}

        def flushes() -> float:
            return broker.metrics.registry.get_sample_value("understudy_log_flushes_total", labels) or 0

        before = flushes()
        requests = 0
        for _ in range(5):
            await asyncio.gather(*(c.request(p.Op.PRODUCE, body) for c in conns))
            requests += len(conns)
        assert 1 <= flushes() - before < requests
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await c.close()


async def test_stop_persists_offsets_and_reopen_keeps_data(tmp_path: Path) -> None:
    cfg = BrokerConfig(data_dir=tmp_path / "d", port=0, replication_port=0, sync=False)
    broker = Broker(cfg)
    where = await broker.start()
    addr = f"127.0.0.1:{where.port}"
    try:
        await create_topic([addr], topic="keep", queues=2)
        async with Producer([addr]) as prod:
            await (await prod.send("keep", b"a", queue=1))
        conn = await Connection.open(addr)
        await conn.request(p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("g", "keep", {1: 1}).encode())
        # offsets never move backwards
        stored = p.OffsetsResponse.decode(
            await conn.request(p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("g", "keep", {1: 0}).encode())
        )
        assert stored.offsets == {1: 1}
        await conn.close()
    finally:
        await broker.stop()

    again = Broker(cfg)
    where = await again.start()
    try:
        conn = await Connection.open(f"127.0.0.1:{where.port}")
        fetched = p.OffsetsResponse.decode(
            await conn.request(p.Op.FETCH_OFFSET, p.FetchOffsetRequest("g", "keep", [0, 1]).encode())
        )
        assert fetched.offsets == {0: None, 1: 1}
        pulled = p.PullResponse.decode(
            await conn.request(p.Op.PULL, p.PullRequest("keep", 1, 0, 1000, 0).encode())
        )
        assert [r.body for r in pulled.records] == [b"a"]
        await conn.close()
    finally:
        await again.stop()
