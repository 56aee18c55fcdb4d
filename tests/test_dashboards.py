"""Grafana dashboards: committed JSON equals the generator's output, the layout is sound, the
required panels exist, every PromQL expression uses only contract metric names, and the JSON is
Grafana 11 dashboard JSON as far as grafana-foundation-sdk's models can tell offline."""

from __future__ import annotations

import copy
import itertools
import json
import pathlib
import re
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.cog.runtime import panelcfg_config
from grafana_foundation_sdk.models.dashboard import Dashboard

from understudy_broker.metric_names import series_names
from understudy_harness.promql import selected_series
from understudy_harness.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIR = ROOT / "charts" / "understudy" / "files" / "grafana-dashboards"
FILES = sorted(DIR.glob("*.json"))


def load_generator() -> Any:
    return load_script(ROOT / "charts" / "tools" / "generate_dashboards.py",
                       "generate_dashboards")


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in FILES}


def expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target, annotation and variable query."""
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    for ann in board["annotations"]["list"]:
        found.append((f"annotation {ann['name']}", ann["expr"]))
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["definition"])
            assert match, var["definition"]
            found.append((f"variable {var['name']}", match.group(1)))
    return found


def test_committed_json_is_what_the_generator_writes() -> None:
    gen = load_generator()
    assert sorted(gen.DASHBOARDS) == [p.name for p in FILES]
    for name, build in gen.DASHBOARDS.items():
        assert (DIR / name).read_text() == gen.render(build), (
            f"{name} is stale: run .venv/bin/python charts/tools/generate_dashboards.py"
        )


def test_uids_are_unique_and_stable() -> None:
    uids = [b["uid"] for b in dashboards().values()]
    assert sorted(uids) == [
        "understudy-broker-performance",
        "understudy-failover-sla",
        "understudy-group-overview",
        "understudy-topics",
    ]


@pytest.mark.parametrize("name", [p.name for p in FILES])
def test_layout(name: str) -> None:
    board = dashboards()[name]
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0
        assert g["w"] > 0
        assert g["x"] + g["w"] <= 24, p["title"]
        boxes.append((p["title"], g))
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        overlap = (
            a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]
        )
        assert not overlap, (ta, tb)


@pytest.mark.parametrize("name", [p.name for p in FILES])
def test_datasource_is_a_variable(name: str) -> None:
    board = dashboards()[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("name", [p.name for p in FILES])
def test_expressions_use_only_contract_metrics(name: str) -> None:
    allowed = series_names()
    found = expressions(dashboards()[name])
    assert found
    for where, expr in found:
        names = selected_series(expr)
        assert names, (where, expr)
        assert names <= allowed, (where, names - allowed)


def titles(name: str) -> set[str]:
    return {p["title"] for p in dashboards()[name]["panels"]}


def test_required_panels() -> None:
    assert {
        "Mode timeline",
        "Effective permission per broker",
        "Failovers per hour",
        "Read availability",
    } <= titles("group-overview.json")
    assert {"Messages in /s", "Messages out /s", "Produce latency", "Replication lag"} <= titles(
        "broker-performance.json"
    )
    assert {
        "Read availability",
        "Read-unavailable time",
        "One-reader violations (samples)",
        "Phase duration p95 (range)",
    } <= titles("failover-sla.json")
    assert {"Queues", "Writable queues", "Readable queues", "Consumer lag"} <= titles(
        "topics.json"
    )


def test_topics_board_selects_topics_and_sums_lag_per_consumer_group() -> None:
    board = dashboards()["topics.json"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["topic"]["definition"] == "label_values(understudy_topic_queues, topic)"
    assert "group" not in variables
    for where, expr in expressions(board):
        if not where.startswith(("variable", "annotation")):
            assert 'topic=~"$topic"' in expr, where
    lag = next(p for p in board["panels"] if p["title"] == "Consumer lag")
    assert [t["expr"] for t in lag["targets"]] == [
        'sum by (topic, consumer_group) (understudy_consumer_lag_messages{topic=~"$topic"})'
    ]


def test_state_panels_map_every_value() -> None:
    board = dashboards()["group-overview.json"]
    timeline = next(p for p in board["panels"] if p["title"] == "Mode timeline")
    modes = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {k: v["text"] for k, v in modes.items()} == {
        "0": "NORMAL", "1": "FENCING", "2": "SLAVE_CONSUME", "3": "RECOVERING",
    }
    perms = next(p for p in board["panels"] if p["title"] == "Effective permission per broker")
    options = perms["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {k: v["text"] for k, v in options.items()} == {
        "0": "NONE", "1": "READ", "2": "WRITE", "3": "FULL",
    }
    assert {k: v["color"] for k, v in modes.items()} == {
        "0": "green", "1": "orange", "2": "yellow", "3": "blue",
    }
    mode_stat = next(p for p in board["panels"] if p["title"] == "Mode")
    assert mode_stat["fieldConfig"]["defaults"]["mappings"] == timeline["fieldConfig"]["defaults"][
        "mappings"
    ]


# Fields Grafana reads that the Grafana 11.6 schema, so the SDK's models, does not have.
OUTSIDE_SCHEMA = {
    # Read by the Prometheus datasource's annotation support.
    "annotation": {"titleFormat", "step"},
    # Written by Grafana's variable editor, shown in the dashboard's variable list.
    "query variable": {"definition"},
}


def decoded_custom_default(panel_type: str) -> Any:
    """What the SDK's decoder puts in fieldConfig.defaults.custom when the JSON has none."""
    config = panelcfg_config(panel_type)
    if config is None or config.field_config_from_json_hook is None:
        return None
    return json.loads(json.dumps(config.field_config_from_json_hook({}), cls=JSONEncoder))


