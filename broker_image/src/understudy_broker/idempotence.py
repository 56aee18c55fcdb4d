"""Idempotent produce (invariant 8): a retried send to the same queue is stored once.

Why this module exists: a producer that gets no answer (a lost connection, a timeout, a
master that died after appending) cannot tell whether its batch was stored, so it sends
it again. Without help the log then holds the messages twice. As in Kafka's idempotent
producer, every producer picks a producer id and numbers its messages per queue; the
master remembers the numbers it stored and answers a repeat with the offsets the first
copy got instead of storing it again.

The pieces, all pure (the broker's produce handler does the I/O):

* **Wire.** A PRODUCE trailer (``protocol.encode_produce(..., producer=)``): the producer
  id (u64, random, chosen by the client) and one sequence number per message, counted
  per ``(topic, queue)`` from 0. A message keeps its number through every retry to the
  same queue; moved to another queue (another group), it gets that queue's next number.
* **Runs.** The messages of one PRODUCE that go to one queue with consecutive numbers are
  stored at consecutive offsets: one :class:`Run` ``(queue, first_seq, count,
  first_offset)`` says where all of them are. A delayed message is stored in the group's
  schedule, not at an offset: its run has ``first_offset`` :data:`SCHEDULED`.
* **The log is the memory.** The runs of a PRODUCE are written as one record of the
  internal topic :data:`PRODUCERS_TOPIC` *in the same append* as the messages, so they
  are durable, replicated and lost together: a master that restarts rebuilds its table
  from the last :data:`REBUILD_RECORDS` of those records, and a slave's copy of the log
  carries them too. A PRODUCE_MULTI's parts stored in one append share one record per
  producer: version 1 holds one topic's runs (what every broker reads), version 2 the
  runs of several topics (:func:`encode_request_record`). A broker older than version 2
  skips those records when it rebuilds: a lost memory of those repeats, never a wrong
  answer (docs/idempotence.md, "The record's versions").
* **The table** (:class:`ProducerTable`) keeps the last :data:`RUNS_PER_QUEUE` runs of
  each ``(producer, topic, queue)`` and at most :data:`MAX_KEYS` such keys, least recently
  used first out. A run that continues the key's last one in numbers *and* offsets (the
  producer's next batch, nothing of another producer in between) extends it, so a queue
  with one producer keeps its whole history in one run. A repeat of an older run, or of a producer forgotten since, is stored
  again (a duplicate the checker counts); docs/idempotence.md says when that can happen.

A sequence number at or below one already stored is *not* taken as a repeat unless it is
inside a recorded run: batches of one producer may reach a queue out of order (a retry
after a later batch got through), and a number skipped by a message that failed for good
must not hide the ones after it.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

#: The internal topic whose queue 0 holds one record of runs per idempotent PRODUCE.
PRODUCERS_TOPIC: Final = "__understudy_producers"
#: Runs remembered per (producer, topic, queue): a retry of any of them is recognised.
RUNS_PER_QUEUE: Final = 16
#: (producer, topic, queue) keys remembered; the least recently used goes first.
MAX_KEYS: Final = 16_384
#: Producer records read back from the log when a master (re)builds its table.
REBUILD_RECORDS: Final = 20_000
#: ``first_offset`` of a run of delayed messages (stored in the schedule, no offset yet).
SCHEDULED: Final = -1

_HEAD = struct.Struct(">BQH")  # version, producer id, topic length (1) or topic count (2)
_RUN = struct.Struct(">IQIq")  # queue, first seq, count, first offset (-1: scheduled)
_COUNT = struct.Struct(">I")
_NAME = struct.Struct(">H")  # version 2: each topic's name length
_VERSION = 1  # one topic's runs
_VERSION_TOPICS = 2  # several topics' runs: the parts of a PRODUCE_MULTI
#: The most topics one version 2 record holds.
MAX_RECORD_TOPICS: Final = 0xFFFF


@dataclass(frozen=True, slots=True)
class Run:
    """Messages ``first_seq .. first_seq + count - 1`` of one producer to ``queue``, stored
    at offsets ``first_offset ..`` (or all delayed: ``first_offset`` is :data:`SCHEDULED`)."""

    queue: int
    first_seq: int
    count: int
    first_offset: int

    def offset_of(self, seq: int) -> int | None:
        """The offset ``seq`` was stored at (:data:`SCHEDULED` for a delayed run), None
        when the run does not hold it."""
        i = seq - self.first_seq
        if not 0 <= i < self.count:
            return None
        return SCHEDULED if self.first_offset == SCHEDULED else self.first_offset + i


def runs_of(stored: Sequence[tuple[int, int, int]]) -> list[Run]:
    """The runs of ``(queue, seq, offset)`` triples in the order they were stored (offset
    :data:`SCHEDULED` for a delayed message): consecutive numbers at consecutive offsets
    of one queue make one run. (Per message on the master's produce path: a run grows in
    a list, and becomes a :class:`Run` once, at the end.)"""
    out: list[list[int]] = []  # [queue, first_seq, count, first_offset] per run
    open_runs: dict[int, list[int]] = {}  # queue -> its last run
    for queue, seq, offset in stored:
        last = open_runs.get(queue)
        if last is not None and seq == last[1] + last[2] and (
                offset == SCHEDULED == last[3]
                or (offset != SCHEDULED != last[3] and offset == last[3] + last[2])):
            last[2] += 1
            continue
        last = open_runs[queue] = [queue, seq, 1, offset]
        out.append(last)
    return [Run(*run) for run in out]


def _runs_bytes(runs: Sequence[Run]) -> list[bytes]:
    """A topic's runs in a record: their count, then each."""
    return [_COUNT.pack(len(runs)),
            *(_RUN.pack(r.queue, r.first_seq, r.count, r.first_offset) for r in runs)]


