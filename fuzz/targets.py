"""The fuzz targets: one function per target, ``TARGETS[name](data)``, each raising only
when a property is broken (an :class:`AssertionError` or a leaked exception is a crash).

The property every decoder shares: any input either decodes or raises the module's
documented error (``protocol.FrameError``, ``wire.ReplicationProtocolError`` and the
errors the slave's session is written to survive, ``CommitLogError`` subclasses,
``scheduling.ScheduleError``), never another exception: a ``TypeError`` from a handler is
an ``INTERNAL`` answer at best, and in the slave's replication loop it ends replication
for good. The storage targets add the one that matters most: whatever a slave accepts
is stored as valid records, checked against the reference encoder
(:func:`check_stored_log`), and a reopened log recovers exactly it.

Imported by :mod:`fuzz.run` inside ``atheris.instrument_imports``; imports of the broker
go here, not in ``fuzz/__init__.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import struct
import tempfile
import traceback
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from unittest import mock

import atheris

from understudy_broker import protocol as p
from understudy_broker import scheduling as sch
from understudy_broker.model import check_topic_name
from understudy_broker.replication import master as rmaster
from understudy_broker.replication import wire
from understudy_broker.replication.slave import ReplicationClient
from understudy_broker.storage import records as rec
from understudy_broker.storage.commitlog import CommitLog, FlushPolicy

Target = Callable[[bytes], None]

#: The smallest segment a log accepts: small inputs cross segment boundaries.
SEGMENT = 4096

# ------------------------------------------------------------------ frames


def _decode_stream(data: bytes, max_frame: int, cuts: Sequence[int]
                   ) -> tuple[list[p.Frame], p.FrameError | None, int]:
    """Feed ``data`` cut at ``cuts``; the frames, the error (if any), bytes consumed."""
    dec = p.FrameDecoder(max_frame)
    frames: list[p.Frame] = []
    consumed = 0
    start = 0
    for end in [*cuts, len(data)]:
        dec.feed(data[start:end])
        start = end
        try:
            while isinstance(frame := dec.next_frame(), p.Frame):
                frames.append(frame)
                consumed += p.HEADER_SIZE + len(frame.body)
        except p.FrameError as exc:
            for again in (dec.next_frame, lambda: dec.feed(b"x")):
                try:  # a failed decoder refuses further use, with the same error
                    again()
                except p.FrameError as same:
                    if same is not exc:
                        raise AssertionError("a failed decoder raised another error") from same
                else:
                    raise AssertionError("a failed decoder accepted more use")
            return frames, exc, consumed
        if dec.buffered >= p.HEADER_SIZE:
            # NEED_DATA with a whole header buffered: the announced frame is within the
            # limit (a larger announcement must fail before any body byte is kept).
            length = struct.unpack_from(">I", data, consumed + 20)[0]
            assert p.HEADER_SIZE + length <= max_frame, "announced size over the limit kept"
    return frames, None, consumed


def frames(data: bytes) -> None:
    """``FrameDecoder`` over any byte stream, whole and in chunks: only ``FrameError``; each
    frame is exactly the bytes it was decoded from; chunking changes nothing."""
    if len(data) < 2:
        return
    max_frame = p.HEADER_SIZE + data[0] * 8
    step = data[1] + 1
    stream = data[2:]
    whole, error, consumed = _decode_stream(stream, max_frame, ())
    pos = 0
    for f in whole:
        raw = p.encode_frame(request_id=f.request_id, op=f.op, body=f.body, status=f.status,
                             flags=f.flags, epoch=f.epoch)
        assert stream[pos:pos + len(raw)] == raw, "a frame is not the bytes it came from"
        pos += len(raw)
    assert pos == consumed
    cut, cerror, _ = _decode_stream(stream, max_frame, range(step, len(stream), step))
    assert cut == whole, "chunked input decoded to other frames"
    assert (error is None) == (cerror is None), "chunked input failed differently"
    if error is not None and cerror is not None:
        assert (error.code, error.request_id) == (cerror.code, cerror.request_id)


# ------------------------------------------------------------------ bodies

_PROTOCOL_ERRORS: tuple[type[BaseException], ...] = (p.FrameError,)
_HELLO_ERRORS: tuple[type[BaseException], ...] = (
    wire.ReplicationProtocolError, asyncio.IncompleteReadError)

_LOOP = asyncio.new_event_loop()


def _read_hello(data: bytes) -> str:
    """The master's handshake read (``master._read_hello``) over ``data`` then EOF."""
    reader = asyncio.StreamReader(loop=_LOOP)
    reader.feed_data(data)
    reader.feed_eof()
    return _LOOP.run_until_complete(rmaster._read_hello(reader))


