"""The idempotent producer's rules (pure): runs, the producer record, the table; and the
master's load of its table from a real log."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from understudy_broker import idempotence as idem
from understudy_broker.idempotence import Run
from understudy_broker.server.producers import Producers
from understudy_broker.storage.commitlog import CommitLog


def test_consecutive_numbers_at_consecutive_offsets_make_one_run() -> None:
    stored = [(0, 5, 100), (1, 0, 7), (0, 6, 101), (0, 7, 102), (1, 1, 8),
              (0, 9, 103),  # a number skipped: a new run
              (2, 3, idem.SCHEDULED), (2, 4, idem.SCHEDULED), (2, 5, 40)]
    assert idem.runs_of(stored) == [
        Run(0, 5, 3, 100), Run(1, 0, 2, 7), Run(0, 9, 1, 103),
        Run(2, 3, 2, idem.SCHEDULED), Run(2, 5, 1, 40)]


def test_the_record_round_trips_and_refuses_what_it_did_not_write() -> None:
    runs = [Run(0, 5, 3, 100), Run(7, 2**63, 1, idem.SCHEDULED)]
    body = idem.encode_record(2**64 - 1, "tópic", runs)
    assert idem.decode_record(body) == (2**64 - 1, [("tópic", runs)])
    for bad in (body[:-1], body + b"x", b"\x03" + body[1:], b"", b"\x01\x00"):
        with pytest.raises(ValueError, match="producer record"):
            idem.decode_record(bad)


def test_one_record_holds_the_runs_of_every_topic_of_a_request() -> None:
    parts = [("orders", [Run(0, 5, 3, 100)]), ("pay", []), ("t", [Run(2, 0, 1, idem.SCHEDULED)])]
    body = idem.encode_request_record(9, parts)
    assert body[0] == 2  # version 2: several topics
    assert idem.decode_record(body) == (9, parts)
    # One topic is written as version 1, which brokers before version 2 read too.
    assert idem.encode_request_record(9, parts[:1]) == idem.encode_record(9, *parts[0])
    for bad in (body[:-1], body + b"\x00", b"\x02" + body[1:9] + b"\x00\x01" + body[11:]):
        with pytest.raises(ValueError, match="producer record"):
            idem.decode_record(bad)
    with pytest.raises(ValueError, match="1 to 65535 topics"):
        idem.encode_request_record(9, [])
    table = idem.ProducerTable()
    assert table.rebuild([body]) == 0
    assert table.lookup(9, "orders", 0, 7) == 102
    assert table.lookup(9, "t", 2, 0) == idem.SCHEDULED


def test_the_table_answers_repeats_inside_recorded_runs_only() -> None:
    table = idem.ProducerTable()
    table.record(1, "t", [Run(0, 10, 5, 200)])
    table.record(1, "t", [Run(0, 0, 3, 300)])  # an earlier batch that arrived later
    assert table.repeats(1, "t", [0, 0, 0, 0, 0], [10, 14, 15, 2, 3]) == {0: 200, 1: 204, 3: 302}
    assert table.lookup(2, "t", 0, 10) is None  # another producer
    assert table.lookup(1, "u", 0, 10) is None  # another topic
    assert table.lookup(1, "t", 1, 10) is None  # another queue


def test_the_table_keeps_the_last_runs_per_queue_and_the_recent_keys() -> None:
    table = idem.ProducerTable(runs_per_queue=2, max_keys=2)
    for i in range(3):
        table.record(1, "t", [Run(0, i * 10, 1, i)])
    assert [table.lookup(1, "t", 0, s) for s in (0, 10, 20)] == [None, 1, 2]
    table.record(2, "t", [Run(0, 0, 1, 50)])
    table.lookup(1, "t", 0, 10)
    table.record(1, "t", [Run(0, 30, 1, 3)])  # producer 1 used again: producer 2 is older
    table.record(3, "t", [Run(0, 0, 1, 60)])
    assert len(table) == 2
    assert table.lookup(2, "t", 0, 0) is None
    assert table.lookup(1, "t", 0, 30) == 3


def test_a_producers_next_batch_right_after_the_last_extends_its_run() -> None:
    table = idem.ProducerTable(runs_per_queue=2)
    for n in range(100):  # one producer alone on the queue: one run for all of it
        table.record(1, "t", [Run(0, n * 3, 3, 10 + n * 3)])
    table.record(1, "t", [Run(0, 300, 2, 400)])  # another producer wrote in between
    table.record(1, "t", [Run(0, 302, 1, idem.SCHEDULED)])
    table.record(1, "t", [Run(0, 303, 1, idem.SCHEDULED)])
    assert table.runs(1, "t", 0) == [Run(0, 300, 2, 400), Run(0, 302, 2, idem.SCHEDULED)]
    table2 = idem.ProducerTable(runs_per_queue=2)
    for n in range(100):
        table2.record(1, "t", [Run(0, n * 3, 3, 10 + n * 3)])
    assert table2.runs(1, "t", 0) == [Run(0, 0, 300, 10)]
    assert table2.lookup(1, "t", 0, 0) == 10
    assert table2.lookup(1, "t", 0, 299) == 309


def test_a_rebuild_replays_records_and_skips_unreadable_ones() -> None:
    table = idem.ProducerTable()
    good = idem.encode_record(9, "t", [Run(3, 0, 4, 10)])
    assert table.rebuild([good, b"garbage", good]) == 1
    assert table.lookup(9, "t", 3, 3) == 13


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_retried_batches_are_stored_once_whatever_the_order(data: st.DataObject) -> None:
    """A model of the master: batches of numbered messages to a few queues arrive, some
    again (retries), in any order; each message is stored exactly once as long as its
    run is among the last ones kept, and a repeat is answered with its first offset."""
    sent: list[list[tuple[int, int]]] = []  # batches of (queue, seq)
    next_seq = [0, 0, 0]
    for _ in range(data.draw(st.integers(1, 8))):
        batch = []
        for q in data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=6)):
            batch.append((q, next_seq[q]))
            next_seq[q] += 1
        sent.append(batch)
    arrivals = data.draw(st.lists(st.sampled_from(range(len(sent))), min_size=1,
                                  max_size=16)) + list(range(len(sent)))
    table = idem.ProducerTable()
    log: list[list[int]] = [[], [], []]  # per queue: the seq at each offset
    first: dict[tuple[int, int], int] = {}
    for b in arrivals:
        queues = [q for q, _s in sent[b]]
        seqs = [s for _q, s in sent[b]]
        repeats = table.repeats(7, "t", queues, seqs)
        stored = []
        for i, (q, s) in enumerate(sent[b]):
            if i in repeats:
                assert repeats[i] == first[(q, s)]
                continue
            first[(q, s)] = len(log[q])
            stored.append((q, s, len(log[q])))
            log[q].append(s)
        table.record(7, "t", idem.runs_of(stored))
    for q in range(3):
        assert sorted(log[q]) == list(range(next_seq[q])), f"queue {q}: {log[q]}"


async def test_a_message_that_comes_back_to_a_queue_keeps_its_number_there() -> None:
    """Found by the chaos soak: a send to an island master, unanswered, was retried on
    another group and from there moved back to its first queue under that queue's *next*
    number, so the master could not tell it was the same message and stored it twice."""
    from understudy_broker import protocol as p
    from understudy_broker.client import Producer, _Pending

    prod = Producer(["127.0.0.1:1"])  # encodes only: never connects
    loop = asyncio.get_running_loop()

    def numbers(items: list[_Pending]) -> list[int]:
        decoded = p.decode_produce_full(prod._encode("t", items, batch=False))
        assert decoded.producer is not None
        in_batches = p.decode_produce_batches(prod._encode("t", list(items), batch=True))
        assert in_batches.producer == decoded.producer  # items of one queue: same order
        return list(decoded.producer[1])

    a = _Pending(1, None, b"a", loop.create_future(), False, 0.0)
    b = _Pending(1, None, b"b", loop.create_future(), False, 0.0)
    assert numbers([a, b]) == [0, 1]
    moved = _Pending(4, a.key, a.body, a.future, False, 0.0, seqs=a.seqs)  # retried elsewhere
    assert numbers([moved]) == [0]  # queue 4's first number
    back = _Pending(1, a.key, a.body, a.future, False, 0.0, seqs=moved.seqs)  # and back
    assert numbers([back, _Pending(1, None, b"c", loop.create_future(), False, 0.0)]) == [0, 2]
    for item in (a, b, moved, back):
        item.future.cancel()
    await prod.router.close()


async def test_a_master_loads_its_table_a_chunk_at_a_time_and_gets_what_one_build_gets(
        tmp_path: Path) -> None:
    # 2,500 producer records: three reads of up to 1,024. Between reads the event loop
    # runs other tasks (a broker's ZooKeeper pings), and the table is the same as one
    # built in one go on the first PRODUCE.
    log = CommitLog.open(tmp_path / "log")
    try:
        for n in range(2500):
            body = idem.encode_record(n % 7, "t", [Run(n % 3, n, 1, n)])
            log.append([(idem.PRODUCERS_TOPIC, 0, None, body, 0)])
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        loaded = Producers(log)
        await loaded.load()
        during = ticks
        task.cancel()
        assert loaded.loaded
        assert during >= 3
        once = Producers(log).table()
        for pid in range(7):
            for q in range(3):
                assert loaded.table().runs(pid, "t", q) == once.runs(pid, "t", q)
        assert loaded.table().lookup(2499 % 7, "t", 2499 % 3, 2499) == 2499
    finally:
        log.close()


_runs = st.lists(st.builds(Run, st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1),
                           st.integers(0, 2**32 - 1), st.integers(-1, 2**62)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**64 - 1), st.text(max_size=8), _runs, st.binary(max_size=64), st.data())
def test_any_record_round_trips_and_any_damage_is_a_value_error(
        producer: int, topic: str, runs: list[Run], junk: bytes, data: st.DataObject) -> None:
    """Producer records are read back from the log: what this version wrote reads back
    exactly; bytes it did not write (cut, extended, flipped, random) raise ValueError,
    nothing else (the table skips them)."""
    several = data.draw(st.lists(st.tuples(st.text(max_size=8), _runs), min_size=2, max_size=4,
                                 unique_by=lambda part: part[0]))
    body = idem.encode_record(producer, topic, runs)
    assert idem.decode_record(body) == (producer, [(topic, runs)])
    request = idem.encode_request_record(producer, several)
    assert idem.decode_record(request) == (producer, several)
    if data.draw(st.booleans()):
        body = request
    cut = data.draw(st.integers(0, len(body)))
    flip = data.draw(st.integers(0, len(body) - 1))
    damaged = bytearray(body)
    damaged[flip] ^= data.draw(st.integers(1, 255))
    for bad in (body[:cut], body + junk, bytes(damaged), junk):
        with contextlib.suppress(ValueError):
            idem.decode_record(bad)
