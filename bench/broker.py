"""Broker benchmark: Understudy (master + slave, synchronous replication) against NATS
JetStream (3-node cluster, file storage, replicas 3 and 2) and RabbitMQ (3-node cluster,
a quorum queue with publisher confirms), on loopback, 1 KiB messages, the same Python
asyncio client style and a 256-message in-flight window on every side.

Prints figures and ratios, writes ``bench-results/broker.json``. No assertions: this is a
measurement, not a test. Every server it starts is stopped by PID (process group) before
it exits, also on an error, Ctrl-C or SIGTERM.

Durability classes, stated so the ratios are read correctly:

* ``understudy`` (headline): ``--sync --flush interval`` — a produce is acknowledged once
  the master wrote it and a slave wrote it (page cache on two processes), fsync every
  100 ms. JetStream 2.9 file storage acknowledges after a quorum stored the message and
  fsyncs on an interval too (``sync_interval``, default 2 min), so this is like for like.
* ``understudy_fsync``: ``--sync --flush batch`` — also fsynced on master (group commit)
  and slave before the acknowledgement. Stronger than JetStream's default.
* ``rabbitmq``: Debian's RabbitMQ (3.10 on bookworm, installed with apt-get when missing,
  like bench/peers.py), 3 nodes, one quorum queue with 3 members (its leader on the node
  the client connects to), publisher confirms. A publish is confirmed once its Raft entry
  is committed: a majority of the members (2 of 3, the leader counting) appended it to
  their write-ahead log and fdatasynced that log (ra's ``wal_sync_method``, default
  ``datasync``; the WAL syncs a batch of writes at once). So like ``understudy_fsync``
  (two copies on disk before the acknowledgement), not like the page-cache classes.
  Consumed with ``no_ack`` (auto-acknowledge), as JetStream's consumer uses
  ``AckPolicy.NONE``; aio_pika awaits each publish's confirm, so the client runs a task
  per publish, at most 256 at once. A fresh cluster per run (bench/peers.py's ``Rabbit``,
  about 20 s to form), default runtime flags: the Erlang schedulers busy-wait a little
  before they sleep, which counts in RabbitMQ's CPU per message. On this machine the
  Python client itself spends about 250-330 us of CPU per confirmed publish (aio_pika; the
  lower-level aiormq was not meaningfully cheaper), so RabbitMQ's msg/s here is bound by
  its client, not its servers: the ratios against RabbitMQ flatter Understudy, and its
  server CPU per message is the fairer figure.

The Understudy producer sends batches of ``--batch-size`` (default 128) inside the same
256-message window, so two batches overlap in the client -> master -> slave pipeline
(with batches of 256 one batch made the whole round trip alone). Smaller batches
overlap more but cost more CPU per message; on a CPU-starved machine larger ones win. Each system also
reports CPU microseconds per message (servers and client; RabbitMQ's servers: its 3
``beam.smp``): on a shared machine the msg/s figures move with other people's load, CPU
per message much less.

Ratios (Understudy / peer; a p99 ratio below 1 means Understudy answers faster):
``ratio_<what>_vs_<peer>`` for the flush-interval pair and ``ratio_fsync_<what>_vs_<peer>``
for the flush-batch pair, ``<what>`` in produce, p99, consume and ``<peer>`` in r2, r3,
rabbitmq. Issue 16's targets, printed met/missed in the ratio table and kept under
``targets`` (with ``targets_met`` once every one was measured): produce >= 4x JetStream R2
with flush interval and >= 3x with flush batch, ack p99 no worse than R2's (both), consume
>= 6x R2, server CPU (master + slave, flush interval) <= 5 us/msg. Also the issue's keys
``ratio_produce_fsync_vs_r2`` (the value of ``ratio_fsync_produce_vs_r2``),
``ratio_consume_vs_r2`` and ``server_cpu_us_per_msg`` (``understudy_server_cpu_us_per_msg``).
``ratio_target_met`` / ``ratio_fsync_target_met`` keep their earlier meaning (produce >=
2x R2 with p99 no worse) for the scripts that read them.

Message sizes (``--sizes``, default 100, 1024 and 65536 bytes): Understudy with flush
interval and with flush batch, JetStream R2 and RabbitMQ once per size (``--sizes-repeat``),
MB/s (10^6 bytes of body per second) next to msg/s, so the machine's byte limit shows;
under ``sizes`` in the JSON, keyed by the size in bytes. The 1024 entry is the 1 KiB runs
above (their median run), not a run of its own. A size other than 1 KiB sends ``--count``
messages, but no more than ``--size-budget-mb`` (256) MiB of bodies and no fewer than 2000
(64 KiB: 4096 messages); the count used is printed and stored. Limits: the broker's frame
limit is 16 MiB (``--max-frame-bytes``), but the producer closes a batch at its
``max_batch_bytes`` (1 MiB by default), so with 64 KiB messages Understudy sends batches
of 16, not 128 (said in the output; with the producer's 4 batches in flight per group, 64
messages are then on the wire). JetStream's ``max_payload`` (1 MB) and RabbitMQ's
``max_message_size`` (128 MiB; AMQP frames of 128 KiB) take 64 KiB as it is.

TLS + SCRAM on vs off (issue 15; bench/secure.py): in the same run, a plain and a secure
ZooKeeper-coordinated local cluster of the same shape (one group, master + slave, sync,
``--flush batch``), and JetStream R2 with TLS interleaved with the plain R2 runs; same
messages, count, window and client settings. Adds ``secure_vs_plain_produce_ratio`` (secure
msg/s / plain msg/s; target >= 0.75), ``jetstream_tls_vs_plain_produce_ratio`` and their
figures to ``broker.json`` (every other key is as before).

Usage: ``python bench/broker.py [--count N] [--batch-size B] [--repeat R] [--skip-jetstream]
[--skip-rabbitmq] [--skip-secure] [--secure-repeat S] [--skip-sizes] [--sizes 100,1024,65536]
[--sizes-repeat R] [--size-budget-mb M] [--skip-scale] [--scale-groups 1,10,20,50]
[--scale-rounds R]``. The scale part (``bench/scale.py``, failover with the masters of many
groups killed at once) runs last, after every other server is stopped, and its document
goes under ``scale`` (with ``failover_1_group_reads_restored_ms_p99`` ...
``failover_50_groups_reads_restored_ms_p99``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchlib import end_on_sigterm, signals_deferred
from rich.console import Console
from rich.table import Table

from understudy_broker.client import Consumer, Producer, create_topic
from understudy_broker.protocol import DEFAULT_MAX_FRAME_BYTES
from understudy_broker.security import ClientSecurity
from understudy_operator.local.ports import free_port

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

BODY = b"x" * 1024
WINDOW = 256
#: The producer closes a batch at this many bytes (its default; under the broker's frame
#: limit, DEFAULT_MAX_FRAME_BYTES): the batch size of large messages (sizes sweep).
PRODUCER_MAX_BATCH_BYTES: int = inspect.signature(Producer).parameters["max_batch_bytes"].default
console = Console(stderr=True)


def size_label(size: int) -> str:
    """``100 B``, ``1 KiB``, ``64 KiB``, ``1.5 MiB``."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} B"


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s}s")


