"""The broker wire protocol: frames, operation and status codes, typed bodies.

Why this module exists: the broker, the client library, the benchmarks and the tests all
speak this protocol, and a malformed frame from any peer must be caught in one place
with one clear error. The codec is pure (in the manner of h11): no sockets, no asyncio,
no clock. Transport code feeds bytes into a :class:`FrameDecoder` and takes
:class:`Frame` objects out, or :data:`NEED_DATA` when a frame is still incomplete.

Frame layout (big-endian, one frame per request or response)::

    offset size field
    0      2    magic        0x5553 ("US")
    2      1    version      1
    3      1    flags        bit 0: response; other bits reserved (0)
    4      4    request_id   chosen by the requester, echoed in the response
    8      2    op           operation code (requests and responses both carry it)
    10     2    status       status code; 0 (OK) in every request
    12     8    epoch        the sender's view of the group epoch; 0 = unknown
    20     4    body_length  bytes of body that follow the header
    24     4    body_crc     CRC-32 (zlib) of the body
    28     ...  body

The maximum frame size is checked as soon as the 28-byte header is complete, before a
single body byte is buffered: a peer that announces 4 GiB gets ``TOO_LARGE`` and no
allocation. Data bodies (produce batches, pull responses) are compact binary; control
bodies (topics, offsets, routes, heartbeats) are JSON. An error response carries a UTF-8
message as its body.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, NamedTuple, Self

from understudy_broker.checksum import crc32
from understudy_broker.model import TopicNameError, check_topic_name, normalize_snapshot
from understudy_broker.storage import records as stored_format

MAGIC: Final = 0x5553
VERSION: Final = 1
FLAG_RESPONSE: Final = 0x01
DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024

HEADER = struct.Struct(
    ">"
    "H"  # magic: 0x5553, rejects peers that are not speaking this protocol
    "B"  # version: 1
    "B"  # flags: bit 0 = response
    "I"  # request_id: echoed by the response; lets one connection pipeline requests
    "H"  # op: Op code
    "H"  # status: Status code (0 in requests)
    "Q"  # epoch: sender's view of the group epoch, 0 = unknown (accept)
    "I"  # body_length: bytes after the header
    "I"  # body_crc: zlib.crc32 of the body
)
HEADER_SIZE: Final = HEADER.size  # 28


class Op(enum.IntEnum):
    """Operation codes. 8-31 are reserved for the HA issue and later additions."""

    CREATE_TOPIC = 1
    PRODUCE = 2
    PULL = 3
    COMMIT_OFFSET = 4
    FETCH_OFFSET = 5
    GET_ROUTE = 6
    HEARTBEAT = 7
    BACKSYNC_OFFSETS = 8  # the acting slave pushes its consumer offsets to the master
    GET_STATUS = 9  # reserved: the controller reads a broker's status
    ADMIN_TOPIC = 10  # create, alter or delete a cluster topic (/topics/<t>)
    QUEUE_STATS = 11  # per queue: log start/end and every consumer group's committed offset
    MEMBER_HEARTBEAT = 12  # join / stay in a consumer group; answers the member's queues
    LEAVE_GROUP = 13  # a member leaves cleanly (after committing)
    DESCRIBE_GROUP = 14  # a consumer group's members and assignment
    LIST_GROUPS = 15  # every consumer group under the chroot
    NACK = 16  # a member hands a message back: redelivered after a delay, or dead-lettered
    AUTHENTICATE = 17  # one SCRAM step (docs/security.md); the connection's user once done
    SECURITY_ADMIN = 18  # users and ACLs: create, delete, list; add, remove, list; whoami
    PRODUCE_MULTI = 19  # several PRODUCE bodies (one per topic) in one request, one answer each
    PULL_MULTI = 20  # several PULLs (one per queue) in one long poll, one answer each
    PRODUCE_BATCH = 21  # PRODUCE in batch form: each queue's records packed as stored
    PRODUCE_MULTI_BATCH = 22  # PRODUCE_MULTI whose parts are in batch form
    PULL_BATCH = 23  # PULL answered with the stored batches themselves
    PULL_MULTI_BATCH = 24  # PULL_MULTI whose parts are answered as PULL_BATCH's


class Status(enum.IntEnum):
    """Response status codes."""

    OK = 0
    NO_PERMISSION = 1
    NOT_MASTER = 2
    UNKNOWN_TOPIC = 3
    BAD_FRAME = 4
    TOO_LARGE = 5
    STALE_EPOCH = 6
    TIMEOUT = 7
    NOT_ENOUGH_REPLICAS = 8
    UNKNOWN_OPERATION = 9
    INTERNAL = 10
    BAD_REQUEST = 11  # a well-formed frame whose content is invalid (bad queue, ...)
    NOT_OWNER = 12  # a pull or commit by a member that does not own the queue (invariant 6)
    UNKNOWN_MEMBER = 13  # the member's session expired or it never joined: rejoin
    UNSUPPORTED = 14  # the broker runs without ZooKeeper: no cluster topics or consumer groups
    CONFLICT = 15  # the topic exists (create), or changed while being altered
    NOT_SEND_HEAD = 16  # a write to an ordered topic on a group that is not its send head
    STORAGE_FULL = 17  # the broker's disk is full: nothing of the request was stored
    CORRUPT_RECORD = 18  # the record at this offset is damaged here: never served (final)
    BUSY = 19  # the broker is at a limit (client connections): nothing was done, retry
    AUTHENTICATION_FAILED = 20  # unknown user, wrong password, or not authenticated yet
    NOT_AUTHORIZED = 21  # the connection's user holds no ACL for this: nothing was done


#: Refusals that mean "not the broker for this now": the client's route is stale (or the
#: group has no writer yet); a re-route answers them, they say nothing about latency.
ROUTING: Final = frozenset({Status.NO_PERMISSION, Status.NOT_MASTER, Status.STALE_EPOCH,
                            Status.NOT_SEND_HEAD})

#: Statuses after which a client should re-route and retry.
RETRIABLE: Final = frozenset(
    {
        Status.NO_PERMISSION,
        Status.NOT_MASTER,
        Status.STALE_EPOCH,
        Status.NOT_SEND_HEAD,
        Status.TIMEOUT,
        Status.NOT_ENOUGH_REPLICAS,
        Status.INTERNAL,
        Status.STORAGE_FULL,
        Status.BUSY,
    }
)


class FrameError(Exception):
    """A frame or body that cannot be accepted. ``code`` is the status to answer with;
    ``request_id`` is known when the header was readable."""

    def __init__(self, code: Status, message: str, *, request_id: int | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame. ``body`` is a view into the decoder's copy of the bytes."""

    request_id: int
    op: int
    status: int
    flags: int
    epoch: int
    body: bytes

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)


class _NeedData:
    """Sentinel type for :data:`NEED_DATA`."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


def encode_frame(
    *,
    request_id: int,
    op: int,
    body: bytes = b"",
    status: int = Status.OK,
    flags: int = 0,
    epoch: int = 0,
) -> bytes:
    """Header plus body, ready to write to a socket."""
    return (
        HEADER.pack(
            MAGIC, VERSION, flags, request_id, op, status, epoch, len(body), crc32(body)
        )
        + body
    )


def encode_response(
    request: Frame, *, status: int = Status.OK, body: bytes = b"", epoch: int = 0
) -> bytes:
    """A response frame to ``request`` (same request id and op)."""
    return encode_frame(
        request_id=request.request_id,
        op=request.op,
        status=status,
        flags=FLAG_RESPONSE,
        epoch=epoch,
        body=body,
    )


def encode_error(
    *, request_id: int, op: int, status: Status, message: str, epoch: int = 0
) -> bytes:
    """An error response whose body is a UTF-8 message."""
    return encode_frame(
        request_id=request_id,
        op=op,
        status=status,
        flags=FLAG_RESPONSE,
        epoch=epoch,
        body=message.encode("utf-8", "replace"),
    )


class FrameDecoder:
    """Incremental frame decoder: ``feed(data)``, then call ``next_frame()`` until it
    returns :data:`NEED_DATA`.

    After a :class:`FrameError` the stream is out of sync and the decoder refuses
    further use; the transport answers the error and closes the connection.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < HEADER_SIZE:
            raise ValueError(f"max_frame_bytes must be at least {HEADER_SIZE}")
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0
        self._failed: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos

    def pending(self) -> tuple[int, int] | None:
        """``(op, total bytes)`` of the incomplete frame at the head of the buffer once its
        header has arrived (after :meth:`next_frame` returned :data:`NEED_DATA`, so the
        header was checked), else None: a server can budget a frame before its body."""
        if len(self._buf) - self._pos < HEADER_SIZE or self._failed is not None:
            return None
        _m, _v, _f, _rid, op, _s, _e, length, _crc = HEADER.unpack_from(self._buf, self._pos)
        return op, HEADER_SIZE + length

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._failed is not None:
            raise self._failed
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_frame(self) -> Frame | _NeedData:
        if self._failed is not None:
            raise self._failed
        try:
            return self._next()
        except FrameError as exc:
            self._failed = exc
            raise

    def _next(self) -> Frame | _NeedData:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            # Reject a stranger (an HTTP probe, garbage) as soon as the magic is visible.
            if len(buf) - pos >= 2 and _U16.unpack_from(buf, pos)[0] != MAGIC:
                raise FrameError(Status.BAD_FRAME, "bad magic: not an Understudy frame")
            return NEED_DATA
        magic, version, flags, rid, op, status, epoch, length, crc = HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            raise FrameError(Status.BAD_FRAME, f"bad magic 0x{magic:04x}, expected 0x{MAGIC:04x}")
        if version != VERSION:
            raise FrameError(
                Status.BAD_FRAME,
                f"unsupported protocol version {version}, expected {VERSION}",
                request_id=rid,
            )
        if HEADER_SIZE + length > self.max_frame_bytes:
            raise FrameError(
                Status.TOO_LARGE,
                f"frame of {HEADER_SIZE + length} bytes exceeds the limit of "
                f"{self.max_frame_bytes} bytes",
                request_id=rid,
            )
        end = pos + HEADER_SIZE + length
        if len(buf) < end:
            return NEED_DATA
        body = bytes(memoryview(buf)[pos + HEADER_SIZE : end])
        if crc32(body) != crc:
            raise FrameError(Status.BAD_FRAME, "body CRC mismatch", request_id=rid)
        self._pos = end
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > 1 << 20:
            del buf[:end]
            self._pos = 0
        return Frame(rid, op, status, flags, epoch, body)


