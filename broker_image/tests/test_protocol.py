"""The codec without a socket: round-trips for every body type, and every kind of bad
input the decoder must reject with a clear error."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from understudy_broker import protocol as p
from understudy_broker.storage.records import (
    InvalidMessageError,
    Message,
    encode_batch,
    encode_record,
    topic_bytes,
)

topics = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=30).filter(
    lambda t: t not in (".", ".."))
queues = st.integers(min_value=0, max_value=p.MAX_QUEUES)
offsets = st.integers(min_value=0, max_value=(1 << 63) - 1)
keys = st.none() | st.binary(max_size=40)
bodies = st.binary(max_size=300)


def roundtrip(obj: object) -> object:
    encoded = obj.encode()  # type: ignore[attr-defined]
    return type(obj).decode(encoded)  # type: ignore[attr-defined]


@given(topics, st.lists(st.builds(p.ProduceMessage, queues, keys, bodies), max_size=20))
def test_produce_request_roundtrip(topic: str, messages: list[p.ProduceMessage]) -> None:
    req = p.ProduceRequest(topic, messages)
    out = roundtrip(req)
    assert isinstance(out, p.ProduceRequest)
    assert out.topic == topic
    assert list(out.messages) == messages


def test_a_produce_carries_the_producer_lease_after_its_messages() -> None:
    """An ordered topic's PRODUCE names the active producer and its generation
    (docs/ordered.md); a body without one decodes as before."""
    msgs = [(0, b"k", b"v"), (0, None, b"w")]
    body = p.encode_produce("t", msgs, ("host-1-ab", 7))
    assert p.decode_produce_full(body) == p.ProduceBody("t", msgs, ("host-1-ab", 7))
    assert p.decode_produce(body) == ("t", msgs)
    assert p.decode_produce_full(p.encode_produce("t", msgs)) == p.ProduceBody("t", msgs)


def test_a_produce_carries_the_idempotent_producer_numbers_last() -> None:
    """Every trailer at once, in order; a count that does not match is a clear error."""
    msgs = [(0, b"k", b"v"), (1, None, b"w")]
    body = p.encode_produce("t", msgs, ("m", 2), [0, 5], (2**64 - 1, [7, 0]))
    assert p.decode_produce_full(body) == p.ProduceBody("t", msgs, ("m", 2), [0, 5],
                                                        (2**64 - 1, [7, 0]))
    assert p.decode_produce_full(p.encode_produce("t", msgs, producer=(3, [1, 2]))).producer \
        == (3, [1, 2])
    bad = (p.encode_produce("t", msgs) + bytes([3]) + (3).to_bytes(8, "big")
           + (1).to_bytes(4, "big") + (9).to_bytes(8, "big"))
    with pytest.raises(p.FrameError, match="1 sequence numbers for 2 messages"):
        p.decode_produce_full(bad)
    with pytest.raises(p.FrameError, match="body truncated"):
        p.decode_produce_full(p.encode_produce("t", msgs, producer=(3, [1, 2]))[:-3])
    with pytest.raises(ValueError, match="one sequence number per message"):
        p.encode_produce("t", msgs, producer=(3, [1]))


@given(topics, st.lists(st.tuples(queues, keys, bodies), max_size=20),
       st.booleans(), st.booleans())
def test_batch_form_produce_round_trips_with_every_trailer(
        topic: str, messages: list[tuple[int, bytes | None, bytes]], lease: bool,
        numbered: bool) -> None:
    """A batch-form PRODUCE holds one batch per run of one queue's messages and gives the
    messages back in order, trailers included (one entry per message, in that order)."""
    messages.sort(key=lambda m: m[0])
    n = len(messages)
    producer = (9, list(range(n))) if numbered else None
    deliver = [5 * i for i in range(n)] if lease else None
    body = p.encode_produce_batches(topic, messages, ("m", 3) if lease else None, deliver,
                                    producer)
    req = p.decode_produce_batches(body)
    assert p.batch_messages(req) == messages
    assert [b[0] for b in req.batches] == sorted({q for q, _k, _b in messages})
    assert req.total == n
    assert (req.lease, req.deliver_at, req.producer) == (
        ("m", 3) if lease else None, deliver if deliver and any(deliver) else None, producer)
    out = roundtrip(p.ProduceBatchRequest(topic, [p.ProduceMessage(*m) for m in messages]))
    assert isinstance(out, p.ProduceBatchRequest)
    assert [(m.queue, m.key, m.body) for m in out.messages] == messages


def _one_batch(section: bytes, count: int, crc: int | None = None) -> bytes:
    head = struct.pack(">IIII", 0, count, zlib.crc32(section) if crc is None else crc,
                       len(section))
    return b"\x00\x01t" + struct.pack(">I", 1) + head + section


@pytest.mark.parametrize(("body", "error"), [
    (_one_batch(struct.pack(">iIi", -1, 1, 0) + b"x", 1, crc=7), "fail their CRC"),
    (_one_batch(struct.pack(">iIi", -1, 2, 0) + b"x", 1), "disagree with its length"),
    (_one_batch(struct.pack(">iIi", -1, 0, 0) + b"x", 1), "disagree with its length"),
    (_one_batch(struct.pack(">iIi", -1, 1, 0) + b"x", 2), "run past its end"),
    (_one_batch(struct.pack(">iIi", -1, 1, 0) + b"x", 0), "holds 0 records"),
    (_one_batch(struct.pack(">iIi", -2, 1, 0) + b"x", 1), "key length -2"),
    (_one_batch(struct.pack(">iIi", -1, 1, 5) + b"x", 1), "timestamp delta is not 0"),
    (_one_batch(struct.pack(">iIiiIi", -1, 0, 0, -1, 0, 9), 2), "timestamp delta 9"),
    (_one_batch(struct.pack(">iIi", -1, 1, 0) + b"x", 1)[:-1], "body truncated"),
    (_one_batch(struct.pack(">iIi", -1, 1, 0) + b"x", 1) + b"\x07", "trailing bytes"),
    (b"\x00\x01t" + struct.pack(">I", 1 << 30), "exceeds the body size"),
])
def test_a_bad_batch_form_produce_is_refused_with_what_is_wrong(body: bytes,
                                                              error: str) -> None:
    """Each batch is checked once (its CRC, its records' lengths, the broker's clock):
    what disagrees is a BAD_FRAME naming the queue's batch, and nothing is decoded."""
    with pytest.raises(p.FrameError, match=error) as info:
        p.decode_produce_batches(body)
    assert info.value.code == p.Status.BAD_FRAME


