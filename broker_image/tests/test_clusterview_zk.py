"""A broker's cluster view against a real ZooKeeper: routes come from the brokers' route
documents, and a broker without one (an older version) is followed through its status.

Why this exists: every broker watches every group's brokers to answer any topic's route.
It used to watch their status documents, which each broker republishes every second, so
B brokers cost B x B notifications, reads and decodes a second: most of a core of the
machine at rest with 40 brokers (bench/scale.py), and with 100 brokers lost their
ZooKeeper sessions. A broker now writes a route document only when its permission or
epoch changes; these tests check what the view shows and what it is notified of."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.model import Permission
from understudy_broker.zklayout import (
    BrokerRouteDoc,
    BrokerStatus,
    config_path,
    live_path,
    route_path,
    status_dir,
    status_path,
)
from understudy_harness.testing import CountingClient, counting_session, eventually, paper_group

pytestmark = pytest.mark.integration

GROUP = "g1"


@pytest.fixture
def client(zk: str, admin: KazooClient) -> Iterator[CountingClient]:
    admin.create(config_path(GROUP), paper_group(GROUP, "m", "s").to_json(), makepath=True)
    admin.create(live_path(GROUP, "m"), b"", ephemeral=True, makepath=True)
    with counting_session(zk) as c:
        yield c


def _status(permission: Permission, epoch: int, offset: int = 0) -> bytes:
    return BrokerStatus("m", permission, epoch, max_offset=offset).to_json()


def _m(view: ClusterView) -> tuple[int, int] | None:
    """m's (permission, epoch) in the view's route of the group (None: not known yet)."""
    found = [b for b in view.group_route(GROUP).brokers if b.name == "m"]
    return (found[0].permission, found[0].epoch) if found else None


async def test_a_route_document_wins_over_the_status_and_the_status_is_a_fallback(
        client: CountingClient, admin: KazooClient) -> None:
    view = ClusterView(client, asyncio.get_running_loop())
    await view.start()
    # An older broker: a status and no route document. The view follows its status.
    admin.create(status_path(GROUP, "m"), _status(Permission.FULL, 1), makepath=True)
    await eventually(lambda: _m(view) == (int(Permission.FULL), 1),
                     "m FULL/1 from its status")
    # Its route document appears: the view follows it, not the status any more.
    admin.create(route_path(GROUP, "m"), BrokerRouteDoc(Permission.READ, 2).to_json(),
                 makepath=True)
    await eventually(lambda: _m(view) == (int(Permission.READ), 2),
                     "m READ/2 from its route document")
    admin.set(status_path(GROUP, "m"), _status(Permission.FULL, 3))
    await asyncio.sleep(0.3)
    assert _m(view) == (int(Permission.READ), 2)
    # The route document is deleted (the broker scaled away and pruned, say): back to the
    # status.
    admin.delete(route_path(GROUP, "m"))
    await eventually(lambda: _m(view) == (int(Permission.FULL), 3),
                     "m FULL/3 from its status again")


async def test_statuses_republished_with_a_route_document_notify_no_view(
        client: CountingClient, admin: KazooClient) -> None:
    view = ClusterView(client, asyncio.get_running_loop())
    await view.start()
    admin.create(route_path(GROUP, "m"), BrokerRouteDoc(Permission.FULL, 1).to_json(),
                 makepath=True)
    admin.create(status_path(GROUP, "m"), _status(Permission.FULL, 1), makepath=True)
    await eventually(lambda: _m(view) == (int(Permission.FULL), 1), "m FULL")
    await asyncio.sleep(0.3)  # any status watch armed before the route was seen has ended
    before = client.calls.get(status_path(GROUP, "m"), 0)
    for offset in range(1, 21):  # twenty republishes, as twenty seconds of a broker's life
        admin.set(status_path(GROUP, "m"), _status(Permission.FULL, 1, offset))
    await asyncio.sleep(0.5)
    assert client.calls.get(status_path(GROUP, "m"), 0) - before == 0
    assert admin.get_children(status_dir(GROUP)) == ["m"]


async def test_a_restarted_brokers_old_claim_is_not_shown_next_to_a_newer_epoch(
        client: CountingClient, admin: KazooClient) -> None:
    """m was killed as master (its route document says FULL at epoch 1, and stays) and s
    acts at epoch 3. m registers again before it writes a route: the view must not show
    its old FULL as a writer, or producers send to it and isolate its group."""
    view = ClusterView(client, asyncio.get_running_loop())
    await view.start()
    admin.create(route_path(GROUP, "m"), BrokerRouteDoc(Permission.FULL, 1).to_json(),
                 makepath=True)
    admin.create(route_path(GROUP, "s"), BrokerRouteDoc(Permission.READ, 3).to_json(),
                 makepath=True)
    admin.create(live_path(GROUP, "s"), b"", ephemeral=True, makepath=True)
    # m is live (the fixture registered it), its document is two epochs old.
    await eventually(lambda: _m(view) == (0, 1), "m shown without permission at epoch 1")
    assert view.group_route(GROUP).brokers[1].permission == int(Permission.READ)
    # m applies the newest state and publishes it: now its claim is shown.
    admin.set(route_path(GROUP, "m"), BrokerRouteDoc(Permission.FULL, 4).to_json())
    await eventually(lambda: _m(view) == (int(Permission.FULL), 4), "m FULL/4")
