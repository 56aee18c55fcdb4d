"""The Understudy client library: an async producer and consumer that follow permissions.

Why this module exists: applications, the CLIs, the drill and the benchmarks need one
client that knows the failover rules without ever talking to ZooKeeper. It learns the
group's brokers from any broker (GET_ROUTE) and, when a broker answers
``NO_PERMISSION``/``NOT_MASTER`` or a connection is lost, re-fetches the route and tries
brokers in order of effective permission ``FULL, WRITE, READ, NONE`` — writes go to a
broker holding WRITE, reads to one holding READ.

* :class:`Connection`: one TCP connection, requests pipelined by request id.
* :class:`Router`: routes, connection per purpose (write/read), failover order.
* :class:`Producer`: per-topic batches (a batch may span queues), linger, a window of
  in-flight batches, retries with jittered exponential backoff
  (:class:`~understudy_broker.retry.Backoff`) on retriable errors. Retries can
  duplicate a message (at-least-once) and, with more than one batch in flight, reorder.
* :class:`Consumer`: one long-poll pull loop per queue, prefetch, at-least-once
  ``commit()`` of what was delivered, resuming from the group's committed offsets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import socket
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from understudy_broker import protocol as p
from understudy_broker.faultavoid import DEFAULT_STEPS, FaultTable
from understudy_broker.model import Permission, Role, parse_address
from understudy_broker.retry import Backoff
from understudy_broker.scheduling import (
    DEFAULT_MAX_RECONSUME,
    ScheduleError,
    check_deliver_at,
    decode_retry,
    is_system_topic,
    retry_topic,
)
from understudy_broker.security import ClientSecurity, tls_error_message
from understudy_broker.tasks import stop_tasks

log = logging.getLogger("understudy.client")

PERMISSION_ORDER: Final = (Permission.FULL, Permission.WRITE, Permission.READ, Permission.NONE)
#: How long one route watch (a long-polled GET_ROUTE) waits for a change.
ROUTE_WAIT_MS: Final = 20_000
READ_CHUNK: Final = 256 * 1024
#: While no broker has answered a route request, ask one more broker this often.
REFRESH_STAGGER_S: Final = 0.2
#: How long a broker that failed a request is tried after the others.
AVOID_S: Final = 5.0
#: A producer's default linger: how long a batch waits after its first message for more.
#: 5 ms, as Kafka's producer since 4.0 (KIP-1030) and librdkafka since 1.5: at a
#: moderate rate most of a request's cost is per request, not per message (2,000 msg/s
#: to a 2-group topic on 2 cores: 1 ms gave 2.3 messages a request and the brokers and
#: client used 1.66 cores, 5 ms gives 5.8 and 0.92; docs/perf-notes.md). A full batch
#: (``batch_size``) goes at once, so throughput runs do not wait.
DEFAULT_LINGER_MS: Final = 5.0
#: Batches a Producer keeps in flight at once by default (and at most 4 per group).
DEFAULT_MAX_IN_FLIGHT: Final = 8


class BrokerError(Exception):
    """A broker answered with a non-OK status."""

    def __init__(self, status: int, message: str, *, address: str = "") -> None:
        try:
            name = p.Status(status).name
        except ValueError:
            name = f"status {status}"
        super().__init__(f"{name} from {address or 'broker'}: {message}")
        self.status = status
        self.message = message
        self.address = address

    @property
    def retriable(self) -> bool:
        return self.status in p.RETRIABLE


class DamagedRecord(BrokerError):
    """``CORRUPT_RECORD``: the record at ``offset`` of ``topic``/``queue`` is damaged on the
    broker and is not served (docs/storage-and-replication.md, "Corruption").
    :meth:`Consumer.getmany` raises it and stops pulling that queue;
    :meth:`Consumer.skip` moves past it, if the application so decides."""

    def __init__(self, status: int, message: str, *, address: str, topic: str, queue: int,
                 offset: int, skip_to: int | None = None) -> None:
        super().__init__(status, message, address=address)
        self.topic = topic
        self.queue = queue
        self.offset = offset
        #: Where reading goes on past the damage: after the whole damaged batch.
        self.skip_to = offset + 1 if skip_to is None else max(skip_to, offset + 1)

    @classmethod
    def of(cls, exc: BrokerError, topic: str, queue: int, asked: int) -> DamagedRecord:
        """From the broker's answer to a pull of ``topic``/``queue`` from ``asked``."""
        at = p.corrupt_record_offset(exc.message)
        return cls(exc.status, exc.message, address=exc.address, topic=topic, queue=queue,
                   offset=asked if at is None else at,
                   skip_to=p.corrupt_record_skip_to(exc.message))


class SecurityError(BrokerError):
    """This client cannot talk to the broker: authentication was refused
    (``AUTHENTICATION_FAILED``) or the TLS handshake failed. Never retried: another
    attempt would fail the same way."""

    @property
    def retriable(self) -> bool:
        return False


class TlsError(SecurityError):
    """A failed TLS handshake; its text is the TLS error and what to check."""

    def __init__(self, exc: BaseException, address: str) -> None:
        super().__init__(p.Status.AUTHENTICATION_FAILED, tls_error_message(exc, address),
                         address=address)

    def __str__(self) -> str:
        return self.message


#: Refusals of this client rather than of the broker's state: never retried.
REFUSALS: Final = frozenset({p.Status.AUTHENTICATION_FAILED, p.Status.NOT_AUTHORIZED})


def broker_error(status: int, message: str, *, address: str) -> BrokerError:
    """The error for a refused request: a :class:`SecurityError` when it refused this
    client (authentication, ACLs), a :class:`BrokerError` otherwise."""
    cls = SecurityError if status in REFUSALS else BrokerError
    return cls(status, message, address=address)


@dataclass
class _PullBatch:
    """Pulls made on one connection in one event-loop turn, at one epoch: they go
    together in one PULL_MULTI."""

    epoch: int
    timeout_s: float
    parts: list[tuple[bytes, asyncio.Future[p.PullResponse]]] = field(default_factory=list)


