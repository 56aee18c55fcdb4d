"""A mutation fuzzer for a live broker over TCP: valid requests of every operation,
mutated (bodies with the frame CRC fixed so they reach the decoders, JSON values swapped
for hostile ones, header fields, cuts), random garbage, truncated frames and headers
announcing huge bodies, sent over many connections.

Self-contained (the standard library and ``understudy_broker``): ``tests/test_fuzz.py``
loads it by path and runs it against a broker process it started; ``fuzz/seeds.py``
writes :func:`example_requests` as the codec targets' seeds. The report says what the
broker answered and which records it may have stored (every message of every frame sent
that is, by the codec, a well-formed PRODUCE), so the caller can check that nothing else
is in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from understudy_broker import protocol as p
from understudy_broker import scheduling as sch
from understudy_broker.storage.offsets import RESERVED_PREFIX

#: ``(topic, queue, key, body)``: a record as a producer sent it.
Sent = tuple[str, int, bytes | None, bytes]

_HOUR_MS = 3_600_000


def example_requests(topic: str, *, queues: int = 4, now_ms: int | None = None
                     ) -> list[tuple[p.Op, bytes]]:
    """One or more valid request bodies per operation, for ``topic`` (a delayed message
    is due a day after ``now_ms``, by default now)."""
    far = (int(time.time() * 1000) if now_ms is None else now_ms) + 24 * _HOUR_MS
    msgs: list[tuple[int, bytes | None, bytes]] = [
        (q % queues, None if q % 2 else b"key-%d" % q, b"example-%d" % q) for q in range(3)]
    return [
        (p.Op.CREATE_TOPIC, p.CreateTopicRequest(topic, queues).encode()),
        (p.Op.PRODUCE, p.encode_produce(topic, msgs)),
        (p.Op.PRODUCE, p.encode_produce(topic, msgs[:1], ("member-1", 3))),
        (p.Op.PRODUCE, p.encode_produce(topic, msgs[:2], None, [far, 0])),
        (p.Op.PRODUCE, p.encode_produce(topic, msgs, producer=(0x5EED, [7, 8, 9]))),
        (p.Op.PULL, p.PullRequest(topic, 0, 0, 65536, 0).encode()),
        (p.Op.PULL, p.PullRequest(topic, 1, 0, 1024, 0, "cg", "member-1", 2).encode()),
        (p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("cg", topic, {0: 1, 1: 0}).encode()),
        (p.Op.COMMIT_OFFSET,
         p.CommitOffsetRequest("cg", topic, {2: 5}, "member-1", 2).encode()),
        (p.Op.FETCH_OFFSET, p.FetchOffsetRequest("cg", topic, [0, 1, 2]).encode()),
        (p.Op.GET_ROUTE, p.GetRouteRequest(topic).encode()),
        (p.Op.GET_ROUTE, p.GetRouteRequest(None, 3, 10).encode()),
        (p.Op.HEARTBEAT, p.HeartbeatRequest("fuzz").encode()),
        (p.Op.BACKSYNC_OFFSETS, p.BackSyncRequest(
            "g1", "s1", 1, {"cg": {topic: {0: 1}}}, (4, 5, 9)).encode()),
        (p.Op.ADMIN_TOPIC, p.AdminTopicRequest(
            "create", topic, ["g1", "g2"], 2, backlog={0: 3}).encode()),
        (p.Op.QUEUE_STATS, p.QueueStatsRequest(topic, [0, 1]).encode()),
        (p.Op.MEMBER_HEARTBEAT, p.MemberHeartbeatRequest(
            "cg", "member-1", [topic], join=True, released=[(topic, 1)]).encode()),
        (p.Op.LEAVE_GROUP, p.LeaveGroupRequest("cg", "member-1").encode()),
        (p.Op.DESCRIBE_GROUP, p.DescribeGroupRequest("cg").encode()),
        (p.Op.LIST_GROUPS, p.ListGroupsRequest().encode()),
        (p.Op.NACK, p.NackRequest("cg", "member-1", 2, topic, 0, 0, 1000, 3).encode()),
        (p.Op.PRODUCE_BATCH, p.encode_produce_batches(topic, sorted(msgs, key=_queue))),
        (p.Op.PRODUCE_BATCH, p.encode_produce_batches(
            topic, sorted(msgs, key=_queue), producer=(0x5EED, [10, 11, 12]))),
        (p.Op.PULL_BATCH, p.PullRequest(topic, 0, 1, 65536, 0).encode()),
    ]


def _queue(message: tuple[int, bytes | None, bytes]) -> int:
    return message[0]


# ------------------------------------------------------------------ mutation

_HOSTILE: list[Any] = [
    None, True, -1, 0, 2**31, 2**63, 2**64, -(2**63), 1e308, "", "x" * 70_000, "a/b",
    "9" * 5000, [], [[[[]]]], {}, {"0": None}, [0, 2**62], [[0, 2**62]], [[5, 1]],
    {"x": {"y": {"-1": 1}}},
]


def _hostile_json(rng: random.Random, body: bytes) -> bytes:
    """The JSON body with one value (or key) replaced by a hostile one."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or not doc or rng.random() < 0.1:
        return json.dumps(rng.choice(_HOSTILE)).encode()
    key = rng.choice(sorted(doc))
    if rng.random() < 0.2:
        doc[rng.choice(["", "9" * 40, "topic", key + "x"])] = doc.pop(key)
    else:
        doc[key] = rng.choice(_HOSTILE)
    return json.dumps(doc).encode()


