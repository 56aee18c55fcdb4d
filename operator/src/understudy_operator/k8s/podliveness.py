"""Broker liveness from pod and container status: the Kubernetes ``LivenessSource``.

Why this module exists: DESIGN splits down-signals into *certain* deaths, acted on at once, and
*ambiguous* ones, confirmed over ``detectionChecks`` checks. In local mode the process table
tells them apart; under Kubernetes the kubelet's pod status does, and the failover controller
must not care which. :func:`classify_pod` is the pure mapping (unit-tested without a cluster);
:class:`PodLiveness` keeps the latest verdict per broker, fed by the operator's pod watch, and
wakes the controller when a verdict becomes a certain death.

The mapping, and why:

=================================================  ==========  ==================================
pod / ``broker`` container                         verdict     why
=================================================  ==========  ==================================
pod gone (a watch ``DELETED`` after we saw it)     EXITED      the kubelet confirmed its
                                                               containers stopped
phase ``Failed`` / ``Succeeded``                   EXITED      nothing runs in it any more
container ``terminated``                           EXITED      the process exited
container ``waiting`` after a previous run         EXITED      crash loop: no process runs
running, ``deletionTimestamp`` set                 STOPPED     terminating: it may still serve
                                                               for its grace period, so it is
                                                               a down-signal but not proof
running and Ready                                  RUNNING
running, not Ready (probe failing)                 UNKNOWN     ambiguous: a slave is not Ready
                                                               whenever its master is away, so
                                                               readiness alone must never fence
no container status yet (Pending)                  UNKNOWN     decisions rest on ZooKeeper
=================================================  ==========  ==================================

Only ``EXITED`` counts as proof that a broker cannot read (``machine.cannot_read``); a pod that
is merely terminating is not, so a planned restart never hands reads to a slave before the
master is fenced in ZooKeeper or gone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from understudy_operator.controller.observe import ProcessState

log = logging.getLogger(__name__)

CONTAINER: Final = "broker"
Listener = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class PodVerdict:
    """What a pod says about its broker's process, with the evidence in words."""

    state: ProcessState
    reason: str
    uid: str | None = None
    ready: bool = False

    @property
    def certain_death(self) -> bool:
        return self.state is ProcessState.EXITED


def _map(value: Any) -> Mapping[str, Any]:
    """``value`` if it is an object, else empty: a malformed pod status never raises."""
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    for cs in _list(_map(pod.get("status")).get("containerStatuses")):
        if isinstance(cs, Mapping) and cs.get("name") == name:
            return cs
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's ``Ready`` condition."""
    for cond in _list(_map(pod.get("status")).get("conditions")):
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def classify_pod(pod: Mapping[str, Any] | None, *, deleted: bool = False,
                 container: str = CONTAINER) -> PodVerdict:
    """The verdict for one pod (see the module docstring's table). ``deleted`` is true for a
    watch ``DELETED`` event; ``pod`` ``None`` means no pod is known (``UNKNOWN``)."""
    if pod is None:
        return PodVerdict(ProcessState.UNKNOWN, "no pod")
    meta = _map(pod.get("metadata"))
    uid = meta.get("uid") if isinstance(meta.get("uid"), str) else None
    if deleted:
        return PodVerdict(ProcessState.EXITED, "pod deleted", uid)
    phase = _map(pod.get("status")).get("phase")
    if phase in ("Failed", "Succeeded"):
        return PodVerdict(ProcessState.EXITED, f"pod phase {phase}", uid)
    cs = _container(pod, container)
    if cs is None:
        return PodVerdict(ProcessState.UNKNOWN, f"no status for container {container!r} yet",
                          uid)
    state = _map(cs.get("state"))
    if "terminated" in state:
        term = _map(state.get("terminated"))
        return PodVerdict(ProcessState.EXITED,
                          f"container terminated (exit code {term.get('exitCode', '?')}, "
                          f"{term.get('reason') or 'no reason'})", uid)
    if "waiting" in state:
        restarts = cs.get("restartCount")
        restarted = (isinstance(restarts, int) and restarts > 0) or "terminated" in _map(
            cs.get("lastState"))
        why = _map(state.get("waiting")).get("reason") or "waiting"
        if restarted:
            return PodVerdict(ProcessState.EXITED, f"container not running ({why}) after an exit",
                              uid)
        return PodVerdict(ProcessState.UNKNOWN, f"container not started yet ({why})", uid)
    if "running" in state:
        if meta.get("deletionTimestamp"):
            return PodVerdict(ProcessState.STOPPED, "pod terminating", uid)
        ready = pod_ready(pod)
        if ready:
            return PodVerdict(ProcessState.RUNNING, "container running and ready", uid, True)
        return PodVerdict(ProcessState.UNKNOWN, "container running, not ready", uid)
    return PodVerdict(ProcessState.UNKNOWN, "container state unknown", uid)


class PodLiveness:
    """A :class:`~understudy_operator.controller.liveness.LivenessSource` for one group,
    fed with pod watch events through :meth:`observe`.

    Brokers are pods of the group's StatefulSet, so a broker's name is its pod's name. A
    pod the operator is about to delete can be marked with :meth:`mark_terminating` first:
    from then on, until that pod is gone, it reads as ``STOPPED`` even if a stale watch event
    still shows it running — the controller must not see a master that is being restarted as
    healthy.
    """

    def __init__(self) -> None:
        self._brokers: set[str] = set()
        self._verdicts: dict[str, PodVerdict] = {}
        self._terminating: dict[str, str] = {}  # broker -> uid being deleted
        self._listeners: list[Listener] = []

    # -- LivenessSource
    def track(self, brokers: Iterable[str]) -> None:
        self._brokers = set(brokers)

    def process_state(self, broker: str) -> ProcessState:
        verdict = self._verdicts.get(broker)
        return verdict.state if verdict is not None else ProcessState.UNKNOWN

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def close(self) -> None:
        self._listeners.clear()

    # -- feeding
    def verdict(self, broker: str) -> PodVerdict:
        return self._verdicts.get(broker) or PodVerdict(ProcessState.UNKNOWN, "no pod seen")

    def mark_terminating(self, broker: str, uid: str | None) -> None:
        if uid is None:
            return
        self._terminating[broker] = uid
        old = self._verdicts.get(broker)
        if old is not None and old.uid == uid and old.state is not ProcessState.EXITED:
            self._verdicts[broker] = PodVerdict(ProcessState.STOPPED, "pod being deleted by "
                                                "the operator", uid)

    def observe(self, pod: Mapping[str, Any], *, deleted: bool = False) -> PodVerdict:
        """Record a pod event; wake listeners when it turns into a certain death."""
        name = str(_map(pod.get("metadata")).get("name", ""))
        verdict = classify_pod(pod, deleted=deleted)
        old = self._verdicts.get(name)
        if deleted and old is not None and old.uid not in (None, verdict.uid):
            return old  # a late DELETED of an older pod; the newer pod's verdict stands
        marked = self._terminating.get(name)
        if marked is not None:
            if verdict.uid != marked or verdict.state is ProcessState.EXITED:
                self._terminating.pop(name, None)
            elif verdict.state in (ProcessState.RUNNING, ProcessState.UNKNOWN):
                verdict = PodVerdict(ProcessState.STOPPED, "pod being deleted by the operator",
                                     verdict.uid)
        self._verdicts[name] = verdict
        was_dead = old is not None and old.certain_death and old.uid == verdict.uid
        if verdict.certain_death and not was_dead:
            log.info("broker %s: %s", name, verdict.reason)
            for listener in list(self._listeners):
                with contextlib.suppress(Exception):
                    listener(name)
        return verdict