# --------------------------------------------------------------------------- bodies

_U16 = struct.Struct(">H")  # length of a short string (topic name)
_U64 = struct.Struct(">Q")
_PRODUCE_HEAD = struct.Struct(
    ">"
    "I"  # message count
)
_PRODUCE_MSG = struct.Struct(
    ">"
    "H"  # queue
    "i"  # key length, -1 = no key
    "I"  # body length
)
_OFFSETS_HEAD = struct.Struct(">I")  # count of (queue, offset) pairs
_OFFSET_ENTRY = struct.Struct(
    ">"
    "H"  # queue
    "Q"  # queue offset assigned to the message
)
_PULL_REQ = struct.Struct(
    ">"
    "H"  # queue
    "Q"  # first queue offset wanted
    "I"  # max bytes of record bodies+keys in the response (at least one record is sent)
    "I"  # max wait in ms when nothing is available (long poll)
)
_PULL_RESP_HEAD = struct.Struct(
    ">"
    "Q"  # next offset to ask for
    "Q"  # queue start (oldest retained offset)
    "Q"  # queue end (next offset to be written)
    "I"  # record count
)
_PULL_RECORD = struct.Struct(
    ">"
    "Q"  # queue offset
    "q"  # timestamp, ms since the epoch
    "i"  # key length, -1 = no key
    "I"  # body length
)
MAX_QUEUES: Final = 0xFFFF


def pulled_frame_bytes(key: bytes | None, body: bytes) -> int:
    """The size of the PULL answer frame that carries this one message: a broker refuses
    at produce a message no consumer with its frame limit could ever receive."""
    return (HEADER_SIZE + _PULL_RESP_HEAD.size + _PULL_RECORD.size
            + (len(key) if key is not None else 0) + len(body))


def _bad(message: str) -> FrameError:
    return FrameError(Status.BAD_FRAME, message)


class _Reader:
    """Bounds-checked reads from a body; every overrun is a BAD_FRAME."""

    __slots__ = ("_data", "_pos", "_view")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._view = memoryview(data)
        self._pos = 0

    @property
    def pos(self) -> int:
        return self._pos

    @property
    def data(self) -> bytes:
        return self._data

    def seek(self, pos: int) -> None:
        self._pos = pos

    def unpack(self, st: struct.Struct) -> tuple[Any, ...]:
        if self._pos + st.size > len(self._data):
            raise _bad("body truncated")
        values = st.unpack_from(self._data, self._pos)
        self._pos += st.size
        return values

    def take(self, n: int) -> bytes:
        if n < 0 or self._pos + n > len(self._data):
            raise _bad("body truncated")
        out = bytes(self._view[self._pos : self._pos + n])
        self._pos += n
        return out

    def string(self) -> str:
        (n,) = self.unpack(_U16)
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("string is not UTF-8") from None

    def end(self) -> None:
        if self._pos != len(self._data):
            raise _bad(f"{len(self._data) - self._pos} unexpected trailing bytes")


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _U16.pack(len(raw)) + raw


