"""The SLA job: read exports, call the transforms, write the tables and the report.

Why this module exists: it is the only place with I/O. It runs unchanged in ``local[*]``
(``understudy sla report``) and under ``spark-submit`` on a cluster (``spark-submit
.../understudy_spark/job.py --input hdfs://... --out hdfs://...`` or ``python -m
understudy_spark.job``): it never sets a master when spark-submit already did, and writes
every output through Spark or the Hadoop FileSystem API, so ``--out`` may be any Hadoop
path.

Rejected lines are counted by a Spark ``Observation`` riding on the pass that builds the
per-group states; text exports get one quick pass before it that collects their distinct
series heads (see ``readers._with_heads``). The same Observation collects the distinct
values of the event-time series (docs/sla.md "Event times"), from which the groups with a
complete event log get their transitions placed to the millisecond.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from understudy_spark import promapi, readers, report, topics, transforms
from understudy_spark.readers import InputError
from understudy_spark.transforms import ExactTables, Targets

Progress = Callable[[str], None]
_KEEP_OBSERVATIONS = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


@dataclass(frozen=True, slots=True)
class JobConfig:
    """What ``understudy sla report`` was asked to do."""

    inputs: tuple[str, ...]
    out: str
    step_s: float = 15.0
    targets: Targets = field(default_factory=Targets)
    skip_bad: bool = False


@dataclass(frozen=True, slots=True)
class JobResult:
    """What the job found and wrote."""

    files: int
    samples: int
    rejected_lines: int
    rejected_by_file: dict[str, int]
    groups: int
    incidents: int
    open_incidents: int
    outputs: tuple[str, ...]
    seconds: float


def build_session(
    *,
    master: str | None = None,
    shuffle_partitions: int = 8,
    app: str = "understudy-sla",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession configured for this job.

    Under spark-submit (``PYSPARK_GATEWAY_PORT`` is set) the master and resources come
    from spark-submit. Otherwise it runs in ``local[*]`` bound to 127.0.0.1 with the UI
    off, as on a developer machine or in CI. ``conf`` adds or overrides settings (the
    tests use it for a small, quick session).
    """
    builder = SparkSession.builder.appName(app)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is not None or not under_submit:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.master(master or "local[*]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", os.environ.get("UNDERSTUDY_SPARK_DRIVER_MEMORY", "2g"))
        )
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # AQE replaces a stage that turned out empty by an empty relation and drops the
        # Observation node inside it: the rejected-line count would be lost exactly when
        # every line was rejected. Keep the node.
        .config("spark.sql.adaptive.optimizer.excludedRules", _KEEP_OBSERVATIONS)
        .config(*transforms.SORT_AGGREGATION)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def quiet_pandas_warning() -> None:
    """PySpark 4.x warns on every pandas conversion with pandas 3; the conversions used
    here (flat tables of numbers, strings, timestamps) are covered by the tests."""
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")


