"""The real kopf operator against the KMock Kubernetes emulator and a real ZooKeeper.

What is real here: kopf and every handler of the operator, the operator's HTTP client, the
failover controller with its ZooKeeper election, versioned state writes and watches, the pod
liveness source fed by kopf's pod watch, and ZooKeeper itself. What is emulated, and how:

* KMock stores objects and serves list/watch/patch; the ``Emulator`` subclass below adds what
  an API server sets (``uid``, ``resourceVersion``, ``generation``, ``creationTimestamp``).
* Nothing runs a StatefulSet controller or a kubelet, so ``Workloads`` plays both: it gives the
  StatefulSet an ``updateRevision`` (a hash of its pod template), creates the broker pods
  (labelled with that revision), sets their container status, terminates a deleted pod
  gracefully (a finalizer keeps the pod object until its broker has stopped, as the kubelet
  does) and re-creates it. Each broker pod is backed by a ``FakeBroker``: an asyncio task with a real
  ``BrokerCoordinator`` ZooKeeper session (live node, state watch, lease, status) that computes
  its effective permission with ``model.effective_permission`` — it simulates only the data
  plane (a slave's master link is "the master's fake broker runs"; a returning master
  acknowledges back-sync shortly after RECOVERING).

Never a claim about Kubernetes itself: KMock ignores label selectors, has no garbage collector
and no admission; the kind suite (e2e/) covers those.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import kmock
import kopf
import pytest
from kazoo.client import KazooClient
from prometheus_client import generate_latest

from understudy_broker import metric_names
from understudy_broker.client import Consumer, Producer
from understudy_broker.ha.coordinator import BrokerCoordinator
from understudy_broker.model import Health, Mode, Permission, effective_permission
from understudy_broker.zklayout import (
    BrokerStatus,
    ChainDoc,
    GroupConfig,
    TopicDoc,
    chains_path,
    config_path,
    decode_state,
    ordered_dir,
    state_path,
    topic_path,
)
from understudy_harness import testing
from understudy_harness.testing import UNDERSTUDY, Process
from understudy_operator.handlers.app import run
from understudy_operator.handlers.metrics import OperatorMetrics
from understudy_operator.handlers.runtime import OperatorConfig
from understudy_operator.k8s.spec import parse_spec
from understudy_operator.k8s.zkconfig import encode_zk_config
from understudy_operator.local.plan import ClusterPlan
from understudy_operator.local.ports import free_port
from understudy_operator.zk import with_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NS = "ns1"
BG = "understudy.io/v1alpha1/brokergroups"
BT = "understudy.io/v1alpha1/brokertopics"
KUBELET = "understudy.test/kubelet"  # stands for the kubelet: a pod goes once its broker stopped


# --------------------------------------------------------------------------- the emulator


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """KMock plus the metadata an API server would set; it records pod deletions."""

    deleted_pods: list[str] = attrs.field(factory=list)
    _rv: int = 0

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and isinstance(request.data, dict):
            self._rv += 1
            meta = request.data.setdefault("metadata", {})
            if request.action == kmock.action.CREATE:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta.setdefault("creationTimestamp",
                                datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
                meta["resourceVersion"] = str(self._rv)
            elif request.action == kmock.action.UPDATE:
                meta["resourceVersion"] = str(self._rv)
                key = (request.resource, request.namespace, request.name)
                if "spec" in request.data and request.subresource is None:
                    with contextlib.suppress(Exception):
                        current = self.objects[key]
                        if current.get("spec") != request.data["spec"]:
                            meta["generation"] = int(
                                current.get("metadata", {}).get("generation", 1)) + 1
        if (request.resource is not None and request.action == kmock.action.DELETE
                and request.resource.plural == "pods" and request.name):
            self.deleted_pods.append(request.name)
        return await super()._handle(request)


def declare(k: Emulator) -> None:
    k.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False,
                                                      verbs={"list", "watch", "get"})
    k.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch", "get"})
    for res, kind in [(BG, "BrokerGroup"), (BT, "BrokerTopic")]:
        k.resources[res] = kmock.ResourceInfo(
            kind=kind, namespaced=True, subresources={"status"},
            verbs={"list", "watch", "get", "patch", "create", "delete"})
    for res, kind in [("v1/pods", "Pod"), ("v1/services", "Service"),
                      ("v1/configmaps", "ConfigMap"), ("v1/events", "Event"),
                      ("v1/persistentvolumeclaims", "PersistentVolumeClaim"),
                      ("v1/secrets", "Secret"),  # security is on by default
                      ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy"),
                      ("apps/v1/statefulsets", "StatefulSet"),
                      ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget")]:
        k.resources[res] = kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs={"list", "watch", "get", "patch", "create",
                                               "delete"})
    k.objects["v1/namespaces", None, NS] = {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": NS}}


# --------------------------------------------------------------------------- fake brokers


class FakeBroker:
    """A broker's ZooKeeper side, in-process (see the module docstring)."""

    def __init__(self, *, url: str, group: str, name: str,
                 running: Callable[[str], bool]) -> None:
        self.url, self.group, self.name = url, group, name
        self._running = running
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.coord: BrokerCoordinator | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.coord = BrokerCoordinator(self.url, group=self.group, name=self.name,
                                       session_timeout_s=1.0, loop=loop,
                                       on_change=self._wake.set, address="127.0.0.1:1")
        await self.coord.start()
        self._task = loop.create_task(self._loop(), name=f"fake-{self.name}")

    async def _loop(self) -> None:
        coord = self.coord
        if coord is None:
            return
        persisted: int | None = None
        recovering: tuple[int, float] | None = None
        while not self._stop.is_set():
            cfg, st = coord.config, coord.state
            if cfg is not None and any(b.name == self.name for b in cfg.brokers):
                spec = cfg.broker(self.name)
                slaves = [s.name for s in cfg.slaves]
                links = [s for s in slaves if self._running(s)] if spec.ordinal == 0 else []
                health = Health(zk_live=coord.zk_live, zk_lost_for=coord.zk_lost_for(),
                                fence_after=1.0, slaves_assigned=bool(slaves),
                                slave_connected=bool(links), slave_once_connected=True,
                                lease_valid=coord.lease_valid())
                eff = effective_permission(role=spec.role, name=self.name,
                                           configured=spec.permission, state=st, health=health)
                master = spec.ordinal == 0
                ready = (not master) or (st is not None and st.mode is not Mode.NORMAL
                                         and not eff & Permission.READ)
                if master and st is not None and st.mode is Mode.RECOVERING:
                    if recovering is None or recovering[0] != st.epoch:
                        recovering = (st.epoch, time.monotonic())
                    elif time.monotonic() - recovering[1] > 0.2:
                        persisted = st.epoch
                status = BrokerStatus(
                    broker=self.name, effective=eff, epoch_applied=st.epoch if st else 0,
                    master_link=not master and self._running(cfg.master.name),
                    slave_links=tuple(links), max_offset=1000, ready=ready,
                    backsync_epoch=persisted, updated_ms=int(time.time() * 1000))
                with contextlib.suppress(Exception):
                    await coord.publish_status(status)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self._wake.wait()

    async def stop(self) -> None:
        self._stop.set()
        # Cancel until done: Python 3.11's wait_for can swallow one cancellation.
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=1.0)
        if self.coord is not None:
            await self.coord.stop()


