"""Peers' publish recovery after a leader SIGKILL: RabbitMQ quorum queues and JetStream R3.

Each system is a 3-node cluster on 127.0.0.1 (free ports, data in a temp directory). A
publisher sends small persistent messages at ``rate`` msg/s, each awaiting its own
acknowledgement (RabbitMQ: publisher confirm; JetStream: ``js.publish`` ack; up to 20000 in
flight). A cycle: 1 s of traffic, SIGKILL of the leader (the quorum queue's leader node's
Erlang VM, beam.smp; the stream leader's nats-server), traffic until a message sent after
the kill is acknowledged, plus 1 s; the node is restarted on the same data and config, and
the next cycle starts once the queue has 3 online members / the stream a leader and 2
current replicas. The queue and the stream keep their last 20000 messages. Per cycle, from
every acknowledgement's send and receive times:

* ``publish_recovery_ms`` (headline): the longest gap between consecutive acknowledgements
  from 1 s before the kill to the end of the cycle; sends never stop, so the publisher
  heard nothing for that long (bench/cluster.py's "write stall", same definition);
* ``first_ack_after_kill_ms``: from the kill to the first acknowledgement of a message
  *sent* after the kill.

The publisher connects to a node that is *not* the leader (chosen before each cycle; the
others are connection fallbacks), as RabbitMQ users publish through any member: the kill
never breaks its connection, so both figures are server failover, not client reconnects.
JetStream's figures sit inside nats-server's Raft election timeout (a follower waits 4-9 s
for a lost leader); publishes meanwhile fail at once (NoStreamResponseError, counted).

RabbitMQ is Debian's ``rabbitmq-server`` (3.10 on bookworm), installed by this benchmark
with apt-get when missing (not by ``make setup``: ~60 MB of Erlang only this needs). Nodes
run from /usr/lib/rabbitmq/bin (the /usr/sbin wrappers switch to the rabbitmq user), with
their own epmd on a free port, a cookie in a temp HOME and no plugins. Every process is
stopped by PID (process group) at the end, also on SIGINT/SIGTERM/SIGHUP.

    python bench/peers.py [--cycles 20] [--rate 2000]   # ~7 min; writes bench-results/peers.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker import NatsNode, Processes, start_jetstream_nodes, start_nats, wait_port

from understudy_harness.checker import percentile
from understudy_operator.local.ports import free_port

WARM_S, AFTER_S, RECOVER_S, ACK_TIMEOUT_S, MAX_IN_FLIGHT = 1.0, 1.0, 30.0, 10.0, 20000
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
QUEUE = "peers"
Send = Callable[[int], Awaitable[None]]


def recovery_ms(acks: list[tuple[float, float]], kill_at: float, start: float,
                end: float) -> tuple[float | None, float | None]:
    """(longest gap between consecutive acknowledgements in [start, end], kill -> first
    acknowledgement of a message sent at or after ``kill_at``) in ms, from (sent, acked)
    pairs. Both None when no message sent after the kill was acknowledged."""
    first = min((a for s, a in acks if s >= kill_at), default=None)
    if first is None:
        return None, None
    points = sorted(a for _, a in acks if start <= a <= end)
    gap = max((b - a for a, b in itertools.pairwise(points)), default=0.0)
    return round(gap * 1000, 1), round((first - kill_at) * 1000, 1)


def rotate(items: list[Any], first: Any) -> list[Any]:
    """``items`` starting at ``first``, the others after it in their order."""
    i = items.index(first)
    return items[i:] + items[:i]


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP raise SystemExit and SIGINT KeyboardInterrupt, so ``finally`` stops
    the servers; the previous handlers come back afterwards (main thread only)."""

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    wanted = {signal.SIGTERM: leave, signal.SIGHUP: leave, signal.SIGINT: signal.default_int_handler}
    old = {s: signal.signal(s, h) for s, h in wanted.items()} if main else {}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {what} after {timeout_s:g} s")
        await asyncio.sleep(0.5)


