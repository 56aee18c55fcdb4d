"""History files: the JSONL writer and the strict reader the checker is fed from."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from understudy_broker.model import Mode, Permission
from understudy_harness.checker import check
from understudy_harness.history import (
    Deliver,
    HistoryError,
    HistoryWriter,
    ModeChange,
    Perm,
    ProduceAck,
    read_history,
)


def test_writer_and_reader_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    ticks = iter(range(100, 10_000, 10))
    with HistoryWriter(path, clock=lambda: next(ticks), clock_name="test") as w:
        w.produce_ack(id="a", topic="t", queue=1, offset=7)
        w.deliver(cgroup="cg", topic="t", queue=1, offset=7, id="a")
        w.commit(cgroup="cg", topic="t", queue=1, offset=8)
        w.perm(group="g1", broker="g1-0", effective=Permission.FULL, role="master")
        w.mode(group="g1", mode=Mode.SLAVE_CONSUME, epoch=4)
        w.fault(cycle=1, kind="kill", broker="g1-0", group="g1")
        w.restart(cycle=1, broker="g1-0", group="g1")
        assert w.count == 7
    loaded = read_history(path)
    assert loaded.header["clock"] == "test"
    assert loaded.torn_tail == 0
    assert loaded.events[0] == ProduceAck(110, "a", "t", 1, 7)
    assert loaded.events[1] == Deliver(120, "cg", "t", 1, 7, "a")
    assert loaded.events[3] == Perm(140, "g1", "g1-0", Permission.FULL, "master")
    assert loaded.events[4] == ModeChange(150, "g1", Mode.SLAVE_CONSUME, 4)
    assert [e.t for e in loaded.events] == sorted(e.t for e in loaded.events)
    report = check(loaded.events)
    assert report.ok
    assert len(report.cycles) == 1


def test_writer_is_safe_across_threads(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:

        def produce(prefix: str) -> None:
            for i in range(200):
                w.produce_ack(id=f"{prefix}{i}", topic="t", queue=0, offset=i)

        threads = [threading.Thread(target=produce, args=(p,)) for p in "abcd"]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    loaded = read_history(path)
    assert len(loaded.events) == 800
    assert check(loaded.events).acked == 800


def test_torn_last_line_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:
        w.produce_ack(id="a", topic="t", queue=0, offset=0)
    with path.open("a") as fh:
        fh.write('{"type":"deliver","t":12,"cgr')  # the recorder died mid-line
    loaded = read_history(path)
    assert loaded.torn_tail == 1
    assert len(loaded.events) == 1


def test_corrupt_line_in_the_middle_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(
        '{"type":"produce_ack","t":1,"id":"a","topic":"t","queue":0,"offset":0}\n'
        "not json at all\n"
        '{"type":"produce_ack","t":2,"id":"b","topic":"t","queue":0,"offset":1}\n'
    )
    with pytest.raises(HistoryError, match=r"h.jsonl:2: not JSON"):
        read_history(path)


def test_non_object_line_and_bad_field_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(HistoryError, match="expected a JSON object"):
        read_history(path)
    path.write_text('{"type":"commit","t":1,"cgroup":"c","topic":"t","queue":"0","offset":1}\n')
    with pytest.raises(HistoryError, match=r"h.jsonl:1: commit.queue must be int"):
        read_history(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="cannot read history"):
        read_history(tmp_path / "nope.jsonl")


def test_closed_writer_refuses(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path / "h.jsonl")
    w.close()
    with pytest.raises(HistoryError, match="closed"):
        w.produce_ack(id="a", topic="t", queue=0, offset=0)


def test_appending_to_a_history_adds_no_second_header(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path, clock=lambda: 5, clock_name="first") as w:
        w.produce_ack(id="a", topic="t", queue=0, offset=0)
    with HistoryWriter(path, clock=lambda: 9, clock_name="second") as w:
        w.produce_ack(id="b", topic="t", queue=0, offset=1)
    lines = path.read_text().splitlines()
    assert sum('"header"' in line for line in lines) == 1
    loaded = read_history(path)
    assert loaded.header["clock"] == "first"
    assert [e.t for e in loaded.events] == [5, 9]
