"""TLS + SCRAM on vs off, measured by ``bench/broker.py`` in the same run (issue 15,
"Benchmark"); the figures go into ``bench-results/broker.json``.

Understudy: two clusters of the same shape, ``understudy_operator.local.cluster.up(groups=1,
slaves=1)`` -- a ZooKeeper, a master and a slave with synchronous replication and the
controller -- one plain and one ``secure=True`` (TLS on the client and replication ports,
SCRAM required, ACLs enforced; docs/security.md). SCRAM needs ZooKeeper, so this is not
bench/broker.py's static pair: both clusters here are coordinated, and their brokers keep
the local cluster's default ``--flush batch`` (fsync before an acknowledgement, group
commit, on master and slave), the durability of bench/broker.py's ``understudy_fsync``.
The secure run produces as a user ``bench`` (SCRAM-SHA-512) holding only the ACLs it needs
(``produce`` on the topics ``bench`` and ``ready``, ``create`` on the cluster), so every
produce goes through the ACL check a real client's would (the admin is a super user, whose
check stops early). Both runs use bench/broker.py's ``understudy_produce``: the same
1 KiB messages, count, 256-message window and batch size; connecting and authenticating
happen before the clock starts (its warm-up send).

JetStream: bench/broker.py's 3-node R2 file-storage cluster, once more with TLS on the
client port and on the routes between the servers (an ECDSA P-256 certificate from the
same CA code as the local cluster's, ``understudy_operator.k8s.certs``; the client's
context is Understudy's ``security.client_context``). The plain runs are broker.py's
``jetstream_r2`` runs, interleaved with these. No authentication there: NATS has no
SCRAM, and its user checks happen once per connection, so TLS is what costs per message.

Runs alternate (plain then secure, secure then plain, ...) so a change in the machine's
load hits both: ``--secure-repeat`` (5) pairs of Understudy clusters, ``--repeat`` (3)
pairs of JetStream clusters. Each comparison reports its *median pair*: the adjacent plain
and secure runs whose produce ratio is the median of the pairs' (both ran under about the
same load; the median of each side taken separately may come from different minutes). The
ratio of every pair is in ``*_produce_ratio_all``, every run's rate in
``*_produce_msgs_per_s_all``; ``*_cpu_ratio`` is plain / secure CPU per message (servers
and client) of the median pair, the throughput ratio a CPU-bound machine would show.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchlib import signals_deferred
from broker import (
    CpuMeter,
    NatsTls,
    Processes,
    console,
    jetstream_run,
    start_jetstream,
    summarize,
    understudy_produce,
    wait_slave,
)
from rich.console import Console
from rich.table import Table

from understudy_broker import protocol as p
from understudy_broker.acl import make_user, parse_rule
from understudy_broker.admin import security_admin
from understudy_broker.security import ClientSecurity, client_context
from understudy_operator.k8s import certs
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs as lprocs
from understudy_operator.local.plan import STATE_FILE

#: The issue's target: TLS + SCRAM costs at most 25 % of the produce throughput.
TARGET_RATIO = 0.75
BENCH_USER = "bench"
TOPIC = "bench"

SECURE_SYSTEMS = (
    ("understudy_plain", "understudy plain",
     "local cluster (1 group, master + slave, sync, flush batch), no TLS, no auth"),
    ("understudy_secure", "understudy TLS + SCRAM",
     "the same cluster with local up --secure: TLS on every port, SCRAM-SHA-512 user "
     "'bench' with produce ACLs"),
    ("jetstream_plain_r2", "jetstream R2, plain",
     "broker.py's jetstream_r2 runs (the plain run of the median pair)"),
    ("jetstream_tls_r2", "jetstream R2, TLS",
     "the same 3-node R2 cluster with TLS on the client port and the routes"),
)
#: (ratio key prefix, secure figures, plain figures)
PAIRS = (
    ("secure_vs_plain", "understudy_secure", "understudy_plain"),
    ("jetstream_tls_vs_plain", "jetstream_tls_r2", "jetstream_plain_r2"),
)


def interleave(repeat: int, plain: Callable[[int], dict[str, Any]],
               secure: Callable[[int], dict[str, Any]]
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``repeat`` runs of each, alternating which goes first: (plain, secure),
    (secure, plain), ...; each is called with the run's index."""
    plains: list[dict[str, Any]] = []
    secures: list[dict[str, Any]] = []
    for i in range(repeat):
        order = ((plains, plain), (secures, secure))
        for runs, run in order if i % 2 == 0 else reversed(order):
            runs.append(run(i))
    return plains, secures


