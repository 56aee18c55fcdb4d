"""Corruption beyond a torn tail, with real broker processes: stop the broker, damage a
file, start it again, and look at what a client sees (docs/storage-and-replication.md,
"Corruption"). The broker always starts; what is damaged is named and never served."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import Consumer, DamagedRecord, Producer, create_topic
from understudy_broker.storage.index import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE
from understudy_harness.testing import BrokerProc, queue_bodies, request_once, wait_caught_up

pytestmark = pytest.mark.integration

SMALL = ["--segment-bytes", "65536", "--max-frame-bytes", "32768"]


def body(i: int) -> bytes:
    return b"msg-%05d-" % i + b"x" * 500


async def produce(broker: BrokerProc, sends: list[tuple[int, bytes]]) -> None:
    async with Producer([broker.address], batch_size=16) as prod:
        for queue, data in sends:
            await prod.send("t", data, queue=queue)
        await prod.flush()


async def pull(broker: BrokerProc, queue: int, offset: int) -> p.Frame:
    return await request_once(broker.address, p.Op.PULL,
                              p.PullRequest("t", queue, offset, 1 << 20, 0).encode(), timeout_s=10)


def segment_files(broker: BrokerProc) -> list[Path]:
    return sorted(f for f in (broker.data_dir / "commitlog").iterdir() if f.name.isdigit())


def first_segment(broker: BrokerProc) -> Path:
    return segment_files(broker)[0]


def damage_body(segment: Path, data: bytes) -> None:
    """Flip one byte inside the stored body ``data`` (the segment holds it once)."""
    raw = bytearray(segment.read_bytes())
    at = raw.find(data)
    assert at > 0
    assert raw.find(data, at + 1) < 0
    raw[at + 20] ^= 0x20
    segment.write_bytes(bytes(raw))


def metric(broker: BrokerProc, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))


@pytest.mark.parametrize("where", ["old segment, not scanned at start",
                                   "sealed segment scanned at start"])
async def test_a_damaged_record_is_refused_by_name_and_skippable(brokers: Any,
                                                                  where: str) -> None:
    master = brokers.master(extra=["--async", *SMALL, "--log-level", "INFO"])
    await create_topic([master.address], topic="t", queues=2)
    await produce(master, [(i % 2, body(i)) for i in range(600)])
    master.stop()
    files = segment_files(master)
    assert len(files) >= 5
    if where == "old segment, not scanned at start":
        segment, victim = files[0], 7  # queue 1, offset 3
    else:  # without a recovery point the last three segments are scanned
        (master.data_dir / "commitlog" / "recovery-point").unlink()
        segment = files[-3]
        victim = next(i for i in range(1, 600, 2) if body(i - 2) in segment.read_bytes())
    offset = victim // 2
    damage_body(segment, body(victim))
    master.start()

    # The damage takes out the batch holding the victim (the unit of storage, checked
    # whole): a pull anywhere in it is refused, naming the offset after it.
    refused = await pull(master, 1, offset)
    assert refused.status == p.Status.CORRUPT_RECORD
    message = p.error_message(refused)
    assert p.corrupt_record_offset(message) == offset
    skip_to = p.corrupt_record_skip_to(message)
    assert skip_to is not None, message
    assert skip_to > offset, message
    assert str(segment) in message, message
    assert "CRC mismatch" in message, message
    # Read from the start, every intact message before the batch is served.
    served: list[bytes] = []
    at = 0
    while True:
        answer = await pull(master, 1, at)
        if answer.status == p.Status.CORRUPT_RECORD:
            break
        got_now = p.PullResponse.decode(answer.body).records
        served += [r.body for r in got_now]
        at = got_now[-1].offset + 1
    start = at
    assert start <= offset < skip_to <= start + 16  # at most a producer batch
    queue1 = [body(i) for i in range(1, 600, 2)]
    assert served == queue1[:start]
    refused_first = await pull(master, 1, skip_to - 1)
    assert refused_first.status == p.Status.CORRUPT_RECORD
    assert p.corrupt_record_skip_to(p.error_message(refused_first)) == skip_to
    rest = p.PullResponse.decode((await pull(master, 1, skip_to)).body)
    assert rest.records[0].body == queue1[skip_to]
    assert await queue_bodies(master.address, "t", 0) == [body(i) for i in range(0, 600, 2)]

    # A consumer is told (not retried forever), and may skip it explicitly.
    consumer = Consumer([master.address], group="g", topic="t", max_wait_ms=100)
    got: list[bytes] = []
    skipped: list[DamagedRecord] = []
    try:
        while True:
            try:
                batch = await consumer.getmany(timeout_s=2)
            except DamagedRecord as exc:
                skipped.append(exc)
                await consumer.skip(exc)
                continue
            if not batch:
                break
            got += [r.body for r in batch]
        await consumer.commit()
    finally:
        await consumer.close()
    assert [(d.topic, d.queue, d.offset, d.skip_to, d.status) for d in skipped] == [
        ("t", 1, start, skip_to, p.Status.CORRUPT_RECORD)]
    lost = set(queue1[start:skip_to])
    assert sorted(got) == sorted(body(i) for i in range(600) if body(i) not in lost)
    fetched = await request_once(master.address, p.Op.FETCH_OFFSET,
                                 p.FetchOffsetRequest("g", "t", [0, 1]).encode())
    assert p.OffsetsResponse.decode(fetched.body).offsets == {0: 300, 1: 300}

    # Counted and logged once, with the file, however often it was read.
    assert metric(master, "understudy_corrupt_records_total") == 1
    lines = [line for line in master.log().splitlines() if "damaged record, not served" in line]
    assert len(lines) == 1, lines
    assert str(segment) in lines[0], lines
    assert f"t/1 offsets {start}..{skip_to - 1} are damaged" in lines[0], lines


INDEX_DAMAGE = {
    "cut mid-entry": lambda raw: raw[:INDEX_HEADER_SIZE + 5 * INDEX_ENTRY_SIZE + 9],
    "cut to the header": lambda raw: raw[:INDEX_HEADER_SIZE],
    "cut to zero bytes": lambda raw: b"",
    "garbage header": lambda raw: os.urandom(INDEX_HEADER_SIZE) + raw[INDEX_HEADER_SIZE:],
}


@pytest.mark.parametrize(("damage", "point"), [
    ("cut mid-entry", "removed"), ("cut to the header", "removed"),
    ("cut to zero bytes", "removed"), ("garbage header", "removed"),
    ("cut to the header", "kept")])
async def test_a_damaged_index_is_rebuilt_at_start_and_every_message_served(
        brokers: Any, damage: str, point: str) -> None:
    master = brokers.master(extra=["--async", *SMALL])
    await create_topic([master.address], topic="t", queues=2)
    # Queue 1 only early: its records lie before the part of the log a restart scans.
    early = [body(i) for i in range(20)]
    await produce(master, [(1, b) for b in early] + [(0, body(i)) for i in range(600)])
    master.stop()
    index = master.data_dir / "index" / "t" / "1"
    index.write_bytes(INDEX_DAMAGE[damage](index.read_bytes()))
    if point == "removed":  # e.g. a damaged recovery point: no index end to compare with
        (master.data_dir / "commitlog" / "recovery-point").unlink()
    master.start()
    assert await queue_bodies(master.address, "t", 1) == early
    assert len(await queue_bodies(master.address, "t", 0)) == 600
    async with Producer([master.address]) as prod:
        sent = await prod.send("t", b"new", queue=1)
        await prod.flush()
    assert sent.result() == (1, 20)  # the queue goes on; no offset is given twice
    assert f"index repaired from the log: {index}: " in master.log(), master.log()[-2000:]


OFFSETS_DAMAGE = {
    "random bytes": lambda raw: os.urandom(len(raw)),
    "truncated JSON": lambda raw: raw[: len(raw) // 2],
    "JSON of the wrong shape": lambda raw: json.dumps({"format": 1, "offsets": {"g": 7}}).encode(),
}


@pytest.mark.parametrize("damage", sorted(OFFSETS_DAMAGE))
async def test_a_garbage_offsets_file_is_set_aside_and_rebuilt_from_the_log(
        brokers: Any, damage: str) -> None:
    master = brokers.master(extra=["--async", *SMALL])
    await create_topic([master.address], topic="t", queues=2)
    await produce(master, [(i % 2, body(i)) for i in range(200)])
    first: list[bytes] = []
    consumer = Consumer([master.address], group="g", topic="t", max_wait_ms=100)
    try:
        while len(first) < 120:
            first += [r.body for r in await consumer.getmany(timeout_s=2)]
        committed = await consumer.commit()
    finally:
        await consumer.close()
    master.stop()
    path = master.data_dir / "offsets.json"
    garbage = OFFSETS_DAMAGE[damage](path.read_bytes())
    path.write_bytes(garbage)
    master.start()

    fetched = await request_once(master.address, p.Op.FETCH_OFFSET,
                                 p.FetchOffsetRequest("g", "t", [0, 1]).encode())
    assert p.OffsetsResponse.decode(fetched.body).offsets == committed
    [kept] = master.data_dir.glob("offsets.json.corrupt-*")
    assert kept.read_bytes() == garbage
    assert f"corrupt consumer-offset file {path}" in master.log()
    assert f"moved to {kept}" in master.log()
    # The group goes on exactly where it committed: nothing again, nothing skipped.
    rest: list[bytes] = []
    consumer = Consumer([master.address], group="g", topic="t", max_wait_ms=100)
    try:
        while batch := await consumer.getmany(timeout_s=2):
            rest += [r.body for r in batch]
    finally:
        await consumer.close()
    assert sorted(first + rest) == sorted(body(i) for i in range(200))


async def test_a_slaves_damaged_copy_is_named_not_served_and_it_keeps_replicating(
        brokers: Any) -> None:
    master = brokers.master(extra=["--async", *SMALL])
    slave = brokers.slave(master, extra=["--permission", "READ", *SMALL])
    await create_topic([master.address], topic="t", queues=2)
    await produce(master, [(i % 2, body(i)) for i in range(600)])
    await wait_caught_up(master.address, slave.address)
    slave.stop()
    segment = first_segment(slave)
    damage_body(segment, body(7))
    slave.start()

    refused = await pull(slave, 1, 3)
    assert refused.status == p.Status.CORRUPT_RECORD
    assert str(segment) in p.error_message(refused)
    intact = p.PullResponse.decode((await pull(master, 1, 3)).body)
    assert intact.records[0].body == body(7)  # the master's copy is whole
    await produce(master, [(1, b"after")])
    await wait_caught_up(master.address, slave.address)
    after = p.PullResponse.decode((await pull(slave, 1, 300)).body)
    assert [r.body for r in after.records] == [b"after"]
