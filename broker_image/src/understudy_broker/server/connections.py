"""The client port: connections, sessions, and turning frames into answers.

Why this module exists: one place decides how a connection is read and answered, so the
rules that keep a broker alive under bad or heavy input hold for every request: a
malformed frame costs its sender the connection and nothing else (invariant 5), a client
with too many requests in flight is not read until some finish (back-pressure), and any
unexpected error becomes an ``INTERNAL`` answer instead of a dead broker.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from understudy_broker import protocol as p
from understudy_broker.server.requests import CONSUMER_OPS, RequestError

log = logging.getLogger("understudy.broker")

READ_CHUNK = 256 * 1024
MAX_INFLIGHT_PER_CONNECTION = 1024
#: How long pending long-polls get to answer NO_PERMISSION before their sessions close.
SESSION_CLOSE_GRACE_S = 1.0


@dataclass(eq=False, slots=True)
class _Session:
    """One client connection. ``consumer``: it pulled, fetched or committed offsets, so it
    is closed when this broker loses READ."""

    writer: asyncio.StreamWriter
    polls: set[asyncio.Task[Any]]
    consumer: bool = False


class ClientPort:
    """The broker's client port. ``handle`` answers one request (see
    :class:`~understudy_broker.server.requests.Requests`); ``epoch`` stamps every answer."""

    def __init__(
        self,
        *,
        handle: Callable[[p.Frame], Awaitable[bytes]],
        epoch: Callable[[], int],
        max_frame_bytes: int,
    ) -> None:
        self._handle = handle
        self._epoch = epoch
        self._max_frame_bytes = max_frame_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._sessions: set[_Session] = set()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._stopping = False

    @property
    def port(self) -> int | None:
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=READ_CHUNK, backlog=512
        )

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
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=grace_s)

    async def close_consumer_sessions(self, *, still_lost: Callable[[], bool]) -> None:
        """READ was lost: let waiting long-polls answer NO_PERMISSION (the caller already
        woke them), then close every consumer session so clients re-route — unless READ
        came back meanwhile (``still_lost()`` is false)."""
        victims = [s for s in self._sessions if s.consumer]
        polls = {t for s in victims for t in s.polls}
        if polls:
            await asyncio.wait(polls, timeout=SESSION_CLOSE_GRACE_S)
        if not still_lost():
            return
        for s in victims:
            s.writer.close()
        if victims:
            log.info("closed %d consumer session(s) after losing READ", len(victims))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        decoder = p.FrameDecoder(self._max_frame_bytes)
        mine: set[asyncio.Task[Any]] = set()
        polls: set[asyncio.Task[Any]] = set()
        session = _Session(writer, polls)
        self._sessions.add(session)
        peer = writer.get_extra_info("peername")
        try:
            while not self._stopping:
                if len(mine) >= MAX_INFLIGHT_PER_CONNECTION:
                    # Backpressure: stop reading until this client's requests drain.
                    await asyncio.wait(set(mine), return_when=asyncio.FIRST_COMPLETED)
                    continue
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                decoder.feed(data)
                while True:
                    frame = decoder.next_frame()
                    if not isinstance(frame, p.Frame):
                        break
                    t = asyncio.create_task(self._respond(frame, writer))
                    mine.add(t)
                    self._inflight.add(t)
                    t.add_done_callback(mine.discard)
                    t.add_done_callback(self._inflight.discard)
                    if frame.op in CONSUMER_OPS:
                        session.consumer = True
                    if frame.op == p.Op.PULL:
                        polls.add(t)
                        t.add_done_callback(polls.discard)
        except p.FrameError as exc:
            log.warning("closing connection from %s: %s", peer, exc)
            with contextlib.suppress(ConnectionError):
                writer.write(
                    p.encode_error(
                        request_id=exc.request_id or 0,
                        op=0,
                        status=exc.code,
                        message=exc.message,
                        epoch=self._epoch(),
                    )
                )
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            # Nobody will read a long-poll's answer any more; writes and other requests
            # finish (a produce already appended still gets flushed and replicated).
            for t in polls:
                t.cancel()
            if mine:
                await asyncio.wait(set(mine), timeout=5)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)
            self._sessions.discard(session)

    async def _respond(self, frame: p.Frame, writer: asyncio.StreamWriter) -> None:
        epoch = self._epoch()
        try:
            body = await self._handle(frame)
            out = p.encode_response(frame, body=body, epoch=epoch)
        except RequestError as exc:
            out = p.encode_error(
                request_id=frame.request_id, op=frame.op, status=exc.status, message=exc.message,
                epoch=epoch,
            )
        except p.FrameError as exc:
            out = p.encode_error(
                request_id=frame.request_id, op=frame.op, status=exc.code, message=exc.message,
                epoch=epoch,
            )
        except Exception as exc:
            log.exception("request %s op %s failed", frame.request_id, frame.op)
            out = p.encode_error(
                request_id=frame.request_id, op=frame.op, status=p.Status.INTERNAL,
                message=f"internal error: {type(exc).__name__}: {exc}", epoch=epoch,
            )
        if writer.is_closing():
            return
        writer.write(out)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
