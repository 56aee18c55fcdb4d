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
import contextlib
import itertools
import logging
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from understudy_broker import protocol as p
from understudy_broker.model import Permission
from understudy_broker.retry import Backoff
from understudy_broker.tasks import stop_tasks

log = logging.getLogger("understudy.client")

PERMISSION_ORDER: Final = (Permission.FULL, Permission.WRITE, Permission.READ, Permission.NONE)
READ_CHUNK: Final = 256 * 1024


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


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


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
        self._task = asyncio.create_task(self._read_loop())

    @classmethod
    async def open(
        cls,
        address: str,
        *,
        max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
        connect_timeout_s: float = 3.0,
    ) -> Connection:
        host, port = parse_address(address)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=READ_CHUNK), connect_timeout_s
        )
        return cls(address, reader, writer, max_frame_bytes=max_frame_bytes)

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
        rid = next(self._ids) & 0xFFFFFFFF
        fut: asyncio.Future[p.Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._writer.write(p.encode_frame(request_id=rid, op=op, epoch=epoch, body=body))
        return rid, fut

    async def request(
        self, op: p.Op, body: bytes, *, epoch: int = 0, timeout_s: float = 30.0
    ) -> bytes:
        """Send and wait; returns the OK body or raises BrokerError/ConnectionError.

        The timeout covers writing too: a frozen broker (SIGSTOP, a VM pause) that stops
        reading cannot hold the caller beyond ``timeout_s``."""
        frame = await self.exchange(op, body, epoch=epoch, timeout_s=timeout_s)
        if frame.status != p.Status.OK:
            raise BrokerError(frame.status, p.error_message(frame), address=self.address)
        return frame.body

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
        finally:
            # drain() may raise (the broker died) before the future is awaited: forget it,
            # so the read loop's failure does not leave an unretrieved exception behind.
            if not fut.done():
                self._pending.pop(rid, None)
                fut.cancel()
        return frame

    async def _read_loop(self) -> None:
        reason: BaseException = ConnectionError(f"connection to {self.address} closed by peer")
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
        except (ConnectionError, OSError) as exc:
            reason = ConnectionError(f"connection to {self.address} lost: {exc}")
        except asyncio.CancelledError:
            reason = ConnectionError(f"connection to {self.address} closed")
        finally:
            self._fail_all(reason)

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
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)
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
) -> p.Frame:
    """One request on a fresh connection, closed afterwards; returns the response frame
    whatever its status. For the few callers that talk to one broker once: a broker
    probing a peer, an acting slave pushing back-sync, tools and tests. Raises
    ``OSError``/``TimeoutError`` when the broker cannot be reached, :class:`BrokerError`
    (``TIMEOUT``) when it does not answer in time."""
    conn = await Connection.open(address, max_frame_bytes=max_frame_bytes,
                                 connect_timeout_s=timeout_s)
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


