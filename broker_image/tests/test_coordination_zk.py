"""BrokerCoordinator against a real ZooKeeper: registration, watches, epochs, expiry,
lease renewal, status publishing and digest ACLs."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoAuthError
from kazoo.protocol.states import KeeperState
from kazoo.security import make_digest_acl

from understudy_broker.ha.coordinator import BrokerCoordinator, CoordinationError
from understudy_broker.model import GroupState, Mode, Permission, parse_address
from understudy_broker.zklayout import (
    BrokerStatus,
    GroupConfig,
    config_path,
    encode_state,
    live_path,
    state_path,
    status_path,
)
from understudy_harness.testing import PartitionProxy, eventually, paper_group

pytestmark = pytest.mark.integration

GROUP = "g1"


def group_config() -> GroupConfig:
    return paper_group(GROUP, "m", "s")


@pytest.fixture
async def coord(zk: str, admin: KazooClient) -> AsyncIterator[tuple[BrokerCoordinator, list[int]]]:
    admin.create(config_path(GROUP), group_config().to_json(), makepath=True)
    admin.create(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 1)), makepath=True)
    changes: list[int] = []
    c = BrokerCoordinator(
        zk, group=GROUP, name="m", session_timeout_s=2.0, loop=asyncio.get_running_loop(),
        on_change=lambda: changes.append(1), address="127.0.0.1:1",
    )
    await c.start()
    try:
        yield c, changes
    finally:
        await c.stop()


async def test_registers_watches_and_renews(coord: tuple[BrokerCoordinator, list[int]],
                                            admin: KazooClient) -> None:
    c, changes = coord
    data, stat = admin.get(live_path(GROUP, "m"))
    assert json.loads(data) == {"pid": os.getpid(), "address": "127.0.0.1:1"}
    assert stat.ephemeralOwner == c.session_id
    await eventually(lambda: c.state is not None and c.config is not None, "state and config")
    assert c.state == GroupState(Mode.NORMAL, 1)
    await eventually(c.lease_valid, "a valid lease")
    assert c.zk_live
    assert c.zk_lost_for() == 0.0
    assert changes
    await eventually(lambda: c.live == frozenset({"m"}), "the live set")
    admin.create(live_path(GROUP, "s"), b"{}", ephemeral=True)
    await eventually(lambda: c.live == frozenset({"m", "s"}), "a peer in the live set")
    # A new epoch is applied through the watch and re-confirmed by the lease at once.
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.FENCING, 2, reason="test")))
    await eventually(lambda: c.state is not None and c.state.epoch == 2, "epoch 2")
    await eventually(lambda: c.lease.epoch == 2, "lease confirming epoch 2")


async def test_older_epoch_and_malformed_state_are_ignored(
        coord: tuple[BrokerCoordinator, list[int]], admin: KazooClient) -> None:
    c, _ = coord
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.SLAVE_CONSUME, 5, acting="s")))
    await eventually(lambda: c.state is not None and c.state.epoch == 5, "epoch 5")
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 3)))
    admin.set(state_path(GROUP), b"{not json")
    admin.set(state_path(GROUP), json.dumps({"mode": "BOGUS", "epoch": 9}).encode())
    # A later valid write proves the three above were delivered and passed over.
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.RECOVERING, 6, acting="s")))
    await eventually(lambda: c.state is not None and c.state.epoch == 6, "epoch 6")
    assert c.state == GroupState(Mode.RECOVERING, 6, acting="s")
    assert not c.apply_state(GroupState(Mode.NORMAL, 4))
    assert c.state is not None
    assert c.state.epoch == 6


async def test_malformed_config_keeps_the_previous_one(
        coord: tuple[BrokerCoordinator, list[int]], admin: KazooClient) -> None:
    c, _ = coord
    await eventually(lambda: c.config is not None, "config")
    admin.set(config_path(GROUP), b"[1, 2]")
    admin.set(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 2)))
    await eventually(lambda: c.state is not None and c.state.epoch == 2, "epoch 2")
    assert c.config == group_config()


async def test_publish_status(coord: tuple[BrokerCoordinator, list[int]], admin: KazooClient) -> None:
    c, _ = coord
    status = BrokerStatus(broker="m", effective=Permission.FULL, epoch_applied=1, max_offset=42)
    await c.publish_status(status)
    await c.publish_status(BrokerStatus(broker="m", effective=Permission.NONE, epoch_applied=2))
    data, _ = admin.get(status_path(GROUP, "m"))
    assert BrokerStatus.from_json(data).epoch_applied == 2


async def test_session_expiry_unregisters_then_reregisters(
        coord: tuple[BrokerCoordinator, list[int]], admin: KazooClient, zk: str) -> None:
    c, _ = coord
    old_sid = c.session_id
    assert old_sid is not None
    cid = c.client.client_id
    # kazoo's harness trick: a second client attaches to the same session and closes it,
    # which expires the session for the first client.
    thief = KazooClient(hosts=zk, client_id=cid, timeout=2.0)
    thief.start(timeout=10)
    thief.stop()
    thief.close()
    await eventually(lambda: not c.registered, "the coordinator noticing the expiry")
    await eventually(lambda: c.registered and c.session_id != old_sid, "re-registration")
    _, stat = admin.get(live_path(GROUP, "m"))
    assert stat.ephemeralOwner == c.session_id
    assert c.zk_live
    await eventually(c.lease_valid, "a lease renewed in the new session")


async def test_stop_removes_the_live_node(zk: str, admin: KazooClient) -> None:
    admin.create(config_path(GROUP), group_config().to_json(), makepath=True)
    c = BrokerCoordinator(zk, group=GROUP, name="s", session_timeout_s=2.0,
                          loop=asyncio.get_running_loop(), on_change=lambda: None)
    await c.start()
    try:
        assert admin.exists(live_path(GROUP, "s")) is not None
        # No state node yet: no lease, whatever else is true.
        await c.renew()
        assert not c.lease_valid()
    finally:
        await c.stop()
    assert admin.exists(live_path(GROUP, "s")) is None
    assert not c.lease_valid()


async def registers_once_the_old_node_goes(zk: str, admin: KazooClient, other: KazooClient,
                                          *, acl: list[Any] | None = None) -> None:
    """``other`` (an earlier session) holds ``live/m``: a new broker must wait (not steal
    it, not give up) and register once that session ends."""
    try:
        admin.ensure_path(live_path(GROUP, "m").rsplit("/", 1)[0])  # an open parent
        other.create(live_path(GROUP, "m"), b"{}", ephemeral=True, acl=acl)
        c = BrokerCoordinator(zk, group=GROUP, name="m", session_timeout_s=2.0,
                              loop=asyncio.get_running_loop(), on_change=lambda: None)
        start = asyncio.create_task(c.start())
        await asyncio.sleep(0.5)
        assert not start.done(), start.exception() if start.done() else None
        other.stop()  # the old session ends: its node goes
        async with asyncio.timeout(10):
            await start
        try:
            _, stat = admin.get(live_path(GROUP, "m"))
            assert stat.ephemeralOwner == c.session_id
        finally:
            await c.stop()
    finally:
        other.stop()
        other.close()


async def test_restart_waits_for_the_previous_sessions_node(zk: str, admin: KazooClient) -> None:
    # A previous incarnation's node (another session) must not be stolen; the new broker
    # registers once it is gone.
    other = KazooClient(hosts=zk, timeout=2.0)
    other.start(timeout=10)
    await registers_once_the_old_node_goes(zk, admin, other)


async def test_registration_goes_on_when_reading_the_old_node_fails(
        zk: str, admin: KazooClient) -> None:
    # The previous session's node exists and reading it fails (here: an ACL the new broker
    # does not satisfy; in the field: the new session expiring too, or the link dropping,
    # as a broker paused past its session met under load). Registration must keep trying
    # and register once the node is gone; it used to raise and never register again.
    other = KazooClient(hosts=zk, timeout=2.0, auth_data=[("digest", "old:secret")])
    other.start(timeout=10)
    await registers_once_the_old_node_goes(
        zk, admin, other, acl=[make_digest_acl("old", "secret", all=True)])


async def test_digest_acl_protects_created_nodes(zk: str, admin: KazooClient) -> None:
    c = BrokerCoordinator(zk, group=GROUP, name="m", session_timeout_s=2.0,
                          loop=asyncio.get_running_loop(), on_change=lambda: None,
                          digest_auth=("understudy", "s3cret"))
    await c.start()
    try:
        await c.publish_status(BrokerStatus(broker="m", effective=Permission.NONE, epoch_applied=0))
        with pytest.raises(NoAuthError):
            admin.get(live_path(GROUP, "m"))
        with pytest.raises(NoAuthError):
            admin.get(status_path(GROUP, "m"))
        authed = KazooClient(hosts=zk, timeout=2.0, auth_data=[("digest", "understudy:s3cret")])
        authed.start(timeout=10)
        try:
            assert authed.get(status_path(GROUP, "m"))[0]
        finally:
            authed.stop()
            authed.close()
    finally:
        await c.stop()


async def test_unreachable_zookeeper_is_a_clear_error() -> None:
    from understudy_operator.local.ports import free_port

    c = BrokerCoordinator(f"127.0.0.1:{free_port()}", group=GROUP, name="m",
                          session_timeout_s=1.0, loop=asyncio.get_running_loop(),
                          on_change=lambda: None)
    with pytest.raises(CoordinationError, match="not reachable"):
        await c.start(connect_timeout_s=0.5)


async def test_a_start_cancelled_while_connecting_leaves_no_session(zk: str, admin: KazooClient) -> None:
    """A broker shut down while its ZooKeeper session is still connecting: the session
    connects after the start was given up, and must be closed then, not left running."""
    hosts, _, chroot = zk.partition("/")
    proxy = PartitionProxy(parse_address(hosts))
    proxy.cut()  # the connect is held until the heal
    c = BrokerCoordinator(f"127.0.0.1:{proxy.port}/{chroot}", group=GROUP, name="m",
                          session_timeout_s=4.0, loop=asyncio.get_running_loop(),
                          on_change=lambda: None)
    states: list[str] = []
    c.client.add_listener(states.append)
    try:
        start = asyncio.create_task(c.start(connect_timeout_s=8.0))
        await eventually(lambda: proxy.silent, "the connect reaches the proxy", within_s=5.0)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        proxy.heal()  # the client connects again, in kazoo's thread, after the cancel
        await eventually(lambda: KazooState.CONNECTED in states and states[-1] == KazooState.LOST,
                         "the session connected, then was closed", within_s=10.0)
        assert c.client.client_state == KeeperState.CLOSED
        assert not c.client.connected
        assert admin.exists(live_path(GROUP, "m")) is None
    finally:
        await c.stop()
        proxy.close()
