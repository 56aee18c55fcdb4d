"""Five consecutive failover/failback cycles (master ``kill -9``) on a real local
cluster, with the shared checker judging every invariant after each cycle.

Why this exists beside ``test_drill.py`` (2 cycles): defects that need state carried across
cycles — epochs, offsets back-synced twice, a permission log spanning many incarnations,
a consumer resuming from offsets moved by several slaves — only show after many. The
drill runs producers and two consumer groups throughout; after it, the history is cut at
the end of each cycle (the next fault) and each prefix is checked for one-reader violations,
committed-offset rewinds and rewind duplicates; the whole history (after the final
drain) is checked for everything, lost acknowledged messages included.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from understudy_broker.model import Mode
from understudy_harness.checker import check
from understudy_harness.drill import DrillOptions, run_drill
from understudy_harness.history import Fault, ModeChange, read_history

CYCLES = 5  # 20, then 10, before the chaos soak took over the long runs (make chaos)


@pytest.mark.integration
@pytest.mark.slow
def test_five_kill_cycles_keep_every_invariant_after_each_cycle(drill_dir: Path) -> None:
    opts = DrillOptions(cycles=CYCLES, fault="kill", slaves=1, directory=drill_dir, rate=100.0,
                        warmup_s=0.2, dwell_s=0.2)
    result = asyncio.run(run_drill(opts))
    assert result.errors == [], _logs(result.directory)
    assert result.cycles_completed == CYCLES
    events = read_history(result.history).events
    faults = sorted((e for e in events if isinstance(e, Fault)), key=lambda e: e.t)
    assert len(faults) == CYCLES
    normals = sorted(e.t for e in events if isinstance(e, ModeChange) and e.mode is Mode.NORMAL)
    epochs = [e.epoch for e in sorted((e for e in events if isinstance(e, ModeChange)), key=lambda e: e.t)]
    # epochs only grow; the group starts at epoch 1 and a cycle takes at least four
    # transitions (FENCING, SLAVE_CONSUME, RECOVERING, NORMAL): exactly four each
    assert epochs == sorted(set(epochs))
    assert epochs[-1] == 1 + 4 * CYCLES
    last = max(e.t for e in events)
    for n, fault in enumerate(faults, start=1):
        assert any(t > fault.t for t in normals), f"cycle {n} never reached NORMAL"
        # the cycle ends where the next one starts (the master's READ comes after NORMAL)
        end = faults[n].t if n < len(faults) else last + 1
        prefix = check([e for e in events if e.t < end])
        assert prefix.one_reader_violations == 0, (n, prefix.violations)
        assert prefix.offset_rewinds == 0, (n, prefix.violations)
        assert prefix.duplicates_rewind == 0, (n, prefix.violations)
        assert len(prefix.cycles) == n
        assert prefix.cycles[-1].reads_restored_ms is not None, n  # a slave took reads
        # and the master read again after the slave (the watch may coalesce RECOVERING, so
        # the back-sync figure can be missing; the failback gap cannot)
        assert prefix.cycles[-1].failback_gap_ms is not None, n
    final = result.report
    assert final.acked > 0
    assert final.lost_acked == 0
    assert final.violations == [], final.violations
    assert result.ok


def _logs(directory: Path, lines: int = 40) -> str:
    """The tails of the cluster's process logs, for a failure message."""
    out = []
    for log in sorted((directory / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(out)