# --------------------------------------------------------------------------- workloads


def revision_of(sts: dict[str, Any]) -> str:
    template = json.dumps(sts.get("spec", {}).get("template", {}), sort_keys=True)
    return f"{sts['metadata']['name']}-{hashlib.sha256(template.encode()).hexdigest()[:10]}"


def running_status(*, restarts: int = 0) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "broker", "ready": True, "restartCount": restarts,
                                   "state": {"running": {"startedAt": now}}}]}


def terminated_status(*, restarts: int = 0) -> dict[str, Any]:
    return {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "broker", "ready": False, "restartCount": restarts,
                                   "state": {"terminated": {"exitCode": 137,
                                                            "reason": "Error"}}}]}


@dataclass
class Workloads:
    """The StatefulSet controller and kubelet of this test (see the module docstring)."""

    k: Emulator
    http: aiohttp.ClientSession
    base: str
    url: str
    brokers: dict[str, FakeBroker] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    paused: bool = False

    def running(self, name: str) -> bool:
        return name in self.brokers

    async def api(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with self.http.request(method, self.base + path, json=body,
                                     headers=headers) as resp:
            text = await resp.text()
            assert resp.status < 300, f"{method} {path}: {resp.status} {text[:300]}"
            return json.loads(text) if text else {}

    def objects(self, res: str) -> list[dict[str, Any]]:
        out = []
        for (r, ns, _), obj in list(self.k.objects.items()):
            if f"{r.group}/{r.version}/{r.plural}".lstrip("/") == res and ns == NS \
                    and not obj.deleted:
                out.append(obj.raw)
        return out

    def get(self, res: str, name: str) -> dict[str, Any] | None:
        return next((o for o in self.objects(res) if o["metadata"]["name"] == name), None)

    def must(self, res: str, name: str) -> dict[str, Any]:
        """:meth:`get` for an object the test knows exists (it fails, naming it, if not)."""
        obj = self.get(res, name)
        assert obj is not None, f"no {res} {name!r}"
        return obj

    async def start_broker(self, group: str, name: str, url: str) -> None:
        broker = FakeBroker(url=url, group=group, name=name, running=self.running)
        # Known before it starts: a start cut short (the test ends and cancels this loop
        # while the ZooKeeper client connects in its thread) is still stopped by close().
        # Registered after, such a broker's client was left reconnecting to a stopped
        # ZooKeeper, and kazoo's exit hook then waited for it forever.
        self.brokers[name] = broker
        await broker.start()

    async def stop_broker(self, name: str) -> None:
        broker = self.brokers.pop(name, None)
        if broker is not None:
            await broker.stop()

    async def terminate(self, name: str) -> None:
        """Graceful termination: the broker stops, the container is reported terminated, and
        only then does the pod object go (the kubelet's finalizer is released)."""
        await self.stop_broker(name)
        await self.api("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status",
                       {"status": terminated_status(restarts=self.restarts.get(name, 0))})
        await self.api("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}",
                       {"metadata": {"finalizers": []}})

    async def kill(self, name: str) -> None:
        """The container dies: the process goes, then the kubelet reports it terminated."""
        await self.stop_broker(name)
        await self.api("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status",
                       {"status": terminated_status(restarts=self.restarts.get(name, 0))})

    async def revive(self, name: str, group: str, url: str) -> None:
        """The kubelet restarts the container."""
        self.restarts[name] = self.restarts.get(name, 0) + 1
        await self.start_broker(group, name, url)
        await self.api("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status",
                       {"status": running_status(restarts=self.restarts[name])})

    async def tick(self) -> None:
        for pod in self.objects("v1/pods"):
            if pod["metadata"].get("deletionTimestamp"):
                await self.terminate(pod["metadata"]["name"])
        for sts in self.objects("apps/v1/statefulsets"):
            name = sts["metadata"]["name"]
            rev = revision_of(sts)
            if (sts.get("status") or {}).get("updateRevision") != rev:
                await self.api("PATCH", f"/apis/apps/v1/namespaces/{NS}/statefulsets/{name}"
                               "/status", {"status": {"updateRevision": rev}})
            replicas = int(sts["spec"]["replicas"])
            url = self.zk_url_of(sts)
            pods = {p["metadata"]["name"]: p for p in self.objects("v1/pods")
                    if p["metadata"].get("labels", {}).get("understudy.io/group") == name}

            for ordinal in range(replicas):
                pod_name = f"{name}-{ordinal}"
                if pod_name in pods:
                    continue
                labels = dict(sts["spec"]["template"]["metadata"]["labels"])
                labels["controller-revision-hash"] = rev
                labels["statefulset.kubernetes.io/pod-name"] = pod_name
                await self.api("POST", f"/api/v1/namespaces/{NS}/pods", {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "namespace": NS, "labels": labels,
                                 "finalizers": [KUBELET]},
                    "spec": {"containers": [{"name": "broker", "image": "x"}]},
                    "status": {"phase": "Pending"}})
                await self.start_broker(name, pod_name, url)
                await self.api("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod_name}/status",
                               {"status": running_status()})
            for pod_name in pods:
                if int(pod_name.rsplit("-", 1)[1]) >= replicas:
                    await self.api("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod_name}")

    @staticmethod
    def zk_url_of(sts: dict[str, Any]) -> str:
        script = sts["spec"]["template"]["spec"]["containers"][0]["command"][2]
        return str(script.split("--zk ", 1)[1].split(" ", 1)[0].strip("'"))

    async def run(self) -> None:
        while True:
            if not self.paused:
                with contextlib.suppress(AssertionError, aiohttp.ClientError):
                    await self.tick()
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        for name in list(self.brokers):
            await self.stop_broker(name)


