"""The failover state machine: a pure function from (config, state, observation, memory)
to a :class:`Decision`.

Why this module exists: failover is where a broker group either keeps its invariants or
loses them, so the rules live in one place with no I/O and no clock of its own (time comes
in with the observation). The driver does the ZooKeeper writes; the tests and the model
checker call :func:`decide` directly. The rules are DESIGN "Failover":

``NORMAL -> FENCING``
    the master is down and at least one slave is eligible (ZooKeeper-live, configured
    with READ, link to the master down). A *certain* death (process exited) acts at once;
    ambiguous signals (ephemeral node gone, process stopped) must persist for
    ``(detectionChecks - 1) x checkIntervalMs`` -- i.e. be seen by ``detectionChecks``
    consecutive checks.
``FENCING -> SLAVE_CONSUME``
    once the broker being fenced is proven unable to read: it acknowledged NONE at this
    epoch, its process is not running, or its ZooKeeper session is gone. The acting master
    is the eligible slave with the highest replicated offset (ties: lowest ordinal).
``SLAVE_CONSUME -> RECOVERING``
    the master is back, isolated (NONE at this epoch), connected to the acting slave for
    replication, and reports ready.
``RECOVERING -> NORMAL``
    the master reports it persisted the back-synced offsets of this epoch; after
    ``backSyncTimeoutSeconds`` without that, back to ``SLAVE_CONSUME`` (new epoch), retried
    after a back-off.

Exceptions: the acting slave dying during ``SLAVE_CONSUME`` sends the group through
``FENCING`` again (``acting`` then names the slave being fenced) so that a second slave
only reads once the first is proven unable to; the master dying during ``RECOVERING``
hands reads straight back to the acting slave (nobody reads in ``RECOVERING``); a group
whose master and every slave are down stays as it is and is marked *degraded*.

In ``FENCING`` the state's ``acting`` field names the broker being fenced when it is a
slave (the former acting master) and is ``None`` when the master is being fenced.

Every transition increments the epoch. :func:`plan_force` is the pure half of the human
override (``understudy group force-mode``): it refuses anything that could give two
brokers READ or rewind a consumer, with an explanation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.zklayout import BrokerSpec, GroupConfig
from understudy_operator.controller.observe import BrokerView, Observation, ProcessState

#: The phases of ``understudy_failover_phase_seconds``.
PHASES = ("detect", "fence", "switch", "backsync")


@dataclass(frozen=True, slots=True)
class Memory:
    """What the controller remembers between decisions (all times on ``Observation.now``).

    ``epoch``/``entered_at``: the state epoch the timers refer to and when this controller
    first saw (or wrote) it. ``master_suspect_since``/``acting_suspect_since``: start of the
    current run of ambiguous down-signals. ``outage_since``: first sign of the master
    outage being handled (start of the *detect* phase). ``switch_pending_since``: when
    ``SLAVE_CONSUME`` was written and the acting slave has not yet reported READ.
    ``retry_after``: no new back-sync attempt before this time. ``proof_at`` and
    ``proof_versions``: when the broker being fenced was first seen proven unable to read
    in this FENCING epoch, and every slave's status version at that moment (offsets
    compared for the acting choice must come from statuses published after it).
    """

    epoch: int = 0
    entered_at: float | None = None
    master_suspect_since: float | None = None
    acting_suspect_since: float | None = None
    outage_since: float | None = None
    switch_pending_since: float | None = None
    retry_after: float | None = None
    proof_at: float | None = None
    proof_versions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one check.

    ``target``: the state to write (versioned) or ``None`` to stay. ``memory``: the memory
    to keep if the write succeeds (or if there is nothing to write). ``degraded``: the
    master and every slave are down. ``phases``: ``(phase, seconds)`` pairs completed by
    this decision. ``recheck_in``: seconds after which a new check can change the outcome
    without any new event (a detection window or a timeout ending).
    """

    target: GroupState | None
    reason: str
    memory: Memory
    degraded: bool = False
    phases: tuple[tuple[str, float], ...] = ()
    recheck_in: float | None = None


class ForceRefused(ValueError):
    """A human override would break an invariant; the message says which and why."""


