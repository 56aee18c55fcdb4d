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
    producer = (0xFEED, [0, 1, 2])
    batch = [(0, None, b"a"), (0, None, b"b"), (0, None, b"c")]

    async def send(body: bytes) -> list[tuple[int, int]]:
        conn = await Connection.open(master.address)
        try:
            return list(p.ProduceResponse.decode(
                await conn.request(p.Op.PRODUCE, body, timeout_s=10)).offsets)
        finally:
            await conn.close()

    assert await send(p.encode_produce("t", [(0, None, b"before")])) == [(0, 0)]
    first = await send(p.encode_produce("t", batch, producer=producer))
    assert first == [(0, 1), (0, 2), (0, 3)]
    assert await send(p.encode_produce("t", batch, producer=producer)) == first
    master.kill9()
    before = len(master.log())
    master.log_level = "INFO"  # the rebuild's line
    master.start()
    # The restarted master rebuilt its table while it started, before it served (its
    # start-up banner): not at the first PRODUCE, holding every client's requests.
    await eventually(lambda: "understudy broker " in master.log()[before:], "the banner")
    started = master.log()[before:]
    rebuilt = started.find("producer table rebuilt from the log: 1 producer queue(s) from 1 ")
    assert 0 <= rebuilt < started.find("understudy broker "), started
    # The table is rebuilt from the log: the whole batch and a part of it are repeats,
    # a new number is stored.
    assert await send(p.encode_produce("t", batch, producer=producer)) == first
    mixed = p.encode_produce("t", [(0, None, b"c"), (0, None, b"d")],
                             producer=(0xFEED, [2, 3]))
    assert await send(mixed) == [(0, 3), (0, 4)]
    # Another producer's numbers are its own.
    assert await send(p.encode_produce("t", [(0, None, b"x")], producer=(1, [0]))) == [(0, 5)]
    assert await queue_bodies(master.address, "t", 0) == [b"before", b"a", b"b", b"c", b"d", b"x"]
    metrics = (lc.http_get(master.http_port, "/metrics") or "").splitlines()
    # This incarnation answered four repeats: the whole batch, then "c".
    repeats = [m for m in metrics if m.startswith("understudy_produce_repeats_total{")]
    assert len(repeats) == 1, repeats
    assert repeats[0].endswith(" 4.0"), repeats
