"""Benchmark: a topic over two groups through master kills and hangs, and consumer-group joins.

Why this exists: issue 11's targets are only worth quoting when measured on real processes
over many cycles. On one local cluster (ZooKeeper, two groups of a master and a slave, the
controller) and one cluster topic over both groups (4 queues each), this measures:

- **write stall** (DESIGN "Checker definitions"): per fault, the longest interval during
  which the producer had pending sends and got no acknowledgement, from every send's send
  and acknowledgement times. A producer sends unkeyed messages at ``--rate`` msg/s, from
  a process of its own (``bench/loadproducer.py``: a producer service does not share its
  event loop with consumer-group members, and the bench's did, at a cost measured there);
  ``--cycles`` master ``kill -9`` (alternating groups; the master restarted and the group
  NORMAL again before the next cycle) and as many master hangs (SIGSTOP for
  ``--hang-s``, past the 2 s ZooKeeper session, then SIGCONT);
- **end-to-end recovery**: from the fault to the first delivery, to a consumer-group member,
  of a message produced after the fault (the members commit every ``COMMIT_INTERVAL_S``);
- **no fault**: the write stall of as many windows as the kill cycles', as long as their
  median, with no fault: the floor that scheduling on shared cores and the disk's flushes
  put under every fault cycle's figure; and, in those windows, each message's time from
  send to delivery: the floor under the end-to-end figure;
- **rebalance**: with two members consuming, a third joins: from its ``start()`` to its first
  delivery from a queue it was handed; the queues moved per join against the minimum;
  duplicates over the clean joins and leaves (each id delivered more than once to the
  group); two members on one queue, from the members' ownership logs.

Each cycle's and window's stall is printed with what disturbed it from outside the cluster:
the load generator's own pauses, flushes over ``SLOW_FLUSH_S``, and the host's steal inside
the stall (``/proc/stat``, sampled every 10 ms: CPU time the hypervisor gave other guests
while this machine's processes wanted to run). The p99 of the cycles without slow flushes
and of those without host steal are reported beside the whole figures, never instead.

Peers (RabbitMQ quorum queues, JetStream R3) come from ``bench/peers.py`` when it exists;
otherwise their entries say why they are missing. Prints a table and writes
``bench-results/cluster.json``. No assertions: the tests assert.

    python bench/cluster.py                 # what `make bench` runs (20 + 20 cycles)
    python bench/cluster.py --cycles 3      # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import pathlib
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from benchlib import (
    GeneratorPauses,
    HostSteal,
    cluster_directory,
    machine_figures,
    run_on_uvloop,
    write_results,
)
from loadproducer import ProducerProcess
from prometheus_client.parser import text_string_to_metric_families

from understudy_broker import metric_names as names
from understudy_broker import protocol as p
from understudy_broker.admin import admin_topic
from understudy_broker.client import Consumer
from understudy_broker.tasks import stop_tasks
from understudy_harness.checker import check, percentile
from understudy_harness.history import Own
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import ClusterPlan

TOPIC = "bench"
TARGETS = {"kill": 50.0, "hang": 1000.0, "e2e": 250.0, "join": 1000.0}
# The members commit on a timer. Committing after every getmany (an earlier version)
# made ~230 commits/s, each an offsets fsync and a replication round on a broker: with the
# pull loops that prompt delivery keeps busy, the 2-core machine ran 1.83 cores busy and
# the no-fault write stall rose from ~18 to ~25 ms p50 (docs/cluster.md, run D).
COMMIT_INTERVAL_S = 0.1


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


@dataclass
class Traffic:
    """One producer at a steady rate, in a process of its own (:mod:`loadproducer`), and
    the members of consumer group ``bench`` in this one."""

    boot: list[str]
    producer: ProducerProcess
    deliveries: list[tuple[float, int, str, int]] = field(default_factory=list)
    first_delivery: dict[str, float] = field(default_factory=dict)  # member -> monotonic
    first_seen: dict[int, float] = field(default_factory=dict)  # id -> its first delivery
    members: list[Consumer] = field(default_factory=list)
    stopping: bool = False
    pauses: GeneratorPauses = field(default_factory=GeneratorPauses)  # this process's
    steal: HostSteal = field(default_factory=HostSteal)

    @property
    def sends(self) -> dict[int, float]:
        """id -> monotonic send time, as far as :meth:`ProducerProcess.poll` has read."""
        return self.producer.sends

    @property
    def acks(self) -> dict[int, float]:
        """id -> monotonic acknowledgement time, likewise."""
        return self.producer.acks

    async def consume(self, c: Consumer) -> None:
        """Deliveries are recorded as they come; what was delivered is committed every
        ``COMMIT_INTERVAL_S`` (a timer, as Kafka's auto-commit and RocketMQ's offset
        persistence do, at 50x their 5 s default), and when the member stops. A hung
        master's commit goes on in the background (at least once)."""
        committed = time.monotonic()
        while not self.stopping or c.assigned:
            recs = await c.getmany(timeout_s=0.1)
            now = time.monotonic()
            if recs:
                self.first_delivery.setdefault(c.member_id, now)
            for r in recs:
                self.deliveries.append((now, int(r.body), c.member_id, r.queue))
                self.first_seen.setdefault(int(r.body), now)
            if now - committed >= COMMIT_INTERVAL_S or (self.stopping and not recs):
                committed = now
                await c.commit(timeout_s=0.1)
            if self.stopping and not recs:
                return

    def member(self) -> Consumer:
        return Consumer(self.boot, group="bench", topic=TOPIC, session_timeout_ms=3000,
                        max_wait_ms=100)

    def write_stall_ms(self, start: float, end: float) -> tuple[float, float, float]:
        """Longest time in [start, end] with sends pending and no acknowledgement, when
        it began (ms after ``start``), and the longest pause of the producer's event loop
        within it (:class:`benchlib.GeneratorPauses`). The producer sends steadily, so
        sends are always pending: the longest gap between consecutive acknowledgements
        (from ``start``)."""
        acks = sorted(t for t in self.acks.values() if start <= t <= end)
        points = [start, *acks]
        gap, at = max(((b - a, a) for a, b in itertools.pairwise(points)),
                      default=(end - start, start))
        return gap * 1000, (at - start) * 1000, self.producer.pauses.longest_ms(at, at + gap)

    def steal_ms(self, start: float, stall_at_ms: float, stall_ms: float) -> float | None:
        """The host's steal inside a stall that began ``stall_at_ms`` after ``start``."""
        began = start + stall_at_ms / 1000
        return self.steal.between(began, began + stall_ms / 1000)

    def delivery_ms(self, start: float, end: float) -> list[float]:
        """From send to first delivery, of each message sent in [start, end] (none lost
        here: the run checks that every acknowledged id was delivered)."""
        first = self.first_seen
        return [(first[i] - sent) * 1000 for i, sent in self.sends.items()
                if start <= sent <= end and i in first]

    def e2e_ms(self, fault_at: float) -> float | None:
        first = min((self.first_seen[i] for i, t in self.sends.items()
                     if t >= fault_at and i in self.first_seen), default=None)
        return None if first is None else (first - fault_at) * 1000