def initial_state(wall: float) -> GroupState:
    """The state a controller creates when a group has none."""
    return GroupState(mode=Mode.NORMAL, epoch=1, acting=None, since=wall, reason="initial state")


# ----------------------------------------------------------------------------- signals


def certainly_dead(view: BrokerView) -> bool:
    """A certain death: the process exited. Acts at once."""
    return view.process is ProcessState.EXITED


def suspect(view: BrokerView) -> bool:
    """Any sign (certain or ambiguous) that the broker is down."""
    return view.process in (ProcessState.EXITED, ProcessState.STOPPED) or not view.zk_live


def is_up(view: BrokerView) -> bool:
    """ZooKeeper-live and not known to be exited or stopped."""
    return view.zk_live and view.process in (ProcessState.RUNNING, ProcessState.UNKNOWN)


def cannot_read(view: BrokerView, epoch: int) -> str | None:
    """Why ``view``'s broker is proven unable to read at ``epoch``, or ``None``.

    Proof is one of: the process exited; its ZooKeeper session is gone (a broker's read
    lease is shorter than the session timeout, so its lease has lapsed too); it published
    a status that applied ``epoch`` (or newer) with an effective permission without READ.
    A stopped process is *not* proof: it may resume.
    """
    if view.process is ProcessState.EXITED:
        return "its process exited"
    if not view.zk_live:
        return "its ZooKeeper session is gone"
    st = view.status
    if st is not None and st.epoch_applied >= epoch and not st.effective & Permission.READ:
        return f"it acknowledged {st.effective.label} at epoch {st.epoch_applied}"
    return None


def eligible_slaves(
    config: GroupConfig,
    obs: Observation,
    *,
    need_link_down: bool,
    exclude: frozenset[str] = frozenset(),
) -> list[BrokerSpec]:
    """Slaves that may take reads: up, configured with READ, in the recorded in-sync set
    (when there is one), with a published status and (when ``need_link_down``) reporting
    their link to the master down. When the master's process has certainly exited its link
    is down by definition, whatever a status published a moment before the crash still
    says."""
    master_dead = certainly_dead(obs.view(config.master.name))
    out: list[BrokerSpec] = []
    for spec in config.slaves:
        view = obs.view(spec.name)
        if spec.name in exclude or not is_up(view) or view.status is None:
            continue
        if not spec.permission & Permission.READ:
            continue
        if obs.in_sync is not None and spec.name not in obs.in_sync:
            continue
        if need_link_down and view.status.master_link and not master_dead:
            continue
        out.append(spec)
    return out


def pick_acting(candidates: list[BrokerSpec], obs: Observation) -> BrokerSpec | None:
    """The candidate with the highest replicated offset; ties go to the lowest ordinal."""

    def key(spec: BrokerSpec) -> tuple[int, int]:
        st = obs.view(spec.name).status
        return (st.max_offset if st is not None else -1, -spec.ordinal)

    return max(candidates, key=key, default=None)


def all_down(config: GroupConfig, obs: Observation) -> bool:
    """The master shows a down-signal and no slave is up: DESIGN's *Degraded*."""
    return suspect(obs.view(config.master.name)) and not any(
        is_up(obs.view(s.name)) for s in config.slaves
    )


def master_ready_for_backsync(view: BrokerView, state: GroupState) -> bool:
    """Back, isolated at this epoch, replicating from the acting slave, and ready."""
    st = view.status
    return (
        is_up(view)
        and st is not None
        and st.epoch_applied >= state.epoch
        and not st.effective & Permission.READ
        and st.ready
        and state.acting is not None
        and state.acting in st.slave_links
    )


# ----------------------------------------------------------------------------- decide