def _json_body(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(f"body is not JSON: {exc}") from None
    except RecursionError:  # bad input, not a broker fault: a final answer, not INTERNAL
        raise _bad("body is not JSON this broker accepts: nested too deeply") from None
    if not isinstance(data, dict):
        raise _bad("JSON body must be an object")
    return data


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise _bad(f"missing field {name!r}")
    value = data[name]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise _bad(f"field {name!r} has the wrong type")
    return value


def _topic_name(data: Mapping[str, Any]) -> str:
    topic: str = _field(data, "topic", str)
    validate_topic(topic)
    return topic


def validate_topic(topic: str) -> None:
    """The one topic-name rule (:func:`understudy_broker.model.check_topic_name`), answered
    ``BAD_REQUEST``: a name the log would refuse is refused at the door."""
    try:
        check_topic_name(topic)
    except TopicNameError as exc:
        raise FrameError(Status.BAD_REQUEST, str(exc)) from None


def _queue(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUEUES:
        raise _bad(f"invalid queue {value!r}")
    return value


def _offset(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise _bad(f"invalid offset {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    topic: str
    queues: int

    def encode(self) -> bytes:
        return _json_body({"topic": self.topic, "queues": self.queues})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        queues = _field(data, "queues", int)
        if not 1 <= queues <= MAX_QUEUES:
            raise FrameError(Status.BAD_REQUEST, f"queue count must be 1-{MAX_QUEUES}")
        return cls(_topic_name(data), queues)


@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    topic: str
    queues: int
    created: bool

    def encode(self) -> bytes:
        return _json_body({"topic": self.topic, "queues": self.queues, "created": self.created})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_topic_name(data), _field(data, "queues", int), _field(data, "created", bool))


@dataclass(frozen=True, slots=True)
class ProduceMessage:
    queue: int
    key: bytes | None
    body: bytes


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """A batch for one topic; messages may target different queues."""

    topic: str
    messages: Sequence[ProduceMessage]

    def encode(self) -> bytes:
        return encode_produce(self.topic, [(m.queue, m.key, m.body) for m in self.messages])

    @classmethod
    def decode(cls, body: bytes) -> Self:
        topic, raw = decode_produce(body)
        return cls(topic, [ProduceMessage(q, k, b) for q, k, b in raw])


#: ``(member, generation)`` of the active producer of an ordered topic, sent after the
#: messages of a PRODUCE (a trailer: marker byte 1, the member string, u64 generation).
ProduceLease = tuple[str, int]
_LEASE_MARK = 1
_DELIVER_MARK = 2
_PRODUCER_MARK = 3
_LEASE_GEN = struct.Struct(">Q")
_PRODUCER_ID = struct.Struct(">Q")

#: ``(producer id, one sequence number per message)`` of an idempotent producer
#: (invariant 8, docs/idempotence.md): a trailer, marker byte 3, u64 id, u32 count, u64 each.
ProducerSeqs = tuple[int, Sequence[int]]
#: The largest sequence number (a producer counts from 0 per queue: never reached).
MAX_PRODUCER_SEQ: Final = (1 << 63) - 1


class ProduceBody(NamedTuple):
    """A decoded PRODUCE: the messages and the trailers that came with them."""

    topic: str
    messages: list[tuple[int, bytes | None, bytes]]
    lease: ProduceLease | None = None  # the active producer of an ordered topic
    deliver_at: list[int] | None = None  # delivery times (ms); None: all now
    producer: ProducerSeqs | None = None  # an idempotent producer's id and numbers


def encode_produce(topic: str, messages: Sequence[tuple[int, bytes | None, bytes]],
                   lease: ProduceLease | None = None,
                   deliver_at: Sequence[int] | None = None,
                   producer: ProducerSeqs | None = None) -> bytes:
    """A PRODUCE body from plain ``(queue, key, body)`` tuples, packed into one
    preallocated buffer (the producer's hot path: no object per message).

    Trailers, each present only when needed, in this order: the producer lease of an
    ordered topic; ``deliver_at``, one delivery time (ms since the epoch; 0: now) per
    message (docs/delayed.md); ``producer``, an idempotent producer's id and one sequence
    number per message (docs/idempotence.md)."""
    return _encode_messages(topic, messages) + _trailers(len(messages), lease, deliver_at,
                                                         producer)


def _trailers(count: int, lease: ProduceLease | None, deliver_at: Sequence[int] | None,
              producer: ProducerSeqs | None) -> bytes:
    """The trailers of a PRODUCE of ``count`` messages, either form (:func:`encode_produce`)."""
    body = b""
    if lease is not None:
        member, generation = lease
        body += bytes([_LEASE_MARK]) + _string(member) + _LEASE_GEN.pack(generation)
    if deliver_at is not None and any(deliver_at):
        if len(deliver_at) != count:
            raise ValueError("one delivery time per message")
        body += bytes([_DELIVER_MARK]) + _PRODUCE_HEAD.pack(len(deliver_at)) + struct.pack(
            f">{len(deliver_at)}q", *deliver_at)
    if producer is not None:
        pid, seqs = producer
        if len(seqs) != count:
            raise ValueError("one sequence number per message")
        body += (bytes([_PRODUCER_MARK]) + _PRODUCER_ID.pack(pid)
                 + _PRODUCE_HEAD.pack(len(seqs)) + struct.pack(f">{len(seqs)}Q", *seqs))
    return body


def _encode_messages(topic: str, messages: Sequence[tuple[int, bytes | None, bytes]]) -> bytes:
    head = _string(topic)
    msg = _PRODUCE_MSG.size
    size = len(head) + _PRODUCE_HEAD.size
    for _q, key, body in messages:
        size += msg + len(body) + (len(key) if key is not None else 0)
    buf = bytearray(size)
    buf[: len(head)] = head
    pos = len(head)
    _PRODUCE_HEAD.pack_into(buf, pos, len(messages))
    pos += _PRODUCE_HEAD.size
    pack_into = _PRODUCE_MSG.pack_into
    for queue, key, body in messages:
        if key is None:
            pack_into(buf, pos, queue, -1, len(body))
            pos += msg
        else:
            pack_into(buf, pos, queue, len(key), len(body))
            pos += msg
            buf[pos : pos + len(key)] = key
            pos += len(key)
        buf[pos : pos + len(body)] = body
        pos += len(body)
    return bytes(buf)


def decode_produce(body: bytes) -> tuple[str, list[tuple[int, bytes | None, bytes]]]:
    """The PRODUCE body as ``(topic, [(queue, key, body), ...])``: the broker's hot path,
    so plain tuples and one bounds check per field instead of typed objects. The trailers
    after the messages are read by :func:`decode_produce_full`."""
    decoded = decode_produce_full(body)
    return decoded.topic, decoded.messages


def decode_produce_full(body: bytes) -> ProduceBody:
    """:func:`decode_produce` with its trailers (:class:`ProduceBody`)."""
    r = _Reader(body)
    topic = r.string()
    (count,) = r.unpack(_PRODUCE_HEAD)
    if count * _PRODUCE_MSG.size > len(body):
        raise _bad(f"message count {count} exceeds the body size")
    pos = r.pos
    size = len(body)
    unpack_from = _PRODUCE_MSG.unpack_from
    head = _PRODUCE_MSG.size
    out: list[tuple[int, bytes | None, bytes]] = []
    append = out.append
    for _ in range(count):
        if pos + head > size:
            raise _bad("body truncated")
        queue, key_len, body_len = unpack_from(body, pos)
        pos += head
        if key_len == -1:
            key = None
        elif key_len < 0 or pos + key_len > size:
            raise _bad("body truncated")
        else:
            key = body[pos : pos + key_len]
            pos += key_len
        end = pos + body_len
        if end > size:
            raise _bad("body truncated")
        append((queue, key, body[pos:end]))
        pos = end
    lease, deliver, producer = _decode_trailers(r, pos, count)
    return ProduceBody(topic, out, lease, deliver, producer)


def _decode_trailers(r: _Reader, pos: int, count: int
                     ) -> tuple[ProduceLease | None, list[int] | None, ProducerSeqs | None]:
    """The trailers of a PRODUCE of ``count`` messages from ``pos`` to the body's end."""
    body = r.data
    size = len(body)
    lease: ProduceLease | None = None
    if pos < size and body[pos] == _LEASE_MARK:
        r.seek(pos + 1)
        member = r.string()
        (generation,) = r.unpack(_LEASE_GEN)
        lease, pos = (member, generation), r.pos
    deliver: list[int] | None = None
    if pos < size and body[pos] == _DELIVER_MARK:
        r.seek(pos + 1)
        (n,) = r.unpack(_PRODUCE_HEAD)
        if n != count:
            raise _bad(f"{n} delivery times for {count} messages")
        deliver = list(r.unpack(struct.Struct(f">{n}q")))
        pos = r.pos
    producer: ProducerSeqs | None = None
    if pos < size and body[pos] == _PRODUCER_MARK:
        r.seek(pos + 1)
        (pid,) = r.unpack(_PRODUCER_ID)
        (n,) = r.unpack(_PRODUCE_HEAD)
        if n != count:
            raise _bad(f"{n} sequence numbers for {count} messages")
        seqs = list(r.unpack(struct.Struct(f">{n}Q")))
        if seqs and max(seqs) > MAX_PRODUCER_SEQ:
            # The broker keeps them as signed 64-bit numbers (idempotence.ProducerTable).
            raise FrameError(Status.BAD_REQUEST,
                             f"sequence numbers are at most {MAX_PRODUCER_SEQ}")
        producer = (pid, seqs)
        pos = r.pos
    if pos != size:
        raise _bad(f"{size - pos} unexpected trailing bytes")
    return lease, deliver, producer


# ---- the batch form (PRODUCE_BATCH, PRODUCE_MULTI_BATCH; docs/record-batch.md, step 2)

_BATCH_HEAD = struct.Struct(
    ">"
    "I"  # queue
    "I"  # record count, >= 1
    "I"  # records crc: crc32 of the records section
    "I"  # records section length
)


class ProduceBatches(NamedTuple):
    """A decoded batch-form PRODUCE: per batch ``(queue, count, records section, records
    crc)``, checked (the CRC matches, the section holds exactly ``count`` well-formed
    records, every timestamp delta 0), ``total`` messages in all, and the trailers (one
    entry per message, in batch then record order)."""

    topic: str
    batches: list[tuple[int, int, bytes, int]]
    total: int  # messages in all
    lease: ProduceLease | None = None
    deliver_at: list[int] | None = None
    producer: ProducerSeqs | None = None


def encode_produce_batches(topic: str, messages: Sequence[tuple[int, bytes | None, bytes]],
                           lease: ProduceLease | None = None,
                           deliver_at: Sequence[int] | None = None,
                           producer: ProducerSeqs | None = None) -> bytes:
    """A batch-form PRODUCE body: one batch per run of consecutive messages to one queue
    (the caller puts each queue's messages together; the answer's offsets follow this
    order), each the records section the master stores as it is, with its CRC. The
    trailers are :func:`encode_produce`'s, one entry per message in this order."""
    pieces = [_string(topic), _PRODUCE_HEAD.pack(0)]
    batches = 0
    n = len(messages)
    i = 0
    while i < n:
        queue = messages[i][0]
        j = i + 1
        while j < n and messages[j][0] == queue:
            j += 1
        section = stored_format.encode_records([(k, b, 0) for _q, k, b in messages[i:j]])
        pieces += [_BATCH_HEAD.pack(queue, j - i, crc32(section), len(section)), section]
        batches += 1
        i = j
    pieces[1] = _PRODUCE_HEAD.pack(batches)
    pieces.append(_trailers(n, lease, deliver_at, producer))
    return b"".join(pieces)


def decode_produce_batches(body: bytes) -> ProduceBatches:
    """A batch-form PRODUCE body (:func:`encode_produce_batches`), every batch checked
    once: its CRC over the section (one C call) and its records' lengths (one unpack a
    record, no copy). BAD_FRAME when anything disagrees."""
    r = _Reader(body)
    topic = r.string()
    (n,) = r.unpack(_PRODUCE_HEAD)
    if n * _BATCH_HEAD.size > len(body):
        raise _bad(f"batch count {n} exceeds the body size")
    batches: list[tuple[int, int, bytes, int]] = []
    count = 0
    pos = r.pos
    size = len(body)
    head = _BATCH_HEAD.size
    unpack_head = _BATCH_HEAD.unpack_from
    for _ in range(n):
        if pos + head > size:
            raise _bad("body truncated")
        queue, records, crc, length = unpack_head(body, pos)
        start = pos + head
        pos = start + length
        if pos > size:
            raise _bad("body truncated")
        if records < 1:
            raise _bad(f"a batch of queue {queue} holds {records} records")
        section = body[start:pos]
        if crc32(section) != crc:
            raise _bad(f"the records of queue {queue}'s batch fail their CRC")
        problem = stored_format.records_problem(body, start, pos, records, stamped=True)
        if problem is not None:
            raise _bad(f"queue {queue}'s batch: {problem}")
        batches.append((queue, records, section, crc))
        count += records
    r.seek(pos)
    lease, deliver, producer = _decode_trailers(r, r.pos, count)
    return ProduceBatches(topic, batches, count, lease, deliver, producer)


@dataclass(frozen=True, slots=True)
class ProduceBatchRequest:
    """PRODUCE_BATCH's body by message (tools and tests; the producer and the broker use
    :func:`encode_produce_batches` and :func:`decode_produce_batches`)."""

    topic: str
    messages: Sequence[ProduceMessage]

    def encode(self) -> bytes:
        return encode_produce_batches(self.topic,
                                      [(m.queue, m.key, m.body) for m in self.messages])

    @classmethod
    def decode(cls, body: bytes) -> Self:
        return cls(*_by_message(decode_produce_batches(body)))


def _by_message(req: ProduceBatches) -> tuple[str, list[ProduceMessage]]:
    return req.topic, [ProduceMessage(q, k, b) for q, k, b in batch_messages(req)]


def batch_messages(req: ProduceBatches) -> list[tuple[int, bytes | None, bytes]]:
    """The ``(queue, key, body)`` of every message of a batch-form PRODUCE, in order (what
    :func:`decode_produce` gives for the other form)."""
    return [(queue, key, value) for queue, records, section, _crc in req.batches
            for key, value, _delta in stored_format.records_of(section, records)]


#: The offset a PRODUCE answers for a delayed message: it has none until it is due.
SCHEDULED_OFFSET: Final = 0xFFFF_FFFF_FFFF_FFFF


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    """One ``(queue, offset)`` per message, in request order."""

    offsets: Sequence[tuple[int, int]]

    def encode(self) -> bytes:
        """One preallocated buffer, one ``pack_into`` per entry (the broker's hot path)."""
        n = len(self.offsets)
        entry = _OFFSET_ENTRY.size
        buf = bytearray(_OFFSETS_HEAD.size + n * entry)
        _OFFSETS_HEAD.pack_into(buf, 0, n)
        pack_into = _OFFSET_ENTRY.pack_into
        pos = _OFFSETS_HEAD.size
        for q, o in self.offsets:
            pack_into(buf, pos, q, o)
            pos += entry
        return bytes(buf)

    @classmethod
    def decode(cls, body: bytes) -> Self:
        r = _Reader(body)
        (count,) = r.unpack(_OFFSETS_HEAD)
        if count * _OFFSET_ENTRY.size != len(body) - _OFFSETS_HEAD.size:
            raise _bad("offset count does not match the body size")
        return cls(list(_OFFSET_ENTRY.iter_unpack(memoryview(body)[_OFFSETS_HEAD.size:])))


_MULTI_HEAD = struct.Struct(">H")  # parts
_MULTI_PART = struct.Struct(">I")  # part length
_MULTI_RESULT = struct.Struct(">HI")  # status, answer length
#: Most parts one PRODUCE_MULTI or PULL_MULTI carries (a producer sends one per topic it
#: has a batch of; a consumer one per queue it reads from the broker).
MAX_MULTI_PARTS: Final = 4096


def _counted_parts(count: int, parts: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``count u16`` then each part's head and bytes (the multi-part bodies)."""
    out = [_MULTI_HEAD.pack(count)]
    for head, data in parts:
        out.append(head)
        out.append(data)
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class MultiRequest:
    """Several request bodies of one operation in one request to one broker, answered
    part by part (:class:`MultiResponse`): PRODUCE_MULTI and PULL_MULTI.

    Body: ``parts u16`` then per part ``length u32 | body``."""

    parts: Sequence[bytes]

    def encode(self) -> bytes:
        if not 1 <= len(self.parts) <= MAX_MULTI_PARTS:
            raise ValueError(f"a multi-part request carries 1 to {MAX_MULTI_PARTS} parts")
        return _counted_parts(len(self.parts),
                              ((_MULTI_PART.pack(len(part)), part) for part in self.parts))

    @classmethod
    def decode(cls, body: bytes) -> Self:
        r = _Reader(body)
        (count,) = r.unpack(_MULTI_HEAD)
        if not 1 <= count <= MAX_MULTI_PARTS:
            raise _bad(f"a multi-part request carries 1 to {MAX_MULTI_PARTS} parts, not {count}")
        if count * _MULTI_PART.size > len(body):
            raise _bad(f"part count {count} exceeds the body size")
        parts = []
        for _ in range(count):
            (n,) = r.unpack(_MULTI_PART)
            parts.append(r.take(n))
        r.end()
        return cls(parts)


class ProduceMultiRequest(MultiRequest):
    """PRODUCE_MULTI: several PRODUCE bodies (:func:`encode_produce`, trailers included),
    each for its own topic, in one request to one broker. The broker handles each as a
    PRODUCE of its own and answers each; their appends share the group commit's fsync and
    the replication round, so a producer writing many topics pays one request's fixed
    costs for all of them (docs/broker.md, "PRODUCE_MULTI")."""

    __slots__ = ()


class ProduceMultiBatchRequest(MultiRequest):
    """PRODUCE_MULTI_BATCH: PRODUCE_MULTI whose parts are batch-form PRODUCE bodies
    (:func:`encode_produce_batches`); answered as PRODUCE_MULTI is."""


class PullMultiRequest(MultiRequest):
    """PULL_MULTI: several :class:`PullRequest` bodies, one per queue, to one broker, in
    one long poll: answered as a whole as soon as any part has records (or a part's
    ownership check fails), or when the shortest wait of its parts ends. Each part is
    checked (ACL, queue, ownership) and answered as a PULL of its own; a member reading
    several queues from one broker pays one request's fixed costs for all of them, as
    Kafka's fetch carries every partition a consumer reads from that broker
    (docs/broker.md, "PULL_MULTI")."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class MultiResponse:
    """One answer per part, in request order: ``(status, body)``, the body the part's
    own answer (a :class:`ProduceResponse`, a :class:`PullResponse`) when the status is
    OK and the error's message otherwise.

    Body: ``parts u16`` then per part ``status u16 | length u32 | body``."""

    results: Sequence[tuple[int, bytes]]

    def encode(self) -> bytes:
        return _counted_parts(len(self.results), (
            (_MULTI_RESULT.pack(int(status), len(answer)), answer)
            for status, answer in self.results))

    @classmethod
    def decode(cls, body: bytes) -> Self:
        r = _Reader(body)
        (count,) = r.unpack(_MULTI_HEAD)
        if count * _MULTI_RESULT.size > len(body):
            raise _bad(f"part count {count} exceeds the body size")
        results: list[tuple[int, bytes]] = []
        for _ in range(count):
            status, n = r.unpack(_MULTI_RESULT)
            try:
                Status(status)
            except ValueError:
                raise _bad(f"unknown status {status}") from None
            results.append((Status(status), r.take(n)))
        r.end()
        return cls(results)


class ProduceMultiResponse(MultiResponse):
    """PRODUCE_MULTI's answer: a :class:`ProduceResponse` or an error per part."""

    __slots__ = ()


class PullMultiResponse(MultiResponse):
    """PULL_MULTI's answer: a :class:`PullResponse` or an error per part."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class PullRequest:
    topic: str
    queue: int
    offset: int
    max_bytes: int
    max_wait_ms: int

    #: A consumer-group member's pull names its group, itself and the assignment
    #: generation it pulls under; the broker checks it owns the queue (invariant 6).
    cgroup: str = ""
    member: str = ""
    generation: int = 0

    def encode(self) -> bytes:
        head = _string(self.topic) + _PULL_REQ.pack(
            self.queue, self.offset, self.max_bytes, self.max_wait_ms
        )
        if not self.member:
            return head
        return head + _string(self.cgroup) + _string(self.member) + _U64.pack(self.generation)

    @classmethod
    def decode(cls, body: bytes) -> Self:
        r = _Reader(body)
        topic = r.string()
        queue, offset, max_bytes, max_wait_ms = r.unpack(_PULL_REQ)
        if r.pos == len(body):
            return cls(topic, queue, offset, max_bytes, max_wait_ms)
        cgroup, member = r.string(), r.string()
        (generation,) = r.unpack(_U64)
        r.end()
        if not cgroup or not member:
            raise FrameError(Status.BAD_REQUEST, "a member pull needs a consumer group and a member")
        return cls(topic, queue, offset, max_bytes, max_wait_ms, cgroup, member, generation)


class PulledRecord(NamedTuple):
    """One message of a PULL answer (a named tuple: a consumer decodes one per message)."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    body: bytes


@dataclass(frozen=True, slots=True)
class PullResponse:
    next_offset: int
    queue_start: int
    queue_end: int
    records: Sequence[PulledRecord] = field(default_factory=list)

    def encode(self) -> bytes:
        parts = [
            _PULL_RESP_HEAD.pack(
                self.next_offset, self.queue_start, self.queue_end, len(self.records)
            )
        ]
        pack = _PULL_RECORD.pack
        for rec in self.records:
            if rec.key is None:
                parts.append(pack(rec.offset, rec.timestamp_ms, -1, len(rec.body)))
            else:
                parts.append(pack(rec.offset, rec.timestamp_ms, len(rec.key), len(rec.body)))
                parts.append(rec.key)
            parts.append(rec.body)
        return b"".join(parts)

    @classmethod
    def decode(cls, body: bytes) -> Self:
        r = _Reader(body)
        next_offset, start, end, count = r.unpack(_PULL_RESP_HEAD)
        if count * _PULL_RECORD.size > len(body):
            raise _bad(f"record count {count} exceeds the body size")
        records = []
        for _ in range(count):
            offset, ts, key_len, body_len = r.unpack(_PULL_RECORD)
            key = None if key_len == -1 else r.take(key_len)
            records.append(PulledRecord(offset, ts, key, r.take(body_len)))
        r.end()
        return cls(next_offset, start, end, records)


_PULL_BATCH_HEAD = struct.Struct(
    ">"
    "Q"  # next offset to ask for
    "Q"  # queue start (oldest retained offset)
    "Q"  # queue end (next offset to be written)
    "Q"  # from offset: the first message wanted (the first item may hold earlier ones)
    "I"  # item count
)
_SEQ_OFFSET = struct.Struct(">QQ")  # where a batch's and a record's header both start


def encode_pull_batches(next_offset: int, queue_start: int, queue_end: int,
                        from_offset: int, items: Sequence[bytes]) -> bytes:
    """A PULL_BATCH answer: the stored items (batches, records) as the log holds them,
    after a head (docs/record-batch.md, step 3): the broker decodes no message."""
    return b"".join([_PULL_BATCH_HEAD.pack(next_offset, queue_start, queue_end, from_offset,
                                           len(items)), *items])


def decode_pull_batches(body: bytes) -> PullResponse:
    """A PULL_BATCH answer as a :class:`PullResponse`: each item checked (framing, both
    CRCs, its records' lengths as they are read), its messages from the answer's from
    offset on. BAD_FRAME when an item is damaged or the body holds anything else."""
    r = _Reader(body)
    next_offset, start, end, from_offset, count = r.unpack(_PULL_BATCH_HEAD)
    buf = memoryview(body)
    pos = r.pos
    records: list[PulledRecord] = []
    for _ in range(count):
        if pos + stored_format.PREFIX_SIZE + _SEQ_OFFSET.size > len(buf):
            raise _bad("a pulled item is truncated")
        first = _SEQ_OFFSET.unpack_from(buf, pos + stored_format.PREFIX_SIZE)[1]
        try:
            head, stored, _used = stored_format.decode_item(
                buf, pos, pos, first=max(0, min(from_offset - first, 1 << 32)))
        except (stored_format.CorruptRecordError, UnicodeDecodeError) as exc:
            # (A record of the older format whose topic is not UTF-8 under a good CRC:
            # no broker writes one, a broken or hostile one could send it.)
            raise _bad(f"a pulled item is damaged: {exc}") from None
        records += [PulledRecord(m.queue_offset, m.timestamp_ms, m.key, m.body) for m in stored]
        pos += head.size
    if pos != len(buf):
        raise _bad(f"{len(buf) - pos} unexpected trailing bytes")
    return PullResponse(next_offset, start, end, records)


class PullBatchResponse:
    """PULL_BATCH's answer (:func:`encode_pull_batches`), decoded to a
    :class:`PullResponse`."""

    @staticmethod
    def decode(body: bytes) -> PullResponse:
        return decode_pull_batches(body)


def _queue_offsets(data: Mapping[str, Any], name: str) -> dict[int, int | None]:
    raw = _field(data, name, dict)
    out: dict[int, int | None] = {}
    for k, v in raw.items():
        out[_queue_key(name, k)] = None if v is None else _offset(v)
    return out


def _queue_key(name: str, key: str) -> int:
    """A queue number written as a JSON object key."""
    try:
        return _queue(int(key))
    except ValueError:
        raise _bad(f"{name}: queue {key!r} is not a number") from None


@dataclass(frozen=True, slots=True)
class CommitOffsetRequest:
    """Commit the next offset to consume, per queue, for a consumer group. A consumer-group
    member names itself and its generation: the broker refuses (NOT_OWNER) a commit for a
    queue the member does not own, as it refuses its pulls (invariant 6)."""

    group: str
    topic: str
    offsets: Mapping[int, int]
    member: str = ""
    generation: int = 0

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "group": self.group,
            "topic": self.topic,
            "offsets": {str(q): o for q, o in self.offsets.items()},
        }
        if self.member:
            doc.update(member=self.member, generation=self.generation)
        return _json_body(doc)

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        offsets = _queue_offsets(data, "offsets")
        if any(v is None for v in offsets.values()):
            raise _bad("offsets: null is not a committable offset")
        clean = {q: v for q, v in offsets.items() if v is not None}
        member = data.get("member", "")
        generation = data.get("generation", 0)
        if not isinstance(member, str) or isinstance(generation, bool) \
                or not isinstance(generation, int) or generation < 0:
            raise _bad("member must be a string and generation an integer >= 0")
        return cls(_field(data, "group", str), _topic_name(data), clean, member, generation)


@dataclass(frozen=True, slots=True)
class OffsetsResponse:
    """Committed offsets per queue (``None`` = nothing committed). The answer to both
    COMMIT_OFFSET (the stored values, which never move backwards) and FETCH_OFFSET."""

    offsets: Mapping[int, int | None]

    def encode(self) -> bytes:
        return _json_body({"offsets": {str(q): o for q, o in self.offsets.items()}})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        return cls(_queue_offsets(_json_object(body), "offsets"))


@dataclass(frozen=True, slots=True)
class FetchOffsetRequest:
    group: str
    topic: str
    queues: Sequence[int]

    def encode(self) -> bytes:
        return _json_body({"group": self.group, "topic": self.topic, "queues": list(self.queues)})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        queues = [_queue(q) for q in _field(data, "queues", list)]
        return cls(_field(data, "group", str), _topic_name(data), queues)


@dataclass(frozen=True, slots=True)
class GetRouteRequest:
    """``topic`` None asks for every topic. With ``wait_ms`` the broker answers when its
    cluster view moves past ``known_version`` (or when the wait ends): clients keep one
    such request outstanding and so learn route changes as they happen."""

    topic: str | None = None
    known_version: int = -1
    wait_ms: int = 0

    def encode(self) -> bytes:
        data: dict[str, Any] = {"topic": self.topic}
        if self.wait_ms:
            data.update(known_version=self.known_version, wait_ms=self.wait_ms)
        return _json_body(data)

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        topic = data.get("topic")
        if topic is not None and not isinstance(topic, str):
            raise _bad("field 'topic' has the wrong type")
        known, wait = data.get("known_version", -1), data.get("wait_ms", 0)
        if not isinstance(known, int) or not isinstance(wait, int) or not 0 <= wait <= 600_000:
            raise FrameError(Status.BAD_REQUEST, "known_version and wait_ms (0-600000) are integers")
        return cls(topic, known, wait)


@dataclass(frozen=True, slots=True)
class BrokerRoute:
    """One broker as a client sees it. ``permission`` is effective, 0-3; ``reachable``
    is False when the answering broker could not reach it."""

    name: str
    address: str
    role: str
    permission: int
    epoch: int
    reachable: bool = True

    def holds(self, need: int) -> bool:
        """Reachable, and its effective permission includes all of ``need``."""
        return self.reachable and (self.permission & need) == need

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "role": self.role,
            "permission": self.permission,
            "epoch": self.epoch,
            "reachable": self.reachable,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        perm = _field(data, "permission", int)
        if not 0 <= perm <= 3:
            raise _bad(f"invalid permission {perm}")
        return cls(
            _field(data, "name", str),
            _field(data, "address", str),
            _field(data, "role", str),
            perm,
            _field(data, "epoch", int),
            bool(data.get("reachable", True)),
        )


@dataclass(frozen=True, slots=True)
class GroupRoute:
    group: str
    brokers: Sequence[BrokerRoute]


def current_claims(brokers: Sequence[BrokerRoute]) -> list[BrokerRoute]:
    """The group's brokers with every permission published at an epoch older than the
    newest a reachable broker of the group shows taken away (pure).

    Epochs only grow, so a broker behind its peer has not heard of the group's newest
    state, and what it last claimed may no longer be true. Two such claims were seen: a
    master restarted after kill -9 registers again before it writes a new route document,
    so its previous life's FULL at the old epoch is shown, live, next to its acting slave
    at the new one; and a master woken from SIGSTOP after its session expired does the
    same with the FULL it held before the hang. Producers that took either for the
    writer's return sent to it, failed, and isolated its group for ten minutes
    (``bench/cluster.py``: a 500 ms write stall at the next hang of the other group). A
    broker shown without permission here is asked again once it publishes the newest
    epoch, a notification later."""
    newest = max((b.epoch for b in brokers if b.reachable), default=0)
    return [b if b.epoch >= newest or not b.permission else replace(b, permission=0)
            for b in brokers]


@dataclass(frozen=True, slots=True)
class RouteResponse:
    """``{"groups": [{"group", "brokers": [...]}], "topics": {name: {"queues", "groups",
    "placement"}}, "version"}``. ``placement[t][q]`` is the group of queue ``q`` (None: a
    removed queue); a topic without placement lives wholly on ``topic_groups[t][0]`` (a
    topic created on one group with CREATE_TOPIC). ``version`` is the answering broker's
    cluster-view version (0 without ZooKeeper)."""

    groups: Sequence[GroupRoute]
    topics: Mapping[str, int]  # topic -> queue count
    topic_groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    placement: Mapping[str, Sequence[str | None]] = field(default_factory=dict)
    version: int = 0
    #: Ordered topics only: the group that takes the topic's writes now (its send head;
    #: None while no group can), from the answering broker's view of the chains.
    send_heads: Mapping[str, str | None] = field(default_factory=dict)
    #: Ordered topics only: the group consumers read now (the consume chain's head).
    consume_heads: Mapping[str, str | None] = field(default_factory=dict)

    def group_of(self, topic: str, queue: int) -> str | None:
        """The group holding ``queue`` of ``topic`` (None: unknown or removed)."""
        placed = self.placement.get(topic)
        if placed is not None:
            return placed[queue] if 0 <= queue < len(placed) else None
        groups = self.topic_groups.get(topic) or [g.group for g in self.groups]
        n = self.topics.get(topic)
        return groups[0] if groups and n is not None and 0 <= queue < n else None

    def brokers_of(self, group: str) -> Sequence[BrokerRoute]:
        for g in self.groups:
            if g.group == group:
                return g.brokers
        return ()

    def encode(self) -> bytes:
        topics: dict[str, Any] = {}
        for t, n in self.topics.items():
            info: dict[str, Any] = {"queues": n, "groups": list(self.topic_groups.get(t, ()))}
            if t in self.placement:
                info["placement"] = list(self.placement[t])
            if t in self.send_heads:
                info["sendHead"] = self.send_heads[t]
            if t in self.consume_heads:
                info["consumeHead"] = self.consume_heads[t]
            topics[t] = info
        return _json_body(
            {
                "groups": [
                    {"group": g.group, "brokers": [b.to_json() for b in g.brokers]}
                    for g in self.groups
                ],
                "topics": topics,
                "version": self.version,
            }
        )

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        groups = []
        for g in _field(data, "groups", list):
            if not isinstance(g, dict):
                raise _bad("route group must be an object")
            brokers = []
            for b in _field(g, "brokers", list):
                if not isinstance(b, dict):
                    raise _bad("route broker must be an object")
                brokers.append(BrokerRoute.from_json(b))
            groups.append(GroupRoute(_field(g, "group", str), brokers))
        topics: dict[str, int] = {}
        topic_groups: dict[str, list[str]] = {}
        placement: dict[str, list[str | None]] = {}
        send_heads: dict[str, str | None] = {}
        consume_heads: dict[str, str | None] = {}
        for name, info in _field(data, "topics", dict).items():
            if not isinstance(info, dict):
                raise _bad("topic info must be an object")
            topics[name] = _field(info, "queues", int)
            topic_groups[name] = _strings(info, "groups")
            placed = info.get("placement")
            if placed is not None:
                if not isinstance(placed, list) or len(placed) != topics[name]:
                    raise _bad(f"topic {name!r}: placement must list a group per queue")
                placement[name] = [None if x is None else str(x) for x in placed]
            for key, heads in (("sendHead", send_heads), ("consumeHead", consume_heads)):
                if key in info:
                    head = info[key]
                    if head is not None and not isinstance(head, str):
                        raise _bad(f"topic {name!r}: {key} must be a group name or null")
                    heads[name] = head
        version = data.get("version", 0)
        return cls(groups, topics, topic_groups, placement,
                   version if isinstance(version, int) else 0, send_heads, consume_heads)


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    sender: str = ""

    def encode(self) -> bytes:
        return _json_body({"sender": self.sender})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        sender = data.get("sender", "")
        if not isinstance(sender, str):
            raise _bad("field 'sender' has the wrong type")
        return cls(sender)


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    name: str
    group: str
    role: str
    permission: int
    epoch: int
    max_phys: int

    def encode(self) -> bytes:
        return _json_body(
            {
                "name": self.name,
                "group": self.group,
                "role": self.role,
                "permission": self.permission,
                "epoch": self.epoch,
                "max_phys": self.max_phys,
            }
        )

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(
            _field(data, "name", str),
            _field(data, "group", str),
            _field(data, "role", str),
            _field(data, "permission", int),
            _field(data, "epoch", int),
            _field(data, "max_phys", int),
        )


#: The most schedule entries one back-sync may name as escaped. Its ranges are expanded
#: to one offset each, so a range a peer merely announces (``[0, 2**62)``) is refused
#: before anything is allocated for it.
MAX_ESCAPED: Final = 1 << 22


@dataclass(frozen=True, slots=True)
class BackSyncRequest:
    """BACKSYNC_OFFSETS: the acting slave's final consumer offsets, tagged with the
    RECOVERING epoch it applied (DESIGN "Failover" step 3). The master merges them
    (maximum per key), persists them, and only then answers."""

    group: str
    sender: str
    epoch: int
    offsets: Mapping[str, Mapping[str, Mapping[int, int]]]
    #: The schedule entries (origins) the acting slave escaped to other groups: the master
    #: must never deliver them again (docs/delayed.md). Sent as ``[first, end)`` runs.
    escaped: Sequence[int] = ()

    def encode(self) -> bytes:
        return _json_body(
            {
                "group": self.group,
                "sender": self.sender,
                "epoch": self.epoch,
                "offsets": {
                    g: {t: {str(q): o for q, o in qs.items()} for t, qs in ts.items()}
                    for g, ts in self.offsets.items()
                },
                "escaped": _ranges(self.escaped),
            }
        )

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        epoch = _field(data, "epoch", int)
        if epoch < 1:
            raise FrameError(Status.BAD_REQUEST, f"back-sync epoch must be positive, got {epoch}")
        try:
            offsets = normalize_snapshot(_field(data, "offsets", dict))
        except ValueError as exc:
            raise FrameError(Status.BAD_REQUEST, f"back-sync offsets: {exc}") from None
        raw = data.get("escaped", [])
        escaped: list[int] = []
        for pair in raw if isinstance(raw, list) else [None]:
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(isinstance(o, int) and not isinstance(o, bool) for o in pair)
                    and 0 <= pair[0] < pair[1]):
                raise FrameError(Status.BAD_REQUEST,
                                 "back-sync escaped: a list of [first, end) offset ranges")
            if len(escaped) + pair[1] - pair[0] > MAX_ESCAPED:
                raise FrameError(Status.BAD_REQUEST,
                                 f"back-sync escaped: more than {MAX_ESCAPED} entries")
            escaped.extend(range(pair[0], pair[1]))
        return cls(_field(data, "group", str), _field(data, "sender", str), epoch, offsets,
                   tuple(escaped))


def _ranges(offsets: Sequence[int]) -> list[list[int]]:
    """Offsets as sorted ``[first, end)`` runs: an acting slave escapes nearly everything
    that fell due while it acted, so its escaped offsets are a few long runs."""
    out: list[list[int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] == o:
            out[-1][1] = o + 1
        else:
            out.append([o, o + 1])
    return out


@dataclass(frozen=True, slots=True)
class BackSyncResponse:
    """The master persisted the offsets: ``moved`` keys went up; ``backsync_epoch`` is the
    epoch it now reports in its status."""

    epoch: int
    moved: int
    backsync_epoch: int

    def encode(self) -> bytes:
        return _json_body(
            {"epoch": self.epoch, "moved": self.moved, "backsync_epoch": self.backsync_epoch}
        )

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(
            _field(data, "epoch", int), _field(data, "moved", int), _field(data, "backsync_epoch", int)
        )


# --------------------------------------------------------------------------- cluster


def _strings(data: Mapping[str, Any], name: str) -> list[str]:
    value = data.get(name, [])
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise _bad(f"field {name!r} must be a list of strings")
    return list(value)


def _int_field(data: Mapping[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise FrameError(Status.BAD_REQUEST, f"field {name!r} must be an integer {lo}..{hi}")
    return value


ADMIN_ACTIONS: Final = ("create", "alter", "delete")


@dataclass(frozen=True, slots=True)
class AdminTopicRequest:
    """ADMIN_TOPIC: ``create`` (groups, queues_per_group, ordered), ``alter`` (add_groups,
    remove_groups, queues_per_group), ``delete``. ``backlog`` is the unconsumed count per
    queue the admin client measured (QUEUE_STATS), for the removal checks; ``force``
    removes queues or deletes a topic whatever they hold."""

    action: str
    topic: str
    groups: Sequence[str] = ()
    queues_per_group: int | None = None
    add_groups: Sequence[str] = ()
    remove_groups: Sequence[str] = ()
    ordered: bool = False
    force: bool = False
    backlog: Mapping[int, int] | None = None

    def encode(self) -> bytes:
        return _json_body({
            "action": self.action, "topic": self.topic, "groups": list(self.groups),
            "queues_per_group": self.queues_per_group, "add_groups": list(self.add_groups),
            "remove_groups": list(self.remove_groups), "ordered": self.ordered,
            "force": self.force,
            "backlog": None if self.backlog is None else {str(q): n for q, n in self.backlog.items()},
        })

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        action = _field(data, "action", str)
        if action not in ADMIN_ACTIONS:
            raise FrameError(Status.BAD_REQUEST, f"action must be one of {', '.join(ADMIN_ACTIONS)}")
        qpg = data.get("queues_per_group")
        if qpg is not None and (isinstance(qpg, bool) or not isinstance(qpg, int)):
            raise _bad("field 'queues_per_group' must be an integer")
        raw = data.get("backlog")
        backlog = None if raw is None else {
            q: (o or 0) for q, o in _queue_offsets({"backlog": raw}, "backlog").items()}
        return cls(action, _topic_name(data), _strings(data, "groups"), qpg,
                   _strings(data, "add_groups"), _strings(data, "remove_groups"),
                   bool(data.get("ordered", False)), bool(data.get("force", False)), backlog)


@dataclass(frozen=True, slots=True)
class AdminTopicResponse:
    """The topic as stored after the change (``placement`` empty after a delete)."""

    topic: str
    placement: Sequence[str | None]
    ordered: bool
    changed: bool

    def encode(self) -> bytes:
        return _json_body({"topic": self.topic, "placement": list(self.placement),
                           "ordered": self.ordered, "changed": self.changed})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        placed = _field(data, "placement", list)
        return cls(_topic_name(data), [None if g is None else str(g) for g in placed],
                   bool(data.get("ordered", False)), bool(data.get("changed", False)))


@dataclass(frozen=True, slots=True)
class QueueStats:
    start: int
    end: int
    committed: Mapping[str, int]  # consumer group -> committed offset


@dataclass(frozen=True, slots=True)
class QueueStatsRequest:
    topic: str
    queues: Sequence[int]

    def encode(self) -> bytes:
        return _json_body({"topic": self.topic, "queues": list(self.queues)})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_topic_name(data), [_queue(q) for q in _field(data, "queues", list)])


@dataclass(frozen=True, slots=True)
class QueueStatsResponse:
    """What one broker holds for the queues asked (its own copy: on a slave it lags by
    the replication delay). Queues it does not hold are left out."""

    broker: str
    group: str
    queues: Mapping[int, QueueStats]

    def encode(self) -> bytes:
        return _json_body({"broker": self.broker, "group": self.group, "queues": {
            str(q): {"start": s.start, "end": s.end, "committed": dict(s.committed)}
            for q, s in self.queues.items()}})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        out: dict[int, QueueStats] = {}
        for k, v in _field(data, "queues", dict).items():
            if not isinstance(v, dict):
                raise _bad("queue stats must be objects")
            committed = _field(v, "committed", dict)
            out[_queue_key("queues", k)] = QueueStats(_offset(_field(v, "start", int)),
                                             _offset(_field(v, "end", int)),
                                             {str(g): _offset(o) for g, o in committed.items()})
        return cls(_field(data, "broker", str), _field(data, "group", str), out)


def _keys(data: Mapping[str, Any], name: str) -> list[tuple[str, int]]:
    raw = data.get(name, [])
    if not isinstance(raw, list):
        raise _bad(f"field {name!r} must be a list of [topic, queue]")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
            raise _bad(f"field {name!r} must be a list of [topic, queue]")
        validate_topic(item[0])
        out.append((item[0], _queue(item[1])))
    return out


@dataclass(frozen=True, slots=True)
class MemberHeartbeatRequest:
    """MEMBER_HEARTBEAT. ``join`` creates the member (or takes it over from another
    broker); otherwise an unknown member gets ``UNKNOWN_MEMBER``. ``released`` are queues
    the member committed and stopped pulling. The broker answers at once when
    ``generation`` differs from the assignment's, else when the assignment changes or
    ``wait_ms`` ends (a long poll)."""

    cgroup: str
    member: str
    topics: Sequence[str]
    session_timeout_ms: int = 6000
    join: bool = False
    released: Sequence[tuple[str, int]] = ()
    generation: int = -1
    wait_ms: int = 0
    #: A producer of an ordered topic (``cgroup`` is the topic): the brokers hold the
    #: producers of each ordered topic as a group whose one unit is the right to send.
    producer: bool = False

    def encode(self) -> bytes:
        return _json_body({
            "group": self.cgroup, "member": self.member, "topics": list(self.topics),
            "session_timeout_ms": self.session_timeout_ms, "join": self.join,
            "released": [list(k) for k in self.released], "generation": self.generation,
            "wait_ms": self.wait_ms, "producer": self.producer})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        topics = _strings(data, "topics")
        for t in topics:
            validate_topic(t)
        return cls(_field(data, "group", str), _field(data, "member", str), topics,
                   _int_field(data, "session_timeout_ms", 6000, 500, 600_000),
                   bool(data.get("join", False)), _keys(data, "released"),
                   _int_field(data, "generation", -1, -1, 1 << 62),
                   _int_field(data, "wait_ms", 0, 0, 60_000),
                   bool(data.get("producer", False)))


@dataclass(frozen=True, slots=True)
class MemberHeartbeatResponse:
    """``owned``: queues the member may pull under ``generation``; ``revoking``: those of
    them it must commit and release now."""

    generation: int
    owned: Sequence[tuple[str, int]]
    revoking: Sequence[tuple[str, int]]
    broker: str = ""

    def encode(self) -> bytes:
        return _json_body({"generation": self.generation, "owned": [list(k) for k in self.owned],
                           "revoking": [list(k) for k in self.revoking], "broker": self.broker})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_field(data, "generation", int), _keys(data, "owned"), _keys(data, "revoking"),
                   str(data.get("broker", "")))


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    cgroup: str
    member: str
    producer: bool = False  # as in MemberHeartbeatRequest

    def encode(self) -> bytes:
        return _json_body({"group": self.cgroup, "member": self.member,
                           "producer": self.producer})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_field(data, "group", str), _field(data, "member", str),
                   bool(data.get("producer", False)))


@dataclass(frozen=True, slots=True)
class DescribeGroupRequest:
    cgroup: str
    producer: bool = False  # the producers of ordered topic ``cgroup``

    def encode(self) -> bytes:
        return _json_body({"group": self.cgroup, "producer": self.producer})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_field(data, "group", str), bool(data.get("producer", False)))


@dataclass(frozen=True, slots=True)
class DescribeGroupResponse:
    """Members (``{member, broker, topics}``) and ownership (``{topic, queue, member,
    next}``) as ZooKeeper holds them; an empty group when the consumer group is unknown."""

    cgroup: str
    generation: int
    members: Sequence[Mapping[str, Any]]
    owners: Sequence[Mapping[str, Any]]

    def encode(self) -> bytes:
        return _json_body({"group": self.cgroup, "generation": self.generation,
                           "members": list(self.members), "owners": list(self.owners)})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_field(data, "group", str), _field(data, "generation", int),
                   _field(data, "members", list), _field(data, "owners", list))


