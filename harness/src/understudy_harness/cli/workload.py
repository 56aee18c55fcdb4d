"""``understudy workload``: recorded traffic against any running cluster.

Why this module exists: the kind chaos suite runs its traffic inside the cluster (a Job),
where the test cannot reach the clients, and must still judge the run with the shared
checker. This command runs the drill's own traffic (:class:`.workload.Traffic`) against a
bootstrap list for a fixed time, drains, writes every acknowledgement, delivery and commit
to a history file, and prints one JSON line on stdout. It records; it does not judge:
``drained: false`` still exits 0, and the checker reports what was lost. Exit status: 0 the
run completed and the history is written, 1 the workload could not run (no broker took the
topic), 2 bad input.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import click
from rich.console import Console

from understudy_broker.cli.client import security_options
from understudy_broker.model import parse_address_list
from understudy_broker.security import ClientSecurity
from understudy_harness.cli.live import live_status
from understudy_harness.workload import (
    TrafficCounts,
    WorkloadError,
    WorkloadOptions,
    WorkloadResult,
    run_workload,
)

_err = Console(stderr=True)


def parse_bootstrap(text: str) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` -> addresses (the client commands' rule,
    :func:`understudy_broker.model.parse_address_list`); ``ValueError`` naming the bad
    entry."""
    return tuple(parse_address_list([text]))


def _bootstrap(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    try:
        return parse_bootstrap(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class WorkloadFailed(click.ClickException):
    exit_code = 1


@click.command(short_help="Recorded traffic for a fixed time; writes a checker history.",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--bootstrap", required=True, callback=_bootstrap, help="Brokers of the group, HOST:PORT[,HOST:PORT...]; the client finds the writer and the reader itself.")
@click.option("--topic", required=True, help="Topic to create (4 queues) and use; message ids are '<topic>-<n>'.")
@click.option("--groups", type=click.IntRange(1, 16), default=2, show_default=True, help="Consumer groups reading the topic (cg1..cgN).")
@click.option("--rate", type=click.FloatRange(1, 5000), default=200.0, show_default=True, help="Messages produced per second.")
@click.option("--duration", type=click.FloatRange(0, 86400), default=60.0, show_default=True, help="Seconds of producing before the drain.")
@click.option("--drain-timeout", type=click.FloatRange(0, 3600), default=60.0, show_default=True, help="Seconds to wait after producing stops until every consumer group has every acknowledged message.")
@click.option("--history", required=True, type=click.Path(dir_okay=False, path_type=Path), help="History file to write (JSONL, time.time_ns clock); must not exist yet or be empty.")
@security_options
def workload(
    bootstrap: tuple[str, ...],
    topic: str,
    groups: int,
    rate: float,
    duration: float,
    drain_timeout: float,
    history: Path,
    security: ClientSecurity | None,
) -> None:
    """Produce to TOPIC at RATE for DURATION seconds while GROUPS consumer groups read it,
    drain, and record every acknowledgement, delivery and commit in the history file that
    'understudy drill' and the kind suite judge with the shared checker. Prints one JSON
    line: acked, delivered, failed_sends, drained, events, history."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if history.exists() and history.stat().st_size > 0:
        raise click.BadParameter(f"{history} already holds a history; choose a new file", param_hint="--history")
    if not history.parent.is_dir():
        raise click.BadParameter(f"directory {history.parent} does not exist", param_hint="--history")
    opts = WorkloadOptions(
        bootstrap=bootstrap, topic=topic, history=history, groups=groups, rate=rate,
        duration_s=duration, drain_timeout_s=drain_timeout, security=security,
    )  # fmt: skip
    result = _run_with_status(opts)
    click.echo(json.dumps(result.to_json(), separators=(",", ":")))


def _run_with_status(opts: WorkloadOptions) -> WorkloadResult:
    counts = TrafficCounts()
    started = time.monotonic()

    def line() -> str:
        elapsed = time.monotonic() - started
        phase = "producing" if elapsed < opts.duration_s else "draining"
        return (f"{phase} {elapsed:.0f}s/{opts.duration_s:.0f}s  acked {counts.acked}  "
                f"delivered {counts.delivered}  unacked sends {counts.failed_sends}")  # fmt: skip

    with live_status(_err, line):
        try:
            return asyncio.run(run_workload(opts, counts=counts))
        except WorkloadError as exc:
            raise WorkloadFailed(str(exc)) from None
