"""The Secrets behind a secure group: the CA, the brokers' certificates, the group secret and
the brokers' copy of the ZooKeeper digest — read, planned (``k8s/security.py``), written.

Why this module exists: the reconcile handler builds pods that mount these Secrets, so they
must exist (and be current) before the pods do; the security timer calls the same code to
renew certificates before they end. Every decision is the pure planner's; this module only
moves bytes between the API and it, with optimistic concurrency (a patch carries the
``resourceVersion`` read, so two operator replicas never both renew: the loser re-reads).

Never written anywhere but into these Secrets: private keys, the group secret, the digest.
A Secret of the same name that the operator did not make is never overwritten
(:class:`SecretConflict`, reported on the BrokerGroup's status).
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kopf

from understudy_broker.security import ClientSecurity, client_context
from understudy_operator.handlers.runtime import Runtime
from understudy_operator.k8s import certs
from understudy_operator.k8s.certs import CertError
from understudy_operator.k8s.kube import SECRETS, KubeError
from understudy_operator.k8s.security import (
    ANNOTATION_CA_KEY_REPLACEMENT,
    ANNOTATION_TLS_GENERATION,
    GROUP_SECRET_KEY,
    LABEL_SECRET_FOR,
    ZK_DIGEST_KEY,
    CaState,
    SecurityInputs,
    broker_tls_secret_name,
    build_secret,
    ca_location,
    ca_state,
    foreign_secret,
    generation_of,
    group_brokers,
    group_secret_name,
    new_group_secret,
    plan_broker_certs,
    plan_ca,
    secret_data,
    tls_revision,
    zk_digest_secret_name,
)
from understudy_operator.k8s.spec import BrokerGroupSpec
from understudy_operator.k8s.userspec import OPERATOR_COMMON_NAME
from understudy_operator.zk import secure_chroot

log = logging.getLogger(__name__)
CA_SECRET_FOR = "ca"


class SecretConflict(RuntimeError):
    """A Secret the operator needs exists and is not the operator's (the message says
    which), or the CA Secret cannot be used."""


def now() -> datetime:
    return datetime.now(UTC)


def group_secret_for(group: str) -> str:
    return f"BrokerGroup.{group}"


async def write_secret(rt: Runtime, obj: dict[str, Any], current: Mapping[str, Any] | None,
                       *, drop_annotations: tuple[str, ...] = ()) -> dict[str, Any]:
    """Create ``obj``, or patch ``current`` to it: keys ``current`` has and ``obj`` lacks
    are removed, and the patch carries the ``resourceVersion`` read (a concurrent writer
    makes it fail with 409: the caller re-reads)."""
    meta = obj["metadata"]
    if current is None:
        return await rt.kube.create(obj)
    cur_meta = current.get("metadata") or {}
    data: dict[str, Any] = {k: None for k in (current.get("data") or {}) if k not in obj["data"]}
    data.update(obj["data"])
    patch_meta: dict[str, Any] = {"labels": meta.get("labels") or {},
                                  "resourceVersion": cur_meta.get("resourceVersion")}
    annotations: dict[str, Any] = dict(meta.get("annotations") or {})
    annotations.update({a: None for a in drop_annotations})
    if annotations:
        patch_meta["annotations"] = annotations
    if meta.get("ownerReferences"):
        patch_meta["ownerReferences"] = meta["ownerReferences"]
    return await rt.kube.patch(SECRETS, namespace=meta["namespace"], name=meta["name"],
                               patch={"metadata": patch_meta, "data": data})


async def ensure_ca(rt: Runtime, namespace: str) -> CaState:
    """The CA for resources of ``namespace``: created on first use, renewed when due, its
    key replaced when the CA Secret's annotation asks (``plan_ca``). Raises
    :class:`SecretConflict` when the Secret cannot be used."""
    ns, name = ca_location(rt.config.ca_secret, namespace)
    for _attempt in range(3):
        current = await rt.kube.get(SECRETS, namespace=ns, name=name)
        state: CaState | None = None
        replacement: str | None = None
        if current is not None:
            meta = current.get("metadata") or {}
            managed = (meta.get("labels") or {}).get(LABEL_SECRET_FOR) == CA_SECRET_FOR
            replacement = (meta.get("annotations") or {}).get(ANNOTATION_CA_KEY_REPLACEMENT)
            try:
                state = ca_state(secret_data(current), managed=managed)
            except CertError as exc:
                raise SecretConflict(f"CA Secret {ns}/{name}: {exc}") from exc
        plan = plan_ca(state, replacement=replacement, now=now(), policy=rt.config.cert_policy)
        if plan.problem:
            log.warning("CA Secret %s/%s: %s", ns, name, plan.problem)
        if not plan.changed and not plan.clear_annotation:
            return plan.state
        obj = build_secret(name=name, namespace=ns, secret_for=CA_SECRET_FOR,
                           data=plan.state.to_data())
        drop = (ANNOTATION_CA_KEY_REPLACEMENT,) if plan.clear_annotation else ()
        try:
            await write_secret(rt, obj, current, drop_annotations=drop)
        except KubeError as exc:
            if exc.status == 409:  # another replica wrote it first: read it again
                continue
            raise
        for action in plan.actions:
            log.warning("CA Secret %s/%s: %s", ns, name, action)
        return plan.state
    raise KubeError(status=409, reason="Conflict",
                    message=f"CA Secret {ns}/{name} kept changing while it was renewed")


async def secure_zookeeper(rt: Runtime, url: str) -> None:
    """With a digest identity, make sure ``url``'s chroot is digest-protected (once per
    operator run and chroot). Raises ``ZkUnavailable``/``ZkError``."""
    digest = rt.config.zk_digest
    if digest is None or url in rt.secured_chroots:
        return
    connect, slash, rest = url.partition("/")
    if not slash or not rest:
        rt.secured_chroots.add(url)
        return
    done = await secure_chroot(connect, f"/{rest}", digest=digest,
                               timeout_s=rt.config.controller_session_timeout_s + 4)
    log.info("ZooKeeper %s: %s", connect, done)
    rt.secured_chroots.add(url)


async def ensure_group_security(rt: Runtime, *, body: Mapping[str, Any],
                                spec: BrokerGroupSpec) -> SecurityInputs:
    """Every Secret the group's pods mount, current, before the pods are built; returns what
    the builders need (the certificates' revision, the CA bundle, the digest mount)."""
    meta = body.get("metadata", {})
    namespace, group = str(meta["namespace"]), str(meta["name"])
    secret_for = group_secret_for(group)
    revision: str | None = None
    bundle: str | None = None
    if spec.security.tls:
        ca = await ensure_ca(rt, namespace)
        revision, bundle = await _broker_certs(rt, body, spec, ca), ca.bundle().decode()
    if spec.security.group_secret:
        name = group_secret_name(group)
        current = await _own(rt, namespace, name, secret_for)
        if current is None or GROUP_SECRET_KEY not in secret_data(current):
            obj = build_secret(name=name, namespace=namespace, secret_for=secret_for,
                               data={GROUP_SECRET_KEY: new_group_secret()})
            kopf.adopt(obj, owner=body)  # type: ignore[arg-type]
            await _write_once(rt, obj, current)
            log.info("group %s/%s: group secret created", namespace, group)
    digest = rt.config.zk_digest
    if digest is not None:
        name = zk_digest_secret_name(group)
        current = await _own(rt, namespace, name, secret_for)
        wanted = f"{digest[0]}:{digest[1]}".encode()
        if secret_data(current).get(ZK_DIGEST_KEY) != wanted:
            obj = build_secret(name=name, namespace=namespace, secret_for=secret_for,
                               data={ZK_DIGEST_KEY: wanted})
            kopf.adopt(obj, owner=body)  # type: ignore[arg-type]
            await _write_once(rt, obj, current)
    return SecurityInputs(tls_revision=revision, ca_bundle=bundle, zk_digest=digest is not None)


async def _own(rt: Runtime, namespace: str, name: str, secret_for: str
               ) -> dict[str, Any] | None:
    current = await rt.kube.get(SECRETS, namespace=namespace, name=name)
    problem = foreign_secret(current, secret_for)
    if problem is not None:
        raise SecretConflict(problem)
    return current


async def _write_once(rt: Runtime, obj: dict[str, Any], current: Mapping[str, Any] | None
                      ) -> None:
    try:
        await write_secret(rt, obj, current)
    except KubeError as exc:
        if exc.status == 409:  # another replica made it: the next reconcile checks it
            raise kopf.TemporaryError(f"Secret {obj['metadata']['name']} changed while "
                                      "written; retrying", delay=1) from exc
        raise


async def _broker_certs(rt: Runtime, body: Mapping[str, Any], spec: BrokerGroupSpec,
                        ca: CaState) -> str:
    meta = body.get("metadata", {})
    namespace, group = str(meta["namespace"]), str(meta["name"])
    name = broker_tls_secret_name(group)
    current = await _own(rt, namespace, name, group_secret_for(group))
    generation = generation_of(current)
    plan = plan_broker_certs(
        ca=ca, current=secret_data(current), generation=generation,
        brokers=group_brokers(spec, group, namespace, rt.config.cluster_domain), now=now(),
        policy=rt.config.cert_policy)
    if plan.changed:
        obj = build_secret(name=name, namespace=namespace, secret_for=group_secret_for(group),
                           data=plan.data,
                           annotations={ANNOTATION_TLS_GENERATION: str(plan.generation)})
        kopf.adopt(obj, owner=body)  # type: ignore[arg-type]
        await _write_once(rt, obj, current)
        why = "; ".join(f"{b}: {r}" for b, r in sorted(plan.reasons.items())) or "CA bundle"
        log.info("group %s/%s: broker certificates written (generation %d; %s)", namespace,
                 group, plan.generation, why)
    return tls_revision(plan.data["ca.crt"], plan.generation)


#: The operator's own client certificate lives in memory only, this long.
OPERATOR_CERT_VALIDITY = timedelta(days=1)


async def operator_client_security(rt: Runtime, namespace: str) -> ClientSecurity:
    """What the operator presents to brokers with TLS on (a topic's backlog): the CA bundle
    and a client certificate with common name ``understudy-operator`` (allowed only
    ``userspec.operator_rules``: describe), issued from the namespace's CA and kept in memory
    only (the key touches a private temporary directory just long enough for OpenSSL to load
    it)."""
    ca = await ensure_ca(rt, namespace)
    key = (namespace, ca.current.info.fingerprint)
    cached = rt.client_security.get(key)
    if cached is not None and cached[0] > now():
        return cached[1]
    pair = certs.issue(ca.current, common_name=OPERATOR_COMMON_NAME, server=False,
                       client=True, now=now(), validity=OPERATOR_CERT_VALIDITY)
    ctx = _client_context(ca.bundle(), pair)
    security = ClientSecurity(ssl=ctx)
    rt.client_security[key] = (now() + OPERATOR_CERT_VALIDITY / 2, security)
    return security


def _client_context(bundle: bytes, pair: certs.KeyPair) -> ssl.SSLContext:
    with tempfile.TemporaryDirectory(prefix="understudy-op-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o700)
        paths = {}
        for name, data in (("ca.crt", bundle), ("client.crt", pair.cert_pem),
                           ("client.key", pair.key_pem)):
            path = base / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            paths[name] = path
        return client_context(paths["ca.crt"], paths["client.crt"], paths["client.key"])