@dataclass(frozen=True, slots=True)
class ListGroupsRequest:
    def encode(self) -> bytes:
        return _json_body({})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        _json_object(body)
        return cls()


@dataclass(frozen=True, slots=True)
class ListGroupsResponse:
    """Per consumer group: ``{group, members, generation}``."""

    groups: Sequence[Mapping[str, Any]]

    def encode(self) -> bytes:
        return _json_body({"groups": list(self.groups)})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        return cls(_field(_json_object(body), "groups", list))


@dataclass(frozen=True, slots=True)
class NackRequest:
    """NACK: member ``member`` of consumer group ``cgroup`` (at assignment ``generation``)
    hands back the record at ``offset`` of ``topic``/``queue``, which it owns: it comes
    again after ``delay_ms`` through the group's retry topic, or goes to its dead-letter
    topic once handed back more than ``max_reconsume`` times (docs/delayed.md)."""

    cgroup: str
    member: str
    generation: int
    topic: str
    queue: int
    offset: int
    delay_ms: int
    max_reconsume: int

    def encode(self) -> bytes:
        return _json_body({"group": self.cgroup, "member": self.member,
                           "generation": self.generation, "topic": self.topic,
                           "queue": self.queue, "offset": self.offset,
                           "delayMs": self.delay_ms, "maxReconsume": self.max_reconsume})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        out = cls(_field(data, "group", str), _field(data, "member", str),
                  _field(data, "generation", int), _topic_name(data),
                  _field(data, "queue", int), _field(data, "offset", int),
                  _field(data, "delayMs", int), _field(data, "maxReconsume", int))
        if not out.cgroup or not out.member:
            raise _bad("a nack names its consumer group and member")
        if out.queue < 0 or out.offset < 0 or out.delay_ms < 0 or out.max_reconsume < 0:
            raise _bad("queue, offset, delayMs and maxReconsume must not be negative")
        return out


