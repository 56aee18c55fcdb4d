"""Benchmark: delayed messages at scale (docs/delayed.md), beside RabbitMQ's TTL + DLX.

Why this exists: issue 13 asks that a million scheduled messages not cost a million of
anything in memory, and that due messages arrive on time under load. On a local cluster
(ZooKeeper, one group of a master and a synchronously replicated slave, the controller):

- **memory**: 1 KiB messages are scheduled over the next day (due 1 h to 25 h from now,
  so none falls due during the run) until the master's schedule holds 10k, 100k and 1M
  (``understudy_scheduled_messages``); the master's RSS (``VmRSS``) is read at each count
  once its schedule has caught up (``rss_mb``, and ``slave_rss_mb``);
- **lateness**: with those entries pending, 1 KiB messages are sent at ``--rate`` (2000)
  msg/s for ``--seconds`` with a ``--delay`` s delay, so ``--rate`` msg/s fall due; a
  consumer records, per message, its arrival minus its delivery time (``lateness_ms_*``,
  never negative unless a message came early: ``early`` counts them) and what never came
  (``scheduled_lost``);
- **RabbitMQ**, on the same machine in the same run (one node, Debian's 3.10, installed
  with apt-get when missing, as bench/peers.py does): the usual way to build delays there
  — a durable queue of persistent messages with a per-message TTL (``expiration``) whose
  dead-letter exchange routes to the consumer's queue — with the same counts pending and
  the same lateness run. Uniform delays are where that pattern applies (a message expires
  only at the head of its queue). ``rabbitmq.rss_mb`` is the Erlang VM's RSS.

Prints a table and writes ``bench-results/delayed.json``. No assertions: the tests assert.

    python bench/delayed.py                       # what `make bench` runs
    python bench/delayed.py --counts 10000,50000 --seconds 10 --no-rabbitmq   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchlib import end_on_sigterm, write_results

from understudy_broker import protocol as p
from understudy_broker.admin import admin_topic
from understudy_broker.client import Consumer, Producer
from understudy_harness.checker import percentile
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs as lprocs
from understudy_operator.local.plan import ClusterPlan

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from peers import Rabbit, install_rabbitmq, run_isolated

TOPIC = "bench-delayed"
BODY = 1024
HOUR_MS = 3_600_000


def rss_mb(pid: int) -> float:
    text = pathlib.Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return round(int(m.group(1)) / 1024, 1) if m else float("nan")


def metric(port: int, name: str) -> float | None:
    """A broker's one series ``name`` (the local cluster's metrics reader)."""
    values = lc._metric_values(lc.http_get(port, "/metrics", timeout=2) or "", name)
    return values[0] if values else None


def body(due_ms: int, i: int) -> bytes:
    head = b"%d:%d:" % (due_ms, i)
    return head + b"x" * (BODY - len(head))


async def schedule_until(prod: Producer, upto: int, done: int) -> int:
    """Send scheduled messages (due over the next day) until ``upto`` were acknowledged."""
    now = int(time.time() * 1000)
    window: set[asyncio.Future[tuple[int, int]]] = set()
    i = done
    while i < upto:
        due = now + HOUR_MS + (i * 86_400_000) // 1_000_000 % (24 * HOUR_MS)
        window.add(await prod.send(TOPIC, body(due, i), deliver_at_ms=due))
        i += 1
        if len(window) >= 4000:
            finished, window = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
            for f in finished:
                f.result()
    await asyncio.gather(*window)
    return i


def lateness_summary(late: list[float], sent: int, got: int, early: int) -> dict[str, Any]:
    return {"sent": sent, "received": got, "scheduled_lost": sent - got, "early": early,
            "lateness_ms_p50": round(percentile(late, 50) or 0.0, 1),
            "lateness_ms_p99": round(percentile(late, 99) or 0.0, 1),
            "lateness_ms_max": round(max(late, default=0.0), 1)}


async def lateness_run(name: str, send: Callable[[int, int], Any],
                       receive: Callable[[], Any], args: argparse.Namespace) -> dict[str, Any]:
    """Send ``args.rate`` msg/s due ``args.delay`` s later for ``args.seconds``; collect
    arrivals until all came or 30 s after the last was due; print and return the figures."""
    rate, seconds, delay_ms = args.rate, args.seconds, int(args.delay * 1000)
    late: list[float] = []
    seen: set[int] = set()
    early = 0
    stop = asyncio.Event()
    complete = asyncio.Event()  # every message sent has arrived
    total: list[int] = []  # the count sent, once sending is over

    async def consume() -> None:
        nonlocal early
        while not stop.is_set():
            for raw in await receive():
                now = time.time() * 1000
                due_s, i_s, _ = raw.split(b":", 2)
                i = int(i_s)
                if i in seen:
                    continue
                seen.add(i)
                lag = now - int(due_s)
                early += lag < 0
                late.append(max(0.0, lag))
                if total and len(seen) >= total[0]:
                    complete.set()

    reader = asyncio.create_task(consume())
    sent = 0
    started = time.monotonic()
    pending: set[asyncio.Future[Any]] = set()
    while time.monotonic() - started < seconds:
        await asyncio.sleep(0.005)
        owed = int((time.monotonic() - started) * rate) - sent
        for _ in range(max(0, owed)):
            due = int(time.time() * 1000) + delay_ms
            pending.add(asyncio.ensure_future(send(due, sent)))
            sent += 1
        pending = {f for f in pending if not f.done()}
    await asyncio.gather(*pending, return_exceptions=True)
    total.append(sent)
    if len(seen) >= sent:
        complete.set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay_ms / 1000 + 30):
            await complete.wait()
    stop.set()
    await asyncio.wait({reader}, timeout=5)
    reader.cancel()
    out = lateness_summary(late, sent, len(seen), early)
    print(f"{name}: lateness p50 {out['lateness_ms_p50']} ms, p99 {out['lateness_ms_p99']} "
          f"ms, lost {out['scheduled_lost']}, early {out['early']}", flush=True)
    return out


# --------------------------------------------------------------------------- Understudy


async def understudy(plan: ClusterPlan, counts: list[int], args: argparse.Namespace
                     ) -> dict[str, Any]:
    boot = [plan.address("g1-0")]
    await admin_topic(boot, p.AdminTopicRequest("create", TOPIC, groups=["g1"],
                                                queues_per_group=4))
    master = plan.process("g1-0")
    slave = plan.process("g1-1")
    mpid = lprocs.read_pid(plan.pid_dir, "g1-0")
    spid = lprocs.read_pid(plan.pid_dir, "g1-1")
    if mpid is None or spid is None or not master.http_port or not slave.http_port:
        raise RuntimeError("the local cluster's brokers have no pid or HTTP port")
    out: dict[str, Any] = {"rss_mb": {}, "slave_rss_mb": {},
                           "rss_mb_empty": rss_mb(mpid), "schedule_seconds": {}}
    done = 0
    async with Producer(boot, batch_size=256, linger_ms=2) as prod:
        for count in counts:
            t0 = time.monotonic()
            done = await schedule_until(prod, count, done)
            for port in (master.http_port, slave.http_port):  # both indexed everything
                for _ in range(1200):
                    if (metric(port, "understudy_scheduled_messages") or 0) >= count:
                        break
                    await asyncio.sleep(0.5)
            await asyncio.sleep(2)  # settle (the index releases memory in steps)
            out["schedule_seconds"][str(count)] = round(time.monotonic() - t0, 1)
            out["rss_mb"][str(count)] = rss_mb(mpid)
            out["slave_rss_mb"][str(count)] = rss_mb(spid)
            print(f"understudy: {count:>9,} scheduled: master RSS {out['rss_mb'][str(count)]} MB,"
                  f" slave {out['slave_rss_mb'][str(count)]} MB", flush=True)
        consumer = Consumer(boot, group="bench", topic=TOPIC, max_wait_ms=100)

        async def send(due: int, i: int) -> None:
            await (await prod.send(TOPIC, body(due, 10_000_000 + i), deliver_at_ms=due))

        async def receive() -> list[bytes]:
            return [r.body for r in await consumer.getmany(timeout_s=0.2)]

        try:
            out.update(await lateness_run("understudy", send, receive, args))
        finally:
            await consumer.close()
    return out


# --------------------------------------------------------------------------- RabbitMQ


async def _rabbit(rabbit: Rabbit, counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    import aio_pika

    node = rabbit.nodes[0]
    pid_file = pathlib.Path(node.env["RABBITMQ_PID_FILE"])
    pid = int((await asyncio.to_thread(pid_file.read_text)).strip())
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{node.amqp}/")
    out: dict[str, Any] = {"rss_mb": {}, "rss_mb_empty": rss_mb(pid)}
    try:
        ch = await conn.channel(publisher_confirms=True)
        target = await ch.declare_queue("target", durable=True)
        await ch.declare_queue("delay", durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "target"})

        async def publish(due: int, i: int) -> None:
            ttl = max(0, due - int(time.time() * 1000))
            await ch.default_exchange.publish(
                aio_pika.Message(body(due, i), delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                 expiration=datetime.timedelta(milliseconds=ttl)),
                routing_key="delay")

        # Memory: the same counts, due over the next day (a separate queue: uniform TTLs
        # per queue keep RabbitMQ's head-of-queue expiry exact; these never fall due).
        # Published without confirms, as fast as the client goes (with a confirm per
        # message this Python client managed ~1000 msg/s), then counted by the broker.
        await ch.declare_queue("parked", durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "target"})
        bulk = await conn.channel(publisher_confirms=False)
        done = 0
        now = int(time.time() * 1000)
        for count in counts:
            while done < count:
                await bulk.default_exchange.publish(
                    aio_pika.Message(body(now + 25 * HOUR_MS, done),
                                     delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                     expiration=datetime.timedelta(hours=25)),
                    routing_key="parked")
                done += 1
            for _ in range(1200):
                declared = await ch.declare_queue("parked", passive=True)
                if (declared.declaration_result.message_count or 0) >= count:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(2)
            out["rss_mb"][str(count)] = rss_mb(pid)
            print(f"rabbitmq: {count:>9,} parked: RSS {out['rss_mb'][str(count)]} MB", flush=True)
        buffered: list[bytes] = []

        async def on_message(msg: Any) -> None:
            buffered.append(msg.body)
            await msg.ack()

        await target.consume(on_message, no_ack=False)

        async def receive() -> list[bytes]:
            await asyncio.sleep(0.05)
            got, buffered[:] = list(buffered), []
            return got

        out.update(await lateness_run("rabbitmq", publish, receive, args))
    finally:
        await conn.close()
    return out


def rabbitmq(counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    install_rabbitmq()
    return run_isolated("delayed", lambda root, procs: asyncio.run(
        _rabbit(Rabbit(root, procs, size=1), counts, args)))


# --------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="10000,100000,1000000",
                    help="scheduled counts at which RSS is read (ascending)")
    ap.add_argument("--rate", type=float, default=2000.0, help="due messages per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the lateness run")
    ap.add_argument("--delay", type=float, default=5.0, help="delay of the lateness run, s")
    ap.add_argument("--no-rabbitmq", action="store_true", help="skip the RabbitMQ comparison")
    ap.add_argument("--out", default="bench-results/delayed.json")
    args = ap.parse_args(argv)
    counts = sorted(int(c) for c in args.counts.split(","))
    end_on_sigterm()
    load_before = os.getloadavg()
    directory = pathlib.Path(tempfile.mkdtemp(prefix="understudy-bench-delayed-"))
    try:
        plan = lc.up(directory / "c", groups=1, slaves=1)
        try:
            ours = asyncio.run(understudy(plan, counts, args))
        finally:
            lc.down(plan.dir)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    theirs: dict[str, Any] | None = None
    if not args.no_rabbitmq:
        theirs = rabbitmq(counts, args)
    doc: dict[str, Any] = {
        "lateness_ms_p50": ours["lateness_ms_p50"],
        "lateness_ms_p99": ours["lateness_ms_p99"],
        "rss_mb": ours["rss_mb"],
        "scheduled_lost": ours["scheduled_lost"],
        "understudy": ours,
        "rabbitmq": theirs,
        "lateness_p99_vs_rabbitmq": (round(ours["lateness_ms_p99"] / theirs["lateness_ms_p99"], 4)
                                     if theirs and theirs["lateness_ms_p99"] else None),
        "workload": {"counts": counts, "body_bytes": BODY, "rate": args.rate,
                     "seconds": args.seconds, "delay_s": args.delay,
                     "group": "one master + one slave, synchronous replication"},
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    write_results(doc, pathlib.Path(args.out))
    print(f"\n{'':24}{'understudy':>14}{'rabbitmq':>14}")
    for c in counts:
        r = theirs["rss_mb"].get(str(c)) if theirs else None
        print(f"{'RSS MB @ ' + format(c, ','):24}{ours['rss_mb'][str(c)]:>14}{r if r is not None else '-':>14}")
    for k in ("lateness_ms_p50", "lateness_ms_p99", "scheduled_lost", "early"):
        print(f"{k:24}{ours[k]:>14}{theirs[k] if theirs else '-':>14}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main(sys.argv[1:]))
