"""The ``understudy sla`` command line: option parsing (pure) and one end-to-end run of
``synth`` then ``report`` as a user would type them."""

from __future__ import annotations

import csv
import datetime as dt
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


T_MS = 1793534400000  # 2026-11-01T12:00:00Z, inside the one synthetic day
PERM = 'understudy_broker_permission{group="g", broker="g-0", role="master"}'


def bad_inputs(folder: pathlib.Path) -> dict[str, int]:
    """Three files with rejected lines in each form and some good samples (one incident
    of group ``g``); returns the rejected lines per file. Used by the CLI's --skip-bad
    run, which checks the per-file counts, the total and the samples kept."""
    good = []
    for i in range(8):
        t = T_MS + i * 15000
        good.append(f'{{__name__="understudy_group_mode", group="g"}} {1 if 2 <= i < 5 else 0} {t}')
        good.append(f'{{__name__="understudy_broker_permission", group="g", broker="g-0", role="master"}} '
                    f"{0 if 2 <= i < 5 else 3} {t}")
    folder.mkdir(parents=True, exist_ok=True)
    _write_file(folder, "a.txt", "\n".join([*good[:4], "garbage line", *good[4:], '{__name__="up"} 1 not-a-time']) + "\n")
    _write_file(folder, "b.om", f"# TYPE x gauge\n{PERM} 3\nnot a sample at all\n{PERM} 3 {T_MS}\n# EOF\n")
    _write_file(folder, "c.json", '{"status": "success", "data": \n\n')  # 3 lines, all rejected
    return {"a.txt": 2, "b.om": 2, "c.json": 3}


BAD_INPUT_GOOD_SAMPLES = 16 + 1  # a.txt and b.om


def _write_file(folder: pathlib.Path, name: str, text: str) -> None:
    (folder / name).write_text(text, encoding="utf-8")


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
def test_synth_then_report_end_to_end_with_skip_bad(tmp_path: pathlib.Path) -> None:
    """One real run of both commands: the synthetic plant plus three damaged files (one per
    form) under --skip-bad, which must report each file's rejected lines and keep the rest."""
    exports, out = tmp_path / "exports", tmp_path / "report"
    rejected = bad_inputs(tmp_path / "damaged")
    synth = _understudy(["sla", "synth", "--groups", "2", "--days", "1", "--step", "15s", "--incidents", "3",
                         "--seed", "11", "--format", "dump", "--out", str(exports)], timeout=120)
    assert synth.returncode == 0, synth.stderr
    truth = json.loads((exports / "ground_truth.json").read_text())
    targets = tmp_path / "targets.yaml"
    targets.write_text("incident_read_unavailable_s: 30\nmonthly_read_availability: 0.999\n")
    report = _understudy(["sla", "report", "--input", str(exports / "dump"), str(tmp_path / "damaged"),
                          "--out", str(out), "--targets", str(targets), "--shuffle-partitions", "2",
                          "--skip-bad"], timeout=600)
    assert report.returncode == 0, report.stderr
    assert "[sla" in report.stderr  # stage lines
    # the plant's incidents plus the one in the damaged files' good lines (group g)
    assert f"{len(truth['incidents']) + 1} incident(s)" in report.stdout
    samples = truth["samples"]["dump"] + truth["duplicates"] + BAD_INPUT_GOOD_SAMPLES
    assert f"from {samples} samples in 4 file(s)" in report.stdout
    total = sum(rejected.values())
    assert f"rejected {total} input line(s) (--skip-bad)" in report.stdout
    for name, n in rejected.items():
        assert re.search(rf"--skip-bad: rejected {n} line\(s\) of \S*/damaged/{re.escape(name)}\n", report.stderr), name
    assert f"{total} rejected input line(s)" in (out / "summary.md").read_text(encoding="utf-8")

    with (out / "incidents.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0].keys())[: len(CONTRACT_COLUMNS)] == CONTRACT_COLUMNS
    damaged = [r for r in rows if r["group"] == "g"]
    assert [r["master_lost_at"] for r in damaged] == [
        dt.datetime.fromtimestamp(T_MS / 1000 + 30, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")]
    rows = [r for r in rows if r["group"] != "g"]
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
