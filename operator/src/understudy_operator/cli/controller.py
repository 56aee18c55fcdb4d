"""``understudy controller``: run the failover controller for one or more groups.

Why this module exists: in local mode (``understudy local up``, the drill, the tests) the
controller is a process of its own, started against a ZooKeeper and a pid directory. This
is its command line: parse, build the driver, serve ``/metrics``, log every transition
with its reason, and on SIGTERM/SIGINT resign (close the session so another controller
takes over at once) and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import click
from prometheus_client import start_http_server

from understudy_broker.zklayout import LayoutError, check_name
from understudy_operator.cli.options import check_zk_connect, digest_option
from understudy_operator.controller.driver import Controller, ControllerMetrics, log_transition
from understudy_operator.controller.journal import TransitionJournal
from understudy_operator.controller.liveness import (
    LivenessSource,
    NullLiveness,
    ProcessTableLiveness,
)
from understudy_operator.zk import Digest

log = logging.getLogger("understudy.controller")


@click.command(short_help="Run the failover controller.",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--zk", "connect", required=True, metavar="HOST:PORT[,HOST:PORT...][/CHROOT]",
              callback=check_zk_connect,
              help="ZooKeeper connect string, with the chroot (e.g. 127.0.0.1:2181/understudy).")
@click.option("--group", "groups", multiple=True, required=True, metavar="G",
              help="A group to control; repeat for several.")
@click.option("--pid-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Directory with <broker>.pid files (required for --liveness process).")
@click.option("--http-port", type=click.IntRange(0, 65535), required=True,
              help="Port for /metrics (0 picks a free one; the port is logged).")
@click.option("--http-host", default="127.0.0.1", show_default=True,
              help="Address for /metrics.")
@click.option("--liveness", type=click.Choice(["process", "none"]), default="process",
              show_default=True,
              help="Where process deaths come from: the pid files and process table, or "
                   "nowhere (ZooKeeper signals only).")
@click.option("--session-timeout", type=click.FloatRange(0.5, 60), default=4.0,
              show_default=True, help="Controller ZooKeeper session timeout, seconds.")
@digest_option
@click.option("--transitions-log", type=click.Path(dir_okay=False, path_type=Path),
              help="Append every transition this controller makes as a JSON line "
                   "{t_ns, group, mode, epoch, acting, reason} (an audit trail; the drill reads it).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def controller(connect: str, groups: tuple[str, ...], pid_dir: Path | None, http_port: int,
               http_host: str, liveness: str, session_timeout: float, digest: Digest | None,
               transitions_log: Path | None, verbose: bool) -> None:
    """Run the failover controller: elect a leader per group, watch the brokers, and move
    each group through NORMAL, FENCING, SLAVE_CONSUME and RECOVERING as DESIGN.md says.
    Logs every transition with its reason; SIGTERM resigns and exits cleanly."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    for g in groups:
        try:
            check_name("group", g)
        except LayoutError as exc:
            raise click.BadParameter(str(exc), param_hint="--group") from None
    if liveness == "process" and pid_dir is None:
        raise click.UsageError("--liveness process needs --pid-dir")
    auth = digest
    try:
        asyncio.run(_run(connect=connect, groups=groups, pid_dir=pid_dir, http_host=http_host,
                         http_port=http_port, liveness=liveness,
                         session_timeout=session_timeout, auth=auth,
                         transitions_log=transitions_log))
    except OSError as exc:
        raise click.ClickException(f"cannot serve /metrics on {http_host}:{http_port}: {exc}") from exc


async def _run(*, connect: str, groups: tuple[str, ...], pid_dir: Path | None, http_host: str,
               http_port: int, liveness: str, session_timeout: float,
               auth: tuple[str, str] | None, transitions_log: Path | None) -> None:
    loop = asyncio.get_running_loop()
    source: LivenessSource = (
        ProcessTableLiveness(pid_dir, loop) if liveness == "process" and pid_dir is not None
        else NullLiveness()
    )
    metrics = ControllerMetrics()
    server, thread = start_http_server(http_port, addr=http_host, registry=metrics.registry)
    log.info("metrics on http://%s:%d/metrics", http_host, server.server_port)
    journal = TransitionJournal(transitions_log) if transitions_log is not None else None
    ctl = Controller(connect, groups=groups, liveness=source, loop=loop,
                     session_timeout_s=session_timeout, digest_auth=auth, metrics=metrics,
                     on_transition=journal.record if journal is not None else log_transition)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await ctl.start()
        except Exception as exc:
            raise click.ClickException(f"cannot reach ZooKeeper at {connect}: {exc!r}") from exc
        log.info("controller %s started for %s (liveness: %s)", ctl.identity, ", ".join(groups),
                 liveness)
        await stop.wait()
        log.info("controller %s resigning", ctl.identity)
    finally:
        await ctl.stop()
        if journal is not None:
            journal.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
