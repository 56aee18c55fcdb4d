"""ZkAuthority: the broker's permission from ZooKeeper state + lease, behind B's interface."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from kazoo.client import KazooClient

from understudy_broker.authority import Authority
from understudy_broker.model import GroupState, Health, Mode, Permission, Role
from understudy_broker.zkauthority import ReplicationFacts, ZkAuthority
from understudy_broker.zklayout import (
    BrokerSpec,
    BrokerStatus,
    GroupConfig,
    config_path,
    encode_state,
    state_path,
    status_path,
)

pytestmark = pytest.mark.integration

GROUP = "g1"


@pytest.fixture
def admin(zk: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk, timeout=2.0)
    client.start(timeout=10)
    try:
        cfg = GroupConfig(group=GROUP, brokers=(
            BrokerSpec("m", 0, "127.0.0.1", 1, 2, 3, Permission.FULL),
            BrokerSpec("s", 1, "127.0.0.1", 4, 5, 6, Permission.READ),
        )).validate()
        client.create(config_path(GROUP), cfg.to_json(), makepath=True)
        yield client
    finally:
        client.stop()
        client.close()


async def wait_for(pred: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def pair(zk: str, admin: KazooClient) -> AsyncIterator[tuple[ZkAuthority, ZkAuthority]]:
    m = ZkAuthority(connect=zk, group=GROUP, name="m", role=Role.MASTER,
                    configured=Permission.FULL, address="127.0.0.1:1", session_timeout_s=2.0,
                    publish_interval_s=0.2)
    s = ZkAuthority(connect=zk, group=GROUP, name="s", role=Role.SLAVE,
                    configured=Permission.READ, address=lambda: "127.0.0.1:4",
                    session_timeout_s=2.0, publish_interval_s=0.2)
    s.set_facts_source(lambda: ReplicationFacts(master_link=True, max_offset=17))
    m.set_facts_source(lambda: ReplicationFacts(slave_links=("s",)))
    await m.start()
    try:
        await s.start()
        try:
            yield m, s
        finally:
            await s.stop()
    finally:
        await m.stop()


async def test_unknown_state_is_none_then_follows_zookeeper(
        pair: tuple[ZkAuthority, ZkAuthority], admin: KazooClient) -> None:
    m, s = pair
    authority: Authority = m  # B's interface, structurally
    changes: list[tuple[Permission, int]] = []
    authority.subscribe(lambda: changes.append((m.effective(), m.epoch())))
    assert m.effective() is Permission.NONE  # no state yet: never the static fallback
    assert m.epoch() == 0
    admin.create(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 1)), makepath=True)
    await wait_for(lambda: m.effective() is Permission.FULL, "master FULL")
    assert changes[-1] == (Permission.FULL, 1)
    assert s.effective() is Permission.NONE
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.SLAVE_CONSUME, 2, acting="s")))
    await wait_for(lambda: s.effective() is Permission.READ, "slave READ")
    await wait_for(lambda: m.effective() is Permission.NONE, "master NONE")
    assert m.epoch() == s.epoch() == 2
    # The master is ready for back-sync: isolated at this epoch with the acting slave linked.
    await wait_for(lambda: BrokerStatus.from_json(admin.get(status_path(GROUP, "m"))[0]).ready,
                   "master status ready")
    st = BrokerStatus.from_json(admin.get(status_path(GROUP, "s"))[0])
    assert (st.effective, st.epoch_applied, st.master_link, st.max_offset) == (
        Permission.READ, 2, True, 17)
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.RECOVERING, 3, acting="s")))
    await wait_for(lambda: s.effective() is Permission.NONE, "slave drops READ in RECOVERING")


async def test_route_lists_the_group_from_zookeeper(
        pair: tuple[ZkAuthority, ZkAuthority], admin: KazooClient) -> None:
    m, s = pair
    admin.create(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 1)), makepath=True)
    await wait_for(lambda: m.effective() is Permission.FULL, "master FULL")
    await wait_for(lambda: BrokerStatus.from_json(
        admin.get(status_path(GROUP, "m"))[0]).effective is Permission.FULL, "m's status")
    routes = await s.route()
    assert len(routes) == 1
    by_name = {b.name: b for b in routes[0].brokers}
    assert by_name["s"].address == "127.0.0.1:4"
    assert by_name["m"].permission == int(Permission.FULL)
    assert by_name["m"].reachable


async def test_health_from_replication_notifies(pair: tuple[ZkAuthority, ZkAuthority],
                                                admin: KazooClient) -> None:
    m, _ = pair
    admin.create(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 1)), makepath=True)
    await wait_for(lambda: m.effective() is Permission.FULL, "master FULL")
    m.update_health(Health(slaves_assigned=True, slave_connected=True, slave_once_connected=True))
    assert m.effective() is Permission.FULL  # ZooKeeper live: never isolated
    assert m.status().slave_once_connected
