"""The route document against a real ZooKeeper (docs/cluster-routes.md): one controller
writes every group's route into ``/routes/doc``; brokers' views take routes from it and
watch no group themselves while its writer holds ``/routes/writer``, and follow every
group again the moment it does not.

Why this exists: every broker followed every group by its own watches, so killing the
masters of G groups cost about 3G x B notifications on B brokers (50 groups: readable again
after 8 s, bench/scale.py). What a user would notice is a route that is wrong or late, so
each test checks the routes a broker answers, and the first one that the brokers are not
notified group by group any more."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import pytest
from kazoo.client import KazooClient

from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.model import Permission
from understudy_broker.protocol import BrokerRoute
from understudy_broker.zklayout import (
    ROUTES_DOC,
    ROUTES_WRITER,
    BrokerRouteDoc,
    RoutesDoc,
    config_path,
    controller_path,
    live_path,
    route_path,
)
from understudy_harness.testing import CountingClient, counting_session, eventually, paper_group
from understudy_operator.controller.routewriter import RouteWriter
from understudy_operator.zk import open_gateway

pytestmark = pytest.mark.integration

GROUPS = ("g1", "g2")


def group_calls(client: CountingClient) -> int:
    """Notifications (and first reads) of any group's nodes."""
    return sum(n for path, n in client.calls.items() if path.startswith("/groups/"))


@pytest.fixture
def cluster(admin: KazooClient) -> KazooClient:
    """Two groups of a master m<i> (FULL, epoch 1) and a slave s<i> (NONE), both live; g1
    has a controller elected (so the writer is the controller leading g1)."""
    for i, g in enumerate(GROUPS, 1):
        admin.create(config_path(g), paper_group(g, f"m{i}", f"s{i}").to_json(), makepath=True)
        for name, perm in ((f"m{i}", Permission.FULL), (f"s{i}", Permission.NONE)):
            admin.create(live_path(g, name), b"", ephemeral=True, makepath=True)
            admin.create(route_path(g, name), BrokerRouteDoc(perm, 1).to_json(), makepath=True)
    admin.create(f"{controller_path('g1')}/n-", b"c1", ephemeral=True, sequence=True,
                 makepath=True)
    return admin


@pytest.fixture
def view_client(zk: str) -> Iterator[CountingClient]:
    with counting_session(zk) as c:
        yield c


@contextlib.asynccontextmanager
async def writer(zk: str, identity: str,
                 led: Callable[[], Sequence[str]] = lambda: ["g1"]) -> AsyncIterator[RouteWriter]:
    """A route writer on its own session, as a controller runs it; its session (and so its
    writer node) ends with the block."""
    async with open_gateway(zk) as gw:
        w = RouteWriter(gw, identity, led, check_s=0.1)
        task = asyncio.create_task(w.run())
        try:
            yield w
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def broker_view(client: KazooClient) -> ClusterView:
    view = ClusterView(client, asyncio.get_running_loop(), follow_document=True)
    await view.start()
    return view


def reader(view: ClusterView, group: str) -> tuple[str, int] | None:
    """The broker shown with READ in ``group``'s route, and its epoch."""
    found = [(b.name, b.epoch) for b in view.group_route(group).brokers
             if b.holds(int(Permission.READ))]
    return found[0] if len(found) == 1 else None


def fail_over(admin: KazooClient, i: int, epoch: int) -> None:
    """Group g<i>'s master dies and its slave takes READ at ``epoch``."""
    g = f"g{i}"
    admin.delete(live_path(g, f"m{i}"))
    admin.set(route_path(g, f"s{i}"), BrokerRouteDoc(Permission.READ, epoch).to_json())


