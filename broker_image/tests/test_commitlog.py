"""Commit log: round trips, segment rolls, indexes, retention, flush policy (real files)."""

from __future__ import annotations

import itertools
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from understudy_broker.storage.commitlog import (
    CommitLog,
    FlushPolicy,
    Retention,
    SegmentInfo,
    segments_to_delete,
)
from understudy_broker.storage.records import (
    BATCH_RECORD_SIZE,
    EOF_MAGIC,
    EOF_MARKER,
    InvalidMessageError,
    Message,
    MessageTooLargeError,
    PackedBatch,
    StoredRecord,
    decode_item,
    encode_records,
)

SEG = 8 << 10  # small segments so a few hundred records roll several times

messages_st = st.builds(
    Message,
    topic=st.sampled_from(["orders", "audit.log", "t-1"]),
    queue=st.integers(0, 3),
    key=st.one_of(st.none(), st.binary(max_size=16)),
    body=st.binary(max_size=1500),
    timestamp_ms=st.integers(0, 2**62),
)
batches_st = st.lists(st.lists(messages_st, min_size=0, max_size=12), min_size=1, max_size=12)


def read_all(
    log: CommitLog, topic: str, queue: int, *, max_bytes: int = 1 << 30
) -> list[StoredRecord]:
    out: list[StoredRecord] = []
    offset = log.queue_start(topic, queue)
    while True:
        got = log.read(topic, queue, offset, max_bytes=max_bytes, max_records=7)
        if not got:
            return out
        out.extend(got)
        offset = got[-1].queue_offset + 1


def expected_by_queue(batches: list[list[Message]]) -> dict[tuple[str, int], list[Message]]:
    out: dict[tuple[str, int], list[Message]] = {}
    for batch in batches:
        for m in batch:
            out.setdefault((m.topic, m.queue), []).append(m)
    return out


def snapshot_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=batches_st, max_bytes=st.integers(1, 5000))
def test_append_reopen_read_back_equal(batches: list[list[Message]], max_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        log = CommitLog.open(Path(d), segment_bytes=SEG)
        results = [log.append(b) for b in batches]
        for b, r in zip(batches, results, strict=True):
            assert [(t, q) for t, q, _ in r.queue_offsets] == [(m.topic, m.queue) for m in b]
        end, seq = log.max_phys, log.next_seq
        log.close()
        log = CommitLog.open(Path(d), segment_bytes=SEG)
        try:
            assert (log.max_phys, log.next_seq) == (end, seq)
            assert log.recovery.truncated_bytes == 0
            want = expected_by_queue(batches)
            for (topic, queue), msgs in want.items():
                got = read_all(log, topic, queue, max_bytes=max_bytes)
                assert [(r.key, r.body, r.timestamp_ms) for r in got] == [
                    (m.key, m.body, m.timestamp_ms) for m in msgs
                ]
                assert [r.queue_offset for r in got] == list(range(len(msgs)))
                assert log.queue_end(topic, queue) == len(msgs)
            seqs = sorted(r.seq for k in want for r in read_all(log, *k))
            assert seqs == list(range(seq))
            assert log.topics() == {t: max(q for tt, q in want if tt == t) + 1 for t, _ in want}
        finally:
            log.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=batches_st)
