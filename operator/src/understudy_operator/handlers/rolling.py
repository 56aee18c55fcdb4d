"""Applying rollout steps: gather facts, ask the pure planner, delete one pod (or hand off).

Why this module exists: with ``updateStrategy: OnDelete`` a new StatefulSet revision reaches a
broker only when its pod is deleted, and the order matters (``understudy_operator.k8s.rollout``).
This module is the thin I/O around that planner, run by the leader of the group only.

The planned handoff of the master, step by step, and why each is safe:

1. mark the master's pod as terminating in the group's liveness source, then delete the pod —
   from this moment the controller sees the master as *down* (never "back and healthy"), so
   it cannot undo step 2 by returning the group to NORMAL;
2. versioned write ``NORMAL → FENCING`` (reason "planned handoff: ..."): the master drops READ;
3. wait (on ZooKeeper watches, bounded) for proof the master cannot read: it acknowledged NONE
   at the new epoch, or its ZooKeeper session or process is gone;
4. versioned write ``FENCING → SLAVE_CONSUME`` with the planner's in-sync slave acting, so
   reads continue while the master restarts; its return is an ordinary back-sync.

If another writer moves the state first (the controller reacting to the pod's death), the
handoff stops there: the controller finishes the job under the same invariants. If the proof
does not come in time, the controller completes the failover when the container exits.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from understudy_broker.model import GroupState, Mode, Permission
from understudy_operator.controller.observe import ProcessState
from understudy_operator.handlers import events
from understudy_operator.handlers.runtime import GroupHandle, Runtime
from understudy_operator.k8s.builders import selector_labels
from understudy_operator.k8s.kube import PODS, STATEFULSETS
from understudy_operator.k8s.podliveness import pod_ready
from understudy_operator.k8s.rollout import BrokerFacts, PodFacts, RolloutFacts, Step, plan_rollout
from understudy_operator.k8s.zkconfig import broker_name

log = logging.getLogger(__name__)

REVISION_LABEL = "controller-revision-hash"


def pod_facts(pod: dict[str, Any]) -> PodFacts | None:
    meta = pod.get("metadata") or {}
    name = str(meta.get("name", ""))
    suffix = name.rsplit("-", 1)[-1]
    if not suffix.isdigit():
        return None
    return PodFacts(name=name, ordinal=int(suffix),
                    revision=(meta.get("labels") or {}).get(REVISION_LABEL),
                    ready=pod_ready(pod), terminating=bool(meta.get("deletionTimestamp")),
                    uid=meta.get("uid"))


async def gather(rt: Runtime, handle: GroupHandle) -> RolloutFacts | None:
    sts = await rt.kube.get(STATEFULSETS, namespace=handle.namespace, name=handle.name)
    if sts is None:
        return None
    spec = handle.spec
    pods = [f for p in await rt.kube.list(PODS, namespace=handle.namespace,
                                          labels=selector_labels(handle.name))
            if (f := pod_facts(p)) is not None]
    names = [broker_name(handle.name, o) for o in range(spec.replicas)]
    obs = await handle.zk.observe_group(handle.name, names)
    state, _ = await handle.zk.read_state(handle.name)
    brokers = {}
    for ordinal, name in enumerate(names):
        view = obs.view(name)
        st = view.status
        brokers[name] = BrokerFacts(
            name=name, ordinal=ordinal, configured=spec.permission_of(ordinal),
            live=view.zk_live, epoch_applied=st.epoch_applied if st else 0,
            max_offset=st.max_offset if st else 0, has_status=st is not None)
    return RolloutFacts(replicas=spec.replicas,
                        update_revision=(sts.get("status") or {}).get("updateRevision"),
                        pods=pods, brokers=brokers, state=state,
                        max_lag_bytes=rt.config.max_lag_bytes, in_sync=obs.in_sync)


async def roll(rt: Runtime, handle: GroupHandle) -> Step | None:
    """Plan and apply at most one rollout step; ``None`` when not leading or busy."""
    if not handle.leading or handle.rollout_lock.locked():
        return None
    async with handle.rollout_lock:
        facts = await gather(rt, handle)
        if facts is None:
            return None
        step = plan_rollout(facts)
        if step.kind in ("done", "wait"):
            if step.kind == "wait" and step.outdated:
                log.info("group %s/%s rollout waits: %s", handle.namespace, handle.name,
                         step.reason)
            return step
        rt.metrics.decision(handle.name, f"rollout-{step.kind}")
        await events.post(rt, handle.owner, type_="Normal", reason="RollingUpdate",
                          message=step.reason)
        if step.kind == "handoff":
            await handoff(rt, handle, step)
        else:
            await _delete_pod(rt, handle, step)
        return step


async def _delete_pod(rt: Runtime, handle: GroupHandle, step: Step) -> None:
    if step.pod is None:
        return
    handle.liveness.mark_terminating(step.pod, step.uid)
    answer = await rt.kube.delete(PODS, namespace=handle.namespace, name=step.pod)
    if answer is None or not (answer.get("metadata") or {}).get("deletionTimestamp"):
        # Gone at once (no grace period): that is a certain death, and the pod watch may
        # not have told us yet.
        handle.liveness.observe(answer or {"metadata": {"name": step.pod, "uid": step.uid}},
                                deleted=True)
    else:
        handle.liveness.observe(answer)
    log.info("group %s/%s: deleted pod %s (%s)", handle.namespace, handle.name, step.pod,
             step.reason)


def _proof(state: GroupState, status_epoch: int | None, effective: Permission | None,
           live: bool, process: ProcessState) -> str | None:
    if process is ProcessState.EXITED:
        return "its pod is gone"
    if not live:
        return "its ZooKeeper session is gone"
    if status_epoch is not None and status_epoch >= state.epoch and effective is not None \
            and not effective & Permission.READ:
        return f"it acknowledged {effective.label} at epoch {status_epoch}"
    return None


async def handoff(rt: Runtime, handle: GroupHandle, step: Step) -> None:
    """The planned handoff (module docstring)."""
    group, master = handle.name, step.pod
    if master is None or step.acting is None:
        return
    zk = handle.zk
    state, version = await zk.read_state(group)
    if state is None or state.mode is not Mode.NORMAL:
        return
    await _delete_pod(rt, handle, step)
    fencing = GroupState(mode=Mode.FENCING, epoch=state.epoch + 1, acting=None,
                         since=time.time(),
                         reason=f"planned handoff: fencing master {master} before its restart")
    if not await zk.write_state(group, fencing, version=version):
        log.info("group %s: state moved before the planned fence; the controller continues",
                 group)
        return
    await _announce(rt, handle, state, fencing)
    deadline = time.monotonic() + rt.config.handoff_timeout_s
    while True:
        current, version = await zk.read_state(group)
        if current != fencing:
            log.info("group %s: state moved during the handoff (%s); the controller continues",
                     group, current.mode.name if current else None)
            return
        seen = await zk.observe_group(group, [master, step.acting],
                                      process=handle.liveness.process_state)
        mst = seen.view(master).status
        proof = _proof(fencing, mst.epoch_applied if mst else None,
                       mst.effective if mst else None, seen.view(master).zk_live,
                       seen.view(master).process)
        if proof is not None:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning("group %s: master %s did not acknowledge the fence within %.0fs; the "
                        "controller completes the failover when its container exits", group,
                        master, rt.config.handoff_timeout_s)
            return
        await zk.wait_change(group, master, timeout_s=min(left, 1.0))
    if not seen.view(step.acting).zk_live:
        log.warning("group %s: %s left before the handoff; the controller picks a reader",
                    group, step.acting)
        return
    consume = GroupState(mode=Mode.SLAVE_CONSUME, epoch=fencing.epoch + 1, acting=step.acting,
                         since=time.time(),
                         reason=f"planned handoff: master {master} fenced ({proof}); "
                                f"{step.acting} serves reads while it restarts")
    if await zk.write_state(group, consume, version=version):
        await _announce(rt, handle, fencing, consume)


async def _announce(rt: Runtime, handle: GroupHandle, old: GroupState, new: GroupState) -> None:
    if rt.on_transition is not None:
        rt.on_transition(handle, old, new)
