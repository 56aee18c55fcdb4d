"""ZkAuthority: the broker's permission from ZooKeeper state + lease, behind B's interface."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kazoo.client import KazooClient

from understudy_broker.ha.authority import Authority, BrokerHooks, ReplicationFacts
from understudy_broker.ha.zkauthority import ZkAuthority
from understudy_broker.model import GroupState, Health, Mode, Permission, Role
from understudy_broker.zklayout import (
    BrokerRouteDoc,
    BrokerStatus,
    config_path,
    encode_state,
    route_path,
    state_path,
    status_path,
)
from understudy_harness.testing import eventually, paper_group

pytestmark = pytest.mark.integration

GROUP = "g1"


@pytest.fixture
def admin(admin: KazooClient) -> KazooClient:
    """The shared admin client, with this module's group config written."""
    admin.create(config_path(GROUP), paper_group(GROUP, "m", "s").to_json(), makepath=True)
    return admin


@pytest.fixture
async def pair(zk: str, admin: KazooClient) -> AsyncIterator[tuple[ZkAuthority, ZkAuthority]]:
    m = ZkAuthority(connect=zk, group=GROUP, name="m", role=Role.MASTER,
                    configured=Permission.FULL, address="127.0.0.1:1", session_timeout_s=2.0,
                    publish_interval_s=0.2)
    s = ZkAuthority(connect=zk, group=GROUP, name="s", role=Role.SLAVE,
                    configured=Permission.READ, address=lambda: "127.0.0.1:4",
                    session_timeout_s=2.0, publish_interval_s=0.2)
    s.attach(BrokerHooks(facts=lambda: ReplicationFacts(master_link=True, max_offset=17),
                         offsets=dict))
    m.attach(BrokerHooks(facts=lambda: ReplicationFacts(slave_links=("s",)), offsets=dict))
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
    await eventually(lambda: m.effective() is Permission.FULL, "master FULL")
    assert changes[-1] == (Permission.FULL, 1)
    assert s.effective() is Permission.NONE
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.SLAVE_CONSUME, 2, acting="s")))
    await eventually(lambda: s.effective() is Permission.READ, "slave READ")
    await eventually(lambda: m.effective() is Permission.NONE, "master NONE")
    assert m.epoch() == s.epoch() == 2
    # The master is ready for back-sync: isolated at this epoch with the acting slave linked.
    await eventually(lambda: BrokerStatus.from_json(admin.get(status_path(GROUP, "m"))[0]).ready,
                   "master status ready")
    # s's status follows its permission by one write (its route document goes first).
    def s_status() -> tuple[Permission, int, bool, int]:
        st = BrokerStatus.from_json(admin.get(status_path(GROUP, "s"))[0])
        return st.effective, st.epoch_applied, st.master_link, st.max_offset

    await eventually(lambda: s_status() == (Permission.READ, 2, True, 17), "s's status READ/2")
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.RECOVERING, 3, acting="s")))
    await eventually(lambda: s.effective() is Permission.NONE, "slave drops READ in RECOVERING")


async def test_route_lists_the_group_from_zookeeper(
        pair: tuple[ZkAuthority, ZkAuthority], admin: KazooClient) -> None:
    m, s = pair
    admin.create(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 1)), makepath=True)
    await eventually(lambda: m.effective() is Permission.FULL, "master FULL")
    await eventually(lambda: BrokerStatus.from_json(
        admin.get(status_path(GROUP, "m"))[0]).effective is Permission.FULL, "m's status")
    # s learns m's published permission from its cluster view's watch on m's route
    # document: it follows the write by one notification, not at once.

    async def m_full_in_route() -> bool:
        brokers = (await s.route())[0].brokers
        return any(b.name == "m" and b.permission == int(Permission.FULL) for b in brokers)

    await eventually(m_full_in_route, "m FULL in s's route")
    routes = await s.route()
    assert len(routes) == 1
    by_name = {b.name: b for b in routes[0].brokers}
    assert by_name["s"].address == "127.0.0.1:4"
    assert by_name["m"].permission == int(Permission.FULL)
    assert by_name["m"].reachable


async def test_the_route_document_is_written_when_it_changes_not_with_each_status(
        pair: tuple[ZkAuthority, ZkAuthority], admin: KazooClient) -> None:
    """Every broker's cluster view watches every broker's route document, so a broker
    writes it on a change of permission or epoch only; its status goes on being
    republished every interval (offsets, timestamps) for the controller."""
    assert len(pair) == 2  # both brokers run and publish
    admin.create(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 1)), makepath=True)

    def route(name: str) -> tuple[BrokerRouteDoc, int]:
        data, stat = admin.get(route_path(GROUP, name))
        return BrokerRouteDoc.from_json(data), stat.version

    await eventually(lambda: admin.exists(route_path(GROUP, "m")) is not None
                     and route("m")[0] == BrokerRouteDoc(Permission.FULL, 1), "m's route FULL/1")
    doc, version = route("m")
    status_version = admin.exists(status_path(GROUP, "m")).version
    # Five publish intervals (0.2 s): the status is rewritten, the route document is not.
    await eventually(lambda: admin.exists(status_path(GROUP, "m")).version >= status_version + 4,
                     "m's status republished")
    assert route("m") == (doc, version)
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.SLAVE_CONSUME, 2, acting="s")))
    await eventually(lambda: route("s")[0] == BrokerRouteDoc(Permission.READ, 2), "s's route READ/2")
    await eventually(lambda: route("m")[0] == BrokerRouteDoc(Permission.NONE, 2), "m's route NONE/2")
    assert route("m")[1] > version


async def test_health_from_replication_notifies(pair: tuple[ZkAuthority, ZkAuthority],
                                                admin: KazooClient) -> None:
    m, _ = pair
    admin.create(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 1)), makepath=True)
    await eventually(lambda: m.effective() is Permission.FULL, "master FULL")
    m.update_health(Health(slaves_assigned=True, slave_connected=True, slave_once_connected=True))
    assert m.effective() is Permission.FULL  # ZooKeeper live: never isolated
    assert m.status().slave_once_connected