# --------------------------------------------------------------------------- fixtures


@dataclass
class Env:
    k: Emulator
    w: Workloads
    zk_connect: str
    chroot: str
    admin: KazooClient
    metrics: OperatorMetrics

    def spec(self, **overrides: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "image": "understudy/broker:1", "slaves": 1,
            "zookeeper": {"connect": self.zk_connect, "chroot": self.chroot,
                          "sessionTimeoutMs": 1000},
            "failover": {"checkIntervalMs": 100, "detectionChecks": 2,
                         "backSyncTimeoutSeconds": 5},
            "storage": {"retentionOnDelete": "Delete"},
        }
        spec.update(overrides)
        return spec

    async def create(self, name: str, spec: dict[str, Any]) -> None:
        await self.w.api("POST", f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokergroups", {
            "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerGroup",
            "metadata": {"name": name, "namespace": NS}, "spec": spec})

    async def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        await self.w.api("PATCH", f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokergroups/"
                         f"{name}", {"spec": spec})

    def bg(self, name: str) -> dict[str, Any] | None:
        return self.w.get(BG, name)

    def must_bg(self, name: str) -> dict[str, Any]:
        return self.w.must(BG, name)

    def must_condition(self, name: str, ctype: str) -> dict[str, Any]:
        cond = self.condition(name, ctype)
        assert cond is not None, f"BrokerGroup {name!r} has no {ctype} condition"
        return cond

    def state(self, group: str) -> Any:
        if self.admin.exists(state_path(group)) is None:
            return None
        return decode_state(self.admin.get(state_path(group))[0])

    def condition(self, name: str, ctype: str) -> dict[str, Any] | None:
        bg = self.bg(name) or {}
        for cond in (bg.get("status") or {}).get("conditions") or []:
            if cond.get("type") == ctype:
                return dict(cond)
        return None

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.w.objects("v1/events")
                if e.get("involvedObject", {}).get("name") == name
                and e.get("involvedObject", {}).get("kind") == "BrokerGroup"]


async def eventually(check: Callable[[], Any], *, within: float = 20.0, what: str = "") -> Any:
    """The shared poller; a check may look into objects still being created, so its
    exceptions count as "not yet"."""
    return await testing.eventually(check, what, within, tolerate=(Exception,))


def mode_changes(w: Workloads, group: str) -> dict[int, tuple[str, str]]:
    """``{epoch: (mode, reason)}`` from the ModeChanged Events the operator posts for every
    state it writes (the handoff's and the controller's alike). Not a ZooKeeper watch: a
    watch re-armed after FENCING can miss it when SLAVE_CONSUME follows within
    milliseconds."""
    out: dict[int, tuple[str, str]] = {}
    for e in w.objects("v1/events"):
        if e.get("involvedObject", {}).get("name") != group or e.get("reason") != "ModeChanged":
            continue
        m = re.match(r"\w+/\d+ -> (\w+)/(\d+)(?:, acting \S+)?: (.*)$", e["message"])
        if m:
            out[int(m.group(2))] = (m.group(1), m.group(3))
    return out

@contextlib.asynccontextmanager
async def operator(url: str, *, identity: str,
                   metrics: OperatorMetrics | None = None,
                   zk_connect: str | None = None) -> AsyncIterator[threading.Thread]:
    """The operator in a thread with its own event loop, as in production: kopf treats every
    task of its loop as its own when it stops, and must not wait for the test's."""
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    loops: list[asyncio.AbstractEventLoop] = []

    async def until_stopped(**kwargs: Any) -> None:
        loops.append(asyncio.get_running_loop())
        await run(**kwargs)

    def main() -> None:
        try:
            asyncio.run(until_stopped(
                config=OperatorConfig(status_interval_s=0.5, handoff_timeout_s=5.0,
                                      identity=identity, controller_session_timeout_s=1.0,
                                      scanning=False, topic_retry_s=0.5,
                                      zk_connect=zk_connect),
                connection=kopf.ConnectionInfo(server=url), namespaces=[NS], metrics=metrics,
                stop_flag=stop, ready_flag=ready))
        except BaseException as exc:  # reported by the test below
            failure.append(exc)

    thread = threading.Thread(target=main, name=f"operator-{identity}", daemon=True)
    thread.stop_flag = stop  # type: ignore[attr-defined]  # lets a test stop one replica early
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, 15), f"operator {identity} did not start"
        yield thread
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
        if thread.is_alive():
            stacks = []
            for task in asyncio.all_tasks(loops[0]) if loops else ():
                frames = task.get_stack()
                where = "".join(traceback.format_stack(frames[-1])) if frames else "?"
                stacks.append(f"{task.get_name()}:\n{where}")
            raise AssertionError(f"operator {identity} did not stop; pending tasks:\n"
                                 + "\n".join(stacks))
        assert not failure, f"operator {identity} failed: {failure[0]!r}"


@pytest.fixture
async def cluster(zk: str, admin: KazooClient) -> AsyncIterator[Env]:
    """KMock, the workload emulation and ZooKeeper, without an operator."""
    zk_connect, _, chroot = zk.partition("/")
    k = Emulator()
    declare(k)
    async with k, kmock.Server(k) as server, aiohttp.ClientSession() as http:
        base = str(server.url).rstrip("/")
        w = Workloads(k=k, http=http, base=base, url=base)
        driver = asyncio.get_running_loop().create_task(w.run())
        try:
            yield Env(k=k, w=w, zk_connect=zk_connect, chroot=f"/{chroot}", admin=admin,
                      metrics=OperatorMetrics())
        finally:
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver
            await w.close()


