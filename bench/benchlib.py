"""What the benchmark scripts share: a producer at a steady rate, ending on SIGTERM
through their cleanup, and writing their results file."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import gc
import json
import os
import pathlib
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from understudy_broker.client import BrokerError, Producer
from understudy_harness.testing import end_on_sigterm
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import STATE_FILE

T = TypeVar("T")


class GeneratorPauses:
    """The load generator's own pauses: how late its event loop woke from a short sleep.

    Why: the process that sends and times the messages is not the system under test, but
    its pauses land in the figures (an acknowledgement read 40 ms late looks like a 40 ms
    write stall). Two things keep them small and one makes them visible: the history the
    run keeps (every send's and acknowledgement's time, hundreds of thousands of objects)
    is frozen out of the garbage collector's scans every second (``gc.freeze``: a full
    collection over it took 35 ms here); and each pause over ``threshold_s`` is recorded,
    so a figure can be read next to what the generator itself did in its window."""

    def __init__(self, *, tick_s: float = 0.005, threshold_s: float = 0.010) -> None:
        self.tick_s = tick_s
        self.threshold_s = threshold_s
        self.pauses: list[tuple[float, float]] = []  # (monotonic start, seconds late)

    async def run(self) -> None:
        last_freeze = time.monotonic()
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            if now - before - self.tick_s > self.threshold_s:
                self.pauses.append((before, now - before - self.tick_s))
            if now - last_freeze >= 1.0:
                gc.freeze()
                last_freeze = now

    def longest_ms(self, start: float, end: float) -> float:
        """The longest pause that overlapped [start, end], in ms (0 when none)."""
        return max((late * 1000 for at, late in self.pauses
                    if at <= end and at + self.tick_s + late >= start), default=0.0)


def cpu_ticks(stat: str = "/proc/stat") -> list[int] | None:
    """Clock ticks of every CPU so far, by state: the ``cpu`` line of ``/proc/stat`` (user,
    nice, system, idle, iowait, irq, softirq, steal, ...); None where there is none."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 2 or fields[0] != "cpu":
        return None
    return [int(x) for x in fields[1:]]


def steal_ms(ticks: list[int] | None) -> float | None:
    """CPU time the hypervisor ran something else while this machine's CPUs wanted to run
    (the ``steal`` ticks of :func:`cpu_ticks`, all CPUs, in ms), or None where the kernel
    does not say."""
    if ticks is None or len(ticks) < 8:
        return None
    return ticks[7] * 1000 / os.sysconf("SC_CLK_TCK")


def read_steal_ms(stat: str = "/proc/stat") -> float | None:
    """:func:`steal_ms` now."""
    return steal_ms(cpu_ticks(stat))


def steal_between(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Steal (ms) in [start, end] from ``(monotonic, steal ms)`` samples in time order: the
    difference between the last sample at or before ``start`` and the first at or after
    ``end`` (so it may cover up to a sampling interval more); None when the samples do not
    bracket the interval."""
    first = bisect.bisect_right(samples, start, key=lambda s: s[0]) - 1
    last = bisect.bisect_left(samples, end, key=lambda s: s[0])
    if first < 0 or last >= len(samples):
        return None
    return samples[last][1] - samples[first][1]


class HostSteal:
    """The host's steal, sampled every ``interval_s`` in a thread of the bench.

    Why: on a virtual machine the hypervisor can stop this machine's CPUs while other
    guests run. Every process of the cluster stops with them, so an acknowledgement stream
    shows a gap that no part of the system made (measured here on a busy host: 40-170 ms
    of steal inside 12 of 20 kill cycles' stalls, among them every stall over 80 ms). Like
    the slow flushes, a figure is reported whole and beside it without the cycles the host
    disturbed, never instead of it."""

    def __init__(self, *, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (monotonic, steal ms so far)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return read_steal_ms() is not None

    def start(self) -> None:
        if self._thread is None and self.available:
            self._thread = threading.Thread(target=self._run, name="host-steal", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            value = read_steal_ms()
            if value is not None:
                self.samples.append((time.monotonic(), value))
            self._stop.wait(self.interval_s)

    def between(self, start: float, end: float) -> float | None:
        return steal_between(list(self.samples), start, end)

    def per_second(self) -> float | None:
        """Steal over the whole sampling, ms per second of wall time."""
        if len(self.samples) < 2:
            return None
        (t0, v0), (t1, v1) = self.samples[0], self.samples[-1]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else None


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (then arrive as usual): a cleanup
    that stops servers one by one is not cut short by a second Ctrl-C or a SIGTERM
    arriving meanwhile."""
    wanted = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_results(doc: Any, out: pathlib.Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


async def send_at_rate(prod: Producer, topic: str, rate: float, *,
                       stopping: Callable[[], bool],
                       acked: Callable[[int, asyncio.Future[tuple[int, int]]], None],
                       sent: Callable[[int], None] | None = None,
                       window: int = 2000) -> None:
    """Every 5 ms, send what ``rate`` owes (bodies are the ids 1, 2, ...), at most
    ``window`` unacknowledged; ``acked(id, future)`` runs when each send is done (a
    callback on the send's future, not a task per send: on two shared cores the load
    generator's own CPU is taken from the brokers). Returns when ``stopping()`` and every
    send is done."""
    slots = asyncio.Semaphore(window)
    outstanding: set[asyncio.Future[tuple[int, int]]] = set()

    def done(i: int, fut: asyncio.Future[tuple[int, int]]) -> None:
        outstanding.discard(fut)
        slots.release()
        acked(i, fut)

    n = 0
    started = time.monotonic()
    while not stopping():
        await asyncio.sleep(0.005)
        owed = int((time.monotonic() - started) * rate) - n
        for _ in range(max(0, owed)):
            await slots.acquire()
            n += 1
            if sent is not None:
                sent(n)
            try:
                fut = await prod.send(topic, b"%d" % n)
            except (BrokerError, ConnectionError):
                slots.release()
                continue
            outstanding.add(fut)
            fut.add_done_callback(functools.partial(done, n))
    await asyncio.gather(*outstanding, return_exceptions=True)


def machine_figures(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """The machine a run shared: load averages before (``os.getloadavg()`` at its start)
    and now, and the CPU count (the ``loadavg`` and ``cpus`` keys of the results)."""
    return {"loadavg": {"before": [round(x, 2) for x in load_before],
                        "after": [round(x, 2) for x in os.getloadavg()]},
            "cpus": os.cpu_count()}


def run_on_uvloop(main: Coroutine[Any, Any, T]) -> T:
    """Run a load generator on uvloop, as the brokers run: on two shared cores the
    generator's own CPU (a third of a core on asyncio's default loop) is taken from the
    brokers it measures."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


@contextlib.contextmanager
def cluster_directory(name: str, *, keep: bool = False) -> Iterator[pathlib.Path]:
    """A directory for one local cluster, ``$TMPDIR/understudy-bench-<name>-*/c``. When
    the block ends, also by SIGTERM, the cluster started there is stopped by its recorded
    PIDs (and any process whose command line names the directory), and the directory is
    removed unless ``keep``."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix=f"understudy-bench-{name}-")) / "c"
    end_on_sigterm()  # SIGTERM ends the run through the finally below
    try:
        yield directory
    finally:
        with signals_deferred():
            if (directory / STATE_FILE).exists():
                lc.down(directory)
            procs.kill_leftovers(directory)
            if not keep:
                shutil.rmtree(directory.parent, ignore_errors=True)