def encode_record(producer: int, topic: str, runs: Sequence[Run]) -> bytes:
    """The body of a :data:`PRODUCERS_TOPIC` record (version 1): which messages of which
    producer one PRODUCE stored where."""
    name = topic.encode()
    return b"".join([_HEAD.pack(_VERSION, producer, len(name)), name, *_runs_bytes(runs)])


def encode_request_record(producer: int, parts: Sequence[tuple[str, Sequence[Run]]]) -> bytes:
    """One record for the runs of several topics one append stored for ``producer``
    (``(topic, runs)`` each, topics distinct, at most :data:`MAX_RECORD_TOPICS`): version
    1 when there is one topic, version 2 otherwise."""
    if len(parts) == 1:
        return encode_record(producer, *parts[0])
    if not 1 < len(parts) <= MAX_RECORD_TOPICS:
        raise ValueError(f"a producer record holds 1 to {MAX_RECORD_TOPICS} topics, "
                         f"not {len(parts)}")
    out = [_HEAD.pack(_VERSION_TOPICS, producer, len(parts))]
    for topic, runs in parts:
        name = topic.encode()
        out += [_NAME.pack(len(name)), name, *_runs_bytes(runs)]
    return b"".join(out)


def _decode_topic(body: bytes, at: int, tlen: int) -> tuple[tuple[str, list[Run]], int]:
    """One topic's name (``tlen`` bytes at ``at``) and runs, and where they end."""
    if at + tlen > len(body):
        raise ValueError("producer record length does not match its topic name")
    topic = body[at : at + tlen].decode()
    at += tlen
    (n,) = _COUNT.unpack_from(body, at)
    at += _COUNT.size
    if at + n * _RUN.size > len(body):
        raise ValueError("producer record length does not match its run count")
    runs = [Run(*_RUN.unpack_from(body, at + i * _RUN.size)) for i in range(n)]
    return (topic, runs), at + n * _RUN.size


def decode_record(body: bytes) -> tuple[int, list[tuple[str, list[Run]]]]:
    """``(producer, [(topic, runs), ...])`` from either version; raises ``ValueError`` for
    a body no version writes (the table skips it: a lost memory, never a wrong answer)."""
    try:
        version, producer, n = _HEAD.unpack_from(body, 0)
        at = _HEAD.size
        if version == _VERSION:  # n: the topic name's length
            part, at = _decode_topic(body, at, n)
            parts = [part]
        elif version == _VERSION_TOPICS and n > 1:  # n: how many topics
            parts = []
            for _ in range(n):
                (tlen,) = _NAME.unpack_from(body, at)
                part, at = _decode_topic(body, at + _NAME.size, tlen)
                parts.append(part)
        else:
            raise ValueError(f"producer record version {version}")
        if at != len(body):
            raise ValueError("producer record length does not match its run count")
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable producer record: {exc}") from None
    return producer, parts


