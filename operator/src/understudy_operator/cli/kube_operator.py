"""``understudy operator``: run the BrokerGroup operator (kopf) — the command the Helm chart's
Deployment starts.

Why this module exists: the chart's contract is one command line
(``--zk CONNECT/CHROOT (--all-namespaces | --namespace NS ...) --metrics-port 8080
--health-port 8081 --log-level LEVEL --zk-digest-file FILE --ca-secret NS/NAME``); this module turns it into an :class:`OperatorConfig`,
finds the API server credentials the way kopf does (service account in a pod, else kubeconfig,
or ``--server`` for a local proxy or emulator), serves ``/metrics`` and kopf's liveness probe,
and runs :func:`understudy_operator.handlers.app.run`. Bad flags are click usage errors.
kopf and the handlers are imported when the command runs, not when ``understudy --help``
lists it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from understudy_broker.model import parse_zk_connect
from understudy_operator.cli.options import digest_option
from understudy_operator.k8s.spec import chroot_problem, connect_problem

if TYPE_CHECKING:
    import kopf

    from understudy_operator.zk import Digest

log = logging.getLogger("understudy.operator")

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def split_ca_secret(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` -> (namespace, name); ``ValueError`` if bad."""
    ns, slash, name = value.partition("/")
    if not slash or not _NAME.match(ns) or not _NAME.match(name):
        raise ValueError(f"{value!r}: expected NAMESPACE/NAME of a Secret")
    return ns, name


def split_zk(value: str) -> tuple[str, str | None]:
    """``host:port[,host:port]/chroot`` -> (connect, chroot or None); ``ValueError`` if
    bad: the rules of every ``--zk`` (:func:`understudy_broker.model.parse_zk_connect`),
    and, as both become the default of specs that name none, a manifest's
    (:func:`~understudy_operator.k8s.spec.connect_problem`, ``chroot_problem``)."""
    servers, chroot = parse_zk_connect(value)
    connect = ",".join(f"{host}:{port}" for host, port in servers)
    problem = connect_problem(connect) or (chroot_problem(chroot) if chroot else None)
    if problem:
        raise ValueError(f"{problem} (it is the default of every spec that names none)")
    return connect, chroot


def connection_info(server: str | None, *, insecure: bool) -> kopf.ConnectionInfo:
    """API credentials: ``--server`` as given, else the pod's service account, else the
    kubeconfig (the same discovery as kopf's own login handlers)."""
    import kopf

    from understudy_operator.handlers.app import make_settings

    if server is not None:
        return kopf.ConnectionInfo(server=server, insecure=insecure or None)
    settings = make_settings()
    for login in (kopf.login_with_service_account, kopf.login_with_kubeconfig):
        info = login(settings=settings, logger=log)
        if info is not None:
            return info
    raise click.ClickException(
        "no Kubernetes credentials: not in a pod (no service account token) and no kubeconfig "
        "(set KUBECONFIG or pass --server URL)")


@click.command(short_help="Run the Kubernetes operator (kopf).",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--zk", "zk", metavar="HOST:PORT[,...][/CHROOT]",
              help="Default ZooKeeper for groups whose spec names none; its chroot is the "
                   "default for groups without spec.zookeeper.chroot.")
@click.option("-A", "--all-namespaces", is_flag=True, help="Watch BrokerGroups everywhere.")
@click.option("-n", "--namespace", "namespaces", multiple=True, metavar="NS",
              help="Watch BrokerGroups in NS (repeat for several).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port for Prometheus /metrics (0 disables).")
@click.option("--health-port", type=click.IntRange(0, 65535), default=8081, show_default=True,
              help="Port for kopf's liveness probe GET /healthz (0 disables).")
@click.option("--listen", default="0.0.0.0", show_default=True,
              help="Address for /metrics and /healthz.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"],
                                               case_sensitive=False),
              default="info", show_default=True, help="Log verbosity (logs go to stderr).")
@click.option("--status-interval", type=click.FloatRange(0.5, 60), default=2.0,
              show_default=True, help="Seconds between status refreshes of each group.")
@click.option("--handoff-timeout", type=click.FloatRange(1, 300), default=10.0,
              show_default=True,
              help="Seconds a planned master handoff waits for the master to acknowledge the "
                   "fence before leaving the failover to the controller.")
@click.option("--max-lag-bytes", type=click.IntRange(0), default=1 << 20, show_default=True,
              help="A slave within this many bytes of the master counts as in sync (rollouts).")
@click.option("--server", metavar="URL",
              help="API server URL (e.g. http://127.0.0.1:8001 from 'kubectl proxy'); default: "
                   "the pod's service account, else the kubeconfig.")
@click.option("--insecure-skip-tls-verify", "insecure", is_flag=True,
              help="With --server: do not verify the server's certificate.")
@click.option("--scanning/--no-scanning", default=True, show_default=True,
              help="Let kopf list and watch namespaces and CRDs; --no-scanning assumes the "
                   "--namespace list exists (no RBAC for namespaces needed).")
