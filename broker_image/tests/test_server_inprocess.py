"""The server in this process (real log, real sockets on 127.0.0.1) with an authority the
test can change: stale epochs, permission changes seen by running long-polls,
pipelining of a long-poll and another request on one connection, group commit."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import (
    BrokerError,
    Connection,
    Consumer,
    Producer,
    Router,
    create_topic,
    request_once,
)
from understudy_broker.config import BrokerConfig, advertised_host
from understudy_broker.ha.authority import StaticAuthority
from understudy_broker.model import Permission, Role
from understudy_broker.server.broker import Broker
from understudy_broker.server.errors import RequestError
from understudy_broker.storage.records import MessageTooLargeError, PackedBatch
from understudy_harness.testing import eventually

pytestmark = pytest.mark.integration


class SettableAuthority(StaticAuthority):
    """A real (static) Authority whose permission and epoch the test sets, the way a
    coordinated broker's change with the group state."""

    def __init__(self) -> None:
        self.address = ""
        super().__init__(name="m", group="g", role=Role.MASTER, configured=Permission.FULL,
                         address=lambda: self.address)
        self.perm = Permission.FULL
        self._epoch = 5

    def effective(self) -> Permission:
        return self.perm

    def epoch(self) -> int:
        return self._epoch

    def set(self, perm: Permission, epoch: int) -> None:
        self.perm, self._epoch = perm, epoch
        for fn in self._listeners:
            fn()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Broker, SettableAuthority, str]]:
    auth = SettableAuthority()
    cfg = BrokerConfig(data_dir=tmp_path / "d", port=0, replication_port=0, sync=False, name="m",
                       group="g")
    broker = Broker(cfg, authority=auth)
    where = await broker.start()
    auth.address = f"127.0.0.1:{where.port}"
    try:
        yield broker, auth, f"127.0.0.1:{where.port}"
    finally:
        await broker.stop()


async def test_stale_epoch_is_refused_and_unknown_epoch_accepted(served: Any) -> None:
    _broker, _auth, addr = served
    await create_topic([addr], topic="t", queues=1)
    conn = await Connection.open(addr)
    try:
        body = p.ProduceRequest("t", [p.ProduceMessage(0, None, b"x")]).encode()
        with pytest.raises(BrokerError) as info:
            await conn.request(p.Op.PRODUCE, body, epoch=4)
        assert info.value.status == p.Status.STALE_EPOCH
        for epoch in (0, 5, 6):
            resp = p.ProduceResponse.decode(await conn.request(p.Op.PRODUCE, body, epoch=epoch))
            assert len(resp.offsets) == 1
    finally:
        await conn.close()


async def test_long_poll_does_not_block_the_connection_and_wakes_on_data(served: Any) -> None:
    _broker, _auth, addr = served
    await create_topic([addr], topic="lp", queues=1)
    conn = await Connection.open(addr)
    try:
        pull = conn.send(p.Op.PULL, p.PullRequest("lp", 0, 0, 1 << 20, 30_000).encode())
        # A request pipelined behind the long-poll is answered while the poll waits.
        hb = await conn.request(p.Op.HEARTBEAT, b"{}")
        assert p.HeartbeatResponse.decode(hb).role == "master"
        assert not pull.done()
        async with Producer([addr]) as prod:
            await (await prod.send("lp", b"wake up", queue=0))
        async with asyncio.timeout(20):
            frame = await pull
        resp = p.PullResponse.decode(frame.body)
        assert [r.body for r in resp.records] == [b"wake up"]
        assert resp.next_offset == 1
    finally:
        await conn.close()


async def test_losing_read_ends_a_waiting_long_poll_with_no_permission(served: Any) -> None:
    _broker, auth, addr = served
    await create_topic([addr], topic="lp2", queues=1)
    conn = await Connection.open(addr)
    try:
        pull = conn.send(p.Op.PULL, p.PullRequest("lp2", 0, 0, 1 << 20, 30_000).encode())
        await conn.request(p.Op.HEARTBEAT, b"{}")  # the pull is now waiting
        auth.set(Permission.WRITE, 6)
        async with asyncio.timeout(20):
            frame = await pull
        assert frame.status == p.Status.NO_PERMISSION
    finally:
        await conn.close()


async def test_concurrent_batches_share_fsyncs(served: Any) -> None:
    broker, _auth, addr = served
    await create_topic([addr], topic="gc", queues=4)
    conns = [await Connection.open(addr) for _ in range(8)]
    try:
        body = p.ProduceRequest("gc", [p.ProduceMessage(q % 4, None, b"y" * 512) for q in range(16)]).encode()
        labels = {"group": "g", "broker": "m"}

        def flushes() -> float:
            return broker.metrics.registry.get_sample_value("understudy_log_flushes_total", labels) or 0

        before = flushes()
        requests = 0
        for _ in range(5):
            await asyncio.gather(*(c.request(p.Op.PRODUCE, body) for c in conns))
            requests += len(conns)
        assert 1 <= flushes() - before < requests
        # Every flush is timed: the histogram counts as many as the counter.
        timed = broker.metrics.registry.get_sample_value("understudy_log_flush_seconds_count",
                                                         labels)
        assert timed == flushes()
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await c.close()


