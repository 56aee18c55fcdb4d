"""Security on Kubernetes, everything that runs without a cluster (issue 15, operator side).

* The operator's CA (``k8s/certs.py``) and every decision about it (``k8s/security.py``):
  issuance, renewal windows, CA renewal with the same key, the two-step key replacement,
  when a group's certificates are reissued and when that restarts its brokers — pure, with
  fixed clocks; one real TLS handshake (Python's ``ssl``) shows that a broker restarted with
  a renewed CA and one still holding the old certificate accept each other.
* ``spec.security`` / ``spec.networkPolicy`` and the BrokerUser spec: parsing, the CRDs'
  schemas and CEL rules agreeing with the parsers (cel-python), samples.
* The built objects (flags naming files only, Secret mounts, the certificate revision, the
  NetworkPolicy) and the rendered chart (ZooKeeper digest required, NetworkPolicies), all
  validated strictly for Kubernetes 1.29-1.33 with kubernetes-validate, offline.
* RBAC: the verbs the chart grants are exactly those the operator's code uses (derived from
  the ``kube.*`` calls in its handlers) plus kopf's documented needs — no more, no fewer.
* Credentials: a SCRAM password never appears in what the operator writes.
* A real ZooKeeper: the chroot and the ``/acl`` nodes are closed to a client without the
  digest identity.

Nothing here is a claim about a real API server or network plugin (RBAC enforcement,
NetworkPolicy enforcement, admission): those are for the kind suite (e2e/).
"""

from __future__ import annotations

import ast
import base64
import functools
import json
import pathlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from kazoo.exceptions import KazooException, NoAuthError
from scramp import ScramClient, ScramMechanism

from understudy_broker.acl import Resource, Rule, UserDoc
from understudy_harness import crdschema
from understudy_harness.testing import zk_session
from understudy_operator.k8s import certs, kube
from understudy_operator.k8s.builders import (
    broker_script,
    build_all,
    build_configmap,
    build_network_policy,
    build_statefulset,
)
from understudy_operator.k8s.certs import CertError, CertPolicy
from understudy_operator.k8s.security import (
    ANNOTATION_SECURITY_MODE,
    ANNOTATION_TLS_REVISION,
    CaState,
    SecurityInputs,
    broker_dns_names,
    build_secret,
    ca_state,
    cert_problem,
    foreign_secret,
    group_brokers,
    plan_broker_certs,
    plan_ca,
    plan_user_cert,
    secret_data,
    security_change_problems,
    tls_revision,
)
from understudy_operator.k8s.spec import SpecError, TlsClientAuth, parse_spec
from understudy_operator.k8s.userspec import (
    AuthType,
    parse_user_spec,
    scram_user_doc,
)
from understudy_operator.zk import open_gateway, secure_chroot

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "understudy"
OPERATOR = ROOT / "operator" / "src" / "understudy_operator"
K8S_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33"]
NS = "shop"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
POLICY = CertPolicy()


def spec_of(**raw: Any) -> Any:
    return parse_spec({"image": "understudy/broker:t", **raw}, default_zk_connect="zk:2181")


@functools.cache
def ca_at(start: datetime = T0) -> CaState:
    return CaState(current=certs.new_ca(now=start, validity=POLICY.ca_validity))


# --------------------------------------------------------------------------- certificates


def test_needs_renewal_is_the_window_before_the_end() -> None:
    end = T0 + 100 * DAY
    assert not certs.needs_renewal(end, T0, 30 * DAY)
    assert not certs.needs_renewal(end, end - 30 * DAY - timedelta(seconds=1), 30 * DAY)
    assert certs.needs_renewal(end, end - 30 * DAY, 30 * DAY)
    assert certs.needs_renewal(end, end + DAY, 30 * DAY)  # past its end


def test_cert_policy_refuses_windows_that_cannot_work() -> None:
    with pytest.raises(CertError, match="shorter than its validity"):
        CertPolicy(cert_validity=10 * DAY, cert_renew_before=10 * DAY)
    with pytest.raises(CertError, match="later than the CA"):
        CertPolicy(ca_renew_before=20 * DAY, cert_renew_before=30 * DAY)


def test_a_broker_certificate_names_its_pod_and_services_and_is_both_server_and_client() -> None:
    ca = ca_at().current
    names = broker_dns_names("orders", NS, 1)
    assert names == ("orders-1", "orders-1.shop", "orders-1.shop.svc",
                     "orders-1.shop.svc.cluster.local", "orders-1.orders-headless",
                     "orders-1.orders-headless.shop", "orders-1.orders-headless.shop.svc",
                     "orders-1.orders-headless.shop.svc.cluster.local")
    pair = certs.issue(ca, common_name=certs.BROKER_COMMON_NAME, dns_names=names, server=True,
                       client=True, now=T0, validity=POLICY.cert_validity)
    info = pair.info
    assert info.common_name == "understudy-broker"
    assert info.dns_names == names
    assert info.server_auth
    assert info.client_auth
    assert not info.is_ca
    assert certs.issued_by(info, ca.info)
    assert certs.verify_signature(pair.cert_pem, ca.cert_pem)
    assert certs.key_matches(pair)
    assert info.not_before < T0 < info.not_after == T0 + POLICY.cert_validity
    # A leaf never outlives its CA certificate.
    late = certs.issue(ca, common_name="u", server=False, client=True,
                       now=ca.info.not_after - 10 * DAY, validity=POLICY.cert_validity)
    assert late.info.not_after == ca.info.not_after
    assert not late.info.server_auth
    other = certs.new_ca(now=T0, validity=POLICY.ca_validity)
    assert not certs.issued_by(info, other.info)
    assert not certs.verify_signature(pair.cert_pem, other.cert_pem)
    with pytest.raises(CertError):
        certs.inspect(b"not a certificate")


def _serve_once(ctx: ssl.SSLContext) -> tuple[socket.socket, dict[str, Any], threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, Any] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                cert: Any = tls.getpeercert()
                seen["peer"] = dict(x[0] for x in cert["subject"])
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError) as exc:
            seen["error"] = exc

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, seen, thread