@dataclass(frozen=True, slots=True)
class NackResponse:
    """Where the handed-back message went (the retry or the dead-letter topic), how many
    times it has been handed back, and when it is due (ms since the epoch)."""

    topic: str
    reconsume: int
    due_ms: int

    def encode(self) -> bytes:
        return _json_body({"topic": self.topic, "reconsume": self.reconsume,
                           "dueMs": self.due_ms})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_topic_name(data), _field(data, "reconsume", int), _field(data, "dueMs", int))


@dataclass(frozen=True, slots=True)
class AuthenticateRequest:
    """AUTHENTICATE: one step of a SASL SCRAM exchange (RFC 5802): the client-first
    message, then the client-final one, each in its own request on the same connection."""

    mechanism: str
    message: str

    def encode(self) -> bytes:
        return _json_body({"mechanism": self.mechanism, "message": self.message})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_field(data, "mechanism", str), _field(data, "message", str))


@dataclass(frozen=True, slots=True)
class AuthenticateResponse:
    """The server's SCRAM message for the step; ``user`` once the exchange succeeded."""

    message: str
    user: str | None = None

    def encode(self) -> bytes:
        return _json_body({"message": self.message, "user": self.user})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        user = data.get("user")
        return cls(_field(data, "message", str), user if isinstance(user, str) else None)