_Key = tuple[int, str, int]


class ProducerTable:
    """What each producer stored where, as far as the last runs go (see the module doc).

    Each key's runs are one flat ``array('q')`` of ``(first_seq, count, first_offset)``
    triples, oldest first: 24 bytes a run, no object per run."""

    def __init__(self, *, runs_per_queue: int = RUNS_PER_QUEUE, max_keys: int = MAX_KEYS) -> None:
        self._runs: OrderedDict[_Key, array[int]] = OrderedDict()
        self._per_queue = runs_per_queue
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._runs)

    def lookup(self, producer: int, topic: str, queue: int, seq: int) -> int | None:
        """The offset a repeat of ``seq`` was first stored at (:data:`SCHEDULED` for a
        delayed message), or None: not stored as far as the table remembers."""
        runs = self._runs.get((producer, topic, queue))
        if runs is None:
            return None
        for at in range(len(runs) - 3, -1, -3):
            i = seq - runs[at]
            if 0 <= i < runs[at + 1]:
                first = runs[at + 2]
                return SCHEDULED if first == SCHEDULED else first + i
        return None

    def repeats(self, producer: int, topic: str, queues: Sequence[int],
                seqs: Sequence[int]) -> dict[int, int]:
        """``{index: first offset}`` of the messages of one PRODUCE (``queues[i]``,
        ``seqs[i]``) that were stored before."""
        out: dict[int, int] = {}
        # Per queue, the end of its highest run: a number from there on was never stored,
        # so a new batch (every message of it, in the common case) costs one comparison
        # a message instead of a walk over the runs kept.
        tops: dict[int, int] = {}
        for i, (queue, seq) in enumerate(zip(queues, seqs, strict=True)):
            top = tops.get(queue)
            if top is None:
                runs = self._runs.get((producer, topic, queue))
                top = tops[queue] = max(
                    (runs[at] + runs[at + 1] for at in range(0, len(runs), 3)), default=0
                ) if runs is not None else 0
            if seq >= top:
                continue
            offset = self.lookup(producer, topic, queue, seq)
            if offset is not None:
                out[i] = offset
        return out

    def record(self, producer: int, topic: str, runs: Iterable[Run]) -> None:
        for run in runs:
            key = (producer, topic, run.queue)
            kept = self._runs.get(key)
            if kept is None:
                kept = self._runs[key] = array("q")
                if len(self._runs) > self._max_keys:
                    self._runs.popitem(last=False)
            else:
                self._runs.move_to_end(key)
            if kept and _continues(kept, run):
                kept[-2] += run.count  # the same producer's next batch right after it
                continue
            kept.extend((run.first_seq, run.count, run.first_offset))
            if len(kept) > 3 * self._per_queue:
                del kept[: len(kept) - 3 * self._per_queue]

    def runs(self, producer: int, topic: str, queue: int) -> list[Run]:
        """The runs kept for one key, oldest first (for tests and inspection)."""
        kept = self._runs.get((producer, topic, queue), array("q"))
        return [Run(queue, kept[i], kept[i + 1], kept[i + 2]) for i in range(0, len(kept), 3)]

    def rebuild(self, bodies: Iterable[bytes]) -> int:
        """Replay producer records, oldest first; returns how many were unreadable."""
        bad = 0
        for body in bodies:
            try:
                producer, parts = decode_record(body)
            except ValueError:
                bad += 1
                continue
            for topic, runs in parts:
                self.record(producer, topic, runs)
        return bad


def _continues(kept: array[int], run: Run) -> bool:
    """``run`` follows the last kept run in numbers and offsets: one run can say both."""
    seq, count, first = kept[-3], kept[-2], kept[-1]
    if run.first_seq != seq + count:
        return False
    if first == SCHEDULED or run.first_offset == SCHEDULED:
        return first == run.first_offset
    return run.first_offset == first + count