@pytest.fixture
async def env(cluster: Env) -> AsyncIterator[Env]:
    """The cluster with one operator replica running."""
    async with operator(cluster.w.base, identity="op-a", metrics=cluster.metrics):
        yield cluster


# --------------------------------------------------------------------------- tests


async def test_create_builds_owned_children_zk_config_and_ready_status(env: Env) -> None:
    await env.create("orders", env.spec())
    bg = await eventually(lambda: (env.bg("orders") or {}).get("metadata", {}).get("uid")
                          and env.bg("orders"), what="the BrokerGroup")
    uid = bg["metadata"]["uid"]

    sts = await eventually(lambda: env.w.get("apps/v1/statefulsets", "orders"),
                           what="the StatefulSet")
    assert sts["spec"]["replicas"] == 2
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    children = [
        env.w.get("v1/configmaps", "orders-config"),
        env.w.get("v1/services", "orders-headless"),
        env.w.get("v1/services", "orders-0"),
        env.w.get("v1/services", "orders-1"),
        env.w.get("policy/v1/poddisruptionbudgets", "orders"),
        sts,
    ]
    for child in children:
        assert child is not None
        refs = child["metadata"].get("ownerReferences") or []
        assert [(r["kind"], r["name"], r["uid"], r.get("controller")) for r in refs] == [
            ("BrokerGroup", "orders", uid, True)], child["metadata"]["name"]

    spec = parse_spec(env.spec(), name="orders")
    expected = encode_zk_config(spec=spec, group="orders", namespace=NS)
    await eventually(lambda: env.admin.exists("/groups/orders/config"), what="ZK config")
    assert env.admin.get("/groups/orders/config")[0] == expected
    assert GroupConfig.from_json(expected).master.name == "orders-0"

    ready = await eventually(
        lambda: (c := env.condition("orders", "Ready")) and c["status"] == "True" and c,
        what="Ready=True")
    assert ready["reason"] == "Ready"
    status = env.must_bg("orders")["status"]
    assert status["observedGeneration"] == 1
    assert status["mode"] == "NORMAL"
    assert status["readable"] is True
    # Ready needs the master reading; the slave's status may reach the operator one refresh
    # later (each broker publishes its own, about once a second).
    await eventually(
        lambda: [b["effectivePermission"] for b in env.must_bg("orders")["status"]["brokers"]]
        == ["FULL", "NONE"], what="both brokers' permissions in the status")
    assert "understudy.io/finalizer" in env.must_bg("orders")["metadata"]["finalizers"]

    # The operator runs in its own thread: the gauge is set right after the status patch
    # this test just saw, so give it that moment rather than racing it.
    text = await eventually(
        lambda: (t := metrics_text(env.metrics))
        and f"{metric_names.OPERATOR_LEADING_GROUPS} 1.0" in t and t,
        what="the leading-groups gauge at 1")
    assert f'{metric_names.OPERATOR_RECONCILE_DURATION_SECONDS}_count{{handler="reconcile"}}' \
        in text
    assert 'understudy_group_mode{group="orders"} 0.0' in text


def metrics_text(metrics: OperatorMetrics) -> str:
    return generate_latest(metrics.registry).decode()


async def test_bad_spec_reports_condition_and_event_and_applies_nothing(env: Env) -> None:
    await env.create("broken", env.spec(slaves=2, permission="EVERYTHING",
                                        replication={"minInSyncReplicas": 3}))
    cond = await eventually(lambda: env.condition("broken", "Ready"), what="a Ready condition")
    assert cond["status"] == "False"
    assert cond["reason"] == "InvalidSpec"
    assert "spec.permission: 'EVERYTHING'" in cond["message"]
    assert "spec.replication.minInSyncReplicas: 3 is more than spec.slaves (2)" \
        in cond["message"]
    events = await eventually(lambda: [e for e in env.events("broken")
                                       if e["reason"] == "InvalidSpec"], what="the Event")
    assert events[0]["type"] == "Warning"
    await asyncio.sleep(1.0)  # several status ticks: still nothing may appear
    assert env.w.get("apps/v1/statefulsets", "broken") is None
    assert env.w.get("v1/configmaps", "broken-config") is None
    assert not [s for s in env.w.objects("v1/services")
                if s["metadata"]["name"].startswith("broken")]
    assert env.admin.exists("/groups/broken") is None


async def ready_group(env: Env, name: str, **spec: Any) -> None:
    await env.create(name, env.spec(**spec))
    await eventually(lambda: (c := env.condition(name, "Ready")) and c["status"] == "True",
                     within=30, what=f"{name} Ready")


async def test_pod_status_drives_failover_and_failback(env: Env) -> None:
    await ready_group(env, "pay")
    url = f"{env.zk_connect}{env.chroot}"
    epoch0 = env.state("pay").epoch

    await env.w.kill("pay-0")  # container terminated: a certain death
    state = await eventually(lambda: (s := env.state("pay")) and s.mode is Mode.SLAVE_CONSUME
                             and s, what="SLAVE_CONSUME")
    assert state.acting == "pay-1"
    status = await eventually(
        lambda: (st := (env.bg("pay") or {}).get("status", {})).get("mode") == "SLAVE_CONSUME"
        and st.get("acting") == "pay-1" and st.get("readable") and st, what="status")
    assert status["lastFailover"]["masterDown"] is not None
    assert env.must_condition("pay", "FailoverInProgress")["status"] == "True"
    assert env.must_condition("pay", "ReadAvailable")["reason"] == "ActingSlaveReading"
    changes = await eventually(lambda: [e["message"] for e in env.events("pay")
                                        if e["reason"] == "ModeChanged"
                                        and "SLAVE_CONSUME" in e["message"].split(":")[0]],
                               what="a ModeChanged Event for SLAVE_CONSUME")
    assert "pay-1" in changes[0]

    await env.w.revive("pay-0", "pay", url)  # the kubelet restarts the container
    final = await eventually(lambda: (s := env.state("pay")) and s.mode is Mode.NORMAL
                             and s.epoch > epoch0 and s, what="NORMAL again")
    assert final.epoch >= epoch0 + 4  # FENCING, SLAVE_CONSUME, RECOVERING, NORMAL
    await eventually(lambda: (c := env.condition("pay", "BackSyncComplete"))
                     and c["status"] == "True" and env.must_bg("pay")["status"]["mode"] == "NORMAL",
                     what="BackSyncComplete")

    def modes() -> list[str]:
        return [e["message"].split(":")[0] for e in env.events("pay") if e["reason"] == "ModeChanged"]

    # Events are posted after the status (kopf's own queue): the last may still be on its way.
    await eventually(lambda: all(any(x in m for m in modes()) for x in (
        "-> FENCING", "-> SLAVE_CONSUME", "-> RECOVERING", "-> NORMAL")), what="a ModeChanged Event per mode")
    times = env.must_bg("pay")["status"]["lastFailover"]
    assert times["normalAgain"] is not None
    assert times["masterBack"] is not None


