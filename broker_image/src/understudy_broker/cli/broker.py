"""``understudy broker``: run one broker (master or slave) in the foreground.

Why this module exists: it is the process entry point the operator, the local cluster,
the tests and people all use. It turns flags into a validated
:class:`~understudy_broker.config.BrokerConfig` (bad flags exit 2 with a message naming
the flag), runs the :class:`~understudy_broker.server.broker.Broker` on uvloop when available,
and turns SIGTERM/SIGINT into a clean stop (in-flight requests finish, log and offsets
are flushed, exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import click

from understudy_broker.config import (
    BrokerConfig,
    ClientLimits,
    ConfigError,
    SecurityConfig,
    parse_hostport,
    parse_peer,
    validate,
)
from understudy_broker.model import Permission, Role
from understudy_broker.protocol import DEFAULT_MAX_FRAME_BYTES
from understudy_broker.replication.isr import DEFAULT_MAX_LAG_BYTES
from understudy_broker.security import SecurityConfigError, read_secret
from understudy_broker.server.limits import fd_reserve, nofile_wanted
from understudy_broker.storage.index import DEFAULT_INDEX_OPEN_FILES
from understudy_broker.zkclient import parse_digest

#: Slave master-link timeout. With coordination it bounds how soon a hung master is
#: fenced (the controller needs the slave's link down), so it is shorter there.
DEFAULT_LINK_TIMEOUT_MS = 3000
DEFAULT_LINK_TIMEOUT_ZK_MS = 1000
#: The client port's limits by default (docs/broker.md, "Limits").
LIMITS = ClientLimits()


def _config_from_flags(
    *,
    data_dir: str,
    port: int,
    host: str,
    http_port: int | None,
    advertised_host: str | None = None,
    replication_port: int | None,
    role: str,
    master: str | None,
    name: str | None,
    group: str,
    permission: str | None,
    peer: tuple[str, ...],
    sync: bool,
    segment_bytes: int,
    flush: str,
    index_open_files: int = DEFAULT_INDEX_OPEN_FILES,
    flush_interval_ms: int,
    retention_bytes: int | None,
    retention_hours: float | None,
    retention_check_interval: float,
    min_insync_replicas: int,
    auto_degrade: bool,
    in_sync_replicas: int | None,
    max_lag_bytes: int,
    ack_timeout: float,
    max_frame_bytes: int,
    max_connections: int = LIMITS.max_connections,
    idle_timeout: float = LIMITS.idle_timeout_s,
    frame_timeout: float = LIMITS.frame_timeout_s,
    max_inflight_per_connection: int = LIMITS.max_inflight_per_connection,
    max_unsent_bytes: int = LIMITS.max_unsent_bytes,
    max_request_memory: int = LIMITS.max_request_memory,
    link_timeout_ms: int | None = None,
    zk: str | None = None,
    zk_session_timeout_ms: int = 4000,
    zk_digest: str | None = None,
    zk_digest_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    tls_client_auth: str = "optional",
    tls_http: bool = False,
    tls_reload_interval: float = 30.0,
    require_auth: bool = False,
    super_user: tuple[str, ...] = (),
    group_secret_file: str | None = None,
    audit: str = "denied",
    peer_user: str | None = None,
    peer_password_file: str | None = None,
) -> BrokerConfig:
    """Flags -> config; raises ConfigError/ValueError with a message naming the flag."""
    the_role = Role(role)
    perm = (
        Permission.parse(permission)
        if permission is not None
        else (Permission.FULL if the_role is Role.MASTER else Permission.NONE)
    )
    return BrokerConfig(
        data_dir=Path(data_dir),
        port=port,
        host=host,
        advertised_host=advertised_host,
        http_port=http_port,
        replication_port=replication_port,
        role=the_role,
        master=parse_hostport(master, what="--master") if master else None,
        name=name or ("broker-0" if the_role is Role.MASTER else "broker-1"),
        group=group,
        permission=perm,
        peers=tuple(parse_peer(x) for x in peer),
        sync=sync,
        segment_bytes=segment_bytes,
        index_open_files=index_open_files,
        flush=flush,
        flush_interval_ms=flush_interval_ms,
        retention_bytes=retention_bytes,
        retention_hours=retention_hours,
        retention_check_interval_s=retention_check_interval,
        min_insync_replicas=min_insync_replicas,
        auto_degrade=auto_degrade,
        in_sync_replicas=in_sync_replicas,
        max_lag_bytes=max_lag_bytes,
        max_frame_bytes=max_frame_bytes,
        limits=ClientLimits(
            max_connections=max_connections,
            idle_timeout_s=idle_timeout,
            frame_timeout_s=frame_timeout,
            max_inflight_per_connection=max_inflight_per_connection,
            max_unsent_bytes=max_unsent_bytes,
            max_request_memory=max_request_memory,
        ),
        ack_timeout_s=ack_timeout,
        link_timeout_s=(link_timeout_ms if link_timeout_ms is not None
                        else DEFAULT_LINK_TIMEOUT_ZK_MS if zk else DEFAULT_LINK_TIMEOUT_MS) / 1000,
        zk=zk,
        zk_session_timeout_ms=zk_session_timeout_ms,
        zk_digest=_digest(zk_digest, zk_digest_file),
        security=SecurityConfig(
            tls_cert=_path(tls_cert), tls_key=_path(tls_key), tls_ca=_path(tls_ca),
            tls_client_auth=tls_client_auth, tls_http=tls_http,
            tls_reload_interval_s=tls_reload_interval, require_auth=require_auth,
            super_users=frozenset(super_user),
            group_secret=_secret_bytes(group_secret_file, "--group-secret-file"),
            audit=audit, peer_user=peer_user,
            peer_password=_secret_text(peer_password_file, "--peer-password-file"),
        ),
    )


def _digest(text: str | None, file: str | None = None) -> tuple[str, str] | None:
    flag = "--zk-digest"
    if file is not None:
        if text:
            raise ConfigError("--zk-digest and --zk-digest-file: give one")
        text, flag = _secret_text(file, "--zk-digest-file"), "--zk-digest-file"
    if not text:
        return None
    try:
        return parse_digest(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def _path(text: str | None) -> Path | None:
    return None if text is None else Path(text)


def _secret_text(file: str | None, flag: str) -> str | None:
    if file is None:
        return None
    try:
        return read_secret(Path(file))
    except SecurityConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def _secret_bytes(file: str | None, flag: str) -> bytes | None:
    text = _secret_text(file, flag)
    return None if text is None else text.encode()


@click.command(short_help="Run a broker (master or slave).",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", required=True, type=click.Path(file_okay=False), help="Log, indexes, offsets and topics live here.")
@click.option("--port", required=True, type=int, help="Client port (0 = pick a free one; not with --zk).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--advertised-host", default=None,
              help="Address clients are told for this broker (default: --host; for 0.0.0.0 or "
                   "::, this machine's own name resolved, e.g. a container's IP).")
@click.option("--http-port", type=int, default=None, help="Side port for /metrics, /healthz, /readyz.")
@click.option("--replication-port", type=int, default=None, help="Master: port slaves replicate from.")
@click.option("--role", type=click.Choice(["master", "slave"]), default="master", show_default=True)
@click.option("--master", default=None, metavar="HOST:PORT", help="Slave: the master's replication address.")
@click.option("--name", default=None, help="Broker name (default broker-0 for a master, broker-1 for a slave).")
@click.option("--group", default="default", show_default=True, help="Broker group name.")
@click.option("--permission", default=None, type=click.Choice(["FULL", "WRITE", "READ", "NONE"], case_sensitive=False),
              help="Configured permission (default FULL for a master, NONE for a slave).")
@click.option("--peer", multiple=True, metavar="NAME=HOST:PORT", help="Another broker of the group (repeatable), for routes.")
@click.option("--sync/--async", "sync", default=True, show_default=True,
              help="Synchronous replication acknowledges a produce only after a slave persisted it.")
@click.option("--segment-bytes", type=int, default=64 * 1024 * 1024, show_default=True)
@click.option("--index-open-files", type=int, default=DEFAULT_INDEX_OPEN_FILES, show_default=True,
              help="Queue index files held open at once (least recently used closed first; "
                   "each queue written has one). Descriptors for them are kept from "
                   "--max-connections.")
@click.option("--flush", type=click.Choice(["batch", "interval"]), default="batch", show_default=True,
              help="batch: fsync (group commit) before every acknowledgement; interval: every --flush-interval-ms.")
@click.option("--flush-interval-ms", type=int, default=100, show_default=True)
@click.option("--retention-bytes", type=int, default=None, help="Delete old segments beyond this many bytes.")
@click.option("--retention-hours", type=float, default=None, help="Delete segments older than this.")
@click.option("--retention-check-interval", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, metavar="SECONDS",
              help="How often retention looks for segments to delete.")
@click.option("--min-insync-replicas", type=int, default=1, show_default=True,
              help="Sync mode: the fewest in-sync slaves a write is ever acknowledged with "
                   "(the floor under --auto-degrade; 0 lets the master acknowledge alone).")
@click.option("--in-sync-replicas", type=int, default=None,
              help="Sync mode: copies a write needs, the master included (default "
                   "--min-insync-replicas + 1); fewer in sync: NOT_ENOUGH_REPLICAS.")
@click.option("--auto-degrade/--no-auto-degrade", default=False, show_default=True,
              help="Sync mode: when fewer than --in-sync-replicas copies are in sync, need "
                   "only those, down to the --min-insync-replicas floor.")
@click.option("--max-lag-bytes", type=int, default=DEFAULT_MAX_LAG_BYTES, show_default=True,
              help="Sync mode: a slave this many bytes behind leaves the in-sync set "
                   "(as does one that has not acknowledged within the link timeout).")
@click.option("--ack-timeout", type=float, default=5.0, show_default=True, help="Sync mode: seconds to wait for a slave.")
@click.option("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES, show_default=True,
              help="Largest request frame; a larger one is answered TOO_LARGE from its header "
                   "and its connection closed.")
@click.option("--max-connections", type=int, default=LIMITS.max_connections, show_default=True,
              help="Client connections served at once; one more is answered BUSY (retriable) "
                   "and closed. Never more than the open-file limit minus 1024 kept for "
                   "storage (the broker raises its soft limit to fit).")
@click.option("--idle-timeout", type=float, default=LIMITS.idle_timeout_s, show_default=True,
              help="Seconds: close a connection that sends nothing with no request in flight "
                   "(a waiting long-poll is in flight), or that reads none of its answers, for "
                   "this long; 0 = never.")
@click.option("--frame-timeout", type=float, default=LIMITS.frame_timeout_s, show_default=True,
              help="Seconds: a frame must be complete this long after its first byte (time "
                   "the broker holds the connection back does not count); else TIMEOUT and "
                   "the connection is closed.")
@click.option("--max-inflight-per-connection", type=int,
              default=LIMITS.max_inflight_per_connection, show_default=True,
              help="Requests of one connection handled at once; beyond, it is not read "
                   "(its client's sends block) until some finish.")
@click.option("--max-unsent-bytes", type=int, default=LIMITS.max_unsent_bytes, show_default=True,
              help="Answer bytes of one connection waiting for its client to read them; "
                   "beyond, it is not read and no pull answer is built for it. Also caps "
                   "one pull answer.")
@click.option("--max-request-memory", type=int, default=LIMITS.max_request_memory,
              show_default=True,
              help="Bytes of requests being received and handled, all connections together "
                   "(a frame counts from its header); beyond, connections sending produces "
                   "or large requests are not read until some finish. At least "
                   "--max-frame-bytes.")
@click.option("--link-timeout-ms", type=int, default=None,
              help="Slave: no byte from the master for this long means the link is down "
                   "(default 1000 with --zk, else 3000; the master sends metadata every "
                   "250 ms). The read lease is derived from it: use one value for a whole group.")
@click.option("--zk", default=None, metavar="HOST:PORT[,HOST:PORT...][/CHROOT]",
              help="Take permission from ZooKeeper (register, watch the group state, publish "
                   "status, read lease) instead of --permission alone. The group config in "
                   "ZooKeeper must name this broker with the same ports.")
@click.option("--zk-session-timeout-ms", type=int, default=4000, show_default=True,
              help="ZooKeeper session timeout; the read lease is derived from it.")
@click.option("--zk-digest", default=None, metavar="USER:PASSWORD", envvar="UNDERSTUDY_ZK_DIGEST",
              help="ZooKeeper digest identity (also env UNDERSTUDY_ZK_DIGEST); nodes get its ACL.")
@click.option("--zk-digest-file", default=None, metavar="FILE",
              help="A file holding USER:PASSWORD, instead of --zk-digest (a mounted Secret).")
@click.option("--tls-cert", default=None, metavar="FILE",
              help="Serve TLS on the client and replication ports with this certificate "
                   "(PEM; with --tls-key). It is also this broker's client certificate "
                   "towards its peers.")
@click.option("--tls-key", default=None, metavar="FILE", help="The certificate's private key.")
@click.option("--tls-ca", default=None, metavar="FILE",
              help="CA certificates that verify client certificates and peer brokers.")
@click.option("--tls-client-auth", type=click.Choice(["none", "optional", "required"]),
              default="optional", show_default=True,
              help="Client certificates on the client port (a verified one authenticates "
                   "its common name as the user).")
@click.option("--tls-http", is_flag=True, default=False,
              help="Serve the HTTP side port (metrics, health) over TLS too.")
@click.option("--tls-reload-interval", type=click.FloatRange(min=0.1), default=30.0,
              show_default=True,
              help="Seconds between checks of the certificate files; a changed pair is "
                   "used for new connections without a restart.")
@click.option("--require-auth", is_flag=True, default=False,
              help="Every client authenticates (SCRAM or a client certificate) and ACLs "
                   "in ZooKeeper are enforced (needs --zk).")
@click.option("--super-user", multiple=True, metavar="NAME",
              help="A user granted everything (repeatable): brokers, the cluster admin.")
@click.option("--group-secret-file", default=None, metavar="FILE",
              help="The group's shared secret: the replication port serves only brokers "
                   "that prove it (and a slave replicates only from a master that does).")
@click.option("--audit", type=click.Choice(["off", "denied", "all"]), default="denied",
              show_default=True,
              help="Which authorisation decisions go to the understudy.audit log.")
@click.option("--peer-user", default=None, metavar="NAME",
              help="SCRAM user this broker authenticates as on its peers' client ports "
                   "(else its certificate is its identity there).")
@click.option("--peer-password-file", default=None, metavar="FILE",
              help="The --peer-user's password.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def broker(log_level: str, **flags: Any) -> None:
    """Run a broker. A master: --data-dir DIR --port P --replication-port R; a slave: add
    --role slave --master HOST:R. With --zk ... --group G --name N the broker's permission
    comes from the group's state in ZooKeeper. SIGTERM/SIGINT stop it cleanly; SIGUSR1
    writes every asyncio task and where it waits to the log (it keeps running)."""
    try:
        cfg = _config_from_flags(**flags)
        validate(cfg)
    except (ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _fit_open_files(cfg)
    try:
        _run_on_best_loop(cfg)
    except ConfigError as exc:
        raise click.ClickException(f"broker refused to start: {exc}") from exc
    except Exception as exc:
        raise click.ClickException(f"broker failed: {type(exc).__name__}: {exc}") from exc


def _fit_open_files(cfg: BrokerConfig) -> None:
    """Raise the soft open-file limit (up to the hard one) so --max-connections fits next
    to the descriptors storage needs; the client port serves fewer (and says so) if not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = nofile_wanted(cfg.limits.max_connections, fd_reserve(cfg.index_open_files))
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def _run_on_best_loop(cfg: BrokerConfig) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        asyncio.run(_run(cfg))
        return
    uvloop.run(_run(cfg))


