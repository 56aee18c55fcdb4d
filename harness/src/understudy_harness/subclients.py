"""Clients in processes of their own, for the faults only a process can have.

Why this module exists: a producer or consumer paused past its session (SIGSTOP, as a
long GC pause or a frozen VM would) must find, when it wakes, that the brokers handed its
leadership or its queues on and refuse what it sends late. An in-process client cannot be
paused alone, so the drill's ordered scenario runs one producer (``understudy produce``)
and one consumer-group member (``understudy consume``) as subprocesses, stops and
continues them, and merges what they recorded into the history afterwards: the producer
writes a ``produce_ack`` event per acknowledgement, the consumer a line per delivery and
per queue acquired or released (turned into ``deliver`` and ``own`` events here).
Every process started here is stopped by PID (:meth:`SubClient.stop`).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from understudy_harness.history import Deliver, Event, HistoryError, Own, parse_event

#: A count no run reaches: the subprocess runs until it is stopped.
FOREVER = 1_000_000_000


def _understudy() -> str:
    """The ``understudy`` command of this interpreter's environment."""
    return str(Path(sys.executable).with_name("understudy"))


@dataclass
class SubClient:
    """One client subprocess: its member id, what it records, and the process."""

    name: str
    kind: str  # "producer" | "consumer"
    topic: str
    cgroup: str | None
    record: Path
    proc: subprocess.Popen[bytes]
    stopped_at: int | None = None  # time_ns of the kill

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        """SIGKILL (a crash: no commit, no hand-over) and reap; idempotent."""
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process must die too
            self.proc.kill()
            self.stopped_at = time.time_ns()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of its output (progress bars left out), for an error message."""
        log = self.record.with_suffix(".log")
        if not log.exists():
            return "(no output)"
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()
        kept = [t for t in text if t.strip() and "━" not in t]
        return " | ".join(kept[-lines:]) or "(no output)"

    def events(self) -> list[Event]:
        """What it recorded, as history events (a torn last line is dropped). A queue the
        consumer still held when it was killed is released at the kill."""
        lines = list(_lines(self.record))
        if self.kind == "producer":
            out: list[Event] = []
            for doc in lines:
                with contextlib.suppress(HistoryError):
                    ev = parse_event(doc, where=str(self.record))
                    if ev is not None:
                        out.append(ev)
            return out
        return consumer_events(lines, topic=self.topic, cgroup=self.cgroup or "",
                               end_ns=self.stopped_at)


def consumer_events(lines: Sequence[dict[str, Any]], *, topic: str, cgroup: str,
                    end_ns: int | None) -> list[Event]:
    """``understudy consume --record`` lines as ``deliver`` and ``own`` events (pure)."""
    out: list[Event] = []
    held: dict[tuple[str, int], int] = {}
    for doc in lines:
        t = int(float(doc["t"]) * 1e9)
        kind, queue, member = doc.get("kind"), int(doc["queue"]), str(doc["member"])
        if kind == "deliver":
            out.append(Deliver(t, cgroup, topic, queue, int(doc["offset"]), str(doc["id"]),
                               member))
        elif kind in ("acquire", "release"):
            out.append(Own(t, cgroup, topic, queue, member, kind == "acquire"))
            if kind == "acquire":
                held[(member, queue)] = t
            else:
                held.pop((member, queue), None)
    if end_ns is not None:
        out += [Own(max(end_ns, t), cgroup, topic, q, m, False) for (m, q), t in held.items()]
    return out


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    for raw in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            doc = json.loads(raw)
            if isinstance(doc, dict):
                yield doc


def start_producer(directory: Path, bootstrap: Sequence[str], topic: str, *, name: str,
                   rate: float, session_timeout_ms: int,
                   client_args: Sequence[str] = ()) -> SubClient:
    """``understudy produce`` at ``rate``, ids ``<name>-<n>``, recording its acks;
    ``client_args``: TLS and credentials of a secure cluster."""
    record = directory / f"{name}.jsonl"
    cmd = [_understudy(), "produce", "-b", ",".join(bootstrap), *client_args, "-t", topic,
           "--count", str(FOREVER), "--rate", f"{rate:g}", "--id-prefix", name,
           "--member-id", name, "--leader-session-timeout-ms", str(session_timeout_ms),
           "--record", str(record), "--send-timeout", "30", "--window", "2000",
           "--batch-size", "16", "--linger-ms", "2"]
    return SubClient(name, "producer", topic, None, record, _spawn(cmd, directory, name))


def start_consumer(directory: Path, bootstrap: Sequence[str], topic: str, *, cgroup: str,
                   name: str, session_timeout_ms: int, prefix: Sequence[str] = (),
                   client_args: Sequence[str] = ()) -> SubClient:
    """``understudy consume`` as member ``name`` of ``cgroup``, committing every batch and
    recording its deliveries and ownership; after ``prefix`` (``ip netns exec NAME``: a
    member on a host of its own, :mod:`understudy_harness.netns`)."""
    record = directory / f"{name}.jsonl"
    cmd = [*prefix, _understudy(), "consume", "-b", ",".join(bootstrap), *client_args,
           "-t", topic, "-g", cgroup,
           "--count", str(FOREVER), "--idle-timeout", "86400", "--commit-every", "1",
           "--session-timeout-ms", str(session_timeout_ms), "--member-id", name,
           "--record", str(record)]
    return SubClient(name, "consumer", topic, cgroup, record, _spawn(cmd, directory, name))


def _spawn(cmd: list[str], directory: Path, name: str) -> subprocess.Popen[bytes]:
    log = (directory / f"{name}.log").open("ab")
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
