"""Delayed messages and nacks, pure parts: the envelopes, the limits, where a handed-back
message goes, the produce trailer, and the SQLite schedule index on a real file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from understudy_broker import protocol as p
from understudy_broker import scheduling as sch
from understudy_broker.model import TopicNameError, check_topic_name
from understudy_broker.storage.schedule import ScheduleIndex

NOW = 1_800_000_000_000


def test_delivery_times_past_near_far() -> None:
    assert sch.check_deliver_at(NOW - 5000, NOW) == 0  # the past: now
    assert sch.check_deliver_at(NOW, NOW) == 0  # now
    assert sch.check_deliver_at(NOW + 50, NOW) == NOW + 50  # near, but honoured
    assert sch.check_deliver_at(NOW + 40 * 86_400_000, NOW) == NOW + 40 * 86_400_000
    with pytest.raises(sch.ScheduleError, match="longest delay is 45 days"):
        sch.check_deliver_at(NOW + 46 * 86_400_000, NOW)


def test_durations_and_times_parse_or_say_why_not() -> None:
    assert [sch.parse_duration_ms(t) for t in ("500ms", "10s", "1.5m", "2h", "40d", "7")] == [
        500, 10_000, 90_000, 7_200_000, 40 * 86_400_000, 7000]
    with pytest.raises(sch.ScheduleError, match="not a duration"):
        sch.parse_duration_ms("soon")
    assert sch.parse_deliver_at_ms("2027-01-01T00:00:00Z") == 1_798_761_600_000
    assert sch.parse_deliver_at_ms("2027-01-01T01:00:00+01:00") == 1_798_761_600_000
    assert sch.parse_deliver_at_ms("2027-01-01T00:00:00") == 1_798_761_600_000  # UTC
    with pytest.raises(sch.ScheduleError, match="ISO-8601"):
        sch.parse_deliver_at_ms("tomorrow")


def test_schedule_records_round_trip_and_garbage_is_refused() -> None:
    body = sch.encode_entry(due_ms=NOW, topic="orders", queue=3, payload=b"hello")
    assert sch.decode(body) == sch.Entry(NOW, "orders", 3, b"hello")
    assert sch.decode(sch.encode_done([5, 1, 9])) == [5, 1, 9]
    for bad in (b"", b"\x07junk", body[:5], sch.encode_done([1])[:-1]):
        with pytest.raises(sch.ScheduleError):
            sch.decode(bad)
    with pytest.raises(sch.ScheduleError):
        sch.encode_done([])


def test_a_handed_back_message_retries_then_dead_letters() -> None:
    target, first = sch.handed_back(topic="work", queue=2, offset=40, body=b"x",
                                    cgroup="cg", max_reconsume=2)
    assert (target, first) == ("%RETRY%cg", sch.Retry(1, "work", 2, 40, b"x"))
    # Read back from the retry topic: the first origin and the count go on.
    target, second = sch.handed_back(topic="%RETRY%cg", queue=0, offset=7,
                                     body=sch.encode_retry(first), cgroup="cg", max_reconsume=2)
    assert (target, second) == ("%RETRY%cg", sch.Retry(2, "work", 2, 40, b"x"))
    target, third = sch.handed_back(topic="%RETRY%cg", queue=1, offset=3,
                                    body=sch.encode_retry(second), cgroup="cg", max_reconsume=2)
    assert (target, third.reconsume) == ("%DLQ%cg", 3)
    with pytest.raises(sch.ScheduleError):
        sch.handed_back(topic="%RETRY%cg", queue=0, offset=0, body=b"not an envelope",
                        cgroup="cg", max_reconsume=2)


def test_system_topic_names_follow_the_one_rule() -> None:
    assert check_topic_name("%DLQ%cg") == "%DLQ%cg"
    assert check_topic_name("%RETRY%cg-1") == "%RETRY%cg-1"
    for bad in ("%X%cg", "cg%", "%DLQ%", "%DLQ%%RETRY%cg"):
        with pytest.raises(TopicNameError):
            check_topic_name(bad)


def test_the_produce_trailer_carries_one_time_per_message() -> None:
    msgs = [(0, None, b"a"), (1, b"k", b"b")]
    body = p.encode_produce("t", msgs, ("m", 3), [0, NOW])
    assert p.decode_produce_full(body) == p.ProduceBody("t", msgs, ("m", 3), [0, NOW])
    assert p.decode_produce_full(p.encode_produce("t", msgs, None, [0, 0])).deliver_at is None
    # A trailer with the wrong count is a clear error, not a crash.
    bad = p.encode_produce("t", msgs) + bytes([2]) + (1).to_bytes(4, "big") + NOW.to_bytes(8, "big")
    with pytest.raises(p.FrameError, match="1 delivery times for 2 messages"):
        p.decode_produce_full(bad)
    with pytest.raises(ValueError, match="one delivery time per message"):
        p.encode_produce("t", msgs, None, [NOW])


def test_the_nack_request_refuses_what_it_cannot_mean() -> None:
    req = p.NackRequest("cg", "m1", 4, "work", 1, 10, 1000, 16)
    assert p.NackRequest.decode(req.encode()) == req
    for bad in (p.NackRequest("", "m1", 4, "work", 1, 10, 1000, 16),
                p.NackRequest("cg", "m1", 4, "work", 1, -1, 1000, 16)):
        with pytest.raises(p.FrameError):
            p.NackRequest.decode(bad.encode())


def test_the_index_orders_by_due_and_follows_the_log(tmp_path: Path) -> None:
    ix = ScheduleIndex.open(tmp_path / "s.db")
    ix.apply([(0, NOW + 30), (1, NOW + 10), (2, NOW + 20)], [], 3)
    assert ix.due(NOW + 25, 10) == [(1, NOW + 10), (2, NOW + 20)]
    assert ix.next_due() == NOW + 10
    assert ix.pending() == 3
    ix.apply([], [1], 4)  # a DONE record
    assert [o for o, _d in ix.due(NOW + 100, 10)] == [2, 0]
    assert ix.indexed == 4
    assert ix.overdue(NOW + 25) == 1
    # The log was cut shorter by recovery: the index follows it.
    assert ix.cut(1, 0) == 1
    assert ix.indexed == 1
    assert ix.pending() == 1
    ix.close()
    again = ScheduleIndex.open(tmp_path / "s.db")
    assert (again.indexed, again.pending(), again.rebuilt) == (1, 1, None)
    again.close()


def test_escaped_entries_are_never_indexed_again_and_survive_a_reopen(tmp_path: Path) -> None:
    ix = ScheduleIndex.open(tmp_path / "s.db")
    ix.apply([(0, NOW), (1, NOW)], [], 2)
    ix.escaped_add([0])
    ix.close()
    ix = ScheduleIndex.open(tmp_path / "s.db")  # the commit survived the process
    assert ix.escaped() == [0]
    assert [o for o, _ in ix.due(NOW, 10)] == [1]
    ix.apply([(0, NOW)], [], 2)  # re-applying the log does not bring it back
    assert [o for o, _ in ix.due(NOW, 10)] == [1]
    ix.escaped_synced([0])
    assert ix.escaped() == []
    ix.close()


def test_an_unreadable_index_is_set_aside_and_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database" * 100)
    ix = ScheduleIndex.open(path)
    assert ix.rebuilt is not None
    assert ix.indexed == 0
    assert ix.pending() == 0
    assert list(tmp_path.glob("s.db.corrupt-*"))
    ix.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM entry").fetchone() == (0,)


def test_back_sync_carries_escaped_offsets_as_runs() -> None:
    req = p.BackSyncRequest("g1", "g1-1", 3, {}, (7, 1, 2, 3, 9, 8, 20))
    body = req.encode()
    assert b'"escaped":[[1,4],[7,10],[20,21]]' in body.replace(b" ", b"")
    assert sorted(p.BackSyncRequest.decode(body).escaped) == [1, 2, 3, 7, 8, 9, 20]
    for bad in (b'[[3,3]]', b'[[5,2]]', b'[7]', b'"x"', b'[[1,true]]'):
        doc = body.replace(b'[[1,4],[7,10],[20,21]]', bad).replace(
            b'[[1, 4], [7, 10], [20, 21]]', bad)
        with pytest.raises(p.FrameError, match="offset ranges"):
            p.BackSyncRequest.decode(doc)


def test_a_cut_moves_the_applied_position_into_the_log(tmp_path: Path) -> None:
    """Retention took the head of the schedule queue past what was applied: applying
    resumes at the new start. (It stayed behind it, so every pass cut and logged again.)"""
    ix = ScheduleIndex.open(tmp_path / "s.db")
    ix.apply([(0, NOW), (1, NOW)], [], 2)
    assert ix.cut(9, 5) == 2
    assert (ix.indexed, ix.pending()) == (5, 0)
    ix.apply([(7, NOW)], [], 8)
    assert ix.cut(6, 0) == 1  # recovery cut the tail: back to its end
    assert ix.indexed == 6
    ix.close()