def _decoders() -> list[tuple[str, Callable[[bytes], object], tuple[type[BaseException], ...]]]:
    out: list[tuple[str, Callable[[bytes], object], tuple[type[BaseException], ...]]] = []
    for kind, types in (("request", p.REQUEST_TYPES), ("response", p.RESPONSE_TYPES)):
        for op, cls in sorted(types.items()):
            decode: Callable[[bytes], object] = cls.decode  # type: ignore[attr-defined]
            out.append((f"{kind} {op.name}", decode, _PROTOCOL_ERRORS))
    out += [
        ("decode_produce_full", p.decode_produce_full, _PROTOCOL_ERRORS),
        ("decode_produce_batches", p.decode_produce_batches, _PROTOCOL_ERRORS),
        ("schedule record", sch.decode, (sch.ScheduleError,)),
        ("retry envelope", sch.decode_retry, (sch.ScheduleError,)),
        ("replication metadata", wire.decode_metadata, (wire.ReplicationProtocolError,)),
        ("replication hello", _read_hello, _HELLO_ERRORS),
    ]
    return out


#: ``(name, decode, the errors it documents)``; a body target's first byte picks one.
DECODERS = _decoders()


def decoder_index(name: str) -> int:
    return next(i for i, (n, _d, _e) in enumerate(DECODERS) if n == name)


def _roundtrip(name: str, value: Any) -> None:
    """The binary data bodies re-encode to what decodes to the same value."""
    if isinstance(value, p.ProduceRequest | p.PullRequest | p.PullResponse | p.ProduceResponse):
        assert type(value).decode(value.encode()) == value, f"{name} does not round-trip"
    elif name == "decode_produce_full":
        # (topic, messages, lease, deliver_at, ...trailers): all-zero delivery times are
        # the same as none, and are not written.
        fields = tuple(value)
        produce = tuple(p.decode_produce_full(p.encode_produce(*fields)))
        deliver = fields[3] if fields[3] and any(fields[3]) else None
        assert produce == (*fields[:3], deliver, *fields[4:]), "a produce does not round-trip"
    elif name == "decode_produce_batches":
        # Every well-formed batch-form body is the one encoding of its messages: each
        # batch a run of one queue (two batches of one queue in a row re-encode as one).
        fields = tuple(value)
        messages = p.batch_messages(value)
        queues = [b[0] for b in value.batches]
        if all(a != b for a, b in itertools.pairwise(queues)):
            deliver = fields[4] if fields[4] and any(fields[4]) else None
            again = p.decode_produce_batches(p.encode_produce_batches(
                fields[0], messages, fields[3], deliver, fields[5]))
            assert again == value._replace(deliver_at=deliver), \
                "a batch-form produce does not round-trip"
    elif name == "replication metadata":
        frame = wire.encode_metadata(*value)
        metadata = wire.decode_metadata(frame[wire.PUSH_HEADER.size:])
        assert wire.encode_metadata(*metadata) == frame, "metadata does not round-trip"


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _decode_checked(index: int, body: bytes) -> None:
    name, decode, errors = DECODERS[index % len(DECODERS)]
    try:
        value = decode(body)
    except errors:
        return
    except Exception as exc:
        raise AssertionError(f"{name}: {type(exc).__name__} leaked instead of "
                             f"{errors[0].__name__}:\n{_trace(exc)}") from exc
    _roundtrip(name, value)


def bodies(data: bytes) -> None:
    """Every body decoder (the first byte picks it) on any bytes: only its documented
    error; the binary data bodies round-trip."""
    if data:
        _decode_checked(data[0], data[1:])


