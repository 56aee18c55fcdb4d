"""Benchmark: failover at scale — the masters of 1, 10, 20 and 50 groups killed at once.

Why this exists: one controller process drives every group of a cluster, and the issue
measured (READ granted to each acting slave, from the brokers' permission logs, on a local
cluster) 23 ms for 1 group, 133 ms for 10 and 365 ms for 20 when every master was killed
at the same moment: about 17 ms more per group, as if the groups were failed over one
after another. The target is that every one of 50 groups is readable again within 250 ms
p99, as the consumers see it. This bench measures that, and where the time goes.

For each N in ``--groups``: a local cluster (``understudy_operator.local.cluster.up``:
private ZooKeeper, N groups of a master and one synchronous slave, the controller) in a
temporary directory; per group a one-queue topic ``scale-<group>`` holding one message,
and one consumer (``understudy_broker.client.Consumer``) that keeps pulling it (long polls
of 200 ms; an empty answer counts as answered: ``Consumer._pull_loop`` reports the first
pull answered after failed ones, or by another broker than the pull before it, whatever
it holds). Then ``--rounds`` rounds of:

1. wait until every group is NORMAL, its master reads, a slave could take reads at once
   (the controller's own ``eligible_slaves``) and its consumer reads from the master;
2. SIGKILL every master in one tight loop (``os.kill`` over the PIDs of the cluster's pid
   files, nothing awaited in between), each group's kill instant taken just before its
   signal;
3. per group, as ms after the kill of its master:
   - **consumer-seen reads restored**: the first pull, sent after the kill, that another
     broker of the group answered (``Consumer.on_read_restored``; dated when the pull was
     *sent*, as the drill and ``bench/failover.py`` date it: a pull answered OK was served
     by a broker holding READ when it arrived);
   - **READ granted** to the acting slave: its first line holding READ after the kill in
     its ``permissions.jsonl`` (the permission-change log, ``harness/permevents.py``'s
     source);
   - where the time goes, stage by stage: the process gone (a pidfd this bench opened),
     the controller seeing the exit (its ``understudy_broker_exited_timestamp_seconds``
     gauge, set in ``Controller._on_process_exit`` when its pidfd fires), FENCING and
     SLAVE_CONSUME written (its transition journal ``logs/transitions.jsonl``, dated when
     each versioned write succeeded), READ granted, the consumer's pull; and the sums of
     the controller's ``understudy_failover_phase_seconds`` histograms (detect, fence,
     switch, and back-sync after the restart) between two scrapes of its ``/metrics``, and
     between the same scrapes the route writer's writes of ``/routes/doc``
     (``understudy_route_document_writes_total``: each is read by every broker,
     docs/cluster-routes.md);
   - the controller's CPU (``utime + stime`` of ``/proc/<pid>/stat``, sampled every 10 ms)
     from the first kill to the instant the last group was readable (consumer-seen): in
     total, per group, and "controller CPU per group per second" = CPU seconds / groups /
     wall seconds of that window — the fraction of one core the controller spent per
     group while the failover ran. Beside it, in the same window: the machine's busy share
     (``/proc/stat``), CPU pressure (PSI: the share of the window in which some runnable
     task waited for a CPU), ZooKeeper's CPU, and ZooKeeper's own counters (``mntr``;
     ``cons`` for the controller's session: how many requests it sent);
4. restart the masters and wait for every group to be NORMAL again (back-sync).

Before the first round the cluster is measured at rest for a few seconds: the cores used
by the controller, the brokers, ZooKeeper and this process, ZooKeeper's packets per second,
watches and watchers notified per changed node, and the controller's requests per second.

Reported per N: p50/p99/max over every group of every round (the consumer-seen p99 also
from the first kill), the load average and CPU pressure at the start and end, and tables of
where the time goes; ``bench-results/scale.json`` holds every figure, with the top-level
keys ``failover_<N>_group[s]_reads_restored_ms_p99`` (consumer-seen), ``..._grant_ms_p99``
and the controller CPU figures; every round's per-group timeline is under ``per_groups``.
:func:`run_scale` returns that document. No assertions: a benchmark measures, tests assert.

Biases, to read the figures right:

- Every consumer lives in this one process, on one event loop (uvloop): N consumers'
  reconnects, route watches and pulls are served one after another, so the consumer-seen
  figure of the last groups includes this process's own queueing, and any time this
  process waits for a CPU (its CPU and its longest loop pause in each window are
  printed). Consumers elsewhere would not wait for these two cores; separate consumer
  processes here would add N processes to them.
- The dating by the pull's send time leaves out the answer's way back (an empty long poll
  is answered 200 ms later: its arrival says nothing about the failover).
- Everything runs on one 2-core machine: 2N brokers, ZooKeeper (a JVM), the controller and
  this process. The brokers' background work grows with N (every broker watches every
  group's statuses, and every broker republishes its status every second), so the
  controller and the acting slaves compete for the cores with it; other people's runs add
  to it (see the load averages and CPU pressure).
- ``utime + stime`` advance in clock ticks (10 ms here): a window with little CPU reads
  0 or 10 ms; the 1-group figure is coarse.
- "process gone" is seen by this process's loop: when this process waits for a CPU it is
  late, and the controller may see the exit first.
- Above 20 groups the brokers are started one every 0.5 s (``--stagger-s``; a ``sleep``
  before each broker's usual command, through ``local up``'s ``placement``), since 100
  brokers started at once starve their own ZooKeeper clients and some exit. On the
  2-core machine this was written on, 50 groups did not come up either way: past about
  55 brokers the 2 s ZooKeeper sessions expire at rest (see the report of the run).

Usage::

    python bench/scale.py                                  # 1, 10, 20, 50 groups, 3 rounds
    python bench/scale.py --groups 1,10 --rounds 1         # a quick look
    python bench/scale.py --groups 50 --rounds 2 --out bench-results/scale.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import pathlib
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from benchlib import (
    GeneratorPauses,
    cpu_ticks,
    end_on_sigterm,
    run_on_uvloop,
    signals_deferred,
    steal_ms,
    write_results,
)
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from understudy_broker import metric_names as names
from understudy_broker.client import Consumer, Producer, create_topic
from understudy_broker.ha.permlog import FILE_NAME as PERMISSION_LOG
from understudy_broker.ha.permlog import read_changes
from understudy_broker.model import Mode, Permission
from understudy_broker.tasks import stop_tasks
from understudy_broker.zklayout import GroupConfig, controller_path
from understudy_harness.checker import percentile
from understudy_operator.controller.journal import read_transitions
from understudy_operator.controller.machine import PHASES, eligible_slaves
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import (
    CONTROLLER,
    STATE_FILE,
    ClusterPlan,
    Placement,
    Placer,
    transitions_log,
)
from understudy_operator.local.zkserver import four_letter
from understudy_operator.zk import ZkError, ZkGateway, gateway

T = TypeVar("T")

TARGET_MS = 250.0
DEFAULT_GROUPS = (1, 10, 20, 50)
CGROUP = "scale"
MAX_WAIT_MS = 200  # the consumers' long poll, as the drill's
SAMPLE_S = 0.01  # the controller's CPU is sampled this often during a round
IDLE_S = 3.0  # the idle window before the first round
#: The stages of one group's failover, in order, as instants after the kill.
STAGES = ("exited", "exit_seen", "fencing", "slave_consume", "grant", "consumer")
STAGE_WORDS = {
    "exited": "process gone (this bench's pidfd)",
    "exit_seen": "controller sees the exit (its pidfd)",
    "fencing": "FENCING written",
    "slave_consume": "SLAVE_CONSUME written",
    "grant": "READ granted (acting slave's log)",
    "consumer": "consumer reads (pull sent)",
}
STEPS = tuple(f"{a}->{b}" for a, b in zip(("kill", *STAGES), STAGES, strict=False))

_out = Console(width=None if sys.stdout.isatty() else 160)
_started = time.monotonic()


def progress(msg: str) -> None:
    print(f"[bench scale {time.strftime('%H:%M:%S')} +{time.monotonic() - _started:.0f}s] {msg}",
          file=sys.stderr, flush=True)


def key_prefix(n: int) -> str:
    return f"failover_{n}_group" + ("" if n == 1 else "s")


def _r(v: float | None, nd: int = 1) -> float | None:
    return None if v is None else round(v, nd)


def _ms(v: Any) -> str:
    if isinstance(v, float | int):
        return str(round(v)) if abs(v) >= 10 or v == 0 else f"{v:.1f}"
    return "-" if v is None else str(v)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _pressure_avg60() -> float | None:
    """CPU pressure (PSI "some", % of the last 60 s with a task waiting for a CPU)."""
    try:
        line = pathlib.Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return float(line.split("avg60=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


# ------------------------------------------------------------------------------ CPU

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of ``pid`` so far (``/proc/<pid>/stat``, every thread),
    ``None`` when it is gone."""
    if pid is None:
        return None
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_jiffies(ticks: list[int]) -> tuple[int, int]:
    """(busy, total) of :func:`benchlib.cpu_ticks` (the first eight states; idle and iowait
    are not busy; the host's steal is, so ``host_steal_ms`` is reported beside it)."""
    fields = ticks[:8]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def cpu_pressure_us() -> int | None:
    """Microseconds so far in which some runnable task waited for a CPU (PSI,
    ``/proc/pressure/cpu``); ``None`` without PSI."""
    try:
        text = pathlib.Path("/proc/pressure/cpu").read_text()
    except OSError:
        return None
    line = next((x for x in text.splitlines() if x.startswith("some")), "")
    return int(line.rsplit("total=", 1)[1]) if "total=" in line else None