@pytest.mark.parametrize("name", [p.name for p in FILES])
def test_sdk_models_read_the_json_back(name: str) -> None:
    """Decoding with the SDK's models and encoding again gives the committed JSON back: every
    field is one the Grafana 11.6 schema knows (the decoder drops what it does not know), except
    those named in OUTSIDE_SCHEMA."""
    register_default_plugins()
    board = dashboards()[name]
    expected = copy.deepcopy(board)
    for ann in expected["annotations"]["list"]:
        for key in OUTSIDE_SCHEMA["annotation"]:
            del ann[key]
    for var in expected["templating"]["list"]:
        if var["type"] == "query":
            for key in OUTSIDE_SCHEMA["query variable"]:
                del var[key]
    again = json.loads(json.dumps(Dashboard.from_json(copy.deepcopy(board)), cls=JSONEncoder))
    for panel, original in zip(again["panels"], board["panels"], strict=True):
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if "custom" in defaults and "custom" not in original["fieldConfig"]["defaults"]:
            assert defaults.pop("custom") == decoded_custom_default(panel["type"]), panel["title"]
    assert again == expected


def null_paths(value: Any, path: str = "") -> list[str]:
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in null_paths(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in null_paths(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("name", [p.name for p in FILES])
def test_is_grafana_11_dashboard_json(name: str) -> None:
    board = dashboards()[name]
    assert board["schemaVersion"] == Dashboard().schema_version  # what the pinned SDK writes
    assert 39 <= board["schemaVersion"] <= 41  # the Grafana 11 releases
    assert 8 <= len(board["uid"]) <= 40
    for key in ("templating", "annotations", "time"):
        assert isinstance(board[key], dict), key
    for panel in board["panels"]:
        assert isinstance(panel["id"], int)
        assert panel["id"] > 0
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert all(isinstance(v, int) for v in panel["gridPos"].values())
        if panel["type"] == "row":
            assert panel["collapsed"] is False
            assert panel["panels"] == []
            continue
        assert panel["type"] in {"stat", "timeseries", "state-timeline", "bargauge"}
        assert panel["title"]
        assert panel["description"]
        assert isinstance(panel.get("options", {}), dict)
        assert isinstance(panel["fieldConfig"]["defaults"], dict)
        assert panel["fieldConfig"]["overrides"] == []
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[0]["value"] is None  # the base step, -Infinity, which Grafana writes as null
        values = [s["value"] for s in steps[1:]]
        assert all(isinstance(v, int | float) for v in values)
        assert values == sorted(values)
        refs = [t["refId"] for t in panel["targets"]]
        assert all(refs)
        assert len(refs) == len(set(refs)), panel["title"]
    base_step = r"\.panels\[\d+\]\.fieldConfig\.defaults\.thresholds\.steps\[0\]\.value"
    assert [p for p in null_paths(board) if not re.fullmatch(base_step, p)] == []


def test_sdk_zero_values_do_not_change_what_grafana_shows() -> None:
    """The SDK writes whole option objects, filling what is not set with zero values (legend
    hidden, tooltip sorted, no reducer). Where the JSON has such an object it must say what
    Grafana's own default says."""
    for board in dashboards().values():
        for panel in board["panels"]:
            options = panel.get("options", {})
            if panel["type"] == "state-timeline":
                assert options["legend"]["showLegend"] is True, panel["title"]
                assert options["tooltip"] == {"mode": "single", "sort": "none"}, panel["title"]
            if "reduceOptions" in options:
                assert options["reduceOptions"]["calcs"] == ["lastNotNull"], panel["title"]
