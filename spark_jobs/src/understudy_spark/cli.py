"""``understudy sla``: failover SLA reports and the synthetic exports that test them.

Why this module exists: it is the user-facing contract of issue 5 (``sla report`` and
``sla synth`` with their option names). It parses options, shows progress and turns
input errors into one clear message; the work lives in :mod:`understudy_spark.job` and
:mod:`understudy_spark.synth`. PySpark is imported only by ``report``, so ``synth`` and
``--help`` stay fast.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from typing import Any

import click
import yaml

from understudy_spark.transforms import Targets

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``15s``, ``1m``, ``500ms``, ``30`` (seconds) -> seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a positive duration like 15s, 1m or 500ms")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


TARGET_KEYS = {"incident_read_unavailable_s", "monthly_read_availability"}


def load_targets(path: pathlib.Path) -> Targets:
    """Targets from a YAML or JSON file (JSON is YAML), e.g.::

        incident_read_unavailable_s: 60
        monthly_read_availability: 0.999
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
    try:
        limit = float(data.get("incident_read_unavailable_s", defaults.incident_read_unavailable_s))
        avail = float(data.get("monthly_read_availability", defaults.monthly_read_availability))
    except (TypeError, ValueError):
        raise ValueError(f"{path}: targets must be numbers") from None
    if limit < 0 or not 0.0 <= avail <= 1.0:
        raise ValueError(
            f"{path}: incident_read_unavailable_s must be >= 0 and "
            "monthly_read_availability a fraction in [0, 1] (0.999, not 99.9)"
        )
    return Targets(incident_read_unavailable_s=limit, monthly_read_availability=avail)


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


@click.group(short_help="Failover SLA reports from Prometheus exports.",
             context_settings={"help_option_names": ["-h", "--help"]})
def sla() -> None:
    """Failover SLA reports from Prometheus exports (query_range JSON, promtool tsdb
    dump text, text/OpenMetrics exposition with timestamps)."""


@sla.command()
@click.option("--input", "inputs", multiple=True, required=True, metavar="PATH",
              help="Export file, directory or glob; local or any Hadoop path. Repeat, or "
                   "list several after one --input.")
@click.argument("more_inputs", nargs=-1, metavar="[PATH...]")
@click.option("--out", required=True, metavar="DIR", help="Output directory (local or Hadoop path).")
@click.option("--targets", "targets_file", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
              help="YAML/JSON with incident_read_unavailable_s and monthly_read_availability.")
@click.option("--step", type=DURATION, default="15s", show_default=True,
              help="Scrape interval: the time resolution of the states.")
@click.option("--skip-bad", is_flag=True, help="Continue past malformed input and report how many lines were rejected.")
@click.option("--master", default=None, help="Spark master (default: local[*], or spark-submit's).")
@click.option("--shuffle-partitions", type=click.IntRange(min=1), default=8, show_default=True,
              help="spark.sql.shuffle.partitions; raise it for large inputs on a cluster.")
def report(
    inputs: tuple[str, ...],
    more_inputs: tuple[str, ...],
    out: str,
    targets_file: pathlib.Path | None,
    step: float,
    skip_bad: bool,
    master: str | None,
    shuffle_partitions: int,
) -> None:
    """Compute incidents and daily/monthly SLA; write incidents.csv, daily.csv,
    monthly.csv, Parquet tables, report.html and summary.md into --out."""
    try:
        targets = load_targets(targets_file) if targets_file is not None else Targets()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--targets") from None
    from understudy_spark import job  # PySpark is heavy: import it only here
    from understudy_spark.readers import InputError

    job.quiet_pandas_warning()
    progress = job.stderr_progress()
    progress("starting Spark")
    spark = job.build_session(master=master, shuffle_partitions=shuffle_partitions)
    config = job.JobConfig(inputs=inputs + more_inputs, out=out, step_s=step, targets=targets, skip_bad=skip_bad)
    try:
        result = job.run(spark, config, progress=progress)
    except InputError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        spark.stop()
    click.echo(
        f"{result.incidents} incident(s) ({result.open_incidents} still open) in {result.groups} group(s) "
        f"from {result.samples} samples in {result.files} file(s) in {result.seconds:.1f} s"
    )
    if result.rejected_lines:
        click.echo(f"rejected {result.rejected_lines} input line(s) (--skip-bad)")
    click.echo(f"report: {out.rstrip('/')}/report.html")


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
