"""The master's side of idempotent produce: which messages of a PRODUCE were stored
before, and the record that remembers the new ones (pure rules in
:mod:`understudy_broker.idempotence`; docs/idempotence.md).

The table is built from the log (the last producer records), so a master that restarted
recognises a retry of a batch it stored before it died; after that it follows the appends
this broker makes. A master builds it while it starts (:meth:`Producers.load`, before it
listens or registers in ZooKeeper, so before anyone routes to it): built
on the first PRODUCE instead, a long history (up to :data:`idempotence.REBUILD_RECORDS`
records, about 25 µs each) held the event loop for every client of the broker at the
moment writes came back to it. A slave never takes a produce and never builds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass, field

from understudy_broker import idempotence as idem
from understudy_broker import protocol as p
from understudy_broker.storage.commitlog import CommitLog, DamagedRecordError
from understudy_broker.storage.records import PackedBatch, RecordTuple

log = logging.getLogger(__name__)

#: Release the producer queue's in-memory index every this many records: the table holds
#: what matters, the index entries are only read again by a rebuild (which reloads them).
_RELEASE_EVERY = 4096


@dataclass(slots=True)
class ProducePlan:
    """What to append for one idempotent PRODUCE: ``messages`` (the new ones; empty when
    every message was a repeat), ``repeats`` (request index → the offset its first copy
    got, :data:`idempotence.SCHEDULED` for a delayed one), ``kept`` (the request index of
    each new message, in append order) and the ``runs`` that :meth:`Producers.records`
    puts in the producer record after them."""

    messages: list[RecordTuple | PackedBatch]
    repeats: dict[int, int]
    kept: list[int]
    producer: int = 0
    topic: str = ""
    runs: list[idem.Run] = field(default_factory=list)


class Producers:
    """The producer table of one broker's log."""

    def __init__(self, log_: CommitLog) -> None:
        self._log = log_
        self._table: idem.ProducerTable | None = None
        self._since_release = 0
        self.repeats_dropped = 0  # messages answered from the table instead of stored

    @property
    def loaded(self) -> bool:
        return self._table is not None

    def table(self) -> idem.ProducerTable:
        """The table, built now (in one go) if :meth:`load` has not built it."""
        if self._table is None:
            for _ in self._build():
                pass
        assert self._table is not None
        return self._table

    async def load(self) -> None:
        """Build the table from the log, giving the event loop back after every chunk of
        records read (ZooKeeper pings, the HTTP port): what a master does while it starts.
        Appends must not run meanwhile (the broker does not serve until this returns)."""
        for _ in self._build():
            await asyncio.sleep(0)

    def _build(self) -> Iterator[None]:
        """Build the table, pausing (yielding) after each read of records."""
        if self._table is not None:
            return
        table, started = idem.ProducerTable(), time.perf_counter()
        records = bad = 0
        for chunk in self._recent_records():
            records += len(chunk)
            bad += table.rebuild(chunk)
            yield
        if self._table is not None:  # built meanwhile by a table() call
            return
        self._table = table
        log.info("producer table rebuilt from the log: %d producer queue(s) from %d "
                 "record(s) in %.0f ms%s", len(table), records,
                 (time.perf_counter() - started) * 1000,
                 f", {bad} unreadable record(s) skipped" if bad else "")
        self._release()

    def _recent_records(self) -> Iterator[list[bytes]]:
        """The bodies of the last producer records, oldest first, a read's worth at a time."""
        lg = self._log
        topic = idem.PRODUCERS_TOPIC
        end = lg.queue_end(topic, 0)
        offset = max(lg.queue_start(topic, 0), end - idem.REBUILD_RECORDS)
        while offset < end:
            try:
                got = lg.read(topic, 0, offset, max_bytes=1 << 20, max_records=1024)
            except DamagedRecordError as exc:  # logged by the store; a retry may duplicate
                offset = exc.offset + 1
                continue
            if not got:
                return
            yield [rec.body for rec in got]
            offset = got[-1].queue_offset + 1

    def repeats(self, topic: str, producer: p.ProducerSeqs, queues: Sequence[int]
                ) -> dict[int, int]:
        """Request index -> the offset its first copy got, for the messages of one
        PRODUCE stored before (:data:`idempotence.SCHEDULED` for a delayed one)."""
        pid, seqs = producer
        return self.table().repeats(pid, topic, queues, seqs)

    def plan(self, topic: str, producer: p.ProducerSeqs, queues: Sequence[int],
             messages: Sequence[RecordTuple | PackedBatch], *,
             repeats: dict[int, int], delayed: Container[int] = ()) -> ProducePlan:
        """Split one PRODUCE into repeats (:meth:`repeats`) and new messages, and say in
        runs where the new ones go (:meth:`records` makes the record that remembers
        them). ``queues[i]`` is the queue message ``i`` was sent to, ``delayed`` holds the
        indexes of delayed messages (stored in the schedule, without an offset yet).
        ``messages`` are what the log will store: one per message when there are repeats;
        packed batches may stand for several otherwise. Offsets are those the append will
        give: nothing may suspend between this and the append."""
        pid, seqs = producer
        # No repeat (a new batch: the common case): every message, without a test each.
        kept = (list(range(len(queues))) if not repeats
                else [i for i in range(len(queues)) if i not in repeats])
        if not kept:
            return ProducePlan([], repeats, kept)
        if repeats and len(messages) != len(queues):
            raise ValueError("a plan with repeats takes one message per request message")
        next_offset: dict[int, int] = {}
        stored: list[tuple[int, int, int]] = []
        queue_end = self._log.queue_end
        for i in kept:
            q = queues[i]
            if i in delayed:
                stored.append((q, seqs[i], idem.SCHEDULED))
                continue
            at = next_offset.get(q)
            if at is None:
                at = queue_end(topic, q)
            next_offset[q] = at + 1
            stored.append((q, seqs[i], at))
        new: list[RecordTuple | PackedBatch] = (list(messages) if not repeats
                                                else [messages[i] for i in kept])
        return ProducePlan(new, repeats, kept, pid, topic, idem.runs_of(stored))

    @staticmethod
    def records(plans: Sequence[ProducePlan], now_ms: int) -> list[RecordTuple]:
        """The producer records to append after the messages of ``plans`` (one append,
        distinct topics): one per producer for all its topics (the parts of a
        PRODUCE_MULTI share it), none for a plan of repeats only. Pure."""
        by_producer: dict[int, list[tuple[str, list[idem.Run]]]] = {}
        for plan in plans:
            if plan.messages:
                by_producer.setdefault(plan.producer, []).append((plan.topic, plan.runs))
        step = idem.MAX_RECORD_TOPICS
        return [(idem.PRODUCERS_TOPIC, 0, None,
                 idem.encode_request_record(pid, parts[i:i + step]), now_ms)
                for pid, parts in by_producer.items() for i in range(0, len(parts), step)]

    def stored(self, plan: ProducePlan) -> None:
        """The plan's append succeeded: remember its runs."""
        self.table().record(plan.producer, plan.topic, plan.runs)
        self._since_release += 1
        if self._since_release >= _RELEASE_EVERY:
            self._release()

    def _release(self) -> None:
        self._since_release = 0
        end = self._log.queue_end(idem.PRODUCERS_TOPIC, 0)
        self._log.release_index_memory(idem.PRODUCERS_TOPIC, 0, end)
