"""Recorded histories of a failover run: typed events, a JSONL writer and a strict reader.

Why this module exists: the drill, the kind chaos suite and the tests all judge a run by
the same invariant checker (:mod:`understudy_harness.checker`). The checker must not care
who recorded the run, so the record is a plain, versionless JSON-lines file with one event
per line, and this module is the single definition of what an event is. Parsing is strict:
a malformed line is a :class:`HistoryError` naming the line and the field, never a silent
skip, because a checker that quietly drops events can report "zero lost" for a run that
lost messages. The only tolerated damage is a torn last line (the recorder was killed
mid-write); it is dropped and counted so the caller can say so.

One clock: every event carries ``t``, integer nanoseconds from a single clock chosen by the
recorder (``time.monotonic_ns`` by default; CLOCK_MONOTONIC is system-wide on Linux, so
processes on one machine agree). The first line may be a ``header`` naming that clock.

Event types (fields besides ``type`` and ``t``):

==============  ============================================================
produce_ack     id, topic, queue, offset — the broker acknowledged the produce
deliver         cgroup, topic, queue, offset, id [, member] — a consumer group
                received it (``member``: the consumer-group member that pulled it),
                dated when the client handed it out, not when it was written down
own             cgroup, topic, queue, member, held — a member began (``held`` true)
                or stopped (false) owning and pulling a queue
commit          cgroup, topic, queue, offset — committed offset (the NEXT offset
                to read, i.e. last delivered + 1)
perm            group, broker, effective (FULL/WRITE/READ/NONE) [, role]
                — a broker's effective permission changed (or was first seen)
mode            group, mode (NORMAL/FENCING/SLAVE_CONSUME/RECOVERING), epoch
fault           cycle, kind (kill/hang/...), broker, group
restart         cycle, broker, group — the faulted broker was restarted/resumed
==============  ============================================================
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

from understudy_broker.model import Mode, Permission


class HistoryError(ValueError):
    """A history event or file is malformed; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ProduceAck:
    t: int
    id: str
    topic: str
    queue: int
    offset: int
    #: A delayed message: when it is due (ms since the epoch, the producer's clock).
    deliver_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Deliver:
    t: int
    cgroup: str
    topic: str
    queue: int
    offset: int
    id: str
    member: str | None = None


@dataclass(frozen=True, slots=True)
class Own:
    t: int
    cgroup: str
    topic: str
    queue: int
    member: str
    held: bool


@dataclass(frozen=True, slots=True)
class Commit:
    t: int
    cgroup: str
    topic: str
    queue: int
    offset: int


@dataclass(frozen=True, slots=True)
class Perm:
    t: int
    group: str
    broker: str
    effective: Permission
    role: str | None = None


@dataclass(frozen=True, slots=True)
class ModeChange:
    t: int
    group: str
    mode: Mode
    epoch: int


@dataclass(frozen=True, slots=True)
class Fault:
    t: int
    cycle: int
    kind: str
    broker: str
    group: str


@dataclass(frozen=True, slots=True)
class Restart:
    t: int
    cycle: int
    broker: str
    group: str


@dataclass(frozen=True, slots=True)
class Nack:
    """A consumer group handed message ``id`` back (it is expected once more)."""

    t: int
    cgroup: str
    id: str


