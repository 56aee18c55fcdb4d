"""A broker group as containers through container faults, judged by the shared checker.

ZooKeeper, a master, its slave(s) and the failover controller each run in a container
(the built images; ZooKeeper from the same local base) on two podman networks; the drill's
traffic runs on the host. Cycles, one per fault on the master: ``podman kill`` (SIGKILL of
PID 1), ``podman pause`` past the session timeout, disconnected from every network (an
island no client reaches), disconnected from ZooKeeper's network only, and a restart of
its container on the same volume (SIGTERM, a new container). The merged history
(workload, faults, controller journal, every broker's permission log — a ``kill-9``
separating PID-1 incarnations as in the kind suite) goes to the checker, and the drill's
table is printed. ``CONTAINER_FAULTS`` (comma-separated) and ``CONTAINER_SLAVES`` choose
other faults or two slaves. docs/containers.md.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from understudy_harness.cli.drill import print_result as print_drill_table
from understudy_harness.containers import Podman
from understudy_harness.containers_group import FAULTS, SuiteOptions, run_suite
from understudy_harness.drill import DrillResult

ARTIFACTS = Path(os.environ.get("E2E_ARTIFACTS")
                 or Path(__file__).resolve().parents[1] / "bench-results" / "containers")


def options() -> SuiteOptions:
    faults = tuple(f for f in os.environ.get("CONTAINER_FAULTS", ",".join(FAULTS)).split(",") if f)
    return SuiteOptions(faults=faults, slaves=int(os.environ.get("CONTAINER_SLAVES", "1")))


def test_group_in_containers_survives_container_faults(podman: Podman, workdir: Path) -> None:
    opts = options()
    result = run_suite(podman, workdir, opts)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    saved = ARTIFACTS / "history-containers.jsonl"
    shutil.copyfile(result.history, saved)
    doc = {**result.report.to_json(), "drained": result.drained, "errors": result.errors,
           "cycles_completed": result.cycles_completed, "cycles_notes": result.notes}
    (ARTIFACTS / "containers.json").write_text(json.dumps(doc, indent=2) + "\n")
    print()
    print_drill_table(DrillResult(
        report=result.report, history=saved, directory=workdir,
        cycles_completed=result.cycles_completed,
        sampling={"source": "broker permission-change logs (host bind mounts)",
                  "events": result.perm_events},
        errors=result.errors))
    print("cycles:", json.dumps(result.notes))
    assert not result.errors, result.errors
    assert result.drained, "some consumer group never received every acknowledged message"
    assert result.report.ok, result.report.violations
    r = result.report
    assert r.lost_acked == 0
    assert r.duplicates_rewind == 0
    assert r.offset_rewinds == 0
    assert r.one_reader_violations == 0
    assert result.cycles_completed == len(opts.faults)
    assert [c.kind for c in r.cycles] == list(opts.faults)
