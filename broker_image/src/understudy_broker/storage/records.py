"""The item formats of the commit log, and the one walker over stored bytes.

Why this module exists: the same bytes are written by the master's append, copied by a
slave, checked before a slave accepts them, scanned when a broker recovers and decoded
when a consumer reads. Each of those must agree to the byte on what a record is, so the
layout is defined once, here, as ``struct`` fields, and every pass over stored bytes goes
through :func:`walk`. Pure: no files, no clock, no asyncio.

Two kinds of item hold messages. A broker writes batches; records are what brokers
before batches (2026-11-28) wrote, read as they are (a log may hold both: see
docs/record-batch.md). All big-endian; sizes derived with ``calcsize``.

Batch: the messages one append stores for one ``(topic, queue)``, at consecutive
sequence numbers and queue offsets (record ``i`` has ``base seq + i``, ``base queue
offset + i`` and timestamp ``first timestamp + delta``)::

    BATCH_PREFIX    total length | BATCH_MAGIC | header crc (crc32 of BATCH_HEADER + topic)
    BATCH_HEADER    base seq | base queue offset | first timestamp ms | queue | count |
                    topic len | attributes (0) | records crc (crc32 of the records section)
    topic (utf-8)
    records         count x ( BATCH_RECORD: key len (-1: none) | body len | timestamp delta
                              | key | body )

The first record's delta is 0 (so a batch has one encoding). The two CRCs split what the
writer of the records (the producer, for a batch-form PRODUCE: :class:`PackedBatch`; the
master otherwise) and the writer of the header (the master: sequence numbers, offsets)
know. The slave's check and recovery's scan check
both and that the records' lengths add up (:func:`walk`, :func:`check_item`); a read
checks both and the lengths of the records it walks (:func:`decode_item`).

Record (one message; the format before batches, still read)::

    RECORD_PREFIX   total length | magic | crc32 of every byte after the crc field
    RECORD_HEADER   seq | queue offset | timestamp ms | queue | topic len | key len | body len
    topic (utf-8) | key (absent when key len == -1) | body

End-of-file marker (fills the rest of a segment when the next record does not fit)::

    EOF_MARKER      total length (= rest of the segment) | EOF magic | next sequence number
    zero bytes up to the segment end

An item never straddles two segments, so a segment of ``segment_bytes`` always ends with
a marker or exactly at an item's end. The marker carries the next sequence number so a
log whose active segment is empty still knows where the sequence continues.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from understudy_broker.checksum import crc32
from understudy_broker.model import TopicNameError, check_topic_name

RECORD_MAGIC = 0xDAA320A7
BATCH_MAGIC = 0xB47C4E52
EOF_MAGIC = 0xCBD43194

RECORD_PREFIX = struct.Struct(
    ">"
    "I"  # total record length in bytes, this field included
    "I"  # magic: RECORD_MAGIC
    "I"  # crc32 over every byte that follows this field (header rest + topic + key + body)
)
RECORD_HEADER = struct.Struct(
    ">"
    "Q"  # sequence number: global, +1 per record, never reused
    "Q"  # queue offset: logical position of the record inside its (topic, queue)
    "q"  # timestamp, ms since the Unix epoch (producer's or broker's clock)
    "I"  # queue id
    "H"  # topic length in bytes (utf-8)
    "i"  # key length in bytes; -1 means "no key" (distinct from an empty key)
    "I"  # body length in bytes
)
EOF_MARKER = struct.Struct(
    ">"
    "I"  # total marker length: from here to the end of the segment
    "I"  # magic: EOF_MAGIC
    "Q"  # sequence number the next record will carry
)
BATCH_PREFIX = RECORD_PREFIX  # total length | BATCH_MAGIC | header crc
BATCH_HEADER = struct.Struct(
    ">"
    "Q"  # base sequence number: the first record's
    "Q"  # base queue offset: the first record's
    "q"  # first timestamp, ms since the Unix epoch: the first record's
    "I"  # queue id
    "I"  # record count, >= 1
    "H"  # topic length in bytes (utf-8)
    "H"  # attributes: 0 (bits reserved: compression, not built)
    "I"  # records crc: crc32 of the records section
)
BATCH_RECORD = struct.Struct(
    ">"
    "i"  # key length in bytes; -1 means "no key"
    "I"  # body length in bytes
    "i"  # timestamp delta, ms, from the batch's first timestamp
)
BATCH_END = RECORD_PREFIX.size + BATCH_HEADER.size  # where the topic starts
#: The field RECORD_HEADER and BATCH_HEADER both start with: the (first) sequence number.
FIRST_SEQ = struct.Struct(">Q")
BATCH_RECORD_SIZE = BATCH_RECORD.size
#: BATCH_PREFIX and BATCH_HEADER: one unpack for both.
_PREFIX_BATCH_HEADER = struct.Struct(BATCH_PREFIX.format + BATCH_HEADER.format[1:])
#: A timestamp delta must fit the field; a batch closes before one that does not.
MAX_DELTA = 0x7FFF_FFFF
PREFIX_SIZE = RECORD_PREFIX.size
HEADER_END = PREFIX_SIZE + RECORD_HEADER.size
EOF_MIN = EOF_MARKER.size
#: The two fields records and markers share: total length, magic.
LEN_MAGIC = struct.Struct(">II")
#: The CRC field followed by RECORD_HEADER: one unpack for both on the hot paths.
CRC_HEADER = struct.Struct(">I" + RECORD_HEADER.format[1:])
#: The CRC covers everything after the prefix.
CRC_FROM = PREFIX_SIZE


# ---- errors ------------------------------------------------------------------------
class CommitLogError(Exception):
    """Base class of storage errors."""


class CorruptRecordError(CommitLogError):
    """A record read back from disk fails its checks."""


class MessageTooLargeError(CommitLogError, ValueError):
    """A message cannot fit in one segment."""


class InvalidMessageError(CommitLogError, ValueError):
    """Topic name, queue id or key length out of range."""


# ---- values ------------------------------------------------------------------------
class Message(NamedTuple):
    """A record to append. A tuple rather than a dataclass: the broker's produce path
    builds one per message, and :meth:`CommitLog.append` also takes plain
    ``(topic, queue, key, body, timestamp_ms)`` tuples (:data:`RecordTuple`), which cost a
    fraction of an object to build."""

    topic: str
    queue: int
    key: bytes | None
    body: bytes
    timestamp_ms: int


#: ``(topic, queue, key, body, timestamp_ms)``; :class:`Message` is one.
RecordTuple = tuple[str, int, bytes | None, bytes, int]


class PackedBatch(NamedTuple):
    """Messages of one ``(topic, queue)`` whose records section a producer packed
    (a batch-form PRODUCE, docs/record-batch.md): :meth:`CommitLog.append` stores the
    section as it came, under a header it writes, without touching a record. Checked
    before it gets here: the section is well formed (:func:`records_problem`, every
    delta 0) and ``records_crc`` is its CRC. ``topic`` and ``queue`` come first, as in a
    :data:`RecordTuple`."""

    topic: str
    queue: int
    records: bytes
    messages: int  # how many records the section holds
    timestamp_ms: int  # the first (and every) record's: the broker's clock at arrival
    records_crc: int


class StoredRecord(NamedTuple):
    """A message read back. ``phys_offset`` and ``size`` are those of the item holding it:
    a record, or the batch every message of which has the same two. A named tuple, not a
    dataclass: a read builds one per message, and a frozen dataclass's ``__init__`` cost
    a broker serving consumers a fifth of its CPU."""

    topic: str
    queue: int
    queue_offset: int
    seq: int
    timestamp_ms: int
    key: bytes | None
    body: bytes
    phys_offset: int
    size: int


#: One item :func:`walk` found, as a plain tuple in :class:`Walked`'s field order. The
#: slave's replication path unpacks these directly: building a named tuple per record
#: cost it about a fifth of its CPU.
WalkedRow = tuple[int, int, bool, int, int, int, str, int]


class Walked(NamedTuple):
    """One item :func:`walk` found, by name (recovery's view; :meth:`Walk.named`): a
    batch or a record (``seq`` and ``queue_offset`` are its first message's, ``messages``
    how many it holds), or an end-of-file marker (``is_marker``; then ``seq`` is the next
    sequence number and the other fields are zero)."""

    phys: int
    size: int
    is_marker: bool
    seq: int
    queue_offset: int
    queue: int
    topic: str
    messages: int  # messages in the item: 1 for a record, 0 for a marker


@dataclass(slots=True)
class Walk:
    """What :func:`walk` found in a buffer."""

    items: list[WalkedRow] = field(default_factory=list)
    valid_end: int = 0  # physical offset after the last whole valid item
    error: str | None = None  # why walking stopped before the data ended (None: data ended)

    def named(self) -> list[Walked]:
        return [Walked._make(row) for row in self.items]


# ---- pure helpers -------------------------------------------------------------------
def topic_bytes(topic: str) -> bytes:
    """The topic's utf-8 bytes, or :class:`InvalidMessageError` (the name rule is
    :func:`understudy_broker.model.check_topic_name`)."""
    try:
        return check_topic_name(topic).encode("utf-8")
    except TopicNameError as exc:
        raise InvalidMessageError(str(exc)) from None


def record_size(*, topic_len: int, key: bytes | None, body_len: int) -> int:
    return HEADER_END + topic_len + (len(key) if key is not None else 0) + body_len


def segment_end(phys: int, segment_bytes: int) -> int:
    """The end of the segment holding physical offset ``phys``."""
    return (phys // segment_bytes + 1) * segment_bytes


def encode_record(
    *, seq: int, queue_offset: int, message: Message, topic_raw: bytes
) -> tuple[bytes, ...]:
    """The pieces of one record (join them to get its bytes). The reference encoder of the
    layout above; :meth:`CommitLog.append` writes the same bytes into one buffer."""
    key = message.key
    klen = -1 if key is None else len(key)
    rest = RECORD_HEADER.pack(
        seq,
        queue_offset,
        message.timestamp_ms,
        message.queue,
        len(topic_raw),
        klen,
        len(message.body),
    )
    crc = crc32(rest)
    crc = crc32(topic_raw, crc)
    if key:
        crc = crc32(key, crc)
    crc = crc32(message.body, crc)
    size = HEADER_END + len(topic_raw) + max(klen, 0) + len(message.body)
    prefix = RECORD_PREFIX.pack(size, RECORD_MAGIC, crc)
    if key:
        return (prefix, rest, topic_raw, key, message.body)
    return (prefix, rest, topic_raw, message.body)


def encode_records(messages: Iterable[tuple[bytes | None, bytes, int]]) -> bytes:
    """A batch's records section from ``(key, body, timestamp delta)`` triples: the one
    encoder of :data:`BATCH_RECORD` runs (the master's :func:`batch_parts`, and the
    producer's batch-form PRODUCE, which sends the section the master will store)."""
    pack = BATCH_RECORD.pack
    pieces: list[bytes] = []
    add = pieces.append
    for key, body, delta in messages:
        if key is None:
            add(pack(-1, len(body), delta))
        else:
            add(pack(len(key), len(body), delta))
            add(key)
        add(body)
    return b"".join(pieces)


def unpacked(items: Sequence[RecordTuple | PackedBatch]) -> list[RecordTuple]:
    """``items`` with each :class:`PackedBatch` taken apart into its messages."""
    out: list[RecordTuple] = []
    for m in items:
        if isinstance(m, PackedBatch):
            topic, queue, ts = m.topic, m.queue, m.timestamp_ms
            out += [(topic, queue, key, body, ts + delta)
                    for key, body, delta in records_of(m.records, m.messages)]
        else:
            out.append(m)
    return out


def batch_head_parts(*, seq: int, queue_offset: int, queue: int, topic_raw: bytes,
                     count: int, first_ts: int, records_crc: int, records_len: int
                     ) -> tuple[list[bytes], int]:
    """The pieces of a batch before its records section (prefix, header, topic) and the
    batch's total length: the one encoder of a batch's header, for records packed here
    (:func:`batch_parts`) or by a producer (:class:`PackedBatch`)."""
    rest = BATCH_HEADER.pack(seq, queue_offset, first_ts, queue, count, len(topic_raw), 0,
                             records_crc)
    size = BATCH_END + len(topic_raw) + records_len
    prefix = BATCH_PREFIX.pack(size, BATCH_MAGIC, crc32(topic_raw, crc32(rest)))
    return [prefix, rest, topic_raw], size


def batch_parts(*, seq: int, queue_offset: int, queue: int, topic_raw: bytes,
                messages: Sequence[RecordTuple]) -> tuple[list[bytes], int]:
    """The bytes of one batch of ``messages`` (one topic and queue; the first sets the
    batch's timestamp, the others within :data:`MAX_DELTA` of it: the caller's business),
    as pieces to write one after the other, and their total length. The encoder of the
    layout above for messages the master packs itself (:func:`encode_batch` joins the
    pieces; :meth:`CommitLog.append` writes them). A batch of one is checksummed piece by
    piece; a larger one's records are joined first, for one CRC over the section."""
    first_ts = messages[0][4]
    records: list[bytes]
    if len(messages) == 1:
        _t, _q, key, body, _ts = messages[0]
        head = BATCH_RECORD.pack(-1 if key is None else len(key), len(body), 0)
        rcrc = crc32(head)
        if key:
            rcrc = crc32(key, rcrc)
        rcrc = crc32(body, rcrc)
        records = [head, key, body] if key else [head, body]
        rlen = BATCH_RECORD_SIZE + (len(key) if key else 0) + len(body)
    else:
        section = encode_records([(key, body, ts - first_ts)
                                  for _t, _q, key, body, ts in messages])
        rcrc = crc32(section)
        records = [section]
        rlen = len(section)
    head_parts, size = batch_head_parts(seq=seq, queue_offset=queue_offset, queue=queue,
                                        topic_raw=topic_raw, count=len(messages),
                                        first_ts=first_ts, records_crc=rcrc, records_len=rlen)
    return head_parts + records, size


def encode_batch(*, seq: int, queue_offset: int, messages: Sequence[RecordTuple]) -> bytes:
    """The bytes of one batch of ``messages`` (one topic and queue; :class:`Message` or
    :data:`RecordTuple` items): :func:`batch_parts`, joined."""
    if not messages:
        raise ValueError("a batch holds at least one record")
    topic, queue = messages[0][0], messages[0][1]
    if any((m[0], m[1]) != (topic, queue) for m in messages):
        raise ValueError("a batch holds one topic's queue")
    parts, _size = batch_parts(seq=seq, queue_offset=queue_offset, queue=queue,
                               topic_raw=topic_bytes(topic), messages=messages)
    return b"".join(parts)


def encode_eof_marker(*, length: int, next_seq: int) -> bytes:
    return EOF_MARKER.pack(length, EOF_MAGIC, next_seq) + bytes(length - EOF_MIN)


def records_problem(buf: memoryview | bytes, start: int, end: int, count: int, *,
                    stamped: bool = False) -> str | None:
    """Why a batch's records section ``buf[start:end]`` of ``count`` records is not
    well formed (lengths that run over or fall short of the section, a first timestamp
    other than the header's; with ``stamped``, any timestamp delta but 0: the broker
    stamps what a producer sends), or None."""
    unpack = BATCH_RECORD.unpack_from
    p = start
    if count == 1 and end - start >= BATCH_RECORD_SIZE:  # a batch of one: the common case
        klen, blen, delta = unpack(buf, start)  # with many queues, checked in one step
        if not delta and klen >= -1 and start + BATCH_RECORD_SIZE + max(klen, 0) + blen == end:
            return None
    if count and end - start >= BATCH_RECORD_SIZE and unpack(buf, start)[2] != 0:
        return "its first record's timestamp delta is not 0"
    for _ in range(count):
        if p + BATCH_RECORD_SIZE > end:
            return "its records run past its end"
        klen, blen, delta = unpack(buf, p)
        if klen < -1:
            return f"a record has key length {klen}"
        if stamped and delta:
            return f"a record has timestamp delta {delta} (the broker stamps the time: 0)"
        p += BATCH_RECORD_SIZE + (klen if klen > 0 else 0) + blen
    if p != end:
        return "its record lengths disagree with its length"
    return None


def records_of(section: bytes, count: int) -> list[tuple[bytes | None, bytes, int]]:
    """The ``(key, body, timestamp delta)`` of each record of a well-formed records
    section (:func:`records_problem` says None): the inverse of :func:`encode_records`."""
    unpack = BATCH_RECORD.unpack_from
    out: list[tuple[bytes | None, bytes, int]] = []
    p = 0
    for _ in range(count):
        klen, blen, delta = unpack(section, p)
        p += BATCH_RECORD_SIZE
        key: bytes | None = None
        if klen >= 0:
            key = section[p : p + klen]
            p += klen
        out.append((key, section[p : p + blen], delta))
        p += blen
    return out


class ItemHead(NamedTuple):
    """The message-holding item (batch or record) at a position, checked whole."""

    topic: str
    queue: int
    queue_offset: int  # the first message's
    seq: int  # the first message's
    messages: int
    size: int


def _batch_head(buf: memoryview, pos: int, phys: int) -> tuple[ItemHead, int, int]:
    """The batch at ``buf[pos:]`` with its framing and both CRCs checked (not its records'
    lengths): the batch, its first timestamp and where its records start."""
    if len(buf) - pos < BATCH_END:
        raise CorruptRecordError(f"batch at {phys}: truncated header")
    size, _magic, hcrc, seq, qoff, ts0, queue, count, tlen, attrs, rcrc = (
        _PREFIX_BATCH_HEADER.unpack_from(buf, pos))
    rstart = pos + BATCH_END + tlen
    if size < BATCH_END or pos + size > len(buf) or rstart > pos + size:
        raise CorruptRecordError(f"batch at {phys}: bad magic or length")
    if crc32(buf[pos + CRC_FROM : rstart]) != hcrc or crc32(buf[rstart : pos + size]) != rcrc:
        raise CorruptRecordError(f"batch at {phys}: CRC mismatch")
    if count < 1 or attrs != 0:
        raise CorruptRecordError(f"batch at {phys}: count {count}, attributes {attrs}")
    try:
        topic = bytes(buf[pos + BATCH_END : rstart]).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptRecordError(f"batch at {phys}: topic is not utf-8") from None
    return ItemHead(topic, queue, qoff, seq, count, size), ts0, rstart


def _message_item(buf: memoryview, pos: int, phys: int) -> int:
    """The magic of the batch or record at ``buf[pos:]``; :class:`CorruptRecordError` when
    there is neither."""
    if len(buf) - pos < LEN_MAGIC.size:
        raise CorruptRecordError(f"record at {phys}: truncated header")
    magic: int = LEN_MAGIC.unpack_from(buf, pos)[1]
    if magic not in (RECORD_MAGIC, BATCH_MAGIC):
        raise CorruptRecordError(f"record at {phys}: bad magic or length")
    return magic


def _record_head(rec: StoredRecord) -> ItemHead:
    return ItemHead(rec.topic, rec.queue, rec.queue_offset, rec.seq, 1, rec.size)


def check_item(buf: memoryview, pos: int, phys: int) -> ItemHead:
    """Check the batch or record at ``buf[pos:]`` (framing, CRCs, every record's lengths)
    and say what it holds; :class:`CorruptRecordError` when it is not intact."""
    if _message_item(buf, pos, phys) == RECORD_MAGIC:
        return _record_head(decode_record(buf, pos, phys))
    head, _ts0, rstart = _batch_head(buf, pos, phys)
    problem = records_problem(buf, rstart, pos + head.size, head.messages)
    if problem is not None:
        raise CorruptRecordError(f"batch at {phys}: {problem}")
    return head


def item_head(buf: memoryview, pos: int, phys: int) -> ItemHead:
    """The batch or record at ``buf[pos:]``, its framing and CRCs checked but not its
    records decoded (a batch's record lengths were checked by its writer; the CRCs say
    they are unchanged): what a read that hands on stored bytes checks."""
    if _message_item(buf, pos, phys) == RECORD_MAGIC:
        return _record_head(decode_record(buf, pos, phys))
    return _batch_head(buf, pos, phys)[0]


def decode_item(buf: memoryview, pos: int, phys: int, *, first: int = 0,
                limit: int | None = None, budget: int | None = None, must: bool = True
                ) -> tuple[ItemHead, list[StoredRecord], int]:
    """The batch or record at ``buf[pos:]``, checked (framing, CRCs; a batch's records'
    lengths as far as they are walked), its messages from the ``first``-th, at most
    ``limit`` of them and, with ``budget``, as many as fit in that many bytes (a
    message's own bytes: its record within the batch, or the whole record), the first
    even when it does not (``must``). Returns the item, the messages and their bytes.
    One pass over the records: what the writer checked whole (append, a slave's check,
    recovery's scan), the CRCs say is unchanged."""
    if _message_item(buf, pos, phys) == RECORD_MAGIC:
        rec = decode_record(buf, pos, phys)
        head = _record_head(rec)
        if first != 0 or limit == 0 or (budget is not None and head.size > budget and not must):
            return head, [], 0
        return head, [rec], head.size
    head, ts0, p = _batch_head(buf, pos, phys)
    stop = head.messages if limit is None else min(head.messages, first + limit)
    topic, queue, qoff, seq, size = head.topic, head.queue, head.queue_offset, head.seq, head.size
    end = pos + size
    unpack = BATCH_RECORD.unpack_from
    out: list[StoredRecord] = []
    add = out.append
    used = 0
    for i in range(stop):
        if p + BATCH_RECORD_SIZE > end:
            raise CorruptRecordError(f"batch at {phys}: its records run past its end")
        klen, blen, delta = unpack(buf, p)
        own = BATCH_RECORD_SIZE + (klen if klen > 0 else 0) + blen
        if klen < -1 or p + own > end:
            raise CorruptRecordError(f"batch at {phys}: its record lengths disagree with "
                                     "its length")
        if i < first:
            p += own
            continue
        if budget is not None and used + own > budget and (out or not must):
            break
        p += BATCH_RECORD_SIZE
        key: bytes | None = None
        if klen >= 0:
            key = bytes(buf[p : p + klen])
            p += klen
        add(StoredRecord(topic, queue, qoff + i, seq + i, ts0 + delta, key,
                         bytes(buf[p : p + blen]), phys, size))
        p += blen
        used += own
    return head, out, used


def decode_record(buf: memoryview, pos: int, phys: int) -> StoredRecord:
    """Decode and CRC-check the record at ``buf[pos:]``."""
    if len(buf) - pos < HEADER_END:
        raise CorruptRecordError(f"record at {phys}: truncated header")
    size, magic, crc = RECORD_PREFIX.unpack_from(buf, pos)
    if magic != RECORD_MAGIC or size < HEADER_END or pos + size > len(buf):
        raise CorruptRecordError(f"record at {phys}: bad magic or length")
    if crc32(buf[pos + CRC_FROM : pos + size]) != crc:
        raise CorruptRecordError(f"record at {phys}: CRC mismatch")
    seq, qoff, ts, queue, tlen, klen, blen = RECORD_HEADER.unpack_from(buf, pos + PREFIX_SIZE)
    p = pos + HEADER_END
    topic = bytes(buf[p : p + tlen]).decode("utf-8")
    p += tlen
    key: bytes | None = None
    if klen >= 0:
        key = bytes(buf[p : p + klen])
        p += klen
    body = bytes(buf[p : p + blen])
    return StoredRecord(topic, queue, qoff, seq, ts, key, body, phys, size)


_ZEROS = bytes(1 << 16)


def _zeros(view: memoryview) -> bool:
    """Whether every byte of ``view`` is zero (compared 64 KiB at a time: a marker's
    padding can be most of a segment)."""
    step = len(_ZEROS)
    for i in range(0, len(view), step):
        chunk = view[i : i + step]
        if chunk != _ZEROS[: len(chunk)]:
            return False
    return True


def walk(
    buf: memoryview,
    *,
    start_phys: int,
    segment_bytes: int,
    verify: bool = True,
    topics: dict[bytes, str] | None = None,
) -> Walk:
    """Every whole batch, record and marker in ``buf`` (which starts at physical
    ``start_phys``).

    Stops at the end of the data, at an incomplete item (``error`` None: more bytes may
    come, as in a replication push that ends inside a batch) or at an invalid one
    (``error`` says why and where). Checks framing, lengths, the CRCs (``verify``), that
    a batch's record lengths add up to its length (so a slave never stores a batch it
    could not serve, whatever its CRCs say; with ``verify`` only), the topic name (:func:`understudy_broker.model.check_topic_name`,
    once per distinct name: pass a ``topics`` cache that outlives the call) and that each
    marker fills its segment exactly, with zeros (a marker carries no CRC). Continuity
    (sequence and queue offsets) is the caller's business, because only the caller knows
    where the log stood before ``buf``.

    This is the slave's hot path (every replicated byte goes through it), hence one
    ``unpack_from`` for the CRC and the header together, plain tuples for the results and
    the segment end recomputed only when a boundary is crossed.
    """
    out = Walk(valid_end=start_phys)
    items = out.items
    append = items.append
    n = len(buf)
    pos = 0
    unpack_len_magic = LEN_MAGIC.unpack_from
    unpack_crc_header = CRC_HEADER.unpack_from
    unpack_batch = _PREFIX_BATCH_HEADER.unpack_from
    seg_end = segment_end(start_phys, segment_bytes)
    names = {} if topics is None else topics
    while pos < n:
        phys = start_phys + pos
        if phys >= seg_end:
            seg_end = segment_end(phys, segment_bytes)
        if n - pos < LEN_MAGIC.size:
            break
        size, magic = unpack_len_magic(buf, pos)
        if magic in (BATCH_MAGIC, RECORD_MAGIC):
            least = BATCH_END if magic == BATCH_MAGIC else HEADER_END
            if size < least or size + EOF_MIN > seg_end - phys:
                kind = "batch" if magic == BATCH_MAGIC else "record"
                out.error = f"{kind} at {phys} has impossible length {size}"
                break
            if n - pos < size:
                break
        if magic == BATCH_MAGIC:
            _s, _m, hcrc, seq, qoff, _ts, queue, count, tlen, attrs, rcrc = unpack_batch(buf, pos)
            t0 = pos + BATCH_END
            rstart = t0 + tlen
            end = pos + size
            if rstart + count * BATCH_RECORD_SIZE > end or count < 1 or attrs != 0:
                out.error = f"batch at {phys}: header fields disagree with its length"
                break
            if verify and (crc32(buf[pos + CRC_FROM : rstart]) != hcrc
                           or crc32(buf[rstart:end]) != rcrc):
                out.error = f"batch at {phys} fails its CRC"
                break
            # Unverified (a damaged batch's framing being confirmed), its records are
            # what the damage may have hit; its own length still frames what follows.
            problem = records_problem(buf, rstart, end, count) if verify else None
            if problem is not None:
                out.error = f"batch at {phys}: {problem}"
                break
        elif magic == RECORD_MAGIC:
            crc, seq, qoff, _ts, queue, tlen, klen, blen = unpack_crc_header(buf, pos + 8)
            if verify and crc32(buf[pos + CRC_FROM : pos + size]) != crc:
                out.error = f"record at {phys} fails its CRC"
                break
            if HEADER_END + tlen + max(klen, 0) + blen != size or klen < -1:
                out.error = f"record at {phys}: field lengths disagree with record length"
                break
            t0 = pos + HEADER_END
            count = 1
        elif magic == EOF_MAGIC:
            if size != seg_end - phys or size < EOF_MIN:
                out.error = (
                    f"end-of-file marker at {phys} has length {size}, expected {seg_end - phys}"
                )
                break
            if n - pos < size:
                break
            if not _zeros(buf[pos + EOF_MIN : pos + size]):
                out.error = f"end-of-file marker at {phys}: its padding is not all zeros"
                break
            (_, _, next_seq) = EOF_MARKER.unpack_from(buf, pos)
            append((phys, size, True, next_seq, 0, 0, "", 0))
            pos += size
            out.valid_end = start_phys + pos
            continue
        else:
            out.error = f"bad magic 0x{magic:08x} at {phys}"
            break
        raw = bytes(buf[t0 : t0 + tlen])
        topic = names.get(raw)
        if topic is None:
            try:
                topic = check_topic_name(raw.decode("utf-8"))
            except UnicodeDecodeError:
                out.error = f"item at {phys}: topic is not utf-8"
                break
            except TopicNameError as exc:
                out.error = f"item at {phys}: {exc}"
                break
            names[raw] = topic
        append((phys, size, False, seq, qoff, queue, topic, count))
        pos += size
        out.valid_end = start_phys + pos
    return out
