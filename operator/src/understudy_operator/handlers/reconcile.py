"""Create, update and resume of a BrokerGroup: parse → plan → apply → patch status.

Why this module exists: this is the handler that turns a spec into running parts, and the one
place that must never half-apply a bad spec. The order is deliberate:

1. ``parse_spec`` — a bad spec becomes ``Ready=False, reason=InvalidSpec`` plus a Warning
   Event, and nothing else happens (a group already running keeps its last good spec);
2. ``plan_scale`` — scaling down waits (``kopf.TemporaryError``) while a broker to be removed
   acts for reads;
3. the group's controller is started once (its ZooKeeper session is also ours), the ZooKeeper
   ``config`` is written (only when its bytes change);
   (before 3, the Secrets the pods mount — certificates, group secret, ZooKeeper digest —
   are made or renewed by ``handlers/security.py``; a same-named Secret the operator did not
   make stops everything with ``Ready=False, reason=SecretConflict``);
4. children are built, adopted and applied; per-broker Services of removed ordinals are
   deleted (Kubernetes would not garbage-collect them: their owner still exists).

``spec.security.tls`` and ``groupSecret`` are fixed once the group runs (the StatefulSet
records what its brokers were started with): a change is reported like a bad spec.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from understudy_broker.model import GroupState, Mode
from understudy_operator.controller.driver import Controller
from understudy_operator.handlers import events
from understudy_operator.handlers.runtime import GroupHandle, Runtime
from understudy_operator.handlers.security import (
    SecretConflict,
    ensure_group_security,
    secure_zookeeper,
)
from understudy_operator.k8s.builders import (
    LABEL_GROUP,
    LABEL_SERVICE,
    build_all,
    network_policy_name,
)
from understudy_operator.k8s.kube import (
    BROKERGROUPS,
    CRDS,
    NETWORKPOLICIES,
    SERVICEMONITOR_CRD,
    SERVICEMONITORS,
    SERVICES,
    STATEFULSETS,
    KubeError,
)
from understudy_operator.k8s.podliveness import PodLiveness
from understudy_operator.k8s.rollout import plan_scale
from understudy_operator.k8s.security import security_change_problems
from understudy_operator.k8s.spec import MAX_SLAVES, BrokerGroupSpec, SpecError, parse_spec
from understudy_operator.k8s.status import (
    Condition,
    compute_conditions,
    compute_status,
    merge_conditions,
)
from understudy_operator.k8s.zkconfig import broker_name, encode_zk_config
from understudy_operator.zk import ZkError

log = logging.getLogger(__name__)


def with_operator_defaults(spec: Mapping[str, Any], *, chroot: str | None) -> dict[str, Any]:
    """The spec with the operator's default chroot filled in where the spec names none (the
    chart's ``zookeeper.chroot``); the connect string default is passed to ``parse_spec``."""
    out = dict(spec)
    zk = out.get("zookeeper")
    if chroot and (zk is None or (isinstance(zk, Mapping) and "chroot" not in zk)):
        out["zookeeper"] = {**(zk or {}), "chroot": chroot}
    return out


def parse(rt: Runtime, spec: Mapping[str, Any], name: str) -> BrokerGroupSpec:
    """``parse_spec`` with the operator's defaults; raises ``SpecError``."""
    return parse_spec(with_operator_defaults(spec, chroot=rt.config.zk_chroot), name=name,
                      default_zk_connect=rt.config.zk_connect)


def spec_error_text(exc: SpecError) -> str:
    return "invalid spec: " + "; ".join(exc.problems)


async def report_invalid(rt: Runtime, *, body: Mapping[str, Any], exc: SpecError) -> None:
    """Ready=False/InvalidSpec on the status and a Warning Event; nothing is applied."""
    meta = body.get("metadata", {})
    text = spec_error_text(exc)
    status = compute_status(
        generation=int(meta.get("generation") or 0), state=None, brokers=[],
        previous=body.get("status") or {}, now=datetime.now(UTC), spec_error=text)
    # An invalid spec leaves whatever runs untouched: keep the last mode/brokers fields.
    slim = {"observedGeneration": status["observedGeneration"],
            "conditions": status["conditions"]}
    await rt.kube.patch_status(BROKERGROUPS, namespace=meta["namespace"], name=meta["name"],
                               status=slim)
    await events.post(rt, body, type_="Warning", reason="InvalidSpec", message=text)