SECURITY_ACTIONS: Final = ("user-create", "user-delete", "user-list", "acl-add", "acl-remove",
                           "acl-list", "whoami")


@dataclass(frozen=True, slots=True)
class SecurityAdminRequest:
    """SECURITY_ADMIN: ``action`` (:data:`SECURITY_ACTIONS`) on ``user``. A created user's
    ``credentials`` are its salted SCRAM keys (``acl.UserDoc`` JSON, made by the client:
    the password never travels); ``rules`` are ``acl.Rule`` dicts."""

    action: str
    user: str | None = None
    credentials: Mapping[str, Any] | None = None
    rules: Sequence[Mapping[str, Any]] = ()

    def encode(self) -> bytes:
        return _json_body({"action": self.action, "user": self.user,
                           "credentials": self.credentials, "rules": list(self.rules)})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        action = _field(data, "action", str)
        if action not in SECURITY_ACTIONS:
            raise FrameError(Status.BAD_REQUEST,
                             f"action must be one of {', '.join(SECURITY_ACTIONS)}")
        user = data.get("user")
        if user is not None and not isinstance(user, str):
            raise _bad("field 'user' must be a string")
        creds = data.get("credentials")
        if creds is not None and not isinstance(creds, dict):
            raise _bad("field 'credentials' must be an object")
        rules = data.get("rules", [])
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise _bad("field 'rules' must be a list of objects")
        return cls(action, user, creds, rules)


