"""The cluster benchmark's producer, as a process of its own.

Why a process: a producer service does not share its event loop with consumer-group
members. When bench/cluster.py ran its producer and its members in one loop, the
members' work (pulls, deliveries, commits, and their reconnects at every failback) sat
between an acknowledgement's arrival and its timestamp, and on two shared cores the one
busy process was the last to get a core: 12-16 kill cycles per run, the layouts
alternated on one machine (2026-11-27, 21:40-21:52 UTC, load 2-3), gave a longest write
stall of 53.1, 58.5 and 57.0 ms with one process and 51.0, 38.7, 35.6 and 36.0 ms with
the producer on its own (docs/cluster.md, "The producer in a process of its own").

The child (``python bench/loadproducer.py --bootstrap A,B --topic T --rate R --out F``)
sends unkeyed messages whose bodies are the ids 1, 2, ... at the rate
(:func:`benchlib.send_at_rate`) and appends to ``F``, every ``FLUSH_S``, one line per
event, times from ``time.monotonic()`` (one clock for every process of the machine):

    S <id> <t>         the send of <id> (before ``Producer.send``)
    A <id> <t>         its acknowledgement
    P <t> <late_s>     the child's event loop woke <late_s> late from a sleep begun at <t>

SIGTERM stops the sending; the child waits for what is outstanding, writes the rest and
exits 0. :class:`ProducerProcess` is the parent's side: it starts and stops the child
(by PID, with the harness's :class:`Process`) and reads its lines as they come.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from benchlib import GeneratorPauses, run_on_uvloop, send_at_rate

from understudy_broker.client import Producer
from understudy_harness.testing import Process

FLUSH_S = 0.05


@dataclass
class ProducerProcess:
    """The parent's handle on the child: what it sent and had acknowledged so far
    (``sends``, ``acks``: id -> monotonic time) and its loop's pauses."""

    bootstrap: list[str]
    topic: str
    rate: float
    out: pathlib.Path
    sends: dict[int, float] = field(default_factory=dict)
    acks: dict[int, float] = field(default_factory=dict)
    pauses: GeneratorPauses = field(default_factory=GeneratorPauses)
    _proc: Process | None = None
    _read: int = 0  # bytes of ``out`` already taken in
    _last_ack: float = 0.0

    def start(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_bytes(b"")
        argv = [sys.executable, str(pathlib.Path(__file__).resolve()),
                "--bootstrap", ",".join(self.bootstrap), "--topic", self.topic,
                "--rate", str(self.rate), "--out", str(self.out)]
        self._proc = Process(name="producer", argv=argv,
                             log_path=self.out.with_suffix(".log")).start(wait_port=False)

    def poll(self) -> None:
        """Take in the complete lines written since the last call."""
        with open(self.out, "rb") as f:
            f.seek(self._read)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._read += end
        for line in data[:end].splitlines():
            kind, a, b = line.split()
            if kind == b"S":
                self.sends[int(a)] = float(b)
            elif kind == b"A":
                t = float(b)
                self.acks[int(a)] = t
                self._last_ack = max(self._last_ack, t)
            elif kind == b"P":
                self.pauses.pauses.append((float(a), float(b)))

    async def caught_up(self, until: float, *, timeout_s: float = 5.0) -> None:
        """Poll until an acknowledgement at or after ``until`` is in (or ``timeout_s``
        passed, e.g. while no send is acknowledged): a window's figures are read only
        once everything the child saw in it has been written."""
        deadline = time.monotonic() + timeout_s
        self.poll()
        while self._last_ack < until and time.monotonic() < deadline:
            self.check()
            await asyncio.sleep(FLUSH_S)
            self.poll()

    def check(self) -> None:
        """Raise if the child exited (its log says why)."""
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"the producer process exited with {self._proc.poll()}:\n"
                               f"{self._proc.log()[-2000:]}")

    def stop(self) -> int | None:
        """SIGTERM: the child stops sending, waits for its outstanding sends and writes
        them; then the rest of its lines are read. SIGKILL if it does not end. Returns
        its exit code (``None`` if it was not running)."""
        if self._proc is None:
            return None
        code = self._proc.stop(timeout_s=30.0)
        self._proc = None
        self.poll()
        return code


async def _child(args: argparse.Namespace, out: TextIO) -> None:
    lines: list[str] = []
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    pauses = GeneratorPauses()

    def flush() -> None:
        lines.extend(f"P {at:.6f} {late:.6f}\n" for at, late in pauses.pauses)
        pauses.pauses.clear()
        out.write("".join(lines))
        out.flush()
        lines.clear()

    async def flusher() -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            flush()

    def acked(i: int, fut: asyncio.Future[tuple[int, int]]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            lines.append(f"A {i} {time.monotonic():.6f}\n")

    def sent(i: int) -> None:
        lines.append(f"S {i} {time.monotonic():.6f}\n")

    background = [asyncio.create_task(pauses.run()), asyncio.create_task(flusher())]
    try:
        async with Producer(args.bootstrap.split(","), linger_ms=1, send_timeout_s=10.0) as prod:
            await send_at_rate(prod, args.topic, args.rate, stopping=lambda: stopping,
                               acked=acked, sent=sent)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        flush()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True, help="HOST:PORT,... of the brokers")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rate", type=float, required=True, help="messages per second")
    ap.add_argument("--out", type=pathlib.Path, required=True, help="the events file (appended)")
    args = ap.parse_args(argv)
    with open(args.out, "a", buffering=1 << 20) as out:
        run_on_uvloop(_child(args, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
