"""BrokerTopic: sync the spec into ``/topics/<t>``, report placement, delete per policy.

Why this module exists: a platform team declares a topic next to its BrokerGroups and
expects the operator to make it so. The rules are the CLI's (planned by the pure
:mod:`understudy_operator.k8s.topicspec` on top of :mod:`understudy_broker.topology`); this
module is the thin I/O around them: read the document and its znode version, measure the
backlog through the brokers only when a plan would remove queues, write with the version
read (two operator replicas racing cannot lose a change: the loser re-reads and finds
nothing to do), and report on the status and in Events.

A refusal is reported, never half-applied: ``Ready=False`` with reason ``InvalidSpec``,
``Refused`` (an unknown group, a change of ``ordered``) or ``Backlog`` (a removal or a
``Delete`` waiting for queues to drain; retried every ``topic_retry_s``, 30 s).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kopf

from understudy_broker.admin import backlog_of, describe_topic
from understudy_broker.client import BrokerError
from understudy_broker.security import ClientSecurity
from understudy_broker.topicnodes import OrderedNodesLeft
from understudy_broker.topology import TopicPlanError
from understudy_broker.zklayout import GroupConfig, TopicDoc
from understudy_operator.handlers import events
from understudy_operator.handlers.runtime import Runtime
from understudy_operator.handlers.security import (
    SecretConflict,
    operator_client_security,
    secure_zookeeper,
)
from understudy_operator.k8s.kube import BROKERTOPICS, KubeError
from understudy_operator.k8s.spec import SpecError
from understudy_operator.k8s.status import Condition, merge_conditions
from understudy_operator.k8s.topicspec import (
    TopicSpec,
    check_update,
    parse_topic_spec,
    placement_status,
    plan_delete,
    plan_sync,
)
from understudy_operator.k8s.userspec import OPERATOR_COMMON_NAME, operator_rules
from understudy_operator.zk import ZkError, ZkGateway, ZkUnavailable

log = logging.getLogger(__name__)

def parse(rt: Runtime, body: Mapping[str, Any]) -> TopicSpec:
    """The resource's spec with the operator's ZooKeeper defaults, checked against what
    the last sync applied; raises ``SpecError``."""
    meta = body.get("metadata", {})
    spec = parse_topic_spec(body.get("spec") or {}, name=str(meta.get("name")),
                            default_zk_connect=rt.config.zk_connect,
                            default_chroot=rt.config.zk_chroot)
    problems = check_update(body.get("status") or {}, spec)
    if problems:
        raise SpecError(problems, kind="BrokerTopic")
    return spec


async def reconcile_topic(rt: Runtime, *, body: Mapping[str, Any]) -> None:
    """Create/update/resume: make ZooKeeper match the spec, then report."""
    meta = body.get("metadata", {})
    try:
        spec = parse(rt, body)
    except SpecError as exc:
        rt.metrics.errors.labels("topic", "invalid-spec").inc()
        await _report(rt, body, ready=False, reason="InvalidSpec",
                      message="invalid spec: " + "; ".join(exc.problems), warn=True)
        return
    zk = await _session(rt, body, spec)
    try:
        configs = await _group_configs(zk)
        current, version = await zk.read_topic(spec.topic)
        plan = plan_sync(spec, current, known_groups=configs.keys())
        if plan.removes:
            backlog = await measure_backlog(configs, spec.topic, current,
                                            security=await _security(rt, body, current, zk))
            plan = plan_sync(spec, current, known_groups=configs.keys(), backlog=backlog)
    except ZkError as exc:
        raise kopf.TemporaryError(f"ZooKeeper: {exc!r}", delay=5) from exc
    except TopicPlanError as exc:
        waiting = exc.code == "backlog"
        rt.metrics.errors.labels("topic", exc.code).inc()
        await _report(rt, body, ready=False, reason="Backlog" if waiting else "Refused",
                      message=str(exc), warn=True, placed=current, spec=spec)
        if waiting:
            raise kopf.TemporaryError(str(exc), delay=rt.config.topic_retry_s) from exc
        return
    placed = current
    if plan.doc is not None:
        try:
            written = await zk.write_topic(plan.doc, version=version)
        except ZkError as exc:
            raise kopf.TemporaryError(f"ZooKeeper: {exc!r}", delay=5) from exc
        except OrderedNodesLeft as exc:
            rt.metrics.errors.labels("topic", "ordered-leftover").inc()
            await _report(rt, body, ready=False, reason="Refused", message=str(exc), warn=True,
                          placed=current, spec=spec)
            return
        if not written:  # another writer (a replica, the CLI) got there first: re-read
            raise kopf.TemporaryError(f"topic {spec.topic!r} changed while syncing", delay=1)
        placed = plan.doc
        action = "created" if current is None else "altered"
        rt.metrics.decision(spec.topic, f"topic-{action}")
        log.info("topic %s: %s in %s (%d queues over %s)", spec.topic, action,
                 spec.zookeeper.url, len(placed.live_queues()), ",".join(placed.groups()))
        await events.post(rt, body, type_="Normal", reason=f"Topic{action.capitalize()}",
                          message=f"topic {spec.topic} {action}: {len(placed.live_queues())} "
                                  f"queues over {', '.join(placed.groups())}")
    await _report(rt, body, ready=True, reason="Synced",
                  message=f"/topics/{spec.topic} matches the spec", placed=placed, spec=spec,
                  generation=int(meta.get("generation") or 0))


async def finalize_topic(rt: Runtime, *, body: Mapping[str, Any]) -> str:
    """The finalizer: delete the topic when ``deletionPolicy`` says so. ``Delete`` waits
    (retried every ``topic_retry_s``, with a Warning Event) while a queue holds messages."""
    try:
        spec = parse(rt, body)
    except SpecError:
        return "invalid spec: nothing was ever applied from it; topic left as it is"
    if spec.deletion_policy.value == "Retain":
        return f"deletionPolicy Retain: topic {spec.topic} left in ZooKeeper"
    zk = await _session(rt, body, spec)
    try:
        current, version = await zk.read_topic(spec.topic)
        backlog = None
        if current is not None and spec.deletion_policy.value == "Delete":
            backlog = await measure_backlog(await _group_configs(zk), spec.topic, current,
                                            security=await _security(rt, body, current, zk))
        if not plan_delete(spec, current, backlog):
            return f"topic {spec.topic} was already gone"
        deleted = await zk.delete_topic(spec.topic)
    except TopicPlanError as exc:
        await events.post(rt, body, type_="Warning", reason="DeleteWaiting", message=str(exc))
        raise kopf.TemporaryError(str(exc), delay=rt.config.topic_retry_s) from exc
    except ZkError as exc:
        raise kopf.TemporaryError(f"ZooKeeper: {exc!r}", delay=5) from exc
    del version  # a delete after a concurrent alter is still the delete the user asked for
    rt.metrics.decision(spec.topic, "topic-deleted")
    return f"topic {spec.topic} deleted" if deleted else f"topic {spec.topic} was already gone"


async def _security(rt: Runtime, body: Mapping[str, Any], doc: TopicDoc | None,
                    zk: ZkGateway) -> ClientSecurity | None:
    """TLS and the operator's client certificate when a group of the topic that this
    operator runs has TLS on (``spec.security.tls``); plain for groups it does not run
    (local groups, another operator's), which it knows nothing about. The identity's rules
    (describe topics and consumer groups) are written to the cluster first."""
    if doc is None:
        return None
    groups = set(doc.groups())
    if not any(h.spec.security.tls for h in rt.groups.values() if h.name in groups):
        return None
    namespace = str(body.get("metadata", {}).get("namespace"))
    await zk.write_acl_rules(OPERATOR_COMMON_NAME, operator_rules().to_json())
    try:
        return await operator_client_security(rt, namespace)
    except (SecretConflict, KubeError) as exc:
        log.warning("topic backlog: no TLS identity for the operator (%s)", exc)
        return None


async def measure_backlog(configs: Mapping[str, GroupConfig], topic: str, doc: TopicDoc | None,
                          *, security: ClientSecurity | None = None) -> dict[int, int] | None:
    """Unconsumed messages per queue, asked of the brokers of the topic's groups (their
    addresses are in the groups' ZooKeeper ``configs``) with ``security`` (TLS on the
    groups); ``None`` when no broker answered, which the plans treat as "still holds
    messages"."""
    if doc is None:
        return {}
    bootstrap = [f"{b.host}:{b.port}" for group in doc.groups() if group in configs
                 for b in configs[group].brokers]
    if not bootstrap:
        return None
    try:
        return backlog_of(await describe_topic(bootstrap, topic, security))
    except (BrokerError, ConnectionError, OSError, TimeoutError) as exc:
        log.warning("topic %s: backlog unknown (%s)", topic, exc)
        return None