def _flip(rng: random.Random, data: bytes, n: int) -> bytes:
    buf = bytearray(data)
    for _ in range(n):
        if not buf:
            break
        at = rng.randrange(len(buf))
        kind = rng.randrange(4)
        if kind == 0:
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif kind == 2:
            del buf[at:at + rng.randrange(1, 9)]
        else:
            buf[at:at] = rng.randbytes(rng.randrange(1, 9))
    return bytes(buf)


def _header(op: int, length: int, *, rid: int) -> bytes:
    return p.HEADER.pack(p.MAGIC, p.VERSION, 0, rid, op, 0, 0, length, 0)


@dataclass
class Mutator:
    """Frames from the valid examples: each call to :meth:`frame` is one, of a kind
    picked at random (the kinds are listed in the module docstring)."""

    rng: random.Random
    examples: list[tuple[p.Op, bytes]]
    max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES
    kinds: Counter[str] = field(default_factory=Counter)

    def frame(self, rid: int) -> tuple[bytes, bool]:
        """One frame's bytes, and whether the connection must end after it (a cut frame
        or a header alone: the broker waits for the rest of it)."""
        rng = self.rng
        op, body = rng.choice(self.examples)
        roll = rng.random()
        if roll < 0.30:
            kind, out, last = "body", self._frame(op, _flip(rng, body, rng.randrange(1, 4)), rid), False
        elif roll < 0.50:
            kind = "json" if body[:1] == b"{" else "body"
            mutated = _hostile_json(rng, body) if kind == "json" else _flip(rng, body, 1)
            out, last = self._frame(op, mutated, rid), False
        elif roll < 0.60:
            kind, out, last = "header", self._bad_header(op, body, rid), False
        elif roll < 0.70:
            kind, last = "raw-flip", False
            out = _flip(rng, p.encode_frame(request_id=rid, op=op, body=body), rng.randrange(1, 4))
        elif roll < 0.75:
            kind, out, last = "garbage", rng.randbytes(rng.randrange(1, 200)), True
        elif roll < 0.85:
            kind, last = "cut", True
            whole = p.encode_frame(request_id=rid, op=op, body=body)
            out = whole[:rng.randrange(1, len(whole))]
        elif roll < 0.92:
            kind, last = "announced", True
            length = rng.choice([2**31, 2**32 - 1, self.max_frame_bytes - p.HEADER_SIZE,
                                 self.max_frame_bytes])
            out = _header(op, length, rid=rid) + rng.randbytes(rng.randrange(0, 64))
        else:
            kind, out, last = "valid", self._frame(op, body, rid), False
        self.kinds[kind] += 1
        return out, last

    def _frame(self, op: int, body: bytes, rid: int) -> bytes:
        return p.encode_frame(request_id=rid, op=op, body=body)

    def _bad_header(self, op: int, body: bytes, rid: int) -> bytes:
        rng = self.rng
        fields: dict[str, Any] = {
            "version": p.VERSION, "flags": 0, "op": op, "status": 0, "epoch": 0}
        name = rng.choice(sorted(fields))
        fields[name] = {"version": rng.choice([0, 2, 255]),
                        "flags": rng.choice([1, 2, 0xFF]),
                        "op": rng.choice([0, 17, 31, 200, 0xFFFF]),
                        "status": rng.choice([1, 4, 0xFFFF]),
                        "epoch": rng.choice([1, 2**63, 2**64 - 1])}[name]
        return p.HEADER.pack(p.MAGIC, fields["version"], fields["flags"], rid, fields["op"],
                             fields["status"], fields["epoch"], len(body),
                             zlib.crc32(body)) + body


