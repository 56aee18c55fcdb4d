"""bench/sla.py: its pure helpers and its answers to bad flags (no Spark is started)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest

from understudy_harness.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    return load_script(ROOT / "bench" / "sla.py", "bench_sla")


def _row(size: str, form: str, samples: int, spark: float, duck: float) -> dict[str, object]:
    return {"size": size, "form": form, "samples": samples, "spark_seconds": spark, "duckdb_seconds": duck}


def test_linearity_reports_time_growth_against_data_growth() -> None:
    rows = [_row("1w", "dump", 100, 10.0, 2.0), _row("2w", "dump", 200, 20.0, 6.0),
            _row("4w", "dump", 400, 30.0, 8.0)]
    by_engine = {g["engine"]: g for g in _bench().linearity(rows)}
    assert by_engine["spark"]["growth_vs_data"] == {"2w": 1.0, "4w": 0.75}
    assert by_engine["duckdb"]["growth_vs_data"] == {"2w": 1.5, "4w": 1.0}
    assert by_engine["spark"]["seconds_per_million_samples"]["4w"] == 75000.0


def test_injected_before_counts_incidents_that_start_in_the_prefix() -> None:
    truth = {"start": "2026-11-01T00:00:00Z", "incidents": [
        {"master_lost_at": "2026-11-01T10:00:00Z"}, {"master_lost_at": "2026-11-07T23:59:45Z"},
        {"master_lost_at": "2026-11-08T00:00:00Z"}]}
    assert _bench().injected_before(truth, 7) == 2


def test_link_prefix_takes_the_first_days(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "data" / "dump"
    data.mkdir(parents=True)
    for day in ("2026-11-03", "2026-11-01", "2026-11-02"):
        (data / f"{day}.txt").write_text(day)
    _bench().link_prefix(tmp_path / "data", tmp_path / "1d", ("dump",), 2)
    assert sorted(p.name for p in (tmp_path / "1d" / "dump").iterdir()) == ["2026-11-01.txt", "2026-11-02.txt"]


@pytest.mark.parametrize(("args", "message"), [
    (["--weeks", "one"], "--weeks must be whole numbers"),
    (["--forms", "csv"], "--forms: unknown ['csv']"),
    (["--groups", "0"], "need at least one size and one group"),
    (["--groups", "100000000", "--weeks", "4"], "not enough disk"),
])
def test_bad_flags_are_clear_errors_before_any_work(tmp_path: pathlib.Path, args: list[str], message: str) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "sla.py"), *args, "--workdir", str(tmp_path / "w"),
                          "--out", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert message in run.stderr
    assert not (tmp_path / "out.json").exists()
    assert not (tmp_path / "w" / "data").exists()


def test_weekly_synthesis_writes_consecutive_days_and_merges_the_truth(tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(ROOT / "spark_jobs" / "src"))
    from understudy_spark.synth import SynthSpec, synthesize

    per_day, truth = _bench().synthesize_weeks(
        synthesize, SynthSpec, groups=2, days=9, forms=("dump",), out=tmp_path, incidents_per_group_week=2.0
    )
    names = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert names == [f"2026-11-{d:02d}.txt" for d in range(1, 10)]
    assert len(per_day["dump"]) == 9
    assert all(n > 0 for n in per_day["dump"])
    # 4 incidents in the first week's plan, 1 in the two-day remainder, all kept
    assert len(truth["incidents"]) == 5
    assert _bench().injected_before(truth, 7) == 4


@pytest.mark.parametrize("form", ["dump", "query_range"])
def test_the_duckdb_reference_finds_the_injected_incidents(tmp_path: pathlib.Path, form: str) -> None:
    """The ratio only means something if DuckDB computes what the job computes: every
    injected incident, its durations, and proven vs unresolved two-reader time."""
    import datetime as dt

    sys.path.insert(0, str(ROOT / "spark_jobs" / "src"))
    from understudy_spark.synth import SynthSpec, synthesize

    bench = _bench()
    spec = SynthSpec(groups=4, days=1, step_s=bench.STEP_S, incidents=8, seed=11, violation_fraction=0.6)
    synthesize(spec, out=tmp_path, formats=(form,))
    truth = json.loads((tmp_path / "ground_truth.json").read_text())
    _seconds, rows = bench.run_duckdb(form, tmp_path)

    def bucket(text: str) -> int:
        return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()) // bench.STEP_S

    durations = ("read_unavailable_s", "failback_gap_s", "one_reader_violation_s", "one_reader_unresolved_s")
    got = sorted((r["group"], r["master_lost_b"], r["normal_b"], *(r[d] for d in durations)) for r in rows)
    want = sorted((i["group"], bucket(i["master_lost_at"]), bucket(i["normal_at"]), *(i[d] for d in durations))
                  for i in truth["incidents"])
    assert got == want
    # the plant has both kinds of two-reader time, or this would not test the split
    assert any(i["one_reader_violation_s"] for i in truth["incidents"])
    assert any(i["one_reader_unresolved_s"] for i in truth["incidents"])
