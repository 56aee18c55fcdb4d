"""What one broker knows of the whole cluster: every topic and every group's brokers.

Why this module exists: any broker answers the route of any topic (DESIGN "Topics across
groups"): per queue its group, that group's brokers and their effective permissions. The
view is kept by ZooKeeper watches, not polls: ``/topics/*`` documents, and per group its
``config``, ``live`` children and each broker's ``route`` document (effective permission
and epoch; a broker writes it the moment either changes, so a failover reaches every view
within a notification). Each change to what a route shows bumps
:attr:`ClusterView.version`; GET_ROUTE long-polls wait on it, so clients learn a new route
as soon as the brokers do.

Routes, not statuses, are watched because a broker republishes its ``status`` about once
a second (offsets, timestamps) and every broker watches every group: B brokers watching B
statuses cost B x B notifications, reads and decodes a second (``bench/scale.py``
measured 1.8 cores of the machine at rest with 40 brokers; with 100, brokers lost their
ZooKeeper sessions). A broker with no ``route`` document (an older version, during a
rolling upgrade) is still followed through its ``status``, and only for what a route
shows: a status republished with only its offsets or timestamp changed bumps nothing
(when it did, every client's route watch and every hosted consumer group's rebalance
check woke with every republish).

**The route document** (docs/cluster-routes.md). Those per-group watches make a failover of
G groups about 3G notifications on each of the B brokers, 3G x B in all. A view made with
``follow_document`` (a broker's) also follows ``/routes/writer`` and ``/routes/doc``:
while the controller named in ``/routes/writer`` has written the document, the view takes
every group's route from it (one notification per write, however many groups changed)
and arms no per-group watches; the ones it had end at their next notification. While no
writer holds the node, or its document is missing, malformed or another writer's, the view
follows the groups itself as above (re-armed at once when the writer goes), answering a
group it has not read whole yet from the last document it had. The writer's own view
(``follow_document`` off: :class:`~understudy_operator.controller.routewriter.RouteWriter`)
is a per-group view; :meth:`ClusterView.complete` says when it has read every group once.

Threading: kazoo calls the watch functions on its threads; they only hand the data to
the loop (``call_soon_threadsafe``). All state is read and written on the loop. A watch
returns ``False`` to disarm itself once its topic or group is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from understudy_broker.protocol import BrokerRoute, GroupRoute, current_claims
from understudy_broker.zklayout import (
    GROUPS_DIR,
    ROUTES_DIR,
    ROUTES_DOC,
    ROUTES_WRITER,
    TOPICS_DIR,
    BrokerRouteDoc,
    BrokerStatus,
    ChainDoc,
    GroupConfig,
    LayoutError,
    RoutesDoc,
    TopicDoc,
    chains_path,
    config_path,
    live_dir,
    route_dir,
    status_dir,
    topic_path,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Group:
    config: GroupConfig | None = None
    live: frozenset[str] = frozenset()
    routes: dict[str, tuple[int, int]] = field(default_factory=dict)  # from route documents
    statuses: dict[str, BrokerStatus] = field(default_factory=dict)  # brokers without one
    route_names: frozenset[str] = frozenset()  # the ``route`` children
    status_names: frozenset[str] = frozenset()  # the ``status`` children
    watched_route: set[str] = field(default_factory=set)
    watched_status: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)  # the watch kinds heard from at least once
    read: set[str] = field(default_factory=set)  # brokers whose route or status was read
    gone: bool = False

    @property
    def complete(self) -> bool:
        """Every node of the group read once (the route writer waits for it); a group
        without a config (being deleted, a stray node) has no route to read."""
        if "config" not in self.seen:
            return False
        return self.config is None or ({"live", "route", "status"} <= self.seen
                                       and (self.route_names | self.status_names) <= self.read)

    def fields(self, broker: str) -> tuple[int, int] | None:
        """``(effective, epoch)`` of ``broker``: its route document, else its status."""
        route = self.routes.get(broker)
        return route if route is not None else _route_fields(self.statuses.get(broker))


def _route_fields(status: BrokerStatus | None) -> tuple[int, int] | None:
    """What :meth:`ClusterView.group_route` takes from a broker's status."""
    return None if status is None else (int(status.effective), status.epoch_applied)


