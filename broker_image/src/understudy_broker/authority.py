"""Where a broker's effective permission and epoch come from.

Why this module exists: request handlers must not care whether permission is static
configuration (this issue) or a ZooKeeper-backed lease (the HA issue). They ask an
:class:`Authority` for ``effective()`` and ``epoch()`` on every request, and the
authority tells the server (through :meth:`Authority.subscribe`) when either changes, so
the server can update metrics and wake long-polls. A new authority plugs in without
touching the handlers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from understudy_broker.config import Peer
from understudy_broker.model import Health, Permission, Role, effective_permission
from understudy_broker.protocol import BrokerRoute, GroupRoute

Listener = Callable[[], None]
#: Asks a peer for ``(effective permission, epoch, role)``; raises OSError or
#: TimeoutError when the peer cannot be reached.
PeerProbe = Callable[[Peer], Awaitable[tuple[int, int, str]]]


class Authority(Protocol):
    """The permission source a broker enforces."""

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

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StaticAuthority:
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

    @property
    def role(self) -> Role:
        return self._role

    @property
    def name(self) -> str:
        return self._name

    @property
    def group(self) -> str:
        return self._group

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

    async def route(self) -> list[GroupRoute]:
        address = self._address() if callable(self._address) else self._address
        me = BrokerRoute(address=address, name=self._name, role=self._role.value,
                         permission=int(self._effective), epoch=self.epoch())
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
