"""bench/benchlib.py: the host's steal, the figure that tells a stall the hypervisor made
from one the cluster made (no server is started)."""

from __future__ import annotations

import os
import pathlib

from understudy_harness.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
benchlib = load_script(ROOT / "bench" / "benchlib.py", "bench_benchlib")


def test_steal_is_the_cpu_lines_eighth_value_in_ms(tmp_path: pathlib.Path) -> None:
    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    stat.write_text(f"cpu  10 0 5 900 3 0 1 {2 * hz} 0 0\ncpu0 5 0 2 450 1 0 0 {hz} 0 0\n")
    assert benchlib.read_steal_ms(str(stat)) == 2000.0
    stat.write_text("intr 1 2 3\n")
    assert benchlib.read_steal_ms(str(stat)) is None
    assert benchlib.read_steal_ms(str(tmp_path / "missing")) is None


def test_steal_in_a_stall_is_read_from_the_samples_that_bracket_it() -> None:
    # Sampled every 10 ms; the host took 60 ms between 1.02 and 1.05.
    samples = [(1.00, 500.0), (1.01, 500.0), (1.02, 500.0), (1.03, 520.0), (1.04, 540.0),
               (1.05, 560.0), (1.06, 560.0)]
    assert benchlib.steal_between(samples, 1.021, 1.049) == 60.0
    assert benchlib.steal_between(samples, 1.00, 1.02) == 0.0
    assert benchlib.steal_between(samples, 1.055, 1.06) == 0.0
    # Not bracketed: nothing is said rather than a guess.
    assert benchlib.steal_between(samples, 0.9, 1.02) is None
    assert benchlib.steal_between(samples, 1.05, 1.2) is None
    assert benchlib.steal_between([], 1.0, 1.1) is None
