"""``understudy local``: a whole Understudy cluster on this machine, without Kubernetes.

Why this module exists: the embedded default. A person (or the drill, or a test) gets a
private ZooKeeper, broker groups and the failover controller with one command, can look
at them, wound them and stop them. The work is done by
:mod:`understudy_operator.local.cluster`; this module only parses flags and prints.
Bad input (unknown broker, no cluster in the directory, a directory in use) is a clear
message and exit status 2.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from understudy_broker.replication.isr import DEFAULT_MAX_LAG_BYTES
from understudy_broker.zklayout import ReplicationPolicy
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import ADMIN_USER, DEFAULT_DIR, PlanError

_out = Console()
_err = Console(stderr=True)

dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="State directory of the local cluster (cluster.json, pids/, logs/, data/).",
)


class LocalUsageError(click.ClickException):
    """Printed as 'Error: ...' with exit status 2 (bad input, not a crash)."""

    exit_code = 2


def _fail(exc: Exception) -> LocalUsageError:
    return LocalUsageError(str(exc))


@click.group(short_help="Run a cluster on this machine, no Kubernetes.",
             context_settings={"help_option_names": ["-h", "--help"]})
def local() -> None:
    """Run a cluster on this machine: a private ZooKeeper, broker groups (g1-0 is the
    master of g1, g1-1.. its slaves) and the failover controller, as detached processes
    with pid files and logs under --dir."""
    # kazoo logs every dropped connection at WARNING; a CLI user only needs our messages
    logging.getLogger("kazoo").setLevel(logging.ERROR)


@local.command()
@dir_option
@click.option("--groups", type=click.IntRange(1, 50), default=1, show_default=True, help="Broker groups.")
@click.option("--slaves", type=click.IntRange(0, 8), default=1, show_default=True, help="Slaves per group.")
@click.option("--sync/--async", default=True, show_default=True, help="Replication mode.")
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(1000, 10000),
    default=2000,
    show_default=True,
    help="ZooKeeper session timeout for brokers (how long a hung master keeps its session).",
)
@click.option("--min-insync-replicas", type=click.IntRange(0, 8), default=None,
              help="Sync mode: the fewest in-sync slaves a write is acknowledged with "
                   "[default: 1, 0 without slaves].")
@click.option("--in-sync-replicas", type=click.IntRange(1, 9), default=None,
              help="Sync mode: copies a write needs, the master included "
                   "[default: --min-insync-replicas + 1].")
@click.option("--auto-degrade/--no-auto-degrade", default=False, show_default=True,
              help="Sync mode: with fewer copies in sync, need only those (down to the floor).")
@click.option("--max-lag-bytes", type=click.IntRange(1, None), default=DEFAULT_MAX_LAG_BYTES,
              show_default=True, help="Sync mode: a slave this far behind is not in sync.")
@click.option("--zk-ensemble", type=click.Choice([str(n) for n in lc.ZK_ENSEMBLE_SIZES]),
              default="1", show_default=True,
              help="ZooKeeper servers: 1 standalone, or an ensemble (zk1..zkN, each its own "
                   "process, killed and started like a broker).")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait for NORMAL.")
@click.option("--secure", is_flag=True, default=False,
              help="TLS on every broker port, SCRAM and ACLs: a certificate authority, the "
                   "brokers' certificate, group secrets and an admin user are made under "
                   "DIR/security (docs/security.md).")
def up(directory: Path, groups: int, slaves: int, sync: bool, session_timeout_ms: int,
       min_insync_replicas: int | None, in_sync_replicas: int | None, auto_degrade: bool,
       max_lag_bytes: int, zk_ensemble: str, timeout: float, secure: bool) -> None:
    """Start the cluster; return once every group is NORMAL and its master reads.
    Quorum writes: docs/replication.md."""
    replication = ReplicationPolicy(
        sync=sync, min_insync=min(1, slaves) if min_insync_replicas is None else min_insync_replicas,
        auto_degrade=auto_degrade, in_sync_replicas=in_sync_replicas, max_lag_bytes=max_lag_bytes)
    try:
        with _err.status("starting") as live:
            plan = lc.up(
                directory,
                groups=groups,
                slaves=slaves,
                sync=sync,
                replication=replication,
                session_timeout_ms=session_timeout_ms,
                zk_ensemble=int(zk_ensemble),
                timeout=timeout,
                progress=lambda msg: live.update(msg),
                secure=secure,
            )
    except (lc.LocalError, PlanError) as exc:
        raise _fail(exc) from None
    _out.print(lc.describe(plan))
    if plan.secure:
        files = plan.security
        _out.print(f"secure: TLS on every port, SCRAM and ACLs. The admin user is "
                   f"'{ADMIN_USER}', its password in {files.admin_password} (owner-only); "
                   f"the CA certificate is {files.ca_cert}.")
        _out.print("connect as the admin: understudy topic list -b "
                   f"{plan.address(plan.groups[0].master.name)} "
                   + " ".join(files.client_argv()))
    _out.print(f"stop it with: understudy local down --dir {plan.dir}")


@local.command()
@dir_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def status(directory: Path, as_json: bool) -> None:
    """Groups (mode, epoch, acting slave), brokers (role, effective permission, pid,
    alive, replication lag) and ZooKeeper servers (pid, port, mode: leader/follower), from
    ZooKeeper, each server's 'srvr' answer and the pid table."""
    try:
        st = lc.status(directory)
    except (lc.LocalError, PlanError) as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(st.to_json(), indent=2))
        return
    zk = "[green]up[/]" if st.zk_alive else "[red]down[/]"
    ctl = "[green]up[/]" if st.controller_alive else "[red]down[/]"
    _out.print(f"state {st.dir}   zookeeper {st.zk} {zk}   controller {ctl}")
    if len(st.zk_nodes) > 1:
        nodes = Table("zookeeper", "pid", "port", "mode", "alive",
                      title="zookeeper ensemble", title_justify="left")
        for n in st.zk_nodes:
            nodes.add_row(n.name, "-" if n.pid is None else str(n.pid), str(n.port),
                          n.mode or "-", _alive(n.alive, n.stopped))
        _out.print(nodes)
    for g in st.groups:
        mode = g.mode or "no state"
        epoch = "-" if g.epoch is None else str(g.epoch)
        table = Table(
            "broker", "role", "effective", "pid", "alive", "lag (bytes)",
            title=f"group {g.name}: {mode}, epoch {epoch}, acting {g.acting or '-'}",
            title_justify="left",
        )  # fmt: skip
        for b in g.brokers:
            table.add_row(
                b.name,
                b.role,
                b.effective.label if b.source != "-" else "-",
                "-" if b.pid is None else str(b.pid),
                _alive(b.alive, b.stopped),
                "-" if b.lag_bytes is None else str(b.lag_bytes),
            )
        _out.print(table)


