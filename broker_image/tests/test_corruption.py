"""Corruption beyond a torn tail, on real files: a damaged record in an old segment, an
index cut short or overwritten, an unreadable offsets file, a slave's damaged copy.

Each is detected, named with its file and offset, never served as a message, and the
log (or the store) opens and serves everything intact (docs/storage-and-replication.md,
"Corruption")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from understudy_broker.server.replica import SlaveReplica
from understudy_broker.storage.commitlog import (
    CommitLog,
    CorruptSegmentError,
    DamagedRecordError,
    FlushPolicy,
    Retention,
)
from understudy_broker.storage.index import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE
from understudy_broker.storage.offsets import COMMITS_TOPIC, encode_commit_record
from understudy_broker.storage.records import PREFIX_SIZE, Message, StoredRecord
from understudy_broker.storage.store import Store

SEG = 8 << 10


def read_all(log: CommitLog, topic: str, queue: int, offset: int = 0) -> list[StoredRecord]:
    return log.read(topic, queue, offset, max_bytes=1 << 30, max_records=1 << 20)


def build(root: Path, *, records: int = 60, queues: int = 3) -> list[StoredRecord]:
    """About five segments of records spread over ``queues`` queues; every record, in log
    order."""
    log = CommitLog.open(root, segment_bytes=SEG)
    try:
        for i in range(records):
            log.append([Message("t", i % queues, None, b"body-%03d-" % i + b"x" * 600, 1000 + i)])
        out = [r for q in range(queues) for r in read_all(log, "t", q)]
    finally:
        log.close()
    return sorted(out, key=lambda r: r.phys_offset)


def flip(path: Path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x5A
    path.write_bytes(bytes(raw))


def segments(root: Path) -> list[Path]:
    return sorted(p for p in (root / "commitlog").iterdir() if p.name.isdigit())


# ---- a damaged record in an old, sealed segment --------------------------------------------

@pytest.mark.parametrize("where", ["length", "crc", "queue offset", "body"])
def test_a_damaged_record_in_an_old_segment_is_named_and_never_served(
        tmp_path: Path, where: str) -> None:
    records = build(tmp_path)
    first = segments(tmp_path)[0]
    assert len(segments(tmp_path)) > 3  # the damaged one is outside recovery's scan
    victim = next(r for r in records if r.queue == 1 and r.queue_offset == 3)
    assert victim.phys_offset + victim.size <= SEG
    at = {"length": 2, "crc": 9, "queue offset": PREFIX_SIZE + 15, "body": victim.size - 5}
    flip(first, victim.phys_offset + at[where])
    found: list[DamagedRecordError] = []
    log = CommitLog.open(tmp_path, segment_bytes=SEG, on_damaged=found.append)
    try:
        # The records before it are served; a read starting at it is refused, by name.
        assert [r.body for r in read_all(log, "t", 1)] == [
            r.body for r in records if r.queue == 1 and r.queue_offset < 3]
        with pytest.raises(DamagedRecordError) as info:
            read_all(log, "t", 1, 3)
        err = info.value
        assert (err.topic, err.queue, err.offset) == ("t", 1, 3)
        assert (err.path, err.position, err.phys) == (first, victim.phys_offset,
                                                      victim.phys_offset)
        assert str(first) in str(err)
        assert "t/1 offset 3" in str(err)
        with pytest.raises(DamagedRecordError):
            log.read("t", 1, 3, max_bytes=1, max_records=1)
        with pytest.raises(DamagedRecordError):  # nor handed on whole (PULL_BATCH)
            log.read_items("t", 1, 3, max_bytes=1 << 20, max_records=100)
        # Reported once, however often it is read; skipping it serves the rest.
        assert found == [err]
        assert [r.body for r in read_all(log, "t", 1, 4)] == [
            r.body for r in records if r.queue == 1 and r.queue_offset > 3]
        for q in (0, 2):
            assert read_all(log, "t", q) == [r for r in records if r.queue == q]
        log.append([Message("t", 1, None, b"after", 1)])
        assert read_all(log, "t", 1, 20)[-1].body == b"after"
    finally:
        log.close()


def test_an_index_entry_naming_another_queues_record_is_not_served(tmp_path: Path) -> None:
    records = build(tmp_path)
    idx = tmp_path / "index" / "t" / "1"
    raw = bytearray(idx.read_bytes())
    other = (tmp_path / "index" / "t" / "0").read_bytes()
    at = INDEX_HEADER_SIZE + 2 * INDEX_ENTRY_SIZE
    entry = slice(at, at + INDEX_ENTRY_SIZE)
    raw[entry] = other[entry]  # t/1 offset 2 now points at t/0 offset 2
    idx.write_bytes(bytes(raw))
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert len(read_all(log, "t", 1)) == 2
        with pytest.raises(DamagedRecordError, match=r"the item here holds t/0 offsets 2\.\.2"):
            read_all(log, "t", 1, 2)
        assert read_all(log, "t", 1, 3) == [r for r in records if r.queue == 1][3:]
    finally:
        log.close()


# ---- a per-queue index cut short or overwritten ----------------------------------------------

def build_idle_queue(root: Path) -> list[bytes]:
    """Queue 1 written first only, then queue 0 for several segments: queue 1's records
    all lie before the part of the log recovery scans. Returns queue 1's bodies."""
    log = CommitLog.open(root, segment_bytes=SEG)
    try:
        early = [b"early-%02d" % i + b"y" * 500 for i in range(10)]
        for body in early:
            log.append([Message("t", 1, None, body, 1)])
        for i in range(60):
            log.append([Message("t", 0, None, b"late-%02d" % i + b"z" * 500, 1)])
        log.flush()
        log.write_recovery_point(log.recovery_mark())
    finally:
        log.close()
    return early


