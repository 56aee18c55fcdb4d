"""Where a broker's effective permission, epoch and route come from.

Why this module exists: request handlers must not care whether permission is static
configuration or a ZooKeeper-backed lease. They ask an :class:`Authority` for
``effective()`` and ``epoch()`` on every request, and the authority tells the broker
(through :meth:`Authority.subscribe`) when either changes, so the broker can update
metrics, log the change and wake long-polls. Everything else that differs between a
coordinated and an uncoordinated broker also sits behind this interface — the address
clients are told, readiness, where the in-sync set is recorded, whether a READ loss
was a lease lapse, and back-sync — so the broker holds no ``if coordinated`` branches:

* :class:`StaticAuthority` (no ``--zk``): ``model.effective_permission`` with no group
  state; the route is this broker plus its ``--peer`` list, probed with HEARTBEAT;
* :class:`~understudy_broker.ha.zkauthority.ZkAuthority` (``--zk``): the group state,
  session health, replication facts and read lease; status publishing and back-sync.

:func:`authority_for` picks one from a broker's configuration.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, request_once
from understudy_broker.config import BrokerConfig, Peer
from understudy_broker.model import Health, Permission, Role, Snapshot, effective_permission
from understudy_broker.protocol import BrokerRoute, GroupRoute
from understudy_broker.replication.isr import IsrStore
from understudy_broker.security import ClientSecurity
from understudy_broker.zklayout import GroupConfig, OrderedFacts

if TYPE_CHECKING:
    from understudy_broker.ha.aclview import AclView
    from understudy_broker.ha.clusterview import ClusterView
    from understudy_broker.ha.membership import Membership

Listener = Callable[[], None]
#: Asks a peer for ``(effective permission, epoch, role)``; raises OSError or
#: TimeoutError when the peer cannot be reached.
PeerProbe = Callable[[Peer], Awaitable[tuple[int, int, str]]]


@dataclass(frozen=True, slots=True)
class ReplicationFacts:
    """What the replication layer knows, for the status document."""

    master_link: bool = False
    slave_links: tuple[str, ...] = ()
    max_offset: int = 0
    backsync_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class BrokerHooks:
    """What a broker lends its authority: the replication facts its status publishes and
    the consumer-offset snapshot back-sync pushes."""

    facts: Callable[[], ReplicationFacts]
    offsets: Callable[[], Snapshot]
    #: Called on the loop when the group's master registers again (its ``live`` node
    #: reappears): a slave reconnects its replication link at once.
    master_back: Callable[[], None] = lambda: None
    #: Per ordered topic with a queue on this group: what the chain mover needs from this
    #: broker (its status publishes it; docs/ordered.md).
    ordered: Callable[[], dict[str, OrderedFacts]] = dict
    #: Back-sync of the schedule (docs/delayed.md): wait until no escape is in flight,
    #: then the schedule entries this slave escaped; told which the master took.
    escape_quiesce: Callable[[], Awaitable[None]] = lambda: _done()
    escaped: Callable[[], list[int]] = list
    escaped_synced: Callable[[list[int]], None] = lambda _o: None
    #: A master: every slave the in-sync record may name now (None: no record loaded),
    #: the slaves whose echoes renew its read lease (docs/failover.md).
    echo_set: Callable[[], frozenset[str] | None] = lambda: None


async def _done() -> None:
    return None


class Authority(Protocol):
    """The permission source a broker enforces, and the rest of its coordination."""

    @property
    def role(self) -> Role: ...

    @property
    def name(self) -> str: ...

    @property
    def group(self) -> str: ...

    def effective(self) -> Permission:
        """The permission to enforce for the request being handled now."""
        ...

    def epoch(self) -> int:
        """The group epoch this broker has applied (0 = none)."""
        ...

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` (on the event loop) whenever effective() or epoch() changes."""
        ...

    def update_health(self, health: Health) -> None:
        """Facts from the replication layer (slave links) that may change permission."""
        ...

    async def route(self) -> list[GroupRoute]:
        """This broker's group(s) as clients should see them."""
        ...

    def advertised_address(self) -> str:
        """The address clients are told for this broker."""
        ...

    def ready(self, *, master_link: bool | None) -> tuple[bool, str]:
        """``/readyz``: ready or not, and why. ``master_link`` is a slave's replication
        connection (``None`` on a master)."""
        ...

    def isr_store(self) -> IsrStore | None:
        """Where the master records the in-sync set (``None``: the static quorum rule)."""
        ...

    def lease_lapsed_at_ns(self) -> int | None:
        """When READ is masked because the read lease lapsed: the wall-clock instant of the
        lapse (``time.time_ns``), for the permission log; else ``None``."""
        ...

    def confirmed(self) -> bool:
        """This broker's view of its group was confirmed by ZooKeeper within the lease (the
        read lease): false after a pause until it is confirmed again, even while WRITE is
        still effective (WRITE ends only when the new group state arrives). Ordered topics
        take writes only while confirmed (docs/ordered.md). Always true without
        ZooKeeper."""
        ...

    def attach(self, hooks: BrokerHooks) -> None:
        """The broker's facts and offsets, for status and back-sync (before :meth:`start`)."""
        ...

    def group_config(self) -> GroupConfig | None:
        """The group's configuration as applied from ZooKeeper (None: not yet, or none)."""
        ...

    def acting(self) -> str | None:
        """The slave the applied group state names as acting for reads in SLAVE_CONSUME
        (None otherwise, and without ZooKeeper)."""
        ...

    def probe(self) -> dict[str, int] | None:
        """A master whose ZooKeeper confirmations are failing: the probe to put in the next
        metadata frame (``{"seq", "hold_ms"}``), else None (docs/failover.md, "A master
        cut off from ZooKeeper only")."""
        ...

    def echoed(self, slave: str, seq: int, epoch: int) -> None:
        """A master: ``slave`` answered probe ``seq`` with the epoch it applied."""
        ...

    def answer_probe(self, master_epoch: int, hold_s: float) -> int | None:
        """A slave: the epoch to echo a probe of a master at ``master_epoch`` with, having
        agreed to use no READ for ``hold_s``; None: this slave does not echo (it applied
        another epoch, acts for reads, or would not hold back that long)."""
        ...

    def facts_changed(self) -> None:
        """The replication facts changed: publish them now rather than on the interval."""
        ...

    async def wait_config(self, timeout_s: float) -> GroupConfig | None:
        """The group's configuration once known (``None``: none within ``timeout_s``, or no
        coordination at all)."""
        ...

    @property
    def cluster(self) -> ClusterView | None:
        """Every topic and group under the chroot (``None`` without ZooKeeper)."""
        ...

    @property
    def membership(self) -> Membership | None:
        """Consumer groups held by brokers (``None`` without ZooKeeper)."""
        ...

    @property
    def acls(self) -> AclView | None:
        """Users and ACL rules (``None`` without ZooKeeper)."""
        ...

    @property
    def producers(self) -> Membership | None:
        """The producers of ordered topics, held by brokers like consumer groups: the one
        that owns the topic's unit is its active producer (``None`` without ZooKeeper)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def probe_peer(peer: Peer, *, timeout_s: float = 0.5,
                     security: ClientSecurity | None = None) -> tuple[int, int, str]:
    """HEARTBEAT a peer: ``(effective permission, epoch, role)``; ``OSError`` or
    ``TimeoutError`` when it cannot be reached, ``ValueError`` when it answers wrongly."""
    try:
        frame = await request_once(peer.address, p.Op.HEARTBEAT, p.HeartbeatRequest().encode(),
                                   timeout_s=timeout_s, max_frame_bytes=64 * 1024,
                                   security=security)
        if frame.status != p.Status.OK:
            raise ValueError(f"peer {peer.name} answered with an error")
        hb = p.HeartbeatResponse.decode(frame.body)
    except BrokerError as exc:
        raise TimeoutError(str(exc)) from exc
    except p.FrameError as exc:
        raise ValueError(str(exc)) from exc
    return hb.permission, hb.epoch, hb.role


def authority_for(cfg: BrokerConfig, *, address: Callable[[], str],
                  peer_probe: PeerProbe = probe_peer,
                  security: ClientSecurity | None = None) -> Authority:
    """The authority a broker with ``cfg`` runs under: ZooKeeper with ``--zk``, else static.
    ``address`` gives ``host:port`` once the broker listens (port 0 resolves late)."""
    if cfg.zk is not None:
        from understudy_broker.ha.zkauthority import ZkAuthority

        return ZkAuthority(
            connect=cfg.zk, group=cfg.group, name=cfg.name, role=cfg.role,
            configured=cfg.permission, address=address,
            session_timeout_s=cfg.zk_session_timeout_ms / 1000,
            link_timeout_s=cfg.link_timeout_s, digest_auth=cfg.zk_digest, security=security,
        )
    if peer_probe is probe_peer and security is not None:
        peer_probe = functools.partial(probe_peer, security=security)
    return StaticAuthority(name=cfg.name, group=cfg.group, role=cfg.role,
                           configured=cfg.permission, address=address, peers=cfg.peers,
                           probe=peer_probe)


class BrokerIdentity:
    """Who an authority speaks for: this broker's role, name and group (fixed by its
    configuration; failover never changes a role)."""

    _role: Role
    _name: str
    _group: str

    @property
    def role(self) -> Role:
        return self._role

    @property
    def name(self) -> str:
        return self._name

    @property
    def group(self) -> str:
        return self._group


class StaticAuthority(BrokerIdentity):
    """Permission from configuration: ``model.effective_permission`` with ``state=None``,
    so a master enforces its configured permission and a slave at most READ. The route is
    this broker plus its ``--peer`` list, each peer's permission learned by a HEARTBEAT
    (``probe``) and cached for ``cache_s``. ``address`` may be a callable so a broker
    bound to port 0 advertises the port it actually got."""

    def __init__(
        self,
        *,
        name: str,
        group: str,
        role: Role,
        configured: Permission,
        address: str | Callable[[], str],
        peers: Sequence[Peer] = (),
        probe: PeerProbe | None = None,
        cache_s: float = 1.0,
    ) -> None:
        self._name = name
        self._group = group
        self._role = role
        self._configured = configured
        self._address = address
        self._peers = tuple(peers)
        self._probe = probe
        self._cache_s = cache_s
        self._health = Health()
        self._listeners: list[Listener] = []
        self._cache: tuple[float, list[BrokerRoute]] | None = None
        self._effective = self._compute()

    def _compute(self) -> Permission:
        return effective_permission(
            role=self._role,
            name=self._name,
            configured=self._configured,
            state=None,
            health=self._health,
        )

    def effective(self) -> Permission:
        return self._effective

    def epoch(self) -> int:
        return 0

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def update_health(self, health: Health) -> None:
        self._health = health
        new = self._compute()
        if new != self._effective:
            self._effective = new
            for listener in self._listeners:
                listener()

    def advertised_address(self) -> str:
        return self._address() if callable(self._address) else self._address

    def ready(self, *, master_link: bool | None) -> tuple[bool, str]:
        if master_link is False:
            return False, "not connected to the master"
        return True, f"{self._role.value} {self._effective.label}"

    def isr_store(self) -> IsrStore | None:
        return None

    def lease_lapsed_at_ns(self) -> int | None:
        return None

    def confirmed(self) -> bool:
        return True

    def attach(self, hooks: BrokerHooks) -> None:
        return None

    def group_config(self) -> GroupConfig | None:
        return None

    def acting(self) -> str | None:
        return None

    def probe(self) -> dict[str, int] | None:
        return None  # no lease without ZooKeeper: nothing to renew

    def echoed(self, slave: str, seq: int, epoch: int) -> None:
        return None

    def answer_probe(self, master_epoch: int, hold_s: float) -> int | None:
        return None

    def facts_changed(self) -> None:
        return None

    @property
    def cluster(self) -> ClusterView | None:
        return None

    @property
    def membership(self) -> Membership | None:
        return None

    @property
    def acls(self) -> AclView | None:
        return None

    @property
    def producers(self) -> Membership | None:
        return None

    async def wait_config(self, timeout_s: float) -> GroupConfig | None:
        return None

    async def route(self) -> list[GroupRoute]:
        me = BrokerRoute(address=self.advertised_address(), name=self._name,
                         role=self._role.value, permission=int(self._effective),
                         epoch=self.epoch())
        now = time.monotonic()
        if self._cache is None or now - self._cache[0] > self._cache_s:
            self._cache = (now, await self._probe_peers())
        return [GroupRoute(self._group, [me, *self._cache[1]])]

    async def _probe_peers(self) -> list[BrokerRoute]:
        if not self._peers:
            return []

        async def one(peer: Peer) -> BrokerRoute:
            role = "unknown"
            if self._probe is None:
                return BrokerRoute(peer.name, peer.address, role, 0, 0, reachable=False)
            try:
                perm, epoch, role = await self._probe(peer)
            except (OSError, TimeoutError, ValueError):
                return BrokerRoute(peer.name, peer.address, role, 0, 0, reachable=False)
            return BrokerRoute(peer.name, peer.address, role, perm, epoch)

        return list(await asyncio.gather(*(one(p) for p in self._peers)))

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
