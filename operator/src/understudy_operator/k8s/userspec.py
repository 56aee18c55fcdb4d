"""A BrokerUser's spec, and the ZooKeeper documents it becomes: pure, no I/O.

Why this module exists: a BrokerUser is a person's or an application's identity on the
brokers (Strimzi's KafkaUser): how it authenticates and what its ACLs grant. The handler
(``handlers/users.py``) must never half-apply one — a bad ACL is reported and nothing is
written — and must never let a password travel further than the salted SCRAM credential
:func:`understudy_broker.acl.make_user` makes. So the spec is parsed here, every problem at
once, with the broker's own rules (:mod:`understudy_broker.acl`: user names, resources,
operations), and the documents for ``/acl/users/<user>`` and ``/acl/rules/<user>`` are
built here from a password the handler read and drops.

Spec (docs/security-kubernetes.md)::

    spec:
      authentication:
        type: scram-sha-512 | tls
        passwordSecret: {name, key}   # scram-sha-512: a Secret the user owns
      acls: [{resource: topic|group|cluster, name: "orders-*", operations: [produce]}]
      zookeeper: {connect, chroot}    # [the operator's --zk] the cluster the user is for
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from understudy_broker.acl import (
    AclError,
    Resource,
    Rule,
    RulesDoc,
    UserDoc,
    check_user,
    make_user,
)
from understudy_operator.k8s.certs import BROKER_COMMON_NAME
from understudy_operator.k8s.spec import FieldParser, SpecError, ZooKeeperSpec, parse_zookeeper

KIND: Final = "BrokerUser"
#: The operator's own identity on the brokers (its client certificate, for a topic's
#: backlog); it holds only :func:`operator_rules`.
OPERATOR_COMMON_NAME: Final = "understudy-operator"
#: Names a BrokerUser may not take: the brokers' (a super user) and the operator's.
RESERVED_USERS: Final = frozenset({BROKER_COMMON_NAME, OPERATOR_COMMON_NAME})
MAX_ACLS: Final = 256
_SPEC_KEYS: Final = frozenset({"authentication", "acls", "zookeeper"})
_AUTH_KEYS: Final = frozenset({"type", "passwordSecret"})
_SECRET_REF_KEYS: Final = frozenset({"name", "key"})
_ACL_KEYS: Final = frozenset({"resource", "name", "operations"})
#: SCRAM mechanisms written for ``scram-sha-512`` (the type names the one it allows).
SCRAM_MECHANISMS: Final = ("SCRAM-SHA-512",)


class AuthType(enum.StrEnum):
    SCRAM_SHA_512 = "scram-sha-512"
    TLS = "tls"


@dataclass(frozen=True, slots=True)
class SecretKeyRef:
    """A key of a Secret in the BrokerUser's namespace."""

    name: str
    key: str


@dataclass(frozen=True, slots=True)
class UserSpec:
    user: str
    authentication: AuthType
    password_secret: SecretKeyRef | None
    rules: tuple[Rule, ...]
    zookeeper: ZooKeeperSpec

    def rules_doc(self) -> RulesDoc:
        return RulesDoc(self.rules)


def parse_user_spec(spec: Mapping[str, Any], *, name: str,
                    default_zk_connect: str | None = None,
                    default_chroot: str | None = None) -> UserSpec:
    """Validate a BrokerUser's ``spec``; ``name`` (``metadata.name``) is the user name.
    Raises :class:`SpecError` listing every problem."""
    if not isinstance(spec, Mapping):
        raise SpecError([f"spec: must be an object, got {type(spec).__name__}"], kind=KIND)
    p = FieldParser()
    try:
        check_user(name)
    except AclError as exc:
        p.add(f"metadata.name: {exc}")
    if name in RESERVED_USERS:
        p.add(f"metadata.name: {name!r} is reserved (certificates with this name are super "
              "users of every broker)")
    p.unknown(spec, "spec", _SPEC_KEYS)
    auth_raw = p.obj(spec, "spec", "authentication", _AUTH_KEYS)
    if not auth_raw:
        p.add("spec.authentication: required (type scram-sha-512 or tls)")
    auth = AuthType(p.enum_str(auth_raw, "spec.authentication", "type", tuple(AuthType),
                               default=AuthType.SCRAM_SHA_512.value))
    ref_raw = p.obj(auth_raw, "spec.authentication", "passwordSecret", _SECRET_REF_KEYS)
    ref: SecretKeyRef | None = None
    if auth is AuthType.SCRAM_SHA_512:
        if not ref_raw:
            p.add("spec.authentication.passwordSecret: required for scram-sha-512 (the name "
                  "and key of a Secret holding the password)")
        else:
            secret = p.string(ref_raw, "spec.authentication.passwordSecret", "name",
                              required=True)
            key = p.string(ref_raw, "spec.authentication.passwordSecret", "key",
                           default="password")
            ref = SecretKeyRef(secret, key or "password")
    elif ref_raw:
        p.add("spec.authentication.passwordSecret: only for scram-sha-512 (a tls user gets "
              "a certificate from the operator)")
    rules = _rules(p, spec.get("acls"))
    zookeeper = parse_zookeeper(p, spec, default_zk_connect, default_chroot)
    if p.problems:
        raise SpecError(p.problems, kind=KIND)
    return UserSpec(name, auth, ref, rules, zookeeper)


def _rules(p: FieldParser, raw: Any) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        p.add(f"spec.acls: must be a list of {{resource, name, operations}}, got {raw!r}")
        return ()
    if len(raw) > MAX_ACLS:
        p.add(f"spec.acls: at most {MAX_ACLS} rules, got {len(raw)}")
        return ()
    rules: list[Rule] = []
    for i, item in enumerate(raw):
        path = f"spec.acls[{i}]"
        if not isinstance(item, Mapping):
            p.add(f"{path}: must be an object with resource, name and operations")
            continue
        p.unknown(item, path, _ACL_KEYS)
        doc = dict(item)
        if doc.get("resource") == Resource.CLUSTER.value:
            doc.setdefault("name", "*")
        ops = doc.get("operations")
        if isinstance(ops, list):
            doc["operations"] = [o.strip().lower() if isinstance(o, str) else o for o in ops]
        try:
            rule = Rule.from_dict(doc)
        except AclError as exc:
            p.add(f"{path}: {exc}")
            continue
        if rule not in rules:
            rules.append(rule)
    return tuple(rules)


def operator_rules() -> RulesDoc:
    """What the operator's identity may do: describe topics and consumer groups (a topic's
    route and queue statistics, its consumer groups' offsets) — all a backlog needs."""
    return RulesDoc((Rule(Resource.TOPIC, "*", frozenset({"describe"})),
                     Rule(Resource.GROUP, "*", frozenset({"describe"}))))


def scram_user_doc(password: str) -> UserDoc:
    """``/acl/users/<user>`` for a SCRAM user: a fresh salt, the salted keys, never the
    password (:func:`understudy_broker.acl.make_user`)."""
    return make_user(password, mechanisms=SCRAM_MECHANISMS)


def tls_user_doc() -> UserDoc:
    """``/acl/users/<user>`` for a certificate user: no SCRAM credential (the broker
    knows the user exists; its certificate authenticates it)."""
    return UserDoc()
