"""The pure security rules: what an ACL rule grants, the documents in ZooKeeper, the
SCRAM user in a client-first message, the replication handshake's MACs and the broker's
security flags (each bad one refused with a message naming it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from understudy_broker import acl
from understudy_broker.acl import AclError, Resource, Rule, RulesDoc, UserDoc, authorize
from understudy_broker.config import BrokerConfig, ConfigError, SecurityConfig, validate
from understudy_broker.replication.wire import group_mac, proof_matches
from understudy_broker.server.auth import scram_user
from understudy_broker.server.errors import RequestError


def allowed(rules: list[Rule], resource: Resource, name: str, op: str,
            super_user: bool = False) -> bool:
    return authorize(rules, user="u", super_user=super_user, resource=resource, name=name,
                     operation=op).allowed


def test_a_rule_grants_its_operations_on_matching_names_only() -> None:
    rules = [acl.parse_rule("topic", "orders-*", ["produce"]),
             acl.parse_rule("group", "shop", ["join"])]
    assert allowed(rules, Resource.TOPIC, "orders-eu", "produce")
    assert allowed(rules, Resource.TOPIC, "orders-eu", "describe")  # implied
    assert not allowed(rules, Resource.TOPIC, "orders-eu", "consume")
    assert not allowed(rules, Resource.TOPIC, "orders", "produce")  # prefix is "orders-"
    assert not allowed(rules, Resource.TOPIC, "payroll", "produce")
    assert allowed(rules, Resource.GROUP, "shop", "describe")
    assert not allowed(rules, Resource.GROUP, "shop", "commit")
    assert not allowed(rules, Resource.GROUP, "shop-2", "join")  # a literal is exact
    assert not allowed(rules, Resource.CLUSTER, "*", "create")
    assert allowed([], Resource.CLUSTER, "*", "security", super_user=True)
    everything = [acl.parse_rule("topic", "*", ["all"])]
    assert allowed(everything, Resource.TOPIC, "x", "admin")
    assert not allowed(everything, Resource.GROUP, "x", "join")


def test_a_groups_retry_and_dead_letter_topics_follow_the_group() -> None:
    assert acl.topic_resource("%RETRY%shop", "consume") == (Resource.GROUP, "shop", "join")
    assert acl.topic_resource("%DLQ%shop", "produce") == (Resource.GROUP, "shop", "commit")
    assert acl.topic_resource("orders", "consume") == (Resource.TOPIC, "orders", "consume")


@pytest.mark.parametrize(("resource", "name", "ops", "why"), [
    ("topic", "orders", ["fly"], "operations on a topic"),
    ("topic", "orders", [], "operations on a topic"),
    ("cluster", "x", ["create"], "cluster rule's name is '*'"),
    ("queue", "x", ["produce"], "topic, group or cluster"),
    ("group", "a*b", ["join"], "prefix ending in '*'"),
    ("group", "shop", ["produce"], "operations on a group"),
])
def test_a_malformed_rule_is_refused_with_what_is_wrong(resource: str, name: str,
                                                        ops: list[str], why: str) -> None:
    with pytest.raises(AclError, match=why):
        acl.parse_rule(resource, name, ops)


def test_documents_round_trip_and_keep_no_password() -> None:
    user = acl.make_user("correct horse battery staple", iterations=4096)
    assert set(user.scram) == set(acl.MECHANISMS)
    raw = user.to_json()
    assert b"correct horse" not in raw
    assert UserDoc.from_json(raw) == user
    rules = RulesDoc((acl.parse_rule("topic", "a", ["produce"]),))
    doc = rules.adding([acl.parse_rule("group", "g", ["join"])])
    assert RulesDoc.from_json(doc.to_json()) == doc
    assert doc.removing(rules.rules).rules == (acl.parse_rule("group", "g", ["join"]),)
    for bad in (b"[]", b"{", b'{"scram": {"MD5": {}}}',
                b'{"scram": {"SCRAM-SHA-256": {"salt": "!!", "stored_key": "", '
                b'"server_key": "", "iterations": 4096}}}'):
        with pytest.raises(AclError):
            UserDoc.from_json(bad)
    with pytest.raises(AclError, match="at least 4096"):
        acl.ScramCredential(b"s", b"k", b"k", 10)
    with pytest.raises(AclError, match="user name"):
        acl.check_user("../etc")


def test_the_scram_user_is_read_from_a_client_first_message() -> None:
    assert scram_user("n,,n=bob,r=abc") == "bob"
    assert scram_user("n,,n=a=2Cb=3Dc,r=abc") == "a,b=c"
    with pytest.raises(RequestError, match="client-first"):
        scram_user("hello")


def test_the_replication_macs_bind_side_group_and_both_nonces() -> None:
    secret, a, b = b"s" * 32, b"a" * 32, b"b" * 32
    mac = group_mac(secret, "slave", "g1", a, b)
    assert proof_matches(mac, group_mac(secret, "slave", "g1", a, b))
    assert not proof_matches(mac, group_mac(secret, "master", "g1", a, b))  # no reflection
    assert not proof_matches(mac, group_mac(secret, "slave", "g2", a, b))
    assert not proof_matches(mac, group_mac(secret, "slave", "g1", b, a))
    assert not proof_matches(mac, group_mac(b"t" * 32, "slave", "g1", a, b))


@pytest.mark.parametrize(("change", "flag"), [
    ({"tls_cert": Path("c.pem")}, "--tls-cert and --tls-key"),
    ({"tls_client_auth": "sometimes"}, "--tls-client-auth"),
    ({"tls_cert": Path("c"), "tls_key": Path("k"), "tls_client_auth": "required"},
     "needs --tls-ca"),
    ({"tls_ca": Path("ca")}, "need --tls-cert"),
    ({"require_auth": True}, "--require-auth needs --zk"),
    ({"audit": "loud"}, "--audit"),
    ({"group_secret": b"short"}, "at least 16 bytes"),
    ({"peer_user": "b"}, "--peer-user and --peer-password-file"),
])
def test_bad_security_flags_are_refused_naming_the_flag(change: dict[str, object],
                                                        flag: str) -> None:
    cfg = BrokerConfig(data_dir=Path("d"), port=1, replication_port=2,
                       security=dataclasses.replace(SecurityConfig(), **change))
    with pytest.raises(ConfigError, match=flag):
        validate(cfg)