@dataclass(frozen=True, slots=True)
class Sample:
    t_ns: int
    controller: float | None  # CPU seconds
    zookeeper: float | None
    busy: int  # machine busy clock ticks
    total: int
    pressure_us: int | None
    steal_ms: float | None  # the host's steal so far (benchlib.steal_ms)


class Sampler:
    """The controller's and ZooKeeper's CPU, the machine's busy ticks and CPU pressure,
    every :data:`SAMPLE_S` (a sleep in between: no busy loop), to read them at any instant
    of a round afterwards."""

    def __init__(self, controller: int | None, zookeeper: int | None) -> None:
        self.pids = controller, zookeeper
        self.samples: list[Sample] = []

    def sample(self) -> Sample:
        ticks = cpu_ticks()
        if ticks is None:
            raise RuntimeError("/proc/stat has no 'cpu' line: this bench needs Linux")
        busy, total = machine_jiffies(ticks)
        got = Sample(time.time_ns(), cpu_seconds(self.pids[0]), cpu_seconds(self.pids[1]),
                     busy, total, cpu_pressure_us(), steal_ms(ticks))
        self.samples.append(got)
        return got

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_S)

    def at(self, t_ns: int) -> Sample | None:
        """The first sample taken at or after ``t_ns`` (at most one sampling period late)."""
        return next((x for x in self.samples if x.t_ns >= t_ns), None)


def window_figures(s0: Sample, s1: Sample) -> dict[str, float | None]:
    """What the machine, the controller and ZooKeeper did between two samples."""
    wall = (s1.t_ns - s0.t_ns) / 1e9

    def cpu_ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((b - a) * 1000, 1)

    return {
        "window_s": round(wall, 4),
        "controller_cpu_ms": cpu_ms(s0.controller, s1.controller),
        "zookeeper_cpu_ms": cpu_ms(s0.zookeeper, s1.zookeeper),
        "machine_busy_pct": round(100 * (s1.busy - s0.busy) / (s1.total - s0.total), 1)
        if s1.total > s0.total else None,
        "cpu_pressure_pct": round((s1.pressure_us - s0.pressure_us) / 1e4 / wall, 1)
        if s0.pressure_us is not None and s1.pressure_us is not None and wall > 0 else None,
        # CPU time the hypervisor gave other guests while this machine wanted to run: every
        # process here stopped for it (bench/benchlib.py, HostSteal).
        "host_steal_ms": round(s1.steal_ms - s0.steal_ms, 1)
        if s0.steal_ms is not None and s1.steal_ms is not None else None,
    }


# ------------------------------------------------------------------------ consumers


@dataclass
class Probe:
    """One group's consumer and what it saw."""

    group: str
    master: str
    master_address: str
    brokers: dict[str, str]  # address -> broker name
    consumer: Consumer
    last_reader: str = ""  # address of the broker that answered the last restored pull
    kill_ns: int | None = None
    restored: tuple[int, int, str] | None = None  # (pull sent ns, answered ns, broker)
    task: asyncio.Task[None] | None = None
    on_first: Callable[[], None] | None = None  # told when ``restored`` is set

    def on_restored(self, _queue: int, address: str, sent_ns: int) -> None:
        self.last_reader = address
        if self.kill_ns is not None and self.restored is None and sent_ns >= self.kill_ns \
                and address != self.master_address:
            self.restored = (sent_ns, time.time_ns(), self.brokers.get(address, address))
            if self.on_first is not None:
                self.on_first()