async def test_brokers_route_from_the_writers_document_and_watch_no_group(
        zk: str, cluster: KazooClient, view_client: CountingClient) -> None:
    async with writer(zk, "c1") as w:
        await eventually(lambda: cluster.exists(ROUTES_DOC), "the first document written")
        view = await broker_view(view_client)
        await eventually(lambda: view.documented, "the broker routes from the document")
        assert view.groups() == list(GROUPS)
        assert reader(view, "g1") == ("m1", 1)
        assert reader(view, "g2") == ("m2", 1)
        writes = w.writes
        fail_over(cluster, 1, 2)
        fail_over(cluster, 2, 2)
        await eventually(lambda: reader(view, "g1") == ("s1", 2)
                         and reader(view, "g2") == ("s2", 2), "both failovers routed")
        # The master is shown unreachable, as the per-group view shows it.
        assert [(b.name, b.reachable) for b in view.group_route("g1").brokers] == [
            ("m1", False), ("s1", True)]
        assert w.writes > writes
        # Four changes in two groups, and the broker was notified of none of them group by
        # group: only the document (and the group list) reached it.
        assert group_calls(view_client) == 0, view_client.calls
        assert view_client.calls[ROUTES_DOC] >= 2


async def test_routes_stay_current_when_the_writer_goes_and_another_comes(
        zk: str, cluster: KazooClient, view_client: CountingClient) -> None:
    view = await broker_view(view_client)
    async with writer(zk, "c1"):
        await eventually(lambda: view.documented, "routes from c1's document")
    # c1's session ended with its node: the broker follows the groups itself at once.
    await eventually(lambda: not view.documented, "back to the broker's own watches")
    fail_over(cluster, 1, 2)
    await eventually(lambda: reader(view, "g1") == ("s1", 2), "a failover with no writer")
    assert reader(view, "g2") == ("m2", 1)
    async with writer(zk, "c2"):
        await eventually(lambda: view.documented, "routes from c2's document")
        assert reader(view, "g1") == ("s1", 2)
        fail_over(cluster, 2, 3)
        await eventually(lambda: reader(view, "g2") == ("s2", 3), "a failover under c2")
        assert cluster.get(ROUTES_WRITER)[0] == b"c2"


async def test_a_malformed_or_foreign_document_is_not_used(
        cluster: KazooClient, view_client: CountingClient) -> None:
    """Hand-written documents: garbage is ignored (the broker follows the groups), one
    written by someone other than the writer named in /routes/writer too; the writer's own
    is used, and what it says is what the broker answers."""
    cluster.create(ROUTES_WRITER, b"x", ephemeral=True, makepath=True)
    cluster.create(ROUTES_DOC, b"{not json", makepath=True)
    view = await broker_view(view_client)
    await eventually(lambda: reader(view, "g1") == ("m1", 1), "g1 routed from its own nodes")
    assert not view.documented
    made_up = RoutesDoc("y", {"g1": (BrokerRoute("s1", "127.0.0.1:4", "slave", 1, 9, True),)})
    cluster.set(ROUTES_DOC, made_up.to_json())
    await asyncio.sleep(0.3)
    assert not view.documented
    assert reader(view, "g1") == ("m1", 1)
    cluster.set(ROUTES_DOC, RoutesDoc("x", made_up.groups).to_json())
    await eventually(lambda: view.documented, "the writer's own document used")
    assert reader(view, "g1") == ("s1", 9)
    assert view.groups() == ["g1"]
    cluster.set(ROUTES_DOC, b'{"writer": "x", "groups": {"g1": [["s1", 1]]}}')
    await eventually(lambda: not view.documented, "a malformed one drops it")
    await eventually(lambda: reader(view, "g1") == ("m1", 1), "g1 from its own nodes again")


async def test_only_the_chosen_controller_writes_and_only_one_at_a_time(
        zk: str, cluster: KazooClient) -> None:
    async with writer(zk, "follower", led=lambda: []) as idle:
        async with writer(zk, "c1") as first, writer(zk, "c1-twin") as second:
            await eventually(lambda: cluster.exists(ROUTES_DOC), "a document written")
            await asyncio.sleep(0.5)
            holder = cluster.get(ROUTES_WRITER)[0].decode()
            assert holder in ("c1", "c1-twin")
            loser = second if holder == "c1" else first
            assert loser.writes == 0
            assert RoutesDoc.from_json(cluster.get(ROUTES_DOC)[0]).writer == holder
        assert idle.writes == 0
        assert cluster.exists(ROUTES_WRITER) is None
