"""Broker benchmark: Understudy (master + slave, synchronous replication) against NATS
JetStream (3-node cluster, file storage, replicas 3 and 2), on loopback, 1 KiB messages,
the same Python asyncio client style and a 256-message in-flight window on both sides.

Prints figures and ratios, writes ``bench-results/broker.json``. No assertions: this is a
measurement, not a test. Every server it starts is stopped by PID before it exits.

Durability classes, stated so the ratios are read correctly:

* ``understudy`` (headline): ``--sync --flush interval`` — a produce is acknowledged once
  the master wrote it and a slave wrote it (page cache on two processes), fsync every
  100 ms. JetStream 2.9 file storage acknowledges after a quorum stored the message and
  fsyncs on an interval too (``sync_interval``, default 2 min), so this is like for like.
* ``understudy_fsync``: ``--sync --flush batch`` — also fsynced on master (group commit)
  and slave before the acknowledgement. Stronger than JetStream's default.

The Understudy producer sends batches of ``--batch-size`` (default 128) inside the same
256-message window, so two batches overlap in the client -> master -> slave pipeline
(with batches of 256 one batch made the whole round trip alone). Smaller batches
overlap more but cost more CPU per message; on a CPU-starved machine larger ones win. Each system also
reports CPU microseconds per message (servers and client): on a shared machine the
msg/s figures move with other people's load, CPU per message much less.

TLS + SCRAM on vs off (issue 15; bench/secure.py): in the same run, a plain and a secure
ZooKeeper-coordinated local cluster of the same shape (one group, master + slave, sync,
``--flush batch``), and JetStream R2 with TLS interleaved with the plain R2 runs; same
messages, count, window and client settings. Adds ``secure_vs_plain_produce_ratio`` (secure
msg/s / plain msg/s; target >= 0.75), ``jetstream_tls_vs_plain_produce_ratio`` and their
figures to ``broker.json`` (every other key is as before).

Usage: ``python bench/broker.py [--count N] [--batch-size B] [--repeat R] [--skip-jetstream]
[--skip-secure] [--secure-repeat S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import end_on_sigterm, signals_deferred
from rich.console import Console
from rich.table import Table

from understudy_broker.client import Consumer, Producer, create_topic
from understudy_broker.security import ClientSecurity
from understudy_operator.local.ports import free_port

BODY = b"x" * 1024
WINDOW = 256
console = Console(stderr=True)


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU time per message of the servers and of this (client) process during a run.

    On a shared machine the wall-clock rate moves with other people's load; CPU time
    per message barely does, so it is the figure to compare before and after a change.
    """

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.servers0 = [cpu_seconds(p) for p in pids]
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
    security: ClientSecurity | None = None,
) -> tuple[float, list[float]]:
    """``security``: TLS and the SCRAM user of every connection (bench/secure.py)."""
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
            fut = await prod.send(topic, BODY)

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
    root: Path, procs: Processes, n: int, *, flush: str, name: str, batch_size: int
) -> dict[str, float]:
    with understudy_pair(root, procs, flush=flush) as address:
        asyncio.run(wait_slave(address))
        console.print(
            f"[bold]understudy[/] sync replication, flush={flush}, batches of {batch_size}: "
            f"producing {n:,} x 1 KiB ..."
        )
        meter = CpuMeter([proc.pid for proc in procs.procs])
        seconds, lat = asyncio.run(understudy_produce(address, "bench", n, batch_size=batch_size))
        out = summarize(name, n, seconds, lat)
        out.update(meter.per_message(name, n))
        console.print(f"  {out[f'{name}_produce_msgs_per_s']:,.0f} msg/s, p99 {out[f'{name}_produce_ack_p99_ms']} ms; consuming ...")
        out[f"{name}_consume_msgs_per_s"] = round(asyncio.run(understudy_consume(address, "bench", n + 1)), 1)
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
                        consume: bool = True) -> dict[str, float]:
    """Produce ``n`` messages (then consume them unless not ``consume``); figures under
    ``name`` (default ``jetstream_r<replicas>``). ``tls``: the client's context (the
    servers require TLS, bench/secure.py)."""
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
            fut = await js.publish_async(subject, BODY)

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


def run_jetstream(root: Path, procs: Processes, n: int, replicas: int) -> dict[str, float]:
    js_root = root / f"js-r{replicas}"
    js_root.mkdir(parents=True)
    try:
        urls = start_jetstream(js_root, procs)
        console.print(f"[bold]jetstream[/] 3 nodes, file storage, replicas {replicas}: producing {n:,} x 1 KiB ...")
        out = asyncio.run(jetstream_run(urls, replicas, n, [proc.pid for proc in procs.procs]))
        name = f"jetstream_r{replicas}"
        console.print(f"  {out[f'{name}_produce_msgs_per_s']:,.0f} msg/s, p99 {out[f'{name}_produce_ack_p99_ms']} ms")
        return out
    finally:
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
)


