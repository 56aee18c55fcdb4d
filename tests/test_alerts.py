"""The chart's PrometheusRule: `promtool check rules`, `promtool test rules` with a firing and
a non-firing case per alert (charts/tests/alerts.test.yaml), alert metadata, and every PromQL
expression limited to the metrics contract."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from typing import Any

import helm_python
import pytest
import yaml

from understudy_broker.metric_names import series_names
from understudy_harness.promql import selected_series

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "understudy"
TESTS_FILE = ROOT / "charts" / "tests" / "alerts.test.yaml"
REQUIRED_ALERTS = {
    "UnderstudyGroupNotReadable",
    "UnderstudySlaveConsumeTooLong",
    "UnderstudyBackSyncStalled",
    "UnderstudyOneReaderViolation",
    "UnderstudyReplicationLagHigh",
    "UnderstudyOperatorDown",
    "UnderstudyTopicNotWritable",
    "UnderstudyConsumerLagGrowing",
}

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian package 'prometheus'; make setup installs it)",
)


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    merged = {"monitoring": {"prometheusRule": {"enabled": True, **(values or {})}}}
    out = helm_python.Chart.load(str(CHART)).render(merged, name="understudy", namespace="mon")
    doc = yaml.safe_load(out["understudy/templates/prometheusrule.yaml"])
    groups: list[dict[str, Any]] = doc["spec"]["groups"]
    return groups


def alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


def write_rules(directory: pathlib.Path, groups: list[dict[str, Any]]) -> pathlib.Path:
    path = directory / "understudy-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def promtool(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_check_rules(tmp_path: pathlib.Path) -> None:
    path = write_rules(tmp_path, rule_groups())
    proc = promtool("check", "rules", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(REQUIRED_ALERTS)} rules found" in proc.stdout


def test_promtool_unit_tests_pass(tmp_path: pathlib.Path) -> None:
    write_rules(tmp_path, rule_groups())
    shutil.copy(TESTS_FILE, tmp_path / "alerts.test.yaml")
    proc = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_unit_tests_fail_when_a_threshold_changes(tmp_path: pathlib.Path) -> None:
    # The promtool cases are sensitive: a rule rendered with other thresholds fails them.
    write_rules(tmp_path, rule_groups({"replicationLagBytes": 209715200, "slaveConsumeFor": "30m",
                                       "topicNotWritableFor": "5m",
                                       "consumerLagMessages": 5000}))
    shutil.copy(TESTS_FILE, tmp_path / "alerts.test.yaml")
    proc = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert proc.returncode != 0
    for alert in ("UnderstudyReplicationLagHigh", "UnderstudySlaveConsumeTooLong",
                  "UnderstudyTopicNotWritable", "UnderstudyConsumerLagGrowing"):
        assert alert in proc.stdout + proc.stderr, alert


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    doc = yaml.safe_load(TESTS_FILE.read_text())
    fires: set[str] = set()
    silent: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fires == REQUIRED_ALERTS
    assert silent == REQUIRED_ALERTS


def test_alert_metadata() -> None:
    found = alerts(rule_groups())
    assert {a["alert"] for a in found} == REQUIRED_ALERTS
    for alert in found:
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        for key in ("summary", "description", "runbook_url"):
            assert alert["annotations"][key].strip(), (alert["alert"], key)
        # All of these can flap (scrape skew, a failover in progress): require a hold time.
        assert _seconds(alert["for"]) >= 60, alert["alert"]


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(duration[:-1]) * units[duration[-1]]


def test_rule_expressions_use_only_contract_metrics() -> None:
    allowed = series_names()
    for alert in alerts(rule_groups()):
        names = selected_series(alert["expr"])
        assert names, alert["alert"]
        assert names <= allowed, (alert["alert"], names - allowed)
