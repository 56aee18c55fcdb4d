"""Wiring: the kopf registry of the BrokerGroup operator, its settings, and :func:`run`.

Why this module exists: handlers are registered into a registry made per operator run (never
kopf's process-wide default registry), so the CLI, the tests and a second replica in the same
process each get their own. Every handler here is a few lines that find the run's
:class:`~understudy_operator.handlers.runtime.Runtime` in kopf's ``memo``, time the call for
``/metrics`` and delegate to one module per verb: ``reconcile`` (create/update/resume),
``status`` + ``rolling`` (the timer), ``delete`` (the finalizer), ``pods`` (pod events); BrokerTopics go to ``topics``
(create/update/resume and the finalizer), BrokerUsers to ``users`` (the same, plus a timer
that notices a changed password Secret and renews a certificate). A second BrokerGroup timer
(every ``security_interval_s``) runs ``reconcile`` again so certificates are renewed before
they end (``handlers/security.py``), which restarts the brokers through the rollout.

Both replicas of a two-replica operator run every handler (kopf peering is off: leadership is
per group, by the controller's ZooKeeper election). Applies and deletions are idempotent;
status patches, rollout steps and mode-change Events come only from a group's leader.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

import kopf

from understudy_operator.handlers.delete import finalize
from understudy_operator.handlers.metrics import OperatorMetrics
from understudy_operator.handlers.pods import route
from understudy_operator.handlers.reconcile import reconcile
from understudy_operator.handlers.rolling import roll
from understudy_operator.handlers.runtime import (
    MEMO_KEY,
    GroupHandle,
    OperatorConfig,
    Runtime,
    runtime_of,
)
from understudy_operator.handlers.status import on_transition, refresh, watch_state
from understudy_operator.handlers.topics import finalize_topic, reconcile_topic
from understudy_operator.handlers.users import finalize_user, reconcile_user
from understudy_operator.k8s.builders import LABEL_GROUP
from understudy_operator.k8s.kube import (
    BROKERGROUPS,
    BROKERTOPICS,
    BROKERUSERS,
    KubeClient,
    KubeError,
)
from understudy_operator.zk import ZkError

log = logging.getLogger(__name__)

FINALIZER: Final = "understudy.io/finalizer"
_BG: Final = (BROKERGROUPS.group, BROKERGROUPS.version, BROKERGROUPS.plural)
_BT: Final = (BROKERTOPICS.group, BROKERTOPICS.version, BROKERTOPICS.plural)
_BU: Final = (BROKERUSERS.group, BROKERUSERS.version, BROKERUSERS.plural)


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """A fresh registry with the operator's handlers."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        return runtime_of(memo).kube.info

    @kopf.on.resume(*_BG, registry=registry)
    @kopf.on.create(*_BG, registry=registry)
    @kopf.on.update(*_BG, registry=registry)
    async def reconcile_brokergroup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        rt = runtime_of(memo)
        with rt.metrics.timed("reconcile"):
            await reconcile(rt, body=body)
        handle = rt.groups.get((str(body.metadata.namespace), str(body.metadata.name)))
        if handle is not None:
            watch_state(rt, handle)

    @kopf.timer(*_BG, interval=config.status_interval_s, registry=registry)
    async def status_brokergroup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        rt = runtime_of(memo)
        handle = rt.groups.get((str(body.metadata.namespace), str(body.metadata.name)))
        if handle is None:
            rt.metrics.leading.set(rt.leading_count())
            return
        try:
            with rt.metrics.timed("status"):
                await refresh(rt, handle, body)
        except (ZkError, KubeError) as exc:
            # The next tick retries; kopf's own retry would wait a minute.
            log.warning("group %s/%s: status refresh failed: %r", handle.namespace,
                        handle.name, exc)
            return
        finally:
            # After the refresh, so the gauge is never older than the status just written
            # (an election won during the refresh used to show up one tick late).
            rt.metrics.leading.set(rt.leading_count())
        if handle.leading and not handle.rollout_lock.locked():
            handle.spawn(_roll_logged(rt, handle), name=f"rollout-{handle.name}")

    @kopf.timer(*_BG, interval=config.security_interval_s,
                initial_delay=config.security_interval_s, registry=registry)
    async def renew_brokergroup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        # The same idempotent reconcile: it renews what is due (certificates, a CA) and
        # writes nothing otherwise; a new certificate revision starts the safe rollout.
        rt = runtime_of(memo)
        handle = rt.groups.get((str(body.metadata.namespace), str(body.metadata.name)))
        if handle is None or handle.generation != int(body.metadata.get("generation") or 0):
            return  # not running here yet, or a spec change is pending: the update handles it
        with rt.metrics.timed("renew"):
            await reconcile(rt, body=body)

    @kopf.on.delete(*_BG, registry=registry)
    async def delete_brokergroup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> str:
        rt = runtime_of(memo)
        with rt.metrics.timed("delete"):
            return await finalize(rt, body=body)

    @kopf.on.resume(*_BT, registry=registry)
    @kopf.on.create(*_BT, registry=registry)
    @kopf.on.update(*_BT, field="spec", registry=registry)
    async def reconcile_brokertopic(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        rt = runtime_of(memo)
        with rt.metrics.timed("topic"):
            await reconcile_topic(rt, body=body)

    @kopf.on.delete(*_BT, registry=registry)
    async def delete_brokertopic(body: kopf.Body, memo: kopf.Memo, **_: Any) -> str:
        rt = runtime_of(memo)
        with rt.metrics.timed("topic-delete"):
            return await finalize_topic(rt, body=body)

    @kopf.on.resume(*_BU, registry=registry)
    @kopf.on.create(*_BU, registry=registry)
    @kopf.on.update(*_BU, field="spec", registry=registry)
    async def reconcile_brokeruser(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        rt = runtime_of(memo)
        with rt.metrics.timed("user"):
            await reconcile_user(rt, body=body)

    @kopf.timer(*_BU, interval=config.security_interval_s,
                initial_delay=config.security_interval_s, registry=registry)
    async def refresh_brokeruser(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        # A changed password Secret, a certificate due, a CA renewed: written again.
        rt = runtime_of(memo)
        with rt.metrics.timed("user"):
            await reconcile_user(rt, body=body)

    @kopf.on.delete(*_BU, registry=registry)
    async def delete_brokeruser(body: kopf.Body, memo: kopf.Memo, **_: Any) -> str:
        rt = runtime_of(memo)
        with rt.metrics.timed("user-delete"):
            return await finalize_user(rt, body=body)

    @kopf.on.event("", "v1", "pods", labels={LABEL_GROUP: kopf.PRESENT}, registry=registry)
    def broker_pod(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        route(runtime_of(memo), event=event, body=body)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await runtime_of(memo).close()

    return registry


async def _roll_logged(rt: Runtime, handle: GroupHandle) -> None:
    with rt.metrics.timed("rollout"):
        try:
            await roll(rt, handle)
        except Exception:
            log.exception("group %s/%s: rollout step failed; retried on the next tick",
                          handle.namespace, handle.name)
            raise


def make_settings(config: OperatorConfig | None = None) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = config is not None and not config.scanning
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30
    return settings


async def run(
    *,
    config: OperatorConfig,
    connection: kopf.ConnectionInfo,
    namespaces: Sequence[str] = (),
    clusterwide: bool = False,
    metrics: OperatorMetrics | None = None,
    liveness_endpoint: str | None = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or forever); every group controller is
    stopped and every ZooKeeper session closed on the way out."""
    rt = Runtime(config=config, kube=KubeClient(connection), metrics=metrics or OperatorMetrics())
    rt.on_transition = on_transition(rt)
    try:
        await kopf.operator(
            registry=build_registry(config), settings=make_settings(config), clusterwide=clusterwide,
            namespaces=list(namespaces), liveness_endpoint=liveness_endpoint,
            stop_flag=stop_flag, ready_flag=ready_flag, memo=kopf.Memo({MEMO_KEY: rt}),
            standalone=True)
    finally:
        await rt.close()