async def test_rollout_restarts_slaves_first_then_master_through_planned_handoff(
        env: Env) -> None:
    await ready_group(env, "roll", slaves=2)
    sts = env.w.must("apps/v1/statefulsets", "roll")
    old_rev = revision_of(sts)
    env.k.deleted_pods.clear()
    await env.patch_spec("roll", {"image": "understudy/broker:2"})

    def rolled() -> bool:
        pods = [p for p in env.w.objects("v1/pods")
                if p["metadata"]["name"].startswith("roll-")]
        sts_now = env.w.must("apps/v1/statefulsets", "roll")
        rev = (sts_now.get("status") or {}).get("updateRevision")
        return bool(rev != old_rev and len(pods) == 3 and all(
            p["metadata"]["labels"]["controller-revision-hash"] == rev for p in pods))

    await eventually(rolled, within=60, what="every pod at the new revision")
    final = await eventually(lambda: (s := env.state("roll")) and s.mode is Mode.NORMAL and s,
                             within=30, what="NORMAL after the rollout")
    assert env.k.deleted_pods == ["roll-2", "roll-1", "roll-0"]

    # The mode history from the operator's ModeChanged Events (mode_changes); they are
    # posted from kopf's own queue, so wait for the last one.
    seen = await eventually(lambda: (h := mode_changes(env.w, "roll")) and final.epoch in h and h,
                            what="a ModeChanged Event for the final NORMAL")
    modes = [seen[e] for e in sorted(seen)]
    # The master was fenced by the planned handoff; reads then went to a slave (written by the
    # handoff, or by the controller if it saw the master's container exit first); the
    # master's return was an ordinary back-sync.
    kinds = [m for m, _ in modes]
    fence = next((i for i, (m, r) in enumerate(modes)
                  if m == "FENCING" and r.startswith("planned handoff")), None)
    assert fence is not None, modes
    assert kinds[fence:] == ["FENCING", "SLAVE_CONSUME", "RECOVERING", "NORMAL"], modes
    assert sorted(seen)[fence:] == list(range(final.epoch - 3, final.epoch + 1)), seen
    consume = modes[fence + 1]
    assert "roll-1" in consume[1] or "roll-2" in consume[1], consume
    steps = [e["message"] for e in env.events("roll") if e["reason"] == "RollingUpdate"]
    assert [s.split(" ")[0] for s in steps[:2]] == ["restarting", "restarting"]
    assert steps[-1].startswith("planned handoff")


async def test_scale_up_and_down_updates_zk_config_services_and_statefulset(env: Env) -> None:
    await ready_group(env, "sc", slaves=1)

    def brokers() -> list[str]:
        return [b.name for b in GroupConfig.from_json(env.admin.get("/groups/sc/config")[0])
                .brokers]

    await env.patch_spec("sc", {"slaves": 2})
    await eventually(lambda: brokers() == ["sc-0", "sc-1", "sc-2"], what="3 brokers in ZK")
    await eventually(lambda: env.w.must("apps/v1/statefulsets", "sc")["spec"]["replicas"] == 3
                     and env.w.get("v1/services", "sc-2") is not None, what="scaled up")
    await eventually(lambda: (c := env.condition("sc", "Ready")) and c["status"] == "True"
                     and env.must_bg("sc")["status"]["readyBrokers"] == "3/3", what="3/3 ready")

    await env.patch_spec("sc", {"slaves": 1})
    await eventually(lambda: brokers() == ["sc-0", "sc-1"], what="2 brokers in ZK")
    await eventually(lambda: env.w.must("apps/v1/statefulsets", "sc")["spec"]["replicas"] == 2
                     and env.w.get("v1/services", "sc-2") is None, what="scaled down")
    await eventually(lambda: env.admin.exists("/groups/sc/status/sc-2") is None,
                     what="the removed broker's status pruned")
    assert env.admin.exists("/groups/sc/status/sc-1") is not None
    assert any(e["reason"] == "Scaled" for e in env.events("sc"))


async def test_scale_down_waits_while_the_removed_slave_acts_for_reads(env: Env) -> None:
    # sd-1 may not read, so sd-2 acts; scaling to one slave would remove it.
    await ready_group(env, "sd", slaves=2, brokers=[{"ordinal": 1, "permission": "NONE"}])
    await env.w.kill("sd-0")
    await eventually(lambda: (s := env.state("sd")) and s.mode is Mode.SLAVE_CONSUME,
                     what="SLAVE_CONSUME")
    acting = env.state("sd").acting
    assert acting == "sd-2"
    await env.patch_spec("sd", {"slaves": 1, "brokers": None})
    await eventually(lambda: any(e["reason"] == "ScaleDeferred" for e in env.events("sd")),
                     what="a ScaleDeferred Event")
    assert env.w.must("apps/v1/statefulsets", "sd")["spec"]["replicas"] == 3
    assert env.state("sd").acting == acting