async def _group_configs(zk: ZkGateway) -> dict[str, GroupConfig]:
    """Groups with a readable config (the ones a topic may be placed on), read once."""
    configs = {g: await zk.read_config(g) for g in await zk.groups()}
    return {g: c for g, c in configs.items() if c is not None}


async def _session(rt: Runtime, body: Mapping[str, Any], spec: TopicSpec) -> ZkGateway:
    try:
        await secure_zookeeper(rt, spec.zookeeper.url)
        return await rt.topic_zk(spec.zookeeper.url)
    except (ZkUnavailable, ZkError) as exc:
        text = f"ZooKeeper {spec.zookeeper.url} unreachable ({exc}); nothing applied, retrying"
        await _report(rt, body, ready=False, reason="ZooKeeperUnreachable", message=text,
                      warn=True)
        raise kopf.TemporaryError(text, delay=5) from exc


async def _report(rt: Runtime, body: Mapping[str, Any], *, ready: bool, reason: str,
                  message: str, warn: bool = False, placed: TopicDoc | None = None,
                  spec: TopicSpec | None = None, generation: int | None = None) -> None:
    """Patch the status (conditions always; placement when known) and, for a problem, post
    a Warning Event. A status that cannot be written is logged: the next call retries."""
    meta = body.get("metadata", {})
    previous = (body.get("status") or {}).get("conditions")
    status: dict[str, Any] = {"conditions": merge_conditions(
        previous=previous if isinstance(previous, Sequence) else [],
        current=[Condition("Ready", ready, reason, message)], now=datetime.now(UTC))}
    if generation is not None:
        status["observedGeneration"] = generation
    if spec is not None and (ready or placed is not None):
        status.update(placement_status(placed), topic=spec.topic, zookeeper=spec.zookeeper.url)
    try:
        await rt.kube.patch_status(BROKERTOPICS, namespace=str(meta["namespace"]),
                                   name=str(meta["name"]), status=status)
    except KubeError as exc:
        log.warning("topic %s: status not written: %s", meta.get("name"), exc)
    if warn:
        await events.post(rt, body, type_="Warning", reason=reason, message=message)
