"""Pure DataFrame -> DataFrame transforms that turn Prometheus samples into failover SLAs.

Why this module exists: the definitions in DESIGN.md ("SLA definitions") are the audit
contract, so they live in one place, free of I/O, testable with a handful of inline rows
and identical whether the job runs in ``local[*]`` or on a cluster. Each function starts
and ends with a ``select`` that is its schema contract, passes ``how=`` to every join,
gives every window an explicit frame and uses no Python UDF.

The pipeline::

    samples (timestamp, metric, labels, value)           -- readers.SAMPLES_SCHEMA
      -> key_samples     group/broker/role columns (the job's readers emit these directly)
      -> clean_keyed     one value per (group, broker, metric, step bucket)
      -> group_states    one row per (group, bucket): mode, who can read, known?
      -> incident_buckets  each bucket's incident (or none) and whether it is unavailable
      -> incidents       master lost -> reads restored -> master back -> normal
      -> outside_incidents  unavailable stretches that belong to no incident
      -> timeline        run-length state timeline per group (for the report)
      -> daily_sla / monthly_sla against the targets

Time is discretised into buckets of one step (the scrape interval): a sample at ``t``
belongs to bucket ``floor(t / step)``. A bucket with no usable sample is *unknown*: never
counted as unavailable, reported in its own ``unknown_s`` column.

Event times (the last section; docs/sla.md "Event times"): a group whose export carries a
complete log of its mode and READ changes (the event-time gauges) gets its incidents,
its time outside incidents and its daily seconds from those instants, to the
millisecond (:func:`exact_tables`); every other group keeps the buckets.

What real exports throw at us, and where it is handled (all in :func:`clean_samples`):
staleness markers (Prometheus' special NaN; any NaN means "no sample" for these gauges),
duplicate samples and out-of-order samples (one value per bucket, the latest timestamp
wins), label churn from restarted pods (series are keyed by ``group``/``broker``/``role``
only, ``instance``/``pod`` are dropped); counter resets are handled in
:func:`failover_increases`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType
from pyspark.sql.window import WindowSpec

from understudy_broker import metric_names
from understudy_spark.readers import millis_of

MODE = metric_names.GROUP_MODE
PERMISSION = metric_names.BROKER_PERMISSION
UP = metric_names.UP
FAILOVERS = metric_names.FAILOVER_TOTAL
CONTRACT_METRICS = (MODE, PERMISSION, UP, FAILOVERS)

# The long table keyed by the labels the SLA uses (``readers.read_parsed(keyed=True)``).
KEYED_SCHEMA = StructType(
    [
        StructField("timestamp", TimestampType(), nullable=False),
        StructField("metric", StringType(), nullable=False),
        StructField("group", StringType(), nullable=True),
        StructField("broker", StringType(), nullable=False),
        StructField("role", StringType(), nullable=False),
        StructField("mode", StringType(), nullable=False),
        StructField("value", DoubleType(), nullable=True),
    ]
)

MODE_NORMAL = 0
MODE_RECOVERING = 3
READ_BIT = 1
WRITE_BIT = 2

# Timeline states, in the order the report draws their legend.
STATE_NORMAL = "normal"
STATE_SLAVE_READ = "slave_read"
STATE_UNREADABLE = "unreadable"
STATE_TWO_READERS = "two_readers"
STATE_UNKNOWN = "unknown"

INCIDENT_COLUMNS = [
    "group",
    "master_lost_at",
    "reads_restored_at",
    "master_back_at",
    "normal_at",
    "read_unavailable_s",
    "failback_gap_s",
    "one_reader_violation_s",
    "one_reader_unresolved_s",
    "backsync_s",
    "unknown_s",
    "duration_s",
    "open",
]


@dataclass(frozen=True, slots=True)
class Targets:
    """SLA targets. ``incident_read_unavailable_s``: the most read-unavailable time one
    incident may have. ``monthly_read_availability``: the fraction of known time a group
    must be readable, per month (also applied per day in the daily table).
    ``topic_availability`` (and per topic ``topic_targets``): what a topic's write and
    full-read availability must each reach."""

    incident_read_unavailable_s: float = 60.0
    monthly_read_availability: float = 0.999
    # Topics (docs/sla.md "Topic SLA"): write and full-read availability must both reach the
    # topic's target, per day and per month; ``topic_targets`` overrides it per topic.
    topic_availability: float = 0.999
    topic_targets: tuple[tuple[str, float], ...] = ()

    def topic_target_map(self) -> dict[str, float]:
        return dict(self.topic_targets)


def _by_group(*extra: str) -> WindowSpec:
    return Window.partitionBy("group", *extra).orderBy("bucket")


def _running(*extra: str) -> WindowSpec:
    return _by_group(*extra).rowsBetween(Window.unboundedPreceding, Window.currentRow)


def _before(*extra: str) -> WindowSpec:
    return _by_group(*extra).rowsBetween(Window.unboundedPreceding, -1)


def _whole(*extra: str) -> WindowSpec:
    # Ordered like the other windows (the frame is still the whole partition) so Spark
    # computes them over one sort instead of sorting the states twice.
    return _by_group(*extra).rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)


def _at(bucket: Column, step_s: float) -> Column:
    return F.timestamp_millis((bucket * F.lit(int(step_s * 1000))).cast("long"))


def key_samples(samples: DataFrame) -> DataFrame:
    """The long table (``readers.SAMPLES_SCHEMA``) keyed by the labels the SLA uses:
    ``timestamp, metric, group, broker, role, mode, value`` (``KEYED_SCHEMA``).

    ``instance``/``pod`` and every other label are dropped here, which is what merges the
    series of a restarted pod with its predecessor. An empty ``group`` is no group.
    """
    labels = F.col("labels")
    group = labels["group"]
    return samples.select(
        "timestamp",
        "metric",
        F.when(group != "", group).alias("group"),
        F.coalesce(labels["broker"], F.lit("")).alias("broker"),
        F.coalesce(labels["role"], F.lit("")).alias("role"),
        F.coalesce(labels["mode"], F.lit("")).alias("mode"),
        "value",
    )


# Spark's rule that plans an aggregation over input already sorted by its keys as a sort
# aggregation (off by default): what :func:`clean_keyed`'s sort is for.
SORT_AGGREGATION = ("spark.sql.execution.replaceHashWithSortAgg", "true")


def clean_samples(samples: DataFrame, *, step_s: float) -> DataFrame:
    """:func:`clean_keyed` over the long table (``readers.SAMPLES_SCHEMA``)."""
    return clean_keyed(key_samples(samples), step_s=step_s)


def clean_keyed(keyed: DataFrame, *, step_s: float) -> DataFrame:
    """Contract metrics only, one value per (group, broker, role, metric, bucket).

    Input: ``KEYED_SCHEMA`` (what the job's readers produce directly). Output: ``group,
    broker, role, metric, bucket, value``; ``broker``/``role`` are ``""`` for group-level
    series. Rows are hash-partitioned by ``group`` so every later aggregation and window
    reuses that one shuffle; only the narrow keyed rows cross it.
    """
    step_ms = int(step_s * 1000)
    if step_ms <= 0:
        raise ValueError(f"step must be positive, got {step_s!r} s")
    usable = keyed.select("timestamp", "metric", "group", "broker", "role", "value").where(
        F.col("metric").isin(*CONTRACT_METRICS)
        & F.col("group").isNotNull()
        & F.col("value").isNotNull()
        & ~F.isnan("value")  # staleness marker (or a NaN gauge): not a sample
    )
    ts_ms = F.unix_millis("timestamp")
    # The metric crosses the shuffle and keys the de-duplication as a one-byte code, not
    # as a ~25-character name; the name is put back after.
    code = F.lit(None).cast("tinyint")
    name = F.lit(None).cast(StringType())
    for i, metric in enumerate(CONTRACT_METRICS):
        code = F.when(F.col("metric") == metric, F.lit(i).cast("tinyint")).otherwise(code)
        name = F.when(F.col("m") == i, F.lit(metric)).otherwise(name)
    rows = usable.select(
        "group",
        "broker",
        "role",
        code.alias("m"),
        ts_ms.alias("ts_ms"),
        F.floor(ts_ms / F.lit(step_ms)).alias("bucket"),
        "value",
    )
    # Sorted once by (group, bucket, series) when the session has ``SORT_AGGREGATION``
    # (``job.build_session`` sets it): this de-duplication and ``group_states``' per-bucket
    # aggregation become sort aggregations over that order, and the windows over (group,
    # bucket) need no sort of their own. Nearly every key here is distinct (one sample per
    # series and bucket), so two hash aggregations over every sample cost more than one
    # sort of them, which runs of each series' samples, already in time order, make cheap
    # (docs/sla.md "One sort instead of two hash aggregations"). A session without the
    # setting would sort for nothing, so it keeps the hash aggregations; same rows.
    spread = rows.repartition("group")
    if str(keyed.sparkSession.conf.get(SORT_AGGREGATION[0], "false")).strip().lower() == "true":
        spread = spread.sortWithinPartitions("group", "bucket", "broker", "role", "m")
    deduped = spread.groupBy("group", "bucket", "broker", "role", "m").agg(
        F.max_by("value", "ts_ms").alias("value")
    )
    return deduped.select("group", "broker", "role", name.alias("metric"), "bucket", "value")


def group_states(clean: DataFrame) -> DataFrame:
    """One row per (group, bucket) that has any sample.

    Output: ``group, bucket, mode, master_read, readers, writers, perm_series,
    brokers_down, failovers, known, readable, violation, unresolved, has_mode,
    ever_readable`` (``writers``: the brokers with WRITE in their effective permission, for
    the topic SLA; ``has_mode``: the group has a mode series at all; ``ever_readable``: an
    earlier bucket was readable; the last two for :func:`incident_buckets`). ``known`` follows DESIGN: the
    mode series has a sample, or every broker's permission series has one (the broker
    count is the most permission series the group ever showed at once).

    Two readers in one bucket are a one-reader ``violation`` only when the next or the
    previous bucket has two readers too: then one broker's READ sample lies between two
    READ samples of the other, so both held READ at once. A lone two-reader bucket is
    ``unresolved``: targets are scraped at different phases, and a clean hand-over (the
    old reader's last READ sample before it, the new reader's first one after it) lands
    in one bucket just the same.
    """
    metric, value = F.col("metric"), F.col("value")
    is_perm = metric == PERMISSION
    read = (value.cast("int").bitwiseAND(READ_BIT) == READ_BIT).cast("int")
    write = (value.cast("int").bitwiseAND(WRITE_BIT) == WRITE_BIT).cast("int")
    per_bucket = (
        clean.select("group", "broker", "role", "metric", "bucket", "value")
        .groupBy("group", "bucket")
        .agg(
            F.max(F.when(metric == MODE, value)).cast("int").alias("mode"),
            F.max(F.when(is_perm & (F.col("role") == "master"), read)).alias("master_read"),
            F.coalesce(F.sum(F.when(is_perm, read)), F.lit(0)).cast("int").alias("readers"),
            F.coalesce(F.sum(F.when(is_perm, write)), F.lit(0)).cast("int").alias("writers"),
            F.count(F.when(is_perm, 1)).cast("int").alias("perm_series"),
            F.count(F.when((metric == UP) & (value == 0), 1)).cast("int").alias("brokers_down"),
            F.max(F.when(metric == FAILOVERS, value)).alias("failovers"),
        )
    )
    n_brokers = F.max("perm_series").over(_whole())
    known = F.col("mode").isNotNull() | ((F.col("perm_series") >= n_brokers) & (n_brokers > 0))
    two = F.col("readers") >= 2
    w = _by_group()
    beside = [
        (F.abs(f("bucket").over(w) - F.col("bucket")) == 1) & (f("readers").over(w) >= 2)
        for f in (F.lag, F.lead)
    ]
    proven = two & F.coalesce(beside[0] | beside[1], F.lit(False))
    readable = F.col("readers") >= 1
    return per_bucket.select(
        "group",
        "bucket",
        "mode",
        "master_read",
        "readers",
        "writers",
        "perm_series",
        "brokers_down",
        "failovers",
        known.alias("known"),
        readable.alias("readable"),
        proven.alias("violation"),
        (two & ~proven).alias("unresolved"),
        # For :func:`incident_buckets`, here so that they share this one window pass.
        (F.max(F.col("mode").isNotNull().cast("int")).over(_whole()) == 1).alias("has_mode"),
        F.coalesce(F.max(readable.cast("int")).over(_before()) == 1, F.lit(False))
        .alias("ever_readable"),
    )


def _unavailable() -> Column:
    """Read-unavailable: known and nobody readable. The one definition every total,
    every incident and every stretch outside incidents counts (unknown time never is)."""
    return F.col("known") & ~F.col("readable")


ATTRIBUTION_COLUMNS = ("incident", "in_incident", "ends_here", "lead_in", "unavailable")


def incident_buckets(states: DataFrame) -> DataFrame:
    """Every row of :func:`group_states` with the incident it belongs to: the per-bucket
    attribution that :func:`incidents`, :func:`outside_incidents` and the totals of
    :func:`daily_sla` all count, so that the read-unavailable time of the incidents plus
    the time outside any incident is exactly the total.

    Output: the columns of ``group_states`` plus ``incident`` (the bucket its fault began
    at, the incident's key; null outside incidents), ``in_incident`` (between the fault
    and the bucket that ends it), ``ends_here`` (the healthy bucket that ends it, part of
    the incident but never unavailable), ``lead_in`` and ``unavailable``
    (:func:`_unavailable`).

    With a mode series, an incident's fault is the first bucket where the mode is not
    NORMAL and the master lacks READ (or is absent); without one, where no broker is
    readable after one had been. It ends at the first bucket where the mode is NORMAL (or
    absent) and the master has READ again. Buckets that are neither keep the current
    state, so a scrape gap inside an incident neither ends nor splits it.

    ``lead_in``: the unbroken run of read-unavailable buckets right before the fault
    (consecutive buckets, nothing readable, no incident) belongs to the incident. The
    master was already gone and nobody read, but the controller's mode sample of that
    bucket still said NORMAL: a kill is seen by the brokers' scrapes before the
    controller's. Counted outside, such a bucket made the totals exceed the sum of the
    incidents (``make demo``: 3 s overall, 0 s in each of its three incidents).
    """
    if set(ATTRIBUTION_COLUMNS) <= set(states.columns):
        return states
    mode, master_read, bucket = F.col("mode"), F.col("master_read"), F.col("bucket")
    has_mode = F.col("has_mode")
    fault = F.when(
        has_mode, mode.isNotNull() & (mode != MODE_NORMAL) & (F.coalesce(master_read, F.lit(0)) == 0)
    ).otherwise(F.col("known") & ~F.col("readable") & F.col("ever_readable"))
    healthy = (master_read == 1) & F.when(has_mode, mode == MODE_NORMAL).otherwise(F.lit(True))
    event = F.when(fault, 1).when(healthy, 0)

    base = list(states.columns)
    # In an incident at this row, and at the row before (the latest event up to the row
    # before: the previous row's ``in_i``), over one window pass rather than a lag of it.
    s = states.select(
        "*",
        F.coalesce(F.last(event, ignorenulls=True).over(_running()), F.lit(0)).alias("in_i"),
        F.coalesce(F.last(event, ignorenulls=True).over(_before()), F.lit(0)).alias("prev_in"),
    )
    is_start = (F.col("in_i") == 1) & (F.col("prev_in") == 0)
    ends_here = (F.col("in_i") == 0) & (F.col("prev_in") == 1)
    # The end row belongs to the incident it ends; the running ``last`` has seen no newer
    # start there.
    s = s.withColumn("start", F.last(F.when(is_start, bucket), ignorenulls=True).over(_running()))
    s = s.select(
        *base,
        F.when((F.col("in_i") == 1) | ends_here, F.col("start")).alias("own"),
        (F.col("in_i") == 1).alias("in_incident"),
        ends_here.alias("ends_here"),
        is_start.alias("is_start"),
        F.row_number().over(_by_group()).alias("rn"),
        _unavailable().alias("unavailable"),
    )
    # Lead-in: a run of unavailable rows outside incidents whose first following other
    # row starts an incident, with no bucket missing in between (row numbers and bucket
    # numbers advance together).
    candidate = F.col("own").isNull() & F.col("unavailable")
    # The first following non-candidate row: the latest one of a running frame in
    # descending bucket order. (A ``currentRow .. unboundedFollowing`` frame would be
    # recomputed for every row by Spark: quadratic in a group's buckets, hours for a month.)
    from_end = Window.partitionBy("group").orderBy(F.desc("bucket")).rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    nxt = F.last(
        F.when(~candidate, F.struct(bucket.alias("b"), F.col("rn").alias("rn"), F.col("is_start").alias("start"))),
        ignorenulls=True,
    ).over(from_end)
    s = s.withColumn("nxt", nxt)
    lead_in = candidate & F.coalesce(
        F.col("nxt.start") & (F.col("nxt.b") - bucket == F.col("nxt.rn") - F.col("rn")), F.lit(False)
    )
    return s.select(
        *base,
        F.coalesce(F.col("own"), F.when(lead_in, F.col("nxt.b"))).alias("incident"),
        "in_incident",
        "ends_here",
        lead_in.alias("lead_in"),
        "unavailable",
    )


def incidents(states: DataFrame, *, step_s: float) -> DataFrame:
    """Failover incidents per group (columns ``INCIDENT_COLUMNS``), from the attribution of
    :func:`incident_buckets` (``states`` may already be that).

    ``master_lost_at`` is the first bucket of the incident: its lead-in if it has one,
    else the fault. ``normal_at`` is the bucket that ends it; ``null`` while still open.
    ``read_unavailable_s`` counts the incident's unavailable buckets (lead-in included).
    """
    b = incident_buckets(states)
    in_inc = F.col("in_incident")
    ends_here = F.col("ends_here")
    master_read = F.col("master_read")
    s = b.select(
        "group", "bucket", "mode", "master_read", "known", "readable", "violation", "unresolved",
        "incident", "in_incident", "ends_here", "lead_in", "unavailable",
    ).where(F.col("incident").isNotNull())
    s = s.withColumn(
        "restored_seen",
        F.max((in_inc & F.col("readable")).cast("int")).over(_running("incident")),
    )
    restored = F.col("restored_seen") == 1
    unavailable = F.col("unavailable")
    agg = s.groupBy("group", "incident").agg(
        F.min("bucket").alias("lost_b"),
        F.min(F.when(ends_here, F.col("bucket"))).alias("end_b"),
        F.max("bucket").alias("last_b"),
        F.min(F.when(in_inc & F.col("readable"), F.col("bucket"))).alias("restored_b"),
        # The master is back at its first sample after reads were restored; a master first
        # seen already reading in NORMAL is back at the bucket that ends the incident.
        F.min(F.when(((in_inc & restored) | ends_here) & master_read.isNotNull(),
                     F.col("bucket"))).alias("back_b"),
        F.count(F.when(unavailable, 1)).alias("unavail_n"),
        F.count(F.when(unavailable & restored, 1)).alias("gap_n"),
        F.count(F.when(in_inc & F.col("violation"), 1)).alias("violation_n"),
        F.count(F.when(in_inc & F.col("unresolved"), 1)).alias("unresolved_n"),
        F.count(F.when(in_inc & (F.col("mode") == MODE_RECOVERING), 1)).alias("backsync_n"),
        F.count(F.when((in_inc | F.col("lead_in")) & F.col("known"), 1)).alias("known_n"),
    )
    span_end = F.coalesce(F.col("end_b"), F.col("last_b") + 1)
    step = F.lit(float(step_s))
    return agg.select(
        "group",
        _at(F.col("lost_b"), step_s).alias("master_lost_at"),
        _at(F.col("restored_b"), step_s).alias("reads_restored_at"),
        _at(F.col("back_b"), step_s).alias("master_back_at"),
        _at(F.col("end_b"), step_s).alias("normal_at"),
        (F.col("unavail_n") * step).alias("read_unavailable_s"),
        (F.col("gap_n") * step).alias("failback_gap_s"),
        (F.col("violation_n") * step).alias("one_reader_violation_s"),
        (F.col("unresolved_n") * step).alias("one_reader_unresolved_s"),
        (F.col("backsync_n") * step).alias("backsync_s"),
        ((span_end - F.col("lost_b") - F.col("known_n")) * step).alias("unknown_s"),
        ((span_end - F.col("lost_b")) * step).alias("duration_s"),
        F.col("end_b").isNull().alias("open"),
    )


OUTSIDE_COLUMNS = ["group", "start", "end", "read_unavailable_s"]


def outside_incidents(states: DataFrame, *, step_s: float) -> DataFrame:
    """Read-unavailable time that belongs to no incident, as stretches of consecutive
    buckets: ``group, start, end, read_unavailable_s`` (``OUTSIDE_COLUMNS``). From the same
    attribution as :func:`incidents` (``states`` may already be :func:`incident_buckets`),
    so per group: the incidents' ``read_unavailable_s`` plus these equal the total
    ``read_unavailable_s`` of the daily table. Examples: nobody readable while the mode
    stays NORMAL and no failover follows, a cluster being stopped at the end of a drill,
    a group without a mode series that was never readable before."""
    b = incident_buckets(states).select("group", "bucket", "incident", "unavailable")
    s = b.where(F.col("incident").isNull() & F.col("unavailable"))
    new_run = F.coalesce(F.lag("bucket").over(_by_group()) != F.col("bucket") - 1, F.lit(True))
    s = s.withColumn("run", F.sum(new_run.cast("int")).over(_running()))
    runs = s.groupBy("group", "run").agg(
        F.min("bucket").alias("start_b"), (F.max("bucket") + 1).alias("end_b"), F.count(F.lit(1)).alias("n")
    )
    return runs.select(
        "group",
        _at(F.col("start_b"), step_s).alias("start"),
        _at(F.col("end_b"), step_s).alias("end"),
        (F.col("n") * F.lit(float(step_s))).alias("read_unavailable_s"),
    )


def timeline(states: DataFrame, *, step_s: float) -> DataFrame:
    """Run-length state timeline per group: ``group, state, start, end, seconds``.

    States: ``normal`` (master reads), ``slave_read`` (only a slave reads),
    ``unreadable``, ``two_readers`` (a proven one-reader violation; an unresolved
    two-reader bucket is drawn as the readable state it is) and ``unknown`` (no usable
    sample, including buckets missing altogether between two runs).
    """
    state = (
        F.when(~F.col("known"), STATE_UNKNOWN)
        .when(F.col("violation"), STATE_TWO_READERS)
        .when(~F.col("readable"), STATE_UNREADABLE)
        .when(F.col("master_read") == 1, STATE_NORMAL)
        .otherwise(STATE_SLAVE_READ)
    )
    s = states.select("group", "bucket", state.alias("state"))
    w = _by_group()
    new_run = (
        F.lag("state").over(w).isNull()
        | (F.lag("state").over(w) != F.col("state"))
        | (F.lag("bucket").over(w) != F.col("bucket") - 1)
    )
    s = s.withColumn("run", F.sum(new_run.cast("int")).over(_running()))
    runs = s.groupBy("group", "run").agg(
        F.first("state").alias("state"),
        F.min("bucket").alias("start_b"),
        (F.max("bucket") + 1).alias("end_b"),
    )
    next_start = F.lead("start_b").over(Window.partitionBy("group").orderBy("start_b"))
    holes = (
        runs.withColumn("next_b", next_start)
        .where(F.col("next_b") > F.col("end_b"))
        .select(
            "group",
            F.lit(STATE_UNKNOWN).alias("state"),
            F.col("end_b").alias("start_b"),
            F.col("next_b").alias("end_b"),
        )
    )
    both = runs.select("group", "state", "start_b", "end_b").unionByName(holes)
    return both.select(
        "group",
        "state",
        _at(F.col("start_b"), step_s).alias("start"),
        _at(F.col("end_b"), step_s).alias("end"),
        ((F.col("end_b") - F.col("start_b")) * F.lit(float(step_s))).alias("seconds"),
    )


def failover_increases(states: DataFrame) -> DataFrame:
    """Increases of ``understudy_failover_total`` per group and bucket, reset-aware.

    A drop means the controller restarted and the counter began again from zero, so the
    increase is the new value itself (Prometheus' ``increase()`` rule). The first sample
    of a group has no baseline and counts zero. Output: ``group, bucket, increase``.
    """
    f = states.select("group", "bucket", "failovers").where(F.col("failovers").isNotNull())
    prev = F.lag("failovers").over(_by_group())
    inc = (
        F.when(prev.isNull(), F.lit(0.0))
        .when(F.col("failovers") >= prev, F.col("failovers") - prev)
        .otherwise(F.col("failovers"))
    )
    return f.select("group", "bucket", inc.alias("increase"))


def daily_sla(
    states: DataFrame,
    incident_rows: DataFrame,
    *,
    step_s: float,
    first_bucket: int,
    last_bucket: int,
    targets: Targets,
    exact: ExactTables | None = None,
) -> DataFrame:
    """Per group and UTC day inside ``[first_bucket, last_bucket]``.

    Output: ``group, day, known_s, unknown_s, read_unavailable_s, one_reader_violation_s,
    one_reader_unresolved_s, incidents, incidents_over_limit,
    max_incident_read_unavailable_s, failovers_counted, read_availability, target,
    target_met``. ``read_availability`` is readable time over *known* time; unknown time
    is only reported. With ``exact`` (:func:`exact_tables`), the groups it holds take their
    read-unavailable and two-reader seconds from the event times (nothing is unresolved).
    """
    step_ms = int(step_s * 1000)
    step = F.lit(float(step_s))
    day_of = F.to_date(_at(F.col("bucket"), step_s))
    grid = (
        states.select("group")
        .distinct()
        .withColumn(
            "day",
            F.explode(
                F.sequence(
                    F.to_date(F.timestamp_millis(F.lit(first_bucket * step_ms))),
                    F.to_date(F.timestamp_millis(F.lit(last_bucket * step_ms))),
                )
            ),
        )
    )
    day_first = F.ceil(F.unix_millis(F.to_timestamp("day")) / F.lit(step_ms))
    day_end = F.ceil(F.unix_millis(F.to_timestamp(F.date_add("day", 1))) / F.lit(step_ms))
    expected = F.least(day_end, F.lit(last_bucket + 1)) - F.greatest(day_first, F.lit(first_bucket))
    grid = grid.withColumn("expected_n", expected)

    per_day = (
        states.select("group", "bucket", "known", "readable", "violation", "unresolved")
        .withColumn("day", day_of)
        .groupBy("group", "day")
        .agg(
            F.count(F.when(F.col("known"), 1)).alias("known_n"),
            F.count(F.when(_unavailable(), 1)).alias("unavail_n"),
            F.count(F.when(F.col("violation"), 1)).alias("violation_n"),
            F.count(F.when(F.col("unresolved"), 1)).alias("unresolved_n"),
        )
    )
    limit = F.lit(float(targets.incident_read_unavailable_s))
    inc_day = (
        incident_rows.select("group", "master_lost_at", "read_unavailable_s")
        .withColumn("day", F.to_date("master_lost_at"))
        .groupBy("group", "day")
        .agg(
            F.count(F.lit(1)).alias("incidents"),
            F.count(F.when(F.col("read_unavailable_s") > limit, 1)).alias("incidents_over_limit"),
            F.max("read_unavailable_s").alias("max_incident_read_unavailable_s"),
        )
    )
    fo_day = (
        failover_increases(states)
        .withColumn("day", day_of)
        .groupBy("group", "day")
        .agg(F.sum("increase").alias("failovers_counted"))
    )
    joined = (
        grid.join(per_day, on=["group", "day"], how="left")
        .join(inc_day, on=["group", "day"], how="left")
        .join(fo_day, on=["group", "day"], how="left")
    )
    known_n = F.coalesce(F.col("known_n"), F.lit(0))
    unavail_n = F.coalesce(F.col("unavail_n"), F.lit(0))
    availability = F.when(known_n > 0, 1.0 - unavail_n / known_n)
    unavailable_s = unavail_n * step
    violation_s = F.coalesce(F.col("violation_n"), F.lit(0)) * step
    unresolved_s = F.coalesce(F.col("unresolved_n"), F.lit(0)) * step
    if exact is not None:
        joined = joined.join(F.broadcast(exact.groups), on="group", how="left").join(
            F.broadcast(exact.days), on=["group", "day"], how="left")
        is_exact = F.coalesce(F.col("exact"), F.lit(False))
        ex_unavailable = F.coalesce(F.col("exact_unavailable_s"), F.lit(0.0))
        unavailable_s = F.when(is_exact, ex_unavailable).otherwise(unavailable_s)
        violation_s = F.when(is_exact, F.coalesce(F.col("exact_violation_s"), F.lit(0.0))).otherwise(violation_s)
        unresolved_s = F.when(is_exact, F.lit(0.0)).otherwise(unresolved_s)
        availability = F.when(is_exact & (known_n > 0), 1.0 - ex_unavailable / (known_n * step)).otherwise(
            availability)
    target = F.lit(float(targets.monthly_read_availability))
    over = F.coalesce(F.col("incidents_over_limit"), F.lit(0))
    return joined.select(
        "group",
        "day",
        (known_n * step).alias("known_s"),
        ((F.col("expected_n") - known_n) * step).alias("unknown_s"),
        unavailable_s.alias("read_unavailable_s"),
        violation_s.alias("one_reader_violation_s"),
        unresolved_s.alias("one_reader_unresolved_s"),
        F.coalesce(F.col("incidents"), F.lit(0)).alias("incidents"),
        over.alias("incidents_over_limit"),
        F.col("max_incident_read_unavailable_s"),
        F.coalesce(F.col("failovers_counted"), F.lit(0.0)).alias("failovers_counted"),
        availability.alias("read_availability"),
        target.alias("target"),
        (F.coalesce(availability >= target, F.lit(True)) & (over == 0)).alias("target_met"),
    )


OVERALL = "ALL"


def monthly_sla(daily: DataFrame, *, targets: Targets) -> DataFrame:
    """Per group and month (``yyyy-MM``), plus one ``group = "ALL"`` row per month.

    Output: ``group, month, known_s, unknown_s, read_unavailable_s,
    one_reader_violation_s, one_reader_unresolved_s, incidents, incidents_over_limit,
    max_incident_read_unavailable_s, failovers_counted, read_availability, target,
    target_met``.
    """
    d = daily.select(
        "group",
        F.date_format("day", "yyyy-MM").alias("month"),
        "known_s",
        "unknown_s",
        "read_unavailable_s",
        "one_reader_violation_s",
        "one_reader_unresolved_s",
        "incidents",
        "incidents_over_limit",
        "max_incident_read_unavailable_s",
        "failovers_counted",
    )
    sums = [
        F.sum("known_s").alias("known_s"),
        F.sum("unknown_s").alias("unknown_s"),
        F.sum("read_unavailable_s").alias("read_unavailable_s"),
        F.sum("one_reader_violation_s").alias("one_reader_violation_s"),
        F.sum("one_reader_unresolved_s").alias("one_reader_unresolved_s"),
        F.sum("incidents").alias("incidents"),
        F.sum("incidents_over_limit").alias("incidents_over_limit"),
        F.max("max_incident_read_unavailable_s").alias("max_incident_read_unavailable_s"),
        F.sum("failovers_counted").alias("failovers_counted"),
    ]
    per_group = d.groupBy("group", "month").agg(*sums)
    overall = d.groupBy("month").agg(*sums).withColumn("group", F.lit(OVERALL))
    both = per_group.unionByName(overall)
    availability = F.when(
        F.col("known_s") > 0, 1.0 - F.col("read_unavailable_s") / F.col("known_s")
    )
    target = F.lit(float(targets.monthly_read_availability))
    return both.select(
        "group",
        "month",
        "known_s",
        "unknown_s",
        "read_unavailable_s",
        "one_reader_violation_s",
        "one_reader_unresolved_s",
        F.col("incidents").cast("long").alias("incidents"),
        F.col("incidents_over_limit").cast("long").alias("incidents_over_limit"),
        "max_incident_read_unavailable_s",
        "failovers_counted",
        availability.alias("read_availability"),
        target.alias("target"),
        (
            F.coalesce(availability >= target, F.lit(True)) & (F.col("incidents_over_limit") == 0)
        ).alias("target_met"),
    )


# --------------------------------------------------------------------------- event times
#
# docs/sla.md "Event times". The controller and the brokers export, as gauge values, the
# instant of every mode and READ change (each gauge holds the latest instant of its kind).
# Every distinct value such a gauge ever showed is one event, so the distinct values of a
# whole export are an event log of the group: the job collects them in its one pass over the
# input (an Observation of :func:`event_candidate`) and places every transition to the
# millisecond. A group whose log is incomplete keeps the bucket definitions above, and the
# report says which groups are exact and why the others are not (:func:`event_resolution`).

MODE_ENTERED = metric_names.GROUP_MODE_ENTERED
EXITED = metric_names.BROKER_EXITED
STARTED = metric_names.BROKER_STARTED
READ_GAINED = metric_names.BROKER_READ_GAINED
READ_LOST = metric_names.BROKER_READ_LOST
EVENT_METRICS = (MODE_ENTERED, EXITED, STARTED, READ_GAINED, READ_LOST)

# Event kinds, in the order events of one millisecond are applied: an exit or a restart ends
# READ before a gain at the same instant starts it.
KIND_EXITED, KIND_STARTED, KIND_LOST, KIND_GAINED, KIND_MODE = 0, 1, 2, 3, 4
_KINDS = {EXITED: KIND_EXITED, STARTED: KIND_STARTED, READ_LOST: KIND_LOST, READ_GAINED: KIND_GAINED,
          MODE_ENTERED: KIND_MODE}
# The ``mode`` label of MODE_ENTERED, by the mode's code in ``understudy_group_mode``.
MODE_NAMES = ("NORMAL", "FENCING", "SLAVE_CONSUME", "RECOVERING")

# What the Observation collects of :func:`event_candidate`: one row per distinct (series, value).
OBSERVED_EVENTS_SCHEMA = StructType(
    [
        StructField("group", StringType(), nullable=True),
        StructField("broker", StringType(), nullable=True),
        StructField("role", StringType(), nullable=True),
        StructField("mode", StringType(), nullable=True),
        StructField("metric", StringType(), nullable=True),
        StructField("value", DoubleType(), nullable=True),
    ]
)
EXACT = "durations exact (event times)"
# How long after a group's first sample its event log may begin (a new group: its brokers
# publish their first permission and the controller creates its state within seconds).
COVERAGE_SLACK_S = 30.0
NO_EVENT_TIMES = "no event-time series"


def scrape_resolution(step_s: float, why: str) -> str:
    """The resolution line of a group without (complete) event times."""
    return f"durations at scrape resolution ({step_s:g} s): {why}"


def event_candidate() -> Column:
    """Per keyed input row (``readers.KEYED_COLUMNS``): its ``(group, broker, role, mode,
    metric, value)`` when it is a usable event-time sample, else null. The job's
    Observation collects the distinct ones (``OBSERVED_EVENTS_SCHEMA``) as ``events`` in
    its one pass; each set is small: a gauge repeats its value until the next event of
    its kind."""
    usable = (
        F.col("ok")
        & F.col("metric").isin(*EVENT_METRICS)
        & F.col("group").isNotNull()
        & F.col("value").isNotNull()
        & ~F.isnan("value")
        & (F.col("value") > 0)  # an unset gauge would read 0 (1970): never an event
    )
    return F.when(usable, F.struct("group", "broker", "role", "mode", "metric", "value"))


def event_log(observed: DataFrame) -> DataFrame:
    """The observed event values (``OBSERVED_EVENTS_SCHEMA``) as events: ``group, broker,
    role, kind, mode, t_ms`` (``mode``: the code of the mode entered, for ``KIND_MODE``;
    ``broker``/``role`` are ``""`` for it). ``t_ms`` is the instant in whole milliseconds."""
    metric = F.col("metric")
    kind = F.lit(None).cast("int")
    for name, code in _KINDS.items():
        kind = F.when(metric == name, F.lit(code)).otherwise(kind)
    mode = F.lit(None).cast("int")
    for code, name in enumerate(MODE_NAMES):
        mode = F.when(F.col("mode") == name, F.lit(code)).otherwise(mode)
    is_mode = kind == KIND_MODE
    e = observed.select(
        "group",
        F.when(is_mode, F.lit("")).otherwise(F.coalesce("broker", F.lit(""))).alias("broker"),
        F.when(is_mode, F.lit("")).otherwise(F.coalesce("role", F.lit(""))).alias("role"),
        kind.alias("kind"),
        F.when(is_mode, mode).alias("mode"),
        millis_of(F.col("value") * 1000.0).alias("t_ms"),
    )
    return e.where(
        F.col("group").isNotNull()
        & F.col("t_ms").isNotNull()  # an instant no timestamp holds (1e300 s): not an event
        & F.col("kind").isNotNull()
        & F.when(F.col("kind") == KIND_MODE, F.col("mode").isNotNull()).otherwise(F.col("broker") != "")
    ).distinct()


def group_bounds(states: DataFrame, *, step_s: float) -> DataFrame:
    """Per group of :func:`group_states`: ``group, lo_ms, hi_ms`` (the start of its first
    bucket and the end of its last, the window its events are read in) and ``n_brokers``
    (the most permission series it showed at once)."""
    step_ms = int(step_s * 1000)
    b = states.groupBy("group").agg(
        F.min("bucket").alias("lo"), F.max("bucket").alias("hi"), F.max("perm_series").alias("n_brokers"))
    return b.select(
        "group",
        (F.col("lo") * F.lit(step_ms)).alias("lo_ms"),
        ((F.col("hi") + 1) * F.lit(step_ms)).alias("hi_ms"),
        F.coalesce("n_brokers", F.lit(0)).alias("n_brokers"),
    )


def _holding(events: DataFrame) -> DataFrame:
    """Events with ``h`` (the broker holds READ after it: 1 after a gain, 0 after a loss,
    a restart or an exit; null for mode events) and ``h_before`` (the same broker's ``h``
    before it, 0 for its first event)."""
    h = F.when(F.col("kind") == KIND_GAINED, 1).when(F.col("kind") != KIND_MODE, 0)
    wb = Window.partitionBy("group", "broker").orderBy("t_ms", "kind")
    e = events.withColumn("h", h)
    return e.withColumn("h_before", F.coalesce(F.lag("h").over(wb), F.lit(0)))


def event_resolution(events: DataFrame, bounds: DataFrame, *, step_s: float) -> DataFrame:
    """Per group of ``bounds`` (:func:`group_bounds`): ``group, exact, reason``. A group's
    transitions are placed from its events (``exact``) only when its event log is complete
    over its whole window; otherwise ``reason`` says what is missing, and the group keeps
    the bucket definitions (scrape resolution):

    - no event-time series at all (an export without them, or older brokers/controllers);
    - no mode events (a controller without them);
    - fewer brokers with a start event than the group has permission series;
    - event times that begin only inside the window, later than ``COVERAGE_SLACK_S`` (or
      two steps) after the group's first sample (a broker or controller upgraded
      mid-window: what happened before is not in the log; a group that is new in the
      window starts its log within seconds of its first sample);
    - a broker that restarted while its log says it held READ, without an exit event (a
      death no controller dated: when its READ ended is unknown).
    """
    b = bounds.select("group", "lo_ms", "n_brokers")
    h = _holding(events)
    brokers = h.where(F.col("kind") != KIND_MODE).groupBy("group").agg(
        F.count_distinct(F.when(F.col("kind") == KIND_STARTED, F.col("broker"))).alias("started"),
        F.sort_array(F.collect_set(F.when(
            (F.col("kind") == KIND_STARTED) & (F.col("h_before") == 1), F.col("broker")))).alias("undated"),
    )
    firsts = events.where(F.col("kind") != KIND_MODE).groupBy("group", "broker").agg(F.min("t_ms").alias("first"))
    first_broker = firsts.groupBy("group").agg(F.max("first").alias("brokers_from"))
    modes = events.where(F.col("kind") == KIND_MODE).groupBy("group").agg(F.min("t_ms").alias("modes_from"))
    anything = events.select("group").distinct().withColumn("any", F.lit(True))
    j = (
        b.join(anything, on="group", how="left")
        .join(modes, on="group", how="left")
        .join(brokers, on="group", how="left")
        .join(first_broker, on="group", how="left")
    )
    since = F.greatest("modes_from", "brokers_from")
    slack_ms = int(max(COVERAGE_SLACK_S, 2 * step_s) * 1000)
    fallback = F.concat(F.lit(scrape_resolution(step_s, "")), F.coalesce(
        F.when(F.col("any").isNull(), F.lit(NO_EVENT_TIMES))
        .when(F.col("modes_from").isNull(), F.lit("no mode event times from the controller"))
        .when(F.coalesce("started", F.lit(0)) < F.col("n_brokers"),
              F.lit("a broker exports no event-time series"))
        .when(since > F.col("lo_ms") + F.lit(slack_ms), F.concat(
            F.lit("event times begin only at "),
            F.date_format(F.timestamp_millis(since), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")))
        .when(F.size("undated") > 0, F.concat(
            F.array_join("undated", ", "),
            F.lit(" restarted while holding READ, and no controller dated its exit")))
    ))
    return j.select("group", fallback.isNull().alias("exact"), F.coalesce(fallback, F.lit(EXACT)).alias("reason"))


def exact_segments(events: DataFrame, bounds: DataFrame) -> DataFrame:
    """The event log of each group in ``bounds`` as segments of constant state: ``group,
    t0, t1`` (ms, clipped to the group's window), ``readers`` (brokers holding READ),
    ``masters`` (of them, role master), ``mode`` (code), ``hi_ms``, and the incident each
    segment belongs to: ``incident`` (the instant the master lost READ, the incident's
    key; null outside incidents), ``restored`` (when reads came back in it) and ``end``
    (when it ended: the group healthy again, or ``hi_ms`` while still open).

    *Healthy* is mode NORMAL with the master holding READ. An incident is a maximal
    stretch of unhealthy time in which the mode left NORMAL, from the first instant in it
    at which the master lacked READ (an exit, a loss, a lapse) to the instant it was
    healthy again. Unhealthy time before the master lost READ (a FENCING while it still
    read) is not part of it; unhealthy stretches without a failover are no incident (their
    unreadable time is reported outside incidents), as with buckets.
    """
    h = _holding(events).join(bounds.select("group", "lo_ms", "hi_ms"), on="group", how="inner")
    w = Window.partitionBy("group").orderBy("t_ms", "kind", "broker")
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    delta = F.col("h") - F.col("h_before")
    s = h.select(
        "group",
        "lo_ms",
        "hi_ms",
        F.greatest("t_ms", "lo_ms").alias("t0"),
        F.least(F.coalesce(F.lead("t_ms").over(w), F.col("hi_ms")), F.col("hi_ms")).alias("t1"),
        F.coalesce(F.sum(delta).over(upto), F.lit(0)).cast("int").alias("readers"),
        F.coalesce(F.sum(F.when(F.col("role") == "master", delta)).over(upto), F.lit(0)).cast("int").alias("masters"),
        F.last(F.col("mode"), ignorenulls=True).over(upto).alias("mode"),
    ).where(F.col("t1") > F.col("t0"))
    # (no mode yet: a new group before its controller created its state; not healthy)
    healthy = F.coalesce((F.col("mode") == MODE_NORMAL) & (F.col("masters") >= 1), F.lit(False))
    ws = Window.partitionBy("group").orderBy("t0")
    s = s.withColumn("healthy", healthy)
    new_run = F.coalesce(F.lag("healthy").over(ws) != F.col("healthy"), F.lit(True))
    s = s.withColumn("run", F.sum(new_run.cast("int")).over(ws.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    wr = Window.partitionBy("group", "run")
    t0 = F.col("t0")
    failover = F.max((F.col("mode") != MODE_NORMAL).cast("int")).over(wr) == 1
    lost = F.min(F.when(F.col("masters") == 0, t0)).over(wr)
    s = s.withColumn("incident", F.when(~F.col("healthy") & failover, lost))
    restored = F.min(F.when((t0 >= F.col("incident")) & (F.col("readers") >= 1), t0)).over(wr)
    inside = F.col("incident").isNotNull() & (t0 >= F.col("incident"))
    return s.select(
        "group",
        "t0",
        "t1",
        "readers",
        "masters",
        "mode",
        "hi_ms",
        F.when(inside, F.col("incident")).alias("incident"),
        F.when(inside, restored).alias("restored"),
        F.when(inside, F.max("t1").over(wr)).alias("end"),
    )


def exact_pieces(segments: DataFrame, states: DataFrame, *, step_s: float) -> DataFrame:
    """The parts of :func:`exact_segments` that count (in an incident, nobody reading, or
    two readers), cut at bucket boundaries and kept where the bucket is *known*: ``group,
    bucket, p0, p1, ms`` (milliseconds: sums stay exact), ``readers, mode, incident,
    restored``. Unknown time
    is never unavailable, with event times as with samples. Only these pieces are cut into
    buckets: steady single-reader time is never expanded."""
    step_ms = int(step_s * 1000)
    counted = segments.where(F.col("incident").isNotNull() | (F.col("readers") == 0) | (F.col("readers") >= 2))
    first_b = F.floor(F.col("t0") / F.lit(step_ms))
    last_b = F.floor((F.col("t1") - 1) / F.lit(step_ms))
    cut = counted.select("*", F.explode(F.sequence(first_b, last_b)).alias("bucket"))
    lo = F.col("bucket") * F.lit(step_ms)
    pieces = cut.select(
        "group",
        "bucket",
        F.greatest("t0", lo).alias("p0"),
        F.least(F.col("t1"), lo + F.lit(step_ms)).alias("p1"),
        "readers",
        "mode",
        "incident",
        "restored",
    )
    known = states.where(F.col("known")).select("group", "bucket")
    joined = known.join(F.broadcast(pieces), on=["group", "bucket"], how="inner")
    return joined.select(
        "group", "bucket", "p0", "p1", (F.col("p1") - F.col("p0")).alias("ms"),
        "readers", "mode", "incident", "restored",
    )


def exact_incidents(segments: DataFrame, pieces: DataFrame, events: DataFrame) -> DataFrame:
    """Incidents of the exact groups (``INCIDENT_COLUMNS``, times to the millisecond):
    ``master_lost_at`` the master's loss of READ, ``reads_restored_at`` the first READ after
    it, ``master_back_at`` the master's first restart or READ gain from then on,
    ``normal_at`` healthy again (null while open); the seconds are sums of the known
    pieces: nobody reading, of that after reads were restored (failback gap), two readers
    (a violation: event times leave nothing unresolved), RECOVERING (back-sync); unknown is
    the rest of the incident's span."""
    spans = segments.where(F.col("incident").isNotNull()).groupBy("group", "incident").agg(
        F.min("restored").alias("restored"), F.max("end").alias("end"), F.max("hi_ms").alias("hi_ms"))
    p = pieces.where(F.col("incident").isNotNull())
    nobody = F.col("readers") == 0
    sums = p.groupBy("group", "incident").agg(
        F.sum(F.when(nobody, F.col("ms"))).alias("unavailable"),
        F.sum(F.when(nobody & (F.col("p0") >= F.col("restored")), F.col("ms"))).alias("gap"),
        F.sum(F.when(F.col("readers") >= 2, F.col("ms"))).alias("violation"),
        F.sum(F.when(F.col("mode") == MODE_RECOVERING, F.col("ms"))).alias("backsync"),
        F.sum("ms").alias("known"),
    )
    master = events.where((F.col("role") == "master") & F.col("kind").isin(KIND_STARTED, KIND_GAINED)).select(
        F.col("group").alias("m_group"), F.col("t_ms").alias("m_t"))
    back = spans.join(
        master,
        on=(spans["group"] == master["m_group"]) & (master["m_t"] >= spans["restored"]) & (master["m_t"] <= spans["end"]),
        how="inner",
    ).groupBy("group", "incident").agg(F.min("m_t").alias("back"))
    j = spans.join(sums, on=["group", "incident"], how="left").join(back, on=["group", "incident"], how="left")
    is_open = F.col("end") >= F.col("hi_ms")
    duration_ms = F.col("end") - F.col("incident")
    duration = duration_ms / F.lit(1000.0)

    def s(c: str) -> Column:  # milliseconds -> seconds, once
        return F.coalesce(F.col(c), F.lit(0)) / F.lit(1000.0)

    return j.select(
        "group",
        F.timestamp_millis("incident").alias("master_lost_at"),
        F.timestamp_millis("restored").alias("reads_restored_at"),
        F.timestamp_millis("back").alias("master_back_at"),
        F.when(~is_open, F.timestamp_millis("end")).alias("normal_at"),
        s("unavailable").alias("read_unavailable_s"),
        s("gap").alias("failback_gap_s"),
        s("violation").alias("one_reader_violation_s"),
        F.lit(0.0).alias("one_reader_unresolved_s"),
        s("backsync").alias("backsync_s"),
        ((duration_ms - F.coalesce(F.col("known"), F.lit(0))) / F.lit(1000.0)).alias("unknown_s"),
        duration.alias("duration_s"),
        is_open.alias("open"),
    )


def exact_outside(pieces: DataFrame) -> DataFrame:
    """Known time with nobody reading outside any incident, for the exact groups, as
    stretches of adjacent pieces (``OUTSIDE_COLUMNS``)."""
    o = pieces.where(F.col("incident").isNull() & (F.col("readers") == 0))
    w = Window.partitionBy("group").orderBy("p0")
    new_run = F.coalesce(F.lag("p1").over(w) != F.col("p0"), F.lit(True))
    o = o.withColumn("run", F.sum(new_run.cast("int")).over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    runs = o.groupBy("group", "run").agg(F.min("p0").alias("p0"), F.max("p1").alias("p1"), F.sum("ms").alias("ms"))
    return runs.select(
        "group",
        F.timestamp_millis("p0").alias("start"),
        F.timestamp_millis("p1").alias("end"),
        (F.col("ms") / F.lit(1000.0)).alias("read_unavailable_s"),
    )


def exact_days(pieces: DataFrame, *, step_s: float) -> DataFrame:
    """Per exact group and UTC day: ``exact_unavailable_s`` (nobody reading) and
    ``exact_violation_s`` (two readers), for :func:`daily_sla`."""
    day = F.to_date(_at(F.col("bucket"), step_s))
    def seconds(when: Column) -> Column:
        return F.coalesce(F.sum(F.when(when, F.col("ms"))), F.lit(0)) / F.lit(1000.0)

    return pieces.withColumn("day", day).groupBy("group", "day").agg(
        seconds(F.col("readers") == 0).alias("exact_unavailable_s"),
        seconds(F.col("readers") >= 2).alias("exact_violation_s"),
    )


TIMELINE_COLUMNS = ["group", "state", "start", "end", "seconds"]


def exact_timeline(segments: DataFrame, bucket_timeline: DataFrame) -> DataFrame:
    """The state timeline (``TIMELINE_COLUMNS``, :func:`timeline`) of the groups of
    ``segments`` (:func:`exact_segments`) at event resolution: every transition at its
    instant (a 62 ms failover between two scrapes is a 62 ms ``unreadable`` run). The
    states are the timeline's: nobody reading ``unreadable``, two brokers ``two_readers``
    (the events decide: nothing is unresolved), the master reading ``normal``, else
    ``slave_read``. Time the buckets do not know (``unknown`` runs of ``bucket_timeline``,
    holes included) stays unknown, as in every total."""
    groups = segments.select("group").distinct()
    runs = bucket_timeline.join(F.broadcast(groups), on="group", how="left_semi").select(
        "group", "state", F.unix_millis("start").alias("r0"), F.unix_millis("end").alias("r1"))
    unknown = runs.where(F.col("state") == STATE_UNKNOWN).select(
        "group", "state", F.col("r0").alias("p0"), F.col("r1").alias("p1"))
    known = runs.where(F.col("state") != STATE_UNKNOWN).select("group", "r0", "r1")
    state = (
        F.when(F.col("readers") == 0, STATE_UNREADABLE)
        .when(F.col("readers") >= 2, STATE_TWO_READERS)
        .when(F.col("masters") >= 1, STATE_NORMAL)
        .otherwise(STATE_SLAVE_READ)
    )
    seg = segments.select("group", "t0", "t1", state.alias("state"))
    cut = seg.join(known, on="group", how="inner").where((F.col("t0") < F.col("r1")) & (F.col("t1") > F.col("r0")))
    pieces = cut.select("group", "state", F.greatest("t0", "r0").alias("p0"), F.least("t1", "r1").alias("p1"))
    both = pieces.unionByName(unknown)
    w = Window.partitionBy("group").orderBy("p0", "p1")
    new_run = F.coalesce((F.lag("state").over(w) != F.col("state")) | (F.lag("p1").over(w) != F.col("p0")), F.lit(True))
    both = both.withColumn("run", F.sum(new_run.cast("int")).over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    merged = both.groupBy("group", "run").agg(F.first("state").alias("state"), F.min("p0").alias("p0"),
                                               F.max("p1").alias("p1"))
    return merged.select(
        "group", "state", F.timestamp_millis("p0").alias("start"), F.timestamp_millis("p1").alias("end"),
        ((F.col("p1") - F.col("p0")) / F.lit(1000.0)).alias("seconds"),
    )


@dataclass(frozen=True, slots=True)
class ExactTables:
    """What the event times give the exact groups (:func:`exact_tables`): ``groups``
    (``group, exact = true``), their ``incidents`` and ``outside`` stretches, ``days`` for
    :func:`daily_sla`, the ``pieces`` that count and the ``segments`` of constant state
    (for the timeline)."""

    groups: DataFrame
    incidents: DataFrame
    outside: DataFrame
    days: DataFrame
    pieces: DataFrame
    segments: DataFrame

    def merge_timeline(self, bucket_timeline: DataFrame) -> DataFrame:
        """The timeline of every group: the exact groups' at event resolution
        (:func:`exact_timeline`), the others' from the buckets."""
        others = bucket_timeline.join(F.broadcast(self.groups), on="group", how="left_anti")
        exact = exact_timeline(self.segments, bucket_timeline)
        return others.select(*TIMELINE_COLUMNS).unionByName(exact.select(*TIMELINE_COLUMNS))

    def merge_incidents(self, bucket_incidents: DataFrame) -> DataFrame:
        """The incidents of every group: the exact groups' from their events, the others'
        from the buckets."""
        others = bucket_incidents.join(F.broadcast(self.groups), on="group", how="left_anti")
        return others.select(*INCIDENT_COLUMNS).unionByName(self.incidents.select(*INCIDENT_COLUMNS))

    def merge_outside(self, bucket_outside: DataFrame) -> DataFrame:
        others = bucket_outside.join(F.broadcast(self.groups), on="group", how="left_anti")
        return others.select(*OUTSIDE_COLUMNS).unionByName(self.outside.select(*OUTSIDE_COLUMNS))


def exact_tables(events: DataFrame, resolution: DataFrame, bounds: DataFrame, states: DataFrame, *,
                 step_s: float) -> ExactTables:
    """The event-time tables of the groups :func:`event_resolution` found exact. ``events``:
    :func:`event_log`; ``states``: the per-bucket states (for which buckets are known)."""
    groups = resolution.where(F.col("exact")).select("group", "exact")
    exact_bounds = bounds.join(F.broadcast(groups.select("group")), on="group", how="inner")
    segments = exact_segments(events, exact_bounds)
    pieces = exact_pieces(segments, states, step_s=step_s)
    return ExactTables(
        groups=groups,
        incidents=exact_incidents(segments, pieces, events),
        outside=exact_outside(pieces),
        days=exact_days(pieces, step_s=step_s),
        pieces=pieces,
        segments=segments,
    )
