"""Topic-level SLA: per topic, could producers write and could consumers read every queue.

Why this module exists: users are audited per topic, not per group ("writes to topic T were
possible 99.99 % of the month, every queue of T was readable 99.95 %"), while the failover
SLA knows groups. A topic is a list of queues spread over groups (DESIGN "Topics across
groups"), so one group's failover takes away part of a topic. The controller exports where
each queue lives (``understudy_topic_queue_info{topic,queue,group} 1``); this module joins
that placement to the per-group states the job already has (docs/sla.md "Topic SLA").

Everything is kept as intervals, never expanded per bucket and topic: a queue's placement
is a few runs of buckets, a group's conditions (known, writable, unreadable) change only at
incidents and scrape gaps, so a topic's state is a sweep over the starts and ends of those
intervals (:func:`topic_segments`). Groups whose durations are exact (event times) give
their unreadable time to the millisecond (the job's exact ``pieces``); WRITE has no event
times, so writability is at scrape resolution for every group.

Per topic, at each instant of its lifetime (its first placement to its last):

- *known*: the placement series was scraped (``understudy_topic_queue_info`` has a sample
  of some topic at that bucket) and every queue's group is known; otherwise unknown, never
  counted as unavailable;
- *write available*: known, and some queue's group has a broker holding WRITE;
- *read full*: known and every queue's group readable; *read partial*: some but not all;
  *read none*: none;
- a topic with no queue while placements were scraped (deleted and created again later) is
  absent: neither known nor unknown.

``write_availability`` and ``read_availability`` (full reads) are fractions of known time;
``target_met`` requires both to reach the topic's target.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from understudy_broker import metric_names

QUEUE_INFO = metric_names.TOPIC_QUEUE_INFO
CONSUMER_LAG = metric_names.CONSUMER_LAG_MESSAGES
TOPIC_METRICS = (QUEUE_INFO, CONSUMER_LAG)

# What the topic pass reads (readers.read_labelled + topic_rows).
TOPIC_ROWS_SCHEMA = StructType(
    [
        StructField("ts_ms", LongType(), nullable=False),
        StructField("metric", StringType(), nullable=False),
        StructField("group", StringType(), nullable=True),
        StructField("topic", StringType(), nullable=True),
        StructField("queue", StringType(), nullable=True),
        StructField("consumer_group", StringType(), nullable=True),
        StructField("value", DoubleType(), nullable=True),
    ]
)

# The contract columns of topics.csv come first, in this order (issue 17).
TOPIC_MONTHLY_COLUMNS = [
    "topic", "month", "write_availability", "read_availability", "target_met", "target",
    "known_s", "unknown_s", "write_unavailable_s", "read_partial_s", "read_none_s",
    "write_available_s", "read_full_s",
]
TOPIC_DAILY_COLUMNS = ["topic", "day", *TOPIC_MONTHLY_COLUMNS[2:]]
LAG_COLUMNS = ["topic", "consumer_group", "month", "buckets", "lag_p50", "lag_p95", "lag_p99", "lag_max"]

_KINDS = ("known", "writable", "unreadable")


def topic_rows(samples: DataFrame) -> DataFrame:
    """The long table of the topic series (``readers.SAMPLES_SCHEMA``, already only
    ``TOPIC_METRICS``) -> ``TOPIC_ROWS_SCHEMA``: the labels the topic SLA uses, an empty
    label being no label, staleness markers and NaN dropped."""
    labels = F.col("labels")

    def label(name: str) -> Column:
        v = labels[name]
        return F.when(v != "", v)

    return samples.where(
        F.col("metric").isin(*TOPIC_METRICS) & F.col("value").isNotNull() & ~F.isnan("value")
    ).select(
        F.unix_millis("timestamp").alias("ts_ms"),
        "metric",
        label("group").alias("group"),
        label("topic").alias("topic"),
        label("queue").alias("queue"),
        label("consumer_group").alias("consumer_group"),
        "value",
    )


def _runs(df: DataFrame, keys: list[str]) -> DataFrame:
    """Distinct ``keys + bucket`` rows -> runs of consecutive buckets: ``keys, b0, b1``
    (``b1`` exclusive)."""
    w = Window.partitionBy(*keys).orderBy("bucket")
    new = F.coalesce(F.lag("bucket").over(w) != F.col("bucket") - 1, F.lit(True))
    r = df.withColumn("run", F.sum(new.cast("int")).over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    return r.groupBy(*keys, "run").agg(F.min("bucket").alias("b0"), (F.max("bucket") + 1).alias("b1")).drop("run")


def placements(rows: DataFrame, *, step_s: float) -> DataFrame:
    """Where each queue lived, as runs: ``topic, queue, group, p0, p1`` (ms, the buckets
    its info series was scraped in)."""
    step_ms = int(step_s * 1000)
    info = rows.where(
        (F.col("metric") == QUEUE_INFO) & F.col("topic").isNotNull() & F.col("queue").isNotNull()
        & F.col("group").isNotNull() & (F.col("value") > 0)
    ).select("topic", "queue", "group", F.floor(F.col("ts_ms") / F.lit(step_ms)).alias("bucket")).distinct()
    runs = _runs(info, ["topic", "queue", "group"])
    return runs.select("topic", "queue", "group", (F.col("b0") * step_ms).alias("p0"), (F.col("b1") * step_ms).alias("p1"))


def exporter_runs(rows: DataFrame, *, step_s: float) -> DataFrame:
    """The buckets in which the placement series was scraped at all (any topic), as runs
    ``e0, e1`` (ms): outside them a topic's queues are unknown, not gone."""
    step_ms = int(step_s * 1000)
    buckets = rows.where(F.col("metric") == QUEUE_INFO).select(
        F.floor(F.col("ts_ms") / F.lit(step_ms)).alias("bucket")).distinct().withColumn("one", F.lit(1))
    runs = _runs(buckets, ["one"])
    return runs.select((F.col("b0") * step_ms).alias("e0"), (F.col("b1") * step_ms).alias("e1"))


