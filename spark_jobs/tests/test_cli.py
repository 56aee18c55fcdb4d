"""The ``understudy sla`` command line: option parsing (pure) and one end-to-end run of
``synth`` then ``report`` as a user would type them."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from understudy_spark.cli import load_targets, parse_duration, sla

CONTRACT_COLUMNS = [
    "group", "master_lost_at", "reads_restored_at", "master_back_at", "normal_at",
    "read_unavailable_s", "failback_gap_s", "one_reader_violation_s",
]


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15.0), ("1m", 60.0), ("500ms", 0.5), ("30", 30.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "fast", "-5s", "0s", "15x"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a positive duration"):
        parse_duration(text)


def test_targets_from_yaml_and_json(tmp_path: pathlib.Path) -> None:
    y = tmp_path / "t.yaml"
    y.write_text("incident_read_unavailable_s: 30\nmonthly_read_availability: 0.99\n")
    j = tmp_path / "t.json"
    j.write_text(json.dumps({"monthly_read_availability": 0.9995}))
    assert load_targets(y).incident_read_unavailable_s == 30.0
    assert load_targets(y).monthly_read_availability == 0.99
    assert load_targets(j).monthly_read_availability == 0.9995
    assert load_targets(j).incident_read_unavailable_s == 60.0  # default


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("monthly_read_availability: 99.9\n", "a fraction"),
        ("availability: 0.9\n", "unknown key"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("incident_read_unavailable_s: soon\n", "must be numbers"),
        ("a: [\n", "not YAML or JSON"),
    ],
)
def test_bad_targets_file_is_a_clear_usage_error(tmp_path: pathlib.Path, content: str, pattern: str) -> None:
    path = tmp_path / "targets.yaml"
    path.write_text(content)
    with pytest.raises(ValueError, match=pattern):
        load_targets(path)
    result = CliRunner().invoke(sla, ["report", "--input", "x", "--out", str(tmp_path), "--targets", str(path)])
    assert result.exit_code == 2
    assert pattern.split()[0] in result.output
    assert "Traceback" not in result.output


def test_synth_rejects_more_events_than_fit(tmp_path: pathlib.Path) -> None:
    result = CliRunner().invoke(sla, ["synth", "--groups", "1", "--days", "1", "--incidents", "100",
                                      "--out", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "too many events" in result.output
    assert not (tmp_path / "s").exists()


def _understudy(args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in its own process group, killed on any failure."""
    cmd = [sys.executable, "-c", "from understudy_broker.cli import main; main()", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.spark
@pytest.mark.integration
def test_synth_then_report_end_to_end(tmp_path: pathlib.Path) -> None:
    exports, out = tmp_path / "exports", tmp_path / "report"
    synth = _understudy(["sla", "synth", "--groups", "2", "--days", "1", "--step", "15s", "--incidents", "3",
                         "--seed", "11", "--format", "dump", "--out", str(exports)], timeout=120)
    assert synth.returncode == 0, synth.stderr
    truth = json.loads((exports / "ground_truth.json").read_text())
    targets = tmp_path / "targets.yaml"
    targets.write_text("incident_read_unavailable_s: 30\nmonthly_read_availability: 0.999\n")
    report = _understudy(["sla", "report", "--input", str(exports / "dump"), "--out", str(out),
                          "--targets", str(targets), "--shuffle-partitions", "2"], timeout=600)
    assert report.returncode == 0, report.stderr
    assert "[sla" in report.stderr  # stage lines
    assert f"{len(truth['incidents'])} incident(s)" in report.stdout

    with (out / "incidents.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0].keys())[: len(CONTRACT_COLUMNS)] == CONTRACT_COLUMNS
    assert len(rows) == len(truth["incidents"])
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    assert all(iso.match(r[c]) for r in rows for c in CONTRACT_COLUMNS[1:5])
    assert {r["group"] for r in rows} == {i["group"] for i in truth["incidents"]}
    for name in ("daily.csv", "monthly.csv", "summary.md", "parquet/incidents", "parquet/monthly"):
        assert (out / name).exists(), name

    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("<svg") >= 3  # timeline, distribution, attainment
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched
    assert "<script" not in page
    assert "<link" not in page
    for incident in truth["incidents"]:
        assert incident["master_lost_at"] in page