#: Field names the JSON bodies read: a JSON-aware target builds objects from these.
_JSON_KEYS = sorted({
    "action", "add_groups", "address", "backlog", "broker", "changed", "committed",
    "consumeHead", "created", "data", "delayMs", "dueMs", "end", "epoch", "escaped",
    "force", "generation", "group", "groups", "join", "known_version", "max_phys",
    "maxReconsume", "member", "members", "moved", "name", "offset", "offsets", "ordered",
    "owned", "owners", "permission", "placement", "producer", "queue", "queues",
    "queues_per_group", "reachable", "reconsume", "released", "remove_groups", "revoking",
    "role", "sendHead", "sender", "session_timeout_ms", "start", "topic", "topics",
    "version", "wait_ms", "backsync_epoch",
})
_JSON_DECODERS = [i for i, (n, _d, _e) in enumerate(DECODERS)
                  if n != "replication hello" and (n == "replication metadata" or (
                      n.split()[0] in ("request", "response")
                      and n.split()[1] not in ("PRODUCE", "PULL")))]


#: Stands for a number of 5000 digits: ``json.dumps`` cannot write one (Python's digit
#: limit), so :func:`json_bodies` spells it into the text.
_HUGE = "<huge number>"


def _json_value(fdp: atheris.FuzzedDataProvider, depth: int) -> Any:
    kind = fdp.ConsumeIntInRange(0, 10 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-3, 3)
    if kind == 3:  # large, negative, and past int() digit limits
        return fdp.PickValueInList([2**31, 2**62, 2**63, 2**64, -(2**63), _HUGE])
    if kind == 4:
        return fdp.PickValueInList(["t", "orders", "", "0", "-1", "1_0", " 7", "%x",
                                    "a/b", "g1", "m", "x" * 300, "9" * 5000])
    if kind == 5:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if kind == 6:
        return fdp.ConsumeFloat()
    if kind in (7, 8):
        return [_json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return _json_object(fdp, depth + 1)


def _json_object(fdp: atheris.FuzzedDataProvider, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        key = (fdp.PickValueInList(_JSON_KEYS) if fdp.ConsumeBool()
               else str(fdp.ConsumeIntInRange(-2, 70000)))
        out[key] = _json_value(fdp, depth)
    return out


def json_bodies(data: bytes) -> None:
    """The JSON-bodied decoders on objects built from their own field names with values
    of every JSON type (huge numbers, numeric strings, nesting): only the documented
    error."""
    fdp = atheris.FuzzedDataProvider(data)
    index = _JSON_DECODERS[fdp.ConsumeIntInRange(0, len(_JSON_DECODERS) - 1)]
    body = json.dumps(_json_object(fdp, 0)).replace(f'"{_HUGE}"', "9" * 5000).encode()
    _decode_checked(index, body)


# ------------------------------------------------------------------ storage

_TMP_ROOT = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None


@contextmanager
def fresh_log(*, segment_bytes: int = SEGMENT) -> Iterator[CommitLog]:
    """An empty commit log in a temporary directory, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="understudy-fuzz-", dir=_TMP_ROOT))
    log = CommitLog.open(path, segment_bytes=segment_bytes, flush=FlushPolicy("interval"))
    try:
        yield log
    finally:
        log.close()
        shutil.rmtree(path, ignore_errors=True)


def log_bytes(log: CommitLog) -> bytes:
    """Every byte of ``log`` from its start (``read_raw`` stops at segment ends)."""
    out = bytearray()
    pos = log.min_phys
    while pos < log.max_phys:
        chunk = log.read_raw(pos, log.max_phys - pos)
        out += chunk
        pos += len(chunk)
    return bytes(out)


def check_stored(buf: bytes, *, segment_bytes: int, start_phys: int = 0, first_seq: int = 0,
                 ends: dict[tuple[str, int], int] | None = None) -> int:
    """The reference check of stored bytes, independent of :func:`records.walk`: every
    batch (record) is byte for byte what :func:`records.encode_batch`
    (:func:`records.encode_record`) makes of its decoded messages (lengths, CRCs, topic
    name), sequence numbers and queue offsets go up by one a message,
    every end-of-file marker is :func:`records.encode_eof_marker` of the rest of its
    segment with the next sequence number. Returns the next sequence number; ``ends``
    (queue offsets per queue) is updated in place."""
    view = memoryview(buf)
    queue_ends = {} if ends is None else ends
    seq = first_seq
    pos = 0
    while pos < len(buf):
        phys = start_phys + pos
        seg_end = rec.segment_end(phys, segment_bytes)
        assert len(buf) - pos >= rec.LEN_MAGIC.size, f"stored bytes end inside an item at {phys}"
        _size, magic = rec.LEN_MAGIC.unpack_from(buf, pos)
        if magic == rec.EOF_MAGIC:
            marker = rec.encode_eof_marker(length=seg_end - phys, next_seq=seq)
            assert buf[pos:pos + len(marker)] == marker, f"bad end-of-file marker at {phys}"
            pos += len(marker)
            continue
        assert magic in (rec.RECORD_MAGIC, rec.BATCH_MAGIC), \
            f"stored item at {phys} has magic {magic:#x}"
        try:
            head, records, _used = rec.decode_item(view, pos, phys)
        except (rec.CorruptRecordError, UnicodeDecodeError) as exc:
            raise AssertionError(f"stored item at {phys} does not decode: {exc}") from exc
        check_topic_name(head.topic)
        ident = (head.topic, head.queue)
        assert (head.seq, head.queue_offset) == (seq, queue_ends.get(ident, 0)), \
            f"stored item at {phys}: seq/offset {head.seq}/{head.queue_offset} out of order"
        assert [(r.seq, r.queue_offset) for r in records] == [
            (head.seq + i, head.queue_offset + i) for i in range(head.messages)]
        messages = [rec.Message(r.topic, r.queue, r.key, r.body, r.timestamp_ms)
                    for r in records]
        if magic == rec.BATCH_MAGIC:
            raw = rec.encode_batch(seq=head.seq, queue_offset=head.queue_offset,
                                   messages=messages)
        else:
            raw = b"".join(rec.encode_record(seq=head.seq, queue_offset=head.queue_offset,
                                             message=messages[0],
                                             topic_raw=head.topic.encode()))
        assert buf[pos:pos + head.size] == raw, f"stored item at {phys} is not its encoding"
        assert phys + head.size + rec.EOF_MIN <= seg_end, \
            f"stored item at {phys} leaves no room for a marker"
        queue_ends[ident] = head.queue_offset + head.messages
        seq += head.messages
        pos += head.size
    return seq


def check_stored_log(log: CommitLog) -> None:
    """:func:`check_stored` over the whole log, then the log reopened from its files
    recovers the same end, sequence and queues, and serves every record."""
    ends: dict[tuple[str, int], int] = {}
    next_seq = check_stored(log_bytes(log), segment_bytes=log.segment_bytes, ends=ends)
    assert log.next_seq == next_seq
    for (topic, queue), end in ends.items():
        assert log.queue_end(topic, queue) == end
    log.flush()
    again = CommitLog.open(log.directory, segment_bytes=log.segment_bytes,
                           flush=FlushPolicy("interval"))
    try:
        assert (again.max_phys, again.next_seq) == (log.max_phys, log.next_seq), \
            "a reopened log recovered another end"
        for (topic, queue), end in ends.items():
            assert again.queue_end(topic, queue) == end
            got = again.read(topic, queue, 0, max_bytes=1 << 30, max_records=end + 1)
            assert [r.queue_offset for r in got] == list(range(end))
    finally:
        again.close()


#: Messages a master appends before the fuzzed bytes, so continuity checks have a past.
PRELUDE: list[rec.RecordTuple] = [
    ("t", i % 2, None if i % 3 else b"k%d" % i, b"body-%d" % i, 1_700_000_000_000 + i)
    for i in range(8)
]


def walk_target(data: bytes) -> None:
    """:func:`records.walk` over any bytes: never raises; what it accepts is contiguous,
    passes the reference check (at its sequence numbers) and walks the same again when
    cut where it stopped."""
    if len(data) < 2:
        return
    segment_bytes = (data[0] + 1) * 64
    start = data[1] * 16
    buf = memoryview(data[2:])
    w = rec.walk(buf, start_phys=start, segment_bytes=segment_bytes)
    pos = start
    for phys, size, is_marker, seq, qoff, queue, topic, _count in w.items:
        assert phys == pos, "walk skipped bytes"
        # Continuity is the caller's check: each item is checked on its own.
        check_stored(bytes(buf[phys - start:phys - start + size]), segment_bytes=segment_bytes,
                     start_phys=phys, first_seq=seq,
                     ends={} if is_marker else {(topic, queue): qoff})
        pos += size
    assert w.valid_end == pos
    again = rec.walk(buf[:pos - start], start_phys=start, segment_bytes=segment_bytes)
    assert again.items == w.items, "walk disagrees with itself"
    assert again.error is None


def replicated(data: bytes) -> None:
    """``CommitLog.append_replicated`` on any bytes after a short master-written prefix
    (the first byte says how many records): only ``CommitLogError``; the log holds valid
    records only, and a reopened log recovers them."""
    if not data:
        return
    with fresh_log() as log:
        log.append(PRELUDE[:data[0] % (len(PRELUDE) + 1)])
        with suppress(rec.CommitLogError):
            log.append_replicated(log.max_phys, data[1:])
        check_stored_log(log)


def master_stream(messages: Sequence[rec.RecordTuple], *, skip: int = 0) -> bytes:
    """The bytes a master's log holds after appending ``messages`` (from record ``skip``
    on): what it would push to a slave."""
    with fresh_log() as log:
        log.append(messages[:skip])
        start = log.max_phys
        log.append(messages[skip:])
        return log_bytes(log)[start:]


_TOPICS = ["t", "orders", "q" * 200, "", "a/b", "..", "é", "t\x00"]


def _mutate(fdp: atheris.FuzzedDataProvider, buf: bytearray) -> None:
    """One mutation of a record stream: a byte flipped, a field overwritten, a cut, a
    slice repeated or dropped."""
    kind = fdp.ConsumeIntInRange(0, 4)
    at = fdp.ConsumeIntInRange(0, max(0, len(buf) - 1))
    if kind == 0 and buf:
        buf[at] ^= 1 << fdp.ConsumeIntInRange(0, 7)
    elif kind == 1:
        width = fdp.PickValueInList([1, 2, 4, 8])
        value = fdp.ConsumeInt(width * 8) & ((1 << (width * 8)) - 1)
        buf[at:at + width] = value.to_bytes(width, "big")
    elif kind == 2:
        del buf[at:]
    elif kind == 3:
        n = fdp.ConsumeIntInRange(1, 64)
        buf[at:at] = buf[at:at + n]
    else:
        del buf[at:at + fdp.ConsumeIntInRange(1, 64)]


def fix_crcs(buf: bytearray) -> None:
    """Recompute the CRCs of every item that still looks like a batch or a record, so
    mutations reach the checks behind the CRCs (lengths, names, continuity)."""
    pos = 0
    while pos + rec.HEADER_END <= len(buf):
        size, magic = rec.LEN_MAGIC.unpack_from(buf, pos)
        if magic == rec.BATCH_MAGIC and size >= rec.BATCH_END and pos + size <= len(buf):
            tlen = rec.BATCH_HEADER.unpack_from(buf, pos + rec.PREFIX_SIZE)[5]
            rstart = min(pos + rec.BATCH_END + tlen, pos + size)
            struct.pack_into(">I", buf, rec.BATCH_END - 4 + pos,
                             zlib.crc32(memoryview(buf)[rstart:pos + size]))
            struct.pack_into(">I", buf, pos + 8,
                             zlib.crc32(memoryview(buf)[pos + rec.CRC_FROM:rstart]))
            pos += size
            continue
        if magic != rec.RECORD_MAGIC or size < rec.HEADER_END or pos + size > len(buf):
            pos += max(size, rec.LEN_MAGIC.size) if magic == rec.EOF_MAGIC else 1
            continue
        crc = zlib.crc32(memoryview(buf)[pos + rec.CRC_FROM:pos + size])
        struct.pack_into(">I", buf, pos + 8, crc)
        pos += size


def _first_topic_of_length(stream: bytearray, length: int) -> int | None:
    """Where the topic of the first batch of ``stream`` whose topic is ``length`` bytes
    long starts (None: no such batch before the first item that does not frame)."""
    pos = 0
    while pos + rec.BATCH_END <= len(stream):
        size, magic = rec.LEN_MAGIC.unpack_from(stream, pos)
        if magic == rec.BATCH_MAGIC and rec.BATCH_HEADER.unpack_from(
                stream, pos + rec.PREFIX_SIZE)[5] == length:
            return pos + rec.BATCH_END
        if size < rec.LEN_MAGIC.size:
            return None
        pos += size
    return None


def replicated_structured(data: bytes) -> None:
    """Structure-aware: a master's real record stream (names valid and not, keys, bodies
    and segment rolls), mutated a few times with CRCs recomputed, then fed to a slave's
    log in pieces as pushes arrive: only ``CommitLogError``; valid records only."""
    fdp = atheris.FuzzedDataProvider(data)
    skip = fdp.ConsumeIntInRange(0, 3)
    messages: list[rec.RecordTuple] = []
    for i in range(fdp.ConsumeIntInRange(1, 14)):
        topic = fdp.PickValueInList(_TOPICS[:3])
        key = None if fdp.ConsumeBool() else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 8))
        body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 900)) if fdp.ConsumeBool() else (
            bytes([fdp.ConsumeIntInRange(0, 255)]) * fdp.ConsumeIntInRange(0, 2000))
        messages.append((topic, fdp.ConsumeIntInRange(0, 2), key, body, i))
    stream = bytearray(master_stream(messages, skip=skip))
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        _mutate(fdp, stream)
    if fdp.ConsumeBool():
        # A name the codec refuses, spelled into the first batch whose name has its length.
        bad = fdp.PickValueInList(_TOPICS[3:]).encode()
        pos = _first_topic_of_length(stream, len(bad))
        if pos is not None:
            stream[pos:pos + len(bad)] = bad
    if fdp.ConsumeBool():
        fix_crcs(stream)
    cuts = sorted({fdp.ConsumeIntInRange(0, len(stream)) for _ in range(fdp.ConsumeIntInRange(0, 3))})
    with fresh_log() as log:
        log.append(messages[:skip])
        pending = b""
        start = 0
        try:
            for end in [*cuts, len(stream)]:
                piece = pending + bytes(stream[start:end])
                start = end
                before = log.max_phys
                after = log.append_replicated(before, piece)
                pending = piece[after - before:]
        except rec.CommitLogError:
            pass
        check_stored_log(log)


# ------------------------------------------------------------------ replication link


class _Writer:
    """The slave's side of the socket: what it writes is dropped."""

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


