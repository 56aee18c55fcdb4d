"""Queue indexes share a bounded set of open files (storage/index.py: OpenFiles)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from understudy_broker.storage.commitlog import CommitLog, FlushPolicy, Retention
from understudy_broker.storage.index import INDEX_HEADER_SIZE, OpenFiles, QueueIndex


def open_under(root: Path) -> int:
    """This process's descriptors open on files under ``root``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root)):
                count += 1
        except OSError:
            continue
    return count


def test_at_most_limit_files_are_open_and_every_index_keeps_working(tmp_path: Path) -> None:
    files = OpenFiles(2)
    indexes = [QueueIndex.create(tmp_path / f"q{i}", files=files) for i in range(5)]
    for rnd in range(3):
        for i, ix in enumerate(indexes):
            ix.append([(1000 * i + rnd, 10 + rnd, 1)])
            ix.write_pending()  # written behind: this is what opens the file
            assert len(files) <= 2
            assert open_under(tmp_path) <= 2
    assert files.opened > 2  # files were closed and opened again
    for i, ix in enumerate(indexes):
        assert ix.entries() == [(1000 * i + r, 10 + r) for r in range(3)]
    # Entries released from memory are read from the file, reopened when needed.
    first = indexes[0]
    assert first.release_before(2) == 2
    for ix in indexes[1:]:
        ix.entry(ix.base)  # touch the others: the first index's file is closed
    assert first.entry(0) == (0, 10)
    assert first.entry(1) == (1, 11)
    # Retention rewrites a file whose old descriptor may be open: the next use opens the new.
    indexes[4].entry(0)
    assert indexes[4].drop_before_phys(4002) == 2
    assert indexes[4].entries() == [(4002, 12)]
    indexes[4].append([(4003, 13, 1)])
    for ix in indexes:
        ix.close()
        ix.close()  # twice is harmless
    assert len(files) == 0
    assert open_under(tmp_path) == 0
    for i in range(4):
        reloaded, torn = QueueIndex.load(tmp_path / f"q{i}")
        assert torn == 0
        assert reloaded.entries() == [(1000 * i + r, 10 + r) for r in range(3)]
        reloaded.close()
    last, _ = QueueIndex.load(tmp_path / "q4")
    assert (last.base, last.entries()) == (2, [(4002, 12), (4003, 13)])
    last.close()


def test_the_least_recently_used_file_is_closed_before_another_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never more than ``limit`` open, not even between an open and the close it forces:
    a broker's descriptors counted while it wrote indexes behind the log showed one more
    (test_server_limits' bound failed so once)."""
    files = OpenFiles(2)
    indexes = [QueueIndex.create(tmp_path / f"q{i}", files=files) for i in range(4)]
    held_at_open: list[int] = []
    real_open = os.open

    def counting_open(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        held_at_open.append(open_under(tmp_path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", counting_open)
    for rnd in range(2):
        for i, ix in enumerate(indexes):
            ix.append([(1000 * i + rnd, 10, 1)])
            ix.write_pending()
    monkeypatch.undo()
    assert len(held_at_open) == 8  # every write reopened its file (4 files, 2 kept)
    assert max(held_at_open) == 1  # the oldest was closed before each open
    for ix in indexes:
        ix.close()


def test_no_open_file_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="at least one index file"):
        OpenFiles(0)


def test_a_log_with_more_queues_than_open_files_recovers_every_index(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, segment_bytes=1 << 20, flush=FlushPolicy(),
                         retention=Retention(), index_open_files=3)
    for rnd in range(2):
        log.append([("t", q, None, b"%d-%d" % (q, rnd), 0) for q in range(20)])
    assert open_under(tmp_path / "index") <= 3
    bodies = [[r.body for r in log.read("t", q, 0, max_bytes=1 << 16, max_records=10)] for q in range(20)]
    assert bodies == [[b"%d-0" % q, b"%d-1" % q] for q in range(20)]
    log.flush()
    log.close()
    assert open_under(tmp_path) == 0
    again = CommitLog.open(tmp_path, segment_bytes=1 << 20, flush=FlushPolicy(),
                           retention=Retention(), index_open_files=3)
    try:
        assert again.recovery.indexes_rebuilt == 0
        assert [[r.body for r in again.read("t", q, 0, max_bytes=1 << 16, max_records=10)] for q in range(20)] == bodies
        assert open_under(tmp_path / "index") <= 3
    finally:
        again.close()


def test_waiting_index_entries_are_written_a_step_at_a_time(tmp_path: Path) -> None:
    """Before a recovery mark the broker writes the indexes' waiting entries in steps
    (storage/store.py), giving the event loop back in between; each step writes at most
    the indexes it is given, and the mark finds nothing left."""
    log = CommitLog.open(tmp_path, segment_bytes=1 << 20, flush=FlushPolicy(),
                         retention=Retention(), index_open_files=4)
    try:
        log.append([("t", q, None, b"%d" % q, 0) for q in range(10)])

        def on_file() -> int:
            return sum(1 for q in range(10)
                       if (tmp_path / "index" / "t" / str(q)).stat().st_size > INDEX_HEADER_SIZE)
        assert on_file() == 0
        steps = [log.write_pending_indexes(4) for _ in range(3)]
        assert steps == [False, False, True]
        assert on_file() == 10
        assert log.write_pending_indexes(4)  # nothing left
        log.append([("t", 0, None, b"more", 0)])
        mark = log.recovery_mark()
        assert mark.ends[("t", 0)] == 2
        assert (tmp_path / "index" / "t" / "0").stat().st_size == INDEX_HEADER_SIZE + 2 * 16
    finally:
        log.close()


def test_a_batch_takes_one_entry_per_message_and_its_span_is_found_anywhere(
        tmp_path: Path) -> None:
    """Each message of a batch has an entry (offsets stay arithmetic); ``item`` finds the
    batch's span from any of its offsets, in memory or among entries on file only."""
    ix = QueueIndex.create(tmp_path / "q")
    ix.append([(0, 50, 1), (50, 400, 3), (450, 80, 1), (530, 900, 4)])
    assert ix.end == 9
    assert ix.entries()[1:4] == [(50, 400)] * 3
    spans = [ix.item(o) for o in range(9)]
    assert spans == [(0, 50, 0, 1)] + [(50, 400, 1, 4)] * 3 + [(450, 80, 4, 5)] + [
        (530, 900, 5, 9)] * 4
    assert ix.first_index_at_or_after(50) == 1  # a batch's position names its first message
    assert ix.release_before(3) == 3  # offsets 0-2 on file only: the batch is split
    assert [ix.item(o) for o in range(9)] == spans
    with pytest.raises(ValueError, match="count"):
        ix.append([(1500, 10, 0)])
    with pytest.raises(IndexError):
        ix.item(9)
    ix.close()
    reloaded, torn = QueueIndex.load(tmp_path / "q")
    assert torn == 0
    assert [reloaded.item(o) for o in range(9)] == spans
    reloaded.close()