class Router:
    """Knows the route and keeps one connection per purpose (write, read)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
        connect_timeout_s: float = 3.0,
        request_timeout_s: float = 30.0,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address is needed")
        for a in bootstrap:
            parse_address(a)
        self.bootstrap = list(bootstrap)
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.route: p.RouteResponse | None = None
        self._conns: dict[Permission, Connection] = {}
        self._lock = asyncio.Lock()

    @property
    def epoch(self) -> int:
        if self.route is None:
            return 0
        return max((b.epoch for g in self.route.groups for b in g.brokers), default=0)

    def queues(self, topic: str) -> int | None:
        return None if self.route is None else self.route.topics.get(topic)

    def _addresses(self) -> list[str]:
        known = [b.address for g in (self.route.groups if self.route else []) for b in g.brokers]
        return list(dict.fromkeys([*known, *self.bootstrap]))

    async def _connect(self, address: str) -> Connection:
        return await Connection.open(
            address,
            max_frame_bytes=self.max_frame_bytes,
            connect_timeout_s=self.connect_timeout_s,
        )

    async def refresh(self) -> p.RouteResponse:
        """Ask known brokers, then bootstrap ones, for the route; first answer wins."""
        errors = []
        for address in self._addresses():
            try:
                conn = await self._connect(address)
            except (OSError, TimeoutError) as exc:
                errors.append(f"{address}: {exc or type(exc).__name__}")
                continue
            try:
                body = await conn.request(
                    p.Op.GET_ROUTE, p.GetRouteRequest().encode(), timeout_s=self.connect_timeout_s
                )
                self.route = p.RouteResponse.decode(body)
                return self.route
            except (BrokerError, ConnectionError, p.FrameError) as exc:
                errors.append(f"{address}: {exc}")
            finally:
                await conn.close()
        raise ConnectionError("no broker answered GET_ROUTE: " + "; ".join(errors))

    async def learn_topic(self, topic: str, need: Permission) -> int:
        """The topic's queue count. A slave learns new topics from its master about a
        second later, so when the route lacks the topic, ask the broker that serves
        ``need`` (the writer owns the topic list)."""
        await self.refresh()
        n = self.queues(topic)
        if n is None:
            body = await self.request(need, p.Op.GET_ROUTE, p.GetRouteRequest(topic).encode())
            n = p.RouteResponse.decode(body).topics.get(topic)
        if n is None:
            raise BrokerError(p.Status.UNKNOWN_TOPIC, f"unknown topic {topic!r}")
        if self.route is not None:
            self.route = p.RouteResponse(
                self.route.groups,
                {**self.route.topics, topic: n},
                self.route.topic_groups,
            )
        return n

    async def connection(self, need: Permission) -> Connection:
        """A live connection to the best broker for ``need`` (WRITE or READ)."""
        conn = self._conns.get(need)
        if conn is not None and not conn.closed:
            return conn
        async with self._lock:
            conn = self._conns.get(need)
            if conn is not None and not conn.closed:
                return conn
            if self.route is None:
                await self.refresh()
            route = self.route
            brokers = [b for g in (route.groups if route else []) for b in g.brokers]
            errors = []
            for b in failover_order(brokers, need):
                try:
                    conn = await self._connect(b.address)
                except (OSError, TimeoutError) as exc:
                    errors.append(f"{b.address}: {exc or type(exc).__name__}")
                    continue
                self._conns[need] = conn
                return conn
            raise ConnectionError("no broker reachable: " + "; ".join(errors))

    def address_for(self, need: Permission) -> str | None:
        """The broker currently used for ``need`` (None when not connected)."""
        conn = self._conns.get(need)
        return None if conn is None or conn.closed else conn.address

    async def failed(self, need: Permission, conn: Connection | None) -> None:
        """``conn`` (used for ``need``) was refused or lost: drop it and re-learn the route.

        Only that connection is dropped: with one pull loop per queue, several loops see
        the same failure, and the first one may already have opened a fresh connection
        that the others must not close. ``conn`` is ``None`` when connecting failed."""
        if conn is not None:
            if self._conns.get(need) is conn:
                del self._conns[need]
            await conn.close()
        with contextlib.suppress(ConnectionError):
            await self.refresh()

    async def request(self, need: Permission, op: p.Op, body: bytes) -> bytes:
        conn = await self.connection(need)
        return await conn.request(op, body, epoch=self.epoch, timeout_s=self.request_timeout_s)

    async def close(self) -> None:
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.close()


async def create_topic(bootstrap: Sequence[str], *, topic: str, queues: int) -> p.CreateTopicResponse:
    """Create (or grow) a topic on the group's writer."""
    router = Router(bootstrap)
    try:
        body = await _with_retries(
            router, Permission.WRITE, p.Op.CREATE_TOPIC, p.CreateTopicRequest(topic, queues).encode()
        )
        return p.CreateTopicResponse.decode(body)
    finally:
        await router.close()


async def _with_retries(
    router: Router, need: Permission, op: p.Op, body: bytes, *, retries: int = 5
) -> bytes:
    backoff = Backoff(0.05, 1.0)
    for attempt in itertools.count():
        conn: Connection | None = None
        try:
            conn = await router.connection(need)
            return await conn.request(op, body, epoch=router.epoch,
                                      timeout_s=router.request_timeout_s)
        except BrokerError as exc:
            if not exc.retriable or attempt >= retries:
                raise
        except (ConnectionError, OSError, TimeoutError):
            if attempt >= retries:
                raise
        await router.failed(need, conn)
        await backoff.sleep()
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- producer


@dataclass(slots=True)
class _Pending:
    queue: int
    key: bytes | None
    body: bytes
    future: asyncio.Future[tuple[int, int]]


@dataclass(slots=True)
class _Batch:
    items: list[_Pending] = field(default_factory=list)
    nbytes: int = 0
    timer: asyncio.TimerHandle | None = None


