"""The broker process: TCP request handling over the commit log, offsets and replication.

Why this module exists: it is the one place where network input meets stored data, so it
owns the rules that protect the data — every request is checked against the effective
permission from the :class:`~understudy_broker.authority.Authority` (a slave never
writes, a broker without READ never serves a read), stale epochs are refused, and a
malformed frame costs its sender the connection and nothing else.

Concurrency model (one asyncio loop):

* One connection = one read loop feeding a :class:`~understudy_broker.protocol.FrameDecoder`.
  Each request runs as its own task, so a long-poll PULL never blocks a PRODUCE pipelined
  behind it; responses carry the request id and may leave out of order.
* PRODUCE appends synchronously (no await before ``CommitLog.append``), so batches from
  one connection land in the order they were sent. Durability is *group commit*: a
  single flusher task fdatasyncs in a worker thread while the loop keeps appending, and
  one fsync acknowledges every batch appended before it began. With synchronous
  replication the handler also waits for a slave to persist the batch (in parallel with
  the local fsync) before answering.
* PULL long-polls on an :class:`AppendSignal` that is fired by local appends and, on a
  slave, by replicated data.

Coordination (``--zk``): the authority is a :class:`~understudy_broker.zkauthority.ZkAuthority`.
Every change of effective permission is appended to the permission log (:mod:`.permlog`);
losing READ answers waiting long-polls ``NO_PERMISSION`` at once and then closes consumer
sessions (connections that pulled, fetched or committed offsets), so consumers re-route
instead of lingering. An acting slave that applies ``RECOVERING`` pushes its consumer
offsets to the master (:mod:`.backsync`); the master merges, persists, and reports the
epoch in its ZooKeeper status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from understudy_broker import protocol as p
from understudy_broker.authority import Authority, StaticAuthority
from understudy_broker.backsync import backsync_epoch_due, push_until_acknowledged
from understudy_broker.commitlog import (
    CommitLog,
    CommitLogError,
    FlushPolicy,
    Message,
    Retention,
)
from understudy_broker.config import BrokerConfig, ConfigError, Peer
from understudy_broker.lease import lease_clock
from understudy_broker.metrics import BrokerMetrics
from understudy_broker.model import Health, Permission, Role
from understudy_broker.offsets import (
    COMMITS_TOPIC,
    RESERVED_PREFIX,
    OffsetStore,
    decode_commit_record,
    encode_commit_record,
)
from understudy_broker.permlog import FILE_NAME as PERMISSION_LOG
from understudy_broker.permlog import BrokerHttpPort, PermissionLog, lapse_time_ns
from understudy_broker.replication import (
    NotEnoughReplicasError,
    ReplicationClient,
    ReplicationServer,
    ReplicationTimeoutError,
)
from understudy_broker.zkauthority import ReplicationFacts, ZkAuthority, ZkIsrStore
from understudy_broker.zklayout import GroupConfig, LayoutError

log = logging.getLogger("understudy.broker")

READ_CHUNK = 256 * 1024
PULL_MAX_RECORDS = 4096
RETENTION_EVERY_S = 10.0
METADATA_INTERVAL_S = 0.25
MAX_INFLIGHT_PER_CONNECTION = 1024
#: How long a coordinated broker waits at start for the group config (to check its ports).
CONFIG_WAIT_S = 3.0
#: How long pending long-polls get to answer NO_PERMISSION before their sessions close.
SESSION_CLOSE_GRACE_S = 1.0
CONSUMER_OPS = frozenset({p.Op.PULL, p.Op.COMMIT_OFFSET, p.Op.FETCH_OFFSET})


class RequestError(Exception):
    """A request that is answered with a non-OK status."""

    def __init__(self, status: p.Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _acknowledged(waits: list[Awaitable[None]]) -> None:
    """Wait until a write may be acknowledged (locally durable, and replicated when
    replication is synchronous); a replication failure becomes the status the client
    sees."""
    try:
        await asyncio.gather(*waits)
    except NotEnoughReplicasError as exc:
        raise RequestError(p.Status.NOT_ENOUGH_REPLICAS, str(exc)) from exc
    except ReplicationTimeoutError as exc:
        raise RequestError(p.Status.TIMEOUT, str(exc)) from exc


# --------------------------------------------------------------------------- topics


class TopicRegistry:
    """Topic -> queue count, persisted atomically in ``<data>/topics.json``.

    The master owns it; slaves receive it with the replication metadata. Queue counts
    never shrink (a message already stored in queue 7 stays addressable).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._topics: dict[str, int] = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
                raw = data["topics"]
                if not isinstance(raw, dict):
                    raise TypeError("topics is not an object")
                self._topics = {str(k): int(v) for k, v in raw.items()}
            except (ValueError, KeyError, TypeError) as exc:
                raise CommitLogError(f"{path} is unreadable: {exc}") from exc

    def get(self, topic: str) -> int | None:
        return self._topics.get(topic)

    def snapshot(self) -> dict[str, int]:
        return dict(self._topics)

    def create(self, topic: str, queues: int) -> bool:
        """True if created or grown; an existing topic with as many queues is left alone."""
        current = self._topics.get(topic, 0)
        if current >= queues:
            return False
        self._topics[topic] = queues
        self._save()
        return True

    def merge(self, topics: Mapping[str, int]) -> bool:
        """Adopt the master's topics (growing only). True when something changed."""
        changed = False
        for topic, queues in topics.items():
            if queues > self._topics.get(topic, 0):
                self._topics[topic] = queues
                changed = True
        if changed:
            self._save()
        return changed

    def _save(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"topics": self._topics}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        dfd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


