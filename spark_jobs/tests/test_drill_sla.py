"""The SLA job against a real drill: a real Prometheus scrapes a local cluster (real
ZooKeeper, broker processes, controller) while the drill kills the master twice; the
data is exported through ``/api/v1/query_range`` and ``promtool tsdb dump`` of an
admin-API snapshot, and the job must find exactly the drill's failovers, at the times the
drill measured itself (its history: the brokers' permission-change logs and the
controller's transition journal, on one clock).

With event times (docs/sla.md "Event times": the brokers and the controller export the
instants of their permission and mode changes) every figure is within ``EXACT_S`` (10 ms)
of the drill's own: the brokers' gauges carry the very instants of their permission logs,
the controller's those of its journal. The one instant no process records is the kill
itself: the job ends the master's READ when the controller's liveness source saw its
process exit (its pidfd event), which comes after the kill by the process's teardown and
the controller's wakeup: 4.7-10 ms measured on the shared 2-core machine at load 2.5-6,
35.6 ms once with three test processes side by side. That is the controller's scheduling
on a loaded machine, not the job's precision (the job reproduces the gauge's instant), so
master lost may be later, and the read-unavailable time shorter, by up to ``EXIT_SEEN_S``
more (one way only: the job never dates the death before the kill). Reads restored is
never before that event: a controller check that finds the process gone before the
pidfd's event is dispatched announces the exit itself (``ProcessTableLiveness``), so no
transition acts on an exit whose event is dated later (before that, a fresh-clone run once
had the acting slave's READ 19 ms before the exit event).

Without them (the dump again, its event-time series removed: ``plain-g1``) the job keeps
the bucket definitions. Every time it reports is then the start of a bucket of one
scrape interval ``I``. The first sample that shows an event at ``T`` is stamped with its
scrape's start ``s``, ``T <= s < T + I``, so its bucket starts in ``(T - I, T + I)``. On
top of that we allow ``PHASE_S`` for scrape phase effects: a target renders its answer a
little after the scrape's timestamp, a scrape can start late on a loaded machine, and the
incident's start needs two targets' samples (the controller's mode, the master's
permission). Durations are sums of whole buckets: each unreadable stretch (before reads
were restored, and the failback gap) can gain or lose up to one bucket.

All three go through one job run (one Spark pass): the dump's group is renamed
``dump-g1`` and ``plain-g1`` so that each input's incidents can be told apart.

While the drill's Prometheus still runs, ``sla export`` and ``sla report --prometheus``
read it through its HTTP API over one fixed window: the report finds the same incidents,
to the millisecond, as the job over the drill's ``query_range`` export, from exactly the
data ``sla export`` wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import json
import os
import pathlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from understudy_broker.model import Permission
from understudy_harness import promrun
from understudy_harness.drill import DrillOptions, DrillResult, run_drill
from understudy_harness.history import Fault, ModeChange, Perm, Restart, read_history
from understudy_operator.local import cluster as lc
from understudy_operator.local import plan as local_plan
from understudy_spark import cli, job, promapi, transforms

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.slow,
    # A drill and three Spark jobs: ~220 s at load 8-12, and 295.6 s in one fresh-clone
    # `make test` (the main run beside it), against the suite's 300 s. Cut off there, the
    # timeout broke into a py4j call and left the session's gateway out of step: every
    # later Spark test of the run failed with it (60 of them).
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(promrun.missing()), reason="needs the Debian 'prometheus' package (prometheus and promtool)"),
]

SCRAPE_S = 1.0
PHASE_S = 0.5
EXACT_S = 0.010
EXIT_SEEN_S = 0.100  # kill -> the controller's exit event, beyond EXACT_S (see the docstring)
CYCLES = 2
TIMES = ("master_lost_at", "reads_restored_at", "master_back_at", "normal_at")
# How the event-time series' lines of a tsdb dump begin.
EVENT_SERIES = tuple(f'{{__name__="{m}"' for m in transforms.EVENT_METRICS)


@pytest.fixture
def drill_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """The drill's state directory. The drill stops its cluster and Prometheus itself;
    if it was interrupted, this stops whatever is still recorded there, by PID."""
    directory = tmp_path / "drill"
    try:
        yield directory
    finally:
        if (directory / local_plan.STATE_FILE).exists():
            with contextlib.suppress(lc.LocalError, local_plan.PlanError):
                lc.down(directory)
        pid_file = directory / "prometheus" / "prometheus.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().strip())
            with contextlib.suppress(OSError):
                if str(directory) in pathlib.Path(f"/proc/{pid}/cmdline").read_text():
                    os.killpg(pid, signal.SIGKILL)


def _utc(t_ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(t_ns / 1e9, tz=dt.UTC)


def _truth(result: DrillResult) -> list[dict[str, Any]]:
    """Per cycle, the drill's own instants (from its history) for the four incident times,
    and its measured unreadable and failback-gap seconds."""
    events = read_history(result.history).events
    cycles = []
    for c in result.report.cycles:
        restart = next(e.t for e in events if isinstance(e, Restart) and e.cycle == c.cycle)
        back = min(e.t for e in events if isinstance(e, Perm) and e.broker == c.broker and e.t > restart)
        # Normal again, as the job defines it (docs/sla.md): the mode NORMAL *and* the
        # master reading, the later of the controller's NORMAL and the master's READ (it
        # takes READ when it sees NORMAL: usually within 10 ms, not always on a loaded
        # machine, so the journal's NORMAL alone is not the instant).
        mode_normal = min(e.t for e in events
                          if isinstance(e, ModeChange) and e.group == c.group and e.mode.name == "NORMAL"
                          and e.t > c.fault_t)
        reading = [e.t for e in events if isinstance(e, Perm) and e.broker == c.broker and e.t > restart
                   and Permission.READ in e.effective]
        if not reading:
            raise AssertionError(f"cycle {c.cycle}: the master never read again after its restart")
        normal = max(mode_normal, min(reading))
        if c.reads_restored_ms is None or c.failback_gap_ms is None:
            raise AssertionError(f"cycle {c.cycle} has no reads-restored or failback figure: {c}")
        cycles.append({
            "master_lost_at": _utc(c.fault_t),
            "reads_restored_at": _utc(c.fault_t + int(c.reads_restored_ms * 1e6)),
            "master_back_at": _utc(back),
            "normal_at": _utc(normal),
            "read_unavailable_s": (c.reads_restored_ms + c.failback_gap_ms) / 1000,
            "failback_gap_s": c.failback_gap_ms / 1000,
        })
    assert [f.cycle for f in events if isinstance(f, Fault)] == list(range(1, CYCLES + 1))
    return cycles


def _incidents(path: pathlib.Path) -> dict[str, list[dict[str, str]]]:
    by_group: dict[str, list[dict[str, str]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            by_group.setdefault(row["group"], []).append(row)
    return by_group


def test_the_job_finds_the_drills_failovers_in_real_prometheus_exports(
    spark: Any, drill_dir: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.time()
    # The commands run in this test's SparkSession (their own would cost another JVM).
    monkeypatch.setattr(cli, "open_session", lambda **_: contextlib.nullcontext(spark))
    read: dict[str, Any] = {}

    def read_prometheus(url: str) -> None:
        """``sla export`` and ``sla report --prometheus`` against the drill's Prometheus while
        it still runs, over one fixed window that ended 2 s ago: both read the same samples.
        The drill calls this right after its own export, which can be within a second of
        the last NORMAL: the window must end after that state's first scrape and its
        bucket, so it ends two intervals after this call, not two before it (CI once cut
        the last incident open this way)."""
        time.sleep(2 * SCRAPE_S)
        span = ["--start", promapi.iso(started - 2), "--end", promapi.iso(time.time() - 2),
                "--step", f"{SCRAPE_S:g}s"]
        runner = CliRunner()
        read["export"] = runner.invoke(cli.sla, ["export", "--prometheus", url, *span,
                                                 "--out", str(tmp_path / "exported")])
        read["report"] = runner.invoke(cli.sla, ["report", "--prometheus", url, *span,
                                                 "--out", (tmp_path / "direct").as_uri(),
                                                 "--shuffle-partitions", "2"])

    result = asyncio.run(run_drill(DrillOptions(
        cycles=CYCLES, fault="kill", directory=drill_dir, dwell_s=0.5, prometheus_interval_s=SCRAPE_S,
        while_prometheus_runs=read_prometheus,
    )))  # fmt: skip
    assert not result.errors, result.errors
    assert result.cycles_completed == CYCLES
    assert result.report.one_reader_violations == 0
    assert result.prometheus is not None
    assert not (drill_dir / "prometheus" / "prometheus.pid").exists(), "Prometheus was not stopped"
    truth = _truth(result)

    export = result.prometheus
    qr_files = [pathlib.Path(p) for p in export["query_range"]]
    dump = pathlib.Path(export["tsdb_dump"])
    assert qr_files
    assert all(p.stat().st_size > 0 for p in qr_files)
    text = dump.read_text()
    renamed = tmp_path / "dump.txt"
    renamed.write_text(text.replace('group="g1"', 'group="dump-g1"'))
    assert 'group="dump-g1"' in renamed.read_text()
    plain = tmp_path / "plain.txt"  # the same scrapes without the event-time series
    kept = [line for line in text.splitlines() if not line.startswith(EVENT_SERIES)]
    assert len(kept) < len(text.splitlines()), "the export must carry event-time series"
    plain.write_text("\n".join(kept).replace('group="g1"', 'group="plain-g1"') + "\n")

    out = tmp_path / "sla"
    ran = job.run(spark, job.JobConfig(inputs=(*map(str, qr_files), str(renamed), str(plain)), out=str(out),
                                       step_s=SCRAPE_S), progress=lambda _msg: None)
    assert ran.rejected_lines == 0
    found = _incidents(out / "incidents.csv")
    assert sorted(found) == ["dump-g1", "g1", "plain-g1"], found
    summary = (out / "summary.md").read_text()
    assert "dump-g1, g1: durations exact (event times)." in summary.splitlines(), summary
    assert "plain-g1: durations at scrape resolution (1 s): no event-time series." in summary.splitlines(), summary

    # event times: the drill's own figures, to EXACT_S
    exact = dt.timedelta(seconds=EXACT_S)
    for form, group in (("query_range", "g1"), ("tsdb dump", "dump-g1")):
        incidents = found[group]
        assert len(incidents) == CYCLES, (form, incidents)  # one per cycle, none invented
        for got, want in zip(incidents, truth, strict=True):
            assert got["open"] == "False", (form, got)
            for key in TIMES:
                assert got[key], (form, key, got, want)
                seen = dt.datetime.fromisoformat(got[key])
                late = dt.timedelta(seconds=EXIT_SEEN_S) if key == "master_lost_at" else dt.timedelta(0)
                assert -exact <= seen - want[key] <= exact + late, (form, key, got[key], want[key].isoformat())
            unavailable = float(got["read_unavailable_s"]) - want["read_unavailable_s"]
            assert -EXACT_S - EXIT_SEEN_S <= unavailable <= EXACT_S, (form, got, want)
            assert abs(float(got["failback_gap_s"]) - want["failback_gap_s"]) <= EXACT_S, (form, got, want)
            # the brokers' logs show no overlap, and the event times say so: nothing unresolved
            assert float(got["one_reader_violation_s"]) == 0, (form, got)
            assert float(got["one_reader_unresolved_s"]) == 0, (form, got)
    # the two exports carry the same gauge values: the same instants
    assert [[r[k] for k in TIMES] for r in found["g1"]] == [[r[k] for k in TIMES] for r in found["dump-g1"]]

    # scrape resolution, without event times
    tolerance = dt.timedelta(seconds=SCRAPE_S + PHASE_S)
    incidents = found["plain-g1"]
    assert len(incidents) == CYCLES, incidents
    for got, want in zip(incidents, truth, strict=True):
        assert got["open"] == "False", got
        for key in TIMES:
            assert got[key], (key, got, want)
            seen = dt.datetime.fromisoformat(got[key])
            assert abs(seen - want[key]) < tolerance, (key, got[key], want[key].isoformat())
        # each unreadable stretch (until reads restored; the failback gap) +- one bucket
        assert abs(float(got["read_unavailable_s"]) - want["read_unavailable_s"]) <= 2 * SCRAPE_S, (got, want)
        assert abs(float(got["failback_gap_s"]) - want["failback_gap_s"]) <= SCRAPE_S, (got, want)
        # the brokers' logs show no overlap, so nothing is proven; two targets scraped
        # at different phases can put the acting slave's last READ and the master's
        # first into one bucket, which the job reports as unresolved
        assert float(got["one_reader_violation_s"]) == 0, got
        assert float(got["one_reader_unresolved_s"]) <= SCRAPE_S, got
    report = (out / "report.html").read_text()
    assert "dump-g1" in report
    assert "<svg" in report

    # `sla report --prometheus` on the live server: the same incidents, to the millisecond
    exported, direct = read["export"], read["report"]
    assert exported.exit_code == 0, exported.output
    assert "window 1/" in exported.stderr  # one window, two when the run crossed UTC midnight
    assert direct.exit_code == 0, direct.output
    assert f"{CYCLES} incident(s) (0 still open) in 1 group(s)" in direct.stdout, direct.stdout
    read_files = sorted((tmp_path / "direct" / "prometheus").glob("query_range-*.json"))
    written = sorted((tmp_path / "exported").glob("query_range-*.json"))
    assert [f.name for f in read_files] == [f.name for f in written]
    assert 1 <= len(written) <= 2, written
    docs = [json.loads(f.read_text()) for f in written]
    # what it read is what export wrote
    assert [json.loads(f.read_text())["data"] for f in read_files] == [d["data"] for d in docs]
    names = {s["metric"].get("__name__") for d in docs for s in d["data"]["result"]}
    assert {"understudy_group_mode", "understudy_broker_permission", *transforms.EVENT_METRICS} <= names, names
    times = sorted({float(t) for d in docs for s in d["data"]["result"] for t, _v in s["values"]})
    assert all(round(t * 1000) % 1000 == 999 for t in times)  # 1 ms before each bucket's end
    assert "g1: durations exact (event times)." in (tmp_path / "direct" / "summary.md").read_text().splitlines()
    live = _incidents(tmp_path / "direct" / "incidents.csv")
    assert sorted(live) == ["g1"], live
    assert [[r[k] for k in TIMES] for r in live["g1"]] == [[r[k] for k in TIMES] for r in found["g1"]]
