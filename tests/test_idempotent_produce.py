"""Invariant 8 on real broker processes: a producer's retried send to the same queue is
stored once, also after the master restarted (docs/idempotence.md).

The retry is a real one: the slave of a static pair is frozen, so the master appends the
batch but cannot acknowledge it within ``--ack-timeout``; the producer gets TIMEOUT and
sends the same batch again (a keyed send stays on its queue) until the slave resumes.
Without idempotence the same run stores the message several times, which is what the
test would see if the broker forgot what it stored.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import Connection, Producer, create_topic
from understudy_harness.testing import eventually, queue_bodies
from understudy_operator.local import cluster as lc

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
async def test_a_send_retried_while_the_slave_is_frozen_is_stored_once(
        brokers: Any, idempotent: bool) -> None:
    master = brokers.master(extra=["--ack-timeout", "0.4"])
    slave = brokers.slave(master)
    await create_topic([master.address], topic="t", queues=2)
    async with Producer([master.address], idempotent=idempotent, retries=20,
                        retry_backoff_ms=100, send_timeout_s=30, request_timeout_s=5,
                        hedge_after_ms=None) as prod:
        await (await prod.send("t", b"warm-up", key=b"k"))
        os.kill(slave.pid, signal.SIGSTOP)
        try:
            sent = await prod.send("t", b"retried", key=b"k")
            await asyncio.sleep(1.5)  # several attempts time out meanwhile
        finally:
            os.kill(slave.pid, signal.SIGCONT)
        queue, offset = await sent
    stored = await queue_bodies(master.address, "t", queue)
    if idempotent:
        assert stored.count(b"retried") == 1, stored
        assert stored[offset] == b"retried"
    else:  # what the broker does without the numbers: proof that the retries happened
        assert stored.count(b"retried") > 1, stored


async def test_a_repeat_after_the_master_restarted_gets_the_first_offset(brokers: Any) -> None:
    master = brokers.master(extra=["--async"])
    await create_topic([master.address], topic="t", queues=1)
    await create_topic([master.address], topic="u", queues=2)
    producer = (0xFEED, [0, 1, 2])
    batch = [(0, None, b"a"), (0, None, b"b"), (0, None, b"c")]
    # A PRODUCE_MULTI of another producer over two topics: one producer record for both.
    multi = p.MultiRequest([
        p.encode_produce("u", [(0, None, b"u0"), (1, None, b"u1")], producer=(0xBEEF, [0, 0])),
        p.encode_produce("t", [(0, None, b"t9")], producer=(0xBEEF, [0]))]).encode()

    async def send(body: bytes, op: p.Op = p.Op.PRODUCE) -> list[tuple[int, int]]:
        conn = await Connection.open(master.address)
        try:
            answer = await conn.request(op, body, timeout_s=10)
        finally:
            await conn.close()
        if op is p.Op.PRODUCE:
            return list(p.ProduceResponse.decode(answer).offsets)
        results = p.ProduceMultiResponse.decode(answer).results
        assert all(status == p.Status.OK for status, _b in results), results
        return [o for _s, b in results for o in p.ProduceResponse.decode(b).offsets]

    assert await send(p.encode_produce("t", [(0, None, b"before")])) == [(0, 0)]
    first = await send(p.encode_produce("t", batch, producer=producer))
    assert first == [(0, 1), (0, 2), (0, 3)]
    assert await send(p.encode_produce("t", batch, producer=producer)) == first
    multi_first = await send(multi, p.Op.PRODUCE_MULTI)
    assert multi_first == [(0, 0), (1, 0), (0, 4)]
    master.kill9()
    before = len(master.log())
    master.log_level = "INFO"  # the rebuild's line
    master.start()
    # The restarted master rebuilt its table while it started, before it served (its
    # start-up banner): not at the first PRODUCE, holding every client's requests.
    await eventually(lambda: "understudy broker " in master.log()[before:], "the banner")
    started = master.log()[before:]
    # Four producer queues (0xFEED's t/0; 0xBEEF's u/0, u/1 and t/0) from two records:
    # the batch's and the PRODUCE_MULTI's one for both its topics.
    rebuilt = started.find("producer table rebuilt from the log: 4 producer queue(s) from 2 ")
    assert 0 <= rebuilt < started.find("understudy broker "), started
    # The table is rebuilt from the log: the whole batch and a part of it are repeats,
    # a new number is stored.
    assert await send(p.encode_produce("t", batch, producer=producer)) == first
    assert await send(multi, p.Op.PRODUCE_MULTI) == multi_first
    mixed = p.encode_produce("t", [(0, None, b"c"), (0, None, b"d")],
                             producer=(0xFEED, [2, 3]))
    assert await send(mixed) == [(0, 3), (0, 5)]
    # Another producer's numbers are its own.
    assert await send(p.encode_produce("t", [(0, None, b"x")], producer=(1, [0]))) == [(0, 6)]
    assert await queue_bodies(master.address, "t", 0) == [b"before", b"a", b"b", b"c", b"t9", b"d",
                                                         b"x"]
    assert await queue_bodies(master.address, "u", 0) == [b"u0"]
    assert await queue_bodies(master.address, "u", 1) == [b"u1"]
    metrics = (lc.http_get(master.http_port, "/metrics") or "").splitlines()
    # This incarnation answered seven repeats: the whole batch, the whole multi, then "c".
    repeats = [m for m in metrics if m.startswith("understudy_produce_repeats_total{")]
    assert len(repeats) == 1, repeats
    assert repeats[0].endswith(" 7.0"), repeats
