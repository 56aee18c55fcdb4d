"""``understudy sla``: failover SLA reports and the synthetic exports that test them.

Why this module exists: it is the user-facing contract of issue 5 (``sla report``,
``sla export`` and ``sla synth`` with their option names). It parses options, shows
progress and turns input errors into one clear message; the work lives in
:mod:`understudy_spark.job`, :mod:`understudy_spark.promapi` (reading a Prometheus HTTP
API) and :mod:`understudy_spark.synth`. PySpark is imported only by ``report``, so
``export``, ``synth`` and ``--help`` stay fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import decimal
import json
import math
import pathlib
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import yaml

from understudy_spark import promapi
from understudy_spark.transforms import Targets

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``15s``, ``1m``, ``500ms``, ``30`` (seconds) -> seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a positive duration like 15s, 1m or 500ms")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


TARGET_KEYS = {"incident_read_unavailable_s", "monthly_read_availability", "topic_availability", "topic_targets"}


def parse_topic_targets(values: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``--topic-target TOPIC=PERCENT`` (repeatable), e.g. ``orders=99.99``: the topic's
    write and full-read availability target, as a fraction; sorted by topic."""
    found: dict[str, float] = {}
    for value in values:
        name, sep, pct = value.partition("=")
        try:  # decimal: 99.99 % is 0.9999, not 0.9998999999999999
            fraction = float(decimal.Decimal(pct.strip()) / 100)
        except decimal.InvalidOperation:
            fraction = math.nan
        if not sep or not name.strip() or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"--topic-target {value!r}: expected TOPIC=PERCENT, e.g. orders=99.99")
        found[name.strip()] = fraction
    return tuple(sorted(found.items()))


def load_targets(path: pathlib.Path) -> Targets:
    """Targets from a YAML or JSON file (JSON is YAML), e.g.::

        incident_read_unavailable_s: 60
        monthly_read_availability: 0.999
        topic_availability: 0.999        # per topic: writes and full reads, each
        topic_targets: {orders: 0.9999}  # per-topic overrides
    """
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML or JSON: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with {', '.join(sorted(TARGET_KEYS))}")
    unknown = set(data) - TARGET_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(TARGET_KEYS)}")
    defaults = Targets()
    per_topic = data.get("topic_targets") or {}
    if not isinstance(per_topic, dict):
        raise ValueError(f"{path}: topic_targets must map topic names to fractions")
    try:
        limit = float(data.get("incident_read_unavailable_s", defaults.incident_read_unavailable_s))
        avail = float(data.get("monthly_read_availability", defaults.monthly_read_availability))
        topic_avail = float(data.get("topic_availability", defaults.topic_availability))
        topic_targets = tuple(sorted((str(k), float(v)) for k, v in per_topic.items()))
    except (TypeError, ValueError):
        raise ValueError(f"{path}: targets must be numbers") from None
    fractions = [avail, topic_avail, *(v for _k, v in topic_targets)]
    if limit < 0 or not all(0.0 <= f <= 1.0 for f in fractions):
        raise ValueError(
            f"{path}: incident_read_unavailable_s must be >= 0 and each availability "
            "(monthly_read_availability, topic_availability, topic_targets) a fraction in [0, 1] (0.999, not 99.9)"
        )
    return Targets(incident_read_unavailable_s=limit, monthly_read_availability=avail,
                   topic_availability=topic_avail, topic_targets=topic_targets)


class _Duration(click.ParamType[float, Any]):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = _Duration()


@dataclass(frozen=True, slots=True)
class PromArgs:
    """The options that say where and how to read a Prometheus HTTP API."""

    url: str | None
    start: str | None
    end: str | None
    headers: tuple[str, ...]
    bearer_token_file: pathlib.Path | None
    ca_file: pathlib.Path | None
    insecure_skip_verify: bool
    timeout: float
    retries: int
    max_points: int
    labels: str | None


_FILE = click.Path(exists=True, dir_okay=False, path_type=pathlib.Path)