# --------------------------------------------------------------------------- understudy


async def bench_user(address: str, admin: ClientSecurity) -> ClientSecurity:
    """Create the user ``bench`` (a fresh password) with the ACLs the benchmark needs,
    through the admin; what it presents: the admin's TLS context and its own SCRAM."""
    password = secrets.token_urlsafe(24)
    await security_admin([address], p.SecurityAdminRequest(
        "user-create", BENCH_USER, json.loads(make_user(password).to_json())), admin)
    rules = [parse_rule("topic", topic, ["produce"]).to_dict() for topic in (TOPIC, "ready")]
    rules.append(parse_rule("cluster", "*", ["create"]).to_dict())
    await security_admin([address], p.SecurityAdminRequest("acl-add", BENCH_USER, rules=rules),
                         admin)
    return ClientSecurity(admin.ssl, BENCH_USER, password)


def run_understudy_cluster(directory: Path, n: int, *, secure: bool,
                           batch_size: int) -> dict[str, float]:
    """One local cluster (plain or ``secure``), ``n`` produces, its figures; the cluster
    is stopped by its recorded PIDs (``local down``) before this returns or raises."""
    name = "understudy_secure" if secure else "understudy_plain"
    try:
        plan = lc.up(directory, groups=1, slaves=1, secure=secure)
        address = plan.groups[0].master.address
        admin = lc.client_security(plan)
        user = None if admin is None else asyncio.run(bench_user(address, admin))
        asyncio.run(wait_slave(address, user))
        pids = [lprocs.read_pid(plan.pid_dir, b.name) for b in plan.brokers]  # master, slave
        if None in pids:
            raise RuntimeError(f"a broker of {directory} has no pid file")
        console.print(f"[bold]understudy[/] ZooKeeper cluster, {'TLS + SCRAM' if secure else 'plain'}"
                      f", flush batch, batches of {batch_size}: producing {n:,} x 1 KiB ...")
        meter = CpuMeter([pid for pid in pids if pid is not None])
        seconds, lat = asyncio.run(understudy_produce(address, TOPIC, n, batch_size=batch_size,
                                                      security=user))
        out = summarize(name, n, seconds, lat)
        out.update(meter.per_message(name, n))
        console.print(f"  {out[f'{name}_produce_msgs_per_s']:,.0f} msg/s, "
                      f"p99 {out[f'{name}_produce_ack_p99_ms']} ms")
        return out
    finally:
        if (directory / STATE_FILE).exists():
            with signals_deferred():
                lc.down(directory)


def understudy_secure_vs_plain(root: Path, n: int, *, batch_size: int,
                               repeat: int) -> dict[str, Any]:
    plains, secures = interleave(
        repeat,
        lambda i: run_understudy_cluster(root / f"plain-{i}", n, secure=False,
                                         batch_size=batch_size),
        lambda i: run_understudy_cluster(root / f"secure-{i}", n, secure=True,
                                         batch_size=batch_size))
    return median_pair("secure_vs_plain", plains, secures, "understudy_plain",
                       "understudy_secure")


# --------------------------------------------------------------------------- jetstream


