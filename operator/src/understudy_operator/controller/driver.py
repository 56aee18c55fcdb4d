"""The thin asyncio driver around the pure failover machine.

Why this module exists: :func:`~understudy_operator.controller.machine.decide` knows the
rules but does no I/O. This module does the I/O and nothing else, per group:

- leader election under ``/controllers/<group>`` (ephemeral sequential nodes; the lowest
  leads, each follower watches its predecessor), so one controller decides per group and
  a stopped controller hands over at once (its session closes);
- watches on ``config``, ``state``, the ``live`` children and every broker's ``status``,
  plus liveness events (a certain process death), all of which wake the group at once; a
  periodic check every ``checkIntervalMs`` is only the safety net, and a decision's
  ``recheck_in`` wakes it exactly when a detection window or timeout ends;
- every transition is ``set(state, ..., version=v)`` with the version just read; a
  ``BadVersionError`` means someone else moved: re-read and decide again, never apply the
  stale decision;
- the initial state ``{NORMAL, epoch 1}`` when a group has a config and no state;
- Prometheus series for the groups this controller leads (and only those).

Threading: kazoo callbacks only call ``loop.call_soon_threadsafe``; everything else runs on
the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.security import make_digest_acl
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from understudy_broker.coordination import kazoo_future
from understudy_broker.model import GroupState, Mode
from understudy_broker.zklayout import (
    BrokerStatus,
    GroupConfig,
    LayoutError,
    config_path,
    controller_path,
    decode_state,
    encode_state,
    live_dir,
    state_path,
    status_path,
)
from understudy_broker.zklayout import decode_isr as decode_isr  # re-exported for cli_group
from understudy_broker.zklayout import isr_path as isr_path
from understudy_operator.controller.liveness import LivenessSource
from understudy_operator.controller.machine import PHASES, Decision, Memory, decide, initial_state
from understudy_operator.controller.observe import BrokerView, Observation

log = logging.getLogger(__name__)

#: Buckets for ``understudy_failover_phase_seconds`` (10 ms .. 60 s).
PHASE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ControllerMetrics:
    """The controller's Prometheus series, in a registry of its own (no global state).

    Group series exist only while this controller leads the group: :meth:`forget` removes
    them when leadership is lost, so two controllers never both export a group.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.mode = Gauge("understudy_group_mode", "Group mode: 0 NORMAL, 1 FENCING, "
                          "2 SLAVE_CONSUME, 3 RECOVERING", ["group"], registry=r)
        self.epoch = Gauge("understudy_group_epoch", "Group state epoch", ["group"], registry=r)
        self.failovers = Counter("understudy_failover_total",
                                 "Failovers: reads handed to a slave (FENCING -> SLAVE_CONSUME)",
                                 ["group"], registry=r)
        self.phase = Histogram("understudy_failover_phase_seconds",
                               "Failover phase durations (detect, fence, switch, backsync)",
                               ["group", "phase"], buckets=PHASE_BUCKETS, registry=r)
        self.degraded = Gauge("understudy_group_degraded",
                              "1 when the group's master and every slave are down", ["group"],
                              registry=r)
        self.transitions = Counter("understudy_controller_transitions_total",
                                   "State transitions written by this controller",
                                   ["group", "to"], registry=r)

    def lead(self, group: str) -> None:
        self.failovers.labels(group)
        for phase in PHASES:
            self.phase.labels(group, phase)

    def set_state(self, group: str, state: GroupState) -> None:
        self.mode.labels(group).set(int(state.mode))
        self.epoch.labels(group).set(state.epoch)

    def forget(self, group: str) -> None:
        for metric in (self.mode, self.epoch, self.failovers, self.degraded):
            with contextlib.suppress(KeyError):
                metric.remove(group)
        for phase in PHASES:
            with contextlib.suppress(KeyError):
                self.phase.remove(group, phase)
        for mode in Mode:
            with contextlib.suppress(KeyError):
                self.transitions.remove(group, mode.name)


async def read_isr(zk: Callable[[Any], Awaitable[Any]], client: KazooClient, group: str
                   ) -> frozenset[str] | None:
    """The recorded in-sync set, ``None`` when there is no record. A malformed record
    counts as an empty set: no slave is trusted to hold every acknowledged commit."""
    try:
        raw, _ = await zk(client.get_async(isr_path(group)))
    except NoNodeError:
        return None
    try:
        return decode_isr(raw)
    except LayoutError as exc:
        log.error("group %s: %s; trusting no slave", group, exc)
        return frozenset()


TransitionLog = Callable[[str, GroupState, GroupState], None]


def log_transition(group: str, old: GroupState, new: GroupState) -> None:
    log.warning("group %s: %s/%d -> %s/%d acting=%s: %s", group, old.mode.name, old.epoch,
                new.mode.name, new.epoch, new.acting or "-", new.reason)


