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
- every ZooKeeper call through the operator's one gateway (:mod:`understudy_operator.zk`),
  including :meth:`~understudy_operator.zk.ZkGateway.observe_group`, the read it decides on;
- Prometheus series for the groups this controller leads (and only those), and the topic
  series when it leads the cluster's first elected group (:class:`TopicExporter`).

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
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from understudy_broker import metric_names as names
from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.retry import Backoff
from understudy_broker.tasks import stop_tasks
from understudy_broker.zklayout import (
    BrokerStatus,
    GroupConfig,
    LayoutError,
    config_path,
    controller_path,
    decode_state,
    encode_state,
    isr_path,
    live_dir,
    state_path,
    status_path,
)
from understudy_operator import zk as zkio
from understudy_operator.controller.chainmover import ChainMover
from understudy_operator.controller.liveness import LivenessSource
from understudy_operator.controller.machine import PHASES, Decision, Memory, decide, initial_state
from understudy_operator.controller.observe import Observation
from understudy_operator.controller.routewriter import RouteWriter
from understudy_operator.controller.topicview import (
    TopicCounts,
    group_permission,
    topic_counts,
)
from understudy_operator.zk import Digest

log = logging.getLogger(__name__)

#: Buckets for ``understudy_failover_phase_seconds`` (10 ms .. 60 s).
PHASE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds between two refreshes of the topic series.
TOPIC_REFRESH_S = 1.0


