"""BrokerUser: credentials and ACLs into ZooKeeper, a certificate into a Secret, and back out.

Why this module exists: the brokers authenticate users and enforce ACLs from ZooKeeper
(``/acl/users/<user>``, ``/acl/rules/<user>``; :mod:`understudy_broker.acl`), and a platform
team declares users next to its groups. This is the thin I/O around the pure
:mod:`understudy_operator.k8s.userspec` and :mod:`understudy_operator.k8s.security`:

* ``scram-sha-512``: the password is read from the user's own Secret, turned at once into
  salted SCRAM credentials (``acl.make_user``) and dropped; only those reach ZooKeeper. The
  status keeps the Secret's ``resourceVersion`` (never anything derived from the password),
  so a changed password is noticed by the timer and written again, with a new salt;
* ``tls``: a client certificate (common name = the user) from the operator's CA in a Secret
  named after the user (``ca.crt``, ``user.crt``, ``user.key``), renewed before it ends;
  ``/acl/users/<user>`` holds no credential, only the user's existence;
* ``spec.acls`` -> ``/acl/rules/<user>``. A bad spec (a bad ACL among them) is reported and
  nothing is written;
* deletion removes both nodes and the certificate Secret.

User names are per cluster (ZooKeeper chroot): two BrokerUsers of one name in different
namespaces writing to the same chroot would be the same user (docs/security-kubernetes.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kopf

from understudy_broker.acl import AclError, UserDoc
from understudy_operator.handlers import events
from understudy_operator.handlers.runtime import Runtime
from understudy_operator.handlers.security import (
    SecretConflict,
    ensure_ca,
    secure_zookeeper,
    write_secret,
)
from understudy_operator.k8s.certs import inspect
from understudy_operator.k8s.kube import BROKERUSERS, SECRETS, KubeError, is_subset
from understudy_operator.k8s.security import (
    LABEL_SECRET_FOR,
    USER_CERT_KEY,
    build_secret,
    foreign_secret,
    plan_user_cert,
    secret_data,
    user_secret_name,
)
from understudy_operator.k8s.spec import SpecError
from understudy_operator.k8s.status import Condition, merge_conditions, rfc3339
from understudy_operator.k8s.userspec import (
    AuthType,
    UserSpec,
    parse_user_spec,
    scram_user_doc,
    tls_user_doc,
)
from understudy_operator.zk import ZkError, ZkGateway, ZkUnavailable

log = logging.getLogger(__name__)


def user_secret_for(user: str) -> str:
    return f"BrokerUser.{user}"


def parse(rt: Runtime, body: Mapping[str, Any]) -> UserSpec:
    meta = body.get("metadata", {})
    return parse_user_spec(body.get("spec") or {}, name=str(meta.get("name")),
                           default_zk_connect=rt.config.zk_connect,
                           default_chroot=rt.config.zk_chroot)


class _Problem(Exception):
    """A user that cannot be written now: reported, retried by the timer."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


async def reconcile_user(rt: Runtime, *, body: Mapping[str, Any]) -> None:
    """Create/update/resume and the timer: make ZooKeeper (and the certificate Secret)
    match the spec; write nothing that is already there."""
    try:
        spec = parse(rt, body)
    except SpecError as exc:
        rt.metrics.errors.labels("user", "invalid-spec").inc()
        await _report(rt, body, ready=False, reason="InvalidSpec",
                      message="invalid spec (nothing written): " + "; ".join(exc.problems),
                      warn=True)
        return
    try:
        await _apply(rt, body, spec)
    except _Problem as exc:
        rt.metrics.errors.labels("user", exc.reason).inc()
        await _report(rt, body, ready=False, reason=exc.reason, message=exc.message, warn=True)
    except (ZkError, ZkUnavailable) as exc:
        text = f"ZooKeeper {spec.zookeeper.url}: {exc!r}; retrying"
        await _report(rt, body, ready=False, reason="ZooKeeperUnreachable", message=text,
                      warn=True)
        raise kopf.TemporaryError(text, delay=5) from exc
    except KubeError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc


async def _session(rt: Runtime, url: str) -> ZkGateway:
    await secure_zookeeper(rt, url)
    return await rt.topic_zk(url)