@dataclass
class Tally:
    """The figures of every cycle of one system."""

    rate: int
    gaps: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    async def cycle(self, send: Send, kill: Callable[[], None]) -> None:
        """Every 5 ms, sends what the rate owes through ``send`` (returns once acknowledged);
        ``kill()`` after WARM_S; stops AFTER_S after the first acknowledgement of a message
        sent after the kill (or RECOVER_S after the kill)."""
        acks: list[tuple[float, float]] = []  # (sent, acked)
        tasks: set[asyncio.Task[None]] = set()
        kill_at, recovered = float("inf"), asyncio.Event()

        async def one(i: int) -> None:
            sent = time.monotonic()
            try:
                await send(i)
            except Exception as exc:
                self.errors[type(exc).__name__] += 1
                return
            acks.append((sent, time.monotonic()))
            if sent >= kill_at:
                recovered.set()

        started, n, end = time.monotonic(), 0, float("inf")
        while (now := time.monotonic()) < end:
            if kill_at == float("inf") and now >= started + WARM_S:
                kill_at = now
                kill()
            if end == float("inf") and (recovered.is_set() or now > kill_at + RECOVER_S):
                end = now + AFTER_S
            for _ in range(max(0, min(int((now - started) * self.rate) - n, MAX_IN_FLIGHT - len(tasks)))):
                task = asyncio.create_task(one(n))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
            await asyncio.sleep(0.005)
        if tasks:
            await asyncio.wait(tasks, timeout=ACK_TIMEOUT_S + 5)
        gap, first = recovery_ms(acks, kill_at, kill_at - WARM_S, end)
        if gap is None or first is None:
            raise RuntimeError(f"no message sent after the kill was acknowledged in {RECOVER_S:g} s")
        self.gaps.append(gap)
        self.firsts.append(first)
        self.steady.append(percentile([round((a - s) * 1000, 1) for s, a in acks if a < kill_at], 50) or 0.0)

    def summary(self) -> dict[str, Any]:
        return {"publish_recovery_ms_p50": percentile(self.gaps, 50),
                "publish_recovery_ms_p99": percentile(self.gaps, 99),
                "first_ack_after_kill_ms_p50": percentile(self.firsts, 50),
                "first_ack_after_kill_ms_p99": percentile(self.firsts, 99),
                "ack_ms_p50_before_kill": percentile(self.steady, 50),
                "cycles": len(self.gaps), "rate": self.rate, "samples_ms": self.gaps,
                "first_ack_samples_ms": self.firsts, "publish_errors": dict(self.errors)}


def run_isolated(prefix: str, body: Callable[[Path, Processes], dict[str, Any]]) -> dict[str, Any]:
    """``body(root, procs)`` in a fresh temp directory; every process stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix=f"understudy-peers-{prefix}-"))
    procs = Processes(root)
    try:
        with signals_raise():
            return body(root, procs)
    finally:
        procs.stop_all()
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- RabbitMQ


@dataclass
class RabbitNode:
    name: str  # rabbitN@localhost
    amqp: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None


class Rabbit:
    """A RabbitMQ cluster of ``size`` nodes (3 by default) with its own epmd, cookie and
    directories under ``root``."""

    def __init__(self, root: Path, procs: Processes, size: int = 3) -> None:
        self.procs = procs
        (root / ".erlang.cookie").write_text("understudy-bench-peers")
        (root / ".erlang.cookie").chmod(0o400)
        (root / "enabled_plugins").write_text("[].\n")  # no management plugin
        (root / "rabbitmq.conf").write_text("log.console.level = warning\n")
        (root / "rabbitmq-env.conf").write_text("")
        epmd = free_port()
        self.env = {**os.environ, "HOME": str(root), "ERL_EPMD_PORT": str(epmd),
                    "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
                    "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins")}
        wait_port(epmd, procs.start("epmd", [shutil.which("epmd") or "epmd", "-port", str(epmd),
                                             "-address", "127.0.0.1"]))
        self.nodes = []
        for i in range(1, size + 1):
            amqp, dist, d = free_port(), free_port(), root / f"rabbit{i}"
            self.nodes.append(RabbitNode(f"rabbit{i}@localhost", amqp, {
                **self.env, "RABBITMQ_NODENAME": f"rabbit{i}@localhost",
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(amqp),
                "RABBITMQ_DIST_PORT": str(dist), "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
                "RABBITMQ_LOG_BASE": str(d / "log"), "RABBITMQ_PID_FILE": str(d / "pid")}))
        for node in self.nodes:
            self.start(node)
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", self.nodes[0].name)
            self.ctl(node, "start_app")

    def ctl(self, node: RabbitNode, *args: str) -> str:
        done = subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-q", "-n", node.name, *args],
                              env=self.env, capture_output=True, text=True, timeout=180)
        if done.returncode:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def start(self, node: RabbitNode) -> None:
        """Start the node and wait until its applications run."""
        Path(node.env["RABBITMQ_PID_FILE"]).unlink(missing_ok=True)
        node.proc = self.procs.start(node.name, [str(RABBIT_BIN / "rabbitmq-server")], env=node.env)
        self.ctl(node, "wait", "--timeout", "120", node.env["RABBITMQ_PID_FILE"])

    def queue(self) -> dict[str, Any]:
        """The queue's row (leader, members, online) as the first node that answers sees it."""
        for node in self.nodes:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                rows = json.loads(self.ctl(node, "list_queues", "name", "leader", "members",
                                           "online", "--formatter", "json") or "[]")
                return next((r for r in rows if r["name"] == QUEUE), {})
        return {}

    def kill(self, node: RabbitNode) -> None:
        """SIGKILL the node's Erlang VM (beam.smp, from its pid file)."""
        os.kill(int(Path(node.env["RABBITMQ_PID_FILE"]).read_text().strip()), signal.SIGKILL)