class ClusterView:
    """Topics and groups as ZooKeeper holds them, kept current by watches."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop,
                 acl: Any = None, *, follow_document: bool = False) -> None:
        self._client = client
        self._follow_document = follow_document
        self._writer: str | None = None  # the identity in /routes/writer
        self._doc: RoutesDoc | None = None  # the last well-formed /routes/doc
        self._doc_current = False  # /routes/doc holds self._doc (not garbage, not deleted)
        self._documented = False  # routes come from self._doc (no per-group watches)
        self._group_list: list[str] | None = None  # the /groups children, once heard
        self._acl = acl
        self._loop = loop
        self._topic_listeners: list[Callable[[], None]] = []
        self.topics: dict[str, TopicDoc] = {}
        #: Each ordered topic's chains (docs/ordered.md), by watch; a document whose shape
        #: is impossible is logged and not applied.
        self.chains: dict[str, ChainDoc] = {}
        self._chain_watches: set[str] = set()
        self._groups: dict[str, _Group] = {}
        self.version = 0
        self._changed = asyncio.Event()
        self._pending_topics: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        for path in (TOPICS_DIR, GROUPS_DIR):
            await asyncio.to_thread(self._client.ensure_path, path, self._acl)
        if self._follow_document:
            # Armed before the groups: with a writer at work, none is watched one by one.
            await asyncio.to_thread(self._client.ensure_path, ROUTES_DIR, self._acl)
            for path, apply in ((ROUTES_WRITER, self._apply_writer), (ROUTES_DOC, self._apply_doc)):
                await asyncio.to_thread(self._client.DataWatch, path, self._kz(apply))
        await asyncio.to_thread(self._client.ChildrenWatch, TOPICS_DIR, self._kz(self._topic_names))
        await asyncio.to_thread(self._client.ChildrenWatch, GROUPS_DIR, self._kz(self._group_names))

    def _kz(self, apply: Callable[..., Any]) -> Callable[..., None]:
        """A kazoo watch function that hands its arguments to ``apply`` on the loop."""
        def fired(*args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(apply, *args)
        return fired

    def _arm(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run a watch constructor (it reads the node once) off the loop."""
        fut = self._loop.run_in_executor(None, fn, *args)
        fut.add_done_callback(_log_failure)

    def _bump(self, *, topics: bool = False) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        if topics:
            for listener in self._topic_listeners:
                listener()

    def subscribe_topics(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs on the loop after every change to :attr:`topics` (a topic
        created, altered or deleted), and not after the permission and epoch changes a
        route shows. Every broker's listeners (its hosted consumer groups rebalancing,
        with ZooKeeper reads for each) ran after each of those too: a failover of N groups
        is about 2N changes on every broker (``bench/scale.py``)."""
        self._topic_listeners.append(listener)

    async def wait_change(self, known_version: int, wait_s: float) -> None:
        """Return when :attr:`version` is past ``known_version`` or ``wait_s`` passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                while self.version <= known_version:
                    await self._changed.wait()

    # ------------------------------------------------------------------ topics

    def _topic_names(self, names: list[str]) -> None:
        for name in names:
            if name not in self.topics and name not in self._pending_topics:
                self._pending_topics.add(name)
                self._arm(self._client.DataWatch, f"{TOPICS_DIR}/{name}", self._topic_watch(name))
        gone = [t for t in self.topics if t not in names]
        for t in gone:
            del self.topics[t]
        if gone:
            self._bump(topics=True)

    def _topic_watch(self, name: str) -> Callable[..., Any]:
        state = {"alive": True}

        def fired(data: bytes | None, *_: Any) -> bool:
            if not state["alive"]:
                return False
            if data is None:
                state["alive"] = False
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._apply_topic, name, data)
            return state["alive"]
        return fired

    def _apply_topic(self, name: str, data: bytes | None) -> None:
        self._pending_topics.discard(name)
        if data is None:
            if self.topics.pop(name, None) is not None:
                self._bump(topics=True)
            return
        try:
            doc = TopicDoc.from_json(data)
        except LayoutError as exc:
            log.error("ignoring malformed topic %s: %s", name, exc)
            return
        if self.topics.get(name) != doc:
            self.topics[name] = doc
            self._bump(topics=True)
        if doc.ordered and name not in self._chain_watches:
            self._chain_watches.add(name)
            self._arm(self._client.DataWatch, chains_path(name), self._chains_watch(name))

    def _chains_watch(self, name: str) -> Callable[..., Any]:
        def fired(data: bytes | None, *_: Any) -> bool:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(self._apply_chains, name, data)
                if data is None:  # the topic was deleted: a new one re-arms
                    self._loop.call_soon_threadsafe(self._chain_watches.discard, name)
            return data is not None
        return fired

    def _apply_chains(self, name: str, data: bytes | None) -> None:
        if data is None:
            if self.chains.pop(name, None) is not None:
                self._bump()
            return
        topic = self.topics.get(name)
        try:
            doc = ChainDoc.from_json(data)
            if topic is not None:
                doc.check(topic.groups())
        except LayoutError as exc:
            log.error("ignoring the chains of %s: %s", name, exc)
            return
        if self.chains.get(name) != doc:
            self.chains[name] = doc
            self._bump()

    # ------------------------------------------------------------------ groups

    def _group_names(self, names: list[str]) -> None:
        self._group_list = list(names)
        if self._documented:
            return  # the document has them
        for name in names:
            if name not in self._groups:
                g = self._groups[name] = _Group()
                self._arm(self._arm_group, name, g)
        for name in [n for n in self._groups if n not in names]:
            self._groups.pop(name).gone = True
            self._bump()

    # ------------------------------------------------------------------ the route document

    @property
    def documented(self) -> bool:
        """Routes come from the route writer's document (no per-group watches)."""
        return self._documented

    def _apply_writer(self, data: bytes | None, *_: Any) -> None:
        self._writer = None if data is None else data.decode("utf-8", "replace")
        self._choose_source()

    def _apply_doc(self, data: bytes | None, *_: Any) -> None:
        # A document deleted or malformed is not followed, but the last good one still
        # answers the groups the view's own watches have not read yet (_from_document).
        before = self._doc
        self._doc_current = False
        if data is not None:
            try:
                self._doc = RoutesDoc.from_json(data, reuse=self._doc)
                self._doc_current = True
            except LayoutError as exc:
                log.error("ignoring the route document: %s", exc)
        if not self._choose_source() and self._documented and (
                before is None or self._doc is None or before.groups != self._doc.groups):
            self._bump()

    def _choose_source(self) -> bool:
        """Take routes from the document while its writer holds ``/routes/writer``, from
        per-group watches otherwise. True when the source changed (the view bumped)."""
        use = (self._writer is not None and self._doc is not None and self._doc_current
               and self._doc.writer == self._writer)
        if use == self._documented:
            return False
        self._documented = use
        if use:
            log.info("routes from the route writer %s's document", self._writer)
            for g in self._groups.values():
                g.gone = True  # each watch ends at its next notification
            self._groups.clear()
        else:
            log.info("no route writer with a document: following every group")
            if self._group_list is not None:
                self._group_names(self._group_list)
        self._bump()
        return True

    def complete(self) -> bool:
        """Whether this (per-group) view has read every group's nodes once."""
        return (self._group_list is not None and not self._documented
                and all(g.complete for g in self._groups.values()))

    def _arm_group(self, name: str, g: _Group) -> None:
        """(kazoo thread) A children watch on a missing node stops for good: make sure the
        group's ``live`` and ``status`` nodes exist first."""
        if self._client.exists(config_path(name)) is not None:  # not a group being deleted
            for path in (live_dir(name), status_dir(name), route_dir(name)):
                self._client.ensure_path(path, self._acl)
        self._client.DataWatch(config_path(name), self._group_watch(name, g, "config"))
        self._client.ChildrenWatch(live_dir(name), self._group_watch(name, g, "live"))
        self._client.ChildrenWatch(route_dir(name), self._group_watch(name, g, "route"))
        self._client.ChildrenWatch(status_dir(name), self._group_watch(name, g, "status"))

    def _group_watch(self, name: str, g: _Group, kind: str) -> Callable[..., Any]:
        def fired(*args: Any) -> bool:
            if g.gone:
                return False
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._apply_group, name, g, kind, args[0])
            return True
        return fired

    def _apply_group(self, name: str, g: _Group, kind: str, value: Any) -> None:
        if g.gone:
            return
        g.seen.add(kind)
        if kind == "config":
            if value is None:
                g.config = None
            else:
                try:
                    g.config = GroupConfig.from_json(value)
                except LayoutError as exc:
                    log.error("group %s: ignoring malformed config: %s", name, exc)
                    return
        elif kind == "live":
            g.live = frozenset(value or ())
        elif kind == "route":
            g.route_names = frozenset(value or ())
            self._follow(name, g)
            return
        elif kind == "status":
            g.status_names = frozenset(value or ())
            self._follow(name, g)
            return
        self._bump()

    def _follow(self, name: str, g: _Group) -> None:
        """Watch each broker's route document, and the status of a broker without one."""
        for broker in g.route_names - g.watched_route:
            g.watched_route.add(broker)
            self._arm(self._client.DataWatch, f"{route_dir(name)}/{broker}",
                      self._route_watch(name, g, broker))
        for broker in g.status_names - g.route_names - g.watched_status:
            g.watched_status.add(broker)
            self._arm(self._client.DataWatch, f"{status_dir(name)}/{broker}",
                      self._status_watch(g, broker))

    def _route_watch(self, name: str, g: _Group, broker: str) -> Callable[..., Any]:
        def fired(data: bytes | None, *_: Any) -> bool:
            if g.gone:
                return False
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._apply_route, name, g, broker, data)
            return data is not None  # a deleted document ends its watch
        return fired

    def _apply_route(self, name: str, g: _Group, broker: str, data: bytes | None) -> None:
        g.read.add(broker)
        before = g.fields(broker)
        if data is None:
            g.routes.pop(broker, None)
            g.watched_route.discard(broker)
            g.route_names = g.route_names - {broker}
            self._follow(name, g)  # followed through its status again, if it has one
        else:
            try:
                route = BrokerRouteDoc.from_json(data)
            except LayoutError as exc:
                log.debug("ignoring malformed route of %s: %s", broker, exc)
                return
            g.routes[broker] = (int(route.effective), route.epoch_applied)
            g.statuses.pop(broker, None)  # its status watch ends at its next notification
        if g.fields(broker) != before:
            self._bump()

    def _status_watch(self, g: _Group, broker: str) -> Callable[..., Any]:
        def fired(data: bytes | None, *_: Any) -> bool:
            if g.gone:
                return False
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._apply_status, g, broker, data)
            return data is not None and broker not in g.route_names
        return fired

    def _apply_status(self, g: _Group, broker: str, data: bytes | None) -> None:
        g.read.add(broker)
        if broker in g.route_names:  # followed through its route document now
            g.statuses.pop(broker, None)
            g.watched_status.discard(broker)
            return
        before = g.fields(broker)
        if data is None:
            g.statuses.pop(broker, None)
            g.watched_status.discard(broker)
        else:
            try:
                g.statuses[broker] = BrokerStatus.from_json(data)
            except LayoutError as exc:
                log.debug("ignoring malformed status of %s: %s", broker, exc)
                return
        if g.fields(broker) != before:
            self._bump()

    @property
    def client(self) -> KazooClient:
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def acl(self) -> Any:
        return self._acl

    async def wait_topic(self, topic: str, doc: TopicDoc | None, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until this view holds ``doc`` for ``topic`` (None: gone), so a
        client that asks for the route right after an admin change sees it."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.topics.get(topic) != doc:
                    await self._changed.wait()

    async def has_topic(self, topic: str, timeout_s: float = 5.0) -> bool:
        """Whether ``topic`` exists, asking ZooKeeper when this view has not heard of it yet.

        A topic created through another broker reaches this view a notification later; a
        client that joins or asks for it in between must not be told it does not exist.
        After a ``sync`` (so the server this session reads from has caught up), a topic
        ZooKeeper holds is waited for (bounded) until the watch delivers it."""
        if topic in self.topics:
            return True
        path = topic_path(topic)

        def exists() -> bool:
            self._client.sync(path)
            return self._client.exists(path) is not None

        if not await asyncio.to_thread(exists):
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while topic not in self.topics:
                    await self._changed.wait()
        return topic in self.topics

    # ------------------------------------------------------------------ answers

    def groups(self) -> list[str]:
        """Groups with a readable config (in the document, while routes come from it; a
        group not read yet since the view went back to its own watches: as the last
        document showed it)."""
        if self._documented and self._doc is not None:
            return sorted(self._doc.groups)
        return sorted(n for n, g in self._groups.items()
                      if g.config is not None or self._from_document(n, g))

    def _from_document(self, name: str, g: _Group | None) -> bool:
        """Answer ``name`` from the last document: routes come from it, or the view's own
        watches have not read every node of the group yet (its config read but not its
        brokers' routes would show no broker holding anything)."""
        return (self._doc is not None and name in self._doc.groups
                and (self._documented or (g is not None and not g.complete)))

    def group_route(self, group: str) -> GroupRoute:
        """The group's brokers as a client should see them: a broker's permission is the
        effective one it last published (its route document, else its status), 0
        (unreachable) when its session is gone, and 0 when it was published at an epoch
        older than a live peer's (:func:`~understudy_broker.protocol.current_claims`)."""
        g = self._groups.get(group)
        if self._from_document(group, g):
            assert self._doc is not None
            return GroupRoute(group, current_claims(self._doc.groups[group]))
        if g is None or g.config is None:
            return GroupRoute(group, [])
        out = []
        for spec in g.config.brokers:
            fields = g.fields(spec.name)
            live = spec.name in g.live
            perm = fields[0] if fields is not None and live else 0
            epoch = fields[1] if fields is not None else 0
            out.append(BrokerRoute(spec.name, spec.address, spec.role.value, perm, epoch,
                                   reachable=live))
        return GroupRoute(group, current_claims(out))


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("arming a cluster watch failed: %r", fut.exception())
