"""The client port's resource limits: what a broker holds per connection and in total,
and when it closes a connection that holds resources without using them.

Why this module exists: a broker serves thousands of connections on one loop, and some
clients misbehave — they open connections and send nothing, send a frame a few bytes a
second, pipeline pulls and never read the answers, or produce faster than the broker can
acknowledge. Each limit here turns one of those into a bounded cost and a documented
behaviour (docs/broker.md, "Limits") instead of unbounded memory, file descriptors or a
dead broker (invariant 5). The limits themselves are
:class:`~understudy_broker.config.ClientLimits`; the decisions here are pure
(:func:`max_connections_for`, :func:`waits_for_memory`, :func:`request_cost`,
:func:`overdue`, :func:`stalled_since`, :class:`Tally`), and :class:`RequestMemory` is the
one stateful piece, the byte budget the connections' read loops wait on.
:mod:`.connections` applies them to sockets.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import math
from dataclasses import dataclass

from understudy_broker import protocol as p
from understudy_broker.config import ClientLimits
from understudy_broker.storage.index import DEFAULT_INDEX_OPEN_FILES

#: File descriptors kept, beside the queue index files, for storage (segments, offsets,
#: schedule), replication, ZooKeeper and the HTTP port.
OTHER_FD_RESERVE = 512


def fd_reserve(index_open_files: int = DEFAULT_INDEX_OPEN_FILES) -> int:
    """Descriptors the client connections never take: the index files a broker holds
    open at most (``--index-open-files``) and :data:`OTHER_FD_RESERVE`."""
    return index_open_files + OTHER_FD_RESERVE


#: The reserve with the default ``--index-open-files``.
FD_RESERVE = fd_reserve()
#: Requests other than PRODUCE up to this size (pulls, heartbeats, routes, commits) are
#: counted in the request memory but never wait for it: a flood of large produces must
#: not starve the consumers and the control plane. Per connection they are bounded by
#: the requests-in-flight limit.
SMALL_REQUEST_BYTES = 64 * 1024
#: How often the limits are enforced (idle, stalled and late-frame connections closed).
SWEEP_EVERY_S = 1.0
#: Refusals and closures are logged as one line per this interval, not one per connection.
LOG_EVERY_S = 10.0


def max_connections_for(configured: int, fd_soft_limit: int, reserve: int = FD_RESERVE) -> int:
    """The connections a broker accepts: ``configured``, but never so many that storage
    and replication would be left without file descriptors (``reserve``:
    :func:`fd_reserve`)."""
    if fd_soft_limit < 0:  # RLIM_INFINITY
        return configured
    return max(1, min(configured, fd_soft_limit - reserve))


def nofile_wanted(max_connections: int, reserve: int = FD_RESERVE) -> int:
    """The RLIMIT_NOFILE soft limit a broker with ``max_connections`` asks for."""
    return max_connections + reserve


_PRODUCES = frozenset({p.Op.PRODUCE, p.Op.PRODUCE_MULTI, p.Op.PRODUCE_BATCH,
                       p.Op.PRODUCE_MULTI_BATCH})


def waits_for_memory(op: int, size: int) -> bool:
    """Whether a request of ``size`` bytes waits for the request memory (PRODUCE and any
    large request do; small requests only count, see :data:`SMALL_REQUEST_BYTES`)."""
    return op in _PRODUCES or size > SMALL_REQUEST_BYTES


def request_cost(op: int, size: int) -> int:
    """What a request of ``size`` bytes costs in the request memory: a PRODUCE counts
    twice, because its messages are decoded into copies that live, with the frame, until
    it is acknowledged (measured: the broker's RSS grew by 2.2-2.4 times the produce
    bytes waiting for a stopped slave)."""
    return 2 * size if op in _PRODUCES else size


class Closure(enum.Enum):
    """Why a connection is closed by the broker (the text goes to the client and log)."""

    IDLE = "sent nothing and had no request in flight"
    STALLED = "read none of its answers"
    FRAME_LATE = "left a frame incomplete"


@dataclass(frozen=True, slots=True)
class Activity:
    """What :func:`overdue` needs to know about one connection at ``now`` (monotonic s).

    ``partial_since``: when the first byte of an incomplete frame arrived (None: no
    partial frame); ``reading``: the broker is reading the socket (not holding it back);
    ``last_active``: the last byte received or answer written; ``stalled_since``: since
    when answers are waiting and none of their bytes left (None: not stalled)."""

    inflight: int
    partial_since: float | None
    reading: bool
    last_active: float
    stalled_since: float | None


def overdue(a: Activity, now: float, limits: ClientLimits) -> Closure | None:
    """Whether a connection is to be closed now, and why.

    A frame must be complete ``frame_timeout_s`` after its first byte, counted only while
    the broker reads (a connection the broker holds back is not late). A connection that
    sends nothing and has nothing in flight for ``idle_timeout_s`` is idle — a long-poll
    PULL, a GET_ROUTE watch or a member heartbeat waiting is a request in flight, not
    idleness. A connection whose answers have not moved for ``idle_timeout_s`` is
    stalled: its client stopped reading."""
    if (a.partial_since is not None and a.reading
            and now - a.partial_since > limits.frame_timeout_s):
        return Closure.FRAME_LATE
    idle = limits.idle_timeout_s
    if not idle:
        return None
    if a.stalled_since is not None and now - a.stalled_since > idle:
        return Closure.STALLED
    if (a.inflight == 0 and a.partial_since is None and a.stalled_since is None
            and now - a.last_active > idle):
        return Closure.IDLE
    return None


def stalled_since(previous: float | None, *, unsent: int, sent_moved: bool,
                  now: float) -> float | None:
    """Since when a connection's answers are stuck: answers wait (``unsent`` bytes) and
    none of their bytes left since the last look (``sent_moved`` false)."""
    if unsent == 0 or sent_moved:
        return None
    return now if previous is None else previous


@dataclass(slots=True)
class Tally:
    """Counts of refusals and closures, logged as one line per :data:`LOG_EVERY_S`
    (a flood of connections must not become a flood of log lines)."""

    counts: collections.Counter[str]
    last_logged: float = -math.inf

    @classmethod
    def new(cls) -> Tally:
        return cls(collections.Counter())

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] += n

    def due(self, now: float) -> str | None:
        """The line to log now (and reset), or None."""
        if not self.counts or now - self.last_logged < LOG_EVERY_S:
            return None
        self.last_logged = now
        line = "; ".join(f"{what}: {n}" for what, n in sorted(self.counts.items()))
        self.counts.clear()
        return line


class RequestMemory:
    """A byte budget for requests being received and handled, shared by every connection
    of a broker.

    A connection takes a frame's cost (:func:`request_cost`) as soon as its header has
    arrived, and gives it back once the request's handler returned. While it waits, it
    does not read its socket: the client's own sends block (TCP back-pressure), the
    broker's memory does not grow. Frames still *arriving* may hold at most half the
    budget, and a frame that arrived whole is served before any arriving one: clients
    that never finish their frames cannot hold every produce back (they hold at most half,
    until their frame deadline). Among each kind, first come, first served. ``take``
    counts without waiting (small requests); usage may exceed the limit by those."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.arriving = 0  # of ``used``: taken by frames not complete yet
        self.waited = 0  # requests that had to wait, for the log
        self._whole: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._parts: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def take(self, n: int, *, arriving: bool = False) -> None:
        self.used += n
        if arriving:
            self.arriving += n

    async def acquire(self, n: int, *, arriving: bool = False) -> None:
        """Wait until ``n`` bytes fit (any frame fits an empty budget)."""
        queue = self._parts if arriving else self._whole
        if not (self._whole or (arriving and self._parts)) and self._fits(n, arriving):
            self.take(n, arriving=arriving)
            return
        self.waited += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        queue.append(entry)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n, arriving=arriving)  # granted as we were cancelled
            else:
                queue.remove(entry)
                self._wake()
            raise

    def arrived(self, n: int) -> None:
        """A frame that took ``n`` while arriving is complete (it still holds them)."""
        self.arriving -= n
        self._wake()

    def release(self, n: int, *, arriving: bool = False) -> None:
        self.used -= n
        if arriving:
            self.arriving -= n
        self._wake()

    def _fits(self, n: int, arriving: bool) -> bool:
        if self.used and self.used + n > self.limit:
            return False
        return not arriving or not self.arriving or self.arriving + n <= self.limit // 2

    def _wake(self) -> None:
        for queue, arriving in ((self._whole, False), (self._parts, True)):
            while queue and self._fits(queue[0][0], arriving):
                n, fut = queue.popleft()
                self.take(n, arriving=arriving)
                fut.set_result(None)
            if queue:
                return  # a whole frame waiting goes before any arriving one