SLOW_FLUSH_S = 0.05  # a flush longer than this is a disk stall the size of the target
#: Steal inside a stall from which the cycle counts as disturbed by the host: two ticks
#: (the kernel counts steal in 10 ms ticks per CPU, sampled every 10 ms).
STEAL_MS = 20.0


def slow_flushes(plan: ClusterPlan) -> dict[str, tuple[float, float]]:
    """Per broker, (flushes so far, flushes over ``SLOW_FLUSH_S``), from the
    ``understudy_log_flush_seconds`` histogram on its /metrics; a broker that does not
    answer is left out."""
    out: dict[str, tuple[float, float]] = {}
    for proc in plan.processes:
        if proc.http_port is None or proc.group is None:
            continue
        text = lc.http_get(proc.http_port, "/metrics", timeout=2)
        if text is None:
            continue
        count = fast = 0.0
        for family in text_string_to_metric_families(text):
            if family.name != names.LOG_FLUSH_SECONDS:
                continue
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    count = sample.value
                elif sample.name.endswith("_bucket") and \
                        float(sample.labels["le"]) == SLOW_FLUSH_S:
                    fast = sample.value
        out[proc.name] = (count, count - fast)
    return out


def slow_between(before: dict[str, tuple[float, float]],
                 after: dict[str, tuple[float, float]]) -> int:
    """Flushes over ``SLOW_FLUSH_S`` between two readings (a restarted broker's counters
    start again from zero)."""
    n = 0.0
    for name, (count, slow) in after.items():
        b_count, b_slow = before.get(name, (0.0, 0.0))
        n += slow if count < b_count else slow - b_slow
    return int(n)


async def wait_normal(plan: ClusterPlan, group: str) -> None:
    await asyncio.to_thread(lc.wait_mode, plan, group, "NORMAL", deadline=time.monotonic() + 60)


