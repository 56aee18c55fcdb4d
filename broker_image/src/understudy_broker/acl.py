"""Who may do what: users, their SCRAM credentials and the ACL rules every broker enforces.

Why this module exists: a broker (master or acting slave), the ``understudy user`` and
``understudy acl`` commands, ``understudy local up --secure`` and the Kubernetes operator's
BrokerUser handler all read or write the same documents and must agree on what a rule
grants. This is the one definition, pure (no sockets, no ZooKeeper, no clock); the
documents live in ZooKeeper under ``/acl`` (paths in :mod:`understudy_broker.zklayout`),
the SCRAM exchange itself is the ``scramp`` library's (RFC 5802/7677).

The model (docs/security.md):

- A *principal* is a user name: the user of a SCRAM exchange, or the common name of a
  verified client certificate. A connection that did neither is anonymous, and a broker
  that requires authentication answers it only ``AUTHENTICATE``.
- A *rule* grants operations on resources of one type whose names match: a literal name,
  a prefix (``orders-*``) or everything (``*``). Rules only grant (no deny rules): what no
  rule grants is refused with ``NOT_AUTHORIZED``. *Super users* (brokers, the admin of a
  local secure cluster) are granted everything.
- Operations (:data:`OPERATIONS`): on a topic ``produce``, ``consume``, ``describe``,
  ``admin``; on a consumer group ``join``, ``commit``, ``describe``; on the cluster
  ``create``, ``alter``, ``delete`` (topics), ``describe``, ``security`` (users and ACLs)
  and ``broker`` (what brokers do to each other: back-sync, peer probes). ``produce``,
  ``consume`` and ``admin`` on a topic imply ``describe`` on it; ``join`` and ``commit``
  on a group imply ``describe``; ``admin`` on a topic implies altering and deleting it.
"""

from __future__ import annotations

import base64
import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from understudy_broker import zklayout
from understudy_broker.scheduling import DLQ_PREFIX, RETRY_PREFIX
from understudy_broker.zklayout import LayoutError, dump_document, load_document


class AclError(LayoutError):
    """A malformed user, rule or document; the message says which and why."""