def group_conditions(states: DataFrame, *, step_s: float, exact_pieces: DataFrame | None = None) -> DataFrame:
    """Per group, the intervals (ms) in which it is ``known``, ``writable`` (known, a
    broker holds WRITE) and ``unreadable`` (known, nobody holds READ): ``group, kind, t0,
    t1``, from the per-bucket ``states``. With ``exact_pieces`` (``ExactTables.pieces``) the
    groups it holds take their unreadable time from the event times instead."""
    step_ms = int(step_s * 1000)
    kinds = F.array_compact(F.array(
        F.when(F.col("known"), F.lit("known")),
        F.when(F.col("known") & (F.col("writers") >= 1), F.lit("writable")),
        F.when(F.col("known") & ~F.col("readable"), F.lit("unreadable")),
    ))
    flagged = states.select("group", "bucket", F.explode(kinds).alias("kind"))
    runs = _runs(flagged, ["group", "kind"]).select(
        "group", "kind", (F.col("b0") * step_ms).alias("t0"), (F.col("b1") * step_ms).alias("t1"))
    if exact_pieces is None:
        return runs
    exact_groups = exact_pieces.select("group").distinct()
    bucket_unreadable = runs.where(F.col("kind") == "unreadable").join(exact_groups, on="group", how="left_anti")
    exact_unreadable = exact_pieces.where(F.col("readers") == 0).select(
        "group", F.lit("unreadable").alias("kind"), F.col("p0").alias("t0"), F.col("p1").alias("t1"))
    return runs.where(F.col("kind") != "unreadable").unionByName(bucket_unreadable).unionByName(exact_unreadable)