def test_a_renewed_ca_and_the_old_one_accept_each_others_brokers(tmp_path: pathlib.Path) -> None:
    # Mid-roll after a CA renewal: the restarted broker trusts the renewed CA certificate,
    # its peer still the old one; mutual TLS works both ways (same key, same subject).
    now = datetime.now(UTC)
    old = certs.new_ca(now=now - 300 * DAY, validity=365 * DAY)
    renewed = certs.renew_ca(old, now=now, validity=POLICY.ca_validity)
    assert renewed.info.subject_key_id == old.info.subject_key_id
    assert renewed.info.not_after > old.info.not_after
    names = broker_dns_names("g", NS, 0)
    server = certs.issue(old, common_name=certs.BROKER_COMMON_NAME, dns_names=names,
                         server=True, client=True, now=now, validity=30 * DAY)
    client = certs.issue(renewed, common_name=certs.BROKER_COMMON_NAME,
                         dns_names=broker_dns_names("g", NS, 1), server=True, client=True,
                         now=now, validity=30 * DAY)

    def path(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    # The server (old certificate) trusts only the renewed CA certificate, the client
    # (certificate of the renewed CA) only the old one.
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(path("s.crt", server.cert_pem), path("s.key", server.key_pem))
    sctx.load_verify_locations(path("new-ca.crt", renewed.cert_pem))
    sctx.verify_mode = ssl.CERT_REQUIRED
    cctx = ssl.create_default_context(cafile=path("old-ca.crt", old.cert_pem))
    cctx.load_cert_chain(path("c.crt", client.cert_pem), path("c.key", client.key_pem))
    listener, seen, thread = _serve_once(sctx)
    with listener, socket.create_connection(listener.getsockname()) as raw, \
            cctx.wrap_socket(raw, server_hostname="g-0.shop.svc") as tls:
        assert tls.recv(2) == b"ok"
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    thread.join(5)
    assert seen.get("peer", {}).get("commonName") == "understudy-broker", seen
    # A certificate from a foreign CA is refused.
    stranger = certs.issue(certs.new_ca(now=now, validity=POLICY.ca_validity),
                           common_name="mallory", server=False, client=True, now=now,
                           validity=DAY)
    bad = ssl.create_default_context(cafile=str(tmp_path / "old-ca.crt"))
    bad.load_cert_chain(path("m.crt", stranger.cert_pem), path("m.key", stranger.key_pem))
    listener, seen, thread = _serve_once(sctx)
    with listener, socket.create_connection(listener.getsockname()) as raw, \
            pytest.raises((ssl.SSLError, ConnectionError)), \
            bad.wrap_socket(raw, server_hostname="g-0.shop.svc") as tls:
        tls.recv(2)
    thread.join(5)
    assert isinstance(seen.get("error"), ssl.SSLError)


def test_the_ca_is_created_renewed_with_its_key_and_replaced_in_two_steps() -> None:
    created = plan_ca(None, replacement=None, now=T0, policy=POLICY)
    assert created.changed
    assert created.actions == ("created a new CA",)
    ca = created.state
    assert plan_ca(ca, replacement=None, now=T0 + DAY, policy=POLICY).changed is False

    due = ca.current.info.not_after - POLICY.ca_renew_before
    renewed = plan_ca(ca, replacement=None, now=due, policy=POLICY)
    assert renewed.changed
    assert "renewed the CA certificate" in renewed.actions[0]
    assert renewed.state.current.key_pem == ca.current.key_pem
    assert renewed.state.current.info.subject_key_id == ca.current.info.subject_key_id
    assert renewed.state.current.info.not_after == due + POLICY.ca_validity

    # Key replacement: 'switch' before 'trust' is refused; 'trust' adds a key that does not
    # sign; 'switch' makes it sign and keeps the old certificate trusted.
    early = plan_ca(ca, replacement="switch", now=T0 + DAY, policy=POLICY)
    assert not early.changed
    assert early.problem
    assert "needs 'trust' first" in early.problem
    trusting = plan_ca(ca, replacement="trust", now=T0 + DAY, policy=POLICY)
    nxt = trusting.state.next
    assert trusting.changed
    assert nxt is not None
    assert trusting.state.current == ca.current
    assert certs.split_bundle(trusting.state.bundle()) == [ca.current.cert_pem, nxt.cert_pem]
    again = plan_ca(trusting.state, replacement="trust", now=T0 + 2 * DAY, policy=POLICY)
    assert not again.changed  # steady while a person rolls the brokers and the clients
    switched = plan_ca(trusting.state, replacement="switch", now=T0 + 3 * DAY, policy=POLICY)
    assert switched.changed
    assert switched.clear_annotation
    assert switched.state.current == nxt
    assert switched.state.next is None
    assert switched.state.trusted == (ca.current.cert_pem,)
    assert set(certs.split_bundle(switched.state.bundle())) == {nxt.cert_pem, ca.current.cert_pem}
    # The old certificate is dropped once it ended.
    later = plan_ca(switched.state, replacement=None,
                    now=ca.current.info.not_after + DAY, policy=POLICY)
    assert later.state.trusted == ()
    assert plan_ca(ca, replacement="yes", now=T0, policy=POLICY).problem


def test_a_ca_brought_by_a_person_is_used_but_never_renewed_or_replaced() -> None:
    theirs = CaState(current=certs.new_ca(now=T0, validity=400 * DAY), managed=False)
    assert plan_ca(theirs, replacement=None, now=T0 + DAY, policy=POLICY) == plan_ca(
        theirs, replacement=None, now=T0 + DAY, policy=POLICY)
    due = plan_ca(theirs, replacement=None, now=T0 + 300 * DAY, policy=POLICY)
    assert not due.changed
    assert due.problem
    assert "replace it in the CA Secret" in due.problem
    assert plan_ca(theirs, replacement="trust", now=T0, policy=POLICY).problem
    # Reading the Secret back: a key that is not the certificate's is refused.
    data = {"ca.crt": theirs.current.cert_pem, "ca.key": ca_at().current.key_pem}
    with pytest.raises(CertError, match="does not belong"):
        ca_state(data, managed=False)
    assert ca_state(ca_at().to_data(), managed=True) == ca_at()


def test_a_brought_rsa_ca_issues_broker_certificates() -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corp-ca")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(T0 - DAY).not_valid_after(T0 + 3650 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    data = {"ca.crt": cert.public_bytes(serialization.Encoding.PEM),
            "ca.key": key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())}
    theirs = ca_state(data, managed=False)
    plan = plan_broker_certs(ca=theirs, current={}, generation=0,
                             brokers=group_brokers(spec_of(slaves=0, replication={
                                 "mode": "async"}), "g", NS), now=T0, policy=POLICY)
    assert certs.verify_signature(plan.data["g-0.crt"], data["ca.crt"])
    assert certs.issued_by(certs.inspect(plan.data["g-0.crt"]), certs.inspect(data["ca.crt"]))
    assert not plan_ca(theirs, replacement=None, now=T0, policy=POLICY).changed