class Cycle(NamedTuple):
    """One fault cycle: its write stall (ms, from the fault to the end of the failback),
    the end-to-end recovery (ms; None if nothing sent after the fault was delivered), its
    length (s), flushes over ``SLOW_FLUSH_S``, the load generator's longest pause in the
    stall (ms), the write stall split at the restart: from the fault until the
    master is started again (the failover), and from then to the end (the failback); and
    the host's steal inside the stall (ms; None where the kernel does not count it)."""

    stall_ms: float
    e2e_ms: float | None
    window_s: float
    slow_flushes: int
    paused_ms: float
    until_restart_ms: float
    from_restart_ms: float
    steal_ms: float | None


async def fault_cycles(traffic: Traffic, plan: ClusterPlan, directory: pathlib.Path, kind: str,
                       cycles: int, hang_s: float) -> list[Cycle]:
    out = []
    for n in range(cycles):
        broker = ("g1-0", "g2-0")[n % 2]
        await asyncio.sleep(1.0)
        flushes = await asyncio.to_thread(slow_flushes, plan)
        at = time.monotonic()
        await asyncio.to_thread(lc.kill, directory, broker, sig="KILL" if kind == "kill" else "STOP")
        await asyncio.sleep(hang_s if kind == "hang" else 1.5)
        restart = time.monotonic()
        await asyncio.to_thread(lc.start, directory, broker)
        await wait_normal(plan, broker.split("-")[0])
        await asyncio.sleep(1.0)
        end = time.monotonic()
        slow = slow_between(flushes, await asyncio.to_thread(slow_flushes, plan))
        await traffic.producer.caught_up(end)
        stall, stall_at, paused = traffic.write_stall_ms(at, end)
        e2e = traffic.e2e_ms(at)
        steal = traffic.steal_ms(at, stall_at, stall)
        out.append(Cycle(stall, e2e, end - at, slow, paused,
                         traffic.write_stall_ms(at, restart)[0],
                         traffic.write_stall_ms(restart, end)[0], steal))
        print(f"  {kind} {n + 1}/{cycles} {broker}: write stall {stall:.1f} ms (from "
              f"{stall_at:.0f} ms after the fault; the generator paused {paused:.0f} ms in "
              f"it, the host stole {_steal_words(steal)}), end-to-end "
              f"{'-' if e2e is None else f'{e2e:.1f}'} ms, flushes over "
              f"{SLOW_FLUSH_S * 1000:g} ms: {slow}", flush=True)
    return out


class Window(NamedTuple):
    """One no-fault window: its write stall (ms), flushes over ``SLOW_FLUSH_S``, the load
    generator's longest pause in the stall (ms), each message's send-to-delivery (ms), and
    the host's steal inside the stall (ms)."""

    stall_ms: float
    slow_flushes: int
    paused_ms: float
    delivery_ms: list[float]
    steal_ms: float | None


async def control_windows(traffic: Traffic, plan: ClusterPlan, cycles: int,
                          length_s: float) -> list[Window]:
    """The same measurement with no fault: the write stall of windows as long as the
    fault cycles', on the same cluster and traffic. What the machine does to the
    acknowledgement stream on its own (scheduling on shared cores, disk flushes) is in
    every fault cycle's figure too."""
    out = []
    for n in range(cycles):
        await asyncio.sleep(1.0)
        flushes = await asyncio.to_thread(slow_flushes, plan)
        at = time.monotonic()
        await asyncio.sleep(length_s)
        end = time.monotonic()
        slow = slow_between(flushes, await asyncio.to_thread(slow_flushes, plan))
        await traffic.producer.caught_up(end)
        stall, stall_at, paused = traffic.write_stall_ms(at, end)
        delivery = traffic.delivery_ms(at, end)
        steal = traffic.steal_ms(at, stall_at, stall)
        out.append(Window(stall, slow, paused, delivery, steal))
        print(f"  no fault {n + 1}/{cycles}: write stall {stall:.1f} ms (from "
              f"{stall_at:.0f} ms into the window; the generator paused {paused:.0f} ms in "
              f"it, the host stole {_steal_words(steal)}), flushes over {SLOW_FLUSH_S * 1000:g} ms: {slow}; send to delivery "
              f"p50 {percentile(delivery, 50) or 0:.1f} ms", flush=True)
    return out


def _steal_words(steal: float | None) -> str:
    return "(not counted here)" if steal is None else f"{steal:.0f} ms"