class Producer:
    """Async producer. ``await send(...)`` returns a future of ``(queue, offset)``.

    A batch is sent when it holds ``batch_size`` messages or ``max_batch_bytes`` (keep
    this under the broker's ``--max-frame-bytes``), or ``linger_ms`` after its first.

    ``acks=1``: the future resolves when the broker acknowledged (after its fsync and, in
    synchronous replication, a slave's). ``acks=0``: it resolves once the batch is
    written to the socket, with offset -1.
    """

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        batch_size: int = 256,
        linger_ms: float = 1.0,
        acks: int = 1,
        retries: int = 5,
        max_in_flight: int = 8,
        retry_backoff_ms: float = 50.0,
        max_buffered: int = 100_000,
        max_batch_bytes: int = 1 << 20,
        request_timeout_s: float = 30.0,
    ) -> None:
        if acks not in (0, 1):
            raise ValueError("acks must be 0 or 1")
        if batch_size < 1 or max_in_flight < 1 or retries < 0 or linger_ms < 0:
            raise ValueError("batch_size and max_in_flight must be positive, retries >= 0")
        self.router = Router(bootstrap, request_timeout_s=request_timeout_s)
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.linger_s = linger_ms / 1000
        self.acks = acks
        self.retries = retries
        self.retry_backoff_s = retry_backoff_ms / 1000
        self._inflight = asyncio.Semaphore(max_in_flight)
        self._buffered = asyncio.Semaphore(max_buffered)
        self._batches: dict[str, _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._rr: dict[str, itertools.count[int]] = {}
        self._closed = False

    async def _queue_count(self, topic: str) -> int:
        n = self.router.queues(topic)
        if n is None:
            n = await self.router.learn_topic(topic, Permission.WRITE)
        return n

    async def send(
        self, topic: str, body: bytes, key: bytes | None = None, queue: int | None = None
    ) -> asyncio.Future[tuple[int, int]]:
        if self._closed:
            raise RuntimeError("producer is closed")
        n = await self._queue_count(topic)
        if queue is None:
            if key is not None:
                queue = zlib.crc32(key) % n
            else:
                queue = next(self._rr.setdefault(topic, itertools.count())) % n
        elif not 0 <= queue < n:
            raise ValueError(f"queue {queue} does not exist: topic {topic!r} has {n} queues")
        await self._buffered.acquire()
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda _f: self._buffered.release())
        batch = self._batches.get(topic)
        if batch is None:
            batch = self._batches[topic] = _Batch()
        batch.items.append(_Pending(queue, key, body, fut))
        batch.nbytes += len(body) + (len(key) if key else 0) + 10
        if len(batch.items) >= self.batch_size or batch.nbytes >= self.max_batch_bytes:
            self._dispatch(topic)
        elif batch.timer is None:
            batch.timer = asyncio.get_running_loop().call_later(
                self.linger_s, self._dispatch, topic
            )
        return fut

    def _dispatch(self, topic: str) -> None:
        batch = self._batches.pop(topic, None)
        if batch is None or not batch.items:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        task = asyncio.create_task(self._send_batch(topic, batch.items))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_batch(self, topic: str, items: list[_Pending]) -> None:
        body = p.encode_produce(topic, [(i.queue, i.key, i.body) for i in items])
        backoff = Backoff(self.retry_backoff_s, 2.0)
        async with self._inflight:
            for attempt in itertools.count():
                conn: Connection | None = None
                try:
                    conn = await self.router.connection(Permission.WRITE)
                    if self.acks == 0:
                        fut = conn.send(p.Op.PRODUCE, body, epoch=self.router.epoch)
                        fut.add_done_callback(_ignore_result)
                        for i in items:
                            if not i.future.done():
                                i.future.set_result((i.queue, -1))
                        return
                    resp = p.ProduceResponse.decode(
                        await conn.request(
                            p.Op.PRODUCE,
                            body,
                            epoch=self.router.epoch,
                            timeout_s=self.router.request_timeout_s,
                        )
                    )
                    for i, (q, off) in zip(items, resp.offsets, strict=False):
                        if not i.future.done():
                            i.future.set_result((q, off))
                    return
                except BrokerError as exc:
                    if not exc.retriable or attempt >= self.retries:
                        _fail(items, exc)
                        return
                    error: Exception = exc
                except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                    if attempt >= self.retries:
                        _fail(items, ConnectionError(f"produce failed: {exc}"))
                        return
                    error = exc
                log.info("produce to %s retrying (%d): %s", topic, attempt + 1, error)
                await self.router.failed(Permission.WRITE, conn)
                await backoff.sleep()

    async def flush(self) -> None:
        """Send every buffered message and wait until all are acknowledged or failed."""
        for topic in list(self._batches):
            self._dispatch(topic)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        if self._closed:
            return
        await self.flush()
        self._closed = True
        await self.router.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()


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
    topic: str
    queue: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    body: bytes


