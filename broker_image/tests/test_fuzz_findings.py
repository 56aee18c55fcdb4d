"""What the fuzz runs found (docs/fuzzing.md), each kept as a plain regression test:
decoders that let another exception than their documented error escape, a peer's
announced range that was allocated, a slave that stored an end-of-file marker whose
padding was not zeros, and a produce the broker stored before failing on it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import create_topic, request_once
from understudy_broker.replication import wire
from understudy_broker.replication.slave import ReplicationClient
from understudy_broker.storage.commitlog import CommitLog, FlushPolicy, ReplicationCorruptError
from understudy_broker.storage.records import EOF_MIN, Message, encode_eof_marker, encode_record

SEGMENT = 4096


def test_metadata_with_a_number_past_the_int_digit_limit_is_a_protocol_error() -> None:
    """json.loads raises a plain ValueError (not JSONDecodeError) for a number of more
    digits than Python converts; the slave's session let it escape, and its reconnect
    loop, which handles ReplicationError, ended: replication stopped for good."""
    body = b'{"max_phys": ' + b"9" * 5000 + b', "data": {}}'
    with pytest.raises(wire.ReplicationProtocolError, match="bad metadata frame"):
        wire.decode_metadata(body)


async def test_the_slave_session_drops_the_link_on_such_metadata(tmp_path: Path) -> None:
    """The same frame through the slave's whole session: an error its loop handles."""
    body = b'{"max_phys": ' + b"9" * 5000 + b', "data": {}}'
    reader = asyncio.StreamReader()
    reader.feed_data(wire.PUSH_HEADER.pack(wire.METADATA_OFFSET, len(body)) + body)
    reader.feed_eof()
    writer = mock.Mock(drain=mock.AsyncMock())

    async def connect(*_a: Any, **_k: Any) -> tuple[asyncio.StreamReader, Any]:
        return reader, writer

    log = CommitLog.open(tmp_path, segment_bytes=SEGMENT, flush=FlushPolicy("interval"))
    try:
        client = ReplicationClient(log, master_host="127.0.0.1", master_port=1, name="s",
                                   on_metadata=lambda _d: None, on_append=lambda: None)
        with mock.patch.object(asyncio, "open_connection", connect), \
                pytest.raises(wire.ReplicationProtocolError):
            await client._session()
    finally:
        log.close()


@pytest.mark.parametrize(
    ("cls", "doc"),
    [
        # RouteResponse: "groups" of a topic not a list (TypeError from iterating it).
        (p.RouteResponse, {"groups": [], "topics": {"t": {"queues": 1, "groups": 5}}}),
        (p.RouteResponse, {"groups": [], "topics": {"t": {"queues": 1, "groups": None}}}),
        # QueueStatsResponse: a queue key that is no number (ValueError from int()).
        (p.QueueStatsResponse, {"broker": "b", "group": "g", "queues": {
            "action": {"start": 0, "end": 0, "committed": {}}}}),
        (p.QueueStatsResponse, {"broker": "b", "group": "g", "queues": {
            "9" * 5000: {"start": 0, "end": 0, "committed": {}}}}),
    ],
    ids=["route-groups-int", "route-groups-null", "stats-queue-word", "stats-queue-digits"],
)
def test_malformed_json_answers_are_frame_errors(cls: Any, doc: dict[str, Any]) -> None:
    with pytest.raises(p.FrameError) as info:
        cls.decode(json.dumps(doc).encode())
    assert info.value.code == p.Status.BAD_FRAME


def _backsync(escaped: list[list[int]]) -> bytes:
    return json.dumps({"group": "g1", "sender": "s", "epoch": 2, "offsets": {},
                       "escaped": escaped}).encode()


def test_a_back_sync_announcing_a_huge_escaped_range_is_refused_unallocated() -> None:
    """``[[0, 2**62]]`` was expanded into one int per offset: the master's memory ran
    out (the fuzz run's RSS limit caught it) while its event loop stood still."""
    started = time.monotonic()
    with pytest.raises(p.FrameError, match="more than") as info:
        p.BackSyncRequest.decode(_backsync([[0, 2**62]]))
    assert info.value.code == p.Status.BAD_REQUEST
    assert time.monotonic() - started < 1.0


def test_the_escaped_limit_counts_every_range() -> None:
    with mock.patch.object(p, "MAX_ESCAPED", 10):
        assert p.BackSyncRequest.decode(_backsync([[0, 4], [100, 106]])).escaped == (
            0, 1, 2, 3, 100, 101, 102, 103, 104, 105)
        with pytest.raises(p.FrameError, match="more than 10 entries"):
            p.BackSyncRequest.decode(_backsync([[0, 4], [100, 107]]))


def test_a_replicated_end_of_file_marker_with_nonzero_padding_is_refused(tmp_path: Path) -> None:
    """The walker checked a marker's length and next sequence but not its padding: a
    slave stored a marker followed by garbage up to the segment end (a marker carries no
    CRC), which the format says is zeros. Now the bytes are refused and nothing of the
    marker is written; the records before it stay."""
    message = Message("t", 0, None, b"x" * 100, 1)
    good = b"".join(encode_record(seq=0, queue_offset=0, message=message, topic_raw=b"t"))
    marker = bytearray(encode_eof_marker(length=SEGMENT - len(good), next_seq=1))
    marker[EOF_MIN + 7] = 0x5A
    slave = CommitLog.open(tmp_path, segment_bytes=SEGMENT, flush=FlushPolicy("interval"))
    try:
        with pytest.raises(ReplicationCorruptError, match="padding is not all zeros"):
            slave.append_replicated(0, good + bytes(marker))
        assert slave.max_phys == len(good)
        # The same marker with its zeros is taken, and the log rolls to the next segment.
        fixed = encode_eof_marker(length=SEGMENT - len(good), next_seq=1)
        assert slave.append_replicated(len(good), fixed) == SEGMENT
    finally:
        slave.close()


def test_a_producer_sequence_number_past_signed_64_bits_is_refused_by_the_codec() -> None:
    """The trailer carries u64 numbers; the broker's table keeps them in ``array('q')``."""
    body = p.encode_produce("t", [(0, None, b"x"), (0, None, b"y")],
                            producer=(1, [2**63 - 2, 2**63]))
    with pytest.raises(p.FrameError, match="at most") as info:
        p.decode_produce_full(body)
    assert info.value.code == p.Status.BAD_REQUEST
    edge = p.encode_produce("t", [(0, None, b"x")], producer=(1, [p.MAX_PRODUCER_SEQ]))
    assert p.decode_produce_full(edge).producer == (1, [p.MAX_PRODUCER_SEQ])


@pytest.mark.integration
async def test_a_broker_refuses_such_a_produce_and_stores_nothing(brokers: Any) -> None:
    """Found by the live fuzz run: the broker appended the messages, then failed to
    remember their numbers (``OverflowError`` in ``ProducerTable.record``) and answered
    INTERNAL, which clients retry: the retry was stored again, since nothing remembered
    the first copy."""
    broker = brokers.master("seq", extra=["--async"])
    await create_topic([broker.address], topic="t", queues=1)
    body = p.encode_produce("t", [(0, None, b"x")], producer=(77, [2**64 - 1]))
    for _ in range(2):  # as a client retries
        frame = await request_once(broker.address, p.Op.PRODUCE, body)
        assert frame.status == p.Status.BAD_REQUEST, p.error_message(frame)
    pulled = await request_once(broker.address, p.Op.PULL,
                                p.PullRequest("t", 0, 0, 1 << 16, 0).encode())
    assert p.PullResponse.decode(pulled.body).queue_end == 0
    assert "Traceback" not in broker.log()
