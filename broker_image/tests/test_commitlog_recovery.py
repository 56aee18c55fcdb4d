"""Commit log crash recovery: torn tails, flipped bytes, damaged sealed segments and indexes."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from understudy_broker.storage.commitlog import CommitLog, CorruptSegmentError, DamagedRecordError
from understudy_broker.storage.index import INDEX_HEADER_SIZE
from understudy_broker.storage.records import HEADER_END, Message, StoredRecord

SEG = 8 << 10
SLOW_OK = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def read_all(log: CommitLog, topic: str, queue: int) -> list[StoredRecord]:
    return log.read(topic, queue, 0, max_bytes=1 << 30, max_records=1 << 20)


#: Messages per append in build_log: batches of one to four messages per queue.
APPENDS = (1, 2, 6, 9, 12)


def build_log(root: Path, *, appends: tuple[int, ...] = APPENDS, body: int = 600
              ) -> list[StoredRecord]:
    """A log of ~2.5 segments over 3 queues, in batches of one to four messages (so a
    torn or damaged batch loses several); returns every message in log order."""
    log = CommitLog.open(root, segment_bytes=SEG)
    try:
        i = 0
        for n in appends:
            batch = []
            for _ in range(n):
                key = None if i % 3 else f"k{i}".encode()
                batch.append(Message("t", i % 3, key, bytes([i]) * (body + i), 1000 + i))
                i += 1
            log.append(batch)
        out = [r for q in range(3) for r in read_all(log, "t", q)]
    finally:
        log.close()
    return sorted(out, key=lambda r: r.phys_offset)


def last_segment(root: Path) -> Path:
    return sorted((root / "commitlog").iterdir())[-1]


def index_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted((root / "index").rglob("*"))
        if p.is_file()
    }


def assert_indexes_agree_with_log(root: Path) -> None:
    """The indexes left by recovery equal the ones a full rebuild produces."""
    recovered = index_files(root)
    with tempfile.TemporaryDirectory() as d:
        copy = Path(d) / "copy"
        shutil.copytree(root, copy)
        log = CommitLog.open(copy, segment_bytes=SEG)
        try:
            log.rebuild_indexes()
            log.flush_indexes()
        finally:
            log.close()
        assert index_files(copy) == recovered


def check_survivors(root: Path, expected: list[StoredRecord]) -> None:
    log = CommitLog.open(root, segment_bytes=SEG)
    try:
        got = sorted(
            (r for q in range(3) for r in read_all(log, "t", q)), key=lambda r: r.phys_offset
        )
        assert got == expected
        end = expected[-1].phys_offset + expected[-1].size if expected else 0
        assert log.max_phys >= end
        assert log.next_seq == len(expected)
        for q in range(3):
            assert log.queue_end("t", q) == sum(1 for r in expected if r.queue == q)
    finally:
        log.close()


@SLOW_OK
@given(data=st.data())
def test_truncated_tail_is_cut_at_the_last_whole_record(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        records = build_log(root)
        seg = last_segment(root)
        base = int(seg.name)
        size = seg.stat().st_size
        cut = data.draw(st.integers(0, size - 1), label="cut")
        os.truncate(seg, cut)
        survivors = [r for r in records if r.phys_offset + r.size <= base + cut]
        log = CommitLog.open(root, segment_bytes=SEG)
        try:
            valid_end = max(
                [base] + [r.phys_offset + r.size for r in survivors if r.phys_offset >= base]
            )
            assert log.max_phys == valid_end
            assert log.recovery.truncated_bytes == base + cut - valid_end
            assert seg.stat().st_size == valid_end - base
        finally:
            log.close()
        check_survivors(root, survivors)
        assert_indexes_agree_with_log(root)


@SLOW_OK
@given(data=st.data())
def test_flipped_byte_in_the_tail_drops_that_record_and_the_rest(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        records = build_log(root)
        seg = last_segment(root)
        base = int(seg.name)
        raw = bytearray(seg.read_bytes())
        pos = data.draw(st.integers(0, len(raw) - 1), label="pos")
        raw[pos] ^= data.draw(st.integers(1, 255), label="xor")
        seg.write_bytes(bytes(raw))
        hit = next(r for r in records if r.phys_offset <= base + pos < r.phys_offset + r.size)
        survivors = [r for r in records if r.phys_offset < hit.phys_offset]
        log = CommitLog.open(root, segment_bytes=SEG)
        try:
            assert log.max_phys == hit.phys_offset
            assert log.recovery.truncated_bytes == len(raw) - (hit.phys_offset - base)
        finally:
            log.close()
        check_survivors(root, survivors)
        assert_indexes_agree_with_log(root)


def test_a_record_damaged_in_place_in_a_sealed_segment_is_kept_and_not_served(
        tmp_path: Path) -> None:
    """A flipped byte in a body: the framing holds and the next batch follows, so
    recovery steps over it (nothing is cut, the sealed segment is not an error) and
    names it; reads refuse its messages (docs/storage-and-replication.md, "Corruption")."""
    records = build_log(tmp_path)
    first = sorted((tmp_path / "commitlog").iterdir())[0]
    hit = next(r for r in records if r.phys_offset <= SEG // 2 < r.phys_offset + r.size)
    batch = [r for r in records if r.phys_offset == hit.phys_offset]
    assert len(batch) > 1  # the damage takes out a batch of several
    assert SEG // 2 - hit.phys_offset > HEADER_END + 1  # in the topic or the body
    raw = bytearray(first.read_bytes())
    raw[SEG // 2] ^= 0x55
    first.write_bytes(bytes(raw))
    before = {p.name: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()}
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert log.recovery.scanned_from == 0
        assert log.recovery.truncated_bytes == 0
        assert len(log.recovery.damaged) == 1
        assert f"{first} at file position {hit.phys_offset}" in log.recovery.damaged[0]
        with pytest.raises(DamagedRecordError) as info:
            log.read("t", hit.queue, hit.queue_offset, max_bytes=1, max_records=1)
        assert (info.value.path, info.value.offset) == (first, hit.queue_offset)
        for q in range(3):  # everything else is served, the damaged batch's queue past it
            start = hit.queue_offset + len(batch) if q == hit.queue else 0
            assert log.read("t", q, start, max_bytes=1 << 30, max_records=1 << 20) == [
                r for r in records if r.queue == q and r.queue_offset >= start]
    finally:
        log.close()
    assert {p.name: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()} == before


def test_a_sealed_segment_whose_framing_is_broken_is_an_error_and_nothing_is_cut(
        tmp_path: Path) -> None:
    """A flipped length field: no record boundary after it can be trusted, so the
    segment cannot be walked and an operator decides."""
    records = build_log(tmp_path)
    first = sorted((tmp_path / "commitlog").iterdir())[0]
    hit = next(r for r in records if r.phys_offset <= SEG // 2 < r.phys_offset + r.size)
    raw = bytearray(first.read_bytes())
    raw[hit.phys_offset + 2] ^= 0x55
    first.write_bytes(bytes(raw))
    before = {p.name: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()}
    with pytest.raises(CorruptSegmentError, match=first.name) as info:
        CommitLog.open(tmp_path, segment_bytes=SEG)
    assert info.value.path == first
    assert info.value.position == hit.phys_offset
    assert {p.name: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()} == before


def test_a_missing_or_short_sealed_segment_is_an_error(tmp_path: Path) -> None:
    build_log(tmp_path, appends=(*APPENDS, 15))
    files = sorted((tmp_path / "commitlog").iterdir())
    assert len(files) >= 3
    os.truncate(files[0], SEG - 10)
    with pytest.raises(CorruptSegmentError, match="sealed segment is"):
        CommitLog.open(tmp_path, segment_bytes=SEG)
    files[1].unlink()
    with pytest.raises(CorruptSegmentError, match="missing file"):
        CommitLog.open(tmp_path, segment_bytes=SEG)


@pytest.mark.parametrize("damage", ["delete", "torn", "garbage", "stale-extra", "all-gone"])
def test_damaged_indexes_are_repaired_from_the_log(tmp_path: Path, damage: str) -> None:
    records = build_log(tmp_path)
    healthy = index_files(tmp_path)
    idx = tmp_path / "index" / "t" / "1"
    if damage == "delete":
        idx.unlink()
    elif damage == "torn":
        os.truncate(idx, idx.stat().st_size - 5)
    elif damage == "garbage":
        idx.write_bytes(b"this is not an index")
    elif damage == "stale-extra":
        # Entries for records that a crash took away: they point past the log's end.
        idx.write_bytes(idx.read_bytes() + idx.read_bytes()[-16:] * 3)
    else:
        shutil.rmtree(tmp_path / "index")
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert log.recovery.indexes_rebuilt >= 1
        assert log.recovery.truncated_bytes == 0
    finally:
        log.close()
    assert index_files(tmp_path) == healthy
    check_survivors(tmp_path, records)


def test_indexes_short_of_the_log_are_extended_without_a_problem(tmp_path: Path) -> None:
    """Indexes are written behind the log (index.py): a crash leaves them short, right as
    far as they go. Recovery adds the rest from its scan; that is not a repair."""
    records = build_log(tmp_path)
    healthy = index_files(tmp_path)
    for q in range(3):
        idx = tmp_path / "index" / "t" / str(q)
        os.truncate(idx, idx.stat().st_size - 2 * 16)
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert (log.recovery.indexes_extended, log.recovery.indexes_rebuilt) == (3, 0)
        assert log.recovery.index_problems == ()
        assert [r for q in range(3) for r in read_all(log, "t", q)] == sorted(
            records, key=lambda r: (r.queue, r.queue_offset))
    finally:
        log.close()
    assert index_files(tmp_path) == healthy
    check_survivors(tmp_path, records)


def test_a_process_that_dies_loses_only_index_entries_the_scan_finds_again(
        tmp_path: Path) -> None:
    """What ``kill -9`` leaves: the log written, each index file holding the entries up
    to the last recovery mark and none after (the rest were in the process' memory)."""
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    for i in range(12):
        log.append([Message("t", i % 3, None, b"before %d" % i, 1)])
    log.flush()
    log.write_recovery_point(log.recovery_mark())
    marked = index_files(tmp_path)
    assert {len(raw) for raw in marked.values()} == {INDEX_HEADER_SIZE + 4 * 16}
    for i in range(6):
        log.append([Message("t", i % 3, None, b"after %d" % i, 2)])
    log.flush()
    assert index_files(tmp_path) == marked  # pending: in memory only
    expected = [[r.body for r in read_all(log, "t", q)] for q in range(3)]
    # No close: the process is gone. Its files are what the next one opens.
    again = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert again.recovery.recovery_point == "used"
        assert (again.recovery.indexes_extended, again.recovery.indexes_rebuilt) == (3, 0)
        assert again.recovery.index_problems == ()
        assert [[r.body for r in read_all(again, "t", q)] for q in range(3)] == expected
        assert again.queue_end("t", 0) == 6
    finally:
        again.close()
    assert {len(raw) for raw in index_files(tmp_path).values()} == {INDEX_HEADER_SIZE + 6 * 16}


def test_appends_continue_correctly_after_recovery(tmp_path: Path) -> None:
    records = build_log(tmp_path)
    seg = last_segment(tmp_path)
    os.truncate(seg, seg.stat().st_size - 3)
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        lost = next(r for r in records if r.phys_offset == records[-1].phys_offset)
        assert lost.queue_offset < records[-1].queue_offset  # a torn batch of several
        assert log.max_phys == lost.phys_offset
        r = log.append([Message("t", lost.queue, None, b"again", 1)])
        assert r.queue_offsets == [("t", lost.queue, lost.queue_offset)]
        assert read_all(log, "t", lost.queue)[-1].body == b"again"
        assert read_all(log, "t", lost.queue)[-1].seq == lost.seq
    finally:
        log.close()


def test_crash_after_the_marker_before_the_next_segment_file(tmp_path: Path) -> None:
    """A batch that rolls writes the marker, then the next file: a crash in between
    leaves a full last segment and no next file. Sequence and queue offsets continue."""
    records = build_log(tmp_path)
    last = last_segment(tmp_path)
    base = int(last.name)
    last.unlink()
    survivors = [r for r in records if r.phys_offset < base]
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert log.max_phys == base
        assert log.next_seq == len(survivors)
        r = log.append([Message("t", 0, None, b"next", 1)])
        assert r.start_phys == base
        assert read_all(log, "t", 0)[-1].seq == len(survivors)
    finally:
        log.close()
    assert last.exists()
