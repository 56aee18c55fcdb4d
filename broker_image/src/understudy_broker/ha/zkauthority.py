"""The ZooKeeper-backed :class:`~understudy_broker.ha.authority.Authority`.

Why this module exists: with coordination, a broker's effective permission is no longer
its configuration but ``model.effective_permission`` over the group state it applied from
ZooKeeper, its session health, the replication facts (slave links) and its read lease.
This class plugs that into the broker server behind the same interface as
``StaticAuthority``, so request handlers do not change:

- ``effective()`` is recomputed on every call, so a lapsed lease masks READ *at the moment
  of the request* — never "serve first, check later";
- a broker that has not yet learned the group state enforces NONE (never the
  uncoordinated fallback of ``state=None``);
- listeners are told whenever permission or epoch change (state applied, session lost,
  lease lapsed, slave link changes), and the broker's ``status`` is published at once on
  such a change (the controller compares offsets only from statuses published after a
  fence) and otherwise every ``publish_interval_s``; its ``route`` document (effective
  permission and epoch, which every broker's cluster view watches) only when it changes;
- the route comes from the ZooKeeper config plus the brokers' published route documents
  (the status, for a broker of an older version that publishes none).

The broker lends its replication facts (master link, connected slaves, max offset,
persisted back-sync epoch) and its consumer-offset snapshot through :meth:`ZkAuthority.attach`;
``ready`` is derived here (a master in SLAVE_CONSUME/RECOVERING, without READ, with the
acting slave connected), and an acting slave's back-sync push is driven from here
(:class:`~understudy_broker.ha.backsync.BackSyncer`) whenever the applied state changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace

from understudy_broker.ha.aclview import AclView
from understudy_broker.ha.authority import BrokerHooks, BrokerIdentity, ReplicationFacts
from understudy_broker.ha.backsync import BackSyncer
from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.ha.coordinator import (
    DEFAULT_LINK_TIMEOUT_S,
    BrokerCoordinator,
    CoordinationError,
)
from understudy_broker.ha.lease import Holdback, SlaveRoute, lease_clock, slave_route_duration_s
from understudy_broker.ha.membership import Membership
from understudy_broker.ha.permlog import lapse_time_ns
from understudy_broker.model import (
    GroupState,
    Health,
    Mode,
    Permission,
    Role,
    effective_permission,
    is_isolated,
)
from understudy_broker.protocol import BrokerRoute, GroupRoute, current_claims
from understudy_broker.replication.isr import IsrConflictError, IsrStore
from understudy_broker.security import ClientSecurity
from understudy_broker.tasks import stop_tasks
from understudy_broker.zkclient import Digest, digest_acl
from understudy_broker.zklayout import (
    PRODUCER_GROUPS,
    BrokerRouteDoc,
    BrokerStatus,
    GroupConfig,
    LayoutError,
    OrderedFacts,
    decode_isr,
    encode_isr,
)

log = logging.getLogger(__name__)

Listener = Callable[[], None]

#: After a broker comes or goes, the status is published at once and again this much later.
REPUBLISH_AFTER_S = 0.2


class ZkIsrStore:
    """The master's :class:`~understudy_broker.replication.isr.IsrStore`: ``/groups/<g>/isr``
    through the authority's ZooKeeper session, versioned writes only.

    An absent record is created with the group config's slaves: before this master
    acknowledged anything, nothing says a slave lacks a write (and it keeps the
    controller's "no record: trust every slave" meaning). A malformed record counts as
    empty (trust no slave) and is overwritten by the next write.
    """

    def __init__(self, authority: ZkAuthority) -> None:
        self._authority = authority

    def _coord(self) -> BrokerCoordinator:
        coord = self._authority.coordinator
        if coord is None:
            raise CoordinationError("not connected to ZooKeeper yet")
        return coord

    async def load(self) -> tuple[frozenset[str], int]:
        coord = self._coord()
        found = await coord.read_isr()
        if found is None:
            cfg = coord.config
            return frozenset(b.name for b in cfg.slaves) if cfg is not None else frozenset(), -1
        raw, version = found
        try:
            return decode_isr(raw), version
        except LayoutError as exc:
            log.error("%s: %s; treating the in-sync set as empty", self._authority.name, exc)
            return frozenset(), version

    async def store(self, members: frozenset[str], *, version: int) -> int:
        new = await self._coord().write_isr(encode_isr(members), version=version)
        if new is None:
            raise IsrConflictError(f"in-sync record is no longer at version {version}")
        return new


class ZkAuthority(BrokerIdentity):
    """Permission from ZooKeeper state + health + read lease (see module docstring).

    ``role`` and ``configured`` come from the broker's own configuration and are
    overridden by the group config in ZooKeeper once it is known. ``fence_after_s`` is the
    master's isolation time (DESIGN "Effective permission"); by default the session timeout.
    """

    def __init__(
        self,
        *,
        connect: str,
        group: str,
        name: str,
        role: Role,
        configured: Permission,
        address: str | Callable[[], str],
        session_timeout_s: float,
        link_timeout_s: float = DEFAULT_LINK_TIMEOUT_S,
        fence_after_s: float | None = None,
        digest_auth: Digest | None = None,
        security: ClientSecurity | None = None,
        publish_interval_s: float = 1.0,
    ) -> None:
        self._connect = connect
        self._group = group
        self._name = name
        self._role = role
        self._configured = configured
        self._address = address
        self._session_timeout_s = session_timeout_s
        self._link_timeout_s = link_timeout_s
        self._fence_after_s = session_timeout_s if fence_after_s is None else fence_after_s
        self._digest_auth = digest_auth
        self._security = security  # what this broker presents to its peers' client ports
        self._publish_interval_s = publish_interval_s
        self._published_route: BrokerRouteDoc | None = None  # the route/<me> last written
        self._health = Health()
        self._facts: Callable[[], ReplicationFacts] = ReplicationFacts
        self._master_back: Callable[[], None] = lambda: None
        self._ordered: Callable[[], dict[str, OrderedFacts]] = dict
        self._backsync: BackSyncer | None = None
        self._listeners: list[Listener] = []
        self._coord: BrokerCoordinator | None = None
        self._last: tuple[Permission, int] = (Permission.NONE, 0)
        self._last_live: frozenset[str] = frozenset()
        self._failback_due = False
        self._publish_now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._cluster: ClusterView | None = None
        self._membership: Membership | None = None
        self._acls: AclView | None = None
        self._producers: Membership | None = None
        # The slave route (docs/failover.md, "A master cut off from ZooKeeper only"): a
        # master's probes and its slaves' echoes; a slave's hold-back after echoing.
        self._route = SlaveRoute(slave_route_duration_s(link_timeout_s))
        self._holdback = Holdback(lease_clock(), max_hold_s=link_timeout_s)
        self._echo_set: Callable[[], frozenset[str] | None] = lambda: None
        self._on_route = False  # the master reads on its slaves' echoes alone (for the log)
        self._timers: dict[str, asyncio.TimerHandle] = {}

    # ------------------------------------------------------------------ Authority

    @property
    def coordinator(self) -> BrokerCoordinator | None:
        return self._coord

    def effective(self) -> Permission:
        coord = self._coord
        if coord is None or coord.state is None:
            return Permission.NONE
        configured, health = self._inputs(coord)
        return effective_permission(role=self._role, name=self._name, configured=configured,
                                    state=coord.state, health=health)

    def _inputs(self, coord: BrokerCoordinator) -> tuple[Permission, Health]:
        configured = self._configured
        slaves_assigned = self._health.slaves_assigned
        cfg = coord.config
        if cfg is not None:
            with contextlib.suppress(LayoutError):
                spec = cfg.broker(self._name)
                configured = spec.permission
                slaves_assigned = bool(cfg.slaves)
        health = replace(
            self._health,
            zk_live=coord.zk_live,
            zk_lost_for=coord.zk_lost_for(),
            fence_after=self._fence_after_s,
            slaves_assigned=slaves_assigned,
            lease_valid=self._lease_valid(coord),
        )
        return configured, health

    def _lease_valid(self, coord: BrokerCoordinator) -> bool:
        """The read lease: confirmed by ZooKeeper, or for a master by the echoes of every
        slave the in-sync record may name; a slave that echoed a probe holds back."""
        now = lease_clock()
        if self._role is Role.SLAVE:
            return coord.lease_valid() and not self._holdback.held(now)
        return coord.lease_valid() or self._route_remaining(coord, now) > 0

    def _route_remaining(self, coord: BrokerCoordinator, now: float) -> float:
        state = coord.state
        required = self._echo_set()
        if state is None or state.mode is not Mode.NORMAL or required is None:
            return 0.0
        return self._route.remaining(now, epoch=state.epoch, required=required)

    def group_config(self) -> GroupConfig | None:
        return self._coord.config if self._coord is not None else None

    def acting(self) -> str | None:
        state = self._coord.state if self._coord is not None else None
        if state is None or state.mode is not Mode.SLAVE_CONSUME:
            return None
        return state.acting

    # ------------------------------------------------------------------ slave route

    def probe(self) -> dict[str, int] | None:
        coord = self._coord
        if self._role is not Role.MASTER or coord is None or coord.state is None:
            return None
        if coord.state.mode is not Mode.NORMAL:
            return None
        lease = coord.lease
        now = lease_clock()
        if coord.zk_live and lease.remaining(now) >= lease.duration / 2:
            if self._on_route:
                self._on_route = False
                log.info("%s: ZooKeeper confirms the read lease again", self._name)
            return None  # ZooKeeper confirms in time: no probe, so no slave holds back
        return {"seq": self._route.probe(now), "hold_ms": math.ceil(self._route.duration * 1000)}

    def echoed(self, slave: str, seq: int, epoch: int) -> None:
        coord = self._coord
        if coord is None or not self._route.echo(slave, seq, epoch):
            return
        remaining = self._route_remaining(coord, lease_clock())
        on_route = remaining > 0 and not coord.lease_valid()
        if on_route != self._on_route:
            self._on_route = on_route
            if on_route:
                log.warning("%s: ZooKeeper does not confirm the read lease; reading on the "
                            "echoes of slave(s) %s", self._name,
                            ", ".join(sorted(self._echo_set() or ())))
        if remaining > 0:
            self._wake_after("route", remaining)
        self._changed()

    def answer_probe(self, master_epoch: int, hold_s: float) -> int | None:
        coord = self._coord
        state = coord.state if coord is not None else None
        if self._role is not Role.SLAVE or state is None or state.epoch != master_epoch:
            return None
        if state.acting == self._name:
            return None  # acting (or being fenced as the acting slave): never renew a master
        now = lease_clock()
        if not self._holdback.answer(now, hold_s):
            log.warning("%s: the master asks slaves to hold back READ for %.3fs, longer than "
                        "this slave's link timeout %.3fs: no echo", self._name, hold_s,
                        self._link_timeout_s)
            return None
        self._wake_after("holdback", self._holdback.remaining(now))
        self._changed()
        return state.epoch

    def _wake_after(self, name: str, delay_s: float) -> None:
        """Recompute permission just after ``delay_s`` (a lease or hold-back ends)."""
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        with contextlib.suppress(RuntimeError):
            self._timers[name] = asyncio.get_running_loop().call_later(
                delay_s + 0.001, self._changed)

    def epoch(self) -> int:
        coord = self._coord
        return coord.state.epoch if coord is not None and coord.state is not None else 0

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def update_health(self, health: Health) -> None:
        self._health = replace(
            self._health,
            slave_connected=health.slave_connected,
            slave_once_connected=self._health.slave_once_connected or health.slave_once_connected,
            slaves_assigned=health.slaves_assigned,
        )
        self._changed()

    def attach(self, hooks: BrokerHooks) -> None:
        """Where the status document's replication fields and back-sync's offsets come
        from; call before :meth:`start`."""
        self._facts = hooks.facts
        self._master_back = hooks.master_back
        self._echo_set = hooks.echo_set
        self._ordered = hooks.ordered
        self._backsync = BackSyncer(
            role=self._role, name=self._name, group=self._group,
            state=lambda: self._coord.state if self._coord is not None else None,
            has_read=lambda: bool(self.effective() & Permission.READ),
            master=self._master_client_address, offsets=hooks.offsets,
            escape_quiesce=hooks.escape_quiesce, escaped=hooks.escaped,
            escaped_synced=hooks.escaped_synced, security=self._security,
        )

    def _master_client_address(self) -> tuple[str, int] | None:
        cfg = self._coord.config if self._coord is not None else None
        if cfg is None:
            return None
        return cfg.master.host, cfg.master.port

    def advertised_address(self) -> str:
        """The address in this broker's BrokerSpec of the group config (a pod's DNS name
        while it listens on 0.0.0.0), else ``host:port``."""
        cfg = self._coord.config if self._coord is not None else None
        if cfg is not None:
            with contextlib.suppress(LayoutError):
                return cfg.broker(self._name).address
        return self._address_now()

    def ready(self, *, master_link: bool | None) -> tuple[bool, str]:
        state = self._coord.state if self._coord is not None else None
        if state is None:
            return False, "no group state applied yet"
        return True, (f"{self._role.value} {self.effective().label} "
                      f"{state.mode.name} epoch {state.epoch}")

    def isr_store(self) -> IsrStore | None:
        return ZkIsrStore(self)

    def confirmed(self) -> bool:
        coord = self._coord
        return coord is not None and coord.lease_valid()

    def lease_lapsed_at_ns(self) -> int | None:
        coord = self._coord
        if coord is None or self._lease_valid(coord):
            return None
        lease = coord.lease
        ends = [] if lease.granted_at is None else [lease.granted_at + lease.duration]
        if self._role is Role.MASTER and coord.state is not None:
            granted = self._route.grant(epoch=coord.state.epoch,
                                        required=self._echo_set() or frozenset())
            if granted is not None:
                ends.append(granted + self._route.duration)
        if not ends:
            return None
        # The lapse timer (or the request that noticed) fired after the lease ran out;
        # READ ended at the lapse itself, since every request checks the lease.
        return lapse_time_ns(now_ns=time.time_ns(), now_clock=lease_clock(),
                             lapsed_at_clock=max(ends))

    async def wait_config(self, timeout_s: float) -> GroupConfig | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            cfg = self._coord.config if self._coord is not None else None
            if cfg is not None:
                return cfg
            if loop.time() >= deadline:
                log.warning("group %s has no config in ZooKeeper yet; enforcing NONE until it "
                            "has a state", self._group)
                return None
            await asyncio.sleep(0.02)

    def facts_changed(self) -> None:
        """The replication facts changed (a slave linked, back-synced offsets persisted):
        publish the status now rather than at the next interval."""
        self._publish_now.set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._coord = BrokerCoordinator(
            self._connect, group=self._group, name=self._name,
            session_timeout_s=self._session_timeout_s, loop=loop, on_change=self._changed,
            digest_auth=self._digest_auth, address=self._address_now(),
            link_timeout_s=self._link_timeout_s,
        )
        await self._coord.start()
        acl = digest_acl(self._digest_auth)
        self._cluster = ClusterView(self._coord.client, loop, acl=acl, follow_document=True)
        await self._cluster.start()
        self._membership = Membership(self._coord.client, loop, broker=self._name,
                                      view=self._cluster, acl=acl)
        self._cluster.subscribe_topics(self._membership.topics_changed)
        await self._membership.start()
        self._producers = Membership(self._coord.client, loop, broker=self._name,
                                     view=self._cluster, acl=acl, space=PRODUCER_GROUPS)
        self._cluster.subscribe_topics(self._producers.topics_changed)
        await self._producers.start()
        self._acls = AclView(self._coord.client, loop, acl=acl)
        await self._acls.start()
        self._task = loop.create_task(self._publish_loop(), name=f"status-{self._name}")
        if self._role is Role.SLAVE:  # the hold-back every slave starts with ends then
            self._wake_after("holdback", self._holdback.remaining(lease_clock()))

    @property
    def cluster(self) -> ClusterView | None:
        return self._cluster

    @property
    def membership(self) -> Membership | None:
        return self._membership

    @property
    def acls(self) -> AclView | None:
        return self._acls

    @property
    def producers(self) -> Membership | None:
        return self._producers

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for held in (self._membership, self._producers):
            if held is not None:
                await held.stop()
        if self._backsync is not None:
            await self._backsync.stop()
        if self._task is not None:
            await stop_tasks([self._task])
            self._task = None
        if self._coord is not None:
            await self._coord.stop()

    async def route(self) -> list[GroupRoute]:
        """This broker exactly as it stands, its peers as the cluster view holds them
        (their published effective permission; unreachable once their session is gone)."""
        me = BrokerRoute(self._name, self.advertised_address(), self._role.value,
                         int(self.effective()), self.epoch())
        view = self._cluster
        peers = [] if view is None else [
            b for b in view.group_route(self._group).brokers if b.name != self._name]
        return [GroupRoute(self._group, current_claims([me, *peers]))]

    # ------------------------------------------------------------------ internals

    def _address_now(self) -> str:
        return self._address() if callable(self._address) else self._address

    def _changed(self) -> None:
        coord = self._coord
        if coord is not None and self._role is Role.SLAVE:
            due = failback_waits_for_me(coord.state, coord.live, coord.config, self._name)
            if due and not self._failback_due:
                self._master_back()
            self._failback_due = due
        if coord is not None and coord.live != self._last_live:
            # A broker came or went (e.g. the master's session expired): publish at once, so
            # the controller gets offsets published after that moment without waiting.
            self._last_live = coord.live
            self._publish_now.set()
            # And once more shortly after: the controller wants a status version newer than
            # the one it recorded when it saw the change, and it may have recorded the first.
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(REPUBLISH_AFTER_S, self._publish_now.set)
        now = (self.effective(), self.epoch())
        if now != self._last:
            old = self._last
            self._last = now
            log.info("%s: effective %s epoch %d (was %s epoch %d)", self._name, now[0].label,
                     now[1], old[0].label, old[1])
            self._publish_now.set()
            for listener in self._listeners:
                listener()
        if self._backsync is not None:
            self._backsync.on_state()

    def status(self) -> BrokerStatus:
        """The status document this broker would publish now."""
        coord = self._coord
        state = coord.state if coord is not None else None
        facts = self._facts()
        eff = self.effective()
        ready = (
            self._role is Role.MASTER
            and state is not None
            and state.mode in (Mode.SLAVE_CONSUME, Mode.RECOVERING)
            and not eff & Permission.READ
            and state.acting in facts.slave_links
        )
        isolated = (
            self._role is Role.MASTER and coord is not None and is_isolated(self._inputs(coord)[1])
        )
        return BrokerStatus(
            broker=self._name, effective=eff, epoch_applied=self.epoch(),
            master_link=facts.master_link, slave_links=facts.slave_links,
            max_offset=facts.max_offset, isolated=isolated,
            slave_once_connected=self._health.slave_once_connected,
            backsync_epoch=facts.backsync_epoch, ready=ready,
            pid=os.getpid(), updated_ms=int(time.time() * 1000),
            ordered=self._ordered() if eff & Permission.READ else {},
        )

    async def _publish_loop(self) -> None:
        while True:
            coord = self._coord
            # Clear before building the status: a change signalled while the write is in
            # flight must trigger another write, not wait for the next interval.
            self._publish_now.clear()
            if coord is not None and coord.zk_live:
                status = self.status()
                route = BrokerRouteDoc.of(status)
                try:
                    if route != self._published_route:  # every broker watches it: on change only
                        # Both at once (one session: ZooKeeper applies them in this order),
                        # so neither the views nor the controller wait for the other write.
                        await asyncio.gather(coord.publish_route(route),
                                             coord.publish_status(status))
                        self._published_route = route
                    else:
                        await coord.publish_status(status)
                except CoordinationError as exc:
                    self._published_route = None  # written again with the next status
                    log.debug("%s: status not published: %s", self._name, exc)
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that lands as
            # the event is set (stop() sets it), and this loop would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._publish_interval_s):
                    await self._publish_now.wait()


def failback_waits_for_me(state: GroupState | None, live: frozenset[str],
                          cfg: GroupConfig | None, me: str) -> bool:
    """This slave acts for reads (SLAVE_CONSUME) and the group's master is registered again:
    the failback (RECOVERING) waits for this slave's replication link to that master, so
    the slave reconnects now rather than at the end of its backoff. Only then: while the
    group is FENCING, a slave that linked to a master just restarted would stop being
    eligible, and the controller would skip SLAVE_CONSUME (a planned handoff's reads)."""
    return (cfg is not None and state is not None and state.mode is Mode.SLAVE_CONSUME
            and state.acting == me and cfg.master.name in live)