@dataclass(frozen=True, slots=True)
class SecurityAdminResponse:
    """``users``: ``[{user, mechanisms, rules}]`` for the list actions and whoami;
    ``changed``: whether anything was written."""

    users: Sequence[Mapping[str, Any]] = ()
    changed: bool = False

    def encode(self) -> bytes:
        return _json_body({"users": list(self.users), "changed": self.changed})

    @classmethod
    def decode(cls, body: bytes) -> Self:
        data = _json_object(body)
        return cls(_field(data, "users", list), bool(data.get("changed", False)))


#: Request and response body types per operation.
REQUEST_TYPES: Final[Mapping[Op, type]] = {
    Op.CREATE_TOPIC: CreateTopicRequest,
    Op.PRODUCE: ProduceRequest,
    Op.PULL: PullRequest,
    Op.COMMIT_OFFSET: CommitOffsetRequest,
    Op.FETCH_OFFSET: FetchOffsetRequest,
    Op.GET_ROUTE: GetRouteRequest,
    Op.HEARTBEAT: HeartbeatRequest,
    Op.BACKSYNC_OFFSETS: BackSyncRequest,
    Op.ADMIN_TOPIC: AdminTopicRequest,
    Op.QUEUE_STATS: QueueStatsRequest,
    Op.MEMBER_HEARTBEAT: MemberHeartbeatRequest,
    Op.LEAVE_GROUP: LeaveGroupRequest,
    Op.DESCRIBE_GROUP: DescribeGroupRequest,
    Op.LIST_GROUPS: ListGroupsRequest,
    Op.NACK: NackRequest,
    Op.AUTHENTICATE: AuthenticateRequest,
    Op.SECURITY_ADMIN: SecurityAdminRequest,
    Op.PRODUCE_MULTI: ProduceMultiRequest,
    Op.PULL_MULTI: PullMultiRequest,
    Op.PRODUCE_BATCH: ProduceBatchRequest,
    Op.PRODUCE_MULTI_BATCH: ProduceMultiBatchRequest,
    Op.PULL_BATCH: PullRequest,
    Op.PULL_MULTI_BATCH: PullMultiRequest,
}
RESPONSE_TYPES: Final[Mapping[Op, type]] = {
    Op.CREATE_TOPIC: CreateTopicResponse,
    Op.PRODUCE: ProduceResponse,
    Op.PULL: PullResponse,
    Op.COMMIT_OFFSET: OffsetsResponse,
    Op.FETCH_OFFSET: OffsetsResponse,
    Op.GET_ROUTE: RouteResponse,
    Op.HEARTBEAT: HeartbeatResponse,
    Op.BACKSYNC_OFFSETS: BackSyncResponse,
    Op.ADMIN_TOPIC: AdminTopicResponse,
    Op.QUEUE_STATS: QueueStatsResponse,
    Op.MEMBER_HEARTBEAT: MemberHeartbeatResponse,
    Op.LEAVE_GROUP: MemberHeartbeatResponse,
    Op.DESCRIBE_GROUP: DescribeGroupResponse,
    Op.LIST_GROUPS: ListGroupsResponse,
    Op.NACK: NackResponse,
    Op.AUTHENTICATE: AuthenticateResponse,
    Op.SECURITY_ADMIN: SecurityAdminResponse,
    Op.PRODUCE_MULTI: ProduceMultiResponse,
    Op.PULL_MULTI: PullMultiResponse,
    Op.PRODUCE_BATCH: ProduceResponse,
    Op.PRODUCE_MULTI_BATCH: ProduceMultiResponse,
    Op.PULL_BATCH: PullBatchResponse,
    Op.PULL_MULTI_BATCH: PullMultiResponse,
}


def error_message(frame: Frame) -> str:
    """The text of an error response."""
    return frame.body.decode("utf-8", "replace")


def corrupt_record_message(offset: int, detail: str, next_offset: int | None = None) -> str:
    """The text of a ``CORRUPT_RECORD`` answer: the damaged record's queue offset first,
    where :func:`corrupt_record_offset` reads it back, then the offset to read from to
    skip it (:func:`corrupt_record_skip_to`; past the whole damaged batch), then what is
    damaged and where."""
    after = offset + 1 if next_offset is None else next_offset
    return (f"offset {offset} is damaged and is not served; read from offset {after} "
            f"to skip it (a consumer group: commit {after}): {detail}")


def corrupt_record_skip_to(message: str) -> int | None:
    """The offset a ``CORRUPT_RECORD`` message says to read from to skip the damage (None:
    not such a message)."""
    _, found, rest = message.partition("; read from offset ")
    number = rest.partition(" ")[0]
    return int(number) if found and number.isdigit() else None


def corrupt_record_offset(message: str) -> int | None:
    """The offset a ``CORRUPT_RECORD`` message names (None: not such a message)."""
    word, _, rest = message.partition(" ")
    number = rest.partition(" ")[0]
    return int(number) if word == "offset" and number.isdigit() else None
