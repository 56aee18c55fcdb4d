"""The ZooKeeper layout and the JSON documents stored in it.

Why this module exists: brokers, the failover controller, the local cluster and the
Kubernetes operator all read and write the same znodes. This module is the single
definition of the paths and of the documents' shapes (DESIGN "ZooKeeper layout"), pure
and without kazoo, so every party encodes and validates them identically and a malformed
document is a clear :class:`LayoutError`, never a crash.

Paths are relative to the chroot (default ``/understudy``); the chroot is part of the
connect string (``host:port/understudy``)::

    /groups/<group>/config            GroupConfig          (written by operator / local up)
    /groups/<group>/state             GroupState           (controller, versioned writes only)
    /groups/<group>/live/<broker>     ephemeral, one per running broker (data: pid, address)
    /groups/<group>/status/<broker>   BrokerStatus         (each broker, ~1 s)
    /groups/<group>/route/<broker>    BrokerRouteDoc       (each broker, only when it changes)
    /controllers/<group>              controller election
    /topics/<topic>                   TopicDoc             (operator / `understudy topic`, versioned)
    /consumers/<cg>/members/<member>  MemberDoc, ephemeral (the broker hosting the member)
    /consumers/<cg>/assignment        AssignmentDoc        (brokers, versioned writes only)
    /acl/users/<user>                 acl.UserDoc          (SCRAM salts and keys, never a password)
    /acl/rules/<user>                 acl.RulesDoc         (what the user may do)
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from understudy_broker.model import (
    GroupState,
    Mode,
    Permission,
    Role,
    TopicNameError,
    check_topic_name,
)
from understudy_broker.protocol import BrokerRoute
from understudy_broker.replication.isr import DEFAULT_MAX_LAG_BYTES

DEFAULT_CHROOT = "/understudy"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class LayoutError(ValueError):
    """A znode document or name is malformed; the message says which and why."""


def check_name(kind: str, name: str) -> str:
    """Group and broker names are DNS labels (they become Kubernetes object names)."""
    if not _NAME.match(name):
        raise LayoutError(f"{kind} name {name!r} must be a DNS label: [a-z0-9-], at most 63")
    return name


ACL_USERS = "/acl/users"
ACL_RULES = "/acl/rules"


_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


def check_user(name: str) -> str:
    """User names: letters, digits, ``._@-``, 1-128 characters, not starting with a
    symbol (they are znode names and certificate common names)."""
    if not isinstance(name, str) or not _USER.match(name):
        raise LayoutError(f"user name {name!r} must be 1-128 of [A-Za-z0-9._@-], starting "
                          "with a letter or digit")
    return name


def acl_user_path(user: str) -> str:
    """``/acl/users/<user>``."""
    return f"{ACL_USERS}/{check_user(user)}"


def acl_rules_path(user: str) -> str:
    return f"{ACL_RULES}/{acl_user_path(user).rsplit('/', 1)[1]}"


def group_path(group: str) -> str:
    return f"/groups/{check_name('group', group)}"


def config_path(group: str) -> str:
    return f"{group_path(group)}/config"


def state_path(group: str) -> str:
    return f"{group_path(group)}/state"


def live_dir(group: str) -> str:
    return f"{group_path(group)}/live"


def live_path(group: str, broker: str) -> str:
    return f"{live_dir(group)}/{check_name('broker', broker)}"


def status_dir(group: str) -> str:
    return f"{group_path(group)}/status"


def status_path(group: str, broker: str) -> str:
    return f"{status_dir(group)}/{check_name('broker', broker)}"


def route_dir(group: str) -> str:
    return f"{group_path(group)}/route"


def route_path(group: str, broker: str) -> str:
    return f"{route_dir(group)}/{check_name('broker', broker)}"


CONTROLLERS_DIR = "/controllers"


def controller_path(group: str) -> str:
    return f"{CONTROLLERS_DIR}/{check_name('group', group)}"


def isr_path(group: str) -> str:
    """``/groups/<group>/isr``: ``{"inSync": [slave, ...]}``, the slaves that hold every
    acknowledged write. Written by the master's replication layer (versioned) *before* it
    acknowledges a write without some slave; read by the controller to pick an acting slave."""
    return f"{group_path(group)}/isr"


def encode_isr(members: Iterable[str]) -> bytes:
    return _dump({"inSync": sorted(members)})


def decode_isr(data: bytes) -> frozenset[str]:
    """The in-sync set; :class:`LayoutError` when ``data`` is not an ISR record."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LayoutError(f"isr: not JSON: {exc}") from exc
    members = doc.get("inSync") if isinstance(doc, dict) else None
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise LayoutError("isr: expected {\"inSync\": [broker names]}")
    return frozenset(members)


