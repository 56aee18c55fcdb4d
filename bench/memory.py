"""Benchmark: a broker's memory as queues and consumer groups grow (issue 16).

Why this exists: issue 16 asks for "broker memory with 10k queues and 1k consumer groups:
printed, bounded, documented". A broker keeps per-queue state (an index object with its
entries mirrored in memory and an open file descriptor, its place in the cluster view)
and per-consumer-group state (offsets, the group's ZooKeeper watches and cache, hosted
members, metric series), so its footprint is a function of both counts. This measures
that function on real processes and says which parts have a limit and which do not.

What runs: one local cluster (ZooKeeper, one group of a master ``g1-0`` and a slave
``g1-1``, the controller: ``understudy_operator.local.cluster.up(dir, groups=1,
slaves=1)``). Then, step by step:

1. **queues** (``--queues``, default 1,000 then 10,000): cluster topics of
   ``--queues-per-topic`` (8) queues on ``g1`` are created through the admin path that
   ``understudy topic create --groups g1 --queues-per-group 8`` takes
   (:func:`understudy_broker.admin.admin_topic`, ADMIN_TOPIC: the topic is written to
   ZooKeeper and every broker learns it by watch), ``--concurrency`` requests at a time.
   The brokers are measured once the topics exist (``created``), then again after one
   message was produced into every queue with the product's ``Producer`` (``written``),
   which makes the broker create the queue's index file and keep it open;
2. **consumer groups** (``--groups``, default 100 then 1,000), with all the queues above:
   each group has one member that joins over the wire with the membership API
   (MEMBER_HEARTBEAT with ``join``, on one shared client connection, session timeout
   600 s so no heartbeat is needed while the step is measured), subscribes to one topic
   (groups spread over the topics round-robin), is assigned its queues, and commits
   offset 1 on every queue it owns (COMMIT_OFFSET with its member id and generation), so
   the brokers hold offsets for the group. Measured with the members **live**; after the
   last step every member leaves (LEAVE_GROUP) and the brokers are measured again
   (``left``: the offsets and the groups' ZooKeeper nodes stay).

Each measurement waits ``--settle-s`` (the brokers' own collector and allocator settle;
nothing is forced in them), then reads, for master and slave: RSS (``VmRSS``), PSS and
USS (``Private_Clean + Private_Dirty``) from ``/proc/<pid>/smaps_rollup`` when readable,
open file descriptors (``/proc/<pid>/fd``), the data directory's size on disk (blocks)
and the size of the master's ``/metrics`` answer; ZooKeeper's RSS is recorded too.

How to read it: ``rss_bytes_per_queue`` is the slope of the master's RSS between the
last two ``written`` queue steps, divided by the queues added (what one more queue with
one message costs); ``rss_bytes_per_consumer_group`` is the slope between the last two
live consumer-group steps. Slopes under a few hundred bytes are within the noise of the
allocator (RSS moves in pages and arenas); the descriptor count is exact. The bounds
table printed at the end says what limits each part, from the code (file:function).

What is bounded and what is not (from the code; the run prints this table too):

- index entries in memory: **per retained record, 16 bytes** (``storage/index.py:
  QueueIndex`` mirrors ``phys`` and ``sizes`` arrays). Bounded only by retention
  (``CommitLog.apply_retention`` → ``QueueIndex.drop_before_phys``). The one release of
  index memory, ``CommitLog.release_index_memory`` → ``QueueIndex.release_before``, is
  used for two internal queues only (``server/scheduler.py`` for the schedule topic,
  ``server/producers.py`` for the producer records); client queues keep every retained
  entry in memory;
- file descriptors: **at most ``--index-open-files`` (512) index files open**, shared by
  every queue (``storage/index.py:OpenFiles``, least recently used closed first), plus
  one per segment (``storage/commitlog.py:CommitLog._read_fd``, dropped by retention).
  The file limit a broker asks for is ``server/limits.py:nofile_wanted`` =
  ``max_connections`` + ``fd_reserve`` (the index files + 512), and
  ``max_connections_for`` leaves that reserve to storage. Nothing bounds the number of
  queues; beyond 512 written queues a write to a queue whose file is closed reopens it;
- consumer groups: nothing is evicted. ``storage/offsets.py:OffsetStore`` keeps every
  (group, topic, queue) offset ever committed (only an admin reset changes one; no
  expiry of a group's offsets), and the whole file is rewritten on each persist
  (``OffsetStore._encode``: O(all offsets) per persist); ``ha/membership.py:Membership``
  keeps a ``_Group`` with two ZooKeeper watches for every group it has served
  (``Membership._group``; never removed), ``_known`` keeps every (group, member) it ever
  read (``Membership._member_topics``; never pruned), ``_last_written``,
  ``_rebalancing`` and ``_ghosts`` keep an entry per group; ``server/metrics.py:
  Metrics.rebalanced`` adds a labelled counter per consumer group that is never removed,
  and ``Metrics.consumer_lag`` one gauge per (topic, queue, group) with offsets (removed
  only when the offsets go, which they do not);
- bounded: client connections (``server/limits.py:max_connections_for``), request
  memory (``limits.py:RequestMemory``), hosted members (expired after their session
  timeout by ``Membership._expiry_loop``), segment read descriptors (by retention).

Prints a table and writes ``bench-results/memory.json`` (``steps``: one dict per
measurement; ``rss_bytes_per_queue``, ``rss_bytes_per_consumer_group``,
``master_rss_mb_at_10k_queues_1k_groups``, ``fds_at_10k_queues``, ``bounds``, the load
average). No assertions: the tests assert.

    python bench/memory.py                                    # what `make bench` runs
    python bench/memory.py --queues 1000,5000 --groups 100,500  # a quicker look
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import pathlib
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from benchlib import cluster_directory, machine_figures, run_on_uvloop, write_results
from rich.console import Console
from rich.table import Table

from understudy_broker import protocol as p
from understudy_broker.admin import admin_topic
from understudy_broker.client import BrokerError, Producer, Router
from understudy_broker.model import Permission
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs as lprocs
from understudy_operator.local.plan import ClusterPlan

T = TypeVar("T")
MASTER, SLAVE = "g1-0", "g1-1"
SESSION_MS = 600_000  # the protocol's maximum: members need no heartbeat while measured
_out = Console(width=max(Console().width, 140))

#: What bounds each part of a broker's memory, from the code (printed and in the JSON).
BOUNDS: list[dict[str, str]] = [
    {"what": "index entries in memory (16 B per retained record)", "bounded": "by retention only",
     "evidence": "storage/index.py:QueueIndex (phys + sizes arrays); "
                 "storage/commitlog.py:release_index_memory is called only by "
                 "server/scheduler.py and server/producers.py (internal queues)"},
    {"what": "index file descriptors", "bounded": "yes: --index-open-files (512)",
     "evidence": "storage/index.py:OpenFiles (least recently used closed first), shared by "
                 "every QueueIndex of the log; server/limits.py:fd_reserve keeps them from "
                 "the client connections"},
    {"what": "segment read descriptors", "bounded": "by retention",
     "evidence": "storage/commitlog.py:CommitLog._read_fd, popped when a segment is deleted"},
    {"what": "committed offsets per (group, topic, queue)", "bounded": "no (no expiry)",
     "evidence": "storage/offsets.py:OffsetStore.commit; only reset() changes one; "
                 "_encode rewrites every offset on each persist"},
    {"what": "consumer-group cache and ZooKeeper watches", "bounded": "no (never dropped)",
     "evidence": "ha/membership.py:Membership._group adds to _groups; _member_topics adds "
                 "to _known; _last_written, _rebalancing, _ghosts keyed per group"},
    {"what": "per-group metric series", "bounded": "no",
     "evidence": "server/metrics.py:Metrics.rebalanced (counter per group, never removed); "
                 "Metrics.consumer_lag (gauge per topic, queue, group with offsets)"},
    {"what": "hosted members", "bounded": "yes: session timeout",
     "evidence": "ha/membership.py:Membership._expiry_loop"},
    {"what": "client connections, request memory", "bounded": "yes",
     "evidence": "server/limits.py:max_connections_for, RequestMemory"},
]


# --------------------------------------------------------------------------- measuring


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _rollup_kb(pid: int) -> dict[str, int]:
    """Fields of ``/proc/<pid>/smaps_rollup`` in kB (empty when it cannot be read)."""
    out: dict[str, int] = {}
    try:
        text = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-1] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1])
    return out


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _disk_bytes(path: pathlib.Path) -> tuple[int, int, int]:
    """(bytes on disk, apparent bytes, index files) under ``path``."""
    blocks = apparent = indexes = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            blocks += st.st_blocks * 512
            apparent += st.st_size
            if f"{os.sep}index{os.sep}" in root + os.sep:
                indexes += 1
    return blocks, apparent, indexes


def _process(pid: int, data: pathlib.Path | None) -> dict[str, Any]:
    roll = _rollup_kb(pid)
    rss = _status_kb(pid, "VmRSS")
    out: dict[str, Any] = {
        "pid": pid,
        "rss_mb": None if rss is None else round(rss / 1024, 2),
        "pss_mb": round(roll["Pss"] / 1024, 2) if "Pss" in roll else None,
        "uss_mb": (round((roll.get("Private_Clean", 0) + roll.get("Private_Dirty", 0)) / 1024, 2)
                   if "Private_Dirty" in roll else None),
        "fds": _fds(pid),
    }
    if data is not None:
        disk, apparent, indexes = _disk_bytes(data)
        out.update(data_dir_mb=round(disk / 1e6, 2), data_dir_apparent_mb=round(apparent / 1e6, 2),
                   index_files=indexes)
    return out


@dataclass
class Cluster:
    plan: ClusterPlan
    boot: list[str]
    pids: dict[str, int]
    data: dict[str, pathlib.Path]
    metrics_port: int | None


def _cluster(plan: ClusterPlan) -> Cluster:
    pids: dict[str, int] = {}
    for name in (MASTER, SLAVE, *(n.name for n in plan.zk_nodes)):
        pid = lprocs.read_pid(plan.pid_dir, name)
        if pid is None:
            raise RuntimeError(f"the local cluster recorded no pid for {name}")
        pids[name] = pid
    data = {b: plan.dir / "data" / b for b in (MASTER, SLAVE)}
    return Cluster(plan, [plan.address(MASTER), plan.address(SLAVE)], pids, data,
                   plan.process(MASTER).http_port)


async def measure(c: Cluster, label: str, queues: int, groups: int, members: str,
                  settle_s: float) -> dict[str, Any]:
    """One step: wait ``settle_s``, then three readings 1 s apart; the last is kept (the
    first two only say whether RSS still moved: ``rss_moving_mb``)."""
    await asyncio.sleep(settle_s)
    readings = []
    for _ in range(3):
        readings.append(await asyncio.to_thread(_process, c.pids[MASTER], None))
        await asyncio.sleep(1.0)
    master = await asyncio.to_thread(_process, c.pids[MASTER], c.data[MASTER])
    slave = await asyncio.to_thread(_process, c.pids[SLAVE], c.data[SLAVE])
    zk_name = c.plan.zk_nodes[0].name
    zk_rss = _status_kb(c.pids[zk_name], "VmRSS")
    metrics = None
    if c.metrics_port is not None:
        text = await asyncio.to_thread(lc.http_get, c.metrics_port, "/metrics", timeout=10)
        metrics = None if text is None else len(text.encode())
    rss = [r["rss_mb"] for r in readings if r["rss_mb"] is not None]
    load = [round(x, 2) for x in os.getloadavg()]
    step: dict[str, Any] = {"step": label, "queues": queues, "consumer_groups": groups, "members": members,
            "master": master, "slave": slave,
            "rss_moving_mb": round(max(rss) - min(rss), 2) if rss else None,
            "zookeeper_rss_mb": None if zk_rss is None else round(zk_rss / 1024, 1),
            "master_metrics_bytes": metrics,
            "loadavg": load}
    _out.print(f"  [bold]{label}[/]: master RSS {master['rss_mb']} MB, {master['fds']} fds; "
               f"slave RSS {slave['rss_mb']} MB, {slave['fds']} fds; load "
               f"{load[0]}")
    return step


# --------------------------------------------------------------------------- the load


async def _bounded(items: Sequence[T], concurrency: int, work: Callable[[T], Awaitable[None]],
                   what: str) -> None:
    """``work(item)`` for every item, ``concurrency`` at a time; progress every 10%."""
    slots = asyncio.Semaphore(concurrency)
    done = 0
    every = max(1, len(items) // 10)
    started = time.monotonic()

    async def one(item: T) -> None:
        nonlocal done
        async with slots:
            await work(item)
        done += 1
        if done % every == 0 or done == len(items):
            _out.print(f"    {what}: {done:,}/{len(items):,} "
                       f"({time.monotonic() - started:.1f} s)")

    await asyncio.gather(*(one(i) for i in items))


RETRIES: dict[str, int] = {}  # what was retried, by error: the run reports it


async def _retrying(call: Callable[[], Awaitable[T]], tries: int = 12) -> T:
    """``call()``, retried on errors (a slave out of the in-sync set refuses a commit with
    NOT_ENOUGH_REPLICAS until it catches up): up to ``tries`` times, 0.2 s to 2 s apart."""
    for attempt in range(tries):
        try:
            return await call()
        except (BrokerError, ConnectionError, OSError, TimeoutError) as exc:
            what = (p.Status(exc.status).name if isinstance(exc, BrokerError)
                    and exc.status in p.Status._value2member_map_ else type(exc).__name__)
            RETRIES[what] = RETRIES.get(what, 0) + 1
            if attempt == tries - 1:
                raise
            await asyncio.sleep(min(2.0, 0.2 * (attempt + 1)))
    raise AssertionError("unreachable")


def topic_name(i: int) -> str:
    return f"mem-{i:05d}"


async def create_topics(c: Cluster, first: int, last: int, per_topic: int,
                        concurrency: int) -> None:
    async def create(i: int) -> None:
        req = p.AdminTopicRequest("create", topic_name(i), ["g1"], per_topic)
        await _retrying(lambda: admin_topic(c.boot, req))

    await _bounded(range(first, last), concurrency, create, "topics created")


async def write_one_each(c: Cluster, first: int, last: int, per_topic: int,
                         concurrency: int) -> None:
    """One message into every queue of topics ``[first, last)``, acknowledged."""
    async with Producer(c.boot, linger_ms=1) as prod:
        async def write(i: int) -> None:
            futs = [await prod.send(topic_name(i), b"m", queue=q) for q in range(per_topic)]
            await asyncio.gather(*futs)

        await _bounded(range(first, last), concurrency, write, "topics written")


@dataclass
class Member:
    cgroup: str
    member: str
    topic: str


async def join_and_commit(router: Router, m: Member) -> None:
    """Join ``m`` (membership API over the wire), then commit offset 1 on every queue it
    owns; a new group's only member gets every free queue at once, else it asks again."""
    owned: Sequence[tuple[str, int]] = ()
    generation = -1
    join = True
    for _ in range(20):
        req = p.MemberHeartbeatRequest(m.cgroup, m.member, [m.topic], SESSION_MS, join=join,
                                       generation=generation)
        resp = p.MemberHeartbeatResponse.decode(await _retrying(functools.partial(
            router.request, Permission.NONE, p.Op.MEMBER_HEARTBEAT, req.encode())))
        join = False
        owned, generation = resp.owned, resp.generation
        if owned:
            break
        await asyncio.sleep(0.2)
    offsets = {q: 1 for t, q in owned if t == m.topic}
    if not offsets:
        raise RuntimeError(f"{m.cgroup}/{m.member} was assigned nothing on {m.topic}")
    body = p.CommitOffsetRequest(m.cgroup, m.topic, offsets, m.member, generation).encode()
    await _retrying(lambda: router.request(Permission.READ, p.Op.COMMIT_OFFSET, body))


