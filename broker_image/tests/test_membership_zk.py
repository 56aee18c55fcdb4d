"""A broker's consumer-group cache against a real ZooKeeper: how it arms each group's
watches when a ZooKeeper call fails or hangs.

Why this exists: an acting slave once answered every request for one consumer group with
``TIMEOUT: ZooKeeper did not answer`` while ZooKeeper was answering. The cache registered a
group before setting its watches, and one lock armed every group: an arming that failed
left the group waiting forever (every later request timed out after 5 s), and an arming
that hung held up every other group. The client below is a real kazoo client on the test's
chroot whose watch calls fail or hang on demand."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from understudy_broker import protocol as p
from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.ha.membership import (
    EXPIRY_CHECK_S,
    Membership,
    MembershipError,
    _Hosted,
    expiry_wait,
)
from understudy_broker.zklayout import CONSUMER_GROUPS, MemberDoc, TopicDoc, topic_path
from understudy_harness.testing import eventually

pytestmark = pytest.mark.integration


class FaultyClient(KazooClient):  # type: ignore[misc]
    """``fail_data_watches`` DataWatch calls raise ConnectionLoss; a DataWatch on a path
    under a group named in ``hold`` waits until its Event is set."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.fail_data_watches = 0
        self.hold: dict[str, threading.Event] = {}
        real: Any = self.__dict__["DataWatch"]  # kazoo sets its recipes on the instance

        def data_watch(path: str, *args: Any, **kw: Any) -> Any:
            if self.fail_data_watches > 0:
                self.fail_data_watches -= 1
                raise ConnectionLoss("injected: the connection dropped")
            for group, release in self.hold.items():
                if path.startswith(CONSUMER_GROUPS.group(group) + "/"):
                    release.wait(30)
            return real(path, *args, **kw)

        self.DataWatch = data_watch


@pytest.fixture
def client(zk: str, admin: KazooClient) -> Iterator[FaultyClient]:
    for group in ("cg", "slow", "fast"):
        admin.ensure_path(CONSUMER_GROUPS.group(group))
    c = FaultyClient(hosts=zk, timeout=2.0)
    c.start(timeout=10)
    try:
        yield c
    finally:
        for release in c.hold.values():
            release.set()
        c.stop()
        c.close()


async def membership(client: FaultyClient) -> Membership:
    loop = asyncio.get_running_loop()
    return Membership(client, loop, broker="b1", view=ClusterView(client, loop))


async def test_a_group_whose_watches_failed_is_armed_again_by_the_next_request(
        client: FaultyClient) -> None:
    m = await membership(client)
    client.fail_data_watches = 1
    with pytest.raises(MembershipError) as refused:
        await m.describe("cg")
    assert refused.value.status is p.Status.TIMEOUT  # retriable: clients try again
    assert "could not watch" in refused.value.message
    assert "tries again" in refused.value.message
    # The next request arms the group and is answered (before: it waited for a watch that
    # was never set, and timed out, as every request after it did).
    async with asyncio.timeout(4):
        described = await m.describe("cg")
    assert described.cgroup == "cg"
    assert described.members == []
    await m.stop()


async def test_a_hung_arming_of_one_group_does_not_hold_up_another(
        client: FaultyClient) -> None:
    m = await membership(client)
    client.hold["slow"] = threading.Event()
    slow = asyncio.create_task(m.describe("slow"))
    await asyncio.sleep(0.2)  # its arming has started and hangs in ZooKeeper's call
    assert not slow.done()
    # Before, one lock armed every group: this request waited for "slow" forever.
    async with asyncio.timeout(4):
        fast = await m.describe("fast")
    assert fast.cgroup == "fast"
    client.hold["slow"].set()
    async with asyncio.timeout(4):
        assert (await slow).cgroup == "slow"
    await m.stop()


async def test_no_rebalance_starts_after_stop(client: FaultyClient) -> None:
    """A watch or a vanished member's timer firing after stop() starts no rebalance (it
    would run on, unstopped; on a closed loop its coroutine was left unawaited)."""
    m = await membership(client)
    await m.describe("cg")
    await m.stop()
    m.rebalance_soon("cg")
    assert "cg" not in m._rebalancing