def stderr_progress() -> Progress:
    """Stage lines on stderr with the elapsed time."""
    return promapi.stderr_progress("sla")


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write one small file to any Hadoop path from the driver."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    hpath = jvm.org.apache.hadoop.fs.Path(path)  # type: ignore[union-attr]
    stream = hpath.getFileSystem(conf).create(hpath, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def _join(out: str, name: str) -> str:
    return out.rstrip("/") + "/" + name


def _rejected_by_file(spark: SparkSession, files: Sequence[readers.InputFile]) -> dict[str, int]:
    bad = readers.read_parsed(spark, files, keyed=True).where(~F.col("ok"))
    rows = bad.groupBy("source_file").agg(F.sum("weight").alias("n")).collect()
    return {str(r["source_file"]): int(r["n"]) for r in rows}


def _first_bad(spark: SparkSession, files: Sequence[readers.InputFile], bad_path: str) -> readers.BadLine:
    form = next((f.form for f in files if f.path == bad_path), None)
    if form is None:  # Spark may report the path in another spelling (file:/ vs file:///)
        form = next(f.form for f in files if f.path.split(":", 1)[-1].lstrip("/") == bad_path.split(":", 1)[-1].lstrip("/"))
    return readers.locate_first_bad(spark, path=bad_path, form=form)


def ordered_by(table: str) -> list[str]:
    """The row order of each output table."""
    by_topic = {"topics": ["topic", "month"], "topics_daily": ["topic", "day"],
                "consumer_lag": ["topic", "consumer_group", "month"]}
    if table in by_topic:
        return by_topic[table]
    second = {"incidents": "master_lost_at", "daily": "day", "monthly": "month"}
    return ["group", second.get(table, "start")]


def topic_tables(
    spark: SparkSession, files: Sequence[readers.InputFile], states: DataFrame, exact: ExactTables | None, *,
    config: JobConfig,
) -> dict[str, DataFrame]:
    """``topics`` (monthly), ``topics_daily`` and ``consumer_lag`` (docs/sla.md "Topic
    SLA"), from a second pass that reads only the topic series, and the per-group states."""
    rows = topics.topic_rows(readers.read_labelled(spark, files, topics.TOPIC_METRICS))
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    placed = spark.createDataFrame(topics.placements(rows, step_s=config.step_s).collect(),
                                   "topic string, queue string, group string, p0 long, p1 long")
    exporter = spark.createDataFrame(topics.exporter_runs(rows, step_s=config.step_s).collect(), "e0 long, e1 long")
    hosting = F.broadcast(placed.select("group").distinct())
    found = topics.group_conditions(
        states.join(hosting, on="group", how="left_semi"), step_s=config.step_s,
        exact_pieces=exact.pieces.join(hosting, on="group", how="left_semi") if exact is not None else None)
    # Runs of a few conditions per group, kept on the driver like ``placed``: every table
    # below reads them more than once.
    conditions = spark.createDataFrame(found.collect(), found.schema)
    segments = topics.topic_segments(placed, exporter, conditions)
    targets = config.targets
    daily = topics.topic_daily(segments, targets=targets.topic_target_map(), default=targets.topic_availability)
    daily = daily.persist(StorageLevel.MEMORY_AND_DISK)
    monthly = topics.topic_monthly(daily, targets=targets.topic_target_map(), default=targets.topic_availability)
    drawn = segments.where(F.col("unknown") | (F.col("known") & ~(F.col("write_ok") & F.col("read_full"))))
    return {"topics": monthly, "topics_daily": daily, "consumer_lag": topics.consumer_lag(rows, step_s=config.step_s),
            "_rows": rows, "_segments": drawn}


def _pandas(df: DataFrame) -> pd.DataFrame:
    frame: pd.DataFrame = df.toPandas()
    return frame


def _csv(frame: pd.DataFrame) -> str:
    out = frame.copy()
    for column in out.columns:
        if pd.api.types.is_datetime64_any_dtype(out[column]):
            out[column] = out[column].map(report.iso)
    # 12 significant digits: seconds stay exact to the millisecond up to ~30 years (with
    # 6, a month's known_s of 2,592,015 s was written 2.59202e+06 and sums did not add up).
    text: str = out.to_csv(index=False, float_format="%.12g")
    return text


def observed_states(
    spark: SparkSession, files: Sequence[readers.InputFile], *, step_s: float
) -> tuple[DataFrame, Observation]:
    """The per-group states of ``files`` (keyed readers -> clean -> states, lazily), and
    the Observation that counts, on the same pass, ``rejected`` input lines (by weight),
    accepted ``samples``, the ``first_bad`` file and the ``topic_samples`` (the topic
    series, :mod:`understudy_spark.topics`), and collects the distinct ``events``
    (:func:`transforms.event_candidate`). Also what ``bench/sla.py`` times."""
    parsed = readers.read_parsed(spark, files, keyed=True)
    ok = F.col("ok")
    # What the Observation counts is computed here, in the projection's generated code: an
    # Observation evaluates its own expressions row by row, not compiled (the event
    # test's five name comparisons, for one, were ~4 % of the query_range read in a
    # profile), and only the columns it needs are carried into it.
    tallied = parsed.select(
        "timestamp", "metric", *readers.KEY_LABELS, "value", "ok",
        F.when(~ok, F.col("weight")).alias("_rejected"),
        F.when(~ok, F.col("source_file")).alias("_bad_file"),
        transforms.event_candidate().alias("_event"),
        (ok & F.col("metric").isin(*topics.TOPIC_METRICS)).alias("_topic"),
    )
    observation = Observation("understudy_sla_input")
    tallied = tallied.observe(
        observation,
        F.coalesce(F.sum("_rejected"), F.lit(0)).alias("rejected"),
        F.count_if(ok).alias("samples"),
        F.min("_bad_file").alias("first_bad"),
        F.collect_set("_event").alias("events"),
        # Whether the topic series are there at all: only then is a topic pass read.
        F.count_if("_topic").alias("topic_samples"),
    )
    clean = transforms.clean_keyed(readers.keyed_samples_of(tallied), step_s=step_s)
    return transforms.group_states(clean), observation


def event_times(
    spark: SparkSession, observed: Sequence[object] | None, states: DataFrame, *, step_s: float
) -> tuple[ExactTables | None, list[tuple[str, str]]]:
    """The exact tables of the groups whose event log is complete, and per group the
    resolution its durations have (``transforms.event_resolution``'s reason); ``(None, [])``
    without a single event value in the input. ``observed``: the Observation's ``events``.
    The events and the per-group bounds are small and kept on the driver (local
    DataFrames), so nothing here reads the input again; the exact ``pieces`` (one pass
    over the persisted states) are persisted: unpersist them when done."""
    if not observed:
        return None, []
    events = transforms.event_log(spark.createDataFrame(list(observed), transforms.OBSERVED_EVENTS_SCHEMA))
    bounds_df = transforms.group_bounds(states, step_s=step_s)
    bounds = spark.createDataFrame(bounds_df.collect(), bounds_df.schema)
    resolution = transforms.event_resolution(events, bounds, step_s=step_s)
    rows = resolution.collect()
    found = sorted((str(r["group"]), str(r["reason"])) for r in rows)
    if not any(bool(r["exact"]) for r in rows):
        return None, found
    exact = transforms.exact_tables(events, resolution, bounds, states, step_s=step_s)
    return replace(exact, pieces=exact.pieces.persist(StorageLevel.MEMORY_AND_DISK)), found


def run(spark: SparkSession, config: JobConfig, *, progress: Progress) -> JobResult:
    """Read, compute, write. Raises :class:`InputError` for input it cannot use."""
    t0 = time.monotonic()
    files = readers.list_inputs(spark, config.inputs)
    counts = {form.value: sum(1 for f in files if f.form is form) for form in readers.ExportFormat}
    progress(f"{len(files)} input file(s): " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))

    if any(f.form is not readers.ExportFormat.QUERY_RANGE for f in files):
        progress("text exports: collecting the distinct series heads (a first, quick pass)")
    planned, observation = observed_states(spark, files, step_s=config.step_s)
    # Each bucket with its incident (or none): incidents, the time outside incidents and
    # the daily totals all count this one attribution, so their sums agree.
    states = transforms.incident_buckets(planned).persist(StorageLevel.MEMORY_AND_DISK)
    incidents: DataFrame | None = None
    daily: DataFrame | None = None
    exact: ExactTables | None = None
    cached: list[DataFrame] = []
    try:
        progress("parsing exports and building per-group states")
        bounds = states.agg(
            F.count(F.lit(1)).alias("n"), F.min("bucket").alias("lo"), F.max("bucket").alias("hi")
        ).first()
        stats = observation.get
        n_states = 0 if bounds is None else int(bounds["n"])
        rejected, samples = int(stats["rejected"]), int(stats["samples"])
        progress(f"{samples} samples accepted, {rejected} line(s) rejected, {n_states} group-steps")
        rejected_by_file: dict[str, int] = {}
        if rejected:
            if not config.skip_bad:
                bad = _first_bad(spark, files, str(stats["first_bad"]))
                raise InputError(
                    f"{bad}\n{rejected} input line(s) rejected in total; fix the input or "
                    "rerun with --skip-bad to report without them"
                )
            rejected_by_file = _rejected_by_file(spark, files)
            for path, n in sorted(rejected_by_file.items()):
                progress(f"--skip-bad: rejected {n} line(s) of {path}")
        if bounds is None or n_states == 0:
            raise InputError(
                "no usable samples of " + ", ".join(transforms.CONTRACT_METRICS)
                + " with a 'group' label in the input"
            )
        first_bucket, last_bucket = int(bounds["lo"]), int(bounds["hi"])

        exact, resolution = event_times(spark, stats.get("events"), states, step_s=config.step_s)
        n_exact = sum(1 for _g, reason in resolution if reason == transforms.EXACT)
        progress(f"event times: {n_exact} group(s) exact, the others at scrape resolution")

        progress("deriving incidents, timelines and daily/monthly SLA")
        found = transforms.incidents(states, step_s=config.step_s)
        if exact is not None:
            found = exact.merge_incidents(found)
        incidents = found.persist(StorageLevel.MEMORY_AND_DISK)
        timeline = transforms.timeline(states, step_s=config.step_s)
        if exact is not None:  # the exact groups' transitions at their instants
            timeline = exact.merge_timeline(timeline)
        daily = transforms.daily_sla(
            states, incidents, step_s=config.step_s, first_bucket=first_bucket,
            last_bucket=last_bucket, targets=config.targets, exact=exact,
        ).persist(StorageLevel.MEMORY_AND_DISK)  # written, and summed again into monthly
        monthly = transforms.monthly_sla(daily, targets=config.targets)
        outside = transforms.outside_incidents(states, step_s=config.step_s)
        if exact is not None:
            outside = exact.merge_outside(outside)
        outputs: list[str] = []
        tables = {"incidents": incidents, "daily": daily, "monthly": monthly, "timeline": timeline}
        n_topic = int(stats["topic_samples"])
        if n_topic:
            progress(f"{n_topic} topic-series samples: reading them again for the topic SLA")
            found_topics = topic_tables(spark, files, states, exact, config=config)
            cached += [found_topics.pop("_rows"), found_topics["topics_daily"]]
            drawn = found_topics.pop("_segments")
            tables.update(found_topics)
        frames: dict[str, pd.DataFrame] = {}
        for name, df in tables.items():
            progress(f"writing {name}")
            # One sorted partition: the tables are small, and a global orderBy would cost
            # an extra sampling job per table.
            ordered = df.coalesce(1).sortWithinPartitions(*ordered_by(name))
            target = _join(config.out, f"parquet/{name}")
            ordered.write.mode("overwrite").parquet(target)
            # Read the small result back rather than computing it a second time.
            frames[name] = _pandas(spark.read.schema(df.schema).parquet(target).orderBy(*ordered_by(name)))
            write_text(spark, _join(config.out, f"{name}.csv"), _csv(frames[name]))
            outputs += [target, _join(config.out, f"{name}.csv")]
        # Shown in the report (its own line and table), not a table of its own.
        frames["outside"] = _pandas(outside.orderBy("group", "start"))
        if n_topic:
            frames["topic_segments"] = _pandas(drawn.orderBy("topic", "t0").limit(report.MAX_TOPIC_SEGMENTS))
        step = pd.Timedelta(seconds=config.step_s)
        if not resolution:  # not one event value in the input
            no_events = transforms.scrape_resolution(config.step_s, transforms.NO_EVENT_TIMES)
            resolution = [(str(g), no_events) for g in sorted(frames["daily"]["group"].unique())]
        meta = report.ReportMeta(
            inputs=config.inputs, step_s=config.step_s, targets=config.targets,
            samples=samples, rejected_lines=rejected,
            start=pd.Timestamp(first_bucket * config.step_s, unit="s"),
            end=pd.Timestamp(last_bucket * config.step_s, unit="s") + step,
            resolution=tuple(resolution),
        )
        progress("rendering report.html and summary.md")
        write_text(spark, _join(config.out, "report.html"), report.render_html(
            incidents=frames["incidents"], daily=frames["daily"], monthly=frames["monthly"],
            timeline=frames["timeline"], outside=frames["outside"], meta=meta,
            topics=frames.get("topics"), topic_segments=frames.get("topic_segments"),
            consumer_lag=frames.get("consumer_lag"),
        ))
        write_text(spark, _join(config.out, "summary.md"), report.render_summary(
            incidents=frames["incidents"], monthly=frames["monthly"], meta=meta, outside=frames["outside"],
            topics=frames.get("topics"),
        ))
        outputs += [_join(config.out, "report.html"), _join(config.out, "summary.md")]
        inc = frames["incidents"]
        return JobResult(
            files=len(files), samples=samples, rejected_lines=rejected,
            rejected_by_file=rejected_by_file, groups=int(frames["daily"]["group"].nunique()),
            incidents=len(inc), open_incidents=int(inc["open"].sum()) if len(inc) else 0,
            outputs=tuple(outputs), seconds=time.monotonic() - t0,
        )
    finally:
        for frame in (daily, incidents, exact.pieces if exact is not None else None, states, *cached):
            if frame is not None:
                frame.unpersist()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m understudy_spark.job`` / ``spark-submit job.py``: the ``report`` CLI."""
    from understudy_spark.cli import report as report_cmd

    report_cmd.main(args=list(argv) if argv is not None else sys.argv[1:], prog_name="understudy_spark.job")


if __name__ == "__main__":
    main()