class Consumer:
    """Consumer-group member reading every queue of one topic.

    Start position per queue: the group's committed offset, else the oldest retained
    record. ``commit()`` stores, per queue, the offset after the last record handed out
    by :meth:`getmany`/iteration — call it after processing (at-least-once).
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
    ) -> None:
        self.group = group
        self.topic = topic
        self.router = Router(bootstrap, request_timeout_s=request_timeout_s + max_wait_ms / 1000)
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self._buffer: asyncio.Queue[list[Record] | BaseException] = asyncio.Queue(prefetch_batches)
        self._positions: dict[int, int] = {}  # next offset to deliver, per queue
        self._committed: dict[int, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    @property
    def positions(self) -> dict[int, int]:
        return dict(self._positions)

    async def start(self) -> None:
        if self._started:
            return
        n = await self.router.learn_topic(self.topic, Permission.READ)
        body = await _with_retries(
            self.router,
            Permission.READ,
            p.Op.FETCH_OFFSET,
            p.FetchOffsetRequest(self.group, self.topic, list(range(n))).encode(),
        )
        committed = p.OffsetsResponse.decode(body).offsets
        for q in range(n):
            off = committed.get(q)
            self._positions[q] = off if off is not None else 0
            if off is not None:
                self._committed[q] = off
        self._tasks = [asyncio.create_task(self._pull_loop(q, self._positions[q])) for q in range(n)]
        self._started = True

    async def _pull_loop(self, queue: int, offset: int) -> None:
        backoff = Backoff(0.1, 2.0)
        router = self.router
        while True:
            req = p.PullRequest(self.topic, queue, offset, self.max_bytes, self.max_wait_ms)
            conn: Connection | None = None
            try:
                conn = await router.connection(Permission.READ)
                resp = p.PullResponse.decode(await conn.request(
                    p.Op.PULL, req.encode(), epoch=router.epoch,
                    timeout_s=router.request_timeout_s))
            except BrokerError as exc:
                if not exc.retriable:
                    await self._buffer.put(exc)
                    return
                log.info("pull %s/%d: %s; re-routing", self.topic, queue, exc)
                await router.failed(Permission.READ, conn)
                await backoff.sleep()
                continue
            except (ConnectionError, OSError, TimeoutError, p.FrameError) as exc:
                log.info("pull %s/%d: %s; reconnecting", self.topic, queue, exc)
                await router.failed(Permission.READ, conn)
                await backoff.sleep()
                continue
            backoff.reset()
            if resp.records:
                await self._buffer.put(
                    [
                        Record(self.topic, queue, r.offset, r.timestamp_ms, r.key, r.body)
                        for r in resp.records
                    ]
                )
            offset = resp.next_offset

    async def getmany(self, *, timeout_s: float = 1.0) -> list[Record]:
        """The next batch of records (possibly empty after ``timeout_s``)."""
        await self.start()
        try:
            item = await asyncio.wait_for(self._buffer.get(), timeout_s)
        except TimeoutError:
            return []
        if isinstance(item, BaseException):
            raise item
        last = item[-1]
        self._positions[last.queue] = max(self._positions.get(last.queue, 0), last.offset + 1)
        return item

    async def __aiter__(self) -> AsyncIterator[Record]:
        while True:
            for rec in await self.getmany(timeout_s=3600):
                yield rec

    async def commit(self) -> dict[int, int | None]:
        """Commit what has been delivered; returns the broker's stored offsets."""
        todo = {q: o for q, o in self._positions.items() if self._committed.get(q) != o}
        if not todo:
            return dict(self._committed)
        body = await _with_retries(
            self.router,
            Permission.READ,
            p.Op.COMMIT_OFFSET,
            p.CommitOffsetRequest(self.group, self.topic, todo).encode(),
        )
        stored = p.OffsetsResponse.decode(body).offsets
        for q, o in stored.items():
            if o is not None:
                self._committed[q] = o
        return dict(stored)

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        await stop_tasks(tasks)
        await self.router.close()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
