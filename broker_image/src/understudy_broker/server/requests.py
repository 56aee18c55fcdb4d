"""Request handling: one method per operation, each checked against the effective permission.

Why this module exists: this is where network input meets stored data, so it owns the
rules that protect the data: a slave never writes (invariant 2), a broker without READ
never serves a read, a request stamped with an older epoch is refused, a write is
acknowledged only once it is durable and replicated as configured (invariant 3), and a
committed offset never moves back (invariant 4). :meth:`Requests.handle` maps an
operation to its handler and returns the response body or raises :class:`RequestError`
with the status the client sees; transport lives in :mod:`.connections`.

PRODUCE appends synchronously (no await before ``CommitLog.append``), so batches from one
connection land in the order they were sent; durability (group commit) and replication
are awaited afterwards, in parallel. PULL long-polls on an :class:`AppendSignal`: woken by a
local append to one of its queues, and by replicated data on a slave and every
permission change (a waiting poll re-checks READ when it wakes).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import errno
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final, Protocol, cast

from understudy_broker import idempotence as idem
from understudy_broker import protocol as p
from understudy_broker import scheduling as sch
from understudy_broker.acl import AclError, Resource
from understudy_broker.chains import still_head
from understudy_broker.client import BrokerError
from understudy_broker.config import BrokerConfig
from understudy_broker.ha.aclview import admin_security
from understudy_broker.ha.authority import Authority
from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.ha.membership import Membership, MembershipError
from understudy_broker.ha.topicadmin import TopicAdmin, TopicConflict
from understudy_broker.model import Permission, Role
from understudy_broker.replication.isr import NotEnoughReplicasError, ReplicationTimeoutError
from understudy_broker.security import ClientSecurity
from understudy_broker.server.auth import INTERNAL, Guard, Session
from understudy_broker.server.errors import RequestError
from understudy_broker.server.metrics import BrokerMetrics
from understudy_broker.server.mirror import CommitMirror
from understudy_broker.server.producers import ProducePlan, Producers
from understudy_broker.server.readable import ReadableEnd
from understudy_broker.server.replica import Replica
from understudy_broker.server.scheduler import Escaper, NoWritableQueue, Scheduler
from understudy_broker.storage.commitlog import DamagedRecordError, RawItem
from understudy_broker.storage.offsets import RESERVED_PREFIX, encode_commit_record
from understudy_broker.storage.records import (
    CommitLogError,
    PackedBatch,
    RecordTuple,
    StoredRecord,
    unpacked,
)
from understudy_broker.storage.store import Store
from understudy_broker.topology import TopicPlanError

log = logging.getLogger("understudy.broker")

PULL_MAX_RECORDS = 4096
#: Operations that make a connection a consumer session (closed when READ is lost).
CONSUMER_OPS = frozenset({p.Op.PULL, p.Op.PULL_MULTI, p.Op.COMMIT_OFFSET, p.Op.FETCH_OFFSET})
#: Long polls: a consumer session's waiting answers (they answer NO_PERMISSION when READ goes).
LONG_POLLS = frozenset({p.Op.PULL, p.Op.PULL_MULTI})


class AppendSignal:
    """Wakes long-poll waiters: those of a queue when that queue grows (:meth:`grew`),
    every one when anything else changes (:meth:`fire`: permission, epoch, bytes
    replicated to a slave, stopping).

    A produce to one queue used to wake every long poll on the broker, and each went
    back to sleep after reading nothing from its own queues: with many queues or
    consumer groups on a broker, most wake-ups were for nothing (docs/broker.md)."""

    def __init__(self) -> None:
        self._every: set[asyncio.Future[None]] = set()
        self._by_queue: dict[tuple[str, int], set[asyncio.Future[None]]] = {}

    def fire(self) -> None:
        """Wake every waiter."""
        waiters, self._every = self._every, set()
        self._by_queue.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def grew(self, queues: Iterable[tuple[str, int]]) -> None:
        """Wake the waiters of these ``(topic, queue)``s."""
        for key in queues:
            for fut in self._by_queue.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    async def wait(self, wait_s: float, queues: Iterable[tuple[str, int]] = ()) -> None:
        """Until one of ``queues`` grows, :meth:`fire`, or ``wait_s`` seconds."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = set(queues)
        self._every.add(fut)
        for key in keys:
            self._by_queue.setdefault(key, set()).add(fut)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await fut
        finally:
            self._every.discard(fut)
            for key in keys:
                waiting = self._by_queue.get(key)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del self._by_queue[key]


def _damaged(exc: DamagedRecordError) -> RequestError:
    """A read reached a damaged record (the store logged it): CORRUPT_RECORD, naming it."""
    return RequestError(p.Status.CORRUPT_RECORD, p.corrupt_record_message(
        exc.offset, f"{exc.topic}/{exc.queue}: {exc.detail}", exc.next_offset))


async def acknowledged(waits: Sequence[Awaitable[None]]) -> None:
    """Wait until a write may be acknowledged (locally durable, and replicated when
    replication is synchronous); a storage or replication failure becomes the status the
    client sees."""
    try:
        await asyncio.gather(*waits)
    except NotEnoughReplicasError as exc:
        raise RequestError(p.Status.NOT_ENOUGH_REPLICAS, str(exc)) from exc
    except ReplicationTimeoutError as exc:
        raise RequestError(p.Status.TIMEOUT, str(exc)) from exc
    except OSError as exc:
        raise storage_failed(exc, "flushing the log", undone=False) from exc