@dataclass(frozen=True, slots=True)
class ReadRestored:
    """A consumer's first pull answered after failed ones: ``t`` is when that pull was
    sent, ``broker`` the broker that answered (reads restored as a consumer sees them)."""

    t: int
    cgroup: str
    topic: str
    queue: int
    broker: str


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic the run used; ``ordered`` ones are judged for order (invariant 7)."""

    t: int
    topic: str
    ordered: bool


Event = (ProduceAck | Deliver | Own | Commit | Perm | ModeChange | Fault | Restart | TopicInfo
         | Nack | ReadRestored)

_TYPES: Final[dict[str, type[Any]]] = {
    "produce_ack": ProduceAck,
    "deliver": Deliver,
    "own": Own,
    "commit": Commit,
    "perm": Perm,
    "mode": ModeChange,
    "fault": Fault,
    "restart": Restart,
    "topic": TopicInfo,
    "nack": Nack,
    "read_restored": ReadRestored,
}
_NAMES: Final[dict[type[Any], str]] = {v: k for k, v in _TYPES.items()}

# field -> expected JSON kind; optional fields are listed in _OPTIONAL.
_FIELDS: Final[dict[str, dict[str, type]]] = {
    "produce_ack": {"id": str, "topic": str, "queue": int, "offset": int},
    "deliver": {"cgroup": str, "topic": str, "queue": int, "offset": int, "id": str},
    "own": {"cgroup": str, "topic": str, "queue": int, "member": str, "held": bool},
    "commit": {"cgroup": str, "topic": str, "queue": int, "offset": int},
    "perm": {"group": str, "broker": str, "effective": str},
    "mode": {"group": str, "mode": str, "epoch": int},
    "fault": {"cycle": int, "kind": str, "broker": str, "group": str},
    "restart": {"cycle": int, "broker": str, "group": str},
    "topic": {"topic": str, "ordered": bool},
    "nack": {"cgroup": str, "id": str},
    "read_restored": {"cgroup": str, "topic": str, "queue": int, "broker": str},
}
_OPTIONAL: Final[dict[str, dict[str, type]]] = {"perm": {"role": str},
                                                 "deliver": {"member": str},
                                                 "produce_ack": {"deliver_at_ms": int}}


def parse_event(doc: Mapping[str, Any], *, where: str = "event") -> Event | None:
    """Turn one JSON object into a typed event.

    Returns ``None`` for a ``header`` line (it carries no event). Raises
    :class:`HistoryError` naming ``where`` and the offending field otherwise.
    """
    kind = doc.get("type")
    if kind == "header":
        return None
    if kind not in _TYPES:
        raise HistoryError(
            f"{where}: unknown event type {kind!r}; expected one of {sorted(_TYPES)}"
        )
    t = doc.get("t")
    if not isinstance(t, int) or isinstance(t, bool):
        raise HistoryError(f"{where}: {kind} needs an integer 't' (nanoseconds), got {t!r}")
    values: dict[str, Any] = {"t": t}
    for name, want in _FIELDS[kind].items():
        values[name] = _field(doc, name, want, where=where, kind=kind)
    for name, want in _OPTIONAL.get(kind, {}).items():
        if doc.get(name) is not None:
            values[name] = _field(doc, name, want, where=where, kind=kind)
    for name in ("queue", "offset", "epoch", "cycle"):
        if (name == "offset" and kind == "produce_ack" and values[name] == -1
                and "deliver_at_ms" in values):
            continue  # a delayed message has no offset until it is due
        if name in values and values[name] < 0:
            raise HistoryError(f"{where}: {kind}.{name} must be >= 0, got {values[name]}")
    try:
        if kind == "perm":
            values["effective"] = Permission.parse(values["effective"])
        if kind == "mode":
            values["mode"] = Mode[values["mode"]]
    except (KeyError, ValueError) as exc:
        raise HistoryError(f"{where}: {kind}: {exc}") from None
    event: Event = _TYPES[kind](**values)
    return event


def _field(doc: Mapping[str, Any], name: str, want: type, *, where: str, kind: str) -> Any:
    if name not in doc:
        raise HistoryError(f"{where}: {kind} is missing field {name!r}")
    value = doc[name]
    if (isinstance(value, bool) and want is not bool) or not isinstance(value, want):
        raise HistoryError(
            f"{where}: {kind}.{name} must be {want.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON object for ``event`` (inverse of :func:`parse_event`)."""
    doc: dict[str, Any] = {"type": _NAMES[type(event)], **asdict(event)}
    if isinstance(event, Perm):
        doc["effective"] = event.effective.label
        if event.role is None:
            del doc["role"]
    if isinstance(event, ModeChange):
        doc["mode"] = event.mode.name
    if isinstance(event, Deliver) and event.member is None:
        del doc["member"]
    if isinstance(event, ProduceAck) and event.deliver_at_ms is None:
        del doc["deliver_at_ms"]
    return doc


def parse_events(docs: Iterable[Mapping[str, Any] | Event]) -> list[Event]:
    """Parse a sequence of JSON objects (already-typed events pass through)."""
    out: list[Event] = []
    for i, doc in enumerate(docs):
        if isinstance(doc, Mapping):
            ev = parse_event(doc, where=f"event {i}")
            if ev is not None:
                out.append(ev)
        else:
            out.append(doc)
    return out


@dataclass(frozen=True, slots=True)
class LoadedHistory:
    """A history file as read: its events, its header, and how many torn lines were dropped."""

    events: list[Event]
    header: dict[str, Any] = field(default_factory=dict)
    torn_tail: int = 0


