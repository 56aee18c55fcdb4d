"""Benchmark: ordered topics (docs/ordered.md) on real processes.

Why this exists: issue 12's figures are only worth quoting when measured on a running
cluster over many cycles. On one local cluster (ZooKeeper, two groups of a master and a
slave, the controller) this measures:

- **throughput**: one producer, 1 KiB messages, sends as fast as acknowledgements come
  back, for ``--seconds``, on an ordered topic over both groups and then on an unordered
  topic over the same groups (one queue per group for both; the groups' replication is
  the local default, synchronous). ``ordered_vs_unordered_throughput`` is the ratio, both
  from this run;
- **send-head failover**: a producer sends the ordered topic at ``--rate``; ``--cycles``
  times the send head's master is killed (``kill -9``) and as many times hung (SIGSTOP
  for ``--hang-s``, past the 2 s ZooKeeper session, then SIGCONT), each time the head's
  master wherever the head is then; the master comes back and its group is NORMAL before
  the next cycle. ``send_head_stall_ms``: the producer's write stall (the longest gap
  between acknowledgements from the fault to the group being NORMAL again);
- **consumer takeover**: two members of a consumer group read the ordered topic (one
  holds it); the one holding it is killed (``abort()``: no commit, no leave) and the time
  to the other member's first delivery is measured, ``--cycles`` times. The target is
  the session timeout + 0.5 s;
- **order and loss**: every acknowledgement and delivery goes through the shared checker
  (``order_violations``: a delivery while an id acknowledged before it was missing;
  ``lost_acked``: acknowledged and never delivered).

Prints a table and writes ``bench-results/ordered.json``. No assertions: the tests assert.

    python bench/ordered.py                 # what `make bench` runs (20 + 20 cycles)
    python bench/ordered.py --cycles 3      # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from benchlib import cluster_directory, machine_figures, send_at_rate, write_results

from understudy_broker import protocol as p
from understudy_broker.admin import admin_topic
from understudy_broker.client import BrokerError, Consumer, Producer, Router
from understudy_broker.zklayout import ChainDoc, chains_path
from understudy_harness.checker import check, percentile
from understudy_harness.history import Deliver, Event, ProduceAck, TopicInfo, iter_jsonl
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import ClusterPlan
from understudy_operator.zk import ZkGateway, gateway

ORDERED = "bench-ordered"  # the failover stream's topic
#: The throughput runs' topics: their backlog (no consumer reads it) must not hold the
#: stream's groups out of its send chain (a group joins only with no backlog of the topic).
THROUGHPUT_ORDERED = "bench-ordered-tp"
UNORDERED = "bench-unordered-tp"
SESSION_MS = 2000
TARGETS = {"kill": 1000.0, "takeover": SESSION_MS + 500.0}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


async def throughput(boot: list[str], topic: str, seconds: float, size: int
                     ) -> tuple[float, float]:
    """Acknowledged messages per second of one producer sending as fast as it may, and
    the share of one core the producer's process used meanwhile (1.0: the client, not the
    brokers, set the rate)."""
    body = b"x" * size
    window = asyncio.Semaphore(4096)
    acked = 0

    def done(fut: asyncio.Future[tuple[int, int]]) -> None:
        nonlocal acked
        window.release()
        if not fut.cancelled() and fut.exception() is None:
            acked += 1

    async with Producer(boot, linger_ms=2, batch_size=256, send_timeout_s=30.0) as prod:
        await (await prod.send(topic, body))  # joined (ordered: the active producer)
        acked = 0
        started, cpu = time.monotonic(), time.process_time()
        while time.monotonic() - started < seconds:
            await window.acquire()
            (await prod.send(topic, body)).add_done_callback(done)
        await prod.flush()
        wall = time.monotonic() - started
        return acked / wall, (time.process_time() - cpu) / wall


@dataclass
class Stream:
    """One producer of the ordered topic at a steady rate, and a consumer group's
    members; every acknowledgement and delivery is kept for the checker."""

    boot: list[str]
    rate: float
    acks: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, id, q, offset)
    # (t, id, member, queue, offset)
    deliveries: list[tuple[float, int, str, int, int]] = field(default_factory=list)
    members: list[Consumer] = field(default_factory=list)
    reading: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # member -> task
    stopping: bool = False  # the producer stops; members read on until cancelled (drain)

    async def add_member(self) -> Consumer:
        c = Consumer(self.boot, group="bench", topic=ORDERED, max_wait_ms=100,
                     session_timeout_ms=SESSION_MS)
        await c.start()
        self.members.append(c)
        self.reading[c.member_id] = asyncio.create_task(self.consume(c))
        return c

    async def kill_member(self, c: Consumer) -> None:
        """As a crash: no commit, no leave (the brokers hand the topic on after its
        session)."""
        self.reading.pop(c.member_id).cancel()
        await c.abort()
        self.members.remove(c)

    async def produce(self) -> None:
        def acked(i: int, fut: asyncio.Future[tuple[int, int]]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                q, off = fut.result()
                self.acks.append((time.monotonic(), i, q, off))

        async with Producer(self.boot, linger_ms=1, send_timeout_s=30.0,
                            leader_session_timeout_ms=SESSION_MS) as prod:
            await send_at_rate(prod, ORDERED, self.rate, stopping=lambda: self.stopping,
                               acked=acked)

    async def consume(self, c: Consumer) -> None:
        while True:
            try:
                recs = await c.getmany(timeout_s=0.1)
            except (BrokerError, ConnectionError, OSError) as exc:  # reported, not fatal
                print(f"  consumer {c.member_id}: {exc}", flush=True)
                await asyncio.sleep(0.1)
                continue
            now = time.monotonic()
            self.deliveries += [(now, int(r.body), c.member_id, r.queue, r.offset)
                                for r in recs]
            if recs:
                await c.commit(timeout_s=0.1)

    def stall_ms(self, start: float, end: float) -> float:
        times = [start, *(a[0] for a in self.acks if start <= a[0] <= end)]
        return max((b - a for a, b in itertools.pairwise(times)), default=end - start) * 1000

    def history(self) -> list[Event]:
        ns = 1_000_000_000
        out: list[Event] = [TopicInfo(0, ORDERED, True)]
        out += [ProduceAck(int(t * ns), str(i), ORDERED, q, off) for t, i, q, off in self.acks]
        out += [Deliver(int(t * ns), "bench", ORDERED, q, off, str(i), m)
                for t, i, m, q, off in self.deliveries]
        return out


async def send_head(boot: list[str]) -> str:
    router = Router(boot)
    try:
        await router.refresh()
        _ordered, head = router.send_head(ORDERED)
        return head or "g1"
    finally:
        await router.close()


async def send_chain(zk: ZkGateway) -> tuple[str, ...]:
    got = await zk.get(chains_path(ORDERED))
    return () if got is None else ChainDoc.from_json(got[0]).send


async def head_cycles(stream: Stream, plan: ClusterPlan, directory: pathlib.Path, kind: str,
                      cycles: int, hang_s: float) -> list[float]:
    """Each cycle starts from the steady state: both groups in the send chain (the group
    faulted before is back at its tail), so it measures a failover, not a wait for one."""
    out = []
    zk = gateway(plan.zk_connect, timeout_s=5.0)
    await zk.start(timeout_s=10)
    try:
        for n in range(cycles):
            await asyncio.sleep(1.0)
            for _ in range(200):
                if len(await send_chain(zk)) == 2:
                    break
                await asyncio.sleep(0.1)
            out.append(await head_cycle(stream, plan, directory, kind, hang_s,
                                        f"{n + 1}/{cycles}"))
    finally:
        await zk.stop()
    return out


async def head_cycle(stream: Stream, plan: ClusterPlan, directory: pathlib.Path, kind: str,
                     hang_s: float, label: str) -> float:
    """One fault of the send head's master; the write stall until the group is NORMAL."""
    group = await send_head(stream.boot)
    broker = f"{group}-0"
    at = time.monotonic()
    await asyncio.to_thread(lc.kill, directory, broker, sig="KILL" if kind == "kill" else "STOP")
    await asyncio.sleep(hang_s if kind == "hang" else 1.5)
    await asyncio.to_thread(lc.start, directory, broker)
    await asyncio.to_thread(lc.wait_mode, plan, group, "NORMAL",
                            deadline=time.monotonic() + 60)
    await asyncio.sleep(0.5)
    stall = stream.stall_ms(at, time.monotonic())
    print(f"  {kind} {label} {broker} (send head): write stall {stall:.1f} ms, "
          f"head now {await send_head(stream.boot)}", flush=True)
    return stall


