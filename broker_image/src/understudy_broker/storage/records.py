"""The record format of the commit log, and the one walker over stored bytes.

Why this module exists: the same bytes are written by the master's append, copied by a
slave, checked before a slave accepts them, scanned when a broker recovers and decoded
when a consumer reads. Each of those must agree to the byte on what a record is, so the
layout is defined once, here, as ``struct`` fields, and every pass over stored bytes goes
through :func:`walk`. Pure: no files, no clock, no asyncio.

Record (all big-endian; sizes derived with ``calcsize``)::

    RECORD_PREFIX   total length | magic | crc32 of every byte after the crc field
    RECORD_HEADER   seq | queue offset | timestamp ms | queue | topic len | key len | body len
    topic (utf-8) | key (absent when key len == -1) | body

End-of-file marker (fills the rest of a segment when the next record does not fit)::

    EOF_MARKER      total length (= rest of the segment) | EOF magic | next sequence number
    zero bytes up to the segment end

A record never straddles two segments, so a segment of ``segment_bytes`` always ends with
a marker or exactly at a record's end. The marker carries the next sequence number so a
log whose active segment is empty still knows where the sequence continues.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from understudy_broker.checksum import crc32
from understudy_broker.model import TopicNameError, check_topic_name

RECORD_MAGIC = 0xDAA320A7
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


@dataclass(frozen=True, slots=True)
class StoredRecord:
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
    record, or an end-of-file marker (``is_marker``; then ``seq`` is the next sequence
    number and the other fields are zero)."""

    phys: int
    size: int
    is_marker: bool
    seq: int
    queue_offset: int
    queue: int
    topic: str
    key_hash: int  # crc32 of the key, 0 without one (kept in the per-queue index)


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


def encode_eof_marker(*, length: int, next_seq: int) -> bytes:
    return EOF_MARKER.pack(length, EOF_MAGIC, next_seq) + bytes(length - EOF_MIN)


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
    """Every whole record and marker in ``buf`` (which starts at physical ``start_phys``).

    Stops at the end of the data, at an incomplete item (``error`` None: more bytes may
    come, as in a replication push that ends inside a record) or at an invalid one
    (``error`` says why and where). Checks framing, lengths, the CRC (``verify``), the topic
    name (:func:`understudy_broker.model.check_topic_name`, once per distinct name: pass a
    ``topics`` cache that outlives the call) and that each marker fills its segment
    exactly, with zeros (a marker carries no CRC). Continuity (sequence and queue offsets)
    is the caller's business, because only the caller knows where the log stood before
    ``buf``.

    This is the slave's per-record hot path (every replicated byte goes through it), hence
    one ``unpack_from`` for the CRC and the header together, plain tuples for the results
    and the segment end recomputed only when a boundary is crossed.
    """
    out = Walk(valid_end=start_phys)
    items = out.items
    append = items.append
    n = len(buf)
    pos = 0
    unpack_len_magic = LEN_MAGIC.unpack_from
    unpack_crc_header = CRC_HEADER.unpack_from
    seg_end = segment_end(start_phys, segment_bytes)
    names = {} if topics is None else topics
    while pos < n:
        phys = start_phys + pos
        if phys >= seg_end:
            seg_end = segment_end(phys, segment_bytes)
        if n - pos < LEN_MAGIC.size:
            break
        size, magic = unpack_len_magic(buf, pos)
        if magic == RECORD_MAGIC:
            if size < HEADER_END or size + EOF_MIN > seg_end - phys:
                out.error = f"record at {phys} has impossible length {size}"
                break
            if n - pos < size:
                break
            crc, seq, qoff, _ts, queue, tlen, klen, blen = unpack_crc_header(buf, pos + 8)
            if verify and crc32(buf[pos + CRC_FROM : pos + size]) != crc:
                out.error = f"record at {phys} fails its CRC"
                break
            if HEADER_END + tlen + max(klen, 0) + blen != size or klen < -1:
                out.error = f"record at {phys}: field lengths disagree with record length"
                break
            t0 = pos + HEADER_END
            raw = bytes(buf[t0 : t0 + tlen])
            topic = names.get(raw)
            if topic is None:
                try:
                    topic = check_topic_name(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    out.error = f"record at {phys}: topic is not utf-8"
                    break
                except TopicNameError as exc:
                    out.error = f"record at {phys}: {exc}"
                    break
                names[raw] = topic
            khash = crc32(buf[t0 + tlen : t0 + tlen + klen]) if klen > 0 else 0
            append((phys, size, False, seq, qoff, queue, topic, khash))
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
        else:
            out.error = f"bad magic 0x{magic:08x} at {phys}"
            break
        pos += size
        out.valid_end = start_phys + pos
    return out
