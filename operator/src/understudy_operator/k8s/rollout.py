"""The rollout and scaling planner: pure decisions about which broker pod may restart next.

Why this module exists: the StatefulSet uses ``updateStrategy: OnDelete``, so Kubernetes never
restarts a broker on its own; the operator does, one pod at a time, in the order that keeps the
group readable and loses nothing. That order is a decision over plain facts (pod revisions and
readiness, the group's ZooKeeper state, each broker's published status), so it lives here as a
pure function and is unit-tested without a cluster; ``handlers.rollout`` only applies the step.

The rules (:func:`plan_rollout`), checked in this order:

1. Nothing happens while the group is not ``NORMAL`` — a failover or a handoff is in progress —
   or while any broker of the group is not back: pod missing, terminating or not Ready, broker
   not live in ZooKeeper, or not yet at the current epoch.
2. Nothing happens while any slave lags the master by more than ``max_lag_bytes`` (replicated
   offsets from the brokers' ZooKeeper status): a restarted slave must be *in sync* before the
   next pod goes.
3. Outdated slaves restart first, highest ordinal first, one per step.
4. The master restarts last, through a *planned handoff*: fence it in ZooKeeper and hand reads
   to the in-sync slave with the highest offset, so consumers keep reading while it restarts;
   its return is an ordinary back-sync (RECOVERING, then NORMAL). A group with no slave able to
   read restarts its master plainly (reads pause while it restarts; the step says so).

Scaling (:func:`plan_scale`) never removes the slave that is acting for reads, and never
scales while a failover is in progress.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from understudy_broker.model import GroupState, Mode, Permission

#: Default in-sync threshold: a slave within this many bytes of the master counts as caught up.
DEFAULT_MAX_LAG_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class PodFacts:
    """One broker pod as the API shows it. ``revision`` is its ``controller-revision-hash``."""

    name: str
    ordinal: int
    revision: str | None
    ready: bool
    terminating: bool = False
    uid: str | None = None


@dataclass(frozen=True, slots=True)
class BrokerFacts:
    """One broker as ZooKeeper shows it (``live`` node and ``status`` document)."""

    name: str
    ordinal: int
    configured: Permission
    live: bool
    epoch_applied: int = 0
    max_offset: int = 0
    has_status: bool = False


@dataclass(frozen=True, slots=True)
class RolloutFacts:
    """Everything one rollout decision looks at."""

    replicas: int
    update_revision: str | None
    pods: Sequence[PodFacts]
    brokers: Mapping[str, BrokerFacts]
    state: GroupState | None
    max_lag_bytes: int = DEFAULT_MAX_LAG_BYTES
    in_sync: frozenset[str] | None = None
    """The replication layer's recorded in-sync set (``/groups/<g>/isr``); ``None``: no record."""


@dataclass(frozen=True, slots=True)
class Step:
    """One rollout step.

    ``kind``: ``done`` (every pod at the update revision), ``wait`` (nothing may move now),
    ``restart-slave`` (delete ``pod``), ``handoff`` (fence the master, hand reads to
    ``acting``, delete ``pod``), ``restart-master`` (delete ``pod`` without a handoff).
    """

    kind: str
    reason: str
    pod: str | None = None
    uid: str | None = None
    acting: str | None = None
    outdated: tuple[str, ...] = field(default=())


def outdated_pods(facts: RolloutFacts) -> list[PodFacts]:
    """Pods of the group (ordinals below ``replicas``) not at the update revision."""
    return sorted(
        (p for p in facts.pods
         if p.ordinal < facts.replicas and p.revision != facts.update_revision),
        key=lambda p: p.ordinal,
    )


def lag_bytes(facts: RolloutFacts, name: str) -> int | None:
    """How far ``name`` trails the master's offset (``None`` when either status is missing)."""
    master = next((b for b in facts.brokers.values() if b.ordinal == 0), None)
    me = facts.brokers.get(name)
    if master is None or me is None or not master.has_status or not me.has_status:
        return None
    return max(0, master.max_offset - me.max_offset)