def _without_host_steal(stalls: list[float], steal: list[float | None]) -> dict[str, Any]:
    """The cycles whose stall the host did not stop (steal under ``STEAL_MS``): what is
    left when the hypervisor ran nothing else in the stall. Beside the whole figure,
    never instead of it; a run where steal is not counted keeps every cycle."""
    kept = [s for s, st in zip(stalls, steal, strict=True) if st is None or st < STEAL_MS]
    return {"samples_host_steal_ms": [_r(st) for st in steal],
            "cycles_with_host_steal": len(stalls) - len(kept),
            "write_stall_ms_p99_without_host_steal": _r(percentile(kept, 99))}


def _without_slow_flushes(stalls: list[float], slow: list[int]) -> dict[str, Any]:
    """The cycles in which no broker had a flush over ``SLOW_FLUSH_S``: what is left when
    the disk did not stall (reported beside the whole figure, never instead of it)."""
    kept = [s for s, f in zip(stalls, slow, strict=True) if f == 0]
    return {"cycles_with_slow_flush": len(stalls) - len(kept),
            "write_stall_ms_p99_without_slow_flush": _r(percentile(kept, 99))}


def overlaps(members: list[Consumer]) -> int:
    """Two members on one queue, by the checker's definition, from the members' logs."""
    owns = [Own(int(t * 1e9), "bench", TOPIC, q, c.member_id, kind == "acquire")
            for c in members for t, kind, q in c.ownership_log]
    return check(owns).two_member_violations


async def rebalances(traffic: Traffic, joins: int) -> dict[str, Any]:
    times: list[float] = []
    moved: list[int] = []
    everyone: list[Consumer] = list(traffic.members)
    for n in range(joins):
        before = {c.member_id: set(c.assigned) for c in traffic.members}
        c = traffic.member()
        everyone.append(c)
        started = time.monotonic()
        await c.start()
        task = asyncio.create_task(traffic.consume(c))
        deadline = time.monotonic() + 10
        first = None
        # Not a scan of every delivery so far every 10 ms: by the joins the run holds about
        # 400k, and one scan takes ~35 ms, so the loop that runs the timed consumer was
        # busy scanning most of the time.
        while first is None and time.monotonic() < deadline:
            first = traffic.first_delivery.get(c.member_id)
            await asyncio.sleep(0.01)
        if first is not None:
            times.append((first - started) * 1000)
        await asyncio.sleep(0.5)
        moved.append(sum(len(qs - set(x.assigned)) for x in traffic.members
                         for mid, qs in before.items() if x.member_id == mid))
        await c.close()
        await stop_tasks([task])
        await asyncio.sleep(0.5)
        print(f"  join {n + 1}/{joins}: first delivery after "
              f"{'-' if first is None else f'{(first - started) * 1000:.1f}'} ms, "
              f"{moved[-1]} queue(s) moved", flush=True)
    return {"times": times, "moved": moved, "everyone": everyone}


