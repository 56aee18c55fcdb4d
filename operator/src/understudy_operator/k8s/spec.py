"""Parse and validate a ``BrokerGroup`` spec into typed, defaulted dataclasses.

Why this module exists: the CRD's structural schema and CEL rules reject most bad specs at the
API server, but not all of them, and not everywhere — KMock and local mode have no API server,
an old object may predate a rule, and CEL cannot check a resource quantity's syntax or a
ZooKeeper connect string. The operator therefore parses every spec here, applies the same
defaults as the CRD, re-checks the CRD's cross-field rules and adds the ones CEL cannot express.
A spec that fails is reported as a status condition and an Event and is *never half-applied*:
parsing is all-or-nothing and happens before any object is built.

Every problem found is reported at once (not just the first), each prefixed with its field path
(``spec.replication.minInSyncReplicas: ...``) so the message in ``kubectl describe`` points at
the line to fix.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from understudy_broker.model import Permission, Role, check_zk_chroot, parse_address
from understudy_broker.replication.isr import DEFAULT_MAX_LAG_BYTES

MAX_SLAVES: Final = 15
MAX_GROUP_NAME_LENGTH: Final = 40
"""Pods are ``<group>-<ordinal>`` and Services ``<group>-headless``; StatefulSet pods also carry
a ``controller-revision-hash`` label of ``<name>-<10 chars>`` that must fit in 63."""

DEFAULT_CHROOT: Final = "/understudy"
DEFAULT_SESSION_TIMEOUT_MS: Final = 4000
DEFAULT_CHECK_INTERVAL_MS: Final = 250
DEFAULT_DETECTION_CHECKS: Final = 2
DEFAULT_BACK_SYNC_TIMEOUT_SECONDS: Final = 30
DEFAULT_STORAGE_SIZE: Final = "1Gi"
DEFAULT_MONITORING_INTERVAL: Final = "15s"
#: spec.replication.maxLagBytes: below 1 MiB, bytes merely in flight under load would push
#: healthy slaves out of the in-sync set.
MIN_MAX_LAG_BYTES: Final = 1 << 20
MAX_MAX_LAG_BYTES: Final = 1 << 40

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")
_HOST_PORT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:\d{1,5})?$")
_CHROOT = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")
_PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
_RESOURCE_KEYS: Final = ("limits", "requests")


class SpecError(ValueError):
    """A BrokerGroup spec that cannot be applied. ``problems`` lists each one with its path."""

    def __init__(self, problems: list[str], *, kind: str = "BrokerGroup") -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__(f"invalid {kind}: " + "; ".join(problems))


class ReplicationMode(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class PvcRetention(enum.StrEnum):
    """What happens to the brokers' PersistentVolumeClaims when the BrokerGroup is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


@dataclass(frozen=True, slots=True)
class StorageSpec:
    size: str = DEFAULT_STORAGE_SIZE
    storage_class_name: str | None = None
    retention_on_delete: PvcRetention = PvcRetention.RETAIN


@dataclass(frozen=True, slots=True)
class ZooKeeperSpec:
    connect: str
    chroot: str = DEFAULT_CHROOT
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS

    @property
    def url(self) -> str:
        """``host:port[,host:port]/chroot`` as kazoo and ``understudy broker --zk`` take it."""
        return f"{self.connect}{self.chroot}"


@dataclass(frozen=True, slots=True)
class ReplicationSpec:
    """Quorum writes (docs/replication.md): ``min_in_sync_replicas`` counts slaves (the
    floor), ``in_sync_replicas`` counts copies with the master (None: the floor + 1)."""

    mode: ReplicationMode = ReplicationMode.SYNC
    min_in_sync_replicas: int = 1
    auto_degrade: bool = False
    in_sync_replicas: int | None = None
    max_lag_bytes: int = DEFAULT_MAX_LAG_BYTES