class Readers:
    """A one-queue topic per group, one message in it, and one consumer per group pulling
    it from a drain task; all in this process."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.probes: dict[str, Probe] = {}
        self.all_restored = asyncio.Event()  # every armed probe has seen reads restored

    async def start(self) -> None:
        for g in self.plan.groups:
            boot = self.plan.bootstrap(g.group)
            topic = f"scale-{g.group}"
            await create_topic(boot, topic=topic, queues=1)
            async with Producer(boot, linger_ms=1, send_timeout_s=30.0) as prod:
                await (await prod.send(topic, b"readable"))
            c = Consumer(boot, group=CGROUP, topic=topic, max_wait_ms=MAX_WAIT_MS,
                         request_timeout_s=5.0)
            probe = Probe(group=g.group, master=g.master.name, master_address=g.master.address,
                          brokers={b.address: b.name for b in g.brokers}, consumer=c,
                          last_reader=g.master.address, on_first=self._check_all)
            c.on_read_restored = probe.on_restored
            await c.start()
            probe.task = asyncio.create_task(self._drain(probe), name=f"drain-{g.group}")
            self.probes[g.group] = probe
            if len(self.probes) % 10 == 0:
                progress(f"{len(self.probes)} of {len(self.plan.groups)} topics and consumers")
        progress(f"{len(self.probes)} topics, one message each, {len(self.probes)} consumers")

    async def _drain(self, probe: Probe) -> None:
        while True:
            try:
                await probe.consumer.getmany(timeout_s=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a consumer error must not end the bench
                logging.getLogger(__name__).info("consumer of %s: %r", probe.group, exc)
                await asyncio.sleep(0.5)

    def _check_all(self) -> None:
        if not self.pending():
            self.all_restored.set()

    def arm(self) -> None:
        """Forget the last round; each probe's ``kill_ns`` is set as its master is killed."""
        self.all_restored.clear()
        for p in self.probes.values():
            p.kill_ns, p.restored = None, None

    def disarm(self) -> None:
        for p in self.probes.values():
            p.kill_ns = None

    def pending(self) -> list[str]:
        return [g for g, p in self.probes.items() if p.restored is None]

    def off_master(self) -> list[str]:
        """Groups whose consumer reads elsewhere than from its master: its last restored
        pull went to another broker and its route does not name the master as the reader
        either (a pull loop started afresh, after a member rejoined, reads from the master
        without a failed pull before it, so no restore is reported: the 50-group run of
        2026-11-27 waited 6 minutes for one)."""
        return [g for g, p in self.probes.items()
                if p.last_reader != p.master_address
                and p.consumer.router.address_for(Permission.READ, g) != p.master_address]

    async def close(self) -> None:
        await stop_tasks([p.task for p in self.probes.values() if p.task is not None])
        for p in self.probes.values():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await p.consumer.close()


# ------------------------------------------------------------------ controller metrics


def scrape(plan: ClusterPlan) -> str | None:
    port = plan.controller_http_port
    return None if port is None else lc.http_get(port, "/metrics", timeout=5)


def phase_totals(text: str | None) -> dict[str, tuple[float, float]]:
    """Per phase, (sum of seconds, count) over every group's histogram."""
    out = {ph: (0.0, 0.0) for ph in PHASES}
    for family in text_string_to_metric_families(text or ""):
        if family.name != names.FAILOVER_PHASE_SECONDS:
            continue
        for s in family.samples:
            phase = s.labels.get("phase", "")
            if phase not in out:
                continue
            total, count = out[phase]
            if s.name.endswith("_sum"):
                out[phase] = (total + s.value, count)
            elif s.name.endswith("_count"):
                out[phase] = (total, count + s.value)
    return out


def counter_total(text: str | None, name: str) -> float | None:
    """A label-less counter's value in a scrape (``None``: not exported)."""
    for family in text_string_to_metric_families(text or ""):
        if family.name == names.counter_base(name):
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return None


def phase_delta(before: str | None, after: str | None,
                phases: Iterable[str]) -> dict[str, dict[str, float | None]]:
    """Per phase, what the histograms gained between two scrapes: observations, their sum
    (ms) and mean (ms)."""
    b, a = phase_totals(before), phase_totals(after)
    out: dict[str, dict[str, float | None]] = {}
    for ph in phases:
        total = (a[ph][0] - b[ph][0]) * 1000
        count = a[ph][1] - b[ph][1]
        out[ph] = {"count": count, "sum_ms": _r(total),
                   "mean_ms": _r(total / count) if count > 0 else None}
    return out


