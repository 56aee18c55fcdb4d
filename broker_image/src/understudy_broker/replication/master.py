"""The master's side of replication: accept slaves, push log bytes, count acknowledgements.

Why this module exists: invariant 3 (no acknowledged message lost when a master dies with
synchronous replication) rests on :meth:`ReplicationServer.wait_replicated`: a produce or a
commit is acknowledged only after the slaves the in-sync rules (:mod:`.isr`) require report
that they persisted its bytes. The wire format is :mod:`.wire`.

Pushes may end in the middle of a record: the slave keeps the partial tail and prepends
it to the next push. Gaps are never papered over: a heartbeat beyond what the master has
(a divergent slave tail) or an offset the master no longer stores drops the link with a
log line, and the slave reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from understudy_broker.replication import isr as rules
from understudy_broker.replication.isr import (
    IsrConflictError,
    IsrStore,
    NotEnoughReplicasError,
    ReplicationTimeoutError,
)
from understudy_broker.replication.wire import (
    AUTH_HELLO,
    AUTH_MAGIC,
    CHALLENGE,
    ECHO,
    ECHO_MARKER,
    HEARTBEAT,
    HELLO,
    MAX_PUSH_BYTES,
    NONCE_BYTES,
    PROOF,
    PUSH_HEADER,
    REPAIR,
    REPAIR_MARKER,
    NotOfThisGroup,
    ReplicationError,
    ReplicationProtocolError,
    decode_hello_name,
    encode_metadata,
    encode_repair,
    group_mac,
    group_secrets,
    hello_name_length,
    matching_secret,
)
from understudy_broker.storage.commitlog import CommitLog
from understudy_broker.storage.records import CommitLogError
from understudy_broker.tasks import stop_tasks

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SlaveLink:
    """A snapshot of one slave's link as the master sees it."""

    name: str
    peer: str
    acked_offset: int
    connected: bool
    in_sync: bool
    connected_since: float  # wall-clock seconds
    lag_bytes: int


@dataclass(eq=False, slots=True)
class _Link:
    name: str
    peer: str
    connected_since: float
    acked: int = -1  # -1 until the first heartbeat
    push_pos: int = 0
    connected: bool = True
    metadata_due: bool = False  # push_metadata_now() asked for a frame before the interval
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None


