"""What the operator keeps in Secrets, and every decision about it, pure.

Why this module exists: security on Kubernetes is a handful of Secrets (the CA, each group's
broker certificates, its group secret and its copy of the ZooKeeper digest, each ``tls``
BrokerUser's certificate) and a few decisions about them: when the CA is created, renewed
or has its key replaced, when a group's certificates are (re)issued, when that must restart
the brokers, and whether an existing Secret is the operator's to change. The handlers
(``handlers/security.py``, ``handlers/users.py``) read and write; everything they decide
is here, over plain data and a clock passed in, and unit tested.

The Secrets (names, keys, who reads them): docs/security-kubernetes.md.

A restart is due when the bytes a broker loaded at start would no longer do: its own
certificate was reissued, or the CA bundle it trusts changed. :func:`tls_revision` hashes
exactly that (the bundle and the group's certificate *generation*, which grows only when
existing brokers' certificates are reissued — adding a broker does not restart the others);
the value goes into the pod template, so the StatefulSet gets a new revision and the
operator's rollout (``k8s/rollout.py``: slaves first, the master through a planned
handoff) restarts the brokers one at a time.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final

from understudy_operator.k8s import certs
from understudy_operator.k8s.certs import CertError, CertInfo, CertPolicy, KeyPair
from understudy_operator.k8s.spec import BrokerGroupSpec, SecuritySpec
from understudy_operator.k8s.zkconfig import broker_name

# ------------------------------------------------------------------ names and keys

#: Marks a Secret as the operator's and says for what: ``ca``, ``BrokerGroup.<name>``,
#: ``BrokerUser.<name>``. A Secret without it (or for something else) is never changed.
LABEL_SECRET_FOR: Final = "understudy.io/secret-for"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGER: Final = "understudy-operator"
#: On the CA Secret: ``trust`` then ``switch`` replaces the CA key (:func:`plan_ca`).
ANNOTATION_CA_KEY_REPLACEMENT: Final = "understudy.io/ca-key-replacement"
#: On a group's certificate Secret: grows when existing brokers' certificates are reissued.
ANNOTATION_TLS_GENERATION: Final = "understudy.io/tls-generation"
#: On the broker pod template: :func:`tls_revision` (a change restarts the brokers).
ANNOTATION_TLS_REVISION: Final = "understudy.io/tls-revision"
#: On the StatefulSet: what the running brokers were started with (:func:`security_mode`).
ANNOTATION_SECURITY_MODE: Final = "understudy.io/security"

DEFAULT_CA_SECRET: Final = "understudy-ca"
CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
NEXT_CERT_KEY: Final = "next.crt"
NEXT_KEY_KEY: Final = "next.key"
TRUSTED_KEY: Final = "trusted.crt"
GROUP_SECRET_KEY: Final = "secret"
ZK_DIGEST_KEY: Final = "digest"
USER_CERT_KEY: Final = "user.crt"
USER_KEY_KEY: Final = "user.key"

TLS_DIR: Final = "/etc/understudy-tls"
GROUP_SECRET_DIR: Final = "/etc/understudy-group"
ZK_DIGEST_DIR: Final = "/etc/understudy-zookeeper"
#: Secret files readable by the broker's group only (fsGroup), never by others.
SECRET_FILE_MODE: Final = 0o440
DEFAULT_CLUSTER_DOMAIN: Final = "cluster.local"


def broker_tls_secret_name(group: str) -> str:
    return f"{group}-broker-tls"


def group_secret_name(group: str) -> str:
    return f"{group}-group-secret"


def zk_digest_secret_name(group: str) -> str:
    return f"{group}-zookeeper-digest"


def user_secret_name(user: str) -> str:
    """The Secret of a ``tls`` BrokerUser: named after the user (as Strimzi's KafkaUser)."""
    return user


def ca_location(configured: tuple[str, str] | None, namespace: str) -> tuple[str, str]:
    """Where the CA Secret lives: the operator's ``--ca-secret NS/NAME`` (one CA for every
    namespace, so groups of one cluster in different namespaces trust each other), else
    ``understudy-ca`` in the resource's own namespace."""
    return configured if configured is not None else (namespace, DEFAULT_CA_SECRET)


def broker_dns_names(group: str, namespace: str, ordinal: int,
                     cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> tuple[str, ...]:
    """Every name a client or a peer may dial a broker by: its own Service
    (``<group>-<n>``, the address in the ZooKeeper config, the route and a slave's
    ``--master``) and its pod's name under the headless Service, short and qualified."""
    name = broker_name(group, ordinal)
    out = []
    for base in (name, f"{name}.{group}-headless"):
        out += [base, f"{base}.{namespace}", f"{base}.{namespace}.svc",
                f"{base}.{namespace}.svc.{cluster_domain}"]
    return tuple(out)


# ------------------------------------------------------------------ Secret objects


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret_data(obj: Mapping[str, Any] | None) -> dict[str, bytes]:
    """A Secret's ``data``, decoded (a key that is not base64 is skipped)."""
    out: dict[str, bytes] = {}
    if not obj:
        return out
    for key, value in (obj.get("data") or {}).items():
        if isinstance(value, str):
            try:
                out[str(key)] = base64.b64decode(value, validate=True)
            except ValueError:
                continue
    return out


def build_secret(*, name: str, namespace: str, secret_for: str, data: Mapping[str, bytes],
                 labels: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An Opaque Secret the operator owns (labelled :data:`LABEL_SECRET_FOR`)."""
    meta: dict[str, Any] = {
        "name": name, "namespace": namespace,
        "labels": {**(labels or {}), LABEL_MANAGED_BY: MANAGER, LABEL_SECRET_FOR: secret_for},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
            "data": {k: b64(v) for k, v in sorted(data.items())}}


def foreign_secret(existing: Mapping[str, Any] | None, secret_for: str) -> str | None:
    """Why the operator must not touch ``existing`` (``None``: absent, or its own for
    ``secret_for``). A same-named Secret someone else made is never overwritten."""
    if existing is None:
        return None
    meta = existing.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(LABEL_SECRET_FOR) == secret_for:
        return None
    owner = labels.get(LABEL_SECRET_FOR)
    whose = f"the operator's for {owner}" if owner else "not made by the operator"
    return (f"Secret {meta.get('namespace')}/{meta.get('name')} exists and is {whose}; "
            "the operator does not overwrite it (rename or delete it)")


# ------------------------------------------------------------------ the CA


@dataclass(frozen=True, slots=True)
class CaState:
    """The CA Secret's contents. ``current`` signs; ``next`` is a new key being trusted
    before it signs (a key replacement in progress); ``trusted`` are older CA
    certificates still trusted (an old key, until its certificate ends). ``managed``:
    the operator made it and may renew it (a CA brought by a person is used as it is)."""

    current: KeyPair
    next: KeyPair | None = None
    trusted: tuple[bytes, ...] = ()
    managed: bool = True

    def bundle(self) -> bytes:
        """Every CA certificate a broker or client must trust, one PEM bundle."""
        return certs.join_bundle([self.current.cert_pem,
                                  *([self.next.cert_pem] if self.next else []),
                                  *self.trusted])

    def to_data(self) -> dict[str, bytes]:
        data = {CA_CERT_KEY: self.current.cert_pem, CA_KEY_KEY: self.current.key_pem}
        if self.next is not None:
            data[NEXT_CERT_KEY] = self.next.cert_pem
            data[NEXT_KEY_KEY] = self.next.key_pem
        if self.trusted:
            data[TRUSTED_KEY] = certs.join_bundle(self.trusted)
        return data


def ca_state(data: Mapping[str, bytes], *, managed: bool) -> CaState:
    """The CA from a Secret's decoded data; :class:`CertError` naming what is wrong."""
    if CA_CERT_KEY not in data or CA_KEY_KEY not in data:
        raise CertError(f"the CA Secret needs {CA_CERT_KEY} and {CA_KEY_KEY}")
    current = KeyPair(data[CA_CERT_KEY], data[CA_KEY_KEY])
    if not certs.key_matches(current):
        raise CertError(f"the CA Secret's {CA_KEY_KEY} does not belong to its {CA_CERT_KEY}")
    if not current.info.is_ca:
        raise CertError(f"the CA Secret's {CA_CERT_KEY} is not a CA certificate")
    nxt = None
    if NEXT_CERT_KEY in data and NEXT_KEY_KEY in data:
        nxt = KeyPair(data[NEXT_CERT_KEY], data[NEXT_KEY_KEY])
        if not certs.key_matches(nxt):
            raise CertError(f"the CA Secret's {NEXT_KEY_KEY} does not belong to its "
                            f"{NEXT_CERT_KEY}")
    trusted = tuple(certs.split_bundle(data.get(TRUSTED_KEY, b"")))
    return CaState(current=current, next=nxt, trusted=trusted, managed=managed)


@dataclass(frozen=True, slots=True)
class CaPlan:
    """What to do with the CA: ``state`` to store when ``changed``; ``actions`` in words
    (Events, logs); ``clear_annotation`` once a key switch is done; ``problem`` when an
    instruction cannot be followed (nothing changes for it)."""

    state: CaState
    changed: bool
    actions: tuple[str, ...] = ()
    clear_annotation: bool = False
    problem: str | None = None


def plan_ca(state: CaState | None, *, replacement: str | None, now: datetime,
            policy: CertPolicy) -> CaPlan:
    """The CA's next state.

    * none yet: a new CA;
    * the certificate due (``policy.ca_renew_before``): renewed with the same key — what it
      issued stays valid, so nothing else needs to happen at once;
    * ``replacement`` (the CA Secret's :data:`ANNOTATION_CA_KEY_REPLACEMENT`) ``trust``: a
      new key is made and added to the trust bundle, still not signing — every broker
      restarts to trust it, clients take the new bundle; then ``switch``: the new key
      signs, the old certificate stays trusted until it ends, every certificate is reissued
      (one more rolling restart). Two steps, because a broker still trusting only the old
      key would refuse a peer restarted with a new-key certificate in the middle of a roll;
    * trusted old certificates that ended are dropped.

    A CA brought by a person (``managed`` false) is never renewed or replaced; its end is
    reported as a problem once it is due.
    """
    if state is None:
        ca = certs.new_ca(now=now, validity=policy.ca_validity)
        return CaPlan(CaState(current=ca), True, ("created a new CA",))
    actions: list[str] = []
    problem: str | None = None
    clear = False
    new = state
    info = state.current.info
    if not state.managed:
        if certs.needs_renewal(info.not_after, now, policy.ca_renew_before):
            problem = (f"the CA certificate (not made by the operator) ends "
                       f"{info.not_after:%Y-%m-%d}; replace it in the CA Secret")
        if replacement:
            problem = "a CA not made by the operator is never replaced by it"
        return CaPlan(state, False, problem=problem)
    if replacement not in (None, "", "trust", "switch"):
        problem = (f"{ANNOTATION_CA_KEY_REPLACEMENT}: {replacement!r} is neither 'trust' "
                   "nor 'switch'")
    elif replacement == "trust" and new.next is None:
        new = replace(new, next=certs.new_ca(now=now, validity=policy.ca_validity))
        actions.append("made a new CA key; it is trusted but does not sign yet")
    elif replacement == "switch":
        if new.next is None:
            problem = (f"{ANNOTATION_CA_KEY_REPLACEMENT}: 'switch' needs 'trust' first (every "
                       "broker must trust the new key before it signs)")
        else:
            new = CaState(current=new.next, next=None,
                          trusted=(new.current.cert_pem, *new.trusted))
            actions.append("the new CA key signs now; the old one stays trusted until its "
                           "certificate ends")
            clear = True
    current_info = new.current.info
    if certs.needs_renewal(current_info.not_after, now, policy.ca_renew_before):
        new = replace(new, current=certs.renew_ca(new.current, now=now,
                                                   validity=policy.ca_validity))
        actions.append(f"renewed the CA certificate (same key; it ended "
                       f"{current_info.not_after:%Y-%m-%d})")
    if new.next is not None and certs.needs_renewal(new.next.info.not_after, now,
                                                    policy.ca_renew_before):
        new = replace(new, next=certs.renew_ca(new.next, now=now, validity=policy.ca_validity))
    kept = tuple(c for c in new.trusted if certs.inspect(c).not_after > now)
    if kept != new.trusted:
        new = replace(new, trusted=kept)
        actions.append(f"dropped {len(state.trusted) - len(kept)} ended CA certificate(s)")
    return CaPlan(new, new != state, tuple(actions), clear, problem)


# ------------------------------------------------------------------ broker certificates


def cert_problem(pair: KeyPair | None, *, ca: CertInfo, common_name: str,
                 dns_names: Sequence[str], server: bool, now: datetime,
                 renew_before: timedelta) -> str | None:
    """Why a certificate must be (re)issued, or ``None`` when it is good: missing,
    unreadable, its key not matching, not issued by the CA's current key, due for renewal,
    another name, other subjectAltNames, or missing a key usage."""
    if pair is None:
        return "missing"
    try:
        info = pair.info
    except CertError as exc:
        return str(exc)
    if not certs.key_matches(pair):
        return "its key does not match the certificate"
    if not certs.issued_by(info, ca):
        return "issued by another CA key"
    if certs.needs_renewal(info.not_after, now, renew_before):
        return f"due for renewal (ends {info.not_after:%Y-%m-%d %H:%M} UTC)"
    if info.common_name != common_name:
        return f"common name {info.common_name!r}, wanted {common_name!r}"
    if sorted(info.dns_names) != sorted(dns_names):
        return "other subjectAltNames"
    if not info.client_auth or (server and not info.server_auth):
        return "missing a key usage"
    return None


@dataclass(frozen=True, slots=True)
class BrokerCertsPlan:
    """The group's certificate Secret wanted: ``data`` (complete), ``generation`` (grows
    when a running broker's certificate is reissued), whether anything ``changed`` and
    why (``reasons``, per broker)."""

    data: dict[str, bytes]
    generation: int
    changed: bool
    reasons: Mapping[str, str] = field(default_factory=dict)


def plan_broker_certs(*, ca: CaState, current: Mapping[str, bytes], generation: int,
                      brokers: Mapping[str, Sequence[str]], now: datetime,
                      policy: CertPolicy) -> BrokerCertsPlan:
    """Certificates for ``brokers`` (name -> subjectAltNames): a missing one is issued on
    its own; if any existing one must be reissued (:func:`cert_problem`), all are, in one
    generation, so the group restarts once. Certificates of brokers no longer in the group
    are dropped; ``ca.crt`` is the CA bundle."""
    ca_info = ca.current.info
    reasons: dict[str, str] = {}
    existing: dict[str, KeyPair] = {}
    for name in brokers:
        crt, key = current.get(f"{name}.crt"), current.get(f"{name}.key")
        if crt is not None and key is not None:
            existing[name] = KeyPair(crt, key)
    for name, sans in brokers.items():
        why = cert_problem(existing.get(name), ca=ca_info, common_name=certs.BROKER_COMMON_NAME,
                           dns_names=sans, server=True, now=now,
                           renew_before=policy.cert_renew_before)
        if why is not None:
            reasons[name] = why
    renew_all = any(name in existing for name in reasons)
    issue = set(brokers) if renew_all else set(reasons)
    data: dict[str, bytes] = {CA_CERT_KEY: ca.bundle()}
    for name, sans in brokers.items():
        if name in issue:
            pair = certs.issue(ca.current, common_name=certs.BROKER_COMMON_NAME,
                               dns_names=sans, server=True, client=True, now=now,
                               validity=policy.cert_validity)
            if name not in reasons:
                reasons[name] = "reissued with the rest of the group"
        else:
            pair = existing[name]
        data[f"{name}.crt"], data[f"{name}.key"] = pair.cert_pem, pair.key_pem
    new_generation = generation + 1 if renew_all else generation
    return BrokerCertsPlan(data=data, generation=new_generation,
                           changed=data != dict(current) or new_generation != generation,
                           reasons=reasons)


def group_brokers(spec: BrokerGroupSpec, group: str, namespace: str,
                  cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> dict[str, tuple[str, ...]]:
    """Broker name -> subjectAltNames for every broker of the group."""
    return {broker_name(group, o): broker_dns_names(group, namespace, o, cluster_domain)
            for o in range(spec.replicas)}


def tls_revision(bundle: bytes, generation: int) -> str:
    """What the brokers loaded at start: the CA bundle and their certificates' generation
    (module docstring). In the pod template; a change restarts the group, safely."""
    return hashlib.sha256(bundle + b"\0" + str(generation).encode()).hexdigest()[:16]


def generation_of(secret: Mapping[str, Any] | None) -> int:
    annotations = ((secret or {}).get("metadata") or {}).get("annotations") or {}
    try:
        return max(0, int(annotations.get(ANNOTATION_TLS_GENERATION, 0)))
    except (TypeError, ValueError):
        return 0


# ------------------------------------------------------------------ user certificates


def plan_user_cert(*, ca: CaState, current: Mapping[str, bytes], user: str, now: datetime,
                   policy: CertPolicy) -> tuple[dict[str, bytes], str | None]:
    """A ``tls`` BrokerUser's Secret data (``ca.crt``, ``user.crt``, ``user.key``) and why
    its certificate was (re)issued (``None``: kept; the bundle is refreshed either way)."""
    pair = None
    if USER_CERT_KEY in current and USER_KEY_KEY in current:
        pair = KeyPair(current[USER_CERT_KEY], current[USER_KEY_KEY])
    why = cert_problem(pair, ca=ca.current.info, common_name=user, dns_names=(), server=False,
                       now=now, renew_before=policy.cert_renew_before)
    if why is not None or pair is None:
        pair = certs.issue(ca.current, common_name=user, server=False, client=True, now=now,
                           validity=policy.cert_validity)
    return ({CA_CERT_KEY: ca.bundle(), USER_CERT_KEY: pair.cert_pem,
             USER_KEY_KEY: pair.key_pem}, why)


# ------------------------------------------------------------------ group secret, digest


def new_group_secret() -> bytes:
    """32 random bytes, URL-safe base64 (a file a broker reads and proves)."""
    return secrets.token_urlsafe(32).encode()


@dataclass(frozen=True, slots=True)
class SecurityInputs:
    """What the builders need beyond the spec: the pod template's
    :data:`ANNOTATION_TLS_REVISION` and the CA bundle for the group's ConfigMap (with TLS
    on), and whether the brokers get the ZooKeeper digest Secret."""

    tls_revision: str | None = None
    ca_bundle: str | None = None
    zk_digest: bool = False


def security_mode(security: SecuritySpec) -> str:
    """The settings that may not change while a group runs, as the StatefulSet records
    them (``tls=true,groupSecret=true``)."""
    return f"tls={str(security.tls).lower()},groupSecret={str(security.group_secret).lower()}"


def security_change_problems(security: SecuritySpec,
                             statefulset: Mapping[str, Any] | None) -> list[str]:
    """Problems with ``security`` for the group's running StatefulSet: ``tls`` and
    ``groupSecret`` stay as the brokers were started (a broker restarted with TLS could not
    replicate from a master without it, and the rollout would wait for that forever). A
    StatefulSet without the annotation predates security: it runs without either."""
    if statefulset is None:
        return []
    annotations = (statefulset.get("metadata") or {}).get("annotations") or {}
    running = annotations.get(ANNOTATION_SECURITY_MODE, "tls=false,groupSecret=false")
    wanted = security_mode(security)
    if running == wanted:
        return []
    was = dict(kv.split("=", 1) for kv in running.split(",") if "=" in kv)
    now = dict(kv.split("=", 1) for kv in wanted.split(",") if "=" in kv)
    return [f"spec.security.{key}: the group's brokers run with {key}: {was.get(key)}; it "
            "cannot change on a running group (create a new group, or set it back)"
            for key in ("tls", "groupSecret") if was.get(key) != now.get(key)]