async def leave(router: Router, m: Member) -> None:
    body = p.LeaveGroupRequest(m.cgroup, m.member).encode()
    await _retrying(lambda: router.request(Permission.NONE, p.Op.LEAVE_GROUP, body))


# --------------------------------------------------------------------------- the run


async def run(args: argparse.Namespace, directory: pathlib.Path) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    doc: dict[str, Any] = {"steps": steps, "timings_s": timings,
                           "queues_per_topic": args.queues_per_topic, "errors": [],
                           "retried": RETRIES}
    try:
        await _steps(args, directory, steps, timings)
    except Exception as exc:  # the steps measured so far are still worth writing
        _out.print(f"[red]stopped early: {exc!r}[/]")
        doc["errors"].append(repr(exc))
    return doc


async def _steps(args: argparse.Namespace, directory: pathlib.Path,
                 steps: list[dict[str, Any]], timings: dict[str, float]) -> None:
    _out.print("starting a local cluster: ZooKeeper, g1-0 (master), g1-1 (slave), controller")
    plan = await asyncio.to_thread(lc.up, directory, groups=1, slaves=1)
    c = _cluster(plan)
    per = args.queues_per_topic
    steps.append(await measure(c, "empty", 0, 0, "-", args.settle_s))
    topics = 0
    for target in args.queues:
        want = -(-target // per)  # topics, rounded up
        if want <= topics:
            continue
        _out.print(f"[bold]{want * per:,} queues[/]: creating topics {topics:,}..{want - 1:,} "
                   f"({per} queues each, {args.concurrency} requests at a time)")
        t0 = time.monotonic()
        await create_topics(c, topics, want, per, args.concurrency)
        timings[f"create_{want * per}_s"] = round(time.monotonic() - t0, 1)
        steps.append(await measure(c, f"{want * per:,} queues created", want * per, 0, "-",
                                   args.settle_s))
        t0 = time.monotonic()
        await write_one_each(c, topics, want, per, args.concurrency)
        timings[f"write_{want * per}_s"] = round(time.monotonic() - t0, 1)
        topics = want
        steps.append(await measure(c, f"{topics * per:,} queues written", topics * per, 0, "-",
                                   args.settle_s))
    members: list[Member] = []
    router = Router(c.boot)
    try:
        await router.refresh()
        for target in args.groups:
            if target <= len(members):
                continue
            new = [Member(f"mem-cg-{i:05d}", f"m-{i:05d}", topic_name(i % max(topics, 1)))
                   for i in range(len(members), target)]
            _out.print(f"[bold]{target:,} consumer groups[/]: {len(new):,} members join and "
                       f"commit ({args.concurrency} at a time)")
            t0 = time.monotonic()
            await _bounded(new, args.concurrency, lambda m: join_and_commit(router, m),
                           "groups joined and committed")
            timings[f"join_{target}_s"] = round(time.monotonic() - t0, 1)
            members += new
            steps.append(await measure(c, f"{target:,} groups, members live", topics * per,
                                       target, "live", args.settle_s))
        if members:
            _out.print(f"[bold]{len(members):,} members leave[/] (offsets and groups stay)")
            await _bounded(members, args.concurrency, lambda m: leave(router, m), "members left")
            steps.append(await measure(c, f"{len(members):,} groups, members left", topics * per,
                                       len(members), "left", args.settle_s))
    finally:
        await router.close()


def _slope(steps: list[dict[str, Any]], key: str, pick: Callable[[dict[str, Any]], bool]
           ) -> tuple[float | None, str]:
    """Bytes of master RSS per unit of ``key`` between the last two steps ``pick`` keeps."""
    kept = [s for s in steps if pick(s) and s["master"]["rss_mb"] is not None]
    if len(kept) < 2 or kept[-1][key] == kept[-2][key]:
        return None, "not enough steps"
    a, b = kept[-2], kept[-1]
    per = (b["master"]["rss_mb"] - a["master"]["rss_mb"]) * (1 << 20) / (b[key] - a[key])
    return round(per), f"{a['step']} -> {b['step']}"


def summarize(doc: dict[str, Any]) -> None:
    steps = doc["steps"]
    doc["rss_bytes_per_queue"], doc["rss_bytes_per_queue_between"] = _slope(
        steps, "queues", lambda s: s["step"] == "empty" or s["step"].endswith("written"))
    doc["rss_bytes_per_consumer_group"], doc["rss_bytes_per_consumer_group_between"] = _slope(
        steps, "consumer_groups", lambda s: s["members"] == "live")
    slave = [s for s in steps if s["step"] == "empty" or s["step"].endswith("written")]
    if len(slave) >= 2 and slave[-1]["queues"] != slave[-2]["queues"]:
        a, b = slave[-2], slave[-1]
        doc["slave_rss_bytes_per_queue"] = round(
            (b["slave"]["rss_mb"] - a["slave"]["rss_mb"]) * (1 << 20) / (b["queues"] - a["queues"]))
    live = [s for s in steps if s["members"] == "live"]
    last = live[-1] if live else None
    doc["master_rss_mb_at_10k_queues_1k_groups"] = (
        last["master"]["rss_mb"] if last and last["queues"] >= 10_000
        and last["consumer_groups"] >= 1000 else None)
    doc["master_rss_mb_at_largest_step"] = None if last is None else {
        "queues": last["queues"], "consumer_groups": last["consumer_groups"],
        "rss_mb": last["master"]["rss_mb"]}
    written = [s for s in steps if s["step"].endswith("written")]
    big = next((s for s in written if s["queues"] >= 10_000), None)
    doc["fds_at_10k_queues"] = None if big is None else {
        "master": big["master"]["fds"], "slave": big["slave"]["fds"]}
    if written:
        w = written[-1]
        doc["fds_at_largest_queue_step"] = {"queues": w["queues"], "master": w["master"]["fds"],
                                            "slave": w["slave"]["fds"]}
    doc["bounds"] = BOUNDS


def report(doc: dict[str, Any]) -> None:
    def mb(v: Any) -> str:
        return "-" if v is None else f"{v:,.1f}"

    table = Table("step", "queues", "groups", "master RSS / PSS / USS MB", "slave RSS / PSS / USS MB",
                  "fds m / s", "index files", "data m / s MB", "/metrics KB", "ZK RSS MB", "load",
                  title="broker memory by queues and consumer groups (one group: master + slave)")
    for s in doc["steps"]:
        m, sl = s["master"], s["slave"]
        table.add_row(s["step"], f"{s['queues']:,}", f"{s['consumer_groups']:,}",
                      f"{mb(m['rss_mb'])} / {mb(m['pss_mb'])} / {mb(m['uss_mb'])}",
                      f"{mb(sl['rss_mb'])} / {mb(sl['pss_mb'])} / {mb(sl['uss_mb'])}",
                      f"{m['fds']} / {sl['fds']}", f"{m.get('index_files')}",
                      f"{mb(m.get('data_dir_mb'))} / {mb(sl.get('data_dir_mb'))}",
                      "-" if s["master_metrics_bytes"] is None
                      else f"{s['master_metrics_bytes'] / 1000:,.0f}",
                      mb(s["zookeeper_rss_mb"]), f"{s['loadavg'][0]}")
    _out.print(table)
    slopes = Table("figure", "value", "between", title="slopes (master RSS)")
    slopes.add_row("bytes per queue (one message each)", f"{doc['rss_bytes_per_queue']}",
                   doc["rss_bytes_per_queue_between"])
    slopes.add_row("bytes per queue, slave", f"{doc.get('slave_rss_bytes_per_queue')}", "same")
    slopes.add_row("bytes per consumer group (live member, offsets on its queues)",
                   f"{doc['rss_bytes_per_consumer_group']}",
                   doc["rss_bytes_per_consumer_group_between"])
    slopes.add_row("master RSS MB at 10k queues, 1k groups",
                   f"{doc['master_rss_mb_at_10k_queues_1k_groups']}",
                   f"largest step: {doc['master_rss_mb_at_largest_step']}")
    slopes.add_row("fds at 10k queues", f"{doc['fds_at_10k_queues']}",
                   f"largest: {doc.get('fds_at_largest_queue_step')}")
    _out.print(slopes)
    bounds = Table(title="what bounds it (from the code)")
    for col in ("what", "bounded", "evidence"):
        bounds.add_column(col, overflow="fold")
    for b in doc["bounds"]:
        bounds.add_row(b["what"], b["bounded"], b["evidence"])
    _out.print(bounds)
    _out.print(f"timings {doc['timings_s']}; requests retried {doc['retried']}; "
               f"errors {doc['errors'] or 'none'}; load average {doc['loadavg']}, "
               f"{doc['cpus']} CPUs")




def _counts(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--queues", type=_counts, default=[1000, 10_000],
                    help="queue counts to measure at, comma separated (default 1000,10000)")
    ap.add_argument("--groups", type=_counts, default=[100, 1000],
                    help="consumer-group counts, with the most queues (default 100,1000)")
    ap.add_argument("--queues-per-topic", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=16,
                    help="admin, produce and join requests in flight at once")
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true",
                    help="keep the cluster's directory (data and logs) under $TMPDIR")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench-results/memory.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    with cluster_directory("memory", keep=args.keep) as directory:
        doc = run_on_uvloop(run(args, directory))
    doc.update(machine_figures(load_before))
    summarize(doc)
    report(doc)
    write_results(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