DAMAGE = {
    "cut mid-entry": lambda raw: raw[:INDEX_HEADER_SIZE + 4 * INDEX_ENTRY_SIZE + 7],
    "cut to the header": lambda raw: raw[:INDEX_HEADER_SIZE],
    "cut to zero bytes": lambda raw: b"",
    "garbage header": lambda raw: b"garbage!!!!!!!" + raw[INDEX_HEADER_SIZE:],
}


@pytest.mark.parametrize("point", ["recovery point", "no recovery point"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_index_is_rebuilt_from_the_log_and_named(
        tmp_path: Path, damage: str, point: str) -> None:
    early = build_idle_queue(tmp_path)
    idx = tmp_path / "index" / "t" / "1"
    idx.write_bytes(DAMAGE[damage](idx.read_bytes()))
    if point == "no recovery point":
        (tmp_path / "commitlog" / "recovery-point").unlink()
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert log.recovery.scanned_from > read_all(log, "t", 1)[-1].phys_offset
        assert [r.body for r in read_all(log, "t", 1)] == early
        assert len(read_all(log, "t", 0)) == 60
        assert [p for p in log.recovery.index_problems if p.startswith(f"{idx}: ")], \
            log.recovery.index_problems
        # New records continue the queue; nothing is numbered twice.
        assert log.append([Message("t", 1, None, b"new", 1)]).queue_offsets == [("t", 1, 10)]
    finally:
        log.close()


def test_an_index_is_rebuilt_past_a_damaged_record_which_stays_unserved(tmp_path: Path) -> None:
    """A rebuild walks the whole log: it steps over a record damaged in place (its queue's
    offsets confirm where it belongs) instead of refusing to start."""
    records = build(tmp_path)
    victim = next(r for r in records if r.queue == 1 and r.queue_offset == 3)
    flip(segments(tmp_path)[0], victim.phys_offset + victim.size - 5)
    (tmp_path / "index" / "t" / "1").write_bytes(b"")
    found: list[DamagedRecordError] = []
    log = CommitLog.open(tmp_path, segment_bytes=SEG, on_damaged=found.append)
    try:
        assert [(e.topic, e.queue, e.offset) for e in found] == [("t", 1, 3)]
        assert log.recovery.damaged == (str(found[0]),)
        assert read_all(log, "t", 1) == [r for r in records if r.queue == 1][:3]
        with pytest.raises(DamagedRecordError):
            read_all(log, "t", 1, 3)
        assert read_all(log, "t", 1, 4) == [r for r in records if r.queue == 1][4:]
    finally:
        log.close()


def test_a_damaged_record_whose_queue_cannot_be_confirmed_stops_a_rebuild(
        tmp_path: Path) -> None:
    """Its header names a queue that does not go on there: the rebuild does not guess,
    and the log is not opened (an operator decides)."""
    records = build(tmp_path)
    victim = next(r for r in records if r.queue == 1 and r.queue_offset == 3)
    flip(segments(tmp_path)[0], victim.phys_offset + PREFIX_SIZE + 27)  # the queue id
    (tmp_path / "index" / "t" / "1").write_bytes(b"")
    with pytest.raises(CorruptSegmentError) as info:
        CommitLog.open(tmp_path, segment_bytes=SEG)
    assert (info.value.path, info.value.position) == (segments(tmp_path)[0], victim.phys_offset)


def test_indexes_that_agree_with_the_log_are_not_reported(tmp_path: Path) -> None:
    build_idle_queue(tmp_path)
    (tmp_path / "commitlog" / "recovery-point").unlink()
    log = CommitLog.open(tmp_path, segment_bytes=SEG)
    try:
        assert log.recovery.index_problems == ()
        assert log.recovery.indexes_rebuilt == 0
    finally:
        log.close()


# ---- an unreadable offsets file ---------------------------------------------------------------

def open_store(root: Path) -> Store:
    return Store.open(root, segment_bytes=SEG, flush=FlushPolicy(mode="interval"),
                      retention=Retention(), flush_before_ack=False)


def commit(store: Store, group: str, queue: int, offset: int) -> None:
    """What the master does for a COMMIT_OFFSET: the offsets store, then a commit record."""
    store.offsets.commit(group, "t", queue, offset)
    store.log.append([Message(COMMITS_TOPIC, 0, None,
                              encode_commit_record(group, "t", {queue: offset}), 1)])


GARBAGE = {
    "random bytes": lambda raw: bytes(range(256)) * 3,
    "truncated JSON": lambda raw: raw[: len(raw) // 2],
    "JSON of the wrong shape": lambda raw: json.dumps({"format": 1, "offsets": [1, 2]}).encode(),
    "missing": None,
}


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
def test_unreadable_offsets_are_rebuilt_from_the_commit_records(tmp_path: Path,
                                                                garbage: str) -> None:
    store = open_store(tmp_path)
    try:
        for i in range(40):  # commits spread over several segments, between messages
            store.log.append([Message("t", i % 2, None, b"m" * 700, 1)])
            commit(store, "g", i % 2, i // 2 + 1)
        commit(store, "h", 0, 5)
        store.offsets.persist()
        want = store.offsets.snapshot()
    finally:
        store.close()
    path = tmp_path / "offsets.json"
    raw = path.read_bytes()
    make = GARBAGE[garbage]
    if make is None:
        path.unlink()
    else:
        path.write_bytes(make(raw))
    store = open_store(tmp_path)
    try:
        assert store.offsets.snapshot() == want
    finally:
        store.close()
    # The unreadable file is kept for an operator; a valid one is in its place.
    if make is not None:
        [kept] = tmp_path.glob("offsets.json.corrupt-*")
        assert kept.read_bytes() == make(raw)
    assert json.loads(path.read_bytes())["offsets"] == {
        g: {t: {str(q): o for q, o in qs.items()} for t, qs in ts.items()}
        for g, ts in want.items()}


def test_a_second_unreadable_offsets_file_does_not_replace_the_first(tmp_path: Path) -> None:
    open_store(tmp_path).close()
    path = tmp_path / "offsets.json"
    for junk in [b"first {", b"second [", b"third"]:  # within one second, most likely
        path.write_bytes(junk)
        open_store(tmp_path).close()
    kept = sorted(f.read_bytes() for f in tmp_path.glob("offsets.json.corrupt-*"))
    assert kept == [b"first {", b"second [", b"third"]


# ---- a damaged commit record, a slave's damaged copy --------------------------------------------

def test_a_damaged_commit_record_is_skipped_and_the_later_ones_applied(tmp_path: Path) -> None:
    """A slave replays the commit records of its log (at start, and as they arrive): one
    damaged record must not stop the ones after it."""
    store = open_store(tmp_path)
    try:
        for i in range(30):
            store.log.append([Message("t", 0, None, b"m" * 700, 1)])
            commit(store, f"g{i % 3}", 0, i + 1)
        victim = store.log.read(COMMITS_TOPIC, 0, 4, max_bytes=1, max_records=1)[0]
    finally:
        store.close()  # offsets.json was never written: the slave's log holds every commit
    flip(segments(tmp_path)[victim.phys_offset // SEG], victim.phys_offset % SEG + victim.size - 3)
    store = open_store(tmp_path)
    try:
        replica = SlaveReplica(store, name="s", master=("127.0.0.1", 1), link_timeout_s=1,
                               on_data=lambda: None)
        replica.apply_commit_records()
        # Record 4 (g1 -> 5) is lost, but g1's later commits carry it past.
        assert store.offsets.snapshot() == {"g0": {"t": {0: 28}}, "g1": {"t": {0: 29}},
                                            "g2": {"t": {0: 30}}}
    finally:
        store.close()


def test_a_slaves_damaged_copy_is_named_not_served_and_replication_goes_on(
        tmp_path: Path) -> None:
    """The slave's log is the master's bytes; its own copy of an old record is damaged.
    The slave opens, names it on read, serves the rest, and keeps appending what the
    master sends after its end (it cannot re-fetch the middle: see the docs)."""
    build(tmp_path / "m")
    master = CommitLog.open(tmp_path / "m", segment_bytes=SEG)
    slave = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
    try:
        while slave.max_phys < master.max_phys:
            slave.append_replicated(slave.max_phys, master.read_raw(slave.max_phys, 1 << 20))
    finally:
        slave.close()
    victim = read_all(master, "t", 2)[1]
    flip(segments(tmp_path / "s")[0], victim.phys_offset + victim.size - 1)
    slave = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
    try:
        with pytest.raises(DamagedRecordError, match=r"t/2 offset 1 is damaged: CRC mismatch"):
            read_all(slave, "t", 2, 1)
        master.append([Message("t", 2, None, b"after", 1)])
        slave.append_replicated(slave.max_phys, master.read_raw(slave.max_phys, 1 << 20))
        assert read_all(slave, "t", 2, 2) == read_all(master, "t", 2, 2)
        assert read_all(master, "t", 2, 1)[0] == victim  # the master's copy is intact
    finally:
        slave.close()
        master.close()


@pytest.mark.parametrize("where", ["body", "record length"])
def test_a_damaged_batch_is_refused_whole_skipped_whole_and_mended_from_a_copy(
        tmp_path: Path, where: str) -> None:
    """A batch is checked whole: a byte flipped in its third message (its body, or the
    length field of its record inside the batch) takes out its five messages, at
    whichever offset a read starts; the error names them and the offset after them;
    recovery steps over it in a sealed segment (the batch's own length still frames what
    follows); another copy's intact batch mends it."""
    master = CommitLog.open(tmp_path / "m", segment_bytes=SEG)
    try:
        for i in range(12):  # 12 appends x 5 messages to one queue, batches of 5
            master.append([Message("t", 0, None, b"m-%02d-%d-" % (i, k) + b"x" * 250, i)
                           for k in range(5)])
        slave = CommitLog.open(tmp_path / "s", segment_bytes=SEG)
        try:
            while slave.max_phys < master.max_phys:
                slave.append_replicated(slave.max_phys,
                                        master.read_raw(slave.max_phys, 1 << 20))
        finally:
            slave.close()
        everything = read_all(master, "t", 0)
        victim = everything[7]  # offsets 5..9 are the second batch
        assert {r.phys_offset for r in everything[5:10]} == {victim.phys_offset}
        assert victim.phys_offset + victim.size <= SEG  # in the first, sealed segment
        at = bytes(segments(tmp_path / "s")[0].read_bytes()).index(victim.body)
        # The record's head (key length, body length, delta) is the 12 bytes before it.
        flip(segments(tmp_path / "s")[0], at + 10 if where == "body" else at - 5)
        found: list[DamagedRecordError] = []
        slave = CommitLog.open(tmp_path / "s", segment_bytes=SEG, on_damaged=found.append)
        try:
            assert len(slave.recovery.damaged) == 1  # scanned at open, stepped over
            assert read_all(slave, "t", 0) == everything[:5]  # what comes before is served
            for start in (5, 7, 9):
                with pytest.raises(DamagedRecordError,
                                   match=r"t/0 offsets 5\.\.9 are damaged") as info:
                    read_all(slave, "t", 0, start)
                assert (info.value.offset, info.value.next_offset) == (start, 10)
                assert info.value.first_offset == 5
                with pytest.raises(DamagedRecordError, match=r"t/0 offsets 5\.\.9"):
                    slave.read_items("t", 0, start, max_bytes=1 << 20, max_records=100)
                assert [i.end for i in slave.read_items("t", 0, 0, max_bytes=1 << 20,
                                                        max_records=100)] == [5]
            assert len(found) == 1
            assert read_all(slave, "t", 0, 10) == everything[10:]
            assert slave.damaged_phys() == [victim.phys_offset]
            copy = master.record_bytes(victim.phys_offset)
            assert copy is not None
            assert slave.record_bytes(victim.phys_offset) is None  # its own is not intact
            assert slave.repair(victim.phys_offset, copy) is None
            assert read_all(slave, "t", 0) == everything
        finally:
            slave.close()
    finally:
        master.close()