async def test_delete_removes_zookeeper_nodes_and_pvcs_when_asked(env: Env) -> None:
    await ready_group(env, "gone")
    await ready_group(env, "kept", storage={"retentionOnDelete": "Retain"})
    for group in ("gone", "kept"):
        for ordinal in range(2):
            await env.w.api("POST", f"/api/v1/namespaces/{NS}/persistentvolumeclaims", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"data-{group}-{ordinal}", "namespace": NS},
                "spec": {}})
    assert env.admin.exists("/controllers/gone") is not None
    for group in ("gone", "kept"):
        await env.w.api("DELETE",
                        f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokergroups/{group}")
    await eventually(lambda: env.bg("gone") is None and env.bg("kept") is None, within=30,
                     what="both BrokerGroups gone (finalizers released)")
    for group in ("gone", "kept"):
        assert env.admin.exists(f"/groups/{group}") is None
        assert env.admin.exists(f"/controllers/{group}") is None
    claims = sorted(c["metadata"]["name"] for c in env.w.objects("v1/persistentvolumeclaims"))
    assert claims == ["data-kept-0", "data-kept-1"]


def gauge(metrics: OperatorMetrics, name: str) -> float | None:
    value = metrics.registry.get_sample_value(name)
    return None if value is None else float(value)


async def test_two_operator_replicas_one_decides_and_the_other_takes_over(
        cluster: Env) -> None:
    env = cluster
    metrics_b = OperatorMetrics()
    async with operator(env.w.base, identity="op-a", metrics=env.metrics):
        await ready_group(env, "duo")
        await eventually(lambda: gauge(env.metrics, metric_names.OPERATOR_LEADING_GROUPS) == 1,
                         what="op-a leads")
        async with operator(env.w.base, identity="op-b", metrics=metrics_b):
            await eventually(lambda: len(env.admin.get_children("/controllers/duo")) == 2,
                             what="both replicas in the election")
            await asyncio.sleep(1.5)  # several status ticks of both replicas
            assert gauge(metrics_b, metric_names.OPERATOR_LEADING_GROUPS) == 0
            assert gauge(env.metrics, metric_names.OPERATOR_LEADING_GROUPS) == 1
            # Only the leader exports the group's series.
            assert metrics_b.registry.get_sample_value(
                "understudy_group_mode", {"group": "duo"}) is None
            # op-a resigns (its ZooKeeper session closes): op-b leads and decides.
            await stop_first(env)
            await eventually(lambda: gauge(metrics_b, metric_names.OPERATOR_LEADING_GROUPS) == 1,
                             what="op-b leads")
            await env.w.kill("duo-0")
            await eventually(lambda: (s := env.state("duo")) and s.mode is Mode.SLAVE_CONSUME,
                             what="op-b fails the group over")
            await eventually(lambda: (env.bg("duo") or {}).get("status", {}).get("mode")
                             == "SLAVE_CONSUME", what="op-b patches the status")


async def stop_first(env: Env) -> None:
    """Stop the replica named op-a (started first) while op-b keeps running."""
    (thread,) = [t for t in threading.enumerate() if t.name == "operator-op-a"]
    thread.stop_flag.set()  # type: ignore[attr-defined]
    await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive()


async def test_the_operator_command_serves_health_and_metrics_and_stops_on_sigterm(
        cluster: Env, tmp_path: Any) -> None:
    env = cluster
    metrics_port, health_port = free_port(), free_port()
    proc = Process("operator", [
        *UNDERSTUDY, "operator", "-n", NS, "--no-scanning",
        "--server", env.w.base, "--zk", f"{env.zk_connect}{env.chroot}",
        "--listen", "127.0.0.1", "--metrics-port", str(metrics_port),
        "--health-port", str(health_port), "--status-interval", "0.5",
        "--log-level", "info"], tmp_path / "operator.log").start(wait_port=False)
    try:
        async with aiohttp.ClientSession() as http:
            async def get(port: int, path: str) -> tuple[int, str]:
                async with http.get(f"http://127.0.0.1:{port}{path}") as resp:
                    return resp.status, await resp.text()

            async def up() -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    return (await get(health_port, "/healthz"))[0] == 200
                return False

            deadline = time.monotonic() + 30
            while not await up():
                assert proc.poll() is None, proc.log()
                assert time.monotonic() < deadline, "no /healthz within 30 s"
                await asyncio.sleep(0.2)
            # No spec.zookeeper.connect: the operator's --zk (and its chroot) is the default.
            spec = env.spec()
            del spec["zookeeper"]
            await env.create("cli", spec)
            await eventually(lambda: (c := env.condition("cli", "Ready")) and c["status"] == "True",
                             within=30, what="Ready via the CLI operator")
            status, text = await get(metrics_port, "/metrics")
            assert status == 200
            for name in (f"{metric_names.OPERATOR_RECONCILE_DURATION_SECONDS}_bucket",
                         metric_names.OPERATOR_LEADING_GROUPS,
                         metric_names.OPERATOR_DECISIONS_TOTAL, metric_names.GROUP_MODE):
                assert name in text, name
        assert await asyncio.to_thread(proc.stop, timeout_s=30) == 0  # SIGTERM: a clean exit
    finally:
        proc.kill9()


async def test_a_bad_update_keeps_the_running_group_as_it_was(env: Env) -> None:
    await ready_group(env, "keep")
    before = env.w.must("apps/v1/statefulsets", "keep")
    config = env.admin.get("/groups/keep/config")[0]
    await env.patch_spec("keep", {"slaves": 99, "image": "understudy/broker:2"})
    cond = await eventually(
        lambda: (c := env.condition("keep", "Ready")) and c["reason"] == "InvalidSpec" and c,
        what="InvalidSpec after the update")
    assert "spec.slaves: 99 is out of range [0, 15]" in cond["message"]
    await eventually(lambda: env.must_bg("keep")["status"]["observedGeneration"] == 2,
                     what="the rejected generation observed")
    await asyncio.sleep(1.0)  # status ticks and rollout ticks: nothing may move
    after = env.w.must("apps/v1/statefulsets", "keep")
    assert after["spec"] == before["spec"]
    assert env.admin.get("/groups/keep/config")[0] == config
    assert env.k.deleted_pods == []
    assert env.state("keep").mode is Mode.NORMAL


async def test_a_corrupt_state_znode_is_reported_and_nothing_crashes(env: Env) -> None:
    await ready_group(env, "bad-zk")
    good, _ = env.admin.get(state_path("bad-zk"))
    env.admin.set(state_path("bad-zk"), b"\x00 not json")
    cond = await eventually(
        lambda: (c := env.condition("bad-zk", "Ready")) and c["reason"] == "NoGroupState" and c,
        what="Ready=False/NoGroupState")
    assert cond["status"] == "False"
    assert env.must_bg("bad-zk")["status"].get("mode") is None  # removed by the merge patch
    env.admin.set(state_path("bad-zk"), good)  # a person repairs it
    await eventually(lambda: (c := env.condition("bad-zk", "Ready")) and c["status"] == "True",
                     what="Ready again after the repair")


async def test_an_unreachable_zookeeper_is_reported_and_nothing_is_applied(env: Env) -> None:
    spec = env.spec()
    spec["zookeeper"] = {"connect": f"127.0.0.1:{free_port()}", "chroot": "/nowhere"}
    await env.create("nozk", spec)
    cond = await eventually(
        lambda: (c := env.condition("nozk", "Ready")) and c["reason"] == "ZooKeeperUnreachable"
        and c, within=30, what="Ready=False/ZooKeeperUnreachable")
    assert "/nowhere unreachable" in cond["message"]
    await eventually(lambda: any(e["reason"] == "ZooKeeperUnreachable"
                                 for e in env.events("nozk")), what="the Warning Event")
    assert env.w.get("apps/v1/statefulsets", "nozk") is None
    assert env.w.get("v1/configmaps", "nozk-config") is None


# --------------------------------------------------------------------------- BrokerTopic


def configure_groups(env: Env, *groups: str) -> None:
    """Group configs in ZooKeeper, as the operator writes them for BrokerGroups."""
    for g in groups:
        env.admin.create(config_path(g), encode_zk_config(
            spec=parse_spec(env.spec(), default_zk_connect=env.zk_connect), group=g,
            namespace=NS), makepath=True)


def topic_doc(env: Env, topic: str) -> TopicDoc | None:
    if env.admin.exists(topic_path(topic)) is None:
        return None
    return TopicDoc.from_json(env.admin.get(topic_path(topic))[0])


def bt_ready(env: Env, name: str, **want: str) -> dict[str, Any] | None:
    """The BrokerTopic's Ready condition, if it has every field in ``want``."""
    status = (env.w.get(BT, name) or {}).get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), None)
    return ready if ready is not None and all(ready.get(k) == v for k, v in want.items()) else None