def topic_segments(placed: DataFrame, exporter: DataFrame, conditions: DataFrame) -> DataFrame:
    """Each topic's lifetime as segments of constant state: ``topic, t0, t1`` (ms) and
    ``state`` flags ``known``, ``write_ok``, ``read_full``, ``read_partial``, ``read_none``
    (``unknown``: in the lifetime, not known and not absent).

    A sweep over interval ends: per topic, the number of queues placed (``q``), of them
    on a known group (``k``), a writable one (``w``), an unreadable one (``u``), and
    whether placements were scraped (``e``)."""
    zero = F.lit(0)

    def events(df: DataFrame, t0: str, t1: str, column: str) -> DataFrame:
        deltas = {c: zero for c in ("dq", "dk", "dw", "du", "de")}
        up = df.select("topic", F.col(t0).alias("t"), *[(F.lit(1) if c == column else v).alias(c) for c, v in deltas.items()])
        down = df.select("topic", F.col(t1).alias("t"), *[(F.lit(-1) if c == column else v).alias(c) for c, v in deltas.items()])
        return up.unionByName(down)

    overlap = placed.join(conditions, on="group", how="inner").where(
        (F.col("t0") < F.col("p1")) & (F.col("t1") > F.col("p0"))
    ).select(
        "topic", "kind", F.greatest("t0", "p0").alias("c0"), F.least("t1", "p1").alias("c1"))
    topics = placed.select("topic").distinct()
    scraped = topics.crossJoin(exporter)
    parts = [events(placed, "p0", "p1", "dq"), events(scraped, "e0", "e1", "de")]
    for kind, column in zip(_KINDS, ("dk", "dw", "du"), strict=True):
        parts.append(events(overlap.where(F.col("kind") == kind), "c0", "c1", column))
    allev = parts[0]
    for p in parts[1:]:
        allev = allev.unionByName(p)
    summed = allev.groupBy("topic", "t").agg(*[F.sum(c).alias(c) for c in ("dq", "dk", "dw", "du", "de")])
    w = Window.partitionBy("topic").orderBy("t")
    running = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    seg = summed.select(
        "topic",
        F.col("t").alias("t0"),
        F.lead("t").over(w).alias("t1"),
        *[F.sum(c).over(running).alias(c[1:]) for c in ("dq", "dk", "dw", "du", "de")],
    ).where(F.col("t1").isNotNull())
    life = placed.groupBy("topic").agg(F.min("p0").alias("life0"), F.max("p1").alias("life1"))
    seg = seg.join(life, on="topic", how="inner").where((F.col("t0") >= F.col("life0")) & (F.col("t1") <= F.col("life1")))
    q, k, wr, u, e = (F.col(c) for c in ("q", "k", "w", "u", "e"))
    known = (q > 0) & (e > 0) & (k == q)
    absent = (q == 0) & (e > 0)
    return seg.select(
        "topic", "t0", "t1",
        known.alias("known"),
        (~known & ~absent).alias("unknown"),
        (known & (wr > 0)).alias("write_ok"),
        (known & (u == 0)).alias("read_full"),
        (known & (u > 0) & (u < q)).alias("read_partial"),
        (known & (u >= q)).alias("read_none"),
    )


def _target(targets: Mapping[str, float], default: float) -> Column:
    t = F.lit(float(default))
    for name, value in sorted(targets.items()):
        t = F.when(F.col("topic") == name, F.lit(float(value))).otherwise(t)
    return t


def _verdicts(targets: Mapping[str, float], default: float) -> list[Column]:
    known = F.col("known_s")
    write = F.when(known > 0, F.col("write_available_s") / known)
    read = F.when(known > 0, F.col("read_full_s") / known)
    target = _target(targets, default)
    met = F.coalesce((write >= target) & (read >= target), F.lit(True))
    return [write.alias("write_availability"), read.alias("read_availability"), met.alias("target_met"),
            target.alias("target")]


_SECONDS = ("known_s", "unknown_s", "write_unavailable_s", "read_partial_s", "read_none_s",
            "write_available_s", "read_full_s")


