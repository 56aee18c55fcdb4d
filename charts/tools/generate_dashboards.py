"""Generate the chart's Grafana dashboards (charts/understudy/files/grafana-dashboards/*.json).

Why this script exists: hand-edited dashboard JSON drifts (duplicate panel ids, overlapping
grid positions, a hard-coded datasource uid). The dashboards are written here as data, the JSON
files are committed for the chart's ``.Files.Glob``, and operator/tests/test_dashboards.py fails
if the committed files differ from what this script writes. Run from the repository root:

    .venv/bin/python charts/tools/generate_dashboards.py

The JSON targets Grafana 11 (schemaVersion 39) and uses only the DESIGN metrics contract and the
operator's metric names (understudy_operator.k8s.metric_names), which the tests check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "understudy" / "files" / "grafana-dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
G = 'group=~"$group"'

MODE_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "NORMAL", "color": "green", "index": 0},
            "1": {"text": "FENCING", "color": "orange", "index": 1},
            "2": {"text": "SLAVE_CONSUME", "color": "yellow", "index": 2},
            "3": {"text": "RECOVERING", "color": "blue", "index": 3},
        },
    }
]
PERMISSION_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "NONE", "color": "transparent", "index": 0},
            "1": {"text": "READ", "color": "green", "index": 1},
            "2": {"text": "WRITE", "color": "purple", "index": 2},
            "3": {"text": "FULL", "color": "blue", "index": 3},
        },
    }
]


class Layout:
    """Assigns panel ids and grid positions left to right, top to bottom (24 columns)."""

    def __init__(self) -> None:
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_height = 0
        self.panels: list[dict[str, Any]] = []

    def add(self, panel: dict[str, Any], *, w: int, h: int) -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        panel["id"] = self.next_id
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.next_id += 1
        self.x += w
        self.row_height = max(self.row_height, h)
        self.panels.append(panel)

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        self.add(
            {"type": "row", "title": title, "collapsed": False, "panels": []}, w=24, h=1
        )
        self.x, self.y, self.row_height = 0, self.y + 1, 0


def target(expr: str, legend: str, ref: str = "A", **extra: Any) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, **extra}


def panel(
    kind: str,
    title: str,
    targets: list[dict[str, Any]],
    *,
    description: str,
    unit: str | None = None,
    mappings: list[dict[str, Any]] | None = None,
    thresholds: list[tuple[float | None, str]] | None = None,
    options: dict[str, Any] | None = None,
    custom: dict[str, Any] | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    if unit:
        defaults["unit"] = unit
    if mappings:
        defaults["mappings"] = mappings
    steps = thresholds or [(None, "green")]
    defaults["thresholds"] = {
        "mode": "absolute",
        "steps": [{"value": v, "color": c} for v, c in steps],
    }
    if custom:
        defaults["custom"] = custom
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
    }


def variables(*, broker: bool = False) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
        },
        {
            "name": "group",
            "label": "Group",
            "type": "query",
            "datasource": DS,
            "query": {"query": "label_values(understudy_broker_permission, group)", "refId": "g"},
            "definition": "label_values(understudy_broker_permission, group)",
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {},
            "sort": 1,
            "hide": 0,
        },
    ]
    if broker:
        q = f"label_values(understudy_messages_in_total{{{G}}}, broker)"
        items.append(
            {
                "name": "broker",
                "label": "Broker",
                "type": "query",
                "datasource": DS,
                "query": {"query": q, "refId": "b"},
                "definition": q,
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "current": {},
                "sort": 1,
                "hide": 0,
            }
        )
    return {"list": items}


def dashboard(
    *, uid: str, title: str, description: str, layout: Layout, broker_var: bool = False
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["understudy"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": variables(broker=broker_var),
        "annotations": {
            "list": [
                {
                    "name": "Mode changes",
                    "datasource": DS,
                    "enable": True,
                    "iconColor": "orange",
                    "expr": f"changes(understudy_group_epoch{{{G}}}[2m]) > 0",
                    "titleFormat": "{{group}}: mode change",
                    "step": "60s",
                }
            ]
        },
        "links": [
            {"title": "Understudy", "type": "dashboards", "tags": ["understudy"], "asDropdown": True}
        ],
        "panels": layout.panels,
    }


READERS = f"sum by (group) (understudy_broker_permission{{{G}}} % 2)"


def group_overview() -> dict[str, Any]:
    lay = Layout()
    lay.row("Now")
    lay.add(
        panel(
            "stat",
            "Mode",
            [target(f"max by (group) (understudy_group_mode{{{G}}})", "{{group}}")],
            description="Group mode from the controller that leads the group.",
            mappings=MODE_MAPPINGS,
            options={"colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=8,
        h=4,
    )
    lay.add(
        panel(
            "stat",
            "Readers",
            [target(READERS, "{{group}}")],
            description="Brokers holding READ right now. 1 is healthy; 0 is unreadable; "
            "more than 1 breaks the one-reader invariant.",
            thresholds=[(None, "red"), (1, "green"), (2, "red")],
            options={"colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=8,
        h=4,
    )
    lay.add(
        panel(
            "stat",
            "Epoch",
            [target(f"max by (group) (understudy_group_epoch{{{G}}})", "{{group}}")],
            description="Every mode change increments the epoch.",
            options={"reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=8,
        h=4,
    )
    lay.row("Timeline")
    lay.add(
        panel(
            "state-timeline",
            "Mode timeline",
            [target(f"max by (group) (understudy_group_mode{{{G}}})", "{{group}}")],
            description="NORMAL -> FENCING -> SLAVE_CONSUME -> RECOVERING -> NORMAL.",
            mappings=MODE_MAPPINGS,
            options={"showValue": "never", "mergeValues": True},
        ),
        w=24,
        h=6,
    )
    lay.add(
        panel(
            "state-timeline",
            "Effective permission per broker",
            [
                target(
                    f"max by (group, broker) (understudy_broker_permission{{{G}}})",
                    "{{broker}}",
                )
            ],
            description="What each broker enforces (computed, never configured by hand).",
            mappings=PERMISSION_MAPPINGS,
            options={"showValue": "auto", "mergeValues": True},
        ),
        w=24,
        h=8,
    )
    lay.row("Availability and failovers")
    lay.add(
        panel(
            "timeseries",
            "Read availability",
            [target(f"({READERS}) > bool 0", "{{group}}")],
            description="1 while some broker of the group holds READ.",
            unit="bool_yes_no",
            custom={"drawStyle": "line", "lineInterpolation": "stepAfter", "fillOpacity": 20},
        ),
        w=12,
        h=8,
    )
    lay.add(
        panel(
            "stat",
            "Read availability (range)",
            [
                target(
                    f"avg_over_time((({READERS}) > bool 0)[$__range:$__interval]) * 100",
                    "{{group}}",
                )
            ],
            description="Share of sampled time in the selected range with a reader. Scrape "
            "gaps are not counted (see the failover SLA dashboard for the Spark report).",
            unit="percent",
            thresholds=[(None, "red"), (99, "orange"), (99.9, "green")],
            options={"reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=6,
        h=8,
    )
    lay.add(
        panel(
            "stat",
            "Failovers (range)",
            [
                target(
                    f"sum by (group) (increase(understudy_failover_total{{{G}}}[$__range]))",
                    "{{group}}",
                )
            ],
            description="Failovers started in the selected range.",
            options={"reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=6,
        h=8,
    )
    lay.add(
        panel(
            "timeseries",
            "Failovers per hour",
            [
                target(
                    f"sum by (group) (increase(understudy_failover_total{{{G}}}[1h]))",
                    "{{group}}",
                )
            ],
            description="Failovers in the preceding hour.",
            custom={"drawStyle": "bars", "fillOpacity": 60},
        ),
        w=24,
        h=7,
    )
    return dashboard(
        uid="understudy-group-overview",
        title="Understudy / Group overview",
        description="Mode, effective permissions, readers and failovers per broker group.",
        layout=lay,
    )


def broker_performance() -> dict[str, Any]:
    sel = f'{G}, broker=~"$broker"'
    lay = Layout()
    lay.row("Throughput")
    for metric, title in (
        ("understudy_messages_in_total", "Messages in"),
        ("understudy_messages_out_total", "Messages out"),
    ):
        lay.add(
            panel(
                "timeseries",
                f"{title} /s",
                [
                    target(
                        f"sum by (group, broker) (rate({metric}{{{sel}}}[$__rate_interval]))",
                        "{{broker}}",
                    )
                ],
                description=f"{title} per broker ({metric}).",
                unit="ops",
            ),
            w=12,
            h=8,
        )
    lay.row("Latency")
    bucket = f"understudy_produce_latency_seconds_bucket{{{sel}}}"
    lay.add(
        panel(
            "timeseries",
            "Produce latency",
            [
                target(
                    f"histogram_quantile({q}, sum by (group, le) "
                    f"(rate({bucket}[$__rate_interval])))",
                    f"{{{{group}}}} p{int(q * 100)}",
                    ref,
                )
                for q, ref in ((0.5, "A"), (0.99, "B"))
            ],
            description="Time to acknowledge a produce (includes the slave's persist in sync "
            "mode).",
            unit="s",
        ),
        w=12,
        h=8,
    )
    lay.add(
        panel(
            "timeseries",
            "Acknowledged produce requests /s",
            [
                target(
                    f"sum by (group) (rate(understudy_produce_latency_seconds_count{{{sel}}}"
                    "[$__rate_interval]))",
                    "{{group}}",
                )
            ],
            description="Acknowledged produce requests per second.",
            unit="reqps",
        ),
        w=12,
        h=8,
    )
    lay.row("Replication")
    lay.add(
        panel(
            "timeseries",
            "Replication lag",
            [
                target(
                    f"max by (group, broker) (understudy_replication_lag_bytes{{{sel}}})",
                    "{{broker}}",
                )
            ],
            description="Bytes a slave is behind its master. Above the alert threshold for "
            "minutes: check the slave's disk and network.",
            unit="bytes",
            thresholds=[(None, "green"), (67108864, "red")],
            custom={"thresholdsStyle": {"mode": "line"}},
        ),
        w=24,
        h=8,
    )
    return dashboard(
        uid="understudy-broker-performance",
        title="Understudy / Broker performance",
        description="Throughput, produce latency and replication lag per broker.",
        layout=lay,
        broker_var=True,
    )


def failover_sla() -> dict[str, Any]:
    lay = Layout()
    lay.row("SLA over the selected range")
    lay.add(
        panel(
            "stat",
            "Read availability",
            [
                target(
                    f"avg_over_time((({READERS}) > bool 0)[$__range:$__interval]) * 100",
                    "{{group}}",
                )
            ],
            description="Sampled read availability. The Spark SLA report is authoritative: "
            "it treats scrape gaps as unknown rather than up or down.",
            unit="percent",
            thresholds=[(None, "red"), (99, "orange"), (99.9, "green")],
            options={"reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=8,
        h=6,
    )
    lay.add(
        panel(
            "stat",
            "Read-unavailable time",
            [
                target(
                    f"sum_over_time((({READERS}) == bool 0)[$__range:$__interval]) "
                    "* $__interval_ms / 1000",
                    "{{group}}",
                )
            ],
            description="Sampled seconds without a reader in the range.",
            unit="s",
            options={"reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=8,
        h=6,
    )
    lay.add(
        panel(
            "stat",
            "One-reader violations (samples)",
            [
                target(
                    f"sum_over_time((({READERS}) > bool 1)[$__range:$__interval])",
                    "{{group}}",
                )
            ],
            description="Samples with two readers. Scrape skew can produce one at a handoff; "
            "the drill checker measures exact overlaps.",
            thresholds=[(None, "green"), (1, "red")],
            options={"colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=8,
        h=6,
    )
    lay.row("Failover phases")
    phase = f"understudy_failover_phase_seconds_bucket{{{G}}}"
    lay.add(
        panel(
            "bargauge",
            "Phase duration p95 (range)",
            [
                target(
                    f"histogram_quantile(0.95, sum by (phase, le) "
                    f"(increase({phase}[$__range])))",
                    "{{phase}}",
                    instant=True,
                )
            ],
            description="detect, fence, switch, backsync: 95th percentile over the range.",
            unit="s",
            options={"orientation": "horizontal", "displayMode": "gradient"},
        ),
        w=12,
        h=8,
    )
    lay.add(
        panel(
            "timeseries",
            "Mean phase duration",
            [
                target(
                    f"sum by (phase) (increase(understudy_failover_phase_seconds_sum{{{G}}}[1h]))"
                    f" / sum by (phase) "
                    f"(increase(understudy_failover_phase_seconds_count{{{G}}}[1h]))",
                    "{{phase}}",
                )
            ],
            description="Mean duration of each phase over the preceding hour.",
            unit="s",
        ),
        w=12,
        h=8,
    )
    lay.add(
        panel(
            "timeseries",
            "Failovers",
            [
                target(
                    f"sum by (group) (increase(understudy_failover_total{{{G}}}[1h]))",
                    "{{group}}",
                )
            ],
            description="Failovers in the preceding hour.",
            custom={"drawStyle": "bars", "fillOpacity": 60},
        ),
        w=24,
        h=6,
    )
    lay.row("Operator")
    lay.add(
        panel(
            "stat",
            "Operator replicas up",
            [target('sum(up{job=~".*understudy-operator.*"})', "up")],
            description="Scrape targets of the operator that are up.",
            thresholds=[(None, "red"), (1, "green")],
            options={"colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}},
        ),
        w=6,
        h=7,
    )
    lay.add(
        panel(
            "timeseries",
            "Reconcile duration p99",
            [
                target(
                    "histogram_quantile(0.99, sum by (handler, le) "
                    "(rate(understudy_operator_reconcile_duration_seconds_bucket"
                    "[$__rate_interval])))",
                    "{{handler}}",
                )
            ],
            description="kopf handler wall time.",
            unit="s",
        ),
        w=6,
        h=7,
    )
    lay.add(
        panel(
            "timeseries",
            "Decisions",
            [
                target(
                    f"sum by (group, decision) "
                    f"(increase(understudy_operator_decisions_total{{{G}}}[$__rate_interval]))",
                    "{{group}} {{decision}}",
                )
            ],
            description="Controller decisions applied (mode transitions, overrides).",
            custom={"drawStyle": "bars", "fillOpacity": 60},
        ),
        w=6,
        h=7,
    )
    lay.add(
        panel(
            "timeseries",
            "Operator errors /s",
            [
                target(
                    "sum by (handler, kind) "
                    "(rate(understudy_operator_errors_total[$__rate_interval]))",
                    "{{handler}} {{kind}}",
                )
            ],
            description="Handler failures (temporary errors are retried).",
            unit="ops",
            thresholds=[(None, "green"), (0.01, "red")],
        ),
        w=6,
        h=7,
    )
    return dashboard(
        uid="understudy-failover-sla",
        title="Understudy / Failover SLA",
        description="Read availability, failover phase durations and operator health.",
        layout=lay,
    )


DASHBOARDS = {
    "group-overview.json": group_overview,
    "broker-performance.json": broker_performance,
    "failover-sla.json": failover_sla,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (OUT / name).write_text(render(build))
        print(f"wrote {OUT / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
