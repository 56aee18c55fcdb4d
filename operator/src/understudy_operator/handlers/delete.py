"""Deleting a BrokerGroup: the finalizer that cleans up what Kubernetes cannot.

Why this module exists: owner references let Kubernetes garbage-collect the group's objects,
but two things live outside its reach. ZooKeeper holds ``/groups/<group>`` (config, state,
statuses) and ``/controllers/<group>``; left behind, they would greet a new group of the same
name with a stale epoch and stale offsets. And the brokers' PersistentVolumeClaims belong to
the StatefulSet's claim templates, not to the BrokerGroup: ``storage.retentionOnDelete: Delete``
must delete them explicitly (not every cluster runs the StatefulSet PVC-retention feature, and
an emulator has no garbage collector at all); ``Retain`` keeps them for a later group.

The order: stop this replica's controller for the group, delete the StatefulSet and the broker
pods, wait (``kopf.TemporaryError``) until no broker pod is left — a running broker would
re-create its status znode — then remove the ZooKeeper nodes and, if asked, the PVCs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from understudy_broker.zklayout import controller_path, group_path
from understudy_operator.handlers.reconcile import parse
from understudy_operator.handlers.runtime import Runtime
from understudy_operator.k8s.builders import selector_labels
from understudy_operator.k8s.kube import PODS, PVCS, SECRETS, STATEFULSETS, KubeError
from understudy_operator.k8s.security import (
    LABEL_SECRET_FOR,
    broker_tls_secret_name,
    group_secret_name,
    zk_digest_secret_name,
)
from understudy_operator.k8s.spec import DEFAULT_CHROOT, PvcRetention, SpecError
from understudy_operator.zk import Digest, ZkError, ZkUnavailable, open_gateway

log = logging.getLogger(__name__)


def _fallback_zk(rt: Runtime, spec: Mapping[str, Any]) -> tuple[str | None, PvcRetention]:
    """ZooKeeper URL and PVC retention from a spec that does not parse (best effort)."""
    zk_raw = spec.get("zookeeper")
    zk: Mapping[str, Any] = zk_raw if isinstance(zk_raw, Mapping) else {}
    connect = zk.get("connect") if isinstance(zk.get("connect"), str) else rt.config.zk_connect
    chroot = zk.get("chroot") if isinstance(zk.get("chroot"), str) else (
        rt.config.zk_chroot or DEFAULT_CHROOT)
    storage_raw = spec.get("storage")
    storage: Mapping[str, Any] = storage_raw if isinstance(storage_raw, Mapping) else {}
    retention = (PvcRetention.DELETE if storage.get("retentionOnDelete") == "Delete"
                 else PvcRetention.RETAIN)
    return (f"{connect}{chroot}" if connect else None), retention


async def finalize(rt: Runtime, *, body: Mapping[str, Any]) -> str:
    """The on-delete handler body; returns a summary (kopf logs it). API errors are retried
    in seconds; the finalizer stays until everything is done."""
    try:
        return await _finalize(rt, body=body)
    except KubeError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc


async def _finalize(rt: Runtime, *, body: Mapping[str, Any]) -> str:
    meta = body.get("metadata", {})
    namespace, name = str(meta["namespace"]), str(meta["name"])
    raw_spec = body.get("spec") or {}
    url: str | None
    try:
        spec = parse(rt, raw_spec, name)
        url, retention = spec.zookeeper.url, spec.storage.retention_on_delete
    except SpecError:
        url, retention = _fallback_zk(rt, raw_spec)

    handle = rt.groups.pop((namespace, name), None)
    if handle is not None:
        await handle.stop()

    await rt.kube.delete(STATEFULSETS, namespace=namespace, name=name)
    pods = await rt.kube.list(PODS, namespace=namespace, labels=selector_labels(name))
    for pod in pods:
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            await rt.kube.delete(PODS, namespace=namespace, name=pod["metadata"]["name"])
    left = [p["metadata"]["name"]
            for p in await rt.kube.list(PODS, namespace=namespace, labels=selector_labels(name))]
    if left:
        raise kopf.TemporaryError(f"waiting for broker pods to stop: {', '.join(left)}", delay=2)

    done = []
    if url is not None:
        try:
            done.append(await delete_group_nodes(url=url, group=name, namespace=namespace,
                                                 digest=rt.config.zk_digest))
        except (ZkError, ZkUnavailable) as exc:
            raise kopf.TemporaryError(f"cannot remove ZooKeeper nodes: {exc}", delay=5) from exc
    else:
        done.append("no ZooKeeper known for the group; nothing removed there")

    if retention is PvcRetention.DELETE:
        prefix = f"data-{name}-"
        claims = [c for c in await rt.kube.list(PVCS, namespace=namespace)
                  if str(c.get("metadata", {}).get("name", "")).startswith(prefix)
                  and str(c["metadata"]["name"])[len(prefix):].isdigit()]
        for claim in claims:
            await rt.kube.delete(PVCS, namespace=namespace, name=claim["metadata"]["name"])
        done.append(f"deleted {len(claims)} PersistentVolumeClaim(s)")
    else:
        done.append("kept the PersistentVolumeClaims (retentionOnDelete: Retain)")
    # Owner references let Kubernetes collect the group's Secrets; deleting them here does
    # not wait for the garbage collector (and a name reused at once starts clean).
    gone = 0
    for secret in (broker_tls_secret_name(name), group_secret_name(name),
                   zk_digest_secret_name(name)):
        found = await rt.kube.get(SECRETS, namespace=namespace, name=secret)
        labels = ((found or {}).get("metadata") or {}).get("labels") or {}
        if found is not None and labels.get(LABEL_SECRET_FOR) == f"BrokerGroup.{name}":
            await rt.kube.delete(SECRETS, namespace=namespace, name=secret)
            gone += 1
    if gone:
        done.append(f"deleted {gone} Secret(s)")
    rt.metrics.decision(name, "deleted")
    summary = "; ".join(done)
    log.info("group %s/%s deleted: %s", namespace, name, summary)
    return summary


async def delete_group_nodes(*, url: str, group: str, namespace: str,
                             timeout_s: float = 10.0, digest: Digest | None = None) -> str:
    """Remove ``/groups/<group>`` and ``/controllers/<group>`` (recursively) under ``url``'s
    chroot, unless the stored config names brokers of another namespace (a same-named group
    elsewhere). Returns what was done, in words; raises :data:`ZkError` or
    :class:`ZkUnavailable` when ZooKeeper cannot be reached."""
    async with open_gateway(url, timeout_s=timeout_s, connect_timeout_s=timeout_s,
                            digest=digest) as zk:
        cfg = await zk.read_config(group)
        if cfg is not None:
            foreign = [b.host for b in cfg.brokers if not b.host.endswith(f".{namespace}.svc")]
            if foreign:
                return (f"kept {group_path(group)}: its config belongs to brokers outside "
                        f"namespace {namespace} ({', '.join(foreign)})")
        await zk.delete_group(group)
    return f"deleted {group_path(group)} and {controller_path(group)}"