class Processes:
    """Servers started by the benchmark, stopped by PID (process group) at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own process group; a restart under the same name appends
        to its log. ``env``: the child's whole environment (default: ours)."""
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.procs.clear()


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system (kernel) CPU seconds a process has used so far
    (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/<pid>/stat``)."""
    return sum(cpu_split(pid))


class CpuMeter:
    """CPU time per message of the servers and of this (client) process during a run.

    On a shared machine the wall-clock rate moves with other people's load; CPU time
    per message barely does, so it is the figure to compare before and after a change.
    """

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.split0 = [cpu_split(p) for p in pids]
        self.servers0 = [u + k for u, k in self.split0]
        self.client0 = time.process_time()

    def per_message(self, name: str, n: int) -> dict[str, float]:
        servers = [cpu_seconds(p) - c0 for p, c0 in zip(self.pids, self.servers0, strict=True)]
        client = time.process_time() - self.client0
        out = {
            f"{name}_server_cpu_us_per_msg": round(sum(servers) / n * 1e6, 1),
            f"{name}_client_cpu_us_per_msg": round(client / n * 1e6, 1),
        }
        if len(servers) == 2:  # understudy: master, slave
            out[f"{name}_master_cpu_us_per_msg"] = round(servers[0] / n * 1e6, 1)
            out[f"{name}_slave_cpu_us_per_msg"] = round(servers[1] / n * 1e6, 1)
        # The kernel's part (system time: sockets, the page cache, fdatasync): what a
        # faster Python path cannot remove.
        kernel = sum(cpu_split(p)[1] - k0 for p, (_u0, k0) in zip(self.pids, self.split0,
                                                                      strict=True))
        out[f"{name}_server_sys_cpu_us_per_msg"] = round(kernel / n * 1e6, 1)
        return out


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


def summarize(name: str, n: int, seconds: float, lat: list[float]) -> dict[str, float]:
    return {
        f"{name}_produce_msgs_per_s": round(n / seconds, 1),
        f"{name}_produce_ack_p50_ms": round(pct(lat, 0.50) * 1000, 3),
        f"{name}_produce_ack_p99_ms": round(pct(lat, 0.99) * 1000, 3),
    }


# --------------------------------------------------------------------------- understudy


@contextlib.contextmanager
def understudy_pair(root: Path, procs: Processes, *, flush: str) -> Iterator[str]:
    exe = str(Path(sys.executable).with_name("understudy"))
    mport, rport, sport = free_port(), free_port(), free_port()
    common = ["--flush", flush, "--log-level", "WARNING"]
    m = procs.start(f"us-master-{flush}", [
        exe, "broker", "--data-dir", str(root / f"m-{flush}"), "--port", str(mport),
        "--replication-port", str(rport), "--sync", "--name", "m", *common])
    wait_port(mport, m)
    s = procs.start(f"us-slave-{flush}", [
        exe, "broker", "--data-dir", str(root / f"s-{flush}"), "--port", str(sport),
        "--role", "slave", "--master", f"127.0.0.1:{rport}", "--name", "s", *common])
    wait_port(sport, s)
    try:
        yield f"127.0.0.1:{mport}"
    finally:
        procs.stop_all()


async def understudy_produce(
    address: str, topic: str, n: int, *, batch_size: int = WINDOW,
    security: ClientSecurity | None = None, body: bytes = BODY,
) -> tuple[float, list[float]]:
    """``security``: TLS and the SCRAM user of every connection (bench/secure.py); ``body``:
    every message's (1 KiB unless the sizes sweep says otherwise)."""
    # The slave must be connected before a synchronous produce can be acknowledged.
    await create_topic([address], topic=topic, queues=4, security=security)
    lat: list[float] = []
    window = asyncio.Semaphore(WINDOW)
    # The window caps messages in flight (as publish_async_max_pending does for
    # JetStream); batch_size < WINDOW lets several batches overlap in the pipeline
    # client -> master -> slave instead of one batch making the whole round trip alone.
    async with Producer([address], batch_size=batch_size, linger_ms=1, security=security) as prod:
        await (await prod.send(topic, b"warm-up"))
        started = time.perf_counter()
        for _ in range(n):
            await window.acquire()
            sent = time.perf_counter()
            fut = await prod.send(topic, body)

            def done(f: asyncio.Future[tuple[int, int]], sent: float = sent) -> None:
                window.release()
                if not f.cancelled() and f.exception() is None:
                    lat.append(time.perf_counter() - sent)

            fut.add_done_callback(done)
        await prod.flush()
        seconds = time.perf_counter() - started
    if len(lat) != n:
        raise RuntimeError(f"understudy acknowledged {len(lat)} of {n}")
    return seconds, lat