def _merge_repeats(queues: Sequence[int], plan: ProducePlan,
                   stored: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """One ``(queue, offset)`` per request message (``queues[i]``: the queue message ``i``
    went to): a repeat gets the offset its first copy got, a new one the offset it was
    stored at (``stored``, in ``plan.kept`` order)."""
    out: list[tuple[int, int]] = []
    it = iter(stored)
    for i, q in enumerate(queues):
        first = plan.repeats.get(i)
        if first is None:
            out.append(next(it))
        else:
            out.append((q, p.SCHEDULED_OFFSET if first == idem.SCHEDULED else first))
    return out


_DISK_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
#: The operations whose PRODUCE bodies are in batch form, and each multi's part's op.
_BATCH_FORM: Final = frozenset({p.Op.PRODUCE_BATCH})
#: The long polls answered with stored items (PULL_BATCH's answer).
_STORED_ANSWERS: Final = frozenset({p.Op.PULL_BATCH, p.Op.PULL_MULTI_BATCH})
_PART_OP: Final[dict[int, p.Op]] = {p.Op.PRODUCE_MULTI: p.Op.PRODUCE,
                                     p.Op.PRODUCE_MULTI_BATCH: p.Op.PRODUCE_BATCH}


#: What a read of a queue gives: messages (PULL), or stored items (PULL_BATCH).
Read = StoredRecord | RawItem


def _first(read: StoredRecord | RawItem) -> int:
    return read.first if isinstance(read, RawItem) else read.queue_offset


def _answer_bytes(read: list[Read]) -> int:
    """What a read puts in a PULL answer: messages' keys and bodies, or items whole."""
    return sum(len(r.data) if isinstance(r, RawItem) else len(r.body) + len(r.key or b"")
               for r in read)


def storage_failed(exc: OSError, doing: str, *, undone: bool = True) -> RequestError:
    """The status a client sees for a failed write to the data directory: a full disk
    (or quota) is ``STORAGE_FULL``, which says what to do; anything else ``INTERNAL``.
    ``undone``: the storage layer undid the write (a failed append: nothing is kept);
    False for a failed flush of bytes already appended (they are not acknowledged)."""
    if exc.errno in _DISK_FULL:
        what = ("nothing was stored" if undone else
                "the write is not acknowledged (a retry of an idempotent producer is "
                "stored once)")
        return RequestError(
            p.Status.STORAGE_FULL,
            f"{doing}: the broker's disk is full ({exc.strerror}"
            f"{f': {exc.filename}' if exc.filename else ''}); {what}. Free space or grow "
            "the volume; a producer of a topic on several groups writes elsewhere")
    return RequestError(p.Status.INTERNAL, f"{doing}: {exc}")


Handler = Callable[[p.Frame, Session], Awaitable[bytes]]
#: Waits until the requesting connection can take an answer (its client reads what it was
#: sent); True when it had to wait. Given by the client port (server/connections.py).
OutputRoom = Callable[[], Awaitable[bool]]


async def always_room() -> bool:
    """The :data:`OutputRoom` of a caller without a connection to hold back."""
    return False


@dataclasses.dataclass(slots=True, eq=False)
class _Part:
    """One PRODUCE (or one part of a PRODUCE_MULTI) on its way through
    :meth:`Requests._checked_produce` -> ``_ready`` -> ``_append`` -> ``_answer``."""

    topic: str
    queues: list[int]  # the queue of each message, in request order
    started: float  # perf_counter at arrival: the produce latency metric
    # Each message as (queue, key, body); None while a batch-form part's batches stand
    # for them (unpack() makes them when needed).
    raw: Sequence[tuple[int, bytes | None, bytes]] | None = None
    messages: list[RecordTuple | PackedBatch] = dataclasses.field(default_factory=list)
    extra: int = 0  # messages beyond one per item of ``messages`` (its packed batches)
    producer: p.ProducerSeqs | None = None
    now_ms: int = 0
    ordered: bool = False
    scheduled: list[tuple[int, int]] | None = None
    head_epoch: int | None = None
    plan: ProducePlan | None = None
    stored: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        """The messages the request holds."""
        return len(self.queues)

    def unpack(self) -> None:
        """Store this part message by message (its packed batches taken apart)."""
        if self.raw is None:
            messages = unpacked(self.messages)
            self.raw = [(q, k, b) for _t, q, k, b, _ts in messages]
            self.messages = list(messages)
            self.extra = 0


class Requests:
    """The handlers of one broker. ``backsync_persisted`` is called with the epoch of a
    back-sync the master just made durable (it goes into the broker's status)."""

    def __init__(
        self,
        *,
        cfg: BrokerConfig,
        authority: Authority,
        store: Store,
        replica: Replica,
        signal: AppendSignal,
        metrics: BrokerMetrics,
        stopping: Callable[[], bool],
        backsync_persisted: Callable[[int | None], None],
        scheduler: Scheduler,
        escaper: Escaper,
        producers: Producers,
        readable: ReadableEnd,
        peer_security: ClientSecurity | None = None,
    ) -> None:
        self._cfg = cfg
        self._guard = Guard(cfg.security, lambda: authority.acls, cfg.name)
        self._authority = authority
        self._store = store
        self._replica = replica
        self._signal = signal
        self._readable = readable
        self._rotation = 0  # where a PULL_MULTI's shared byte budget starts (fairness)
        self._metrics = metrics
        self._stopping = stopping
        self._backsync_persisted = backsync_persisted
        self._scheduler = scheduler
        self._escaper = escaper
        self._topic_admin = TopicAdmin(authority)
        # An acting slave copies each commit to the other slaves of the in-sync record
        # before acknowledging it (server/mirror.py).
        self._mirror = CommitMirror(name=cfg.name, group=cfg.group, store=authority.isr_store(),
                                    peers=self._other_slaves, timeout_s=cfg.link_timeout_s,
                                    security=peer_security)
        self.producers = producers  # built by a master while it starts (broker.py)
        self._handlers: dict[int, Handler] = {
            p.Op.CREATE_TOPIC: self._create_topic,
            p.Op.PRODUCE: self._produce,
            p.Op.PRODUCE_MULTI: self._produce_multi,
            p.Op.PRODUCE_BATCH: self._produce,
            p.Op.PRODUCE_MULTI_BATCH: self._produce_multi,
            p.Op.PULL: self._pull,
            p.Op.PULL_MULTI: self._pull_multi,
            p.Op.PULL_BATCH: self._pull,
            p.Op.PULL_MULTI_BATCH: self._pull_multi,
            p.Op.COMMIT_OFFSET: self._commit_offset,
            p.Op.FETCH_OFFSET: self._fetch_offset,
            p.Op.GET_ROUTE: self._get_route,
            p.Op.HEARTBEAT: self._heartbeat,
            p.Op.BACKSYNC_OFFSETS: self._backsync,
            p.Op.ADMIN_TOPIC: self._admin_topic,
            p.Op.QUEUE_STATS: self._queue_stats,
            p.Op.MEMBER_HEARTBEAT: self._member_heartbeat,
            p.Op.LEAVE_GROUP: self._leave_group,
            p.Op.DESCRIBE_GROUP: self._describe_group,
            p.Op.LIST_GROUPS: self._list_groups,
            p.Op.NACK: self._nack,
            p.Op.AUTHENTICATE: self._authenticate,
            p.Op.SECURITY_ADMIN: self._security_admin,
        }
        # Long polls (LONG_POLLS) take the connection's output room too.
        self._long_polls: dict[int, Callable[[p.Frame, Session, OutputRoom], Awaitable[bytes]]] = {
            p.Op.PULL: self._pull, p.Op.PULL_MULTI: self._pull_multi,
            p.Op.PULL_BATCH: self._pull, p.Op.PULL_MULTI_BATCH: self._pull_multi}

    async def handle(self, frame: p.Frame, room: OutputRoom = always_room,
                     who: Session = INTERNAL) -> bytes:
        """The response body for ``frame`` from the connection whose identity is ``who``;
        raises :class:`RequestError` or ``protocol.FrameError`` for an error answer. A PULL
        builds its answer only once ``room`` says the connection can take it."""
        if frame.is_response:
            raise RequestError(p.Status.BAD_FRAME, "a broker does not accept responses")
        handler = self._handlers.get(frame.op)
        if handler is None:
            raise RequestError(p.Status.UNKNOWN_OPERATION, f"operation {frame.op} is not supported")
        self._guard.admit(who, frame.op)
        try:
            poll = self._long_polls.get(frame.op)
            if poll is not None:  # answered only when the connection has room for it
                return await poll(frame, who, room)
            return await handler(frame, who)
        except DamagedRecordError as exc:  # a read reached it; the store logged it
            raise _damaged(exc) from None

    # ---- checks ---------------------------------------------------------------------

    def _check_epoch(self, frame: p.Frame) -> None:
        current = self._authority.epoch()
        if frame.epoch and frame.epoch < current:
            raise RequestError(
                p.Status.STALE_EPOCH,
                f"request epoch {frame.epoch} is older than this broker's epoch {current}",
            )

    def _require_write(self, frame: p.Frame) -> None:
        if self._authority.role is not Role.MASTER:
            raise RequestError(p.Status.NOT_MASTER, f"{self._cfg.name} is a slave: it never writes")
        self._require(Permission.WRITE, frame)

    def _require_read(self, frame: p.Frame) -> None:
        self._require(Permission.READ, frame)

    def _require(self, need: Permission, frame: p.Frame) -> None:
        effective = self._authority.effective()
        if not effective & need:
            raise RequestError(
                p.Status.NO_PERMISSION,
                f"{self._cfg.name} has no {need.label} permission (effective {effective.label})",
            )
        self._check_epoch(frame)

    def _queues(self, topic: str) -> int:
        n = self._store.topics.get(topic)
        if n is None:
            raise RequestError(p.Status.UNKNOWN_TOPIC, f"unknown topic {topic!r}")
        return n

    def _check_queue(self, topic: str, queue: int) -> None:
        """``queue`` of ``topic`` exists and lives on this group (a read or a nack)."""
        queues = self._queues(topic)
        if queue >= queues:
            raise RequestError(
                p.Status.BAD_REQUEST,
                f"queue {queue} does not exist: topic {topic!r} has {queues} queues",
            )
        self._check_placed(topic, (queue,))

    def _check_placed(self, topic: str, queues: Iterable[int]) -> None:
        """A cluster topic's queue is served only by the group it lives on."""
        view = self._authority.cluster
        doc = None if view is None else view.topics.get(topic)
        if doc is None:
            return
        for q in queues:
            g = doc.group_of(q)
            if g != self._cfg.group:
                where = "was removed" if g is None and q < len(doc.queues) else (
                    "does not exist" if g is None else f"lives on group {g!r}")
                raise RequestError(
                    p.Status.BAD_REQUEST,
                    f"queue {q} of topic {topic!r} {where}, not on {self._cfg.group!r}")

    def _ordered(self, topic: str) -> bool:
        view = self._authority.cluster
        doc = None if view is None else view.topics.get(topic)
        return doc is not None and doc.ordered

    def _reads_to_log_end(self, topic: str) -> bool:
        """An ordered topic's queue here is read to the log end unless this group is the
        topic's send head (the open consume link): the chain rules drain a sealed head's
        whole log, its unacknowledged leftover included, and rule 3 compares the log end
        with the consumer groups' commits (docs/ordered.md, rules 3 and 4)."""
        if not self._ordered(topic):
            return False
        view = self._authority.cluster
        chains = None if view is None else view.chains.get(topic)
        return chains is None or chains.head != self._cfg.group

    def _check_send_head(self, topic: str) -> int:
        """An ordered topic takes writes only on its send head (docs/ordered.md), as this
        broker's watch of the chains says; returns the epoch at which it became head."""
        view = self._authority.cluster
        chains = None if view is None else view.chains.get(topic)
        head = chains.head if chains is not None else None
        if chains is None or head != self._cfg.group:
            raise RequestError(
                p.Status.NOT_SEND_HEAD,
                f"topic {topic!r} is ordered and its send head is "
                f"{head if head is not None else 'no group (sends wait for one)'}, "
                f"not {self._cfg.group!r}")
        if not self._authority.confirmed():
            # Woken from a pause, a master still holds WRITE until the new group state
            # reaches it, and its chains are as stale: measured, it took ordered writes for
            # 185 ms after the chains had moved on (bench/ordered.py).
            raise RequestError(
                p.Status.NOT_SEND_HEAD,
                f"topic {topic!r}: {self._cfg.name} cannot confirm that {self._cfg.group!r} "
                "is still its send head (its lease with ZooKeeper lapsed); re-route")
        return chains.head_epoch

    def _check_still_head(self, topic: str, head_epoch: int) -> None:
        """After an ordered write was stored and replicated: acknowledge it only if this
        broker still writes and its group is still the send head it was when the write was
        appended. A master frozen between the append and the acknowledgement (SIGSTOP, a
        long pause) wakes after the chains moved on; an acknowledgement now would come after
        writes the new head acknowledged. ``STALE_EPOCH``: stored here, not acknowledged;
        the producer sends the batch to the new head (this copy is read first)."""
        view = self._authority.cluster
        chains = None if view is None else view.chains.get(topic)
        writes = (bool(self._authority.effective() & Permission.WRITE)
                  and self._authority.confirmed())
        if not still_head(chains, self._cfg.group, head_epoch, writes):
            raise RequestError(
                p.Status.STALE_EPOCH,
                f"topic {topic!r}: stored on {self._cfg.group!r}, but it stopped being the "
                f"send head (head epoch {head_epoch}) or lost WRITE before the write could "
                "be acknowledged: not acknowledged; send it to the send head the route names")

    def _cluster(self) -> ClusterView:
        view = self._authority.cluster
        if view is None:
            raise RequestError(p.Status.UNSUPPORTED,
                               f"{self._cfg.name} runs without ZooKeeper: no cluster topics "
                               "or consumer groups (start brokers with --zk)")
        return view

    def _membership(self, producer: bool = False) -> Membership:
        m = self._authority.producers if producer else self._authority.membership
        if m is None:
            self._cluster()
            raise AssertionError("unreachable")  # pragma: no cover
        return m

    async def _check_producer_group(self, req: p.MemberHeartbeatRequest) -> None:
        """The producers of an ordered topic are a group named after the topic, and
        subscribed to it alone."""
        view = self._cluster()
        await view.has_topic(req.cgroup)
        doc = view.topics.get(req.cgroup)
        if doc is None or not doc.ordered:
            what = "an unknown topic" if doc is None else "not ordered"
            raise RequestError(p.Status.BAD_REQUEST if doc is not None else p.Status.UNKNOWN_TOPIC,
                               f"producer leadership is for ordered topics: {req.cgroup!r} is "
                               f"{what}")
        if list(req.topics) != [req.cgroup]:
            raise RequestError(p.Status.BAD_REQUEST,
                               f"a producer of ordered topic {req.cgroup!r} subscribes to it "
                               f"alone, not to {list(req.topics)}")

    async def _check_producer(self, topic: str, queue: int,
                              lease: p.ProduceLease | None) -> None:
        """A PRODUCE to an ordered topic comes from its active producer: the member that
        owns the topic's unit in ``/producers/<topic>`` at the generation it names
        (docs/ordered.md). A former leader woken from a pause is refused, as a member
        pulling a queue it lost is (invariant 6)."""
        if lease is None:
            raise RequestError(
                p.Status.NOT_OWNER,
                f"topic {topic!r} is ordered: it takes writes only from its active producer "
                "(the client joins the topic's producers; understudy_broker.client.Producer "
                "does)")
        member, generation = lease
        try:
            await self._membership(producer=True).check_owner(topic, member, topic, queue,
                                                              generation)
        except MembershipError as exc:
            raise RequestError(exc.status, exc.message) from None

    # ---- handlers -------------------------------------------------------------------

    async def _create_topic(self, frame: p.Frame, who: Session) -> bytes:
        self._require_write(frame)
        req = p.CreateTopicRequest.decode(frame.body)
        await self._may_change_topic(who, "create", req.topic)
        if req.topic.startswith(RESERVED_PREFIX):
            raise RequestError(p.Status.BAD_REQUEST,
                               f"topic names starting with {RESERVED_PREFIX!r} are reserved")
        topics = self._store.topics
        try:
            created = topics.create(req.topic, req.queues)
        except OSError as exc:
            raise storage_failed(exc, "recording the topic") from exc
        self._replica.metadata_changed()  # slaves learn the topic now
        return p.CreateTopicResponse(req.topic, topics.get(req.topic) or req.queues,
                                     created).encode()

    async def _produce(self, frame: p.Frame, who: Session) -> bytes:
        part = await self._checked_produce(frame, who)
        self._require_write(frame)  # still, after the checks' waits
        self._ready(part)
        start, end = self._append([part])
        (answer,) = await self._answers([part], start, end)
        if isinstance(answer, RequestError):
            raise answer
        return answer

    async def _checked_produce(self, frame: p.Frame, who: Session, *,
                               part_of_multi: bool = False) -> _Part:
        """A PRODUCE's checks that may wait (the ACL, an ordered topic's producer), and its
        messages; :meth:`_ready` then plans it and :meth:`_append` stores it, with no
        await between the two (batches of one connection keep their order, and the
        producer table cannot change between a plan and its append). WRITE is checked
        here and again right before the append (``part_of_multi``: only there, once for
        the whole request).

        A batch-form body (PRODUCE_BATCH, a PRODUCE_MULTI_BATCH part) is stored batch by
        batch as the producer packed it (docs/record-batch.md, step 2), unless it holds
        delayed messages or a message that might be too large to deliver: those are
        handled message by message, as the other form is."""
        started = time.perf_counter()
        if not part_of_multi:
            self._require_write(frame)
        limit = self._cfg.max_frame_bytes
        # Only a frame near the limit can hold such a message: no per-message cost else.
        large = p.pulled_frame_bytes(None, frame.body) > limit
        batches: list[tuple[int, int, bytes, int]] | None = None
        if frame.op in _BATCH_FORM:
            breq = p.decode_produce_batches(frame.body)
            req = p.ProduceBody(breq.topic, [], breq.lease, breq.deliver_at, breq.producer)
            if breq.deliver_at is not None or large:
                req = req._replace(messages=p.batch_messages(breq))
            else:
                batches = breq.batches
        else:
            req = p.decode_produce_full(frame.body)
        topic = req.topic
        await self._guard.require(who, Resource.TOPIC, topic, "produce")
        queues = self._queues(topic)
        if batches is None:
            raw = req.messages
            part = _Part(topic, [q for q, _k, _b in raw], started, raw)
        else:
            ids: list[int] = []
            for q, n, _section, _crc in batches:
                ids += [q] * n
            part = _Part(topic, ids, started)
        if not part.queues:
            return part
        now_ms = int(time.time() * 1000)
        sent_to = set(part.queues) if batches is None else {b[0] for b in batches}
        bad = sorted(q for q in sent_to if q >= queues)
        if bad:
            raise RequestError(
                p.Status.BAD_REQUEST,
                f"queue {bad[0]} does not exist: topic {topic!r} has {queues} queues",
            )
        self._check_placed(topic, sent_to)
        for i, (_q, k, b) in enumerate(part.raw if large and part.raw is not None else ()):
            if p.pulled_frame_bytes(k, b) > limit:
                # It fits the produce frame (a smaller header), but the PULL answer that
                # carries it would not: stored, it would stop every consumer at its offset.
                raise RequestError(
                    p.Status.TOO_LARGE,
                    f"message {i} of {len(b) + (len(k) if k else 0)} bytes (body and key) "
                    f"could never be delivered: the pull answer carrying it would be "
                    f"{p.pulled_frame_bytes(k, b)} bytes, over the {limit}-byte frame limit")
        part.ordered = self._ordered(topic)
        if part.raw is not None:
            part.scheduled = self._scheduled(topic, part.raw, req.deliver_at, now_ms,
                                             part.ordered)
        if part.ordered:
            self._check_send_head(topic)
            # Suspends only while our watch catches up with a producer generation newer
            # than ours (one batch of an ordered topic in flight per producer); the head
            # is checked again by _ready, with no suspension before the append.
            await self._check_producer(topic, part.queues[0], req.lease)
        if batches is not None:
            part.messages = [PackedBatch(topic, q, section, n, now_ms, crc)
                             for q, n, section, crc in batches]
            part.extra = part.count - len(batches)
        else:
            # Plain tuples, not Message objects: the log takes either, tuples are cheaper.
            raw = req.messages
            messages: list[RecordTuple | PackedBatch] = [(topic, q, k, b, now_ms)
                                                         for q, k, b in raw]
            if part.scheduled is not None:
                # Delayed messages are stored in the group's schedule (docs/delayed.md).
                for i, due in part.scheduled:
                    q, k, b = raw[i]
                    messages[i] = (sch.SCHEDULE_TOPIC, 0, k,
                                   sch.encode_entry(due_ms=due, topic=topic, queue=q,
                                                    payload=b),
                                   now_ms)
            part.messages = messages
        part.producer = req.producer
        part.now_ms = now_ms
        return part

    def _ready(self, part: _Part) -> None:
        """The last checks and the plan of a checked PRODUCE; call with no await between
        it and :meth:`_append`."""
        if part.ordered:
            part.head_epoch = self._check_send_head(part.topic)
        if part.producer is not None and part.count:
            # An idempotent producer: messages stored before are answered, not stored
            # again, and the new ones are remembered in the same append (invariant 8).
            repeats = self.producers.repeats(part.topic, part.producer, part.queues)
            if repeats:
                part.unpack()  # only some of a batch's messages are stored
            part.plan = self.producers.plan(
                part.topic, part.producer, part.queues, part.messages,
                repeats=repeats, delayed={i for i, _due in part.scheduled or ()})
            part.messages = part.plan.messages

    def _append(self, parts: Sequence[_Part]) -> tuple[int, int]:
        """Store the ready parts (distinct topics) with one append (one write per segment,
        one replication wake-up), their idempotent producers' runs in one record per
        producer after them; returns the log span it took. Each part gets its queue
        offsets."""
        lg = self._store.log
        messages = [m for part in parts for m in part.messages]
        if not messages:  # every message a repeat: its first copy is acknowledged as it would be
            return lg.max_phys, lg.max_phys
        plans = [part.plan for part in parts if part.plan is not None]
        if plans:
            messages += self.producers.records(plans, parts[0].now_ms)
        try:
            result = lg.append(messages)
        except (CommitLogError, ValueError) as exc:
            raise RequestError(p.Status.BAD_REQUEST, str(exc)) from exc
        except OSError as exc:
            raise storage_failed(exc, "appending") from exc
        at = 0
        for part in parts:
            n = len(part.messages) + part.extra
            part.stored = result.queue_offsets[at:at + n]
            at += n
            if part.plan is not None and part.messages:
                self.producers.stored(part.plan)
        self._readable.appended(result.end_phys, {(m[0], m[1]) for m in messages})
        self._replica.appended()
        return result.start_phys, result.end_phys

    async def _answers(self, parts: Sequence[_Part], start: int, end: int
                       ) -> list[bytes | RequestError]:
        """Each stored part's answer, once the span ``[start, end)`` is acknowledged
        (durable and replicated; then readable: read-your-writes, server/readable.py):
        one wait for every part (none when no part holds a message: an empty PRODUCE is
        answered at once; a batch of repeats waits as its first copy would)."""
        try:
            if any(part.count for part in parts):
                await self._readable.wait_acknowledged(end, start)
        except RequestError as exc:
            return [exc] * len(parts)
        out: list[bytes | RequestError] = []
        for part in parts:
            try:
                out.append(self._answer(part))
            except RequestError as exc:
                out.append(exc)
        return out

    def _answer(self, part: _Part) -> bytes:
        """A stored, acknowledged part's ProduceResponse."""
        if not part.count:
            return p.ProduceResponse([]).encode()
        if part.head_epoch is not None:
            self._check_still_head(part.topic, part.head_epoch)
        offsets = [(q, p.SCHEDULED_OFFSET if t == sch.SCHEDULE_TOPIC else o)
                   for t, q, o in part.stored]
        plan = part.plan
        if plan is not None:
            self._metrics.produce_repeats(len(plan.repeats))
            offsets = _merge_repeats(part.queues, plan, offsets)
        self._metrics.messages_in(len(part.messages) + part.extra)
        self._metrics.produce_latency(time.perf_counter() - part.started)
        if part.scheduled is not None:
            self._scheduler.wake()
            # A delayed message's answer names the queue it was sent to.
            offsets = [(part.queues[i], o) if o == p.SCHEDULED_OFFSET else (q, o)
                       for i, (q, o) in enumerate(offsets)]
        return p.ProduceResponse(offsets).encode()

    async def _produce_multi(self, frame: p.Frame, who: Session) -> bytes:
        """Each part checked and answered as a PRODUCE of its own: one part's refusal (an
        unknown topic, a denied ACL) leaves the others stored. The parts that pass are
        stored with one append, in order, and acknowledged together: one write, one
        group-commit fsync, one replication round. A topic seen twice in one request
        closes the append before it (its second part's plan must see the first stored);
        a storage refusal of the append is answered by every part in it."""
        self._require_write(frame)
        parts = p.MultiRequest.decode(frame.body).parts
        results: list[tuple[int, bytes] | None] = [None] * len(parts)
        checked: list[tuple[int, _Part]] = []
        for i, body in enumerate(parts):
            try:
                checked.append((i, await self._checked_produce(
                    dataclasses.replace(frame, op=_PART_OP[frame.op], body=body), who,
                    part_of_multi=True)))
            except RequestError as exc:
                results[i] = (exc.status, exc.message.encode())
            except p.FrameError as exc:
                results[i] = (exc.code, exc.message.encode())
        # From here to the last append, no await.
        if checked:
            self._require_write(frame)  # still, after the parts' checks' waits
        appends: list[tuple[list[tuple[int, _Part]], int, int]] = []

        def store(batch: list[tuple[int, _Part]]) -> None:
            try:
                start, end = self._append([part for _i, part in batch])
            except RequestError as exc:
                if exc.status == p.Status.BAD_REQUEST and len(batch) > 1:
                    for one in batch:  # the log refused one of them (nothing is written): which
                        store([one])
                    return
                for i, _part in batch:
                    results[i] = (exc.status, exc.message.encode())
            else:
                appends.append((batch, start, end))

        pending: list[tuple[int, _Part]] = []
        topics: set[str] = set()
        for i, part in checked:
            if part.topic in topics:
                store(pending)
                pending, topics = [], set()
            try:
                self._ready(part)
            except RequestError as exc:
                results[i] = (exc.status, exc.message.encode())
                continue
            pending.append((i, part))
            topics.add(part.topic)
        if pending:
            store(pending)
        for stored, start, end in appends:  # the later spans end later: one wait each
            answers = await self._answers([part for _i, part in stored], start, end)
            for (i, _part), answer in zip(stored, answers, strict=True):
                results[i] = ((answer.status, answer.message.encode())
                              if isinstance(answer, RequestError) else (p.Status.OK, answer))
        return p.ProduceMultiResponse([r for r in results if r is not None]).encode()

    def _scheduled(self, topic: str, raw: Sequence[tuple[int, bytes | None, bytes]],
                   deliver_at: Sequence[int] | None, now_ms: int, ordered: bool
                   ) -> list[tuple[int, int]] | None:
        """``(index, due ms)`` of the messages to schedule (None: none); a delivery time
        in the past is delivered now, any future one honoured; beyond the longest delay,
        or on an ordered topic, the batch is refused and nothing is stored."""
        if deliver_at is None:
            return None
        out: list[tuple[int, int]] = []
        for i, at in enumerate(deliver_at):
            try:
                due = sch.check_deliver_at(at, now_ms)
            except sch.ScheduleError as exc:
                raise RequestError(p.Status.BAD_REQUEST, f"message {i}: {exc}") from None
            if due:
                out.append((i, due))
        if out and ordered:
            raise RequestError(p.Status.BAD_REQUEST,
                               f"topic {topic!r} is ordered: delayed delivery is not supported "
                               "on ordered topics (it would reorder them)")
        return out or None

    async def _pull(self, frame: p.Frame, who: Session,
                    room: OutputRoom = always_room) -> bytes:
        self._require_read(frame)
        (answer,) = await self._long_poll(frame, who, room, [p.PullRequest.decode(frame.body)])
        if isinstance(answer, RequestError):
            raise answer
        return answer

    async def _pull_multi(self, frame: p.Frame, who: Session,
                          room: OutputRoom = always_room) -> bytes:
        """PULL_MULTI: each part checked and answered as a PULL of its own (a part's
        refusal leaves the others served); READ is the broker's, checked for the whole."""
        self._require_read(frame)
        parts: list[p.PullRequest | RequestError] = []
        for body in p.PullMultiRequest.decode(frame.body).parts:
            try:
                parts.append(p.PullRequest.decode(body))
            except p.FrameError as exc:
                parts.append(RequestError(exc.code, exc.message))
        answers = await self._long_poll(frame, who, room, parts)
        return p.PullMultiResponse([
            (a.status, a.message.encode()) if isinstance(a, RequestError) else (p.Status.OK, a)
            for a in answers]).encode()

    async def _long_poll(self, frame: p.Frame, who: Session, room: OutputRoom,
                         parts: Sequence[p.PullRequest | RequestError]
                         ) -> list[bytes | RequestError]:
        """The long poll of one or more queues (a PULL, a PULL_MULTI): answered when any
        part has records, when a part is refused (its ownership moved while waiting), or
        when the shortest of the parts' waits ends. READ (a whole-request error) and each
        member's ownership are checked again after every wait."""
        out: list[bytes | RequestError | None] = [None] * len(parts)
        live: dict[int, p.PullRequest] = {}
        for i, req in enumerate(parts):
            if isinstance(req, RequestError):
                out[i] = req
                continue
            try:
                await self._guard.require(who, Resource.TOPIC, req.topic, "consume")
                if req.member:
                    await self._guard.require(who, Resource.GROUP, req.cgroup, "join")
                self._check_queue(req.topic, req.queue)
                if req.member:
                    await self._check_owner(req.cgroup, req.member, req.generation, req.topic,
                                            req.queue)
                live[i] = req
            except RequestError as exc:
                out[i] = exc
        lg = self._store.log
        # Keep the response inside the frame limit the client most likely uses, and within
        # what one connection may have waiting to be read (docs/broker.md, "Limits"); the
        # parts of a PULL_MULTI share it, taking turns to read first.
        budget = min(self._cfg.max_frame_bytes // 2, self._cfg.limits.max_unsent_bytes)
        wait_ms = min((req.max_wait_ms for req in live.values()), default=0)
        deadline = time.monotonic() + min(wait_ms, 60_000) / 1000
        # PULL_BATCH: the stored items themselves, checked but not decoded (the client
        # decodes them); PULL: the messages, decoded here and encoded for the answer.
        raw = frame.op in _STORED_ANSWERS
        read: dict[int, tuple[int, int, int, list[Read]]] = {}
        while live:
            while await room():  # the connection can take the answer: nothing held here
                await self._recheck(frame, live, out)
            if not live:
                break
            left = budget
            read = {}
            # The parts share the budget; who reads first turns from poll to poll, so a
            # queue with a long backlog cannot keep the others' answers empty.
            order = list(live.items())
            self._rotation = turn = (self._rotation + 1) % len(order)
            # Only what may be acknowledged is read (server/readable.py); the answer's end
            # is the readable end, so a consumer's lag counts what it can read.
            readable_end = self._readable.phys
            for i, req in order[turn:] + order[:turn]:
                readable = (lg.max_phys if self._reads_to_log_end(req.topic)
                            else readable_end)
                start = lg.queue_start(req.topic, req.queue)
                end = lg.queue_end(req.topic, req.queue)
                offset = max(req.offset, start)
                limit = max(1, min(req.max_bytes, left))
                records: list[Read] = []
                try:
                    if left > 0 and raw:
                        records += lg.read_items(req.topic, req.queue, offset,
                                                 max_bytes=limit, max_records=PULL_MAX_RECORDS)
                    elif left > 0:
                        records += lg.read(req.topic, req.queue, offset, max_bytes=limit,
                                           max_records=PULL_MAX_RECORDS)
                except DamagedRecordError as exc:  # this part's; the others are served
                    out[i] = _damaged(exc)
                    del live[i]
                    continue
                if readable < lg.max_phys:  # the log has an unreadable tail
                    end = lg.queue_offset_at(req.topic, req.queue, readable)
                    # Whole items: an append's items all lie below the readable end or
                    # all above it.
                    if records and _first(records[-1]) >= end:
                        records = records[:bisect.bisect_left(records, end, key=_first)]
                left -= _answer_bytes(records)
                read[i] = (offset, start, end, records)
            remaining = deadline - time.monotonic()
            if (any(r[3] for r in read.values()) or any(o is not None for o in out)
                    or remaining <= 0 or self._stopping()):
                break  # records, or a refusal the client should hear of now, or time
            await self._signal.wait(remaining, [(req.topic, req.queue) for req in live.values()])
            await self._recheck(frame, live, out)  # permission and ownership may have moved
        for i, (offset, start, end, records) in read.items():
            if i not in live:
                continue
            if raw:
                items = cast(list[RawItem], records)
                next_offset = items[-1].end if items else offset
                self._metrics.messages_out(next_offset - max(offset, items[0].first)
                                           if items else 0)
                out[i] = p.encode_pull_batches(next_offset, start,
                                               end if not items else max(end, next_offset),
                                               offset, [item.data for item in items])
                continue
            msgs = cast(list[StoredRecord], records)
            next_offset = msgs[-1].queue_offset + 1 if msgs else offset
            self._metrics.messages_out(len(msgs))
            out[i] = p.PullResponse(
                next_offset,
                start,
                end if not msgs else max(end, next_offset),
                [p.PulledRecord(r.queue_offset, r.timestamp_ms, r.key, r.body) for r in msgs],
            ).encode()
        answers = [a for a in out if a is not None]
        assert len(answers) == len(out)  # every part was refused, or read while live
        return answers

    async def _recheck(self, frame: p.Frame, live: dict[int, p.PullRequest],
                       out: list[bytes | RequestError | None]) -> None:
        """After a wait: READ for the whole request (raises), ownership per member part (a
        part that lost its queue leaves the poll with NOT_OWNER)."""
        self._require_read(frame)
        for i, req in list(live.items()):
            if req.member:
                try:
                    await self._check_owner(req.cgroup, req.member, req.generation, req.topic,
                                            req.queue)
                except RequestError as exc:
                    out[i] = exc
                    del live[i]

    async def _commit_offset(self, frame: p.Frame, who: Session) -> bytes:
        self._require_read(frame)
        req = p.CommitOffsetRequest.decode(frame.body)
        await self._guard.require(who, Resource.TOPIC, req.topic, "consume")
        await self._guard.require(who, Resource.GROUP, req.group, "commit")
        queues = self._queues(req.topic)
        bad = [q for q in req.offsets if q >= queues]
        if bad:
            raise RequestError(p.Status.BAD_REQUEST, f"queue {bad[0]} does not exist")
        self._check_placed(req.topic, req.offsets)
        if req.member:
            for q in sorted(req.offsets):
                await self._check_owner(req.group, req.member, req.generation, req.topic, q)
        offsets = self._store.offsets
        stored: dict[int, int | None] = {}
        moved: dict[int, int] = {}
        for q, off in req.offsets.items():
            before = offsets.get(req.group, req.topic, q)
            stored[q] = kept = offsets.commit(req.group, req.topic, q, off)
            if kept != before:
                moved[q] = kept
        # The commit travels to slaves as a log record, so the sync acknowledgement (and
        # the in-sync set) covers it exactly as it covers a produce.
        body = encode_commit_record(req.group, req.topic, moved) if moved else None
        try:
            commits_end = self._replica.record_commits(body)
        except OSError as exc:
            raise storage_failed(exc, "recording the commit") from exc
        except (CommitLogError, ValueError) as exc:
            raise RequestError(p.Status.INTERNAL, f"recording the commit: {exc}") from exc
        waits = [self._offsets_durable()]
        if commits_end:
            waits.append(self._replica.replicated(commits_end))
        if self._authority.acting() == self._cfg.name:  # a slave acting for reads
            # Every value now stored for these queues, not only what moved: an earlier
            # commit that moved them may still be on its way to a slave.
            held = {q: o for q, o in stored.items() if o is not None}
            waits.append(self._mirror.mirror(self._authority.epoch(),
                                             {req.group: {req.topic: held}}))
        await acknowledged(waits)
        return p.OffsetsResponse(stored).encode()

    def _other_slaves(self) -> dict[str, str]:
        cfg = self._authority.group_config()
        if cfg is None:
            return {}
        return {b.name: b.address for b in cfg.slaves if b.name != self._cfg.name}

    async def _offsets_durable(self) -> None:
        """Acknowledge offsets only once they are on disk: a master killed right after
        acknowledging a commit restarts with it, and back-sync (maximum per key) can then
        only move offsets forward."""
        try:
            await self._store.offsets_durable()
        except OSError as exc:
            raise storage_failed(exc, "persisting consumer offsets") from exc

    async def _fetch_offset(self, frame: p.Frame, who: Session) -> bytes:
        self._require_read(frame)
        req = p.FetchOffsetRequest.decode(frame.body)
        await self._guard.require(who, Resource.TOPIC, req.topic, "consume")
        await self._guard.require(who, Resource.GROUP, req.group, "describe")
        self._queues(req.topic)
        self._check_placed(req.topic, req.queues)
        offsets = self._store.offsets
        return p.OffsetsResponse(
            {q: offsets.get(req.group, req.topic, q) for q in req.queues}
        ).encode()

    async def _get_route(self, frame: p.Frame, who: Session) -> bytes:
        req = p.GetRouteRequest.decode(frame.body)
        if req.topic is not None:
            await self._guard.require(who, Resource.TOPIC, req.topic, "describe")
        view = self._authority.cluster
        if view is not None and req.wait_ms:
            await view.wait_change(req.known_version, req.wait_ms / 1000)
        local = self._store.topics.snapshot()
        own = await self._authority.route()
        if view is None:
            topics = local if req.topic is None else (
                {req.topic: local[req.topic]} if req.topic in local else {})
            names = [g.group for g in own]
            return p.RouteResponse(own, topics, {t: names for t in topics}).encode()
        if req.topic is not None and req.topic not in local:
            await view.has_topic(req.topic)  # created through another broker a moment ago
        cluster = view.topics if req.topic is None else (
            {req.topic: view.topics[req.topic]} if req.topic in view.topics else {})
        counts: dict[str, int] = {}
        topic_groups: dict[str, list[str]] = {}
        placement: dict[str, list[str | None]] = {}
        for t, n in local.items():  # single-group topics (CREATE_TOPIC)
            if t not in view.topics and (req.topic is None or req.topic == t):
                counts[t], topic_groups[t] = n, [self._cfg.group]
        heads: dict[str, str | None] = {}
        reads: dict[str, str | None] = {}
        for t, doc in cluster.items():
            counts[t] = len(doc.queues)
            topic_groups[t] = list(doc.groups())
            placement[t] = list(doc.queues)
            if doc.ordered:
                chains = view.chains.get(t)
                heads[t] = chains.head if chains is not None else None
                reads[t] = chains.consume[0].group if chains is not None and chains.consume \
                    else None
        wanted = set(view.groups()) if req.topic is None else {
            g for gs in topic_groups.values() for g in gs}
        groups = [*own, *(view.group_route(g) for g in sorted(wanted) if g != self._cfg.group)]
        return p.RouteResponse(groups, counts, topic_groups, placement, view.version,
                               heads, reads).encode()

    # ---- cluster: topics and consumer groups ------------------------------------------

    async def _admin_topic(self, frame: p.Frame, who: Session) -> bytes:
        view = self._cluster()
        req = p.AdminTopicRequest.decode(frame.body)
        await self._may_change_topic(who, req.action, req.topic)
        try:
            doc = await self._topic_admin.apply(req, known_groups=view.groups())
        except TopicPlanError as exc:
            raise RequestError(p.Status.BAD_REQUEST, str(exc)) from None
        except TopicConflict as exc:
            raise RequestError(p.Status.CONFLICT, str(exc)) from None
        except LookupError as exc:
            raise RequestError(p.Status.UNKNOWN_TOPIC, str(exc)) from None
        if doc is None:
            return p.AdminTopicResponse(req.topic, [], False, True).encode()
        return p.AdminTopicResponse(doc.name, list(doc.queues), doc.ordered, True).encode()

    async def _queue_stats(self, frame: p.Frame, who: Session) -> bytes:
        req = p.QueueStatsRequest.decode(frame.body)
        await self._guard.require(who, Resource.TOPIC, req.topic, "describe")
        n = self._queues(req.topic)
        lg, offsets = self._store.log, self._store.offsets
        committed = offsets.snapshot()
        out: dict[int, p.QueueStats] = {}
        for q in req.queues:
            if q >= n:
                continue
            out[q] = p.QueueStats(
                lg.queue_start(req.topic, q), lg.queue_end(req.topic, q),
                {cg: ts[req.topic][q] for cg, ts in committed.items()
                 if q in ts.get(req.topic, {})})
        return p.QueueStatsResponse(self._cfg.name, self._cfg.group, out).encode()

    async def _member_heartbeat(self, frame: p.Frame, who: Session) -> bytes:
        req = p.MemberHeartbeatRequest.decode(frame.body)
        if req.producer:
            await self._guard.require(who, Resource.TOPIC, req.cgroup, "produce")
        else:
            await self._guard.require(who, Resource.GROUP, req.cgroup, "join")
            for t in req.topics:
                await self._guard.require(who, Resource.TOPIC, t, "consume")
        if req.producer:
            await self._check_producer_group(req)
        return await _answer(self._membership(req.producer).heartbeat(req))

    async def _leave_group(self, frame: p.Frame, who: Session) -> bytes:
        req = p.LeaveGroupRequest.decode(frame.body)
        await self._guard.require(who, *((Resource.TOPIC, req.cgroup, "produce") if req.producer
                                         else (Resource.GROUP, req.cgroup, "join")))
        return await _answer(self._membership(req.producer).leave(req))

    async def _describe_group(self, frame: p.Frame, who: Session) -> bytes:
        req = p.DescribeGroupRequest.decode(frame.body)
        await self._guard.require(who, Resource.TOPIC if req.producer else Resource.GROUP,
                                  req.cgroup, "describe")
        return await _answer(self._membership(req.producer).describe(req.cgroup))

    async def _list_groups(self, frame: p.Frame, who: Session) -> bytes:
        p.ListGroupsRequest.decode(frame.body)
        listed = await _answer(self._membership().list_groups())
        if not self._guard.enforcing:
            return listed
        groups = p.ListGroupsResponse.decode(listed).groups
        seen = [g for g in groups
                if await self._guard.allowed(who, Resource.GROUP, str(g["group"]), "describe")]
        return p.ListGroupsResponse(seen).encode()

    async def _check_owner(self, cgroup: str, member: str, generation: int, topic: str,
                           queue: int) -> None:
        """A member's pull or commit: NOT_OWNER unless it owns the queue (invariant 6)."""
        try:
            await self._membership().check_owner(cgroup, member, topic, queue, generation)
        except MembershipError as exc:
            raise RequestError(exc.status, exc.message) from None

    async def _backsync(self, frame: p.Frame, who: Session) -> bytes:
        """BACKSYNC_OFFSETS on the master: no READ needed (the master is NONE until this
        completes). Merge (maximum per key: nothing moves back), persist, then answer; a
        push tagged with an epoch older than the one applied is refused as stale."""
        req = p.BackSyncRequest.decode(frame.body)
        await self._guard.require(who, Resource.CLUSTER, "*", "broker")
        if self._authority.role is not Role.MASTER:
            return await self._mirrored(frame, req)
        if req.group != self._cfg.group:
            raise RequestError(p.Status.BAD_REQUEST,
                               f"back-sync for group {req.group!r} sent to group {self._cfg.group!r}")
        current = self._authority.epoch()
        if req.epoch < current or (frame.epoch and frame.epoch < current):
            raise RequestError(
                p.Status.STALE_EPOCH,
                f"back-sync tagged epoch {req.epoch} is older than this broker's epoch {current}",
            )
        offsets = self._store.offsets
        moved = offsets.merge(req.offsets, epoch=req.epoch)
        waits = [self._offsets_durable()]
        if req.escaped:
            # What the acting slave escaped leaves this master's schedule before it
            # delivers again; DONE records carry that to the other slaves.
            try:
                done = self._scheduler.absorb(req.escaped)
            except OSError as exc:
                raise storage_failed(exc, "recording escaped schedule entries") from exc
            except (CommitLogError, ValueError) as exc:
                raise RequestError(p.Status.INTERNAL,
                                   f"recording escaped schedule entries: {exc}") from exc
            if done is not None:
                waits.append(self._store.log_durable(done.end_phys))
        await acknowledged(waits)
        if moved:
            # The slaves that were not acting learn the back-synced offsets through the
            # log too (not waited for: the acting slave already holds them).
            self._replica.snapshot_offsets()
        log.info("back-sync from %s at epoch %d persisted (%d offsets moved up, %d escaped "
                 "schedule entries taken)", req.sender, req.epoch, moved, len(req.escaped))
        self._backsync_persisted(offsets.backsync_epoch)
        return p.BackSyncResponse(req.epoch, moved, offsets.backsync_epoch or req.epoch).encode()

    async def _mirrored(self, frame: p.Frame, req: p.BackSyncRequest) -> bytes:
        """BACKSYNC_OFFSETS on a slave: the acting slave's copy of a commit (server/mirror.py).
        Taken only from the slave this one's applied state names acting, at exactly that
        epoch; merged (maximum per key) and persisted before the answer."""
        epoch = self._authority.epoch()
        acting = self._authority.acting()
        if req.group != self._cfg.group:
            raise RequestError(p.Status.BAD_REQUEST,
                               f"offsets for group {req.group!r} sent to group {self._cfg.group!r}")
        if acting is None or acting != req.sender or acting == self._cfg.name:
            raise RequestError(p.Status.NOT_MASTER if acting is None else p.Status.STALE_EPOCH,
                               f"{self._cfg.name} is a slave and {req.sender} does not act for "
                               f"reads in the state it applied (epoch {epoch}): back-sync goes "
                               "to the master")
        if req.epoch != epoch or (frame.epoch and frame.epoch != epoch):
            raise RequestError(p.Status.STALE_EPOCH,
                               f"offsets tagged epoch {req.epoch}; this slave applied {epoch}")
        moved = self._store.offsets.merge(req.offsets)
        await acknowledged([self._offsets_durable()])
        return p.BackSyncResponse(req.epoch, moved, epoch).encode()

    async def _nack(self, frame: p.Frame, who: Session) -> bytes:
        """NACK on the broker serving the queue (it holds READ): the member must own the
        queue (invariant 6). The message goes, as an ordinary produce through the client
        library, to the consumer group's retry topic with a delay (stored in that group's
        schedule) or to its dead-letter topic; an acting slave sends it to another group
        (it never writes its own log). Answered once the copy is acknowledged."""
        self._require_read(frame)
        self._cluster()
        req = p.NackRequest.decode(frame.body)
        await self._guard.require(who, Resource.TOPIC, req.topic, "consume")
        await self._guard.require(who, Resource.GROUP, req.cgroup, "commit")
        self._check_queue(req.topic, req.queue)
        await self._check_owner(req.cgroup, req.member, req.generation, req.topic, req.queue)
        records = self._store.log.read(req.topic, req.queue, req.offset, max_bytes=1,
                                       max_records=1)
        if not records or records[0].queue_offset != req.offset:
            raise RequestError(p.Status.BAD_REQUEST,
                               f"no record at offset {req.offset} of {req.topic!r}/{req.queue}")
        rec = records[0]
        try:
            target, retry = sch.handed_back(topic=req.topic, queue=req.queue, offset=req.offset,
                                            body=rec.body, cgroup=req.cgroup,
                                            max_reconsume=req.max_reconsume)
        except (sch.ScheduleError, ValueError) as exc:
            raise RequestError(p.Status.BAD_REQUEST, f"cannot hand back: {exc}") from None
        dead = target.startswith(sch.DLQ_PREFIX)
        now_ms = int(time.time() * 1000)
        due = 0 if dead or req.delay_ms <= 0 else now_ms + min(req.delay_ms, sch.MAX_DELAY_MS)
        await self._ensure_topic(target)
        avoid = self._cfg.group if self._authority.role is Role.SLAVE else None
        try:
            await self._escaper.put(target, rec.key, sch.encode_retry(retry),
                                    deliver_at_ms=due, avoid_group=avoid)
        except NoWritableQueue as exc:
            raise RequestError(p.Status.NOT_ENOUGH_REPLICAS,
                               f"cannot hand the message back now: {exc}") from None
        except BrokerError as exc:  # the receiving group's answer, passed on
            try:
                status = p.Status(exc.status)
            except ValueError:
                status = p.Status.INTERNAL
            raise RequestError(status, f"handing back: {exc.message}") from None
        except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
            raise RequestError(p.Status.TIMEOUT, f"handing back: {exc}") from None
        self._metrics.nacked("dlq" if dead else "retry")
        return p.NackResponse(target, retry.reconsume, due or now_ms).encode()

    async def _ensure_topic(self, topic: str) -> None:
        """A consumer group's retry or dead-letter topic, created on first use with one
        queue on every group of the cluster."""
        view = self._cluster()
        if topic in view.topics:
            return
        req = p.AdminTopicRequest("create", topic, groups=sorted(view.groups()),
                                  queues_per_group=1)
        try:
            await self._topic_admin.apply(req, known_groups=view.groups())
        except TopicConflict:
            pass  # another broker created it first
        except TopicPlanError as exc:
            raise RequestError(p.Status.INTERNAL, f"creating {topic!r}: {exc}") from None

    async def _may_change_topic(self, who: Session, action: str, topic: str) -> None:
        """Creating, altering or deleting a topic: the cluster operation, or ``admin`` on
        the topic itself."""
        if await self._guard.allowed(who, Resource.CLUSTER, "*", action):
            return
        await self._guard.require(who, Resource.TOPIC, topic, "admin")

    # ---- security ---------------------------------------------------------------------

    async def _authenticate(self, frame: p.Frame, who: Session) -> bytes:
        if self._authority.acls is None:
            raise RequestError(p.Status.UNSUPPORTED,
                               f"{self._cfg.name} runs without ZooKeeper: it has no users "
                               "(start brokers with --zk)")
        return await self._guard.authenticate(who, p.AuthenticateRequest.decode(frame.body))

    async def _security_admin(self, frame: p.Frame, who: Session) -> bytes:
        req = p.SecurityAdminRequest.decode(frame.body)
        if req.action == "whoami":
            return p.SecurityAdminResponse([{
                "user": who.user, "via": who.via,
                "super_user": self._guard.is_super(who),
                "rules": [] if who.user is None or self._authority.acls is None else
                [r.to_dict() for r in await self._authority.acls.fresh_rules(who.user)]}]
            ).encode()
        acls = self._authority.acls
        if acls is None:
            self._cluster()
            raise AssertionError("unreachable")  # pragma: no cover
        listing = req.action in ("user-list", "acl-list")
        await self._guard.require(who, Resource.CLUSTER, "*",
                                  "describe" if listing else "security")
        try:
            return await admin_security(acls, req)
        except AclError as exc:
            raise RequestError(p.Status.BAD_REQUEST, str(exc)) from None

    async def _heartbeat(self, frame: p.Frame, who: Session) -> bytes:
        p.HeartbeatRequest.decode(frame.body)
        return p.HeartbeatResponse(
            self._cfg.name,
            self._cfg.group,
            self._authority.role.value,
            int(self._authority.effective()),
            self._authority.epoch(),
            self._store.log.max_phys,
        ).encode()


class _Encodable(Protocol):
    def encode(self) -> bytes: ...


async def _answer(call: Awaitable[_Encodable]) -> bytes:
    """A consumer-group answer, or the status its refusal carries."""
    try:
        return (await call).encode()
    except MembershipError as exc:
        raise RequestError(exc.status, exc.message) from None
