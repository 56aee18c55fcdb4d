"""Permission enforcement and permission-following clients, with broker processes.

One module-scoped group: master ``m`` configured WRITE (no READ), slave ``s`` configured
READ, slave ``n`` with the slave default (NONE). Writes must land on ``m``, reads on ``s``.
Also covers the CLIs' ``--json`` contract and the HTTP side port on the same group.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
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
)
from understudy_broker.model import Permission
from understudy_harness.testing import raw_request

pytestmark = pytest.mark.integration
UNDERSTUDY = str(Path(sys.executable).with_name("understudy"))


@pytest.fixture(scope="module")
def group(module_brokers: Any) -> dict[str, Any]:
    m = module_brokers.master("m", start=False)
    s = module_brokers.slave(m, "s", start=False)
    n = module_brokers.slave(m, "n", start=False)
    m.extra += ["--permission", "WRITE", "--async",
                "--peer", f"s={s.address}", "--peer", f"n={n.address}"]
    s.extra += ["--permission", "READ", "--peer", f"m={m.address}", "--peer", f"n={n.address}"]
    n.extra += ["--peer", f"m={m.address}", "--peer", f"s={s.address}"]
    for b in (m, s, n):
        b.start()
    asyncio.run(create_topic([s.address], topic="perm", queues=2))
    asyncio.run(_until_everyone_knows([b.address for b in (m, s, n)], "perm"))
    return {"m": m, "s": s, "n": n}


async def _until_everyone_knows(addresses: list[str], topic: str) -> None:
    """Slaves learn topics with the replication metadata (every 0.25 s)."""
    for _ in range(100):
        known = []
        for a in addresses:
            router = Router([a])
            try:
                known.append(topic in (await router.refresh()).topics)
            finally:
                await router.close()
        if all(known):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"topic {topic} did not reach every broker")


async def test_slave_refuses_produce_with_not_master(group: dict[str, Any]) -> None:
    body = p.ProduceRequest("perm", [p.ProduceMessage(0, None, b"x")]).encode()
    for name in ("s", "n"):
        frame = await raw_request(group[name].address, p.Op.PRODUCE, body)
        assert frame.status == p.Status.NOT_MASTER, name
        assert "slave" in p.error_message(frame)
    frame = await raw_request(
        group["s"].address, p.Op.CREATE_TOPIC, p.CreateTopicRequest("x", 1).encode()
    )
    assert frame.status == p.Status.NOT_MASTER


async def test_broker_without_read_refuses_reads(group: dict[str, Any]) -> None:
    pull = p.PullRequest("perm", 0, 0, 1 << 16, 0).encode()
    commit = p.CommitOffsetRequest("g", "perm", {0: 1}).encode()
    fetch = p.FetchOffsetRequest("g", "perm", [0]).encode()
    for name in ("m", "n"):  # WRITE-only master, NONE slave
        for op, body in ((p.Op.PULL, pull), (p.Op.COMMIT_OFFSET, commit), (p.Op.FETCH_OFFSET, fetch)):
            frame = await raw_request(group[name].address, op, body)
            assert frame.status == p.Status.NO_PERMISSION, (name, op)
            assert "READ" in p.error_message(frame)
    frame = await raw_request(group["s"].address, p.Op.PULL, pull)
    assert frame.status == p.Status.OK


async def test_route_lists_every_broker_with_effective_permission(group: dict[str, Any]) -> None:
    frame = await raw_request(group["n"].address, p.Op.GET_ROUTE, p.GetRouteRequest().encode())
    route = json.loads(frame.body)
    assert route["topics"]["perm"] == {"queues": 2, "groups": ["default"]}
    [g] = route["groups"]
    perms = {b["name"]: (b["role"], b["permission"], b["address"]) for b in g["brokers"]}
    assert perms == {
        "m": ("master", int(Permission.WRITE), group["m"].address),
        "s": ("slave", int(Permission.READ), group["s"].address),
        "n": ("slave", int(Permission.NONE), group["n"].address),
    }


async def test_client_writes_to_writer_and_reads_from_reader(group: dict[str, Any]) -> None:
    m, s, n = group["m"], group["s"], group["n"]
    # Bootstrap from the broker that can do neither: the client must follow the route.
    async with Producer([n.address]) as prod:
        futs = [await prod.send("perm", b"follow-%d" % i) for i in range(20)]
        await prod.flush()
        assert prod.router.address_for(Permission.WRITE) == m.address
    assert all(f.result()[1] >= 0 for f in futs)

    c = Consumer([m.address], group="follow", topic="perm", max_wait_ms=200)
    try:
        bodies: set[bytes] = set()
        while len(bodies) < 20:
            recs = await c.getmany(timeout_s=5)
            assert recs, "consumer stalled"
            bodies |= {r.body for r in recs if r.body.startswith(b"follow-")}
        assert c.router.address_for(Permission.READ) == s.address
        stored = await c.commit()
        assert sum(v or 0 for v in stored.values()) >= 20
    finally:
        await c.close()


async def test_client_reports_refusals_it_cannot_route_around(group: dict[str, Any]) -> None:
    router = Router([group["n"].address])
    try:
        await router.refresh()
        conn = await router.connection(Permission.NONE)
        with pytest.raises(BrokerError) as info:
            await conn.request(p.Op.PULL, p.PullRequest("perm", 0, 0, 100, 0).encode())
        assert info.value.status == p.Status.NO_PERMISSION
        assert info.value.retriable
    finally:
        await router.close()


def test_produce_and_consume_cli_json(group: dict[str, Any]) -> None:
    m, s = group["m"], group["s"]
    out = subprocess.run(
        [UNDERSTUDY, "produce", "--bootstrap", s.address, "--topic", "perm", "--count", "500",
         "--size", "200", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["acked"] == 500
    assert summary["msgs_per_s"] > 0
    assert summary["ack_p99_ms"] >= summary["ack_p50_ms"] > 0

    out = subprocess.run(
        [UNDERSTUDY, "consume", "--bootstrap", m.address, "--topic", "perm", "--group", "cli",
         "--count", "500", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["consumed"] >= 500
    assert summary["msgs_per_s"] > 0


def test_http_side_port(group: dict[str, Any]) -> None:
    m, s = group["m"], group["s"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{m.http_port}/metrics", timeout=5).read().decode()
    assert 'understudy_broker_permission{broker="m",group="default",role="master"} 2.0' in text
    assert "understudy_messages_in_total" in text
    assert "understudy_produce_latency_seconds_bucket" in text
    slave_text = urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/metrics", timeout=5).read().decode()
    assert 'understudy_broker_permission{broker="s",group="default",role="slave"} 1.0' in slave_text
    assert 'understudy_replication_lag_bytes{broker="s",group="default"}' in slave_text
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{m.http_port}{path}", timeout=5) as resp:
            assert resp.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{m.http_port}/nope", timeout=5)
    assert info.value.code == 404


async def test_consumer_resumes_from_its_committed_offsets(group: dict[str, Any]) -> None:
    m, s = group["m"], group["s"]
    async with Producer([m.address]) as prod:
        for i in range(40):
            # 200 bytes: 20 of them are more than one 2 KB pull.
            await prod.send("perm", b"resume-%d " % i + b"." * 190, queue=i % 2)
        await prod.flush()

    # Small pulls: the first batch is only part of its queue.
    first = Consumer([s.address], group="resume", topic="perm", max_wait_ms=100, max_bytes=2048)
    try:
        taken = await first.getmany(timeout_s=5)
        assert taken
        committed = await first.commit()
    finally:
        await first.close()
    last = {r.queue: r.offset for r in taken}
    for q, off in last.items():
        assert committed[q] == off + 1

    second = Consumer([s.address], group="resume", topic="perm", max_wait_ms=100)
    try:
        firsts: dict[int, int] = {}
        while recs := await second.getmany(timeout_s=2):
            firsts.setdefault(recs[0].queue, recs[0].offset)
    finally:
        await second.close()
    assert any(off > 0 for off in firsts.values()), firsts
    # Each queue restarts exactly at the committed offset: nothing skipped, no rewind.
    for q, off in firsts.items():
        assert off == (committed.get(q) or 0)


async def test_frozen_broker_times_out_instead_of_hanging(group: dict[str, Any]) -> None:
    n = group["n"]
    conn = await Connection.open(n.address)
    os.kill(n.pid, signal.SIGSTOP)  # a VM pause / GC stall / SIGSTOP
    try:
        with pytest.raises(BrokerError) as info:
            await conn.request(p.Op.HEARTBEAT, b"{}", timeout_s=0.5)
        assert info.value.status == p.Status.TIMEOUT
        assert info.value.retriable
    finally:
        os.kill(n.pid, signal.SIGCONT)
        await conn.close()
    # Once it runs again it answers as before.
    conn = await Connection.open(n.address)
    try:
        hb = p.HeartbeatResponse.decode(await conn.request(p.Op.HEARTBEAT, b"{}"))
        assert hb.name == "n"
    finally:
        await conn.close()