#: What ``ReplicationClient.run`` survives: anything else ends replication for good.
SESSION_ERRORS: tuple[type[BaseException], ...] = (
    asyncio.IncompleteReadError, ConnectionError, OSError, TimeoutError,
    wire.ReplicationError, rec.CommitLogError)


def replication(data: bytes) -> None:
    """A slave's whole session (``ReplicationClient._session``) reading ``data`` as the
    master's byte stream (pushes and metadata frames, then EOF) into an empty log: only
    the errors its reconnect loop handles; the log holds valid records only."""
    metadata: list[dict[str, Any]] = []

    async def connect(*_args: Any, **_kw: Any) -> tuple[asyncio.StreamReader, _Writer]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return reader, _Writer()

    with fresh_log() as log:
        client = ReplicationClient(log, master_host="127.0.0.1", master_port=1, name="fuzz",
                                   on_metadata=metadata.append, on_append=lambda: None,
                                   link_timeout_s=5.0)
        try:
            with mock.patch.object(asyncio, "open_connection", connect):
                _LOOP.run_until_complete(client._session())
        except SESSION_ERRORS:
            pass
        except Exception as exc:
            raise AssertionError(
                f"the slave's session raised {type(exc).__name__}: its reconnect loop "
                f"does not handle that, so replication would stop for good:\n{_trace(exc)}"
            ) from exc
        assert all(isinstance(m, dict) for m in metadata)
        check_stored_log(log)


TARGETS: dict[str, Target] = {
    "frames": frames,
    "bodies": bodies,
    "json_bodies": json_bodies,
    "replication": replication,
    "walk": walk_target,
    "replicated": replicated,
    "replicated_structured": replicated_structured,
}