def read_history(path: Path) -> LoadedHistory:
    """Read a JSONL history strictly.

    A line that is not a JSON object, or an event with a missing or mistyped field, raises
    :class:`HistoryError` with the line number. Only the final line may be torn (no
    trailing newline and not parseable); it is dropped and counted in ``torn_tail``.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read history: {exc.strerror or exc}") from exc
    lines = raw.split(b"\n")
    torn = 0
    events: list[Event] = []
    header: dict[str, Any] = {}
    last = len(lines) - 1
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            doc = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if number - 1 == last:  # no newline after it: the writer died mid-line
                torn += 1
                continue
            raise HistoryError(f"{where}: not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise HistoryError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        if doc.get("type") == "header":
            header = doc
            continue
        ev = parse_event(doc, where=where)
        if ev is not None:
            events.append(ev)
    return LoadedHistory(events=events, header=header, torn_tail=torn)


Clock = Callable[[], int]


class HistoryWriter:
    """Append events to a JSONL file, stamping each with ``t`` from one clock.

    Thread-safe: the drill records from the event loop and from kazoo's watch thread.
    Each event is written as one line and flushed, so a killed recorder leaves at most one
    torn line (which :func:`read_history` tolerates).
    """

    def __init__(
        self, path: Path, *, clock: Clock = time.monotonic_ns, clock_name: str = "monotonic_ns"
    ) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        fresh = not path.exists() or path.stat().st_size == 0
        self._fh: IO[str] | None = path.open("a", encoding="utf-8")
        self._count = 0
        if fresh:  # appending to an existing history (a later merge) adds no second header
            self._write({"type": "header", "t": clock(), "clock": clock_name, "version": 1})

    @property
    def count(self) -> int:
        """Events written (the header excluded)."""
        return self._count

    def now(self) -> int:
        return self._clock()

    def record(self, event: Event) -> None:
        """Write a typed event as is."""
        with self._lock:
            self._write(event_to_dict(event))
            self._count += 1

    def produce_ack(self, *, id: str, topic: str, queue: int, offset: int,
                    deliver_at_ms: int | None = None) -> None:
        self.record(ProduceAck(self.now(), id, topic, queue, offset, deliver_at_ms))

    def nack(self, *, cgroup: str, id: str) -> None:
        self.record(Nack(self.now(), cgroup, id))

    def deliver(self, *, cgroup: str, topic: str, queue: int, offset: int, id: str,
                member: str | None = None, t: int | None = None) -> None:
        self.record(Deliver(self.now() if t is None else t, cgroup, topic, queue, offset, id,
                            member))

    def own(self, *, cgroup: str, topic: str, queue: int, member: str, held: bool,
            t: int | None = None) -> None:
        self.record(Own(self.now() if t is None else t, cgroup, topic, queue, member, held))

    def commit(self, *, cgroup: str, topic: str, queue: int, offset: int,
               t: int | None = None) -> None:
        self.record(Commit(self.now() if t is None else t, cgroup, topic, queue, offset))

    def perm(
        self,
        *,
        group: str,
        broker: str,
        effective: Permission,
        role: str | None = None,
        t: int | None = None,
    ) -> None:
        self.record(Perm(self.now() if t is None else t, group, broker, effective, role))

    def mode(self, *, group: str, mode: Mode, epoch: int) -> None:
        self.record(ModeChange(self.now(), group, mode, epoch))

    def fault(self, *, cycle: int, kind: str, broker: str, group: str) -> None:
        self.record(Fault(self.now(), cycle, kind, broker, group))

    def topic(self, *, topic: str, ordered: bool) -> None:
        self.record(TopicInfo(self.now(), topic, ordered))

    def read_restored(self, *, cgroup: str, topic: str, queue: int, broker: str,
                      t: int | None = None) -> None:
        self.record(ReadRestored(self.now() if t is None else t, cgroup, topic, queue, broker))

    def restart(self, *, cycle: int, broker: str, group: str) -> None:
        self.record(Restart(self.now(), cycle, broker, group))

    def _write(self, doc: dict[str, Any]) -> None:
        if self._fh is None:
            raise HistoryError(f"{self.path}: history writer is closed")
        self._fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def iter_jsonl(events: Iterable[Event]) -> Iterator[str]:
    """JSON lines for ``events`` (for tests and exports)."""
    for ev in events:
        yield json.dumps(event_to_dict(ev), separators=(",", ":"))
