"""The client port: connections, sessions, and turning frames into answers.

Why this module exists: one place decides how a connection is read and answered, so the
rules that keep a broker alive under bad or heavy input hold for every request: a
malformed frame costs its sender the connection and nothing else (invariant 5), any
unexpected error becomes an ``INTERNAL`` answer instead of a dead broker, and what a
connection may hold is bounded (:mod:`.limits`, docs/broker.md "Limits"):

- at most ``max_connections`` connections; one more is answered ``BUSY`` and closed;
- a connection is not read while it has ``max_inflight_per_connection`` requests being
  handled, while more than ``max_unsent_bytes`` of its answers wait for its client to read
  them (and no PULL answer is built for it meanwhile), or while the broker's request
  memory (``max_request_memory``, reserved from a frame's header) is spent: back-pressure
  — the client's own sends block, the broker's memory does not grow;
- a frame not complete ``frame_timeout_s`` after its first byte, a connection idle or
  not reading its answers for ``idle_timeout_s`` is closed by a sweep once a second.

Concurrency (one asyncio loop): each connection is one read loop feeding a
:class:`~understudy_broker.protocol.FrameDecoder`; each request runs as its own task, so a
long-poll PULL never blocks a PRODUCE pipelined behind it, and answers carry the request
id and may leave out of order. A connection that pulled, fetched or committed offsets is a
*consumer session*: when the broker loses READ it is closed (after its waiting long-polls
answered ``NO_PERMISSION``) so the client re-routes instead of lingering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from understudy_broker import protocol as p
from understudy_broker.config import ClientLimits
from understudy_broker.security import certificate_user
from understudy_broker.server import limits as lim
from understudy_broker.server.auth import Session
from understudy_broker.server.errors import RequestError
from understudy_broker.server.requests import CONSUMER_OPS, LONG_POLLS, OutputRoom

log = logging.getLogger("understudy.broker")

READ_CHUNK = 256 * 1024
#: How long pending long-polls get to answer NO_PERMISSION before their sessions close.
SESSION_CLOSE_GRACE_S = 1.0
#: How long a closing connection's requests and last answers get to finish.
FINISH_GRACE_S = 5.0
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


class _Gone(ConnectionError):
    """The connection closed while an answer waited for room: nobody will read it."""


@dataclass(eq=False, slots=True)
class _Conn:
    """One client connection. ``consumer``: it pulled, fetched or committed offsets, so it
    is closed when this broker loses READ. The rest is what the limits look at."""

    writer: asyncio.StreamWriter
    max_unsent: int
    last_active: float
    session: Session
    mine: set[asyncio.Task[Any]] = field(default_factory=set)
    polls: set[asyncio.Task[Any]] = field(default_factory=set)
    consumer: bool = False
    partial_since: float | None = None
    reading: bool = False
    written: int = 0  # answer bytes handed to the transport
    sent_seen: int = 0  # of those, the ones gone to the kernel at the last sweep
    stalled_since: float | None = None
    closed_for: lim.Closure | None = None

    def unsent(self) -> int:
        return self.writer.transport.get_write_buffer_size()

    async def room(self) -> bool:
        """Wait until this connection's unsent answers are within the limit (the
        transport's high-water mark is the limit, so ``drain`` waits exactly then);
        True when it had to wait."""
        waited = False
        while self.unsent() > self.max_unsent:
            if self.writer.is_closing():
                raise _Gone
            waited = True
            try:
                await self.writer.drain()
            except ConnectionError:
                raise _Gone from None
        if self.writer.is_closing():
            raise _Gone
        return waited

    def activity(self) -> lim.Activity:
        return lim.Activity(len(self.mine), self.partial_since, self.reading,
                            self.last_active, self.stalled_since)


class ClientPort:
    """The broker's client port. ``handle`` answers one request (see
    :class:`~understudy_broker.server.requests.Requests`; the second argument waits for
    room to answer); ``epoch`` stamps every answer."""

    def __init__(
        self,
        *,
        handle: Callable[[p.Frame, OutputRoom, Session], Awaitable[bytes]],
        epoch: Callable[[], int],
        max_frame_bytes: int,
        limits: ClientLimits | None = None,
        tls: ssl.SSLContext | None = None,
        fd_reserve: int = lim.FD_RESERVE,
    ) -> None:
        self._handle = handle
        self._fd_reserve = fd_reserve
        self._tls = tls
        self._epoch = epoch
        self._max_frame_bytes = max_frame_bytes
        self._limits = limits or ClientLimits()
        self._max_connections = self._limits.max_connections
        self._memory = lim.RequestMemory(self._limits.max_request_memory)
        self._tally = lim.Tally.new()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._conns: set[_Conn] = set()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._stopping = False

    @property
    def port(self) -> int | None:
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self._max_connections = lim.max_connections_for(self._limits.max_connections, soft,
                                                        self._fd_reserve)
        if self._max_connections < self._limits.max_connections:
            log.warning(
                "serving at most %d client connections, not %d (--max-connections): the "
                "open-file limit is %d and %d descriptors are kept for storage and "
                "replication; raise it (ulimit -n) to serve more",
                self._max_connections, self._limits.max_connections, soft, self._fd_reserve)
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=READ_CHUNK, backlog=512, ssl=self._tls,
            ssl_handshake_timeout=self._limits.frame_timeout_s if self._tls else None,
        )
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="client-port-sweep")

    def close(self) -> None:
        """Stop accepting connections (those open are still served)."""
        self._stopping = True
        if self._server is not None:
            self._server.close()

    async def stop(self, *, grace_s: float) -> None:
        """Let in-flight requests finish (up to ``grace_s``), then close every connection."""
        self.close()
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=grace_s)
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._connections):
            task.cancel()
        waits = [*self._connections, *([self._sweeper] if self._sweeper else [])]
        if waits:
            await asyncio.wait(waits, timeout=grace_s)

    async def close_consumer_sessions(self, *, still_lost: Callable[[], bool]) -> None:
        """READ was lost: let waiting long-polls answer NO_PERMISSION (the caller already
        woke them), then close every consumer session so clients re-route — unless READ
        came back meanwhile (``still_lost()`` is false)."""
        victims = [c for c in self._conns if c.consumer]
        polls = {t for c in victims for t in c.polls}
        if polls:
            await asyncio.wait(polls, timeout=SESSION_CLOSE_GRACE_S)
        if not still_lost():
            return
        for c in victims:
            c.writer.close()
        if victims:
            log.info("closed %d consumer session(s) after losing READ", len(victims))

    # ---- one connection -------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._conns) >= self._max_connections:
            self._refuse(writer)
            return
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        decoder = p.FrameDecoder(self._max_frame_bytes)
        peer = writer.get_extra_info("peername")
        # A verified client certificate names the connection's user (TLS is done here).
        session = Session.of_certificate(
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
            certificate_user(writer.get_extra_info("ssl_object")))
        conn = _Conn(writer, self._limits.max_unsent_bytes, time.monotonic(), session)
        # drain() then waits exactly while more than the limit is unsent.
        writer.transport.set_write_buffer_limits(high=self._limits.max_unsent_bytes)
        self._conns.add(conn)
        reserved = 0  # request memory held for the incomplete frame at the decoder's head
        try:
            while not self._stopping:
                reserved = await self._hold_back(conn, decoder, reserved)
                conn.reading = True
                try:
                    data = await reader.read(READ_CHUNK)
                finally:
                    conn.reading = False
                if not data:
                    break
                conn.last_active = time.monotonic()
                decoder.feed(data)
                completed = False
                while True:
                    frame = decoder.next_frame()
                    if not isinstance(frame, p.Frame):
                        break
                    completed = True
                    await self._inflight_room(conn)  # one read may carry many frames
                    if reserved:  # taken when its header arrived
                        charge, reserved = reserved, 0
                        self._memory.arrived(charge)
                    else:
                        charge = await self._charge(frame.op, p.HEADER_SIZE + len(frame.body))
                    self._spawn(conn, frame, charge)
                if not decoder.buffered:
                    conn.partial_since = None
                elif completed or conn.partial_since is None:
                    conn.partial_since = time.monotonic()  # a new frame began in this read
        except p.FrameError as exc:
            log.warning("closing connection from %s: %s", peer, exc)
            self._write_error(writer, exc.request_id or 0, exc.code, exc.message)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if reserved:
                self._memory.release(reserved, arriving=True)
            # Nobody will read a long-poll's answer any more; writes and other requests
            # finish (a produce already appended still gets flushed and replicated).
            for t in conn.polls:
                t.cancel()
            if conn.mine:
                await asyncio.wait(set(conn.mine), timeout=FINISH_GRACE_S)
            self._conns.discard(conn)
            await _close(writer)
            if task is not None:
                self._connections.discard(task)

    async def _hold_back(self, conn: _Conn, decoder: p.FrameDecoder, reserved: int) -> int:
        """Wait until ``conn`` may be read (back-pressure): fewer requests in flight than
        the limit, unsent answers within theirs, and request memory for the frame whose
        header has arrived. Returns the memory held for that frame. Time spent here does
        not count against the frame's deadline: the broker, not the client, held it."""
        held = await self._inflight_room(conn)
        held = await conn.room() or held
        head = decoder.pending() if not reserved else None
        if head is not None:
            reserved = await self._charge(*head, arriving=True)
            held = True
        if held and conn.partial_since is not None:
            conn.partial_since = time.monotonic()
        return reserved

    async def _inflight_room(self, conn: _Conn) -> bool:
        """Wait until ``conn`` has fewer requests in flight than the limit; True when it
        had to wait."""
        held = False
        while len(conn.mine) >= self._limits.max_inflight_per_connection:
            held = True
            await asyncio.wait(set(conn.mine), return_when=asyncio.FIRST_COMPLETED)
        return held

    async def _charge(self, op: int, size: int, *, arriving: bool = False) -> int:
        """Take request memory for a request of ``size`` bytes (:func:`~.limits.request_cost`),
        waiting for it unless it is a small one (:func:`~.limits.waits_for_memory`);
        ``arriving``: only its header is here yet."""
        cost = lim.request_cost(op, size)
        if lim.waits_for_memory(op, size):
            await self._memory.acquire(cost, arriving=arriving)
        else:
            self._memory.take(cost, arriving=arriving)
        return cost

    def _spawn(self, conn: _Conn, frame: p.Frame, charge: int) -> None:
        t = asyncio.create_task(self._respond(frame, conn, charge))
        conn.mine.add(t)
        self._inflight.add(t)
        t.add_done_callback(conn.mine.discard)
        t.add_done_callback(self._inflight.discard)
        if frame.op in CONSUMER_OPS:
            conn.consumer = True
        if frame.op in LONG_POLLS:
            conn.polls.add(t)
            t.add_done_callback(conn.polls.discard)

    async def _respond(self, frame: p.Frame, conn: _Conn, charge: int) -> None:
        try:
            out = await self._answer(frame, conn.room, conn.session)
        except _Gone:
            return
        finally:
            self._memory.release(charge)  # the request is handled: its bytes are free
        try:
            await conn.room()  # never more than the limit waiting for the client
        except _Gone:
            return
        conn.writer.write(out)
        conn.written += len(out)
        conn.last_active = time.monotonic()

    async def _answer(self, frame: p.Frame, room: OutputRoom, session: Session) -> bytes:
        epoch = self._epoch()
        try:
            body = await self._handle(frame, room, session)
            return p.encode_response(frame, body=body, epoch=epoch)
        except RequestError as exc:
            status, message = exc.status, exc.message
        except p.FrameError as exc:
            status, message = exc.code, exc.message
        except _Gone:
            raise
        except Exception as exc:
            log.exception("request %s op %s failed", frame.request_id, frame.op)
            status = p.Status.INTERNAL
            message = f"internal error: {type(exc).__name__}: {exc}"
        return p.encode_error(request_id=frame.request_id, op=frame.op, status=status,
                              message=message, epoch=epoch)

    def _write_error(self, writer: asyncio.StreamWriter, request_id: int, status: p.Status,
                     message: str) -> None:
        if not writer.is_closing():
            writer.write(p.encode_error(request_id=request_id, op=0, status=status,
                                        message=message, epoch=self._epoch()))

    # ---- limits ---------------------------------------------------------------------

    def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """One connection over ``max_connections``: a BUSY answer on request id 0, then
        closed at once (the answer is small enough for the socket buffer)."""
        self._tally.add(f"refused: at {self._max_connections} connections (--max-connections)")
        self._write_error(
            writer, 0, p.Status.BUSY,
            f"the broker serves {self._max_connections} client connections, its limit "
            "(--max-connections); retry later or through another broker")
        writer.close()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(lim.SWEEP_EVERY_S)
            try:
                self.sweep(time.monotonic())
            except Exception:  # the limits must outlive a surprise in one sweep
                log.exception("client port sweep failed")

    def sweep(self, now: float) -> None:
        """Close the connections the limits say are overdue; log the tally."""
        limits = self._limits
        for conn in list(self._conns):
            unsent = conn.unsent()
            sent = conn.written - unsent
            conn.stalled_since = lim.stalled_since(
                conn.stalled_since, unsent=unsent, sent_moved=sent != conn.sent_seen, now=now)
            conn.sent_seen = sent
            why = lim.overdue(conn.activity(), now, limits)
            if why is not None and conn.closed_for is None:
                self._close_for(conn, why)
        if self._memory.waited:
            self._tally.add("requests that waited for request memory (--max-request-memory)",
                            self._memory.waited)
            self._memory.waited = 0
        line = self._tally.due(now)
        if line is not None:
            log.warning("client port limits, last %.0f s: %s", lim.LOG_EVERY_S, line)

    def _close_for(self, conn: _Conn, why: lim.Closure) -> None:
        conn.closed_for = why
        after_s, flag = ((self._limits.frame_timeout_s, "--frame-timeout")
                         if why is lim.Closure.FRAME_LATE
                         else (self._limits.idle_timeout_s, "--idle-timeout"))
        what = f"{why.value} for {after_s:g} s"
        self._tally.add(f"closed: {what} ({flag})")
        if why is lim.Closure.STALLED:
            _reset(conn.writer)  # its answers would never leave: drop them, kernel's too
            return
        self._write_error(conn.writer, 0, p.Status.TIMEOUT,
                          f"closing this connection: it {what} ({flag})")
        conn.writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset: what the socket still holds to send is dropped at once (a
    plain close would leave it in the kernel until the client reads or TCP gives up)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close, letting the last answers leave; a client that does not read them within
    :data:`FINISH_GRACE_S` loses them (the transport is aborted: nothing stays held)."""
    writer.close()
    try:
        async with asyncio.timeout(FINISH_GRACE_S):
            with contextlib.suppress(Exception):  # reset by the peer: closed anyway
                await writer.wait_closed()
    except TimeoutError:
        _reset(writer)
