"""Recorded traffic: producers and consumer groups whose every acknowledgement, delivery
and commit goes into a history that the shared checker judges.

Why this module exists: the drill (local processes) and the kind chaos suite (a Job in a
cluster) must judge lost, duplicate and rewound messages the same way, so they must
record traffic the same way. :class:`Traffic` is that one implementation: the drill drives
it between its fault cycles, and ``understudy workload`` (:func:`run_workload`) drives it for
a fixed duration against any bootstrap list and writes the history to a file. Message ids
are ``<label>-<sequence>``, unique within a run; the body of each message is its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from understudy_harness.history import HistoryWriter

if TYPE_CHECKING:
    from understudy_broker.security import ClientSecurity

log = logging.getLogger(__name__)

#: Client request timeout: long enough for a failover, short enough that the run moves on.
REQUEST_TIMEOUT_S = 5.0
CONSUMER_GROUPS = ("cg1", "cg2")
#: Sends not yet acknowledged above which a producer pauses (the group takes no writes now).
MAX_OUTSTANDING = 2000
#: How long a handed-back message waits before it comes again.
NACK_DELAY_MS = 1000


class WorkloadError(RuntimeError):
    """The workload could not run (no broker answered, bad options)."""


class TrafficCounts:
    """Live counters a status line reads while traffic runs."""

    def __init__(self) -> None:
        self.acked = 0
        self.delivered = 0
        self.failed_sends = 0


@dataclass(frozen=True, slots=True)
class Target:
    """One stream of traffic: a topic on one broker group, or over ``groups``.

    ``label`` prefixes the message ids and keys the drain bookkeeping (the drill uses the
    broker group's name). ``groups``: a cluster topic, created over these groups with
    ``queues`` per group. ``keyed``: each message is sent with its id as key (pinned to
    one queue); unkeyed sends are spread and move away from a group with no writer."""

    label: str
    topic: str
    bootstrap: tuple[str, ...]
    groups: tuple[str, ...] = ()
    keyed: bool = True
    #: An ordered topic (one queue per group, docs/ordered.md), with ``producers``
    #: producer instances of which the brokers let one send at a time.
    ordered: bool = False
    producers: int = 1
    #: Delayed messages (docs/delayed.md): each is sent for delivery this many ms later,
    #: spread over the range; None: at once.
    delay_ms: tuple[int, int] | None = None
    #: Members hand back (nack) the first delivery of about one message in this many,
    #: for redelivery a second later; 0: never.
    nack_every: int = 0
    #: ``False``: a failed or slow send is never sent again (no retry, no hedge), so every
    #: extra copy the consumers see was written by the brokers (the delayed scenario's
    #: escape duplicates), not by the producer's at-least-once window.
    resend: bool = True
    #: TLS and credentials of a secure cluster (``local up --secure``); None: plain.
    security: ClientSecurity | None = None


@dataclass(slots=True)
class Member:
    """A consumer-group member run by :class:`Traffic` (``members`` > 0)."""

    member_id: str
    cgroup: str
    target: Target
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    crash: bool = False
    consumer: Any = None  # the running Consumer, while there is one


@dataclass(slots=True)
class ProducerRun:
    """A producer instance run by :class:`Traffic`; ids are ``<label>-<seq>`` for the
    first instance of a target, ``<label>.p<n>-<seq>`` for the others."""

    name: str
    target: Target
    producer: Any = None  # the running Producer
    task: asyncio.Task[None] | None = None
    crash: bool = False


class Traffic:
    """A producer and ``consumer_groups`` consumer groups per target, recording into a history.

    ``members`` = 0: one static consumer per consumer group, restarted from the committed
    offsets whenever :attr:`generation` changes. ``members`` > 0: that many consumer-group
    members per consumer group (broker-held membership, cluster topics only), each
    recording its deliveries and its queue ownership (``own`` events); members join,
    leave cleanly (commit, then release) or crash (no commit, no leave) through
    :meth:`add_member` and :meth:`remove_member`."""

    def __init__(
        self,
        targets: Sequence[Target],
        writer: HistoryWriter,
        counts: TrafficCounts,
        *,
        rate: float,
        queues: int,
        consumer_groups: Sequence[str] = CONSUMER_GROUPS,
        members: int = 0,
        session_timeout_ms: int = 2000,
    ) -> None:
        self.targets = tuple(targets)
        self.members = members
        self.session_timeout_ms = session_timeout_ms
        self.member_runs: dict[str, Member] = {}
        self._member_seq = 0
        self._recorded: dict[str, dict[int, int]] = defaultdict(dict)  # per cgroup
        self.writer = writer
        self.status = counts
        self.rate = rate
        self.queues = queues
        self.consumer_groups = tuple(consumer_groups)
        self.producing = asyncio.Event()
        self.producing.set()
        self.stop = asyncio.Event()
        self.generation = 0  # bumped to make consumers restart from the committed offsets
        self.acked: dict[str, set[str]] = defaultdict(set)
        self.received: dict[tuple[str, str], set[str]] = defaultdict(set)
        # Handed back (nacked) ids, and those that came again: the drain waits for both.
        self.nacked: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.redelivered: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.producers: list[asyncio.Task[None]] = []
        self.producer_runs: dict[str, ProducerRun] = {}
        self._producer_seq = 0
        self.consumers: list[asyncio.Task[None]] = []
        self.delivered = asyncio.Event()  # set on every delivery: wakes the drain

    async def start(self) -> None:
        from understudy_broker.client import create_topic

        for t in self.targets:
            if t.groups:
                await create_cluster_topic(t, 1 if t.ordered else self.queues)
            else:
                await create_topic(list(t.bootstrap), topic=t.topic, queues=self.queues,
                                   security=t.security)
            self.writer.topic(topic=t.topic, ordered=t.ordered)
            for _ in range(t.producers):
                self.add_producer(t)
            for cg in self.consumer_groups:
                if self.members:
                    for _ in range(self.members):
                        self.add_member(t, cg)
                else:
                    self.consumers.append(asyncio.create_task(self._consume(t, cg)))

    # ---- producers ----------------------------------------------------------------------

    def add_producer(self, target: Target) -> str:
        """Start a producer instance for ``target`` (of an ordered topic: it stands by
        until the brokers make it the active one)."""
        n = self._producer_seq = self._producer_seq + 1
        first = not any(r.target == target for r in self.producer_runs.values())
        name = target.label if first else f"{target.label}.p{n}"
        run = ProducerRun(name, target)
        run.task = asyncio.create_task(self._produce(run), name=f"producer-{name}")
        self.producer_runs[name] = run
        self.producers.append(run.task)
        return name

    def active_producer(self, target: Target) -> str | None:
        """The producer instance of an ordered ``target`` that the brokers let send now."""
        for name, run in self.producer_runs.items():
            if (run.target == target and run.producer is not None
                    and run.producer.leadership(target.topic).active):
                return name
        return None

    async def crash_producer(self, name: str) -> None:
        """Stop a producer instance as a crash would: nothing more sent, no hand-over (the
        brokers end its leadership after its session). Its unacknowledged sends stay so."""
        run = self.producer_runs.pop(name)
        run.crash = True
        if run.task is not None:
            run.task.cancel()
            await settle([run.task], within_s=10)

    # ---- consumer-group members -------------------------------------------------------

    def add_member(self, target: Target, cgroup: str) -> str:
        """Start a new member of ``cgroup`` (it joins; the brokers rebalance)."""
        self._member_seq += 1
        member = Member(f"{cgroup}-m{self._member_seq}", cgroup, target, asyncio.Event())
        member.task = asyncio.create_task(self._member(member), name=member.member_id)
        self.member_runs[member.member_id] = member
        self.consumers.append(member.task)
        return member.member_id

    async def remove_member(self, member_id: str, *, crash: bool) -> None:
        """Stop a member: cleanly (commit, leave: its queues move at once) or as a crash
        (no commit, no leave: they move after its session timeout)."""
        member = self.member_runs.pop(member_id)
        member.crash = crash
        member.stop.set()
        if member.task is not None:
            await settle([member.task], within_s=15)

    def members_of(self, cgroup: str) -> list[str]:
        return [m for m, run in self.member_runs.items() if run.cgroup == cgroup]

    def reading_members(self, cgroup: str) -> list[str]:
        """Members of ``cgroup`` pulling some queue now (of an ordered topic: the one)."""
        return [m for m, run in self.member_runs.items()
                if run.cgroup == cgroup and run.consumer is not None and run.consumer.assigned]

    async def _member(self, member: Member) -> None:
        from understudy_broker.client import Consumer

        topic, cgroup, mid = member.target.topic, member.cgroup, member.member_id
        recorded = self._recorded[cgroup]
        while not member.stop.is_set() and not self.stop.is_set():
            consumer = Consumer(
                list(member.target.bootstrap), group=cgroup, topic=topic, max_wait_ms=200,
                request_timeout_s=REQUEST_TIMEOUT_S, membership=True, member_id=mid,
                session_timeout_ms=self.session_timeout_ms, security=member.target.security,
            )  # fmt: skip
            member.consumer = consumer
            self._watch_reads(consumer, cgroup)
            seen = 0
            try:
                async with asyncio.timeout(3 * REQUEST_TIMEOUT_S):
                    await consumer.start()
                last_commit = time.monotonic()
                while not member.stop.is_set() and not self.stop.is_set():
                    batch = await consumer.getmany(timeout_s=0.2)
                    handed = self.writer.now()  # see _delivered
                    seen = self._record_ownership(consumer, member, seen, recorded)
                    for r in batch:
                        self._delivered(member.target, cgroup, r, member=mid, t=handed)
                        if self._nack_this(member.target, r):
                            await self._nack(consumer, member.target, cgroup, r)
                    if time.monotonic() - last_commit > 0.1:
                        await self._commit(consumer, cgroup, topic, recorded)
                        last_commit = time.monotonic()
            except Exception as exc:
                log.info("member %s of %s: %s; starting again", mid, cgroup, exc)
                await asyncio.sleep(0.1)
            finally:
                try:
                    with contextlib.suppress(Exception):
                        if not member.crash:  # close() commits too, but says nothing of it:
                            # recorded here, a final commit the brokers then lose is a rewind
                            await self._commit(consumer, cgroup, topic, recorded)
                        stopping = consumer.abort() if member.crash else consumer.close()
                        async with asyncio.timeout(5):
                            await stopping
                finally:  # even when cancelled: an unrecorded release reads as ownership
                    self._record_ownership(consumer, member, seen, recorded)

    def _record_ownership(self, consumer: Any, member: Member, seen: int,
                          recorded: dict[int, int]) -> int:
        """Write the member's new ownership-log entries as ``own`` events; where it began
        a queue is the broker's committed offset then (recorded like a commit, so a lost
        commit shows as a rewind). Returns how many entries are written."""
        log_ = consumer.ownership_log
        for wall, what, queue in log_[seen:]:
            held = what == "acquire"
            self.writer.own(cgroup=member.cgroup, topic=member.target.topic, queue=queue,
                            member=member.member_id, held=held, t=int(wall * 1e9))
            if held and queue in consumer.started_at:  # began from the committed offset
                # dated when it began, not when this runs: written late (after a batch, or
                # at close), it read as a commit after the new owner's own commits, and
                # the checker saw a rewind that never happened (the chaos soak did).
                self._observe_offsets(member.cgroup, member.target.topic,
                                      {queue: consumer.started_at[queue]}, recorded,
                                      t=int(wall * 1e9))
        return len(log_)

    @staticmethod
    def _nack_this(target: Target, r: Any) -> bool:
        """Hand back the first delivery of every ``nack_every``-th id (by its sequence)."""
        if not target.nack_every or r.reconsume_times:
            return False
        seq = r.body.rsplit(b"-", 1)[-1]
        return seq.isdigit() and int(seq) % target.nack_every == 0

    async def _nack(self, consumer: Any, target: Target, cgroup: str, r: Any) -> None:
        mid = r.body.decode("utf-8", "replace")
        try:
            await consumer.nack(r, delay_ms=NACK_DELAY_MS)
        except Exception as exc:  # processed as delivered: it is not expected again
            log.info("nack %s by %s: %s", mid, cgroup, exc)
            return
        self.writer.nack(cgroup=cgroup, id=mid)
        self.nacked[(target.label, cgroup)].add(mid)

    def _delivered(self, target: Target, cgroup: str, r: Any, *, t: int,
                   member: str | None = None) -> None:
        """Record one delivery, dated ``t``: when ``getmany`` handed its batch out (read
        right after it returned), not when this line is written. A member hands a batch
        out only inside its lease (docs/cluster.md); writing a big batch (thousands of
        records, after a backlog) takes the event loop tens of milliseconds, and nacks in
        the loop await. A lease that ended meanwhile dates the member's release at its
        end (``ownership_log``), so deliveries dated as written read as pulls of a queue
        the member no longer owned: the checker counted thousands of two-member
        violations that no member ever made. The CLI's ``consume --record`` dates its
        batches the same way."""
        mid = r.body.decode("utf-8", "replace")
        # r.topic: a redelivered (nacked) message comes from the group's retry topic.
        self.writer.deliver(cgroup=cgroup, topic=r.topic, queue=r.queue, offset=r.offset,
                            id=mid, member=member, t=t)
        self.received[(target.label, cgroup)].add(mid)
        if r.reconsume_times:
            self.redelivered[(target.label, cgroup)].add(mid)
        self.status.delivered += 1
        self.delivered.set()

    async def _produce(self, run: ProducerRun) -> None:
        from understudy_broker.client import Producer

        target = run.target
        topic = target.topic
        producer = run.producer = Producer(
            list(target.bootstrap), batch_size=16, linger_ms=2,
            retries=3 if target.resend else 0,
            hedge_after_ms=500.0 if target.resend else None,
            request_timeout_s=REQUEST_TIMEOUT_S,
            leader_session_timeout_ms=self.session_timeout_ms,
            security=target.security,
        )  # fmt: skip
        # An ordered topic's standby sends nothing until the brokers make it the active
        # producer (its sends would wait there anyway, and time out).
        lead = producer.leadership(topic) if target.ordered else None
        outstanding: set[asyncio.Future[tuple[int, int]]] = set()
        period = 1 / self.rate
        seq = 0
        try:
            while self.producing.is_set():
                if len(outstanding) > MAX_OUTSTANDING or (lead is not None and not lead.active):
                    await asyncio.sleep(0.01)
                    continue
                mid = f"{run.name}-{seq}"
                due: int | None = None
                if target.delay_ms is not None:
                    lo, hi = target.delay_ms
                    due = int(time.time() * 1000) + lo + (seq * 7919) % max(1, hi - lo + 1)
                seq += 1
                try:
                    key = mid.encode() if target.keyed else None
                    fut = await producer.send(topic, mid.encode(), key=key,
                                              deliver_at_ms=due or 0)
                except Exception as exc:
                    log.debug("send %s: %s", mid, exc)
                    self.status.failed_sends += 1
                    await asyncio.sleep(0.05)
                    continue
                outstanding.add(fut)
                fut.add_done_callback(self._on_ack(target.label, topic, mid, outstanding, due))
                await asyncio.sleep(period)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await producer.flush()
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await (producer.abort() if run.crash else producer.close())

    def _on_ack(
        self, label: str, topic: str, mid: str, outstanding: set[asyncio.Future[tuple[int, int]]],
        due: int | None = None,
    ) -> Callable[[asyncio.Future[tuple[int, int]]], None]:
        def done(fut: asyncio.Future[tuple[int, int]]) -> None:
            outstanding.discard(fut)
            if fut.cancelled() or fut.exception() is not None:
                self.status.failed_sends += 1
                return
            queue, offset = fut.result()
            self.writer.produce_ack(id=mid, topic=topic, queue=queue, offset=offset,
                                    deliver_at_ms=due)
            self.acked[label].add(mid)
            self.status.acked += 1

        return done

    def _watch_reads(self, consumer: Any, cgroup: str) -> None:
        """Record each pull that answered after failed ones (``read_restored``), dated
        when it was sent and on the history's clock, naming the broker that answered."""
        writer = self.writer

        def restored(queue: int, address: str, sent_ns: int) -> None:
            route = consumer.router.route
            name = next((b.name for g in (route.groups if route else []) for b in g.brokers
                         if b.address == address), address)
            writer.read_restored(cgroup=cgroup, topic=consumer.topic, queue=queue,
                                 broker=name, t=writer.now() - (time.time_ns() - sent_ns))

        consumer.on_read_restored = restored

    async def _consume(self, target: Target, cgroup: str) -> None:
        from understudy_broker.client import Consumer

        topic = target.topic
        recorded: dict[int, int] = {}  # the committed offset last recorded, per queue
        while not self.stop.is_set():
            generation = self.generation
            consumer = Consumer(
                list(target.bootstrap), group=cgroup, topic=topic, max_wait_ms=200,
                request_timeout_s=REQUEST_TIMEOUT_S, security=target.security,
            )  # fmt: skip
            self._watch_reads(consumer, cgroup)
            try:
                async with asyncio.timeout(3 * REQUEST_TIMEOUT_S):
                    await consumer.start()
                # Where a (re)started consumer begins is the broker's committed offset:
                # recording it is what exposes a commit the brokers lost (a rewind).
                self._observe_offsets(cgroup, topic, consumer.positions, recorded)
                last_commit = time.monotonic()
                while not self.stop.is_set() and generation == self.generation:
                    batch = await consumer.getmany(timeout_s=0.2)
                    handed = self.writer.now()  # see _delivered
                    for r in batch:
                        self._delivered(target, cgroup, r, t=handed)
                    if time.monotonic() - last_commit > 0.1:
                        await self._commit(consumer, cgroup, topic, recorded)
                        last_commit = time.monotonic()
                await self._commit(consumer, cgroup, topic, recorded)
            except Exception as exc:
                log.info("consumer %s/%s: %s; starting a new one", topic, cgroup, exc)
                await asyncio.sleep(0.1)
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await consumer.close()

    def _observe_offsets(
        self, cgroup: str, topic: str, offsets: Mapping[int, int | None], recorded: dict[int, int],
        *, t: int | None = None,
    ) -> None:
        for q, off in sorted(offsets.items()):
            if off is not None and recorded.get(q) != off:
                recorded[q] = off
                self.writer.commit(cgroup=cgroup, topic=topic, queue=q, offset=off, t=t)

    async def _commit(self, consumer: Any, cgroup: str, topic: str, recorded: dict[int, int]) -> None:
        try:
            # A hung group's commit goes on in the background: the other groups' queues
            # keep being consumed meanwhile (what it had not committed may come again).
            stored = await consumer.commit(timeout_s=0.5)
        except Exception as exc:
            log.info("commit %s/%s: %s", topic, cgroup, exc)
            return
        self._observe_offsets(cgroup, topic, stored, recorded)

    def drained(self) -> bool:
        return all(
            self.acked[t.label] <= self.received[(t.label, cg)]
            and self.nacked[(t.label, cg)] <= self.redelivered[(t.label, cg)]
            for t in self.targets
            for cg in self.consumer_groups
        )

    async def finish(self, *, drain_timeout: float) -> bool:
        """Stop producing and wait for the last acknowledgements, then wait until every
        consumer group has every acked message (or the timeout), then stop consuming.
        Returns whether the drain completed."""
        self.producing.clear()
        await settle(self.producers, within_s=20)  # flush (<= 10 s) and close (<= 5 s)
        deadline = time.monotonic() + drain_timeout
        while not self.drained():
            self.delivered.clear()
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    await self.delivered.wait()
            except TimeoutError:
                break
        complete = self.drained()
        await self.shutdown()
        return complete

    async def shutdown(self) -> None:
        """Stop every task; bounded, whatever state the clients are in."""
        self.producing.clear()
        self.stop.set()
        await settle([*self.producers, *self.consumers], within_s=15)