async def test_stop_persists_offsets_and_reopen_keeps_data(tmp_path: Path) -> None:
    cfg = BrokerConfig(data_dir=tmp_path / "d", port=0, replication_port=0, sync=False)
    broker = Broker(cfg)
    where = await broker.start()
    addr = f"127.0.0.1:{where.port}"
    try:
        await create_topic([addr], topic="keep", queues=2)
        async with Producer([addr]) as prod:
            await (await prod.send("keep", b"a", queue=1))
        conn = await Connection.open(addr)
        await conn.request(p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("g", "keep", {1: 1}).encode())
        # offsets never move backwards
        stored = p.OffsetsResponse.decode(
            await conn.request(p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("g", "keep", {1: 0}).encode())
        )
        assert stored.offsets == {1: 1}
        await conn.close()
    finally:
        await broker.stop()

    again = Broker(cfg)
    where = await again.start()
    try:
        conn = await Connection.open(f"127.0.0.1:{where.port}")
        fetched = p.OffsetsResponse.decode(
            await conn.request(p.Op.FETCH_OFFSET, p.FetchOffsetRequest("g", "keep", [0, 1]).encode())
        )
        assert fetched.offsets == {0: None, 1: 1}
        pulled = p.PullResponse.decode(
            await conn.request(p.Op.PULL, p.PullRequest("keep", 1, 0, 1000, 0).encode())
        )
        assert [r.body for r in pulled.records] == [b"a"]
        await conn.close()
    finally:
        await again.stop()


@pytest.mark.parametrize("errno_", [28, 5], ids=["ENOSPC", "EIO"])
async def test_a_failed_flush_is_refused_and_the_broker_keeps_serving(
        served: Any, monkeypatch: pytest.MonkeyPatch, errno_: int) -> None:
    """Storage raises OSError (it does not know the protocol); the server maps a failed
    fdatasync to STORAGE_FULL (a full disk) or INTERNAL for the produce that waited for
    it, and nothing else breaks."""
    broker, _auth, addr = served
    await create_topic([addr], topic="disk", queues=1)
    log = broker.store.log
    healthy = log.flush

    def failing() -> None:
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(log, "flush", failing)
    conn = await Connection.open(addr)
    try:
        body = p.ProduceRequest("disk", [p.ProduceMessage(0, None, b"x")]).encode()
        with pytest.raises(BrokerError) as info:
            await conn.request(p.Op.PRODUCE, body)
        if errno_ == 28:
            assert info.value.status == p.Status.STORAGE_FULL
            assert "the broker's disk is full (No space left on device)" in str(info.value)
            assert "the write is not acknowledged" in str(info.value)
        else:
            assert info.value.status == p.Status.INTERNAL
            assert "flushing the log: [Errno 5] Input/output error" in str(info.value)
        assert p.HeartbeatResponse.decode(await conn.request(p.Op.HEARTBEAT, b"{}")).role == "master"
        monkeypatch.setattr(log, "flush", healthy)
        resp = p.ProduceResponse.decode(await conn.request(p.Op.PRODUCE, body))
        assert [q for q, _o in resp.offsets] == [0]
    finally:
        await conn.close()


async def test_a_failed_connection_is_dropped_but_not_its_replacement(served: Any) -> None:
    """With one pull loop per queue, every loop reports the same lost connection. The first
    report drops it and the loop reconnects; a later report of the *old* connection used to
    close the fresh one (Router.failed dropped whatever was current)."""
    _broker, _auth, addr = served
    router = Router([addr])
    try:
        old = await router.connection(Permission.READ)
        await router.failed(Permission.READ, old)
        assert old.closed
        fresh = await router.connection(Permission.READ)
        assert fresh is not old
        await router.failed(Permission.READ, old)  # a second loop, same failure
        assert not fresh.closed
        assert await router.connection(Permission.READ) is fresh
    finally:
        await router.close()