def decide(
    config: GroupConfig, state: GroupState, obs: Observation, memory: Memory
) -> Decision:
    """One check of one group. Pure: same inputs, same decision."""
    now = obs.now
    mem = memory
    if mem.epoch != state.epoch:
        # A state this controller did not write (another controller, a human override, or a
        # fresh start): its timers start now.
        mem = replace(
            mem,
            epoch=state.epoch,
            entered_at=now,
            acting_suspect_since=None,
            switch_pending_since=None,
            proof_at=None,
            proof_versions=(),
        )
    master_view = obs.view(config.master.name)
    mem = replace(mem, master_suspect_since=_since(mem.master_suspect_since, suspect(master_view), now))
    if state.acting is not None:
        acting_sus = suspect(obs.view(state.acting))
        mem = replace(mem, acting_suspect_since=_since(mem.acting_suspect_since, acting_sus, now))
    if mem.outage_since is None and state.mode is Mode.NORMAL and suspect(master_view):
        mem = replace(mem, outage_since=now)
    degraded = all_down(config, obs)
    if not config.failover.enabled:
        return Decision(None, "failover disabled in the group config", mem, degraded)
    ctx = _Ctx(config=config, state=state, obs=obs, mem=mem, degraded=degraded)
    if state.mode is Mode.NORMAL:
        return ctx.normal()
    if state.mode is Mode.FENCING:
        return ctx.fencing()
    if state.mode is Mode.SLAVE_CONSUME:
        return ctx.slave_consume()
    return ctx.recovering()


def _since(previous: float | None, active: bool, now: float) -> float | None:
    if not active:
        return None
    return now if previous is None else previous