# --------------------------------------------------------------------------- signals


class AppendSignal:
    """Wakes every long-poll waiter when the log grows (or permission changes)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, wait_s: float) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait_s)


class GroupCommitter:
    """Coalesces fdatasyncs: one flush acknowledges every append made before it began.

    ``batch`` mode: :meth:`durable` returns once a flush covering ``end_phys`` completed.
    ``interval`` mode: :meth:`durable` returns at once and the log is flushed every
    ``interval_ms`` (a crash may lose the last interval of acknowledged writes).
    """

    def __init__(
        self,
        log_: CommitLog,
        *,
        mode: str,
        interval_ms: int,
        on_flush: Callable[[], None] = lambda: None,
    ) -> None:
        self._log = log_
        self._on_flush = on_flush
        self._mode = mode
        self._interval_s = interval_ms / 1000
        self._flushed = log_.max_phys
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self.flushes = 0

    async def durable(self, end_phys: int) -> None:
        if self._mode != "batch" or end_phys <= self._flushed:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end_phys, fut))
        self._wake.set()
        await fut

    async def run(self) -> None:
        while True:
            if self._mode == "batch":
                await self._wake.wait()
                self._wake.clear()
            else:
                await asyncio.sleep(self._interval_s)
                if not self._log.needs_flush():
                    continue
            await self.flush_now()

    async def flush_now(self) -> None:
        target = self._log.max_phys
        try:
            await asyncio.to_thread(self._log.flush)
        except OSError as exc:
            log.error("flush failed: %s", exc)
            waiters, self._waiters = self._waiters, []
            for _, fut in waiters:
                if not fut.done():
                    fut.set_exception(RequestError(p.Status.INTERNAL, f"flush failed: {exc}"))
            return
        self.flushes += 1
        self._on_flush()
        self._flushed = max(self._flushed, target)
        keep = []
        for end, fut in self._waiters:
            if end <= self._flushed:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((end, fut))
        self._waiters = keep
        if keep:
            self._wake.set()


class OffsetsPersister:
    """Every write of ``offsets.json``, one at a time, many changes per fsync.

    A consumer commit is acknowledged only once it is on disk (:meth:`durable`): a master
    killed right after acknowledging a commit restarts with it, and back-sync (maximum
    per key) can then only move offsets forward. Without this the commit lived in memory
    until the next periodic persist and a kill -9 rewound the consumer group.

    The file is written from a copy taken on the event loop, in a worker thread, so the
    loop keeps serving while the fsync runs and nothing mutates what is being written.
    Changes made while a write is in flight are covered by the next one (group commit).
    """

    def __init__(self, store: OffsetStore) -> None:
        self._store = store
        self._lock = asyncio.Lock()
        self._version = 0  # bumped by every change to the store
        self._durable = 0  # the version last written
        self.writes = 0

    def changed(self) -> None:
        self._version += 1

    @property
    def pending(self) -> bool:
        return self._durable < self._version

    async def durable(self, *, inline: bool = False) -> None:
        """Return once every change made before the call is on disk (raises OSError).
        ``inline`` writes on the event loop instead of a worker thread: for back-sync,
        where the broker serves nothing else and a thread hop only adds latency."""
        target = self._version
        async with self._lock:
            if self._durable >= target:
                return
            upto = self._version
            if inline:
                self._store.persist()
            else:
                await self._store.persist_async()  # encoded on the loop, written in a thread
            self._durable = max(self._durable, upto)
            self.writes += 1


# --------------------------------------------------------------------------- broker


@dataclass(frozen=True, slots=True)
class Listening:
    """Where a started broker listens (ports resolved when 0 was asked)."""

    host: str
    port: int
    http_port: int | None
    replication_port: int | None


Handler = Callable[[p.Frame], Awaitable[bytes]]


@dataclass(eq=False, slots=True)
class _Session:
    """One client connection. ``consumer``: it pulled, fetched or committed offsets, so it
    is closed when this broker loses READ."""

    writer: asyncio.StreamWriter
    polls: set[asyncio.Task[Any]]
    consumer: bool = False


def spec_mismatch(cfg: BrokerConfig, group: GroupConfig) -> str | None:
    """Why this broker's flags contradict its BrokerSpec in the group config, or None."""
    try:
        spec = group.broker(cfg.name)
    except LayoutError as exc:
        return str(exc)
    problems = []
    if spec.role is not cfg.role:
        problems.append(f"role {spec.role.value} (ordinal {spec.ordinal}), flags say {cfg.role.value}")
    if spec.port != cfg.port:
        problems.append(f"--port {spec.port}, flags say {cfg.port}")
    if cfg.role is Role.MASTER and spec.replication_port != cfg.replication_port:
        problems.append(
            f"--replication-port {spec.replication_port}, flags say {cfg.replication_port}")
    if cfg.http_port is not None and spec.http_port != cfg.http_port:
        problems.append(f"--http-port {spec.http_port}, flags say {cfg.http_port}")
    if not problems:
        return None
    return f"group {group.group!r} config for broker {cfg.name!r} says " + "; ".join(problems)


