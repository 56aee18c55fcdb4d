"""The Prometheus metric names that alerts, dashboards and SLA jobs may rely on.

Why this module exists: DESIGN.md's metrics contract is public — the Spark jobs, the Grafana
dashboards and the PrometheusRule all read these names, and the broker, the controller and
the operator export them. Keeping them in one place (the broker package is the shared
contract every other package already depends on) lets the exporters register exactly these
names and lets a test parse every PromQL expression the chart ships and reject any name
that is not listed here, so a renamed metric breaks the build instead of silently emptying
a dashboard or muting an alert.
"""

from __future__ import annotations

from typing import Final

# --- DESIGN.md "Metrics contract": brokers and controllers -------------------------------
BROKER_PERMISSION: Final = "understudy_broker_permission"  # gauge {group,broker,role} 0-3
GROUP_MODE: Final = "understudy_group_mode"  # gauge {group}: 0 NORMAL .. 3 RECOVERING
GROUP_EPOCH: Final = "understudy_group_epoch"  # gauge {group}
FAILOVER_TOTAL: Final = "understudy_failover_total"  # counter {group}
FAILOVER_PHASE_SECONDS: Final = "understudy_failover_phase_seconds"  # histogram {group,phase}
MESSAGES_IN_TOTAL: Final = "understudy_messages_in_total"  # counter {group,broker}
MESSAGES_OUT_TOTAL: Final = "understudy_messages_out_total"  # counter {group,broker}
REPLICATION_LAG_BYTES: Final = "understudy_replication_lag_bytes"  # gauge {group,broker}
PRODUCE_LATENCY_SECONDS: Final = "understudy_produce_latency_seconds"  # histogram {group,broker}
CONSUMER_LAG_MESSAGES: Final = "understudy_consumer_lag_messages"
"""Gauge {group,topic,queue,consumer_group}: log end minus committed offset, exported by the
broker holding READ for the queue's group (so each series has one source)."""
REBALANCES_TOTAL: Final = "understudy_rebalances_total"
"""Counter {consumer_group}: assignment generations written (by the broker whose write won)."""

# Event times (docs/sla.md, "Event times"): the instants of mode and permission changes as
# gauge values, in seconds since the epoch (wall clock, millisecond precision or better), so
# that an SLA report places each transition where it happened instead of on the scrape grid.
# Each holds the *latest* instant of its kind; a series appears once its kind first happened.
GROUP_MODE_ENTERED: Final = "understudy_group_mode_entered_timestamp_seconds"
"""Gauge {group,mode} (controller): when the group last entered ``mode`` (NORMAL, FENCING,
SLAVE_CONSUME, RECOVERING): the instant the controller's versioned write of that transition
succeeded (the transition journal's instant), or the state's ``since`` for a state it found
written (it became the leader, or another writer moved the group). The current mode began at
the series of the current mode (the largest value)."""
BROKER_EXITED: Final = "understudy_broker_exited_timestamp_seconds"
"""Gauge {group,broker,role} (controller): when the controller's liveness source reported the
broker's process exited (a certain death): a process killed with SIGKILL writes nothing, so
this is when its effective permission ended."""
BROKER_STARTED: Final = "understudy_broker_started_timestamp_seconds"
"""Gauge {group,broker,role}: when this broker process wrote its first permission-log line
(it began publishing an effective permission; a restarted broker is back from here)."""
BROKER_READ_GAINED: Final = "understudy_broker_read_gained_timestamp_seconds"
"""Gauge {group,broker,role}: when this broker process last gained effective READ (the
permission log's instant for that line)."""
BROKER_READ_LOST: Final = "understudy_broker_read_lost_timestamp_seconds"
"""Gauge {group,broker,role}: when this broker process last lost effective READ (the
permission log's instant: a lapsed read lease is dated at the lapse)."""
BROKER_PERMISSION_SINCE: Final = "understudy_broker_permission_since_timestamp_seconds"
"""Gauge {group,broker,role}: when the broker's current effective permission began (the
permission log's instant of the line that set it; epoch-only changes do not move it)."""
TOPIC_QUEUES: Final = "understudy_topic_queues"
"""Gauge {topic}: the topic's queues, removed ones excluded (from ``/topics/<topic>``),
exported by one controller per cluster (see docs/cluster.md "Metrics")."""
TOPIC_WRITABLE_QUEUES: Final = "understudy_topic_writable_queues"
"""Gauge {topic}: queues whose group has a live broker publishing WRITE in its effective
permission (what producers can send to right now)."""
TOPIC_READABLE_QUEUES: Final = "understudy_topic_readable_queues"
"""Gauge {topic}: queues whose group has a live broker publishing READ in its effective
permission (what consumers can pull from right now)."""
TOPIC_QUEUE_INFO: Final = "understudy_topic_queue_info"
"""Gauge {topic,queue,group}, always 1: queue ``queue`` of ``topic`` lives on ``group`` (from
``/topics/<topic>``; removed queues have none), exported by the same controller as the topic
series. The SLA job joins it to the group series for per-topic availability
(docs/sla.md "Topic SLA")."""