TOPICS_DIR = "/topics"
CONSUMERS_DIR = "/consumers"
ORDERED_DIR = "/ordered"
PRODUCERS_DIR = "/producers"
GROUPS_DIR = "/groups"
_MEMBER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def _topic_node(parent: str, topic: str) -> str:
    """``<parent>/<topic>``; a bad topic name is a :class:`LayoutError`."""
    try:
        return f"{parent}/{check_topic_name(topic)}"
    except TopicNameError as exc:
        raise LayoutError(str(exc)) from None


def ordered_dir(topic: str) -> str:
    """``/ordered/<topic>``: an ordered topic's coordination nodes."""
    return _topic_node(ORDERED_DIR, topic)


def chains_path(topic: str) -> str:
    """``/ordered/<topic>/chains``: the send and consume chains of an ordered topic, one
    document so that one versioned write moves both (docs/ordered.md)."""
    return f"{ordered_dir(topic)}/chains"


def topic_path(topic: str) -> str:
    return _topic_node(TOPICS_DIR, topic)


@dataclass(frozen=True, slots=True)
class GroupSpace:
    """Where one kind of broker-held group lives. Consumer groups are
    ``/consumers/<cg>``; the producers of an ordered topic are ``/producers/<topic>``, a
    group whose one assignable unit is the right to send (docs/ordered.md). Both have
    ``members/<member>`` (ephemeral, in the hosting broker's session) and ``assignment``."""

    root: str
    kind: str
    topic_named: bool = False

    def check(self, name: str) -> str:
        if not self.topic_named:
            return check_name(self.kind, name)
        try:
            return check_topic_name(name)
        except TopicNameError as exc:
            raise LayoutError(f"{self.kind}: {exc}") from None

    def group(self, name: str) -> str:
        return f"{self.root}/{self.check(name)}"

    def members(self, name: str) -> str:
        return f"{self.group(name)}/members"

    def member(self, name: str, member: str) -> str:
        return f"{self.members(name)}/{check_member(member)}"

    def assignment(self, name: str) -> str:
        return f"{self.group(name)}/assignment"


CONSUMER_GROUPS = GroupSpace(CONSUMERS_DIR, "consumer group")
PRODUCER_GROUPS = GroupSpace(PRODUCERS_DIR, "producers of ordered topic", topic_named=True)


def consumer_group_path(cgroup: str) -> str:
    return CONSUMER_GROUPS.group(cgroup)


def members_dir(cgroup: str) -> str:
    return CONSUMER_GROUPS.members(cgroup)


def check_member(member: str) -> str:
    """Member ids are chosen by clients: 1-128 of ``A-Z a-z 0-9 . _ : -``."""
    if not _MEMBER.match(member):
        raise LayoutError(f"member id {member!r} must be 1-128 of A-Z a-z 0-9 . _ : - "
                          "and start with a letter or digit")
    return member


def member_path(cgroup: str, member: str) -> str:
    return CONSUMER_GROUPS.member(cgroup, member)


def assignment_path(cgroup: str) -> str:
    return CONSUMER_GROUPS.assignment(cgroup)


