"""Quorum writes (seed 001 §9, docs/replication.md) on a real local group: ZooKeeper, a
master and two slaves as ``understudy broker --zk`` processes, the controller.

``inSyncReplicas: 3`` (every broker holds every write) with the floor at one slave. Strict,
a write is refused with NOT_ENOUGH_REPLICAS as soon as a slave is gone; with autoDegrade
the need falls to the copies in sync, and only the floor refuses. Either way the refusal
names what is in sync and what the write needed, and writes resume once the slaves are
back in the in-sync record.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Connection, create_topic
from understudy_broker.zkclient import make_client
from understudy_broker.zklayout import ReplicationPolicy
from understudy_harness.testing import eventually, isr_record
from understudy_operator.local import cluster as lc

pytestmark = pytest.mark.integration

GROUP = "g1"
MASTER, S1, S2 = "g1-0", "g1-1", "g1-2"


def isr(zk: KazooClient) -> frozenset[str] | None:
    return isr_record(zk, GROUP)


async def produce(address: str, body: bytes) -> str:
    """``OK``, or the refusal's status name and message."""
    conn = await Connection.open(address)
    try:
        await conn.request(p.Op.PRODUCE,
                           p.ProduceRequest("t", [p.ProduceMessage(0, None, body)]).encode(),
                           timeout_s=15)
        return "OK"
    except BrokerError as exc:
        return f"{p.Status(exc.status).name}: {exc.message}"
    finally:
        await conn.close()


@pytest.mark.parametrize("degrade", [False, True], ids=["strict", "auto-degrade"])
async def test_in_sync_replicas_refuses_or_degrades_down_to_the_floor(
        cluster_dir: Path, degrade: bool) -> None:
    policy = ReplicationPolicy(min_insync=1, in_sync_replicas=3, auto_degrade=degrade)
    plan = lc.up(cluster_dir, slaves=2, session_timeout_ms=4000, replication=policy)
    master = plan.bootstrap(GROUP)[0]
    zk = make_client(plan.zk_connect, timeout_s=5.0)
    zk.start(timeout=10)
    try:
        await create_topic([master], topic="t", queues=1)
        assert await produce(master, b"three copies") == "OK"
        await eventually(lambda: isr(zk) == {S1, S2}, "both slaves in the ISR record")

        lc.kill(plan.dir, S2)
        if degrade:
            assert await produce(master, b"two copies") == "OK"
            assert isr(zk) == {S1}  # recorded before the acknowledgement
            lc.kill(plan.dir, S1)
            assert await produce(master, b"master alone") == (
                "NOT_ENOUGH_REPLICAS: 1 in sync (the master), the write needs 2 "
                "(inSyncReplicas 3, minInSyncReplicas 1 slave(s), autoDegrade on)")
            lc.start(plan.dir, S1, wait=False)
        else:
            assert await produce(master, b"two copies") == (
                f"NOT_ENOUGH_REPLICAS: 2 in sync (the master, {S1}), the write needs 3 "
                "(inSyncReplicas 3, minInSyncReplicas 1 slave(s), autoDegrade off)")
            # Refused without waiting for the record; the dead slave leaves it all the same.
            await eventually(lambda: isr(zk) == {S1}, f"{S2} out of the ISR record")
            lc.start(plan.dir, S2, wait=False)

        # The slave back catches up, rejoins the record, and writes are taken again.
        async def accepted() -> bool:
            return await produce(master, b"again") == "OK"

        await eventually(accepted, "writes accepted once the slave is back in sync", 30)
        assert isr(zk) == ({S1} if degrade else {S1, S2})
    finally:
        zk.stop()
        zk.close()
