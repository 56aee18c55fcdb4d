"""The BrokerGroup status: gathered from ZooKeeper and pods, computed by ``compute_status``,
patched only by the operator replica that leads the group.

Why this module exists: ``kubectl get bg`` is how people watch a failover, so the status must
follow the group's ZooKeeper state closely — refreshed by a kopf timer every few seconds and at
once after every transition the controller writes — and two operator replicas must never fight
over it: only the leader of the group's controller election patches it. Mode changes are also
announced as Events from here (the leader writes the transition, so it tells).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from understudy_broker.model import GroupState, Mode
from understudy_broker.zklayout import state_path
from understudy_operator.handlers import events
from understudy_operator.handlers.reconcile import parse, spec_error_text
from understudy_operator.handlers.runtime import GroupHandle, Runtime
from understudy_operator.k8s.builders import selector_labels
from understudy_operator.k8s.kube import BROKERGROUPS, PODS, KubeError, is_subset
from understudy_operator.k8s.podliveness import pod_ready
from understudy_operator.k8s.spec import SpecError
from understudy_operator.k8s.status import BrokerObservation, FailoverTimes, compute_status
from understudy_operator.k8s.zkconfig import broker_name
from understudy_operator.zk import ZkError

log = logging.getLogger(__name__)


def advance_failover_times(prev: FailoverTimes | None, old: GroupState | None,
                           new: GroupState | None) -> FailoverTimes | None:
    """The last failover's milestones after seeing ``old`` become ``new`` (pure). A new
    outage starts when the group leaves NORMAL; each later mode stamps its milestone with
    the state's ``since``."""
    if new is None or old is None or new.epoch == old.epoch:
        return prev
    at = datetime.fromtimestamp(new.since, UTC)
    if old.mode is Mode.NORMAL and new.mode is not Mode.NORMAL:
        return FailoverTimes(master_down=at)
    times = prev or FailoverTimes()
    if new.mode is Mode.SLAVE_CONSUME and times.reads_restored is None:
        return replace(times, reads_restored=at)
    if new.mode is Mode.RECOVERING:
        return replace(times, master_back=at)
    if new.mode is Mode.NORMAL:
        return replace(times, normal_again=at)
    return times


async def refresh(rt: Runtime, handle: GroupHandle, body: Mapping[str, Any] | None = None
                  ) -> dict[str, Any] | None:
    """Recompute the status and patch it when it changed; a no-op unless this replica leads
    the group. Returns the computed status (``None`` when not leading or the object is gone)."""
    if not handle.leading:
        return None
    async with handle.status_lock:
        if body is None:
            fetched = await rt.kube.get(BROKERGROUPS, namespace=handle.namespace,
                                        name=handle.name)
            if fetched is None:
                return None
            body = fetched
        spec_error: str | None = None
        try:
            parse(rt, body.get("spec") or {}, handle.name)
        except SpecError as exc:
            spec_error = spec_error_text(exc)
        spec_error = spec_error or handle.spec_problem
        spec = handle.spec
        name = handle.name
        state, _ = await handle.zk.read_state(name)
        names = [broker_name(name, o) for o in range(spec.replicas)]
        obs = await handle.zk.observe_group(name, names)
        for gone in await handle.zk.prune_statuses(name, set(names)):
            log.info("group %s/%s: removed the status of scaled-away broker %s",
                     handle.namespace, name, gone)
        pods = {
            str(p.get("metadata", {}).get("name")): p
            for p in await rt.kube.list(PODS, namespace=handle.namespace,
                                        labels=selector_labels(name))
        }
        for pod in pods.values():
            handle.liveness.observe(pod)
        master = obs.view(names[0]).status
        brokers = []
        for ordinal, bname in enumerate(names):
            view = obs.view(bname)
            st = view.status
            lag = None
            if ordinal and st is not None and master is not None:
                lag = max(0, master.max_offset - st.max_offset)
            bpod = pods.get(bname)
            brokers.append(BrokerObservation(
                name=bname, ordinal=ordinal, configured=spec.permission_of(ordinal),
                # A broker without a live node publishes nothing: its last status is stale
                # (a dead master's says FULL forever), so its permission is unknown.
                effective=st.effective if st is not None and view.zk_live else None,
                live=view.zk_live,
                ready=bpod is not None and pod_ready(bpod), replication_lag_bytes=lag))
        handle.failover_times = advance_failover_times(handle.failover_times, handle.last_mode,
                                                       state)
        handle.last_mode = state
        previous = body.get("status") or {}
        # A rejected spec was observed too (its problems are in the Ready condition); otherwise
        # the status describes the last generation applied.
        latest = int(body.get("metadata", {}).get("generation") or 0)
        generation = latest if spec_error is not None else (handle.generation or latest)
        status = compute_status(generation=generation, state=state, brokers=brokers,
                                previous=previous, now=datetime.now(UTC),
                                last_failover=handle.failover_times, spec_error=spec_error)
        if not is_subset(status, previous):
            try:
                await rt.kube.patch_status(BROKERGROUPS, namespace=handle.namespace,
                                           name=name, status=status)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                return None
        return status


async def announce_transition(rt: Runtime, handle: GroupHandle, old: GroupState,
                              new: GroupState) -> None:
    """An Event for a mode change this replica wrote, the decision metric, a status refresh."""
    rt.metrics.decision(handle.name, f"mode-{new.mode.name.lower()}")
    acting = f", acting {new.acting}" if new.acting else ""
    await events.post(
        rt, handle.owner, type_="Normal" if new.mode is Mode.NORMAL else "Warning",
        reason="ModeChanged",
        message=f"{old.mode.name}/{old.epoch} -> {new.mode.name}/{new.epoch}{acting}: "
                f"{new.reason}")
    try:
        await refresh(rt, handle)
    except KubeError as exc:
        log.warning("group %s/%s: status refresh after a transition failed: %s",
                    handle.namespace, handle.name, exc)


def on_transition(rt: Runtime) -> Any:
    """The controller's transition callback (runs on the loop, must not block)."""

    def callback(handle: GroupHandle, old: GroupState, new: GroupState) -> None:
        log.warning("group %s/%s: %s/%d -> %s/%d acting=%s: %s", handle.namespace, handle.name,
                    old.mode.name, old.epoch, new.mode.name, new.epoch, new.acting or "-",
                    new.reason)
        handle.spawn(announce_transition(rt, handle, old, new),
                     name=f"announce-{handle.name}-{new.epoch}")

    return callback


def watch_state(rt: Runtime, handle: GroupHandle) -> None:
    """Refresh the status whenever the group's ``state`` znode changes, whoever wrote it (the
    controller, a planned handoff, a person's override), not only on the timer. Armed once."""
    if handle.state_watch_armed:
        return
    handle.state_watch_armed = True

    def spawn_refresh(_data: bytes | None) -> None:
        if handle.leading and not handle.status_lock.locked():
            handle.spawn(_refresh_logged(rt, handle), name=f"status-{handle.name}")

    handle.spawn(handle.zk.data_watch(state_path(handle.name), spawn_refresh),
                 name=f"watch-state-{handle.name}")


async def _refresh_logged(rt: Runtime, handle: GroupHandle) -> None:
    try:
        await refresh(rt, handle)
    except (ZkError, KubeError) as exc:
        log.warning("group %s/%s: status refresh after a state change failed: %r",
                    handle.namespace, handle.name, exc)