# --- exported too, not (yet) read by jobs or dashboards ----------------------------------
LOG_FLUSHES_TOTAL: Final = "understudy_log_flushes_total"  # counter {group,broker}
LOG_FLUSH_SECONDS: Final = "understudy_log_flush_seconds"
"""Histogram {group,broker}: one fdatasync of the commit log, the disk's part of every
acknowledgement (master and slaves). A long one stalls every write the group acknowledges
meanwhile; on a shared disk, every group's."""
SCHEDULED_MESSAGES: Final = "understudy_scheduled_messages"
"""Gauge {group,broker}: delayed messages and retries waiting in this broker's copy of its
group's schedule (docs/delayed.md)."""
SCHEDULED_OVERDUE_MESSAGES: Final = "understudy_scheduled_overdue_messages"
"""Gauge {group,broker}: of those, the ones already due (held: no group could take them)."""
SCHEDULED_DELIVERED_TOTAL: Final = "understudy_scheduled_delivered_total"
"""Counter {group,broker,how}: due messages written by the schedule: ``delivered`` (by
the master, to its own queue), ``moved`` (by the master, to another group's queue) or
``escaped`` (by the acting slave, to another group's master)."""
NACKS_TOTAL: Final = "understudy_nacks_total"
"""Counter {group,broker,to}: messages handed back by consumers: ``retry`` or ``dlq``."""
PRODUCE_REPEATS_TOTAL: Final = "understudy_produce_repeats_total"
"""Counter {group,broker}: messages of idempotent producers answered with the offset their
first copy got instead of stored again (a retried send to the same queue: invariant 8,
docs/idempotence.md)."""
CORRUPT_RECORDS_TOTAL: Final = "understudy_corrupt_records_total"
"""Counter {group,broker}: damaged records reads came across (CRC, framing, or an index
entry naming another record), each counted once: never served (docs/storage-and-replication.md,
"Corruption")."""
GROUP_DEGRADED: Final = "understudy_group_degraded"  # gauge {group}: master and slaves down
CONTROLLER_TRANSITIONS_TOTAL: Final = "understudy_controller_transitions_total"  # {group,to}
ROUTE_DOCUMENT_WRITES_TOTAL: Final = "understudy_route_document_writes_total"
"""Counter: writes of ``/routes/doc`` by this controller while it is the route writer
(docs/cluster-routes.md); every broker reads each one."""

# --- the operator's own metrics ------------------------------------------------------------
OPERATOR_RECONCILE_DURATION_SECONDS: Final = "understudy_operator_reconcile_duration_seconds"
"""Histogram {handler}: wall time of one kopf handler invocation."""
OPERATOR_DECISIONS_TOTAL: Final = "understudy_operator_decisions_total"
"""Counter {group,decision}: controller decisions applied (a mode transition, an override)."""
OPERATOR_ERRORS_TOTAL: Final = "understudy_operator_errors_total"
"""Counter {handler,kind}: handler failures (temporary or permanent)."""
OPERATOR_LEADING_GROUPS: Final = "understudy_operator_leading_groups"
"""Gauge: number of groups whose controller election this operator replica holds."""

# Prometheus' own series, always present for a scraped target.
UP: Final = "up"

HISTOGRAMS: Final[frozenset[str]] = frozenset(
    {FAILOVER_PHASE_SECONDS, PRODUCE_LATENCY_SECONDS, OPERATOR_RECONCILE_DURATION_SECONDS}
)
"""Histograms expose ``_bucket``, ``_sum`` and ``_count`` series instead of the bare name."""

BASE_NAMES: Final[frozenset[str]] = frozenset(
    {
        BROKER_PERMISSION,
        GROUP_MODE,
        GROUP_EPOCH,
        FAILOVER_TOTAL,
        FAILOVER_PHASE_SECONDS,
        MESSAGES_IN_TOTAL,
        MESSAGES_OUT_TOTAL,
        REPLICATION_LAG_BYTES,
        PRODUCE_LATENCY_SECONDS,
        CONSUMER_LAG_MESSAGES,
        REBALANCES_TOTAL,
        GROUP_MODE_ENTERED,
        BROKER_EXITED,
        BROKER_STARTED,
        BROKER_READ_GAINED,
        BROKER_READ_LOST,
        BROKER_PERMISSION_SINCE,
        TOPIC_QUEUES,
        TOPIC_WRITABLE_QUEUES,
        TOPIC_READABLE_QUEUES,
        TOPIC_QUEUE_INFO,
        OPERATOR_RECONCILE_DURATION_SECONDS,
        OPERATOR_DECISIONS_TOTAL,
        OPERATOR_ERRORS_TOTAL,
        OPERATOR_LEADING_GROUPS,
        UP,
    }
)


def series_names() -> frozenset[str]:
    """Every series name a PromQL expression may select: the base names, with histograms
    expanded to their ``_bucket``/``_sum``/``_count`` series (the bare histogram name is not a
    series and is therefore not included)."""
    names = set(BASE_NAMES - HISTOGRAMS)
    for hist in HISTOGRAMS:
        names.update({f"{hist}_bucket", f"{hist}_sum", f"{hist}_count"})
    return frozenset(names)


def counter_base(name: str) -> str:
    """The name to register a counter under: prometheus_client appends ``_total`` itself."""
    if not name.endswith("_total"):
        raise ValueError(f"{name} is not a counter name (no _total suffix)")
    return name[: -len("_total")]
