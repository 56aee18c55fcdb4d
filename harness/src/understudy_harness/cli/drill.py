"""``understudy drill``: a failover drill on a local cluster, judged by the invariant checker.

Why this module exists: it is how a person (and ``make demo``) sees the product's promise
tested: faults injected into a live cluster, a live status line while it runs, a table of
invariants and failover figures at the end, ``--json`` for machines. Exit status: 0 clean,
1 an invariant was violated or a cycle did not complete, 2 bad input, 3 this build cannot
run the drill (the message names what is missing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from understudy_harness import chaos
from understudy_harness.checker import percentile
from understudy_harness.cli.live import live_status
from understudy_harness.drill import (
    FAULT_MIXES,
    FAULTS,
    SCENARIOS,
    DrillError,
    DrillOptions,
    DrillResult,
    Status,
    mixed_options,
    run_drill,
    run_mixed,
)
from understudy_harness.history import HistoryError
from understudy_operator.local.cluster import LocalError
from understudy_operator.local.plan import PlanError

_out = Console()
_err = Console(stderr=True)


class DrillUsageError(click.ClickException):
    exit_code = 2


class DrillCannotRun(click.ClickException):
    exit_code = 3


@click.command(short_help="Failover drill with an invariant checker.",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cycles", type=click.IntRange(0, 1000), default=3, show_default=True, help="Failover/failback cycles (0: traffic and checks only).")
@click.option("--fault", type=click.Choice(FAULTS), default="kill", show_default=True, help="kill: kill -9 the master; hang: SIGSTOP it past the session timeout, then SIGCONT.")
@click.option("--scenario", type=click.Choice(SCENARIOS), default="failover", show_default=True, help="failover: a topic per group, keyed sends, the --fault you choose. cluster: one topic over every group (at least 2), unkeyed sends that route around a dead master, --members members per consumer group; cycles alternate kill and hang and, while a slave acts, a member joins, leaves cleanly or crashes. ordered: one ordered topic over every group, a producer process and two in-process producers (one active at a time), --members members per consumer group and a consumer process in cg2; cycles kill or hang the send head's master in turn and, while its slave acts, pause the processes past their sessions, crash the active producer, or crash the member reading for cg1 (the JSON adds order_violations and the chain history). delayed: one topic over every group whose messages are all sent for delivery 1-5 s later, members that hand one first delivery in ten back; cycles kill and hang masters in turn and hold the slave acting for --dwell while they fall due (escape; the JSON adds scheduled_lost, delivered_early and escape_duplicates).")
@click.option("--members", type=click.IntRange(1, 16), default=2, show_default=True, help="With --scenario cluster or ordered: members per consumer group at the start (ordered: at least 2).")
@click.option("--groups", type=click.IntRange(1, 20), default=1, show_default=True, help="Broker groups (cycles take their masters in turn).")
@click.option("--slaves", type=click.IntRange(0, 8), default=1, show_default=True, help="Slaves per group.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path), help="Also write the results as JSON to this file.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), help="State directory for the cluster (default: a new temporary directory).")
@click.option("--sample-ms", type=click.FloatRange(1, 20), default=None, hidden=True, help="Ignored: every broker keeps a permission-change log now (kept so old scripts still run).")
@click.option("--rate", type=click.FloatRange(1, 5000), default=200.0, show_default=True, help="Messages per second per group.")
@click.option("--dwell", type=click.FloatRange(0, 600), default=1.0, show_default=True, help="Seconds of slave-consume before the master comes back.")
@click.option("--session-timeout-ms", type=click.IntRange(1000, 10000), default=2000, show_default=True, help="Brokers' ZooKeeper session timeout.")
@click.option("--prometheus", is_flag=True, help="Also record the cluster with a private Prometheus (Debian package) and export it for 'understudy sla report' (query_range JSON and promtool tsdb dump, in <dir>/prometheus/export). Each fault then waits for at least 3 scrape intervals of NORMAL, so the recording separates the cycles.")
@click.option("--scrape-interval", type=click.FloatRange(0.1, 60), default=1.0, show_default=True, help="With --prometheus: seconds between scrapes (pass the same value to 'sla report --step').")
@click.option("--faults", type=click.Choice(FAULT_MIXES), default=None, help="mixed: the chaos soak. The cluster scenario's traffic (a topic over at least two groups, --members members per consumer group); each cycle injects the next fault kind of a fixed rotation (--kinds, --seed) into a group's master: " + ", ".join(chaos.KINDS) + ". Kinds this machine cannot run (no network namespaces, no ZooKeeper ensemble, no tmpfs) are reported as skipped with the reason. Prints a table per fault kind.")
@click.option("--kinds", default=",".join(chaos.KINDS), show_default=True, help="With --faults mixed: the kinds to rotate through, comma-separated.")
@click.option("--seed", type=int, default=None, help="With --faults mixed: shuffle each round's kinds and groups with this seed (reproducible); default: the fixed rotation.")
@click.option("--zk-ensemble", type=click.Choice(["1", "3", "5", "7"]), default="1", show_default=True, help="ZooKeeper servers (3: an ensemble; the zk_leader_loss kind needs one).")
@click.option("--max-minutes", type=click.FloatRange(1, 24 * 60), default=None, help="With --faults mixed: stop starting new cycles once the run, with its drain, teardown and check, would last longer than this; the results say so.")
@click.option("--disk-mb", type=click.IntRange(16, 1 << 16), default=256, show_default=True, help="With --faults mixed: each master's data directory on a tmpfs of this size (disk_full; root only).")
@click.option("--netns/--no-netns", default=True, show_default=True, help="With --faults mixed: put every broker, ZooKeeper with the controller, and the drill's clients on hosts of their own in network namespaces when the machine allows (the partition kinds need it; root only).")
@click.option("--kinds-json", type=click.Path(dir_okay=False, path_type=Path), help="With --faults mixed: write the per-kind table as JSON (one object per fault kind).")
@click.option("--secure", is_flag=True, default=False, help="Run on a secure cluster (local up --secure: TLS on every broker port, SCRAM, ACLs); every client connects as its admin.")
def drill(
    cycles: int,
    fault: str,
    scenario: str,
    members: int,
    groups: int,
    slaves: int,
    json_file: Path | None,
    directory: Path | None,
    sample_ms: float | None,
    rate: float,
    dwell: float,
    session_timeout_ms: int,
    prometheus: bool,
    scrape_interval: float,
    faults: str | None,
    kinds: str,
    seed: int | None,
    zk_ensemble: str,
    max_minutes: float | None,
    disk_mb: int,
    netns: bool,
    kinds_json: Path | None,
    secure: bool,
) -> None:
    """Bring up a local cluster, run producers and consumer groups, fault the master again
    and again, then check every invariant: lost acknowledged messages, duplicates
    (in flight vs rewind), committed-offset rewinds, one-reader violations, two members on
    one queue, and per cycle reads-restored, failback gap, back-sync and write-stall times.
    The cluster is always torn down."""
    del sample_ms  # accepted and ignored (see its help)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if cycles > 0 and slaves == 0:
        raise click.BadParameter("failover cycles need at least one slave per group", param_hint="--slaves")
    opts = DrillOptions(
        cycles=cycles,
        fault=fault,
        groups=groups,
        slaves=slaves,
        directory=directory,
        rate=rate,
        dwell_s=dwell,
        session_timeout_ms=session_timeout_ms,
        prometheus_interval_s=scrape_interval if prometheus else None,
        scenario=scenario,
        members=members,
        faults=faults,
        kinds=tuple(k.strip() for k in kinds.split(",") if k.strip()),
        seed=seed,
        zk_ensemble=int(zk_ensemble),
        max_seconds=None if max_minutes is None else max_minutes * 60,
        disk_bytes=disk_mb << 20,
        netns=netns,
        secure=secure,
    )
    if faults is not None:
        try:
            mixed_options(opts)
        except DrillError as exc:
            raise click.BadParameter(str(exc), param_hint="--faults/--kinds") from None
    status = Status()
    result = _run_with_status(opts, status)
    print_result(result)
    if json_file is not None:
        json_file.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        _out.print(f"results written to {json_file}")
    if kinds_json is not None and result.chaos is not None:
        kinds_json.write_text(json.dumps(chaos.to_json(result.chaos), indent=2) + "\n")
        _out.print(f"per-kind results written to {kinds_json}")
    if not result.ok:
        for v in result.report.violations + result.errors + result.chain_violations:
            _err.print(f"[red]FAIL[/] {v}")
        sys.exit(1)
    _out.print("[green]all invariants held[/]")


def _run_with_status(opts: DrillOptions, status: Status) -> DrillResult:
    def line() -> str:
        cycle = f"cycle {status.cycle}/{opts.cycles}  " if opts.cycles else ""
        return cycle + status.line()

    with live_status(_err, line):
        try:
            if opts.faults is not None:
                return run_mixed(opts, status=status)
            return asyncio.run(run_drill(opts, status=status))
        except DrillError as exc:
            raise DrillCannotRun(str(exc)) from None
        except (LocalError, PlanError, HistoryError) as exc:
            raise DrillUsageError(str(exc)) from None


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def print_result(result: DrillResult) -> None:
    """The drill's tables (``understudy drill``); the container suite prints the same."""
    r = result.report
    summary = Table("check", "result", title=f"drill: {result.cycles_completed} cycle(s)")
    summary.add_row("acknowledged messages", str(r.acked))
    summary.add_row("lost acknowledged", _flag(r.lost_acked))
    summary.add_row("skipped by a consumer group", _flag(sum(r.skipped.values())))
    summary.add_row("duplicates in flight (at-least-once)", str(r.duplicates_inflight))
    summary.add_row("duplicates from a rewind", _flag(r.duplicates_rewind))
    summary.add_row("produced twice (a retry moved to another group)",
                    str(r.duplicates_produce - r.duplicates_same_queue))
    summary.add_row("stored twice on one queue (invariant 8)", _flag(r.duplicates_same_queue))
    summary.add_row("committed-offset rewinds", _flag(r.offset_rewinds))
    summary.add_row(
        "one-reader violations",
        _flag(r.one_reader_violations) + (f" ({r.one_reader_overlap_s * 1000:.1f} ms)" if r.one_reader_violations else ""),
    )
    summary.add_row(
        "two members on one queue",
        _flag(r.two_member_violations) + (f" ({r.two_member_overlap_s * 1000:.1f} ms)" if r.two_member_violations else ""),
    )
    summary.add_row("order violations (ordered topics)", _flag(r.order_violations))
    if result.chain_history is not None:
        summary.add_row("chain documents seen / rule violations",
                        f"{len(result.chain_history)} / {_flag(len(result.chain_violations))}")
    for label, name in (
        ("reads restored ms", "reads_restored_ms"),
        ("reads restored ms, as consumers saw it", "consumer_reads_restored_ms"),
        ("failback gap ms", "failback_gap_ms"),
        ("back-sync ms", "backsync_ms"),
        ("write stall ms", "write_stall_ms"),
    ):
        values = r.figures(name)
        summary.add_row(f"{label} p50 / p99", f"{_ms(percentile(values, 50))} / {_ms(percentile(values, 99))}")
    s = result.sampling
    if s:
        summary.add_row("permission source", f"{s.get('source')} ({s.get('events', 0)} changes)")
    _out.print(summary)
    if r.cycles:
        table = Table("cycle", "group", "fault", "reads restored ms", "consumer saw ms", "failback gap ms", "back-sync ms", "normal again ms", "write stall ms")
        for c in r.cycles:
            table.add_row(
                str(c.cycle), c.group, f"{c.kind} {c.broker}", _ms(c.reads_restored_ms),
                _ms(c.consumer_reads_restored_ms), _ms(c.failback_gap_ms), _ms(c.backsync_ms),
                _ms(c.normal_again_ms), _ms(c.write_stall_ms),
            )  # fmt: skip
        _out.print(table)
    if result.chaos is not None:
        _print_kinds(result)
    _out.print(f"history: {result.history}")
    if result.prometheus is not None:
        p = result.prometheus
        _out.print(
            f"Prometheus export (scrape interval {p['scrape_interval_s']:g} s, {p['series']} series): "
            f"{', '.join(p['query_range'])} and {p['tsdb_dump']}"
        )


