"""The fast append path writes exactly the documented record layout, and deferred sync.

``CommitLog.append`` encodes into one preallocated buffer; ``encode_record`` /
``encode_eof_marker`` are the plain reference encoders of the documented layout. The
bytes on disk must be identical (slaves, older logs and recovery depend on the layout).
"""

from __future__ import annotations

import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from understudy_broker.storage.commitlog import CommitLog, FlushPolicy, ReplicationCorruptError
from understudy_broker.storage.records import (
    EOF_MIN,
    HEADER_END,
    PREFIX_SIZE,
    RECORD_MAGIC,
    Message,
    encode_eof_marker,
    encode_record,
    record_size,
)

SEG = 8 << 10

messages_st = st.builds(
    Message,
    topic=st.sampled_from(["orders", "audit.log", "t-1"]),
    queue=st.integers(0, 3),
    key=st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=16)),
    body=st.binary(max_size=3000),
    timestamp_ms=st.integers(-(2**40), 2**62),
)


def reference_stream(batches: list[list[Message]], segment_bytes: int) -> bytes:
    """The byte stream the documented layout prescribes, built with the plain encoders."""
    out = bytearray()
    seq = 0
    ends: dict[tuple[str, int], int] = {}
    for batch in batches:
        for m in batch:
            raw = m.topic.encode()
            size = record_size(topic_len=len(raw), key=m.key, body_len=len(m.body))
            seg_end = (len(out) // segment_bytes + 1) * segment_bytes
            if len(out) + size + EOF_MIN > seg_end:
                out += encode_eof_marker(length=seg_end - len(out), next_seq=seq)
            qoff = ends.get((m.topic, m.queue), 0)
            ends[(m.topic, m.queue)] = qoff + 1
            out += b"".join(encode_record(seq=seq, queue_offset=qoff, message=m, topic_raw=raw))
            seq += 1
    return bytes(out)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(messages_st, max_size=10), min_size=1, max_size=8))
def test_append_writes_the_reference_layout_byte_for_byte(batches: list[list[Message]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = CommitLog.open(Path(tmp), segment_bytes=SEG, flush=FlushPolicy("interval"))
        try:
            for batch in batches:
                log.append(batch)
            on_disk = b"".join(
                p.read_bytes() for p in sorted((Path(tmp) / "commitlog").iterdir())
            )
        finally:
            log.close()
    assert on_disk == reference_stream(batches, SEG)


def test_deferred_sync_acknowledges_only_after_flush(tmp_path: Path) -> None:
    seg = 64 << 10  # one segment holds the whole test
    master = CommitLog.open(tmp_path / "m", segment_bytes=seg, flush=FlushPolicy("interval"))
    slave = CommitLog.open(tmp_path / "s", segment_bytes=seg, flush=FlushPolicy("batch"))
    try:
        res = master.append([Message("t", 0, None, b"x" * 700, 1) for _ in range(30)])
        raw = master.read_raw(0, res.end_phys)
        # Inline (default): the batch policy fsyncs inside append_replicated.
        first = slave.append_replicated(0, raw[:3000])
        assert slave.flushed_phys == first > 0
        # Deferred: written and visible, not yet durable, until flush().
        end = slave.append_replicated(first, raw[first:], defer_sync=True)
        assert end > first
        assert slave.flushed_phys == first
        assert slave.max_phys == end
        slave.flush()
        assert slave.flushed_phys == end
        assert slave.read("t", 0, 0, max_bytes=1 << 20, max_records=100)[-1].queue_offset == 29
    finally:
        master.close()
        slave.close()


def _rec(seq: int, qoff: int, *, topic_raw: bytes = b"t", body: bytes = b"payload") -> bytes:
    message = Message("t", 0, None, body, 1)
    return b"".join(encode_record(seq=seq, queue_offset=qoff, message=message, topic_raw=topic_raw))


def _with_body_len(record: bytes, body_len: int) -> bytes:
    """A record whose body-length field lies, with a CRC that matches the lie."""
    buf = bytearray(record)
    struct.pack_into(">I", buf, HEADER_END - 4, body_len)
    struct.pack_into(">I", buf, 8, zlib.crc32(buf[PREFIX_SIZE:]))
    return bytes(buf)


def _flip_last_byte(record: bytes) -> bytes:
    return record[:-1] + bytes([record[-1] ^ 0xFF])


GOOD = _rec(0, 0) + _rec(1, 1)
SEG_SMALL = 4096


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (_rec(5, 2), "expected 2/2"),
        (_rec(2, 7), "diverged from the master"),
        (_flip_last_byte(_rec(2, 2)), "CRC"),
        (struct.pack(">II", 40, 0x12345678) + bytes(32), "bad magic"),
        (struct.pack(">II", 5, RECORD_MAGIC) + bytes(40), "impossible length"),
        (_with_body_len(_rec(2, 2), 3), "field lengths disagree"),
        (_rec(2, 0, topic_raw=b"\xff\xfe"), "not utf-8"),
        (_rec(2, 0, topic_raw=b"a/b"), "invalid topic"),
        (encode_eof_marker(length=SEG_SMALL - len(GOOD), next_seq=99), "says next seq 99"),
        (encode_eof_marker(length=100, next_seq=2), "end-of-file marker at"),
    ],
    ids=[
        "seq-gap", "queue-offset", "crc", "magic", "length", "field-lengths",
        "topic-utf8", "topic-name", "marker-seq", "marker-length",
    ],
)
def test_bad_replicated_bytes_keep_the_good_prefix_and_write_nothing_else(
    tmp_path: Path, bad: bytes, reason: str
) -> None:
    slave = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    try:
        with pytest.raises(ReplicationCorruptError, match=reason):
            slave.append_replicated(0, GOOD + bad + _rec(9, 9))
        assert slave.max_phys == len(GOOD)
        assert [r.seq for r in slave.read("t", 0, 0, max_bytes=1 << 20, max_records=10)] == [0, 1]
    finally:
        slave.close()
    reopened = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    try:
        assert reopened.max_phys == len(GOOD)
        assert reopened.recovery.truncated_bytes == 0
    finally:
        reopened.close()
