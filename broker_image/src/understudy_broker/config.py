"""A broker's configuration: one frozen dataclass and the pure checks that make a bad
combination of flags fail before anything is opened.

Why this module exists: the CLI, the local cluster and the tests all build brokers; they
share one definition of what a valid broker configuration is, and the server never has
to second-guess its inputs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from understudy_broker.model import Permission, Role, parse_address, parse_zk_connect
from understudy_broker.protocol import DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE
from understudy_broker.replication.isr import DEFAULT_MAX_LAG_BYTES
from understudy_broker.storage.index import DEFAULT_INDEX_OPEN_FILES
from understudy_broker.zklayout import GroupConfig, LayoutError

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the flag."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Another broker of this group, as named by ``--peer NAME=HOST:PORT``."""

    name: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What the client port holds and for how long (docs/broker.md, "Limits"; applied by
    ``server/limits.py`` and ``server/connections.py``). ``idle_timeout_s`` 0: never close
    a connection for idleness or for not reading its answers."""

    #: Client connections served at once; more are answered BUSY and closed.
    max_connections: int = 10_000
    #: Close a connection that sends nothing with nothing in flight, or whose answers do
    #: not move, for this long.
    idle_timeout_s: float = 600.0
    #: A frame must be complete this long after its first byte (while the broker reads).
    frame_timeout_s: float = 30.0
    #: Requests of one connection being handled at once; beyond, it is not read.
    max_inflight_per_connection: int = 1024
    #: Answer bytes of one connection waiting for its client to read them; beyond, it is
    #: not read and no pull answer is built for it.
    max_unsent_bytes: int = 4 * 1024 * 1024
    #: Bytes of requests being received and handled, all connections together; beyond,
    #: connections wait (are not read) until some finish.
    max_request_memory: int = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """TLS, authentication and ACLs (docs/security.md). The default is open: no TLS, no
    authentication (``understudy local up --secure`` and the operator turn them on)."""

    #: Server certificate and key of the client and replication ports; the CA that
    #: verifies client certificates and peer brokers.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    #: Client certificates on the client port: ``none``, ``optional`` (a verified one
    #: authenticates its common name), ``required``.
    tls_client_auth: str = "optional"
    #: The HTTP side port (metrics, health) over TLS too.
    tls_http: bool = False
    #: Seconds between checks of the certificate files (a changed file is loaded for new
    #: connections, no restart).
    tls_reload_interval_s: float = 30.0
    #: Every client authenticates (SCRAM or a client certificate) and ACLs are enforced.
    require_auth: bool = False
    #: Users granted everything (brokers, a local cluster's admin).
    super_users: frozenset[str] = frozenset()
    #: The group's shared secret: the replication port accepts only brokers that prove it.
    group_secret: bytes | None = None
    #: Which decisions go to the ``understudy.audit`` log: ``off``, ``denied``, ``all``.
    audit: str = "denied"
    #: The SCRAM user this broker authenticates as on other brokers' client ports
    #: (back-sync, probes, escapes); without it, its certificate is its identity there.
    peer_user: str | None = None
    peer_password: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


CLIENT_AUTH_MODES = ("none", "optional", "required")
AUDIT_MODES = ("off", "denied", "all")


#: Listen addresses that mean "every interface": never an address to give a client.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def advertised_host(host: str, advertised: str | None, own_address: Callable[[], str]) -> str:
    """The host clients are told for this broker (its route): ``--advertised-host`` when
    given, else the listen address, unless that is a wildcard (``0.0.0.0`` in a container
    image): then ``own_address()`` (the machine's own name resolved, e.g. a container's or
    a pod's IP), which is looked up only then."""
    if advertised:
        return advertised
    return own_address() if host in WILDCARD_HOSTS else host


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    data_dir: Path
    port: int
    host: str = "127.0.0.1"
    #: What clients are told (the route); ``None``: :func:`advertised_host` decides.
    advertised_host: str | None = None
    http_port: int | None = None
    replication_port: int | None = None
    role: Role = Role.MASTER
    master: tuple[str, int] | None = None  # slave: the master's replication address
    name: str = "broker-0"
    group: str = "default"
    permission: Permission = Permission.FULL
    peers: tuple[Peer, ...] = field(default_factory=tuple)
    sync: bool = True
    segment_bytes: int = 64 * 1024 * 1024
    #: Queue index files held open at once (storage/index.py: OpenFiles); descriptors
    #: for them are kept from the client connections (server/limits.py).
    index_open_files: int = DEFAULT_INDEX_OPEN_FILES
    flush: str = "batch"  # "batch" | "interval"
    flush_interval_ms: int = 100
    retention_bytes: int | None = None
    retention_hours: float | None = None
    retention_check_interval_s: float = 10.0
    #: Quorum writes (seed 001 §9, docs/replication.md): the floor in slaves, the copies a
    #: write needs with the master counted (None: ``min_insync_replicas + 1``), and the
    #: byte lag beyond which a slave is not in sync.
    min_insync_replicas: int = 1
    auto_degrade: bool = False
    in_sync_replicas: int | None = None
    max_lag_bytes: int = DEFAULT_MAX_LAG_BYTES
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: The client port's resource limits (docs/broker.md, "Limits"; server/limits.py).
    limits: ClientLimits = field(default_factory=ClientLimits)
    ack_timeout_s: float = 5.0
    offsets_persist_interval_s: float = 1.0
    #: Slave: seconds without a byte from the master before the link counts as down.
    link_timeout_s: float = 3.0
    #: Coordination (DESIGN "ZooKeeper layout"): ``HOST:PORT[,...][/chroot]``; None = static.
    zk: str | None = None
    zk_session_timeout_ms: int = 4000
    #: ``(user, password)`` for ZooKeeper digest authentication and ACLs.
    zk_digest: tuple[str, str] | None = None
    security: SecurityConfig = field(default_factory=SecurityConfig)

    @property
    def coordinated(self) -> bool:
        """Permission comes from ZooKeeper (``--zk``) rather than from the flags."""
        return self.zk is not None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_hostport(text: str, *, what: str) -> tuple[str, int]:
    """``HOST:PORT`` with a port in 1-65535 (:func:`model.parse_address`), as a
    :class:`ConfigError` naming the flag."""
    try:
        return parse_address(text)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def parse_peer(text: str) -> Peer:
    """``NAME=HOST:PORT``."""
    name, sep, addr = text.partition("=")
    if not sep or not name:
        raise ConfigError(f"--peer: expected NAME=HOST:PORT, got {text!r}")
    host, port = parse_hostport(addr, what=f"--peer {name}")
    return Peer(name, host, port)


def validate(cfg: BrokerConfig) -> None:
    """Raise :class:`ConfigError` for the first invalid setting."""
    ports = {"--port": cfg.port, "--http-port": cfg.http_port}
    ports["--replication-port"] = cfg.replication_port
    for flag, port in ports.items():
        if port is not None and not 0 <= port <= 65535:
            raise ConfigError(f"{flag}: port {port} is outside 0-65535")
    used = [p for p in ports.values() if p]
    if len(used) != len(set(used)):
        raise ConfigError("--port, --http-port and --replication-port must differ")
    _validate_security(cfg)
    if cfg.role is Role.MASTER:
        if cfg.replication_port is None:
            raise ConfigError("a master needs --replication-port (slaves connect to it)")
        if cfg.master is not None:
            raise ConfigError("--master is for slaves; add --role slave")
    else:
        if cfg.master is None:
            raise ConfigError("a slave needs --master HOST:PORT (the master's replication port)")
        if cfg.permission & Permission.WRITE:
            raise ConfigError("a slave never writes: use --permission READ or NONE")
    if cfg.segment_bytes < 4096:
        raise ConfigError("--segment-bytes must be at least 4096")
    if cfg.index_open_files < 1:
        raise ConfigError("--index-open-files must be at least 1")
    if cfg.max_frame_bytes < HEADER_SIZE + 64:
        raise ConfigError(f"--max-frame-bytes must be at least {HEADER_SIZE + 64}")
    if cfg.max_frame_bytes + 1024 > cfg.segment_bytes:
        raise ConfigError("--max-frame-bytes must be smaller than --segment-bytes")
    _validate_limits(cfg)
    if cfg.flush not in ("batch", "interval"):
        raise ConfigError("--flush must be 'batch' or 'interval'")
    if cfg.flush_interval_ms < 1:
        raise ConfigError("--flush-interval-ms must be positive")
    if cfg.retention_bytes is not None and cfg.retention_bytes < cfg.segment_bytes:
        raise ConfigError("--retention-bytes must be at least one segment (--segment-bytes)")
    if cfg.retention_hours is not None and cfg.retention_hours <= 0:
        raise ConfigError("--retention-hours must be positive")
    if cfg.min_insync_replicas < 0:
        raise ConfigError("--min-insync-replicas must be 0 or more")
    if cfg.in_sync_replicas is not None and cfg.in_sync_replicas < cfg.min_insync_replicas + 1:
        raise ConfigError(
            f"--in-sync-replicas {cfg.in_sync_replicas} counts the master: it must be at least "
            f"--min-insync-replicas + 1 ({cfg.min_insync_replicas + 1})")
    if cfg.max_lag_bytes < 1:
        raise ConfigError("--max-lag-bytes must be positive")
    if cfg.link_timeout_s <= 0:
        raise ConfigError("--link-timeout-ms must be positive")
    if cfg.zk is not None:
        _validate_coordination(cfg)
    names = [p.name for p in cfg.peers]
    if cfg.name in names or len(names) != len(set(names)):
        raise ConfigError("--peer names must be unique and differ from --name")


def _validate_security(cfg: BrokerConfig) -> None:
    sec = cfg.security
    if (sec.tls_cert is None) != (sec.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if sec.tls_client_auth not in CLIENT_AUTH_MODES:
        raise ConfigError(f"--tls-client-auth: one of {', '.join(CLIENT_AUTH_MODES)}")
    if sec.tls_client_auth == "required" and sec.tls_ca is None:
        raise ConfigError("--tls-client-auth required needs --tls-ca (to verify them)")
    if (sec.tls_ca is not None or sec.tls_http) and not sec.tls:
        raise ConfigError("--tls-ca and --tls-http need --tls-cert and --tls-key")
    if sec.require_auth and not cfg.coordinated:
        raise ConfigError("--require-auth needs --zk: users and ACLs live in ZooKeeper")
    if sec.audit not in AUDIT_MODES:
        raise ConfigError(f"--audit: one of {', '.join(AUDIT_MODES)}")
    if sec.tls_reload_interval_s <= 0:
        raise ConfigError("--tls-reload-interval must be positive")
    if (sec.peer_user is None) != (sec.peer_password is None):
        raise ConfigError("--peer-user and --peer-password-file go together")
    if sec.group_secret is not None:
        lines = [x.strip() for x in sec.group_secret.splitlines() if x.strip()]
        if not lines or any(len(x) < 16 for x in lines):
            raise ConfigError("--group-secret-file: each secret (one per line) at least 16 "
                              "bytes (make one with `head -c 32 /dev/urandom | base64`)")


def _validate_limits(cfg: BrokerConfig) -> None:
    """The client port's limits (docs/broker.md, "Limits")."""
    lim = cfg.limits
    if lim.max_connections < 1:
        raise ConfigError("--max-connections must be at least 1")
    if lim.idle_timeout_s < 0:
        raise ConfigError("--idle-timeout must be 0 (never) or positive")
    if lim.frame_timeout_s <= 0:
        raise ConfigError("--frame-timeout must be positive")
    if lim.max_inflight_per_connection < 1:
        raise ConfigError("--max-inflight-per-connection must be at least 1")
    if lim.max_unsent_bytes < 64 * 1024:
        raise ConfigError("--max-unsent-bytes must be at least 65536")
    if lim.max_request_memory < cfg.max_frame_bytes:
        raise ConfigError(
            f"--max-request-memory ({lim.max_request_memory}) must hold at least one frame "
            f"of --max-frame-bytes ({cfg.max_frame_bytes})")


def _validate_coordination(cfg: BrokerConfig) -> None:
    """The ``--zk`` flags: names become znode names, timeouts must allow a read lease."""
    try:
        parse_zk_connect(cfg.zk or "")
    except ValueError as exc:
        raise ConfigError(f"--zk: {exc}") from None
    for kind, name in (("--group", cfg.group), ("--name", cfg.name)):
        if not _DNS_LABEL.match(name):
            raise ConfigError(
                f"{kind} {name!r}: with --zk it must be a DNS label ([a-z0-9-], at most 63)")
    if cfg.port == 0:
        raise ConfigError("--port 0 cannot be used with --zk: the group config names the port")
    if not 500 <= cfg.zk_session_timeout_ms <= 600_000:
        raise ConfigError("--zk-session-timeout-ms must be 500-600000")


def spec_mismatch(cfg: BrokerConfig, group: GroupConfig) -> str | None:
    """Why this broker's flags contradict its BrokerSpec in the group config, or None.
    (Ports and role come from the flags; the config is what clients and the controller
    are told.)"""
    try:
        spec = group.broker(cfg.name)
    except LayoutError as exc:
        return str(exc)
    problems = []
    if spec.role is not cfg.role:
        problems.append(f"role {spec.role.value} (ordinal {spec.ordinal}), flags say {cfg.role.value}")
    if spec.port != cfg.port:
        problems.append(f"--port {spec.port}, flags say {cfg.port}")
    if cfg.role is Role.MASTER and spec.replication_port != cfg.replication_port:
        problems.append(
            f"--replication-port {spec.replication_port}, flags say {cfg.replication_port}")
    if cfg.http_port is not None and spec.http_port != cfg.http_port:
        problems.append(f"--http-port {spec.http_port}, flags say {cfg.http_port}")
    if not problems:
        return None
    return f"group {group.group!r} config for broker {cfg.name!r} says " + "; ".join(problems)
