"""A full disk under real broker processes (a tmpfs data directory; skipped where the
machine refuses the mount): the master refuses produce with ``STORAGE_FULL``, loses
nothing acknowledged, stays up and serves reads, and takes writes again once space
returns; a slave whose disk fills leaves the in-sync record and the group writes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Connection, create_topic
from understudy_broker.model import Permission
from understudy_broker.zkclient import make_client
from understudy_harness.testing import (
    SmallDisk,
    eventually,
    heartbeat,
    isr_record,
    queue_bodies,
)
from understudy_operator.local import cluster as lc

pytestmark = pytest.mark.integration

QUEUES = 8


async def produce(conn: Connection, queue: int, bodies: list[bytes]) -> str:
    """``OK`` or the refusal's status name."""
    msgs = [p.ProduceMessage(queue, None, b) for b in bodies]
    try:
        await conn.request(p.Op.PRODUCE, p.ProduceRequest("t", msgs).encode(), timeout_s=15)
        return "OK"
    except BrokerError as exc:
        return p.Status(exc.status).name + ": " + exc.message


async def test_a_full_master_refuses_loses_nothing_serves_reads_and_recovers(
        brokers: Any, small_disk: SmallDisk) -> None:
    root = small_disk.mount(2 << 20)
    master = brokers.master(start=False, extra=["--async", "--segment-bytes", "262144",
                                                    "--max-frame-bytes", "131072"])
    master.data_dir = root / "m"
    master.start()
    await create_topic([master.address], topic="t", queues=QUEUES)
    # Ballast, freed at the first refusal so the refusals that follow come from the
    # per-queue indexes as well as from the log (test_disk_full.py says why).
    ballast = root / "ballast"
    ballast.write_bytes(b"z" * (96 << 10))
    acked: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    refusals: list[str] = []
    conn = await Connection.open(master.address)
    try:
        n = 0
        while len(refusals) < 30:
            n += 1
            q = n % QUEUES
            bodies = [b"m%d-%d-" % (n, i) + b"x" * (n % 200) for i in range(1 + n % 5)]
            answer = await produce(conn, q, bodies)
            if answer == "OK":
                acked[q] += bodies
                continue
            refusals.append(answer)
            if ballast.exists():
                ballast.unlink()
            assert n < 100_000, "the disk never filled"
        assert master.poll() is None, "the broker died of a full disk"
        assert {r.split(":")[0] for r in refusals} == {"STORAGE_FULL"}, refusals[:3]
        assert "the broker's disk is full" in refusals[0]
        assert "nothing was stored" in refusals[0]
        # Every acknowledged message is served, in order, and nothing else.
        for q in range(QUEUES):
            assert await queue_bodies(master.address, "t", q) == acked[q], f"queue {q}"
        assert (await heartbeat(master.address)).permission == Permission.FULL

        small_disk.resize(16 << 20)  # space returns: the next produce is taken
        assert await produce(conn, 0, [b"after"]) == "OK"
        acked[0].append(b"after")
    finally:
        await conn.close()
    for q in range(QUEUES):
        assert await queue_bodies(master.address, "t", q) == acked[q], f"queue {q} after space returned"
    master.restart()
    for q in range(QUEUES):
        assert await queue_bodies(master.address, "t", q) == acked[q], f"queue {q} after a restart"


async def test_a_slave_whose_disk_fills_leaves_the_isr_and_the_group_writes_on(
        cluster_dir: Path, small_disk: SmallDisk) -> None:
    plan = lc.up(cluster_dir, slaves=2, session_timeout_ms=4000)
    master, full_slave = plan.bootstrap("g1")[0], "g1-2"
    zk = make_client(plan.zk_connect, timeout_s=5.0)
    zk.start(timeout=10)
    conn: Connection | None = None
    try:
        # The slave comes back with an empty data directory on a 1 MiB disk: it fetches
        # the log from the start and runs out of space on the way.
        lc.kill(plan.dir, full_slave)
        await create_topic([master], topic="t", queues=1)
        conn = await Connection.open(master)
        chunk = [b"y" * 16_000 for _ in range(8)]
        for _ in range(16):  # 2 MiB, more than the slave's disk holds
            assert await produce(conn, 0, chunk) == "OK"
        small_disk.mount(1 << 20)
        data = plan.dir / "data" / full_slave
        with contextlib.suppress(FileNotFoundError):
            data.rename(plan.dir / "old-data")
        data.symlink_to(small_disk.path)
        lc.start(plan.dir, full_slave, wait=False)
        # Writes are acknowledged (with the other slave) all the while the slave fills
        # its disk, and after: it never gets in sync.
        slowest = 0.0
        slave_log = plan.dir / "logs" / f"{full_slave}.log"
        for i in range(2000):
            started = time.monotonic()
            assert await produce(conn, 0, [b"z%d" % i]) == "OK"
            slowest = max(slowest, time.monotonic() - started)
            if "No space left on device" in slave_log.read_text(errors="replace"):
                break  # the slave refused a push for want of space
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the slave's disk never filled:\n"
                                 + slave_log.read_text(errors="replace")[-3000:])
        for i in range(20):
            assert await produce(conn, 0, [b"w%d" % i]) == "OK"
        assert isr_record(zk, "g1") == {"g1-1"}
        print(f"slowest produce while the slave's disk filled: {slowest * 1000:.0f} ms")

        small_disk.resize(64 << 20)  # space returns: it catches up and rejoins
        await eventually(lambda: isr_record(zk, "g1") == {"g1-1", full_slave},
                         "the slave back in the in-sync record", 60)
        assert await produce(conn, 0, [b"after"]) == "OK"
    finally:
        if conn is not None:
            await conn.close()
        zk.stop()
        zk.close()
        lc.down(plan.dir)