def test_broker_certificates_are_issued_reissued_together_and_the_revision_follows() -> None:
    ca = ca_at()
    spec = spec_of(slaves=1)
    brokers = group_brokers(spec, "g", NS)
    first = plan_broker_certs(ca=ca, current={}, generation=0, brokers=brokers, now=T0,
                              policy=POLICY)
    assert first.changed
    assert first.generation == 0
    assert sorted(first.data) == ["ca.crt", "g-0.crt", "g-0.key", "g-1.crt", "g-1.key"]
    assert first.reasons == {"g-0": "missing", "g-1": "missing"}
    revision = tls_revision(first.data["ca.crt"], first.generation)
    same = plan_broker_certs(ca=ca, current=first.data, generation=0, brokers=brokers,
                             now=T0 + DAY, policy=POLICY)
    assert not same.changed
    assert same.data == first.data

    # A new broker gets its certificate; the others keep theirs: no restart for them.
    grown = plan_broker_certs(ca=ca, current=first.data, generation=0,
                              brokers=group_brokers(spec_of(slaves=2), "g", NS), now=T0 + DAY,
                              policy=POLICY)
    assert grown.changed
    assert grown.generation == 0
    assert set(grown.reasons) == {"g-2"}
    assert grown.data["g-0.crt"] == first.data["g-0.crt"]
    assert tls_revision(grown.data["ca.crt"], grown.generation) == revision

    # One certificate due: all are reissued in one new generation (one rolling restart).
    due = T0 + POLICY.cert_validity - POLICY.cert_renew_before
    renewed = plan_broker_certs(ca=ca, current=grown.data, generation=0,
                                brokers=group_brokers(spec_of(slaves=2), "g", NS), now=due,
                                policy=POLICY)
    assert renewed.generation == 1
    assert all(renewed.data[f"g-{o}.crt"] != grown.data[f"g-{o}.crt"] for o in range(3))
    assert "due for renewal" in renewed.reasons["g-0"]
    assert tls_revision(renewed.data["ca.crt"], 1) != revision

    # Scaled down: the removed broker's certificate goes, nobody restarts.
    shrunk = plan_broker_certs(ca=ca, current=grown.data, generation=0, brokers=brokers,
                               now=T0 + DAY, policy=POLICY)
    assert shrunk.changed
    assert shrunk.generation == 0
    assert "g-2.crt" not in shrunk.data

    # A new CA key: reissued; a renewed CA certificate (same key): only the bundle changes,
    # which changes the revision too (the brokers must load the renewed CA before the old
    # certificate ends).
    other = CaState(current=certs.new_ca(now=T0, validity=POLICY.ca_validity))
    moved = plan_broker_certs(ca=other, current=first.data, generation=0, brokers=brokers,
                              now=T0 + DAY, policy=POLICY)
    assert moved.generation == 1
    assert moved.reasons["g-0"] == "issued by another CA key"
    same_key = CaState(current=certs.renew_ca(ca.current, now=T0 + DAY,
                                              validity=POLICY.ca_validity))
    bundle_only = plan_broker_certs(ca=same_key, current=first.data, generation=0,
                                    brokers=brokers, now=T0 + DAY, policy=POLICY)
    assert bundle_only.changed
    assert bundle_only.generation == 0
    assert not bundle_only.reasons
    assert tls_revision(bundle_only.data["ca.crt"], 0) != revision


def test_cert_problem_names_every_reason() -> None:
    ca = ca_at().current
    pair = certs.issue(ca, common_name="alice", server=False, client=True, now=T0,
                       validity=POLICY.cert_validity)

    def problem(**kw: Any) -> str | None:
        args: dict[str, Any] = {"ca": ca.info, "common_name": "alice", "dns_names": (),
                                "server": False, "now": T0, "renew_before": 30 * DAY} | kw
        return cert_problem(kw.pop("pair", pair), **{k: v for k, v in args.items()
                                                    if k != "pair"})

    assert problem() is None
    assert problem(pair=None) == "missing"
    assert problem(common_name="bob") == "common name 'alice', wanted 'bob'"
    assert problem(dns_names=("x",)) == "other subjectAltNames"
    assert problem(server=True) == "missing a key usage"
    assert "due for renewal" in (problem(now=T0 + 340 * DAY) or "")
    swapped = certs.KeyPair(pair.cert_pem, ca.key_pem)
    assert problem(pair=swapped) == "its key does not match the certificate"


def test_a_tls_user_certificate_is_kept_until_due() -> None:
    ca = ca_at()
    data, why = plan_user_cert(ca=ca, current={}, user="alice", now=T0, policy=POLICY)
    assert why == "missing"
    assert sorted(data) == ["ca.crt", "user.crt", "user.key"]
    info = certs.inspect(data["user.crt"])
    assert info.common_name == "alice"
    assert info.client_auth
    assert not info.server_auth
    kept, why = plan_user_cert(ca=ca, current=data, user="alice", now=T0 + DAY, policy=POLICY)
    assert why is None
    assert kept == data
    renewed, why = plan_user_cert(ca=ca, current=data, user="alice", now=T0 + 340 * DAY,
                                  policy=POLICY)
    assert why
    assert renewed["user.crt"] != data["user.crt"]


# --------------------------------------------------------------------------- specs and CRDs