async def takeovers(stream: Stream, cycles: int) -> list[float]:
    """Kill the member holding the topic; time to the other member's first delivery."""
    out = []
    for n in range(cycles):
        await asyncio.sleep(1.0)
        holder = next((c for c in stream.members if c.assigned), None)
        if holder is None:
            continue
        at = time.monotonic()
        await stream.kill_member(holder)
        await stream.add_member()  # the next standby
        first = None
        while first is None and time.monotonic() < at + 15:
            await asyncio.sleep(0.01)
            first = next((d[0] for d in stream.deliveries
                          if d[0] > at and d[2] != holder.member_id), None)
        took = None if first is None else (first - at) * 1000
        if took is not None:
            out.append(took)
        print(f"  takeover {n + 1}/{cycles}: {holder.member_id} killed; next delivery after "
              f"{'-' if took is None else f'{took:.0f}'} ms", flush=True)
    return out


async def run(args: argparse.Namespace, directory: pathlib.Path) -> dict[str, Any]:
    plan = await asyncio.to_thread(lc.up, directory, groups=2, slaves=1)
    try:
        boot = [b.address for g in plan.groups for b in g.brokers]
        for topic, ordered_topic in ((ORDERED, True), (THROUGHPUT_ORDERED, True),
                                     (UNORDERED, False)):
            await admin_topic(boot, p.AdminTopicRequest("create", topic, ["g1", "g2"], 1,
                                                        ordered=ordered_topic))
        print(f"throughput: {args.seconds:g} s each, {args.size} B messages", flush=True)
        unordered, cpu_u = await throughput(boot, UNORDERED, args.seconds, args.size)
        ordered, cpu_o = await throughput(boot, THROUGHPUT_ORDERED, args.seconds, args.size)
        print(f"  unordered {unordered:.0f} msg/s (producer CPU {cpu_u:.0%} of a core), "
              f"ordered {ordered:.0f} msg/s (producer CPU {cpu_o:.0%})", flush=True)

        stream = Stream(boot, args.rate)
        for _ in range(2):
            await stream.add_member()
        producer = asyncio.create_task(stream.produce())
        await asyncio.sleep(2)
        kinds = [k for k in ("kill", "hang") if k not in args.skip.split(",")]
        stalls: dict[str, list[float]] = {"kill": [], "hang": []}
        for kind in kinds:
            print(f"{kind}: {args.cycles} cycles of the send head's master", flush=True)
            stalls[kind] = await head_cycles(stream, plan, directory, kind, args.cycles,
                                             args.hang_s)
        print(f"consumer takeover: {args.cycles} kills of the member reading", flush=True)
        taken = [] if "takeover" in args.skip.split(",") else await takeovers(stream, args.cycles)
        stream.stopping = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(40):  # the producer's flush: 30 s at most per send
                await asyncio.gather(producer, return_exceptions=True)
        acked = {a[1] for a in stream.acks}
        for _ in range(150):  # the drain: at most 30 s
            if acked <= {d[1] for d in stream.deliveries}:
                break
            await asyncio.sleep(0.2)
        for task in stream.reading.values():
            task.cancel()
        for c in stream.members:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await c.close()
        report = check(stream.history())
        doc: dict[str, Any] = {
            "throughput_msgs_s": {"ordered": round(ordered), "unordered": round(unordered),
                                  "message_bytes": args.size, "seconds": args.seconds,
                                  "producer_cpu_ordered": round(cpu_o, 2),
                                  "producer_cpu_unordered": round(cpu_u, 2)},
            "ordered_vs_unordered_throughput": round(ordered / unordered, 3) if unordered else None,
        }
        for kind in ("kill", "hang"):
            doc[kind] = {
                "send_head_stall_ms_p50": _r(percentile(stalls[kind], 50)),
                "send_head_stall_ms_p99": _r(percentile(stalls[kind], 99)),
                "cycles": len(stalls[kind]),
                "samples_ms": [_r(s) for s in stalls[kind]],
            }
        doc["consumer_takeover_ms_p50"] = _r(percentile(taken, 50))
        doc["consumer_takeover_ms_p99"] = _r(percentile(taken, 99))
        doc["consumer_takeovers"] = len(taken)
        doc["session_timeout_ms"] = SESSION_MS
        doc["order_violations"] = report.order_violations
        doc["order_examples"] = list(report.order_examples)
        doc["lost_acked"] = report.lost_acked
        delivered = {d[1] for d in stream.deliveries}
        if args.history is not None:
            args.history.write_text("".join(line + "\n" for line in iter_jsonl(stream.history())))
        lost = sorted(acked - delivered)
        doc["lost_ranges"] = [[g[0], g[-1]] for g in _runs(lost)][:20]
        doc["last_acked_id"] = max(acked, default=None)
        doc["acked"] = report.acked
        doc["duplicates"] = report.duplicates_produce + report.duplicates_inflight
        return doc
    finally:
        await asyncio.to_thread(lc.down, directory)