async def create_cluster_topic(target: Target, per_group: int) -> None:
    """``topic create --groups`` for a cluster target; a topic left by an earlier run with
    the same placement is used as it is."""
    from understudy_broker import protocol as p
    from understudy_broker.admin import admin_topic
    from understudy_broker.client import BrokerError

    req = p.AdminTopicRequest("create", target.topic, list(target.groups), per_group,
                              ordered=target.ordered)
    try:
        await admin_topic(list(target.bootstrap), req, target.security)
    except BrokerError as exc:
        if exc.status != p.Status.CONFLICT:
            raise


async def settle(tasks: list[asyncio.Task[None]], *, within_s: float) -> None:
    """Wait for ``tasks`` to end; cancel whatever is still running after ``within_s``."""
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=within_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ------------------------------------------------------------------- understudy workload


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    bootstrap: tuple[str, ...]
    topic: str
    history: Path
    groups: int = 2  # consumer groups
    rate: float = 200.0  # messages per second
    duration_s: float = 60.0
    drain_timeout_s: float = 60.0
    queues: int = 4
    security: ClientSecurity | None = None  # TLS and credentials (the client flags)


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    acked: int
    delivered: int
    failed_sends: int
    drained: bool
    events: int
    history: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "acked": self.acked,
            "delivered": self.delivered,
            "failed_sends": self.failed_sends,
            "drained": self.drained,
            "events": self.events,
            "history": str(self.history),
        }


