"""Plain observations the failover state machine decides on.

Why this module exists: the state machine must be a pure function, testable without
ZooKeeper, processes or clocks. Everything the driver learns from the outside world — the
ephemeral ``live`` nodes, the brokers' published ``status`` documents, what the liveness
source says about each broker's process — is copied into these frozen dataclasses first,
and the machine only ever sees them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from understudy_broker.zklayout import BrokerStatus


class ProcessState(enum.Enum):
    """What a liveness source says about a broker's process (or container).

    ``EXITED`` is a *certain* death: the process is gone and cannot serve anything, so the
    controller acts on it at once. ``STOPPED`` (SIGSTOP, a frozen container) is
    *ambiguous*: the process may resume with a stale view, which is what read leases are
    for. ``UNKNOWN`` means the source has no evidence either way (no pid file, no pod
    status yet); decisions then rest on ZooKeeper alone.
    """

    RUNNING = "running"
    STOPPED = "stopped"
    EXITED = "exited"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class BrokerView:
    """One broker as the controller sees it right now.

    ``zk_live``: its ephemeral ``live/<broker>`` node exists (a ZooKeeper session holds it).
    ``status``: its last published ``status/<broker>`` document, or ``None``.
    ``status_version``: the znode version of that document (-1 when absent); it grows with
    every publish, so the controller can tell a status published *after* a moment it
    remembers from one published before.
    """

    name: str
    zk_live: bool = False
    process: ProcessState = ProcessState.UNKNOWN
    status: BrokerStatus | None = None
    status_version: int = -1


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything one decision looks at.

    ``now`` is a monotonic clock reading in seconds (timers and detection windows use it);
    ``wall`` is wall-clock seconds since the epoch (only written into ``state.since``).
    A broker missing from ``brokers`` is treated as not live with an unknown process.
    ``in_sync``: the slaves the replication layer recorded as holding every acknowledged
    commit (``/groups/<group>/isr``), or ``None`` when no such record exists (then every
    slave counts as in sync, which is only safe with a single slave).
    """

    now: float
    wall: float
    brokers: Mapping[str, BrokerView] = field(default_factory=dict)
    in_sync: frozenset[str] | None = None

    def view(self, name: str) -> BrokerView:
        return self.brokers.get(name) or BrokerView(name=name)
