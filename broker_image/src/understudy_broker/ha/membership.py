"""Consumer groups held by brokers: membership, heartbeats, queue ownership in ZooKeeper.

Why this module exists: invariant 6 (one member per queue) must hold while any master
is dead, so a consumer group's state lives with the brokers in ZooKeeper (DESIGN
"Topics across groups"), never with one master:

- a member heartbeats to any broker; that broker *hosts* it: it creates the ephemeral
  ``/consumers/<cg>/members/<member>`` in its own session and deletes it when the
  member's heartbeats stop for its session timeout (or ZooKeeper deletes it when the
  broker dies, and the member re-joins through another broker);
- ``/consumers/<cg>/assignment`` holds ownership; every broker hosting members of the
  group recomputes it on a membership or topic change with the pure
  :func:`understudy_broker.assignment.rebalance` and writes it with a versioned write
  (racing brokers converge: the result is a function of its inputs);
- a queue moves in two steps: its owner is told to release it, stops pulling,
  commits, and releases in its next heartbeat; only then does the taker own it. A member
  whose session expired lost its queues at once; its client stopped pulling before that
  (the member's own lease, counted from when it *sent* its last good heartbeat, ends
  before the broker's expiry, counted from when it *received* it);
- :meth:`Membership.check_owner` is what the broker serving a pull asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from understudy_broker import assignment as asg
from understudy_broker import protocol as p
from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.retry import Backoff
from understudy_broker.tasks import stop_tasks
from understudy_broker.zkclient import kazoo_future
from understudy_broker.zklayout import (
    CONSUMER_GROUPS,
    AssignmentDoc,
    GroupSpace,
    LayoutError,
    MemberDoc,
    Owner,
    QueueKey,
    check_member,
)

log = logging.getLogger(__name__)

#: Expiry checks happen when the earliest hosted session can end, never more often than
#: this; with no member hosted the loop sleeps until one joins (it polled every 0.1 s:
#: ten wake-ups a second on every broker, for each of its two memberships).
EXPIRY_CHECK_S = 0.1
GROUP_READY_TIMEOUT_S = 5.0
#: Grace for a vanished member whose session timeout this broker never read.
UNKNOWN_SESSION_MS = 30_000
#: A group this broker neither hosts a member of nor was asked about (a heartbeat, a pull's
#: ownership check, a describe) for this long is dropped from its cache: the cache stays
#: the size of the groups in use, not of every group ever served (docs/perf-notes.md).
GROUP_IDLE_S = 600.0


class MembershipError(Exception):
    def __init__(self, status: p.Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class _Hosted:
    doc: MemberDoc
    last_seen: float
    joined_at: float


def expiry_wait(hosted: Iterable[_Hosted], now: float) -> float | None:
    """Seconds until the earliest of ``hosted``'s sessions can end (at least
    :data:`EXPIRY_CHECK_S`), ``None`` with none hosted. A heartbeat only moves an expiry
    later, so waking at the old one costs a check, never a late expiry."""
    ends = [h.last_seen + h.doc.session_timeout_ms / 1000 for h in hosted]
    if not ends:
        return None
    return max(EXPIRY_CHECK_S, min(ends) - now + 0.005)


@dataclass(slots=True)
class _Group:
    """What this broker knows of one consumer group (watched once it is used here)."""

    doc: AssignmentDoc = field(default_factory=lambda: AssignmentDoc(0))
    version: int = -1  # znode version of ``doc``; -1: no assignment node yet
    members: frozenset[str] = frozenset()
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    arming: asyncio.Task[None] | None = None  # setting the watches (Membership._group)
    watching_assignment: bool = False
    watching_members: bool = False
    used: float = 0.0  # the clock at its last use here (Membership.evict_idle)


class Membership:
    """The consumer groups seen by one broker."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop, *, broker: str,
                 view: ClusterView, acl: Any = None,
                 on_rebalance: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 space: GroupSpace = CONSUMER_GROUPS, idle_s: float = GROUP_IDLE_S) -> None:
        self._space = space
        self._idle_s = idle_s
        self._client = client
        self._loop = loop
        self._broker = broker
        self._view = view
        self._acl = acl
        self._on_rebalance = on_rebalance
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        self._hosted: dict[tuple[str, str], _Hosted] = {}
        self._hosted_joined = asyncio.Event()  # wakes the expiry loop (expiry_wait)
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalancing: dict[str, asyncio.Task[None]] = {}
        self._rebalance_again: set[str] = set()
        self._last_written: dict[str, int] = {}
        self._known: dict[tuple[str, str], tuple[tuple[str, ...], int]] = {}
        self._ghosts: dict[str, dict[str, tuple[float, tuple[str, ...]]]] = {}
        self._stopped = False  # no rebalance starts after stop()

    def on_rebalance(self, listener: Callable[[str], None]) -> None:
        """``listener(consumer_group)`` after each assignment generation this broker wrote."""
        self._on_rebalance = listener

    async def start(self) -> None:
        self._tasks.append(self._loop.create_task(self._expiry_loop(), name="member-expiry"))
        self._tasks.append(self._loop.create_task(self._evict_loop(), name="group-eviction"))

    @property
    def cached(self) -> int:
        """How many groups this broker keeps a cache (and watches) for."""
        return len(self._groups)

    def evict_idle(self, now: float) -> list[str]:
        """Drop every group unused here for ``idle_s``: no member hosted, no rebalance or
        arming running, no vanished member still owning queues. Its watches end at their
        next notification (kazoo cannot remove them earlier); a later request arms the
        group again from ZooKeeper, which holds all of its state. Returns the groups
        dropped."""
        hosting = {cg for cg, _m in self._hosted}
        dropped = []
        for cgroup, g in list(self._groups.items()):
            task = self._rebalancing.get(cgroup)
            if (now - g.used < self._idle_s or cgroup in hosting or self._ghosts.get(cgroup)
                    or (task is not None and not task.done())
                    or (g.arming is not None and not g.arming.done())):
                continue
            del self._groups[cgroup]
            for table in (self._rebalancing, self._last_written, self._ghosts):
                table.pop(cgroup, None)
            self._rebalance_again.discard(cgroup)
            for key in [k for k in self._known if k[0] == cgroup]:
                del self._known[key]
            dropped.append(cgroup)
        if dropped:
            log.info("%s: %d idle group(s) dropped from the cache (%d kept)", self._space.kind,
                     len(dropped), len(self._groups))
        return dropped

    async def _evict_loop(self) -> None:
        while True:
            await asyncio.sleep(self._idle_s / 2)
            self.evict_idle(self._clock())

    async def stop(self) -> None:
        self._stopped = True
        armings = [g.arming for g in self._groups.values() if g.arming is not None]
        await stop_tasks([*self._tasks, *self._rebalancing.values(), *armings])
        self._tasks.clear()

    def _zk(self, async_result: Any) -> asyncio.Future[Any]:
        return kazoo_future(self._loop, async_result)

    # ------------------------------------------------------------------ watches

    async def _group(self, cgroup: str, *, create: bool = False) -> _Group | None:
        """The group's cached state, watched from its first use here; ``None`` when the
        consumer group does not exist (and ``create`` is false: nothing is written).

        Each group is armed by one task of its own that concurrent first requests share:
        one cache and one set of watches per group, and a slow arming of one group never
        delays another. An arming that failed (a ZooKeeper error) is started again by the
        next request, for the watches it has not set yet; one that is only slow goes on
        after a request gave up waiting, so the next request finds it further along."""
        g = self._groups.get(cgroup)
        if g is None:
            if not create and await self._zk(
                    self._client.exists_async(self._space.group(cgroup))) is None:
                return None
            g = self._groups.setdefault(cgroup, _Group())
        g.used = self._clock()
        if g.ready.is_set():
            return g
        if g.arming is None or (g.arming.done() and (g.arming.cancelled()
                                                     or g.arming.exception() is not None)):
            g.arming = self._loop.create_task(self._arm(cgroup, g), name=f"arm-{cgroup}")
            g.arming.add_done_callback(functools.partial(self._armed, cgroup))
        try:
            async with asyncio.timeout(GROUP_READY_TIMEOUT_S):
                await asyncio.shield(g.arming)
                await g.ready.wait()
        except TimeoutError:
            raise MembershipError(p.Status.TIMEOUT,
                                  f"{self._space.kind} {cgroup}: ZooKeeper did not answer "
                                  f"within {GROUP_READY_TIMEOUT_S:g}s") from None
        except (KazooException, KazooTimeoutError) as exc:
            raise MembershipError(p.Status.TIMEOUT,
                                  f"{self._space.kind} {cgroup}: could not watch its nodes in "
                                  f"ZooKeeper ({exc!r}); the next request tries again") from None
        return g

    async def _arm(self, cgroup: str, g: _Group) -> None:
        """Set the group's watches, each once (a retry skips what an earlier try set)."""
        if not g.watching_assignment:
            await asyncio.to_thread(self._client.ensure_path, self._space.members(cgroup),
                                    self._acl)
            await asyncio.to_thread(self._client.DataWatch, self._space.assignment(cgroup),
                                    self._kz(self._apply_assignment, cgroup, g))
            g.watching_assignment = True
        if not g.watching_members:
            await asyncio.to_thread(self._client.ChildrenWatch, self._space.members(cgroup),
                                    self._kz(self._apply_members, cgroup, g))
            g.watching_members = True

    def _armed(self, cgroup: str, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("%s %s: watching its nodes failed (%r); the next request tries again",
                        self._space.kind, cgroup, exc)

    def _kz(self, apply: Callable[..., None], cgroup: str, g: _Group) -> Callable[..., Any]:
        """A kazoo watch function for ``g``; it ends its watch (returns False) once ``g``
        was dropped from the cache (a later use watches the group afresh)."""
        def fired(*args: Any) -> bool:
            if self._groups.get(cgroup) is not g:
                return False
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(apply, cgroup, g, *args)
            return True
        return fired

    def _apply_assignment(self, cgroup: str, g: _Group, data: bytes | None, stat: Any,
                          *_: Any) -> None:
        if self._groups.get(cgroup) is not g:
            return  # dropped from the cache since
        if data is None or stat is None:
            doc, version = AssignmentDoc(0), -1
        else:
            try:
                doc, version = AssignmentDoc.from_json(data), int(stat.version)
            except LayoutError as exc:
                log.error("%s %s: malformed assignment (%s); rewriting it", self._space.kind,
                          cgroup, exc)
                doc, version = AssignmentDoc(0), int(stat.version)
        if version != g.version or doc != g.doc:
            g.doc, g.version = doc, version
            self._wake(g)
        if not g.ready.is_set():
            g.ready.set()

    def _apply_members(self, cgroup: str, g: _Group, children: list[str]) -> None:
        if self._groups.get(cgroup) is not g:
            return
        members = frozenset(children)
        if members != g.members:
            g.members = members
            self._wake(g)
            self.rebalance_soon(cgroup)

    def _wake(self, g: _Group) -> None:
        g.changed.set()
        g.changed = asyncio.Event()

    def topics_changed(self) -> None:
        """The cluster view changed (queues added or removed): rebalance what we host."""
        for cgroup in {cg for cg, _m in self._hosted}:
            self.rebalance_soon(cgroup)

    # ------------------------------------------------------------------ requests

    async def heartbeat(self, req: p.MemberHeartbeatRequest) -> p.MemberHeartbeatResponse:
        cgroup, member = self._names(req.cgroup, req.member)
        unknown = [t for t in req.topics if not await self._view.has_topic(t)]
        if unknown:
            raise MembershipError(
                p.Status.UNKNOWN_TOPIC,
                f"unknown topic {unknown[0]!r}: consumer groups read cluster topics "
                "(understudy topic create)")
        if not req.topics:
            raise MembershipError(p.Status.BAD_REQUEST, "a member subscribes to at least one topic")
        g = await self._group(cgroup, create=req.join)
        key = (cgroup, member)
        hosted = self._hosted.get(key)
        if g is None:
            raise MembershipError(
                p.Status.UNKNOWN_MEMBER,
                f"no consumer group {cgroup!r}/{member!r} here (it never had a member): join")
        if req.join:
            doc = MemberDoc(member, self._broker, tuple(req.topics), req.session_timeout_ms)
            await self._register(cgroup, doc)
            now = self._clock()
            hosted = self._hosted[key] = _Hosted(doc, now, now)
            self._hosted_joined.set()
            # Answer with the assignment that includes the newcomer (free queues are its
            # at once; the rest follow as their holders release them).
            await self._rebalance_now(cgroup)
        elif hosted is None:
            what = "no member"
            raise MembershipError(
                p.Status.UNKNOWN_MEMBER,
                f"{what} {cgroup!r}/{member!r} here (its session expired, or it joined "
                "through another broker): join again")
        elif member not in g.members and self._clock() - hosted.joined_at > 1.0:
            # Our ZooKeeper session was replaced and took the ephemeral node with it.
            await self._register(cgroup, hosted.doc)
            hosted.joined_at = self._clock()
        hosted.last_seen = self._clock()
        if req.released:
            await self._update(cgroup, lambda owners: asg.release(owners, member, req.released))
        if req.wait_ms and req.generation == g.doc.generation:
            # A long poll: the member hears of a change at once (it already knows what this
            # generation asks of it). Its liveness still counts from this request's arrival
            # (clients wait at most a sixth of the session).
            changed = g.changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(req.wait_ms / 1000):
                    await changed.wait()
        owned, revoking = asg.view_of(g.doc, member)
        return p.MemberHeartbeatResponse(g.doc.generation, owned, revoking, self._broker)

    async def leave(self, req: p.LeaveGroupRequest) -> p.MemberHeartbeatResponse:
        cgroup, member = self._names(req.cgroup, req.member)
        if await self._group(cgroup) is None:
            raise MembershipError(p.Status.UNKNOWN_MEMBER, f"no consumer group {cgroup!r}")
        self._hosted.pop((cgroup, member), None)
        await self._update(cgroup, lambda owners: asg.leave(owners, member))
        with contextlib.suppress(NoNodeError):
            await self._zk(self._client.delete_async(self._space.member(cgroup, member)))
        return p.MemberHeartbeatResponse(self._groups[cgroup].doc.generation, [], [], self._broker)

    async def describe(self, cgroup: str) -> p.DescribeGroupResponse:
        self._names(cgroup, "x")
        g = await self._group(cgroup)
        if g is None:
            return p.DescribeGroupResponse(cgroup, 0, [], [])
        members = []
        for m in sorted(g.members):
            with contextlib.suppress(NoNodeError, LayoutError):
                raw, _ = await self._zk(self._client.get_async(self._space.member(cgroup, m)))
                d = MemberDoc.from_json(raw)
                members.append({"member": d.member, "broker": d.broker, "topics": list(d.topics),
                                "session_timeout_ms": d.session_timeout_ms})
        owners = [{"topic": t, "queue": q, "member": o.member, "next": o.next}
                  for (t, q), o in sorted(g.doc.owners.items())]
        return p.DescribeGroupResponse(cgroup, g.doc.generation, members, owners)

    async def list_groups(self) -> p.ListGroupsResponse:
        """Every consumer group with its member count and generation (read, not watched)."""
        try:
            names = sorted(await self._zk(self._client.get_children_async(self._space.root)))
        except NoNodeError:
            names = []
        out = []
        for cg in names:
            members: list[str] = []
            generation = 0
            with contextlib.suppress(NoNodeError):
                members = await self._zk(self._client.get_children_async(self._space.members(cg)))
            with contextlib.suppress(NoNodeError, LayoutError):
                raw, _ = await self._zk(self._client.get_async(self._space.assignment(cg)))
                generation = AssignmentDoc.from_json(raw).generation
            out.append({"group": cg, "members": len(members), "generation": generation})
        return p.ListGroupsResponse(out)

    async def check_owner(self, cgroup: str, member: str, topic: str, queue: int,
                          generation: int) -> None:
        """Raise NOT_OWNER unless ``member`` owns the queue. A member that pulls under a
        generation newer than ours waits for our watch to catch up (bounded)."""
        g = await self._group(cgroup)
        if g is None:
            raise MembershipError(p.Status.NOT_OWNER,
                                  f"no consumer group {cgroup!r}: member {member!r} owns nothing")
        if generation > g.doc.generation:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    while generation > g.doc.generation:
                        await g.changed.wait()
        doc = self._view.topics.get(topic)
        key = queue if doc is None else doc.ownership_key(queue)
        owner = g.doc.owners.get((topic, key))
        if owner is None or owner.member != member:
            holder = "nobody" if owner is None else repr(owner.member)
            raise MembershipError(
                p.Status.NOT_OWNER,
                f"member {member!r} of {cgroup!r} does not own {topic}/{queue} (generation "
                f"{g.doc.generation}: held by {holder}); stop pulling it")

    # ------------------------------------------------------------------ internals

    def _names(self, cgroup: str, member: str) -> tuple[str, str]:
        try:
            return self._space.check(cgroup), check_member(member)
        except LayoutError as exc:
            raise MembershipError(p.Status.BAD_REQUEST, str(exc)) from None

    async def _register(self, cgroup: str, doc: MemberDoc) -> None:
        """Create the member's ephemeral node in our session (taking it over from another
        broker's session when the member moved to us)."""
        path = self._space.member(cgroup, doc.member)
        for _ in range(3):
            try:
                await self._zk(self._client.create_async(path, doc.to_json(), acl=self._acl,
                                                         ephemeral=True))
                return
            except NodeExistsError:
                try:
                    _raw, stat = await self._zk(self._client.get_async(path))
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self._session_id():
                    await self._zk(self._client.set_async(path, doc.to_json()))
                    return
                # Take it over in one transaction: the members list never lacks the member,
                # so no broker rebalances its queues away while it keeps pulling them.
                txn = self._client.transaction()
                txn.delete(path, version=stat.version)
                txn.create(path, doc.to_json(), acl=self._acl, ephemeral=True)
                results = await self._zk(txn.commit_async())
                if not any(isinstance(r, Exception) for r in results):
                    return
        raise MembershipError(p.Status.INTERNAL, f"could not register member {doc.member!r}")

    def _session_id(self) -> int | None:
        cid = self._client.client_id
        return None if cid is None else int(cid[0])

    async def _update(self, cgroup: str,
                      change: Callable[[Mapping[QueueKey, Owner]], Mapping[QueueKey, Owner]]) -> None:
        """Read-modify-write of the assignment with the znode version read."""
        backoff = Backoff(0.005, 0.1)
        path = self._space.assignment(cgroup)
        for _ in range(20):
            try:
                raw, stat = await self._zk(self._client.get_async(path))
                try:
                    doc = AssignmentDoc.from_json(raw)
                except LayoutError:
                    doc = AssignmentDoc(0)
                version = int(stat.version)
            except NoNodeError:
                doc, version = AssignmentDoc(0), -1
            nxt = asg.advance(doc, change(doc.owners))
            if nxt is None:
                return
            try:
                if version < 0:
                    await self._zk(self._client.create_async(path, nxt.to_json(), acl=self._acl))
                else:
                    await self._zk(self._client.set_async(path, nxt.to_json(), version=version))
            except (BadVersionError, NodeExistsError):
                await backoff.sleep()
                continue
            log.info("%s %s: generation %d", self._space.kind, cgroup, nxt.generation)
            self._last_written[cgroup] = nxt.generation
            if self._on_rebalance is not None:
                self._on_rebalance(cgroup)
            return
        raise MembershipError(p.Status.INTERNAL, f"{self._space.kind} {cgroup}: assignment contended")

    def rebalance_soon(self, cgroup: str) -> None:
        """Rebalance ``cgroup`` now, or once more after the rebalance running. Nothing
        after :meth:`stop`: a watch or a vanished member's timer that fires then would
        start a task nobody stops (or, on a closed loop, leave its coroutine unawaited)."""
        if self._stopped or self._loop.is_closed():
            return
        task = self._rebalancing.get(cgroup)
        if task is not None and not task.done():
            self._rebalance_again.add(cgroup)
            return
        self._rebalancing[cgroup] = self._loop.create_task(self._rebalance(cgroup))

    async def _rebalance_now(self, cgroup: str, timeout_s: float = 2.0) -> None:
        self.rebalance_soon(cgroup)
        task = self._rebalancing.get(cgroup)
        if task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await asyncio.shield(task)
        g = self._groups[cgroup]
        # Our own write reaches our cache through the watch: wait for it (bounded).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.5):
                while self._last_written.get(cgroup, 0) > g.doc.generation:
                    await g.changed.wait()

    async def _rebalance(self, cgroup: str) -> None:
        while True:
            self._rebalance_again.discard(cgroup)
            try:
                members = self._with_ghosts(cgroup, await self._member_topics(cgroup))
                queues = {t: list(d.assignable()) for t, d in self._view.topics.items()}
                await self._update(cgroup, functools.partial(_rebalanced, members=members,
                                                             queues=queues))
            except Exception as exc:  # a ZooKeeper hiccup: the next change retries
                log.warning("%s %s: rebalance failed: %r", self._space.kind, cgroup, exc)
            if cgroup not in self._rebalance_again:
                return

    def _with_ghosts(self, cgroup: str, live: dict[str, tuple[str, ...]]
                     ) -> dict[str, tuple[str, ...]]:
        """Live members, plus members whose node vanished while they still own queues.

        A node vanishes without a hand-over when its *hosting broker* died: the member
        itself may be alive, within its lease, pulling, and about to join another broker.
        Its queues stay its own for its session timeout from when we saw it go (its lease,
        counted from a heartbeat sent before that, is over by then). A member that left or
        that its hosting broker expired owns nothing by the time its node goes."""
        now = self._clock()
        g = self._groups.get(cgroup)
        owners = set() if g is None else {o.member for o in g.doc.owners.values()}
        ghosts = self._ghosts.setdefault(cgroup, {})
        for m in owners - set(live):
            if m not in ghosts:
                topics, session_ms = self._known.get((cgroup, m), ((), UNKNOWN_SESSION_MS))
                if not topics and g is not None:
                    topics = tuple(sorted({t for (t, _q), o in g.doc.owners.items()
                                           if o.member == m}))
                ghosts[m] = (now + session_ms / 1000, topics)
                log.info("%s %s: member %s vanished with its broker; its queues "
                         "stay its own for %.1fs", self._space.kind, cgroup, m, session_ms / 1000)
        out = dict(live)
        for m, (until, topics) in list(ghosts.items()):
            if m in live or now >= until or m not in owners:
                del ghosts[m]
            else:
                out[m] = topics
                self._loop.call_later(until - now + 0.01, self.rebalance_soon, cgroup)
        return out

    async def _member_topics(self, cgroup: str) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        children = await self._zk(self._client.get_children_async(self._space.members(cgroup)))
        for m in children:
            with contextlib.suppress(NoNodeError, LayoutError):
                raw, _ = await self._zk(self._client.get_async(self._space.member(cgroup, m)))
                doc = MemberDoc.from_json(raw)
                out[m] = doc.topics
                self._known[(cgroup, m)] = (doc.topics, doc.session_timeout_ms)
        return out

    async def _expiry_loop(self) -> None:
        while True:
            wait = expiry_wait(self._hosted.values(), self._clock())
            self._hosted_joined.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._hosted_joined.wait()
            now = self._clock()
            for key, h in list(self._hosted.items()):
                if now - h.last_seen > h.doc.session_timeout_ms / 1000:
                    cgroup, member = key
                    self._hosted.pop(key, None)
                    log.info("%s %s: member %s expired (no heartbeat for %.1fs)",
                             self._space.kind, cgroup, member, now - h.last_seen)
                    try:
                        await self._expire(cgroup, member)
                    except Exception as exc:  # a ZooKeeper hiccup must not end expiry for good
                        log.warning("%s %s: expiring %s failed (%r); retried",
                                    self._space.kind, cgroup, member, exc)
                        self._hosted.setdefault(key, h)

    async def _expire(self, cgroup: str, member: str) -> None:
        """The member's session ended here (its own lease ended before): its queues go to
        their takers or are freed first, then its node goes. A member whose node another
        broker took over is alive there (it moved while this broker was frozen or cut
        off): it keeps its queues, and its node stays."""
        path = self._space.member(cgroup, member)
        try:
            _raw, stat = await self._zk(self._client.get_async(path))
        except NoNodeError:
            stat = None
        if stat is not None and stat.ephemeralOwner != self._session_id():
            log.info("%s %s: member %s moved to another broker; not expired here",
                     self._space.kind, cgroup, member)
            return
        with contextlib.suppress(MembershipError):
            await self._update(cgroup, lambda owners: asg.leave(owners, member))
        if stat is not None:
            with contextlib.suppress(NoNodeError, BadVersionError):
                await self._zk(self._client.delete_async(path, version=stat.version))


def _rebalanced(owners: Mapping[QueueKey, Owner], *, members: Mapping[str, tuple[str, ...]],
                queues: Mapping[str, list[int]]) -> Mapping[QueueKey, Owner]:
    return asg.rebalance(owners, members, queues)