def test_rebuilt_indexes_equal_incremental_ones(batches: list[list[Message]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        log = CommitLog.open(root, segment_bytes=SEG)
        for b in batches:
            log.append(b)
        log.close()
        before = {k: v for k, v in snapshot_files(root).items() if k.startswith("index")}
        log = CommitLog.open(root, segment_bytes=SEG)
        try:
            log.rebuild_indexes()
            log.flush_indexes()
            after = {k: v for k, v in snapshot_files(root).items() if k.startswith("index")}
            assert after == before
        finally:
            log.close()


def test_segments_roll_with_eof_markers_and_records_never_straddle(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        for i in range(40):
            log.append([Message("t", 0, None, bytes([i]) * 700, i)])
        files = sorted((tmp_path / "commitlog").iterdir())
        assert len(files) >= 3
        for f in files:
            assert f.name == f"{int(f.name):020d}"
            assert int(f.name) % SEG == 0
        for f in files[:-1]:
            data = f.read_bytes()
            assert len(data) == SEG
            # Find the marker by walking the records from the start of the segment.
            pos = 0
            while True:
                length, magic, _ = EOF_MARKER.unpack_from(data, pos)
                if magic == EOF_MAGIC:
                    assert pos + length == SEG
                    assert data[pos + EOF_MARKER.size :] == bytes(length - EOF_MARKER.size)
                    break
                pos += length
        got = read_all(log, "t", 0)
        assert [r.body[0] for r in got] == list(range(40))
        for r in got:
            assert r.phys_offset // SEG == (r.phys_offset + r.size - 1) // SEG
    finally:
        log.close()


def test_read_honours_limits_but_returns_at_least_one(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        log.append([Message("t", 0, b"k", b"x" * 500, 1) for _ in range(10)])
        one = log.read("t", 0, 0, max_bytes=1, max_records=100)
        assert len(one) == 1
        own = BATCH_RECORD_SIZE + len(b"k") + 500  # a message's own bytes in its batch
        some = log.read("t", 0, 2, max_bytes=own * 3, max_records=100)
        assert [r.queue_offset for r in some] == [2, 3, 4]
        some = log.read("t", 0, 2, max_bytes=own * 3 + own - 1, max_records=100)
        assert [r.queue_offset for r in some] == [2, 3, 4]
        assert len(log.read("t", 0, 0, max_bytes=1 << 20, max_records=4)) == 4
        for _ in range(3):  # batches of one: the first fills the budget, the rest wait
            log.append([Message("t", 1, None, b"y" * 500, 1)])
        assert len(log.read("t", 1, 0, max_bytes=1, max_records=100)) == 1
        assert len(log.read("t", 1, 0, max_bytes=1100, max_records=100)) == 2
        assert log.read("t", 0, 10, max_bytes=1 << 20, max_records=4) == []
        assert log.read("nope", 0, 0, max_bytes=1 << 20, max_records=4) == []
    finally:
        log.close()


def test_bad_messages_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        log.append([Message("t", 0, None, b"ok", 1)])
        end = log.max_phys
        with pytest.raises(MessageTooLargeError, match="does not fit"):
            log.append([Message("t", 0, None, b"a", 1), Message("t", 0, None, b"x" * SEG, 1)])
        for topic in ["", "../etc", "a/b", "x" * 300, ".."]:
            with pytest.raises(InvalidMessageError, match="invalid topic"):
                log.append([Message(topic, 0, None, b"a", 1)])
        with pytest.raises(InvalidMessageError, match="queue id"):
            log.append([Message("t", -1, None, b"a", 1)])
        assert log.max_phys == end
        assert [r.body for r in read_all(log, "t", 0)] == [b"ok"]
    finally:
        log.close()


def test_empty_key_and_no_key_are_distinct(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        log.append([Message("t", 0, b"", b"a", 1), Message("t", 0, None, b"b", 1)])
        assert [r.key for r in read_all(log, "t", 0)] == [b"", None]
    finally:
        log.close()


def test_retention_predicate_deletes_an_old_prefix_only() -> None:
    segs = [SegmentInfo(i * 100, 100, 1000 * i) for i in range(5)]
    by_size = segments_to_delete(
        segs, retention=Retention(max_bytes=250), now_ms=10_000, active_base=400, active_empty=False
    )
    assert by_size == [0, 100, 200]  # 500 bytes -> 200, the first total <= 250
    by_age = segments_to_delete(
        segs, retention=Retention(max_age_s=7.5), now_ms=10_000, active_base=400, active_empty=False
    )
    assert by_age == [0, 100, 200]  # ages 10, 9, 8 s exceed 7.5 s; the next is 7 s old
    never_active = segments_to_delete(
        segs, retention=Retention(max_bytes=0), now_ms=0, active_base=400, active_empty=False
    )
    assert never_active == [0, 100, 200, 300]
    keeps_marker = segments_to_delete(
        segs, retention=Retention(max_bytes=0), now_ms=0, active_base=400, active_empty=True
    )
    assert keeps_marker == [0, 100, 200]
    # A delayed message pending at offset 150: its segment and every later one stay.
    pinned = segments_to_delete(
        segs, retention=Retention(max_bytes=0), now_ms=0, active_base=400, active_empty=False,
        keep_from=150)
    assert pinned == [0]


def test_apply_retention_advances_queue_start_and_survives_reopen(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG, retention=Retention(max_bytes=3 * SEG))
    for i in range(60):
        log.append([Message("t", i % 2, None, bytes([i]) * 700, i)])
    nfiles = len(list((tmp_path / "commitlog").iterdir()))
    deleted = log.apply_retention(now_ms=0)
    assert deleted == nfiles - 3
    assert log.min_phys == deleted * SEG
    for q in (0, 1):
        got = read_all(log, "t", q)
        assert got
        assert got[0].queue_offset == log.queue_start("t", q) > 0
        assert got[-1].queue_offset == log.queue_end("t", q) - 1 == 29
        assert all(r.phys_offset >= log.min_phys for r in got)
    starts = {q: log.queue_start("t", q) for q in (0, 1)}
    seq = log.next_seq
    log.close()
    log = CommitLog.open(tmp_path, segment_bytes=SEG, retention=Retention(max_bytes=3 * SEG))
    try:
        assert {q: log.queue_start("t", q) for q in (0, 1)} == starts
        assert log.next_seq == seq
        r = log.append([Message("t", 0, None, b"after", 1)])
        assert r.queue_offsets == [("t", 0, 30)]
    finally:
        log.close()


def test_interval_flush_policy(tmp_path: Path) -> None:
    log = CommitLog.open(
        tmp_path, segment_bytes=SEG, flush=FlushPolicy(mode="interval", interval_ms=1)
    )
    try:
        assert not log.needs_flush()
        for i in range(30):  # crosses segment boundaries: sealed files are synced too
            log.append([Message("t", 0, None, bytes([i]) * 700, i)])
        log.flush()
        assert not log.needs_flush()
    finally:
        log.close()
    with pytest.raises(ValueError, match="flush mode"):
        FlushPolicy(mode="sometimes")  # type: ignore[arg-type]


def test_opening_with_a_different_segment_size_is_refused(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    for i in range(30):
        log.append([Message("t", 0, None, bytes([i]) * 700, i)])
    log.close()
    with pytest.raises(Exception, match="segment"):
        CommitLog.open(tmp_path, segment_bytes=SEG * 2)


def test_released_index_entries_are_read_from_the_file_and_come_back(tmp_path: Path) -> None:
    """The schedule queue's index keeps only its unapplied tail in memory
    (docs/delayed.md): released entries still read, appends continue after them, and
    repair, truncation and reopening see every entry."""
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        log.append([Message("s", 0, None, b"r%d" % i, 1) for i in range(50)])
        before = [r.body for r in log.read("s", 0, 0, max_bytes=1 << 20, max_records=100)]
        assert log.release_index_memory("s", 0, 30) == 30
        assert log.release_index_memory("s", 0, 10) == 0  # already released
        assert [r.body for r in log.read("s", 0, 0, max_bytes=1 << 20, max_records=100)] == before
        log.append([Message("s", 0, None, b"r%d" % i, 1) for i in range(50, 60)])
        assert log.queue_end("s", 0) == 60
        assert log.read("s", 0, 55, max_bytes=1 << 20, max_records=1)[0].body == b"r55"
        assert log.read("s", 0, 5, max_bytes=1, max_records=1)[0].body == b"r5"
    finally:
        log.close()
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        got = [r.body for r in log.read("s", 0, 0, max_bytes=1 << 20, max_records=100)]
        assert got == [b"r%d" % i for i in range(60)]
        assert log.rebuild_indexes() >= 1
        assert log.queue_end("s", 0) == 60
    finally:
        log.close()


@pytest.mark.parametrize("cut", [0, 1, 2, 3, 4, 5, 6])
def test_queue_offset_at_is_the_first_record_starting_at_or_past_a_position(
        tmp_path: Path, cut: int) -> None:
    # A queue's readable end (server/readable.py): its records interleave with another
    # queue's, and the answer for a position is the number of its records starting below.
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        for i in range(6):
            log.append([Message("t", 0, None, b"t-%d" % i, 1)])
            log.append([Message("u", 0, None, b"u-%d" % i, 1)])
        starts = [log.phys_of("t", 0, o) for o in range(6)]
        assert all(p is not None for p in starts)
        # A position at a record's start (that record is not below it), just past it, and
        # past the log's end.
        at = starts[cut] if cut < 6 else log.max_phys
        assert log.queue_offset_at("t", 0, at) == cut
        assert log.queue_offset_at("t", 0, at + 1) == min(cut + 1, 6)
        assert log.queue_offset_at("t", 0, log.max_phys) == 6
        assert log.queue_offset_at("t", 0, 0) == log.queue_start("t", 0)
        assert log.queue_offset_at("nope", 0, log.max_phys) == 0  # no such queue
    finally:
        log.close()


def _packed(messages: list[Message]) -> list[PackedBatch]:
    """``messages`` (one topic, one timestamp) as a producer packs them: one batch per
    queue, in the order queues first appear, each queue's messages in order."""
    by_queue: dict[int, list[Message]] = {}
    for m in messages:
        by_queue.setdefault(m.queue, []).append(m)
    out = []
    for queue, ms in by_queue.items():
        section = encode_records([(m.key, m.body, 0) for m in ms])
        out.append(PackedBatch(ms[0].topic, queue, section, len(ms), ms[0].timestamp_ms,
                               zlib.crc32(section)))
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(appends=st.lists(st.tuples(st.sampled_from(["orders", "t-1"]),
                                  st.lists(st.tuples(st.integers(0, 3),
                                                     st.one_of(st.none(), st.binary(max_size=8)),
                                                     st.binary(max_size=1500)),
                                           min_size=1, max_size=12)),
                        min_size=1, max_size=10))
def test_packed_batches_are_stored_as_the_master_would_have_packed_them(
        appends: list[tuple[str, list[tuple[int, bytes | None, bytes]]]]) -> None:
    """A producer's packed batches (PRODUCE_BATCH) give the same log, byte for byte, and
    the same offsets, as the same messages appended one by one, segment ends included
    (an append that might cross one is taken apart into messages)."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        plain = CommitLog.open(Path(a), segment_bytes=SEG)
        packed = CommitLog.open(Path(b), segment_bytes=SEG)
        try:
            for n, (topic, sent) in enumerate(appends):
                ms = [Message(topic, q, k, body, 1_700_000_000_000 + n) for q, k, body in sent]
                batches = _packed(ms)
                want = plain.append(ms)
                got = packed.append(batches)
                # Offsets come in the packed order: each queue's messages together.
                order = [bt.queue for bt in batches]
                assert got.queue_offsets == sorted(want.queue_offsets,
                                                   key=lambda o: order.index(o[1]))
                assert (got.start_phys, got.end_phys) == (want.start_phys, want.end_phys)
            assert snapshot_files(Path(b) / "commitlog") == snapshot_files(Path(a) / "commitlog")
            for topic in {t for t, _ in appends}:
                for q in range(4):
                    assert [(r.key, r.body, r.queue_offset) for r in read_all(packed, topic, q)] \
                        == [(r.key, r.body, r.queue_offset) for r in read_all(plain, topic, q)]
        finally:
            plain.close()
            packed.close()


def test_a_packed_batch_past_the_segments_end_is_stored_message_by_message(
        tmp_path: Path) -> None:
    """A packed batch never straddles two segments: one that would is taken apart and
    split there, a batch of what fits, a marker, the rest in the next segment."""
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        log.append([Message("t", 0, None, b"f" * (SEG - 2000), 5)])
        ms = [Message("t", 1, None, bytes([i]) * 500, 7) for i in range(8)]
        result = log.append(_packed(ms))
        assert [o for _t, _q, o in result.queue_offsets] == list(range(8))
        assert len(list((tmp_path / "commitlog").iterdir())) == 2
        got = read_all(log, "t", 1)
        assert [r.body for r in got] == [m.body for m in ms]
        assert {r.phys_offset // SEG for r in got} == {0, 1}
    finally:
        log.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=batches_st, max_bytes=st.integers(1, 5000), start=st.integers(0, 30))
def test_stored_items_hold_what_a_read_gives(batches: list[list[Message]], max_bytes: int,
                                            start: int) -> None:
    """read_items hands on the stored items whole, checked, undecoded (PULL_BATCH): from
    any offset, decoding them from there gives the messages read gives, and at least one
    item when any message is there; the items' byte budget is kept after the first."""
    with tempfile.TemporaryDirectory() as d:
        log = CommitLog.open(Path(d), segment_bytes=SEG)
        try:
            for b in batches:
                log.append(b)
            for topic, queue in expected_by_queue(batches):
                end = log.queue_end(topic, queue)
                items = log.read_items(topic, queue, start, max_bytes=max_bytes,
                                       max_records=1 << 20)
                assert bool(items) == (start < end)
                if not items:
                    continue
                assert items[0].first <= start < items[0].end
                assert all(a.end == b.first for a, b in itertools.pairwise(items))
                assert sum(len(i.data) for i in items[:-1]) < max_bytes
                decoded = [r for i in items
                           for r in decode_item(memoryview(i.data), 0, 0)[1]
                           if r.queue_offset >= start]
                want = log.read(topic, queue, start, max_bytes=1 << 30,
                                max_records=items[-1].end - start)
                assert [(r.queue_offset, r.key, r.body, r.timestamp_ms) for r in decoded] == \
                    [(r.queue_offset, r.key, r.body, r.timestamp_ms) for r in want]
        finally:
            log.close()