# ------------------------------------------------------------------ the broker's view


def produced(data: bytes, *, max_frame_bytes: int) -> list[Sent]:
    """Every message the broker may store from ``data`` sent on one connection: the
    messages of every frame in it that decodes (as the broker decodes it) to a
    well-formed PRODUCE request."""
    dec = p.FrameDecoder(max_frame_bytes)
    dec.feed(data)
    out: list[Sent] = []
    with contextlib.suppress(p.FrameError):
        while isinstance(frame := dec.next_frame(), p.Frame):
            if frame.op not in (p.Op.PRODUCE, p.Op.PRODUCE_BATCH) or frame.is_response:
                continue
            try:
                if frame.op == p.Op.PRODUCE:
                    topic, messages = p.decode_produce(frame.body)
                else:
                    req = p.decode_produce_batches(frame.body)
                    topic, messages = req.topic, p.batch_messages(req)
            except p.FrameError:
                continue
            out += [(topic, q, k, b) for q, k, b in messages]
    return out


@dataclass
class Report:
    """What one :func:`hammer` run saw."""

    frames: int = 0
    connections: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    internal: list[str] = field(default_factory=list)  # INTERNAL answers: decoder leaks
    refused: int = 0  # connections the broker did not accept
    possible: set[Sent] = field(default_factory=set)
    kinds: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


def _status_name(status: int) -> str:
    try:
        return p.Status(status).name
    except ValueError:
        return str(status)


async def _connection(address: str, data: bytes, report: Report, timeout_s: float) -> None:
    """Send ``data``, half-close, and read every answer until the broker closes: it
    answers what it decoded, drops a cut frame and cancels long polls at the EOF."""
    host, port = address.rsplit(":", 1)
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        report.refused += 1
        return
    dec = p.FrameDecoder(1 << 30)
    try:
        # OSError: the broker closed first (after a frame error), so the half-close or a
        # write found no peer.
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(timeout_s):
                writer.write(data)
                writer.write_eof()
                await writer.drain()
                while chunk := await reader.read(65536):
                    dec.feed(chunk)
                    while isinstance(frame := dec.next_frame(), p.Frame):
                        report.statuses[_status_name(frame.status)] += 1
                        if frame.status == p.Status.INTERNAL:
                            report.internal.append(p.error_message(frame))
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def hammer(address: str, *, topic: str, seconds: float, frames: int, seed: int,
                 max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES, parallel: int = 8,
                 answer_timeout_s: float = 10.0) -> Report:
    """Send up to ``frames`` fuzzed frames (or for ``seconds``) to ``address`` over many
    connections, ``parallel`` at a time, 1 to 8 frames each."""
    rng = random.Random(seed)
    mut = Mutator(rng, example_requests(topic), max_frame_bytes)
    report = Report()
    start = time.monotonic()
    rid = 0

    def batch() -> tuple[bytes, int]:
        nonlocal rid
        parts: list[bytes] = []
        for _ in range(rng.randrange(1, 9)):
            rid += 1
            out, last = mut.frame(rid)
            parts.append(out)
            if last:
                break
        return b"".join(parts), len(parts)

    while report.frames < frames and time.monotonic() - start < seconds:
        jobs = []
        for _ in range(parallel):
            data, n = batch()
            report.frames += n
            report.connections += 1
            report.possible.update(produced(data, max_frame_bytes=max_frame_bytes))
            jobs.append(_connection(address, data, report, answer_timeout_s))
        await asyncio.gather(*jobs)
    report.kinds = mut.kinds
    report.seconds = time.monotonic() - start
    return report


def stored_sent(topic: str, queue: int, key: bytes | None, body: bytes) -> Sent | None:
    """A stored record as the message a producer sent: a record of the schedule topic is
    its ENTRY's message; a DONE record, and the records of the broker's other reserved
    topics (committed offsets, producer state), are the broker's own (None)."""
    if topic == sch.SCHEDULE_TOPIC:
        entry = sch.decode(body)
        return None if isinstance(entry, list) else (entry.topic, entry.queue, key, entry.payload)
    if topic.startswith(RESERVED_PREFIX):
        return None
    return (topic, queue, key, body)


def announcing(length: int, *, rid: int) -> bytes:
    """A PRODUCE frame header announcing ``length`` body bytes, without the body."""
    return _header(p.Op.PRODUCE, length, rid=rid)
