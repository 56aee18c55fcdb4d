"""Growth benchmark (issue 16): produce throughput and CPU per message as a cluster gets more
groups and more topics; the issue's claim is that per-message CPU stays flat within 20 %.

Why: the other benchmarks measure one group and one topic. A broker that paid per group
(route watches, the controller, more connections) or per topic (registry, per-queue
state, idempotence tables) would show it only here.

What is measured, on real local clusters (``understudy_operator.local.cluster.up``:
ZooKeeper, the brokers, the controller), synchronous replication (master + 1 slave per
group; the local cluster's brokers keep their default ``--flush batch``, so an
acknowledgement waited for an fdatasync on master and slave), 1 KiB messages, and
bench/broker.py's producer settings (``understudy_produce``: a 256-message window, batches
of ``--batch-size`` 128, linger 1 ms, the Producer's other defaults):

1. **groups**: 1, 2 and 4 groups (``--groups``), one cluster topic over all of them with 8
   queues per group (placement interleaves the groups, and the producer's unkeyed sends go
   round-robin over the queues). Total msg/s, msg/s per group (acknowledgements whose queue
   lives on the group / the run's seconds), ack p50/p99, server CPU us per message (the
   utime + stime of every broker over the run / messages; ZooKeeper and the controller are
   not counted), server CPU per group (its master + slave / its messages), client CPU us per
   message (this process).
2. **groups, the same load per group** (``--skip-same-load`` leaves it out): the groups
   of part 1 again, but the producer's window and in-flight batches grow with the groups
   (256 messages and 8 batches per group), so each group gets the load one group gets in
   part 1, and requests keep their size. Part 1 asks what a fixed load costs as it is
   spread over more groups (its requests shrink); this part asks what the brokers cost
   per message as groups are added at the same load each, which is what a broker paying
   per group would show.
3. **topics**: 1, 10 and 100 topics x 8 queues (``--topics``) on a **one-group** cluster, the
   same total message count sent round-robin over the topics by one Producer. One group,
   not the 4-group cluster: part 1 already moves the group count, so holding it at 1 leaves
   the topic count the only variable; 100 topics x 8 queues on 4 groups would also split
   each topic's batches four ways (the producer batches per topic and group), and on this
   machine 4 groups are 8 brokers on 2 cores, whose scheduling noise would hide a 20 %
   effect.

Every row is the median of ``--repeat`` runs (each figure its own median; every run's msg/s
and server CPU are kept under ``*_all``). A row has its own fresh cluster and topics, made
before its first run; the repeats reuse them. Each run first sends one message per queue of
every topic and awaits them (routes learned, connections open, topics adopted by every
broker) before the clock and the CPU meter start. Each table gives the per-message server
CPU relative to its first row and says whether every row is within 20 % of it.

Also per row, as evidence of what grows: produce requests (the masters' produce-latency
histogram count on /metrics) and fdatasyncs (every broker's log-flush count) per 1000
messages, so messages per request (the batch the broker actually got) can be read next to
the CPU; and the brokers' CPU while idle (``IDLE_S`` = 2 s after the warm-up, before the
clock: ZooKeeper sessions, route watches, timers), in ms per second and as us per message at
the row's rate: a cost per group and second, not per message, that counts more the slower
the run.

Biases, so the figures are read correctly:

* 2 cores: 4 groups are 8 brokers, a ZooKeeper, the controller and this client sharing
  them, so total msg/s cannot scale with groups here and msg/s per group falls. CPU per
  message is the figure; msg/s moves with other people's load (the load average at start
  and end is printed and stored).
* The producer batches per (topic, group) and a PRODUCE request carries one topic, while
  the window (256 messages) and the in-flight batches (4 per group, 8 in all) are shared.
  With T topics round-robin, a batch holds at most about 256 / T messages, closed by the
  1 ms linger, against up to 128 with one topic. In practice far fewer: a batch is closed
  (at its linger) before it gets one of its group's 4 in-flight slots, and batches waiting
  for a slot never merge, so once acknowledgements come back a few at a time the window
  refills a few messages at a time, spread over T topics, and requests stay at 1-2
  messages (10 topics, development run: 828 requests per 1000 messages). What costs per
  request then counts per message: a rise with T is mostly this client behaviour, which the
  requests-per-1000 column shows, not a per-topic cost in the broker.
* The first run of a fresh cluster may still see the brokers' start-up work (the log's
  recovery point, ZooKeeper watches settling); the median of 3 discounts one such run.

Writes ``bench-results/growth.json``: ``groups``, ``groups_same_load`` and ``topics``
(lists of rows; a row of the second also has its ``window`` and ``max_in_flight``),
``cpu_flat_groups``, ``cpu_flat_groups_same_load`` and ``cpu_flat_topics`` (every row's
server CPU per message within 20 % of the first row's), the load average at start and end,
and the settings. No assertions:
a measurement, not a test. Every process is stopped by its recorded PID (``local down``)
after each row, also on an error, Ctrl-C or SIGTERM.

Usage: ``python bench/growth.py [--count 30000] [--repeat 3] [--batch-size 128]
[--groups 1,2,4] [--topics 1,10,100] [--skip-groups] [--skip-same-load] [--skip-topics]
[--keep]
[--out bench-results/growth.json]``; a quick look: ``--count 3000 --repeat 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import end_on_sigterm, signals_deferred
from broker import BODY, WINDOW, CpuMeter, console, cpu_seconds, summarize, wait_slave
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from understudy_broker import metric_names as names
from understudy_broker import protocol as p
from understudy_broker.admin import admin_topic
from understudy_broker.client import DEFAULT_MAX_IN_FLIGHT, Producer
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs as lprocs
from understudy_operator.local.plan import STATE_FILE, ClusterPlan

QUEUES = 8  # per group (parts 1 and 2), per topic (part 3)
FLAT = 0.20  # the bound on the growth of CPU per message
#: Per-run figures reported as the median of the repeats.
FIGURES = ("produce_msgs_per_s", "produce_ack_p50_ms", "produce_ack_p99_ms",
           "server_cpu_us_per_msg", "client_cpu_us_per_msg",
           "produce_requests_per_1000_msgs", "flushes_per_1000_msgs",
           "idle_server_cpu_ms_per_s", "idle_server_cpu_us_per_msg_at_this_rate")
#: Seconds the brokers are watched idle before each run (after its warm-up).
IDLE_S = 2.0


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of counts: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("counts must be positive")
    return counts


def broker_counters(plan: ClusterPlan) -> tuple[float, float]:
    """(produce requests, log flushes) so far, summed over the brokers' /metrics."""
    wanted = {f"{names.PRODUCE_LATENCY_SECONDS}_count": 0, names.LOG_FLUSHES_TOTAL: 1}
    sums = [0.0, 0.0]
    for broker in plan.brokers:
        text = None if broker.http_port is None else lc.http_get(broker.http_port, "/metrics",
                                                                 timeout=2)
        if text is None:
            raise RuntimeError(f"broker {broker.name} does not answer /metrics")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    sums[wanted[sample.name]] += sample.value
    return sums[0], sums[1]