@functools.cache
def crd(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
    return doc


def crd_schema(name: str) -> dict[str, Any]:
    result: dict[str, Any] = crd(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return result


def test_security_is_on_by_default_and_authentication_needs_tls() -> None:
    sec = spec_of().security
    assert (sec.tls, sec.tls_client_auth, sec.require_auth, sec.group_secret) == (
        True, TlsClientAuth.OPTIONAL, True, True)
    assert spec_of().network_policy.enabled
    node = crd_schema("brokergroup")["properties"]["spec"]["properties"]["security"]
    rules = node["x-kubernetes-validations"]
    cases = [
        ({}, True),
        ({"tls": False, "requireAuth": False, "groupSecret": False}, True),
        ({"tls": False}, False),
        ({"tlsClientAuth": "none"}, False),
        ({"tlsClientAuth": "none", "requireAuth": False}, True),
        ({"tlsClientAuth": "required"}, True),
    ]
    for raw, ok in cases:
        cel_ok = crdschema.cel_failures(rules, node, raw) == []
        problem = ""
        try:
            spec_of(security=raw)
        except SpecError as exc:
            problem = str(exc)
        assert cel_ok == (not problem) == ok, raw
        assert ok or "spec.security.requireAuth: authentication needs tls" in problem
    with pytest.raises(SpecError, match=r"superUsers\[0\]"):
        spec_of(security={"superUsers": ["bad name"]})
    with pytest.raises(SpecError, match=r"clientFrom\[0\]\.podSelektor: unknown field"):
        spec_of(networkPolicy={"clientFrom": [{"podSelektor": {}}]})
    # The CRD's defaults are spec.py's (the security object included).
    defaulted = crdschema.apply_defaults(crd_schema("brokergroup")["properties"]["spec"],
                                         {"image": "i"})
    assert defaulted["security"] == {"tls": True, "tlsClientAuth": "optional",
                                     "requireAuth": True, "groupSecret": True}
    assert parse_spec(defaulted, default_zk_connect="z:1") == parse_spec(
        {"image": "i"}, default_zk_connect="z:1")


def test_tls_and_group_secret_cannot_change_under_running_brokers() -> None:
    secure = spec_of().security
    built = build_statefulset(spec=spec_of(), group="g", namespace=NS)
    assert built["metadata"]["annotations"][ANNOTATION_SECURITY_MODE] == "tls=true,groupSecret=true"
    assert security_change_problems(secure, None) == []  # a new group
    assert security_change_problems(secure, built) == []
    plain = spec_of(security={"tls": False, "requireAuth": False, "groupSecret": False})
    problems = security_change_problems(plain.security, built)
    assert [p.split(":")[0] for p in problems] == ["spec.security.tls",
                                                    "spec.security.groupSecret"]
    # A StatefulSet from before security runs without either: the secure default is refused
    # (the status says so), the explicit plain spec is accepted.
    legacy = {"metadata": {"name": "g", "annotations": {}}}
    assert len(security_change_problems(secure, legacy)) == 2
    assert security_change_problems(plain.security, legacy) == []
    # Authentication and client-certificate policy may change (brokers keep their certs).
    relaxed = spec_of(security={"requireAuth": False, "tlsClientAuth": "required"})
    assert security_change_problems(relaxed.security, built) == []


USER_CRD_CASES: list[tuple[dict[str, Any], str | None]] = [
    ({"authentication": {"type": "tls"}}, None),
    ({"authentication": {"type": "scram-sha-512", "passwordSecret": {"name": "p"}}}, None),
    ({"authentication": {"type": "scram-sha-512"}}, "passwordSecret"),
    ({"authentication": {"type": "tls", "passwordSecret": {"name": "p"}}}, "passwordSecret"),
    ({"authentication": {"type": "tls"}, "acls": [{"resource": "topic", "operations": ["produce"]}]},
     "name"),
    ({"authentication": {"type": "tls"}, "acls": [{"resource": "cluster", "name": "x",
                                                    "operations": ["create"]}]}, "name"),
    ({"authentication": {"type": "tls"}, "acls": [{"resource": "cluster",
                                                    "operations": ["create"]}]}, None),
]


def _user_cel(spec: dict[str, Any]) -> list[str]:
    props = crd_schema("brokeruser")["properties"]["spec"]["properties"]
    failed = crdschema.cel_failures(props["authentication"]["x-kubernetes-validations"],
                                    props["authentication"], spec["authentication"])
    items = props["acls"]["items"]
    for acl in spec.get("acls", []):
        failed += crdschema.cel_failures(items["x-kubernetes-validations"], items, acl)
    return failed


@pytest.mark.parametrize(("spec", "where"), USER_CRD_CASES)
def test_brokeruser_crd_and_parser_agree(spec: dict[str, Any], where: str | None) -> None:
    doc = {"apiVersion": "understudy.io/v1alpha1", "kind": "BrokerUser",
           "metadata": {"name": "alice"}, "spec": spec}
    errors = [e.message for e in crdschema.validator(crd_schema("brokeruser")).iter_errors(doc)]
    cel = _user_cel(spec)
    try:
        parse_user_spec(spec, name="alice", default_zk_connect="zk:2181")
        parsed = None
    except SpecError as exc:
        parsed = str(exc)
    if where is None:
        assert errors == []
        assert cel == []
        assert parsed is None
    else:
        assert errors or cel, parsed
        assert where in (parsed or ""), (errors, cel, parsed)


def test_brokeruser_spec_reports_every_problem_and_refuses_reserved_names() -> None:
    with pytest.raises(SpecError) as caught:
        parse_user_spec({"authentication": {"type": "tls"}, "acls": [
            {"resource": "queue", "name": "x", "operations": ["produce"]},
            {"resource": "topic", "name": "orders", "operations": ["join"]},
            {"resource": "group", "name": "bad name", "operations": ["join"]},
            "nope"]}, name="alice", default_zk_connect="zk:2181")
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "spec.acls[0]", "spec.acls[1]", "spec.acls[2]", "spec.acls[3]"]
    assert "operations on a topic" in problems[1]
    for reserved in ("understudy-broker", "understudy-operator"):
        with pytest.raises(SpecError, match="reserved"):
            parse_user_spec({"authentication": {"type": "tls"}}, name=reserved,
                            default_zk_connect="zk:2181")
    rule = crd_schema("brokeruser")["x-kubernetes-validations"][0]
    assert crdschema.cel_failures([rule], crd_schema("brokeruser"),
                                  {"metadata": {"name": "understudy-broker"}, "spec": {}})
    user = parse_user_spec({"authentication": {"type": "scram-sha-512",
                                               "passwordSecret": {"name": "pw"}},
                            "acls": [{"resource": "cluster", "operations": ["Describe"]},
                                     {"resource": "topic", "name": "o-*",
                                      "operations": ["produce", "produce"]}]},
                           name="app", default_zk_connect="zk:2181", default_chroot="/c")
    assert user.authentication is AuthType.SCRAM_SHA_512
    assert user.password_secret is not None
    assert user.password_secret.key == "password"
    assert user.rules == (Rule(Resource.CLUSTER, "*", frozenset({"describe"})),
                          Rule(Resource.TOPIC, "o-*", frozenset({"produce"})))
    assert user.zookeeper.url == "zk:2181/c"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_brokeruser_crd_is_valid_and_shipped_by_the_chart(version: str) -> None:
    kubernetes_validate.validate(crd("brokeruser"), version, strict=True)
    assert (CHART / "crds" / "brokeruser.yaml").read_bytes() == (
        ROOT / "crds" / "brokeruser.yaml").read_bytes()


@pytest.mark.parametrize("path", sorted((ROOT / "crds" / "samples").glob("user-*.yaml")),
                         ids=lambda p: p.name)
def test_brokeruser_samples_validate_and_parse(path: pathlib.Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["kind"] == "BrokerUser"
    crdschema.validator(crd_schema("brokeruser")).validate(doc)
    assert _user_cel(doc["spec"]) == []
    parse_user_spec(doc["spec"], name=doc["metadata"]["name"], default_zk_connect="zk:2181")


# --------------------------------------------------------------------------- built objects


def run_script(script: str, pod: str, tmp_path: pathlib.Path) -> list[str]:
    fake = tmp_path / "understudy"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    proc = subprocess.run(["/bin/sh", "-c", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin",
                                                           "POD_NAME": pod},
                          capture_output=True, text=True, timeout=10, check=True)
    return proc.stdout.splitlines()


def flags(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_broker_flags_name_only_files(tmp_path: pathlib.Path) -> None:
    spec = spec_of(slaves=1, security={"superUsers": ["ops"]})
    argv = run_script(broker_script(spec=spec, group="g", namespace=NS, zk_digest=True), "g-1",
                      tmp_path)
    assert flags(argv, "--tls-cert") == ["/etc/understudy-tls/g-1.crt"]
    assert flags(argv, "--tls-key") == ["/etc/understudy-tls/g-1.key"]
    assert flags(argv, "--tls-ca") == ["/etc/understudy-tls/ca.crt"]
    assert flags(argv, "--tls-client-auth") == ["optional"]
    assert "--require-auth" in argv
    assert flags(argv, "--super-user") == ["understudy-broker", "ops"]
    assert flags(argv, "--group-secret-file") == ["/etc/understudy-group/secret"]
    assert flags(argv, "--zk-digest-file") == ["/etc/understudy-zookeeper/digest"]
    assert "--zk-digest" not in argv
    plain = spec_of(security={"tls": False, "requireAuth": False, "groupSecret": False})
    argv = run_script(broker_script(spec=plain, group="g", namespace=NS), "g-0", tmp_path)
    assert not [a for a in argv if a.startswith(("--tls", "--super", "--group-secret",
                                                 "--require", "--zk-digest"))]


def test_secrets_are_mounted_read_only_and_the_revision_is_in_the_pod_template() -> None:
    spec = spec_of(slaves=1)
    inputs = SecurityInputs(tls_revision="abc123", ca_bundle="PEM", zk_digest=True)
    sts = build_statefulset(spec=spec, group="g", namespace=NS, security=inputs)
    template = sts["spec"]["template"]
    assert template["metadata"]["annotations"] == {ANNOTATION_TLS_REVISION: "abc123"}
    pod = template["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"] == {"secretName": "g-broker-tls", "defaultMode": 0o440}
    assert volumes["group-secret"]["secret"]["secretName"] == "g-group-secret"
    assert volumes["zookeeper-digest"]["secret"]["secretName"] == "g-zookeeper-digest"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    for name in ("tls", "group-secret", "zookeeper-digest"):
        assert mounts[name]["readOnly"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["fsGroup"] == 10001  # 0440 files readable by the broker
    env = pod["containers"][0]["env"]
    assert all("value" not in e or e["name"].startswith("PYTHON") for e in env)
    cm = build_configmap(spec=spec, group="g", namespace=NS, security=inputs)
    assert cm["data"]["ca.crt"] == "PEM"
    # Without a revision (a unit test, security off) the template carries no annotation.
    assert "annotations" not in build_statefulset(spec=spec, group="g", namespace=NS)[
        "spec"]["template"]["metadata"]


def test_network_policy_admits_what_each_port_needs() -> None:
    np = build_network_policy(spec=spec_of(), group="g", namespace=NS)
    assert np["spec"]["podSelector"]["matchLabels"]["understudy.io/group"] == "g"
    assert np["spec"]["policyTypes"] == ["Ingress"]
    client, replication, http = np["spec"]["ingress"]
    assert client["ports"] == [{"protocol": "TCP", "port": 9876}]
    assert client["from"][0] == {"podSelector": {}}  # the namespace
    names = [p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name")
             for p in client["from"][1:]]
    assert names == ["understudy-broker", "understudy-operator"]
    assert replication["ports"] == [{"protocol": "TCP", "port": 10912}]
    assert replication["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "understudy-broker", "app.kubernetes.io/instance": "g",
        "understudy.io/group": "g"}}}]
    assert http["ports"] == [{"protocol": "TCP", "port": 9100}]
    assert http["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name":
                                                             "prometheus"}
    custom = build_network_policy(spec=spec_of(networkPolicy={
        "clientFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
        "metricsFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}), group="g", namespace=NS)
    assert custom["spec"]["ingress"][0]["from"][0] == {
        "namespaceSelector": {"matchLabels": {"team": "a"}}}
    assert custom["spec"]["ingress"][2]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    kinds = [o["kind"] for o in build_all(spec=spec_of(networkPolicy={"enabled": False}),
                                          group="g", namespace=NS)]
    assert "NetworkPolicy" not in kinds


@pytest.mark.parametrize("version", ["1.29", "1.33"])
def test_secure_objects_and_secrets_pass_strict_validation(version: str) -> None:
    spec = spec_of(slaves=2, networkPolicy={"clientFrom": [
        {"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {}}]})
    ca = ca_at()
    plan = plan_broker_certs(ca=ca, current={}, generation=0,
                             brokers=group_brokers(spec, "g", NS), now=T0, policy=POLICY)
    inputs = SecurityInputs(tls_revision=tls_revision(plan.data["ca.crt"], 0),
                            ca_bundle=ca.bundle().decode(), zk_digest=True)
    objects = [o for o in build_all(spec=spec, group="g", namespace=NS, security=inputs)
               if o["kind"] != "ServiceMonitor"]
    objects += [build_secret(name="g-broker-tls", namespace=NS, secret_for="BrokerGroup.g",
                             data=plan.data, annotations={"understudy.io/tls-generation": "0"}),
                build_secret(name="understudy-ca", namespace=NS, secret_for="ca",
                             data=ca.to_data())]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_secret_the_operator_did_not_make_is_never_its() -> None:
    mine = build_secret(name="g-group-secret", namespace=NS, secret_for="BrokerGroup.g",
                        data={"secret": b"x"})
    assert foreign_secret(None, "BrokerGroup.g") is None
    assert foreign_secret(mine, "BrokerGroup.g") is None
    assert "the operator's for BrokerGroup.g" in (foreign_secret(mine, "BrokerUser.g") or "")
    theirs = {"metadata": {"name": "g-group-secret", "namespace": NS}, "data": {}}
    assert "not made by the operator" in (foreign_secret(theirs, "BrokerGroup.g") or "")
    assert secret_data(mine) == {"secret": b"x"}


# --------------------------------------------------------------------------- credentials


def test_a_scram_user_document_holds_a_working_credential_and_never_the_password() -> None:
    password = "correct horse battery staple"
    doc = scram_user_doc(password)
    raw = doc.to_json()
    for form in (password.encode(), base64.b64encode(password.encode())):
        assert form not in raw
    assert list(doc.scram) == ["SCRAM-SHA-512"]
    assert scram_login(UserDoc.from_json(raw), "app", password)
    assert not scram_login(UserDoc.from_json(raw), "app", "wrong")
    assert scram_user_doc(password).to_json() != raw  # a fresh salt every time


def scram_login(doc: UserDoc, user: str, password: str) -> bool:
    """A full SCRAM-SHA-512 exchange (scramp's client and server) against ``doc``."""
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
    client.set_server_final(server.get_server_final())
    return True


# --------------------------------------------------------------------------- the chart


@functools.cache
def render(values_json: str = "{}") -> tuple[dict[str, Any], ...]:
    out = helm_python.Chart.load(str(CHART)).render(json.loads(values_json), name="understudy",
                                                    namespace="understudy-system")
    return tuple(d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt")
                 for d in yaml.safe_load_all(text) if d)


def kinds(docs: Any, kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_chart_zookeeper_requires_digest_credentials() -> None:
    docs = render()
    (secret,) = [s for s in kinds(docs, "Secret") if s["metadata"]["name"] ==
                 "understudy-zookeeper-auth"]
    digest = base64.b64decode(secret["data"]["digest"]).decode()
    user, _, password = digest.partition(":")
    assert user == "understudy"
    assert len(password) == 32
    superpw = base64.b64decode(secret["data"]["superPassword"]).decode()
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (zk,) = kinds(docs, "StatefulSet")
    container = zk["spec"]["template"]["spec"]["containers"][0]
    script = container["command"][2]
    assert "enforce.auth.enabled=true enforce.auth.schemes=digest" in script
    assert "DigestAuthenticationProvider.superDigest=$super_digest" in script
    auth = next(v for v in zk["spec"]["template"]["spec"]["volumes"] if v["name"] == "auth")
    assert auth["secret"]["items"] == [{"key": "superPassword", "path": "superPassword"}]
    (deploy,) = kinds(docs, "Deployment")
    op = deploy["spec"]["template"]["spec"]
    args = op["containers"][0]["args"]
    path = args[args.index("--zk-digest-file") + 1]
    mount = next(m for m in op["containers"][0]["volumeMounts"] if m["name"] ==
                 "zookeeper-digest")
    assert path == f"{mount['mountPath']}/digest"
    assert mount["readOnly"]
    assert args[args.index("--ca-secret") + 1] == "understudy-system/understudy-ca"
    # The generated passwords are in that Secret only: no argument, env value or ConfigMap.
    for doc in docs:
        if doc is secret:
            continue
        text = json.dumps(doc)
        assert password not in text, doc["metadata"]["name"]
        assert superpw not in text, doc["metadata"]["name"]
    theirs = render(json.dumps({"zookeeper": {"auth": {"existingSecret": "mine"}}}))
    assert not [s for s in kinds(theirs, "Secret")]
    (deploy,) = kinds(theirs, "Deployment")
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "zookeeper-digest")
    assert volume["secret"]["secretName"] == "mine"


def test_chart_network_policies() -> None:
    docs = render(json.dumps({"operator": {"watchNamespaces": ["shop"]}}))
    policies = {p["metadata"]["name"]: p["spec"] for p in kinds(docs, "NetworkPolicy")}
    zk, op = policies["understudy-zookeeper"], policies["understudy-operator"]
    clients, quorum = zk["ingress"]
    assert [p["port"] for p in clients["ports"]] == [2181]
    assert clients["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == \
        "understudy-operator"
    brokers = clients["from"][1]
    assert brokers["podSelector"]["matchLabels"] == {"app.kubernetes.io/name":
                                                     "understudy-broker"}
    assert brokers["namespaceSelector"]["matchExpressions"][0]["values"] == ["shop"]
    assert [p["port"] for p in quorum["ports"]] == [2888, 3888]
    assert quorum["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == \
        "understudy-zookeeper"
    assert op["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert not kinds(render(json.dumps({"networkPolicy": {"enabled": False}})), "NetworkPolicy")


@pytest.mark.parametrize("version", ["1.29", "1.33"])
@pytest.mark.parametrize("values", [
    {"zookeeper": {"auth": {"existingSecret": "mine"}}},
    {"networkPolicy": {"enabled": False}, "operator": {"ca": {"secretName": "my-ca"}}},
    {"operator": {"watchNamespaces": ["shop"], "certificates": {"validityDays": 90,
                                                                "renewDays": 20}}},
])
def test_chart_security_values_render_valid_objects(values: dict[str, Any], version: str
                                                    ) -> None:
    if version == "1.29":
        report = helm_python.lint(str(CHART), values, namespace="understudy-system",
                                  strict=True, kube_version="v1.29.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []
    for doc in render(json.dumps(values)):
        if doc["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
            continue
        kubernetes_validate.validate(doc, version, strict=True)


# --------------------------------------------------------------------------- RBAC

#: kube.py's verbs -> the API verbs they send (``apply``: GET, then POST or merge-PATCH).
API_VERBS = {"get": {"get"}, "exists": {"get"}, "list": {"list"}, "create": {"create"},
             "patch": {"patch"}, "delete": {"delete"}, "apply": {"get", "create", "patch"},
             "patch_status": {"patch"}, "post_event": {"create"}}
#: Call sites that pass a built object rather than a resource constant: the kinds they may
#: carry. A new such call site fails the test until it is listed here.
DYNAMIC_KINDS = {
    "handlers/reconcile.py": {"ConfigMap", "Service", "PodDisruptionBudget", "NetworkPolicy",
                              "StatefulSet", "ServiceMonitor"},
    "handlers/security.py": {"Secret"},
}
#: What kopf itself sends (docs/security-kubernetes.md, "RBAC"): watch streams (list +
#: watch) on what it serves and on pods (the pod event handler), patches for finalizers and
#: its progress, Events for handler failures, CRD and namespace scanning, and the
#: finalizers subresource that kopf.adopt's blockOwnerDeletion needs on an owner.
KOPF_NEEDS = {
    ("understudy.io", "brokergroups"): {"list", "watch", "patch"},
    ("understudy.io", "brokertopics"): {"list", "watch", "patch"},
    ("understudy.io", "brokerusers"): {"list", "watch", "patch"},
    ("understudy.io", "brokergroups/status"): {"patch"},
    ("understudy.io", "brokertopics/status"): {"patch"},
    ("understudy.io", "brokerusers/status"): {"patch"},
    ("understudy.io", "brokergroups/finalizers"): {"update"},
    ("understudy.io", "brokerusers/finalizers"): {"update"},
    ("", "pods"): {"list", "watch"},
    ("", "events"): {"create"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
}


def _kube_calls() -> Iterator[tuple[str, str, ast.Call]]:
    """(module path under the package, kube verb, call) for every ``<x>.kube.<verb>(...)``."""
    for path in sorted(OPERATOR.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in API_VERBS
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "kube"):
                yield str(path.relative_to(OPERATOR)), node.func.attr, node


def used_permissions() -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, from the operator's code and kopf's needs."""
    by_kind = {r.kind: r for r in kube.BY_KIND.values()}
    used: dict[tuple[str, str], set[str]] = {k: set(v) for k, v in KOPF_NEEDS.items()}
    calls = list(_kube_calls())
    assert len(calls) > 20  # the scan sees the handlers
    for module, verb, call in calls:
        if verb == "post_event":
            resources = [kube.EVENTS]
        elif (call.args and isinstance(call.args[0], ast.Name)
              and isinstance(getattr(kube, call.args[0].id, None), kube.Resource)):
            resources = [getattr(kube, call.args[0].id)]
        else:
            assert module in DYNAMIC_KINDS, f"{module}: kube.{verb}(<object>) needs DYNAMIC_KINDS"
            resources = [by_kind[k] for k in DYNAMIC_KINDS[module]]
        for res in resources:
            plural = res.plural + ("/status" if verb == "patch_status" else "")
            used.setdefault((res.group, plural), set()).update(API_VERBS[verb])
    return used


def granted(docs: Any) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    out.setdefault((group, res), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("values", [{}, {"operator": {"watchNamespaces": ["shop", "billing"]}}],
                         ids=["cluster-wide", "namespaced"])
def test_rbac_grants_exactly_the_verbs_the_operator_uses(values: dict[str, Any]) -> None:
    used = used_permissions()
    chart = granted(render(json.dumps(values)))
    unused = {k: sorted(v - used.get(k, set())) for k, v in chart.items()
              if v - used.get(k, set())}
    missing = {k: sorted(v - chart.get(k, set())) for k, v in used.items()
               if v - chart.get(k, set())}
    assert unused == {}, f"the chart grants verbs nobody uses: {unused}"
    assert missing == {}, f"the operator uses verbs the chart does not grant: {missing}"
    # Secrets are read and written by name only.
    assert used[("", "secrets")] == {"get", "create", "patch", "delete"}


# --------------------------------------------------------------------------- the operator CLI


def test_operator_takes_the_digest_from_a_file_only_once(tmp_path: pathlib.Path) -> None:
    from click.testing import CliRunner

    from understudy_operator.cli.kube_operator import operator_cmd, split_ca_secret
    from understudy_operator.cli.options import read_digest_file

    digest = tmp_path / "digest"
    digest.write_text("understudy:s3cret:with:colons\n")
    assert read_digest_file(digest) == ("understudy", "s3cret:with:colons")
    digest.write_text("no-colon")
    result = CliRunner().invoke(operator_cmd, ["-A", "--zk-digest-file", str(digest)])
    assert result.exit_code == 2
    assert "USER:PASSWORD" in result.output
    assert "no-colon" not in result.output
    result = CliRunner().invoke(operator_cmd, ["-A", "--zk-digest", "a:b",
                                               "--zk-digest-file", str(digest)])
    assert result.exit_code == 2
    assert "give one" in result.output
    assert split_ca_secret("ops/understudy-ca") == ("ops", "understudy-ca")
    # The controller and `understudy group` take the same file flag.
    from understudy_operator.cli.controller import controller

    digest.write_text("u:p")
    result = CliRunner().invoke(controller, ["--zk", "127.0.0.1:1/x", "--group", "g",
                                             "--http-port", "0",
                                             "--zk-digest", "a:b", "--zk-digest-file",
                                             str(digest)])
    assert result.exit_code == 2
    assert "give one" in result.output
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        split_ca_secret("understudy-ca")


def test_the_operators_identity_may_only_describe() -> None:
    from understudy_broker.acl import authorize
    from understudy_operator.k8s.userspec import OPERATOR_COMMON_NAME, operator_rules

    rules = operator_rules().rules

    def may(resource: Resource, name: str, op: str) -> bool:
        return authorize(rules, user=OPERATOR_COMMON_NAME, super_user=False, resource=resource,
                         name=name, operation=op).allowed

    assert may(Resource.TOPIC, "orders", "describe")
    assert may(Resource.GROUP, "readers", "describe")
    for resource, op in ((Resource.TOPIC, "produce"), (Resource.TOPIC, "consume"),
                         (Resource.TOPIC, "admin"), (Resource.GROUP, "commit"),
                         (Resource.CLUSTER, "security")):
        assert not may(resource, "*" if resource is Resource.CLUSTER else "x", op)


def test_the_operators_client_identity_completes_mutual_tls_with_a_broker(
        tmp_path: pathlib.Path) -> None:
    # What the operator presents for a topic's backlog: its certificate (in memory; the
    # key touched a private temporary directory only while OpenSSL loaded it), verified by a
    # broker-like server that requires client certificates; the broker's name is checked.
    from understudy_operator.handlers.security import _client_context
    from understudy_operator.k8s.userspec import OPERATOR_COMMON_NAME

    now = datetime.now(UTC)
    ca = certs.new_ca(now=now, validity=POLICY.ca_validity)
    broker = certs.issue(ca, common_name=certs.BROKER_COMMON_NAME,
                         dns_names=broker_dns_names("g", NS, 0), server=True, client=True,
                         now=now, validity=DAY)
    me = certs.issue(ca, common_name=OPERATOR_COMMON_NAME, server=False, client=True, now=now,
                     validity=DAY)
    ctx = _client_context(ca.cert_pem, me)
    for name, data in (("b.crt", broker.cert_pem), ("b.key", broker.key_pem),
                       ("ca.crt", ca.cert_pem)):
        (tmp_path / name).write_bytes(data)
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(str(tmp_path / "b.crt"), str(tmp_path / "b.key"))
    sctx.load_verify_locations(str(tmp_path / "ca.crt"))
    sctx.verify_mode = ssl.CERT_REQUIRED
    listener, seen, thread = _serve_once(sctx)
    with listener, socket.create_connection(listener.getsockname()) as raw, \
            ctx.wrap_socket(raw, server_hostname="g-0.shop.svc") as tls:
        assert tls.recv(2) == b"ok"
    thread.join(5)
    assert seen["peer"]["commonName"] == "understudy-operator"
    listener, seen, thread = _serve_once(sctx)
    with listener, socket.create_connection(listener.getsockname()) as raw, \
            pytest.raises(ssl.SSLCertVerificationError, match="match"):
        ctx.wrap_socket(raw, server_hostname="other-0.shop.svc")
    thread.join(5)


# --------------------------------------------------------------------------- a real ZooKeeper


@pytest.mark.integration
async def test_the_chroot_and_acl_nodes_are_closed_without_the_digest(zk: str) -> None:
    connect, _, chroot = zk.partition("/")
    digest = ("understudy", "z00keeper-pw")
    said = await secure_chroot(connect, f"/{chroot}", digest=digest)
    assert "created with the digest identity understudy" in said
    assert "digest ACL in place" in await secure_chroot(connect, f"/{chroot}", digest=digest)
    rules = b'{"rules":[]}'
    async with open_gateway(zk, digest=digest) as gw:
        assert await gw.write_acl_user("alice", scram_user_doc("pw").to_json())
        assert await gw.write_acl_rules("alice", rules)
        assert not await gw.write_acl_rules("alice", rules)  # unchanged: no write
        assert await gw.acl_users() == ["alice"]
    with zk_session(zk, timeout_s=2.0) as stranger:
        for path in ("/acl/users/alice", "/acl/rules/alice"):
            with pytest.raises(NoAuthError):
                stranger.get(path)
        with pytest.raises(NoAuthError):
            stranger.create("/planted", b"x")
        with pytest.raises(NoAuthError):
            stranger.get_children("/")
    async with open_gateway(zk, digest=digest) as gw:
        assert sorted(await gw.delete_acl_user("alice")) == ["/acl/rules/alice",
                                                             "/acl/users/alice"]
        assert await gw.read_acl_user("alice") is None


@pytest.mark.integration
def test_the_charts_zookeeper_settings_refuse_anonymous_clients(tmp_path: pathlib.Path) -> None:
    # The chart's ZooKeeper start script, run for real up to its exec: it computes the super
    # user's digest with the ZooKeeper jar's own DigestAuthenticationProvider (here the
    # Debian package's, 3.8) and extends ZOO_CFG_EXTRA; a ZooKeeper started with those
    # zoo.cfg lines refuses an anonymous client, serves a digest client, and lets the super
    # user read a node only the digest identity may use. (The image's entrypoint that writes
    # zoo.cfg from ZOO_CFG_EXTRA is not run here.)
    from understudy_broker.zkclient import make_client
    from understudy_operator.local.zkserver import JARS, ZooKeeperServer

    if not all(pathlib.Path(j).exists() for j in JARS):
        pytest.skip("no ZooKeeper jar (make setup)")
    (zk,) = kinds(render(), "StatefulSet")
    container = zk["spec"]["template"]["spec"]["containers"][0]
    script = container["command"][2]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    home = tmp_path / "zk"
    (home / "bin").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "bin" / "zkServer.sh").write_text("#!/bin/sh\n")
    (home / "bin" / "zkServer.sh").chmod(0o755)
    for jar in JARS:
        (home / "lib" / pathlib.Path(jar).name).symlink_to(jar)
    (tmp_path / "superPassword").write_text("s00per")
    marker = "exec /docker-entrypoint.sh zkServer.sh start-foreground"
    assert marker in script
    runnable = script.replace("/etc/zookeeper-auth/superPassword",
                              str(tmp_path / "superPassword")).replace(
        marker, 'printf "%s" "$ZOO_CFG_EXTRA"')
    proc = subprocess.run(["/bin/bash", "-ec", runnable], capture_output=True, text=True,
                          timeout=60, check=True,
                          env={"PATH": f"{home / 'bin'}:/usr/bin:/bin", "HOSTNAME": "zk-0",
                               "ZOO_CFG_EXTRA": env["ZOO_CFG_EXTRA"]})
    extra = proc.stdout.split()
    assert "enforce.auth.enabled=true" in extra
    assert any(e.startswith("DigestAuthenticationProvider.superDigest=super:") for e in extra)

    class ChartZooKeeper(ZooKeeperServer):
        def _config(self) -> str:
            lines = [e for e in extra if not e.startswith(("minSession", "maxSession"))]
            return super()._config() + "\n".join(lines) + "\n"

    server = ChartZooKeeper(tmp_path / "data")
    server.start()
    try:
        anonymous = make_client(server.connect, timeout_s=2.0)
        anonymous.start(timeout=5)
        try:
            with pytest.raises(KazooException):  # the server closes its session
                anonymous.get_children("/")
        finally:
            anonymous.stop()
            anonymous.close()
        owner = make_client(server.connect, timeout_s=2.0, digest=("understudy", "pw"))
        owner.start(timeout=5)
        owner.create("/understudy", b"x")  # gets the digest ACL (make_client's default)
        owner.stop()
        owner.close()
        root = make_client(server.connect, timeout_s=2.0, digest=("super", "s00per"))
        root.start(timeout=5)
        assert root.get("/understudy")[0] == b"x"
        root.stop()
        root.close()
    finally:
        server.stop()