class Connection:
    """One connection to one broker; many requests may be in flight at once."""

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_frame_bytes: int,
    ) -> None:
        self.address = address
        self._reader = reader
        self._writer = writer
        self._decoder = p.FrameDecoder(max_frame_bytes)
        self._pending: dict[int, asyncio.Future[p.Frame]] = {}
        self._ids = itertools.count(1)
        self._closed: BaseException | None = None
        self._answered = False  # any frame came back (a TLS port closes a plain client)
        self.client_certificate = False  # set by open(): TLS with a client certificate
        self._tls = writer.get_extra_info("ssl_object") is not None
        self._pull_batch: _PullBatch | None = None
        self._pull_tasks: set[asyncio.Task[None]] = set()
        self._multi_pull = True  # until the broker answers PULL_MULTI with UNKNOWN_OPERATION
        # Pulls are answered with the stored batches (PULL_BATCH, PULL_MULTI_BATCH), which
        # this side checks and decodes (docs/record-batch.md, step 3), until the broker
        # answers them with UNKNOWN_OPERATION (an older broker: PULL, PULL_MULTI).
        self._batch_pull = True
        self._task = asyncio.create_task(self._read_loop())

    @classmethod
    async def open(
        cls,
        address: str,
        *,
        max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
        connect_timeout_s: float = 3.0,
        security: ClientSecurity | None = None,
    ) -> Connection:
        """Connect (over TLS when ``security`` has a context) and, when it names a user,
        authenticate (SCRAM) before returning; :class:`SecurityError` when refused."""
        host, port = parse_address(address)
        tls = security.ssl if security is not None else None
        async with asyncio.timeout(connect_timeout_s):
            try:
                reader, writer = await asyncio.open_connection(
                    host, port, limit=READ_CHUNK, ssl=tls,
                    server_hostname=host if tls is not None else None)
            except ssl.SSLError as exc:
                raise TlsError(exc, address) from None
        conn = cls(address, reader, writer, max_frame_bytes=max_frame_bytes)
        conn.client_certificate = security is not None and security.client_certificate
        if security is not None and security.user is not None:
            try:
                async with asyncio.timeout(connect_timeout_s):
                    await conn._authenticate(security)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _authenticate(self, security: ClientSecurity) -> None:
        """The SCRAM exchange (RFC 5802) in two AUTHENTICATE requests; the server's
        signature is checked too, so a broker that does not know the password is not
        trusted either."""
        assert security.user is not None
        assert security.password is not None
        from scramp import ScramClient, ScramException  # only for SCRAM (slow to import)

        scram = ScramClient([security.mechanism], security.user, security.password)

        async def step(message: str) -> str:
            frame = await self.exchange(
                p.Op.AUTHENTICATE, p.AuthenticateRequest(security.mechanism, message).encode())
            if frame.status != p.Status.OK:
                raise broker_error(frame.status, p.error_message(frame), address=self.address)
            return p.AuthenticateResponse.decode(frame.body).message

        try:
            scram.set_server_first(await step(scram.get_client_first()))
            scram.set_server_final(await step(scram.get_client_final()))
        except ScramException as exc:
            raise SecurityError(p.Status.AUTHENTICATION_FAILED,
                                f"the broker's SCRAM answer is not valid: {exc}",
                                address=self.address) from None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def send(self, op: p.Op, body: bytes, *, epoch: int = 0) -> asyncio.Future[p.Frame]:
        """Write a request; the future resolves with the response frame (any status)."""
        return self._send(op, body, epoch=epoch)[1]

    def _send(
        self, op: p.Op, body: bytes, *, epoch: int
    ) -> tuple[int, asyncio.Future[p.Frame]]:
        if self._closed is not None:
            raise ConnectionError(f"connection to {self.address} is closed: {self._closed}")
        if self._writer.is_closing():  # reset by the peer; our reader has not seen it yet
            raise ConnectionError(f"connection to {self.address} is closed")
        rid = next(self._ids) & 0xFFFFFFFF
        fut: asyncio.Future[p.Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._writer.write(p.encode_frame(request_id=rid, op=op, epoch=epoch, body=body))
        except RuntimeError as exc:
            # uvloop raises this for a transport closed under us (asyncio's own loop drops
            # the write): a lost connection, which every caller retries, not a crash. As a
            # RuntimeError it ended a producer's batch task, whose sends then never
            # resolved (bench/cluster.py hung at its end, once in ~60 kill cycles).
            self._pending.pop(rid, None)
            raise ConnectionError(f"connection to {self.address} is closed: {exc}") from None
        return rid, fut

    async def request(
        self, op: p.Op, body: bytes, *, epoch: int = 0, timeout_s: float = 30.0
    ) -> bytes:
        """Send and wait; returns the OK body or raises BrokerError/ConnectionError.

        The timeout covers writing too: a frozen broker (SIGSTOP, a VM pause) that stops
        reading cannot hold the caller beyond ``timeout_s``."""
        frame = await self.exchange(op, body, epoch=epoch, timeout_s=timeout_s)
        if frame.status != p.Status.OK:
            raise broker_error(frame.status, p.error_message(frame), address=self.address)
        return frame.body

    def pull(self, body: bytes, *, epoch: int, timeout_s: float
             ) -> asyncio.Future[p.PullResponse]:
        """A PULL's answer, decoded, or its error (as ``request(Op.PULL, body)`` raises it).

        The pulls made on this connection in one event-loop turn travel in one PULL_MULTI
        (a consumer's queues on one broker, woken together by one produce, pull again
        together): one request's fixed costs for all of them on both sides, as Kafka's
        fetch carries every partition a consumer reads from a broker. The broker answers
        the whole as soon as any part has records. A broker that does not know PULL_MULTI
        gets one PULL each from then on. Both are sent in their batch form (answered with
        the stored batches, checked and decoded here) to a broker that knows it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[p.PullResponse] = loop.create_future()
        batch = self._pull_batch
        if batch is None or batch.epoch != epoch:
            batch = self._pull_batch = _PullBatch(epoch, timeout_s)
            loop.call_soon(self._send_pulls, batch)
        batch.parts.append((body, fut))
        return fut

    def _send_pulls(self, batch: _PullBatch) -> None:
        if self._pull_batch is batch:
            self._pull_batch = None
        task = asyncio.create_task(self._pulls(batch))
        self._pull_tasks.add(task)
        task.add_done_callback(self._pull_tasks.discard)

    def _older(self, exc: BrokerError, stored: bool) -> bool:
        """Whether ``exc`` says this broker does not know the form of pull just sent
        (``stored``: the batch form): the next form down is used from then on (the batch
        form goes first, then PULL_MULTI)."""
        if exc.status != p.Status.UNKNOWN_OPERATION:
            return False
        if stored:
            if self._batch_pull:
                log.info("%s answers no batch-form pull: asks for messages", self.address)
                self._batch_pull = False
        elif self._multi_pull:
            log.info("%s takes one queue per pull (no PULL_MULTI)", self.address)
            self._multi_pull = False
        return True

    async def _pulls(self, batch: _PullBatch) -> None:
        parts = [(body, fut) for body, fut in batch.parts if not fut.done()]  # not abandoned
        try:
            while len(parts) > 1 and self._multi_pull:
                stored = self._batch_pull
                try:
                    answer = await self.request(
                        p.Op.PULL_MULTI_BATCH if stored else p.Op.PULL_MULTI,
                        p.PullMultiRequest([b for b, _f in parts]).encode(),
                        epoch=batch.epoch, timeout_s=batch.timeout_s)
                except BrokerError as exc:
                    if not self._older(exc, stored):
                        raise
                    continue
                results = p.PullMultiResponse.decode(answer).results
                if len(results) != len(parts):
                    raise p.FrameError(p.Status.BAD_FRAME, f"{len(results)} answers to "
                                       f"a PULL_MULTI of {len(parts)} parts")
                for (_b, fut), (status, part) in zip(parts, results, strict=True):
                    if fut.done():
                        continue
                    if status != p.Status.OK:
                        fut.set_exception(broker_error(
                            status, part.decode("utf-8", "replace"), address=self.address))
                        continue
                    try:
                        fut.set_result(_pulled(part, stored))
                    except p.FrameError as exc:  # this part's answer is damaged
                        fut.set_exception(exc)
                return
            if len(parts) == 1:
                await self._pull_one(*parts[0], batch)
            else:
                await asyncio.gather(*(self._pull_one(body, fut, batch) for body, fut in parts))
        except asyncio.CancelledError:
            _fail_futures(parts, ConnectionError(f"connection to {self.address} closed"))
            raise
        except Exception as exc:  # the request failed as a whole: every part with it
            _fail_futures(parts, exc)

    async def _pull_one(self, body: bytes, fut: asyncio.Future[p.PullResponse],
                        batch: _PullBatch) -> None:
        while True:
            stored = self._batch_pull
            try:
                answer = await self.request(p.Op.PULL_BATCH if stored else p.Op.PULL, body,
                                            epoch=batch.epoch, timeout_s=batch.timeout_s)
                resp = _pulled(answer, stored)
            except BrokerError as exc:
                if stored and self._older(exc, stored):
                    continue
                if not fut.done():
                    fut.set_exception(exc)
            except Exception as exc:
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(resp)
            return

    async def exchange(
        self, op: p.Op, body: bytes, *, epoch: int = 0, timeout_s: float = 30.0
    ) -> p.Frame:
        """Send and wait for the response frame, whatever its status (a ``TIMEOUT``
        :class:`BrokerError` when none arrives within ``timeout_s``)."""
        rid, fut = self._send(op, body, epoch=epoch)
        try:
            async with asyncio.timeout(timeout_s):
                await self._writer.drain()
                frame = await fut
        except TimeoutError:
            raise BrokerError(
                p.Status.TIMEOUT, f"no answer within {timeout_s}s", address=self.address
            ) from None
        except (ConnectionError, OSError) as exc:
            if self._refusing_certificate() and not isinstance(exc, ssl.SSLError):
                raise self._certificate_refused() from exc
            raise
        finally:
            # drain() may raise (the broker died) before the future is awaited: forget it,
            # so the read loop's failure does not leave an unretrieved exception behind.
            if not fut.done():
                self._pending.pop(rid, None)
                fut.cancel()
        return frame

    async def _read_loop(self) -> None:
        reason: BaseException = ConnectionError(f"connection to {self.address} closed by peer")
        if not self._tls:
            reason = ConnectionError(
                f"connection to {self.address} closed by peer before any answer (a broker "
                "that serves TLS closes plain connections: give --tls-ca?)")
        elif self.client_certificate:
            reason = self._certificate_refused()
        try:
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    break
                self._decoder.feed(data)
                while True:
                    frame = self._decoder.next_frame()
                    if not isinstance(frame, p.Frame):
                        break
                    if not self._answered:
                        self._answered = True
                        reason = ConnectionError(f"connection to {self.address} closed by peer")
                    fut = self._pending.pop(frame.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(frame)
                    elif frame.request_id == 0 and frame.status != p.Status.OK:
                        # The broker rejected our stream (BAD_FRAME/TOO_LARGE) and closes.
                        reason = BrokerError(
                            frame.status, p.error_message(frame), address=self.address
                        )
        except p.FrameError as exc:
            reason = ConnectionError(f"bad frame from {self.address}: {exc}")
        except ssl.SSLError as exc:
            reason = TlsError(exc, self.address)
        except (ConnectionError, OSError) as exc:
            if not self._refusing_certificate():
                reason = ConnectionError(f"connection to {self.address} lost: {exc}")
        except asyncio.CancelledError:
            reason = ConnectionError(f"connection to {self.address} closed")
        finally:
            self._fail_all(reason)

    def _refusing_certificate(self) -> bool:
        """TLS 1.3 checks a client certificate after the client's handshake is done: a
        refused one shows as the broker closing (an alert, or a reset when our first
        request crossed it) before it answered anything."""
        return self._tls and self.client_certificate and not self._answered

    def _certificate_refused(self) -> TlsError:
        return TlsError(ConnectionError(
            "the broker closed the connection before any answer: it refused this "
            "client's certificate (not signed by its CA, or expired)"), self.address)

    def _fail_all(self, reason: BaseException) -> None:
        if self._closed is None:
            self._closed = reason
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(
                    reason if isinstance(reason, ConnectionError | BrokerError)
                    else ConnectionError(str(reason))
                )
                # Whoever awaits it still gets the exception; a request whose caller
                # already gave up (send() without await) must not log "Future exception
                # was never retrieved" when a broker dies.
                fut.exception()
        self._writer.close()

    async def close(self) -> None:
        await stop_tasks([self._task])
        if self._closed is None:  # the read loop was cancelled before it ever ran
            self._fail_all(ConnectionError(f"connection to {self.address} closed"))
        await stop_tasks(list(self._pull_tasks))
        try:
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()
        except TimeoutError:
            # A peer that stopped reading keeps our write buffer from draining.
            self._writer.transport.abort()
        except Exception:  # already closed or reset: nothing left to do
            pass


async def request_once(
    address: str,
    op: p.Op,
    body: bytes = b"",
    *,
    epoch: int = 0,
    timeout_s: float = 5.0,
    max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
    security: ClientSecurity | None = None,
) -> p.Frame:
    """One request on a fresh connection, closed afterwards; returns the response frame
    whatever its status. For the few callers that talk to one broker once: a broker
    probing a peer, an acting slave pushing back-sync, tools and tests. Raises
    ``OSError``/``TimeoutError`` when the broker cannot be reached, :class:`BrokerError`
    (``TIMEOUT``) when it does not answer in time."""
    conn = await Connection.open(address, max_frame_bytes=max_frame_bytes,
                                 connect_timeout_s=timeout_s, security=security)
    try:
        return await conn.exchange(op, body, epoch=epoch, timeout_s=timeout_s)
    finally:
        await conn.close()


def failover_order(brokers: Sequence[p.BrokerRoute], need: Permission) -> list[p.BrokerRoute]:
    """Brokers holding ``need`` first, then by effective permission FULL, WRITE, READ,
    NONE; unreachable ones last. Pure, so the order is testable without a socket."""

    def key(b: p.BrokerRoute) -> tuple[int, int, int]:
        perm = Permission(b.permission & 3)
        return (
            0 if b.reachable else 1,
            0 if (perm & need) == need else 1,
            PERMISSION_ORDER.index(perm),
        )

    return sorted(brokers, key=key)


def connect_order(brokers: Sequence[p.BrokerRoute], need: Permission,
                  avoided: Callable[[str], bool]) -> list[p.BrokerRoute]:
    """The brokers to try for ``need``, best first (pure): :func:`failover_order`, with a
    broker that just failed us (``avoided(address)``: a hung one still looks FULL in the
    route until its session ends) moved last. A slave is never tried for WRITE (roles are
    fixed): tried first because the master had just failed, it could only answer
    NOT_MASTER, and a producer counted that against the group.

    What needs no permission (the route watch, membership heartbeats, admin requests)
    goes to the broker holding least, a slave first: the reader is the broker most likely
    to hang, and a route watch parked on a hung master would learn of that master's own
    failover last, keeping its clients on it until their request timeout."""
    if need is Permission.WRITE:
        brokers = [b for b in brokers if b.role != Role.SLAVE]
    if need is Permission.NONE:
        ordered = sorted(brokers, key=lambda b: (
            0 if b.reachable else 1, -PERMISSION_ORDER.index(Permission(b.permission & 3))))
    else:
        ordered = failover_order(brokers, need)
    return sorted(ordered, key=lambda b: avoided(b.address))


class Router:
    """Knows the route and keeps one connection per purpose (write, read)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
        connect_timeout_s: float = 3.0,
        request_timeout_s: float = 30.0,
        security: ClientSecurity | None = None,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address is needed")
        self.security = security
        for a in bootstrap:
            parse_address(a)
        self.bootstrap = list(bootstrap)
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.route: p.RouteResponse | None = None
        self._conns: dict[tuple[str | None, Permission], Connection] = {}
        self._lock = asyncio.Lock()
        self._failed_at: dict[str, float] = {}  # address -> monotonic time it failed us
        self._watch: asyncio.Task[None] | None = None
        self._route_listeners: list[Callable[[p.RouteResponse, p.RouteResponse | None], None]] = []
        # live_queues' answers for the route they were read from (routes are replaced, not
        # changed): a producer asks once per message.
        self._live: tuple[p.RouteResponse | None, dict[str, list[int]]] = (None, {})
        self._route_seen = asyncio.Event()  # set, then replaced, at every route learned

    @property
    def epoch(self) -> int:
        if self.route is None:
            return 0
        return max((b.epoch for g in self.route.groups for b in g.brokers), default=0)

    def epoch_of(self, group: str | None) -> int:
        """The newest epoch the route shows for ``group`` (every group when None)."""
        if group is None or self.route is None:
            return self.epoch
        return max((b.epoch for b in self.route.brokers_of(group)), default=0)

    def group_of(self, topic: str, queue: int) -> str | None:
        return None if self.route is None else self.route.group_of(topic, queue)

    def live_queues(self, topic: str) -> list[int]:
        """The topic's queues that exist (removed ones left out); the same list for as
        long as the route stays (do not change it)."""
        route = self.route
        if route is None or topic not in route.topics:
            return []
        seen, lists = self._live
        if seen is not route:
            lists = {}
            self._live = (route, lists)
        live = lists.get(topic)
        if live is None:
            placed = route.placement.get(topic)
            live = lists[topic] = (list(range(route.topics[topic])) if placed is None
                                   else [q for q, g in enumerate(placed) if g is not None])
        return live

    def queue_on(self, topic: str, group: str | None) -> int | None:
        """The first live queue of ``topic`` on ``group`` (an ordered topic has one per
        group), or None."""
        return next((q for q in self.live_queues(topic)
                     if group is not None and self.group_of(topic, q) == group), None)

    def consume_head(self, topic: str) -> tuple[bool, int | None]:
        """``(ordered, queue)``: whether ``topic`` is an ordered topic, and the queue its
        consumers read now (the consume chain's head group's; None while there is none)."""
        route = self.route
        if route is None or topic not in route.consume_heads:
            return False, None
        return True, self.queue_on(topic, route.consume_heads[topic])

    def send_head(self, topic: str) -> tuple[bool, str | None]:
        """``(ordered, head)``: whether ``topic`` is an ordered topic, and its send head
        (None while no group can take its writes)."""
        route = self.route
        if route is None or topic not in route.send_heads:
            return False, None
        return True, route.send_heads[topic]

    def holds(self, group: str, need: Permission) -> bool:
        """The route shows a reachable broker of ``group`` holding ``need``."""
        return self.route is not None and any(
            b.holds(need) for b in self.route.brokers_of(group))

    def on_route(self, listener: Callable[[p.RouteResponse, p.RouteResponse | None], None]) -> None:
        """``listener(new, old)`` after every route learned; starts the route watch: one
        long-polled GET_ROUTE kept outstanding, so changes arrive as the brokers see them."""
        self._route_listeners.append(listener)
        self.watch()

    def watch(self) -> None:
        """Keep one long-polled GET_ROUTE outstanding (once): the route then follows the
        brokers' permission changes as they see them, and :meth:`pause` can end early."""
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_routes(), name="route-watch")

    async def pause(self, delay_s: float, group: str | None, need: Permission,
                    failed_at_epoch: int) -> None:
        """A retry's backoff: wait ``delay_s``, or less — not at all if the route already
        shows a broker of ``group`` holding ``need`` at an epoch newer than the failed
        attempt's, else until a route arrives that does (READ handed to the acting slave,
        WRITE back on a returning master). With the route watch running, a client follows
        a permission change the moment a broker sees it instead of sleeping out its
        backoff (up to 2 s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay_s
        while (left := deadline - loop.time()) > 0:
            if self.epoch_of(group) > failed_at_epoch and (
                    group is None or self.holds(group, need)):
                return
            seen = self._route_seen
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await seen.wait()

    def _learned(self, route: p.RouteResponse) -> None:
        # A broker of an older version may still show a claim made at a stale epoch.
        route = dataclasses.replace(route, groups=[
            p.GroupRoute(g.group, p.current_claims(g.brokers)) for g in route.groups])
        old = self.route
        if old is not None:
            # A broker whose view lags may not know a topic yet: keep what we know of it
            # rather than guess its queues' groups.
            kept = [t for t in old.topics if t not in route.topics and t in old.placement]
            if kept:
                groups = {g.group: g for g in route.groups}
                groups.update({g.group: g for g in old.groups if g.group not in groups})
                route = dataclasses.replace(
                    route,
                    groups=list(groups.values()),
                    topics={**route.topics, **{t: old.topics[t] for t in kept}},
                    topic_groups={**route.topic_groups,
                                  **{t: old.topic_groups.get(t, []) for t in kept}},
                    placement={**route.placement, **{t: old.placement[t] for t in kept}},
                    # An ordered topic kept must stay ordered: without its heads it would
                    # be sent to round-robin, out of order.
                    send_heads={**route.send_heads,
                                **{t: old.send_heads[t] for t in kept if t in old.send_heads}},
                    consume_heads={**route.consume_heads, **{
                        t: old.consume_heads[t] for t in kept if t in old.consume_heads}})
        self.route = route
        for listener in self._route_listeners:
            listener(route, old)
        seen, self._route_seen = self._route_seen, asyncio.Event()
        seen.set()

    async def _watch_routes(self) -> None:
        backoff = Backoff(0.05, 1.0)
        # Versions count one broker's view changes: they compare only with that broker.
        source, known = "", -1
        while True:
            conn: Connection | None = None
            try:
                conn = await self.connection(Permission.NONE)
                if conn.address != source:
                    source, known = conn.address, -1
                req = p.GetRouteRequest(None, known, ROUTE_WAIT_MS).encode()
                body = await conn.request(p.Op.GET_ROUTE, req,
                                          timeout_s=ROUTE_WAIT_MS / 1000 + self.connect_timeout_s)
                route = p.RouteResponse.decode(body)
                if route.version != known:
                    known = route.version
                    self._learned(route)
                backoff.reset()
                continue
            except (BrokerError, ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                log.debug("route watch: %s", exc)
                if conn is not None and self._conns.get((None, Permission.NONE)) is conn:
                    del self._conns[(None, Permission.NONE)]
                    await conn.close()
            await backoff.sleep()

    async def unless_moved(self, group: str | None, need: Permission, address: str,
                           request: Awaitable[T]) -> T:
        """``request``'s answer from the broker at ``address`` — unless, first, a route
        arrives in which another broker of ``group`` holds ``need`` at a newer epoch (a
        hung master's READ handed to the acting slave): then the request is cancelled and
        :class:`_HolderMoved` raised, so the caller goes to the new holder at once instead
        of waiting out the request timeout."""
        epoch = self.epoch_of(group)
        task = asyncio.ensure_future(request)
        try:
            while not await _answered_first(task, self._route_seen.wait()):
                route = self.route
                if route is not None and group is not None and any(
                        b.holds(need) and b.epoch > epoch and b.address != address
                        for b in route.brokers_of(group)):
                    raise _HolderMoved(f"{need.label} moved from {address} to another broker "
                                       f"of {group!r} while a request waited for its answer")
            return task.result()
        finally:
            await _abandon(task)

    def queues(self, topic: str) -> int | None:
        return None if self.route is None else self.route.topics.get(topic)

    def _addresses(self) -> list[str]:
        known = [b.address for g in (self.route.groups if self.route else []) for b in g.brokers]
        now = time.monotonic()
        return sorted(dict.fromkeys([*known, *self.bootstrap]),
                      key=lambda a: self._avoided(a, now))

    def _avoided(self, address: str, now: float) -> bool:
        """Whether ``address`` failed a request within :data:`AVOID_S` (tried last)."""
        return now - self._failed_at.get(address, -AVOID_S) < AVOID_S

    async def _connect(self, address: str) -> Connection:
        return await Connection.open(
            address,
            max_frame_bytes=self.max_frame_bytes,
            connect_timeout_s=self.connect_timeout_s,
            security=self.security,
        )

    async def refresh(self) -> p.RouteResponse:
        """Ask known brokers, then bootstrap ones, for the route; first answer wins. One
        more broker is asked every :data:`REFRESH_STAGGER_S` while none has answered, so
        a hung broker (it accepts connections and never answers) costs a stagger, not a
        whole timeout: every member heartbeat and pull loop re-routes through here."""
        errors: list[str] = []
        refused: list[SecurityError] = []
        addresses = iter(self._addresses())
        asked: dict[asyncio.Task[p.RouteResponse], str] = {}
        pending: set[asyncio.Task[p.RouteResponse]] = set()
        try:
            while True:
                address = next(addresses, None)
                if address is not None:
                    task = asyncio.create_task(self._ask_route(address))
                    asked[task] = address
                    pending.add(task)
                if not pending:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=REFRESH_STAGGER_S if address is not None else None,
                    return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if exc is None:
                        route = task.result()
                        self._learned(route)
                        return route
                    if not isinstance(exc, (OSError, TimeoutError, BrokerError,
                                            ConnectionError, p.FrameError)):
                        raise exc
                    if isinstance(exc, SecurityError):
                        refused.append(exc)
                    errors.append(f"{asked[task]}: {exc or type(exc).__name__}")
        finally:
            await stop_tasks(pending)
        if refused and len(refused) == len(errors):
            raise refused[0]  # every broker refused this client: say why, not "no answer"
        raise ConnectionError("no broker answered GET_ROUTE: " + "; ".join(errors))

    async def _ask_route(self, address: str) -> p.RouteResponse:
        # A connection this router holds to the broker already answers (requests are
        # pipelined): a new one costs a TLS handshake and a SCRAM exchange on a secure
        # cluster, on every re-route of every pull loop.
        held = next((c for c in self._conns.values()
                     if c.address == address and not c.closed), None)
        conn = held or await self._connect(address)
        try:
            body = await conn.request(
                p.Op.GET_ROUTE, p.GetRouteRequest().encode(), timeout_s=self.connect_timeout_s)
            return p.RouteResponse.decode(body)
        finally:
            if held is None:
                await conn.close()

    async def learn_topic(self, topic: str, need: Permission) -> int:
        """The topic's queue count. A broker may learn a topic a moment after another
        (a slave from its master, a cluster topic from its ZooKeeper watch), so when the
        route lacks the topic, ask the broker that serves ``need``, then every known
        broker, and adopt the first route that has it (with its placement)."""
        await self.refresh()
        n = self.queues(topic)
        if n is not None:
            return n
        ask = p.GetRouteRequest(topic).encode()
        found: p.RouteResponse | None = None
        with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError):
            found = p.RouteResponse.decode(await self.request(need, p.Op.GET_ROUTE, ask))
        for address in ([] if found is not None and topic in found.topics else self._addresses()):
            with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError,
                                     p.FrameError):
                frame = await request_once(address, p.Op.GET_ROUTE, ask,
                                           timeout_s=self.connect_timeout_s,
                                           security=self.security)
                if frame.status == p.Status.OK:
                    found = p.RouteResponse.decode(frame.body)
                    if topic in found.topics:
                        break
        if found is None or topic not in found.topics:
            raise BrokerError(p.Status.UNKNOWN_TOPIC, f"unknown topic {topic!r}")
        base = self.route or found
        groups = {g.group: g for g in base.groups}
        groups.update({g.group: g for g in found.groups if g.brokers or g.group not in groups})
        self.route = p.RouteResponse(
            list(groups.values()),
            {**base.topics, topic: found.topics[topic]},
            {**base.topic_groups, topic: list(found.topic_groups.get(topic, ()))},
            {**base.placement, **({topic: found.placement[topic]}
                                  if topic in found.placement else {})},
            base.version,
        )
        return found.topics[topic]

    async def connection(self, need: Permission, group: str | None = None) -> Connection:
        """A live connection to the best broker for ``need`` (WRITE or READ; NONE: any),
        among ``group``'s brokers (every broker when None)."""
        key = (group, need)
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            return conn
        async with self._lock:
            conn = self._conns.get(key)
            if conn is not None and not conn.closed:
                return conn
            if self.route is None:
                await self.refresh()
            route = self.route
            if route is None:
                brokers: list[p.BrokerRoute] = []
            elif group is None:
                brokers = [b for g in route.groups for b in g.brokers]
            else:
                brokers = list(route.brokers_of(group))
            if not brokers and need is Permission.NONE:
                brokers = [p.BrokerRoute(a, a, "", 0, 0) for a in self.bootstrap]
            errors = []
            now = time.monotonic()
            for b in connect_order(brokers, need, lambda a: self._avoided(a, now)):
                try:
                    conn = await self._connect(b.address)
                except (OSError, TimeoutError) as exc:
                    errors.append(f"{b.address}: {exc or type(exc).__name__}")
                    continue
                self._conns[key] = conn
                return conn
            where = f" of group {group!r}" if group is not None else ""
            raise ConnectionError(f"no broker{where} reachable: " + ("; ".join(errors) or "none known"))

    def address_for(self, need: Permission, group: str | None = None) -> str | None:
        """The broker currently used for ``need`` in ``group`` (any group when None; None
        when not connected)."""
        for (g, n), conn in self._conns.items():
            if n is need and (group is None or g == group) and not conn.closed:
                return conn.address
        return None

    async def failed(self, need: Permission, conn: Connection | None,
                     group: str | None = None, error: BaseException | None = None) -> None:
        """``conn`` (used for ``need``) was refused or lost: drop it and re-learn the route.

        Only that connection is dropped: with one pull loop per queue, several loops see
        the same failure, and the first one may already have opened a fresh connection
        that the others must not close. ``conn`` is ``None`` when connecting failed.

        A refusal that says nothing about the route or the connection (``error``: a
        :class:`BrokerError` such as NOT_ENOUGH_REPLICAS or STORAGE_FULL, from a broker
        that did answer) keeps the connection: it is shared, and closing it failed every
        other request on it — a consumer's commit refused for want of replicas broke all
        of its pull loops, over and over, while the slave was down."""
        if isinstance(error, BrokerError) and not _drops_connection(error):
            return
        if conn is not None:
            self._failed_at[conn.address] = time.monotonic()
            if self._conns.get((group, need)) is conn:
                del self._conns[(group, need)]
            await conn.close()
        with contextlib.suppress(ConnectionError):
            await self.refresh()

    async def request(self, need: Permission, op: p.Op, body: bytes) -> bytes:
        conn = await self.connection(need)
        return await conn.request(op, body, epoch=self.epoch, timeout_s=self.request_timeout_s)

    async def close(self) -> None:
        if self._watch is not None:
            await stop_tasks([self._watch])
            self._watch = None
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.close()


async def create_topic(bootstrap: Sequence[str], *, topic: str, queues: int,
                       security: ClientSecurity | None = None) -> p.CreateTopicResponse:
    """Create (or grow) a topic on the group's writer."""
    router = Router(bootstrap, security=security)
    try:
        body = await _with_retries(
            router, Permission.WRITE, p.Op.CREATE_TOPIC, p.CreateTopicRequest(topic, queues).encode()
        )
        return p.CreateTopicResponse.decode(body)
    finally:
        await router.close()


async def _with_retries(
    router: Router, need: Permission, op: p.Op, body: bytes, *, retries: int = 5,
    group: str | None = None,
) -> bytes:
    backoff = Backoff(0.05, 1.0)
    for attempt in itertools.count():
        conn: Connection | None = None
        try:
            conn = await router.connection(need, group)
            return await conn.request(op, body, epoch=router.epoch_of(group),
                                      timeout_s=router.request_timeout_s)
        except BrokerError as exc:
            if not exc.retriable or attempt >= retries:
                raise
            error: BaseException = exc
        except (ConnectionError, OSError, TimeoutError) as exc:
            if attempt >= retries:
                raise
            error = exc
        await router.failed(need, conn, group, error)
        await backoff.sleep()
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- producer


def _drops_connection(exc: BrokerError) -> bool:
    """Whether a refusal means this connection should go: the broker is not the one for
    the request now (a routing status), or it did not answer in time (TIMEOUT: possibly
    hung). Any other refusal came from a broker that answered and is right for it."""
    return exc.status in p.ROUTING or exc.status in (p.Status.TIMEOUT, p.Status.UNKNOWN_TOPIC)


def _worth_retrying(exc: BrokerError) -> bool:
    """A refused produce worth another attempt: a retriable status, or UNKNOWN_TOPIC for a
    topic the route holds (``send`` checked it): a broker whose watch has not caught up
    with a topic just created. Attempts stay bounded by the retries and the send timeout."""
    return exc.retriable or exc.status == p.Status.UNKNOWN_TOPIC


class _Room:
    """Places for messages waiting to be acknowledged (``max_buffered``): taken by each
    send, given back as each is answered; a send finding none waits, first come first
    served. ``asyncio.Semaphore`` does the same, but its ``acquire`` builds a generator
    over its waiters on every call (a take and a give: 0.57 µs with it, 0.25 with this,
    measured alone; once per message sent)."""

    def __init__(self, places: int) -> None:
        self._free = places
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def take(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give()  # a place was handed over as the waiter was cancelled: pass it on
            raise

    def give(self, _answered: object = None) -> None:
        """A place is free again: it goes to the first waiter still waiting."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1


def commit_point(position: int, not_handed_back: Iterable[int], committed: int | None) -> int | None:
    """The offset a queue's commit stores now, or ``None`` when there is nothing new: its
    next offset to deliver, but not past a record whose nack failed (the group must read
    that one again); a commit already past such a record is not taken back."""
    point = min(position, min(not_handed_back, default=position))
    if point == committed:
        return None
    if point < position and committed is not None and point < committed:
        return None
    return point


def _pulled(answer: bytes, stored: bool) -> p.PullResponse:
    """A PULL answer, in the batch form (the stored items: checked and decoded here) or
    the other."""
    return p.decode_pull_batches(answer) if stored else p.PullResponse.decode(answer)


def _queue_of(item: _Pending) -> int:
    return item.queue


def _resolve(items: list[_Pending], resp: p.ProduceResponse) -> None:
    """An acknowledged batch: each message's future gets its (queue, offset)."""
    for i, (q, off) in zip(items, resp.offsets, strict=False):
        if not i.future.done():
            i.future.set_result((q, -1 if off == p.SCHEDULED_OFFSET else off))


@dataclass(slots=True)
class _Pending:
    queue: int
    key: bytes | None
    body: bytes
    future: asyncio.Future[tuple[int, int]]
    pinned: bool  # keyed or explicit queue: never moves to another queue
    deadline: float  # monotonic: fail after this (the send timeout)
    attempts: int = 0
    hedged: bool = False  # a copy went to another group while this one hangs
    deliver_at: int = 0  # ms since the epoch: a delayed message (docs/delayed.md); 0 now
    # The idempotent producer's number for this message on each queue it was sent to
    # (invariant 8): kept through every retry, and shared by the copies a retry elsewhere
    # or a hedge makes, so a copy that comes back to a queue carries the number it had
    # there (the master then recognises it) instead of a new one.
    seqs: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Batch:
    items: list[_Pending] = field(default_factory=list)
    nbytes: int = 0
    timer: asyncio.TimerHandle | None = None


class _GroupMember:
    """A member of a group the brokers hold (docs/cluster.md): it joins through any
    broker, keeps one long-polled heartbeat outstanding, and holds a lease that ends a
    margin before the brokers would expire it. A consumer-group member
    (:class:`Consumer`) and the producer leadership of an ordered topic
    (:class:`_ProducerLeadership`) are both one."""

    router: Router
    member_id: str
    session_timeout_s: float
    _generation: int
    _lease_until: float

    def _lease_valid(self) -> bool:
        return time.monotonic() < self._lease_until

    def _request(self, *, join: bool, wait_ms: int
                 ) -> tuple[p.MemberHeartbeatRequest, Callable[[], None]]:
        """The heartbeat to send, and what to do once it is answered."""
        raise NotImplementedError

    async def _apply(self, resp: p.MemberHeartbeatResponse) -> None:
        raise NotImplementedError

    async def _drop_all(self, why: str) -> None:
        raise NotImplementedError

    async def _beat(self, *, join: bool = False, wait_ms: int = 0) -> p.MemberHeartbeatResponse:
        req, answered = self._request(join=join, wait_ms=wait_ms)
        sent = time.monotonic()
        conn = await self.router.connection(Permission.NONE)
        try:
            resp = p.MemberHeartbeatResponse.decode(await conn.request(
                p.Op.MEMBER_HEARTBEAT, req.encode(),
                timeout_s=wait_ms / 1000 + self.session_timeout_s / 8))
        except BrokerError as exc:
            if exc.status == p.Status.TIMEOUT:  # a hung broker: ask another one next time
                await self.router.failed(Permission.NONE, conn)
            raise
        except (ConnectionError, OSError, p.FrameError):
            await self.router.failed(Permission.NONE, conn)
            raise
        if self._lease_until and not self._lease_valid():
            # Our lease ended while this was on its way (a cut, a hung broker, a re-join
            # after UNKNOWN_MEMBER): what we held ended then, and the brokers may have
            # handed it on. Let it go before the new lease begins, not on the answer.
            await self._drop_all("its lease ended before a heartbeat was answered")
        # The brokers count us alive from the arrival of this request; we stop a margin
        # earlier, counted from when we sent it.
        self._lease_until = max(self._lease_until, sent + self.session_timeout_s * 0.8)
        answered()
        return resp

    async def _join(self) -> None:
        await self._apply(await self._beat(join=True))

    async def _heartbeat_loop(self) -> None:
        backoff = Backoff(0.05, 1.0)
        # A heartbeat stuck on a hung broker is given up after wait + S/8, and the member
        # joins through another broker at once. Worst case: the last answered heartbeat
        # was sent at T (answered at T + wait, a long poll), the next one hangs and is
        # given up at T + 2 wait + S/8 = T + 0.46 S, leaving a third of the session for
        # the join elsewhere before the lease ends (T + 0.8 S). With S/3 + S/3 a hung
        # broker took the whole lease; with S/4 the join had 0.17 S: members fell out.
        wait_ms = int(min(self.session_timeout_s / 6, 5.0) * 1000)
        while True:
            try:
                if not self._lease_valid():
                    await self._drop_all("its lease ended (no heartbeat answered in time)")
                    await self._join()
                else:
                    await self._apply(await self._beat(wait_ms=wait_ms))
                backoff.reset()
                continue
            except BrokerError as exc:
                if exc.status == p.Status.UNKNOWN_MEMBER:
                    # Our hosting broker died or hung and we reached another one. While our
                    # lease holds, the brokers still count us a member (none expired us):
                    # join here (it takes our node over) and keep what we own; past the
                    # lease the loop above dropped it first.
                    log.info("member %s moves to another broker: %s", self.member_id, exc.message)
                    with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError):
                        await self._join()
                        continue
                else:
                    log.info("heartbeat of %s: %s", self.member_id, exc)
            except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                log.info("heartbeat of %s: %s; trying another broker", self.member_id, exc)
            await backoff.sleep()

    async def _leave(self, group: str, *, producer: bool = False) -> None:
        conn = await self.router.connection(Permission.NONE)
        await conn.request(p.Op.LEAVE_GROUP,
                           p.LeaveGroupRequest(group, self.member_id, producer).encode(),
                           timeout_s=5.0)


def _member_id() -> str:
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{os.urandom(3).hex()}"


class _ProducerLeadership(_GroupMember):
    """The right to send to one ordered topic (docs/ordered.md): the producers of the
    topic are a group the brokers hold (``/producers/<topic>``) whose one unit is that
    right. The member that owns it is the active producer; the others stand by and take
    over when its session ends or it leaves. Every PRODUCE carries ``(member,
    generation)``, and the brokers refuse it unless the member owns the unit, so a
    former leader woken from a pause is refused."""

    def __init__(self, router: Router, topic: str, *, member_id: str,
                 session_timeout_s: float) -> None:
        self.router = router
        self.topic = topic
        self.member_id = member_id
        self.session_timeout_s = session_timeout_s
        self._generation = -1
        self._lease_until = 0.0
        self._owns = False
        self._revoking = False
        self._release = False
        self._changed = asyncio.Event()
        self._heartbeat: asyncio.Task[None] | None = None
        self.term = 0  # grows each time the unit becomes ours
        self._recheck = False

    @property
    def active(self) -> bool:
        return self._owns and not self._revoking and self._lease_valid()

    @property
    def lease(self) -> p.ProduceLease:
        return (self.member_id, self._generation)

    def _request(self, *, join: bool, wait_ms: int
                 ) -> tuple[p.MemberHeartbeatRequest, Callable[[], None]]:
        release = self._release and self._owns
        unit = self.router.live_queues(self.topic)[:1]
        req = p.MemberHeartbeatRequest(
            self.topic, self.member_id, [self.topic], int(self.session_timeout_s * 1000),
            join=join, released=[(self.topic, q) for q in unit] if release else [],
            generation=self._generation, wait_ms=wait_ms, producer=True)

        def answered() -> None:
            if release:
                self._release = False
        return req, answered

    def _changed_now(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _apply(self, resp: p.MemberHeartbeatResponse) -> None:
        owns = any(t == self.topic for t, _q in resp.owned)
        self._revoking = any(t == self.topic for t, _q in resp.revoking)
        if owns and not self._owns:
            self.term += 1
            log.info("producer %s is the active producer of %s (generation %d)",
                     self.member_id, self.topic, resp.generation)
        self._owns = owns
        self._generation = resp.generation
        self._changed_now()

    async def _drop_all(self, why: str) -> None:
        if self._owns:
            log.warning("producer %s of %s stops sending: %s", self.member_id, self.topic, why)
        self._owns = False
        self._generation = -1
        self._changed_now()

    def start(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._run(), name=f"producer-lease-{self.topic}")

    async def _run(self) -> None:
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                await self._join()
                break
            except (BrokerError, ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                log.info("producer %s of %s: joining: %s", self.member_id, self.topic, exc)
                await backoff.sleep()
        await self._heartbeat_loop()

    async def wait_active(self, deadline: float) -> bool:
        """Wait until this producer may send (True) or until ``deadline`` (monotonic)."""
        while not self.active:
            if self._owns and self._revoking and not self._release:
                self._release = True  # asked back (nothing of ours in flight): hand it on
            if self._release or self._recheck:
                self._recheck = False
                with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError):
                    await self._apply(await self._beat())
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.1)):
                    await changed.wait()
        return True

    def refused(self) -> None:
        """A broker refused our lease: stop sending, and ask at once what we own."""
        self._owns = False
        self._recheck = True

    async def abort(self) -> None:
        """Stop heartbeats without leaving (a crash, for tests and drills)."""
        if self._heartbeat is not None:
            await stop_tasks([self._heartbeat])
            self._heartbeat = None

    async def close(self) -> None:
        if self._heartbeat is not None:
            await stop_tasks([self._heartbeat])
            self._heartbeat = None
        if self._lease_valid():
            with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError):
                await self._leave(self.topic, producer=True)
        self._owns = False