def _alive(alive: bool, stopped: bool) -> str:
    if alive and not stopped:
        return "[green]yes[/]"
    return "[yellow]stopped[/]" if alive else "[red]no[/]"


@local.command()
@dir_option
@click.argument("broker")
@click.option(
    "--signal",
    "sig",
    type=click.Choice(["KILL", "STOP", "TERM", "CONT"], case_sensitive=False),
    default="KILL",
    show_default=True,
    help="KILL: crash it; STOP: freeze it (resume with 'local start' or --signal CONT); TERM: stop it cleanly.",
)
def kill(directory: Path, broker: str, sig: str) -> None:
    """Send a signal to one broker or ZooKeeper server (names as 'local status' shows
    them: g1-0, ..., zk1 ...)."""
    try:
        pid = lc.kill(directory, broker, sig=sig)
    except (lc.LocalError, PlanError) as exc:
        raise _fail(exc) from None
    _out.print(f"sent SIG{sig.upper()} to {broker} (pid {pid})")


@local.command()
@dir_option
@click.argument("broker")
def start(directory: Path, broker: str) -> None:
    """Start a broker or ZooKeeper server that is down, exactly as 'up' did (a frozen one
    is resumed)."""
    try:
        pid = lc.start(directory, broker)
    except (lc.LocalError, PlanError) as exc:
        raise _fail(exc) from None
    _out.print(f"{broker} running (pid {pid})")


@local.command()
@dir_option
def down(directory: Path) -> None:
    """Stop everything 'up' started (controller, brokers, ZooKeeper), each by its PID."""
    try:
        stopped = lc.down(directory, progress=lambda msg: _out.print(msg))
    except (lc.LocalError, PlanError) as exc:
        raise _fail(exc) from None
    if not stopped:
        _out.print("nothing was running")
    _out.print(f"logs and data kept in {directory.resolve()}")