@dataclass(frozen=True, slots=True)
class _Ctx:
    config: GroupConfig
    state: GroupState
    obs: Observation
    mem: Memory
    degraded: bool

    @property
    def window(self) -> float:
        fo = self.config.failover
        return max(0, fo.detection_checks - 1) * fo.check_interval_ms / 1000.0

    def confirmed_down(self, name: str, since: float | None) -> tuple[bool, float | None]:
        """(down, recheck_in): certain death at once, ambiguous signals after the window."""
        view = self.obs.view(name)
        if certainly_dead(view):
            return True, None
        if since is None:
            return False, None
        left = since + self.window - self.obs.now
        if left <= 0:
            return True, None
        return False, left

    def stay(self, reason: str, *, recheck_in: float | None = None,
             phases: tuple[tuple[str, float], ...] = (), mem: Memory | None = None) -> Decision:
        return Decision(None, reason, mem or self.mem, self.degraded, phases, recheck_in)

    def move(self, mode: Mode, *, acting: str | None, reason: str, mem: Memory,
             phases: tuple[tuple[str, float], ...] = ()) -> Decision:
        target = GroupState(
            mode=mode, epoch=self.state.epoch + 1, acting=acting, since=self.obs.wall, reason=reason
        )
        mem = replace(mem, epoch=target.epoch, entered_at=self.obs.now, acting_suspect_since=None,
                      proof_at=None, proof_versions=())
        return Decision(target, reason, mem, self.degraded, phases)

    def _down_words(self, name: str) -> str:
        view = self.obs.view(name)
        if certainly_dead(view):
            return "process exited"
        words = []
        if view.process is ProcessState.STOPPED:
            words.append("process stopped")
        if not view.zk_live:
            words.append("ZooKeeper node gone")
        return " and ".join(words) or "down"

    # -- NORMAL
    def normal(self) -> Decision:
        master = self.config.master.name
        down, recheck = self.confirmed_down(master, self.mem.master_suspect_since)
        if not down:
            if recheck is not None:
                return self.stay(f"master {master} suspect, confirming", recheck_in=recheck)
            mem = replace(self.mem, outage_since=None)
            return self.stay("master healthy", mem=mem)
        candidates = eligible_slaves(self.config, self.obs, need_link_down=True)
        if not candidates:
            why = "master down; group degraded (every slave down)" if self.degraded else (
                "master down but no eligible slave (ZooKeeper-live, READ, link to master down)"
            )
            return self.stay(why)
        detect = self.obs.now - self.mem.outage_since if self.mem.outage_since is not None else None
        reason = (
            f"master {master} down ({self._down_words(master)}); fencing it before "
            f"{', '.join(c.name for c in candidates)} may take reads"
        )
        return self.move(
            Mode.FENCING,
            acting=None,
            reason=reason,
            mem=self.mem,
            phases=(("detect", detect),) if detect is not None else (),
        )

    # -- FENCING
    def fencing(self) -> Decision:
        master = self.config.master.name
        target = self.state.acting or master
        target_view = self.obs.view(target)
        proof = cannot_read(target_view, self.state.epoch)
        if proof is None:
            return self.stay(f"waiting for proof that {target} cannot read at epoch {self.state.epoch}",
                             mem=replace(self.mem, proof_at=None, proof_versions=()))
        mem = self.mem
        if mem.proof_at is None:
            versions = tuple((s.name, self.obs.view(s.name).status_version) for s in self.config.slaves)
            mem = replace(mem, proof_at=self.obs.now, proof_versions=versions)
        candidates = eligible_slaves(
            self.config, self.obs, need_link_down=target == master, exclude=frozenset({target})
        )
        # With a recorded in-sync set every candidate holds every acknowledged commit (the
        # set was read after the proof, so it can no longer shrink), and offsets only rank
        # them. Without one, offsets decide safety, so they are compared only from statuses
        # published after the fenced broker stopped committing: after its certain death,
        # any status at this epoch; otherwise a status published after the proof was first
        # seen. A slave that does not publish within a session timeout is left out rather
        # than stalling the failover. A single candidate needs no comparison: fresh offsets
        # could not change who is picked, and the proof alone keeps one reader (this saves
        # the candidate's republish after a hung master's session expires).
        certain = certainly_dead(target_view)
        fresh = candidates if self.obs.in_sync is not None or len(candidates) == 1 else [
            c for c in candidates if self._fresh(c, mem, certain=certain)]
        proof_at = mem.proof_at if mem.proof_at is not None else self.obs.now
        grace = self.config.session_timeout_ms / 1000.0
        waited = self.obs.now - proof_at
        if len(fresh) < len(candidates) and not (fresh and waited >= grace):
            stale = ", ".join(c.name for c in candidates if c not in fresh)
            return self.stay(f"{target} fenced ({proof}); waiting for fresh offsets from {stale}",
                             recheck_in=max(0.0, grace - waited) if fresh else None, mem=mem)
        best = pick_acting(fresh, self.obs)
        fence = self._phase("fence")
        if best is not None:
            st = self.obs.view(best.name).status
            offset = st.max_offset if st is not None else 0
            reason = f"{target} fenced ({proof}); {best.name} acts for reads (offset {offset})"
            mem = replace(mem, switch_pending_since=self.obs.now)
            return self.move(Mode.SLAVE_CONSUME, acting=best.name, reason=reason, mem=mem, phases=fence)
        master_view = self.obs.view(master)
        if target == master and is_up(master_view) and not suspect(master_view):
            reason = f"master {master} back ({proof}) before any slave took reads"
            mem = replace(mem, outage_since=None)
            return self.move(Mode.NORMAL, acting=None, reason=reason, mem=mem)
        return self.stay(f"{target} fenced ({proof}) but no eligible slave to act for reads", mem=mem)

    def _fresh(self, spec: BrokerSpec, mem: Memory, *, certain: bool) -> bool:
        view = self.obs.view(spec.name)
        if view.status is None:
            return False
        if certain:
            return view.status.epoch_applied >= self.state.epoch
        return view.status_version > dict(mem.proof_versions).get(spec.name, -1)

    # -- SLAVE_CONSUME
    def slave_consume(self) -> Decision:
        acting = self.state.acting
        if acting is None:  # a malformed override; fence whoever might read and start over
            return self.move(Mode.FENCING, acting=None, mem=self.mem,
                             reason="SLAVE_CONSUME without an acting slave; re-fencing")
        acting_view = self.obs.view(acting)
        down, recheck = self.confirmed_down(acting, self.mem.acting_suspect_since)
        if down:
            others = eligible_slaves(
                self.config, self.obs, need_link_down=False, exclude=frozenset({acting})
            )
            if others:
                reason = (
                    f"acting slave {acting} down ({self._down_words(acting)}); fencing it before "
                    f"{', '.join(o.name for o in others)} may take reads"
                )
                return self.move(Mode.FENCING, acting=acting, reason=reason, mem=self.mem)
            why = "group degraded: master and every slave down" if self.degraded else (
                f"acting slave {acting} down and no other eligible slave"
            )
            return self.stay(why)
        phases: tuple[tuple[str, float], ...] = ()
        mem = self.mem
        st = acting_view.status
        if (
            mem.switch_pending_since is not None
            and st is not None
            and st.epoch_applied >= self.state.epoch
            and st.effective & Permission.READ
        ):
            phases = (("switch", self.obs.now - mem.switch_pending_since),)
            mem = replace(mem, switch_pending_since=None)
        master_view = self.obs.view(self.config.master.name)
        if master_ready_for_backsync(master_view, self.state) and is_up(acting_view):
            if mem.retry_after is not None and self.obs.now < mem.retry_after:
                return self.stay("master ready; back-sync retry backing off",
                                 recheck_in=mem.retry_after - self.obs.now, phases=phases, mem=mem)
            reason = f"master back and ready; {acting} drops reads and back-syncs its offsets"
            return self.move(Mode.RECOVERING, acting=acting, reason=reason,
                             mem=replace(mem, retry_after=None), phases=phases)
        return self.stay(f"{acting} acts for reads", recheck_in=recheck, phases=phases, mem=mem)

    # -- RECOVERING
    def recovering(self) -> Decision:
        acting = self.state.acting
        master = self.config.master.name
        master_view = self.obs.view(master)
        st = master_view.status
        down, recheck = self.confirmed_down(master, self.mem.master_suspect_since)
        if not down and st is not None and st.backsync_epoch is not None \
                and st.backsync_epoch >= self.state.epoch:
            reason = f"master {master} persisted back-synced offsets of epoch {st.backsync_epoch}"
            mem = replace(self.mem, outage_since=None)
            return self.move(Mode.NORMAL, acting=None, reason=reason, mem=mem,
                             phases=self._phase("backsync"))
        if acting is None:
            return self.stay("RECOVERING without an acting slave; waiting for an override")
        if down:
            if is_up(self.obs.view(acting)):
                reason = f"master {master} lost during back-sync; {acting} resumes reads"
                return self.move(Mode.SLAVE_CONSUME, acting=acting, reason=reason, mem=self.mem)
            return self.stay("master and acting slave down during back-sync")
        entered = self.mem.entered_at if self.mem.entered_at is not None else self.obs.now
        timeout = self.config.failover.backsync_timeout_s
        left = entered + timeout - self.obs.now
        if left <= 0:
            backoff = min(timeout, 5.0)
            reason = (
                f"back-sync not persisted within {timeout:g}s; {acting} resumes reads, "
                f"retry in {backoff:g}s"
            )
            mem = replace(self.mem, retry_after=self.obs.now + backoff)
            return self.move(Mode.SLAVE_CONSUME, acting=acting, reason=reason, mem=mem)
        candidates = [x for x in (left, recheck) if x is not None]
        return self.stay("waiting for the master to persist back-synced offsets",
                         recheck_in=min(candidates))

    def _phase(self, name: str) -> tuple[tuple[str, float], ...]:
        if self.mem.entered_at is None:
            return ()
        return ((name, self.obs.now - self.mem.entered_at),)