class Controller:
    """One controller process: one ZooKeeper session, one :class:`GroupDriver` per group."""

    def __init__(
        self,
        connect: str,
        *,
        groups: Sequence[str],
        liveness: LivenessSource,
        loop: asyncio.AbstractEventLoop,
        session_timeout_s: float = 4.0,
        digest_auth: tuple[str, str] | None = None,
        metrics: ControllerMetrics | None = None,
        identity: str | None = None,
        on_transition: TransitionLog = log_transition,
    ) -> None:
        self.loop = loop
        self.liveness = liveness
        self.metrics = metrics or ControllerMetrics()
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.on_transition = on_transition
        auth = [("digest", f"{digest_auth[0]}:{digest_auth[1]}")] if digest_auth else None
        self.acl = [make_digest_acl(*digest_auth, all=True)] if digest_auth else None
        self.client = KazooClient(hosts=connect, timeout=session_timeout_s, auth_data=auth,
                                  default_acl=self.acl)
        self.generation = 0  # bumped on every session loss: leadership is per session
        self.drivers = [GroupDriver(self, g) for g in groups]
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self, *, connect_timeout_s: float = 10.0) -> None:
        self.client.add_listener(self._listener)
        await asyncio.to_thread(self.client.start, connect_timeout_s)
        self.liveness.subscribe(self._on_process_exit)
        for d in self.drivers:
            self._tasks.append(self.loop.create_task(d.run(), name=f"controller-{d.group}"))

    async def stop(self) -> None:
        """Resign: stop deciding, then close the session so followers take over at once."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for d in self.drivers:
            self.metrics.forget(d.group)
        self.liveness.close()
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self.client.remove_listener(self._listener)
        self.client.stop()
        self.client.close()

    def leading(self, group: str) -> bool:
        return any(d.group == group and d.is_leader for d in self.drivers)

    async def zk(self, async_result: Any) -> Any:
        return await kazoo_future(self.loop, async_result)

    def _listener(self, state: str) -> None:
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._on_zk_state, state)

    def _on_zk_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self.generation += 1
            log.warning("controller %s: ZooKeeper session lost; leadership dropped", self.identity)
        elif state == KazooState.SUSPENDED:
            log.warning("controller %s: ZooKeeper connection suspended", self.identity)
        for d in self.drivers:
            d.wake()

    def _on_process_exit(self, broker: str) -> None:
        for d in self.drivers:
            if broker in d.brokers:
                d.wake()


class GroupDriver:
    """Election, watches and the decide/write loop for one group."""

    def __init__(self, controller: Controller, group: str) -> None:
        self.c = controller
        self.group = group
        self.is_leader = False
        self.brokers: set[str] = set()
        self.memory = Memory()
        self.last_decision: Decision | None = None
        self._event = asyncio.Event()
        self._watched_status: set[str] = set()
        self._watches_armed = False
        self._node: str | None = None
        self._node_gen = -1
        self._degraded = False

    def wake(self) -> None:
        self._event.set()

    def _wake_threadsafe(self, *_: Any) -> Any:
        with contextlib.suppress(RuntimeError):
            self.c.loop.call_soon_threadsafe(self.wake)
        return None

    # ------------------------------------------------------------------ election

    async def run(self) -> None:
        while True:
            try:
                gen = await self._campaign()
                self.is_leader = True
                self.memory = Memory()  # a new leader starts its timers afresh
                log.info("controller %s leads group %s", self.c.identity, self.group)
                self.c.metrics.lead(self.group)
                await self._lead(gen)
            except asyncio.CancelledError:
                raise
            except KazooException as exc:
                log.warning("group %s: ZooKeeper error %r; retrying", self.group, exc)
                await asyncio.sleep(0.2)
            except Exception:  # a driver must keep driving; the bug is logged loudly
                log.exception("group %s: controller loop crashed; restarting it", self.group)
                await asyncio.sleep(0.5)
            finally:
                if self.is_leader:
                    log.info("controller %s no longer leads group %s", self.c.identity, self.group)
                self.is_leader = False
                self.c.metrics.forget(self.group)

    async def _campaign(self) -> int:
        """Return (with the session generation) once this controller leads the group."""
        base = controller_path(self.group)
        while True:
            gen = self.c.generation
            if not self.c.client.connected:
                await self._sleep(0.2)
                continue
            if self._node is None or self._node_gen != gen:
                self._node = await self.c.zk(self.c.client.create_async(
                    f"{base}/c-", self.c.identity.encode(), acl=self.c.acl, ephemeral=True,
                    sequence=True, makepath=True))
                self._node_gen = gen
            mine = self._node.rsplit("/", 1)[1]
            children = sorted(await self.c.zk(self.c.client.get_children_async(base)))
            if mine not in children:
                self._node = None
                continue
            idx = children.index(mine)
            if idx == 0:
                return gen
            pred = f"{base}/{children[idx - 1]}"
            self._event.clear()
            stat = await self.c.zk(self.c.client.exists_async(pred, watch=self._wake_threadsafe))
            if stat is not None:
                await self._sleep(5.0)

    async def _sleep(self, seconds: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that races with the event, and Controller.stop() would then wait forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._event.wait()
        self._event.clear()

    # ------------------------------------------------------------------ leading

    def _arm_watches(self) -> None:
        if self._watches_armed:
            return
        self._watches_armed = True
        client = self.c.client
        client.DataWatch(config_path(self.group), self._wake_threadsafe)
        client.DataWatch(state_path(self.group), self._wake_threadsafe)
        with contextlib.suppress(KazooException):
            client.ensure_path(live_dir(self.group), acl=self.c.acl)
        client.ChildrenWatch(live_dir(self.group), self._wake_threadsafe)

    def _arm_status_watches(self, names: set[str]) -> None:
        for name in names - self._watched_status:
            self._watched_status.add(name)
            self.c.client.DataWatch(status_path(self.group, name), self._wake_threadsafe)

    async def _lead(self, gen: int) -> None:
        await asyncio.to_thread(self._arm_watches)
        while self.c.generation == gen:
            self._event.clear()
            if not self.c.client.connected:
                await self._sleep(0.2)
                continue
            recheck = await self.check_once()
            if recheck == 0:
                continue  # a transition was written (or lost a race): decide again at once
            await self._sleep(recheck)

    async def check_once(self) -> float:
        """Observe, decide, write. Returns seconds until the next periodic check (0: now)."""
        client = self.c.client
        try:
            raw_cfg, _ = await self.c.zk(client.get_async(config_path(self.group)))
        except NoNodeError:
            return 1.0
        try:
            config = GroupConfig.from_json(raw_cfg)
        except LayoutError as exc:
            log.error("group %s: malformed config, not deciding: %s", self.group, exc)
            return 1.0
        interval = config.failover.check_interval_ms / 1000.0
        names = {b.name for b in config.brokers}
        if names != self.brokers:
            self.brokers = names
            self.c.liveness.track(names)
            await asyncio.to_thread(self._arm_status_watches, names)
        try:
            raw_state, stat = await self.c.zk(client.get_async(state_path(self.group)))
        except NoNodeError:
            await self._create_initial()
            return 0
        try:
            state = decode_state(raw_state)
        except LayoutError as exc:
            log.error("group %s: malformed state, not deciding (override with "
                      "'understudy group force-mode'): %s", self.group, exc)
            return interval
        self.c.metrics.set_state(self.group, state)
        obs = await self._observe(config)
        decision = decide(config, state, obs, self.memory)
        self.last_decision = decision
        self.c.metrics.degraded.labels(self.group).set(1 if decision.degraded else 0)
        for phase, seconds in decision.phases:
            self.c.metrics.phase.labels(self.group, phase).observe(max(0.0, seconds))
        if decision.target is None:
            if decision.degraded != self._degraded:
                if decision.degraded:
                    log.error("group %s: DEGRADED: %s", self.group, decision.reason)
                else:
                    log.warning("group %s: no longer degraded", self.group)
            self._degraded = decision.degraded
            self.memory = decision.memory
            return min(interval, decision.recheck_in) if decision.recheck_in is not None else interval
        try:
            await self.c.zk(client.set_async(state_path(self.group), encode_state(decision.target),
                                             version=stat.version))
        except BadVersionError:
            log.info("group %s: state moved under us (version %d); re-reading", self.group,
                     stat.version)
            return 0
        self.memory = decision.memory
        self.c.metrics.set_state(self.group, decision.target)
        self.c.metrics.transitions.labels(self.group, decision.target.mode.name).inc()
        if state.mode is Mode.FENCING and decision.target.mode is Mode.SLAVE_CONSUME:
            self.c.metrics.failovers.labels(self.group).inc()
        self.c.on_transition(self.group, state, decision.target)
        return 0

    async def _create_initial(self) -> None:
        st = initial_state(time.time())
        try:
            await self.c.zk(self.c.client.create_async(
                state_path(self.group), encode_state(st), acl=self.c.acl, makepath=True))
        except NodeExistsError:
            return
        log.warning("group %s: created initial state NORMAL/1", self.group)

    async def _observe(self, config: GroupConfig) -> Observation:
        client = self.c.client
        try:
            live = set(await self.c.zk(client.get_children_async(live_dir(self.group))))
        except NoNodeError:
            live = set()
        views: dict[str, BrokerView] = {}
        for spec in config.brokers:
            status: BrokerStatus | None = None
            version = -1
            try:
                raw, zstat = await self.c.zk(client.get_async(status_path(self.group, spec.name)))
                version = zstat.version
                status = BrokerStatus.from_json(raw)
            except NoNodeError:
                pass
            except LayoutError as exc:
                log.warning("group %s: ignoring malformed status of %s: %s", self.group, spec.name,
                            exc)
            views[spec.name] = BrokerView(
                name=spec.name,
                zk_live=spec.name in live,
                process=self.c.liveness.process_state(spec.name),
                status=status,
                status_version=version,
            )
        in_sync = await read_isr(self.c.zk, client, self.group)
        return Observation(now=time.monotonic(), wall=time.time(), brokers=views, in_sync=in_sync)