@dataclass(frozen=True, slots=True)
class FailoverSpec:
    enabled: bool = True
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS
    detection_checks: int = DEFAULT_DETECTION_CHECKS
    back_sync_timeout_seconds: int = DEFAULT_BACK_SYNC_TIMEOUT_SECONDS


@dataclass(frozen=True, slots=True)
class PodTemplateSpec:
    """Scheduling overrides copied verbatim into the pod spec (validated by the API server)."""

    affinity: Mapping[str, Any] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    priority_class_name: str | None = None


@dataclass(frozen=True, slots=True)
class MonitoringSpec:
    enabled: bool = True
    interval: str = DEFAULT_MONITORING_INTERVAL


class TlsClientAuth(enum.StrEnum):
    """``--tls-client-auth``: whether a client must (``required``), may (``optional``) or
    may not (``none``) present a certificate."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class SecuritySpec:
    """``spec.security`` (docs/security-kubernetes.md). On by default: operator-issued
    certificates and TLS on the client and replication ports (``tls``), every client
    authenticated and ACLs enforced (``require_auth``), the replication port open only to
    brokers that prove the group's secret (``group_secret``). ``super_users``: BrokerUser
    names granted everything, besides the brokers themselves."""

    tls: bool = True
    tls_client_auth: TlsClientAuth = TlsClientAuth.OPTIONAL
    require_auth: bool = True
    group_secret: bool = True
    super_users: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NetworkPolicySpec:
    """``spec.networkPolicy``: who may reach the brokers' ports. ``client_from`` and
    ``metrics_from`` are NetworkPolicyPeers copied verbatim (validated by the API server);
    ``None`` means the default (every pod of the namespace; Prometheus pods anywhere)."""

    enabled: bool = True
    client_from: tuple[Mapping[str, Any], ...] | None = None
    metrics_from: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True, slots=True)
class BrokerGroupSpec:
    """A validated BrokerGroup spec. Build it with :func:`parse_spec`."""

    image: str
    zookeeper: ZooKeeperSpec
    slaves: int = 1
    permission: Permission = Permission.FULL
    overrides: Mapping[int, Permission] = field(default_factory=dict)
    image_pull_policy: str = "IfNotPresent"
    storage: StorageSpec = field(default_factory=StorageSpec)
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    replication: ReplicationSpec = field(default_factory=ReplicationSpec)
    failover: FailoverSpec = field(default_factory=FailoverSpec)
    pod_template: PodTemplateSpec = field(default_factory=PodTemplateSpec)
    monitoring: MonitoringSpec = field(default_factory=MonitoringSpec)
    security: SecuritySpec = field(default_factory=SecuritySpec)
    network_policy: NetworkPolicySpec = field(default_factory=NetworkPolicySpec)

    @property
    def replicas(self) -> int:
        """Brokers in the group: the master (ordinal 0) and the slaves."""
        return self.slaves + 1

    def permission_of(self, ordinal: int) -> Permission:
        """The *configured* permission of a broker: its override, else the group's."""
        return self.overrides.get(ordinal, self.permission)

    @staticmethod
    def role_of(ordinal: int) -> Role:
        return Role.MASTER if ordinal == 0 else Role.SLAVE


def validate_group_name(name: str) -> list[str]:
    """Problems with a BrokerGroup's ``metadata.name`` (empty when it is usable)."""
    if not _DNS1035.match(name):
        return [
            f"metadata.name: {name!r} must be a DNS-1035 label "
            "(lowercase letters, digits and '-', starting with a letter)"
        ]
    if len(name) > MAX_GROUP_NAME_LENGTH:
        return [f"metadata.name: {name!r} is longer than {MAX_GROUP_NAME_LENGTH} characters"]
    return []