def exits_seen(text: str | None) -> dict[str, float]:
    """Per broker, when the controller's liveness source saw its process exit (seconds
    since the epoch)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text or ""):
        if family.name == names.BROKER_EXITED:
            for s in family.samples:
                out[s.labels.get("broker", "")] = s.value
    return out


# ------------------------------------------------------------------------ readiness


async def ready_facts(zk: ZkGateway, cfg: GroupConfig) -> str | None:
    """Why ``cfg``'s group is not ready for a round, or ``None`` when it is: NORMAL, the
    master holds READ, and a slave could take reads at once (the controller's rule)."""
    state, _ = await zk.read_state(cfg.group, warn=lambda _m: None)
    if state is None or state.mode is not Mode.NORMAL:
        return f"state {'none' if state is None else state.mode.name}"
    obs = await zk.observe_group(cfg.group, [b.name for b in cfg.brokers], warn=lambda _m: None)
    st = obs.view(cfg.master.name).status
    if st is None or not st.effective & Permission.READ:
        return "master does not read yet"
    if not eligible_slaves(cfg, obs, need_link_down=False):
        isr = "none" if obs.in_sync is None else ",".join(sorted(obs.in_sync))
        return f"no slave eligible (in-sync record {isr})"
    return None


async def wait_ready(zk: ZkGateway, plan: ClusterPlan, readers: Readers, *,
                     within_s: float) -> dict[str, str]:
    """Wait until every group is ready (:func:`ready_facts`) and its consumer reads from
    its master; returns what was still wrong per group at the deadline (empty: ready).
    Polls only the groups not yet seen ready (every 0.5 s: N groups' reads cost
    ZooKeeper and the controller's machine CPU), then checks all once more."""
    deadline = time.monotonic() + within_s
    pending = {g.group: "not checked" for g in plan.groups}
    configs = {g.group: g for g in plan.groups}
    while True:
        for group in list(pending):
            try:
                why = await ready_facts(zk, configs[group])
            except ZkError as exc:
                why = f"ZooKeeper: {exc!r}"
            if why is None and group in readers.off_master():
                why = "its consumer does not read from the master yet"
            if why is None:
                del pending[group]
            else:
                pending[group] = why
        if not pending:
            again = {}
            for g in plan.groups:
                why = await ready_facts(zk, g)
                if why is not None:
                    again[g.group] = why
            if not again:
                return {}
            pending = again
        if time.monotonic() > deadline:
            return pending
        await asyncio.sleep(0.5)


# ------------------------------------------------------------------------- one round


@dataclass
class RoundResult:
    groups: dict[str, dict[str, float | str | None]] = field(default_factory=dict)
    kill_spread_us: float = 0.0
    last_readable_ms: float | None = None
    #: From the first kill to the last group readable (consumer-seen): window_figures().
    window: dict[str, float | None] = field(default_factory=dict)
    #: From the first kill to 1 s after the last group readable (switch phases observed).
    settled: dict[str, float | None] = field(default_factory=dict)
    slaves_cpu_ms_settled: float | None = None
    #: ZooKeeper from just before the kill to 1 s after the last group readable (zk_delta).
    zookeeper: dict[str, float | None] = field(default_factory=dict)
    bench_cpu_ms: float | None = None
    bench_longest_pause_ms: float | None = None
    phases: dict[str, dict[str, float | None]] = field(default_factory=dict)
    #: Writes of /routes/doc between the scrapes before the kill and after the failover
    #: (docs/cluster-routes.md); every broker reads each.
    route_document_writes: float | None = None
    recovery_s: float | None = None
    missing: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def timeline(plan: ClusterPlan, kills: dict[str, int], exited: dict[str, int],
             seen: dict[str, float], probes: dict[str, Probe]
             ) -> dict[str, dict[str, float | str | None]]:
    """Per group, each stage's instant as ms after the SIGKILL of its master (``None``:
    not seen), and that kill's offset from the first one."""
    first = min(kills.values())
    moves: dict[str, dict[Mode, tuple[int, str | None]]] = {}
    for t in read_transitions(transitions_log(plan.dir)):
        if t.t_ns >= first:
            moves.setdefault(t.group, {}).setdefault(t.mode, (t.t_ns, t.acting))
    out: dict[str, dict[str, float | str | None]] = {}
    for g in plan.groups:
        kill_ns = kills[g.group]

        def ms(t_ns: float | None, kill_ns: int = kill_ns) -> float | None:
            return None if t_ns is None or t_ns < kill_ns else round((t_ns - kill_ns) / 1e6, 2)

        mine = moves.get(g.group, {})
        fencing = mine.get(Mode.FENCING)
        slave_consume = mine.get(Mode.SLAVE_CONSUME)
        acting = slave_consume[1] if slave_consume is not None else g.slaves[0].name
        grant = next((c.t_ns for c in read_changes(plan.dir / "data" / str(acting) / PERMISSION_LOG)
                      if c.t_ns >= kill_ns and c.effective & Permission.READ), None)
        exit_at = seen.get(g.master.name)
        restored = probes[g.group].restored
        out[g.group] = {
            "kill_offset": round((kill_ns - first) / 1e6, 3),
            "exited": ms(exited.get(g.group)),
            "exit_seen": ms(exit_at * 1e9) if exit_at is not None else None,
            "fencing": ms(fencing[0]) if fencing else None,
            "slave_consume": ms(slave_consume[0]) if slave_consume else None,
            "grant": ms(grant),
            "consumer": ms(restored[0]) if restored else None,
            "consumer_answered": ms(restored[1]) if restored else None,
            "acting": acting,
            "answered_by": restored[2] if restored else None,
        }
    return out


def watch_exits(pids: dict[str, int], exited: dict[str, int]) -> list[int]:
    """A pidfd per master, read on this loop: ``exited[group]`` is when the kernel reported
    the process gone (the same event the controller waits for). Returns the fds to close."""
    loop = asyncio.get_running_loop()
    fds = []

    def gone(group: str, fd: int) -> None:
        exited.setdefault(group, time.time_ns())
        loop.remove_reader(fd)

    for group, pid in pids.items():
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            fds.append(fd)
            loop.add_reader(fd, gone, group, fd)
    return fds


def close_fds(fds: list[int]) -> None:
    loop = asyncio.get_running_loop()
    for fd in fds:
        loop.remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)


@dataclass
class Bench:
    plan: ClusterPlan
    zk: ZkGateway
    readers: Readers
    pauses: GeneratorPauses
    controller_pid: int | None
    zookeeper_pid: int | None
    controller_sid: int | None
    restore_timeout_s: float
    ready_timeout_s: float

    async def round(self, n: int, total: int) -> RoundResult:
        """Ready, kill every master, measure, restart them (:meth:`failback`)."""
        res = RoundResult()
        plan, readers = self.plan, self.readers
        label = f"{len(plan.groups)} groups, round {n}/{total}"
        progress(f"{label}: waiting until every group is NORMAL, its master reads and its "
                 "consumer reads from it")
        wrong = await wait_ready(self.zk, plan, readers, within_s=self.ready_timeout_s)
        if wrong:
            res.error = "not ready: " + "; ".join(f"{g}: {w}" for g, w in sorted(wrong.items()))
            return res
        await asyncio.sleep(1.0)  # the last publishes and watches settle
        before = await asyncio.to_thread(scrape, plan)
        masters: dict[str, int] = {}
        for g in plan.groups:
            pid = procs.read_pid(plan.pid_dir, g.master.name)
            info = procs.inspect(pid, marker=g.master.name)
            if info is None or not info.alive:
                res.error = f"master {g.master.name} is not running before the kill"
                return res
            masters[g.group] = info.pid
        sampler = Sampler(self.controller_pid, self.zookeeper_pid)
        slaves = [procs.read_pid(plan.pid_dir, x.name) for g in plan.groups for x in g.slaves]
        slaves0 = sum(c for c in map(cpu_seconds, slaves) if c is not None)
        zk0, ctl0 = zk_mntr(plan), zk_connection(plan, self.controller_sid)
        exited: dict[str, int] = {}
        fds = watch_exits(masters, exited)
        bench0 = time.process_time()
        s0 = sampler.sample()
        mono_kill = time.monotonic()
        kills: dict[str, int] = {}
        readers.arm()
        for group, pid in masters.items():  # the kill: one tight loop, nothing awaited
            kills[group] = time.time_ns()
            procs.send(pid, signal.SIGKILL)
        kill_ns = min(kills.values())
        res.kill_spread_us = round((time.time_ns() - kill_ns) / 1e3, 1)
        for group, t in kills.items():
            readers.probes[group].kill_ns = t
        sampling = asyncio.create_task(sampler.run())
        progress(f"{label}: killed {len(masters)} masters (in {res.kill_spread_us:.0f} us)")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.restore_timeout_s):
                await readers.all_restored.wait()
        res.missing = readers.pending()
        bench_cpu = time.process_time() - bench0
        await asyncio.sleep(1.0)  # the switch phase is observed on the controller's next checks
        await stop_tasks([sampling])
        close_fds(fds)
        settled = sampler.sample()
        res.slaves_cpu_ms_settled = round(
            (sum(c for c in map(cpu_seconds, slaves) if c is not None) - slaves0) * 1000, 1)
        res.settled = window_figures(s0, settled)
        res.zookeeper = zk_delta(zk0, await asyncio.to_thread(zk_mntr, plan))
        ctl1 = await asyncio.to_thread(zk_connection, plan, self.controller_sid)
        if "recved" in ctl0 and "recved" in ctl1:
            res.zookeeper["controller_requests"] = ctl1["recved"] - ctl0["recved"]
            res.zookeeper["controller_requests_per_group"] = round(
                (ctl1["recved"] - ctl0["recved"]) / len(plan.groups), 1)
            res.zookeeper["controller_max_latency_ms_since_connect"] = ctl1.get("maxlat")
        after = await asyncio.to_thread(scrape, plan)
        readers.disarm()
        restored = [p.restored[0] for p in readers.probes.values() if p.restored is not None]
        if restored:
            last = max(restored)
            res.last_readable_ms = round((last - kill_ns) / 1e6, 1)
            s1 = sampler.at(last)
            if s1 is not None:
                res.window = window_figures(s0, s1)
            res.bench_longest_pause_ms = round(
                self.pauses.longest_ms(mono_kill, mono_kill + (last - kill_ns) / 1e9), 1)
        res.bench_cpu_ms = round(bench_cpu * 1000, 1)
        res.groups = await asyncio.to_thread(timeline, plan, kills, exited, exits_seen(after),
                                             readers.probes)
        res.phases = phase_delta(before, after, ("detect", "fence", "switch"))
        w0, w1 = (counter_total(t, names.ROUTE_DOCUMENT_WRITES_TOTAL) for t in (before, after))
        res.route_document_writes = None if w0 is None or w1 is None else w1 - w0
        cons = [v["consumer"] for v in res.groups.values() if isinstance(v["consumer"], float)]
        grants = [v["grant"] for v in res.groups.values() if isinstance(v["grant"], float)]
        progress(f"{label}: consumer-seen p50/max {_ms(percentile(cons, 50))}/{_ms(max(cons, default=None))} ms, "
                 f"READ grant p50/max {_ms(percentile(grants, 50))}/{_ms(max(grants, default=None))} ms, "
                 f"controller CPU {_ms(res.window.get('controller_cpu_ms'))} ms, machine busy "
                 f"{_ms(res.window.get('machine_busy_pct'))}%, CPU pressure "
                 f"{_ms(res.window.get('cpu_pressure_pct'))}%, host steal "
                 f"{_ms(res.window.get('host_steal_ms'))} ms, route document writes "
                 f"{_ms(res.route_document_writes)}"
                 + (f"; no consumer-seen restore for {', '.join(res.missing)}" if res.missing else ""))
        await self.failback(res, masters, after, label)
        return res

    async def failback(self, res: RoundResult, masters: dict[str, int], scraped: str | None,
                       label: str) -> None:
        """Every master restarted, every group NORMAL again (back-sync); the back-sync
        phase's histograms read against ``scraped`` (the scrape after the failover)."""
        progress(f"{label}: restarting {len(masters)} masters")
        restarted = time.monotonic()
        await asyncio.to_thread(restart_masters, self.plan, list(masters.values()))
        wrong = await wait_ready(self.zk, self.plan, self.readers, within_s=self.ready_timeout_s)
        if wrong:
            res.error = "not NORMAL again: " + "; ".join(f"{g}: {w}" for g, w in sorted(wrong.items()))
            return
        res.recovery_s = round(time.monotonic() - restarted, 1)
        await asyncio.sleep(0.5)  # the back-sync phase is observed as NORMAL is written
        res.phases.update(phase_delta(scraped, await asyncio.to_thread(scrape, self.plan),
                                      ("backsync",)))
        progress(f"{label}: every group NORMAL again {res.recovery_s} s after the restart")