def median_run(runs: list[dict[str, float]], name: str) -> dict[str, Any]:
    """The run with the median produce rate (an odd count picks a real run)."""
    ranked = sorted(runs, key=lambda r: r[f"{name}_produce_msgs_per_s"])
    out: dict[str, Any] = dict(ranked[len(ranked) // 2])
    if len(runs) > 1:
        out[f"{name}_produce_msgs_per_s_all"] = [r[f"{name}_produce_msgs_per_s"] for r in runs]
    return out


def add_ratios(results: dict[str, Any]) -> None:
    """Understudy / JetStream ratios; p99 ratios below 1 mean Understudy answers faster."""
    for us in ("understudy", "understudy_fsync"):
        if f"{us}_produce_msgs_per_s" not in results:
            continue
        prefix = "ratio" if us == "understudy" else "ratio_fsync"
        for key in ("r2", "r3"):
            js = f"jetstream_{key}"
            if f"{js}_produce_msgs_per_s" not in results:
                continue
            results[f"{prefix}_produce_vs_{key}"] = round(
                results[f"{us}_produce_msgs_per_s"] / results[f"{js}_produce_msgs_per_s"], 2)
            results[f"{prefix}_p99_vs_{key}"] = round(
                results[f"{us}_produce_ack_p99_ms"] / results[f"{js}_produce_ack_p99_ms"], 2)
            results[f"{prefix}_consume_vs_{key}"] = round(
                results[f"{us}_consume_msgs_per_s"] / results[f"{js}_consume_msgs_per_s"], 2)
        if f"{prefix}_produce_vs_r2" in results:
            results[f"{prefix}_target_met"] = bool(
                results[f"{prefix}_produce_vs_r2"] >= 2.0 and results[f"{prefix}_p99_vs_r2"] <= 1.0)


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
    ratios = Table(title="Understudy / JetStream (target: produce >= 2x R2 with p99 no worse)")
    for col in ("understudy durability", "vs", "produce x", "p99 x (<1 better)", "consume x", "target"):
        ratios.add_column(col, justify="right")
    for prefix, label in (("ratio", "flush interval"), ("ratio_fsync", "flush batch (fsync)")):
        for key in ("r2", "r3"):
            if f"{prefix}_produce_vs_{key}" not in results:
                continue
            met = results.get(f"{prefix}_target_met") if key == "r2" else None
            ratios.add_row(label, f"JetStream {key.upper()}",
                           f"{results[f'{prefix}_produce_vs_{key}']:.2f}",
                           f"{results[f'{prefix}_p99_vs_{key}']:.2f}",
                           f"{results[f'{prefix}_consume_vs_{key}']:.2f}",
                           "" if met is None else ("met" if met else "missed"))
    if ratios.row_count:
        console_out.print(ratios)
    secure_module().print_secure_report(results, console_out)
    console_out.print(
        f"load average {results['loadavg_start']:.1f} -> {results['loadavg_end']:.1f} on "
        f"{results['cpus']} cpus (other work on the machine moves msg/s; CPU us/msg moves less); "
        f"wrote {out}")


def secure_module() -> types.ModuleType:
    """bench/secure.py (TLS + SCRAM on vs off). It imports this module by name, so when
    this file runs as a script it is registered as ``broker`` first: one copy of it."""
    sys.modules.setdefault("broker", sys.modules[__name__])
    import secure

    return secure


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30_000, help="messages per run (default 30000)")
    ap.add_argument("--batch-size", type=int, default=128,
                    help="understudy producer batch size; the window stays 256 messages (default 128)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per system; the median run (by produce rate) is reported (default 3)")
    ap.add_argument("--skip-jetstream", action="store_true")
    ap.add_argument("--skip-secure", action="store_true",
                    help="skip TLS + SCRAM on vs off (bench/secure.py)")
    ap.add_argument("--secure-repeat", type=int, default=5,
                    help="plain and secure Understudy cluster runs, alternating, for TLS + SCRAM "
                         "on vs off; each side's median run is reported (default 5: a run "
                         "lasts 2 s, so one burst of other load moves it a lot)")
    ap.add_argument("--out", default="bench-results/broker.json")
    args = ap.parse_args(argv)
    if args.count < 1 or args.batch_size < 1 or args.repeat < 1 or args.secure_repeat < 1:
        ap.error("--count, --batch-size, --repeat and --secure-repeat must be positive")
    end_on_sigterm()  # SIGTERM too goes through the finally below: every server stopped
    secure = secure_module()
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
    finally:
        with signals_deferred():
            procs.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    results["loadavg_end"] = os.getloadavg()[0]
    add_ratios(results)
    secure.add_secure_ratios(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print_report(results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