async def run(args: argparse.Namespace, directory: pathlib.Path) -> dict[str, Any]:
    plan = await asyncio.to_thread(lc.up, directory, groups=2, slaves=1)
    producer: ProducerProcess | None = None
    steal = HostSteal()
    steal.start()
    try:
        boot = [b.address for g in plan.groups for b in g.brokers]
        await admin_topic(boot, p.AdminTopicRequest("create", TOPIC, ["g1", "g2"], 4))
        producer = ProducerProcess(boot, TOPIC, args.rate, directory / "producer" / "events")
        traffic = Traffic(boot, producer, steal=steal)
        traffic.members = [traffic.member(), traffic.member()]
        for c in traffic.members:
            await c.start()
        watching = asyncio.create_task(traffic.pauses.run())
        tasks = [asyncio.create_task(traffic.consume(c)) for c in traffic.members]
        producer.start()
        await asyncio.sleep(2)
        results: dict[str, Any] = {}
        for kind in ("kill", "hang"):
            print(f"{kind}: {args.cycles} cycles", flush=True)
            results[kind] = await fault_cycles(traffic, plan, directory, kind, args.cycles,
                                               args.hang_s)
        length = statistics.median(c.window_s for c in results["kill"])
        print(f"no fault: {args.cycles} windows of {length:.1f} s (the kill cycles' median)",
              flush=True)
        control = await control_windows(traffic, plan, args.cycles, length)
        print(f"rebalance: {args.cycles} joins", flush=True)
        rebalance_from = time.monotonic()
        reb = await rebalances(traffic, args.cycles)
        # The producer first (it waits for its outstanding sends), then the members,
        # which consume what is left before they stop.
        if (code := await asyncio.to_thread(producer.stop)) != 0:
            raise RuntimeError(f"the producer process ended with {code}")
        traffic.stopping = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await stop_tasks([watching])
        for c in traffic.members:
            await c.close()
        counts = Counter((i for _t, i, _m, _q in traffic.deliveries))
        doc: dict[str, Any] = {}
        for kind in ("kill", "hang"):
            stalls = [c.stall_ms for c in results[kind]]
            e2e = [c.e2e_ms for c in results[kind] if c.e2e_ms is not None]
            slow = [c.slow_flushes for c in results[kind]]
            failover = [c.until_restart_ms for c in results[kind]]
            failback = [c.from_restart_ms for c in results[kind]]
            doc[kind] = {
                "write_stall_ms_p50": _r(percentile(stalls, 50)),
                "write_stall_ms_p99": _r(percentile(stalls, 99)),
                "e2e_recovery_ms_p50": _r(percentile(e2e, 50)),
                "e2e_recovery_ms_p99": _r(percentile(e2e, 99)),
                "cycles": len(stalls),
                "samples_write_stall_ms": [_r(s) for s in stalls],
                "samples_slow_flushes": slow,
                "samples_generator_pause_ms": [_r(c.paused_ms) for c in results[kind]],
                # The same stall split at the restart (a gap across it counts in both parts).
                "write_stall_until_restart_ms_p50": _r(percentile(failover, 50)),
                "write_stall_until_restart_ms_p99": _r(percentile(failover, 99)),
                "write_stall_from_restart_ms_p50": _r(percentile(failback, 50)),
                "write_stall_from_restart_ms_p99": _r(percentile(failback, 99)),
                **_without_slow_flushes(stalls, slow),
                **_without_host_steal(stalls, [c.steal_ms for c in results[kind]]),
            }
        stalls = [w.stall_ms for w in control]
        slow = [w.slow_flushes for w in control]
        delivered = [d for w in control for d in w.delivery_ms]
        doc["no_fault"] = {
            "write_stall_ms_p50": _r(percentile(stalls, 50)),
            "write_stall_ms_p99": _r(percentile(stalls, 99)),
            "delivery_ms_p50": _r(percentile(delivered, 50)),
            "delivery_ms_p99": _r(percentile(delivered, 99)),
            "window_s": round(length, 2),
            "cycles": len(control),
            "samples_write_stall_ms": [_r(s) for s in stalls],
            "samples_slow_flushes": slow,
            "samples_generator_pause_ms": [_r(w.paused_ms) for w in control],
            **_without_slow_flushes(stalls, slow),
            **_without_host_steal(stalls, [w.steal_ms for w in control]),
        }
        # 8 queues: 2 members hold 4 + 4; a third takes floor(8/3) = 2 from them.
        doc["rebalance"] = {
            "join_to_delivery_ms_p50": _r(percentile(reb["times"], 50)),
            "join_to_delivery_ms_p99": _r(percentile(reb["times"], 99)),
            "joins": len(reb["times"]),
            "queues_moved_per_join": reb["moved"],
            "queues_moved_minimum": 2,
            # ids sent during the joins and leaves (no fault then) delivered more than once
            "duplicates_clean": sum(1 for i, n in counts.items()
                                    if n > 1 and traffic.sends.get(i, 0) >= rebalance_from),
            "duplicates_total": sum(1 for n in counts.values() if n > 1),
            "two_member_violations": overlaps(reb["everyone"]),
        }
        acked = set(traffic.acks)
        doc["lost_acked"] = len(acked - set(counts))
        per_s = traffic.steal.per_second()
        doc["host_steal_ms_per_s"] = None if per_s is None else round(per_s, 1)
        return doc
    finally:
        steal.stop()
        if producer is not None:
            await asyncio.to_thread(producer.stop)
        await asyncio.to_thread(lc.down, directory)


def peers(cycles: int, rate: int) -> dict[str, Any]:
    here = pathlib.Path(__file__).resolve().parent
    if not (here / "peers.py").exists():
        why = "not measured: bench/peers.py (RabbitMQ quorum queues, JetStream R3) is not in this tree yet"
        return {"rabbitmq": {"error": why}, "jetstream_r3": {"error": why}}
    sys.path.insert(0, str(here))
    import peers as peer_mod  # type: ignore[import-not-found]

    out: dict[str, Any] = {}
    for key, fn in (("rabbitmq", peer_mod.measure_rabbitmq), ("jetstream_r3", peer_mod.measure_jetstream)):
        try:
            out[key] = fn(cycles, rate)
        except Exception as exc:  # a peer that cannot run must not hide our figures
            out[key] = {"error": repr(exc)}
    return out




