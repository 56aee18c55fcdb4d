"""Kubernetes Events about a BrokerGroup: what ``kubectl describe bg`` shows people.

Why this module exists: every mode change, planned handoff, rollout step and rejected spec is
announced as an Event, from several handlers and from the controller's transition callback.
Posting is best effort — an Event that cannot be written is logged, never allowed to fail the
decision it describes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from understudy_operator.handlers.runtime import Runtime
from understudy_operator.k8s.kube import KubeError

log = logging.getLogger(__name__)


async def post(rt: Runtime, involved: Mapping[str, Any], *, type_: str, reason: str,
               message: str) -> None:
    """Post an Event about ``involved`` (needs ``apiVersion``, ``kind``, ``metadata``)."""
    try:
        await rt.kube.post_event(involved=involved, type_=type_, reason=reason, message=message)
    except KubeError as exc:
        log.warning("cannot post Event %s (%s): %s", reason, message, exc)