async def test_a_consumer_waits_out_a_broker_that_does_not_know_the_topic_yet(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker just restarted answers UNKNOWN_TOPIC until it has taken the cluster's
    topics in. A consumer whose route holds the topic retries (before, the error reached
    getmany and an application loop that did not catch it stopped reading for good)."""
    broker, _auth, addr = served
    await create_topic([addr], topic="late", queues=1)
    consumer = Consumer([addr], group="g", topic="late", max_wait_ms=50)
    try:
        await consumer.start()
        topics = broker._parts.store.topics  # the broker's registry, as a restart leaves it
        monkeypatch.setattr(type(topics), "get", lambda _self, _topic: None)
        assert await consumer.getmany(timeout_s=0.5) == []  # refused meanwhile: no error
        monkeypatch.undo()
        async with Producer([addr]) as prod:
            await (await prod.send("late", b"after", queue=0))
        got: list[bytes] = []
        async with asyncio.timeout(20):
            while not got:
                got = [r.body for r in await consumer.getmany(timeout_s=0.5)]
        assert got == [b"after"]
    finally:
        await consumer.close()


async def test_one_getmany_hands_out_every_queue_already_buffered(served: Any) -> None:
    """Batches of several queues waiting in the consumer come out of one getmany. One
    batch per call let a caller that commits after each call fall a whole buffer behind
    (end-to-end latency ~200 ms with no fault at all in bench/cluster.py)."""
    _broker, _auth, addr = served
    await create_topic([addr], topic="fan", queues=4)
    consumer = Consumer([addr], group="g", topic="fan", max_wait_ms=50)
    try:
        await consumer.start()
        async with Producer([addr]) as prod:
            acks = [await prod.send("fan", b"%d-%d" % (q, i), queue=q)
                    for q in range(4) for i in range(3)]
            await asyncio.gather(*acks)
        await eventually(lambda: consumer._buffer.qsize() >= 4,
                         "every queue's pull loop has buffered its batch")
        got = await consumer.getmany(timeout_s=1)
        assert sorted(r.body for r in got) == sorted(b"%d-%d" % (q, i)
                                                     for q in range(4) for i in range(3))
        assert await consumer.commit() == {q: 3 for q in range(4)}
    finally:
        await consumer.close()


class HeldStart(SettableAuthority):
    """An authority whose start (a coordinated broker's ZooKeeper registration) waits
    until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.registering = asyncio.Event()
        self.release = asyncio.Event()

    async def start(self) -> None:
        self.registering.set()
        await self.release.wait()
        await super().start()


async def test_the_client_port_listens_before_the_broker_registers(tmp_path: Path) -> None:
    """Once a broker is live in ZooKeeper, routes name it and clients connect. Its port
    listens from before that, and a request that comes in while the broker is still
    starting is held and answered, not refused: refused connections made producers
    isolate a restarted master's group as failed (docs/cluster.md, "Runs D and E")."""
    auth = HeldStart()
    cfg = BrokerConfig(data_dir=tmp_path / "d", port=0, replication_port=0, sync=False,
                       name="m", group="g")
    broker = Broker(cfg, authority=auth)
    starting = asyncio.create_task(broker.start())
    try:
        async with asyncio.timeout(10):
            await auth.registering.wait()
        port = broker._port.port
        assert port is not None, "the client port does not listen while the broker registers"
        auth.address = addr = f"127.0.0.1:{port}"
        asked = asyncio.create_task(request_once(addr, p.Op.GET_ROUTE,
                                                 p.GetRouteRequest().encode(), timeout_s=20))
        done, _ = await asyncio.wait({asked}, timeout=0.3)
        assert not done, "a request was answered before the broker had started"
        auth.release.set()
        async with asyncio.timeout(20):
            await starting
            frame = await asked
        assert frame.status == p.Status.OK
        assert p.RouteResponse.decode(frame.body).brokers_of("g")
    finally:
        auth.release.set()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(20):
                await starting
        await broker.stop()


async def test_the_route_names_the_advertised_host(tmp_path: Path) -> None:
    """A broker tells clients ``--advertised-host`` rather than its listen address (a
    container listens on 0.0.0.0, which no client can dial), and clients follow it."""
    cfg = BrokerConfig(data_dir=tmp_path / "d", port=0, replication_port=0, sync=False,
                       advertised_host="localhost")
    broker = Broker(cfg)
    where = await broker.start()
    try:
        conn = await Connection.open(f"127.0.0.1:{where.port}")
        try:
            route = p.RouteResponse.decode(await conn.request(p.Op.GET_ROUTE, p.GetRouteRequest().encode()))
        finally:
            await conn.close()
        assert [b.address for g in route.groups for b in g.brokers] == [f"localhost:{where.port}"]
        await create_topic([f"127.0.0.1:{where.port}"], topic="adv", queues=1)
        async with Producer([f"127.0.0.1:{where.port}"]) as prod:  # sends where the route says
            assert (await (await prod.send("adv", b"x", queue=0)))[1] == 0
    finally:
        await broker.stop()


def test_a_wildcard_listen_address_is_never_advertised() -> None:
    looked_up: list[bool] = []

    def own() -> str:
        looked_up.append(True)
        return "10.1.2.3"

    assert advertised_host("127.0.0.1", None, own) == "127.0.0.1"
    assert not looked_up  # the machine's name is resolved only when needed
    assert advertised_host("0.0.0.0", "broker-0.svc", own) == "broker-0.svc"
    for wildcard in ("0.0.0.0", "::", ""):
        assert advertised_host(wildcard, None, own) == "10.1.2.3"


async def test_messages_sent_while_no_send_slot_is_free_go_out_together(served: Any) -> None:
    """A batch whose linger ends while its group has no free send slot keeps taking
    messages until a send ends, instead of going out as a request of its own. Before,
    every linger closed a batch per topic and the closed batches queued for the slot
    without merging: with several topics sharing the window, requests fell to 1-2
    messages and the brokers' CPU per message rose 25-fold (bench/growth.py)."""
    broker, _auth, addr = served
    topics = [f"bt{i}" for i in range(4)]
    for t in topics:
        await create_topic([addr], topic=t, queues=1)
    labels = {"group": "g", "broker": "m"}

    def requests() -> float:
        return broker.metrics.registry.get_sample_value(
            "understudy_produce_latency_seconds_count", labels) or 0

    async with Producer([addr], batch_size=128, linger_ms=1, max_in_flight=1,
                        max_in_flight_per_group=1, idempotent=False) as prod:
        for t in topics:
            await (await prod.send(t, b"warm-up"))
        before = requests()
        # The producer's only send slot is busy, as during a slow send (held directly:
        # a slow broker would make the number of lingers that pass a matter of timing).
        await prod._inflight.acquire()
        futures = []
        for i in range(5):  # five lingers' worth of messages to every topic
            for t in topics:
                futures.append(await prod.send(t, b"m%d" % i))
            await asyncio.sleep(0.005)
        assert not any(f.done() for f in futures)
        prod._inflight.release()
        prod._kick()  # what the end of the slow send does
        acked = await asyncio.gather(*futures)
    assert requests() - before == len(topics)  # one request per topic, not one per linger
    sent = [t for _i in range(5) for t in topics]  # the order of the futures
    for t in topics:  # each topic's messages in order, at consecutive offsets from 1
        assert [o for (_q, o), topic in zip(acked, sent, strict=True) if topic == t] == \
            [1, 2, 3, 4, 5]


def count_ops(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Requests the broker handles from here on, by operation."""
    seen: dict[int, int] = {}
    handle = broker.parts.requests.handle

    async def counted(frame: p.Frame, *args: Any, **kwargs: Any) -> bytes:
        seen[frame.op] = seen.get(frame.op, 0) + 1
        return await handle(frame, *args, **kwargs)
    monkeypatch.setattr(broker.parts.requests, "handle", counted)
    return seen


async def pulled(addr: str, topic: str, queue: int = 0) -> list[bytes]:
    frame = await request_once(addr, p.Op.PULL, p.PullRequest(topic, queue, 0, 1 << 20, 0).encode())
    return [r.body for r in p.PullResponse.decode(frame.body).records]


async def test_a_producer_writing_many_topics_sends_their_batches_in_one_request(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches for one group travel together in a PRODUCE_MULTI, one part per topic (with
    100 topics a request carried 2.5 messages and server CPU per message was 14x one
    topic's: bench/growth.py). Each message is acknowledged at its own offset."""
    broker, _auth, addr = served
    topics = [f"mt{i}" for i in range(20)]
    for t in topics:
        await create_topic([addr], topic=t, queues=1)
    async with Producer([addr], batch_size=128, linger_ms=1, max_in_flight=1,
                        max_in_flight_per_group=1) as prod:
        await (await prod.send(topics[0], b"warm-up"))
        seen = count_ops(broker, monkeypatch)
        await prod._inflight.acquire()  # the only slot busy, as during a slow send
        futures = [await prod.send(t, b"%s-%d" % (t.encode(), i)) for i in range(3) for t in topics]
        await asyncio.sleep(0.01)
        prod._inflight.release()
        prod._kick()
        acked = await asyncio.gather(*futures)
    assert seen == {p.Op.PRODUCE_MULTI_BATCH: 1}
    first = {t: 1 if t == topics[0] else 0 for t in topics}
    sent = [t for _i in range(3) for t in topics]
    for t in topics:
        assert [o for (_q, o), topic in zip(acked, sent, strict=True) if topic == t] == \
            [first[t], first[t] + 1, first[t] + 2]
        assert (await pulled(addr, t))[-3:] == [b"%s-%d" % (t.encode(), i) for i in range(3)]


async def test_produce_multi_answers_each_part_on_its_own(served: Any) -> None:
    """A part the broker refuses (an unknown topic, a malformed body) is answered with its
    own error; the other parts are stored and acknowledged."""
    _broker, _auth, addr = served
    for t in ("pa", "pb"):
        await create_topic([addr], topic=t, queues=1)
    parts = [p.encode_produce("pa", [(0, None, b"a1")]), p.encode_produce("nope", [(0, None, b"x")]),
             b"\x00\x05garbage", p.encode_produce("pb", [(0, None, b"b1"), (0, None, b"b2")])]
    frame = await request_once(addr, p.Op.PRODUCE_MULTI, p.ProduceMultiRequest(parts).encode())
    results = p.ProduceMultiResponse.decode(frame.body).results
    assert [s for s, _b in results] == [p.Status.OK, p.Status.UNKNOWN_TOPIC, p.Status.BAD_FRAME,
                                        p.Status.OK]
    assert p.ProduceResponse.decode(results[0][1]).offsets == [(0, 0)]
    assert p.ProduceResponse.decode(results[3][1]).offsets == [(0, 0), (0, 1)]
    assert b"nope" in results[1][1]
    assert await pulled(addr, "pa") == [b"a1"]
    assert await pulled(addr, "pb") == [b"b1", b"b2"]


@pytest.mark.parametrize("body", [b"", b"\x00\x00", b"\x00\x02\x00\x00\x00\x09abc",
                                  p.ProduceMultiRequest([b"x"]).encode() + b"tail"])
async def test_a_malformed_produce_multi_is_refused_whole_and_stores_nothing(
        served: Any, body: bytes) -> None:
    broker, _auth, addr = served
    await create_topic([addr], topic="pm", queues=1)
    before = broker.parts.store.log.max_phys
    frame = await request_once(addr, p.Op.PRODUCE_MULTI, body)
    assert frame.status == p.Status.BAD_FRAME, p.error_message(frame)
    assert broker.parts.store.log.max_phys == before


async def test_produce_multi_parts_are_stored_with_one_append(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parts that pass their checks go to the log together (one write, one index and
    replication round): per-part appends were most of the master's cost at 100 topics."""
    broker, _auth, addr = served
    topics = ["ja", "jb", "jc"]
    for t in topics:
        await create_topic([addr], topic=t, queues=2)
    log_ = broker.parts.store.log
    appends: list[int] = []
    append = log_.append

    def counted(messages: Any) -> Any:
        appends.append(len(messages))
        return append(messages)
    monkeypatch.setattr(log_, "append", counted)
    parts = [p.encode_produce(t, [(0, None, b"%s-0" % t.encode()), (1, None, b"%s-1" % t.encode())])
             for t in topics]
    frame = await request_once(addr, p.Op.PRODUCE_MULTI, p.ProduceMultiRequest(parts).encode())
    results = p.ProduceMultiResponse.decode(frame.body).results
    assert [s for s, _b in results] == [p.Status.OK] * 3
    assert [p.ProduceResponse.decode(b).offsets for _s, b in results] == [[(0, 0), (1, 0)]] * 3
    assert appends == [6]
    for t in topics:
        assert await pulled(addr, t, 0) == [b"%s-0" % t.encode()]
        assert await pulled(addr, t, 1) == [b"%s-1" % t.encode()]


async def test_a_part_the_log_refuses_is_answered_alone(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log refuses a batch whole (it checks every record before writing any); the
    request's parts are then stored one by one, so only the part it refuses fails."""
    broker, _auth, addr = served
    for t in ("ka", "kb", "kc"):
        await create_topic([addr], topic=t, queues=1)
    log_ = broker.parts.store.log
    append = log_.append

    def refusing(messages: Any) -> Any:
        if any(m[3] == b"poison" for m in messages):
            raise MessageTooLargeError("record of 9 bytes does not fit (test)")
        return append(messages)
    monkeypatch.setattr(log_, "append", refusing)
    parts = [p.encode_produce("ka", [(0, None, b"a")]), p.encode_produce("kb", [(0, None, b"poison")]),
             p.encode_produce("kc", [(0, None, b"c")])]
    frame = await request_once(addr, p.Op.PRODUCE_MULTI, p.ProduceMultiRequest(parts).encode())
    results = p.ProduceMultiResponse.decode(frame.body).results
    assert [s for s, _b in results] == [p.Status.OK, p.Status.BAD_REQUEST, p.Status.OK]
    assert b"does not fit" in results[1][1]
    assert (await pulled(addr, "ka"), await pulled(addr, "kb"), await pulled(addr, "kc")) == \
        ([b"a"], [], [b"c"])


async def test_an_empty_produce_is_answered_without_waiting_for_acknowledgements(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PRODUCE with no message stores nothing, so it waits for nothing: not for the
    log's unacknowledged tail (a slave that is late), alone or as a PRODUCE_MULTI part."""
    broker, _auth, addr = served
    await create_topic([addr], topic="empty", queues=1)
    never = asyncio.Event()

    async def unacknowledged(end: int, start: int) -> None:
        await never.wait()
    monkeypatch.setattr(broker.parts.readable, "wait_acknowledged", unacknowledged)
    frame = await request_once(addr, p.Op.PRODUCE, p.encode_produce("empty", []), timeout_s=2)
    assert p.ProduceResponse.decode(frame.body).offsets == []
    multi = p.ProduceMultiRequest([p.encode_produce("empty", [])] * 2).encode()
    frame = await request_once(addr, p.Op.PRODUCE_MULTI, multi, timeout_s=2)
    assert p.ProduceMultiResponse.decode(frame.body).results == [
        (p.Status.OK, p.ProduceResponse([]).encode())] * 2


async def test_one_topic_twice_in_a_request_is_stored_once_per_message(served: Any) -> None:
    """Two parts of one topic from an idempotent producer, the second repeating the
    first's last number: the second part is planned after the first is stored, so the
    repeat is answered with its first copy's offset, not stored again (invariant 8)."""
    _broker, _auth, addr = served
    await create_topic([addr], topic="twice", queues=1)
    parts = [p.encode_produce("twice", [(0, None, b"m0"), (0, None, b"m1")], producer=(7, [0, 1])),
             p.encode_produce("twice", [(0, None, b"m1"), (0, None, b"m2")], producer=(7, [1, 2]))]
    frame = await request_once(addr, p.Op.PRODUCE_MULTI, p.ProduceMultiRequest(parts).encode())
    results = p.ProduceMultiResponse.decode(frame.body).results
    assert [s for s, _b in results] == [p.Status.OK, p.Status.OK]
    assert [p.ProduceResponse.decode(b).offsets for _s, b in results] == [
        [(0, 0), (0, 1)], [(0, 1), (0, 2)]]
    assert await pulled(addr, "twice") == [b"m0", b"m1", b"m2"]


async def test_a_broker_without_produce_multi_gets_one_topic_per_request(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older broker answers UNKNOWN_OPERATION, to the batch form and then to
    PRODUCE_MULTI: the producer sends message by message, one topic per request, and
    keeps to that; nothing is lost or stored twice."""
    broker, _auth, addr = served
    topics = ["old1", "old2", "old3"]
    for t in topics:
        await create_topic([addr], topic=t, queues=1)
    seen = count_ops(broker, monkeypatch)
    handle = broker.parts.requests.handle

    async def older(frame: p.Frame, *args: Any, **kwargs: Any) -> bytes:
        if frame.op in (p.Op.PRODUCE_MULTI, p.Op.PRODUCE_BATCH, p.Op.PRODUCE_MULTI_BATCH):
            seen[frame.op] = seen.get(frame.op, 0) + 1
            raise RequestError(p.Status.UNKNOWN_OPERATION,
                               f"operation {frame.op} is not supported")
        return await handle(frame, *args, **kwargs)
    monkeypatch.setattr(broker.parts.requests, "handle", older)
    async with Producer([addr], batch_size=128, linger_ms=1, max_in_flight=1,
                        max_in_flight_per_group=1) as prod:
        for rnd in range(2):
            await prod._inflight.acquire()
            futures = [await prod.send(t, b"%s-%d" % (t.encode(), rnd)) for t in topics]
            await asyncio.sleep(0.01)
            prod._inflight.release()
            prod._kick()
            await asyncio.gather(*futures)
    # Each tried once, then never again.
    assert seen.get(p.Op.PRODUCE_MULTI_BATCH) == 1
    assert seen.get(p.Op.PRODUCE_MULTI) == 1
    assert p.Op.PRODUCE_BATCH not in seen  # the batch form was off by then
    for t in topics:
        assert await pulled(addr, t) == [b"%s-0" % t.encode(), b"%s-1" % t.encode()]


async def test_a_producers_batches_are_stored_as_it_packed_them(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The producer sends each queue's records packed as stored (PRODUCE_BATCH): the log
    gets them as packed batches, one per queue, not message by message; each message is
    answered at its own offset and read back in the order sent, an idempotent retry of
    part of a batch included."""
    broker, _auth, addr = served
    await create_topic([addr], topic="packed", queues=3)
    log_ = broker.parts.store.log
    appended: list[list[object]] = []
    append = log_.append

    def spy(messages: Any) -> Any:
        appended.append(list(messages))
        return append(messages)
    monkeypatch.setattr(log_, "append", spy)
    seen = count_ops(broker, monkeypatch)
    async with Producer([addr], batch_size=64, linger_ms=20) as prod:
        futures = [await prod.send("packed", b"m%d" % i, queue=i % 3) for i in range(30)]
        acked = await asyncio.gather(*futures)
    seen.pop(p.Op.GET_ROUTE, None)
    assert seen == {p.Op.PRODUCE_BATCH: 1}
    (stored,) = appended
    batches = [m for m in stored if isinstance(m, PackedBatch)]
    assert [(b.queue, b.messages) for b in batches] == [(0, 10), (1, 10), (2, 10)]
    assert acked == [(i % 3, i // 3) for i in range(30)]
    for q in range(3):
        assert await pulled(addr, "packed", q) == [b"m%d" % i for i in range(q, 30, 3)]
    # The same producer numbers again (a retry whose answer was lost): the repeats are
    # answered with their first offsets, the new message stored once.
    body = p.encode_produce_batches("packed", [(0, None, b"again"), (0, None, b"new")],
                                    producer=(77, [0, 1]))
    first = await request_once(addr, p.Op.PRODUCE_BATCH, body)
    assert p.ProduceResponse.decode(first.body).offsets == [(0, 10), (0, 11)]
    body = p.encode_produce_batches("packed", [(0, None, b"new"), (0, None, b"newer")],
                                    producer=(77, [1, 2]))
    again = await request_once(addr, p.Op.PRODUCE_BATCH, body)
    assert p.ProduceResponse.decode(again.body).offsets == [(0, 11), (0, 12)]
    assert (await pulled(addr, "packed", 0))[10:] == [b"again", b"new", b"newer"]


async def test_a_pull_batch_is_answered_with_the_stored_batches_and_gives_what_a_pull_does(
        served: Any) -> None:
    """PULL_BATCH's answer is the stored batches as they are (the broker decodes no
    message), from the one holding the asked offset; decoded, it gives what PULL gives."""
    broker, _auth, addr = served
    await create_topic([addr], topic="stored", queues=1)
    body = p.encode_produce_batches("stored", [(0, None, b"m%d" % i) for i in range(10)])
    assert (await request_once(addr, p.Op.PRODUCE_BATCH, body)).status == p.Status.OK
    (item,) = broker.parts.store.log.read_items("stored", 0, 0, max_bytes=1 << 20,
                                                max_records=100)
    for offset in (0, 3, 9):
        ask = p.PullRequest("stored", 0, offset, 1 << 20, 0).encode()
        batch = await request_once(addr, p.Op.PULL_BATCH, ask)
        plain = await request_once(addr, p.Op.PULL, ask)
        assert batch.body.endswith(item.data)  # the stored batch, whole
        assert p.decode_pull_batches(batch.body) == p.PullResponse.decode(plain.body)
        assert [r.body for r in p.decode_pull_batches(batch.body).records] == \
            [b"m%d" % i for i in range(offset, 10)]


async def test_a_broker_without_the_batch_form_gets_message_by_message_produces(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker from before the batch form answers UNKNOWN_OPERATION to PRODUCE_BATCH:
    the producer sends that batch again at once as a PRODUCE, and every later one too;
    nothing is lost or stored twice."""
    broker, _auth, addr = served
    await create_topic([addr], topic="older", queues=2)
    seen = count_ops(broker, monkeypatch)
    handle = broker.parts.requests.handle

    async def older(frame: p.Frame, *args: Any, **kwargs: Any) -> bytes:
        if frame.op in (p.Op.PRODUCE_BATCH, p.Op.PRODUCE_MULTI_BATCH):
            seen[frame.op] = seen.get(frame.op, 0) + 1
            raise RequestError(p.Status.UNKNOWN_OPERATION,
                               f"operation {frame.op} is not supported")
        return await handle(frame, *args, **kwargs)
    monkeypatch.setattr(broker.parts.requests, "handle", older)
    async with Producer([addr], batch_size=4, linger_ms=1) as prod:
        for rnd in range(3):
            futures = [await prod.send("older", b"%d-%d" % (rnd, i), queue=i % 2)
                       for i in range(4)]
            assert [o for _q, o in await asyncio.gather(*futures)] == [2 * rnd, 2 * rnd] + \
                [2 * rnd + 1] * 2
    seen.pop(p.Op.GET_ROUTE, None)
    assert seen == {p.Op.PRODUCE_BATCH: 1, p.Op.PRODUCE: 3}
    assert await pulled(addr, "older", 0) == [b"%d-%d" % (r, i) for r in range(3)
                                              for i in (0, 2)]


def pull_part(topic: str, queue: int, offset: int = 0, wait_ms: int = 0) -> bytes:
    return p.PullRequest(topic, queue, offset, 1 << 20, wait_ms).encode()


async def test_pull_multi_answers_each_part_on_its_own(served: Any) -> None:
    """Each part of a PULL_MULTI is a PULL of its own: a part the broker refuses (an
    unknown topic, a queue out of range, a malformed body) gets its own error; the others
    get their records."""
    _broker, _auth, addr = served
    for t in ("qa", "qb"):
        await create_topic([addr], topic=t, queues=2)
    async with Producer([addr]) as prod:
        await asyncio.gather(*[await prod.send(t, b"%s-%d" % (t.encode(), q), queue=q)
                               for t in ("qa", "qb") for q in (0, 1)])
    parts = [pull_part("qa", 1), pull_part("nope", 0), pull_part("qa", 9), b"\x00\x05garbage",
             pull_part("qb", 0)]
    frame = await request_once(addr, p.Op.PULL_MULTI, p.PullMultiRequest(parts).encode())
    results = p.PullMultiResponse.decode(frame.body).results
    assert [s for s, _b in results] == [p.Status.OK, p.Status.UNKNOWN_TOPIC,
                                        p.Status.BAD_REQUEST, p.Status.BAD_FRAME, p.Status.OK]
    assert [r.body for r in p.PullResponse.decode(results[0][1]).records] == [b"qa-1"]
    assert [r.body for r in p.PullResponse.decode(results[4][1]).records] == [b"qb-0"]
    assert b"nope" in results[1][1]


async def test_a_pull_multi_is_answered_when_any_part_gets_a_record(served: Any) -> None:
    """The long poll waits for all its queues at once and answers, all parts together,
    when one of them grows: the record for that part, nothing for the others (their
    offsets unchanged), long before the wait (60 s) would end."""
    _broker, _auth, addr = served
    await create_topic([addr], topic="lp", queues=3)
    body = p.PullMultiRequest([pull_part("lp", q, wait_ms=60_000) for q in range(3)]).encode()
    polling = asyncio.create_task(request_once(addr, p.Op.PULL_MULTI, body, timeout_s=70))
    await asyncio.sleep(0.2)
    assert not polling.done()  # nothing to read yet: it waits
    async with Producer([addr]) as prod:
        await (await prod.send("lp", b"one", queue=2))
    async with asyncio.timeout(10):
        frame = await polling
    answers = [p.PullResponse.decode(b) for _s, b in p.PullMultiResponse.decode(frame.body).results]
    assert [[r.body for r in a.records] for a in answers] == [[], [], [b"one"]]
    assert [a.next_offset for a in answers] == [0, 0, 1]


@pytest.mark.parametrize("body", [b"", b"\x00\x00", b"\x00\x02\x00\x00\x00\x09abc",
                                  p.PullMultiRequest([b"x"]).encode() + b"tail"])
async def test_a_malformed_pull_multi_is_refused_whole(served: Any, body: bytes) -> None:
    _broker, _auth, addr = served
    await create_topic([addr], topic="pmm", queues=1)
    frame = await request_once(addr, p.Op.PULL_MULTI, body)
    assert frame.status == p.Status.BAD_FRAME, p.error_message(frame)


async def test_a_consumer_pulls_its_queues_on_one_broker_in_one_request(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer's pull loops of one broker's queues, woken together (one produce to
    all four), pull again together in one PULL_MULTI (one request's costs for all of
    them, as Kafka's fetch); every record arrives once, in order per queue."""
    broker, _auth, addr = served
    await create_topic([addr], topic="mq", queues=4)
    seen = count_ops(broker, monkeypatch)
    consumer = Consumer([addr], group="g", topic="mq", max_wait_ms=2000)
    got: dict[int, list[bytes]] = {q: [] for q in range(4)}
    try:
        await consumer.start()
        async with Producer([addr]) as prod:
            for i in range(5):
                await asyncio.gather(*[await prod.send("mq", b"%d-%d" % (q, i), queue=q)
                                       for q in range(4)])
                async with asyncio.timeout(20):
                    while sum(map(len, got.values())) < 4 * (i + 1):
                        for r in await consumer.getmany(timeout_s=0.5):
                            got[r.queue].append(r.body)
    finally:
        await consumer.close()
    assert got == {q: [b"%d-%d" % (q, i) for i in range(5)] for q in range(4)}
    # Four queues: the loops' pulls travel together, not one request per queue each (in
    # the batch form: answered with the stored batches).
    assert seen.get(p.Op.PULL_MULTI_BATCH, 0) > seen.get(p.Op.PULL_BATCH, 0)
    assert not seen.get(p.Op.PULL)
    assert not seen.get(p.Op.PULL_MULTI)


async def test_a_broker_without_pull_multi_gets_one_pull_per_queue(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older broker answers PULL_MULTI with UNKNOWN_OPERATION (and the batch form
    before it): the consumer pulls each queue on its own from then on and misses
    nothing."""
    broker, _auth, addr = served
    await create_topic([addr], topic="oldq", queues=3)
    seen: dict[int, int] = {}
    handle = broker.parts.requests.handle

    async def older(frame: p.Frame, *args: Any, **kwargs: Any) -> bytes:
        seen[frame.op] = seen.get(frame.op, 0) + 1
        if frame.op in (p.Op.PULL_MULTI, p.Op.PULL_BATCH, p.Op.PULL_MULTI_BATCH):
            raise RequestError(p.Status.UNKNOWN_OPERATION,
                               f"operation {frame.op} is not supported")
        return await handle(frame, *args, **kwargs)
    monkeypatch.setattr(broker.parts.requests, "handle", older)
    consumer = Consumer([addr], group="g", topic="oldq", max_wait_ms=200)
    got: list[bytes] = []
    try:
        await consumer.start()
        async with Producer([addr]) as prod:
            await asyncio.gather(*[await prod.send("oldq", b"%d" % q, queue=q) for q in range(3)])
        async with asyncio.timeout(20):
            while len(got) < 3:
                got += [r.body for r in await consumer.getmany(timeout_s=0.5)]
        await asyncio.sleep(0.5)  # more rounds of pulls
    finally:
        await consumer.close()
    assert sorted(got) == [b"0", b"1", b"2"]
    # Each tried once (on the consumer's one connection: the batch form by the pulls in
    # flight when its first refusal came back), then never again.
    assert seen.get(p.Op.PULL_MULTI) == 1
    assert 1 <= seen.get(p.Op.PULL_MULTI_BATCH, 0) + seen.get(p.Op.PULL_BATCH, 0) <= 3
    assert seen.get(p.Op.PULL, 0) > 3


async def test_a_queue_with_a_backlog_does_not_starve_the_others_of_a_pull_multi(
        tmp_path: Path) -> None:
    """The parts of a PULL_MULTI share one byte budget (half the frame limit), and a read
    gives at least one record even past it; which part reads first turns from poll to
    poll, so a queue far behind with records as large as the budget cannot take every
    answer while another queue's record waits."""
    auth = SettableAuthority()
    cfg = BrokerConfig(data_dir=tmp_path / "d", port=0, replication_port=0, sync=False, name="m",
                       group="g", max_frame_bytes=128 * 1024)  # a budget of 64 KiB a poll
    broker = Broker(cfg, authority=auth)
    where = await broker.start()
    addr = auth.address = f"127.0.0.1:{where.port}"
    try:
        await create_topic([addr], topic="bk", queues=2)
        async with Producer([addr], batch_size=1) as prod:
            await asyncio.gather(*[await prod.send("bk", b"x" * 70_000, queue=0) for _ in range(6)])
            await (await prod.send("bk", b"waiting", queue=1))
        offsets = [0, 0]
        served_at = None
        for poll in range(1, 5):
            body = p.PullMultiRequest([pull_part("bk", q, offsets[q]) for q in (0, 1)]).encode()
            frame = await request_once(addr, p.Op.PULL_MULTI, body)
            answers = [p.PullResponse.decode(b)
                       for _s, b in p.PullMultiResponse.decode(frame.body).results]
            offsets = [a.next_offset for a in answers]
            if answers[1].records:
                served_at = poll
                break
        assert served_at is not None, "queue 1's record never came in 4 polls"
        assert served_at <= 2
        assert offsets[0] < 6  # queue 0 was still behind: the budget was what limited it
    finally:
        await broker.stop()