class Broker:
    """One broker: open with :meth:`start`, stop with :meth:`stop`."""

    def __init__(
        self,
        cfg: BrokerConfig,
        *,
        authority: Authority | None = None,
        peer_probe: Callable[[Peer], Awaitable[tuple[int, int, str]]] | None = None,
    ) -> None:
        self.cfg = cfg
        if authority is None and cfg.zk is not None:
            authority = ZkAuthority(
                connect=cfg.zk,
                group=cfg.group,
                name=cfg.name,
                role=cfg.role,
                configured=cfg.permission,
                address=self._advertised_address,
                session_timeout_s=cfg.zk_session_timeout_ms / 1000,
                link_timeout_s=cfg.link_timeout_s,
                digest_auth=cfg.zk_digest,
            )
        self._zk = authority if isinstance(authority, ZkAuthority) else None
        self._authority: Authority = authority or StaticAuthority(
            name=cfg.name,
            group=cfg.group,
            role=cfg.role,
            configured=cfg.permission,
            address=lambda: f"{self.cfg.host}:{self.listening.port}",
            peers=cfg.peers,
            probe=peer_probe,
        )
        self.metrics = BrokerMetrics(group=cfg.group, broker=cfg.name, role=cfg.role.value)
        self._log: CommitLog | None = None
        self._offsets: OffsetStore | None = None
        self._persister: OffsetsPersister | None = None
        self._topics: TopicRegistry | None = None
        self._committer: GroupCommitter | None = None
        self._repl_server: ReplicationServer | None = None
        self._repl_client: ReplicationClient | None = None
        self._server: asyncio.Server | None = None
        self._http: BrokerHttpPort | None = None
        self._signal: AppendSignal | None = None
        self._background: list[asyncio.Task[Any]] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._sessions: set[_Session] = set()
        self._permlog = PermissionLog(cfg.data_dir / PERMISSION_LOG, group=cfg.group,
                                      broker=cfg.name)
        self._had_read = False
        self._backsync_persisted: int | None = None
        self._backsync_task: asyncio.Task[None] | None = None
        self._backsync_epoch: int | None = None  # the epoch being pushed or acknowledged
        self._last_facts: tuple[bool, tuple[str, ...], int | None] | None = None
        self._master_heard: tuple[int, float] | None = None  # (replication session, when)
        self._commits_applied = 0  # slave: next COMMITS_TOPIC offset to apply
        self._commits_end = 0  # master: log end of the last commit record appended
        self._inflight: set[asyncio.Task[Any]] = set()
        self._handlers: dict[int, Handler] = {
            p.Op.CREATE_TOPIC: self._create_topic,
            p.Op.PRODUCE: self._produce,
            p.Op.PULL: self._pull,
            p.Op.COMMIT_OFFSET: self._commit_offset,
            p.Op.FETCH_OFFSET: self._fetch_offset,
            p.Op.GET_ROUTE: self._get_route,
            p.Op.HEARTBEAT: self._heartbeat,
            p.Op.BACKSYNC_OFFSETS: self._backsync,
        }
        self._stopping = False

    # ---- lifecycle ------------------------------------------------------------------

    @property
    def log(self) -> CommitLog:
        if self._log is None:
            raise RuntimeError("broker not started")
        return self._log

    @property
    def offsets(self) -> OffsetStore:
        if self._offsets is None:
            raise RuntimeError("broker not started")
        return self._offsets

    @property
    def topics(self) -> TopicRegistry:
        if self._topics is None:
            raise RuntimeError("broker not started")
        return self._topics

    async def start(self) -> Listening:
        cfg = self.cfg
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._signal = AppendSignal()
        retention = Retention(
            max_bytes=cfg.retention_bytes,
            max_age_s=None if cfg.retention_hours is None else cfg.retention_hours * 3600,
        )
        self._log = CommitLog.open(
            cfg.data_dir,
            segment_bytes=cfg.segment_bytes,
            flush=self._flush_policy(),
            retention=retention,
        )
        rec = self._log.recovery
        if rec.truncated_bytes or rec.indexes_rebuilt:
            log.warning(
                "recovered the log: truncated %d torn bytes, rebuilt %d indexes",
                rec.truncated_bytes,
                rec.indexes_rebuilt,
            )
        self._offsets = OffsetStore.open(cfg.data_dir / "offsets.json")
        self._persister = OffsetsPersister(self._offsets)
        self._backsync_persisted = self._offsets.backsync_epoch
        self._topics = TopicRegistry(cfg.data_dir / "topics.json")
        # Topics seen in the log but missing from the registry (a crash between the two)
        # are re-registered so their data stays addressable.
        self._topics.merge({t: n for t, n in self._log.topics().items()
                            if not t.startswith(RESERVED_PREFIX)})
        if cfg.role is Role.SLAVE:
            self._apply_commit_records()  # commits replicated after offsets.json was written
        self._committer = GroupCommitter(
            self._log,
            mode=cfg.flush,
            interval_ms=cfg.flush_interval_ms,
            on_flush=self.metrics.log_flushed,
        )
        self._permlog.open()
        self._authority.subscribe(self._on_authority_change)
        if self._zk is not None:
            self._zk.set_facts_source(self._facts)
        await self._authority.start()
        if self._zk is not None:
            await self._check_group_config(self._zk)

        if cfg.role is Role.MASTER:
            self._repl_server = ReplicationServer(
                self._log,
                host=cfg.host,
                port=cfg.replication_port or 0,
                sync=cfg.sync,
                min_insync=cfg.min_insync_replicas,
                auto_degrade=cfg.auto_degrade,
                metadata=self._metadata,
                ack_timeout_s=cfg.ack_timeout_s,
                # Topics and consumer offsets reach slaves within this interval; a
                # topic just created is readable on a slave this much later.
                metadata_interval_s=METADATA_INTERVAL_S,
                # With ZooKeeper the master records the in-sync set (docs/failover.md):
                # a slave that does not acknowledge within the link timeout leaves it
                # before anything is acknowledged without it.
                isr=ZkIsrStore(self._zk) if self._zk is not None else None,
                isr_lag_s=cfg.link_timeout_s,
            )
            await self._repl_server.start()
        else:
            if cfg.master is None:
                raise RuntimeError("a slave needs a master address")
            self._repl_client = ReplicationClient(
                self._log,
                master_host=cfg.master[0],
                master_port=cfg.master[1],
                name=cfg.name,
                on_metadata=self._on_metadata,
                on_append=self._on_replicated,
                link_timeout_s=cfg.link_timeout_s,
            )
            self._background.append(asyncio.create_task(self._repl_client.run()))

        self._server = await asyncio.start_server(
            self._serve_connection, cfg.host, cfg.port, limit=READ_CHUNK, backlog=512
        )
        if cfg.http_port is not None:
            self._http = BrokerHttpPort(
                registry=self.metrics.registry, ready=self._ready, host=cfg.host,
                port=cfg.http_port, permissions=self._permlog.path,
            )
            await self._http.start()
        self._background += [
            asyncio.create_task(self._committer.run()),
            asyncio.create_task(self._housekeeping()),
        ]
        self._on_authority_change()
        return self.listening

    def _advertised_address(self) -> str:
        """The address clients are told for this broker: its BrokerSpec's in the group
        config (a pod's DNS name while it listens on 0.0.0.0), else host:port."""
        coord = self._zk.coordinator if self._zk is not None else None
        if coord is not None and coord.config is not None:
            with contextlib.suppress(LayoutError):
                return coord.config.broker(self.cfg.name).address
        return f"{self.cfg.host}:{self.listening.port}"

    async def _check_group_config(self, zk: ZkAuthority) -> None:
        """Wait briefly for the group config; refuse to run if it contradicts the flags
        (ports and role come from the flags; the config is what clients and the controller
        are told). A group not configured yet is logged, not fatal: the broker enforces
        NONE until it learns the state."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONFIG_WAIT_S
        while True:
            coord = zk.coordinator
            group = coord.config if coord is not None else None
            if group is not None:
                problem = spec_mismatch(self.cfg, group)
                if problem is not None:
                    await zk.stop()
                    self._permlog.close()
                    if self._log is not None:
                        self._log.close()
                        self._log = None
                    raise ConfigError(problem)
                return
            if loop.time() >= deadline:
                log.warning("group %s has no config in ZooKeeper yet; enforcing NONE until it "
                            "has a state", self.cfg.group)
                return
            await asyncio.sleep(0.02)

    def _flush_policy(self) -> FlushPolicy:
        """On a master the broker flushes (GroupCommitter: one fdatasync for many
        concurrent batches), so the log never fsyncs inside ``append``. On a slave the
        replication client acknowledges what ``append_replicated`` returned, so with
        ``--flush batch`` the log must fsync inside it (invariant 3)."""
        cfg = self.cfg
        if cfg.role is Role.SLAVE and cfg.flush == "batch":
            return FlushPolicy(mode="batch", interval_ms=cfg.flush_interval_ms)
        return FlushPolicy(mode="interval", interval_ms=cfg.flush_interval_ms)

    @property
    def listening(self) -> Listening:
        port = self.cfg.port
        if self._server is not None and self._server.sockets:
            port = int(self._server.sockets[0].getsockname()[1])
        return Listening(
            host=self.cfg.host,
            port=port,
            http_port=self._http.port if self._http is not None else None,
            replication_port=self._repl_server.port if self._repl_server is not None else None,
        )

    async def stop(self, *, grace_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish, flush log and offsets."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        if self._backsync_task is not None:
            self._backsync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._backsync_task
        if self._signal is not None:
            self._signal.fire()  # long-polls return now
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=grace_s)
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=grace_s)
        if self._http is not None:
            await self._http.stop()
        if self._repl_client is not None:
            await self._repl_client.stop()
        if self._repl_server is not None:
            await self._repl_server.stop()
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._authority.stop()
        self._permlog.record(Permission.NONE, self._authority.epoch())
        self._permlog.close()
        if self._persister is not None:
            try:
                await self._persister.durable()
            except OSError as exc:
                log.error("persisting consumer offsets at stop failed: %s", exc)
        if self._log is not None:
            self._log.flush()
            self._log.flush_indexes()
            self._log.close()
            self._log = None

    # ---- replication hooks ----------------------------------------------------------

    def _metadata(self) -> dict[str, Any]:
        """What the master pushes to slaves on an interval: topics and consumer offsets."""
        return {"topics": self.topics.snapshot(), "offsets": self.offsets.snapshot()}

    def _heard_from_master(self) -> None:
        rc = self._repl_client
        if rc is not None:
            self._master_heard = (rc.sessions, time.monotonic())

    def _master_link_up(self) -> bool:
        """The slave's link counts as up only while the master is *heard* (metadata every
        0.25 s, data): a TCP connection to a frozen master is accepted by its kernel and
        proves nothing, and reporting it as a link would keep the controller from fencing."""
        rc = self._repl_client
        if rc is None or not rc.connected or self._master_heard is None:
            return False
        session, at = self._master_heard
        return session == rc.sessions and time.monotonic() - at < self.cfg.link_timeout_s

    def _on_metadata(self, data: Mapping[str, Any]) -> None:
        self._heard_from_master()
        topics = data.get("topics")
        if isinstance(topics, dict):
            self.topics.merge({str(k): int(v) for k, v in topics.items()})
        snapshot = data.get("offsets")
        if snapshot is not None and self.offsets.merge(snapshot) and self._persister is not None:
            self._persister.changed()  # written by housekeeping within the persist interval

    def _on_replicated(self, *_args: object) -> None:
        self._heard_from_master()
        self._apply_commit_records()
        if self._signal is not None:
            self._signal.fire()

    def _apply_commit_records(self) -> None:
        """Slave: apply the consumer commits replicated as :data:`COMMITS_TOPIC` records
        (maximum per key, so replays after a restart are harmless)."""
        lg = self.log
        end = lg.queue_end(COMMITS_TOPIC, 0)
        pos = max(self._commits_applied, lg.queue_start(COMMITS_TOPIC, 0))
        moved = 0
        while pos < end:
            try:
                records = lg.read(COMMITS_TOPIC, 0, pos, max_bytes=1 << 20, max_records=4096)
            except CommitLogError as exc:
                log.error("reading replicated commits at offset %d failed: %s", pos, exc)
                break
            if not records:
                break
            for rec in records:
                try:
                    moved += self.offsets.merge(decode_commit_record(rec.body))
                except ValueError as exc:
                    log.error("skipping a malformed commit record at offset %d: %s",
                              rec.queue_offset, exc)
            pos = records[-1].queue_offset + 1
        self._commits_applied = pos
        if moved and self._persister is not None:
            self._persister.changed()  # written by housekeeping within the persist interval

    def _on_authority_change(self) -> None:
        """Called on the loop whenever effective permission or epoch may have changed
        (state applied, session lost, lease lapsed, slave links changed)."""
        eff = self._authority.effective()
        epoch = self._authority.epoch()
        self.metrics.set_permission(eff)
        self._record_permission(eff, epoch)
        if self._signal is not None:
            self._signal.fire()  # long-polls re-check their permission
        has_read = bool(eff & Permission.READ)
        if self._had_read and not has_read:
            task = asyncio.get_running_loop().create_task(self._close_consumer_sessions())
            self._background.append(task)
            task.add_done_callback(self._forget_background)
        self._had_read = has_read
        self._maybe_backsync()

    def _forget_background(self, task: asyncio.Task[Any]) -> None:
        with contextlib.suppress(ValueError):
            self._background.remove(task)

    def _record_permission(self, eff: Permission, epoch: int) -> None:
        last = self._permlog.last
        t_ns = None
        coord = self._zk.coordinator if self._zk is not None else None
        if last is not None and last.effective & Permission.READ and not eff & Permission.READ \
                and coord is not None and not coord.lease_valid():
            lease = coord.lease
            if lease.granted_at is not None:
                # The lapse timer (or the request that noticed) fired after the lease ran out;
                # READ ended at the lapse itself, since every request checks the lease.
                t_ns = lapse_time_ns(now_ns=time.time_ns(), now_clock=lease_clock(),
                                     lapsed_at_clock=lease.granted_at + lease.duration)
        self._permlog.record(eff, epoch, t_ns=t_ns)

    async def _close_consumer_sessions(self) -> None:
        """READ was lost: let waiting long-polls answer NO_PERMISSION (the signal already
        woke them), then close every consumer session so clients re-route."""
        victims = [s for s in self._sessions if s.consumer]
        polls = {t for s in victims for t in s.polls}
        if polls:
            await asyncio.wait(polls, timeout=SESSION_CLOSE_GRACE_S)
        if self._authority.effective() & Permission.READ:
            return  # READ came back meanwhile; nothing to close
        for s in victims:
            s.writer.close()
        if victims:
            log.info("closed %d consumer session(s) after losing READ", len(victims))

    def _ready(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "stopping"
        if self._zk is not None:
            coord = self._zk.coordinator
            state = coord.state if coord is not None else None
            if state is None:
                return False, "no group state applied yet"
            return True, (f"{self.cfg.role.value} {self._authority.effective().label} "
                          f"{state.mode.name} epoch {state.epoch}")
        if self._repl_client is not None and not self._repl_client.connected:
            return False, "not connected to the master"
        return True, f"{self.cfg.role.value} {self._authority.effective().label}"

    # ---- coordination: facts and back-sync ------------------------------------------

    def _facts(self) -> ReplicationFacts:
        """What ZkAuthority publishes in this broker's status."""
        links: tuple[str, ...] = ()
        if self._repl_server is not None:
            links = tuple(sorted(lk.name for lk in self._repl_server.links() if lk.connected))
        return ReplicationFacts(
            master_link=self._master_link_up(),
            slave_links=links,
            max_offset=self._log.max_phys if self._log is not None else 0,
            backsync_epoch=self._backsync_persisted,
        )

    def _publish_if_facts_changed(self) -> None:
        if self._zk is None:
            return
        f = self._facts()
        key = (f.master_link, f.slave_links, f.backsync_epoch)
        if key != self._last_facts:
            self._last_facts = key
            self._zk.facts_changed()

    def _maybe_backsync(self) -> None:
        """Start pushing offsets when this slave is the acting slave of a RECOVERING group."""
        zk = self._zk
        if zk is None or self._stopping or self._offsets is None:
            return
        coord = zk.coordinator
        due = backsync_epoch_due(role=self.cfg.role, name=self.cfg.name,
                                 state=coord.state if coord is not None else None)
        if due is None or due == self._backsync_epoch:
            return
        if self._backsync_task is not None:
            self._backsync_task.cancel()
        self._backsync_epoch = due
        self._backsync_task = asyncio.get_running_loop().create_task(
            self._run_backsync(zk, due), name=f"backsync-{due}")

    async def _run_backsync(self, zk: ZkAuthority, epoch: int) -> None:
        def master() -> tuple[str, int] | None:
            coord = zk.coordinator
            if coord is None or coord.config is None:
                return None
            m = coord.config.master
            return m.host, m.port

        def still_due() -> bool:
            coord = zk.coordinator
            state = coord.state if coord is not None else None
            return (not self._stopping and not self._authority.effective() & Permission.READ
                    and backsync_epoch_due(role=self.cfg.role, name=self.cfg.name,
                                           state=state) == epoch)

        def request() -> p.BackSyncRequest:
            return p.BackSyncRequest(self.cfg.group, self.cfg.name, epoch,
                                     self.offsets.snapshot())

        started = time.monotonic()
        try:
            answer = await push_until_acknowledged(epoch=epoch, master=master, request=request,
                                                   still_due=still_due)
        except Exception:  # a background task must report, not vanish
            log.exception("back-sync of epoch %d crashed", epoch)
            self._backsync_epoch = None
            return
        if answer is None:
            log.info("back-sync of epoch %d abandoned (no longer due)", epoch)
        else:
            log.info("back-sync of epoch %d acknowledged in %.1f ms (%d offsets moved up)",
                     epoch, (time.monotonic() - started) * 1000, answer.moved)

    async def _housekeeping(self) -> None:
        last_persist = last_retention = time.monotonic()
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            if now - last_persist >= self.cfg.offsets_persist_interval_s:
                last_persist = now
                try:
                    if self._persister is not None and self._persister.pending:
                        await self._persister.durable()
                except OSError as exc:
                    log.error("persisting consumer offsets failed: %s", exc)
            if now - last_retention >= RETENTION_EVERY_S:
                last_retention = now
                deleted = self.log.apply_retention(int(time.time() * 1000))
                if deleted:
                    log.info("retention deleted %d segment(s)", deleted)
            self._refresh_health()

    def _refresh_health(self) -> None:
        if self._repl_server is not None:
            rs = self._repl_server
            self._authority.update_health(
                Health(
                    slaves_assigned=bool(self.cfg.peers),
                    slave_connected=rs.slave_connected,
                    slave_once_connected=rs.slave_once_connected,
                )
            )
            for link in rs.links():
                self.metrics.replication_lag(broker=link.name, lag_bytes=link.lag_bytes)
        if self._repl_client is not None:
            self.metrics.replication_lag(
                broker=self.cfg.name, lag_bytes=int(self._repl_client.lag_bytes)
            )
        self._publish_if_facts_changed()

    # ---- connections ----------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        decoder = p.FrameDecoder(self.cfg.max_frame_bytes)
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
                        epoch=self._authority.epoch(),
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
        epoch = self._authority.epoch()
        try:
            if frame.is_response:
                raise RequestError(p.Status.BAD_FRAME, "a broker does not accept responses")
            handler = self._handlers.get(frame.op)
            if handler is None:
                raise RequestError(
                    p.Status.UNKNOWN_OPERATION, f"operation {frame.op} is not supported"
                )
            body = await handler(frame)
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

    # ---- checks ---------------------------------------------------------------------

    def _check_epoch(self, frame: p.Frame) -> None:
        current = self._authority.epoch()
        if frame.epoch and frame.epoch < current:
            raise RequestError(
                p.Status.STALE_EPOCH,
                f"request epoch {frame.epoch} is older than this broker's epoch {current}",
            )

    def _require_write(self, frame: p.Frame) -> None:
        if self._authority.role is not Role.MASTER:
            raise RequestError(p.Status.NOT_MASTER, f"{self.cfg.name} is a slave: it never writes")
        if not self._authority.effective() & Permission.WRITE:
            raise RequestError(
                p.Status.NO_PERMISSION,
                f"{self.cfg.name} has no WRITE permission "
                f"(effective {self._authority.effective().label})",
            )
        self._check_epoch(frame)

    def _require_read(self, frame: p.Frame) -> None:
        if not self._authority.effective() & Permission.READ:
            raise RequestError(
                p.Status.NO_PERMISSION,
                f"{self.cfg.name} has no READ permission "
                f"(effective {self._authority.effective().label})",
            )
        self._check_epoch(frame)

    def _queues(self, topic: str) -> int:
        n = self.topics.get(topic)
        if n is None:
            raise RequestError(p.Status.UNKNOWN_TOPIC, f"unknown topic {topic!r}")
        return n

    # ---- handlers -------------------------------------------------------------------

    async def _create_topic(self, frame: p.Frame) -> bytes:
        self._require_write(frame)
        req = p.CreateTopicRequest.decode(frame.body)
        if req.topic.startswith(RESERVED_PREFIX):
            raise RequestError(p.Status.BAD_REQUEST,
                               f"topic names starting with {RESERVED_PREFIX!r} are reserved")
        created = self.topics.create(req.topic, req.queues)
        queues = self.topics.get(req.topic) or req.queues
        if self._repl_server is not None:
            self._repl_server.push_metadata_now()  # slaves learn the topic now
        return p.CreateTopicResponse(req.topic, queues, created).encode()

    async def _produce(self, frame: p.Frame) -> bytes:
        started = time.perf_counter()
        self._require_write(frame)
        topic, raw = p.decode_produce(frame.body)
        queues = self._queues(topic)
        if not raw:
            return p.ProduceResponse([]).encode()
        now_ms = int(time.time() * 1000)
        bad = [q for q, _k, _b in raw if q >= queues]
        if bad:
            raise RequestError(
                p.Status.BAD_REQUEST,
                f"queue {bad[0]} does not exist: topic {topic!r} has {queues} queues",
            )
        # Plain tuples, not Message objects: the log takes either, tuples are cheaper.
        messages = [(topic, q, k, b, now_ms) for q, k, b in raw]
        # No await before the append: batches of one connection keep their order.
        try:
            result = self.log.append(messages)
        except (CommitLogError, ValueError) as exc:
            raise RequestError(p.Status.BAD_REQUEST, str(exc)) from exc
        if self._signal is not None:
            self._signal.fire()
        if self._committer is None:
            raise RuntimeError("broker not started")
        waits: list[Awaitable[None]] = [self._committer.durable(result.end_phys)]
        if self._repl_server is not None:
            self._repl_server.notify_appended()
            if self.cfg.sync:
                waits.append(self._repl_server.wait_replicated(result.end_phys))
        await _acknowledged(waits)
        self.metrics.messages_in(len(messages))
        self.metrics.produce_latency(time.perf_counter() - started)
        return p.ProduceResponse([(q, o) for _t, q, o in result.queue_offsets]).encode()

    async def _pull(self, frame: p.Frame) -> bytes:
        self._require_read(frame)
        req = p.PullRequest.decode(frame.body)
        queues = self._queues(req.topic)
        if req.queue >= queues:
            raise RequestError(
                p.Status.BAD_REQUEST,
                f"queue {req.queue} does not exist: topic {req.topic!r} has {queues} queues",
            )
        # Keep the response inside the frame limit the client most likely uses.
        max_bytes = max(1, min(req.max_bytes, self.cfg.max_frame_bytes // 2))
        deadline = time.monotonic() + min(req.max_wait_ms, 60_000) / 1000
        signal = self._signal
        while True:
            start = self.log.queue_start(req.topic, req.queue)
            end = self.log.queue_end(req.topic, req.queue)
            offset = max(req.offset, start)
            records = self.log.read(
                req.topic, req.queue, offset, max_bytes=max_bytes, max_records=PULL_MAX_RECORDS
            )
            remaining = deadline - time.monotonic()
            if records or remaining <= 0 or self._stopping or signal is None:
                break
            await signal.wait(remaining)
            self._require_read(frame)  # permission may have changed while waiting
        next_offset = records[-1].queue_offset + 1 if records else offset
        self.metrics.messages_out(len(records))
        return p.PullResponse(
            next_offset,
            start,
            end if not records else max(end, next_offset),
            [p.PulledRecord(r.queue_offset, r.timestamp_ms, r.key, r.body) for r in records],
        ).encode()

    async def _commit_offset(self, frame: p.Frame) -> bytes:
        self._require_read(frame)
        req = p.CommitOffsetRequest.decode(frame.body)
        queues = self._queues(req.topic)
        bad = [q for q in req.offsets if q >= queues]
        if bad:
            raise RequestError(p.Status.BAD_REQUEST, f"queue {bad[0]} does not exist")
        stored: dict[int, int | None] = {}
        moved: dict[int, int] = {}
        for q, off in req.offsets.items():
            before = self.offsets.get(req.group, req.topic, q)
            stored[q] = kept = self.offsets.commit(req.group, req.topic, q, off)
            if kept != before:
                moved[q] = kept
        if moved and self._persister is not None:
            self._persister.changed()
        waits: list[Awaitable[None]] = [self._offsets_durable()]
        rs = self._repl_server
        if rs is not None:
            if moved:
                # The commit travels to slaves as a log record, so the sync acknowledgement
                # (and the in-sync set) covers it exactly as it covers a produce.
                record = Message(COMMITS_TOPIC, 0, None,
                                 encode_commit_record(req.group, req.topic, moved),
                                 int(time.time() * 1000))
                try:
                    self._commits_end = self.log.append([record]).end_phys
                except (CommitLogError, ValueError) as exc:
                    raise RequestError(p.Status.INTERNAL, f"recording the commit: {exc}") from exc
                rs.notify_appended()
            if self.cfg.sync and self._commits_end:
                # Unchanged offsets still wait: an earlier commit that moved them may be
                # in flight to the slaves.
                waits.append(rs.wait_replicated(self._commits_end))
        await _acknowledged(waits)
        return p.OffsetsResponse(stored).encode()

    async def _offsets_durable(self, *, inline: bool = False) -> None:
        """Acknowledge offsets only once they are on disk (see :class:`OffsetsPersister`)."""
        if self._persister is None:
            raise RuntimeError("broker not started")
        try:
            await self._persister.durable(inline=inline)
        except OSError as exc:
            raise RequestError(p.Status.INTERNAL, f"persisting consumer offsets: {exc}") from exc

    async def _fetch_offset(self, frame: p.Frame) -> bytes:
        self._require_read(frame)
        req = p.FetchOffsetRequest.decode(frame.body)
        self._queues(req.topic)
        return p.OffsetsResponse(
            {q: self.offsets.get(req.group, req.topic, q) for q in req.queues}
        ).encode()

    async def _get_route(self, frame: p.Frame) -> bytes:
        req = p.GetRouteRequest.decode(frame.body)
        topics = self.topics.snapshot()
        if req.topic is not None:
            topics = {req.topic: topics[req.topic]} if req.topic in topics else {}
        groups = await self._authority.route()
        names = [g.group for g in groups]
        return p.RouteResponse(groups, topics, {t: names for t in topics}).encode()

    async def _backsync(self, frame: p.Frame) -> bytes:
        """BACKSYNC_OFFSETS on the master: no READ needed (the master is NONE until this
        completes). Merge (maximum per key: nothing moves back), persist, then answer; a
        push tagged with an epoch older than the one applied is refused as stale."""
        if self._authority.role is not Role.MASTER:
            raise RequestError(p.Status.NOT_MASTER,
                               f"{self.cfg.name} is a slave: back-sync goes to the master")
        req = p.BackSyncRequest.decode(frame.body)
        if req.group != self.cfg.group:
            raise RequestError(p.Status.BAD_REQUEST,
                               f"back-sync for group {req.group!r} sent to group {self.cfg.group!r}")
        current = self._authority.epoch()
        if req.epoch < current or (frame.epoch and frame.epoch < current):
            raise RequestError(
                p.Status.STALE_EPOCH,
                f"back-sync tagged epoch {req.epoch} is older than this broker's epoch {current}",
            )
        before = self.offsets.backsync_epoch
        moved = self.offsets.merge(req.offsets, epoch=req.epoch)
        if (moved or self.offsets.backsync_epoch != before) and self._persister is not None:
            self._persister.changed()
        await self._offsets_durable(inline=True)
        if moved and self._repl_server is not None:
            # The slaves that were not acting learn the back-synced offsets through the
            # log too (not waited for: the acting slave already holds them).
            with contextlib.suppress(CommitLogError, ValueError):
                self._commits_end = self.log.append([Message(
                    COMMITS_TOPIC, 0, None,
                    json.dumps(self.offsets.snapshot(), separators=(",", ":")).encode("utf-8"),
                    int(time.time() * 1000))]).end_phys
                self._repl_server.notify_appended()
        self._backsync_persisted = self.offsets.backsync_epoch
        log.info("back-sync from %s at epoch %d persisted (%d offsets moved up)", req.sender,
                 req.epoch, moved)
        self._publish_if_facts_changed()
        return p.BackSyncResponse(req.epoch, moved, self.offsets.backsync_epoch or req.epoch).encode()

    async def _heartbeat(self, frame: p.Frame) -> bytes:
        p.HeartbeatRequest.decode(frame.body)
        return p.HeartbeatResponse(
            self.cfg.name,
            self.cfg.group,
            self._authority.role.value,
            int(self._authority.effective()),
            self._authority.epoch(),
            self.log.max_phys,
        ).encode()


async def probe_peer(peer: Peer, *, timeout_s: float = 0.5) -> tuple[int, int, str]:
    """HEARTBEAT a peer: ``(effective permission, epoch, role)``."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(peer.host, peer.port), timeout_s
    )
    try:
        writer.write(
            p.encode_frame(request_id=1, op=p.Op.HEARTBEAT, body=p.HeartbeatRequest().encode())
        )
        head = await asyncio.wait_for(reader.readexactly(p.HEADER_SIZE), timeout_s)
        decoder = p.FrameDecoder(64 * 1024)
        decoder.feed(head)
        frame = decoder.next_frame()  # enforces the size limit before reading the body
        if frame is p.NEED_DATA:
            length = p.HEADER.unpack(head)[7]
            decoder.feed(await asyncio.wait_for(reader.readexactly(length), timeout_s))
            frame = decoder.next_frame()
        if not isinstance(frame, p.Frame) or frame.status != p.Status.OK:
            raise ValueError(f"peer {peer.name} answered with an error")
        hb = p.HeartbeatResponse.decode(frame.body)
        return hb.permission, hb.epoch, hb.role
    except p.FrameError as exc:
        raise ValueError(str(exc)) from exc
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