# --------------------------------------------------------------------------- documents


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    """One broker of a group. Ordinal 0 is the master."""

    name: str
    ordinal: int
    host: str
    port: int
    replication_port: int
    http_port: int
    permission: Permission = Permission.FULL

    @property
    def role(self) -> Role:
        return Role.MASTER if self.ordinal == 0 else Role.SLAVE

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class FailoverPolicy:
    enabled: bool = True
    check_interval_ms: int = 250
    detection_checks: int = 2
    backsync_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class ReplicationPolicy:
    """Quorum writes (seed 001 §9, docs/replication.md). ``min_insync`` counts slaves (the
    floor); ``in_sync_replicas`` counts copies with the master (None: ``min_insync + 1``)."""

    sync: bool = True
    min_insync: int = 1
    auto_degrade: bool = False
    in_sync_replicas: int | None = None
    max_lag_bytes: int = DEFAULT_MAX_LAG_BYTES

    @property
    def copies(self) -> int:
        """``in_sync_replicas`` with its default applied."""
        return self.min_insync + 1 if self.in_sync_replicas is None else self.in_sync_replicas


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """``/groups/<group>/config``: the desired group, as the operator or ``local up`` wrote it."""

    group: str
    brokers: tuple[BrokerSpec, ...]
    failover: FailoverPolicy = field(default_factory=FailoverPolicy)
    replication: ReplicationPolicy = field(default_factory=ReplicationPolicy)
    session_timeout_ms: int = 2000

    @property
    def master(self) -> BrokerSpec:
        return next(b for b in self.brokers if b.ordinal == 0)

    @property
    def slaves(self) -> tuple[BrokerSpec, ...]:
        return tuple(b for b in self.brokers if b.ordinal != 0)

    def broker(self, name: str) -> BrokerSpec:
        for b in self.brokers:
            if b.name == name:
                return b
        raise LayoutError(f"group {self.group!r} has no broker {name!r}")

    def validate(self) -> GroupConfig:
        check_name("group", self.group)
        ordinals = sorted(b.ordinal for b in self.brokers)
        if ordinals != list(range(len(self.brokers))) or not self.brokers:
            raise LayoutError(
                f"group {self.group!r}: broker ordinals must be 0..n-1 with 0 the master, got {ordinals}"
            )
        names = [check_name("broker", b.name) for b in self.brokers]
        if len(set(names)) != len(names):
            raise LayoutError(f"group {self.group!r}: duplicate broker names {names}")
        rp = self.replication
        if rp.min_insync > len(self.slaves):
            raise LayoutError(
                f"group {self.group!r}: minInSyncReplicas={rp.min_insync} "
                f"exceeds the number of slaves ({len(self.slaves)})"
            )
        if rp.sync and not rp.min_insync + 1 <= rp.copies <= len(self.brokers):
            raise LayoutError(
                f"group {self.group!r}: inSyncReplicas={rp.copies} (copies, the master "
                f"included) must be between minInSyncReplicas + 1 ({rp.min_insync + 1}) and "
                f"the group's {len(self.brokers)} broker(s)")
        if rp.max_lag_bytes < 1:
            raise LayoutError(f"group {self.group!r}: maxLagBytes must be positive")
        if self.failover.check_interval_ms < 10 or self.failover.detection_checks < 1:
            raise LayoutError(f"group {self.group!r}: checkIntervalMs>=10, detectionChecks>=1")
        if self.session_timeout_ms < 500:
            raise LayoutError(f"group {self.group!r}: sessionTimeoutMs must be >= 500")
        return self

    def to_json(self) -> bytes:
        doc = {
            "group": self.group,
            "brokers": [
                {
                    "name": b.name,
                    "ordinal": b.ordinal,
                    "host": b.host,
                    "port": b.port,
                    "replicationPort": b.replication_port,
                    "httpPort": b.http_port,
                    "permission": b.permission.label,
                }
                for b in self.brokers
            ],
            "failover": {
                "enabled": self.failover.enabled,
                "checkIntervalMs": self.failover.check_interval_ms,
                "detectionChecks": self.failover.detection_checks,
                "backSyncTimeoutSeconds": self.failover.backsync_timeout_s,
            },
            "replication": {
                "mode": "sync" if self.replication.sync else "async",
                "minInSyncReplicas": self.replication.min_insync,
                "autoDegrade": self.replication.auto_degrade,
                **({} if self.replication.in_sync_replicas is None
                   else {"inSyncReplicas": self.replication.in_sync_replicas}),
                "maxLagBytes": self.replication.max_lag_bytes,
            },
            "sessionTimeoutMs": self.session_timeout_ms,
        }
        return _dump(doc)

    @classmethod
    def from_json(cls, data: bytes) -> GroupConfig:
        doc = _load("config", data)
        try:
            brokers = tuple(
                BrokerSpec(
                    name=str(b["name"]),
                    ordinal=int(b["ordinal"]),
                    host=str(b["host"]),
                    port=int(b["port"]),
                    replication_port=int(b["replicationPort"]),
                    http_port=int(b["httpPort"]),
                    permission=Permission.parse(str(b.get("permission", "FULL"))),
                )
                for b in doc["brokers"]
            )
            fo = doc.get("failover", {})
            rp = doc.get("replication", {})
            mode = rp.get("mode", "sync")
            if mode not in ("sync", "async"):
                raise LayoutError(f"config: replication.mode must be sync or async, got {mode!r}")
            cfg = cls(
                group=str(doc["group"]),
                brokers=brokers,
                failover=FailoverPolicy(
                    enabled=bool(fo.get("enabled", True)),
                    check_interval_ms=int(fo.get("checkIntervalMs", 250)),
                    detection_checks=int(fo.get("detectionChecks", 2)),
                    backsync_timeout_s=float(fo.get("backSyncTimeoutSeconds", 30.0)),
                ),
                replication=ReplicationPolicy(
                    sync=mode == "sync",
                    min_insync=int(rp.get("minInSyncReplicas", 1)),
                    auto_degrade=bool(rp.get("autoDegrade", False)),
                    in_sync_replicas=(None if rp.get("inSyncReplicas") is None
                                      else int(rp["inSyncReplicas"])),
                    max_lag_bytes=int(rp.get("maxLagBytes", DEFAULT_MAX_LAG_BYTES)),
                ),
                session_timeout_ms=int(doc.get("sessionTimeoutMs", 2000)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"config: malformed document: {exc!r}") from exc
        return cfg.validate()


def encode_state(state: GroupState) -> bytes:
    return _dump(
        {
            "mode": state.mode.name,
            "epoch": state.epoch,
            "acting": state.acting,
            "since": state.since,
            "reason": state.reason,
        }
    )


def decode_state(data: bytes) -> GroupState:
    doc = _load("state", data)
    mode = str(doc.get("mode"))
    if mode not in Mode.__members__:
        raise LayoutError(f"state: unknown mode {mode!r}: expected one of {list(Mode.__members__)}")
    try:
        return GroupState(
            mode=Mode[mode],
            epoch=int(doc["epoch"]),
            acting=None if doc.get("acting") is None else str(doc["acting"]),
            since=float(doc.get("since", 0.0)),
            reason=str(doc.get("reason", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LayoutError(f"state: malformed document: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class OrderedFacts:
    """What a group's reader reports for one ordered topic (docs/ordered.md): the log end of
    the topic's queue on the group, the lowest offset committed there over the consumer
    groups that committed on the topic, and the chain epoch the broker had applied."""

    end: int
    consumed: int
    view_epoch: int
    #: The consumer groups ``consumed`` covers (those that committed on the topic); the
    #: chain mover holds the group for a subscribed consumer group missing here.
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """``/groups/<group>/status/<broker>``, refreshed by the broker about once a second.

    ``ready`` means: started, applied ``epoch_applied``, and (for a returning master in
    SLAVE_CONSUME) isolated with the acting slave connected for replication, i.e. ready
    for back-sync. ``backsync_epoch`` is the epoch of the last back-synced offsets the
    broker persisted.
    """

    broker: str
    effective: Permission
    epoch_applied: int
    master_link: bool = False
    slave_links: tuple[str, ...] = ()
    max_offset: int = 0
    isolated: bool = False
    slave_once_connected: bool = False
    backsync_epoch: int | None = None
    ready: bool = False
    pid: int | None = None
    updated_ms: int = 0
    ordered: dict[str, OrderedFacts] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return _dump(
            {
                "ordered": {t: {"end": f.end, "consumed": f.consumed, "viewEpoch": f.view_epoch,
                                "groups": list(f.groups)}
                            for t, f in sorted(self.ordered.items())},
                "broker": self.broker,
                "effective": self.effective.label,
                "epochApplied": self.epoch_applied,
                "masterLink": self.master_link,
                "slaveLinks": list(self.slave_links),
                "maxOffset": self.max_offset,
                "isolated": self.isolated,
                "slaveOnceConnected": self.slave_once_connected,
                "backSyncEpoch": self.backsync_epoch,
                "ready": self.ready,
                "pid": self.pid,
                "updatedMs": self.updated_ms,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> BrokerStatus:
        doc = _load("status", data)
        try:
            bse = doc.get("backSyncEpoch")
            pid = doc.get("pid")
            return cls(
                broker=str(doc["broker"]),
                effective=Permission.parse(str(doc["effective"])),
                epoch_applied=int(doc["epochApplied"]),
                master_link=bool(doc.get("masterLink", False)),
                slave_links=tuple(str(s) for s in doc.get("slaveLinks", [])),
                max_offset=int(doc.get("maxOffset", 0)),
                isolated=bool(doc.get("isolated", False)),
                slave_once_connected=bool(doc.get("slaveOnceConnected", False)),
                backsync_epoch=None if bse is None else int(bse),
                ready=bool(doc.get("ready", False)),
                pid=None if pid is None else int(pid),
                updated_ms=int(doc.get("updatedMs", 0)),
                ordered={str(t): OrderedFacts(int(f["end"]), int(f["consumed"]),
                                              int(f["viewEpoch"]),
                                              tuple(str(g) for g in f.get("groups", ())))
                         for t, f in (doc.get("ordered") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LayoutError(f"status: malformed document: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class BrokerRouteDoc:
    """``/groups/<group>/route/<broker>``: what a route shows of a broker, its effective
    permission and the epoch it applied (the rest of a route comes from the config and the
    ``live`` nodes).

    Why apart from :class:`BrokerStatus`: the status is republished about once a second
    (offsets, timestamps), and every broker watches every group's routes (the cluster
    view answers any topic's route). Watched there, each republish cost every broker of
    the cluster a notification, a read and a decode: B brokers made B x B a second, which
    at 20 groups took most of a core of the whole machine at rest and at 50 groups left
    brokers unable to keep their ZooKeeper sessions. A broker writes this document only
    when one of its two fields changes (and once at start), so the views are notified of
    route changes only. A broker without one (an older version) is still read from its
    status.
    """

    effective: Permission
    epoch_applied: int

    @classmethod
    def of(cls, status: BrokerStatus) -> BrokerRouteDoc:
        return cls(status.effective, status.epoch_applied)

    def to_json(self) -> bytes:
        return _dump({"effective": self.effective.label, "epochApplied": self.epoch_applied})

    @classmethod
    def from_json(cls, data: bytes) -> BrokerRouteDoc:
        doc = _load("route", data)
        try:
            return cls(Permission.parse(str(doc["effective"])), int(doc["epochApplied"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"route: {exc!r}") from exc


ROUTES_DIR = "/routes"
#: Ephemeral, held by the one controller that writes :data:`ROUTES_DOC` (its identity).
ROUTES_WRITER = f"{ROUTES_DIR}/writer"
#: :class:`RoutesDoc`: every group's route, written by the holder of :data:`ROUTES_WRITER`.
ROUTES_DOC = f"{ROUTES_DIR}/doc"


@dataclass(frozen=True, slots=True)
class RoutesDoc:
    """``/routes/doc``: every group's route, as the route writer's view holds it
    (docs/cluster-routes.md). ``writer`` is the identity in :data:`ROUTES_WRITER` when it
    was written: a broker uses a document only while that same writer holds the node."""

    writer: str
    groups: dict[str, tuple[BrokerRoute, ...]]  # what a RouteResponse shows of each group
    #: Each group's rows as decoded (not compared): what :meth:`from_json` reuses.
    rows: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> bytes:
        return _dump({"writer": self.writer, "groups": {
            g: [[b.name, b.address, b.role, b.permission, b.epoch, b.reachable] for b in bs]
            for g, bs in self.groups.items()}})

    @classmethod
    def from_json(cls, data: bytes, reuse: RoutesDoc | None = None) -> RoutesDoc:
        """The document in ``data``; a group whose rows are those of ``reuse`` (the last
        one decoded) is taken from it, not checked and built again: every broker decodes
        every write, and a write changes a few groups (50 groups: 0.5 ms to 0.1 ms)."""
        doc = _load("routes", data)
        try:
            writer = doc["writer"]
            groups = doc["groups"]
            if not isinstance(writer, str) or not writer or not isinstance(groups, dict):
                raise TypeError("expected a writer and a groups object")
            out: dict[str, tuple[BrokerRoute, ...]] = {}
            for g, rows in groups.items():
                if reuse is not None and reuse.rows.get(g) == rows:
                    out[g] = reuse.groups[g]
                    continue
                check_name("group", g)
                out[g] = tuple(_routed(b) for b in rows)
            return cls(writer, out, groups)
        except (KeyError, TypeError, ValueError, LayoutError) as exc:
            raise LayoutError(f"routes: {exc}") from exc


def _routed(row: Any) -> BrokerRoute:
    name, address, role, permission, epoch, reachable = row
    if not (isinstance(name, str) and isinstance(address, str) and isinstance(role, str)
            and type(permission) is int and 0 <= permission <= 3 and type(epoch) is int
            and epoch >= 0 and isinstance(reachable, bool)):
        raise TypeError(f"a routed broker is [name, address, role, 0-3, epoch, bool]: {row!r}")
    return BrokerRoute(check_name("broker", name), address, role, permission, epoch, reachable)


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _load(kind: str, data: bytes, error: type[ValueError] = LayoutError) -> dict[str, Any]:
    """A znode document as a JSON object; ``error`` (with ``kind`` in its message) if not."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{kind}: not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise error(f"{kind}: expected a JSON object, got {type(doc).__name__}")
    return doc


dump_document = _dump
load_document = _load


# --------------------------------------------------------------------------- cluster


@dataclass(frozen=True, slots=True)
class TopicDoc:
    """``/topics/<topic>``: a topic's queues, numbered 0..n-1, and the group each lives on.

    ``queues[i]`` is the group of queue ``i``, or ``None`` for a queue that was removed
    (queue ids never change meaning: a removed id is never reused). ``ordered`` marks a
    strictly ordered topic (DESIGN "Ordered topics"); ``retention_hours`` None keeps the
    broker's default.
    """

    name: str
    queues: tuple[str | None, ...]
    ordered: bool = False
    retention_hours: int | None = None

    def groups(self) -> tuple[str, ...]:
        """The groups holding at least one live queue, in order of first queue."""
        return tuple(dict.fromkeys(g for g in self.queues if g is not None))

    def live_queues(self) -> tuple[int, ...]:
        return tuple(q for q, g in enumerate(self.queues) if g is not None)

    def queues_of(self, group: str) -> tuple[int, ...]:
        return tuple(q for q, g in enumerate(self.queues) if g == group)

    def assignable(self) -> tuple[int, ...]:
        """The queues a consumer group hands out: every live queue, or for an ordered topic
        only its first, which stands for the whole topic (one member reads it, in the
        order of the consume chain; docs/ordered.md)."""
        live = self.live_queues()
        return live[:1] if self.ordered else live

    def ownership_key(self, queue: int) -> int:
        """The queue whose owner may pull or commit ``queue``: itself, or for an ordered
        topic the queue that stands for the topic."""
        live = self.live_queues()
        return live[0] if self.ordered and live else queue

    def group_of(self, queue: int) -> str | None:
        return self.queues[queue] if 0 <= queue < len(self.queues) else None

    def to_json(self) -> bytes:
        return _dump({"name": self.name, "queues": list(self.queues), "ordered": self.ordered,
                      "retentionHours": self.retention_hours})

    @classmethod
    def from_json(cls, data: bytes) -> TopicDoc:
        doc = _load("topic", data)
        try:
            name = str(doc["name"])
            check_topic_name(name)
            raw = doc["queues"]
            if not isinstance(raw, list):
                raise LayoutError("topic: queues must be a list of group names or null")
            queues = tuple(None if g is None else check_name("group", str(g)) for g in raw)
            ret = doc.get("retentionHours")
            return cls(name, queues, bool(doc.get("ordered", False)),
                       None if ret is None else int(ret))
        except LayoutError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"topic: malformed document: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class MemberDoc:
    """``/consumers/<cg>/members/<member>``: ephemeral, owned by the broker that hosts the
    member's heartbeats (``broker``); ``topics`` it subscribes to."""

    member: str
    broker: str
    topics: tuple[str, ...]
    session_timeout_ms: int

    def to_json(self) -> bytes:
        return _dump({"member": self.member, "broker": self.broker, "topics": list(self.topics),
                      "sessionTimeoutMs": self.session_timeout_ms})

    @classmethod
    def from_json(cls, data: bytes) -> MemberDoc:
        doc = _load("member", data)
        try:
            return cls(check_member(str(doc["member"])), str(doc["broker"]),
                       tuple(check_topic_name(str(t)) for t in doc["topics"]),
                       int(doc["sessionTimeoutMs"]))
        except LayoutError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"member: malformed document: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a queue: ``member`` pulls it; ``next`` set means it is being handed to
    ``next`` (``member`` commits, then releases; only then does ``next`` pull)."""

    member: str
    next: str | None = None


QueueKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class AssignmentDoc:
    """``/consumers/<cg>/assignment``: queue ownership, written with versioned writes by
    brokers. ``generation`` grows with every change."""

    generation: int
    owners: dict[QueueKey, Owner] = field(default_factory=dict)

    def owned_by(self, member: str) -> list[QueueKey]:
        return sorted(k for k, o in self.owners.items() if o.member == member)

    def to_json(self) -> bytes:
        return _dump({
            "generation": self.generation,
            "owners": [{"topic": t, "queue": q, "member": o.member, "next": o.next}
                       for (t, q), o in sorted(self.owners.items())],
        })

    @classmethod
    def from_json(cls, data: bytes) -> AssignmentDoc:
        doc = _load("assignment", data)
        try:
            owners: dict[QueueKey, Owner] = {}
            for e in doc["owners"]:
                nxt = e.get("next")
                owners[(check_topic_name(str(e["topic"])), int(e["queue"]))] = Owner(
                    check_member(str(e["member"])), None if nxt is None else check_member(str(nxt)))
            return cls(int(doc["generation"]), owners)
        except LayoutError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"assignment: malformed document: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class Link:
    """One group of a consume chain. ``until`` is the chain epoch at which the group
    stopped being the send head (None while it is the head): its log of the topic is
    final once its reader has applied that epoch."""

    group: str
    until: int | None = None


@dataclass(frozen=True, slots=True)
class ChainDoc:
    """``/ordered/<topic>/chains`` (docs/ordered.md). ``send[0]`` is the only group that
    accepts the topic's writes, since chain epoch ``head_epoch`` (the fencing token a
    producer names); consumers read ``consume[0]`` only. ``epoch`` grows by one with every
    change. :meth:`check` refuses a shape no sequence of transitions produces."""

    topic: str
    send: tuple[str, ...]
    consume: tuple[Link, ...]
    epoch: int
    head_epoch: int

    @property
    def head(self) -> str | None:
        return self.send[0] if self.send else None

    def consume_groups(self) -> tuple[str, ...]:
        return tuple(link.group for link in self.consume)

    def check(self, groups: Collection[str]) -> ChainDoc:
        """Raise :class:`LayoutError` unless this is a shape the transitions can reach
        over the topic's ``groups`` (a document edited by hand into an impossible shape
        is refused, never acted on)."""
        where = f"chains of {self.topic!r}"
        consumed = self.consume_groups()
        for kind, names in (("send", self.send), ("consume", consumed)):
            if len(set(names)) != len(names):
                raise LayoutError(f"{where}: a group appears twice in the {kind} chain: {names}")
            unknown = [g for g in names if g not in groups]
            if unknown:
                raise LayoutError(f"{where}: {kind} chain names groups the topic is not on: "
                                  f"{unknown}")
        if self.epoch < 0 or not 0 <= self.head_epoch <= self.epoch:
            raise LayoutError(f"{where}: epochs must satisfy 0 <= headEpoch <= epoch")
        if self.send:
            if not self.consume or self.consume[-1] != Link(self.send[0]):
                raise LayoutError(f"{where}: the send head {self.send[0]!r} must be the "
                                  "consume chain's tail, still open (until null)")
            waiting = set(self.send[1:]) & set(consumed)
            if waiting:
                raise LayoutError(f"{where}: {sorted(waiting)} wait in the send chain but "
                                  "still hold a backlog in the consume chain")
        for link in self.consume[:-1] if self.send else self.consume:
            if link.until is None or link.until > self.epoch:
                raise LayoutError(f"{where}: consume link {link.group!r} is not the send head "
                                  "and needs an until epoch <= epoch")
        return self

    def to_json(self) -> bytes:
        return _dump({"topic": self.topic, "send": list(self.send),
                      "consume": [{"group": c.group, "until": c.until} for c in self.consume],
                      "epoch": self.epoch, "headEpoch": self.head_epoch})

    @classmethod
    def from_json(cls, data: bytes) -> ChainDoc:
        doc = _load("chains", data)
        try:
            until = [c.get("until") for c in doc["consume"]]
            return cls(
                check_topic_name(str(doc["topic"])),
                tuple(check_name("group", str(g)) for g in doc["send"]),
                tuple(Link(check_name("group", str(c["group"])), None if u is None else int(u))
                      for c, u in zip(doc["consume"], until, strict=True)),
                int(doc["epoch"]), int(doc["headEpoch"]))
        except LayoutError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LayoutError(f"chains: malformed document: {exc!r}") from exc