def _runs(ids: list[int]) -> list[list[int]]:
    """Sorted ids as runs of consecutive ones."""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][-1] == i - 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--hang-s", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--keep", action="store_true",
                    help="keep the cluster's directory (data and logs) under $TMPDIR")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench-results/ordered.json"))
    ap.add_argument("--history", type=pathlib.Path, default=None,
                    help="also write every acknowledgement and delivery here (JSON lines)")
    ap.add_argument("--skip", default="", help="phases to skip: hang,takeover")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    with cluster_directory("ordered", keep=args.keep) as directory:
        doc = asyncio.run(run(args, directory))
    doc.update(machine_figures(load_before))
    print()
    t = doc["throughput_msgs_s"]
    print(f"throughput, 1 producer       ordered {t['ordered']} msg/s, unordered "
          f"{t['unordered']} msg/s: ratio {doc['ordered_vs_unordered_throughput']}")
    print(f"{'':30}{'p50':>10}{'p99':>10}   target")
    for kind in ("kill", "hang"):
        k = doc[kind]
        target = f"p99 <= {TARGETS['kill']:g} ms" if kind == "kill" else ""
        print(f"send-head stall, {kind:<13}{k['send_head_stall_ms_p50']!s:>10}"
              f"{k['send_head_stall_ms_p99']!s:>10}   {target} ({k['cycles']} cycles)")
    print(f"consumer takeover             {doc['consumer_takeover_ms_p50']!s:>10}"
          f"{doc['consumer_takeover_ms_p99']!s:>10}   p99 <= {TARGETS['takeover']:g} ms "
          f"({doc['consumer_takeovers']} kills)")
    print(f"order violations: {doc['order_violations']}; acknowledged and never delivered: "
          f"{doc['lost_acked']} (of {doc['acked']})")
    print(f"load average before {doc['loadavg']['before']}, after {doc['loadavg']['after']}")
    write_results(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