def nats_tls_files(directory: Path) -> NatsTls:
    """A CA and one certificate for every nats-server (server and client use: the routes
    verify each other), naming localhost and 127.0.0.1."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca = certs.new_ca(now=now, validity=timedelta(days=1))
    leaf = certs.issue(ca, common_name="nats-bench", dns_names=["localhost"],
                       ip_addresses=["127.0.0.1"], server=True, client=True, now=now,
                       validity=timedelta(days=1))
    tls = NatsTls(cert=directory / "nats.crt", key=directory / "nats.key",
                  ca=directory / "ca.crt")
    tls.key.touch(mode=0o600)
    tls.key.write_bytes(leaf.key_pem)
    tls.cert.write_bytes(leaf.cert_pem)
    tls.ca.write_bytes(ca.cert_pem)
    return tls


class _QuietTlsClose(logging.Filter):
    """asyncio warns that nats-py's ``eof_received`` returns true on a TLS transport
    (harmless: the connection is closing); once per run, it would only clutter the table."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


def run_jetstream_tls(root: Path, procs: Processes, n: int, replicas: int,
                      tls: NatsTls) -> dict[str, float]:
    """bench/broker.py's ``run_jetstream`` with TLS, produce only."""
    name = f"jetstream_tls_r{replicas}"
    root.mkdir(parents=True)
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _QuietTlsClose) for f in asyncio_log.filters):
        asyncio_log.addFilter(_QuietTlsClose())
    try:
        urls = start_jetstream(root, procs, tls=tls)
        console.print(f"[bold]jetstream[/] 3 nodes, file storage, replicas {replicas}, TLS: "
                      f"producing {n:,} x 1 KiB ...")
        out = asyncio.run(jetstream_run(urls, replicas, n, [proc.pid for proc in procs.procs],
                                        tls=client_context(tls.ca), name=name, consume=False))
        console.print(f"  {out[f'{name}_produce_msgs_per_s']:,.0f} msg/s, "
                      f"p99 {out[f'{name}_produce_ack_p99_ms']} ms")
        return out
    finally:
        with signals_deferred():
            procs.stop_all()


# --------------------------------------------------------------------------- figures


def jetstream_tls_vs_plain(plains: list[dict[str, Any]],
                           tlss: list[dict[str, Any]]) -> dict[str, Any]:
    """The median pair of broker.py's ``jetstream_r2`` runs (its produce figures again,
    as ``jetstream_plain_r2_*``) and the TLS runs interleaved with them."""
    renamed = [{k.replace("jetstream_r2_", "jetstream_plain_r2_", 1): v for k, v in run.items()
                if "_consume_" not in k} for run in plains]
    return median_pair("jetstream_tls_vs_plain", renamed, tlss, "jetstream_plain_r2",
                       "jetstream_tls_r2")


def median_pair(prefix: str, plains: list[dict[str, Any]], secures: list[dict[str, Any]],
                plain: str, secure: str) -> dict[str, Any]:
    """The figures of the adjacent plain and secure runs whose produce ratio is the
    median of the pairs' (an odd count picks a real pair): both ran under about the same
    load, which the median of each side separately does not promise. Also every run's
    msg/s (``<name>_produce_msgs_per_s_all``) and every pair's ratio
    (``<prefix>_produce_ratio_all``)."""
    ratios = [round(s[f"{secure}_produce_msgs_per_s"] / q[f"{plain}_produce_msgs_per_s"], 3)
              for s, q in zip(secures, plains, strict=True)]
    k = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
    out: dict[str, Any] = {**plains[k], **secures[k]}
    if len(ratios) > 1:
        for name, runs in ((plain, plains), (secure, secures)):
            out[f"{name}_produce_msgs_per_s_all"] = [r[f"{name}_produce_msgs_per_s"] for r in runs]
        out[f"{prefix}_produce_ratio_all"] = ratios
    return out


def cpu_per_msg(results: dict[str, Any], name: str) -> float:
    """Server and client CPU microseconds per message of ``name``'s run."""
    return float(results[f"{name}_server_cpu_us_per_msg"]
                 + results[f"{name}_client_cpu_us_per_msg"])