async def understudy_consume(address: str, topic: str, n: int) -> float:
    c = Consumer([address], group="bench", topic=topic, max_wait_ms=200)
    got = 0
    started = time.perf_counter()
    try:
        while got < n:
            recs = await c.getmany(timeout_s=10)
            if not recs:
                raise RuntimeError(f"consumer stalled at {got}")
            got += len(recs)
        await c.commit()
    finally:
        await c.close()
    return got / (time.perf_counter() - started)


async def wait_slave(address: str, security: ClientSecurity | None = None) -> None:
    """Until the master answers a synchronous produce (the slave is in sync)."""
    for _ in range(100):
        try:
            await create_topic([address], topic="ready", queues=1, security=security)
            async with Producer([address], retries=0, security=security) as prod:
                await (await prod.send("ready", b"ping"))
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise RuntimeError("the slave never came in sync")


def run_understudy(
    root: Path, procs: Processes, n: int, *, flush: str, name: str, batch_size: int,
    body: bytes = BODY,
) -> dict[str, float]:
    with understudy_pair(root, procs, flush=flush) as address:
        asyncio.run(wait_slave(address))
        console.print(
            f"[bold]understudy[/] sync replication, flush={flush}, batches of {batch_size}: "
            f"producing {n:,} x {size_label(len(body))} ..."
        )
        meter = CpuMeter([proc.pid for proc in procs.procs])
        seconds, lat = asyncio.run(understudy_produce(address, "bench", n, batch_size=batch_size,
                                                      body=body))
        out = summarize(name, n, seconds, lat)
        out.update(meter.per_message(name, n))
        console.print(f"  {out[f'{name}_produce_msgs_per_s']:,.0f} msg/s, p99 {out[f'{name}_produce_ack_p99_ms']} ms; consuming ...")
        meter = CpuMeter([proc.pid for proc in procs.procs])
        out[f"{name}_consume_msgs_per_s"] = round(asyncio.run(understudy_consume(address, "bench", n + 1)), 1)
        # The consume phase's CPU too (<name>_consume_server_cpu_us_per_msg, ...).
        out.update(meter.per_message(f"{name}_consume", n + 1))
    return out


# --------------------------------------------------------------------------- jetstream


@dataclasses.dataclass
class NatsNode:
    """One nats-server of a JetStream cluster: ``name`` is its server_name (what
    ``stream_info().cluster.leader`` answers); restart it with :func:`start_nats`."""

    name: str
    conf: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


def start_nats(procs: Processes, name: str, conf: Path, port: int) -> subprocess.Popen[bytes]:
    exe = shutil.which("nats-server")
    if exe is None:
        raise RuntimeError("nats-server is not installed (Debian package nats-server; make setup installs it)")
    proc = procs.start(f"nats-{name}", [exe, "-c", str(conf)])
    wait_port(port, proc)
    return proc


