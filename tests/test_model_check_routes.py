"""Model check: a broker's cluster view switching between the route writer's document and
its own per-group watches (``ha/clusterview.py``, docs/cluster-routes.md), over random
interleavings of route changes, writers coming and going, stale and malformed documents,
and late notifications.

The world: an in-memory ZooKeeper with one-shot watches whose notifications reach a session
in the order ZooKeeper made the changes (each delivery reads the node as it is then, as
kazoo's recipes do). Two sessions: the broker's (the view under test, ``follow_document``)
and the writer's (a per-group view, the route writer's input). The code under test is the
real :class:`ClusterView` and the real document builder
(:func:`~understudy_operator.controller.routewriter.routes_of`); only kazoo and the event
loop are replaced, so every notification is delivered when the model says.

Checked after every step: a group the broker answered a route for is never answered with
no brokers while it exists (a switch never leaves a group out of the view); and while the
broker follows the groups itself, no broker is shown at an older epoch than it was shown at
before (a fall-back from the document never shows a group as it was before the document:
between reading a group's config and its brokers' routes, the view showed nobody holding
anything). Checked once
everything is delivered and the writer, if any, has written what it sees: the broker's
routes are exactly the routes of a view that follows every group itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.model import Permission
from understudy_broker.zklayout import (
    GROUPS_DIR,
    ROUTES_DOC,
    ROUTES_WRITER,
    BrokerRouteDoc,
    config_path,
    live_dir,
    route_dir,
    route_path,
)
from understudy_harness.testing import paper_group
from understudy_operator.controller.routewriter import routes_of

GROUPS = ("g1", "g2")
BROKERS = ("m", "s")
WRITERS = ("c1", "c2")


class Store:
    """ZooKeeper's nodes: path -> data; a node's children are the paths one level under it."""

    def __init__(self) -> None:
        self.nodes: dict[str, bytes] = {}
        self.sessions: list[Session] = []

    def children(self, path: str) -> list[str]:
        prefix = path + "/"
        return sorted({p[len(prefix):] for p in self.nodes
                       if p.startswith(prefix) and "/" not in p[len(prefix):]})

    def set(self, path: str, data: bytes | None) -> None:
        """Create, write (``data``) or delete (``None``) a node, and queue the notifications
        of every session watching it or its parent's children."""
        existed = path in self.nodes
        if data is None:
            self.nodes.pop(path, None)
        else:
            self.nodes[path] = data
        for s in self.sessions:
            s.changed(path, children=existed != (data is not None))


class Session:
    """One kazoo client: DataWatch and ChildrenWatch recipes with one-shot server watches."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.sessions.append(self)
        self.data_watches: dict[str, list[Callable[..., Any]]] = {}
        self.child_watches: dict[str, list[Callable[..., Any]]] = {}
        self.armed: set[tuple[str, str]] = set()  # (kind, path) with a server watch set
        self.pending: deque[tuple[str, str]] = deque()

    # the recipes the view uses
    def ensure_path(self, path: str, *_: Any) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in self.store.nodes:
                self.store.set(p, b"")

    def exists(self, path: str) -> bool | None:
        return True if path in self.store.nodes else None

    def DataWatch(self, path: str, func: Callable[..., Any]) -> None:
        self.data_watches.setdefault(path, []).append(func)
        self._fire_data(path, [func])

    def ChildrenWatch(self, path: str, func: Callable[..., Any]) -> None:
        self.child_watches.setdefault(path, []).append(func)
        self._fire_children(path, [func])

    # the server side
    def changed(self, path: str, *, children: bool) -> None:
        if ("data", path) in self.armed:
            self.armed.discard(("data", path))
            self.pending.append(("data", path))
        parent = path.rsplit("/", 1)[0] or "/"
        if children and ("children", parent) in self.armed:
            self.armed.discard(("children", parent))
            self.pending.append(("children", parent))

    def deliver_one(self) -> bool:
        if not self.pending:
            return False
        kind, path = self.pending.popleft()
        if kind == "data":
            self._fire_data(path, self.data_watches.get(path, []))
        else:
            self._fire_children(path, self.child_watches.get(path, []))
        return True

    def _fire_data(self, path: str, funcs: list[Callable[..., Any]]) -> None:
        data = self.store.nodes.get(path)
        self.armed.add(("data", path))
        for f in list(funcs):
            if f(data, None) is False:
                funcs.remove(f)

    def _fire_children(self, path: str, funcs: list[Callable[..., Any]]) -> None:
        self.armed.add(("children", path))
        for f in list(funcs):
            if f(self.store.children(path)) is False:
                funcs.remove(f)


class Done:
    def add_done_callback(self, _fn: Any) -> None:
        return None


class Loop:
    """The calls a view hands to its loop (kazoo's threads call ``call_soon_threadsafe``;
    the view runs watch constructors in the executor): queued, and run one at a time when
    the model says, so a watch's first read lands after the view moved on, as it does."""

    def __init__(self) -> None:
        self.queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        self.queue.append((fn, args))

    def run_in_executor(self, _executor: Any, fn: Callable[..., Any], *args: Any) -> Done:
        self.queue.append((fn, args))
        return Done()

    def run_one(self) -> bool:
        if not self.queue:
            return False
        fn, args = self.queue.popleft()
        fn(*args)
        return True