async def test_brokertopic_is_synced_into_zookeeper_grown_and_refusals_change_nothing(
        env: Env) -> None:
    configure_groups(env, "g1", "g2", "g3")
    zk = {"connect": env.zk_connect, "chroot": env.chroot}
    base = f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokertopics"
    await env.w.api("POST", base, {
        "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerTopic",
        "metadata": {"name": "orders", "namespace": NS},
        "spec": {"groups": ["g1", "g2"], "queuesPerGroup": 2, "zookeeper": zk}})
    await eventually(lambda: bt_ready(env, "orders", status="True"),
                     what="BrokerTopic Ready")
    doc = topic_doc(env, "orders")
    assert doc is not None
    assert doc.queues == ("g1", "g2", "g1", "g2")
    status = env.w.must(BT, "orders")["status"]
    assert (status["topic"], status["queueCount"], status["groups"]) == ("orders", 4, "g1,g2")
    assert status["queues"][1] == {"queue": 1, "group": "g2"}
    assert "understudy.io/finalizer" in env.w.must(BT, "orders")["metadata"]["finalizers"]

    # Grow: a third group and a third queue per group; existing queues stay where they are.
    await env.w.api("PATCH", f"{base}/orders", {"spec": {"groups": ["g1", "g2", "g3"],
                                                          "queuesPerGroup": 3}})
    await eventually(lambda: env.w.must(BT, "orders")["status"]["queueCount"] == 9,
                     what="nine queues in the status")
    grown = topic_doc(env, "orders")
    assert grown is not None
    assert grown.queues[:4] == doc.queues
    assert {g: len(grown.queues_of(g)) for g in ("g1", "g2", "g3")} == {"g1": 3, "g2": 3, "g3": 3}

    # Refusals: an unknown group, then a spec the schema would have stopped (KMock has no
    # schema): Ready=False with the reason, a Warning Event, and ZooKeeper untouched.
    await env.w.api("PATCH", f"{base}/orders", {"spec": {"groups": ["g1", "g2", "g3", "nope"]}})
    refused = await eventually(lambda: bt_ready(env, "orders", reason="Refused"), what="Refused")
    assert "nope" in refused["message"]
    await env.w.api("PATCH", f"{base}/orders", {"spec": {"queuesPerGroup": 0}})
    invalid = await eventually(lambda: bt_ready(env, "orders", reason="InvalidSpec"), what="InvalidSpec")
    assert "queuesPerGroup" in invalid["message"]
    assert topic_doc(env, "orders") == grown

    def reasons() -> set[str]:
        return {e["reason"] for e in env.w.objects("v1/events")
                if e.get("involvedObject", {}).get("kind") == "BrokerTopic"}

    # Events are posted after the status (kopf's own queue): wait for the last one.
    await eventually(lambda: {"TopicCreated", "TopicAltered", "Refused", "InvalidSpec"} <= reasons(),
                     what="an Event for each step")

    # deletionPolicy Retain (the default): the resource goes, the topic stays.
    await env.w.api("DELETE", f"{base}/orders")
    await eventually(lambda: env.w.get(BT, "orders") is None, what="BrokerTopic gone")
    assert topic_doc(env, "orders") == grown


