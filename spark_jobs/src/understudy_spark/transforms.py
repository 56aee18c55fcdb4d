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
        StructField("value", DoubleType(), nullable=True),
    ]
)

MODE_NORMAL = 0
MODE_RECOVERING = 3
READ_BIT = 1

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
    must be readable, per month (also applied per day in the daily table)."""

    incident_read_unavailable_s: float = 60.0
    monthly_read_availability: float = 0.999


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
    """The long table (``readers.SAMPLES_SCHEMA``) keyed by the three labels the SLA
    uses: ``timestamp, metric, group, broker, role, value`` (``KEYED_SCHEMA``).

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
        "value",
    )


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
    deduped = (
        rows.repartition("group")
        .groupBy("group", "broker", "role", "m", "bucket")
        .agg(F.max_by("value", "ts_ms").alias("value"))
    )
    return deduped.select("group", "broker", "role", name.alias("metric"), "bucket", "value")


def group_states(clean: DataFrame) -> DataFrame:
    """One row per (group, bucket) that has any sample.

    Output: ``group, bucket, mode, master_read, readers, perm_series, brokers_down,
    failovers, known, readable, violation, unresolved``. ``known`` follows DESIGN: the
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
    per_bucket = (
        clean.select("group", "broker", "role", "metric", "bucket", "value")
        .groupBy("group", "bucket")
        .agg(
            F.max(F.when(metric == MODE, value)).cast("int").alias("mode"),
            F.max(F.when(is_perm & (F.col("role") == "master"), read)).alias("master_read"),
            F.coalesce(F.sum(F.when(is_perm, read)), F.lit(0)).cast("int").alias("readers"),
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
    return per_bucket.select(
        "group",
        "bucket",
        "mode",
        "master_read",
        "readers",
        "perm_series",
        "brokers_down",
        "failovers",
        known.alias("known"),
        (F.col("readers") >= 1).alias("readable"),
        proven.alias("violation"),
        (two & ~proven).alias("unresolved"),
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
    has_mode = F.max(mode.isNotNull().cast("int")).over(_whole()) == 1
    ever_readable = F.coalesce(F.max(F.col("readable").cast("int")).over(_before()), F.lit(0))
    fault = F.when(
        has_mode, mode.isNotNull() & (mode != MODE_NORMAL) & (F.coalesce(master_read, F.lit(0)) == 0)
    ).otherwise(F.col("known") & ~F.col("readable") & (ever_readable == 1))
    healthy = (master_read == 1) & F.when(has_mode, mode == MODE_NORMAL).otherwise(F.lit(True))
    event = F.when(fault, 1).when(healthy, 0)

    base = list(states.columns)
    s = states.withColumn("in_i", F.coalesce(F.last(event, ignorenulls=True).over(_running()), F.lit(0)))
    s = s.withColumn("prev_in", F.coalesce(F.lag("in_i").over(_by_group()), F.lit(0)))
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
    after = _by_group().rowsBetween(Window.currentRow, Window.unboundedFollowing)
    nxt = F.first(
        F.when(~candidate, F.struct(bucket.alias("b"), F.col("rn").alias("rn"), F.col("is_start").alias("start"))),
        ignorenulls=True,
    ).over(after)
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
) -> DataFrame:
    """Per group and UTC day inside ``[first_bucket, last_bucket]``.

    Output: ``group, day, known_s, unknown_s, read_unavailable_s, one_reader_violation_s,
    one_reader_unresolved_s, incidents, incidents_over_limit,
    max_incident_read_unavailable_s, failovers_counted, read_availability, target,
    target_met``. ``read_availability`` is readable time over *known* time; unknown time
    is only reported.
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
    target = F.lit(float(targets.monthly_read_availability))
    over = F.coalesce(F.col("incidents_over_limit"), F.lit(0))
    return joined.select(
        "group",
        "day",
        (known_n * step).alias("known_s"),
        ((F.col("expected_n") - known_n) * step).alias("unknown_s"),
        (unavail_n * step).alias("read_unavailable_s"),
        (F.coalesce(F.col("violation_n"), F.lit(0)) * step).alias("one_reader_violation_s"),
        (F.coalesce(F.col("unresolved_n"), F.lit(0)) * step).alias("one_reader_unresolved_s"),
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