def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--hang-s", type=float, default=3.0)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--keep", action="store_true",
                    help="keep the cluster's directory (data and logs) under $TMPDIR")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench-results/cluster.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    with cluster_directory("cluster", keep=args.keep) as directory:
        doc = run_on_uvloop(run(args, directory))
    doc.update({} if args.no_peers else peers(args.cycles, int(args.rate)))
    doc.update(machine_figures(load_before))
    print()
    print(f"{'':28}{'p50':>10}{'p99':>10}   target")
    for kind in ("kill", "hang"):
        k = doc[kind]
        print(f"write stall, {kind:<15}{k['write_stall_ms_p50']!s:>10}{k['write_stall_ms_p99']!s:>10}"
              f"   p99 <= {TARGETS[kind]:g} ms ({k['cycles']} cycles)")
        print(f"  cycles with a flush over {SLOW_FLUSH_S * 1000:g} ms: "
              f"{k['cycles_with_slow_flush']}; p99 of the others: "
              f"{k['write_stall_ms_p99_without_slow_flush']}; the load generator's own "
              f"longest pause inside a stall: {max(k['samples_generator_pause_ms'], default=0)} ms")
        print(f"  cycles with host steal of {STEAL_MS:g} ms or more in the stall: "
              f"{k['cycles_with_host_steal']}; p99 of the others: "
              f"{k['write_stall_ms_p99_without_host_steal']}")
        print(f"  split at the restart: until it (the failover) p50 "
              f"{k['write_stall_until_restart_ms_p50']}, p99 {k['write_stall_until_restart_ms_p99']}; "
              f"from it (the failback) p50 {k['write_stall_from_restart_ms_p50']}, p99 "
              f"{k['write_stall_from_restart_ms_p99']}")
        print(f"end-to-end recovery, {kind:<7}{k['e2e_recovery_ms_p50']!s:>10}{k['e2e_recovery_ms_p99']!s:>10}"
              f"   p99 <= {TARGETS['e2e']:g} ms")
    nf = doc["no_fault"]
    print(f"write stall, no fault       {nf['write_stall_ms_p50']!s:>10}{nf['write_stall_ms_p99']!s:>10}"
          f"   the machine's floor ({nf['cycles']} windows of {nf['window_s']} s)")
    print(f"  windows with a flush over {SLOW_FLUSH_S * 1000:g} ms: "
          f"{nf['cycles_with_slow_flush']}; p99 of the others: "
          f"{nf['write_stall_ms_p99_without_slow_flush']}")
    print(f"  windows with host steal of {STEAL_MS:g} ms or more in the stall: "
          f"{nf['cycles_with_host_steal']}; p99 of the others: "
          f"{nf['write_stall_ms_p99_without_host_steal']}")
    print(f"send to delivery, no fault  {nf['delivery_ms_p50']!s:>10}{nf['delivery_ms_p99']!s:>10}"
          f"   the floor under end-to-end recovery")
    rb = doc["rebalance"]
    print(f"join to first delivery      {rb['join_to_delivery_ms_p50']!s:>10}{rb['join_to_delivery_ms_p99']!s:>10}"
          f"   p99 <= {TARGETS['join']:g} ms ({rb['joins']} joins)")
    print(f"queues moved per join: {rb['queues_moved_per_join']} (minimum {rb['queues_moved_minimum']}); "
          f"two members on one queue: {rb['two_member_violations']}; ids delivered twice: "
          f"{rb['duplicates_total']}; acknowledged and never delivered: {doc['lost_acked']}")
    for peer in ("rabbitmq", "jetstream_r3"):
        d = doc.get(peer, {})
        if "error" in d:
            print(f"{peer}: {d['error']}")
        elif d:
            ratio = (doc["kill"]["write_stall_ms_p99"] or 0) / max(d["publish_recovery_ms_p99"], 1e-9)
            print(f"{peer}: publish recovery p50 {d['publish_recovery_ms_p50']} ms, p99 "
                  f"{d['publish_recovery_ms_p99']} ms; our kill write stall p99 is {ratio:.2f}x")
    print(f"load average {doc['loadavg']}, {doc['cpus']} CPUs; the host stole "
          f"{doc['host_steal_ms_per_s']} ms of CPU a second over the cluster's run")
    write_results(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