def restart_masters(plan: ClusterPlan, pids: Sequence[int]) -> None:
    """Start every master again, as ``up`` started it (each killed incarnation collected
    first)."""
    for g, pid in zip(plan.groups, pids, strict=True):
        procs.wait_gone(pid, marker=g.master.name, timeout=5.0)
        lc.start(plan.dir, g.master.name, wait=False)


# ----------------------------------------------------------------------------- per N


#: ZooKeeper's summaries (``mntr``: ``zk_sum_<name>``, ``zk_cnt_<name>``) a round reports:
#: read and write latency (ms), fsync time (ms), the time reads and writes spent in the
#: commit processor (ms), reads that waited behind a write of their own session (the
#: per-session order: every controller request shares one session), and the watchers
#: notified per changed node (how far each status publish fans out).
ZK_SUMMARIES = ("readlatency", "updatelatency", "fsynctime", "read_commitproc_time_ms",
                "write_commitproc_time_ms", "reads_after_write_in_session_queue",
                "node_changed_watch_count", "jvm_pause_time_ms")


def zk_mntr(plan: ClusterPlan) -> dict[str, float]:
    """ZooKeeper's own counters (``mntr``, every numeric line without its ``zk_``);
    empty when it does not answer."""
    node = plan.zk_nodes[0]
    try:
        text = four_letter(node.host, node.port, "mntr", timeout=2.0)
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        with contextlib.suppress(ValueError):
            out[key.removeprefix("zk_")] = float(value)
    return out


def zk_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """What ZooKeeper did between two ``mntr`` readings: packets, requests per summary and
    their mean."""
    out: dict[str, float | None] = {}
    for key in ("packets_received", "packets_sent"):
        if key in before and key in after:
            out[key] = after[key] - before[key]
    for name in ZK_SUMMARIES:
        cnt = after.get(f"cnt_{name}", 0.0) - before.get(f"cnt_{name}", 0.0)
        total = after.get(f"sum_{name}", 0.0) - before.get(f"sum_{name}", 0.0)
        out[f"{name}_count"] = cnt
        out[f"{name}_mean"] = round(total / cnt, 2) if cnt > 0 else None
    out["max_latency_ms_since_start"] = after.get("max_latency")
    return out


async def controller_session(zk: ZkGateway, plan: ClusterPlan) -> int | None:
    """The controller's ZooKeeper session id: the owner of its (ephemeral) election node
    for the first group."""
    base = controller_path(plan.groups[0].group)
    try:
        kids = sorted(await zk.children(base))
        stat = await asyncio.to_thread(zk.client.exists, f"{base}/{kids[0]}") if kids else None
    except ZkError:
        return None
    return None if stat is None else int(stat.ephemeralOwner)


def zk_connection(plan: ClusterPlan, sid: int | None) -> dict[str, float]:
    """One session's connection as ZooKeeper counts it (``cons``): requests received,
    responses sent, and the latency ZooKeeper measured for it (ms, since it connected)."""
    if sid is None:
        return {}
    node = plan.zk_nodes[0]
    try:
        text = four_letter(node.host, node.port, "cons", timeout=2.0)
    except OSError:
        return {}
    for line in text.splitlines():
        if f"sid=0x{sid:x}," in line and "(" in line:
            fields = dict(kv.split("=", 1) for kv in line[line.index("(") + 1:line.rindex(")")]
                          .split(",") if "=" in kv)
            out = {}
            for key in ("recved", "sent", "avglat", "maxlat"):
                with contextlib.suppress(KeyError, ValueError):
                    out[key] = float(fields[key])
            return out
    return {}