@given(st.lists(st.tuples(queues, offsets), max_size=50))
def test_produce_response_roundtrip(pairs: list[tuple[int, int]]) -> None:
    out = roundtrip(p.ProduceResponse(pairs))
    assert isinstance(out, p.ProduceResponse)
    assert list(out.offsets) == pairs


@given(topics, queues, offsets, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_pull_request_roundtrip(topic: str, q: int, off: int, mb: int, wait: int) -> None:
    req = p.PullRequest(topic, q, off, mb, wait)
    assert roundtrip(req) == req


@given(
    offsets,
    offsets,
    offsets,
    st.lists(
        st.builds(p.PulledRecord, offsets, st.integers(-(2**63), 2**63 - 1), keys, bodies),
        max_size=20,
    ),
)
def test_pull_response_roundtrip(
    nxt: int, start: int, end: int, records: list[p.PulledRecord]
) -> None:
    out = roundtrip(p.PullResponse(nxt, start, end, records))
    assert isinstance(out, p.PullResponse)
    assert (out.next_offset, out.queue_start, out.queue_end) == (nxt, start, end)
    assert list(out.records) == records


@given(topics, st.integers(1, p.MAX_QUEUES), st.booleans())
def test_topic_roundtrip(topic: str, n: int, created: bool) -> None:
    assert roundtrip(p.CreateTopicRequest(topic, n)) == p.CreateTopicRequest(topic, n)
    resp = p.CreateTopicResponse(topic, n, created)
    assert roundtrip(resp) == resp


@given(st.text(max_size=20), topics, st.dictionaries(queues, offsets, max_size=10))
def test_offset_bodies_roundtrip(group: str, topic: str, offs: dict[int, int]) -> None:
    out = roundtrip(p.CommitOffsetRequest(group, topic, offs))
    assert isinstance(out, p.CommitOffsetRequest)
    assert (out.group, out.topic, dict(out.offsets)) == (group, topic, offs)
    assert (out.member, out.generation) == ("", 0)
    member = roundtrip(p.CommitOffsetRequest(group, topic, offs, "m-1", 7))
    assert isinstance(member, p.CommitOffsetRequest)
    assert (member.member, member.generation) == ("m-1", 7)
    fetch = roundtrip(p.FetchOffsetRequest(group, topic, sorted(offs)))
    assert isinstance(fetch, p.FetchOffsetRequest)
    assert list(fetch.queues) == sorted(offs)
    mixed: dict[int, int | None] = {**offs, 70000 % 65535: None}
    resp = roundtrip(p.OffsetsResponse(mixed))
    assert isinstance(resp, p.OffsetsResponse)
    assert dict(resp.offsets) == mixed


brokers = st.builds(
    p.BrokerRoute,
    st.text(max_size=10),
    st.text(max_size=20),
    st.sampled_from(["master", "slave"]),
    st.integers(0, 3),
    st.integers(0, 2**40),
    st.booleans(),
)


@given(
    st.lists(st.builds(p.GroupRoute, st.text(max_size=8), st.lists(brokers, max_size=3)), max_size=3),
    st.dictionaries(topics, st.integers(1, 64), max_size=4),
)
def test_route_and_heartbeat_roundtrip(groups: list[p.GroupRoute], tmap: dict[str, int]) -> None:
    tg = {t: [g.group for g in groups] for t in tmap}
    out = roundtrip(p.RouteResponse(groups, tmap, tg))
    assert isinstance(out, p.RouteResponse)
    assert [(g.group, list(g.brokers)) for g in out.groups] == [
        (g.group, list(g.brokers)) for g in groups
    ]
    assert dict(out.topics) == tmap
    assert {k: list(v) for k, v in out.topic_groups.items()} == tg
    hb = p.HeartbeatResponse("b0", "g", "master", 3, 7, 1234)
    assert roundtrip(hb) == hb
    assert roundtrip(p.HeartbeatRequest("me")) == p.HeartbeatRequest("me")
    assert roundtrip(p.GetRouteRequest("t")) == p.GetRouteRequest("t")


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.sampled_from(list(p.Op)), offsets, bodies),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 97),
)
def test_decoder_reassembles_frames_from_any_chunking(
    frames: list[tuple[int, p.Op, int, bytes]], chunk: int
) -> None:
    wire = b"".join(
        p.encode_frame(request_id=rid, op=op, epoch=ep, body=body) for rid, op, ep, body in frames
    )
    dec = p.FrameDecoder(max_frame_bytes=4096)
    out = []
    for i in range(0, len(wire), chunk):
        dec.feed(wire[i : i + chunk])
        while True:
            f = dec.next_frame()
            if f is p.NEED_DATA:
                break
            out.append(f)
    assert [(f.request_id, f.op, f.epoch, f.body) for f in out] == frames  # type: ignore[union-attr]
    assert dec.buffered == 0


