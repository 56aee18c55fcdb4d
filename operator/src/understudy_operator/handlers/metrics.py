"""The operator's Prometheus metrics, in one registry served on ``/metrics``.

Why this module exists: the alerts and the failover-SLA dashboard read the operator's own
series (reconcile durations, decisions, errors, groups led) and the group series of the
controllers it runs. The names are pinned in :mod:`understudy_broker.metric_names`; this
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

from understudy_broker import metric_names as names
from understudy_operator.controller.driver import ControllerMetrics

RECONCILE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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
            names.counter_base(names.OPERATOR_DECISIONS_TOTAL),
            "Decisions applied: mode transitions, rollout steps, scaling", ["group", "decision"],
            registry=r)
        self.errors = Counter(
            names.counter_base(names.OPERATOR_ERRORS_TOTAL),
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