def parse_spec(
    spec: Mapping[str, Any],
    *,
    name: str | None = None,
    default_zk_connect: str | None = None,
) -> BrokerGroupSpec:
    """Validate ``spec`` (the ``spec`` of a BrokerGroup, defaulted by the API server or not) and
    return it typed, with the CRD's defaults applied.

    ``name`` is the BrokerGroup's ``metadata.name``, checked when given. ``default_zk_connect``
    is the operator's ZooKeeper (from its Helm values), used when the spec names none.
    Raises :class:`SpecError` listing every problem.
    """
    p = FieldParser()
    if name is not None:
        p.problems.extend(validate_group_name(name))
    if not isinstance(spec, Mapping):
        raise SpecError([f"spec: must be an object, got {type(spec).__name__}"])
    p.unknown(spec, "spec", _SPEC_KEYS)

    image = p.string(spec, "spec", "image", required=True)
    pull = p.enum_str(spec, "spec", "imagePullPolicy", _PULL_POLICIES, default="IfNotPresent")
    slaves = p.integer(spec, "spec", "slaves", default=1, minimum=0, maximum=MAX_SLAVES)
    permission = p.permission(spec, "spec", "permission", default=Permission.FULL)
    overrides = p.overrides(spec, slaves)

    storage_raw = p.obj(spec, "spec", "storage", _STORAGE_KEYS)
    size = p.string(storage_raw, "spec.storage", "size", default=DEFAULT_STORAGE_SIZE)
    if size and not _QUANTITY.match(size):
        p.add(f"spec.storage.size: {size!r} is not a resource quantity (e.g. 1Gi, 500Mi)")
    storage = StorageSpec(
        size=size,
        storage_class_name=p.string(storage_raw, "spec.storage", "storageClassName") or None,
        retention_on_delete=PvcRetention(
            p.enum_str(
                storage_raw,
                "spec.storage",
                "retentionOnDelete",
                tuple(PvcRetention),
                default=PvcRetention.RETAIN.value,
            )
        ),
    )

    resources = p.resources(spec)

    zookeeper = parse_zookeeper(p, spec, default_zk_connect)

    repl_raw = p.obj(spec, "spec", "replication", _REPLICATION_KEYS)
    mode = ReplicationMode(
        p.enum_str(
            repl_raw, "spec.replication", "mode", tuple(ReplicationMode), default="sync"
        )
    )
    min_isr = p.integer(
        repl_raw, "spec.replication", "minInSyncReplicas", default=1, minimum=0, maximum=MAX_SLAVES
    )
    copies: int | None = None
    if repl_raw.get("inSyncReplicas") is not None:
        copies = p.integer(repl_raw, "spec.replication", "inSyncReplicas", default=min_isr + 1,
                           minimum=1, maximum=MAX_SLAVES + 1)
    max_lag = p.integer(repl_raw, "spec.replication", "maxLagBytes",
                        default=DEFAULT_MAX_LAG_BYTES, minimum=MIN_MAX_LAG_BYTES,
                        maximum=MAX_MAX_LAG_BYTES)
    # The CRD's CEL rules, re-checked (see crds/brokergroup.yaml).
    if mode is ReplicationMode.SYNC and slaves < 1:
        p.add("spec.replication.mode: sync replication needs at least one slave (spec.slaves >= 1)")
    elif mode is ReplicationMode.SYNC and min_isr > slaves:
        p.add(
            f"spec.replication.minInSyncReplicas: {min_isr} is more than spec.slaves ({slaves})"
        )
    elif mode is ReplicationMode.SYNC and copies is not None and not (
            min_isr + 1 <= copies <= slaves + 1):
        p.add(
            f"spec.replication.inSyncReplicas: {copies} (copies, the master included) must be "
            f"between minInSyncReplicas + 1 ({min_isr + 1}) and spec.slaves + 1 ({slaves + 1})"
        )
    replication = ReplicationSpec(
        mode=mode,
        min_in_sync_replicas=min_isr,
        auto_degrade=p.boolean(repl_raw, "spec.replication", "autoDegrade", default=False),
        in_sync_replicas=copies,
        max_lag_bytes=max_lag,
    )

    fo_raw = p.obj(spec, "spec", "failover", _FAILOVER_KEYS)
    failover = FailoverSpec(
        enabled=p.boolean(fo_raw, "spec.failover", "enabled", default=True),
        check_interval_ms=p.integer(
            fo_raw,
            "spec.failover",
            "checkIntervalMs",
            default=DEFAULT_CHECK_INTERVAL_MS,
            minimum=50,
            maximum=10000,
        ),
        detection_checks=p.integer(
            fo_raw,
            "spec.failover",
            "detectionChecks",
            default=DEFAULT_DETECTION_CHECKS,
            minimum=1,
            maximum=20,
        ),
        back_sync_timeout_seconds=p.integer(
            fo_raw,
            "spec.failover",
            "backSyncTimeoutSeconds",
            default=DEFAULT_BACK_SYNC_TIMEOUT_SECONDS,
            minimum=1,
            maximum=3600,
        ),
    )

    pod_template = p.pod_template(spec)

    mon_raw = p.obj(spec, "spec", "monitoring", _MONITORING_KEYS)
    interval = p.string(
        mon_raw, "spec.monitoring", "interval", default=DEFAULT_MONITORING_INTERVAL
    )
    if not _DURATION.match(interval):
        p.add(f"spec.monitoring.interval: {interval!r} is not a duration like 15s or 1m")
    monitoring = MonitoringSpec(
        enabled=p.boolean(mon_raw, "spec.monitoring", "enabled", default=True), interval=interval
    )

    security = p.security(spec)
    network_policy = p.network_policy(spec)

    if p.problems:
        raise SpecError(p.problems)
    return BrokerGroupSpec(
        image=image,
        image_pull_policy=pull,
        zookeeper=zookeeper,
        slaves=slaves,
        permission=permission,
        overrides=overrides,
        storage=storage,
        resources=resources,
        replication=replication,
        failover=failover,
        pod_template=pod_template,
        monitoring=monitoring,
        security=security,
        network_policy=network_policy,
    )


