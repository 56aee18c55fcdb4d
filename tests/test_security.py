"""Security on a real secure local cluster (``understudy local up --secure``: ZooKeeper,
two groups of a master and a slave serving TLS, SCRAM and ACLs, the controller).

Checked as a user would notice: every refused client gets its error (no credentials, a
wrong password, an unknown user, a foreign or expired certificate, denied on a topic,
denied on a consumer group) and nothing is stored, no offset moves; a client certificate
authenticates its common name; the replication port serves nothing to a stranger; the
acting slave refuses and allows exactly like its master, and back-sync runs over TLS with
authentication."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from understudy_broker import protocol as p
from understudy_broker.cli.client import produce, topic
from understudy_broker.cli.security import acl, user
from understudy_broker.client import BrokerError, Connection, Consumer, Producer, SecurityError
from understudy_broker.replication.wire import AUTH_HELLO, AUTH_MAGIC, CHALLENGE, encode_hello
from understudy_broker.security import ClientSecurity, client_context, server_context
from understudy_harness import testing
from understudy_operator.k8s import certs
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import ClusterPlan

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ClusterPlan]]:
    directory = tmp_path_factory.mktemp("secure") / "c"
    try:
        plan = lc.up(directory, groups=2, slaves=1, secure=True)
        yield directory, plan
    finally:
        if (directory / "cluster.json").exists():
            lc.down(directory)


def admin_args(plan: ClusterPlan) -> list[str]:
    return ["-b", plan.address("g1-0"), *plan.security.client_argv()]


def run(cmd: object, args: list[str]) -> tuple[int, str]:
    out = CliRunner().invoke(cmd, args)  # type: ignore[arg-type]
    return out.exit_code, out.output


def make_user(plan: ClusterPlan, tmp: Path, name: str, rules: list[list[str]]) -> ClientSecurity:
    """A SCRAM user with ``rules`` (``acl add`` arguments), created through the CLI."""
    pw = tmp / f"{name}.pw"
    pw.write_text(f"{name}-secret\n")
    code, out = run(user, ["create", name, "--new-password-file", str(pw), "--json",
                           *admin_args(plan)])
    assert code == 0, out
    assert json.loads(out)["created"], out
    for rule in rules:
        code, out = run(acl, ["add", "--principal", name, *rule, "--json", *admin_args(plan)])
        assert code == 0, out
    sec = ClientSecurity.from_files(tls_ca=plan.security.ca_cert, user=name, password_file=pw)
    assert sec is not None
    return sec


def everyone(plan: ClusterPlan) -> list[str]:
    return [plan.address(b) for b in ("g1-0", "g1-1", "g2-0", "g2-1")]


def topic_create(plan: ClusterPlan, name: str) -> None:
    code, out = run(topic, ["create", "-t", name, "--groups", "g1,g2",
                            "--queues-per-group", "1", *admin_args(plan)])
    assert code == 0, out


async def log_ends(plan: ClusterPlan, name: str) -> dict[str, int]:
    """Every queue's log end, read as the admin from every group's master."""
    sec = lc.client_security(plan)
    ends = {}
    for g in ("g1", "g2"):
        conn = await Connection.open(plan.address(f"{g}-0"), security=sec)
        try:
            body = await conn.request(p.Op.QUEUE_STATS, p.QueueStatsRequest(name, [0, 1]).encode())
        finally:
            await conn.close()
        for q, st in p.QueueStatsResponse.decode(body).queues.items():
            ends[f"{g}/{q}"] = st.end
    return ends


async def produce_as(plan: ClusterPlan, sec: ClientSecurity | None, name: str,
                     n: int = 20) -> list[BaseException | None]:
    async with Producer([plan.address("g1-0")], security=sec, send_timeout_s=3.0) as prod:
        futs = [await prod.send(name, b"m-%d" % i) for i in range(n)]
        await asyncio.gather(*futs, return_exceptions=True)
    return [f.exception() for f in futs]


def test_clients_without_the_right_credentials_are_refused_and_store_nothing(
        secure: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    _directory, plan = secure
    topic_create(plan, "guarded")
    before = asyncio.run(log_ends(plan, "guarded"))
    boot = ["-b", plan.address("g1-0"), "-t", "guarded", "-n", "5", "--json"]
    ca = ["--tls-ca", str(plan.security.ca_cert)]
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("not-the-password\n")

    # No TLS at all: the TLS port closes the plain connection, and says what to check.
    code, out = run(produce, boot)
    assert code != 0, out
    assert "--tls-ca" in out, out
    # TLS but no user: the broker requires authentication.
    code, out = run(produce, [*boot, *ca])
    assert code != 0, out
    assert "AUTHENTICATION_FAILED" in out, out
    assert "requires authentication" in out, out
    # The admin with a wrong password; a user nobody created.
    code, out = run(produce, [*boot, *ca, "--user", "admin", "--password-file", str(wrong)])
    assert code != 0, out
    assert "wrong password for user 'admin'" in out, out
    code, out = run(produce, [*boot, *ca, "--user", "mallory", "--password-file", str(wrong)])
    assert code != 0, out
    assert "unknown user 'mallory'" in out, out

    # Certificates: one from another CA, one expired (both refused by the TLS handshake).
    now = datetime.now(UTC)
    other_ca = certs.new_ca(now=now, validity=timedelta(days=30))
    ours = certs.KeyPair(plan.security.ca_cert.read_bytes(), plan.security.ca_key.read_bytes())
    foreign = certs.issue(other_ca, common_name="admin", server=False, client=True, now=now,
                          validity=timedelta(days=1))
    expired = certs.issue(ours, common_name="admin", server=False, client=True,
                          now=now - timedelta(days=3), validity=timedelta(days=1))
    for label, pair in (("foreign", foreign), ("expired", expired)):
        crt, key = tmp_path / f"{label}.crt", tmp_path / f"{label}.key"
        crt.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        code, out = run(produce, [*boot, *ca, "--tls-cert", str(crt), "--tls-key", str(key)])
        assert code != 0, (label, out)
        assert "TLS error" in out, (label, out)
        assert "refused this client's certificate" in out or "alert" in out.lower(), out
    # A broker certificate the client does not trust (no --tls-ca: the system's CAs).
    code, out = run(produce, [*boot, "--tls-cert", str(tmp_path / "foreign.crt"),
                              "--tls-key", str(tmp_path / "foreign.key")])
    assert code != 0, out
    assert "CERTIFICATE_VERIFY_FAILED" in out, out

    assert asyncio.run(log_ends(plan, "guarded")) == before  # nothing was stored


def test_a_broker_resetting_right_after_the_handshake_reads_as_a_refused_certificate(
        tmp_path: Path) -> None:
    """Found by CI: with TLS 1.3 the broker checks a client certificate after the client's
    handshake is done, and when the client's first request crosses the broker's alert
    the client sees a reset, not the alert. Before any answer, with a certificate
    presented, that is the certificate refused (a TLS error), not a lost connection."""
    now = datetime.now(UTC)
    ca = certs.new_ca(now=now, validity=timedelta(days=1))
    server = certs.issue(ca, common_name="broker", server=True, client=False, now=now,
                         validity=timedelta(days=1), ip_addresses=["127.0.0.1"])
    client = certs.issue(ca, common_name="admin", server=False, client=True, now=now,
                         validity=timedelta(days=1))
    files = {}
    for name, pem in (("ca.crt", ca.cert_pem), ("s.crt", server.cert_pem),
                      ("s.key", server.key_pem), ("c.crt", client.cert_pem),
                      ("c.key", client.key_pem)):
        files[name] = tmp_path / name
        files[name].write_bytes(pem)

    async def scenario() -> str:
        async def reset(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(0.2)  # the client's request is in our buffer, unread
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # no alert, no close_notify: a reset

        srv = await asyncio.start_server(
            reset, "127.0.0.1", 0, ssl=server_context(files["s.crt"], files["s.key"], None,
                                                      "none"))
        port = srv.sockets[0].getsockname()[1]
        try:
            sec = ClientSecurity(ssl=client_context(files["ca.crt"], files["c.crt"],
                                                    files["c.key"]), client_certificate=True)
            conn = await Connection.open(f"127.0.0.1:{port}", security=sec)
            try:
                with pytest.raises(SecurityError) as refused:
                    await conn.request(p.Op.GET_ROUTE, p.GetRouteRequest("t").encode(),
                                       timeout_s=5)
            finally:
                await conn.close()
            return str(refused.value)
        finally:
            srv.close()
            await srv.wait_closed()

    message = asyncio.run(scenario())
    assert "TLS error" in message, message
    assert "refused this client's certificate" in message, message


def test_acls_allow_what_they_grant_and_refuse_the_rest(
        secure: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    _directory, plan = secure
    for name in ("orders-eu", "payroll"):
        topic_create(plan, name)
    bob = make_user(plan, tmp_path, "bob", [
        ["--topic", "orders-*", "--operation", "produce,consume"],
        ["--group", "shop", "--operation", "join,commit"]])

    async def scenario() -> None:
        before = await log_ends(plan, "payroll")
        refused = await produce_as(plan, bob, "payroll")
        assert all(isinstance(e, SecurityError) and e.status == p.Status.NOT_AUTHORIZED
                   for e in refused), refused
        assert "may not produce on topic 'payroll'" in str(refused[0])
        assert await log_ends(plan, "payroll") == before

        assert await produce_as(plan, bob, "orders-eu") == [None] * 20
        seen = await read_all(plan, bob, "orders-eu", "shop", 20)
        assert len(seen) == 20
        # Another consumer group: not granted, refused, and no offset of it appears.
        with pytest.raises(BrokerError) as denied:
            await read_all(plan, bob, "orders-eu", "audit", 20)
        assert denied.value.status == p.Status.NOT_AUTHORIZED
        assert "group 'audit'" in denied.value.message
        assert await committed(plan, "orders-eu", "audit") == {}
        assert sum((await committed(plan, "orders-eu", "shop")).values()) == 20

        # A member refused its group keeps trying: once the group is granted, its next
        # getmany() joins and reads (a refused first join used to leave it outside for good).
        late = Consumer(everyone(plan), group="audit", topic="orders-eu", security=bob)
        try:
            with pytest.raises(BrokerError) as refused_join:
                await late.getmany(timeout_s=0.5)
            assert refused_join.value.status == p.Status.NOT_AUTHORIZED
            code, out = await asyncio.to_thread(run, acl, [
                "add", "--principal", "bob", "--group", "audit", "--operation", "join,commit",
                *admin_args(plan)])
            assert code == 0, out
            late_seen: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(late_seen) < 20 and time.monotonic() < deadline:
                try:
                    late_seen.extend(r.body for r in await late.getmany(timeout_s=0.5))
                except BrokerError as exc:  # until every broker has the new rule
                    if exc.status != p.Status.NOT_AUTHORIZED:
                        raise
            assert len(late_seen) == 20
            await late.commit()
        finally:
            await late.close()
        assert sum((await committed(plan, "orders-eu", "audit")).values()) == 20

    asyncio.run(scenario())

    # Cluster operations are refused to bob, with the ACL that would grant them.
    bob_args = ["-b", plan.address("g2-0"), "--tls-ca", str(plan.security.ca_cert),
                "--user", "bob", "--password-file", str(tmp_path / "bob.pw")]
    code, out = run(topic, ["create", "-t", "orders-new", "--groups", "g1", *bob_args])
    assert code != 0, out
    assert "NOT_AUTHORIZED" in out, out
    code, out = run(user, ["list", *bob_args])
    assert code != 0, out
    assert "--cluster --operation describe" in out, out
    code, out = run(acl, ["list", "--json", *admin_args(plan)])
    rules = {a["principal"]: a["rules"] for a in json.loads(out)["acls"]}
    assert {"resource": "group", "name": "shop", "operations": ["commit", "join"]} in rules["bob"]
    assert {"resource": "group", "name": "audit", "operations": ["commit", "join"]} in rules["bob"]


async def read_all(plan: ClusterPlan, sec: ClientSecurity, name: str, group: str,
                   n: int) -> list[bytes]:
    seen: list[bytes] = []
    consumer = Consumer(everyone(plan), group=group, topic=name, security=sec)
    try:
        deadline = time.monotonic() + 20
        while len(seen) < n and time.monotonic() < deadline:
            seen.extend(r.body for r in await consumer.getmany(timeout_s=0.5))
        await consumer.commit()
    finally:
        await consumer.close()
    return seen


async def committed(plan: ClusterPlan, name: str, group: str) -> dict[int, int]:
    """The consumer group's committed offset per queue (queue 0 lives on g1, 1 on g2),
    as the admin reads it from each group's master."""
    sec = lc.client_security(plan)
    out: dict[int, int] = {}
    for q, g in ((0, "g1"), (1, "g2")):
        conn = await Connection.open(plan.address(f"{g}-0"), security=sec)
        try:
            body = await conn.request(p.Op.QUEUE_STATS, p.QueueStatsRequest(name, [q]).encode())
        finally:
            await conn.close()
        st = p.QueueStatsResponse.decode(body).queues.get(q)
        if st is not None and st.committed.get(group) is not None:
            out[q] = int(st.committed[group] or 0)
    return out