async def _apply(rt: Runtime, body: Mapping[str, Any], spec: UserSpec) -> None:
    meta = body.get("metadata", {})
    namespace, user = str(meta["namespace"]), spec.user
    status = body.get("status") or {}
    url = spec.zookeeper.url
    extra: dict[str, Any] = {"secret": None, "certificateNotAfter": None,
                             "credentialsVersion": None}
    user_doc: bytes | None = None
    zk = await _session(rt, url)
    if spec.authentication is AuthType.SCRAM_SHA_512:
        ref = spec.password_secret
        assert ref is not None  # parse_user_spec requires it
        source = await rt.kube.get(SECRETS, namespace=namespace, name=ref.name)
        password_bytes = secret_data(source).get(ref.key)
        if password_bytes is None:
            raise _Problem("PasswordSecretMissing",
                           f"Secret {namespace}/{ref.name} with key {ref.key!r} not found; "
                           "create it (nothing written)")
        version = str((source or {}).get("metadata", {}).get("resourceVersion") or "")
        current = await zk.read_acl_user(user)
        if (current is None or status.get("credentialsVersion") != version
                or status.get("zookeeper") != url or not _has_scram(current)):
            try:
                # A trailing newline is not part of the password: the CLI's --password-file
                # drops it too (a Secret made from a file usually ends with one).
                user_doc = scram_user_doc(
                    password_bytes.decode("utf-8").rstrip("\r\n")).to_json()
            except (UnicodeDecodeError, AclError) as exc:
                raise _Problem("PasswordSecretMissing",
                               f"Secret {namespace}/{ref.name} key {ref.key!r}: not a usable "
                               f"password ({type(exc).__name__}); nothing written") from None
        del password_bytes
        extra["credentialsVersion"] = version
    else:
        try:
            ca = await ensure_ca(rt, namespace)
        except SecretConflict as exc:
            raise _Problem("SecretConflict", str(exc)) from None
        name = user_secret_name(user)
        current_secret = await rt.kube.get(SECRETS, namespace=namespace, name=name)
        problem = foreign_secret(current_secret, user_secret_for(user))
        if problem is not None:
            raise _Problem("SecretConflict", problem)
        data, why = plan_user_cert(ca=ca, current=secret_data(current_secret), user=user,
                                   now=datetime.now(UTC), policy=rt.config.cert_policy)
        if data != secret_data(current_secret):
            obj = build_secret(name=name, namespace=namespace, secret_for=user_secret_for(user),
                               data=data, labels={"understudy.io/user": user})
            kopf.adopt(obj, owner=body)  # type: ignore[arg-type]
            await write_secret(rt, obj, current_secret)
            log.info("user %s/%s: certificate Secret written (%s)", namespace, user,
                     why or "CA bundle refreshed")
        user_doc = tls_user_doc().to_json()
        extra["secret"] = name
        extra["certificateNotAfter"] = rfc3339(inspect(data[USER_CERT_KEY]).not_after)
    old_url = status.get("zookeeper")
    if old_url and old_url != url:  # moved to another cluster: leave nothing behind
        try:
            old = await _session(rt, str(old_url))
            await old.delete_acl_user(user)
        except (ZkError, ZkUnavailable) as exc:
            log.warning("user %s/%s: could not remove it from %s: %r", namespace, user,
                        old_url, exc)
    changed = []
    if user_doc is not None and await zk.write_acl_user(user, user_doc):
        changed.append("credentials" if spec.authentication is AuthType.SCRAM_SHA_512
                       else "user")
    if await zk.write_acl_rules(user, spec.rules_doc().to_json()):
        changed.append("ACLs")
    if changed:
        rt.metrics.decision(user, "user-written")
        log.info("user %s/%s: %s written to %s", namespace, user, " and ".join(changed), url)
        await events.post(rt, body, type_="Normal", reason="UserWritten",
                          message=f"{' and '.join(changed)} of {user} written to ZooKeeper")
    await _report(rt, body, ready=True, reason="Ready",
                  message=f"{user} and its {len(spec.rules)} ACL rule(s) are in ZooKeeper",
                  extra={"username": user, "authentication": spec.authentication.value,
                         "zookeeper": url, "acls": len(spec.rules), **extra},
                  generation=int(meta.get("generation") or 0))


def _has_scram(doc: bytes) -> bool:
    try:
        return bool(UserDoc.from_json(doc).scram)
    except AclError:
        return False


async def finalize_user(rt: Runtime, *, body: Mapping[str, Any]) -> str:
    """The finalizer: delete the user's nodes and its certificate Secret."""
    meta = body.get("metadata", {})
    namespace, user = str(meta["namespace"]), str(meta["name"])
    status = body.get("status") or {}
    url: str | None
    try:
        url = parse(rt, body).zookeeper.url
    except SpecError:  # nothing was written from a spec that never parsed, unless before
        url = str(status["zookeeper"]) if status.get("zookeeper") else None
    done = []
    if url:
        try:
            zk = await _session(rt, str(url))
            gone = await zk.delete_acl_user(user)
        except (ZkError, ZkUnavailable) as exc:
            raise kopf.TemporaryError(f"cannot remove {user} from ZooKeeper: {exc!r}",
                                      delay=5) from exc
        done.append(f"deleted {', '.join(gone)}" if gone else "no ZooKeeper nodes left")
    try:
        secret = await rt.kube.get(SECRETS, namespace=namespace, name=user_secret_name(user))
        labels = ((secret or {}).get("metadata") or {}).get("labels") or {}
        if secret is not None and labels.get(LABEL_SECRET_FOR) == user_secret_for(user):
            await rt.kube.delete(SECRETS, namespace=namespace, name=user_secret_name(user))
            done.append(f"deleted Secret {user_secret_name(user)}")
    except KubeError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc
    rt.metrics.decision(user, "user-deleted")
    return "; ".join(done) or "nothing to delete"


async def _report(rt: Runtime, body: Mapping[str, Any], *, ready: bool, reason: str,
                  message: str, warn: bool = False, extra: Mapping[str, Any] | None = None,
                  generation: int | None = None) -> None:
    """Patch the status when it changes; a new problem also becomes a Warning Event (the
    timer repeats a problem without repeating its Event)."""
    meta = body.get("metadata", {})
    previous = body.get("status") or {}
    prev_conds = previous.get("conditions")
    before = next((c for c in prev_conds or [] if isinstance(c, Mapping)
                   and c.get("type") == "Ready"), {})
    warn = warn and (before.get("reason"), before.get("message")) != (reason, message)
    status: dict[str, Any] = {"conditions": merge_conditions(
        previous=prev_conds if isinstance(prev_conds, Sequence) else [],
        current=[Condition("Ready", ready, reason, message)], now=datetime.now(UTC))}
    if generation is not None:
        status["observedGeneration"] = generation
    status.update(extra or {})
    if not is_subset(status, previous):
        try:
            await rt.kube.patch_status(BROKERUSERS, namespace=str(meta["namespace"]),
                                       name=str(meta["name"]), status=status)
        except KubeError as exc:
            log.warning("user %s: status not written: %s", meta.get("name"), exc)
    if warn:
        await events.post(rt, body, type_="Warning", reason=reason, message=message)

