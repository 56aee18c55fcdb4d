"""Bad input against a live broker process: a clear error, that connection closed, the
broker keeps serving other clients, nothing stored is lost (invariant 5)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Consumer, Producer, create_topic, request_once
from understudy_harness.testing import raw_request, read_frame

pytestmark = pytest.mark.integration

MAX_FRAME = 64 * 1024


@pytest.fixture(scope="module")
def broker(module_brokers: Any) -> Any:
    # A lone master, asynchronous replication: no slave is needed to acknowledge.
    return module_brokers.master(
        "bad-input", extra=["--async", "--max-frame-bytes", str(MAX_FRAME)]
    )


async def _stored(address: str, topic: str, count: int) -> list[bytes]:
    c = Consumer([address], group=f"check-{count}", topic=topic, max_wait_ms=100)
    out: list[bytes] = []
    try:
        while len(out) < count:
            recs = await c.getmany(timeout_s=3)
            if not recs:
                break
            out += [r.body for r in recs]
    finally:
        await c.close()
    return sorted(out)


async def _send_raw_and_read(address: str, data: bytes) -> tuple[p.Frame | None, bool]:
    """Write ``data``; return the broker's answer (if any) and whether it closed."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        try:
            frame: p.Frame | None = await read_frame(reader, timeout_s=3)
        except ConnectionError:
            frame = None
        async with asyncio.timeout(3):
            closed = (await reader.read(1)) == b""
        return frame, closed
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _header_only(length: int) -> bytes:
    return p.HEADER.pack(p.MAGIC, p.VERSION, 0, 42, p.Op.PRODUCE, 0, 0, length, 0)