class ControllerMetrics:
    """The controller's Prometheus series, in a registry of its own (no global state).

    Group series exist only while this controller leads the group: :meth:`forget` removes
    them when leadership is lost, so two controllers never both export a group.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.mode = Gauge(names.GROUP_MODE, "Group mode: 0 NORMAL, 1 FENCING, "
                          "2 SLAVE_CONSUME, 3 RECOVERING", ["group"], registry=r)
        self.epoch = Gauge(names.GROUP_EPOCH, "Group state epoch", ["group"], registry=r)
        self.failovers = Counter(names.counter_base(names.FAILOVER_TOTAL),
                                 "Failovers: reads handed to a slave (FENCING -> SLAVE_CONSUME)",
                                 ["group"], registry=r)
        self.phase = Histogram(names.FAILOVER_PHASE_SECONDS,
                               "Failover phase durations (detect, fence, switch, backsync)",
                               ["group", "phase"], buckets=PHASE_BUCKETS, registry=r)
        self.degraded = Gauge(names.GROUP_DEGRADED,
                              "1 when the group's master and every slave are down", ["group"],
                              registry=r)
        self.transitions = Counter(names.counter_base(names.CONTROLLER_TRANSITIONS_TOTAL),
                                   "State transitions written by this controller",
                                   ["group", "to"], registry=r)
        self.route_writes = Counter(names.counter_base(names.ROUTE_DOCUMENT_WRITES_TOTAL),
                                    "Writes of /routes/doc by this controller as the route "
                                    "writer", registry=r)
        self.topic_queues = Gauge(names.TOPIC_QUEUES, "Queues of the topic (removed ones "
                                  "excluded)", ["topic"], registry=r)
        self.topic_writable = Gauge(names.TOPIC_WRITABLE_QUEUES, "Queues of the topic whose "
                                    "group has a live broker holding WRITE", ["topic"], registry=r)
        self.topic_readable = Gauge(names.TOPIC_READABLE_QUEUES, "Queues of the topic whose "
                                    "group has a live broker holding READ", ["topic"], registry=r)
        self.topic_queue = Gauge(names.TOPIC_QUEUE_INFO, "1 for each live queue of the topic, "
                                 "labelled with the group it lives on", ["topic", "queue", "group"], registry=r)
        self._placed: dict[str, set[tuple[str, str]]] = {}  # topic -> (queue, group) exported
        # Event times (docs/sla.md "Event times"), seconds since the epoch.
        self.mode_entered = Gauge(names.GROUP_MODE_ENTERED, "When the group last entered each "
                                  "mode (seconds since the epoch)", ["group", "mode"], registry=r)
        self.exited = Gauge(names.BROKER_EXITED, "When the broker's process was seen to exit "
                            "(seconds since the epoch)", ["group", "broker", "role"], registry=r)
        # group -> (mode, epoch) last exported (mode_entered moves when the mode changes)
        self._shown: dict[str, tuple[Mode, int]] = {}
        self._degraded: dict[str, bool] = {}  # group -> the degraded gauge's value
        self._exited: dict[str, set[tuple[str, str]]] = {}  # group -> (broker, role) exported

    def lead(self, group: str) -> None:
        self.failovers.labels(group)
        for phase in PHASES:
            self.phase.labels(group, phase)

    def set_state(self, group: str, state: GroupState, *, entered_at: float | None = None) -> None:
        """Export ``state``. ``entered_at``: the wall-clock instant this controller's write
        of a transition into a new mode succeeded; a mode found otherwise (this controller
        just began leading, or another writer moved the group) is dated by ``state.since``."""
        shown = (state.mode, state.epoch)
        before = self._shown.get(group)
        if before != shown:  # every check of every group comes here
            self._shown[group] = shown
            self.mode.labels(group).set(int(state.mode))
            self.epoch.labels(group).set(state.epoch)
        if entered_at is not None or before is None or before[0] is not state.mode:
            at = entered_at if entered_at is not None else state.since
            if at > 0:
                self.mode_entered.labels(group, state.mode.name).set(at)

    def set_degraded(self, group: str, degraded: bool) -> None:
        if self._degraded.get(group) is not degraded:  # every check of every group comes here
            self._degraded[group] = degraded
            self.degraded.labels(group).set(1 if degraded else 0)

    def broker_exited(self, group: str, broker: str, role: str, at: float) -> None:
        """The liveness source reported ``broker``'s process exited at ``at`` (wall clock)."""
        self._exited.setdefault(group, set()).add((broker, role))
        self.exited.labels(group, broker, role).set(at)

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
            with contextlib.suppress(KeyError):
                self.mode_entered.remove(group, mode.name)
        self._shown.pop(group, None)
        self._degraded.pop(group, None)
        for broker, role in self._exited.pop(group, set()):
            with contextlib.suppress(KeyError):
                self.exited.remove(group, broker, role)

    def set_topic(self, topic: str, counts: TopicCounts) -> None:
        """Export ``topic``'s counts and one ``understudy_topic_queue_info`` series per live
        queue (a removed queue's goes)."""
        self.topic_queues.labels(topic).set(counts.queues)
        self.topic_writable.labels(topic).set(counts.writable)
        self.topic_readable.labels(topic).set(counts.readable)
        placed = {(str(q), g) for q, g in counts.placement}
        for queue, group in self._placed.get(topic, set()) - placed:
            with contextlib.suppress(KeyError):
                self.topic_queue.remove(topic, queue, group)
        for queue, group in placed:
            self.topic_queue.labels(topic, queue, group).set(1)
        self._placed[topic] = placed

    def forget_topic(self, topic: str) -> None:
        for metric in (self.topic_queues, self.topic_writable, self.topic_readable):
            with contextlib.suppress(KeyError):
                metric.remove(topic)
        for queue, group in self._placed.pop(topic, set()):
            with contextlib.suppress(KeyError):
                self.topic_queue.remove(topic, queue, group)


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
        digest_auth: Digest | None = None,
        metrics: ControllerMetrics | None = None,
        identity: str | None = None,
        on_transition: TransitionLog = log_transition,
    ) -> None:
        self.loop = loop
        self.liveness = liveness
        self.metrics = metrics or ControllerMetrics()
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.session_timeout_s = session_timeout_s
        self.on_transition = on_transition
        self.zk = zkio.gateway(connect, timeout_s=session_timeout_s, digest=digest_auth)
        self.generation = 0  # bumped on every session loss: leadership is per session
        self.drivers = [GroupDriver(self, g) for g in groups]
        self.topics = TopicExporter(self)
        self.chains = ChainMover(self)
        self.routes = RouteWriter(self.zk, self.identity,
                                  lambda: [d.group for d in self.drivers if d.is_leader],
                                  on_write=self.metrics.route_writes.inc)
        self._tasks: list[asyncio.Task[None]] = []
        self.resigning = False
        # Transitions whose versioned write is on its way: a stop lets them finish, so
        # every state this controller wrote reaches its journal (see GroupDriver._commit).
        self.commits: set[asyncio.Task[zkio.GroupRead | None]] = set()

    async def start(self, *, connect_timeout_s: float = 10.0) -> None:
        self.zk.add_listener(self._listener)
        try:
            await self.zk.start(timeout_s=connect_timeout_s)
        except zkio.ZkUnavailable:
            self.zk.remove_listener(self._listener)
            raise
        self.liveness.subscribe(self._on_process_exit)
        for d in self.drivers:
            self._tasks.append(self.loop.create_task(d.run(), name=f"controller-{d.group}"))
        self._tasks.append(self.loop.create_task(self.topics.run(), name="controller-topics"))
        self._tasks.append(self.loop.create_task(self.chains.run(), name="controller-chains"))
        self._tasks.append(self.loop.create_task(self.routes.run(), name="controller-routes"))

    async def stop(self) -> None:
        """Resign: stop deciding, then close the session so followers take over at once.

        A transition already sent to ZooKeeper is waited for (bounded by the session
        timeout), never cut off: ZooKeeper may apply a write whose sender was cancelled, and
        the journal and metrics must still record it."""
        self.resigning = True
        await stop_tasks(self._tasks)
        self._tasks.clear()
        if self.commits:
            done, _ = await asyncio.wait(set(self.commits), timeout=self.session_timeout_s)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    log.warning("controller %s: a transition write failed while resigning: %r",
                                self.identity, t.exception())
        for d in self.drivers:
            self.metrics.forget(d.group)
        self.liveness.close()
        self.zk.remove_listener(self._listener)
        await self.zk.stop()

    def leading(self, group: str) -> bool:
        return any(d.group == group and d.is_leader for d in self.drivers)

    def _listener(self, state: str) -> None:
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._on_zk_state, state)

    def _on_zk_state(self, state: str) -> None:
        if state == zkio.LOST:
            self.generation += 1
            log.warning("controller %s: ZooKeeper session lost; leadership dropped", self.identity)
        elif state == zkio.SUSPENDED:
            log.warning("controller %s: ZooKeeper connection suspended", self.identity)
        for d in self.drivers:
            d.wake()

    def _on_process_exit(self, broker: str) -> None:
        at = time.time()  # the liveness event's instant: the exit's event time
        for d in self.drivers:
            if broker in d.brokers:
                if d.is_leader:
                    self.metrics.broker_exited(d.group, broker, d.roles.get(broker, ""), at)
                d.wake()