def install_rabbitmq() -> None:
    if (RABBIT_BIN / "rabbitmq-server").exists():
        return
    print("peers: RabbitMQ is not installed; installing Debian's rabbitmq-server with apt-get "
          "(about 60 MB with Erlang; only this benchmark needs it)", file=sys.stderr, flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
                    "rabbitmq-server"], check=True, env=env, stdout=subprocess.DEVNULL)


async def _rabbit_cycles(rabbit: Rabbit, cycles: int, rate: int) -> dict[str, Any]:
    import aio_pika

    async def connect(via: RabbitNode) -> Any:  # via first, the others as fallbacks
        for node in rotate(rabbit.nodes, via):
            with contextlib.suppress(Exception):
                return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{node.amqp}/")
        raise RuntimeError("no RabbitMQ node accepts a connection")

    async def three_online() -> bool:
        q = await asyncio.to_thread(rabbit.queue)
        return len(q.get("online", [])) == len(q.get("members", [])) == 3 and bool(q.get("leader"))

    conn: Any = await connect(rabbit.nodes[0])
    tally = Tally(rate)
    try:
        await (await conn.channel()).declare_queue(QUEUE, durable=True, arguments={
            "x-queue-type": "quorum", "x-max-length": 20000})
        for _ in range(cycles):
            await until(three_online, "3 online queue members")
            leader_name = (await asyncio.to_thread(rabbit.queue))["leader"]
            leader = next(n for n in rabbit.nodes if n.name == leader_name)
            await conn.close()
            conn = await connect(next(n for n in rabbit.nodes if n is not leader))
            channel = await conn.channel(publisher_confirms=True)

            async def send(i: int, channel: Any = channel) -> None:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=QUEUE, timeout=ACK_TIMEOUT_S)

            await tally.cycle(send, lambda leader=leader: rabbit.kill(leader))
            assert leader.proc is not None
            await asyncio.to_thread(leader.proc.wait, 30)
            await asyncio.to_thread(rabbit.start, leader)
    finally:
        await conn.close()
    return tally.summary()


def rabbitmq_quorum_recovery(cycles: int, rate: int) -> dict[str, Any]:
    """Publish recovery of a 3-member quorum queue after SIGKILL of its leader's node."""
    install_rabbitmq()
    return run_isolated("rmq", lambda root, procs: asyncio.run(
        _rabbit_cycles(Rabbit(root, procs), cycles, rate)))


# --------------------------------------------------------------------------- JetStream