def started(session: Session, *, follow_document: bool) -> tuple[ClusterView, Loop]:
    """A view started as ``ClusterView.start`` does it (its watches armed in order)."""
    loop = Loop()
    view = ClusterView(session, loop, follow_document=follow_document)  # type: ignore[arg-type]
    for path in ("/topics", GROUPS_DIR):
        session.ensure_path(path)
    if follow_document:
        session.ensure_path("/routes")
        session.DataWatch(ROUTES_WRITER, view._kz(view._apply_writer))
        session.DataWatch(ROUTES_DOC, view._kz(view._apply_doc))
    session.ChildrenWatch(GROUPS_DIR, view._kz(view._group_names))
    return view, loop


def routes(view: ClusterView) -> dict[str, list[tuple[str, int, int, bool]]]:
    return {g: [(b.name, b.permission, b.epoch, b.reachable) for b in view.group_route(g).brokers]
            for g in view.groups()}


class Routes(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.zk = Store()
        self.zk.set(GROUPS_DIR, b"")
        for g in GROUPS:
            for path in (f"{GROUPS_DIR}/{g}", config_path(g), live_dir(g), route_dir(g)):
                self.zk.set(path, b"")
            self.zk.set(config_path(g), paper_group(g, *BROKERS).to_json())
            for b in BROKERS:
                self.zk.set(f"{live_dir(g)}/{b}", b"")
                self.zk.set(route_path(g, b), BrokerRouteDoc(Permission.NONE, 1).to_json())
        self.writer_session = Session(self.zk)
        self.source, self.writer_loop = started(self.writer_session, follow_document=False)
        self.broker_session = Session(self.zk)
        self.broker, self.broker_loop = started(self.broker_session, follow_document=True)
        self.epoch = 1
        self.answered: set[str] = set()
        self.shown_epoch: dict[tuple[str, str], int] = {}

    # ZooKeeper changes
    @rule(g=st.sampled_from(GROUPS), b=st.sampled_from(BROKERS),
          perm=st.sampled_from((Permission.NONE, Permission.READ, Permission.FULL)))
    def publish(self, g: str, b: str, perm: Permission) -> None:
        self.epoch += 1
        self.zk.set(route_path(g, b), BrokerRouteDoc(perm, self.epoch).to_json())

    @rule(g=st.sampled_from(GROUPS), b=st.sampled_from(BROKERS), up=st.booleans())
    def liveness(self, g: str, b: str, up: bool) -> None:
        path = f"{live_dir(g)}/{b}"
        if up != (path in self.zk.nodes):
            self.zk.set(path, b"" if up else None)

    # the route writer: claims, writes what its (possibly late) view holds, leaves
    @rule(w=st.sampled_from(WRITERS))
    def claim(self, w: str) -> None:
        if ROUTES_WRITER not in self.zk.nodes:
            self.zk.set(ROUTES_WRITER, w.encode())

    @rule()
    def write(self) -> None:
        """The holder writes what its view holds, once it has read every group (the
        view may still be behind ZooKeeper: notifications not delivered yet)."""
        holder = self.zk.nodes.get(ROUTES_WRITER)
        if holder is not None and self.source.complete():
            self.zk.set(ROUTES_DOC, routes_of(self.source, holder.decode()).to_json())

    @rule(w=st.sampled_from(WRITERS))
    def stale_writer_writes(self, w: str) -> None:
        """A writer that lost its node (and does not know yet) writes once more."""
        if self.source.complete():
            self.zk.set(ROUTES_DOC, routes_of(self.source, w).to_json())

    @rule()
    def leave(self) -> None:
        if ROUTES_WRITER in self.zk.nodes:
            self.zk.set(ROUTES_WRITER, None)

    @rule()
    def garbage(self) -> None:
        self.zk.set(ROUTES_DOC, b'{"writer": "c1", "groups": 7}')

    # notifications, one at a time, in each session's order; each loop's work, in order
    @rule()
    def deliver_to_broker(self) -> None:
        self.broker_session.deliver_one()

    @rule()
    def deliver_to_writer(self) -> None:
        self.writer_session.deliver_one()

    @rule()
    def broker_loop_runs(self) -> None:
        self.broker_loop.run_one()

    @rule()
    def writer_loop_runs(self) -> None:
        self.writer_loop.run_one()

    def _quiet(self, *parts: tuple[Session, Loop]) -> None:
        while any(s.deliver_one() or loop.run_one() for s, loop in parts):
            pass

    @invariant()
    def no_group_left_out(self) -> None:
        for g in GROUPS:
            if self.broker.group_route(g).brokers:
                self.answered.add(g)
            elif g in self.answered:
                raise AssertionError(f"{g} answered before, now with no brokers "
                                     f"(documented={self.broker.documented})")

    @invariant()
    def no_step_back_while_following_the_groups(self) -> None:
        for g in GROUPS:
            for b in self.broker.group_route(g).brokers:
                before = self.shown_epoch.get((g, b.name), 0)
                if not self.broker.documented and b.epoch < before:
                    raise AssertionError(f"{g}/{b.name} shown at epoch {b.epoch} after "
                                         f"{before}, following the groups itself")
                # A document may be older than what the broker read itself (the writer's
                # view lags): what it shows is the floor from then on.
                self.shown_epoch[(g, b.name)] = (b.epoch if self.broker.documented
                                                 else max(before, b.epoch))

    @rule()
    def settle(self) -> None:
        """Everything delivered and the writer (if any) caught up: the broker's routes are
        exactly those of a view that follows every group."""
        writer = (self.writer_session, self.writer_loop)
        self._quiet(writer)
        self.write()
        self._quiet(writer, (self.broker_session, self.broker_loop))
        assert routes(self.broker) == routes(self.source), (
            f"documented={self.broker.documented}")
        assert self.broker.documented == (ROUTES_WRITER in self.zk.nodes)


Routes.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_a_broker_view_switches_sources_without_losing_a_route = Routes.TestCase