def _dump_tasks() -> None:
    """SIGUSR1: write every asyncio task and where it waits to stderr (the broker's log),
    for a broker that is alive but stuck (``kill -USR1 <pid>``; it keeps running)."""
    tasks = asyncio.all_tasks()
    lines = [f"--- {len(tasks)} tasks (SIGUSR1)"]
    for task in sorted(tasks, key=lambda t: t.get_name()):
        lines.append(f"{task.get_name()}:")
        obj: Any = task.get_coro()
        while obj is not None:  # the await chain, outermost first
            frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
            if frame is not None:
                lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} "
                             f"{frame.f_code.co_name}")
            else:
                lines.append(f"    {obj!r}")
            obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    lines.append("--- end of tasks")
    print("\n".join(lines), file=sys.stderr, flush=True)


async def _run(cfg: BrokerConfig) -> None:
    from understudy_broker.server.broker import Broker

    server = Broker(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    where = await server.start()
    # Everything allocated so far lives as long as the process: keep it out of the
    # garbage collector's full scans (shorter pauses on the produce path).
    gc.freeze()
    source = f"coordinated by {cfg.zk}" if cfg.zk else f"permission {cfg.permission.label}"
    parts = [f"understudy broker {cfg.name} ({cfg.role.value}, group {cfg.group}, "
             f"{source}, {'sync' if cfg.sync else 'async'}) "
             f"clients {where.host}:{where.port}"]
    if where.replication_port is not None:
        parts.append(f"replication {where.host}:{where.replication_port}")
    if cfg.master is not None:
        parts.append(f"replicating from {cfg.master[0]}:{cfg.master[1]}")
    if where.http_port is not None:
        parts.append(f"http {where.host}:{where.http_port}")
    parts.append(f"data {cfg.data_dir}")
    print(", ".join(parts), flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    print(f"understudy broker {cfg.name}: stopped cleanly", flush=True)