def _print_kinds(result: DrillResult) -> None:
    """The chaos soak's table: one row per fault kind (``chaos.summarize``)."""
    table = Table("fault kind", "cycles", "lost", "rewinds", "one reader", "two members",
                  "duplicates: in flight / rewind / other queue / same queue / escape",
                  "reads restored, as consumers saw, ms p50 / p99", "write stall ms p50 / p99",
                  title="chaos soak: per fault kind")
    for row in result.chaos or []:
        doc = row.to_json()
        if row.skipped is not None:
            table.add_row(row.kind, "[yellow]skipped[/]", row.skipped)
            continue
        d = row.duplicates
        cycles = str(row.cycles) + (f" ([red]{row.incomplete} incomplete[/])" if row.incomplete else "")
        table.add_row(
            row.kind, cycles, _flag(row.lost_acked + row.missed_by_a_consumer_group),
            _flag(row.offset_rewinds), _flag(row.one_reader_violations),
            _flag(row.two_member_violations),
            f"{d['in_flight']} / {_flag(d['rewind'])} / {d['produced_other_queue']} / "
            f"{_flag(d['same_queue'])} / {d['escape']}",
            f"{_ms(doc['consumer_reads_restored_ms_p50'])} / {_ms(doc['consumer_reads_restored_ms_p99'])}",
            f"{_ms(doc['write_stall_ms_p50'])} / {_ms(doc['write_stall_ms_p99'])}",
        )  # fmt: skip
    # wide enough to keep a row on one line when the output is a file or a pipe (make)
    (_out if _out.is_terminal else Console(width=200)).print(table)
    if result.stopped_early:
        _out.print(f"[yellow]{result.stopped_early}[/]")


def _flag(n: int) -> str:
    return "[green]0[/]" if n == 0 else f"[red]{n}[/]"