def idle_cpu(plan: ClusterPlan, seconds: float, sid: int | None) -> dict[str, float | None]:
    """The cluster at rest: CPU cores used by the controller, every broker together,
    ZooKeeper and this process over ``seconds``, and ZooKeeper's packets per second,
    watches and connections."""
    groups = {
        "controller": [procs.read_pid(plan.pid_dir, CONTROLLER)],
        "brokers": [procs.read_pid(plan.pid_dir, b.name) for b in plan.brokers],
        "zookeeper": [procs.read_pid(plan.pid_dir, z.name) for z in plan.zk_nodes],
    }

    def total(pids: list[int | None]) -> float:
        return sum(c for c in (cpu_seconds(p) for p in pids) if c is not None)

    before, zk0, ctl0 = {k: total(v) for k, v in groups.items()}, zk_mntr(plan), zk_connection(plan, sid)
    bench0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    out: dict[str, float | None] = {f"{k}_cores": round((total(v) - before[k]) / wall, 3)
                                    for k, v in groups.items()}
    out["bench_cores"] = round((time.process_time() - bench0) / wall, 3)
    zk1, ctl1 = zk_mntr(plan), zk_connection(plan, sid)
    if "recved" in ctl0 and "recved" in ctl1:
        out["zk_controller_requests_per_s"] = round((ctl1["recved"] - ctl0["recved"]) / wall)
    for key in ("packets_received", "packets_sent"):
        if key in zk0 and key in zk1:
            out[f"zk_{key}_per_s"] = round((zk1[key] - zk0[key]) / wall)
    for key in ("watch_count", "num_alive_connections", "znode_count"):
        out[f"zk_{key}"] = zk1.get(key)
    changed = zk_delta(zk0, zk1)
    out["zk_watchers_per_node_change"] = changed.get("node_changed_watch_count_mean")
    out["zk_read_latency_ms_mean"] = changed.get("readlatency_mean")
    out["zk_update_latency_ms_mean"] = changed.get("updatelatency_mean")
    return out