_SPEC_KEYS: Final = frozenset(
    {
        "image",
        "imagePullPolicy",
        "slaves",
        "permission",
        "brokers",
        "storage",
        "resources",
        "zookeeper",
        "replication",
        "failover",
        "podTemplate",
        "monitoring",
        "security",
        "networkPolicy",
    }
)
_STORAGE_KEYS: Final = frozenset({"size", "storageClassName", "retentionOnDelete"})
_ZK_KEYS: Final = frozenset({"connect", "chroot", "sessionTimeoutMs"})
_REPLICATION_KEYS: Final = frozenset(
    {"mode", "minInSyncReplicas", "autoDegrade", "inSyncReplicas", "maxLagBytes"})
_FAILOVER_KEYS: Final = frozenset(
    {"enabled", "checkIntervalMs", "detectionChecks", "backSyncTimeoutSeconds"}
)
_POD_TEMPLATE_KEYS: Final = frozenset(
    {"affinity", "tolerations", "nodeSelector", "priorityClassName"}
)
_MONITORING_KEYS: Final = frozenset({"enabled", "interval"})
_BROKER_KEYS: Final = frozenset({"ordinal", "permission"})
_SECURITY_KEYS: Final = frozenset({"tls", "tlsClientAuth", "requireAuth", "groupSecret",
                                   "superUsers"})
_NETWORK_POLICY_KEYS: Final = frozenset({"enabled", "clientFrom", "metricsFrom"})
_PEER_KEYS: Final = frozenset({"podSelector", "namespaceSelector", "ipBlock"})
#: BrokerUser names (and certificate common names): the rule of understudy_broker.acl.
_USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


