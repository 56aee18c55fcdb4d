"""The broker process: storage, a replication role and an authority, served on a client port.

Why this module exists: it is the composition root of a broker and owns its lifecycle:
:meth:`Broker.start` opens the data directory (:class:`~understudy_broker.storage.store.Store`),
builds the role's half (:class:`~.replica.MasterReplica` or :class:`~.replica.SlaveReplica`),
starts the authority that decides the effective permission
(:mod:`understudy_broker.ha.authority`: static, or ZooKeeper with read leases and
back-sync), and serves requests (:class:`~.requests.Requests` behind a
:class:`~.connections.ClientPort`); :meth:`Broker.stop` undoes it in order, flushing log
and offsets. What happens to one request is in :mod:`.requests`; this module only wires.

Around the parts it keeps the facts that cross them: every change of effective
permission is written to the permission log (:mod:`understudy_broker.ha.permlog`), updates
the metric and wakes long-polls; losing READ closes consumer sessions so consumers
re-route at once; housekeeping persists offsets, applies retention and reports
replication health and lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from understudy_broker import protocol as p
from understudy_broker.chains import committed_groups, consumed_upto
from understudy_broker.config import BrokerConfig, ConfigError, advertised_host, spec_mismatch
from understudy_broker.ha.authority import (
    Authority,
    BrokerHooks,
    PeerProbe,
    ReplicationFacts,
    authority_for,
    probe_peer,
)
from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.ha.permlog import FILE_NAME as PERMISSION_LOG
from understudy_broker.ha.permlog import PermissionLog
from understudy_broker.model import Permission, Role
from understudy_broker.replication.master import ReplicationServer
from understudy_broker.security import BrokerTls, CertReloader
from understudy_broker.server import limits as lim
from understudy_broker.server.auth import Session
from understudy_broker.server.connections import ClientPort
from understudy_broker.server.http import BrokerHttpPort
from understudy_broker.server.metrics import BrokerMetrics
from understudy_broker.server.producers import Producers
from understudy_broker.server.readable import ReadableEnd
from understudy_broker.server.replica import (
    METADATA_INTERVAL_S,
    LinkSecurity,
    MasterReplica,
    Replica,
    SlaveReplica,
)
from understudy_broker.server.requests import AppendSignal, OutputRoom, Requests, acknowledged
from understudy_broker.server.scheduler import Escaper, Mode, Scheduler
from understudy_broker.storage.commitlog import AppendResult, FlushPolicy, Retention
from understudy_broker.storage.records import RecordTuple
from understudy_broker.storage.schedule import ScheduleIndex
from understudy_broker.storage.store import Store
from understudy_broker.tasks import stop_tasks
from understudy_broker.zklayout import OrderedFacts

log = logging.getLogger("understudy.broker")

HOUSEKEEPING_EVERY_S = 0.25
#: How long a coordinated broker waits at start for the group config (to check its ports).
CONFIG_WAIT_S = 3.0
SCHEDULE_FILE = "schedule.db"


def _own_address() -> str:
    """This machine's own name resolved (a container's or a pod's IP): what a broker
    listening on a wildcard tells clients; its name when it does not resolve."""
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


@dataclass(frozen=True, slots=True)
class Listening:
    """Where a started broker listens (ports resolved when 0 was asked)."""

    host: str
    port: int
    http_port: int | None
    replication_port: int | None


@dataclass(frozen=True, slots=True)
class _Parts:
    """What exists only while the broker runs."""

    store: Store
    replica: Replica
    requests: Requests
    scheduler: Scheduler
    schedule: ScheduleIndex
    readable: ReadableEnd


class Broker:
    """One broker: open with :meth:`start`, stop with :meth:`stop`. ``authority`` defaults
    to the one its configuration asks for (:func:`~understudy_broker.ha.authority.authority_for`)."""

    def __init__(
        self,
        cfg: BrokerConfig,
        *,
        authority: Authority | None = None,
        peer_probe: PeerProbe = probe_peer,
    ) -> None:
        self.cfg = cfg
        # TLS contexts, built once (a bad certificate fails here, before anything opens),
        # and reloaded when their files change (docs/security.md).
        self.tls = BrokerTls.of(cfg.security)
        self._peer_security = self.tls.peer_security(cfg.security)
        self._reloader = (CertReloader(self.tls.contexts(), cfg.security.tls_cert,
                                       cfg.security.tls_key,
                                       interval_s=cfg.security.tls_reload_interval_s)
                          if cfg.security.tls_cert is not None and cfg.security.tls_key
                          is not None else None)
        self.advertised_host = advertised_host(cfg.host, cfg.advertised_host, _own_address)
        self.authority: Authority = authority or authority_for(
            cfg, address=lambda: f"{self.advertised_host}:{self.listening.port}",
            peer_probe=peer_probe,
            security=self._peer_security)
        self.metrics = BrokerMetrics(group=cfg.group, broker=cfg.name, role=cfg.role.value)
        self._signal = AppendSignal()
        self._permlog = PermissionLog(cfg.data_dir / PERMISSION_LOG, group=cfg.group,
                                      broker=cfg.name)
        self._port = ClientPort(handle=self._handle, epoch=self.authority.epoch,
                                max_frame_bytes=cfg.max_frame_bytes, limits=cfg.limits,
                                tls=self.tls.client_port,
                                fd_reserve=lim.fd_reserve(cfg.index_open_files))
        self._http: BrokerHttpPort | None = None  # only with --http-port
        self._parts: _Parts | None = None
        # Set once the parts exist: the client port listens from the start, before this
        # broker registers in ZooKeeper, and holds the requests that come in meanwhile.
        self._serving = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._had_read = False
        self._epoch_sent = 0  # the epoch our slaves last heard of (a master pushes changes)
        self._backsync_persisted: int | None = None
        self._last_facts: tuple[bool, tuple[str, ...], int | None] | None = None
        self._stopping = False
        # Secondary messages (due entries escaped or moved, nacks) go out through the
        # client library, this broker's own port first (docs/delayed.md).
        self._escaper = Escaper(bootstrap=self._bootstrap, writable=self._group_writable,
                                security=self._peer_security)

    # ---- parts ----------------------------------------------------------------------

    @property
    def parts(self) -> _Parts:
        if self._parts is None:
            raise RuntimeError("broker not started")
        return self._parts

    @property
    def store(self) -> Store:
        return self.parts.store

    @property
    def listening(self) -> Listening:
        return Listening(
            host=self.cfg.host,
            port=self._port.port or self.cfg.port,
            http_port=self._http.port if self._http is not None else None,
            replication_port=self._parts.replica.port if self._parts is not None else None,
        )

    async def _handle(self, frame: p.Frame, room: OutputRoom, session: Session) -> bytes:
        if not self._serving.is_set():
            await self._serving.wait()
        return await self.parts.requests.handle(frame, room, session)

    # ---- lifecycle ------------------------------------------------------------------

    async def start(self) -> Listening:
        cfg = self.cfg
        store = Store.open(
            cfg.data_dir,
            segment_bytes=cfg.segment_bytes,
            flush=self._flush_policy(),
            retention=Retention(
                max_bytes=cfg.retention_bytes,
                max_age_s=None if cfg.retention_hours is None else cfg.retention_hours * 3600,
            ),
            flush_before_ack=cfg.flush == "batch",
            on_log_flush=self.metrics.log_flushed,
            on_damaged_record=lambda _err: self.metrics.corrupt_record(),
            index_open_files=cfg.index_open_files,
        )
        self._backsync_persisted = store.offsets.backsync_epoch
        replica: Replica | None = None
        schedule: ScheduleIndex | None = None
        try:
            schedule = ScheduleIndex.open(cfg.data_dir / SCHEDULE_FILE)
            self._permlog.open()
            producers = Producers(store.log)
            if cfg.role is Role.MASTER:
                # Before the port opens and the broker registers: nobody can route to it,
                # and the controller cannot hand writes back to it, while it reads its
                # producer records (server/producers.py: what the first PRODUCE paid).
                await producers.load()
            # Listen before registering: once this broker is live in ZooKeeper, routes can
            # name it (a restarted master, as the writer) and clients connect at once. A
            # port opened after that refused them for the rest of the start, and each
            # producer isolated the group as failed until its next route change
            # (docs/cluster.md, "Runs D and E"). Requests wait for the parts (below).
            await self._port.start(cfg.host, cfg.port)
            self.authority.subscribe(self._on_authority_change)
            self.authority.attach(BrokerHooks(
                facts=self._facts, offsets=store.offsets.snapshot,
                master_back=self._master_back, ordered=self._ordered_facts,
                escape_quiesce=lambda: self.parts.scheduler.quiesce(),
                escaped=lambda: self.parts.scheduler.escaped(),
                escaped_synced=lambda o: self.parts.scheduler.escaped_synced(o),
                echo_set=self._echo_set))
            await self.authority.start()
            group = await self.authority.wait_config(CONFIG_WAIT_S)
            if group is not None and (problem := spec_mismatch(cfg, group)) is not None:
                raise ConfigError(problem)
            replica = self._replica(store)
            # What a write's acknowledgement waits for, asked in one place: by a produce
            # before it answers, and for consumers, who read only what passed it
            # (server/readable.py).
            readable = ReadableEnd(
                log_end=lambda: store.log.max_phys,
                acknowledged=lambda end, start: acknowledged(
                    [store.log_durable(end), replica.replicated(end, start)]),
                wake=self._signal.grew, immediate=cfg.role is Role.SLAVE)
            scheduler = Scheduler(
                log_=store.log, index=schedule, group=cfg.group, mode=self._schedule_mode,
                append=self._append_local, placed=self._placed_here, escaper=self._escaper,
                on_delivered=self.metrics.scheduled_delivered)
            self._parts = _Parts(store, replica, Requests(
                cfg=cfg, authority=self.authority, store=store, replica=replica,
                signal=self._signal, metrics=self.metrics, stopping=lambda: self._stopping,
                backsync_persisted=self._on_backsync_persisted, scheduler=scheduler,
                escaper=self._escaper, producers=producers, peer_security=self._peer_security,
                readable=readable,
            ), scheduler, schedule, readable)
            membership = self.authority.membership
            if membership is not None:
                membership.on_rebalance(self.metrics.rebalanced)
            view = self.authority.cluster
            if view is not None:
                view.subscribe_topics(lambda: self._adopt_cluster_topics(store, view))
                self._adopt_cluster_topics(store, view)
            await replica.start()
            # The side port listens before the first request is answered: whoever saw this
            # broker answer (a probe, a test, an operator) finds /readyz and /metrics up.
            # Started after that, a slave could answer a heartbeat and still refuse
            # /readyz for as long as the machine kept its loop from the next step.
            if cfg.http_port is not None:
                self._http = BrokerHttpPort(
                    registry=self.metrics.registry, ready=self._ready, host=cfg.host,
                    port=cfg.http_port, permissions=self._permlog.path, tls=self.tls.http,
                )
                await self._http.start()
            self._serving.set()
        except BaseException:
            await self._abort_start(store, replica)
            if schedule is not None:
                schedule.close()
            raise
        if self._reloader is not None:
            self._reloader.start()
        self._spawn(self._housekeeping(), "housekeeping")
        self._spawn(self.parts.scheduler.run(), "scheduler")
        self._spawn(self.parts.readable.run(), "readable-end")
        self._spawn(store.run_recovery_points(), "recovery-point")
        if cfg.flush == "interval":
            self._spawn(store.run_interval_flush(cfg.flush_interval_ms / 1000), "flush")
        self._on_authority_change()
        return self.listening

    async def _abort_start(self, store: Store, replica: Replica | None) -> None:
        """Undo a start that failed part way (a config contradicting the flags, a port in
        use): nothing started is left running, no file is left open."""
        await self._port.stop(grace_s=0)
        if self._http is not None:
            await self._http.stop()
        if replica is not None:
            with contextlib.suppress(Exception):
                await replica.stop()
        with contextlib.suppress(Exception):
            await self.authority.stop()
        self._permlog.close()
        store.close()
        self._parts = None

    def _replica(self, store: Store) -> Replica:
        cfg = self.cfg
        if cfg.role is Role.MASTER:
            server = ReplicationServer(
                store.log,
                host=cfg.host,
                port=cfg.replication_port or 0,
                sync=cfg.sync,
                min_insync=cfg.min_insync_replicas,
                auto_degrade=cfg.auto_degrade,
                in_sync_replicas=cfg.in_sync_replicas,
                max_lag_bytes=cfg.max_lag_bytes,
                # The epoch: a slave that applied a newer one takes none of our bytes
                # (replication/slave.py:_master_behind).
                # A probe while ZooKeeper does not confirm our read lease: the slaves'
                # echoes renew it (docs/failover.md, "A master cut off from ZooKeeper only").
                metadata=lambda: {"topics": store.topics.snapshot(),
                                  "offsets": store.offsets.snapshot(),
                                  "epoch": self.authority.epoch(),
                                  **self._probe()},
                on_echo=self.authority.echoed,
                tls=self.tls.replication, group=cfg.group,
                secret=cfg.security.group_secret,
                ack_timeout_s=cfg.ack_timeout_s,
                metadata_interval_s=METADATA_INTERVAL_S,
                # With ZooKeeper the master records the in-sync set (docs/failover.md):
                # a slave that does not acknowledge within the link timeout leaves it
                # before anything is acknowledged without it.
                isr=self.authority.isr_store(),
                isr_lag_s=cfg.link_timeout_s,
            )
            return MasterReplica(store, server, sync=cfg.sync, slaves_assigned=bool(cfg.peers))
        if cfg.master is None:
            raise ConfigError("a slave needs a master address")
        return SlaveReplica(store, name=cfg.name, master=cfg.master,
                            link_timeout_s=cfg.link_timeout_s, on_data=self._on_replicated,
                            epoch=self.authority.epoch, on_probe=self.authority.answer_probe,
                            link=LinkSecurity(self.tls.peer, cfg.group,
                                              cfg.security.group_secret))

    def _probe(self) -> dict[str, dict[str, int]]:
        probe = self.authority.probe()
        return {} if probe is None else {"probe": probe}

    def _echo_set(self) -> frozenset[str] | None:
        parts = self._parts
        return None if parts is None else parts.replica.echo_set()

    def _flush_policy(self) -> FlushPolicy:
        """On a master the broker flushes (group commit: one fdatasync for many concurrent
        batches), so the log never fsyncs inside ``append``. On a slave the replication
        client acknowledges what ``append_replicated`` returned, so with ``--flush batch``
        the log must be fsynced before that (invariant 3; the client's own group commit)."""
        cfg = self.cfg
        if cfg.role is Role.SLAVE and cfg.flush == "batch":
            return FlushPolicy(mode="batch", interval_ms=cfg.flush_interval_ms)
        return FlushPolicy(mode="interval", interval_ms=cfg.flush_interval_ms)

    async def stop(self, *, grace_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish, flush log and offsets."""
        self._stopping = True
        self._port.close()
        self._signal.fire()  # long-polls return now
        await self._port.stop(grace_s=grace_s)
        if self._http is not None:
            await self._http.stop()
        parts = self._parts
        if parts is not None:
            await parts.replica.stop()
        await stop_tasks(list(self._background))
        if self._reloader is not None:
            await self._reloader.stop()
        await self._escaper.close()
        await self.authority.stop()
        self._permlog.record(Permission.NONE, self.authority.epoch())
        self._permlog.close()
        if parts is not None:
            try:
                await parts.store.offsets_durable()
            except OSError as exc:
                log.error("persisting consumer offsets at stop failed: %s", exc)
            parts.store.close()
            parts.schedule.close()
            self._parts = None

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_replicated(self) -> None:
        """A slave's log grew: long-polls (an acting slave's consumers) and the scheduler
        (schedule records to index) look at it now."""
        self._signal.fire()
        self._wake_scheduler()

    def _wake_scheduler(self) -> None:
        """The scheduler sleeps until its next due entry or a wake (scheduler.IDLE_POLL_S):
        woken by schedule records produced here (requests.py), bytes replicated here and
        permission changes (what it may do changed)."""
        if self._parts is not None:
            self._parts.scheduler.wake()

    # ---- permission changes ---------------------------------------------------------

    def _on_authority_change(self) -> None:
        """Called on the loop whenever effective permission or epoch may have changed
        (state applied, session lost, lease lapsed, slave links changed)."""
        eff = self.authority.effective()
        epoch = self.authority.epoch()
        if epoch != self._epoch_sent and self._parts is not None:
            self._epoch_sent = epoch
            self._parts.replica.epoch_changed()  # a master tells its slaves at once
        has_read = bool(eff & Permission.READ)
        self.metrics.set_permission(eff)
        lost_read = self._had_read and not has_read
        # A lease lapse noticed late (a timer after a pause) is logged at the lapse itself.
        change = self._permlog.record(
            eff, epoch, t_ns=self.authority.lease_lapsed_at_ns() if lost_read else None)
        if change is not None:  # the event-time gauges carry the log line's instant
            self.metrics.permission_logged(change.effective, change.t_ns)
        self._signal.fire()  # long-polls re-check their permission
        self._wake_scheduler()
        if lost_read:
            self._spawn(self._port.close_consumer_sessions(
                still_lost=lambda: not self.authority.effective() & Permission.READ),
                "close-consumer-sessions")
        self._had_read = has_read

    # ---- the schedule (docs/delayed.md) ---------------------------------------------

    def _schedule_mode(self) -> Mode | None:
        """A master delivers due messages while it writes with a confirmed view (a master
        woken from a pause must not deliver what the acting slave escaped meanwhile); the
        acting slave escapes them while it holds READ in a coordinated group."""
        a = self.authority
        eff = a.effective()
        if a.role is Role.MASTER:
            return "deliver" if eff & Permission.WRITE and a.confirmed() else None
        if a.cluster is not None and eff & Permission.READ:
            return "escape"
        return None

    def _append_local(self, records: Sequence[RecordTuple]) -> AppendResult:
        """Append as a produce does: readers and replication are woken."""
        parts = self.parts
        result = parts.store.log.append(records)
        parts.readable.appended(result.end_phys, {(r[0], r[1]) for r in records})
        parts.replica.appended()
        return result

    def _placed_here(self, topic: str, queue: int) -> bool:
        view = self.authority.cluster
        doc = None if view is None else view.topics.get(topic)
        if doc is not None:
            return doc.group_of(queue) == self.cfg.group
        n = self.parts.store.topics.get(topic)
        return n is not None and 0 <= queue < n

    def _group_writable(self, group: str) -> bool:
        """A live broker of ``group`` publishes WRITE (this broker's ZooKeeper view); a
        broker without ZooKeeper knows only its own group."""
        view = self.authority.cluster
        if view is None:
            return group == self.cfg.group and bool(self.authority.effective() & Permission.WRITE)
        return any(b.holds(Permission.WRITE) for b in view.group_route(group).brokers)

    def _bootstrap(self) -> list[str]:
        own = f"{self.advertised_host}:{self.listening.port}"
        peers = [f"{pe.host}:{pe.port}" for pe in self.cfg.peers]
        return [own, *peers]

    def _adopt_cluster_topics(self, store: Store, view: ClusterView) -> None:
        """Cluster topics with queues on this group become local topics (queue counts only
        grow), on every broker of the group: the master writes them, slaves replicate."""
        mine = {t: len(d.queues) for t, d in view.topics.items() if self.cfg.group in d.groups()}
        try:
            store.topics.merge(mine)
        except OSError as exc:
            log.error("recording cluster topics: %s", exc)

    def _ready(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "stopping"
        if not self._serving.is_set():
            return False, "starting"
        link = self._parts.replica.master_link if self._parts is not None else None
        return self.authority.ready(master_link=link)

    # ---- facts for coordination -----------------------------------------------------

    def _ordered_facts(self) -> dict[str, OrderedFacts]:
        """For each ordered topic with a queue on this group: its log end here, how far
        every consumer group that committed on it got, and the chain epoch applied."""
        view, parts = self.authority.cluster, self._parts
        if view is None or parts is None:
            return {}
        mine = {name: queues[0] for name, doc in view.topics.items()
                if doc.ordered and (queues := doc.queues_of(self.authority.group))}
        if not mine:
            return {}
        out: dict[str, OrderedFacts] = {}
        offsets = parts.store.offsets.snapshot()
        for name, queue in mine.items():
            end = parts.store.log.queue_end(name, queue)
            chains = view.chains.get(name)
            out[name] = OrderedFacts(end, consumed_upto(offsets, name, queue, end),
                                     chains.epoch if chains is not None else 0,
                                     committed_groups(offsets, name))
        return out

    def _master_back(self) -> None:
        if self._parts is not None:
            self._parts.replica.master_back()

    def _facts(self) -> ReplicationFacts:
        """What the authority publishes in this broker's status."""
        parts = self._parts
        if parts is None:
            return ReplicationFacts(backsync_epoch=self._backsync_persisted)
        master_link, slave_links = parts.replica.facts()
        return ReplicationFacts(
            master_link=master_link,
            slave_links=slave_links,
            max_offset=parts.store.log.max_phys,
            backsync_epoch=self._backsync_persisted,
        )

    def _on_backsync_persisted(self, epoch: int | None) -> None:
        self._backsync_persisted = epoch
        self._publish_if_facts_changed()

    def _publish_if_facts_changed(self) -> None:
        f = self._facts()
        key = (f.master_link, f.slave_links, f.backsync_epoch)
        if key != self._last_facts:
            self._last_facts = key
            self.authority.facts_changed()

    # ---- housekeeping ---------------------------------------------------------------

    async def _housekeeping(self) -> None:
        store = self.parts.store
        last_persist = last_retention = last_lag = time.monotonic()
        while True:
            await asyncio.sleep(HOUSEKEEPING_EVERY_S)
            now = time.monotonic()
            if now - last_persist >= self.cfg.offsets_persist_interval_s:
                last_persist = now
                if store.offsets_commit.pending:
                    try:
                        await store.offsets_durable()
                    except OSError as exc:
                        log.error("persisting consumer offsets failed: %s", exc)
            if now - last_retention >= self.cfg.retention_check_interval_s:
                last_retention = now
                deleted = store.log.apply_retention(
                    int(time.time() * 1000), keep_from=self.parts.scheduler.retention_floor())
                if deleted:
                    log.info("retention deleted %d segment(s)", deleted)
            self.parts.replica.refresh(self.authority, self._report_lag)
            self._publish_if_facts_changed()
            if now - last_lag >= 1.0:
                last_lag = now
                self._report_consumer_lag(store)
                self.metrics.schedule(*self.parts.scheduler.stats(int(time.time() * 1000)))

    def _report_consumer_lag(self, store: Store) -> None:
        """Consumer lag per (topic, queue, consumer group), from the broker holding READ
        only: its offsets are the current ones, and each series has one source."""
        lags: dict[tuple[str, int, str], int] = {}
        if self.authority.effective() & Permission.READ:
            lg = store.log
            for cg, topics in store.offsets.snapshot().items():
                for topic, queues in topics.items():
                    for q, committed in queues.items():
                        lags[(topic, q, cg)] = max(0, lg.queue_end(topic, q) - committed)
        self.metrics.consumer_lag(lags)

    def _report_lag(self, broker: str, lag_bytes: int) -> None:
        self.metrics.replication_lag(broker=broker, lag_bytes=lag_bytes)
