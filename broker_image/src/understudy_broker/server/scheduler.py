"""The scheduler: delivers due scheduled messages, or escapes them while a slave acts.

Why this module exists: delayed messages and retries are stored once in the group's log
(:mod:`understudy_broker.scheduling`) and must be written a second time when due (seed
001 §6). Every broker of a group runs a :class:`Scheduler`; what it does depends on what
the broker holds (docs/delayed.md):

- always: it applies the schedule queue of its own log to its
  :class:`~understudy_broker.storage.schedule.ScheduleIndex` (entries in, DONE out);
- a master holding WRITE with a confirmed view *delivers*: it appends each due message
  to its target queue and, in the same append, a DONE record naming the entries — so
  delivery and progress are one write, and slaves learn the progress by replication;
- the acting slave *escapes*: it never writes its own log, so it sends each due message to
  a writable queue of the same topic on another group (an ordinary produce through the
  client, :class:`Escaper`), then records the entry as escaped in its index; back-sync
  hands the escaped entries to the master, which removes them and writes DONE for them
  before it takes reads and writes back. A topic with no queue on another writable group
  is held: its due entries wait, counted as overdue, until the master is back.

A due entry whose target queue lives on another group (the topic was altered) is sent
there the same way, by a master too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Literal

from understudy_broker import protocol as p
from understudy_broker import scheduling as sch
from understudy_broker.client import BrokerError, Producer
from understudy_broker.model import Permission
from understudy_broker.security import ClientSecurity
from understudy_broker.storage.commitlog import AppendResult, CommitLog, DamagedRecordError
from understudy_broker.storage.records import RecordTuple
from understudy_broker.storage.schedule import ScheduleIndex

log = logging.getLogger(__name__)

Mode = Literal["deliver", "escape"]
#: Due entries taken per pass.
BATCH = 512
#: Schedule records applied to the index per read.
CATCH_UP_RECORDS = 4096
#: Longest sleep between passes when nothing is due. The broker wakes the scheduler on
#: every append (a produce, bytes replicated to a slave) and every permission change, and
#: a pass sleeps exactly until the next due entry, so this is a safety net, not a
#: latency: at 0.1 s it was ten wake-ups a second on every idle broker.
IDLE_POLL_S = 1.0
#: Release the schedule queue's in-memory index entries in steps of this many.
RELEASE_EVERY = 16_384
#: A topic that could not be escaped (no writable queue elsewhere) is not tried again
#: for this long.
HOLD_S = 1.0


class NoWritableQueue(Exception):
    """No queue of the topic is on a group with a writer (other than the one avoided)."""


class Escaper:
    """Sends secondary messages as ordinary produces through the client library: due
    entries a slave escapes, due entries whose queue moved, and handed-back messages
    (nacks). ``bootstrap`` gives broker addresses (this broker's own client port first:
    any broker answers a route)."""

    def __init__(self, *, bootstrap: Callable[[], list[str]],
                 writable: Callable[[str], bool], send_timeout_s: float = 5.0,
                 security: ClientSecurity | None = None) -> None:
        self._bootstrap = bootstrap
        self._security = security
        # Whether a group has a writer now, from the broker's own ZooKeeper view, not the
        # client's route (a drill found a nack's copy sent to a group 4 s after its hung
        # master had been fenced: the route's watch was parked on the hung broker).
        self._writable = writable
        self._send_timeout_s = send_timeout_s
        self._producer: Producer | None = None
        self._rr = itertools.count()
        self._watching = False

    def _get(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self._bootstrap(), linger_ms=1.0, hedge_after_ms=None,
                                      send_timeout_s=self._send_timeout_s,
                                      request_timeout_s=self._send_timeout_s,
                                      security=self._security)
        return self._producer

    async def put(self, topic: str, key: bytes | None, payload: bytes, *,
                  deliver_at_ms: int = 0, avoid_group: str | None = None) -> tuple[int, int]:
        """Produce one message to a queue of ``topic`` whose group has a writer (not
        ``avoid_group``'s); returns ``(queue, offset)``. Raises :class:`NoWritableQueue`,
        the client's ``BrokerError`` or a connection error."""
        producer = self._get()
        router = producer.router
        if router.queues(topic) is None:
            await router.learn_topic(topic, Permission.WRITE)
        if not self._watching:
            self._watching = True
            router.on_route(lambda _new, _old: None)  # keep the route current
        writable = [q for q in router.live_queues(topic)
                    if (g := router.group_of(topic, q)) is not None and g != avoid_group
                    and self._writable(g)]
        # Send-side fault avoidance: a group that just failed or hung a send (a master
        # frozen before its group was fenced still shows WRITE) is skipped while isolated;
        # a copy that reached it may still be stored when it wakes (docs/delayed.md).
        now = time.monotonic()
        candidates = [q for q in writable
                      if producer.faults.available(router.group_of(topic, q) or "", now)]
        candidates = candidates or writable
        if not candidates:
            raise NoWritableQueue(
                f"no queue of topic {topic!r} is on a group with a writer"
                + (f" other than {avoid_group!r}" if avoid_group else ""))
        queue = candidates[next(self._rr) % len(candidates)]
        fut = await producer.send(topic, payload, key=key, queue=queue,
                                  deliver_at_ms=deliver_at_ms)
        return await fut

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
            self._producer = None


class Scheduler:
    """See the module docstring. ``mode`` says what this broker may do now; ``append``
    appends to the local log as a produce does (wakes readers and replication);
    ``placed`` says whether a topic's queue lives on this group."""

    def __init__(
        self,
        *,
        log_: CommitLog,
        index: ScheduleIndex,
        group: str,
        mode: Callable[[], Mode | None],
        append: Callable[[Sequence[RecordTuple]], AppendResult],
        placed: Callable[[str, int], bool],
        escaper: Escaper,
        on_delivered: Callable[[str, int], None] = lambda _how, _n: None,
    ) -> None:
        self._log = log_
        self._index = index
        self._group = group
        self._mode = mode
        self._append = append
        self._placed = placed
        self._escaper = escaper
        self._on_delivered = on_delivered
        self._busy = asyncio.Lock()
        self._wake = asyncio.Event()
        self._held: dict[str, float] = {}  # topic -> monotonic time to try again
        self._warned: dict[str, float] = {}
        self._released = 0

    # ---- what the broker asks -------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def quiesce(self) -> None:
        """Return once no delivery pass is running (back-sync calls this after READ is
        gone, so no escape can start after it)."""
        async with self._busy:
            pass

    def escaped(self) -> list[int]:
        return self._index.escaped()

    def escaped_synced(self, origins: list[int]) -> None:
        self._index.escaped_synced(origins)

    def absorb(self, origins: Sequence[int]) -> AppendResult | None:
        """The master takes a back-sync's escaped entries: they leave its schedule, and
        DONE records carry that to every slave. Returns the append to wait for. The index
        is brought up to the log first (an entry indexed later would come back)."""
        while self.catch_up(chunks=64):
            pass
        self._index.forget(list(origins))
        return self._done(list(origins))

    def retention_floor(self) -> int | None:
        """The log position retention must keep: the oldest entry still pending, or the
        first not yet indexed (None: nothing scheduled holds the log back)."""
        first = self._index.first_origin()
        indexed = self._index.indexed
        if indexed < self._log.queue_end(sch.SCHEDULE_TOPIC, 0):
            first = indexed if first is None else min(first, indexed)
        return None if first is None else self._log.phys_of(sch.SCHEDULE_TOPIC, 0, first)

    def stats(self, now_ms: int) -> tuple[int, int]:
        """``(pending, overdue)`` entries."""
        return self._index.pending(), self._index.overdue(now_ms)

    # ---- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            worked = False
            mode: Mode | None = None
            try:
                # A bounded step: a broker with a million entries to index (a restart, a
                # burst) keeps answering its clients meanwhile.
                # Deliver only from an index that has caught up with the log: a DONE
                # record not applied yet would let an acting slave escape what the master
                # delivered before it died.
                worked = self.catch_up() >= CATCH_UP_RECORDS
                mode = self._mode()
                if mode is not None and not worked:
                    async with self._busy:
                        if self._mode() == mode:
                            worked = await self._pass(mode)
            except asyncio.CancelledError:
                raise
            except Exception:  # a background task must report, not vanish
                log.exception("scheduler pass failed")
                await asyncio.sleep(1.0)
            if worked:
                await asyncio.sleep(0)
                continue
            await self._sleep(active=mode is not None)

    async def _sleep(self, *, active: bool) -> None:
        """Until the next entry is due (when this broker delivers or escapes), a wake, or
        :data:`IDLE_POLL_S`. Never returns without yielding: a due entry this broker may not
        deliver (a slave, a master without WRITE) must not spin the loop."""
        wait = IDLE_POLL_S
        nxt = self._index.next_due() if active else None
        if nxt is not None:
            wait = min(wait, max(0.001, nxt / 1000 - time.time()))
        self._wake.clear()
        try:
            async with asyncio.timeout(wait):
                await self._wake.wait()
        except TimeoutError:
            pass

    def catch_up(self, *, chunks: int = 1) -> int:
        """Apply up to ``chunks`` reads of the schedule queue of the log to the index;
        returns the records applied."""
        lg, index = self._log, self._index
        applied = 0
        start, end = lg.queue_start(sch.SCHEDULE_TOPIC, 0), lg.queue_end(sch.SCHEDULE_TOPIC, 0)
        at = index.indexed
        if at > end or at < start:
            dropped = index.cut(end, start)
            if at < start:
                log.error("schedule: offsets %d..%d of the schedule were deleted by retention "
                          "before they were indexed", at, start)
            if dropped:
                log.error("schedule: %d entries outside the log [%d, %d) dropped",
                          dropped, start, end)
            at = index.indexed
        while at < end and chunks > 0:
            chunks -= 1
            try:
                records = lg.read(sch.SCHEDULE_TOPIC, 0, at, max_bytes=4 << 20,
                                  max_records=CATCH_UP_RECORDS)
            except DamagedRecordError as exc:  # logged by the store; its entry is lost
                at = exc.offset + 1
                index.apply([], [], at)
                continue
            if not records:
                break
            entries: list[tuple[int, int]] = []
            done: list[int] = []
            for r in records:
                try:
                    what = sch.decode(r.body)
                except sch.ScheduleError as exc:
                    log.error("schedule record %d skipped: %s", r.queue_offset, exc)
                    continue
                if isinstance(what, sch.Entry):
                    entries.append((r.queue_offset, what.due_ms))
                else:
                    done.extend(what)
            at = records[-1].queue_offset + 1
            index.apply(entries, done, at)
            applied += len(records)
        if at - self._released >= RELEASE_EVERY:
            # The log's in-memory index of the schedule queue would grow by 16 bytes per
            # message scheduled; what is applied here is read from its file when due.
            lg.release_index_memory(sch.SCHEDULE_TOPIC, 0, at)
            self._released = at
        return applied

    async def _pass(self, mode: Mode) -> bool:
        now_ms = int(time.time() * 1000)
        mono = time.monotonic()
        self._held = {t: until for t, until in self._held.items() if until > mono}
        due = self._index.due(now_ms, BATCH + 4 * len(self._held))
        if not due:
            return False
        local: list[RecordTuple] = []
        local_origins: list[int] = []
        remote: list[tuple[int, sch.Entry, bytes | None]] = []
        dropped: list[int] = []
        for origin, _due_ms in due:
            try:
                records = self._log.read(sch.SCHEDULE_TOPIC, 0, origin, max_bytes=1,
                                         max_records=1)
            except DamagedRecordError:  # logged by the store: the entry is lost
                dropped.append(origin)
                continue
            if not records or records[0].queue_offset != origin:
                log.error("schedule entry %d is no longer in the log: dropped", origin)
                dropped.append(origin)
                continue
            rec = records[0]
            try:
                entry = sch.decode(rec.body)
            except sch.ScheduleError as exc:
                log.error("schedule entry %d unreadable (%s): dropped", origin, exc)
                dropped.append(origin)
                continue
            if not isinstance(entry, sch.Entry):
                dropped.append(origin)
                continue
            if entry.topic in self._held:
                continue
            if mode == "deliver" and self._placed(entry.topic, entry.queue):
                local.append((entry.topic, entry.queue, rec.key, entry.payload, now_ms))
                local_origins.append(origin)
            else:
                remote.append((origin, entry, rec.key))
            if len(local) + len(remote) >= BATCH:
                break
        if dropped:
            self._finish(mode, dropped)
        if local:
            self._done(local_origins, before=local)
            self._index.forget(local_origins)
            self._on_delivered("delivered", len(local))
        if remote:
            ok = await self._send_remote(mode, remote)
            if ok:
                self._finish(mode, ok)
                self._on_delivered("escaped" if mode == "escape" else "moved", len(ok))
        return bool(local or dropped or remote)

    async def _send_remote(self, mode: Mode, items: list[tuple[int, sch.Entry, bytes | None]]
                           ) -> list[int]:
        avoid = self._group if mode == "escape" else None

        async def one(origin: int, entry: sch.Entry, key: bytes | None) -> int | None:
            try:
                await self._escaper.put(entry.topic, key, entry.payload, avoid_group=avoid)
                return origin
            except NoWritableQueue as exc:
                self._hold(entry.topic, str(exc))
            except (BrokerError, ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                self._hold(entry.topic, f"{type(exc).__name__}: {exc}")
            return None

        results = await asyncio.gather(*(one(o, e, k) for o, e, k in items))
        return [o for o in results if o is not None]

    def _hold(self, topic: str, why: str) -> None:
        now = time.monotonic()
        self._held[topic] = now + HOLD_S
        if now - self._warned.get(topic, -60.0) >= 10.0:
            self._warned[topic] = now
            log.warning("schedule: due messages of topic %r wait (%s)", topic, why)

    def _finish(self, mode: Mode, origins: list[int]) -> None:
        """Entries taken care of: a master writes DONE for them, an acting slave records
        them as escaped (it never writes its log)."""
        if mode == "deliver":
            self._done(origins)
            self._index.forget(origins)
        else:
            self._index.escaped_add(origins)

    def _done(self, origins: list[int], before: Sequence[RecordTuple] = ()
              ) -> AppendResult | None:
        """Append ``before`` (delivered messages) and then the DONE records for
        ``origins``, in one append: delivery and progress are one write."""
        now_ms = int(time.time() * 1000)
        records = list(before)
        for i in range(0, len(origins), sch.DONE_BATCH):
            records.append((sch.SCHEDULE_TOPIC, 0, None,
                            sch.encode_done(origins[i:i + sch.DONE_BATCH]), now_ms))
        if not records:
            return None
        return self._append(records)