class Producer:
    """Async producer. ``await send(...)`` returns a future of ``(queue, offset)``.

    A topic's queues may live on several groups (a cluster topic). An unkeyed send goes
    round-robin over the queues whose group shows a writer and is not isolated by send-side
    fault avoidance (:mod:`understudy_broker.faultavoid`); a failed batch is re-sent to
    queues of another group (``retries`` times), so one dead master does not stop writes.
    A keyed send (or one naming its queue) stays on its queue: it waits for that queue's
    group to have a writer again and fails after ``send_timeout_s`` with an error naming
    the group. The first send to a topic waits for its route the same way while no
    broker answers (started before its brokers), and fails after ``send_timeout_s``.
    Batches are per (topic, group); each group has its own in-flight window
    (``max_in_flight_per_group``, and never more than half of ``max_in_flight``), so a
    hung master cannot take the whole window, and an
    unkeyed batch unanswered after ``hedge_after_ms`` is copied to another group (None:
    wait for the answer or ``request_timeout_s``).

    A batch is sent when it holds ``batch_size`` messages or ``max_batch_bytes`` (keep
    this under the broker's ``--max-frame-bytes``), or ``linger_ms`` after its first.

    ``acks=1``: the future resolves when the broker acknowledged (after its fsync and, in
    synchronous replication, a slave's). ``acks=0``: it resolves once the batch is
    written to the socket, with offset -1.

    ``idempotent`` (default): the producer numbers its messages per queue, and the master
    stores a retried send to the same queue once and answers it with the first copy's
    offset, also after it restarted (invariant 8, docs/idempotence.md). A message moved to
    another group after an unanswered attempt (a retry elsewhere, a hedge) may still be
    stored twice, once on each group (at-least-once).
    """

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        batch_size: int = 256,
        linger_ms: float = DEFAULT_LINGER_MS,
        acks: int = 1,
        retries: int = 5,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_per_group: int = 4,
        retry_backoff_ms: float = 50.0,
        max_buffered: int = 100_000,
        max_batch_bytes: int = 1 << 20,
        request_timeout_s: float = 30.0,
        send_timeout_s: float = 10.0,
        fault_avoidance: bool = True,
        fault_steps: Sequence[tuple[float, float]] = DEFAULT_STEPS,
        hedge_after_ms: float | None = 500.0,
        leader_session_timeout_ms: int = 6000,
        member_id: str | None = None,
        idempotent: bool = True,
        security: ClientSecurity | None = None,
    ) -> None:
        if acks not in (0, 1):
            raise ValueError("acks must be 0 or 1")
        if (batch_size < 1 or max_in_flight < 1 or max_in_flight_per_group < 1 or retries < 0
                or linger_ms < 0 or send_timeout_s <= 0):
            raise ValueError("batch_size, in-flight limits and send_timeout_s must be positive, "
                             "retries and linger_ms >= 0")
        self.router = Router(bootstrap, request_timeout_s=min(request_timeout_s, send_timeout_s),
                             security=security)
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.linger_s = linger_ms / 1000
        self.acks = acks
        self.retries = retries
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.send_timeout_s = send_timeout_s
        self.faults = FaultTable(steps=tuple(fault_steps), enabled=fault_avoidance)
        self.hedge_after_s = None if hedge_after_ms is None else hedge_after_ms / 1000
        self._inflight = asyncio.Semaphore(max_in_flight)
        # Half the window at most: a hung group's batches never starve the healthy groups.
        self._per_group_limit = min(max_in_flight_per_group, max(1, max_in_flight // 2))
        self._group_inflight: dict[str, asyncio.Semaphore] = {}
        # Per ordered topic: one batch in flight, retried whole and first, sent only while
        # this producer is the topic's active producer (docs/ordered.md).
        self._ordered_turn: dict[str, asyncio.Lock] = {}
        self._leaders: dict[str, _ProducerLeadership] = {}
        self.leader_session_timeout_s = leader_session_timeout_ms / 1000
        self.member_id = member_id or _member_id()  # among the producers of ordered topics
        # Per ordered topic: set when the route names another send head (a batch waiting
        # on a hung old head is then sent to the new one, not after the old one wakes).
        self._head_moved: dict[str, asyncio.Event] = {}
        self._buffered = _Room(max_buffered)
        self._batches: dict[tuple[str, str | None], _Batch] = {}
        # Batches whose linger ended while their group had no free send slot: they keep
        # taking messages until a send ends (_kick), instead of waiting for a slot as one
        # closed batch each: with several topics or groups sharing the window, closed
        # batches waiting for a slot never merged and requests fell to 1-2 messages
        # (bench/growth.py: 25x the server CPU per message at 10 topics).
        self._waiting: set[tuple[str, str | None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # A batch sent to a group takes that group's other batches along in one
        # PRODUCE_MULTI (one per topic; Kafka's produce request carries every partition
        # of a node the same way): with many topics a request carried a message or two,
        # and each paid a request's fsync and replication round. Off for good once a
        # broker answers UNKNOWN_OPERATION (an older broker: one topic per request).
        self._multi = True
        # Batches travel in batch form (PRODUCE_BATCH, PRODUCE_MULTI_BATCH): each
        # queue's records packed as the broker stores them, so the master stores them
        # without touching a record (docs/record-batch.md, step 2). Off for good once a
        # broker answers UNKNOWN_OPERATION to it (an older broker: the message-by-message
        # form, which every broker takes).
        self._batch_form = True
        self._rr: dict[str, itertools.count[int]] = {}
        #: (topic, avoided group) -> (route, fault table version, valid until, live
        #: queues, the queues to pick from): :meth:`_pick`'s last judgement.
        self._good: dict[tuple[str, str | None],
                         tuple[p.RouteResponse | None, int, float, list[int], list[int]]] = {}
        self._closed = False
        self._watching = False
        # Idempotence (docs/idempotence.md): a random producer id and, per (topic, queue),
        # the next sequence number.
        self.producer_id = int.from_bytes(os.urandom(8), "big") if idempotent else None
        self._next_seq: dict[tuple[str, int], int] = {}
        # Batches being retried per (topic, group), and the event their end sets.
        self._retrying: dict[tuple[str, str | None], int] = {}
        self._retry_event: dict[tuple[str, str | None], asyncio.Event] = {}

    async def _behind_retries(self, topic: str, group: str | None) -> None:
        """A new batch to ``group`` waits while a batch of this topic there is being
        retried (its outcome unknown): the master then stores at most the batches already
        in flight after it, so the retry is recognised within the runs the master keeps
        per queue (docs/idempotence.md). Sends to other groups go on."""
        while self._retrying.get((topic, group)):
            event = self._retry_event.get((topic, group))
            if event is None:
                event = self._retry_event[(topic, group)] = asyncio.Event()
            await event.wait()

    def _retry_done(self, topic: str, group: str | None) -> None:
        key = (topic, group)
        left = self._retrying[key] - 1
        if left:
            self._retrying[key] = left
            return
        del self._retrying[key]
        event = self._retry_event.pop(key, None)
        if event is not None:
            event.set()

    def _encode(self, topic: str, items: list[_Pending], lease: p.ProduceLease | None = None,
                *, batch: bool) -> bytes:
        """A PRODUCE body for ``items``, in batch form with ``batch`` (``items`` are then
        put in queue order, each queue's in the order sent: the answer's offsets follow
        that order); an idempotent producer numbers each message for its queue the first
        time it goes there and sends the same number on a retry."""
        if batch:
            items.sort(key=_queue_of)
        producer: p.ProducerSeqs | None = None
        if self.producer_id is not None:
            numbers = []
            for i in items:
                seq = i.seqs.get(i.queue)
                if seq is None:
                    key = (topic, i.queue)
                    seq = i.seqs[i.queue] = self._next_seq.get(key, 0)
                    self._next_seq[key] = seq + 1
                numbers.append(seq)
            producer = (self.producer_id, numbers)
        encode = p.encode_produce_batches if batch else p.encode_produce
        return encode(topic, [(i.queue, i.key, i.body) for i in items], lease,
                      [i.deliver_at for i in items], producer)

    def _old_broker(self, exc: BrokerError, batch: bool, where: object) -> bool:
        """Whether ``exc`` says the broker does not know the batch form just sent (an
        older broker): the producer then sends message by message from now on."""
        if not batch or exc.status != p.Status.UNKNOWN_OPERATION:
            return False
        if self._batch_form:
            log.info("%s takes no batch-form produce: sending message by message", where)
            self._batch_form = False
        return True

    async def _queues(self, topic: str) -> list[int]:
        live = self.router.live_queues(topic)
        if not live:
            await self._learn(topic)
            live = self.router.live_queues(topic)
            if not live:
                raise BrokerError(p.Status.UNKNOWN_TOPIC, f"topic {topic!r} has no queues")
        if not self._watching and self.router.route is not None and self.router.route.version:
            self._watching = True
            self.router.on_route(self._route_changed)
        return live

    async def _learn(self, topic: str) -> None:
        """Learn ``topic``'s route, asking again while no broker answers, until
        ``send_timeout_s``: a producer started a moment before its brokers (a pod before
        theirs are ready, a cluster restarting) waits as a send waits for a failover. An
        unknown topic is said at once."""
        deadline = time.monotonic() + self.send_timeout_s
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                await self.router.learn_topic(topic, Permission.WRITE)
                return
            except (ConnectionError, OSError, TimeoutError) as exc:
                delay = backoff.next()
                if time.monotonic() + delay > deadline:
                    raise
                log.info("producer: route of %s: %s; asking again in %.2fs", topic, exc, delay)
                await asyncio.sleep(delay)

    def _route_changed(self, new: p.RouteResponse, old: p.RouteResponse | None) -> None:
        """A group whose writer is back (or changed epoch) is tried again at once."""
        def writers(route: p.RouteResponse | None, group: str) -> set[tuple[str, int]]:
            if route is None:
                return set()
            return {(b.name, b.epoch) for b in route.brokers_of(group)
                    if b.holds(Permission.WRITE)}
        for g in new.groups:
            now = writers(new, g.group)
            if now and now != writers(old, g.group):
                self.faults.route_changed(g.group, time.monotonic())
        for topic, head in new.send_heads.items():
            if old is None or old.send_heads.get(topic) != head:
                moved = self._head_moved.pop(topic, None)
                if moved is not None:
                    moved.set()

    def _pick(self, topic: str, live: list[int], avoid: str | None = None) -> int:
        """Round-robin over queues whose group has a writer and is not isolated; when
        every group is isolated, the least bad group's queues."""
        router, now = self.router, time.monotonic()
        ordered, head = router.send_head(topic)
        if ordered:  # only the send head takes an ordered topic's writes (docs/ordered.md)
            target = router.queue_on(topic, head)
            return live[0] if target is None else target  # no head: refused, we re-route
        rr = self._rr.setdefault(topic, itertools.count())
        # The queues to pick from change only with the route, the fault table or the end
        # of an isolation: judged again then, not for every message (judging them was
        # over a third of a producing process's CPU in bench/broker.py).
        cached = self._good.get((topic, avoid))
        faults = self.faults
        if (cached is not None and cached[0] is router.route and cached[1] == faults.version
                and now < cached[2] and cached[3] == live):
            good = cached[4]
        else:
            good = self._good_queues(topic, live, avoid, now)
            self._good[(topic, avoid)] = (router.route, faults.version,
                                          faults.next_change(now), live, good)
        return good[next(rr) % len(good)]

    def _good_queues(self, topic: str, live: list[int], avoid: str | None,
                     now: float) -> list[int]:
        """The queues :meth:`_pick` picks from at ``now``."""
        router = self.router
        # Each group is judged once per call, not once per queue (per queue, it was 9 % of
        # a producing process's CPU in bench/cluster.py).
        groups = [router.group_of(topic, q) or "" for q in live]
        usable = {g: g != avoid and self.faults.available(g, now) for g in set(groups)}
        writable = {g: ok and router.holds(g, Permission.WRITE) for g, ok in usable.items()}
        good = [q for q, g in zip(live, groups, strict=True) if writable[g]]
        if not good:
            good = [q for q, g in zip(live, groups, strict=True) if usable[g]]
        if not good:
            best = self.faults.least_bad(sorted(set(groups) - ({avoid} if avoid else set())), now)
            good = [q for q, g in zip(live, groups, strict=True) if g == best] or live
        return good

    async def send(
        self, topic: str, body: bytes, key: bytes | None = None, queue: int | None = None,
        *, deliver_at_ms: int = 0, delay_ms: int | None = None,
    ) -> asyncio.Future[tuple[int, int]]:
        """Queue one message; the future resolves to ``(queue, offset)`` once acknowledged.
        ``deliver_at_ms`` (ms since the epoch) delays it: consumers get it at that time,
        not before (docs/delayed.md); ``delay_ms`` is the same, counted from now. A time
        in the past is delivered now; one more than ``scheduling.MAX_DELAY_MS`` away is
        refused (``ValueError``). A delayed message's offset is -1 (none until due)."""
        if self._closed:
            raise RuntimeError("producer is closed")
        if delay_ms is not None:
            if deliver_at_ms:
                raise ValueError("give deliver_at_ms or delay_ms, not both")
            deliver_at_ms = int(time.time() * 1000) + delay_ms if delay_ms > 0 else 0
        if deliver_at_ms:
            try:
                check_deliver_at(deliver_at_ms, int(time.time() * 1000))
            except ScheduleError as exc:
                raise ValueError(str(exc)) from None
        live = self.router.live_queues(topic)
        route = self.router.route
        if not live or (not self._watching and route is not None and route.version):
            live = await self._queues(topic)  # the topic to learn, or the route watch to start
        if deliver_at_ms and self.router.send_head(topic)[0]:
            raise ValueError(f"topic {topic!r} is ordered: delayed delivery is not supported "
                             "on ordered topics")
        pinned = key is not None or queue is not None
        if queue is None:
            queue = live[zlib.crc32(key) % len(live)] if key is not None else self._pick(topic, live)
        elif queue not in live:
            raise ValueError(f"queue {queue} does not exist: topic {topic!r} has queues "
                             f"{live[0]}..{live[-1]}" if live else f"topic {topic!r} has no queues")
        await self._buffered.take()
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(self._buffered.give)
        self._enqueue(topic, _Pending(queue, key, body, fut, pinned,
                                      time.monotonic() + self.send_timeout_s,
                                      deliver_at=deliver_at_ms))
        return fut

    def _enqueue(self, topic: str, item: _Pending) -> None:
        bkey = (topic, self.router.group_of(topic, item.queue))
        batch = self._batches.get(bkey)
        if batch is None:
            batch = self._batches[bkey] = _Batch()
        batch.items.append(item)
        batch.nbytes += len(item.body) + (len(item.key) if item.key else 0) + 10
        if len(batch.items) >= self.batch_size or batch.nbytes >= self.max_batch_bytes:
            self._dispatch(bkey)
        elif batch.timer is None and bkey not in self._waiting:
            batch.timer = asyncio.get_running_loop().call_later(self.linger_s, self._lingered, bkey)

    def _lingered(self, bkey: tuple[str, str | None]) -> None:
        """A batch's linger ended: send it if its group has a free slot, else let it grow
        until a send ends (a full batch goes at once either way)."""
        batch = self._batches.get(bkey)
        if batch is None:
            return
        batch.timer = None
        if self._slot_free(bkey[1]):
            self._dispatch(bkey)
        else:
            self._waiting.add(bkey)

    def _slot_free(self, group: str | None) -> bool:
        return not self._window(group).locked() and not self._inflight.locked()

    def _kick(self) -> None:
        """A send ended: the waiting batches whose group has a free slot go now (not
        after :meth:`abort`: nothing more is sent)."""
        if self._closed:
            return
        for bkey in [k for k in self._waiting if self._slot_free(k[1])]:
            self._dispatch(bkey)

    def _dispatch(self, bkey: tuple[str, str | None]) -> None:
        batch = self._take(bkey)
        if batch is None:
            return
        topic, group = bkey
        together = [(topic, batch.items)]
        if group is not None and self._joins_multi(bkey):
            room = self.max_batch_bytes - batch.nbytes
            for other in [k for k in self._batches if k[1] == group and k != bkey]:
                extra = self._batches[other]
                if extra.items and extra.nbytes <= room and self._joins_multi(other):
                    room -= extra.nbytes
                    together.append((other[0], self._take(other).items))  # type: ignore[union-attr]
        if len(together) > 1:
            self._start(self._send_batches(group or "", together))
        else:
            self._start(self._send_batch(topic, group, batch.items))

    def _take(self, bkey: tuple[str, str | None]) -> _Batch | None:
        """Remove the batch of ``bkey`` from the buffers, to be sent (None if empty)."""
        self._waiting.discard(bkey)
        batch = self._batches.pop(bkey, None)
        if batch is None or not batch.items:
            return None
        if batch.timer is not None:
            batch.timer.cancel()
        return batch

    def _joins_multi(self, bkey: tuple[str, str | None]) -> bool:
        """A batch that may travel in a PRODUCE_MULTI: acknowledged sends to an unordered
        topic with no retry of its own in progress (those keep their one-batch path)."""
        return (self._multi and self.acks != 0 and not self.router.send_head(bkey[0])[0]
                and not self._retrying.get(bkey))

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _window(self, group: str | None) -> asyncio.Semaphore:
        sem = self._group_inflight.get(group or "")
        if sem is None:
            sem = self._group_inflight[group or ""] = asyncio.Semaphore(self._per_group_limit)
        return sem

    async def _send_batch(self, topic: str, group: str | None, items: list[_Pending],
                          *, retry: bool = False) -> None:
        try:
            await self._send_batch_once(topic, group, items, retry)
        finally:
            self._kick()  # its slots are free again

    async def _send_batches(self, group: str, batches: list[tuple[str, list[_Pending]]]) -> None:
        """Several topics' batches to ``group`` in one PRODUCE_MULTI. A batch it could not
        store goes on as a retry of its own (:meth:`_send_batch_once`), counted as one so
        that later batches of its topic wait behind it, as after any failed attempt."""
        again: list[tuple[str, list[_Pending]]] = []
        try:
            again = await self._send_batches_once(group, batches)
        except Exception as exc:  # a bug must not leave sends waiting forever
            for _topic, items in batches:
                _fail(items, exc)
            raise
        finally:
            for topic, items in again:
                items = [i for i in items if not i.future.done() and not i.hedged]
                if items:
                    self._retrying[(topic, group)] = self._retrying.get((topic, group), 0) + 1
                    self._start(self._send_batch(topic, group, items, retry=True))
            self._kick()

    async def _send_batches_once(self, group: str, batches: list[tuple[str, list[_Pending]]]
                                 ) -> list[tuple[str, list[_Pending]]]:
        """One attempt; returns the batches to send again on their own."""
        batch = self._batch_form
        body = p.ProduceMultiRequest([self._encode(t, items, batch=batch)
                                      for t, items in batches]).encode()
        op = p.Op.PRODUCE_MULTI_BATCH if batch else p.Op.PRODUCE_MULTI
        async with self._window(group), self._inflight:
            started = time.monotonic()
            conn: Connection | None = None
            try:
                conn = await self.router.connection(Permission.WRITE, group)
                pending = asyncio.ensure_future(conn.request(
                    op, body, epoch=self.router.epoch_of(group),
                    timeout_s=self.router.request_timeout_s))
                if self.hedge_after_s is not None:
                    done, _ = await asyncio.wait({pending}, timeout=self.hedge_after_s)
                    if not done:
                        for topic, items in batches:
                            self._hedge(topic, group, items, started)
                answer = p.ProduceMultiResponse.decode(await pending)
            except BrokerError as exc:
                # Refused whole, before any part was looked at (an older broker, not the
                # writer, a stale epoch): each batch's own path meets and handles it.
                where = conn.address if conn is not None else group
                if self._old_broker(exc, batch, where):
                    pass  # sent again on their own, message by message
                elif exc.status == p.Status.UNKNOWN_OPERATION:
                    log.info("%s takes one topic per produce (no PRODUCE_MULTI)", where)
                    self._multi = False
                return batches
            except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                log.info("produce to %d topics on %s failed: %s", len(batches), group, exc)
                self.faults.observe(group, (time.monotonic() - started) * 1000,
                                    time.monotonic(), failed=True, started=started)
                await self.router.failed(Permission.WRITE, conn, group, exc)
                return batches
            self.faults.observe(group, (time.monotonic() - started) * 1000, time.monotonic(),
                                started=started)
        again: list[tuple[str, list[_Pending]]] = []
        for (topic, items), (status, raw) in zip(batches, answer.results, strict=False):
            if status == p.Status.OK:
                _resolve(items, p.ProduceResponse.decode(raw))
                continue
            error = BrokerError(p.Status(status), raw.decode("utf-8", "replace"))
            if _worth_retrying(error):
                again.append((topic, items))
            else:
                _fail(items, error)
        if len(answer.results) < len(batches):  # a broker answering fewer parts: a bug there
            again += batches[len(answer.results):]
        return again

    async def _send_batch_once(self, topic: str, group: str | None,
                               items: list[_Pending], retry: bool = False) -> None:
        if self.router.send_head(topic)[0]:
            # An ordered topic: batches go one at a time, in the order they were made, and
            # a failed one is re-sent whole to the send head before any later batch.
            turn = self._ordered_turn.setdefault(topic, asyncio.Lock())
            try:
                async with turn, self._inflight:
                    await self._send_ordered(topic, group, items)
            finally:
                if retry:  # the topic became ordered since: its count ends here too
                    self._retry_done(topic, group)
            return
        if not retry:  # a retry was counted by its caller (_send_batches)
            await self._behind_retries(topic, group)
        # acks=0 is never answered, so an older broker's refusal would go unseen: it
        # sends message by message, which every broker takes.
        batch = self._batch_form and self.acks != 0
        body = self._encode(topic, items, batch=batch)
        backoff = Backoff(self.retry_backoff_s, 2.0)
        retrying = retry
        async with self._window(group), self._inflight:
            try:
                while True:
                    conn: Connection | None = None
                    started = time.monotonic()
                    used_epoch = self.router.epoch_of(group)
                    try:
                        conn = await self.router.connection(Permission.WRITE, group)
                        if self.acks == 0:
                            fut = conn.send(p.Op.PRODUCE, body, epoch=self.router.epoch_of(group))
                            fut.add_done_callback(_ignore_result)
                            for i in items:
                                if not i.future.done():
                                    i.future.set_result((i.queue, -1))
                            return
                        pending = asyncio.ensure_future(conn.request(
                            p.Op.PRODUCE_BATCH if batch else p.Op.PRODUCE,
                            body,
                            epoch=self.router.epoch_of(group),
                            timeout_s=self.router.request_timeout_s,
                        ))
                        if self.hedge_after_s is not None and group is not None:
                            done, _ = await asyncio.wait({pending}, timeout=self.hedge_after_s)
                            if not done:
                                self._hedge(topic, group, items, started)
                        resp = p.ProduceResponse.decode(await pending)
                        if group is not None:
                            self.faults.observe(group, (time.monotonic() - started) * 1000,
                                                time.monotonic(), started=started)
                        _resolve(items, resp)
                        return
                    except BrokerError as exc:
                        if self._old_broker(exc, batch, conn.address if conn else group):
                            batch = False  # refused before anything was looked at
                            body = self._encode(topic, items, batch=batch)
                            continue
                        if not _worth_retrying(exc):
                            _fail(items, exc)
                            return
                        error: Exception = exc
                    except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                        error = exc
                    log.info("produce to %s on %s failed: %s", topic, group or "its group", error)
                    # A refusal by permission (the broker is not the writer now) says the route
                    # we used is stale, not that the group is slow: re-routing (below) is the
                    # answer. Isolating for it kept a group that had just become writable again
                    # out of rotation for minutes.
                    if group is not None and not (isinstance(error, BrokerError) and (
                            error.status in p.ROUTING or error.status == p.Status.UNKNOWN_TOPIC)):
                        # A broker that answered "not now" (NOT_ENOUGH_REPLICAS, a full disk)
                        # is skipped briefly; no answer or a broker timeout is a failure.
                        refused = isinstance(error, BrokerError) and \
                            error.status is not p.Status.TIMEOUT
                        self.faults.observe(group, (time.monotonic() - started) * 1000,
                                            time.monotonic(), failed=not refused,
                                            refused=refused, started=started)
                    await self.router.failed(Permission.WRITE, conn, group, error)
                    items = self._retry_elsewhere(topic, group, items, error)
                    if not items:
                        return
                    if not retrying:
                        retrying = True
                        self._retrying[(topic, group)] = self._retrying.get((topic, group), 0) + 1
                    await self.router.pause(backoff.next(), group, Permission.WRITE, used_epoch)
                    batch = batch and self._batch_form
                    body = self._encode(topic, items, batch=batch)
            finally:
                if retrying:
                    self._retry_done(topic, group)

    def leadership(self, topic: str) -> _ProducerLeadership:
        """This producer's standing among the producers of ordered topic ``topic`` (joined
        at the first send to it): ``.active`` says whether it is the one that sends."""
        lead = self._leaders.get(topic)
        if lead is None:
            lead = self._leaders[topic] = _ProducerLeadership(
                self.router, topic, member_id=self.member_id,
                session_timeout_s=self.leader_session_timeout_s)
            lead.start()
        return lead

    async def _send_ordered(self, topic: str, group: str | None, items: list[_Pending]) -> None:
        """One batch of an ordered topic, to the send head, while this producer is the
        topic's active producer, until acknowledged or past its messages' send timeout.

        A refusal or a lost connection re-reads the route and sends the same batch to
        the head it names (the old head may have stored it too: those are duplicates,
        read before this copy, never out of order). A batch whose outcome is unknown is
        never re-sent after another producer may have sent: if this producer stopped
        being the active one since, the batch fails (another producer's messages may
        follow the stored copy)."""
        backoff = Backoff(self.retry_backoff_s, 2.0)
        lead = self.leadership(topic)
        uncertain_term: int | None = None  # the term in which an attempt's outcome was lost
        while True:
            now = time.monotonic()
            for i in items:
                if not i.future.done() and now >= i.deadline:
                    i.future.set_exception(BrokerError(
                        p.Status.TIMEOUT, f"ordered topic {topic!r}: no send head took the "
                        f"message within {self.send_timeout_s:g}s"))
            items = [i for i in items if not i.future.done()]
            if not items:
                return
            if not await lead.wait_active(min(i.deadline for i in items)):
                _fail(items, BrokerError(
                    p.Status.TIMEOUT, f"ordered topic {topic!r}: this producer "
                    f"({lead.member_id}) did not become its active producer within "
                    f"{self.send_timeout_s:g}s (another producer holds it)"))
                return
            if uncertain_term is not None and uncertain_term != lead.term:
                _fail(items, BrokerError(
                    p.Status.NOT_OWNER, f"ordered topic {topic!r}: this producer stopped "
                    "being its active producer while a send's outcome was unknown; it is "
                    "not re-sent (it may be stored, before what another producer sent)"))
                return
            conn: Connection | None = None
            moved = self._head_moved.setdefault(topic, asyncio.Event())
            group = self._to_send_head(topic, group, items)  # the head the route names now
            batch = self._batch_form
            try:
                conn = await self.router.connection(Permission.WRITE, group)
                body = self._encode(topic, items, lead.lease, batch=batch)
                resp = p.ProduceResponse.decode(await _unless(moved, conn.request(
                    p.Op.PRODUCE_BATCH if batch else p.Op.PRODUCE, body,
                    epoch=self.router.epoch_of(group),
                    timeout_s=self.router.request_timeout_s)))
                _resolve(items, resp)
                return
            except BrokerError as exc:
                if self._old_broker(exc, batch, conn.address if conn else group):
                    continue  # refused before anything was looked at: sent again at once
                if exc.status == p.Status.NOT_OWNER:  # refused before the append
                    log.info("ordered produce to %s refused: %s", topic, exc.message)
                    lead.refused()
                    await backoff.sleep()
                    continue
                if not _worth_retrying(exc):
                    _fail(items, exc)
                    return
                error: Exception = exc
            except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                error = exc
            refused = isinstance(error, BrokerError) and error.status in _REFUSED_BEFORE_APPEND
            if not refused and uncertain_term is None:  # lost or unanswered: maybe stored
                uncertain_term = lead.term
            log.info("ordered produce to %s on %s failed: %s", topic, group, error)
            if not isinstance(error, _HeadMoved):  # the old head may be fine, just not head
                await self.router.failed(Permission.WRITE, conn, group, error)
                await backoff.sleep()

    def _to_send_head(self, topic: str, group: str | None, items: list[_Pending]) -> str | None:
        """The group the route names send head of ``topic`` (``group`` while it names
        none), with the batch's unpinned messages moved to its queue."""
        ordered, head = self.router.send_head(topic)
        target = self.router.queue_on(topic, head)
        if not ordered or target is None or head == group:
            return group
        for i in items:
            if not i.pinned:
                i.queue = target
        return head

    def _hedge(self, topic: str, group: str, items: list[_Pending], started: float) -> None:
        """No answer from ``group`` within ``hedge_after_ms`` (a hung or very slow master):
        isolate it and send copies of the unpinned messages to another group now; the first
        acknowledgement resolves each send (the other copy may be stored too: at least
        once). Pinned messages keep waiting for this group."""
        now = time.monotonic()
        movable = [i for i in items if not i.pinned and not i.hedged and not i.future.done()]
        live = self.router.live_queues(topic)
        if not movable or len({self.router.group_of(topic, q) for q in live}) < 2:
            return
        if self.router.send_head(topic)[0]:
            return  # an ordered topic: a copy on another group would be out of order
        self.faults.observe(group, (now - started) * 1000, now, failed=True, started=started)
        log.info("produce to %s on %s unanswered after %.0f ms: sending %d message(s) elsewhere",
                 topic, group, (now - started) * 1000, len(movable))
        for i in movable:
            i.hedged = True
            q = self._pick(topic, live, avoid=group)
            if self.router.group_of(topic, q) != group:
                self._enqueue(topic, _Pending(q, i.key, i.body, i.future, False, i.deadline,
                                              i.attempts + 1, deliver_at=i.deliver_at,
                                              seqs=i.seqs))
        for bkey in [k for k in self._batches if k[0] == topic and k[1] != group]:
            self._dispatch(bkey)

    def _retry_elsewhere(self, topic: str, group: str | None, items: list[_Pending],
                         error: Exception) -> list[_Pending]:
        """After a failed attempt: unpinned messages move to another group's queues (a
        new batch); pinned ones stay (returned, to retry here) until their send timeout."""
        stay: list[_Pending] = []
        now = time.monotonic()
        live = self.router.live_queues(topic)
        for i in items:
            if i.future.done() or i.hedged:  # a copy is in flight elsewhere
                continue
            i.attempts += 1
            if (not i.pinned and i.attempts > self.retries) or now >= i.deadline:
                why = (f"queue {i.queue} of topic {topic!r} is on group {group!r}, which has "
                       f"no writer" if i.pinned and group else "produce failed")
                i.future.set_exception(BrokerError(
                    error.status if isinstance(error, BrokerError) else p.Status.TIMEOUT,
                    f"{why} after {i.attempts} attempt(s) in "
                    f"{self.send_timeout_s - (i.deadline - now):.1f}s: {error}"))
                continue
            if i.pinned or not live:
                stay.append(i)
                continue
            q = self._pick(topic, live, avoid=group)
            if self.router.group_of(topic, q) == group:
                stay.append(i)
            else:
                self._enqueue(topic, _Pending(q, i.key, i.body, i.future, False, i.deadline,
                                              i.attempts, deliver_at=i.deliver_at,
                                              seqs=i.seqs))
        for bkey in [k for k in self._batches if k[0] == topic and k[1] != group]:
            self._dispatch(bkey)
        return stay

    async def flush(self) -> None:
        """Send every buffered message and wait until all are acknowledged or failed."""
        while self._batches or self._tasks:
            for bkey in list(self._batches):
                self._dispatch(bkey)
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Send what is buffered, hand on the leadership of ordered topics, stop."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        for lead in self._leaders.values():
            await lead.close()
        await self.router.close()

    async def abort(self) -> None:
        """Stop as a crashed process would: nothing more is sent, no leadership handed on
        (the brokers end it when its session times out). For tests and drills."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for lead in self._leaders.values():
            await lead.abort()
        await self.router.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()


T = TypeVar("T")

#: Answers given before anything of a PRODUCE was appended (a re-send cannot duplicate).
_REFUSED_BEFORE_APPEND = frozenset({
    p.Status.NOT_MASTER, p.Status.NO_PERMISSION, p.Status.NOT_SEND_HEAD,
    p.Status.UNKNOWN_TOPIC, p.Status.NOT_OWNER})


class _HolderMoved(ConnectionError):
    """The route gave the permission a request needed to another broker of the group
    while it waited for an answer (a hung broker): as a lost connection, but the new
    holder is tried at once."""


class _HeadMoved(ConnectionError):
    """The route named another send head while a batch waited for the old one's answer
    (a hung master): its outcome is unknown, as after a lost connection."""


async def _unless(moved: asyncio.Event, request: Awaitable[T]) -> T:
    """``request``'s answer, unless ``moved`` is set first (then :class:`_HeadMoved`; the
    request is cancelled)."""
    task = asyncio.ensure_future(request)
    try:
        if not await _answered_first(task, moved.wait()):
            raise _HeadMoved("the send head moved while this batch waited for an answer")
        return task.result()
    finally:
        await _abandon(task)


async def _answered_first(task: asyncio.Future[T], other: Awaitable[object]) -> bool:
    """Wait for ``task`` or ``other``, whichever ends first; True when ``task`` is done
    (``other`` is cancelled either way, ``task`` never)."""
    waiter = asyncio.ensure_future(other)
    both: set[asyncio.Future[Any]] = {task, waiter}
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    return task.done()


async def _abandon(task: asyncio.Future[T]) -> None:
    """Cancel ``task`` if it is still running and wait for it to end, quietly."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _fail_futures(parts: Sequence[tuple[bytes, asyncio.Future[p.PullResponse]]],
                  exc: BaseException) -> None:
    for _body, fut in parts:
        if not fut.done():
            fut.set_exception(exc)


def _fail(items: list[_Pending], exc: BaseException) -> None:
    for i in items:
        if not i.future.done():
            i.future.set_exception(exc)


def _ignore_result(fut: asyncio.Future[p.Frame]) -> None:
    if not fut.cancelled():
        fut.exception()


# --------------------------------------------------------------------------- consumer


@dataclass(frozen=True, slots=True)
class Record:
    """One message as a consumer gets it. A message redelivered after a nack (read from
    the consumer group's retry topic, ``topic``) or read from a dead-letter topic carries
    how many times it was handed back and where it was first read (``origin``: topic,
    queue, offset)."""

    topic: str
    queue: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    body: bytes
    reconsume_times: int = 0
    origin: tuple[str, int, int] | None = None


def _record(topic: str, queue: int, r: p.PulledRecord) -> Record:
    if not is_system_topic(topic):
        return Record(topic, queue, r.offset, r.timestamp_ms, r.key, r.body)
    try:
        env = decode_retry(r.body)
    except ScheduleError:  # written there by hand: handed out as it is
        return Record(topic, queue, r.offset, r.timestamp_ms, r.key, r.body)
    return Record(topic, queue, r.offset, r.timestamp_ms, r.key, env.body, env.reconsume,
                  (env.topic, env.queue, env.offset))


#: While a consumer also reads its retry topic, its own wait is sliced this fine.
RETRY_POLL_S = 0.1
#: Kafka's ``max.poll.interval.ms`` default: a member whose application has not called
#: :meth:`Consumer.getmany` for this long is taken to be stuck, and leaves its group.
DEFAULT_MAX_POLL_INTERVAL_MS = 300_000


class _PollIntervalExceeded(Exception):
    """The application stopped calling ``getmany()`` (ends the member's background tasks)."""


class Consumer(_GroupMember):
    """A consumer-group member of one topic.

    *Static* (a single-group topic, or ``membership=False``): it reads every queue.
    *Member* (a cluster topic, the default there): it joins ``group`` through the brokers
    and reads only the queues the brokers assign it (:mod:`understudy_broker.assignment`):
    a heartbeat long poll keeps it told, a queue it must give up is committed (what
    :meth:`getmany` handed out) and released at the next :meth:`getmany`/:meth:`commit`,
    and it stops pulling every queue when its own lease ends (no answered heartbeat for
    ``session_timeout_ms`` minus a margin), before the brokers hand its queues on.

    A member whose application has not called :meth:`getmany` for
    ``max_poll_interval_ms`` (Kafka's ``max.poll.interval.ms``; None: never) is stuck in
    processing while its heartbeats go on: it leaves the group, so its queues (and any it
    was asked to release) move to the other members instead of waiting for it. What it
    handed out and did not commit is delivered again by the next owner. Its next
    :meth:`getmany` joins again.

    Start position per queue: the group's committed offset, else the oldest retained
    record. ``commit()`` stores, per queue, the offset after the last record handed out
    by :meth:`getmany`/iteration — call it after processing (at-least-once).
    ``ownership_log`` records ``(wall time, "acquire"|"release", queue)`` for checkers.

    ``max_bytes`` bounds one pull's answer per queue: messages' bytes from a broker that
    answers message by message; whole stored batches (at least one) from one that
    answers with them (PULL_BATCH), so one answer may hold a producer's whole batch of
    that queue, as a Kafka fetch returns a first record batch larger than its limit.
    """

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        group: str,
        topic: str,
        max_wait_ms: int = 500,
        max_bytes: int = 1 << 20,
        prefetch_batches: int = 16,
        request_timeout_s: float = 30.0,
        membership: bool | None = None,
        member_id: str | None = None,
        session_timeout_ms: int = 6000,
        orderly: bool = False,
        retries: bool = True,
        max_reconsume: int = DEFAULT_MAX_RECONSUME,
        security: ClientSecurity | None = None,
        max_poll_interval_ms: int | None = DEFAULT_MAX_POLL_INTERVAL_MS,
    ) -> None:
        if session_timeout_ms < 500:
            raise ValueError("session_timeout_ms must be at least 500")
        if max_poll_interval_ms is not None and max_poll_interval_ms < 1:
            raise ValueError("max_poll_interval_ms must be positive (or None: never leave)")
        if max_reconsume < 0:
            raise ValueError("max_reconsume must not be negative")
        #: Nacks (docs/delayed.md): a member also reads its group's retry topic once it
        #: exists, through a second member of the group (``<member>.retry``).
        self.retries = retries and not orderly and not is_system_topic(topic)
        self.max_reconsume = max_reconsume
        self._retry: Consumer | None = None
        # What the retry member shares with this one.
        self._settings: dict[str, Any] = dict(
            max_wait_ms=max_wait_ms, max_bytes=max_bytes, prefetch_batches=prefetch_batches,
            request_timeout_s=request_timeout_s, session_timeout_ms=session_timeout_ms,
            max_poll_interval_ms=max_poll_interval_ms)
        self.max_poll_interval_s = (None if max_poll_interval_ms is None
                                    else max_poll_interval_ms / 1000)
        self._polled_at = time.monotonic()  # the last getmany() call began or ended
        self._in_getmany = 0
        #: Not in the group now, and getmany() joins: it left for max_poll_interval_ms,
        #: or its first join (in start()) failed.
        self._must_join = False
        #: Orderly consumption (docs/ordered.md): ``getmany`` hands out one record at a
        #: time and commits the one before it first (the caller came back: it processed
        #: it), so a queue's next owner starts after the last record processed.
        self.orderly = orderly
        # The rest of an orderly batch, or an error found behind records handed out.
        self._carry: tuple[int, int, list[Record]] | BaseException | None = None
        self._handed: int | None = None  # orderly: the queue of the record handed out last
        self.group = group
        self.topic = topic
        self.router = Router(bootstrap, request_timeout_s=request_timeout_s + max_wait_ms / 1000,
                             security=security)
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.membership = membership
        self.member_id = member_id or _member_id()
        self.session_timeout_s = session_timeout_ms / 1000
        self.ownership_log: list[tuple[float, str, int]] = []
        #: Called ``(queue, broker address, sent at ns)`` for the first pull answered after
        #: one or more failed ones, or answered by another broker than the pull before it
        #: (READ moved while this queue's loop had no pull out: a full buffer, an
        #: application busy elsewhere): reads restored as this consumer sees them (the
        #: drill measures failover with it).
        self.on_read_restored: Callable[[int, str, int], None] | None = None
        self.started_at: dict[int, int] = {}  # per queue acquired: the committed offset it began at
        self._holding: set[int] = set()  # queues whose acquisition is logged, not released
        # Per group, the commit that commit(timeout_s) left running (a hung master).
        self._commits_pending: dict[str | None, asyncio.Task[None]] = {}
        self._commit_failures = 0  # see commit_failures
        self._buffer: asyncio.Queue[tuple[int, int, list[Record]] | BaseException] = (
            asyncio.Queue(prefetch_batches))
        self._positions: dict[int, int] = {}  # next offset to deliver, per queue
        self._committed: dict[int, int] = {}
        # Per queue, the offsets of records whose nack failed: commits stop at the first.
        self._not_handed_back: dict[int, set[int]] = {}
        self._loops: dict[int, tuple[int, asyncio.Task[None]]] = {}  # queue -> (token, task)
        self._tokens = itertools.count(1)
        self._heartbeat: asyncio.Task[None] | None = None
        self._generation = -1
        self._revoking: set[int] = set()
        self._released: set[int] = set()
        self._lease_until = 0.0
        self._lock = asyncio.Lock()
        self._started = False
        # An ordered topic (docs/ordered.md): the brokers assign its first queue, which
        # stands for the topic; its owner reads the consume head's queue, and follows the
        # consume chain as the route changes.
        self._last_resp: p.MemberHeartbeatResponse | None = None
        self._head_moved = asyncio.Event()
        self._reapply: asyncio.Task[None] | None = None

    @property
    def positions(self) -> dict[int, int]:
        return dict(self._positions)

    @property
    def assigned(self) -> list[int]:
        """The queues this consumer pulls now."""
        return sorted(self._loops)

    async def start(self) -> None:
        if self._started:
            return
        await self.router.learn_topic(self.topic, Permission.READ)
        route = self.router.route
        cluster = route is not None and self.topic in route.placement
        if self.membership is None:
            self.membership = cluster
        if self.membership and not cluster:
            raise BrokerError(p.Status.UNSUPPORTED, f"topic {self.topic!r} is not a cluster "
                              "topic: consumer-group membership needs `topic create --groups`")
        self._started = True
        # The route follows permission changes (a pull that failed on a dead master goes
        # to the acting slave the moment it reads) and notices the retry topic's creation.
        self.router.watch()
        if self.membership:
            if self.router.consume_head(self.topic)[0]:
                self.router.on_route(self._route_changed)
                self._reapply = asyncio.create_task(self._follow_chain(), name="consume-chain")
            self._must_join = True
            await self._join_now("joins the group")
            return
        for q in self.router.live_queues(self.topic):
            await self._acquire(q)

    async def _member_tasks(self) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._heartbeat_loop())
                tasks.create_task(self._lease_watch())
                if self.max_poll_interval_s is not None:
                    tasks.create_task(self._poll_watch(self.max_poll_interval_s))
        except* _PollIntervalExceeded:
            await self._leave_stuck()

    async def _poll_watch(self, interval_s: float) -> None:
        """End the member's tasks once the application has not been in or called
        :meth:`getmany` for ``interval_s``."""
        while True:
            left = self._polled_at + interval_s - time.monotonic()
            if left <= 0 and not self._in_getmany:
                raise _PollIntervalExceeded
            await asyncio.sleep(max(left, interval_s / 10, 0.01))

    async def _leave_stuck(self) -> None:
        """Leave the group without committing: the application is stuck in what it was
        handed, so that is delivered again by the queues' next owners (at least once)."""
        self._must_join = True
        idle = time.monotonic() - self._polled_at
        log.warning("consumer %s of %s: getmany() not called for %.1fs (max_poll_interval_ms "
                    "%d): leaves the group; its queues move to the other members, and what it "
                    "handed out and did not commit is delivered again", self.member_id,
                    self.group, idle, int((self.max_poll_interval_s or 0) * 1000))
        async with self._lock:
            self._last_resp = None  # an ordered topic's head move must not take queues back
        await self._drop_all("the application stopped calling getmany()")
        self._lease_until = 0.0  # it holds nothing now: no pull, no hand-out
        with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError):
            await self._leave(self.group)  # else the brokers expire it after its session

    async def _join_now(self, why: str) -> None:
        """Join the group and start the member's heartbeat: in start(), and at the
        getmany() after leaving for the poll interval or after a first join that failed.
        A join that fails raises to the caller, and the next getmany() tries again."""
        log.info("consumer %s of %s: %s", self.member_id, self.group, why)
        await self._join()
        self._must_join = False
        self._polled_at = time.monotonic()
        self._heartbeat = asyncio.create_task(self._member_tasks(), name="member-heartbeat")

    async def _lease_watch(self) -> None:
        """Stop every queue the moment the lease ends, whatever the heartbeat loop waits on
        (a connect to a cut-off broker can outlast the lease). Pulls and hand-outs already
        stop there (both check the lease); this makes the release happen, and be logged,
        then: a member cut from every broker logged it only when a heartbeat was answered
        again, and one stopped before that (killed, or its process ended) seemed to hold
        the queue after the brokers had handed it on."""
        while True:
            left = self._lease_until - time.monotonic()
            if left <= 0 and self._loops:
                await self._drop_all("its lease ended (no heartbeat answered in time)")
            await asyncio.sleep(max(left, 0.05))

    # ---- queues ---------------------------------------------------------------------

    async def _acquire(self, queue: int, *, background: bool = False) -> None:
        """Start pulling ``queue`` from the group's committed offset. ``background``: the
        offset is fetched by the pull task itself, so a member's heartbeat never waits
        for a hung group's broker (it would miss its session and lose every queue)."""
        if queue in self._loops:
            return
        token = next(self._tokens)
        offset = None if background else await self._start_position(queue)
        task = asyncio.create_task(self._pull_loop(queue, offset, token))
        self._loops[queue] = (token, task)

    async def _start_position(self, queue: int) -> int:
        """Start owning ``queue`` (logged): from the committed offset, fetched, for a queue
        newly ours; from our own position when we never stopped owning it (a pull loop
        restarted after a refused pull), so nothing we handed out comes again."""
        if queue not in self._positions:
            group = self.router.group_of(self.topic, queue)
            body = await _with_retries(
                self.router, Permission.READ, p.Op.FETCH_OFFSET,
                p.FetchOffsetRequest(self.group, self.topic, [queue]).encode(), group=group)
            off = p.OffsetsResponse.decode(body).offsets.get(queue)
            if off is not None:
                self._committed[queue] = off
            self._positions[queue] = off if off is not None else 0
            self.started_at[queue] = self._positions[queue]
        else:
            self.started_at.pop(queue, None)  # resumed: not a start from the committed offset
        self._holding.add(queue)
        self.ownership_log.append((time.time(), "acquire", queue))
        return self._positions[queue]

    async def _stop_queue(self, queue: int) -> None:
        """Stop pulling ``queue``; its undelivered prefetched records are dropped (the
        token no longer matches). Logged as released now, or, past the member's lease, when
        the lease ended: past it the member neither pulls nor hands out (both check the
        lease), so its hold ended then, whenever this runs (after a SIGSTOP, a heartbeat
        answered on waking says the queue is gone: the same instant)."""
        entry = self._loops.pop(queue, None)
        if entry is None:
            return
        # Hand-outs of this queue end here (the token no longer matches), or ended with
        # the lease: decided now, before the wait below. Meanwhile a concurrent heartbeat's
        # answer may renew the lease (the heartbeat loop's and a settle's are both in
        # flight at a heal), and judged after it, a release the lapse had ended was
        # logged when the wait ended: after the next owner had taken the queue.
        now = time.monotonic()
        lapsed = self.membership and now >= self._lease_until
        at = time.time() - (now - self._lease_until) if lapsed else time.time()
        await stop_tasks([entry[1]])
        if queue in self._holding:  # it may have stopped before it fetched its offset
            self._holding.discard(queue)
            self.ownership_log.append((at, "release", queue))

    async def _drop_all(self, why: str) -> None:
        if self._loops:
            log.warning("consumer %s of %s: stops every queue: %s", self.member_id, self.group, why)
        for q in list(self._loops):
            await self._stop_queue(q)  # released when the lease ended, if it has
            self._forget(q)
        self._revoking.clear()
        self._generation = -1

    def _forget(self, queue: int) -> None:
        """A queue lost without a hand-over: what was handed out and not committed is the
        next owner's to deliver again (at least once); never commit it from here."""
        self._positions.pop(queue, None)
        self._committed.pop(queue, None)
        self._not_handed_back.pop(queue, None)

    # ---- membership -----------------------------------------------------------------

    def _lease_valid(self) -> bool:
        return not self.membership or time.monotonic() < self._lease_until

    def _unit(self) -> int | None:
        """For an ordered topic, the queue that stands for it in the assignment."""
        if not self.router.consume_head(self.topic)[0]:
            return None
        live = self.router.live_queues(self.topic)
        return live[0] if live else None

    def _route_changed(self, new: p.RouteResponse, old: p.RouteResponse | None) -> None:
        """The consume head moved: stop reading the old head (it was read to its end: the
        chain moves only then) and read the new one."""
        if old is None or (new.consume_heads.get(self.topic)
                           != old.consume_heads.get(self.topic)):
            self._head_moved.set()

    async def _follow_chain(self) -> None:
        while True:
            await self._head_moved.wait()
            self._head_moved.clear()
            if self._last_resp is not None:
                await self._apply(self._last_resp)

    def _request(self, *, join: bool, wait_ms: int
                 ) -> tuple[p.MemberHeartbeatRequest, Callable[[], None]]:
        released = sorted(self._released)
        unit = self._unit()
        req = p.MemberHeartbeatRequest(
            self.group, self.member_id, [self.topic], int(self.session_timeout_s * 1000),
            join=join, released=sorted({(self.topic, q if unit is None else unit)
                                        for q in released}),
            generation=self._generation, wait_ms=wait_ms)

        def answered() -> None:
            self._released -= set(released)
        return req, answered

    async def _apply(self, resp: p.MemberHeartbeatResponse) -> None:
        async with self._lock:
            self._last_resp = resp
            owned = {q for t, q in resp.owned if t == self.topic}
            revoking = {q for t, q in resp.revoking if t == self.topic}
            ordered, head = self.router.consume_head(self.topic)
            if ordered:  # owning the topic's queue means reading the consume head's
                owned = {head} if owned and head is not None else set()
                revoking = owned if revoking else set()
            self._generation = resp.generation
            for q, (_token, task) in list(self._loops.items()):
                if task.done():  # ended on NOT_OWNER or a lapsed lease: restart if ours
                    await self._stop_queue(q)
            for q in list(self._loops):
                if q not in owned:
                    await self._stop_queue(q)  # lost without a hand-over: expired
                    self._forget(q)
            for q in revoking:
                if q in self._loops:
                    await self._stop_queue(q)
                if q not in self._released:
                    self._revoking.add(q)
            self._revoking &= owned
            for q in sorted(owned - revoking - set(self._loops)):
                await self._acquire(q, background=True)

    async def _settle(self) -> None:
        """Commit and release the queues the brokers asked back; stop at a lapsed lease."""
        if not self._lease_valid() and self._loops:
            await self._drop_all("its lease ended")
        if not self._revoking:
            return
        todo = sorted(self._revoking)
        await self._commit_queues(todo)
        self._revoking -= set(todo)
        self._released |= set(todo)
        for q in todo:  # handed over: if it comes back, start from the committed offset
            self._forget(q)
        with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError):
            await self._apply(await self._beat())

    # ---- pulling --------------------------------------------------------------------

    async def _pull_loop(self, queue: int, offset: int | None, token: int) -> None:
        backoff = Backoff(0.1, 2.0)
        router = self.router
        group = router.group_of(self.topic, queue)
        while offset is None:  # acquired by a heartbeat: fetch where to start here
            if not self._lease_valid():
                return
            try:
                offset = await self._start_position(queue)
            except BrokerError as exc:
                if not exc.retriable:
                    await self._buffer.put(exc)
                    return
                await backoff.sleep()
            except (ConnectionError, OSError, TimeoutError, p.FrameError):
                await backoff.sleep()
        failing = False  # the last pull failed: the next answer restores reads
        answered_by: str | None = None  # the broker that answered the last pull
        while True:
            member = (self.group, *self._membership_fields()) if self.membership else ("", "", 0)
            req = p.PullRequest(self.topic, queue, offset, self.max_bytes, self.max_wait_ms, *member)
            conn: Connection | None = None
            used_epoch = router.epoch_of(group)
            try:
                if not self._lease_valid():
                    return
                conn = await router.connection(Permission.READ, group)
                sent_ns, used_epoch = time.time_ns(), router.epoch_of(group)
                resp = await router.unless_moved(
                    group, Permission.READ, conn.address, conn.pull(
                        req.encode(), epoch=used_epoch, timeout_s=router.request_timeout_s))
            except BrokerError as exc:
                if exc.status == p.Status.NOT_OWNER:
                    log.info("pull %s/%d: %s", self.topic, queue, exc.message)
                    return  # the next heartbeat says what we own
                # UNKNOWN_TOPIC for a topic the route holds: a broker just restarted that has
                # not taken the cluster's topics in yet (retried; a topic really gone is
                # gone from the route refreshed below, and the next answer ends the loop).
                if not (exc.retriable or (exc.status == p.Status.UNKNOWN_TOPIC
                                          and router.queues(self.topic) is not None)):
                    await self._buffer.put(DamagedRecord.of(exc, self.topic, queue, offset)
                                           if exc.status == p.Status.CORRUPT_RECORD else exc)
                    return
                log.info("pull %s/%d: %s; re-routing", self.topic, queue, exc)
                failing = True
                await router.failed(Permission.READ, conn, group, exc)
                await router.pause(backoff.next(), group, Permission.READ, used_epoch)
                continue
            except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                log.info("pull %s/%d: %s; reconnecting", self.topic, queue, exc)
                await router.failed(Permission.READ, conn, group)
                failing = True
                if not isinstance(exc, _HolderMoved):  # the new holder is known: go now
                    await router.pause(backoff.next(), group, Permission.READ, used_epoch)
                continue
            if (self.on_read_restored is not None and conn is not None
                    and (failing or answered_by not in (None, conn.address))):
                self.on_read_restored(queue, conn.address, sent_ns)
            failing = False
            answered_by = None if conn is None else conn.address
            backoff.reset()
            if resp.records:
                await self._buffer.put((queue, token, [
                    _record(self.topic, queue, r) for r in resp.records]))
            offset = resp.next_offset

    async def getmany(self, *, timeout_s: float = 1.0) -> list[Record]:
        """The records buffered so far, from any of this member's queues (waiting up to
        ``timeout_s`` for the first; empty after that); with ``orderly``, the next record
        alone, after committing the one handed out before.
        Redelivered (nacked) messages come first when both are waiting. A member outside
        its group (its first join failed, or it left for ``max_poll_interval_ms``) joins
        here; a join that fails raises, and the next call tries again."""
        await self.start()
        self._in_getmany += 1
        self._polled_at = time.monotonic()
        try:
            if self._must_join:
                await self._join_now("getmany() called: joins the group")
            return await self._getmany_any(timeout_s)
        finally:
            self._in_getmany -= 1
            self._polled_at = time.monotonic()

    async def _getmany_any(self, timeout_s: float) -> list[Record]:
        retry = self._retry_consumer()
        if retry is None:
            return await self._getmany(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                records = await retry.getmany(timeout_s=0)
            except (BrokerError, ConnectionError, OSError, TimeoutError) as exc:
                # The retry member could not start or pull now (a broker that has not
                # learned the retry topic yet): this member's own queues go on; it tries
                # again at the next call.
                log.warning("consumer group %s: retry topic: %s", self.group, exc)
                records = []
            if records:
                return records
            left = deadline - time.monotonic()
            records = await self._getmany(min(max(left, 0.0), RETRY_POLL_S))
            if records or left <= RETRY_POLL_S:
                return records

    def _retry_consumer(self) -> Consumer | None:
        """The member reading this group's retry topic, started once the topic exists."""
        if self._retry is not None or not (self.retries and self.membership):
            return self._retry
        route = self.router.route
        name = retry_topic(self.group)
        if route is None or name not in route.topics:
            return None
        self._retry = Consumer(self.router.bootstrap, group=self.group, topic=name,
                               member_id=f"{self.member_id}.retry", retries=False,
                               max_reconsume=self.max_reconsume,
                               security=self.router.security, **self._settings)
        log.info("consumer group %s: reading its retry topic %s", self.group, name)
        return self._retry

    async def skip(self, damaged: DamagedRecord) -> None:
        """Move past a damaged record that :meth:`getmany` raised: its queue is pulled again
        from the offset after the damage (after the whole damaged batch:
        :attr:`DamagedRecord.skip_to`), and the next :meth:`commit` stores that position.
        What it skips is then lost to this group, which is why this is the application's explicit call;
        the broker's log says where it lies (and a slave may hold an intact copy)."""
        if damaged.topic != self.topic:
            if self._retry is None or damaged.topic != self._retry.topic:
                raise ValueError(f"record of topic {damaged.topic!r} was not read by this "
                                 f"consumer of {self.topic!r}")
            return await self._retry.skip(damaged)
        queue = damaged.queue
        self._positions[queue] = max(self._positions.get(queue, 0), damaged.skip_to)
        if queue in self._loops:  # restart its pull loop (ended by the error) from there
            await self._stop_queue(queue)
            await self._acquire(queue)

    async def nack(self, record: Record, *, delay_ms: int = 1000) -> p.NackResponse:
        """Hand ``record`` back (it failed): the group gets it again after ``delay_ms``
        (0: at once) through its retry topic, with
        ``reconsume_times`` one higher; past ``max_reconsume`` it goes to the group's
        dead-letter topic ``%DLQ%<group>`` instead. The record counts as processed: the
        next :meth:`commit` moves past it. Needs consumer-group membership; the member
        must own the record's queue (``NOT_OWNER`` otherwise). When it raises, the record
        was not handed back: until a nack of it succeeds, commits of its queue (and
        :meth:`close`'s) stop at it, so when this member leaves or dies the group reads it
        again, with what followed it on its queue (at least once; RocketMQ's consumer
        keeps a message it could not send back the same way)."""
        if record.topic != self.topic:
            retry = self._retry
            if retry is None or record.topic != retry.topic:
                raise ValueError(f"record of topic {record.topic!r} was not read by this "
                                 f"consumer of {self.topic!r}")
            return await retry.nack(record, delay_ms=delay_ms)
        await self.start()
        if not self.membership:
            raise BrokerError(p.Status.UNSUPPORTED,
                              "nack needs consumer-group membership (a cluster topic)")
        member, generation = self._membership_fields()
        req = p.NackRequest(self.group, member, generation, record.topic, record.queue,
                            record.offset, max(0, delay_ms), self.max_reconsume)
        group = self.router.group_of(self.topic, record.queue)
        failed = self._not_handed_back.setdefault(record.queue, set())
        failed.add(record.offset)  # until an answer says it was handed back
        body = await _with_retries(self.router, Permission.READ, p.Op.NACK, req.encode(),
                                   group=group)
        answer = p.NackResponse.decode(body)
        failed.discard(record.offset)
        return answer

    async def _getmany(self, timeout_s: float) -> list[Record]:
        """Everything the pull loops have buffered (several queues' batches at once), or,
        with an empty buffer, the first batch to arrive within ``timeout_s``. Handing out
        one batch per call would let the buffer fill with small batches behind a caller
        that commits after each call: deliveries then queued for its whole depth
        (``prefetch_batches`` round trips; ~200 ms in ``bench/cluster.py``). An error in
        the buffer behind records is raised at the next call, after those records."""
        if self.orderly and self._handed is not None:
            queue, self._handed = self._handed, None
            if queue in self._loops or queue in self._revoking:
                await self._commit_queues([queue])
        await self._settle()
        deadline = time.monotonic() + timeout_s
        out: list[Record] = []
        while True:
            if self._carry is not None:
                item: tuple[int, int, list[Record]] | BaseException = self._carry
                self._carry = None
            elif out:
                try:
                    item = self._buffer.get_nowait()
                except asyncio.QueueEmpty:
                    return out
            else:
                try:
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        item = await self._buffer.get()
                except TimeoutError:
                    return []
            if isinstance(item, BaseException):
                if out:
                    self._carry = item
                    return out
                raise item
            queue, token, records = item
            entry = self._loops.get(queue)
            if entry is None or entry[0] != token or not self._lease_valid():
                continue  # pulled before the queue was given up: never handed out
            if self.orderly:
                if len(records) > 1:
                    self._carry = (queue, token, records[1:])
                records = records[:1]
                self._handed = queue
            last = records[-1]
            self._positions[queue] = max(self._positions.get(queue, 0), last.offset + 1)
            if self.orderly:
                return records
            out.extend(records)

    async def __aiter__(self) -> AsyncIterator[Record]:
        while True:
            for rec in await self.getmany(timeout_s=3600):
                yield rec

    def _membership_fields(self) -> tuple[str, int]:
        return (self.member_id, max(0, self._generation)) if self.membership else ("", 0)

    async def commit(self, *, timeout_s: float | None = None) -> dict[int, int | None]:
        """Commit what has been delivered from the queues this consumer holds; returns the
        offsets the brokers stored for those it committed. Each group's queues are
        committed at once, in parallel. ``timeout_s``: return after at most this long
        with what was stored by then; a group that has not answered (a hung master) goes
        on committing in the background, is skipped while it does, and its queues are
        committed again after (what was not committed may be delivered again: at least
        once); a group whose commit failed after its retries (its brokers down) is warned
        about, counted in :attr:`commit_failures` and committed again with the next
        commit. ``None``: wait for every group (raises as the slowest does)."""
        held = [q for q in sorted(self._positions)
                if not self.membership or q in self._loops or q in self._revoking]
        stored = await self._commit_queues(held, timeout_s=timeout_s)
        await self._settle()
        if self._retry is not None:
            await self._retry.commit(timeout_s=timeout_s)
        return stored

    async def _commit_queues(self, queues: Sequence[int], *, timeout_s: float | None = None
                             ) -> dict[int, int | None]:
        """Commit ``queues`` (those with something new) and return what the brokers
        stored for them; queues with nothing new are not in the answer."""
        points = {q: commit_point(self._positions[q], self._not_handed_back.get(q, ()),
                                  self._committed.get(q))
                  for q in queues if q in self._positions}
        todo = {q: o for q, o in points.items() if o is not None}
        if not todo:
            return {}
        by_group: dict[str | None, dict[int, int]] = {}
        for q, o in todo.items():
            by_group.setdefault(self.router.group_of(self.topic, q), {})[q] = o
        stored: dict[int, int | None] = {}

        async def one(group: str | None, offsets: dict[int, int]) -> None:
            body = await _with_retries(
                self.router,
                Permission.READ,
                p.Op.COMMIT_OFFSET,
                p.CommitOffsetRequest(self.group, self.topic, offsets,
                                      *self._membership_fields()).encode(),
                group=group,
            )
            answer = p.OffsetsResponse.decode(body).offsets
            for q, kept in answer.items():
                if kept is not None and kept >= self._committed.get(q, -1):
                    self._committed[q] = kept
            stored.update(answer)

        if timeout_s is not None:  # a group still answering an earlier commit is skipped
            by_group = {g: offs for g, offs in by_group.items()
                        if g not in self._commits_pending}
        tasks = {asyncio.create_task(one(g, offs)): g for g, offs in by_group.items()}
        if not tasks:
            return {}
        if timeout_s is None:
            failures = [r for r in await asyncio.gather(*tasks, return_exceptions=True)
                        if isinstance(r, BaseException)]
            if failures:
                raise failures[0]
            return dict(stored)
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:  # finishes (or fails) on its own; close() waits for it
            self._commits_pending[tasks[task]] = task
            task.add_done_callback(functools.partial(self._commit_done, tasks[task]))
        for task in done:
            if task.exception() is not None:
                self._commit_failed(tasks[task], task.exception())
        return dict(stored)

    def _commit_done(self, group: str | None, task: asyncio.Task[None]) -> None:
        del self._commits_pending[group]
        if not task.cancelled() and task.exception() is not None:
            self._commit_failed(group, task.exception())

    @property
    def commit_failures(self) -> int:
        """Commits of a group that :meth:`commit` with ``timeout_s`` saw fail after their
        retries and left to the next commit (this member's and its retry topic member's)."""
        retry = self._retry.commit_failures if self._retry is not None else 0
        return self._commit_failures + retry

    def _commit_failed(self, group: str | None, exc: BaseException | None) -> None:
        self._commit_failures += 1
        log.warning("consumer %s of %s: a commit to %s was not taken (%s): kept for the "
                    "next commit", self.member_id, self.group,
                    f"group {group!r}" if group is not None else "the topic's group", exc)

    async def close(self) -> None:
        """Commit what was handed out, leave the group (its queues move at once), stop."""
        if self._retry is not None:
            await self._retry.close()
        await self._stop_pulling()
        if self._started and self.membership:
            with contextlib.suppress(BrokerError, ConnectionError, OSError, TimeoutError):
                if self._lease_valid():
                    await self._commit_queues(sorted(self._positions))
                    await self._leave(self.group)
        await self.router.close()

    async def abort(self) -> None:
        """Stop as a crashed process would: no commit, no leave. The brokers hand this
        member's queues on once its session times out (what was handed out and not
        committed is delivered again to the next owner: the at-least-once window)."""
        if self._retry is not None:
            await self._retry.abort()
        await self._stop_pulling()
        await self.router.close()

    async def _stop_pulling(self) -> None:
        if self._commits_pending:  # commits left running by commit(timeout_s): bounded
            await asyncio.wait(list(self._commits_pending.values()),
                               timeout=self.session_timeout_s)
            for task in list(self._commits_pending.values()):
                task.cancel()
        if self._heartbeat is not None:
            await stop_tasks([self._heartbeat])
            self._heartbeat = None
        if self._reapply is not None:
            await stop_tasks([self._reapply])
            self._reapply = None
        for q in list(self._loops):
            await self._stop_queue(q)

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
