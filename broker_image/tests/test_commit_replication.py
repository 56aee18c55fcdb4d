"""Consumer commits replicated through the commit log (master and slave brokers in this
process, real logs, real sockets on 127.0.0.1): a sync-mode commit is acknowledged only
once a slave holds it, a slave rebuilds commits from its log after a restart, and the
internal topic stays out of clients' reach."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Connection
from understudy_broker.config import BrokerConfig
from understudy_broker.model import Permission, Role
from understudy_broker.server.broker import Broker
from understudy_broker.server.replica import MasterReplica
from understudy_broker.storage.offsets import COMMITS_TOPIC

pytestmark = pytest.mark.integration


def master_cfg(root: Path) -> BrokerConfig:
    return BrokerConfig(data_dir=root / "m", port=0, replication_port=0, sync=True,
                        min_insync_replicas=1, auto_degrade=False, ack_timeout_s=2.0,
                        flush="interval", name="m", group="g")


def slave_cfg(root: Path, repl_port: int) -> BrokerConfig:
    return BrokerConfig(data_dir=root / "s", port=0, role=Role.SLAVE, name="s", group="g",
                        permission=Permission.READ, master=("127.0.0.1", repl_port),
                        flush="interval", offsets_persist_interval_s=3600.0)


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Broker]:
    broker = Broker(master_cfg(tmp_path))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def connect(broker: Broker) -> Connection:
    return await Connection.open(f"127.0.0.1:{broker.listening.port}")


async def commit(conn: Connection, offsets: dict[int, int]) -> dict[int, int | None]:
    body = await conn.request(p.Op.COMMIT_OFFSET,
                              p.CommitOffsetRequest("cg", "t", offsets).encode(), timeout_s=10)
    return p.OffsetsResponse.decode(body).offsets


async def start_slave(root: Path, master: Broker) -> Broker:
    slave = Broker(slave_cfg(root, master.listening.replication_port or 0))
    await slave.start()
    return slave


async def wait_linked(master: Broker) -> None:
    replica = master.parts.replica
    assert isinstance(replica, MasterReplica)
    rs = replica.server
    for _ in range(500):
        if any(lk.in_sync for lk in rs.links()):
            return
        await asyncio.sleep(0.02)
    pytest.fail("the slave never linked")


async def test_sync_commit_is_on_the_slave_when_acknowledged(
        master: Broker, tmp_path: Path) -> None:
    slave = await start_slave(tmp_path, master)
    conn = await connect(master)
    try:
        await wait_linked(master)
        await conn.request(p.Op.CREATE_TOPIC, p.CreateTopicRequest("t", 2).encode())
        for n in range(1, 30):
            assert await commit(conn, {0: n, 1: 2 * n}) == {0: n, 1: 2 * n}
            # No sleep: the acknowledgement itself guarantees the slave has applied it.
            assert (slave.store.offsets.get("cg", "t", 0), slave.store.offsets.get("cg", "t", 1)) == (n, 2 * n)
        # A commit that moves nothing is answered with the stored values.
        assert await commit(conn, {0: 3}) == {0: 29}
    finally:
        await conn.close()
        await slave.stop()


async def test_sync_commit_without_a_slave_is_not_acknowledged(master: Broker) -> None:
    conn = await connect(master)
    try:
        await conn.request(p.Op.CREATE_TOPIC, p.CreateTopicRequest("t", 1).encode())
        with pytest.raises(BrokerError) as err:
            await commit(conn, {0: 5})
        assert err.value.status == p.Status.NOT_ENOUGH_REPLICAS
    finally:
        await conn.close()


async def test_restarted_slave_rebuilds_commits_from_its_log(
        master: Broker, tmp_path: Path) -> None:
    slave = await start_slave(tmp_path, master)
    conn = await connect(master)
    try:
        await wait_linked(master)
        await conn.request(p.Op.CREATE_TOPIC, p.CreateTopicRequest("t", 1).encode())
        await commit(conn, {0: 41})
    finally:
        await conn.close()
        await slave.stop()
    # The slave persists offsets.json on an (here: hour-long) interval and at stop; remove
    # the file to show the log alone carries the commit.
    (tmp_path / "s" / "offsets.json").unlink()
    slave = Broker(replace(slave_cfg(tmp_path, 1), master=("127.0.0.1", 1)))
    await slave.start()
    try:
        assert slave.store.offsets.get("cg", "t", 0) == 41
        assert COMMITS_TOPIC not in slave.store.topics.snapshot()
    finally:
        await slave.stop()


async def test_internal_commit_topic_is_out_of_clients_reach(master: Broker, tmp_path: Path) -> None:
    slave = await start_slave(tmp_path, master)
    conn = await connect(master)
    try:
        await wait_linked(master)
        await conn.request(p.Op.CREATE_TOPIC, p.CreateTopicRequest("t", 1).encode())
        await commit(conn, {0: 1})
        with pytest.raises(BrokerError) as err:
            await conn.request(p.Op.CREATE_TOPIC, p.CreateTopicRequest(COMMITS_TOPIC, 1).encode())
        assert err.value.status == p.Status.BAD_REQUEST
        assert "reserved" in str(err.value)
        for op, body in (
            (p.Op.PULL, p.PullRequest(COMMITS_TOPIC, 0, 0, 1 << 16, 0).encode()),
            (p.Op.PRODUCE, p.ProduceRequest(COMMITS_TOPIC, [p.ProduceMessage(0, None, b"x")]).encode()),
        ):
            with pytest.raises(BrokerError) as err:
                await conn.request(op, body)
            assert err.value.status == p.Status.UNKNOWN_TOPIC
        route = p.RouteResponse.decode(await conn.request(p.Op.GET_ROUTE,
                                                          p.GetRouteRequest(None).encode()))
        assert set(route.topics) == {"t"}
    finally:
        await conn.close()
        await slave.stop()