def test_a_client_certificate_authenticates_its_common_name(
        secure: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    _directory, plan = secure
    topic_create(plan, "metrics-in")
    code, out = run(acl, ["add", "--principal", "carol", "--topic", "metrics-in",
                          "--operation", "produce", *admin_args(plan)])
    assert code == 0, out
    now = datetime.now(UTC)
    ca = certs.KeyPair(plan.security.ca_cert.read_bytes(), plan.security.ca_key.read_bytes())
    pair = certs.issue(ca, common_name="carol", server=False, client=True, now=now,
                       validity=timedelta(days=1))
    crt, key = tmp_path / "carol.crt", tmp_path / "carol.key"
    crt.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    args = ["-b", plan.address("g1-0"), "--tls-ca", str(plan.security.ca_cert),
            "--tls-cert", str(crt), "--tls-key", str(key)]
    code, out = run(user, ["whoami", "--json", *args])
    assert code == 0, out
    assert json.loads(out)["user"] == "carol", out
    assert json.loads(out)["via"] == "certificate", out
    code, out = run(produce, [*args, "-t", "metrics-in", "-n", "10", "--json"])
    assert code == 0, out
    assert json.loads(out.splitlines()[-1])["acked"] == 10, out
    code, out = run(produce, [*args, "-t", "orders-eu", "-n", "1", "--json"])
    assert code != 0, out
    assert "user 'carol' may not produce" in out, out


def test_the_replication_port_serves_no_stranger(secure: tuple[Path, ClusterPlan]) -> None:
    """A peer without the group's secret gets no byte of the log: not with a plain hello,
    not with a made-up proof; and a plain TCP client cannot even speak TLS to it."""
    _directory, plan = secure
    master = next(g for g in plan.groups if g.group == "g1").master
    tls = client_context(plan.security.ca_cert, plan.security.broker_cert,
                         plan.security.broker_key)

    async def attempt(first: bytes, tls_ctx: ssl.SSLContext | None) -> bytes:
        reader, writer = await asyncio.open_connection(
            master.host, master.replication_port, ssl=tls_ctx,
            server_hostname=master.host if tls_ctx else None)
        try:
            writer.write(first)
            await writer.drain()
            got = b""
            async with asyncio.timeout(5):
                while chunk := await reader.read(65536):
                    got += chunk
            return got
        except (ConnectionError, ssl.SSLError):
            return b""
        finally:
            writer.close()

    async def scenario() -> None:
        # Even holding the brokers' own certificate: a plain hello gets nothing.
        assert await attempt(encode_hello("g1-9") + (0).to_bytes(8, "big"), tls) == b""
        # A made-up proof: the master's challenge (64 bytes) and nothing after it.
        got = await attempt(AUTH_HELLO.pack(AUTH_MAGIC, b"\0" * 32) + b"\1" * 32
                            + encode_hello("g1-9") + (0).to_bytes(8, "big"), tls)
        assert len(got) == CHALLENGE.size
        # No TLS at all.
        assert await attempt(encode_hello("g1-9"), None) == b""

    asyncio.run(scenario())
    text = (plan.log_dir / f"{master.name}.log").read_text()
    assert "refused a replication connection" in text


def test_the_acting_slave_enforces_acls_like_its_master_and_back_sync_runs_secure(
        secure: tuple[Path, ClusterPlan], tmp_path: Path) -> None:
    directory, plan = secure
    topic_create(plan, "orders-failover")
    dave = make_user(plan, tmp_path, "dave", [
        ["--topic", "orders-failover", "--operation", "produce,consume"],
        ["--group", "dave-app", "--operation", "join,commit"]])
    asyncio.run(produce_as(plan, dave, "orders-failover"))
    lc.kill(directory, "g1-0")
    try:
        lc.wait_mode(plan, "g1", "SLAVE_CONSUME", deadline=time.monotonic() + 20)

        async def while_acting() -> None:
            seen = await read_all(plan, dave, "orders-failover", "dave-app", 20)
            assert len(seen) == 20  # g1's queue read (and committed) through the acting slave
            with pytest.raises(BrokerError) as denied:
                await read_all(plan, dave, "orders-failover", "other-app", 20)
            assert denied.value.status == p.Status.NOT_AUTHORIZED
            # The acting slave's own answer: pull from it directly as dave.
            conn = await Connection.open(plan.address("g1-1"), security=dave)
            try:
                frame = await conn.exchange(p.Op.FETCH_OFFSET, p.FetchOffsetRequest(
                    "other-app", "orders-failover", [0]).encode())
            finally:
                await conn.close()
            assert frame.status == p.Status.NOT_AUTHORIZED, p.error_message(frame)

        asyncio.run(while_acting())
    finally:
        lc.start(directory, "g1-0")
    lc.wait_mode(plan, "g1", "NORMAL", deadline=time.monotonic() + 30)
    lc.wait_master_reads(plan, "g1", deadline=time.monotonic() + 20)
    # Back-sync over TLS, authenticated as a broker: the commit made on the acting slave
    # is on the master, and dave's group reads nothing again.
    got = asyncio.run(committed(plan, "orders-failover", "dave-app"))
    assert got.get(0) is not None, got
    assert sum(got.values()) == 20, got
    again = asyncio.run(read_again(plan, dave))
    assert again == [], again


async def read_again(plan: ClusterPlan, sec: ClientSecurity) -> list[bytes]:
    consumer = Consumer(everyone(plan), group="dave-app", topic="orders-failover",
                        security=sec)
    try:
        out: list[bytes] = []
        for _ in range(6):
            out.extend(r.body for r in await consumer.getmany(timeout_s=0.5))
        return out
    finally:
        await consumer.close()


def test_a_new_certificate_is_served_without_a_restart_on_every_port(brokers: testing.Brokers,
                                                       tmp_path: Path) -> None:
    now = datetime.now(UTC)
    ca = certs.new_ca(now=now, validity=timedelta(days=30))
    first = certs.issue(ca, common_name="understudy-broker", ip_addresses=["127.0.0.1"],
                        server=True, client=True, now=now, validity=timedelta(days=10))
    crt, key, ca_file = tmp_path / "b.crt", tmp_path / "b.key", tmp_path / "ca.crt"
    crt.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    ca_file.write_bytes(ca.cert_pem)
    m = brokers.master(extra=["--tls-cert", str(crt), "--tls-key", str(key), "--tls-ca",
                              str(ca_file), "--tls-reload-interval", "0.2", "--async",
                              "--tls-http"])
    ctx = client_context(ca_file)
    # The HTTP side port speaks TLS too (--tls-http): metrics over https, not over http.
    with urllib.request.urlopen(f"https://127.0.0.1:{m.http_port}/healthz", context=ctx,
                                timeout=5) as answer:
        assert answer.status == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{m.http_port}/healthz", timeout=5)

    async def served_serial() -> int:
        _reader, writer = await asyncio.open_connection("127.0.0.1", m.port, ssl=ctx,
                                                       server_hostname="127.0.0.1")
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            return certs.inspect(ssl.DER_cert_to_PEM_cert(der).encode()).serial
        finally:
            writer.close()

    assert asyncio.run(served_serial()) == first.info.serial
    second = certs.issue(ca, common_name="understudy-broker", ip_addresses=["127.0.0.1"],
                         server=True, client=True, now=now, validity=timedelta(days=20))
    tmp_key = tmp_path / "b.key.new"
    tmp_key.write_bytes(second.key_pem)
    crt.write_bytes(second.cert_pem)
    tmp_key.replace(key)
    testing.wait_until(lambda: asyncio.run(served_serial()) == second.info.serial,
                       "the broker serves the new certificate", within_s=10)
    # Clients go on working with the same process.
    tls = ["-b", f"127.0.0.1:{m.port}", "--tls-ca", str(ca_file)]
    code, out = run(topic, ["create", "-t", "t", "-q", "1", *tls])
    assert code == 0, out
    code, out = run(produce, [*tls, "-t", "t", "-n", "5", "--json"])
    assert code == 0, out
    assert json.loads(out.splitlines()[-1])["acked"] == 5, out


@pytest.mark.parametrize(("master_lines", "slave_lines", "links"), [
    (["old"], ["old", "new"], True),          # step 1: the new secret added second
    (["old", "new"], ["new", "old"], True),   # step 2: swapped, a broker at a time
    (["new", "old"], ["old", "new"], True),
    (["new", "old"], ["new"], True),          # step 3: the old one dropped
    (["old"], ["new"], False),                # never shared a secret: no link
], ids=["add", "swap-slave-first", "swap-master-first", "drop", "stranger"])
def test_the_group_secret_rotates_a_broker_at_a_time(
        brokers: testing.Brokers, tmp_path: Path, master_lines: list[str],
        slave_lines: list[str], links: bool) -> None:
    """A secret file holds one secret per line: a master proves the first and accepts any,
    a slave accepts a master proving any of its own and proves that one back. So every
    step of a rolling rotation keeps the replication link; two brokers with no secret in
    common never link."""
    secret = {"old": "o" * 32, "new": "n" * 32}

    def secret_file(name: str, lines: list[str]) -> str:
        path = tmp_path / f"{name}.secret"
        path.write_text("".join(secret[x] + "\n" for x in lines))
        return str(path)

    m = brokers.master(extra=["--async", "--group-secret-file", secret_file("m", master_lines)])
    s = brokers.slave(m, extra=["--group-secret-file", secret_file("s", slave_lines)])
    code, out = run(topic, ["create", "-b", m.address, "-t", "t", "-q", "1"])
    assert code == 0, out
    code, out = run(produce, ["-b", m.address, "-t", "t", "-n", "20", "--json"])
    assert code == 0, out
    if links:
        asyncio.run(testing.wait_caught_up(m.address, s.address, within_s=10))
    else:
        # The master proves its secret first: the slave refuses it and takes nothing.
        testing.wait_until(lambda: "not our master" in s.log(),
                           "the slave refuses a master without its secret", within_s=10)
        assert asyncio.run(testing.heartbeat(s.address)).max_phys == 0


def test_the_workload_runs_as_a_user_of_a_secure_cluster(secure: tuple[Path, ClusterPlan],
                                                         tmp_path: Path) -> None:
    """``understudy workload`` (the kind suite's traffic) takes the client flags too."""
    from understudy_harness.cli.workload import workload

    _directory, plan = secure
    history = tmp_path / "history.jsonl"
    code, out = run(workload, ["--bootstrap", ",".join(everyone(plan)), "--topic", "wl",
                               "--groups", "1", "--rate", "100", "--duration", "1.5",
                               "--drain-timeout", "15", "--history", str(history),
                               *plan.security.client_argv()])
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["acked"] > 0, result
    assert result["drained"], result
    assert result["delivered"] >= result["acked"], result