def topic_daily(segments: DataFrame, *, targets: Mapping[str, float], default: float) -> DataFrame:
    """Per topic and UTC day (``TOPIC_DAILY_COLUMNS``): the seconds of each state (exact to
    the millisecond: sums of milliseconds) and the verdict against the topic's target."""
    day_ms = 86_400_000
    days = F.sequence(F.floor(F.col("t0") / day_ms), F.floor((F.col("t1") - 1) / day_ms))
    cut = segments.select("*", F.explode(days).alias("d"))
    d0 = F.col("d") * day_ms
    ms = F.least(F.col("t1"), d0 + day_ms) - F.greatest(F.col("t0"), d0)
    cut = cut.select("*", ms.alias("ms"), F.to_date(F.timestamp_millis(d0)).alias("day"))

    def secs(flag: Column) -> Column:
        return (F.coalesce(F.sum(F.when(flag, F.col("ms"))), F.lit(0)) / F.lit(1000.0))

    k = F.col("known")
    sums = cut.groupBy("topic", "day").agg(
        secs(k).alias("known_s"),
        secs(F.col("unknown")).alias("unknown_s"),
        secs(k & ~F.col("write_ok")).alias("write_unavailable_s"),
        secs(F.col("read_partial")).alias("read_partial_s"),
        secs(F.col("read_none")).alias("read_none_s"),
        secs(F.col("write_ok")).alias("write_available_s"),
        secs(F.col("read_full")).alias("read_full_s"),
    )
    return sums.select("topic", "day", *_verdicts(targets, default), *_SECONDS).select(*TOPIC_DAILY_COLUMNS)


def topic_monthly(daily: DataFrame, *, targets: Mapping[str, float], default: float) -> DataFrame:
    """Per topic and month (``yyyy-MM``, ``TOPIC_MONTHLY_COLUMNS``): the daily seconds
    summed, so the months add up to the days."""
    sums = daily.groupBy("topic", F.date_format("day", "yyyy-MM").alias("month")).agg(
        *[F.sum(c).alias(c) for c in _SECONDS])
    return sums.select("topic", "month", *_verdicts(targets, default), *_SECONDS).select(*TOPIC_MONTHLY_COLUMNS)


def consumer_lag(rows: DataFrame, *, step_s: float) -> DataFrame:
    """Consumer lag per topic, consumer group and month (``LAG_COLUMNS``): per bucket, the
    lag of the consumer group on the topic (the latest value of each queue in the bucket,
    summed over the queues that have one), then percentiles over the month's buckets with
    a sample. A queue whose group nobody reads exports no lag (its broker holding READ
    exports it), so those buckets count the readable queues only."""
    step_ms = int(step_s * 1000)
    lag = rows.where(
        (F.col("metric") == CONSUMER_LAG) & F.col("topic").isNotNull() & F.col("consumer_group").isNotNull()
        & F.col("queue").isNotNull()
    ).select("topic", "consumer_group", "queue", "ts_ms", "value",
             F.floor(F.col("ts_ms") / F.lit(step_ms)).alias("bucket"))
    per_queue = lag.groupBy("topic", "consumer_group", "queue", "bucket").agg(F.max_by("value", "ts_ms").alias("v"))
    per_bucket = per_queue.groupBy("topic", "consumer_group", "bucket").agg(F.sum("v").alias("lag"))
    month = F.date_format(F.timestamp_millis(F.col("bucket") * F.lit(step_ms)), "yyyy-MM")
    out = per_bucket.groupBy("topic", "consumer_group", month.alias("month")).agg(
        F.count(F.lit(1)).alias("buckets"),
        F.percentile("lag", F.lit(0.5)).alias("lag_p50"),
        F.percentile("lag", F.lit(0.95)).alias("lag_p95"),
        F.percentile("lag", F.lit(0.99)).alias("lag_p99"),
        F.max("lag").alias("lag_max"),
    )
    return out.select(*LAG_COLUMNS)