def test_truncated_frame_waits_for_more_data() -> None:
    wire = p.encode_frame(request_id=1, op=p.Op.HEARTBEAT, body=b"{}")
    dec = p.FrameDecoder()
    dec.feed(wire[:-1])
    assert dec.next_frame() is p.NEED_DATA
    dec.feed(wire[-1:])
    frame = dec.next_frame()
    assert isinstance(frame, p.Frame)
    assert frame.body == b"{}"


def test_bad_crc_is_bad_frame() -> None:
    wire = bytearray(p.encode_frame(request_id=9, op=p.Op.HEARTBEAT, body=b"{}"))
    wire[-1] ^= 0xFF
    dec = p.FrameDecoder()
    dec.feed(wire)
    with pytest.raises(p.FrameError) as info:
        dec.next_frame()
    assert info.value.code is p.Status.BAD_FRAME
    assert info.value.request_id == 9
    assert "CRC" in info.value.message
    # the decoder stays failed: the stream is out of sync
    with pytest.raises(p.FrameError):
        dec.next_frame()


def test_oversized_length_rejected_from_the_header_alone() -> None:
    header = p.HEADER.pack(p.MAGIC, p.VERSION, 0, 5, p.Op.PRODUCE, 0, 0, 2**32 - 1, 0)
    dec = p.FrameDecoder(max_frame_bytes=1024)
    dec.feed(header)  # not one body byte has arrived
    with pytest.raises(p.FrameError) as info:
        dec.next_frame()
    assert info.value.code is p.Status.TOO_LARGE
    assert info.value.request_id == 5
    assert dec.buffered == p.HEADER_SIZE