class GroupDriver:
    """Election, watches and the decide/write loop for one group."""

    def __init__(self, controller: Controller, group: str) -> None:
        self.c = controller
        self.group = group
        self.is_leader = False
        self.brokers: list[str] = []  # the brokers the last config named, in its order
        self.roles: dict[str, str] = {}  # broker -> role, from the config (metric labels)
        self.memory = Memory()
        self.last_decision: Decision | None = None
        self._event = asyncio.Event()
        self._watched_status: set[str] = set()
        self._watches_armed = False
        # What the watches keep (kazoo re-reads a node on each notification): path ->
        # (data, znode version), None data when absent; the live children; the config
        # last parsed. Periodic checks decide on these (see check_once).
        self._kept: dict[str, tuple[bytes | None, int]] = {}
        self._kept_live: frozenset[str] | None = None
        self._kept_config: tuple[bytes, GroupConfig | None] | None = None
        self._kept_state: tuple[bytes, GroupState] | None = None  # the state last decoded
        self._statuses: dict[bytes, BrokerStatus] = {}  # see _parse_status
        self._node: str | None = None
        self._node_gen = -1
        self._degraded = False

    def wake(self, *_: Any) -> None:
        self._event.set()

    def _wake_threadsafe(self, *_: Any) -> None:
        """A one-shot kazoo watch callback (kazoo's thread): wake the loop."""
        with contextlib.suppress(RuntimeError):
            self.c.loop.call_soon_threadsafe(self.wake)

    # ------------------------------------------------------------------ election

    async def run(self) -> None:
        backoff = Backoff(0.2, 2.0)
        while True:
            try:
                gen = await self._campaign()
                self.is_leader = True
                self.memory = Memory()  # a new leader starts its timers afresh
                log.info("controller %s leads group %s", self.c.identity, self.group)
                self.c.metrics.lead(self.group)
                backoff.reset()
                await self._lead(gen)
            except asyncio.CancelledError:
                raise
            except zkio.ZkError as exc:
                log.warning("group %s: ZooKeeper error %r; retrying", self.group, exc)
                await backoff.sleep()
            except Exception:  # a driver must keep driving; the bug is logged loudly
                log.exception("group %s: controller loop crashed; restarting it", self.group)
                await backoff.sleep()
            finally:
                if self.is_leader:
                    log.info("controller %s no longer leads group %s", self.c.identity, self.group)
                self.is_leader = False
                self.c.metrics.forget(self.group)

    async def _campaign(self) -> int:
        """Return (with the session generation) once this controller leads the group."""
        zk = self.c.zk
        base = controller_path(self.group)
        while True:
            gen = self.c.generation
            if not zk.connected:
                await self._sleep(0.2)
                continue
            if self._node is None or self._node_gen != gen:
                self._node = await zk.create(f"{base}/c-", self.c.identity.encode(),
                                             ephemeral=True, sequence=True)
                self._node_gen = gen
            if self._node is None:  # a sequential node always gets a new name
                continue
            mine = self._node.rsplit("/", 1)[1]
            children = sorted(await zk.children(base))
            if mine not in children:
                self._node = None
                continue
            idx = children.index(mine)
            if idx == 0:
                return gen
            pred = f"{base}/{children[idx - 1]}"
            self._event.clear()
            if await zk.exists(pred, watch=self._wake_threadsafe):
                await self._sleep(5.0)

    async def _sleep(self, seconds: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that races with the event, and Controller.stop() would then wait forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._event.wait()
        self._event.clear()

    # ------------------------------------------------------------------ leading

    async def _arm_watches(self) -> None:
        if self._watches_armed:
            return
        self._watches_armed = True
        zk = self.c.zk
        await zk.watch_node(config_path(self.group), self._keep(config_path(self.group)))
        await zk.watch_node(state_path(self.group), self._keep(state_path(self.group)))
        await zk.watch_node(isr_path(self.group), self._keep(isr_path(self.group)))
        with contextlib.suppress(zkio.ZkError):
            await zk.ensure_path(live_dir(self.group))
        await zk.children_watch(live_dir(self.group), self._keep_live)

    async def _arm_status_watches(self, names: set[str]) -> None:
        for name in names - self._watched_status:
            self._watched_status.add(name)
            path = status_path(self.group, name)
            await self.c.zk.watch_node(path, self._keep(path))

    def _keep(self, path: str) -> Callable[[bytes | None, int], None]:
        def changed(data: bytes | None, version: int) -> None:
            old = self._kept.get(path)
            if data is not None and old is not None and version < old[1]:
                return  # a read from before this controller's own write, delivered late
            self._kept[path] = (data, version)
            self.wake()
        return changed

    def _keep_live(self, children: list[str]) -> None:
        self._kept_live = frozenset(children)
        self.wake()

    async def _lead(self, gen: int) -> None:
        await self._arm_watches()
        while self.c.generation == gen:
            self._event.clear()
            if not self.c.zk.connected:
                await self._sleep(0.2)
                continue
            recheck = await self.check_once()
            if recheck == 0:
                continue  # a transition was written (or lost a race): decide again at once
            await self._sleep(recheck)

    async def check_once(self) -> float:
        """Observe, decide, write. Returns seconds until the next periodic check (0: now).

        A check first decides on what the watches keep (config, state, ``live`` children,
        statuses, the in-sync record). A decision to stay is taken as it is: the periodic
        checks of a quiet group cost no ZooKeeper request (six reads before watches kept
        them, one while the in-sync record was still read). A decision to move is never
        written on kept data: everything is read again, decided again, and that decision
        is written with the state version just read."""
        kept = await self._kept_inputs()
        if kept is not None:
            config, state, obs = kept
            decision = decide(config, state, obs, self.memory)
            if decision.target is None:
                self.c.metrics.set_state(self.group, state)
                return self._stay(decision, config.failover.check_interval_ms / 1000.0)
        return await self._check_fresh()

    async def _kept_inputs(self) -> tuple[GroupConfig, GroupState, Observation] | None:
        """The config, state and observation from what the watches keep, or None when
        something is not kept (yet), is malformed or names brokers not watched yet: then
        the fresh check handles it."""
        config = self._config_kept()
        raw_state = self._kept.get(state_path(self.group))
        if (config is None or raw_state is None or raw_state[0] is None
                or self._kept_live is None or [b.name for b in config.brokers] != self.brokers):
            return None
        state = self._state_kept(raw_state[0])
        if state is None:
            return None
        names = self.brokers
        statuses = []
        for name in names:
            found = self._kept.get(status_path(self.group, name))
            if found is None:
                return None
            statuses.append(None if found[0] is None else (found[0], found[1]))
        isr = self._kept.get(isr_path(self.group))
        if isr is None:
            return None
        return config, state, zkio.observation_of(
            self.group, names, live=self._kept_live, statuses=statuses,
            in_sync=zkio.isr_of(self.group, isr[0]), process=self.c.liveness.process_state,
            parse=self._parse_status)

    def _state_kept(self, raw: bytes) -> GroupState | None:
        """The kept state decoded, remembered by its bytes (a quiet group's state is the
        same document check after check); None when malformed (the fresh check says so)."""
        if self._kept_state is not None and self._kept_state[0] == raw:
            return self._kept_state[1]
        try:
            state = decode_state(raw)
        except LayoutError:
            return None
        self._kept_state = (raw, state)
        return state

    def _parse_status(self, raw: bytes) -> BrokerStatus:
        """A status decoded, remembered by its bytes (a quiet group's statuses repeat
        check after check; a republish with a new timestamp is new bytes)."""
        status = self._statuses.get(raw)
        if status is None:
            status = BrokerStatus.from_json(raw)  # LayoutError: not remembered
            if len(self._statuses) >= 4 * max(1, len(self.brokers)):
                self._statuses.clear()
            self._statuses[raw] = status
        return status

    def _config_kept(self) -> GroupConfig | None:
        found = self._kept.get(config_path(self.group))
        if found is None or found[0] is None:
            return None
        raw = found[0]
        if self._kept_config is None or self._kept_config[0] != raw:
            try:
                parsed: GroupConfig | None = GroupConfig.from_json(raw)
            except LayoutError:
                parsed = None  # the fresh check reports it
            self._kept_config = (raw, parsed)
        return self._kept_config[1]

    def _record(self, decision: Decision) -> None:
        self.last_decision = decision
        self.c.metrics.set_degraded(self.group, decision.degraded)
        for phase, seconds in decision.phases:
            self.c.metrics.phase.labels(self.group, phase).observe(max(0.0, seconds))

    def _stay(self, decision: Decision, interval: float) -> float:
        """Take a decision that writes nothing; seconds until the next check."""
        self._record(decision)
        if decision.degraded != self._degraded:
            if decision.degraded:
                log.error("group %s: DEGRADED: %s", self.group, decision.reason)
            else:
                log.warning("group %s: no longer degraded", self.group)
        self._degraded = decision.degraded
        self.memory = decision.memory
        return min(interval, decision.recheck_in) if decision.recheck_in is not None else interval

    async def _check_fresh(self) -> float:
        """The check on a fresh read of every input; the only one that writes.

        The config, the state and the observation are read in one round trip
        (:meth:`~understudy_operator.zk.ZkGateway.read_group`). When the inputs just read
        would move the group on from the state being written too (FENCING after a certain
        death goes on to SLAVE_CONSUME), the next check's reads are sent with the write,
        and ZooKeeper answers them after it (a session's requests are answered in order):
        the next decision is taken at once on inputs read after the write, as if read
        again after it, and a failover's FENCING and SLAVE_CONSUME cost three round trips,
        not six. Otherwise the write goes alone and the next check starts from what the
        watches keep, as before: a read sent with every write would mostly decide to stay."""
        found = await self._read()
        while True:
            step = await self._decide_fresh(found)
            if not isinstance(step, tuple):
                return step
            state, version, decision, read_after = step
            # The write and its bookkeeping run as their own task, shielded: a stop that
            # cancels this driver mid-write would otherwise leave a state in ZooKeeper that
            # the journal, the metrics and the log never saw.
            commit = self.c.loop.create_task(self._commit(state, version, decision, read_after),
                                             name=f"controller-{self.group}-commit")
            self.c.commits.add(commit)
            commit.add_done_callback(self.c.commits.discard)
            after = await asyncio.shield(commit)
            if after is None:
                return 0  # written alone, or lost a race: check again at once
            found = after

    async def _read(self, write: tuple[GroupState, int] | None = None) -> zkio.GroupRead:
        """Config, state and observation in one round trip, the observation of the brokers
        the last config named (read again when the config names others)."""
        return await self.c.zk.read_group(
            self.group, self.brokers, write=write, process=self.c.liveness.process_state,
            warn_config=lambda msg: log.error("%s; not deciding", msg),
            warn_state=lambda msg: log.error(
                "%s; not deciding (override with 'understudy group force-mode')", msg))

    async def _decide_fresh(self, found: zkio.GroupRead
                            ) -> float | tuple[GroupState, int, Decision, bool]:
        """Decide on a fresh read: seconds until the next check (0: at once), or the
        transition to write over ``(state, version)`` and whether to read again with it
        (the same inputs would move the group on from the transition's target too: only
        a hint, as the next move is decided on what is read after the write)."""
        config, state, version = found.config, found.state, found.version
        if config is None:
            return 1.0
        interval = config.failover.check_interval_ms / 1000.0
        order = [b.name for b in config.brokers]
        self.roles = {b.name: b.role.value for b in config.brokers}
        if order != self.brokers:
            self.brokers = order
            self.c.liveness.track(order)
            await self._arm_status_watches(set(order))
        if version < 0:
            await self._create_initial()
            return 0
        if state is None:
            return interval
        self.c.metrics.set_state(self.group, state)
        obs = found.observation
        if obs is None:  # read for other brokers than the config names: observe them now
            obs = await self.c.zk.observe_group(self.group, order,
                                                process=self.c.liveness.process_state)
        decision = decide(config, state, obs, self.memory)
        if decision.target is None:
            return self._stay(decision, interval)
        if self.c.resigning:
            return interval  # resigning: the next leader decides; nothing new is started
        onward = decide(config, decision.target, obs, decision.memory).target is not None
        return state, version, decision, onward

    async def _commit(self, state: GroupState, version: int, decision: Decision,
                      read_after: bool) -> zkio.GroupRead | None:
        """Write ``decision.target`` over ``state`` (at ``version``) and record it; returns
        the inputs read right after the write when ``read_after``, else ``None`` (also when
        the write did not take)."""
        assert decision.target is not None
        self._record(decision)
        found: zkio.GroupRead | None = None
        if read_after:
            found = await self._read(write=(decision.target, version))
            written, at = bool(found.written), found.written_at
        else:
            written, at = await self.c.zk.write_state(self.group, decision.target, version=version), None
        if not written:
            log.info("group %s: state moved under us (version %d); re-reading", self.group,
                     version)
            return None
        # The transition's event time (as the journal's t_ns): when the write's answer came.
        written_at = at if at is not None else time.time()
        # What the watch will deliver in a moment, kept now: the next check must not
        # decide on the state this write replaced.
        self._kept[state_path(self.group)] = (encode_state(decision.target), version + 1)
        self.memory = decision.memory
        self.c.metrics.set_state(
            self.group, decision.target,
            entered_at=written_at if decision.target.mode is not state.mode else None)
        self.c.metrics.transitions.labels(self.group, decision.target.mode.name).inc()
        if state.mode is Mode.FENCING and decision.target.mode is Mode.SLAVE_CONSUME:
            self.c.metrics.failovers.labels(self.group).inc()
        self.c.on_transition(self.group, state, decision.target)
        if found is not None and found.failed is not None:
            log.info("group %s: the reads after the write failed (%r); reading again",
                     self.group, found.failed)
            return None
        return found

    async def _create_initial(self) -> None:
        if await self.c.zk.create_state(self.group, initial_state(time.time())):
            log.warning("group %s: created initial state NORMAL/1", self.group)


class TopicExporter:
    """The topic series (docs/cluster.md "Metrics"). Every :data:`TOPIC_REFRESH_S`, when
    this controller leads the cluster's first elected group
    (:func:`~understudy_operator.controller.topicview.exports_topics`), it reads every
    ``/topics`` document and the groups they use and sets the gauges; a topic gone from
    ZooKeeper loses its series, and every topic does when this controller stops exporting
    (it lost that leadership, ZooKeeper failed, or it stopped)."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller
        self.exported: set[str] = set()

    async def run(self) -> None:
        try:
            while True:
                try:
                    counts = await self.read()
                except zkio.ZkError as exc:
                    log.info("topic series: ZooKeeper error %r; dropped until the next read", exc)
                    counts = {}
                except Exception:  # never let a bug end the refresh; it is logged loudly
                    log.exception("topic series: refresh crashed")
                    counts = {}
                self.publish(counts)
                await asyncio.sleep(TOPIC_REFRESH_S)
        finally:
            self.publish({})

    async def read(self) -> dict[str, TopicCounts]:
        """The counts to export: empty unless this controller is the cluster's exporter."""
        zk = self.c.zk
        led = [d.group for d in self.c.drivers if d.is_leader]
        if not await zk.leads_the_cluster(led):
            return {}
        docs = [doc for t in await zk.topics()
                if (doc := (await zk.read_topic(t, warn=_debug))[0]) is not None]
        held = {g: await self._permission(g) for g in sorted({g for d in docs for g in d.groups()})}
        return topic_counts(docs, held)

    async def _permission(self, group: str) -> Permission:
        config = await self.c.zk.read_config(group, warn=_debug)
        if config is None:
            return Permission.NONE
        return group_permission(await self.c.zk.observe_group(
            group, [b.name for b in config.brokers], warn=_debug))

    def publish(self, counts: dict[str, TopicCounts]) -> None:
        for topic, c in counts.items():
            self.c.metrics.set_topic(topic, c)
        for topic in self.exported - counts.keys():
            self.c.metrics.forget_topic(topic)
        self.exported = set(counts)


def _debug(message: str) -> None:
    """Malformed documents are reported by the group drivers and the brokers already."""
    log.debug("%s", message)