def consumer_group_names(n: int) -> tuple[str, ...]:
    """``cg1`` … ``cgN``, the names the drill uses too."""
    return tuple(f"cg{i}" for i in range(1, n + 1))


async def run_workload(opts: WorkloadOptions, *, counts: TrafficCounts | None = None) -> WorkloadResult:
    """Produce at ``rate`` for ``duration_s`` while ``groups`` consumer groups read, then
    drain and write every event to ``opts.history`` (``time.time_ns``: the clock the
    brokers' permission-change logs use, so the two merge into one history)."""
    counts = counts or TrafficCounts()
    target = Target(label=opts.topic, topic=opts.topic, bootstrap=opts.bootstrap,
                    security=opts.security)
    with HistoryWriter(opts.history, clock=time.time_ns, clock_name="time_ns") as writer:
        traffic = Traffic(
            [target], writer, counts, rate=opts.rate, queues=opts.queues,
            consumer_groups=consumer_group_names(opts.groups),
        )  # fmt: skip
        try:
            try:
                await traffic.start()
            except Exception as exc:
                raise WorkloadError(f"cannot create topic {opts.topic!r} via {','.join(opts.bootstrap)}: {exc}") from exc
            await asyncio.sleep(opts.duration_s)
            drained = await traffic.finish(drain_timeout=opts.drain_timeout_s)
        finally:
            await traffic.shutdown()
        events = writer.count
    return WorkloadResult(
        acked=counts.acked,
        delivered=counts.delivered,
        failed_sends=counts.failed_sends,
        drained=drained,
        events=events,
        history=opts.history,
    )
