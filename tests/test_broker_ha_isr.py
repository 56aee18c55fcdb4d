"""The in-sync record and replicated commits on a real local cluster: real ZooKeeper,
real ``understudy broker --zk`` processes (a master, two slaves, synchronous replication
with ``minInSyncReplicas=1``), the real ``understudy controller``.

One story, in order: both slaves are in ``/groups/g1/isr``; one slave is frozen (SIGSTOP)
and leaves the record before the next produce or commit is acknowledged; the master is
killed right after a commit acknowledgement; the controller hands READ to the in-sync
slave, whose committed offset is at least the acknowledged one; the master returns and
the frozen slave, resumed and caught up, is back in the record. The clients live through
the kill without "Future exception was never retrieved" noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Connection, Consumer, Producer, create_topic
from understudy_broker.zkclient import make_client
from understudy_broker.zklayout import decode_state, state_path
from understudy_harness.testing import eventually, isr_record
from understudy_operator.local import cluster as lc

pytestmark = pytest.mark.integration

GROUP = "g1"
MASTER, S1, S2 = "g1-0", "g1-1", "g1-2"


def isr(zk: KazooClient) -> frozenset[str] | None:
    return isr_record(zk, GROUP)


def state(zk: KazooClient) -> tuple[str, str | None]:
    st = decode_state(zk.get(state_path(GROUP))[0])
    return st.mode.name, st.acting


async def fetch(address: str, queues: list[int]) -> dict[int, int | None]:
    conn = await Connection.open(address)
    try:
        body = await conn.request(p.Op.FETCH_OFFSET,
                                  p.FetchOffsetRequest("cg", "t", queues).encode())
        return p.OffsetsResponse.decode(body).offsets
    finally:
        await conn.close()


async def test_isr_shrinks_before_the_ack_failover_picks_in_sync_slave_and_commits_survive(
        cluster_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    plan = lc.up(cluster_dir, slaves=2, session_timeout_ms=4000)
    address = dict(zip([MASTER, S1, S2], plan.bootstrap(GROUP), strict=True))
    bootstrap = plan.bootstrap(GROUP)
    zk = make_client(plan.zk_connect, timeout_s=5.0)
    zk.start(timeout=10)
    producer = Producer(bootstrap, request_timeout_s=10)
    consumer = Consumer(bootstrap, group="cg", topic="t", max_wait_ms=200)
    try:
        await create_topic(bootstrap, topic="t", queues=2)
        await asyncio.gather(*[await producer.send("t", f"a{i}".encode(), queue=i % 2)
                               for i in range(100)])
        await eventually(lambda: isr(zk) == {S1, S2}, "both slaves in the ISR record")

        # A frozen slave leaves the record before anything is acknowledged without it.
        lc.kill(plan.dir, S2, sig="STOP")
        await (await producer.send("t", b"after-stop", queue=0))
        assert isr(zk) == {S1}
        await asyncio.gather(*[await producer.send("t", f"b{i}".encode(), queue=i % 2)
                               for i in range(50)])
        seen = 0
        while seen < 120:
            seen += len(await consumer.getmany(timeout_s=1.0))
        acked = await consumer.commit()
        assert isr(zk) == {S1}
        lc.kill(plan.dir, MASTER)  # right after the commit acknowledgement
        lc.start(plan.dir, S2, wait=False)  # resumed: live again, but not in sync

        await eventually(lambda: state(zk)[0] == "SLAVE_CONSUME", "SLAVE_CONSUME", 40)
        assert state(zk) == ("SLAVE_CONSUME", S1)
        # S1 reads once it applied the state and renewed its lease (a moment after
        # ZooKeeper shows it): ask until it answers.
        on_slave = await eventually(lambda: fetch(address[S1], [0, 1]),
                                    "the acting slave answering", tolerate=(BrokerError,))
        for q, off in acked.items():
            assert off is not None
            assert (on_slave[q] or 0) >= off, (q, on_slave, acked)
        # The consumer reads the rest from the acting slave and commits there.
        while seen < 151:
            seen += len(await consumer.getmany(timeout_s=1.0))
        await consumer.commit()

        lc.start(plan.dir, MASTER, wait=False)
        await eventually(lambda: state(zk)[0] == "NORMAL", "NORMAL after back-sync", 60)
        await eventually(lambda: isr(zk) == {S1, S2}, "the resumed slave back in the ISR", 30)
        await (await producer.send("t", b"after-failback", queue=1))
        # Producer and consumer lived through the kill and follow the master back.
        async def read_after_failback() -> bool:
            return b"after-failback" in [r.body for r in await consumer.getmany(timeout_s=1.0)]

        await eventually(read_after_failback, "the consumer reading from the master again", 30)
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(15):
                await producer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(15):
                await consumer.close()
        zk.stop()
        zk.close()
        lc.down(plan.dir)
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text, caplog.text