async def test_an_ordered_brokertopic_is_created_with_its_chains_and_deleted_with_them(
        env: Env) -> None:
    """BrokerTopic ``ordered: true``: one queue per group, the topic and its chains in one
    transaction (the code the CLI's broker uses), both gone with a Delete policy; more
    queues per group is an invalid spec (the CRD's CEL rule; KMock has none: the parser's
    own check) and writes nothing."""
    configure_groups(env, "g1", "g2")
    zk = {"connect": env.zk_connect, "chroot": env.chroot}
    base = f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokertopics"
    await env.w.api("POST", base, {
        "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerTopic",
        "metadata": {"name": "wide", "namespace": NS},
        "spec": {"groups": ["g1", "g2"], "ordered": True, "queuesPerGroup": 4,
                 "zookeeper": zk}})
    invalid = await eventually(lambda: (bt_ready(env, "wide") or {}).get("reason")
                               == "InvalidSpec" and bt_ready(env, "wide"), what="InvalidSpec")
    assert "one queue per group" in invalid["message"]
    assert topic_doc(env, "wide") is None
    await env.w.api("POST", base, {
        "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerTopic",
        "metadata": {"name": "ledger", "namespace": NS},
        "spec": {"groups": ["g2", "g1"], "ordered": True, "deletionPolicy": "ForceDelete",
                 "zookeeper": zk}})
    await eventually(lambda: (bt_ready(env, "ledger") or {}).get("status") == "True",
                     what="ledger Ready")
    doc = topic_doc(env, "ledger")
    assert doc == TopicDoc("ledger", ("g2", "g1"), True)
    chains = ChainDoc.from_json(env.admin.get(chains_path("ledger"))[0]).check(("g1", "g2"))
    assert (chains.send, chains.consume_groups()) == (("g2", "g1"), ("g2",))
    await env.w.api("DELETE", f"{base}/ledger")
    await eventually(lambda: env.w.get(BT, "ledger") is None, what="ledger resource gone")
    assert topic_doc(env, "ledger") is None
    assert env.admin.exists(ordered_dir("ledger")) is None


async def test_brokertopic_force_delete_removes_the_topic_and_ordered_is_never_flipped(
        env: Env) -> None:
    configure_groups(env, "g1", "g2")
    zk = {"connect": env.zk_connect, "chroot": env.chroot}
    base = f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokertopics"
    # A topic that exists already (made by the CLI) with ordered=true: the resource that
    # says unordered is refused instead of rewriting it.
    env.admin.create(topic_path("ledger"), TopicDoc("ledger", ("g1",), True).to_json(),
                     makepath=True)
    for name, spec in [("ledger", {"groups": ["g1"], "queuesPerGroup": 1}),
                       ("scratch", {"groups": ["g1", "g2"], "queuesPerGroup": 1,
                                    "deletionPolicy": "ForceDelete"})]:
        await env.w.api("POST", base, {
            "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerTopic",
            "metadata": {"name": name, "namespace": NS}, "spec": {**spec, "zookeeper": zk}})
    ledger = await eventually(lambda: bt_ready(env, "ledger", reason="Refused"), what="ledger refused")
    assert "ordered" in ledger["message"]
    assert topic_doc(env, "ledger") == TopicDoc("ledger", ("g1",), True)
    await eventually(lambda: topic_doc(env, "scratch") is not None, what="scratch created")
    await env.w.api("DELETE", f"{base}/scratch")
    await eventually(lambda: env.w.get(BT, "scratch") is None, what="scratch resource gone")
    assert topic_doc(env, "scratch") is None


async def test_brokertopic_removes_and_deletes_queues_only_once_real_brokers_report_them_drained(
        cluster: Env, two_groups: tuple[Path, ClusterPlan]) -> None:
    """Against a real local cluster (ZooKeeper, two groups of broker processes): the
    operator asks the brokers for the backlog before it removes a queue or deletes a topic,
    and waits (Ready=False/Backlog, DeleteWaiting Events) until a consumer group drains it.
    The operator's default ZooKeeper is the cluster's, so the spec names only the chroot."""
    _directory, plan = two_groups
    boot = [plan.address("g1-0"), plan.address("g2-0")]
    base = f"/apis/understudy.io/v1alpha1/namespaces/{NS}/brokertopics"

    async def drain() -> int:
        c = Consumer(boot, group="audit", topic="drain", max_wait_ms=100)
        got = 0
        try:
            while batch := await c.getmany(timeout_s=1.5):
                got += len(batch)
            await c.commit()
        finally:
            await c.close()
        return got

    async with operator(cluster.w.base, identity="op-t", zk_connect=plan.zk_hosts):
        await cluster.w.api("POST", base, {
            "apiVersion": "understudy.io/v1alpha1", "kind": "BrokerTopic",
            "metadata": {"name": "drain", "namespace": NS},
            "spec": {"groups": ["g1", "g2"], "queuesPerGroup": 1, "deletionPolicy": "Delete",
                     "zookeeper": {"chroot": plan.chroot}}})
        await eventually(lambda: bt_ready(cluster, "drain", status="True"),
                         what="drain Ready")
        async with Producer(boot) as prod:
            for i in range(20):  # unkeyed: round robin over both queues
                await (await prod.send("drain", b"m%d" % i))

        await cluster.w.api("PATCH", f"{base}/drain", {"spec": {"groups": ["g1"]}})
        held = await eventually(lambda: bt_ready(cluster, "drain", reason="Backlog"), what="removal held")
        assert "unconsumed" in held["message"]
        assert cluster.w.must(BT, "drain")["status"]["queueCount"] == 2
        assert await drain() == 20
        await eventually(lambda: cluster.w.must(BT, "drain")["status"]["queueCount"] == 1
                         and bt_ready(cluster, "drain", status="True"),
                         what="g2's queue removed once drained")

        async with Producer(boot) as prod:
            await (await prod.send("drain", b"late"))
        await cluster.w.api("DELETE", f"{base}/drain")
        await eventually(lambda: any(e["reason"] == "DeleteWaiting"
                                     for e in cluster.w.objects("v1/events")),
                         what="a DeleteWaiting Event")
        assert cluster.w.get(BT, "drain") is not None  # held by the finalizer
        assert await drain() == 1
        await eventually(lambda: cluster.w.get(BT, "drain") is None, what="resource gone")
        assert with_gateway(plan.zk_connect, lambda zk: zk.read_topic("drain")) == (None, -1)