def test_garbage_bytes_are_bad_frame() -> None:
    dec = p.FrameDecoder()
    dec.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(p.FrameError) as info:
        dec.next_frame()
    assert info.value.code is p.Status.BAD_FRAME
    assert "magic" in info.value.message


def test_wrong_version_is_bad_frame() -> None:
    wire = bytearray(p.encode_frame(request_id=3, op=p.Op.HEARTBEAT))
    wire[2] = 99
    dec = p.FrameDecoder()
    dec.feed(wire)
    with pytest.raises(p.FrameError, match="version 99"):
        dec.next_frame()


@pytest.mark.parametrize(
    ("cls", "body"),
    [
        (p.ProduceRequest, b""),
        (p.ProduceRequest, struct.pack(">H", 1) + b"t" + struct.pack(">I", 3)),
        (p.ProduceRequest, p.ProduceRequest("t", [p.ProduceMessage(0, b"k", b"v")]).encode() + b"x"),
        (p.ProduceRequest, p.ProduceRequest("t", [p.ProduceMessage(0, None, b"vvvv")]).encode()[:-2]),
        # a producer lease cut short, or followed by more bytes
        (p.ProduceRequest, p.encode_produce("t", [(0, None, b"v")], ("m", 3))[:-3]),
        (p.ProduceRequest, p.encode_produce("t", [(0, None, b"v")], ("m", 3)) + b"\x00"),
        (p.PullRequest, b"\x00\x01t"),
        (p.PullResponse, struct.pack(">QQQI", 0, 0, 0, 10**9)),
        (p.ProduceResponse, struct.pack(">I", 4)),
        (p.CreateTopicRequest, b"not json"),
        (p.CreateTopicRequest, b"[1,2]"),
        (p.CreateTopicRequest, b'{"topic": "t"}'),
        (p.CreateTopicRequest, b'{"topic": "t", "queues": "4"}'),
        (p.CommitOffsetRequest, b'{"group": "g", "topic": "t", "offsets": {"x": 1}}'),
        (p.CommitOffsetRequest, b'{"group": "g", "topic": "t", "offsets": {"0": -1}}'),
        (p.CommitOffsetRequest, b'{"group": "g", "topic": "t", "offsets": {}, "member": 3}'),
        (p.CommitOffsetRequest,
         b'{"group": "g", "topic": "t", "offsets": {}, "member": "m", "generation": -1}'),
        (p.FetchOffsetRequest, b'{"group": "g", "topic": "t", "queues": [70000]}'),
        (p.HeartbeatResponse, b"\xff\xfe"),
    ],
)
def test_malformed_bodies_are_rejected_with_a_message(cls: type, body: bytes) -> None:
    with pytest.raises(p.FrameError) as info:
        cls.decode(body)  # type: ignore[attr-defined]
    assert info.value.code is p.Status.BAD_FRAME
    assert info.value.message