class ReplicationServer:
    """The master's side: accepts slaves, pushes log bytes, tracks acknowledgements."""

    def __init__(
        self,
        log: CommitLog,
        *,
        host: str,
        port: int,
        sync: bool,
        min_insync: int = 1,
        auto_degrade: bool = False,
        in_sync_replicas: int | None = None,
        metadata: Callable[[], dict[str, Any]],
        ack_timeout_s: float = 3.0,
        max_lag_bytes: int = rules.DEFAULT_MAX_LAG_BYTES,
        metadata_interval_s: float = 1.0,
        link_timeout_s: float = 3.0,
        chunk_bytes: int = 1 << 20,
        isr: IsrStore | None = None,
        isr_lag_s: float = 1.0,
        isr_retry_s: float = 0.2,
        on_echo: Callable[[str, int, int], None] | None = None,
        tls: ssl.SSLContext | None = None,
        group: str = "",
        secret: bytes | None = None,
    ) -> None:
        # The port's TLS, and the group secret a connecting slave must prove first.
        self._tls = tls
        self._group = group
        self._secrets = group_secrets(secret) if secret is not None else ()
        self.refused = 0  # connections that did not prove the group secret
        if max_lag_bytes < 1:
            raise ValueError("max_lag_bytes must be positive")
        self.log = log
        self.host = host
        self.port = port
        self.sync = sync
        self.policy = rules.AckPolicy.of(min_insync=min_insync, auto_degrade=auto_degrade,
                                         in_sync_replicas=in_sync_replicas)
        self.metadata = metadata
        self.ack_timeout_s = ack_timeout_s
        self.max_lag_bytes = max_lag_bytes
        self.metadata_interval_s = metadata_interval_s
        self.link_timeout_s = link_timeout_s
        self.chunk_bytes = min(chunk_bytes, MAX_PUSH_BYTES)
        # Waits released with fewer than in_sync_replicas copies (produces, commits, and
        # a broker's readable end moving: server/readable.py).
        self.degraded_acks = 0
        self._links: dict[str, _Link] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._once_connected = False
        # In-sync set (only with an IsrStore). ``_isr`` is what the record says;
        # ``_joining`` caught up and is required by waiters before the record shows it;
        # ``_leaving`` must be removed from the record before a waiter may go on without it.
        self._isr_store = isr
        self.isr_lag_s = isr_lag_s
        self.isr_retry_s = isr_retry_s
        self._isr: frozenset[str] = frozenset()
        self._isr_version: int | None = None  # None until loaded
        self._joining: set[str] = set()
        self._leaving: set[str] = set()
        self._isr_wake = asyncio.Event()
        self.isr_writes = 0
        # ``on_echo(slave, seq, epoch)``: a slave answered a metadata frame's probe.
        self._on_echo = on_echo

    # ---- lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        if self._isr_store is not None:
            task = asyncio.create_task(self._isr_loop(), name="isr")
            self._tasks.add(task)
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, ssl=self._tls,
            ssl_handshake_timeout=self.link_timeout_s if self._tls is not None else None)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("replication server listening on %s:%d (sync=%s)", self.host, self.port, self.sync)

    async def stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for link in list(self._links.values()):
            if link.writer is not None:
                link.writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        for _end, _n, fut in self._waiters:
            if not fut.done():
                fut.set_exception(ReplicationError("replication server stopped"))
                fut.exception()  # mark retrieved: the waiter may be gone
        self._waiters.clear()

    # ---- state --------------------------------------------------------------------
    @property
    def isr(self) -> frozenset[str] | None:
        """The in-sync set as recorded (None in static mode or before it is loaded)."""
        if self._isr_store is None or self._isr_version is None:
            return None
        return self._isr

    def _in_sync(self, link: _Link) -> bool:
        if self._isr_store is not None:
            return link.name in self._isr and link.name not in self._leaving
        return (
            link.connected
            and link.acked >= 0
            and self.log.max_phys - link.acked <= self.max_lag_bytes
        )

    def links(self) -> list[SlaveLink]:
        return [
            SlaveLink(
                name=lk.name,
                peer=lk.peer,
                acked_offset=max(lk.acked, 0),
                connected=lk.connected,
                in_sync=self._in_sync(lk),
                connected_since=lk.connected_since,
                lag_bytes=max(0, self.log.max_phys - max(lk.acked, 0)),
            )
            for lk in self._links.values()
        ]

    @property
    def slave_connected(self) -> bool:
        return any(lk.connected for lk in self._links.values())

    @property
    def slave_once_connected(self) -> bool:
        return self._once_connected

    @property
    def degraded(self) -> bool:
        """Sync mode acknowledging with fewer than ``in_sync_replicas`` copies (auto-degrade)."""
        copies = 1 + self._insync_count()
        return (self.sync and self.policy.auto_degrade and self.policy.degraded(copies)
                and copies >= self.policy.copies_needed(copies))

    def _insync_count(self) -> int:
        if self._isr_store is not None:
            return len(self._isr - self._leaving)
        return sum(1 for lk in self._links.values() if self._in_sync(lk))

    def _slaves_needed(self) -> int:
        """Static mode: slave acknowledgements a write needs now."""
        return self.policy.copies_needed(1 + self._insync_count()) - 1

    def _quorum(self) -> int:
        acked = [lk.acked for lk in self._links.values() if lk.connected and lk.acked >= 0]
        return rules.quorum_offset(acked, self._slaves_needed())

    def _count_ack(self, copies: int) -> None:
        if self.policy.degraded(copies):
            self.degraded_acks += 1

    # ---- master API ---------------------------------------------------------------
    def notify_appended(self) -> None:
        for link in self._links.values():
            link.wake.set()

    def push_metadata_now(self) -> None:
        """Send a metadata frame to every slave at the next turn of its push loop.

        For changes slaves should see before the next interval (a topic just created
        becomes readable on a slave right away instead of up to
        ``metadata_interval_s`` later). Cheap to call: it only wakes the push loops.
        """
        for link in self._links.values():
            link.metadata_due = True
            link.wake.set()

    async def wait_replicated(self, end_phys: int, *, start_phys: int | None = None) -> None:
        """See the module docstring; returns at once in async mode. ``start_phys`` (where
        the write began) is what a member's byte lag is measured from: bytes appended
        after it are in flight, not lag."""
        if not self.sync:
            return
        if self._isr_store is not None:
            await self._wait_isr(end_phys, end_phys if start_phys is None else start_phys)
            return
        if end_phys <= self._quorum():
            self._count_ack(1 + self._slaves_needed())
            return
        if self._insync_count() < self._slaves_needed():
            raise NotEnoughReplicasError(self._not_enough(1 + self._insync_count()))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end_phys, next(self._counter), fut))
        try:
            async with asyncio.timeout(self.ack_timeout_s):
                await fut
        except TimeoutError:
            raise ReplicationTimeoutError(
                f"no {self._slaves_needed()} slave(s) acknowledged offset {end_phys} "
                f"within {self.ack_timeout_s:g}s"
            ) from None

    def _release_waiters(self) -> None:
        if self._isr_store is not None:
            self._release_isr_waiters()
            return
        quorum = self._quorum()
        while self._waiters and self._waiters[0][0] <= quorum:
            _end, _n, fut = heapq.heappop(self._waiters)
            if not fut.done():
                self._count_ack(1 + self._slaves_needed())
                fut.set_result(None)

    def _not_enough(self, copies: int) -> str:
        p = self.policy
        if self._isr_store is not None:
            slaves = sorted(self._required())
        else:
            slaves = sorted(lk.name for lk in self._links.values() if self._in_sync(lk))
        return (f"{copies} in sync (the master{''.join(', ' + n for n in slaves)}), the write "
                f"needs {p.copies_needed(copies)} (inSyncReplicas {p.in_sync_replicas}, "
                f"minInSyncReplicas {p.min_insync} slave(s), autoDegrade "
                f"{'on' if p.auto_degrade else 'off'})")

    # ---- in-sync set ----------------------------------------------------------------
    def _acked(self, name: str) -> int:
        link = self._links.get(name)
        return link.acked if link is not None and link.connected else -1

    def _isr_outcome(self, end: int) -> bool | None:
        """For a write ending at ``end``: None = keep waiting, True = acknowledge,
        False = refuse (fewer copies in sync than the policy needs)."""
        if self._isr_version is None:
            return None  # not loaded yet
        return rules.write_outcome(
            recorded=self._isr, joining=self._joining, leaving=self._leaving, acked=self._acked,
            end=end, policy=self.policy)

    def _required(self) -> frozenset[str]:
        return rules.required(self._isr, self._joining, self._leaving)

    def reload_isr(self) -> None:
        """Read the in-sync record again (the group moved to another epoch: an acting slave
        may have taken members out of it). Until it is read, no slave route (echo_set is
        None) and waiting writes wait."""
        if self._isr_store is not None and self._isr_version is not None:
            self._isr_version = None
            self._isr_wake.set()

    def echo_set(self) -> frozenset[str] | None:
        """Every slave the in-sync record may name right now (so the controller may choose
        it to act for reads): what the record says as far as we know (a record someone
        else wrote is adopted when our write conflicts with it), and who is joining (a
        write that adds them may have reached ZooKeeper unanswered). None while no record
        is loaded: the slave route then renews nothing (docs/failover.md, "A master cut
        off from ZooKeeper only")."""
        if self._isr_store is None or self._isr_version is None or self._isr_version < 0:
            return None
        return self._isr | self._joining

    def _release_isr_waiters(self) -> None:
        while self._waiters:
            end, _n, fut = self._waiters[0]
            outcome = self._isr_outcome(end)
            if outcome is None:
                return
            heapq.heappop(self._waiters)
            if fut.done():
                continue
            if outcome:
                self._count_ack(1 + len(self._required()))
                fut.set_result(None)
            else:
                fut.set_exception(NotEnoughReplicasError(
                    self._not_enough(1 + len(self._required()))))

    async def _wait_isr(self, end: int, start: int) -> None:
        self._evict_disconnected()
        self._evict_far_behind(start)
        outcome = self._isr_outcome(end)
        if outcome is not None:
            if not outcome:
                raise NotEnoughReplicasError(self._not_enough(1 + len(self._required())))
            self._count_ack(1 + len(self._required()))
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end, next(self._counter), fut))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ack_timeout_s
        try:
            async with asyncio.timeout(min(self.isr_lag_s, self.ack_timeout_s)):
                await asyncio.shield(fut)
            return
        except TimeoutError:
            # Members that have not acknowledged within the lag bound leave the ISR (the
            # record is updated before this write is acknowledged without them).
            self._evict(end)
        try:
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                await fut
        except TimeoutError:
            raise ReplicationTimeoutError(
                f"offset {end} not acknowledged by the in-sync slaves "
                f"({', '.join(sorted(self._isr)) or 'none'}) within {self.ack_timeout_s:g}s"
            ) from None

    def _evict(self, end: int) -> None:
        lagging = rules.lagging(self._required(), acked=self._acked, end=end)
        if lagging:
            log.warning("slave(s) %s did not acknowledge offset %d within %gs: leaving the "
                        "in-sync set", ", ".join(sorted(lagging)), end, self.isr_lag_s)
            self._leave(lagging)

    def _evict_far_behind(self, start: int) -> None:
        """Members more than ``max_lag_bytes`` behind the start of a write about to wait
        leave (a slow disk): new writes stop waiting for them."""
        far = rules.too_far_behind(self._required(), acked=self._acked, log_end=start,
                                   max_lag_bytes=self.max_lag_bytes)
        if far:
            log.warning("slave(s) %s more than %d bytes behind offset %d: leaving the in-sync "
                        "set", ", ".join(sorted(far)), self.max_lag_bytes, start)
            self._leave(far)

    def _leave(self, members: frozenset[str]) -> None:
        """``members`` must leave the record before anything is acknowledged without them."""
        self._joining -= members
        self._leaving |= members
        self._isr_wake.set()
        self._release_waiters()

    def _maybe_join(self, link: _Link) -> None:
        """A connected slave that has every byte of the log joins the ISR."""
        if self._isr_store is None or self._isr_version is None or not rules.joins(
                name=link.name, connected=link.connected, acked=link.acked,
                log_end=self.log.max_phys, recorded=self._isr, joining=self._joining,
                leaving=self._leaving):
            return
        log.info("slave %s caught up at offset %d: joining the in-sync set", link.name,
                 link.acked)
        self._leaving.discard(link.name)
        self._joining.add(link.name)
        self._isr_wake.set()

    async def _isr_loop(self) -> None:
        """Load the record, then write it whenever the wanted set differs from it."""
        store = self._isr_store
        if store is None:
            return
        while True:
            try:
                if self._isr_version is None:
                    members, version = await store.load()
                    self._isr, self._isr_version = members, version
                    log.info("in-sync set %s (record version %d)", sorted(members), version)
                    for link in self._links.values():
                        self._maybe_join(link)
                    if version < 0:
                        self._isr_wake.set()  # create the record
                    self._release_waiters()
                wanted = self._required()
                if wanted != self._isr or self._isr_version < 0:
                    new_version = await store.store(wanted, version=self._isr_version)
                    log.info("in-sync set %s -> %s", sorted(self._isr), sorted(wanted))
                    self._isr, self._isr_version = wanted, new_version
                    self.isr_writes += 1
                    # Whoever changed sides during the write needs another one.
                    self._joining -= wanted
                    self._leaving &= wanted
                    self._release_waiters()
                    continue
                self._isr_wake.clear()
                await self._isr_wake.wait()
            except asyncio.CancelledError:
                raise
            except IsrConflictError as exc:
                log.warning("in-sync record changed under us (%s); reloading its version", exc)
                try:
                    members, self._isr_version = await store.load()
                    # Someone else wrote it (an acting slave takes members out): adopt it.
                    self._isr = members
                except Exception as exc2:  # unreachable store: retry below
                    log.warning("reloading the in-sync record failed: %s", exc2)
                    await asyncio.sleep(self.isr_retry_s)
            except Exception as exc:  # ZooKeeper unreachable: keep trying, waiters wait
                log.warning("writing the in-sync record failed: %s; retrying", exc)
                await asyncio.sleep(self.isr_retry_s)

    def _evict_disconnected(self) -> None:
        """Members without a link cannot acknowledge: they leave the ISR now.

        Called only when a write is waiting (or about to): the record shrinks lazily,
        just before the master would go on without someone. A master that merely lost
        its links (partitioned, resumed after a freeze, shutting down) does not empty the
        record the controller picks an acting slave from."""
        gone = {m for m in self._required()
                if m not in self._links or not self._links[m].connected}
        if gone:
            log.warning("slave(s) %s not connected: leaving the in-sync set",
                        ", ".join(sorted(gone)))
            self._leave(frozenset(gone))

    def _on_links_changed(self) -> None:
        """A link went away: waiters that can no longer be satisfied stop waiting."""
        if self._isr_store is not None:
            if self._waiters:
                self._evict_disconnected()
            self._release_waiters()
            return
        self._release_waiters()  # auto-degrade: the need may have fallen with the link
        if not self._waiters or self._insync_count() >= self._slaves_needed():
            return
        waiters, self._waiters = self._waiters, []
        for end, _n, fut in waiters:
            if not fut.done():
                fut.set_exception(NotEnoughReplicasError(
                    f"{self._not_enough(1 + self._insync_count())}; offset {end} was waiting"))

    # ---- per-connection -----------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        host, port = writer.get_extra_info("peername")[:2]
        peer = f"{host}:{port}"
        link: _Link | None = None
        pusher: asyncio.Task[None] | None = None
        try:
            if self._secrets:
                async with asyncio.timeout(self.link_timeout_s):
                    await self._check_proof(reader, writer)
            async with asyncio.timeout(self.link_timeout_s):
                name = await _read_hello(reader)
            async with asyncio.timeout(self.link_timeout_s):
                (first,) = HEARTBEAT.unpack(await reader.readexactly(HEARTBEAT.size))
            self._check_start(name, first)
            old = self._links.get(name)
            if old is not None and old.connected and old.writer is not None:
                log.warning("slave %s reconnected from %s; closing its old link", name, peer)
                old.writer.close()
            link = _Link(name=name, peer=peer, connected_since=time.time(), writer=writer)
            link.acked = link.push_pos = first
            self._links[name] = link
            self._once_connected = True
            log.info("slave %s connected from %s at offset %d", name, peer, first)
            self._release_waiters()
            pusher = asyncio.create_task(self._push(link, writer))
            while True:
                async with asyncio.timeout(self.link_timeout_s):
                    raw = await reader.readexactly(HEARTBEAT.size)
                (offset,) = HEARTBEAT.unpack(raw)
                if offset == REPAIR_MARKER:
                    async with asyncio.timeout(self.link_timeout_s):
                        (phys,) = REPAIR.unpack(await reader.readexactly(REPAIR.size))
                    data = self.log.record_bytes(phys) or b""
                    log.warning("slave %s found the record at log offset %d damaged in its "
                                "copy: %s", name, phys,
                                "sending ours" if data else "ours is not intact either")
                    writer.write(encode_repair(phys, data))
                    continue
                if offset == ECHO_MARKER:
                    async with asyncio.timeout(self.link_timeout_s):
                        seq, epoch = ECHO.unpack(await reader.readexactly(ECHO.size))
                    if self._on_echo is not None:
                        self._on_echo(name, seq, epoch)
                    continue
                if offset > link.push_pos or offset < link.acked:
                    raise ReplicationProtocolError(
                        f"slave {name} acknowledged offset {offset}, but it was sent "
                        f"up to {link.push_pos} and had acknowledged {link.acked}"
                    )
                if offset != link.acked:
                    link.acked = offset
                    self._release_waiters()
                self._maybe_join(link)
                if pusher.done():
                    pusher.result()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            log.warning("replication link %s (%s) closed by the slave", link and link.name, peer)
        except TimeoutError:
            log.warning(
                "replication link %s (%s): no heartbeat for %gs; dropping it",
                link and link.name,
                peer,
                self.link_timeout_s,
            )
        except NotOfThisGroup as exc:
            self.refused += 1
            log.warning("refused a replication connection from %s: %s", peer, exc)
        except (ReplicationError, CommitLogError) as exc:
            log.error("replication link %s (%s) dropped: %s", link and link.name, peer, exc)
        except asyncio.CancelledError:
            # stop() cancels the links it owns and waits for them. End normally then: on
            # Python 3.11 the stream server's done-callback calls exception() on this task,
            # and a cancelled one logged "Exception in callback ... CancelledError" at every
            # broker shutdown.
            if not self._stopping:
                raise
        finally:
            if pusher is not None:
                await stop_tasks([pusher])
            writer.close()
            if link is not None:
                link.connected = False
                self._on_links_changed()
            if task is not None:
                self._tasks.discard(task)

    def _check_start(self, name: str, offset: int) -> None:
        if offset > self.log.max_phys:
            raise ReplicationProtocolError(
                f"slave {name} reports offset {offset} beyond the master's end "
                f"{self.log.max_phys}: divergent tail, the slave must be repaired"
            )
        if offset < self.log.min_phys:
            raise ReplicationProtocolError(
                f"slave {name} needs offset {offset}, but the master keeps only "
                f"[{self.log.min_phys}, {self.log.max_phys}] (retention removed the rest)"
            )

    async def _push(self, link: _Link, writer: asyncio.StreamWriter) -> None:
        next_meta = 0.0
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if now >= next_meta or link.metadata_due:
                link.metadata_due = False
                frame = self._metadata_frame()
                if frame is not None:
                    writer.write(frame)
                next_meta = now + self.metadata_interval_s
            if link.push_pos < self.log.max_phys:
                data = self.log.read_raw(link.push_pos, self.chunk_bytes)
                # One write, so one send(): header and bytes written apart cost two system
                # calls (on loopback each also runs the receiver's TCP path) and often two
                # wake-ups of the slave, on every replicated batch.
                writer.writelines((PUSH_HEADER.pack(link.push_pos, len(data)), data))
                link.push_pos += len(data)
                await writer.drain()
                continue
            await writer.drain()
            link.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_meta - loop.time())):
                    await link.wake.wait()

    def _metadata_frame(self) -> bytes | None:
        """The metadata frame, or None (logged) when the broker's callback fails or the
        frame is too large: a bad metadata snapshot must not stop the log bytes flowing."""
        try:
            return encode_metadata(self.log.max_phys, self.metadata())
        except ValueError as exc:
            log.error("%s; not sent", exc)
        except Exception:
            log.exception("metadata callback failed; skipping this metadata frame")
        return None


    async def _check_proof(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        """The group-secret handshake (replication/wire.py): nothing of the log is sent to
        a peer that does not prove it."""
        magic, theirs = AUTH_HELLO.unpack(await reader.readexactly(AUTH_HELLO.size))
        if magic != AUTH_MAGIC:
            raise NotOfThisGroup(
                "it did not prove the group secret (a broker of this group starts with "
                "the same --group-secret-file)")
        ours = os.urandom(NONCE_BYTES)
        writer.write(CHALLENGE.pack(ours, group_mac(self._secrets[0], "master", self._group,
                                                    theirs, ours)))
        await writer.drain()
        (proof,) = PROOF.unpack(await reader.readexactly(PROOF.size))
        if matching_secret(self._secrets, "slave", self._group, ours, theirs, proof) is None:
            raise NotOfThisGroup(f"its proof of group {self._group!r}'s secret is wrong")


async def _read_hello(reader: asyncio.StreamReader) -> str:
    nlen = hello_name_length(await reader.readexactly(HELLO.size))
    return decode_hello_name(await reader.readexactly(nlen))