def test_the_expiry_wait_is_the_earliest_session_end() -> None:
    def hosted(last_seen: float, timeout_ms: int) -> _Hosted:
        return _Hosted(MemberDoc("m", "b1", (), timeout_ms), last_seen, last_seen)

    assert expiry_wait([], 100.0) is None  # nothing hosted: sleep until a join
    assert expiry_wait([hosted(100.0, 6000), hosted(101.0, 2000)], 101.5) == pytest.approx(1.505)
    # Already due (an expiry being retried): checked again soon, not in a busy loop.
    assert expiry_wait([hosted(90.0, 1000)], 100.0) == EXPIRY_CHECK_S


async def test_a_member_that_stops_heartbeating_expires_after_its_session(
        client: FaultyClient, admin: KazooClient) -> None:
    """The expiry loop sleeps while no member is hosted; a join wakes it, and the member
    is gone about one session timeout after its last heartbeat."""
    admin.create(topic_path("t"), TopicDoc("t", ("g1",)).to_json(), makepath=True)
    loop = asyncio.get_running_loop()
    view = ClusterView(client, loop)
    await view.start()
    m = Membership(client, loop, broker="b1", view=view)
    await m.start()
    try:
        await asyncio.sleep(0.3)  # the loop is asleep with nothing hosted
        joined = time.monotonic()
        await m.heartbeat(p.MemberHeartbeatRequest("cg", "m1", ("t",), session_timeout_ms=1000,
                                                   join=True))
        assert [x["member"] for x in (await m.describe("cg")).members] == ["m1"]
        async def gone() -> bool:
            return not (await m.describe("cg")).members
        await eventually(gone, "the member expired", 10)
        gone_after = time.monotonic() - joined
        print(f"expired {gone_after:.2f} s after its only heartbeat (session 1 s)")
        assert gone_after >= 1.0  # never before its session ended
    finally:
        await m.stop()  # the view holds watches only; the client fixture closes them


async def test_idle_groups_leave_the_cache_and_come_back_whole(
        client: FaultyClient, admin: KazooClient) -> None:
    """The cache holds the groups in use here, not every group ever served (it grew by
    one group's state and two watches per group, for the broker's life). Thirty groups
    whose only member left are dropped once idle; a group with a member hosted here is
    kept; and a dropped group used again is watched afresh, with what another broker
    wrote to ZooKeeper meanwhile."""
    admin.create(topic_path("t"), TopicDoc("t", ("g1",)).to_json(), makepath=True)
    loop = asyncio.get_running_loop()
    view = ClusterView(client, loop)
    await view.start()
    now = [0.0]
    m = Membership(client, loop, broker="b1", view=view, clock=lambda: now[0], idle_s=60)
    other = Membership(client, loop, broker="b2", view=view)
    try:
        for i in range(30):
            await m.heartbeat(p.MemberHeartbeatRequest(f"cg{i}", "m1", ("t",), 10_000, join=True))
            await m.leave(p.LeaveGroupRequest(f"cg{i}", "m1"))
        await m.heartbeat(p.MemberHeartbeatRequest("live", "m1", ("t",), 10_000, join=True))
        assert m.cached == 31
        now[0] = 30.0
        assert m.evict_idle(now[0]) == []  # not idle long enough yet
        now[0] = 100.0
        # A group whose rebalance after the leave is still writing is kept until it ends
        # (on a loaded machine, some of the thirty): the eviction loop takes it next time.
        dropped: list[str] = []

        def idle_ones_dropped() -> bool:
            dropped.extend(m.evict_idle(now[0]))
            return len(dropped) >= 30
        await eventually(idle_ones_dropped, "every idle group dropped")
        assert sorted(dropped) == sorted(f"cg{i}" for i in range(30))
        assert m.cached == 1  # "live" hosts a member here
        # Another broker's member joins cg0 while this broker has forgotten it.
        await other.heartbeat(p.MemberHeartbeatRequest("cg0", "m2", ("t",), 10_000, join=True))
        described = await m.describe("cg0")
        assert [x["member"] for x in described.members] == ["m2"]
        assert {o["member"] for o in described.owners} == {"m2"}
        assert m.cached == 2
        # The new watches follow the group: m2 leaves through the other broker.
        await other.leave(p.LeaveGroupRequest("cg0", "m2"))

        async def left() -> bool:
            return not (await m.describe("cg0")).members
        await eventually(left, "m2's leave seen through the new watch", 10)
    finally:
        await m.stop()
        await other.stop()