async def report_unreachable(rt: Runtime, *, body: Mapping[str, Any], message: str) -> None:
    """Ready=False/ZooKeeperUnreachable and a Warning Event (the handler retries)."""
    await report_problem(rt, body=body, reason="ZooKeeperUnreachable", message=message)


async def report_problem(rt: Runtime, *, body: Mapping[str, Any], reason: str,
                         message: str) -> None:
    """Ready=False with ``reason`` and a Warning Event; nothing else is applied."""
    meta = body.get("metadata", {})
    conditions = [
        Condition("Ready", False, reason, message) if c.type == "Ready" else c
        for c in compute_conditions(state=None, brokers=[])
    ]
    prev = (body.get("status") or {}).get("conditions")
    rendered = merge_conditions(previous=prev if isinstance(prev, list) else [],
                                current=conditions, now=datetime.now(UTC))
    try:
        await rt.kube.patch_status(BROKERGROUPS, namespace=meta["namespace"], name=meta["name"],
                                   status={"conditions": rendered})
    except KubeError as exc:
        log.warning("cannot report %s on the status: %s", reason, exc)
    await events.post(rt, body, type_="Warning", reason=reason, message=message)


async def ensure_group(rt: Runtime, *, body: Mapping[str, Any], spec: BrokerGroupSpec
                       ) -> GroupHandle:
    """The group's handle, starting its controller on first use (or after the ZooKeeper
    address changed). Raises ``kopf.TemporaryError`` when ZooKeeper is unreachable."""
    meta = body.get("metadata", {})
    namespace, name = str(meta["namespace"]), str(meta["name"])
    owner = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
             "metadata": {"name": name, "namespace": namespace, "uid": meta.get("uid")}}
    handle = rt.groups.get((namespace, name))
    if handle is not None and handle.zk_url == spec.zookeeper.url:
        handle.spec = spec
        handle.owner = owner
        return handle
    if handle is not None:
        log.warning("group %s/%s: ZooKeeper moved to %s; restarting its controller",
                    namespace, name, spec.zookeeper.url)
        rt.groups.pop(handle.key, None)
        await handle.stop()
    loop = asyncio.get_running_loop()
    liveness = PodLiveness()
    holder: list[GroupHandle] = []

    def on_transition(group: str, old: GroupState, new: GroupState) -> None:
        if holder and rt.on_transition is not None:
            rt.on_transition(holder[0], old, new)

    controller = Controller(
        spec.zookeeper.url, groups=[name], liveness=liveness, loop=loop,
        session_timeout_s=rt.config.controller_session_timeout_s,
        metrics=rt.metrics.controller,
        identity=rt.config.identity, on_transition=on_transition,
        digest_auth=rt.config.zk_digest)
    try:
        await secure_zookeeper(rt, spec.zookeeper.url)
        await controller.start(connect_timeout_s=5.0)
    except Exception as exc:
        await controller.stop()
        text = f"ZooKeeper {spec.zookeeper.url} unreachable ({exc!r}); nothing applied, retrying"
        await report_unreachable(rt, body=body, message=text)
        raise kopf.TemporaryError(text, delay=5) from exc
    handle = GroupHandle(namespace=namespace, name=name, zk_url=spec.zookeeper.url,
                         controller=controller, liveness=liveness, spec=spec, owner=owner)
    holder.append(handle)
    rt.groups[handle.key] = handle
    return handle


async def reconcile(rt: Runtime, *, body: Mapping[str, Any]) -> None:
    """The create/update/resume handler body. ZooKeeper and API hiccups are retried in
    seconds (kopf's default for an unexpected error would be a minute)."""
    try:
        await _reconcile(rt, body=body)
    except ZkError as exc:
        raise kopf.TemporaryError(f"ZooKeeper: {exc!r}", delay=5) from exc
    except KubeError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc


async def _reconcile(rt: Runtime, *, body: Mapping[str, Any]) -> None:
    meta = body.get("metadata", {})
    namespace, name = str(meta["namespace"]), str(meta["name"])
    try:
        spec = parse(rt, body.get("spec") or {}, name)
    except SpecError as exc:
        rt.metrics.errors.labels("reconcile", "invalid-spec").inc()
        await report_invalid(rt, body=body, exc=exc)
        return

    sts = await rt.kube.get(STATEFULSETS, namespace=namespace, name=name)
    problems = security_change_problems(spec.security, sts)
    running = rt.groups.get((namespace, name))
    if problems:
        rt.metrics.errors.labels("reconcile", "invalid-spec").inc()
        refused = SpecError(problems)
        if running is not None:  # the status timer keeps reporting it
            running.spec_problem = spec_error_text(refused)
        await report_invalid(rt, body=body, exc=refused)
        return
    if running is not None:
        running.spec_problem = None
    current = int(sts["spec"]["replicas"]) if sts and "replicas" in sts.get("spec", {}) else None
    try:
        security = await ensure_group_security(rt, body=body, spec=spec)
    except SecretConflict as exc:
        rt.metrics.errors.labels("reconcile", "secret-conflict").inc()
        await report_problem(rt, body=body, reason="SecretConflict", message=str(exc))
        raise kopf.TemporaryError(str(exc), delay=30) from exc
    handle = await ensure_group(rt, body=body, spec=spec)
    state, _ = await handle.zk.read_state(name)
    scale = plan_scale(current=current, desired=spec.replicas, state=state,
                       broker_name_of={o: broker_name(name, o) for o in range(MAX_SLAVES + 1)})
    if not scale.allowed:
        await events.post(rt, body, type_="Normal", reason="ScaleDeferred", message=scale.reason)
        raise kopf.TemporaryError(scale.reason, delay=5)

    data = encode_zk_config(spec=spec, group=name, namespace=namespace)
    if await handle.zk.write_config(name, data):
        rt.metrics.decision(name, "config-written")
        log.info("group %s/%s: ZooKeeper config written (%d brokers)", namespace, name,
                 spec.replicas)

    objects = build_all(spec=spec, group=name, namespace=namespace, security=security)
    monitor_crd = await rt.kube.exists(CRDS, namespace=None, name=SERVICEMONITOR_CRD)
    if not monitor_crd:
        objects = [o for o in objects if o["kind"] != "ServiceMonitor"]
    kopf.adopt(objects, owner=body)  # type: ignore[arg-type]
    for obj in objects:
        try:
            applied = await rt.kube.apply(obj)
        except KubeError as exc:
            raise kopf.TemporaryError(
                f"applying {obj['kind']} {obj['metadata']['name']}: {exc}", delay=5) from exc
        if applied.action != "unchanged":
            log.info("group %s/%s: %s %s %s", namespace, name, applied.action, obj["kind"],
                     obj["metadata"]["name"])
    if monitor_crd and not spec.monitoring.enabled:
        await rt.kube.delete(SERVICEMONITORS, namespace=namespace, name=name)
    if not spec.network_policy.enabled:
        await rt.kube.delete(NETWORKPOLICIES, namespace=namespace, name=network_policy_name(name))
    await _delete_stale_services(rt, namespace=namespace, name=name, replicas=spec.replicas)
    handle.generation = int(meta.get("generation") or 0)
    if current is not None and current != spec.replicas:
        rt.metrics.decision(name, "scale")
        await events.post(rt, body, type_="Normal", reason="Scaled",
                          message=f"brokers {current} -> {spec.replicas}")
    if state is not None and state.mode is not Mode.NORMAL:
        log.info("group %s/%s applied while %s", namespace, name, state.mode.name)


async def _delete_stale_services(rt: Runtime, *, namespace: str, name: str, replicas: int
                                 ) -> None:
    services = await rt.kube.list(SERVICES, namespace=namespace,
                                  labels={LABEL_GROUP: name, LABEL_SERVICE: "broker"})
    keep = {broker_name(name, o) for o in range(replicas)}
    for svc in services:
        svc_name = str(svc.get("metadata", {}).get("name"))
        if svc_name not in keep:
            await rt.kube.delete(SERVICES, namespace=namespace, name=svc_name)
            log.info("group %s/%s: deleted Service %s of a removed broker", namespace, name,
                     svc_name)