# ----------------------------------------------------------------------------- override


def potential_reader(config: GroupConfig, state: GroupState) -> str | None:
    """The broker that may hold READ (or still be dropping it) under ``state``."""
    if state.mode is Mode.NORMAL:
        return config.master.name
    if state.mode is Mode.FENCING:
        return state.acting or config.master.name
    return state.acting


def plan_force(
    config: GroupConfig,
    state: GroupState,
    obs: Observation,
    *,
    mode: Mode,
    acting: str | None = None,
    reason: str = "",
    accept_rewind: bool = False,
) -> GroupState:
    """The state a human override would write, or :class:`ForceRefused` explaining why not.

    Never allowed, even with ``accept_rewind``: anything that could give two brokers READ
    (the broker that may read now must be proven unable first), naming a broker that is
    not a live slave configured with READ as acting, and an ``acting`` that the mode does
    not use. ``accept_rewind`` only waives the consumer-offset checks (NORMAL before the
    master persisted back-sync; an acting slave behind another slave).
    """
    names = {b.name for b in config.brokers}
    if acting is not None and acting not in names:
        raise ForceRefused(f"group {config.group!r} has no broker {acting!r}")
    master = config.master.name
    current = potential_reader(config, state)
    new_reader: str | None = None
    next_acting: str | None = None
    if mode is Mode.NORMAL:
        if acting is not None:
            raise ForceRefused("NORMAL takes no --acting: the master reads in NORMAL")
        mview = obs.view(master)
        if not is_up(mview):
            raise ForceRefused(f"master {master} is not live; NORMAL would leave the group unreadable")
        came_from_master = state.mode is Mode.NORMAL or (
            state.mode is Mode.FENCING and state.acting is None
        )
        bse = mview.status.backsync_epoch if mview.status is not None else None
        synced = bse is not None and bse >= state.epoch
        if not (came_from_master or synced or accept_rewind):
            raise ForceRefused(
                f"master {master} has not persisted back-synced offsets for epoch {state.epoch} "
                f"(backSyncEpoch={bse}); NORMAL now would rewind consumers that committed on "
                f"{state.acting or 'the acting slave'}. Let RECOVERING finish, or pass "
                "--accept-rewind if that slave's offsets are lost for good"
            )
        new_reader = master
    elif mode is Mode.SLAVE_CONSUME:
        if acting is None:
            raise ForceRefused("SLAVE_CONSUME needs --acting SLAVE")
        spec = config.broker(acting)
        view = obs.view(acting)
        if spec.ordinal == 0:
            raise ForceRefused(f"{acting} is the master; SLAVE_CONSUME names a slave")
        if not spec.permission & Permission.READ:
            raise ForceRefused(f"{acting} is configured {spec.permission.label}, without READ")
        if not is_up(view):
            raise ForceRefused(
                f"{acting} is not a live eligible slave (ZooKeeper node "
                f"{'present' if view.zk_live else 'absent'}, process {view.process.value})"
            )
        if not accept_rewind:
            if obs.in_sync is not None and acting not in obs.in_sync:
                raise ForceRefused(
                    f"{acting} is not in the in-sync set {sorted(obs.in_sync)}: it may miss "
                    "acknowledged commits. Name an in-sync slave, or pass --accept-rewind"
                )
            mine = view.status.max_offset if view.status is not None else -1
            for other in eligible_slaves(config, obs, need_link_down=False, exclude=frozenset({acting})):
                ost = obs.view(other.name).status
                if ost is not None and ost.max_offset > mine:
                    raise ForceRefused(
                        f"{acting} is behind {other.name} (replicated offset {mine} < "
                        f"{ost.max_offset}); naming it could rewind consumers. Name "
                        f"{other.name}, or pass --accept-rewind"
                    )
        new_reader = next_acting = acting
    elif mode is Mode.FENCING:
        if acting is not None and acting != state.acting:
            raise ForceRefused(
                "FENCING fences whoever may read now; it takes no --acting of your choosing"
            )
        next_acting = current if current != master else None
    else:  # RECOVERING
        if state.mode not in (Mode.SLAVE_CONSUME, Mode.RECOVERING) or state.acting is None:
            raise ForceRefused(
                "RECOVERING back-syncs from the slave that was acting; the group is in "
                f"{state.mode.name} with no acting slave"
            )
        if acting is not None and acting != state.acting:
            raise ForceRefused(
                f"back-sync must come from {state.acting}, the slave that was reading, not {acting}"
            )
        next_acting = state.acting
    if current is not None and current != new_reader:
        proof = cannot_read(obs.view(current), state.epoch)
        if proof is None and mode is not Mode.FENCING and mode is not Mode.RECOVERING:
            raise ForceRefused(
                f"{current} may still hold READ at epoch {state.epoch} (not proven unable: it is "
                f"neither exited, nor without a ZooKeeper session, nor acknowledged NONE); "
                f"{mode.name} now could give two brokers READ. Force FENCING first"
            )
    text = f"forced {mode.name}" + (f": {reason}" if reason else "")
    return GroupState(mode=mode, epoch=state.epoch + 1, acting=next_acting, since=obs.wall, reason=text)
