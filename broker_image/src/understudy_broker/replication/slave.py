"""The slave's side of replication: copy the master's log byte for byte, acknowledge what
is durable, reconnect when the link drops.

Why this module exists: a slave reports an offset only after
:meth:`CommitLog.append_replicated` wrote (and, with ``FlushPolicy(mode="batch")``,
fsynced) every byte below it — that report is what the master's acknowledgement waits for
(invariant 3). The slave copies the master's byte stream at the master's physical offsets,
so its segment files are byte-identical and its indexes rebuild equal. A push whose start
differs from the slave's end (+ its buffered tail) drops the link; the slave reconnects
with jittered, capped backoff (:class:`~understudy_broker.retry.Backoff`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

from understudy_broker.replication.wire import (
    AUTH_HELLO,
    AUTH_MAGIC,
    CHALLENGE,
    HEARTBEAT,
    MAX_METADATA_BYTES,
    MAX_PUSH_BYTES,
    METADATA_OFFSET,
    NONCE_BYTES,
    PROOF,
    PUSH_HEADER,
    REPAIR,
    REPAIR_OFFSET,
    NotOfThisGroup,
    ReplicationError,
    ReplicationProtocolError,
    check_body_length,
    decode_metadata,
    decode_probe,
    decode_repair,
    encode_echo,
    encode_hello,
    encode_repair_request,
    group_mac,
    group_secrets,
    matching_secret,
)
from understudy_broker.retry import Backoff
from understudy_broker.storage.commitlog import CommitLog
from understudy_broker.storage.durability import GroupCommit
from understudy_broker.storage.records import CommitLogError
from understudy_broker.tasks import stop_tasks

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_MIN_S = 3.0
"""The least time one connection attempt to the master gets (TCP, TLS and the
group-secret handshake), whatever the link timeout. Linux sends a lost SYN again only
after 1 s (RFC 6298's initial retransmission timeout): with the 1 s link timeout as the
limit, every attempt whose SYN or SYN-ACK was lost failed, one in three on a link losing
20 % each way, and a slave cut off there took 10 s to get back into the in-sync set.
3 s lets each be sent twice."""


class ReplicationClient:
    """The slave's side: one connection to the master, reconnecting with jittered, capped
    backoff."""

    def __init__(
        self,
        log: CommitLog,
        *,
        master_host: str,
        master_port: int,
        name: str,
        on_metadata: Callable[[dict[str, Any]], None],
        on_append: Callable[[], None],
        heartbeat_s: float | None = None,
        link_timeout_s: float = 3.0,
        connect_timeout_s: float | None = None,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 2.0,
        commit: GroupCommit | None = None,
        epoch: Callable[[], int] = lambda: 0,
        on_probe: Callable[[int, float], int | None] | None = None,
        tls: ssl.SSLContext | None = None,
        group: str = "",
        secret: bytes | None = None,
    ) -> None:
        self._tls = tls
        self._group = group
        self._secrets = group_secrets(secret) if secret is not None else ()
        self.log = log
        self.master_host = master_host
        self.master_port = master_port
        self.name = name
        self._hello = encode_hello(name)
        self.on_metadata = on_metadata
        self.on_append = on_append
        # Idle heartbeats say the link lives and what is durable (acknowledgements of
        # pushes go at once, not with these): four per link timeout, as the master's
        # metadata frames go the other way. At a fixed 0.1 s they were ten wake-ups a
        # second on both brokers of every idle link.
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else min(0.25, link_timeout_s / 4)
        self.link_timeout_s = link_timeout_s
        self.connect_timeout_s = (connect_timeout_s if connect_timeout_s is not None
                                  else max(link_timeout_s, CONNECT_TIMEOUT_MIN_S))
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        # Group commit of replicated bytes (batch flush policy): one fsync in a worker
        # thread acknowledges every push appended before it began. ``commit``: the one
        # the log's other flushers use (the broker's Store: its recovery points), so two
        # flushes of one log never run at once.
        self._commit = commit if commit is not None else GroupCommit(
            self._flush, mark=lambda: log.max_phys, flushed=log.flushed_phys)
        # The group epoch this slave applied (0: none, or no ZooKeeper), and the one the
        # master's metadata last named in this session (None: it names none).
        self._epoch = epoch
        # ``on_probe(master_epoch, hold_s)``: the epoch to echo a master's probe with (the
        # broker has agreed to hold back its READ for ``hold_s``), or None: no echo.
        self._on_probe = on_probe
        self.master_epoch: int | None = None
        self.connected = False
        self.master_offset: int | None = None
        self.sessions = 0  # connections made (for status and tests)
        self.repaired = 0  # damaged records mended with the master's copy
        self.last_error: str | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None

    @property
    def lag_bytes(self) -> int:
        if self.master_offset is None:
            return 0
        return max(0, self.master_offset - self.log.max_phys)

    def wake(self) -> None:
        """The master is back (its ``live`` node reappeared): reconnect now, from the first
        backoff step, instead of at the end of a wait of up to ``backoff_max_s``; a failback
        waits for this link. An attempt under way is given up for a new one: it may be to
        an address the master has left (a pod that came back elsewhere)."""
        self._backoff.reset()
        self._wake.set()

    async def stop(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.close()

    async def run(self) -> None:
        while not self._stop.is_set():
            progressed = False
            try:
                progressed = await self._session()
            except TimeoutError:  # before OSError, of which it is one
                self.last_error = f"no data from the master for {self.link_timeout_s:g}s"
            except (asyncio.IncompleteReadError, OSError) as exc:
                self.last_error = f"connection: {exc!r}"
            except MasterBehindError as exc:
                self.last_error = str(exc)
                log.warning("replication from %s:%d paused: %s", self.master_host,
                            self.master_port, exc)
                self._backoff.reset()  # it catches up within milliseconds: ask again soon
            except (ReplicationError, CommitLogError) as exc:
                self.last_error = str(exc)
                log.error(
                    "replication from %s:%d dropped: %s", self.master_host, self.master_port, exc
                )
            finally:
                self.connected = False
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
            if self._stop.is_set():
                break
            if progressed:
                self._backoff.reset()
            delay = self._backoff.next()
            log.info("replication link down (%s); retrying in %.2fs", self.last_error, delay)
            self._wake.clear()
            await _first_of(self._stop, self._wake, timeout_s=delay)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the master and prove the group secret within ``connect_timeout_s``;
        a :meth:`wake` meanwhile gives this attempt up (``ConnectionError``, and the run
        loop tries again at its first backoff step), and so does :meth:`stop` (the broker
        stops without waiting out an attempt on a master that does not answer)."""
        self._wake.clear()
        opening = asyncio.create_task(self._open())
        woken = asyncio.create_task(self._wake.wait())
        stopping = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait((opening, woken, stopping), timeout=self.connect_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            await stop_tasks((opening, woken, stopping))
        if not opening.cancelled():
            return opening.result()  # connected, or why not (refused, not our master, ...)
        if stopping.done() and not stopping.cancelled():
            raise ConnectionError("stopping")
        if woken.done() and not woken.cancelled():
            raise ConnectionError("the master came back: connecting again")
        raise ConnectionError(f"no connection to {self.master_host}:{self.master_port} "
                              f"within {self.connect_timeout_s:g}s")

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(
            self.master_host, self.master_port, ssl=self._tls,
            server_hostname=self.master_host if self._tls is not None else None)
        self._writer = writer  # closed by run() whatever happens next
        if self._secrets:
            await self._prove(reader, writer)
        return reader, writer

    async def _prove(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The group-secret handshake (replication/wire.py); the master proves it too,
        so a stranger on the master's address cannot feed this slave a log."""
        ours = os.urandom(NONCE_BYTES)
        writer.write(AUTH_HELLO.pack(AUTH_MAGIC, ours))
        await writer.drain()
        theirs, mac = CHALLENGE.unpack(await reader.readexactly(CHALLENGE.size))
        secret = matching_secret(self._secrets, "master", self._group, ours, theirs, mac)
        if secret is None:
            raise NotOfThisGroup(
                f"{self.master_host}:{self.master_port} did not prove group "
                f"{self._group!r}'s secret: not our master")
        writer.write(PROOF.pack(group_mac(secret, "slave", self._group, theirs, ours)))

    @property
    def _group_commit(self) -> bool:
        """Batch flush policy: acknowledge only fsynced bytes, fsyncing off the loop."""
        return self.log.flush_policy.mode == "batch"

    def _durable_offset(self) -> int:
        """What this slave may acknowledge: written bytes, or with a ``batch`` flush
        policy only the fsynced ones."""
        return self.log.flushed_phys if self._group_commit else self.log.max_phys

    async def _session(self) -> bool:
        """One connection; returns whether any bytes were replicated."""
        if self._group_commit and self.log.flushed_phys < self.log.max_phys:
            # A previous session may have appended bytes it never fsynced: the hello
            # offset is an acknowledgement too.
            await self._fsync()
        reader, writer = await self._connect()
        self.master_epoch = None
        writer.write(self._hello + HEARTBEAT.pack(self._durable_offset()))
        async with asyncio.timeout(self.link_timeout_s):
            await writer.drain()
        self.connected = True
        self.sessions += 1
        heartbeats = asyncio.create_task(self._heartbeats(writer))
        syncer: asyncio.Task[None] | None = None
        wanted = asyncio.Event()  # set by the reader when appended bytes need an fsync
        if self._group_commit:
            syncer = asyncio.create_task(self._syncer(writer, wanted))
        progressed = False
        pending = b""
        try:
            while not self._stop.is_set():
                async with asyncio.timeout(self.link_timeout_s):
                    header = await reader.readexactly(PUSH_HEADER.size)
                start, length = PUSH_HEADER.unpack(header)
                if start == METADATA_OFFSET:
                    self._on_metadata_frame(
                        await self._read_body(reader, length, MAX_METADATA_BYTES))
                    continue
                if start == REPAIR_OFFSET:
                    self._on_repair(*decode_repair(
                        await self._read_body(reader, length, MAX_PUSH_BYTES + REPAIR.size)))
                    continue
                expected = self.log.max_phys + len(pending)
                if start != expected:
                    raise ReplicationProtocolError(
                        f"master pushed bytes from {start}, but this slave ends at {expected}: gap"
                    )
                body = await self._read_body(reader, length, MAX_PUSH_BYTES)
                if (behind := self._master_behind()) is not None:
                    raise MasterBehindError(behind)
                data = pending + body if pending else body
                before = self.log.max_phys
                after = self.log.append_replicated(before, data, defer_sync=syncer is not None)
                pending = data[after - before :]
                if len(pending) > self.log.segment_bytes:
                    raise ReplicationProtocolError("partial record larger than a segment")
                self.master_offset = max(self.master_offset or 0, start + length)
                if after > before:
                    progressed = True
                    if syncer is None:
                        writer.write(HEARTBEAT.pack(after))
                    else:
                        # Group commit: the syncer fsyncs everything appended so far in
                        # a worker thread while this loop keeps reading and appending;
                        # one fsync then acknowledges every push that arrived meanwhile.
                        wanted.set()
                    self.on_append()
        finally:
            # stop_tasks re-cancels a task that outlives its cancellation and lets this
            # session's own cancellation propagate (a bare ``await task`` under
            # ``suppress(BaseException)`` swallowed it).
            await stop_tasks(t for t in (heartbeats, syncer) if t is not None)
            failure = syncer.exception() if syncer is not None and not syncer.cancelled() else None
            if failure is not None:
                raise failure  # a failed fsync is the reason the link dropped
        return progressed

    async def _flush(self) -> None:
        await asyncio.to_thread(self.log.flush)

    async def _fsync(self) -> None:
        """Make every appended byte durable (group commit); a failure becomes a
        ReplicationError."""
        try:
            await self._commit.durable()
        except OSError as exc:
            raise ReplicationError(f"fsync of replicated bytes failed: {exc}") from exc

    async def _syncer(self, writer: asyncio.StreamWriter, wanted: asyncio.Event) -> None:
        """fdatasync appended bytes off the event loop, then acknowledge them.

        A failed fsync closes the link at once (the reader then stops on its next read)
        and is raised as :class:`ReplicationError`: nothing unsynced is acknowledged,
        and the next session retries the fsync before its hello.
        """
        acked = self.log.flushed_phys
        while True:
            await wanted.wait()
            wanted.clear()
            try:
                await self._fsync()
            except ReplicationError:
                writer.close()
                raise
            durable = self.log.flushed_phys
            if durable > acked:
                acked = durable
                writer.write(HEARTBEAT.pack(durable))

    async def _read_body(self, reader: asyncio.StreamReader, length: int, cap: int) -> bytes:
        check_body_length(length, cap)
        async with asyncio.timeout(self.link_timeout_s):
            return await reader.readexactly(length)

    def _master_behind(self) -> str | None:
        """Why the master's bytes must not be taken now, or None: it names an older group
        epoch than this slave applied. A master woken from a pause, or back from a
        partition, still writes at the epoch it knew for the moment before it applies the
        group's newer state; a slave that took its bytes would acknowledge a write the
        group no longer lets it make (docs/failover.md, "After a partition heals"). The
        bytes are not appended, so nothing is acknowledged, and the link is tried again
        soon: the master sends its epoch the moment it applies one."""
        mine = self._epoch()
        if self.master_epoch is None or mine <= self.master_epoch:
            return None
        return (f"the master writes at epoch {self.master_epoch}, this slave applied epoch "
                f"{mine}: its bytes are not taken until it applies the group's state")

    def _on_metadata_frame(self, body: bytes) -> None:
        max_phys, data = decode_metadata(body)
        epoch = data.get("epoch")
        self.master_epoch = epoch if isinstance(epoch, int) else None
        self.master_offset = max_phys
        probe = decode_probe(data)
        try:
            self.on_metadata(data)
        except Exception:
            log.exception("on_metadata callback failed; replication continues")
        if probe is not None:
            self._echo(*probe)

    def _echo(self, seq: int, hold_s: float) -> None:
        """Answer a master's probe, if the broker agrees (it holds back its own READ
        first). The master reads on the echoes of all its in-sync slaves."""
        writer, master_epoch = self._writer, self.master_epoch
        if self._on_probe is None or writer is None or master_epoch is None:
            return
        epoch = self._on_probe(master_epoch, hold_s)
        if epoch is not None:
            writer.write(encode_echo(seq, epoch))

    async def _heartbeats(self, writer: asyncio.StreamWriter) -> None:
        asked: set[int] = set()  # damaged records asked for in this session
        while True:
            for phys in self.log.damaged_phys():
                if phys not in asked and phys < (self.master_offset or 0):
                    asked.add(phys)
                    writer.write(encode_repair_request(phys))
            await asyncio.sleep(self.heartbeat_s)
            writer.write(HEARTBEAT.pack(self._durable_offset()))
            await writer.drain()

    def _on_repair(self, phys: int, data: bytes) -> None:
        """The master's copy of a record damaged in ours: written over it in place."""
        if not data:
            log.error("the master has no intact copy of the record at log offset %d either; "
                      "it stays damaged", phys)
            return
        problem = self.log.repair(phys, data)
        if problem is None:
            self.repaired += 1
            log.warning("mended the damaged record at log offset %d with the master's copy", phys)
        else:
            log.error("the damaged record at log offset %d was not mended: %s", phys, problem)


class MasterBehindError(ReplicationError):
    """The master pushed bytes while naming an older group epoch than this slave applied."""


async def _first_of(*events: asyncio.Event, timeout_s: float) -> None:
    """Return when one of ``events`` is set or ``timeout_s`` passed."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await stop_tasks(waits)