@click.option("--identity", metavar="NAME",
              help="This replica's name in controller elections (default: HOSTNAME:PID).")
@digest_option
@click.option("--ca-secret", metavar="NAMESPACE/NAME",
              help="The one CA Secret for every namespace (default: understudy-ca in each "
                   "resource's namespace). The chart sets its own namespace's.")
@click.option("--ca-validity-days", type=click.IntRange(30, 36500), default=5 * 365,
              show_default=True, help="Validity of a new or renewed CA certificate.")
@click.option("--ca-renew-days", type=click.IntRange(2, 36499), default=180,
              show_default=True, help="Renew the CA certificate this long before it ends.")
@click.option("--cert-validity-days", type=click.IntRange(2, 3650), default=365,
              show_default=True, help="Validity of broker and user certificates.")
@click.option("--cert-renew-days", type=click.IntRange(1, 3649), default=30,
              show_default=True,
              help="Renew a certificate this long before it ends (a rolling restart).")
@click.option("--cluster-domain", default="cluster.local", show_default=True,
              help="DNS suffix of Services in the brokers' certificates.")
@click.option("--security-interval", type=click.FloatRange(1, 86400), default=60.0,
              show_default=True,
              help="Seconds between certificate renewal checks and password Secret checks.")
def operator_cmd(zk: str | None, all_namespaces: bool, namespaces: tuple[str, ...],
                 metrics_port: int, health_port: int, listen: str, log_level: str,
                 status_interval: float, handoff_timeout: float, max_lag_bytes: int,
                 server: str | None, insecure: bool, scanning: bool, identity: str | None,
                 digest: Digest | None, ca_secret: str | None, ca_validity_days: int,
                 ca_renew_days: int, cert_validity_days: int, cert_renew_days: int,
                 cluster_domain: str, security_interval: float) -> None:
    """Run the Kubernetes operator for BrokerGroups (understudy.io/v1alpha1): builds each
    group's StatefulSet, Services, ConfigMap, PDB (and ServiceMonitor), writes its ZooKeeper config, runs its
    failover controller with pod status as the liveness source, rolls pods safely (slaves
    first, the master through a planned handoff) and keeps the status current. Two replicas
    are safe: one decides per group. Stops cleanly on SIGTERM."""
    if all_namespaces == bool(namespaces):
        raise click.UsageError("pass exactly one of --all-namespaces or --namespace NS ...")
    from prometheus_client import start_http_server

    from understudy_operator.handlers.app import run
    from understudy_operator.handlers.metrics import OperatorMetrics
    from understudy_operator.handlers.runtime import OperatorConfig
    from understudy_operator.k8s.certs import CertError, CertPolicy

    ca_location: tuple[str, str] | None = None
    if ca_secret is not None:
        try:
            ca_location = split_ca_secret(ca_secret)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--ca-secret") from None
    try:
        policy = CertPolicy(ca_validity=timedelta(days=ca_validity_days),
                            ca_renew_before=timedelta(days=ca_renew_days),
                            cert_validity=timedelta(days=cert_validity_days),
                            cert_renew_before=timedelta(days=cert_renew_days))
    except CertError as exc:
        raise click.UsageError(f"certificate days: {exc}") from None
    connect: str | None = None
    chroot: str | None = None
    if zk is not None:
        try:
            connect, chroot = split_zk(zk)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--zk") from None
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    info = connection_info(server, insecure=insecure)
    config = OperatorConfig(
        zk_connect=connect, zk_chroot=chroot, status_interval_s=status_interval,
        handoff_timeout_s=handoff_timeout, max_lag_bytes=max_lag_bytes, scanning=scanning,
        identity=identity or f"{socket.gethostname()}:{os.getpid()}", zk_digest=digest,
        ca_secret=ca_location, cert_policy=policy, cluster_domain=cluster_domain,
        security_interval_s=security_interval)
    metrics = OperatorMetrics()
    served: Any = None
    if metrics_port:
        try:
            served = start_http_server(metrics_port, addr=listen, registry=metrics.registry)
        except OSError as exc:
            raise click.ClickException(
                f"cannot serve /metrics on {listen}:{metrics_port}: {exc}") from exc
        log.info("metrics on http://%s:%d/metrics", listen, metrics_port)
    liveness = f"http://{listen}:{health_port}/healthz" if health_port else None
    where = "all namespaces" if all_namespaces else ", ".join(namespaces)
    log.info("operator %s watching %s (default ZooKeeper: %s, digest identity: %s, CA: %s)",
             config.identity, where, zk or "none", digest[0] if digest else "none",
             "/".join(ca_location) if ca_location else "understudy-ca per namespace")
    try:
        asyncio.run(run(config=config, connection=info, namespaces=namespaces,
                        clusterwide=all_namespaces, metrics=metrics,
                        liveness_endpoint=liveness))
    finally:
        if served is not None:
            httpd, thread = served
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)