class Resource(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


#: The operations of each resource type.
OPERATIONS: Final[Mapping[Resource, frozenset[str]]] = {
    Resource.TOPIC: frozenset({"produce", "consume", "describe", "admin"}),
    Resource.GROUP: frozenset({"join", "commit", "describe"}),
    Resource.CLUSTER: frozenset({"create", "alter", "delete", "describe", "security", "broker"}),
}
#: ``"all"`` in a rule's operations stands for every operation of its resource type.
ALL: Final = "all"
#: What holding an operation also grants on the same resource.
_IMPLIES: Final[Mapping[tuple[Resource, str], frozenset[str]]] = {
    (Resource.TOPIC, "produce"): frozenset({"describe"}),
    (Resource.TOPIC, "consume"): frozenset({"describe"}),
    (Resource.TOPIC, "admin"): frozenset({"describe"}),
    (Resource.GROUP, "join"): frozenset({"describe"}),
    (Resource.GROUP, "commit"): frozenset({"describe"}),
}

#: SCRAM mechanisms a broker offers, strongest first.
MECHANISMS: Final = ("SCRAM-SHA-512", "SCRAM-SHA-256")
#: RFC 7677 asks for at least 4096 iterations; 4096 is also Kafka's default. Each
#: connection's client pays them once (about 2 ms of PBKDF2 here); more are a flag away.
MIN_ITERATIONS: Final = 4096
DEFAULT_ITERATIONS: Final = 4096

_PATTERN = re.compile(r"^(\*|[A-Za-z0-9._%-]{1,249}\*?)$")


def check_user(name: str) -> str:
    """:func:`understudy_broker.zklayout.check_user`, as an :class:`AclError`."""
    try:
        return zklayout.check_user(name)
    except LayoutError as exc:
        raise AclError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Rule:
    """Grants ``operations`` on every ``resource`` whose name matches ``name``: a literal,
    ``prefix*`` or ``*``. On the cluster the name is always ``*``."""

    resource: Resource
    name: str
    operations: frozenset[str]

    def __post_init__(self) -> None:
        if not _PATTERN.match(self.name):
            raise AclError(f"resource name {self.name!r}: a name, a prefix ending in '*', "
                           "or '*'")
        if self.resource is Resource.CLUSTER and self.name != "*":
            raise AclError("a cluster rule's name is '*'")
        allowed = OPERATIONS[self.resource]
        unknown = sorted(self.operations - allowed - {ALL})
        if unknown or not self.operations:
            raise AclError(f"operations on a {self.resource.value}: {', '.join(sorted(allowed))} "
                           f"or {ALL}; got {', '.join(unknown) or 'none'}")

    def covers(self, resource: Resource, name: str, operation: str) -> bool:
        if resource is not self.resource or not _matches(self.name, name):
            return False
        return ALL in self.operations or any(
            operation == held or operation in _IMPLIES.get((resource, held), ())
            for held in self.operations)

    def to_dict(self) -> dict[str, Any]:
        return {"resource": self.resource.value, "name": self.name,
                "operations": sorted(self.operations)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Rule:
        try:
            resource = Resource(doc["resource"])
            name = doc["name"]
            ops = doc["operations"]
        except (KeyError, ValueError, TypeError) as exc:
            raise AclError(f"rule {dict(doc)!r}: needs resource (topic, group, cluster), "
                           f"name and operations ({exc})") from None
        if not isinstance(name, str) or not isinstance(ops, list) or not all(
                isinstance(o, str) for o in ops):
            raise AclError(f"rule {dict(doc)!r}: name is a string, operations a list of strings")
        return cls(resource, name, frozenset(ops))

    def describe(self) -> str:
        return f"{self.resource.value}:{self.name} {','.join(sorted(self.operations))}"


def parse_rule(resource: str, name: str, operations: Iterable[str]) -> Rule:
    """A rule from command-line words (``--topic orders --operation produce``)."""
    try:
        kind = Resource(resource)
    except ValueError:
        raise AclError(f"resource type {resource!r}: topic, group or cluster") from None
    return Rule(kind, name, frozenset(o.strip().lower() for o in operations))


def _matches(pattern: str, name: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str  # "super user", "rule topic:orders-* produce", "no rule grants it"


def authorize(rules: Sequence[Rule], *, user: str, super_user: bool, resource: Resource,
              name: str, operation: str) -> Decision:
    """May ``user`` (holding ``rules``) do ``operation`` on ``resource`` ``name``?"""
    if operation not in OPERATIONS[resource]:
        raise AclError(f"{operation!r} is not an operation on a {resource.value}")
    if super_user:
        return Decision(True, "super user")
    for rule in rules:
        if rule.covers(resource, name, operation):
            return Decision(True, f"rule {rule.describe()}")
    return Decision(False, "no rule grants it")


#: The topics a consumer group's retries and dead letters live in (scheduling.py names
#: them): what a member may do with them follows from the group, not from a topic rule.
_SYSTEM_PREFIXES: Final = (RETRY_PREFIX, DLQ_PREFIX)


def topic_resource(topic: str, operation: str) -> tuple[Resource, str, str]:
    """Where an operation on ``topic`` is checked: the topic itself, or for a consumer
    group's retry or dead-letter topic the group (``join`` to read it and see it,
    ``commit`` to hand a message back)."""
    for prefix in _SYSTEM_PREFIXES:
        if topic.startswith(prefix):
            return Resource.GROUP, topic[len(prefix):], (
                "join" if operation in ("consume", "describe") else "commit")
    return Resource.TOPIC, topic, operation


def denied_message(user: str | None, resource: Resource, name: str, operation: str) -> str:
    """What a refused client reads after ``NOT_AUTHORIZED``."""
    who = f"user {user!r}" if user is not None else "an anonymous client"
    what = "the cluster" if resource is Resource.CLUSTER else f"{resource.value} {name!r}"
    target = "--cluster" if resource is Resource.CLUSTER else f"--{resource.value} {name}"
    return (f"{who} may not {operation} on {what}: no ACL grants it (understudy acl add "
            f"--principal {user or 'NAME'} {target} --operation {operation})")


# ---------------------------------------------------------------------- documents


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a broker keeps of a SCRAM password (RFC 5802): never the password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __post_init__(self) -> None:
        if self.iterations < MIN_ITERATIONS:
            raise AclError(f"SCRAM iterations {self.iterations}: at least {MIN_ITERATIONS}")
        if not self.salt or not self.stored_key or not self.server_key:
            raise AclError("a SCRAM credential needs a salt, a stored key and a server key")

    def to_dict(self) -> dict[str, Any]:
        return {"salt": _b64(self.salt), "stored_key": _b64(self.stored_key),
                "server_key": _b64(self.server_key), "iterations": self.iterations}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ScramCredential:
        try:
            return cls(_unb64(doc["salt"]), _unb64(doc["stored_key"]),
                       _unb64(doc["server_key"]), int(doc["iterations"]))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, AclError):
                raise
            raise AclError(f"SCRAM credential: needs salt, stored_key, server_key (base64) "
                           f"and iterations ({exc})") from None


@dataclass(frozen=True, slots=True)
class UserDoc:
    """``/acl/users/<user>``: the user's SCRAM credentials by mechanism (none for a user
    who authenticates by client certificate only)."""

    scram: Mapping[str, ScramCredential] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.scram) - set(MECHANISMS))
        if unknown:
            raise AclError(f"SCRAM mechanisms: {', '.join(MECHANISMS)}; got {unknown}")

    def to_json(self) -> bytes:
        return dump_document({"scram": {m: c.to_dict() for m, c in sorted(self.scram.items())}})

    @classmethod
    def from_json(cls, data: bytes) -> UserDoc:
        doc = load_document("user", data, AclError)
        scram = doc.get("scram", {})
        if not isinstance(scram, dict):
            raise AclError("user: 'scram' must be an object")
        return cls({m: ScramCredential.from_dict(c) for m, c in scram.items()})


