"""The broker's Prometheus series, on a registry of its own.

Why this module exists: metric names and labels are a public contract (DESIGN, "Metrics
contract"): the Spark SLA jobs, dashboards and alert rules read them. The names come from
:mod:`understudy_broker.metric_names`; the series are declared once, here, on a per-server
``CollectorRegistry`` (never the global default), so several
brokers can live in one process (tests, local mode) without colliding.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from understudy_broker import metric_names as names
from understudy_broker.model import Permission


class BrokerMetrics:
    """Series for one broker, pre-labelled with its group and name."""

    def __init__(self, *, group: str, broker: str, role: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.group = group
        self.broker = broker
        self._permission = Gauge(
            names.BROKER_PERMISSION,
            "Effective permission the broker enforces (0 NONE, 1 READ, 2 WRITE, 3 FULL).",
            ["group", "broker", "role"],
            registry=self.registry,
        ).labels(group=group, broker=broker, role=role)
        # Event times (docs/sla.md "Event times"): children are created when first set, so
        # a series never shows 0 (1970) before its kind of change happened.
        labels = {"group": group, "broker": broker, "role": role}
        self._event_labels = labels
        self._started = Gauge(
            names.BROKER_STARTED,
            "When this broker process wrote its first permission-log line (seconds since the epoch).",
            list(labels), registry=self.registry)
        self._since = Gauge(
            names.BROKER_PERMISSION_SINCE,
            "When the current effective permission began (seconds since the epoch).",
            list(labels), registry=self.registry)
        self._read_gained = Gauge(
            names.BROKER_READ_GAINED,
            "When this broker process last gained effective READ (seconds since the epoch).",
            list(labels), registry=self.registry)
        self._read_lost = Gauge(
            names.BROKER_READ_LOST,
            "When this broker process last lost effective READ (seconds since the epoch).",
            list(labels), registry=self.registry)
        self._logged: Permission | None = None
        self._in = Counter(
            names.counter_base(names.MESSAGES_IN_TOTAL),
            "Messages appended by produce requests.",
            ["group", "broker"],
            registry=self.registry,
        ).labels(group=group, broker=broker)
        self._out = Counter(
            names.counter_base(names.MESSAGES_OUT_TOTAL),
            "Messages delivered by pull requests.",
            ["group", "broker"],
            registry=self.registry,
        ).labels(group=group, broker=broker)
        self._lag = Gauge(
            names.REPLICATION_LAG_BYTES,
            "Bytes of log a slave is behind its master (reported by both sides).",
            ["group", "broker"],
            registry=self.registry,
        )
        self._latency = Histogram(
            names.PRODUCE_LATENCY_SECONDS,
            "Produce request time from receipt to acknowledgement (append, flush, replication).",
            ["group", "broker"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        ).labels(group=group, broker=broker)

        self._flushes = Counter(
            names.counter_base(names.LOG_FLUSHES_TOTAL),
            "fdatasync calls made for acknowledgements (group commit: fewer than produce requests).",
            ["group", "broker"],
            registry=self.registry,
        ).labels(group=group, broker=broker)
        self._flush_seconds = Histogram(
            names.LOG_FLUSH_SECONDS,
            "Wall time of one flush (fdatasync, in a worker thread) of the commit log: the disk's part of every acknowledgement.",
            ["group", "broker"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        ).labels(group=group, broker=broker)

        self._consumer_lag = Gauge(
            names.CONSUMER_LAG_MESSAGES,
            "Messages between a queue's log end and a consumer group's committed offset.",
            ["group", "topic", "queue", "consumer_group"],
            registry=self.registry,
        )
        self._lag_keys: set[tuple[str, str, str]] = set()
        self._rebalances = Counter(
            names.counter_base(names.REBALANCES_TOTAL),
            "Consumer-group assignment generations this broker wrote.",
            ["consumer_group"],
            registry=self.registry,
        )

        self._scheduled = Gauge(
            names.SCHEDULED_MESSAGES,
            "Delayed messages and retries waiting in this broker's copy of the schedule.",
            ["group", "broker"], registry=self.registry,
        ).labels(group=group, broker=broker)
        self._overdue = Gauge(
            names.SCHEDULED_OVERDUE_MESSAGES,
            "Scheduled messages already due and not yet written (held).",
            ["group", "broker"], registry=self.registry,
        ).labels(group=group, broker=broker)
        self._sched_out = Counter(
            names.counter_base(names.SCHEDULED_DELIVERED_TOTAL),
            "Due scheduled messages written: delivered here, moved or escaped to another group.",
            ["group", "broker", "how"], registry=self.registry,
        )
        self._nacks = Counter(
            names.counter_base(names.NACKS_TOTAL),
            "Messages handed back by consumers, by destination (retry, dlq).",
            ["group", "broker", "to"], registry=self.registry,
        )
        self._repeats = Counter(
            names.counter_base(names.PRODUCE_REPEATS_TOTAL),
            "Retried messages of idempotent producers answered with their first offset "
            "instead of stored again.",
            ["group", "broker"], registry=self.registry,
        ).labels(group=group, broker=broker)

        self._corrupt = Counter(
            names.counter_base(names.CORRUPT_RECORDS_TOTAL),
            "Damaged records found by reads (each counted once); never served.",
            ["group", "broker"], registry=self.registry,
        ).labels(group=group, broker=broker)

    def corrupt_record(self) -> None:
        self._corrupt.inc()

    def schedule(self, pending: int, overdue: int) -> None:
        self._scheduled.set(pending)
        self._overdue.set(overdue)

    def scheduled_delivered(self, how: str, n: int) -> None:
        self._sched_out.labels(group=self.group, broker=self.broker, how=how).inc(n)

    def nacked(self, to: str) -> None:
        self._nacks.labels(group=self.group, broker=self.broker, to=to).inc()

    def consumer_lag(self, lags: dict[tuple[str, int, str], int]) -> None:
        """Set every (topic, queue, consumer group) lag; series not in ``lags`` go (this
        broker no longer reads, or the group's offsets are gone)."""
        keys = {(t, str(q), cg) for t, q, cg in lags}
        for topic, queue, cgroup in self._lag_keys - keys:
            self._consumer_lag.remove(self.group, topic, queue, cgroup)
        for (t, q, cg), lag in lags.items():
            self._consumer_lag.labels(group=self.group, topic=t, queue=str(q),
                                      consumer_group=cg).set(lag)
        self._lag_keys = keys

    def rebalanced(self, consumer_group: str) -> None:
        self._rebalances.labels(consumer_group=consumer_group).inc()

    def log_flushed(self, seconds: float) -> None:
        self._flushes.inc()
        self._flush_seconds.observe(seconds)

    def set_permission(self, perm: Permission) -> None:
        self._permission.set(int(perm))

    def permission_logged(self, perm: Permission, t_ns: int) -> None:
        """A permission-log line was written at ``t_ns`` (``time.time_ns()``, possibly
        backdated to a lease lapse): set the event-time gauges from that instant."""
        at = t_ns / 1e9
        before = self._logged
        if before is None:
            self._started.labels(**self._event_labels).set(at)
        if before is None or perm != before:
            self._since.labels(**self._event_labels).set(at)
            had = before is not None and bool(before & Permission.READ)
            if perm & Permission.READ and not had:
                self._read_gained.labels(**self._event_labels).set(at)
            elif had and not perm & Permission.READ:
                self._read_lost.labels(**self._event_labels).set(at)
        self._logged = perm

    def messages_in(self, n: int) -> None:
        self._in.inc(n)

    def produce_repeats(self, n: int) -> None:
        self._repeats.inc(n)

    def messages_out(self, n: int) -> None:
        self._out.inc(n)

    def replication_lag(self, *, broker: str, lag_bytes: int) -> None:
        self._lag.labels(group=self.group, broker=broker).set(lag_bytes)

    def produce_latency(self, seconds: float) -> None:
        self._latency.observe(seconds)