def _quiet_unretrieved(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A client future or task that failed with a lost or refused connection nobody awaits
    any more is expected while masters are killed (the drill quiets such futures too; the
    client's ``Router._ask_route`` tasks end that way here): not a traceback on the screen.
    Anything else goes to the default handler."""
    if context.get("message") in ("Future exception was never retrieved",
                                  "Task exception was never retrieved") \
            and isinstance(context.get("exception"), ConnectionError):
        return
    loop.default_exception_handler(context)


async def measure(plan: ClusterPlan, rounds: int) -> dict[str, Any]:
    n = len(plan.groups)
    asyncio.get_running_loop().set_exception_handler(_quiet_unretrieved)
    pauses = GeneratorPauses()
    watching = asyncio.create_task(pauses.run())
    zk = gateway(plan.zk_connect, timeout_s=10.0)
    await zk.start(timeout_s=30)
    readers = Readers(plan)
    doc: dict[str, Any] = {}
    try:
        await readers.start()
        sid = await controller_session(zk, plan)
        # Sleeping in a worker thread: the consumers go on pulling meanwhile, as in a round.
        doc["idle"] = await asyncio.to_thread(idle_cpu, plan, IDLE_S, sid)
        progress(f"{n} groups at rest: " + ", ".join(f"{k} {v}" for k, v in doc["idle"].items()))
        ctl = procs.read_pid(plan.pid_dir, CONTROLLER)
        zkpid = procs.read_pid(plan.pid_dir, plan.zk_nodes[0].name)
        bench = Bench(plan, zk, readers, pauses, ctl, zkpid, sid, restore_timeout_s=30.0,
                      ready_timeout_s=60.0 + 6.0 * n)
        results: list[RoundResult] = []
        for r in range(1, rounds + 1):
            res = await bench.round(r, rounds)
            results.append(res)
            if res.error is not None:
                progress(f"{n} groups, round {r}: {res.error}; no further rounds")
                break
        doc.update(summarise(n, results, doc["idle"]["controller_cores"]))
        doc["rounds"] = [r.to_json() for r in results]
        return doc
    finally:
        await readers.close()
        await zk.stop()
        await stop_tasks([watching])


def _num(row: dict[str, float | str | None], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, float | int) else None


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": _r(percentile(values, 50)), "p99": _r(percentile(values, 99)),
            "max": _r(max(values, default=None)), "n": len(values)}


def summarise(n: int, results: list[RoundResult], idle_cores: float | None) -> dict[str, Any]:
    rows = [g for r in results for g in r.groups.values()]

    def values(stage: str) -> list[float]:
        return [v for g in rows if (v := _num(g, stage)) is not None]

    stages = {s: _stats(values(s)) for s in STAGES}
    steps: dict[str, dict[str, float | None]] = {}
    for step in STEPS:
        a, b = step.split("->")
        gaps = []
        for g in rows:
            start, end = 0.0 if a == "kill" else _num(g, a), _num(g, b)
            if start is not None and end is not None:
                gaps.append(end - start)
        steps[step] = _stats(gaps)
    # How serial: per round, the SLAVE_CONSUME writes' spread over the groups, per group.
    per_group_ms = []
    for r in results:
        sc = sorted(v for g in r.groups.values() if isinstance(v := g.get("slave_consume"), float))
        if len(sc) >= 2:
            per_group_ms.append((sc[-1] - sc[0]) / (len(sc) - 1))
    def mean(which: str, key: str) -> float | None:
        got = [v for r in results if (v := getattr(r, which).get(key)) is not None]
        return sum(got) / len(got) if got else None

    cpu_ms, window = mean("window", "controller_cpu_ms"), mean("window", "window_s")
    from_first = [v + k for g in rows
                  if (v := _num(g, "consumer")) is not None and (k := _num(g, "kill_offset")) is not None]
    per_group_per_s = (cpu_ms / 1000 / n / window) if cpu_ms is not None and window else None
    phases: dict[str, dict[str, float | None]] = {}
    for ph in PHASES:
        count = sum((r.phases.get(ph, {}).get("count") or 0.0) for r in results)
        total = sum((r.phases.get(ph, {}).get("sum_ms") or 0.0) for r in results)
        phases[ph] = {"count": count, "sum_ms": _r(total),
                      "mean_ms": _r(total / count) if count else None}
    consumer, grant = stages["consumer"], stages["grant"]
    return {
        "groups": n,
        "rounds_completed": sum(1 for r in results if r.error is None),
        "reads_restored_ms_p50": consumer["p50"],
        "reads_restored_ms_p99": consumer["p99"],
        "reads_restored_ms_max": consumer["max"],
        "reads_restored_missing": sum(len(r.missing) for r in results),
        "reads_restored_ms_p99_from_first_kill": _r(percentile(from_first, 99)),
        "grant_ms_p50": grant["p50"],
        "grant_ms_p99": grant["p99"],
        "grant_ms_max": grant["max"],
        "stages_ms": stages,
        "steps_ms": steps,
        "slave_consume_spread_ms_per_group": _r(sum(per_group_ms) / len(per_group_ms), 2)
        if per_group_ms else None,
        "route_document_writes": _r(sum(w) / len(w)) if (w := [
            r.route_document_writes for r in results if r.route_document_writes is not None])
        else None,
        "controller_cpu_ms": _r(cpu_ms),
        "controller_cpu_ms_per_group": _r(cpu_ms / n, 2) if cpu_ms is not None else None,
        "controller_cpu_per_group_per_s": _r(per_group_per_s, 4),
        "controller_cpu_window_s": _r(window, 3),
        "controller_idle_cpu_ms_in_window": _r(idle_cores * window * 1000)
        if idle_cores is not None and window else None,
        "zookeeper_cpu_ms": _r(mean("window", "zookeeper_cpu_ms")),
        "machine_busy_pct": _r(mean("window", "machine_busy_pct")),
        "cpu_pressure_pct": _r(mean("window", "cpu_pressure_pct")),
        "host_steal_ms": _r(mean("window", "host_steal_ms")),
        "settled": {k: _r(mean("settled", k), 3) for k in
                    ("window_s", "controller_cpu_ms", "zookeeper_cpu_ms", "machine_busy_pct",
                     "cpu_pressure_pct", "host_steal_ms")}
        | {"slaves_cpu_ms": _r(sum(x) / len(x) if (x := [r.slaves_cpu_ms_settled for r in results
                                                       if r.slaves_cpu_ms_settled is not None])
                                 else None)},
        "phases": phases,
        "zookeeper": {k: _r(mean("zookeeper", k), 2) for k in
                      sorted({k for r in results for k in r.zookeeper})},
        "kill_spread_us_max": max((r.kill_spread_us for r in results), default=None),
        "bench_cpu_ms_max": max((r.bench_cpu_ms for r in results if r.bench_cpu_ms is not None),
                                default=None),
        "bench_longest_pause_ms": max((r.bench_longest_pause_ms for r in results
                                       if r.bench_longest_pause_ms is not None), default=None),
        "recovery_s_max": max((r.recovery_s for r in results if r.recovery_s is not None),
                              default=None),
        "errors": [r.error for r in results if r.error is not None],
    }




def stagger_for(n: int) -> float:
    """Seconds between two brokers' starts when none is asked for: none up to 20 groups;
    above, 0.5 s. Started all at once, 100 brokers importing on two cores starve their
    own ZooKeeper clients: pings go unanswered, connections drop, and a broker whose
    coordinator is not connected within 10 s exits (``BrokerCoordinator.start``), which
    makes ``up`` fail (seen twice at 50 groups, on a loaded and on a quiet machine)."""
    return 0.0 if n <= 20 else 0.5


def staggered(stagger_s: float, slaves: int) -> Placer:
    """A :data:`~understudy_operator.local.plan.Placer` that starts broker ``gK-i``
    ``stagger_s`` after the broker before it in the plan's order (``sleep``, then ``exec``
    of its usual command: the same PID, and its name stays on its command line for the
    PID checks). A restarted broker (``local start``) waits as long again; everything else
    is placed as usual."""
    def place(name: str) -> Placement:
        m = re.fullmatch(r"g(\d+)-(\d+)", name)
        if m is None or stagger_s <= 0:
            return Placement()
        delay = ((int(m[1]) - 1) * (slaves + 1) + int(m[2])) * stagger_s
        return Placement(prefix=("/bin/sh", "-c", f'sleep {delay:.2f}; exec "$@"', "staggered"))
    return place


def run_one(n: int, rounds: int, *, keep: bool = False,
            stagger_s: float | None = None) -> dict[str, Any]:
    """One cluster of ``n`` groups, its rounds, its figures; the cluster is stopped by its
    recorded PIDs before this returns or raises. ``stagger_s``: see :func:`stagger_for`."""
    stagger = stagger_for(n) if stagger_s is None else stagger_s
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"understudy-bench-scale-{n}-"))
    directory = root / "c"
    load_start, pressure_start = _loadavg(), _pressure_avg60()
    t0 = time.monotonic()
    progress(f"{n} groups: starting a local cluster of {2 * n} brokers in {directory} "
             f"(load average {load_start}" + (f"; one broker every {stagger:g} s" if stagger else "")
             + ")")
    try:
        plan = lc.up(directory, groups=n, slaves=1, sync=True, timeout=60.0 + 10.0 * n,
                     progress=lambda msg: progress(f"{n} groups: {msg}"),
                     placement=staggered(stagger, 1))
        progress(f"{n} groups: cluster up in {time.monotonic() - t0:.0f} s")
        doc = run_on_uvloop(measure(plan, rounds))
    except Exception as exc:  # one size failing must not lose the others' figures
        progress(f"{n} groups: failed: {exc!r}")
        doc = {"groups": n, "errors": [repr(exc)]}
    finally:
        if (directory / STATE_FILE).exists():
            with signals_deferred():
                progress(f"{n} groups: stopping the cluster")
                lc.down(directory)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    doc["start_stagger_s"] = stagger
    doc["loadavg_start"] = load_start
    doc["loadavg_end"] = _loadavg()
    doc["cpu_pressure_avg60_start"] = pressure_start
    doc["cpu_pressure_avg60_end"] = _pressure_avg60()
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    if keep:
        doc["directory"] = str(directory)
    return doc


def run_scale(group_counts: Sequence[int] = DEFAULT_GROUPS, *, rounds: int = 3,
              keep: bool = False, stagger_s: float | None = None) -> dict[str, Any]:
    """Run the bench for each group count; the returned document is what ``main`` writes
    to ``bench-results/scale.json`` (see the module docstring)."""
    if threading.current_thread() is threading.main_thread():
        end_on_sigterm()  # SIGTERM ends the run through the finally blocks: every PID stopped
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    doc: dict[str, Any] = {"target_reads_restored_ms_p99": TARGET_MS, "rounds": rounds,
                           "cpus": os.cpu_count(), "clock_ticks_per_s": CLK_TCK,
                           "loadavg_start": _loadavg(), "per_groups": {}}
    for n in group_counts:
        one = run_one(n, rounds, keep=keep, stagger_s=stagger_s)
        doc["per_groups"][str(n)] = one
        k = key_prefix(n)
        doc[f"{k}_reads_restored_ms_p99"] = one.get("reads_restored_ms_p99")
        doc[f"{k}_grant_ms_p99"] = one.get("grant_ms_p99")
        doc[f"{k}_controller_cpu_ms"] = one.get("controller_cpu_ms")
        doc[f"{k}_controller_cpu_ms_per_group"] = one.get("controller_cpu_ms_per_group")
        doc[f"{k}_controller_cpu_per_group_per_s"] = one.get("controller_cpu_per_group_per_s")
    doc["loadavg_end"] = _loadavg()
    return doc


# ------------------------------------------------------------------------------ print


def _trio(d: dict[str, Any], *keys: str) -> str:
    return " / ".join(_ms(d.get(k)) for k in keys)


def print_report(doc: dict[str, Any]) -> None:
    table = Table("groups", "rounds", "consumer-seen p50 / p99 / max", "grant p50 / p99 / max",
                  "ctl CPU ms", "ms / group", "per group per s", f"p99 <= {TARGET_MS:g}",
                  "load avg (1 min) start -> end",
                  title="failover at scale: every master killed at once (ms after the kill)")
    for n, d in doc["per_groups"].items():
        p99 = d.get("reads_restored_ms_p99")
        per_s = d.get("controller_cpu_per_group_per_s")
        table.add_row(
            n, str(d.get("rounds_completed", 0)),
            _trio(d, "reads_restored_ms_p50", "reads_restored_ms_p99", "reads_restored_ms_max"),
            _trio(d, "grant_ms_p50", "grant_ms_p99", "grant_ms_max"),
            _ms(d.get("controller_cpu_ms")), _ms(d.get("controller_cpu_ms_per_group")),
            "-" if per_s is None else f"{per_s:.3f}",
            "-" if p99 is None else ("yes" if p99 <= TARGET_MS else "no"),
            f"{d['loadavg_start'][0]} -> {d['loadavg_end'][0]}")
    _out.print(table)
    _out.print("consumer-seen: the first pull after the kill that the acting slave answered, dated "
               "when it was sent. grant: the acting slave's first READ line in its permission log. "
               "ctl CPU: the controller's utime+stime from the kill to the last group readable "
               "(consumer-seen), mean over the rounds, in 10 ms ticks; per group per s = CPU "
               "seconds / groups / seconds of that window (the fraction of one core per group).")
    where = Table("groups", *(STAGE_WORDS[s] for s in STAGES),
                  title="where the time goes: each stage's instant after the kill, "
                        "p50 / max ms over every group of every round")
    for n, d in doc["per_groups"].items():
        st = d.get("stages_ms", {})
        where.add_row(n, *(_trio(st.get(s, {}), "p50", "max") for s in STAGES))
    _out.print(where)
    steps = Table("groups", *STEPS, title="the steps between stages, p50 / max ms")
    for n, d in doc["per_groups"].items():
        steps.add_row(n, *(_trio(d.get("steps_ms", {}).get(s, {}), "p50", "max") for s in STEPS))
    _out.print(steps)
    more = Table("groups", "SLAVE_CONSUME writes ms apart per group",
                 "phase means ms " + " / ".join(PHASES), "machine busy % / CPU pressure %",
                 "ZooKeeper CPU ms", "ctl CPU ms at rest for as long",
                 "+1 s: ctl / slaves CPU ms", "bench CPU ms / longest loop pause ms",
                 "back to NORMAL s", "at rest, cores: ctl / brokers / zk / bench",
                 title="the machine, the controller, ZooKeeper and this process from the kill to "
                       "the last group readable (means over the rounds)")
    for n, d in doc["per_groups"].items():
        ph, idle, settled = d.get("phases", {}), d.get("idle", {}), d.get("settled", {})
        more.add_row(
            n, _ms(d.get("slave_consume_spread_ms_per_group")),
            " / ".join(_ms(ph.get(p, {}).get("mean_ms")) for p in PHASES),
            _trio(d, "machine_busy_pct", "cpu_pressure_pct"), _ms(d.get("zookeeper_cpu_ms")),
            _ms(d.get("controller_idle_cpu_ms_in_window")),
            _trio(settled, "controller_cpu_ms", "slaves_cpu_ms"),
            _trio(d, "bench_cpu_ms_max", "bench_longest_pause_ms"), _ms(d.get("recovery_s_max")),
            " / ".join(str(idle.get(k, "-")) for k in
                       ("controller_cores", "brokers_cores", "zookeeper_cores", "bench_cores")))
    _out.print(more)
    for n, d in doc["per_groups"].items():
        idle = d.get("idle", {})
        if idle:
            _out.print(f"{n} groups at rest: ZooKeeper {_ms(idle.get('zk_packets_received_per_s'))} "
                       f"packets/s received, {_ms(idle.get('zk_packets_sent_per_s'))} sent, "
                       f"{_ms(idle.get('zk_watch_count'))} watches "
                       f"({_ms(idle.get('zk_watchers_per_node_change'))} notified per changed "
                       f"node), {_ms(idle.get('zk_num_alive_connections'))} connections, the "
                       f"controller's requests {_ms(idle.get('zk_controller_requests_per_s'))}/s; read / "
                       f"update latency {_ms(idle.get('zk_read_latency_ms_mean'))} / "
                       f"{_ms(idle.get('zk_update_latency_ms_mean'))} ms")
        z = d.get("zookeeper", {})
        if z:
            _out.print(f"{n} groups, ZooKeeper from the kill to 1 s after the last group readable: "
                       f"{_ms(z.get('packets_received'))} packets received; read / update "
                       f"latency {_ms(z.get('readlatency_mean'))} / {_ms(z.get('updatelatency_mean'))}"
                       f" ms (mean), fsync {_ms(z.get('fsynctime_mean'))} ms, write commit "
                       f"{_ms(z.get('write_commitproc_time_ms_mean'))} ms; reads queued behind a "
                       f"write of their own session: {_ms(z.get('reads_after_write_in_session_queue_count'))}"
                       f" (mean {_ms(z.get('reads_after_write_in_session_queue_mean'))}); "
                       f"{_ms(z.get('node_changed_watch_count_mean'))} watchers notified per "
                       f"changed node; JVM pauses {_ms(z.get('jvm_pause_time_ms_count'))}; "
                       f"the controller's requests {_ms(z.get('controller_requests'))} "
                       f"({_ms(z.get('controller_requests_per_group'))} per group)")
    for n, d in doc["per_groups"].items():
        for err in d.get("errors", []):
            _out.print(f"[red]{n} groups: {err}[/]")
    _out.print(f"load average {doc['loadavg_start']} -> {doc['loadavg_end']} on {doc['cpus']} CPUs")


def parse_groups(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or any(not 1 <= n <= 50 for n in out):
        raise argparse.ArgumentTypeError("group counts are 1-50, comma-separated")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--groups", type=parse_groups, default=list(DEFAULT_GROUPS),
                    help="group counts, comma-separated (default 1,10,20,50)")
    ap.add_argument("--rounds", type=int, default=3, help="kill rounds per group count (default 3)")
    ap.add_argument("--keep", action="store_true",
                    help="keep each cluster's directory (data and logs) under $TMPDIR")
    ap.add_argument("--stagger-s", type=float, default=None,
                    help="seconds between two brokers' starts (default: 0 up to 20 groups, "
                         "0.5 s above)")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench-results/scale.json"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    logging.basicConfig(level=logging.WARNING)
    end_on_sigterm()
    doc = run_scale(args.groups, rounds=args.rounds, keep=args.keep, stagger_s=args.stagger_s)
    print_report(doc)
    write_results(doc, args.out)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every cluster was stopped on the way out
        print("interrupted; every process this run started was stopped", file=sys.stderr)
        raise SystemExit(130) from None
