"""The broker side of ZooKeeper: registration, watches, status publishing, read lease.

Why this module exists: a broker's effective permission depends on the group ``state``
written by the controller, on whether its own ZooKeeper session is live, and on a read
lease that a stale view cannot outlive. This module owns the kazoo client for one broker
and turns ZooKeeper's threads and callbacks into plain facts on the broker's asyncio loop:

- an ephemeral ``live/<broker>`` node (data: pid, address), re-registered after a session
  expiry, created *before* any lease renewal in a new session (so "ephemeral node gone"
  always implies "no lease granted by that session is still valid");
- ``DataWatch`` on ``config`` and ``state``; a state whose epoch is older than the one
  already applied is refused (logged and ignored), malformed documents are logged and
  ignored, never fatal;
- :meth:`BrokerCoordinator.publish_status` for the broker's ~1 s status refresh;
- the read lease (:mod:`understudy_broker.ha.lease`) renewed by a cheap ``sync`` + ``get`` of
  ``state`` every lease/3, and at once whenever a new epoch is applied;
- optional digest authentication, with digest ACLs on every node it creates.

Threading rule: kazoo calls back on its own threads; every callback here only hands the
data to the loop with ``loop.call_soon_threadsafe``. All fields are read and written on
the loop, and ``on_change`` is always called on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from understudy_broker.ha.lease import Lease, lease_clock, lease_duration_s, renewal_interval_s
from understudy_broker.model import GroupState
from understudy_broker.retry import Backoff
from understudy_broker.tasks import stop_tasks
from understudy_broker.zkclient import (
    Digest,
    close_client,
    digest_acl,
    kazoo_future,
    make_client,
    start_client,
)
from understudy_broker.zklayout import (
    BrokerRouteDoc,
    BrokerStatus,
    GroupConfig,
    LayoutError,
    config_path,
    decode_state,
    isr_path,
    live_dir,
    live_path,
    route_path,
    state_path,
    status_path,
)

log = logging.getLogger(__name__)

#: Default slave master-link timeout used in the lease derivation when the broker does
#: not pass its own (seconds).
DEFAULT_LINK_TIMEOUT_S = 1.0


class CoordinationError(RuntimeError):
    """ZooKeeper could not be reached or refused an operation; the message says which."""


class BrokerCoordinator:
    """One broker's ZooKeeper presence.

    ``connect`` is ``host:port[,host:port...][/chroot]``. ``digest_auth`` is
    ``(user, password)``: the client authenticates with it and every node it creates gets
    a digest ACL for that identity only (the controller and operator use the same
    identity). ``on_change`` is called on ``loop`` whenever ``state``, ``config``,
    ``zk_live`` or the lease's validity may have changed.
    """

    def __init__(
        self,
        connect: str,
        *,
        group: str,
        name: str,
        session_timeout_s: float,
        loop: asyncio.AbstractEventLoop,
        on_change: Callable[[], None],
        digest_auth: Digest | None = None,
        address: str = "",
        link_timeout_s: float = DEFAULT_LINK_TIMEOUT_S,
        clock: Callable[[], float] = lease_clock,
    ) -> None:
        self.group = group
        self.name = name
        self.session_timeout_s = session_timeout_s
        self._loop = loop
        self._on_change = on_change
        self._address = address
        self._link_timeout_s = link_timeout_s
        self._clock = clock
        self._acl = digest_acl(digest_auth)
        self._client = make_client(connect, timeout_s=session_timeout_s, digest=digest_auth)
        self._zk_live = False
        self._lost_at: float | None = self._clock()
        self._registered = False
        self._state: GroupState | None = None
        self._config: GroupConfig | None = None
        self._live: frozenset[str] = frozenset()
        self._lease = Lease(duration=0.0)
        self._renew_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._lapse_timer: asyncio.TimerHandle | None = None
        self._stopping = False

    # ------------------------------------------------------------------ facts

    @property
    def zk_live(self) -> bool:
        """The session is connected (not SUSPENDED, not LOST)."""
        return self._zk_live

    def zk_lost_for(self) -> float:
        """Seconds since the session was last known good (0 while live)."""
        if self._zk_live or self._lost_at is None:
            return 0.0
        return max(0.0, self._clock() - self._lost_at)

    @property
    def state(self) -> GroupState | None:
        """The newest group state applied (epochs never go backwards)."""
        return self._state

    @property
    def config(self) -> GroupConfig | None:
        return self._config

    @property
    def live(self) -> frozenset[str]:
        """The brokers whose ``live`` node exists (from a ChildrenWatch)."""
        return self._live

    @property
    def lease(self) -> Lease:
        return self._lease

    def lease_valid(self) -> bool:
        return self._lease.valid(self._clock())

    @property
    def registered(self) -> bool:
        """The ephemeral ``live`` node exists for the current session."""
        return self._registered

    @property
    def session_id(self) -> int | None:
        cid = self._client.client_id
        return None if cid is None else int(cid[0])

    @property
    def client(self) -> KazooClient:
        """The underlying kazoo client (for tests and tools; do not block the loop on it)."""
        return self._client

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, connect_timeout_s: float = 10.0) -> None:
        """Connect, register, arm the watches and start the lease renewal."""
        self._client.add_listener(self._listener)
        try:
            await start_client(self._client, connect_timeout_s, self._close_client)
        except Exception as exc:  # kazoo raises its own timeout type, not TimeoutError
            raise CoordinationError(
                f"ZooKeeper not reachable within {connect_timeout_s:g}s: {exc!r}") from exc
        try:
            self._set_live(True)
            await self._register()
            self._client.DataWatch(config_path(self.group), self._config_watch)
            self._client.DataWatch(state_path(self.group), self._state_watch)
            self._client.ChildrenWatch(live_dir(self.group), self._live_watch)
        except BaseException:  # cancelled while registering: no session is left behind
            await asyncio.to_thread(self._close_client)
            raise
        self._tasks.append(self._loop.create_task(self._renewal_loop(), name=f"lease-{self.name}"))

    async def stop(self) -> None:
        """Close the session (the ephemeral node disappears at once) and stop tasks."""
        self._stopping = True
        await stop_tasks(self._tasks)
        self._tasks.clear()
        if self._lapse_timer is not None:
            self._lapse_timer.cancel()
        self._lease = self._lease.revoked()
        await asyncio.to_thread(self._close_client)
        self._zk_live = False
        self._registered = False

    def _close_client(self) -> None:
        self._client.remove_listener(self._listener)
        close_client(self._client)

    # ------------------------------------------------------------------ kazoo -> loop

    def _listener(self, state: str) -> None:
        """kazoo state listener: never blocks, only hands the state to the loop."""
        with contextlib.suppress(RuntimeError):  # loop closed during shutdown
            self._loop.call_soon_threadsafe(self._on_zk_state, state)

    def _config_watch(self, data: bytes | None, _stat: Any, *_: Any) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._apply_config, data)

    def _state_watch(self, data: bytes | None, _stat: Any, *_: Any) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._apply_state_bytes, data)

    def _live_watch(self, children: list[str]) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._apply_live, frozenset(children))

    def _apply_live(self, live: frozenset[str]) -> None:
        if live != self._live:
            self._live = live
            self._on_change()

    def _on_zk_state(self, state: str) -> None:
        if self._stopping:
            return
        if state == KazooState.CONNECTED:
            self._set_live(True)
            if not self._registered:
                self._tasks.append(self._loop.create_task(self._register_logged()))
            self._renew_now.set()
        elif state == KazooState.SUSPENDED:
            log.warning("%s: ZooKeeper connection suspended", self.name)
            self._set_live(False)
        elif state == KazooState.LOST:
            log.warning("%s: ZooKeeper session lost; will re-register", self.name)
            self._registered = False
            self._set_live(False)

    def _set_live(self, live: bool) -> None:
        if live == self._zk_live:
            return
        self._zk_live = live
        self._lost_at = None if live else self._clock()
        self._on_change()

    # ------------------------------------------------------------------ documents

    def _apply_config(self, data: bytes | None) -> None:
        if data is None:
            return
        try:
            cfg = GroupConfig.from_json(data)
        except LayoutError as exc:
            log.error("%s: ignoring malformed group config: %s", self.name, exc)
            return
        self._config = cfg
        self._lease = self._lease.with_duration(self._lease_duration(cfg))
        self._on_change()
        self._renew_now.set()

    def _lease_duration(self, cfg: GroupConfig) -> float:
        return lease_duration_s(
            session_timeout_s=self.session_timeout_s,
            link_timeout_s=self._link_timeout_s,
            detection_checks=cfg.failover.detection_checks,
            check_interval_s=cfg.failover.check_interval_ms / 1000.0,
        )

    def _apply_state_bytes(self, data: bytes | None) -> None:
        if data is None:
            return
        try:
            new = decode_state(data)
        except LayoutError as exc:
            log.error("%s: ignoring malformed group state: %s", self.name, exc)
            return
        self.apply_state(new)

    def apply_state(self, new: GroupState) -> bool:
        """Apply ``new`` unless it is older than the state already applied. Returns whether
        it was applied. A newer epoch triggers an immediate lease renewal."""
        old = self._state
        if old is not None and new.epoch < old.epoch:
            log.warning(
                "%s: refusing state at epoch %d (%s): epoch %d already applied",
                self.name, new.epoch, new.mode.name, old.epoch,
            )
            return False
        if old == new:
            return True
        self._state = new
        log.info("%s: applied %s epoch %d (%s)", self.name, new.mode.name, new.epoch, new.reason)
        self._on_change()
        self._renew_now.set()
        return True

    # ------------------------------------------------------------------ registration

    def _live_data(self) -> bytes:
        return json.dumps({"pid": os.getpid(), "address": self._address}).encode()

    async def _register_logged(self) -> None:
        try:
            await self._register()
        except asyncio.CancelledError:
            raise
        except Exception:  # a background task must report, not vanish
            log.exception("%s: registration failed", self.name)

    async def _register(self) -> None:
        """Create ``live/<broker>`` for the current session; if a previous session's node
        is still there (a restart within the session timeout), wait for it to expire. Any
        ZooKeeper error on the way (the new session expiring too, a dropped link) is
        retried: a broker that stopped trying would stay unregistered for good."""
        path = live_path(self.group, self.name)
        backoff = Backoff(0.2, 2.0)
        while not self._stopping:
            try:
                if await self._create_live(path):
                    break
            except NoNodeError:
                continue  # the old node went away between the create and the read
            except KazooException as exc:
                log.warning("%s: cannot register yet (%r); retrying", self.name, exc)
                await backoff.sleep()
                continue
            await asyncio.sleep(0.1)  # a previous session's node: wait for it to expire
        if self._stopping:
            return
        self._registered = True
        log.info("%s: registered %s (session 0x%x)", self.name, path, self.session_id or 0)
        self._renew_now.set()
        self._on_change()

    async def _create_live(self, path: str) -> bool:
        """One try: True once ``path`` exists for this session (created now, or found to
        be ours), False while another session's node holds it."""
        sid = self.session_id
        try:
            await self._wrap(self._client.create_async(
                path, self._live_data(), acl=self._acl, ephemeral=True, makepath=True))
        except NodeExistsError:
            _, stat = await self._wrap(self._client.get_async(path))
            return sid is not None and stat.ephemeralOwner == sid
        return True

    # ------------------------------------------------------------------ status

    async def publish_status(self, status: BrokerStatus) -> None:
        """Write ``status/<broker>``. Raises :class:`CoordinationError` when ZooKeeper is
        not reachable (the caller logs it and tries again next second)."""
        await self._put(status_path(self.group, self.name), status.to_json(), "status")

    async def publish_route(self, route: BrokerRouteDoc) -> None:
        """Write ``route/<broker>`` (only when it changed: every broker watches it).
        Raises :class:`CoordinationError` when ZooKeeper is not reachable."""
        await self._put(route_path(self.group, self.name), route.to_json(), "route")

    async def _put(self, path: str, data: bytes, what: str) -> None:
        try:
            try:
                await self._wrap(self._client.set_async(path, data))
            except NoNodeError:
                await self._wrap(
                    self._client.create_async(path, data, acl=self._acl, makepath=True))
        except NodeExistsError:
            await self._wrap(self._client.set_async(path, data))
        except KazooException as exc:
            raise CoordinationError(f"publishing {what} of {self.name}: {exc!r}") from exc

    # ------------------------------------------------------------------ in-sync set

    async def read_isr(self) -> tuple[bytes, int] | None:
        """``(data, version)`` of ``/groups/<g>/isr``, None when absent."""
        try:
            raw, stat = await self._wrap(self._client.get_async(isr_path(self.group)))
        except NoNodeError:
            return None
        except KazooException as exc:
            raise CoordinationError(f"reading the in-sync record: {exc!r}") from exc
        return bytes(raw), int(stat.version)

    async def write_isr(self, data: bytes, *, version: int) -> int | None:
        """Write the ISR record if it is still at ``version`` (create it when ``version``
        is negative). Returns the new version, or None when the record changed under us
        (version mismatch, created or deleted by someone else)."""
        path = isr_path(self.group)
        try:
            if version < 0:
                await self._wrap(self._client.create_async(path, data, acl=self._acl,
                                                           makepath=True))
                return 0
            stat = await self._wrap(self._client.set_async(path, data, version=version))
            return int(stat.version)
        except (BadVersionError, NodeExistsError, NoNodeError):
            return None
        except KazooException as exc:
            raise CoordinationError(f"writing the in-sync record: {exc!r}") from exc

    # ------------------------------------------------------------------ lease

    async def renew(self) -> bool:
        """One confirmation round trip. Returns whether the lease is valid afterwards.

        Only a connected, registered session renews; the confirmation is ``sync`` +
        ``get state``, timed from before the ``sync`` was sent.
        """
        if self._config is None or not self._zk_live or not self._registered:
            return self.lease_valid()
        was_valid = self.lease_valid()
        sent_at = self._clock()
        path = state_path(self.group)
        try:
            await self._wrap(self._client.sync_async(path))
            data, _stat = await self._wrap(self._client.get_async(path))
            confirmed = decode_state(data)
        except NoNodeError:
            return self.lease_valid()
        except (KazooException, LayoutError) as exc:
            log.debug("%s: lease renewal failed: %r", self.name, exc)
            return self.lease_valid()
        if not self._registered:  # the session was lost while the request was in flight
            return self.lease_valid()
        self.apply_state(confirmed)
        applied = self._state.epoch if self._state is not None else -1
        self._lease = self._lease.renewed(
            sent_at=sent_at, confirmed_epoch=confirmed.epoch, applied_epoch=applied)
        valid = self.lease_valid()
        if valid:
            self._arm_lapse_timer()
        if valid != was_valid:
            self._on_change()
        return valid

    def _arm_lapse_timer(self) -> None:
        if self._lapse_timer is not None:
            self._lapse_timer.cancel()
        delay = self._lease.remaining(self._clock())
        self._lapse_timer = self._loop.call_later(delay + 0.001, self._lease_maybe_lapsed)

    def _lease_maybe_lapsed(self) -> None:
        self._lapse_timer = None
        if not self.lease_valid():
            log.info("%s: read lease lapsed", self.name)
            self._on_change()

    async def _renewal_loop(self) -> None:
        while True:
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep renewing; a bug here must not silently stop leases
                log.exception("%s: lease renewal crashed", self.name)
            interval = renewal_interval_s(self._lease.duration) if self._lease.duration > 0 else 0.2
            self._renew_now.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that lands as
            # the event is set (stop() sets it), and this loop would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._renew_now.wait()

    # ------------------------------------------------------------------ kazoo async bridge

    def _wrap(self, async_result: Any) -> asyncio.Future[Any]:
        return kazoo_future(self._loop, async_result)