@dataclasses.dataclass(frozen=True)
class NatsTls:
    """PEM files for nats-server's TLS: a certificate (server and client use, naming
    127.0.0.1) with its key, and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path

    def block(self) -> str:
        return (f"tls {{ cert_file: \"{self.cert}\", key_file: \"{self.key}\", "
                f"ca_file: \"{self.ca}\", timeout: 5 }}")


def start_jetstream_nodes(root: Path, procs: Processes, n: int = 3,
                          tls: NatsTls | None = None) -> list[NatsNode]:
    """``n`` clustered nats-servers with JetStream (file store under ``root``) on 127.0.0.1.
    ``tls``: TLS on the client port and on the routes between the servers (routes verify
    each other's certificate against the CA; clients need not present one)."""
    ports = [(free_port(), free_port()) for _ in range(n)]
    routes = ", ".join(f"nats-route://127.0.0.1:{c}" for _, c in ports)
    client_tls, route_tls = (f"{tls.block()}\n", f", {tls.block()}") if tls else ("", "")
    nodes = []
    for i, (cport, rport) in enumerate(ports):
        conf = root / f"n{i}.conf"
        conf.write_text(
            f"server_name: n{i}\nlisten: 127.0.0.1:{cport}\n{client_tls}"
            f"jetstream {{ store_dir: \"{root / f'js{i}'}\", max_memory_store: 268435456, max_file_store: 4294967296 }}\n"
            f"cluster {{ name: bench, listen: 127.0.0.1:{rport}, routes: [{routes}]{route_tls} }}\n"
        )
        nodes.append(NatsNode(f"n{i}", conf, cport, start_nats(procs, f"n{i}", conf, cport)))
    return nodes


def start_jetstream(root: Path, procs: Processes, tls: NatsTls | None = None) -> list[str]:
    return [node.url for node in start_jetstream_nodes(root, procs, tls=tls)]


async def jetstream_run(urls: list[str], replicas: int, n: int, pids: list[int], *,
                        tls: ssl.SSLContext | None = None, name: str | None = None,
                        consume: bool = True, body: bytes = BODY) -> dict[str, float]:
    """Produce ``n`` messages of ``body`` (then consume them unless not ``consume``);
    figures under ``name`` (default ``jetstream_r<replicas>``). ``tls``: the client's
    context (the servers require TLS, bench/secure.py)."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

    nc = await nats.connect(servers=urls, tls=tls)
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW)
        stream = f"R{replicas}"
        deadline = time.monotonic() + 30
        while True:  # the meta leader needs a moment after the cluster forms
            try:
                await js.add_stream(StreamConfig(name=stream, subjects=[f"r{replicas}.>"],
                                                 num_replicas=replicas, storage=StorageType.FILE))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        subject = f"r{replicas}.bench"
        await js.publish(subject, b"warm-up")
        lat: list[float] = []
        futs = []
        meter = CpuMeter(pids)
        started = time.perf_counter()
        for _ in range(n):
            sent = time.perf_counter()
            fut = await js.publish_async(subject, body)

            def done(f: asyncio.Future[Any], sent: float = sent) -> None:
                if not f.cancelled() and f.exception() is None:
                    lat.append(time.perf_counter() - sent)

            fut.add_done_callback(done)
            futs.append(fut)
        await asyncio.gather(*futs)
        seconds = time.perf_counter() - started
        name = name or f"jetstream_r{replicas}"
        out = summarize(name, n, seconds, lat)
        out.update(meter.per_message(name, n))
        if not consume:
            return out
        psub = await js.pull_subscribe(subject, durable=f"bench{replicas}",
                                       config=ConsumerConfig(ack_policy=AckPolicy.NONE))
        got = 0
        started = time.perf_counter()
        while got < n + 1:
            got += len(await psub.fetch(WINDOW, timeout=10))
        out[f"{name}_consume_msgs_per_s"] = round(got / (time.perf_counter() - started), 1)
        return out
    finally:
        await nc.close()


def run_jetstream(root: Path, procs: Processes, n: int, replicas: int, *,
                  body: bytes = BODY) -> dict[str, float]:
    js_root = root / f"js-r{replicas}"
    js_root.mkdir(parents=True)
    try:
        urls = start_jetstream(js_root, procs)
        console.print(f"[bold]jetstream[/] 3 nodes, file storage, replicas {replicas}: "
                      f"producing {n:,} x {size_label(len(body))} ...")
        out = asyncio.run(jetstream_run(urls, replicas, n, [proc.pid for proc in procs.procs],
                                        body=body))
        name = f"jetstream_r{replicas}"
        console.print(f"  {out[f'{name}_produce_msgs_per_s']:,.0f} msg/s, p99 {out[f'{name}_produce_ack_p99_ms']} ms")
        return out
    finally:
        procs.stop_all()


# --------------------------------------------------------------------------- rabbitmq


RABBIT_QUEUE = "bench"


async def rabbitmq_run(url: str, n: int, pids: list[int], *,
                       body: bytes = BODY) -> dict[str, float]:
    """Publish ``n`` messages of ``body`` to a new 3-member quorum queue with publisher
    confirms, at most WINDOW unconfirmed, then consume them (auto-acknowledged); figures
    under ``rabbitmq``. ``pids``: the nodes' Erlang VMs (beam.smp), for CPU per message."""
    import aio_pika

    name = "rabbitmq"
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        await channel.declare_queue(RABBIT_QUEUE, durable=True, arguments={
            "x-queue-type": "quorum", "x-quorum-initial-group-size": 3})
        exchange = channel.default_exchange

        async def publish(data: bytes) -> None:  # returns once confirmed (raises on a nack)
            await exchange.publish(
                aio_pika.Message(data, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=RABBIT_QUEUE, mandatory=False)

        await publish(b"warm-up")
        lat: list[float] = []
        window = asyncio.Semaphore(WINDOW)
        tasks: set[asyncio.Task[None]] = set()

        async def one(sent: float) -> None:
            try:
                await publish(body)
                lat.append(time.perf_counter() - sent)
            finally:
                window.release()

        meter = CpuMeter(pids)
        started = time.perf_counter()
        for _ in range(n):
            await window.acquire()
            task = asyncio.create_task(one(time.perf_counter()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        seconds = time.perf_counter() - started
        if len(lat) != n:
            raise RuntimeError(f"rabbitmq confirmed {len(lat)} of {n}")
        out = summarize(name, n, seconds, lat)
        out.update(meter.per_message(name, n))
        out[f"{name}_consume_msgs_per_s"] = round(await rabbitmq_consume(conn, n + 1), 1)
        return out
    finally:
        await conn.close()


async def rabbitmq_consume(conn: AbstractConnection, n: int) -> float:
    """Consume ``n`` messages of the queue with ``no_ack``; messages per second."""
    queue = await (await conn.channel()).get_queue(RABBIT_QUEUE)
    got = 0
    done = asyncio.Event()

    async def on_message(_message: Any) -> None:
        nonlocal got
        got += 1
        if got >= n:
            done.set()

    started = time.perf_counter()
    tag = await queue.consume(on_message, no_ack=True)
    seen = -1
    while not done.is_set():
        if got == seen:
            raise RuntimeError(f"consumer stalled at {got}")
        seen = got
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await done.wait()
    rate = got / (time.perf_counter() - started)
    await queue.cancel(tag)
    return rate


def run_rabbitmq(root: Path, procs: Processes, n: int, *, body: bytes = BODY) -> dict[str, float]:
    """A fresh 3-node cluster (bench/peers.py's ``Rabbit``) under ``root``, one run, every
    node stopped (by its process group) before this returns or raises."""
    root.mkdir(parents=True)
    try:
        rabbit = bench_module("peers").Rabbit(root, procs)
        pids = [int(Path(node.env["RABBITMQ_PID_FILE"]).read_text().strip())
                for node in rabbit.nodes]
        console.print(f"[bold]rabbitmq[/] 3 nodes, quorum queue, publisher confirms: "
                      f"producing {n:,} x {size_label(len(body))} ...")
        out = asyncio.run(rabbitmq_run(f"amqp://guest:guest@127.0.0.1:{rabbit.nodes[0].amqp}/",
                                       n, pids, body=body))
        console.print(f"  {out['rabbitmq_produce_msgs_per_s']:,.0f} msg/s, "
                      f"p99 {out['rabbitmq_produce_ack_p99_ms']} ms")
        return out
    finally:
        with signals_deferred():
            procs.stop_all()


# --------------------------------------------------------------------------- main


SYSTEMS = (
    ("understudy", "understudy sync, flush interval",
     "acked once master and slave wrote it (page cache); fsync every interval"),
    ("understudy_fsync", "understudy sync, flush batch",
     "acked once master and slave fdatasynced it (group commit on both)"),
    ("jetstream_r2", "jetstream R2",
     "acked once 2 of 2 replicas stored it; fsync on sync_interval"),
    ("jetstream_r3", "jetstream R3",
     "acked once 2 of 3 replicas stored it; fsync on sync_interval"),
    ("rabbitmq", "rabbitmq quorum, 3 nodes",
     "confirmed once 2 of 3 members wrote it to their Raft log and fdatasynced it"),
)
#: What Understudy is compared with: (key in the ratios' names, figures' name, label).
PEERS = (("r2", "jetstream_r2", "JetStream R2"), ("r3", "jetstream_r3", "JetStream R3"),
         ("rabbitmq", "rabbitmq", "RabbitMQ quorum"))
#: Issue 16's targets: (name under ``targets``, text ({value}: the figure), figure's key,
#: at least (else at most), bound, the ratio table's row that shows it).
TARGETS = (
    ("produce_vs_r2", "produce >= 4x", "ratio_produce_vs_r2", True, 4.0, ("ratio", "r2")),
    ("p99_vs_r2", "ack p99 <= 1x", "ratio_p99_vs_r2", False, 1.0, ("ratio", "r2")),
    ("consume_vs_r2", "consume >= 6x", "ratio_consume_vs_r2", True, 6.0, ("ratio", "r2")),
    ("server_cpu_us_per_msg", "server CPU {value:g} us/msg <= 5", "server_cpu_us_per_msg",
     False, 5.0, ("ratio", "r2")),
    ("produce_fsync_vs_r2", "produce >= 3x", "ratio_fsync_produce_vs_r2", True, 3.0,
     ("ratio_fsync", "r2")),
    ("p99_fsync_vs_r2", "ack p99 <= 1x", "ratio_fsync_p99_vs_r2", False, 1.0,
     ("ratio_fsync", "r2")),
)
#: The message-size sweep: its systems, the figures kept per size, its fewest messages.
SIZE_SYSTEMS = ("understudy", "understudy_fsync", "jetstream_r2", "rabbitmq")
FIGURES = ("produce_msgs_per_s", "produce_ack_p50_ms", "produce_ack_p99_ms",
           "consume_msgs_per_s", "server_cpu_us_per_msg", "client_cpu_us_per_msg")
MIN_SIZE_COUNT = 2000
#: One run of a system: (directory, messages, body, Understudy batch size) -> figures.
Runner = Callable[[Path, int, bytes, int], dict[str, Any]]


def median_run(runs: list[dict[str, float]], name: str) -> dict[str, Any]:
    """The run with the median produce rate (an odd count picks a real run)."""
    ranked = sorted(runs, key=lambda r: r[f"{name}_produce_msgs_per_s"])
    out: dict[str, Any] = dict(ranked[len(ranked) // 2])
    if len(runs) > 1:
        out[f"{name}_produce_msgs_per_s_all"] = [r[f"{name}_produce_msgs_per_s"] for r in runs]
    return out


def add_ratios(results: dict[str, Any]) -> None:
    """Understudy / peer ratios; p99 ratios below 1 mean Understudy answers faster."""
    for us in ("understudy", "understudy_fsync"):
        if f"{us}_produce_msgs_per_s" not in results:
            continue
        prefix = "ratio" if us == "understudy" else "ratio_fsync"
        for key, peer, _ in PEERS:
            if f"{peer}_produce_msgs_per_s" not in results:
                continue
            results[f"{prefix}_produce_vs_{key}"] = round(
                results[f"{us}_produce_msgs_per_s"] / results[f"{peer}_produce_msgs_per_s"], 2)
            results[f"{prefix}_p99_vs_{key}"] = round(
                results[f"{us}_produce_ack_p99_ms"] / results[f"{peer}_produce_ack_p99_ms"], 2)
            results[f"{prefix}_consume_vs_{key}"] = round(
                results[f"{us}_consume_msgs_per_s"] / results[f"{peer}_consume_msgs_per_s"], 2)
        if f"{prefix}_produce_vs_r2" in results:  # the earlier target, kept for scripts
            results[f"{prefix}_target_met"] = bool(
                results[f"{prefix}_produce_vs_r2"] >= 2.0 and results[f"{prefix}_p99_vs_r2"] <= 1.0)


def add_targets(results: dict[str, Any]) -> None:
    """Issue 16's names for figures above, and its targets: ``targets`` (per target: value,
    bound, met) and ``targets_met`` once every target was measured."""
    if "ratio_fsync_produce_vs_r2" in results:
        results["ratio_produce_fsync_vs_r2"] = results["ratio_fsync_produce_vs_r2"]
    if "understudy_server_cpu_us_per_msg" in results:
        results["server_cpu_us_per_msg"] = results["understudy_server_cpu_us_per_msg"]
    targets: dict[str, dict[str, Any]] = {}
    for name, _, key, at_least, bound, _ in TARGETS:
        if key in results:
            value = results[key]
            targets[name] = {"value": value, "target": f"{'>=' if at_least else '<='} {bound:g}",
                             "met": bool(value >= bound if at_least else value <= bound)}
    if targets:
        results["targets"] = targets
    if len(targets) == len(TARGETS):
        results["targets_met"] = all(t["met"] for t in targets.values())


def target_lines(results: dict[str, Any], row: tuple[str, str] | None) -> list[str]:
    """The targets shown on the ratio table's ``row`` ('produce >= 4x: met'); None: those
    whose row is not in the table (e.g. without JetStream)."""
    measured = results.get("targets", {})
    lines = []
    for name, text, _, _, _, where in TARGETS:
        shown = f"{where[0]}_produce_vs_{where[1]}" in results
        if name in measured and (where == row if row else not shown):
            verdict = "met" if measured[name]["met"] else "missed"
            lines.append(f"{text.format(value=measured[name]['value'])}: {verdict}")
    return lines


# --------------------------------------------------------------------------- message sizes


def size_count(size: int, n: int, budget_bytes: int) -> int:
    """Messages of a ``size``-byte run: ``n``, at most ``budget_bytes`` of bodies, at least
    MIN_SIZE_COUNT (or ``n`` when fewer)."""
    return min(n, max(MIN_SIZE_COUNT, budget_bytes // size))


def size_batch(size: int, batch_size: int) -> int:
    """Understudy's batch size for ``size``-byte messages: ``batch_size``, unless the
    producer closes a batch earlier, at PRODUCER_MAX_BATCH_BYTES (64 KiB: 16)."""
    return max(1, min(batch_size, PRODUCER_MAX_BATCH_BYTES // size))


def size_entry(run: dict[str, Any], names: tuple[str, ...], size: int) -> dict[str, Any]:
    """FIGURES of ``names`` found in ``run``, with produce and consume MB/s (10^6 bytes of
    body per second)."""
    out: dict[str, Any] = {}
    for name in names:
        if f"{name}_produce_msgs_per_s" not in run:
            continue
        out.update({f"{name}_{figure}": run[f"{name}_{figure}"] for figure in FIGURES})
        for what in ("produce", "consume"):
            out[f"{name}_{what}_mb_per_s"] = round(run[f"{name}_{what}_msgs_per_s"] * size / 1e6, 2)
    return out


def size_runners(procs: Processes, *, jetstream: bool, rabbitmq: bool) -> dict[str, Runner]:
    """One run of each system of the sweep (those not skipped), by name."""
    out: dict[str, Runner] = {
        "understudy": lambda root, n, body, batch: run_understudy(
            root, procs, n, flush="interval", name="understudy", batch_size=batch, body=body),
        "understudy_fsync": lambda root, n, body, batch: run_understudy(
            root, procs, n, flush="batch", name="understudy_fsync", batch_size=batch, body=body),
    }
    if jetstream:
        out["jetstream_r2"] = lambda root, n, body, _: run_jetstream(root, procs, n, 2, body=body)
    if rabbitmq:
        out["rabbitmq"] = lambda root, n, body, _: run_rabbitmq(root, procs, n, body=body)
    return out


def run_sizes(root: Path, runners: dict[str, Runner], sizes: list[int], *, n: int,
              batch_size: int, budget_bytes: int, repeat: int,
              main_results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per size (its decimal string): ``count``, ``understudy_batch_size`` and each
    system's figures (the median of ``repeat`` runs). 1 KiB: the main runs' figures."""
    out: dict[str, dict[str, Any]] = {}
    for size in sizes:
        if size == len(BODY):
            out[str(size)] = {"count": n, "understudy_batch_size": batch_size,
                              **size_entry(main_results, SIZE_SYSTEMS, size)}
            continue
        count, batch = size_count(size, n, budget_bytes), size_batch(size, batch_size)
        console.print(
            f"[bold]sizes[/] {size_label(size)}: {count:,} messages "
            f"({size_label(count * size)} of bodies) per run"
            + (f"; understudy batches of {batch}, not {batch_size}: the producer closes a "
               f"batch at {size_label(PRODUCER_MAX_BATCH_BYTES)} (max_batch_bytes)"
               if batch < batch_size else ""))
        entry: dict[str, Any] = {"count": count, "understudy_batch_size": batch}
        body = b"x" * size
        for name, run in runners.items():
            runs = [run(root / f"size{size}-{name}-{i}", count, body, batch)
                    for i in range(repeat)]
            entry.update(size_entry(median_run(runs, name), (name,), size))
        out[str(size)] = entry
    return out


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of byte counts: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("message sizes must be positive byte counts")
    return sizes


# --------------------------------------------------------------------------- report


def print_report(results: dict[str, Any], out: Path) -> None:
    table = Table(title=(f"broker benchmark: {results['count']:,} x 1 KiB, window {WINDOW} "
                         f"(understudy batches of {results['understudy_batch_size']}), loopback"))
    for col in ("system", "produce msg/s", "ack p50 ms", "ack p99 ms", "consume msg/s",
                "server CPU us/msg", "client CPU us/msg"):
        table.add_column(col, justify="right")
    for name, label, _ in SYSTEMS:
        if f"{name}_produce_msgs_per_s" in results:
            table.add_row(label, f"{results[f'{name}_produce_msgs_per_s']:,.0f}",
                          f"{results[f'{name}_produce_ack_p50_ms']:.1f}",
                          f"{results[f'{name}_produce_ack_p99_ms']:.1f}",
                          f"{results[f'{name}_consume_msgs_per_s']:,.0f}",
                          f"{results[f'{name}_server_cpu_us_per_msg']:.0f}",
                          f"{results[f'{name}_client_cpu_us_per_msg']:.0f}")
    # Wide enough for both tables when the output is a file or a pipe (make bench | tee).
    console_out = Console(width=None if sys.stdout.isatty() else 132)
    console_out.print(table)
    for name, label, meaning in SYSTEMS:
        if f"{name}_produce_msgs_per_s" in results:
            console_out.print(f"  {label}: {meaning}")
    ratios = Table(title=("Understudy / peers; issue 16 targets, vs JetStream R2: produce >= 4x "
                          "(flush interval), >= 3x (flush batch), ack p99 no worse, consume >= 6x; "
                          "server CPU <= 5 us/msg"))
    for col in ("understudy durability", "vs", "produce x", "p99 x (<1 better)", "consume x", "target"):
        ratios.add_column(col, justify="right")
    for prefix, label in (("ratio", "flush interval"), ("ratio_fsync", "flush batch (fsync)")):
        for key, _, peer in PEERS:
            if f"{prefix}_produce_vs_{key}" not in results:
                continue
            ratios.add_row(label, peer,
                           f"{results[f'{prefix}_produce_vs_{key}']:.2f}",
                           f"{results[f'{prefix}_p99_vs_{key}']:.2f}",
                           f"{results[f'{prefix}_consume_vs_{key}']:.2f}",
                           "\n".join(target_lines(results, (prefix, key))))
    if ratios.row_count:
        console_out.print(ratios)
    for line in target_lines(results, None):
        console_out.print(f"  target (issue 16): {line}")
    print_sizes_report(results, console_out)
    if "scale" in results:
        bench_module("scale").print_report(results["scale"])
    secure_module().print_secure_report(results, console_out)
    console_out.print(
        f"load average {results['loadavg_start']:.1f} -> {results['loadavg_end']:.1f} on "
        f"{results['cpus']} cpus (other work on the machine moves msg/s; CPU us/msg moves less); "
        f"wrote {out}")


def print_sizes_report(results: dict[str, Any], out: Console) -> None:
    sizes = results.get("sizes")
    if not sizes:
        return
    table = Table(title=f"message sizes: window {WINDOW}, loopback; MB/s = 10^6 bytes of body per s")
    for col in ("size", "messages", "system", "produce\nmsg/s", "produce\nMB/s", "ack p99\nms",
                "consume\nmsg/s", "consume\nMB/s", "server CPU\nus/msg"):
        table.add_column(col, justify="right")
    for size in sorted(sizes, key=int):
        entry = sizes[size]
        for name, label, _ in SYSTEMS:
            if f"{name}_produce_msgs_per_s" in entry:
                table.add_row(size_label(int(size)), f"{entry['count']:,}", label,
                              f"{entry[f'{name}_produce_msgs_per_s']:,.0f}",
                              f"{entry[f'{name}_produce_mb_per_s']:,.1f}",
                              f"{entry[f'{name}_produce_ack_p99_ms']:.1f}",
                              f"{entry[f'{name}_consume_msgs_per_s']:,.0f}",
                              f"{entry[f'{name}_consume_mb_per_s']:,.1f}",
                              f"{entry[f'{name}_server_cpu_us_per_msg']:.0f}")
        table.add_section()
    out.print(table)
    if str(len(BODY)) in sizes:
        out.print(f"  {size_label(len(BODY))}: the runs of the first table (their median run)")
    for size in sorted(sizes, key=int):
        batch = sizes[size]["understudy_batch_size"]
        if batch < results["understudy_batch_size"]:
            out.print(f"  {size_label(int(size))}: understudy batches of {batch}, not "
                      f"{results['understudy_batch_size']}: the producer closes a batch at "
                      f"{size_label(PRODUCER_MAX_BATCH_BYTES)} (max_batch_bytes; frame limit "
                      f"{size_label(DEFAULT_MAX_FRAME_BYTES)})")


def bench_module(name: str) -> types.ModuleType:
    """A module of bench/ that imports this one by name (secure, peers). When this file
    runs as a script it is registered as ``broker`` first: one copy of it."""
    sys.modules.setdefault("broker", sys.modules[__name__])
    return importlib.import_module(name)


def secure_module() -> types.ModuleType:
    """bench/secure.py (TLS + SCRAM on vs off)."""
    return bench_module("secure")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30_000, help="messages per run (default 30000)")
    ap.add_argument("--batch-size", type=int, default=128,
                    help="understudy producer batch size; the window stays 256 messages (default 128)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per system; the median run (by produce rate) is reported (default 3)")
    ap.add_argument("--skip-jetstream", action="store_true")
    ap.add_argument("--skip-rabbitmq", action="store_true",
                    help="skip RabbitMQ (else installed with apt-get when missing)")
    ap.add_argument("--skip-secure", action="store_true",
                    help="skip TLS + SCRAM on vs off (bench/secure.py)")
    ap.add_argument("--secure-repeat", type=int, default=5,
                    help="plain and secure Understudy cluster runs, alternating, for TLS + SCRAM "
                         "on vs off; each side's median run is reported (default 5: a run "
                         "lasts 2 s, so one burst of other load moves it a lot)")
    ap.add_argument("--skip-sizes", action="store_true", help="skip the message-size sweep")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("100,1024,65536"),
                    help="message sizes of the sweep, bytes, comma-separated (default "
                         "100,1024,65536; 1024 reports the 1 KiB runs)")
    ap.add_argument("--sizes-repeat", type=int, default=1,
                    help="runs per system and size in the sweep; the median is reported (default 1)")
    ap.add_argument("--size-budget-mb", type=float, default=256.0,
                    help=f"at most this many MiB of bodies per sweep run (but at least "
                         f"{MIN_SIZE_COUNT} messages); default 256")
    ap.add_argument("--skip-scale", action="store_true",
                    help="skip failover at scale (bench/scale.py: the masters of 1, 10, 20 "
                         "and 50 groups killed at once; its figures go under 'scale')")
    ap.add_argument("--scale-groups", default="1,10,20,50",
                    type=lambda text: bench_module("scale").parse_groups(text),
                    help="group counts of the scale part (default 1,10,20,50)")
    ap.add_argument("--scale-rounds", type=int, default=3,
                    help="rounds per group count in the scale part (default 3)")
    ap.add_argument("--out", default="bench-results/broker.json")
    args = ap.parse_args(argv)
    if (args.count < 1 or args.batch_size < 1 or args.repeat < 1 or args.secure_repeat < 1
            or args.sizes_repeat < 1 or args.size_budget_mb <= 0 or args.scale_rounds < 1):
        ap.error("--count, --batch-size, --repeat, --secure-repeat, --sizes-repeat, "
                 "--size-budget-mb and --scale-rounds must be positive")
    end_on_sigterm()  # SIGTERM too goes through the finally below: every server stopped
    secure = secure_module()
    if not args.skip_rabbitmq:
        try:
            bench_module("peers").install_rabbitmq()
        except (OSError, subprocess.CalledProcessError) as exc:
            ap.error(f"RabbitMQ is missing and could not be installed ({exc}); "
                     "--skip-rabbitmq runs without it")
    results: dict[str, Any] = {"count": args.count, "body_bytes": len(BODY), "window": WINDOW,
                               "understudy_batch_size": args.batch_size, "repeat": args.repeat,
                               "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0],
                               "durability": {name: meaning for name, _, meaning in SYSTEMS}}
    root = Path(tempfile.mkdtemp(prefix="understudy-bench-"))
    procs = Processes(root)
    try:
        for flush, name in (("interval", "understudy"), ("batch", "understudy_fsync")):
            runs = [run_understudy(root / f"{name}-{i}", procs, args.count, flush=flush, name=name,
                                   batch_size=args.batch_size) for i in range(args.repeat)]
            results.update(median_run(runs, name))
        if not args.skip_secure:
            results.update(secure.understudy_secure_vs_plain(
                root / "secure", args.count, batch_size=args.batch_size,
                repeat=args.secure_repeat))
        if not args.skip_jetstream:
            tls = None if args.skip_secure else secure.nats_tls_files(root / "nats-tls")
            for replicas in (2, 3):
                def plain(i: int, replicas: int = replicas) -> dict[str, Any]:
                    return run_jetstream(root / f"js{replicas}-{i}", procs, args.count, replicas)

                if replicas == 2 and tls is not None:  # TLS runs interleaved with the plain
                    runs, tls_runs = secure.interleave(args.repeat, plain, lambda i: (
                        secure.run_jetstream_tls(root / f"js2-tls-{i}", procs, args.count, 2, tls)))
                    results.update(secure.jetstream_tls_vs_plain(runs, tls_runs))
                else:
                    runs = [plain(i) for i in range(args.repeat)]
                results.update(median_run(runs, f"jetstream_r{replicas}"))
        if not args.skip_rabbitmq:
            runs = [run_rabbitmq(root / f"rmq-{i}", procs, args.count) for i in range(args.repeat)]
            results.update(median_run(runs, "rabbitmq"))
        if not args.skip_sizes:
            results["sizes"] = run_sizes(
                root, size_runners(procs, jetstream=not args.skip_jetstream,
                                   rabbitmq=not args.skip_rabbitmq),
                args.sizes, n=args.count, batch_size=args.batch_size,
                budget_bytes=int(args.size_budget_mb * (1 << 20)), repeat=args.sizes_repeat,
                main_results=results)
    finally:
        with signals_deferred():
            procs.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    if not args.skip_scale:  # failover at scale (bench/scale.py); it stops its own servers
        results["scale"] = bench_module("scale").run_scale(args.scale_groups,
                                                           rounds=args.scale_rounds)
    results["loadavg_end"] = os.getloadavg()[0]
    add_ratios(results)
    secure.add_secure_ratios(results)
    add_targets(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print_report(results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