BAD_INPUTS = {
    "garbage": (b"\x00\x01garbage that is no frame at all" * 4, p.Status.BAD_FRAME),
    "http": (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", p.Status.BAD_FRAME),
    "bad-crc": (
        p.encode_frame(request_id=5, op=p.Op.HEARTBEAT, body=b"{}")[:-2] + b"}}",
        p.Status.BAD_FRAME,
    ),
    "oversized-length": (_header_only(2**31), p.Status.TOO_LARGE),
    "wrong-version": (
        p.encode_frame(request_id=5, op=p.Op.HEARTBEAT, body=b"{}")[:2]
        + b"\x09"
        + p.encode_frame(request_id=5, op=p.Op.HEARTBEAT, body=b"{}")[3:],
        p.Status.BAD_FRAME,
    ),
}


async def test_bad_frames_get_an_error_and_a_closed_connection_only(broker: Any) -> None:
    await create_topic([broker.address], topic="safe", queues=2)
    async with Producer([broker.address]) as prod:
        futs = [await prod.send("safe", b"before-%d" % i) for i in range(50)]
        await prod.flush()
    assert all(f.result()[1] >= 0 for f in futs)

    # A bystander connection stays open across everyone else's bad frames.
    host, port = broker.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for name, (data, status) in BAD_INPUTS.items():
            frame, closed = await _send_raw_and_read(broker.address, data)
            assert frame is not None, name
            assert frame.status == status, (name, frame)
            assert p.error_message(frame), name
            assert closed, name
        writer.write(p.encode_frame(request_id=99, op=p.Op.HEARTBEAT, body=b"{}"))
        hb = await read_frame(reader)
        assert hb.request_id == 99
        assert hb.status == p.Status.OK
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    assert broker.proc is not None
    assert broker.proc.poll() is None
    assert await _stored(broker.address, "safe", 50) == sorted(b"before-%d" % i for i in range(50))


async def test_oversized_frame_is_refused_before_its_body_is_sent(broker: Any) -> None:
    # Only the header: the broker must answer without waiting for 1 GiB of body.
    frame, closed = await _send_raw_and_read(broker.address, _header_only(1 << 30))
    assert frame is not None
    assert frame.status == p.Status.TOO_LARGE
    assert frame.request_id == 42
    assert str(MAX_FRAME) in p.error_message(frame)
    assert closed


async def test_truncated_frame_then_hangup_leaves_the_broker_serving(broker: Any) -> None:
    host, port = broker.address.rsplit(":", 1)
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(p.encode_frame(request_id=1, op=p.Op.HEARTBEAT, body=b'{"sender": "x"}')[:-5])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    frame = await raw_request(broker.address, p.Op.HEARTBEAT, b"{}")
    assert frame.status == p.Status.OK


@pytest.mark.parametrize(
    ("op", "body", "status"),
    [
        (200, b"", p.Status.UNKNOWN_OPERATION),
        (p.Op.GET_STATUS, b"{}", p.Status.UNKNOWN_OPERATION),
        (p.Op.BACKSYNC_OFFSETS, b"{}", p.Status.BAD_FRAME),
        (p.Op.PRODUCE, b"\x00\x04safe\xff\xff\xff\xff", p.Status.BAD_FRAME),
        (p.Op.PULL, b"not a pull", p.Status.BAD_FRAME),
        # JSON nested past Python's recursion limit: bad input with a final answer, not
        # INTERNAL (which clients retry).
        (p.Op.QUEUE_STATS, b"[" * 60_000, p.Status.BAD_FRAME),
        (p.Op.CREATE_TOPIC, b'{"g":' * 12_000, p.Status.BAD_FRAME),
        # A delivery time beyond the longest delay (docs/delayed.md).
        (p.Op.PRODUCE, p.encode_produce("safe", [(0, None, b"x")], None, [2**62]),
         p.Status.BAD_REQUEST),
        (p.Op.CREATE_TOPIC, b'{"topic": "bad name!", "queues": 2}', p.Status.BAD_REQUEST),
        (p.Op.PULL, p.PullRequest("nope", 0, 0, 1000, 0).encode(), p.Status.UNKNOWN_TOPIC),
        (p.Op.PULL, p.PullRequest("safe", 9, 0, 1000, 0).encode(), p.Status.BAD_REQUEST),
        (
            p.Op.PRODUCE,
            p.ProduceRequest("safe", [p.ProduceMessage(7, None, b"x")]).encode(),
            p.Status.BAD_REQUEST,
        ),
        # The batch form: a records section that fails its CRC, a queue the topic does
        # not have, a delivery time beyond the longest delay.
        (p.Op.PRODUCE_BATCH, p.encode_produce_batches("safe", [(0, None, b"x")])[:-1] + b"y",
         p.Status.BAD_FRAME),
        (p.Op.PRODUCE_BATCH, p.encode_produce_batches("safe", [(7, None, b"x")]),
         p.Status.BAD_REQUEST),
        (p.Op.PRODUCE_BATCH, p.encode_produce_batches("safe", [(0, None, b"x")], None, [2**62]),
         p.Status.BAD_REQUEST),
    ],
)
async def test_well_framed_but_invalid_requests_get_a_status_and_keep_the_connection(
    broker: Any, op: int, body: bytes, status: p.Status
) -> None:
    await create_topic([broker.address], topic="safe", queues=2)
    host, port = broker.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(p.encode_frame(request_id=3, op=op, body=body))
        frame = await read_frame(reader)
        assert frame.status == status, p.error_message(frame)
        assert frame.request_id == 3
        # same connection still works
        writer.write(p.encode_frame(request_id=4, op=p.Op.HEARTBEAT, body=b"{}"))
        ok = await read_frame(reader)
        assert (ok.request_id, ok.status) == (4, p.Status.OK)
        assert json.loads(ok.body)["role"] == "master"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_message_over_the_frame_limit_fails_alone(broker: Any) -> None:
    await create_topic([broker.address], topic="big", queues=1)
    async with Producer([broker.address], retries=2, max_batch_bytes=16 * 1024) as prod:
        too_big = await prod.send("big", b"z" * (MAX_FRAME + 1))
        with pytest.raises(BrokerError) as info:
            await too_big
        assert info.value.status == p.Status.TOO_LARGE
        # The producer reconnects and the next message goes through.
        fine = await prod.send("big", b"small")
        assert (await fine)[0] == 0
    assert await _stored(broker.address, "big", 1) == [b"small"]


async def test_a_topic_name_the_log_would_refuse_is_refused_at_create(broker: Any) -> None:
    """'café' passed CREATE_TOPIC (the codec checked ``isalnum()``) and then every produce
    to it failed (the log checks ASCII): now the one rule refuses it at once and nothing
    is created."""
    for name in ("café", ".."):
        body = json.dumps({"topic": name, "queues": 1}).encode()
        frame = await raw_request(broker.address, p.Op.CREATE_TOPIC, body)
        assert frame.status == p.Status.BAD_REQUEST, name
        assert "invalid topic name" in p.error_message(frame)
    route = p.RouteResponse.decode(
        (await raw_request(broker.address, p.Op.GET_ROUTE, p.GetRouteRequest().encode())).body)
    assert "café" not in route.topics
    assert ".." not in route.topics


async def test_a_message_no_consumer_could_receive_is_refused_at_produce(broker: Any) -> None:
    """Issue 14: a body just under the frame limit fitted the PRODUCE frame but not the
    PULL answer carrying it, so it was acknowledged and every consumer stopped at its
    offset for good. Now the largest message accepted is one a consumer can receive."""
    await create_topic([broker.address], topic="edge", queues=1)
    overhead = p.pulled_frame_bytes(None, b"")
    largest = MAX_FRAME - overhead
    # Fits a produce frame (its header is smaller than the pull answer's)...
    too_big = p.encode_produce("edge", [(0, None, b"e" * (largest + 8))])
    assert p.HEADER_SIZE + len(too_big) <= MAX_FRAME
    refused = await raw_request(broker.address, p.Op.PRODUCE, too_big)
    assert refused.status == p.Status.TOO_LARGE
    assert "could never be delivered" in p.error_message(refused)
    accepted = await raw_request(broker.address, p.Op.PRODUCE,
                                 p.encode_produce("edge", [(0, None, b"e" * largest)]))
    assert accepted.status == p.Status.OK, p.error_message(accepted)
    # ...and what was accepted comes back within the frame limit (the refused one was
    # not stored: the queue holds exactly one message).
    pulled = await request_once(broker.address, p.Op.PULL,
                                p.PullRequest("edge", 0, 0, MAX_FRAME, 0).encode(),
                                timeout_s=5, max_frame_bytes=MAX_FRAME)
    resp = p.PullResponse.decode(pulled.body)
    assert [len(r.body) for r in resp.records] == [largest]
    assert resp.queue_end == 1
