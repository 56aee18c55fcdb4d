"""What the running operator holds between handler calls: its settings, its API client, its
metrics, and one :class:`GroupHandle` per BrokerGroup (the group's failover controller, its
pod-fed liveness source and its ZooKeeper session).

Why this module exists: kopf handlers are functions; the state they share must live somewhere
explicit, owned by one operator run and handed to the handlers through kopf's ``memo`` — not in
module globals, so two operators (two replicas in one test) never share anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import kopf

from understudy_broker.model import GroupState
from understudy_broker.security import ClientSecurity
from understudy_broker.tasks import stop_tasks
from understudy_operator.controller.driver import Controller
from understudy_operator.handlers.metrics import OperatorMetrics
from understudy_operator.k8s.certs import CertPolicy
from understudy_operator.k8s.kube import KubeClient
from understudy_operator.k8s.podliveness import PodLiveness
from understudy_operator.k8s.rollout import DEFAULT_MAX_LAG_BYTES
from understudy_operator.k8s.security import DEFAULT_CLUSTER_DOMAIN
from understudy_operator.k8s.spec import BrokerGroupSpec
from understudy_operator.k8s.status import FailoverTimes
from understudy_operator.zk import Digest, ZkGateway, gateway

log = logging.getLogger(__name__)

MEMO_KEY: Final = "understudy"


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """Operator-wide settings (from the command line or a test).

    ``zk_connect``/``zk_chroot``: the default ZooKeeper for groups whose spec names none (the
    chart's ``--zk CONNECT/CHROOT``). ``status_interval_s``: the status timer's period.
    ``handoff_timeout_s``: how long a planned handoff waits for the master to acknowledge the
    fence before leaving the rest to the controller. ``max_lag_bytes``: in-sync threshold for
    rollouts. ``identity``: this replica's name in controller elections. ``scanning``: let kopf
    list and watch namespaces and CRDs (off: the namespaces given are assumed to exist and
    resources are discovered once, e.g. without RBAC for namespaces, or against an emulator).
    ``topic_retry_s``: how often a BrokerTopic change or deletion that waits for queues to
    drain is tried again.

    Security (docs/security-kubernetes.md): ``zk_digest`` is the ZooKeeper digest identity of
    every session the operator opens (its controllers', topics', users') and, copied into a
    Secret per group, the brokers'; ``ca_secret`` is ``(namespace, name)`` of the one CA
    Secret (``None``: ``understudy-ca`` in each resource's namespace); ``cert_policy`` the
    validity and renewal windows; ``cluster_domain`` the DNS suffix in the brokers'
    certificates; ``security_interval_s`` how often certificates are checked for renewal
    and password Secrets for changes.
    """

    zk_connect: str | None = None
    zk_chroot: str | None = None
    status_interval_s: float = 2.0
    handoff_timeout_s: float = 10.0
    max_lag_bytes: int = DEFAULT_MAX_LAG_BYTES
    controller_session_timeout_s: float = 4.0
    identity: str | None = None
    scanning: bool = True
    topic_retry_s: float = 30.0
    zk_digest: Digest | None = field(default=None, repr=False)
    ca_secret: tuple[str, str] | None = None
    cert_policy: CertPolicy = field(default_factory=CertPolicy)
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    security_interval_s: float = 60.0


@dataclass
class GroupHandle:
    """One BrokerGroup's running parts inside this operator replica."""

    namespace: str
    name: str
    zk_url: str
    controller: Controller
    liveness: PodLiveness
    spec: BrokerGroupSpec
    owner: dict[str, Any]
    generation: int = 0
    last_mode: GroupState | None = None
    failover_times: FailoverTimes | None = None
    state_watch_armed: bool = False
    spec_problem: str | None = None
    """A spec the operator refused although it parses (a change of spec.security.tls on a
    running group): reported by the status like an invalid spec."""
    status_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    rollout_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def leading(self) -> bool:
        return self.controller.leading(self.name)

    @property
    def zk(self) -> ZkGateway:
        """The group controller's ZooKeeper session (one per group per operator replica)."""
        return self.controller.zk

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``coro`` in the background, owned by this handle (cancelled by :meth:`stop`)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        """Cancel this handle's tasks and stop the controller (its session closes, so another
        replica leads at once)."""
        await stop_tasks(set(self.tasks))
        await self.controller.stop()  # stops its drivers the same way


@dataclass
class Runtime:
    """Everything one operator run owns. Never copied: kopf's per-object ``memo`` copies hold
    a reference to it under :data:`MEMO_KEY`."""

    config: OperatorConfig
    kube: KubeClient
    metrics: OperatorMetrics
    groups: dict[tuple[str, str], GroupHandle] = field(default_factory=dict)
    on_transition: Callable[[GroupHandle, GroupState, GroupState], None] | None = None
    topic_sessions: dict[str, ZkGateway] = field(default_factory=dict)
    """One ZooKeeper session per ensemble/chroot that BrokerTopics and BrokerUsers name
    (topics are written with versioned writes, so one session serves every topic of that
    ensemble)."""
    client_security: dict[tuple[str, str], tuple[datetime, ClientSecurity]] = field(
        default_factory=dict)
    """(namespace, CA fingerprint) -> (renew after, the operator's TLS identity for brokers)."""
    secured_chroots: set[str] = field(default_factory=set)
    """Connect strings + chroots whose chroot node already has the digest ACL."""

    def leading_count(self) -> int:
        return sum(1 for h in self.groups.values() if h.leading)

    async def topic_zk(self, url: str) -> ZkGateway:
        """The started session for ``url``; raises ``ZkUnavailable`` when it cannot start."""
        zk = self.topic_sessions.get(url)
        if zk is not None:
            return zk
        zk = gateway(url, timeout_s=self.config.controller_session_timeout_s,
                     digest=self.config.zk_digest)
        await zk.start(timeout_s=5.0)
        if url in self.topic_sessions:  # another handler won the race: keep one session
            await zk.stop()
            return self.topic_sessions[url]
        self.topic_sessions[url] = zk
        return zk

    async def close(self) -> None:
        for handle in list(self.groups.values()):
            with contextlib.suppress(Exception):
                await handle.stop()
        self.groups.clear()
        for zk in list(self.topic_sessions.values()):
            with contextlib.suppress(Exception):
                await zk.stop()
        self.topic_sessions.clear()
        await self.kube.close()


def runtime_of(memo: Mapping[str, Any]) -> Runtime:
    """The :class:`Runtime` from a handler's ``memo`` (a programming error if missing)."""
    rt = memo.get(MEMO_KEY)
    if not isinstance(rt, Runtime):
        raise kopf.PermanentError("operator runtime missing from kopf's memo")
    return rt
