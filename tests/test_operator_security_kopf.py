"""Security on Kubernetes through the real kopf operator, against the KMock emulator and a
real ZooKeeper (issue 15, operator side).

* A default (secure) BrokerGroup: the operator makes its CA, the brokers' certificates (the
  pods' Service names), the group secret and the brokers' copy of the ZooKeeper digest; the
  pods mount them and name only the files. A certificate that falls due is reissued by the
  security timer and the group restarts through the operator's own rollout: slaves first,
  the master through a planned handoff (visible in the operator's ModeChanged Events).
* BrokerUsers: SCRAM credentials (a full SCRAM-SHA-512 exchange succeeds with the password
  and fails with another), a changed password noticed, a tls user's certificate, ACL rules,
  a bad ACL refused with nothing written, a Secret the operator did not make left alone,
  deletion removing the nodes and the Secret — and the password nowhere the operator
  writes: no Secret, object, status, Event or znode holds it, plain or base64.

Emulated, not Kubernetes: KMock stores objects and serves watches; the StatefulSet controller
and kubelet are the emulation of tests/test_operator_kopf.py (reused from there), the brokers
are fake ZooKeeper-only brokers. No RBAC, admission, garbage collection or ``resourceVersion``
preconditions are enforced; real TLS between brokers is the broker suite's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import pathlib
import sys
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from understudy_broker.acl import RulesDoc, UserDoc
from understudy_broker.zklayout import decode_state, state_path
from understudy_harness import testing
from understudy_operator.handlers.app import run
from understudy_operator.handlers.metrics import OperatorMetrics
from understudy_operator.handlers.runtime import OperatorConfig
from understudy_operator.k8s import certs
from understudy_operator.k8s.security import ANNOTATION_TLS_REVISION, secret_data

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _load_kopf_suite() -> Any:
    """The emulator, the workload emulation and the poller of tests/test_operator_kopf.py
    (one copy of them; a test module is not importable by name in importlib mode)."""
    path = pathlib.Path(__file__).with_name("test_operator_kopf.py")
    spec = importlib.util.spec_from_file_location("understudy_test_operator_kopf", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


KOPF = _load_kopf_suite()
NS: str = KOPF.NS
BU = "understudy.io/v1alpha1/brokerusers"
PASSWORD = "v3ry-s3cret-passw0rd!"
NEW_PASSWORD = "an0ther-s3cret-passw0rd?"


async def eventually(check: Any, *, within: float = 20.0, what: str = "") -> Any:
    return await testing.eventually(check, what, within, tolerate=(Exception,))


@contextlib.asynccontextmanager
async def operator(url: str, config: OperatorConfig) -> AsyncIterator[None]:
    """The operator in its own thread and loop (as tests/test_operator_kopf.py runs it)."""
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(run(config=config, connection=kopf.ConnectionInfo(server=url),
                            namespaces=[NS], metrics=OperatorMetrics(), stop_flag=stop,
                            ready_flag=ready))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=main, name="operator-security", daemon=True)
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, 15), "the operator did not start"
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive(), "the operator did not stop"
        assert not failure, f"the operator failed: {failure[0]!r}"


class Env:
    def __init__(self, k: Any, w: Any, zk_connect: str, chroot: str, admin: KazooClient
                 ) -> None:
        self.k, self.w, self.zk_connect, self.chroot, self.admin = k, w, zk_connect, chroot, admin

    def secret(self, name: str) -> dict[str, Any] | None:
        return self.w.get("v1/secrets", name)  # type: ignore[no-any-return]

    def status(self, res: str, name: str) -> dict[str, Any]:
        return (self.w.get(res, name) or {}).get("status") or {}

    def ready(self, res: str, name: str) -> dict[str, Any] | None:
        for cond in self.status(res, name).get("conditions") or []:
            if cond.get("type") == "Ready":
                return dict(cond)
        return None

    async def create_user(self, name: str, spec: dict[str, Any]) -> None:
        await self.w.api("POST", f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokerusers", {
            "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerUser",
            "metadata": {"name": name, "namespace": NS}, "spec": spec})

    async def put_secret(self, name: str, data: dict[str, bytes]) -> None:
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
        if self.secret(name) is None:
            await self.w.api("POST", f"/api/v1/namespaces/{NS}/secrets", body)
        else:
            await self.w.api("PATCH", f"/api/v1/namespaces/{NS}/secrets/{name}",
                             {"data": body["data"]})

    def znode(self, path: str) -> bytes | None:
        if self.admin.exists(path) is None:
            return None
        return bytes(self.admin.get(path)[0])


@contextlib.asynccontextmanager
async def make_env(zk: str, admin: KazooClient, **config: Any) -> AsyncIterator[Env]:
    zk_connect, _, chroot = zk.partition("/")
    k = KOPF.Emulator()
    KOPF.declare(k)
    k.resources[BU] = kmock.ResourceInfo(
        kind="BrokerUser", namespaced=True, subresources={"status"},
        verbs={"list", "watch", "get", "patch", "create", "delete"})
    async with k, kmock.Server(k) as server, aiohttp.ClientSession() as http:
        base = str(server.url).rstrip("/")
        w = KOPF.Workloads(k=k, http=http, base=base, url=base)
        driver = asyncio.get_running_loop().create_task(w.run())
        settings = OperatorConfig(status_interval_s=0.5, handoff_timeout_s=5.0, identity="sec",
                                  controller_session_timeout_s=1.0, scanning=False,
                                  zk_connect=zk_connect, zk_chroot=f"/{chroot}",
                                  security_interval_s=0.5, **config)
        try:
            async with operator(base, settings):
                yield Env(k, w, zk_connect, f"/{chroot}", admin)
        finally:
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver
            await w.close()


@pytest.fixture
async def env(zk: str, admin: KazooClient) -> AsyncIterator[Env]:
    async with make_env(zk, admin) as made:
        yield made


def group_spec(env: Env, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "understudy/broker:1", "slaves": 1,
        "zookeeper": {"connect": env.zk_connect, "chroot": env.chroot, "sessionTimeoutMs": 1000},
        "failover": {"checkIntervalMs": 100, "detectionChecks": 2, "backSyncTimeoutSeconds": 5},
    }
    spec.update(overrides)
    return spec


async def create_group(env: Env, name: str, spec: dict[str, Any]) -> None:
    await env.w.api("POST", f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokergroups", {
        "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerGroup",
        "metadata": {"name": name, "namespace": NS}, "spec": spec})


async def test_a_secure_group_gets_its_secrets_and_a_due_certificate_rolls_it_safely(
        env: Env) -> None:
    await create_group(env, "tls", group_spec(env))
    await eventually(lambda: (c := env.ready(KOPF.BG, "tls")) and c["status"] == "True",
                     within=30, what="the group Ready")

    ca_data = secret_data(env.secret("understudy-ca"))
    ca = certs.KeyPair(ca_data["ca.crt"], ca_data["ca.key"])
    tls = env.secret("tls-broker-tls")
    assert tls is not None
    data = secret_data(tls)
    assert sorted(data) == ["ca.crt", "tls-0.crt", "tls-0.key", "tls-1.crt", "tls-1.key"]
    for ordinal in (0, 1):
        info = certs.inspect(data[f"tls-{ordinal}.crt"])
        assert info.common_name == "understudy-broker"
        assert f"tls-{ordinal}.{NS}.svc" in info.dns_names
        assert f"tls-{ordinal}.tls-headless.{NS}.svc.cluster.local" in info.dns_names
        assert certs.verify_signature(data[f"tls-{ordinal}.crt"], ca.cert_pem)
    group_secret = secret_data(env.secret("tls-group-secret"))["secret"]
    assert len(group_secret) >= 40
    for name in ("tls-broker-tls", "tls-group-secret"):
        refs = env.secret(name)["metadata"]["ownerReferences"]  # type: ignore[index]
        assert [(r["kind"], r["name"]) for r in refs] == [("BrokerGroup", "tls")]
    assert env.secret("tls-zookeeper-digest") is None  # the operator has no digest here

    sts = env.w.get("apps/v1/statefulsets", "tls")
    old_rev = KOPF.revision_of(sts)
    template = sts["spec"]["template"]
    revision = template["metadata"]["annotations"][ANNOTATION_TLS_REVISION]
    script = template["spec"]["containers"][0]["command"][2]
    assert "--tls-cert /etc/understudy-tls/tls-0.crt" in script
    assert "--require-auth" in script
    assert "--super-user understudy-broker" in script
    assert "--group-secret-file /etc/understudy-group/secret" in script
    assert group_secret.decode() not in json.dumps(sts)
    assert env.w.get("v1/configmaps", "tls-config")["data"]["ca.crt"] == ca_data["ca.crt"].decode()
    assert env.w.get("networking.k8s.io/v1/networkpolicies", "tls-brokers") is not None

    # The master's certificate falls due (it ends in 10 days; renewal is 30 days ahead): the
    # security timer reissues the group's certificates in a new generation, the revision in
    # the pod template changes, and the rollout restarts the slave, then hands the master off.
    env.k.deleted_pods.clear()
    short = certs.issue(ca, common_name="understudy-broker", dns_names=certs.inspect(
        data["tls-0.crt"]).dns_names, server=True, client=True, now=datetime.now(UTC),
        validity=timedelta(days=10))
    await env.put_secret("tls-broker-tls", {**data, "tls-0.crt": short.cert_pem,
                                            "tls-0.key": short.key_pem})
    renewed = await eventually(
        lambda: (s := env.secret("tls-broker-tls")) and s["metadata"].get("annotations", {}).get(
            "understudy.io/tls-generation") == "1" and secret_data(s), what="new certificates")
    for ordinal in (0, 1):
        info = certs.inspect(renewed[f"tls-{ordinal}.crt"])
        assert not certs.needs_renewal(info.not_after, datetime.now(UTC), timedelta(days=30))
        assert renewed[f"tls-{ordinal}.crt"] != data[f"tls-{ordinal}.crt"]
    await eventually(
        lambda: env.w.get("apps/v1/statefulsets", "tls")["spec"]["template"]["metadata"][
            "annotations"][ANNOTATION_TLS_REVISION] != revision, what="a new pod revision")

    def rolled() -> bool:
        sts_now = env.w.get("apps/v1/statefulsets", "tls")
        rev = (sts_now.get("status") or {}).get("updateRevision")
        pods = [p for p in env.w.objects("v1/pods") if p["metadata"]["name"].startswith("tls-")]
        return rev != old_rev and len(pods) == 2 and all(
            p["metadata"]["labels"]["controller-revision-hash"] == rev for p in pods)

    await eventually(rolled, within=60, what="both pods at the new revision")
    # The mode history from the operator's ModeChanged Events (a ZooKeeper watch can miss
    # FENCING when SLAVE_CONSUME follows within milliseconds; it did once, in a fresh run).
    final = await eventually(lambda: (raw := env.znode(state_path("tls"))) and (
        st := decode_state(raw)).mode.name == "NORMAL" and st.epoch > 1 and st,
        within=30, what="NORMAL after the restart")
    seen = await eventually(lambda: (h := KOPF.mode_changes(env.w, "tls")) and final.epoch in h and h,
                            what="a ModeChanged Event for the final NORMAL")
    history = [seen[e] for e in sorted(seen)]
    assert env.k.deleted_pods == ["tls-1", "tls-0"]  # the slave first, then the master
    assert any(m == "FENCING" and r.startswith("planned handoff") for m, r in history), history


async def test_brokerusers_reach_zookeeper_without_their_passwords(env: Env) -> None:
    await env.put_secret("app-password", {"password": PASSWORD.encode()})
    acls = [{"resource": "topic", "name": "orders*", "operations": ["produce", "consume"]},
            {"resource": "group", "name": "orders-consumers", "operations": ["join", "commit"]}]
    await env.create_user("app", {"authentication": {
        "type": "scram-sha-512", "passwordSecret": {"name": "app-password"}}, "acls": acls})
    await env.create_user("reader", {"authentication": {"type": "tls"}, "acls": [
        {"resource": "cluster", "operations": ["describe"]}]})
    await env.create_user("bad", {"authentication": {"type": "tls"}, "acls": [
        {"resource": "topic", "name": "x", "operations": ["join"]}]})
    await env.create_user("nopass", {"authentication": {
        "type": "scram-sha-512", "passwordSecret": {"name": "missing"}}})
    # A Secret named like the tls user that the operator did not make.
    await env.put_secret("squatter", {"user.crt": b"theirs"})
    await env.create_user("squatter", {"authentication": {"type": "tls"}})

    await eventually(lambda: (c := env.ready(BU, "app")) and c["status"] == "True",
                     what="app Ready")
    doc = UserDoc.from_json(env.znode("/acl/users/app") or b"")
    assert list(doc.scram) == ["SCRAM-SHA-512"]
    assert scram_login(doc, "app", PASSWORD)
    assert not scram_login(doc, "app", "guess")
    rules = RulesDoc.from_json(env.znode("/acl/rules/app") or b"")
    assert [r.describe() for r in rules.rules] == [
        "topic:orders* consume,produce", "group:orders-consumers commit,join"]
    status = env.status(BU, "app")
    source = env.secret("app-password") or {}
    assert status["credentialsVersion"] == source["metadata"]["resourceVersion"]
    assert status["zookeeper"] == f"{env.zk_connect}{env.chroot}"
    assert status["acls"] == 2

    await eventually(lambda: (c := env.ready(BU, "reader")) and c["status"] == "True",
                     what="reader Ready")
    cert = secret_data(env.secret("reader"))
    assert sorted(cert) == ["ca.crt", "user.crt", "user.key"]
    info = certs.inspect(cert["user.crt"])
    assert info.common_name == "reader"
    assert info.client_auth
    assert not info.server_auth
    assert certs.verify_signature(cert["user.crt"], cert["ca.crt"])
    assert UserDoc.from_json(env.znode("/acl/users/reader") or b"").scram == {}
    assert env.status(BU, "reader")["secret"] == "reader"

    bad = await eventually(lambda: (c := env.ready(BU, "bad")) and c["reason"] == "InvalidSpec"
                           and c, what="bad refused")
    assert "spec.acls[0]" in bad["message"]
    assert "operations on a topic" in bad["message"]
    missing = await eventually(lambda: (c := env.ready(BU, "nopass"))
                               and c["reason"] == "PasswordSecretMissing" and c,
                               what="nopass waiting for its Secret")
    assert "missing" in missing["message"]
    conflict = await eventually(lambda: (c := env.ready(BU, "squatter"))
                                and c["reason"] == "SecretConflict" and c,
                                what="the squatted Secret refused")
    assert "not made by the operator" in conflict["message"]
    assert secret_data(env.secret("squatter")) == {"user.crt": b"theirs"}
    for user in ("bad", "nopass", "squatter"):
        assert env.znode(f"/acl/users/{user}") is None
        assert env.znode(f"/acl/rules/{user}") is None

    # A new password in the user's Secret (from a file: a trailing newline, which is not
    # part of it, as for the CLI's --password-file): noticed by the timer, a new salt.
    await env.put_secret("app-password", {"password": NEW_PASSWORD.encode() + b"\n"})
    await eventually(lambda: scram_login(UserDoc.from_json(env.znode("/acl/users/app") or b""),
                                         "app", NEW_PASSWORD), what="the new password works")
    assert not scram_login(UserDoc.from_json(env.znode("/acl/users/app") or b""), "app",
                           PASSWORD)

    # Nowhere the operator writes holds a password: Secrets (but the user's own), other
    # objects, statuses, Events, znodes.
    await asyncio.sleep(0.6)  # at least one more timer pass over every user
    assert_no_password(env, (PASSWORD, NEW_PASSWORD), own={"app-password"})

    for user in ("app", "reader"):
        await env.w.api("DELETE", f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokerusers/"
                        f"{user}")
    await eventually(lambda: env.znode("/acl/users/app") is None
                     and env.znode("/acl/rules/app") is None
                     and env.znode("/acl/users/reader") is None
                     and env.secret("reader") is None, what="users deleted")
    assert env.secret("app-password") is not None  # the user's own Secret stays
    assert env.secret("squatter") is not None


def assert_no_password(env: Env, passwords: tuple[str, ...], *, own: set[str]) -> None:
    forms = [f for p in passwords for f in (p, base64.b64encode(p.encode()).decode())]
    for (res, _ns, name), obj in list(env.k.objects.items()):
        if obj.deleted or (res.plural == "secrets" and name in own):
            continue
        text = json.dumps(obj.raw)
        for form in forms:
            assert form not in text, f"{res.plural}/{name} holds a password"
    for path in walk(env.admin, "/"):
        data = env.znode(path) or b""
        for form in forms:
            assert form.encode() not in data, f"znode {path} holds a password"


def walk(client: KazooClient, path: str) -> list[str]:
    out = [path]
    for child in client.get_children(path):
        out += walk(client, f"{path.rstrip('/')}/{child}")
    return out


def scram_login(doc: UserDoc, user: str, password: str) -> bool:
    from scramp import ScramClient, ScramMechanism

    cred = doc.scram["SCRAM-SHA-512"]
    server = ScramMechanism("SCRAM-SHA-512").make_server(
        lambda _u: (cred.salt, cred.stored_key, cred.server_key, cred.iterations))
    client = ScramClient(["SCRAM-SHA-512"], user, password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    try:
        server.set_client_final(client.get_client_final())
    except Exception:
        return False
    return True


async def test_with_a_digest_identity_the_users_nodes_are_closed_to_others(
        zk: str, admin: KazooClient) -> None:
    # The operator's ZooKeeper sessions authenticate with its digest (--zk-digest-file): the
    # chroot and the /acl nodes it writes carry that identity's ACL only.
    digest = ("understudy", "d1gest-pw")
    async with make_env(zk, admin, zk_digest=digest) as env:
        await env.put_secret("app-password", {"password": PASSWORD.encode()})
        await env.create_user("app", {"authentication": {
            "type": "scram-sha-512", "passwordSecret": {"name": "app-password"}}})
        await eventually(lambda: (c := env.ready(BU, "app")) and c["status"] == "True",
                         what="app Ready")
        with pytest.raises(NoAuthError):
            admin.get("/acl/users/app")
        with pytest.raises(NoAuthError):
            admin.get_children("/")
        with testing.zk_session(zk, timeout_s=2.0) as owner:
            owner.add_auth("digest", f"{digest[0]}:{digest[1]}")
            doc = UserDoc.from_json(bytes(owner.get("/acl/users/app")[0]))
            assert scram_login(doc, "app", PASSWORD)
            acls, _ = owner.get_acls("/")
            assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acls] == [
                ("digest", "understudy")]