@pytest.mark.parametrize("body", [b'{"topic": "a b", "queues": 1}', b'{"topic": "t", "queues": 0}'])
def test_invalid_topic_requests_are_bad_request(body: bytes) -> None:
    with pytest.raises(p.FrameError) as info:
        p.CreateTopicRequest.decode(body)
    assert info.value.code is p.Status.BAD_REQUEST


@pytest.mark.parametrize("name", ["café", ".", "..", "naïve", "x" * 201, "a/b", ""])
def test_names_the_log_refuses_are_refused_by_the_codec(name: str) -> None:
    """One topic-name rule: CREATE_TOPIC used to accept names such as 'café' (the codec
    checked ``isalnum()``) that every later produce refused (the log checks ASCII)."""
    with pytest.raises(p.FrameError) as info:
        p.CreateTopicRequest.decode(json.dumps({"topic": name, "queues": 1}).encode())
    assert info.value.code is p.Status.BAD_REQUEST
    with pytest.raises(InvalidMessageError):
        topic_bytes(name)


@given(st.text(max_size=210))
def test_the_codec_accepts_exactly_the_topic_names_the_log_stores(topic: str) -> None:
    refusal: p.Status | None = None
    try:
        p.CreateTopicRequest.decode(json.dumps({"topic": topic, "queues": 1}).encode())
    except p.FrameError as exc:
        refusal = exc.code
    assert refusal in (None, p.Status.BAD_REQUEST)
    codec_ok = refusal is None
    try:
        topic_bytes(topic)
        log_ok = True
    except InvalidMessageError:
        log_ok = False
    assert codec_ok == log_ok


def test_error_response_carries_the_message() -> None:
    req = p.Frame(11, p.Op.PULL, 0, 0, 0, b"")
    wire = p.encode_error(request_id=11, op=req.op, status=p.Status.NO_PERMISSION, message="no READ")
    dec = p.FrameDecoder()
    dec.feed(wire)
    frame = dec.next_frame()
    assert isinstance(frame, p.Frame)
    assert frame.is_response
    assert frame.status == p.Status.NO_PERMISSION
    assert p.error_message(frame) == "no READ"
    assert zlib.crc32(frame.body) == struct.unpack_from(">I", wire, 24)[0]


def test_every_operation_has_body_types_or_is_reserved() -> None:
    reserved = {p.Op.BACKSYNC_OFFSETS, p.Op.GET_STATUS}
    for op in p.Op:
        assert (op in p.REQUEST_TYPES and op in p.RESPONSE_TYPES) or op in reserved


def test_pull_multi_bodies_round_trip_each_part_as_a_pull() -> None:
    parts = [p.PullRequest("a", 0, 5, 1 << 20, 500).encode(),
             p.PullRequest("b", 3, 0, 4096, 500, "cg", "m1", 7).encode()]
    decoded = p.PullMultiRequest.decode(p.PullMultiRequest(parts).encode())
    assert [p.PullRequest.decode(b) for b in decoded.parts] == [
        p.PullRequest("a", 0, 5, 1 << 20, 500), p.PullRequest("b", 3, 0, 4096, 500, "cg", "m1", 7)]
    results = [(p.Status.OK, p.PullResponse(6, 0, 6, [p.PulledRecord(5, 1, None, b"x")]).encode()),
               (p.Status.NOT_OWNER, b"m1 does not own b/3")]
    back = p.PullMultiResponse.decode(p.PullMultiResponse(results).encode()).results
    assert back == results
    assert p.PullResponse.decode(back[0][1]).records[0].body == b"x"
    with pytest.raises(p.FrameError, match="1 to 4096 parts"):
        p.PullMultiRequest.decode(b"\x00\x00")


