"""The fast append path writes exactly the documented batch layout, and deferred sync.

``CommitLog.append`` groups messages by queue and packs each group's records once;
``encode_batch`` / ``encode_eof_marker`` are the plain reference encoders of the
documented layout, and :func:`reference_stream` states the grouping rule on its own. The
bytes on disk must be identical (slaves, older logs and recovery depend on the layout).
"""

from __future__ import annotations

import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from understudy_broker.storage.commitlog import (
    FORMAT_FILE,
    CommitLog,
    FlushPolicy,
    ReplicationCorruptError,
    UnsupportedLogFormatError,
)
from understudy_broker.storage.records import (
    BATCH_END,
    BATCH_RECORD_SIZE,
    EOF_MIN,
    HEADER_END,
    MAX_DELTA,
    PREFIX_SIZE,
    RECORD_MAGIC,
    CorruptRecordError,
    Message,
    check_item,
    decode_item,
    encode_batch,
    encode_eof_marker,
    encode_record,
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
    """The byte stream the documented layout prescribes, built with the plain encoders:
    each run of one topic's messages in an append grouped by queue in the order the
    queues first appear in the run; a group's messages go into batches in order, a batch taking the next one
    while it still fits in the segment with room for a marker and its timestamp is
    within MAX_DELTA of the batch's first; a marker ends a segment when not one more fits."""
    out = bytearray()
    seq = 0
    ends: dict[tuple[str, int], int] = {}
    for batch in batches:
        groups: list[tuple[tuple[str, int], list[Message]]] = []
        run: dict[tuple[str, int], list[Message]] = {}
        for k, m in enumerate(batch):
            if k == 0 or batch[k - 1].topic != m.topic:
                run = {}
            if (m.topic, m.queue) not in run:
                run[(m.topic, m.queue)] = []
                groups.append(((m.topic, m.queue), run[(m.topic, m.queue)]))
            run[(m.topic, m.queue)].append(m)
        for ident, todo in groups:
            while todo:
                seg_end = (len(out) // segment_bytes + 1) * segment_bytes
                size = BATCH_END + len(ident[0].encode())
                take: list[Message] = []
                for m in todo:
                    own = BATCH_RECORD_SIZE + len(m.key or b"") + len(m.body)
                    if (len(out) + size + own + EOF_MIN > seg_end
                            or abs(m.timestamp_ms - todo[0].timestamp_ms) > MAX_DELTA):
                        break
                    take.append(m)
                    size += own
                if not take:
                    out += encode_eof_marker(length=seg_end - len(out), next_seq=seq)
                    continue
                qoff = ends.get(ident, 0)
                out += encode_batch(seq=seq, queue_offset=qoff, messages=take)
                ends[ident] = qoff + len(take)
                seq += len(take)
                todo = todo[len(take):]
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
        for _ in range(30):
            res = master.append([Message("t", 0, None, b"x" * 700, 1)])
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


def _batch(seq: int, qoff: int, count: int = 3) -> bytes:
    return encode_batch(seq=seq, queue_offset=qoff,
                        messages=[Message("t", 0, None, b"m%d" % i, 1 + i) for i in range(count)])


def _flip(item: bytes, at: int) -> bytes:
    return item[:at] + bytes([item[at] ^ 0x01]) + item[at + 1:]


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
        (_batch(5, 2), "expected 2/2"),
        (_batch(2, 7), "diverged from the master"),
        (_flip(_batch(2, 2), len(_batch(2, 2)) - 1), "batch at .* fails its CRC"),
        (_flip(_batch(2, 2), PREFIX_SIZE + 3), "batch at .* fails its CRC"),
        (_batch(2, 2)[:40] + struct.pack(">I", 99) + _batch(2, 2)[44:],  # the count field
         "header fields disagree"),
    ],
    ids=[
        "seq-gap", "queue-offset", "crc", "magic", "length", "field-lengths",
        "topic-utf8", "topic-name", "marker-seq", "marker-length",
        "batch-seq-gap", "batch-queue-offset", "batch-records-crc", "batch-header-crc",
        "batch-count",
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


def test_a_log_of_records_goes_on_with_batches(tmp_path: Path) -> None:
    """A log written before batches (records) is read as it is, and a slave takes
    batches after records: the path for existing data (docs/record-batch.md)."""
    slave = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    try:
        end = slave.append_replicated(0, GOOD + _batch(2, 2))
        assert end == len(GOOD) + len(_batch(2, 2))
    finally:
        slave.close()
    log = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    try:
        log.append([Message("t", 0, None, b"new", 9)])
        got = log.read("t", 0, 0, max_bytes=1 << 20, max_records=10)
        assert [(r.queue_offset, r.seq, r.body) for r in got] == [
            (0, 0, b"payload"), (1, 1, b"payload"), (2, 2, b"m0"), (3, 3, b"m1"),
            (4, 4, b"m2"), (5, 5, b"new")]
        assert [r.timestamp_ms for r in got[2:5]] == [1, 2, 3]
        assert log.read("t", 0, 3, max_bytes=1, max_records=10)[0].body == b"m1"
    finally:
        log.close()
    shutil.rmtree(tmp_path / "index")  # rebuilt from records and batches alike
    (tmp_path / "commitlog" / "recovery-point").unlink(missing_ok=True)
    log = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    try:
        assert log.recovery.index_problems
        assert log.read("t", 0, 0, max_bytes=1 << 20, max_records=10) == got
        assert log.next_seq == 6
    finally:
        log.close()


@pytest.mark.parametrize(("content", "reason"), [
    (b"3\n", "is format 3, written by a newer broker"),
    (b"two", "does not hold a log format number"),
    (b"\xff", "does not hold a log format number"),
])
def test_a_log_of_another_format_is_refused_and_left_as_it_is(
        tmp_path: Path, content: bytes, reason: str) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    log.append([Message("t", 0, None, b"kept", 1)])
    log.close()
    fmt = tmp_path / FORMAT_FILE
    assert fmt.read_bytes() == b"2\n"
    fmt.write_bytes(content)
    segment = tmp_path / "commitlog" / f"{0:020d}"
    before = segment.read_bytes()
    with pytest.raises(UnsupportedLogFormatError, match=reason):
        CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    assert segment.read_bytes() == before
    assert fmt.read_bytes() == content
    fmt.write_bytes(b"1\n")  # a format this broker reads: opened, and said to be its own
    log = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    try:
        assert [r.body for r in log.read("t", 0, 0, max_bytes=1 << 20, max_records=9)] == [
            b"kept"]
    finally:
        log.close()
    assert fmt.read_bytes() == b"2\n"


def _lying_batch(body_len: int) -> bytes:
    """A batch of three whose second record's body length lies, both CRCs matching."""
    buf = bytearray(_batch(2, 2))
    tlen = 1  # topic "t"
    rstart = BATCH_END + tlen
    second = rstart + BATCH_RECORD_SIZE + len(b"m0")
    struct.pack_into(">I", buf, second + 4, body_len)
    struct.pack_into(">I", buf, BATCH_END - 4, zlib.crc32(buf[rstart:]))
    struct.pack_into(">I", buf, 8, zlib.crc32(buf[PREFIX_SIZE:rstart]))
    return bytes(buf)


@pytest.mark.parametrize("body_len", [0, 1, 3, 1000, 2**32 - 1])
def test_a_batch_whose_lengths_lie_under_good_crcs_is_refused_not_misread(
        tmp_path: Path, body_len: int) -> None:
    """Whatever its CRCs say, a batch whose record lengths do not add up is refused by
    the slave's check, and by a read (a CorruptRecordError, never another error or a
    wrong message) had it reached a log some other way."""
    bad = _lying_batch(body_len)
    slave = CommitLog.open(tmp_path, segment_bytes=SEG_SMALL, flush=FlushPolicy("interval"))
    try:
        with pytest.raises(ReplicationCorruptError, match="batch at"):
            slave.append_replicated(0, GOOD + bad)
        assert slave.max_phys == len(GOOD)
    finally:
        slave.close()
    view = memoryview(bad)
    with pytest.raises(CorruptRecordError, match="batch at 7"):
        check_item(view, 0, 7)
    with pytest.raises(CorruptRecordError, match="batch at 7"):
        decode_item(view, 0, 7)


def test_an_append_keeps_topics_in_order_and_regroups_only_a_topics_queues(
        tmp_path: Path) -> None:
    """What is appended after the messages it describes (a producer record after each
    part of a PRODUCE_MULTI) stays after them: a torn tail that keeps it keeps them.
    A topic's own queues are regrouped into one batch each."""
    log = CommitLog.open(tmp_path, segment_bytes=SEG, flush=FlushPolicy("interval"))
    try:
        sent = [Message("a", q % 2, None, b"a%d" % q, 1) for q in range(4)]
        sent += [Message("p", 0, None, b"p1", 1)]
        sent += [Message("b", q % 2, None, b"b%d" % q, 1) for q in range(4)]
        sent += [Message("p", 0, None, b"p2", 1), Message("a", 0, None, b"a-again", 1)]
        result = log.append(sent)
        assert result.queue_offsets == [
            ("a", 0, 0), ("a", 1, 0), ("a", 0, 1), ("a", 1, 1), ("p", 0, 0),
            ("b", 0, 0), ("b", 1, 0), ("b", 0, 1), ("b", 1, 1), ("p", 0, 1), ("a", 0, 2)]
        stored = sorted((r for t, qs in (("a", 2), ("b", 2), ("p", 1)) for q in range(qs)
                         for r in log.read(t, q, 0, max_bytes=1 << 20, max_records=99)),
                        key=lambda r: r.seq)
        assert [r.body for r in stored] == [b"a0", b"a2", b"a1", b"a3", b"p1",
                                            b"b0", b"b2", b"b1", b"b3", b"p2", b"a-again"]
        assert len({r.phys_offset for r in stored}) == 7  # a/0, a/1, p, b/0, b/1, p, a/0
    finally:
        log.close()


def test_a_records_and_a_batchs_header_both_start_with_the_sequence_number() -> None:
    """CommitLog._records_held reads the log's first sequence number with FIRST_SEQ,
    whichever item comes first."""
    from understudy_broker.storage.records import FIRST_SEQ

    record = b"".join(encode_record(seq=41, queue_offset=3, message=Message("t", 0, None,
                                                                           b"x", 1),
                                    topic_raw=b"t"))
    assert FIRST_SEQ.unpack_from(record, PREFIX_SIZE) == (41,)
    assert FIRST_SEQ.unpack_from(_batch(42, 3), PREFIX_SIZE) == (42,)
