"""The operator's Prometheus metrics, in one registry served on ``/metrics``.

Why this module exists: the alerts and the failover-SLA dashboard read the operator's own
series (reconcile durations, decisions, errors, groups led) and the group series of the
controllers it runs. The names are pinned in :mod:`understudy_operator.k8s.metric_names`; this
module registers exactly those, next to the controllers' series, in one registry owned by the
running operator (no process-global registry, so tests can run several operators side by side).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Final

import kopf
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from understudy_operator.controller.driver import ControllerMetrics
from understudy_operator.k8s import metric_names as names

RECONCILE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _base(name: str, suffix: str) -> str:
    """prometheus_client adds ``_total`` to counters itself."""
    if not name.endswith(suffix):
        raise ValueError(f"{name} does not end with {suffix}")
    return name[: -len(suffix)]


class OperatorMetrics:
    """Operator series plus the shared :class:`ControllerMetrics` of every group controller."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.controller = ControllerMetrics(r)
        self.reconcile = Histogram(
            names.OPERATOR_RECONCILE_DURATION_SECONDS,
            "Wall time of one operator handler invocation", ["handler"],
            buckets=RECONCILE_BUCKETS, registry=r)
        self.decisions = Counter(
            _base(names.OPERATOR_DECISIONS_TOTAL, "_total"),
            "Decisions applied: mode transitions, rollout steps, scaling", ["group", "decision"],
            registry=r)
        self.errors = Counter(
            _base(names.OPERATOR_ERRORS_TOTAL, "_total"),
            "Handler failures by kind (temporary, permanent, invalid-spec, unexpected)",
            ["handler", "kind"], registry=r)
        self.leading = Gauge(
            names.OPERATOR_LEADING_GROUPS,
            "Groups whose controller election this operator replica holds", registry=r)

    @contextlib.contextmanager
    def timed(self, handler: str) -> Iterator[None]:
        """Observe the handler's duration and count its failure, if any, by kind."""
        start = time.monotonic()
        try:
            yield
        except kopf.TemporaryError:
            self.errors.labels(handler, "temporary").inc()
            raise
        except kopf.PermanentError:
            self.errors.labels(handler, "permanent").inc()
            raise
        except Exception:
            self.errors.labels(handler, "unexpected").inc()
            raise
        finally:
            self.reconcile.labels(handler).observe(time.monotonic() - start)

    def decision(self, group: str, decision: str) -> None:
        self.decisions.labels(group, decision).inc()