class Run:
    """One timed run: warm-up, then meters on, then ``n`` round-robin sends."""

    def __init__(self, plan: ClusterPlan, topics: list[str], queues: int, n: int,
                 batch_size: int, load_per_group: bool = False) -> None:
        self.plan, self.topics, self.queues = plan, topics, queues
        self.n, self.batch_size = n, batch_size
        scale = len(plan.groups) if load_per_group else 1
        self.window = WINDOW * scale
        self.max_in_flight = DEFAULT_MAX_IN_FLIGHT * scale
        self.boot = [g.master.address for g in plan.groups]
        self.pids = broker_pids(plan)
        self.lat: list[float] = []
        self.per_group: collections.Counter[str] = collections.Counter()

    async def send_all(self, prod: Producer) -> float:
        window = asyncio.Semaphore(self.window)
        router = prod.router

        def acked(f: asyncio.Future[tuple[int, int]], topic: str, sent: float) -> None:
            window.release()
            if not f.cancelled() and f.exception() is None:
                self.lat.append(time.perf_counter() - sent)
                self.per_group[router.group_of(topic, f.result()[0]) or "?"] += 1

        started = time.perf_counter()
        for i in range(self.n):
            topic = self.topics[i % len(self.topics)]
            await window.acquire()
            sent = time.perf_counter()
            fut = await prod.send(topic, BODY)
            fut.add_done_callback(functools.partial(acked, topic=topic, sent=sent))
        await prod.flush()
        return time.perf_counter() - started

    async def measure(self) -> dict[str, Any]:
        async with Producer(self.boot, batch_size=self.batch_size, linger_ms=1,
                            max_in_flight=self.max_in_flight) as prod:
            # one per queue (unkeyed sends go round-robin over them): every connection open,
            # every topic adopted by its brokers, before the clock and the meters start
            warm = [await prod.send(t, b"warm-up") for t in self.topics for _ in range(self.queues)]
            await asyncio.gather(*warm)
            idle = CpuMeter(self.pids)
            await asyncio.sleep(IDLE_S)
            idle_ms_per_s = sum(cpu_seconds(pid) - c0 for pid, c0 in
                                zip(idle.pids, idle.servers0, strict=True)) / IDLE_S * 1000
            requests0, flushes0 = await asyncio.to_thread(broker_counters, self.plan)
            meter = CpuMeter(self.pids)
            group_meters = {g.group: CpuMeter(self.pids_of(g.group)) for g in self.plan.groups}
            seconds = await self.send_all(prod)
            figures = {**summarize("run", self.n, seconds, self.lat),
                       **meter.per_message("run", self.n)}
            group_cpu = {g: m.per_message("run", max(1, self.per_group[g]))["run_server_cpu_us_per_msg"]
                         for g, m in group_meters.items()}
        requests, flushes = await asyncio.to_thread(broker_counters, self.plan)
        if len(self.lat) != self.n:
            raise RuntimeError(f"acknowledged {len(self.lat)} of {self.n}")
        out: dict[str, Any] = {k.removeprefix("run_"): v for k, v in figures.items()
                               if not k.startswith(("run_master", "run_slave"))}
        out["produce_requests_per_1000_msgs"] = round((requests - requests0) / self.n * 1000, 1)
        out["flushes_per_1000_msgs"] = round((flushes - flushes0) / self.n * 1000, 1)
        out["idle_server_cpu_ms_per_s"] = round(idle_ms_per_s, 1)
        out["idle_server_cpu_us_per_msg_at_this_rate"] = round(
            idle_ms_per_s * 1000 / out["produce_msgs_per_s"], 1)
        out["per_group_msgs_per_s"] = {g: round(self.per_group[g] / seconds, 1)
                                       for g in group_meters}
        out["per_group_server_cpu_us_per_msg"] = group_cpu
        return out

    def pids_of(self, group: str) -> list[int]:
        return [pid for b, pid in zip(self.plan.brokers, self.pids, strict=True) if b.group == group]