@dataclass(frozen=True, slots=True)
class RulesDoc:
    """``/acl/rules/<user>``: what the user may do."""

    rules: tuple[Rule, ...] = ()

    def to_json(self) -> bytes:
        return dump_document({"rules": [r.to_dict() for r in self.rules]})

    @classmethod
    def from_json(cls, data: bytes) -> RulesDoc:
        doc = load_document("rules", data, AclError)
        rules = doc.get("rules", [])
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise AclError("rules: 'rules' must be a list of objects")
        return cls(tuple(Rule.from_dict(r) for r in rules))

    def adding(self, new: Iterable[Rule]) -> RulesDoc:
        out = list(self.rules)
        for r in new:
            if r not in out:
                out.append(r)
        return RulesDoc(tuple(out))

    def removing(self, old: Iterable[Rule]) -> RulesDoc:
        gone = set(old)
        return RulesDoc(tuple(r for r in self.rules if r not in gone))


def make_user(password: str, *, iterations: int = DEFAULT_ITERATIONS,
              mechanisms: Sequence[str] = MECHANISMS) -> UserDoc:
    """The stored credentials of ``password``: a fresh salt per mechanism, salted and
    hashed by ``scramp`` (the password itself is not kept)."""
    from scramp import ScramMechanism  # pure computation; imported where it is used

    if not password:
        raise AclError("an empty password")
    scram = {}
    for m in mechanisms:
        salt, stored, server, n = ScramMechanism(m).make_auth_info(
            password, iteration_count=iterations)
        scram[m] = ScramCredential(salt, stored, server, n)
    return UserDoc(scram)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise AclError("expected a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise AclError(f"not base64: {exc}") from None