def add_secure_ratios(results: dict[str, Any]) -> None:
    """``<prefix>_produce_ratio`` (secure / plain msg/s of the median pair; the issue's
    ``secure_vs_plain_produce_ratio``), ``<prefix>_p99_ratio`` (secure / plain ack p99),
    ``<prefix>_cpu_ratio`` (plain / secure CPU per message, servers and client: the
    throughput ratio of a CPU-bound machine, steadier under other load than msg/s) and,
    for Understudy, whether the target (>= 0.75) is met; nothing without a secure run
    (``--skip-secure``)."""
    if not any(f"{secure}_produce_msgs_per_s" in results for _, secure, _ in PAIRS):
        return
    for prefix, secure, plain in PAIRS:
        if f"{secure}_produce_msgs_per_s" not in results or (
                f"{plain}_produce_msgs_per_s" not in results):
            continue
        results[f"{prefix}_produce_ratio"] = round(
            results[f"{secure}_produce_msgs_per_s"] / results[f"{plain}_produce_msgs_per_s"], 3)
        results[f"{prefix}_p99_ratio"] = round(
            results[f"{secure}_produce_ack_p99_ms"] / results[f"{plain}_produce_ack_p99_ms"], 3)
        results[f"{prefix}_cpu_ratio"] = round(cpu_per_msg(results, plain)
                                               / cpu_per_msg(results, secure), 3)
    if "secure_vs_plain_produce_ratio" in results:
        results["secure_vs_plain_target_met"] = bool(
            results["secure_vs_plain_produce_ratio"] >= TARGET_RATIO)
    results["secure_setup"] = {name: meaning for name, _, meaning in SECURE_SYSTEMS
                               if f"{name}_produce_msgs_per_s" in results}


def print_secure_report(results: dict[str, Any], out: Console) -> None:
    if "secure_setup" not in results:
        return
    table = Table(title=(f"TLS + SCRAM on vs off: {results['count']:,} x 1 KiB, window "
                         f"{results['window']}, same cluster shape and client per system"))
    for col in ("system", "produce msg/s (runs)", "ack p50 ms", "ack p99 ms",
                "server CPU us/msg", "client CPU us/msg"):
        table.add_column(col, justify="right")
    for name, label, _ in SECURE_SYSTEMS:
        if f"{name}_produce_msgs_per_s" not in results:
            continue
        runs = results.get(f"{name}_produce_msgs_per_s_all")
        rate = f"{results[f'{name}_produce_msgs_per_s']:,.0f}" + (
            f" ({' · '.join(f'{r:,.0f}' for r in runs)})" if runs else "")
        table.add_row(label, rate, f"{results[f'{name}_produce_ack_p50_ms']:.1f}",
                      f"{results[f'{name}_produce_ack_p99_ms']:.1f}",
                      f"{results[f'{name}_server_cpu_us_per_msg']:.0f}",
                      f"{results[f'{name}_client_cpu_us_per_msg']:.0f}")
    out.print(table)
    for name, label, meaning in SECURE_SYSTEMS:
        if f"{name}_produce_msgs_per_s" in results:
            out.print(f"  {label}: {meaning}")
    for prefix, label in (("secure_vs_plain", "understudy TLS + SCRAM / plain"),
                          ("jetstream_tls_vs_plain", "jetstream TLS / plain")):
        if f"{prefix}_produce_ratio" not in results:
            continue
        pairs = results.get(f"{prefix}_produce_ratio_all")
        met = results.get(f"{prefix}_target_met")
        out.print(
            f"  {label}: produce x{results[f'{prefix}_produce_ratio']:.2f}"
            + (f" (pairs {' · '.join(f'{r:.2f}' for r in pairs)})" if pairs else "")
            + f", ack p99 x{results[f'{prefix}_p99_ratio']:.2f}"
            + f", CPU/msg plain/secure {results[f'{prefix}_cpu_ratio']:.2f}"
            + ("" if met is None else
               f"; target >= {TARGET_RATIO:.2f}: {'met' if met else 'missed'}"))
