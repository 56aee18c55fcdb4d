"""The recovery point: a restart scans only what follows it, and a point that cannot be
trusted (garbage, past the end, from another log, indexes that disagree) costs a longer
scan, never a record."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from understudy_broker.storage.commitlog import (
    RECOVERY_POINT_FILE,
    CommitLog,
    FlushPolicy,
    RecoveryPoint,
    Retention,
)
from understudy_broker.storage.records import Message, StoredRecord
from understudy_broker.storage.store import Store
from understudy_broker.tasks import stop_tasks

SEG = 64 << 10  # one segment holds everything here: the case the point exists for


def append(log: CommitLog, start: int, n: int, *, queue: int | None = None) -> None:
    for i in range(start, start + n):
        q = i % 3 if queue is None else queue
        log.append([Message("t", q, None, b"%05d" % i * 20, 1000 + i)])


def everything(log: CommitLog) -> list[StoredRecord]:
    got = [r for q in range(3) for r in log.read("t", q, 0, max_bytes=1 << 30,
                                                  max_records=1 << 20)]
    return sorted(got, key=lambda r: r.phys_offset)


def crashed_log(root: Path, *, before: int, after: int, after_queue: int | None = None
                ) -> tuple[RecoveryPoint, list[StoredRecord]]:
    """``before`` records, a recovery point, ``after`` more records (to ``after_queue``,
    or round robin), then a crash (the files are left as a kill -9 leaves them: no close,
    no point at the end)."""
    log = CommitLog.open(root, segment_bytes=SEG)
    append(log, 0, before)
    mark = log.recovery_mark()
    log.write_recovery_point(mark)
    append(log, before, after, queue=after_queue)
    records = everything(log)
    log.flush_indexes()  # kill -9 keeps the page cache: the index files hold these
    return mark, records


def reopen(root: Path) -> CommitLog:
    return CommitLog.open(root, segment_bytes=SEG)


def test_a_restart_scans_only_what_follows_the_recovery_point(tmp_path: Path) -> None:
    mark, records = crashed_log(tmp_path, before=200, after=7)
    log = reopen(tmp_path)
    try:
        assert log.recovery.recovery_point == "used"
        assert log.recovery.scanned_from == mark.phys > 0
        assert log.recovery.records_scanned == 7
        assert log.recovery.indexes_rebuilt == 0
        assert everything(log) == records
        assert log.next_seq == 207
        r = log.append([Message("t", 1, None, b"after", 1)])
        assert r.queue_offsets == [("t", 1, sum(1 for x in records if x.queue == 1))]
        assert everything(log)[-1].seq == 207
    finally:
        log.close()


def test_a_point_at_the_very_end_restores_the_sequence_without_scanning(tmp_path: Path) -> None:
    mark, records = crashed_log(tmp_path, before=50, after=0)
    log = reopen(tmp_path)
    try:
        assert (log.recovery.recovery_point, log.recovery.records_scanned) == ("used", 0)
        assert log.max_phys == mark.phys
        assert log.next_seq == 50
        log.append([Message("t", 2, None, b"next", 1)])
        assert everything(log)[-1].seq == 50
        assert len(everything(log)) == len(records) + 1
    finally:
        log.close()


def test_a_torn_tail_after_the_point_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    _mark, records = crashed_log(tmp_path, before=100, after=5)
    seg = sorted((tmp_path / "commitlog").glob("0*"))[-1]
    os.truncate(seg, seg.stat().st_size - 3)
    log = reopen(tmp_path)
    try:
        assert log.recovery.recovery_point == "used"
        assert log.recovery.truncated_bytes > 0
        assert everything(log) == records[:-1]
        assert log.next_seq == 104
    finally:
        log.close()


def _point_of_another_log(tmp_path: Path, root: Path) -> None:
    other = tmp_path / "other"
    log = CommitLog.open(other, segment_bytes=SEG)
    log.append([Message("t", 0, None, b"x" * 77, 1)])  # shifts every later boundary
    append(log, 0, 100)  # a point inside this log's data, not at one of its boundaries
    log.write_recovery_point(log.recovery_mark())
    log.close()
    shutil.copy(other / "commitlog" / RECOVERY_POINT_FILE, root / "commitlog" / RECOVERY_POINT_FILE)


@pytest.mark.parametrize("damage", ["garbage", "not-json-object", "past-the-end",
                                    "another-log", "index-short", "index-missing"])
def test_an_untrustworthy_point_costs_a_longer_scan_never_a_record(
        tmp_path: Path, damage: str) -> None:
    root = tmp_path / "log"
    # Records after the point go to queue 0 only: queues 1 and 2 are checked by the
    # point's index ends alone (queue 0 also by the records scanned).
    mark, records = crashed_log(root, before=120, after=4, after_queue=0)
    point_file = root / "commitlog" / RECOVERY_POINT_FILE
    if damage == "garbage":
        point_file.write_bytes(b"\x00\xff not a recovery point")
    elif damage == "not-json-object":
        point_file.write_text(json.dumps([1, 2, 3]))
    elif damage == "past-the-end":
        doc = json.loads(point_file.read_text())
        doc["phys"] = mark.phys + 10_000
        point_file.write_text(json.dumps(doc))
    elif damage == "another-log":
        _point_of_another_log(tmp_path, root)
    elif damage == "index-short":  # a power loss took index entries the point counts
        idx = root / "index" / "t" / "1"
        os.truncate(idx, idx.stat().st_size - 5 * 16)
    else:
        (root / "index" / "t" / "2").unlink()
    log = reopen(root)
    try:
        if damage.startswith("index"):
            assert log.recovery.recovery_point == "used"
            assert log.recovery.indexes_rebuilt == 3  # a full rebuild from the whole log
        else:
            assert log.recovery.recovery_point.startswith("ignored: "), log.recovery
            assert log.recovery.scanned_from == 0
            assert log.recovery.records_scanned == 124
        assert everything(log) == records
        assert log.next_seq == 124
    finally:
        log.close()


def test_the_point_is_refused_before_the_log_is_flushed_up_to_it(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=SEG, flush=FlushPolicy(mode="interval"))
    try:
        append(log, 0, 3)
        mark = log.recovery_mark()
        with pytest.raises(ValueError, match="flushed up to 0, not to"):
            log.write_recovery_point(mark)
        assert not (tmp_path / "commitlog" / RECOVERY_POINT_FILE).exists()
        log.flush()
        log.write_recovery_point(mark)
        assert RecoveryPoint.decode(
            (tmp_path / "commitlog" / RECOVERY_POINT_FILE).read_bytes()).phys == mark.phys
    finally:
        log.close()


async def test_the_store_keeps_the_point_following_the_log_and_writes_it_at_close(
        tmp_path: Path) -> None:
    store = Store.open(tmp_path, segment_bytes=SEG, flush=FlushPolicy(mode="interval"),
                       retention=Retention(), flush_before_ack=False)
    point = tmp_path / "commitlog" / RECOVERY_POINT_FILE
    task = asyncio.create_task(store.run_recovery_points(0.05))
    try:
        append(store.log, 0, 30)
        end = store.log.max_phys
        # No interval flusher runs here: the task flushes through the group commit.
        for _ in range(100):
            await asyncio.sleep(0.05)
            if point.exists() and RecoveryPoint.decode(point.read_bytes()).phys == end:
                break
        else:
            raise AssertionError("the recovery point never reached the log's end")
        assert store.log.flushed_phys >= end
        append(store.log, 30, 2)
        end = store.log.max_phys
    finally:
        await stop_tasks([task])
        store.close()
    log = reopen(tmp_path)
    try:  # closed cleanly: the point is the end, nothing to scan
        assert (log.recovery.recovery_point, log.recovery.scanned_from) == ("used", end)
        assert log.recovery.records_scanned == 0
        assert len(everything(log)) == 32
    finally:
        log.close()