async def _jetstream_cycles(procs: Processes, nodes: list[NatsNode], cycles: int,
                            rate: int) -> dict[str, Any]:
    import nats
    from nats.js.api import StorageType, StreamConfig

    async def connect(via: NatsNode) -> Any:  # via first, the others as fallbacks
        return await nats.connect(servers=[n.url for n in rotate(nodes, via)], dont_randomize=True,
                                  reconnect_time_wait=0.1, max_reconnect_attempts=-1)

    async def info() -> Any:
        try:
            return (await nc.jetstream().stream_info("PEERS")).cluster
        except Exception:
            return None

    async def created() -> bool:  # the meta leader needs a moment after the cluster forms
        with contextlib.suppress(Exception):
            await nc.jetstream().add_stream(StreamConfig(
                name="PEERS", subjects=[QUEUE], num_replicas=3, storage=StorageType.FILE,
                max_msgs=20000))
            return True
        return False

    async def healthy() -> bool:
        c = await info()
        reps = (c.replicas or []) if c else []
        return bool(c and c.leader) and len(reps) == 2 and all(r.current and not r.offline for r in reps)

    nc = await connect(nodes[0])
    tally = Tally(rate)
    try:
        await until(created, "stream PEERS created", 30)
        for _ in range(cycles):
            await until(healthy, "a stream leader and 2 current replicas")
            leader_name = (await info()).leader
            leader = next(n for n in nodes if n.name == leader_name)
            await nc.close()
            nc = await connect(next(n for n in nodes if n is not leader))
            js = nc.jetstream()

            async def send(i: int, js: Any = js) -> None:
                await js.publish(QUEUE, b"%d" % i, timeout=ACK_TIMEOUT_S)

            await tally.cycle(send, lambda leader=leader: os.kill(leader.proc.pid, signal.SIGKILL))
            await asyncio.to_thread(leader.proc.wait, 30)
            leader.proc = await asyncio.to_thread(start_nats, procs, leader.name, leader.conf, leader.port)
    finally:
        await nc.close()
    return tally.summary()


def jetstream_r3_recovery(cycles: int, rate: int) -> dict[str, Any]:
    """Publish recovery of an R3 file-storage stream after SIGKILL of its leader's server."""
    return run_isolated("js", lambda root, procs: asyncio.run(
        _jetstream_cycles(procs, start_jetstream_nodes(root, procs), cycles, rate)))


# bench/cluster.py calls these names.
measure_rabbitmq, measure_jetstream = rabbitmq_quorum_recovery, jetstream_r3_recovery


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=Path("bench-results/peers.json"))
    args = ap.parse_args(argv)
    if args.cycles < 1 or args.rate < 1:
        ap.error("--cycles and --rate must be positive")
    doc: dict[str, Any] = {}
    for key, fn in (("rabbitmq", rabbitmq_quorum_recovery), ("jetstream_r3", jetstream_r3_recovery)):
        started = time.monotonic()
        try:
            doc[key] = fn(args.cycles, args.rate)
        except Exception as exc:  # one peer failing must not hide the other
            doc[key] = {"error": repr(exc)}
        doc[key]["seconds"] = round(time.monotonic() - started, 1)
    doc["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    doc["cpus"] = os.cpu_count()
    print(f"{f'leader SIGKILL at {args.rate} msg/s':<40}{'p50 ms':>9}{'p99 ms':>9}")
    for key, label in (("rabbitmq", "RabbitMQ quorum"), ("jetstream_r3", "JetStream R3")):
        d = doc[key]
        if "error" in d:
            print(f"{label}: {d['error']}")
            continue
        for what, k in (("confirm gap", "publish_recovery_ms"), ("kill -> first ack", "first_ack_after_kill_ms")):
            print(f"{label + ', ' + what:<40}{d[k + '_p50']!s:>9}{d[k + '_p99']!s:>9}")
        print(f"  {d['cycles']} cycles in {d['seconds']:g} s; ack p50 before the kill "
              f"{d['ack_ms_p50_before_kill']} ms; publish errors {d['publish_errors'] or 'none'}")
    print(f"load average {doc['load_avg']}, {doc['cpus']} CPUs")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