def connect_problem(connect: str) -> str | None:
    """What is wrong with a manifest's ZooKeeper connect string (``host:port,...``, no
    chroot), or None: host names as the CRD allows them, every port given (the brokers'
    ``--zk`` needs it: a host alone passed here and crashed every broker pod) and in
    1-65535."""
    if not all(_HOST_PORT.match(part) for part in connect.split(",")):
        return (f"{connect!r} must be host:port[,host:port...] without a chroot (put the "
                "chroot in spec.zookeeper.chroot)")
    for part in connect.split(","):
        try:
            parse_address(part)
        except ValueError as exc:
            return f"{exc} (every server with its port, as in zk-0.zk:2181)"
    return None


def chroot_problem(chroot: str) -> str | None:
    """What is wrong with a manifest's chroot, or None: the CRD's pattern (parts of
    ``A-Z a-z 0-9 _ . -``) and what ZooKeeper refuses (:func:`check_zk_chroot`: ``.``,
    ``..``, ``/zookeeper``)."""
    if not _CHROOT.match(chroot):
        return (f"{chroot!r} must be an absolute path like /understudy (parts of "
                "A-Z a-z 0-9 _ . -)")
    try:
        check_zk_chroot(chroot)
    except ValueError as exc:
        return str(exc)
    return None


def parse_zookeeper(p: FieldParser, spec: Mapping[str, Any], default_zk_connect: str | None,
                    default_chroot: str | None = None) -> ZooKeeperSpec:
    """``spec.zookeeper`` of a BrokerGroup, BrokerTopic or BrokerUser: the connect string
    (else the operator's default), the chroot (else ``default_chroot``, else the
    project's) and the session timeout; problems go to ``p``."""
    raw_zk = spec.get("zookeeper")
    if default_chroot and (raw_zk is None or (isinstance(raw_zk, Mapping)
                                              and "chroot" not in raw_zk)):
        spec = {**spec, "zookeeper": {**(raw_zk or {}), "chroot": default_chroot}}
    zk_raw = p.obj(spec, "spec", "zookeeper", _ZK_KEYS)
    connect = p.string(zk_raw, "spec.zookeeper", "connect") or (default_zk_connect or "")
    if not connect:
        p.add(
            "spec.zookeeper.connect: required (the operator was started without a default "
            "ZooKeeper connect string)"
        )
    else:
        problem = connect_problem(connect)
        if problem:
            p.add(f"spec.zookeeper.connect: {problem}")
    chroot = p.string(zk_raw, "spec.zookeeper", "chroot", default=DEFAULT_CHROOT)
    problem = chroot_problem(chroot)
    if problem:
        p.add(f"spec.zookeeper.chroot: {problem}")
    return ZooKeeperSpec(
        connect=connect,
        chroot=chroot,
        session_timeout_ms=p.integer(
            zk_raw,
            "spec.zookeeper",
            "sessionTimeoutMs",
            default=DEFAULT_SESSION_TIMEOUT_MS,
            minimum=1000,
            maximum=60000,
        ),
    )


