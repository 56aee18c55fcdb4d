"""Grafana dashboards: committed JSON equals the generator's output, the layout is sound, the
required panels exist, and every PromQL expression uses only contract metric names."""

from __future__ import annotations

import importlib.util
import itertools
import json
import pathlib
import re
from typing import Any

import pytest

from understudy_broker.metric_names import series_names
from understudy_harness.promql import selected_series

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIR = ROOT / "charts" / "understudy" / "files" / "grafana-dashboards"
FILES = sorted(DIR.glob("*.json"))


def load_generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "generate_dashboards", ROOT / "charts" / "tools" / "generate_dashboards.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