def broker_pids(plan: ClusterPlan) -> list[int]:
    """Every broker's PID, in ``plan.brokers`` order (each group's master, then its slave)."""
    pids = [lprocs.read_pid(plan.pid_dir, b.name) for b in plan.brokers]
    missing = [b.name for b, pid in zip(plan.brokers, pids, strict=True) if pid is None]
    if missing:
        raise RuntimeError(f"no pid file for {', '.join(missing)}")
    return [pid for pid in pids if pid is not None]


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs (per group too), and every run's msg/s and
    server CPU per message."""
    row: dict[str, Any] = {f: round(statistics.median(r[f] for r in runs), 1) for f in FIGURES}
    for key in ("per_group_msgs_per_s", "per_group_server_cpu_us_per_msg"):
        row[key] = {g: round(statistics.median(r[key][g] for r in runs), 1) for g in runs[0][key]}
    if len(runs) > 1:
        for f in ("produce_msgs_per_s", "server_cpu_us_per_msg"):
            row[f"{f}_all"] = [r[f] for r in runs]
    return row


def measure_row(directory: Path, *, groups: int, topics: int, n: int, repeat: int,
                batch_size: int, load_per_group: bool = False) -> dict[str, Any]:
    """A fresh cluster of ``groups`` groups and ``topics`` cluster topics (8 queues per
    group for one topic over several groups, 8 per topic on one group), ``repeat`` runs of
    ``n`` messages, the row; the cluster is stopped by its recorded PIDs before this
    returns or raises."""
    try:
        console.print(f"[bold]growth[/] {groups} group(s), {topics} topic(s): starting the cluster ...")
        plan = lc.up(directory, groups=groups, slaves=1)
        group_names = [g.group for g in plan.groups]
        boot = [g.master.address for g in plan.groups]
        names_ = [f"growth-{i}" for i in range(topics)]
        per_group = QUEUES if topics == 1 else max(1, QUEUES // groups)
        queues = per_group * groups  # per topic

        async def prepare() -> None:
            for address in boot:  # every group's slave in sync before a timed sync produce
                await wait_slave(address)
            for topic in names_:
                await admin_topic(boot, p.AdminTopicRequest("create", topic, group_names, per_group))

        asyncio.run(prepare())
        runs = []
        for i in range(repeat):
            timed = Run(plan, names_, queues, n, batch_size, load_per_group)
            run = asyncio.run(timed.measure())
            console.print(f"  run {i + 1}/{repeat}: {run['produce_msgs_per_s']:,.0f} msg/s, server "
                          f"{run['server_cpu_us_per_msg']:.0f} us/msg, client "
                          f"{run['client_cpu_us_per_msg']:.0f} us/msg, "
                          f"{run['produce_requests_per_1000_msgs']:.0f} requests / 1000 msgs")
            runs.append(run)
        row = {"groups": groups, "topics": topics, "queues": queues * topics,
               **median_row(runs)}
        if load_per_group:
            row.update(window=timed.window, max_in_flight=timed.max_in_flight)
        return row
    finally:
        if (directory / STATE_FILE).exists():
            with signals_deferred():
                lc.down(directory)


def add_relative(rows: list[dict[str, Any]]) -> bool:
    """Each row's server (and server + client) CPU per message relative to the first row's;
    whether every row's server figure is within ``FLAT`` of it."""
    if not rows:
        return False
    base = rows[0]
    for row in rows:
        row["server_cpu_relative"] = round(row["server_cpu_us_per_msg"] / base["server_cpu_us_per_msg"], 2)
        row["total_cpu_relative"] = round(
            (row["server_cpu_us_per_msg"] + row["client_cpu_us_per_msg"])
            / (base["server_cpu_us_per_msg"] + base["client_cpu_us_per_msg"]), 2)
    return all(abs(row["server_cpu_us_per_msg"] / base["server_cpu_us_per_msg"] - 1) <= FLAT
               for row in rows)