def handoff_target(facts: RolloutFacts) -> BrokerFacts | None:
    """The slave that takes reads during a planned handoff: live, configured with READ, in
    sync (within ``max_lag_bytes`` and, when recorded, in the in-sync set — the controller
    trusts no other slave to hold every acknowledged write); the highest offset wins, ties go
    to the lowest ordinal."""
    candidates = []
    for b in facts.brokers.values():
        if b.ordinal == 0 or b.ordinal >= facts.replicas or not b.live or not b.has_status:
            continue
        if facts.in_sync is not None and b.name not in facts.in_sync:
            continue
        if not b.configured & Permission.READ:
            continue
        lag = lag_bytes(facts, b.name)
        if lag is None or lag > facts.max_lag_bytes:
            continue
        candidates.append(b)
    return max(candidates, key=lambda b: (b.max_offset, -b.ordinal), default=None)


def plan_rollout(facts: RolloutFacts) -> Step:
    """The next rollout step (see the module docstring for the rules)."""
    if facts.update_revision is None:
        return Step("wait", "the StatefulSet has no update revision yet")
    outdated = outdated_pods(facts)
    names = tuple(p.name for p in outdated)
    if not outdated:
        return Step("done", "every broker runs the current revision")
    state = facts.state
    if state is None:
        return Step("wait", "the group has no state in ZooKeeper yet", outdated=names)
    if state.mode is not Mode.NORMAL:
        return Step("wait", f"group is {state.mode.name} at epoch {state.epoch}; the rollout "
                    "resumes when it is NORMAL", outdated=names)
    by_ordinal = {p.ordinal: p for p in facts.pods}
    for ordinal in range(facts.replicas):
        pod = by_ordinal.get(ordinal)
        if pod is None:
            return Step("wait", f"broker pod with ordinal {ordinal} does not exist yet",
                        outdated=names)
        if pod.terminating:
            return Step("wait", f"{pod.name} is terminating", outdated=names)
        if not pod.ready:
            return Step("wait", f"{pod.name} is not ready", outdated=names)
        broker = facts.brokers.get(pod.name)
        if broker is None or not broker.live:
            return Step("wait", f"{pod.name} is not live in ZooKeeper", outdated=names)
        if not broker.has_status or broker.epoch_applied < state.epoch:
            return Step("wait", f"{pod.name} has not applied epoch {state.epoch}", outdated=names)
        if ordinal != 0:
            lag = lag_bytes(facts, pod.name)
            if lag is None:
                return Step("wait", f"{pod.name}: replication offsets unknown", outdated=names)
            if lag > facts.max_lag_bytes:
                return Step("wait", f"{pod.name} lags the master by {lag} bytes "
                            f"(in sync at <= {facts.max_lag_bytes})", outdated=names)
    slaves = [p for p in outdated if p.ordinal != 0]
    if slaves:
        pod = slaves[-1]
        return Step("restart-slave", f"restarting slave {pod.name} (slaves first; "
                    f"{len(outdated)} outdated)", pod=pod.name, uid=pod.uid, outdated=names)
    master = outdated[0]
    target = handoff_target(facts)
    if target is None:
        return Step("restart-master", f"restarting master {master.name} without a handoff: no "
                    "in-sync slave configured with READ; reads pause until it is back",
                    pod=master.name, uid=master.uid, outdated=names)
    return Step("handoff", f"planned handoff: {target.name} serves reads while master "
                f"{master.name} restarts", pod=master.name, uid=master.uid,
                acting=target.name, outdated=names)


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """Whether the group may go from ``current`` to ``desired`` brokers now."""

    allowed: bool
    reason: str


def plan_scale(*, current: int | None, desired: int, state: GroupState | None,
               broker_name_of: Mapping[int, str] | None = None) -> ScaleDecision:
    """Scaling slaves up is always allowed (new slaves catch up before they may act).
    Scaling down removes the highest ordinals; it waits while the group is not NORMAL if one
    of the removed brokers is acting for reads or being fenced, so the acting slave is never
    removed while it reads."""
    if current is None or desired >= current:
        return ScaleDecision(True, "no broker is removed")
    removed = set(range(desired, current))
    names = dict(broker_name_of or {})
    if state is not None and state.mode is not Mode.NORMAL and state.acting is not None:
        acting_ordinal = next((o for o, n in names.items() if n == state.acting), None)
        if acting_ordinal is None or acting_ordinal in removed:
            return ScaleDecision(False, f"{state.acting} acts for reads ({state.mode.name}); "
                                 "scaling down waits until the group is NORMAL")
    return ScaleDecision(True, f"removing ordinals {sorted(removed)}")
