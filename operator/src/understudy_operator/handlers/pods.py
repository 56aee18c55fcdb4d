"""Pod watch events → the group's liveness source.

Why this module exists: a broker's container terminating is a *certain* death and the
controller must hear of it on the event, not on its next periodic check. kopf already watches
the pods; this handler only routes each event of a broker pod to the :class:`PodLiveness` of
its group (found by the ``understudy.io/group`` label), which wakes the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from understudy_operator.handlers.runtime import Runtime
from understudy_operator.k8s.builders import LABEL_GROUP


def route(rt: Runtime, *, event: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    meta = body.get("metadata") or {}
    group = (meta.get("labels") or {}).get(LABEL_GROUP)
    handle = rt.groups.get((str(meta.get("namespace")), str(group)))
    if handle is None:
        return
    handle.liveness.observe(body, deleted=event.get("type") == "DELETED")
