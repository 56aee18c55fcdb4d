"""The operator's only door to the Kubernetes API.

Why this module exists: kopf's architecture says only the clients talk to the API; the
handlers parse, plan, call this module and patch status. Keeping every request here means one
place decides how objects are applied (GET, then POST or a JSON merge PATCH — never PUT, so the
same code runs against a real API server and against the KMock emulator), how errors look
(:class:`KubeError` with the API's own status, reason and message) and how label selectors are
honoured (also filtered on the client side, because an emulator may ignore them).

It is a small asynchronous client over aiohttp built from a :class:`kopf.ConnectionInfo`, the
same credentials kopf logs in with, so the operator needs no second Kubernetes library at run
time. Objects are plain dicts, as the pure builders produce them.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
import kopf

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """An API request failed; ``status`` is the HTTP status (0 when the server was not
    reached), ``reason`` and ``message`` come from the API's ``Status`` object."""

    def __init__(self, *, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Resource:
    """An API resource: where its objects live in the URL space."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


BROKERGROUPS: Final = Resource("understudy.io", "v1alpha1", "brokergroups", "BrokerGroup")
BROKERTOPICS: Final = Resource("understudy.io", "v1alpha1", "brokertopics", "BrokerTopic")
BROKERUSERS: Final = Resource("understudy.io", "v1alpha1", "brokerusers", "BrokerUser")
SECRETS: Final = Resource("", "v1", "secrets", "Secret")
NETWORKPOLICIES: Final = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
CONFIGMAPS: Final = Resource("", "v1", "configmaps", "ConfigMap")
SERVICES: Final = Resource("", "v1", "services", "Service")
PODS: Final = Resource("", "v1", "pods", "Pod")
PVCS: Final = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
EVENTS: Final = Resource("", "v1", "events", "Event")
STATEFULSETS: Final = Resource("apps", "v1", "statefulsets", "StatefulSet")
PDBS: Final = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
SERVICEMONITORS: Final = Resource("monitoring.coreos.com", "v1", "servicemonitors",
                                  "ServiceMonitor")
CRDS: Final = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                       "CustomResourceDefinition", namespaced=False)

BY_KIND: Final[Mapping[str, Resource]] = {
    r.kind: r
    for r in (BROKERGROUPS, BROKERUSERS, CONFIGMAPS, SERVICES, PODS, PVCS, EVENTS, STATEFULSETS,
              PDBS, SERVICEMONITORS, CRDS, SECRETS, NETWORKPOLICIES)
}

SERVICEMONITOR_CRD: Final = "servicemonitors.monitoring.coreos.com"

#: Fields of an existing StatefulSet that the API server refuses to change; a patch leaves
#: them out (a changed storage size needs a new group, see docs/operator.md).
IMMUTABLE_STATEFULSET_FIELDS: Final = ("selector", "serviceName", "volumeClaimTemplates",
                                       "podManagementPolicy")


def resource_of(obj: Mapping[str, Any]) -> Resource:
    """The resource of a built object (by ``kind``); :class:`KubeError` for an unknown kind."""
    kind = str(obj.get("kind", ""))
    try:
        return BY_KIND[kind]
    except KeyError:
        raise KubeError(status=0, reason="UnknownKind",
                        message=f"the operator has no resource for kind {kind!r}") from None


def is_subset(desired: Any, current: Any) -> bool:
    """Whether ``current`` already holds everything in ``desired`` (dicts compared key by
    key, lists and scalars by equality): then merge-patching ``desired`` would change nothing.
    A ``None`` in ``desired`` means "absent" (merge-patch semantics) and matches a missing key."""
    if isinstance(desired, Mapping):
        return isinstance(current, Mapping) and all(
            (current.get(k) is None) if v is None else (k in current and is_subset(v, current[k]))
            for k, v in desired.items()
        )
    return bool(desired == current)


def matches_labels(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True, slots=True)
class Applied:
    """What :meth:`KubeClient.apply` did: ``created``, ``patched`` or ``unchanged``."""

    action: str
    object: dict[str, Any]


class KubeClient:
    """An asynchronous Kubernetes API client for the operator's few verbs."""

    def __init__(self, info: kopf.ConnectionInfo, *, timeout_s: float = 10.0) -> None:
        self._info = info
        self._server = info.server.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @property
    def info(self) -> kopf.ConnectionInfo:
        """The credentials this client (and kopf, through its login handler) uses."""
        return self._info

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ssl: Any = None
            if self._server.startswith("https://"):
                ssl = self._info.as_ssl_context()
            self._session = aiohttp.ClientSession(
                headers=self._info.as_http_headers(),
                connector=aiohttp.TCPConnector(ssl=ssl) if ssl is not None else None,
                timeout=self._timeout,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, *, body: Any = None,
                       content_type: str = "application/json",
                       params: Mapping[str, str] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        try:
            async with self._http().request(method, self._server + path, data=data,
                                            headers=headers, params=params) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise _error(resp.status, text)
        except aiohttp.ClientError as exc:
            raise KubeError(status=0, reason="Unreachable",
                            message=f"{method} {path}: {exc!r}") from exc
        except TimeoutError as exc:
            raise KubeError(status=0, reason="Timeout", message=f"{method} {path}") from exc
        if not text:
            return {}
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KubeError(status=resp.status, reason="BadResponse",
                            message=f"{method} {path}: not JSON: {text[:200]!r}") from exc
        return doc if isinstance(doc, dict) else {}

    # ------------------------------------------------------------------ verbs

    async def get(self, res: Resource, *, namespace: str | None, name: str
                  ) -> dict[str, Any] | None:
        """The object, or ``None`` when it does not exist."""
        try:
            return await self._request("GET", res.path(namespace=namespace, name=name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, res: Resource, *, namespace: str | None,
                   labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Objects of ``res`` in ``namespace`` whose labels include ``labels``."""
        params = None
        if labels:
            params = {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}
        doc = await self._request("GET", res.path(namespace=namespace), params=params)
        items = doc.get("items") or []
        return [i for i in items
                if isinstance(i, dict) and (not labels or matches_labels(i, labels))]

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        res = resource_of(obj)
        ns = obj.get("metadata", {}).get("namespace")
        return await self._request("POST", res.path(namespace=ns), body=obj)

    async def patch(self, res: Resource, *, namespace: str | None, name: str,
                    patch: Mapping[str, Any], subresource: str | None = None
                    ) -> dict[str, Any]:
        """A JSON merge patch (``None`` values remove keys)."""
        return await self._request(
            "PATCH", res.path(namespace=namespace, name=name, subresource=subresource),
            body=patch, content_type="application/merge-patch+json")

    async def delete(self, res: Resource, *, namespace: str | None, name: str
                     ) -> dict[str, Any] | None:
        """Delete; returns the API's answer (the object, possibly with a
        ``deletionTimestamp``), or ``None`` when it was already gone."""
        try:
            return await self._request("DELETE", res.path(namespace=namespace, name=name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def exists(self, res: Resource, *, namespace: str | None, name: str) -> bool:
        return await self.get(res, namespace=namespace, name=name) is not None

    # ------------------------------------------------------------------ compound

    async def apply(self, obj: Mapping[str, Any]) -> Applied:
        """Create ``obj`` or bring the existing object up to it with a merge patch; no write
        at all when nothing would change."""
        res = resource_of(obj)
        meta = obj.get("metadata", {})
        ns, name = meta.get("namespace"), str(meta.get("name"))
        current = await self.get(res, namespace=ns, name=name)
        if current is None:
            try:
                return Applied("created", await self.create(obj))
            except KubeError as exc:
                if exc.status != 409:  # created meanwhile (another replica): patch below
                    raise
                current = await self.get(res, namespace=ns, name=name) or {}
        desired = dict(obj)
        if res is STATEFULSETS and isinstance(desired.get("spec"), Mapping):
            desired["spec"] = {k: v for k, v in desired["spec"].items()
                               if k not in IMMUTABLE_STATEFULSET_FIELDS}
        if is_subset(desired, current):
            return Applied("unchanged", current)
        return Applied("patched", await self.patch(res, namespace=ns, name=name, patch=desired))

    async def patch_status(self, res: Resource, *, namespace: str, name: str,
                           status: Mapping[str, Any]) -> dict[str, Any]:
        return await self.patch(res, namespace=namespace, name=name,
                                patch={"status": dict(status)}, subresource="status")

    async def post_event(self, *, involved: Mapping[str, Any], type_: str, reason: str,
                         message: str, component: str = "understudy-operator"
                         ) -> dict[str, Any]:
        """A core/v1 Event about ``involved`` (a full object with apiVersion, kind and
        metadata). Message is cut to the API's 1 KiB limit."""
        meta = involved.get("metadata", {})
        ns = meta.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'x')}.{uuid.uuid4().hex[:16]}",
                         "namespace": ns},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return await self.create(event)


def _error(status: int, text: str) -> KubeError:
    reason, message = "", text[:500]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        reason = str(doc.get("reason") or "")
        message = str(doc.get("message") or message)[:500]
    return KubeError(status=status, reason=reason or "Error", message=message)