def test_produce_multi_bodies_round_trip_and_reject_what_they_cannot_hold() -> None:
    parts = [p.encode_produce("a", [(0, None, b"x")]), p.encode_produce("b", [(1, b"k", b"y")])]
    assert p.ProduceMultiRequest.decode(p.ProduceMultiRequest(parts).encode()).parts == parts
    results = [(p.Status.OK, p.ProduceResponse([(0, 7)]).encode()), (p.Status.UNKNOWN_TOPIC, b"no b")]
    assert p.ProduceMultiResponse.decode(p.ProduceMultiResponse(results).encode()).results == results
    with pytest.raises(ValueError, match="1 to 4096 parts"):
        p.ProduceMultiRequest([]).encode()
    with pytest.raises(p.FrameError, match="unknown status 999"):
        p.ProduceMultiResponse.decode(b"\x00\x01\x03\xe7\x00\x00\x00\x00")
    with pytest.raises(p.FrameError, match="exceeds the body size"):
        p.ProduceMultiRequest.decode(b"\x0f\xff\x00")


@given(offset=st.integers(0, 2**63), span=st.integers(1, 5000),
       detail=st.text(max_size=60))
def test_a_corrupt_record_message_names_the_offset_and_where_to_skip_to(
        offset: int, span: int, detail: str) -> None:
    """A client reads both numbers back from the text, whatever the detail says; the
    skip is past the whole damaged batch, and an older broker's message skips one."""
    message = p.corrupt_record_message(offset, detail, offset + span)
    assert p.corrupt_record_offset(message) == offset
    assert p.corrupt_record_skip_to(message) == offset + span
    assert p.corrupt_record_skip_to(p.corrupt_record_message(offset, detail)) == offset + 1
    assert p.corrupt_record_skip_to("no such thing") is None


def test_a_pull_batch_answer_gives_the_messages_from_its_from_offset() -> None:
    """PULL_BATCH carries stored items (batches, and records of the older format) as
    they are; the client checks each and gives the messages from the answer's from
    offset on: the first item may start before it."""
    batch = encode_batch(seq=10, queue_offset=4, messages=[
        ("t", 1, None, b"four", 100), ("t", 1, b"k", b"five", 101), ("t", 1, None, b"six", 103)])
    record = b"".join(encode_record(seq=13, queue_offset=7, topic_raw=b"t",
                                    message=Message("t", 1, None, b"seven", 104)))
    body = p.encode_pull_batches(8, 0, 9, 5, [batch, record])
    resp = p.decode_pull_batches(body)
    assert (resp.next_offset, resp.queue_start, resp.queue_end) == (8, 0, 9)
    assert resp.records == [p.PulledRecord(5, 101, b"k", b"five"),
                            p.PulledRecord(6, 103, None, b"six"),
                            p.PulledRecord(7, 104, None, b"seven")]
    assert p.PullBatchResponse.decode(p.encode_pull_batches(4, 0, 4, 4, [])).records == []


@pytest.mark.parametrize(("cut", "error"), [
    (lambda b: b[:-1], "damaged"),  # the last item's bytes end early
    (lambda b: b[:60] + bytes([b[60] ^ 1]) + b[61:], "damaged"),  # a flipped bit
    (lambda b: b + b"\x00", "trailing bytes"),  # more than the items it counts
    (lambda b: b[:32] + b"\x00\x00\x00\x02" + b[36:], "truncated"),  # fewer than it counts
])
def test_a_damaged_pull_batch_answer_is_a_bad_frame(cut: Any, error: str) -> None:
    batch = encode_batch(seq=0, queue_offset=0, messages=[("t", 0, None, b"x" * 40, 1)])
    with pytest.raises(p.FrameError, match=error) as info:
        p.decode_pull_batches(cut(p.encode_pull_batches(1, 0, 1, 0, [batch])))
    assert info.value.code == p.Status.BAD_FRAME