class FieldParser:
    """Field readers that record problems instead of raising, so all are reported at once.
    Each returns a usable placeholder on error; the caller raises if ``problems`` is set."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def unknown(self, raw: Mapping[str, Any], path: str, allowed: frozenset[str]) -> None:
        for key in sorted(set(raw) - allowed):
            self.add(f"{path}.{key}: unknown field (allowed: {', '.join(sorted(allowed))})")

    def obj(
        self, raw: Mapping[str, Any], path: str, key: str, allowed: frozenset[str]
    ) -> Mapping[str, Any]:
        value = raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(f"{path}.{key}: must be an object, got {type(value).__name__}")
            return {}
        self.unknown(value, f"{path}.{key}", allowed)
        return value

    def string(
        self,
        raw: Mapping[str, Any],
        path: str,
        key: str,
        *,
        default: str = "",
        required: bool = False,
    ) -> str:
        value = raw.get(key)
        if value is None:
            if required:
                self.add(f"{path}.{key}: required")
            return default
        if not isinstance(value, str):
            self.add(f"{path}.{key}: must be a string, got {type(value).__name__}")
            return default
        if required and not value.strip():
            self.add(f"{path}.{key}: must not be empty")
        return value

    def enum_str(
        self,
        raw: Mapping[str, Any],
        path: str,
        key: str,
        allowed: tuple[str, ...],
        *,
        default: str,
    ) -> str:
        value = raw.get(key, default)
        if value not in allowed:
            self.add(f"{path}.{key}: {value!r} is not one of {', '.join(allowed)}")
            return default
        return str(value)

    def integer(
        self,
        raw: Mapping[str, Any],
        path: str,
        key: str,
        *,
        default: int,
        minimum: int,
        maximum: int,
    ) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(f"{path}.{key}: must be an integer, got {value!r}")
            return default
        if not minimum <= value <= maximum:
            self.add(f"{path}.{key}: {value} is out of range [{minimum}, {maximum}]")
            return default
        return value

    def boolean(self, raw: Mapping[str, Any], path: str, key: str, *, default: bool) -> bool:
        value = raw.get(key, default)
        if not isinstance(value, bool):
            self.add(f"{path}.{key}: must be true or false, got {value!r}")
            return default
        return value

    def permission(
        self, raw: Mapping[str, Any], path: str, key: str, *, default: Permission
    ) -> Permission:
        value = raw.get(key, default.label)
        if not isinstance(value, str) or value not in ("FULL", "WRITE", "READ", "NONE"):
            self.add(f"{path}.{key}: {value!r} is not one of FULL, WRITE, READ, NONE")
            return default
        return Permission.parse(value)

    def overrides(self, spec: Mapping[str, Any], slaves: int) -> dict[int, Permission]:
        raw = spec.get("brokers")
        if raw is None:
            return {}
        if not isinstance(raw, list):
            self.add(f"spec.brokers: must be a list, got {type(raw).__name__}")
            return {}
        result: dict[int, Permission] = {}
        for i, item in enumerate(raw):
            path = f"spec.brokers[{i}]"
            if not isinstance(item, Mapping):
                self.add(f"{path}: must be an object")
                continue
            self.unknown(item, path, _BROKER_KEYS)
            if "ordinal" not in item:
                self.add(f"{path}.ordinal: required")
                continue
            ordinal = self.integer(item, path, "ordinal", default=-1, minimum=0, maximum=MAX_SLAVES)
            if ordinal < 0:
                continue
            if ordinal > slaves:
                self.add(
                    f"{path}.ordinal: {ordinal} names no broker (the group has ordinals "
                    f"0..{slaves})"
                )
                continue
            if ordinal in result:
                self.add(f"{path}.ordinal: {ordinal} is listed twice")
                continue
            if "permission" not in item:
                self.add(f"{path}.permission: required")
                continue
            result[ordinal] = self.permission(item, path, "permission", default=Permission.FULL)
        return result

    def resources(self, spec: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        raw = self.obj(spec, "spec", "resources", frozenset(_RESOURCE_KEYS))
        result: dict[str, dict[str, str]] = {}
        for kind in _RESOURCE_KEYS:
            section = raw.get(kind)
            if section is None:
                continue
            if not isinstance(section, Mapping):
                self.add(f"spec.resources.{kind}: must be an object")
                continue
            result[kind] = {}
            for res, qty in section.items():
                text = str(qty) if isinstance(qty, int | str) and not isinstance(qty, bool) else ""
                if not _QUANTITY.match(text):
                    self.add(f"spec.resources.{kind}.{res}: {qty!r} is not a resource quantity")
                    continue
                result[kind][str(res)] = text
        return result

    def pod_template(self, spec: Mapping[str, Any]) -> PodTemplateSpec:
        raw = self.obj(spec, "spec", "podTemplate", _POD_TEMPLATE_KEYS)
        affinity = raw.get("affinity")
        if affinity is not None and not isinstance(affinity, Mapping):
            self.add("spec.podTemplate.affinity: must be an object")
            affinity = None
        tolerations_raw = raw.get("tolerations", [])
        tolerations: tuple[Mapping[str, Any], ...] = ()
        if not isinstance(tolerations_raw, list) or not all(
            isinstance(t, Mapping) for t in tolerations_raw
        ):
            self.add("spec.podTemplate.tolerations: must be a list of objects")
        else:
            tolerations = tuple(tolerations_raw)
        selector_raw = raw.get("nodeSelector", {})
        selector: dict[str, str] = {}
        if not isinstance(selector_raw, Mapping) or not all(
            isinstance(v, str) for v in selector_raw.values()
        ):
            self.add("spec.podTemplate.nodeSelector: must map label names to strings")
        else:
            selector = {str(k): v for k, v in selector_raw.items()}
        priority = self.string(raw, "spec.podTemplate", "priorityClassName") or None
        return PodTemplateSpec(
            affinity=affinity,
            tolerations=tolerations,
            node_selector=selector,
            priority_class_name=priority,
        )

    def security(self, spec: Mapping[str, Any]) -> SecuritySpec:
        raw = self.obj(spec, "spec", "security", _SECURITY_KEYS)
        path = "spec.security"
        tls = self.boolean(raw, path, "tls", default=True)
        client_auth = TlsClientAuth(self.enum_str(raw, path, "tlsClientAuth",
                                                  tuple(TlsClientAuth), default="optional"))
        require_auth = self.boolean(raw, path, "requireAuth", default=True)
        group_secret = self.boolean(raw, path, "groupSecret", default=True)
        users_raw = raw.get("superUsers", [])
        users: list[str] = []
        if not isinstance(users_raw, list):
            self.add(f"{path}.superUsers: must be a list of user names")
        else:
            for i, user in enumerate(users_raw):
                if not isinstance(user, str) or not _USER_NAME.match(user):
                    self.add(f"{path}.superUsers[{i}]: {user!r} is not a user name "
                             "(1-128 of [A-Za-z0-9._@-], starting with a letter or digit)")
                elif user not in users:
                    users.append(user)
        # The CRD's CEL rule on spec.security, re-checked: brokers authenticate to each
        # other's client ports with their certificates, so authentication needs TLS with
        # client certificates allowed.
        if require_auth and (not tls or client_auth is TlsClientAuth.NONE):
            self.add(f"{path}.requireAuth: authentication needs tls: true and tlsClientAuth "
                     "optional or required (brokers authenticate to each other with their "
                     "certificates)")
        return SecuritySpec(tls=tls, tls_client_auth=client_auth, require_auth=require_auth,
                            group_secret=group_secret, super_users=tuple(users))

    def network_policy(self, spec: Mapping[str, Any]) -> NetworkPolicySpec:
        raw = self.obj(spec, "spec", "networkPolicy", _NETWORK_POLICY_KEYS)
        return NetworkPolicySpec(
            enabled=self.boolean(raw, "spec.networkPolicy", "enabled", default=True),
            client_from=self._peers(raw, "clientFrom"),
            metrics_from=self._peers(raw, "metricsFrom"))

    def _peers(self, raw: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], ...] | None:
        value = raw.get(key)
        if value is None:
            return None
        path = f"spec.networkPolicy.{key}"
        if not isinstance(value, list):
            self.add(f"{path}: must be a list of NetworkPolicy peers")
            return None
        peers = []
        for i, peer in enumerate(value):
            if not isinstance(peer, Mapping) or not peer:
                self.add(f"{path}[{i}]: must be a NetworkPolicy peer (podSelector, "
                         "namespaceSelector and/or ipBlock)")
                continue
            self.unknown(peer, f"{path}[{i}]", _PEER_KEYS)
            peers.append(peer)
        return tuple(peers)
