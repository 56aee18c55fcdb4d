"""The SLA job against a real drill: a real Prometheus scrapes a local cluster (real
ZooKeeper, broker processes, controller) while the drill kills the master twice; the
data is exported through ``/api/v1/query_range`` and ``promtool tsdb dump`` of an
admin-API snapshot, and the job must find exactly the drill's failovers, at the times the
drill measured itself (its history: the brokers' permission-change logs and the group
mode watch, on one clock).

Tolerance: every time the job reports is the start of a bucket of one scrape interval
``I``. The first sample that shows an event at ``T`` is stamped with its scrape's start
``s``, ``T <= s < T + I``, so its bucket starts in ``(T - I, T + I)``. On top of that we
allow ``PHASE_S`` for scrape phase effects: a target renders its answer a little after
the scrape's timestamp, a scrape can start late on a loaded machine, and the incident's
start needs two targets' samples (the controller's mode, the master's permission).
Durations are sums of whole buckets: each unreadable stretch (before reads were restored,
and the failback gap) can gain or lose up to one bucket.

Both exports go through one job run (one Spark pass instead of two): the dump's group is
renamed ``dump-g1`` so that each form's incidents can be told apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import os
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from understudy_harness import promrun
from understudy_harness.drill import DrillOptions, DrillResult, run_drill
from understudy_harness.history import Fault, ModeChange, Perm, Restart, read_history
from understudy_operator.local import cluster as lc
from understudy_operator.local import plan as local_plan
from understudy_spark import job

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(bool(promrun.missing()), reason="needs the Debian 'prometheus' package (prometheus and promtool)"),
]

SCRAPE_S = 1.0
PHASE_S = 0.5
CYCLES = 2


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
        normal = min(e.t for e in events
                     if isinstance(e, ModeChange) and e.group == c.group and e.mode.name == "NORMAL" and e.t > c.fault_t)
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
    spark: Any, drill_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    result = asyncio.run(run_drill(DrillOptions(
        cycles=CYCLES, fault="kill", directory=drill_dir, dwell_s=0.5, prometheus_interval_s=SCRAPE_S,
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
    renamed = tmp_path / "dump.txt"
    renamed.write_text(dump.read_text().replace('group="g1"', 'group="dump-g1"'))
    assert 'group="dump-g1"' in renamed.read_text()

    out = tmp_path / "sla"
    ran = job.run(spark, job.JobConfig(inputs=(*map(str, qr_files), str(renamed)), out=str(out), step_s=SCRAPE_S),
                  progress=lambda _msg: None)
    assert ran.rejected_lines == 0
    found = _incidents(out / "incidents.csv")
    assert sorted(found) == ["dump-g1", "g1"], found

    tolerance = dt.timedelta(seconds=SCRAPE_S + PHASE_S)
    for form, group in (("query_range", "g1"), ("tsdb dump", "dump-g1")):
        incidents = found[group]
        assert len(incidents) == CYCLES, (form, incidents)  # one per cycle, none invented
        for got, want in zip(incidents, truth, strict=True):
            assert got["open"] == "False", (form, got)
            for key in ("master_lost_at", "reads_restored_at", "master_back_at", "normal_at"):
                assert got[key], (form, key, got, want)
                seen = dt.datetime.fromisoformat(got[key])
                assert abs(seen - want[key]) < tolerance, (form, key, got[key], want[key].isoformat())
            # each unreadable stretch (until reads restored; the failback gap) +- one bucket
            assert abs(float(got["read_unavailable_s"]) - want["read_unavailable_s"]) <= 2 * SCRAPE_S, (form, got, want)
            assert abs(float(got["failback_gap_s"]) - want["failback_gap_s"]) <= SCRAPE_S, (form, got, want)
            # the brokers' logs show no overlap, so nothing is proven; two targets scraped
            # at different phases can put the acting slave's last READ and the master's
            # first into one bucket, which the job reports as unresolved
            assert float(got["one_reader_violation_s"]) == 0, (form, got)
            assert float(got["one_reader_unresolved_s"]) <= SCRAPE_S, (form, got)
    # the two exports are the same scrapes: the same incident times, bucket for bucket
    # (query_range is evaluated 1 ms before each bucket's end, see promrun)
    times = ("master_lost_at", "reads_restored_at", "master_back_at", "normal_at")
    assert [[r[k] for k in times] for r in found["g1"]] == [[r[k] for k in times] for r in found["dump-g1"]]
    report = (out / "report.html").read_text()
    assert "dump-g1" in report
    assert "<svg" in report