def print_part(out: Console, title: str, rows: list[dict[str, Any]], flat: bool, *,
               by: str) -> None:
    if not rows:
        return
    table = Table(title=title)
    for col in (by, "queues", "produce\nmsg/s", "msg/s per group", "ack p99\nms",
                "server CPU\nus/msg", "relative", "client CPU\nus/msg", "server+client\nrelative",
                "requests\n/1000 msgs", "fsyncs\n/1000 msgs", "idle server\nCPU ms/s"):
        table.add_column(col, justify="right")
    for row in rows:
        per_group = " · ".join(f"{v:,.0f}" for v in row["per_group_msgs_per_s"].values())
        table.add_row(str(row[by]), str(row["queues"]), f"{row['produce_msgs_per_s']:,.0f}",
                      per_group, f"{row['produce_ack_p99_ms']:.1f}",
                      f"{row['server_cpu_us_per_msg']:.0f}", f"{row['server_cpu_relative']:.2f}",
                      f"{row['client_cpu_us_per_msg']:.0f}", f"{row['total_cpu_relative']:.2f}",
                      f"{row['produce_requests_per_1000_msgs']:.0f}",
                      f"{row['flushes_per_1000_msgs']:.0f}",
                      f"{row['idle_server_cpu_ms_per_s']:.0f}")
    out.print(table)
    out.print(f"  server CPU per message flat within {FLAT:.0%} of the first row: "
              f"{'yes' if flat else 'no'}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30_000, help="messages per run (default 30000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; medians (default 3)")
    ap.add_argument("--batch-size", type=int, default=128,
                    help="producer batch size, as bench/broker.py; the window stays 256 (default 128)")
    ap.add_argument("--groups", type=parse_counts, default=parse_counts("1,2,4"),
                    help="group counts of part 1 (default 1,2,4)")
    ap.add_argument("--topics", type=parse_counts, default=parse_counts("1,10,100"),
                    help="topic counts of part 2, one group (default 1,10,100)")
    ap.add_argument("--skip-groups", action="store_true")
    ap.add_argument("--skip-same-load", action="store_true",
                    help="skip part 2: the groups with the same load per group")
    ap.add_argument("--skip-topics", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' directories")
    ap.add_argument("--out", type=Path, default=Path("bench-results/growth.json"))
    args = ap.parse_args(argv)
    if args.count < 1 or args.repeat < 1 or args.batch_size < 1:
        ap.error("--count, --repeat and --batch-size must be positive")
    logging.basicConfig(level=logging.WARNING)
    end_on_sigterm()  # SIGTERM too goes through the finally blocks: every cluster stopped
    doc: dict[str, Any] = {
        "count": args.count, "repeat": args.repeat, "body_bytes": len(BODY), "window": WINDOW,
        "batch_size": args.batch_size, "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "setup": "local cluster (ZooKeeper, controller), master + 1 slave per group, sync "
                 "replication, flush batch; groups: one topic, 8 queues per group; topics: "
                 "one group, 8 queues per topic, sends round-robin over the topics",
    }
    root = Path(tempfile.mkdtemp(prefix="understudy-bench-growth-"))
    try:
        doc["groups"] = [] if args.skip_groups else [
            measure_row(root / f"g{g}", groups=g, topics=1, n=args.count, repeat=args.repeat,
                        batch_size=args.batch_size) for g in args.groups]
        doc["groups_same_load"] = [] if args.skip_same_load else [
            measure_row(root / f"s{g}", groups=g, topics=1, n=args.count * g, repeat=args.repeat,
                        batch_size=args.batch_size, load_per_group=True) for g in args.groups]
        doc["topics"] = [] if args.skip_topics else [
            measure_row(root / f"t{t}", groups=1, topics=t, n=args.count, repeat=args.repeat,
                        batch_size=args.batch_size) for t in args.topics]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    doc["cpu_flat_groups"] = add_relative(doc["groups"])
    doc["cpu_flat_groups_same_load"] = add_relative(doc["groups_same_load"])
    doc["cpu_flat_topics"] = add_relative(doc["topics"])
    doc["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    out = Console(width=None if sys.stdout.isatty() else 150)
    print_part(out, f"groups: one topic, {QUEUES} queues per group, {args.count:,} x 1 KiB, "
               f"window {WINDOW}, batches of {args.batch_size}", doc["groups"],
               doc["cpu_flat_groups"], by="groups")
    print_part(out, f"groups, the same load per group: window {WINDOW} and {DEFAULT_MAX_IN_FLIGHT} "
               f"batches in flight per group, {args.count:,} x 1 KiB per group",
               doc["groups_same_load"], doc["cpu_flat_groups_same_load"], by="groups")
    print_part(out, f"topics: one group, {QUEUES} queues per topic, {args.count:,} x 1 KiB "
               f"round-robin over the topics", doc["topics"], doc["cpu_flat_topics"], by="topics")
    out.print(f"load average (1, 5, 15 min) {doc['loadavg_start']} -> {doc['loadavg_end']} on "
              f"{doc['cpus']} cpus; relative = this row's CPU per message / the first row's; "
              f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
