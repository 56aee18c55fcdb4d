"""Pure computation of a BrokerGroup's ``status`` subresource, in Strimzi's shape.

Why this module exists: ``kubectl get bg`` and ``kubectl describe bg`` are how people see a
failover. What the status says must follow from the facts (ZooKeeper ``state`` and per-broker
``status``, pod readiness, replication lag) by one testable function, not be assembled ad hoc
inside a handler. The caller gathers the facts and passes ``now``; nothing here reads a clock
or talks to a server.

Conditions (each ``type``/``status``/``reason``/``message``/``lastTransitionTime``; a
condition's ``lastTransitionTime`` changes only when its ``status`` does):

``Ready``               spec valid, mode NORMAL, every broker ready, the group readable.
``ReadAvailable``       some broker's effective permission has READ.
``Writable``            the master's effective permission has WRITE.
``FailoverInProgress``  mode is not NORMAL.
``BackSyncComplete``    False from the moment the master lost reads until it has persisted the
                        acting slave's consumer offsets (the group is NORMAL again).
``Degraded``            two readers at once, every broker down, or some broker down/not ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from understudy_broker.model import GroupState, Mode, Permission, Role

CONDITION_TYPES: Final = (
    "Ready",
    "ReadAvailable",
    "Writable",
    "FailoverInProgress",
    "BackSyncComplete",
    "Degraded",
)

_MODE_REASON: Final = {
    Mode.NORMAL: "Normal",
    Mode.FENCING: "Fencing",
    Mode.SLAVE_CONSUME: "SlaveConsume",
    Mode.RECOVERING: "Recovering",
}


@dataclass(frozen=True, slots=True)
class BrokerObservation:
    """What the operator knows about one broker.

    ``effective`` comes from the broker's ZooKeeper ``status`` node (None when the node is
    missing); ``live`` is its ephemeral ``live`` node; ``ready`` is the pod's Ready condition.
    """

    name: str
    ordinal: int
    configured: Permission
    effective: Permission | None = None
    live: bool = False
    ready: bool = False
    replication_lag_bytes: int | None = None

    @property
    def role(self) -> Role:
        return Role.MASTER if self.ordinal == 0 else Role.SLAVE

    @property
    def reads(self) -> bool:
        return self.effective is not None and bool(self.effective & Permission.READ)


@dataclass(frozen=True, slots=True)
class FailoverTimes:
    """The last failover's milestones (as in the SLA report), from the controller."""

    master_down: datetime | None = None
    reads_restored: datetime | None = None
    master_back: datetime | None = None
    normal_again: datetime | None = None


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def rfc3339(moment: datetime) -> str:
    """``2026-11-20T23:59:00Z``: the format of Kubernetes ``metav1.Time``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def compute_conditions(
    *,
    state: GroupState | None,
    brokers: Sequence[BrokerObservation],
    spec_error: str | None = None,
) -> list[Condition]:
    """The six conditions from the facts, without timestamps (see the module docstring)."""
    readers = [b for b in brokers if b.reads]
    master = next((b for b in brokers if b.ordinal == 0), None)
    not_ready = [b.name for b in brokers if not b.ready]
    down = [b.name for b in brokers if not b.live]

    if not brokers or all(b.effective is None for b in brokers):
        read_avail = Condition("ReadAvailable", False, "Unknown", "no broker has reported status")
    elif not readers:
        read_avail = Condition("ReadAvailable", False, "NoReader", "no broker holds READ")
    else:
        who = "MasterReading" if readers[0].role is Role.MASTER else "ActingSlaveReading"
        read_avail = Condition(
            "ReadAvailable", True, who, f"{', '.join(b.name for b in readers)} serves reads"
        )

    if master is not None and master.effective is not None and master.effective & Permission.WRITE:
        writable = Condition("Writable", True, "MasterWritable", f"{master.name} accepts produce")
    else:
        name = master.name if master is not None else "the master"
        writable = Condition("Writable", False, "MasterNotWritable", f"{name} lacks WRITE")

    if state is None:
        failover = Condition("FailoverInProgress", False, "Unknown", "no group state in ZooKeeper")
        backsync = Condition("BackSyncComplete", False, "Unknown", "no group state in ZooKeeper")
    else:
        note = f" ({state.reason})" if state.reason else ""
        reason = _MODE_REASON[state.mode]
        failover = Condition(
            "FailoverInProgress",
            state.mode is not Mode.NORMAL,
            reason,
            f"mode {state.mode.name} at epoch {state.epoch}{note}",
        )
        if state.mode is Mode.NORMAL:
            backsync = Condition(
                "BackSyncComplete", True, "Normal", "the master owns reads and consumer offsets"
            )
        elif state.mode is Mode.RECOVERING:
            backsync = Condition(
                "BackSyncComplete",
                False,
                "BackSyncRunning",
                f"{state.acting or 'the acting slave'} is pushing consumer offsets to the master"
                f"{note}",
            )
        else:
            backsync = Condition(
                "BackSyncComplete",
                False,
                "WaitingForMaster",
                f"consumer offsets are moving on {state.acting or 'a slave'}; back-sync starts "
                f"when the master is back{note}",
            )

    if len(readers) > 1:
        degraded = Condition(
            "Degraded",
            True,
            "OneReaderViolation",
            f"{', '.join(b.name for b in readers)} all report READ",
        )
    elif brokers and len(down) == len(brokers):
        degraded = Condition(
            "Degraded",
            True,
            "AllBrokersDown",
            "every broker is down; resolve with an explicit override (see docs/kubernetes.md)",
        )
    elif down or not_ready:
        names = sorted(set(down) | set(not_ready))
        degraded = Condition(
            "Degraded", True, "BrokersNotReady", f"not live or not ready: {', '.join(names)}"
        )
    else:
        degraded = Condition("Degraded", False, "AllBrokersReady", "every broker is live and ready")

    if spec_error is not None:
        ready = Condition("Ready", False, "InvalidSpec", spec_error)
    elif state is None:
        ready = Condition("Ready", False, "NoGroupState", "waiting for the group state in ZooKeeper")
    elif state.mode is not Mode.NORMAL:
        ready = Condition("Ready", False, "FailoverInProgress", failover.message)
    elif not read_avail.status:
        ready = Condition("Ready", False, read_avail.reason, read_avail.message)
    elif not_ready:
        ready = Condition("Ready", False, "BrokersNotReady", f"not ready: {', '.join(not_ready)}")
    else:
        ready = Condition("Ready", True, "Ready", f"{len(brokers)} brokers ready, mode NORMAL")
    return [ready, read_avail, writable, failover, backsync, degraded]


def merge_conditions(
    *,
    previous: Sequence[Mapping[str, Any]],
    current: Sequence[Condition],
    now: datetime,
) -> list[dict[str, Any]]:
    """Render ``current`` as status conditions, keeping a condition's previous
    ``lastTransitionTime`` when its status did not change."""
    before = {c.get("type"): c for c in previous if isinstance(c, Mapping)}
    stamp = rfc3339(now)
    rendered = []
    for cond in current:
        status = "True" if cond.status else "False"
        old = before.get(cond.type)
        since = stamp
        if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
        rendered.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": since,
            }
        )
    return rendered


def compute_status(
    *,
    generation: int,
    state: GroupState | None,
    brokers: Sequence[BrokerObservation],
    previous: Mapping[str, Any] | None,
    now: datetime,
    last_failover: FailoverTimes | None = None,
    spec_error: str | None = None,
) -> dict[str, Any]:
    """The whole ``status`` object. Keys that may become empty are emitted as ``None`` so a
    JSON merge patch removes a stale value (an old ``acting`` must not linger)."""
    previous = previous or {}
    prev_conditions = previous.get("conditions")
    conditions = merge_conditions(
        previous=prev_conditions if isinstance(prev_conditions, list) else [],
        current=compute_conditions(state=state, brokers=brokers, spec_error=spec_error),
        now=now,
    )
    ordered = sorted(brokers, key=lambda b: b.ordinal)
    master = next((b.name for b in ordered if b.ordinal == 0), None)
    acting = state.acting if state is not None and state.mode is not Mode.NORMAL else None
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "mode": state.mode.name if state is not None else None,
        "epoch": state.epoch if state is not None else None,
        "master": master,
        "acting": acting,
        "readable": any(b.reads for b in ordered),
        "readyBrokers": f"{sum(b.ready for b in ordered)}/{len(ordered)}",
        "brokers": [
            {
                "name": b.name,
                "ordinal": b.ordinal,
                "role": b.role.value,
                "configuredPermission": b.configured.label,
                "effectivePermission": b.effective.label if b.effective is not None else None,
                "live": b.live,
                "ready": b.ready,
                "replicationLagBytes": b.replication_lag_bytes,
            }
            for b in ordered
        ],
        "lastFailover": None,
    }
    if last_failover is not None:
        status["lastFailover"] = {
            "masterDown": _maybe_time(last_failover.master_down),
            "readsRestored": _maybe_time(last_failover.reads_restored),
            "masterBack": _maybe_time(last_failover.master_back),
            "normalAgain": _maybe_time(last_failover.normal_again),
        }
    return status


def _maybe_time(moment: datetime | None) -> str | None:
    return rfc3339(moment) if moment is not None else None