def prometheus_options(*, required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of :class:`PromArgs`, shared by ``report`` and ``export``."""
    options = [
        click.option("--prometheus", "url", required=required, metavar="URL",
                     help="Read straight from this Prometheus HTTP API (http(s)://host:9090[/prefix])"
                          + ("" if required else " instead of --input files") + "."),
        click.option("--start", metavar="T", required=required,
                     help=f"Start of the range read from Prometheus: {promapi.TIME_HELP}."),
        click.option("--end", metavar="T", help="End of the range read from Prometheus (default: now)."),
        click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'",
                     help="Send this HTTP header with every request (repeatable), e.g. "
                          "'X-Scope-OrgID: team-a' or 'Authorization: Basic ...'."),
        click.option("--bearer-token-file", type=_FILE, metavar="PATH",
                     help="Send 'Authorization: Bearer <the file's content>' (re-read on every request)."),
        click.option("--ca-file", type=_FILE, metavar="PATH",
                     help="PEM bundle of the CA(s) to trust for an https:// URL."),
        click.option("--insecure-skip-verify", is_flag=True,
                     help="Do not verify the server's TLS certificate (tests only)."),
        click.option("--timeout", type=DURATION, default="60s", show_default=True,
                     help="Timeout of one request (connect, and each wait for data)."),
        click.option("--retries", type=click.IntRange(0, 20), default=4, show_default=True,
                     help="Retries of a request after a connection error, timeout, HTTP 429 or 5xx "
                          "(backoff 0.5 s doubling up to 10 s, or the server's Retry-After)."),
        click.option("--max-points", type=click.IntRange(1, promapi.POINT_LIMIT), default=promapi.MAX_POINTS,
                     show_default=True,
                     help="Steps per series in one request (Prometheus refuses more than 11,000)."),
        click.option("--labels", metavar="MATCHERS",
                     help="Label matchers added to every selector, e.g. 'namespace=\"prod\"' "
                          "when one Prometheus holds several clusters."),
    ]

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _prom_args(params: dict[str, Any]) -> PromArgs:
    return PromArgs(**{name: params.pop(name) for name in PromArgs.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What to ask which Prometheus for, checked before anything runs."""

    client: promapi.PrometheusClient
    start: float
    end: float
    step_s: float
    query: str
    max_points: int
    windows: int


def read_plan(prom: PromArgs, *, step_s: float, log: promapi.Progress) -> ReadPlan:
    """Check the --prometheus options (times, headers, TLS files, matchers) and plan the
    requests; a usage error names what is wrong."""
    if prom.url is None or prom.start is None:
        raise click.UsageError("--prometheus URL needs --start T (and takes --end T, default now)")
    try:
        start, end = promapi.parse_range(prom.start, prom.end or "now", now=time.time())
        windows = promapi.range_windows(start=start, end=end, step_s=step_s, max_points=prom.max_points,
                                        split_every_s=promapi.DAY_S)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if not windows:
        raise click.UsageError(f"nothing to read: {promapi.iso(start)} .. {promapi.iso(end)} holds no whole "
                               f"--step ({step_s:g} s)")
    try:
        headers = [promapi.parse_header(h) for h in prom.headers]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--header") from None
    try:
        query = promapi.sla_query(prom.labels or "")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--labels") from None
    try:
        client = promapi.PrometheusClient(
            prom.url, headers=headers, bearer_token_file=prom.bearer_token_file, ca_file=prom.ca_file,
            insecure_skip_verify=prom.insecure_skip_verify, timeout_s=prom.timeout, retries=prom.retries, log=log,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return ReadPlan(client=client, start=start, end=end, step_s=step_s, query=query,
                    max_points=prom.max_points, windows=len(windows))


def fetch(plan: ReadPlan, out: pathlib.Path, *, progress: promapi.Progress) -> promapi.ExportResult:
    """Run ``plan`` into ``out``; a server or network problem becomes one clear error."""
    progress(f"reading {plan.client.base}: {promapi.iso(plan.start)} .. {promapi.iso(plan.end)} at "
             f"{plan.step_s:g} s steps, {plan.windows} request(s) planned")
    try:
        return promapi.export_range(plan.client, out, start=plan.start, end=plan.end, step_s=plan.step_s,
                                    query=plan.query, max_points=plan.max_points, progress=progress)
    except promapi.PrometheusError as exc:
        raise click.ClickException(str(exc)) from None


def _is_local(path: str) -> bool:
    """A plain path (no ``scheme:``), which Python can write as well as Hadoop."""
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]+:", path) is None


@contextlib.contextmanager
def open_session(*, master: str | None, shuffle_partitions: int) -> Iterator[SparkSession]:
    """The report's SparkSession, stopped afterwards (the tests put their own in here)."""
    from understudy_spark import job

    spark = job.build_session(master=master, shuffle_partitions=shuffle_partitions)
    try:
        yield spark
    finally:
        spark.stop()


def copy_to_hadoop(spark: SparkSession, files: tuple[pathlib.Path, ...], target: str) -> None:
    """Move local ``files`` into the Hadoop directory ``target`` (replaced)."""
    jvm: Any = spark.sparkContext._jvm
    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    dest = jvm.org.apache.hadoop.fs.Path(target)
    fs = dest.getFileSystem(conf)
    fs.delete(dest, True)
    fs.mkdirs(dest)
    for f in files:
        fs.copyFromLocalFile(True, True, jvm.org.apache.hadoop.fs.Path(f.resolve().as_uri()), dest)


@click.group(short_help="Failover SLA reports from Prometheus (its HTTP API or exports).",
             context_settings={"help_option_names": ["-h", "--help"]})
def sla() -> None:
    """Failover SLA reports from Prometheus: read straight from its HTTP API
    (report --prometheus URL --start T), or from exports (query_range JSON, promtool tsdb
    dump text, text/OpenMetrics exposition with timestamps; report --input PATH). export
    --prometheus writes query_range files that report --input reads later."""


@sla.command()
@click.option("--input", "inputs", multiple=True, metavar="PATH",
              help="Export file, directory or glob; local or any Hadoop path. Repeat, or "
                   "list several after one --input. Exactly one of --input and --prometheus.")
@click.argument("more_inputs", nargs=-1, metavar="[PATH...]")
@click.option("--out", required=True, metavar="DIR", help="Output directory (local or Hadoop path).")
@click.option("--targets", "targets_file", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
              help="YAML/JSON with incident_read_unavailable_s and monthly_read_availability.")
@click.option("--step", type=DURATION, default="15s", show_default=True,
              help="Scrape interval: the time resolution of the states.")
@click.option("--topic-target", "topic_target", multiple=True, metavar="TOPIC=PERCENT",
              help="A topic's target for write and full-read availability, e.g. orders=99.99 (repeatable; "
                   "default: topic_availability of --targets, else 99.9).")
@click.option("--skip-bad", is_flag=True, help="Continue past malformed input and report how many lines were rejected.")
@click.option("--master", default=None, help="Spark master (default: local[*], or spark-submit's).")
@click.option("--shuffle-partitions", type=click.IntRange(min=1), default=8, show_default=True,
              help="spark.sql.shuffle.partitions; raise it for large inputs on a cluster.")
@prometheus_options(required=False)
def report(
    inputs: tuple[str, ...],
    more_inputs: tuple[str, ...],
    out: str,
    targets_file: pathlib.Path | None,
    step: float,
    topic_target: tuple[str, ...],
    skip_bad: bool,
    master: str | None,
    shuffle_partitions: int,
    **params: Any,
) -> None:
    """Compute incidents and daily/monthly SLA; write incidents.csv, daily.csv,
    monthly.csv (and, when the input holds the topic placement series, topics.csv,
    topics_daily.csv, consumer_lag.csv), Parquet tables, report.html and summary.md into --out.

    Reads export files (--input) or a Prometheus HTTP API (--prometheus URL --start T
    [--end T]); what it read from Prometheus stays in --out/prometheus/ as query_range
    files, so report --input DIR/prometheus gives the same report offline."""
    prom = _prom_args(params)
    if (prom.url is None) == (not inputs and not more_inputs):
        raise click.UsageError(
            "give exactly one of --input PATH (export files) and --prometheus URL (its HTTP API)"
        )
    if prom.url is None:
        ctx = click.get_current_context()
        given = [f"--{name.replace('_', '-')}" for name in PromArgs.__dataclass_fields__
                 if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"{', '.join(given)} only go(es) with --prometheus URL")
    try:
        targets = load_targets(targets_file) if targets_file is not None else Targets()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--targets") from None
    try:
        if topic_target:  # the command line wins over the file, topic by topic
            merged = dict(targets.topic_targets) | dict(parse_topic_targets(topic_target))
            targets = dataclasses.replace(targets, topic_targets=tuple(sorted(merged.items())))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--topic-target") from None
    from understudy_spark import job  # PySpark is heavy: import it only here
    from understudy_spark.readers import InputError

    job.quiet_pandas_warning()
    progress = job.stderr_progress()
    with contextlib.ExitStack() as stack:
        if prom.url is not None:
            # Asked before Spark starts: a wrong URL or token fails in a second, not after it.
            plan = read_plan(prom, step_s=step, log=progress)
            fetched_dir = f"{out.rstrip('/')}/prometheus"
            local = _is_local(out)
            staging = pathlib.Path(fetched_dir if local else stack.enter_context(tempfile.TemporaryDirectory()))
            fetched = fetch(plan, staging, progress=progress)
            inputs, more_inputs = (fetched_dir,), ()
        progress("starting Spark")
        spark = stack.enter_context(open_session(master=master, shuffle_partitions=shuffle_partitions))
        if prom.url is not None and not local:
            progress(f"copying {len(fetched.files)} file(s) to {fetched_dir}")
            copy_to_hadoop(spark, fetched.files, fetched_dir)
        config = job.JobConfig(inputs=inputs + more_inputs, out=out, step_s=step, targets=targets, skip_bad=skip_bad)
        try:
            result = job.run(spark, config, progress=progress)
        except InputError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(
        f"{result.incidents} incident(s) ({result.open_incidents} still open) in {result.groups} group(s) "
        f"from {result.samples} samples in {result.files} file(s) in {result.seconds:.1f} s"
    )
    if result.rejected_lines:
        click.echo(f"rejected {result.rejected_lines} input line(s) (--skip-bad)")
    click.echo(f"report: {out.rstrip('/')}/report.html")


@sla.command()
@prometheus_options(required=True)
@click.option("--step", type=DURATION, default="15s", show_default=True,
              help="Scrape interval: one evaluation per step, 1 ms before each step ends (report with the same --step).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=pathlib.Path), metavar="DIR",
              help="Directory for query_range-NNNN.json (earlier ones there are replaced).")
def export(step: float, out: pathlib.Path, **params: Any) -> None:
    """Write the SLA series of a Prometheus HTTP API as query_range JSON files (one per
    day at most, each under Prometheus' 11,000 points per series), which report --input
    DIR reads later or elsewhere with the same result as report --prometheus."""
    prom = _prom_args(params)
    progress = promapi.stderr_progress("export")
    plan = read_plan(prom, step_s=step, log=progress)
    result = fetch(plan, out, progress=progress)
    counted = (f" ({result.series} series at most per file, {result.points} points)"
               if result.series is not None else "")
    click.echo(f"wrote {len(result.files)} file(s), {result.bytes / 1e6:.1f} MB{counted} to {out}; "
               f"read them with: understudy sla report --input {out} --step {step:g}s --out DIR")


@sla.command()
@click.option("--groups", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--days", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--step", type=DURATION, default="15s", show_default=True, help="Scrape interval (whole seconds).")
@click.option("--incidents", type=click.IntRange(min=0), default=6, show_default=True, help="Incidents in total, over all groups.")
@click.option("--gaps", type=int, default=-1, help="Scrape gaps in total (default: half the incidents, at least 1).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--format", "form", type=click.Choice(["query_range", "dump", "openmetrics", "all"]), default="all", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=pathlib.Path), metavar="DIR")
def synth(groups: int, days: int, step: float, incidents: int, gaps: int, seed: int, form: str, out: pathlib.Path) -> None:
    """Write synthetic exports (DIR/<format>/<day>.*) and DIR/ground_truth.json with the
    injected incidents, scrape gaps, pod restarts, counter resets, duplicates and
    staleness markers."""
    from rich.progress import Progress

    from understudy_spark.synth import FORMATS, SynthSpec, plan, synthesize

    if step != int(step):
        raise click.BadParameter("synthetic exports use whole seconds", param_hint="--step")
    try:
        spec = SynthSpec(groups=groups, days=days, step_s=int(step), incidents=incidents, seed=seed, gaps=gaps)
        plan(spec)  # checks that the events fit before anything is written
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    formats = FORMATS if form == "all" else (form,)
    with Progress(transient=True, console=None) as bar:
        task = bar.add_task("writing days", total=days)
        result = synthesize(spec, out=out, formats=formats, on_day=lambda _d: bar.advance(task))
    truth = json.loads((out / "ground_truth.json").read_text(encoding="utf-8"))
    click.echo(
        f"wrote {len(result.files)} file(s) to {out}: "
        + ", ".join(f"{k} {v} samples" for k, v in result.samples.items())
        + f"; {len(truth['incidents'])} incident(s), {len(truth['gaps'])} gap(s), "
        f"{result.duplicates} duplicate(s), {result.staleness_markers} staleness marker(s)",
    )
    print(f"ground truth: {out / 'ground_truth.json'}", file=sys.stderr)
