"""Generate the chart's Grafana dashboards (charts/understudy/files/grafana-dashboards/*.json).

Why this script exists: hand-edited dashboard JSON drifts (duplicate panel ids, overlapping
grid positions, a hard-coded datasource uid, a misspelt option Grafana silently ignores). The
dashboards are written here with grafana-foundation-sdk's typed builders (pinned to the
Grafana 11.6 schema in the ``dev`` extra), the JSON files are committed for the chart's
``.Files.Glob``, and tests/test_dashboards.py fails if the committed files differ from what this
script writes. Run from the repository root:

    .venv/bin/python charts/tools/generate_dashboards.py

The PromQL uses only the DESIGN metrics contract and the operator's metric names
(understudy_broker.metric_names), which the tests check.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, units
from grafana_foundation_sdk.models import dashboard as dash

OUT = Path(__file__).resolve().parents[1] / "understudy" / "files" / "grafana-dashboards"
DS = dash.DataSourceRef(type_val="prometheus", uid="${datasource}")
G = 'group=~"$group"'
READERS = f"sum by (group) (understudy_broker_permission{{{G}}} % 2)"
T = 'topic=~"$topic"'
LAST = ["lastNotNull"]
Steps = list[tuple[float | None, str]]


def value_map(*texts_and_colors: tuple[str, str]) -> list[dash.ValueMapping]:
    """A value mapping 0 -> first text, 1 -> second, ... (metrics export enums as numbers)."""
    return [
        dash.ValueMap(
            options={
                str(i): dash.ValueMappingResult(text=text, color=color, index=i)
                for i, (text, color) in enumerate(texts_and_colors)
            }
        )
    ]


MODES = value_map(
    ("NORMAL", "green"), ("FENCING", "orange"), ("SLAVE_CONSUME", "yellow"), ("RECOVERING", "blue")
)
PERMISSIONS = value_map(
    ("NONE", "transparent"), ("READ", "green"), ("WRITE", "purple"), ("FULL", "blue")
)


# Fields that Grafana reads but the Grafana 11.6 schema (so the SDK's models) does not have. Each
# lives in one model subclass; tests/test_dashboards.py round-trips the JSON through the SDK and
# checks that these are the only keys it does not know.
class _PromAnnotationModel(dash.AnnotationQuery):
    def __init__(self, title_format: str, step: str) -> None:
        super().__init__()
        self.title_format = title_format
        self.step = step

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "titleFormat": self.title_format, "step": self.step}


class PromAnnotation(dash_b.AnnotationQuery):
    """A Prometheus annotation: ``titleFormat`` and ``step`` are read by the Prometheus
    datasource's annotation support, outside the dashboard schema."""

    def __init__(self, *, title_format: str, step: str) -> None:
        self._internal = _PromAnnotationModel(title_format, step)


class _LabelValuesModel(dash.VariableModel):
    def __init__(self, name: str, definition: str) -> None:
        super().__init__(type_val=dash.VariableType.QUERY, name=name)
        self.definition = definition

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "definition": self.definition}


class LabelValuesVariable(dash_b.QueryVariable):
    """A query variable over ``label_values(...)`` with the ``definition`` Grafana's variable
    editor writes (shown in the dashboard's variable list)."""

    def __init__(self, name: str, query: str, ref_id: str) -> None:
        self._internal = _LabelValuesModel(name, query)
        self.query({"query": query, "refId": ref_id})


def query_variable(name: str, label: str, query: str, ref_id: str) -> LabelValuesVariable:
    return (
        LabelValuesVariable(name, query, ref_id)
        .label(label)
        .datasource(DS)
        .refresh(dash.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .sort(dash.VariableSort.ALPHABETICAL_ASC)
        .hide(dash.VariableHide.DONT_HIDE)
    )


def target(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend).ref_id(ref)


class PanelBuilder(Protocol):
    """What every SDK panel builder (stat.Panel, timeseries.Panel, ...) has in common."""

    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: dash.DataSourceRef) -> Self: ...
    def with_target(self, target: prometheus.Dataquery) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def unit(self, unit: str) -> Self: ...
    def mappings(self, mappings: list[dash.ValueMapping]) -> Self: ...
    def thresholds(self, thresholds: dash_b.ThresholdsConfig) -> Self: ...


P = TypeVar("P", bound=PanelBuilder)


def base(
    panel: P,
    title: str,
    targets: list[prometheus.Dataquery],
    *,
    description: str,
    w: int,
    h: int,
    unit: str | None = None,
    mappings: list[dash.ValueMapping] | None = None,
    thresholds: Steps | None = None,
) -> P:
    """Title, queries, size, unit, mappings and thresholds: the part every panel kind shares."""
    panel = panel.title(title).description(description).datasource(DS).span(w).height(h)
    for t in targets:
        panel = panel.with_target(t)
    if unit:
        panel = panel.unit(unit)
    if mappings:
        panel = panel.mappings(mappings)
    steps = [dash.Threshold(value=v, color=c) for v, c in thresholds or [(None, "green")]]
    return panel.thresholds(
        dash_b.ThresholdsConfig().mode(dash.ThresholdsMode.ABSOLUTE).steps(steps)
    )


def stat_panel(
    title: str,
    targets: list[prometheus.Dataquery],
    *,
    background: bool = False,
    description: str,
    w: int,
    h: int,
    unit: str | None = None,
    mappings: list[dash.ValueMapping] | None = None,
    thresholds: Steps | None = None,
) -> stat.Panel:
    """A big number (last non-null value), coloured by thresholds or value mappings."""
    panel = base(
        stat.Panel(), title, targets, description=description, w=w, h=h, unit=unit,
        mappings=mappings, thresholds=thresholds,
    ).reduce_options(common_b.ReduceDataOptions().calcs(LAST))
    if background:
        panel = panel.color_mode(common.BigValueColorMode.BACKGROUND)
    return panel


def timeseries_panel(
    title: str,
    targets: list[prometheus.Dataquery],
    *,
    bars: bool = False,
    steps: bool = False,
    threshold_line: bool = False,
    description: str,
    w: int,
    h: int,
    unit: str | None = None,
    thresholds: Steps | None = None,
) -> timeseries.Panel:
    """A graph: lines by default; ``bars`` for counts per interval, ``steps`` for 0/1 series."""
    panel = base(
        timeseries.Panel(), title, targets, description=description, w=w, h=h, unit=unit,
        thresholds=thresholds,
    )
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    if steps:
        panel = (
            panel.draw_style(common.GraphDrawStyle.LINE)
            .line_interpolation(common.LineInterpolation.STEP_AFTER)
            .fill_opacity(20)
        )
    if threshold_line:
        panel = panel.thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
        )
    return panel


def timeline_panel(
    title: str,
    targets: list[prometheus.Dataquery],
    *,
    mappings: list[dash.ValueMapping],
    show_value: common.VisibilityMode,
    description: str,
    w: int,
    h: int,
) -> statetimeline.Panel:
    """A state timeline of an enum metric, one lane per series."""
    # The SDK materialises legend and tooltip with zero values (legend hidden, tooltip sorted
    # ascending); Grafana's own defaults for this panel are a visible legend and no sorting.
    return (
        base(
            statetimeline.Panel(), title, targets, description=description, w=w, h=h,
            mappings=mappings,
        )
        .show_value(show_value)
        .merge_values(True)
        .legend(
            common_b.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.SINGLE)
            .sort(common.SortOrder.NONE)
        )
    )


def bargauge_panel(
    title: str,
    targets: list[prometheus.Dataquery],
    *,
    description: str,
    w: int,
    h: int,
    unit: str | None = None,
) -> bargauge.Panel:
    """Horizontal gradient bars, one per series (last non-null value)."""
    return (
        base(bargauge.Panel(), title, targets, description=description, w=w, h=h, unit=unit)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common_b.ReduceDataOptions().calcs(LAST))
    )


# A row: its title and its panels, laid out left to right.
Section = tuple[str, Sequence[cogbuilder.Builder[dash.Panel]]]


def board(
    *, uid: str, title: str, description: str, rows: list[Section], broker_var: bool = False,
    topic_var: bool = False,
) -> dash.Dashboard:
    """The dashboard around the rows: variables, mode-change annotation, links, ids. Boards
    pick groups with ``$group``; with ``topic_var`` they pick topics with ``$topic`` instead,
    and the annotation marks mode changes of every group (any may hold a topic's queues)."""
    if topic_var:
        variable = query_variable("topic", "Topic", "label_values(understudy_topic_queues, topic)",
                                  "t")
        changes = "changes(understudy_group_epoch[2m]) > 0"
    else:
        variable = query_variable(
            "group", "Group", "label_values(understudy_broker_permission, group)", "g")
        changes = f"changes(understudy_group_epoch{{{G}}}[2m]) > 0"
    builder = (
        dash_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["understudy"])
        .timezone("utc")
        .editable()
        .tooltip(dash.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(
            dash_b.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .hide(dash.VariableHide.DONT_HIDE)
        )
        .with_variable(variable)
        .annotation(
            PromAnnotation(title_format="{{group}}: mode change", step="60s")
            .name("Mode changes")
            .datasource(DS)
            .enable(True)
            .icon_color("orange")
            .expr(changes)
        )
        .link(
            dash_b.DashboardLink("Understudy")
            .type(dash.DashboardLinkType.DASHBOARDS)
            .tags(["understudy"])
            .as_dropdown(True)
        )
    )
    if broker_var:
        q = f"label_values(understudy_messages_in_total{{{G}}}, broker)"
        builder = builder.with_variable(query_variable("broker", "Broker", q, "b"))
    # The SDK lays panels out left to right and starts a new line once a line is full; it does
    # not number panels (rows all get id 0) and does not wrap a panel that would overflow.
    for row_title, panels in rows:
        builder = builder.with_row(dash_b.Row(row_title))
        for panel in panels:
            builder = builder.with_panel(panel)
    model = builder.build()
    for n, item in enumerate(model.panels or [], start=1):
        item.id_val = n
        pos = item.grid_pos
        if pos is None or pos.x + pos.w > 24:
            raise ValueError(f"{title}: panel {item.title!r} does not fit the 24-column grid")
    return model


def group_overview() -> dash.Dashboard:
    mode = [target(f"max by (group) (understudy_group_mode{{{G}}})", "{{group}}")]
    failovers_1h = f"sum by (group) (increase(understudy_failover_total{{{G}}}[1h]))"
    return board(
        uid="understudy-group-overview",
        title="Understudy / Group overview",
        description="Mode, effective permissions, readers and failovers per broker group.",
        rows=[
            ("Now", [
                stat_panel(
                    "Mode", mode, background=True, mappings=MODES, w=8, h=4,
                    description="Group mode from the controller that leads the group.",
                ),
                stat_panel(
                    "Readers", [target(READERS, "{{group}}")], background=True, w=8, h=4,
                    description="Brokers holding READ right now. 1 is healthy; 0 is unreadable; "
                    "more than 1 breaks the one-reader invariant.",
                    thresholds=[(None, "red"), (1, "green"), (2, "red")],
                ),
                stat_panel(
                    "Epoch",
                    [target(f"max by (group) (understudy_group_epoch{{{G}}})", "{{group}}")],
                    description="Every mode change increments the epoch.", w=8, h=4,
                ),
            ]),
            ("Timeline", [
                timeline_panel(
                    "Mode timeline", mode, mappings=MODES, show_value=common.VisibilityMode.NEVER,
                    description="NORMAL -> FENCING -> SLAVE_CONSUME -> RECOVERING -> NORMAL.",
                    w=24, h=6,
                ),
                timeline_panel(
                    "Effective permission per broker",
                    [target(
                        f"max by (group, broker) (understudy_broker_permission{{{G}}})",
                        "{{broker}}",
                    )],
                    mappings=PERMISSIONS, show_value=common.VisibilityMode.AUTO,
                    description="What each broker enforces (computed, never configured by hand).",
                    w=24, h=8,
                ),
            ]),
            ("Availability and failovers", [
                timeseries_panel(
                    "Read availability", [target(f"({READERS}) > bool 0", "{{group}}")],
                    steps=True, unit=units.BoolYesNo, w=12, h=8,
                    description="1 while some broker of the group holds READ.",
                ),
                stat_panel(
                    "Read availability (range)",
                    [target(
                        f"avg_over_time((({READERS}) > bool 0)[$__range:$__interval]) * 100",
                        "{{group}}",
                    )],
                    description="Share of sampled time in the selected range with a reader. "
                    "Scrape gaps are not counted (see the failover SLA dashboard for the Spark "
                    "report).",
                    unit=units.Percent, w=6, h=8,
                    thresholds=[(None, "red"), (99, "orange"), (99.9, "green")],
                ),
                stat_panel(
                    "Failovers (range)",
                    [target(
                        f"sum by (group) (increase(understudy_failover_total{{{G}}}[$__range]))",
                        "{{group}}",
                    )],
                    description="Failovers started in the selected range.", w=6, h=8,
                ),
                timeseries_panel(
                    "Failovers per hour", [target(failovers_1h, "{{group}}")], bars=True,
                    description="Failovers in the preceding hour.", w=24, h=7,
                ),
            ]),
        ],
    )


def broker_performance() -> dash.Dashboard:
    sel = f'{G}, broker=~"$broker"'
    bucket = f"understudy_produce_latency_seconds_bucket{{{sel}}}"
    throughput = [
        timeseries_panel(
            f"{title} /s",
            [target(
                f"sum by (group, broker) (rate({metric}{{{sel}}}[$__rate_interval]))", "{{broker}}"
            )],
            description=f"{title} per broker ({metric}).", unit=units.OpsPerSecond, w=12, h=8,
        )
        for metric, title in (
            ("understudy_messages_in_total", "Messages in"),
            ("understudy_messages_out_total", "Messages out"),
        )
    ]
    return board(
        uid="understudy-broker-performance",
        title="Understudy / Broker performance",
        description="Throughput, produce latency and replication lag per broker.",
        broker_var=True,
        rows=[
            ("Throughput", throughput),
            ("Latency", [
                timeseries_panel(
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
                    description="Time to acknowledge a produce (includes the slave's persist in "
                    "sync mode).",
                    unit=units.Seconds, w=12, h=8,
                ),
                timeseries_panel(
                    "Acknowledged produce requests /s",
                    [target(
                        f"sum by (group) (rate(understudy_produce_latency_seconds_count{{{sel}}}"
                        "[$__rate_interval]))",
                        "{{group}}",
                    )],
                    description="Acknowledged produce requests per second.",
                    unit=units.RequestsPerSecond, w=12, h=8,
                ),
            ]),
            ("Replication", [
                timeseries_panel(
                    "Replication lag",
                    [target(
                        f"max by (group, broker) (understudy_replication_lag_bytes{{{sel}}})",
                        "{{broker}}",
                    )],
                    description="Bytes a slave is behind its master. Above the alert threshold "
                    "for minutes: check the slave's disk and network.",
                    unit=units.BytesIEC, thresholds=[(None, "green"), (67108864, "red")],
                    threshold_line=True, w=24, h=8,
                ),
            ]),
        ],
    )


def failover_sla() -> dash.Dashboard:
    phase = f"understudy_failover_phase_seconds_bucket{{{G}}}"
    return board(
        uid="understudy-failover-sla",
        title="Understudy / Failover SLA",
        description="Read availability, failover phase durations and operator health.",
        rows=[
            ("SLA over the selected range", [
                stat_panel(
                    "Read availability",
                    [target(
                        f"avg_over_time((({READERS}) > bool 0)[$__range:$__interval]) * 100",
                        "{{group}}",
                    )],
                    description="Sampled read availability. The Spark SLA report is "
                    "authoritative: it treats scrape gaps as unknown rather than up or down.",
                    unit=units.Percent, w=8, h=6,
                    thresholds=[(None, "red"), (99, "orange"), (99.9, "green")],
                ),
                stat_panel(
                    "Read-unavailable time",
                    [target(
                        f"sum_over_time((({READERS}) == bool 0)[$__range:$__interval]) "
                        "* $__interval_ms / 1000",
                        "{{group}}",
                    )],
                    description="Sampled seconds without a reader in the range.",
                    unit=units.Seconds, w=8, h=6,
                ),
                stat_panel(
                    "One-reader violations (samples)",
                    [target(
                        f"sum_over_time((({READERS}) > bool 1)[$__range:$__interval])",
                        "{{group}}",
                    )],
                    background=True, thresholds=[(None, "green"), (1, "red")], w=8, h=6,
                    description="Samples with two readers. Scrape skew can produce one at a "
                    "handoff; the drill checker measures exact overlaps.",
                ),
            ]),
            ("Failover phases", [
                bargauge_panel(
                    "Phase duration p95 (range)",
                    [target(
                        f"histogram_quantile(0.95, sum by (phase, le) "
                        f"(increase({phase}[$__range])))",
                        "{{phase}}",
                    ).instant()],
                    description="detect, fence, switch, backsync: 95th percentile over the range.",
                    unit=units.Seconds, w=12, h=8,
                ),
                timeseries_panel(
                    "Mean phase duration",
                    [target(
                        f"sum by (phase) (increase(understudy_failover_phase_seconds_sum{{{G}}}[1h]))"
                        f" / sum by (phase) "
                        f"(increase(understudy_failover_phase_seconds_count{{{G}}}[1h]))",
                        "{{phase}}",
                    )],
                    description="Mean duration of each phase over the preceding hour.",
                    unit=units.Seconds, w=12, h=8,
                ),
                timeseries_panel(
                    "Failovers",
                    [target(
                        f"sum by (group) (increase(understudy_failover_total{{{G}}}[1h]))",
                        "{{group}}",
                    )],
                    bars=True, description="Failovers in the preceding hour.", w=24, h=6,
                ),
            ]),
            ("Operator", [
                stat_panel(
                    "Operator replicas up", [target('sum(up{job=~".*understudy-operator.*"})', "up")],
                    background=True, thresholds=[(None, "red"), (1, "green")], w=6, h=7,
                    description="Scrape targets of the operator that are up.",
                ),
                timeseries_panel(
                    "Reconcile duration p99",
                    [target(
                        "histogram_quantile(0.99, sum by (handler, le) "
                        "(rate(understudy_operator_reconcile_duration_seconds_bucket"
                        "[$__rate_interval])))",
                        "{{handler}}",
                    )],
                    description="kopf handler wall time.", unit=units.Seconds, w=6, h=7,
                ),
                timeseries_panel(
                    "Decisions",
                    [target(
                        f"sum by (group, decision) "
                        f"(increase(understudy_operator_decisions_total{{{G}}}[$__rate_interval]))",
                        "{{group}} {{decision}}",
                    )],
                    bars=True, w=6, h=7,
                    description="Controller decisions applied (mode transitions, overrides).",
                ),
                timeseries_panel(
                    "Operator errors /s",
                    [target(
                        "sum by (handler, kind) "
                        "(rate(understudy_operator_errors_total[$__rate_interval]))",
                        "{{handler}} {{kind}}",
                    )],
                    description="Handler failures (temporary errors are retried).",
                    unit=units.OpsPerSecond, thresholds=[(None, "green"), (0.01, "red")], w=6, h=7,
                ),
            ]),
        ],
    )


def topics() -> dash.Dashboard:
    # One controller per cluster exports the topic series; "max by" hides the moment of a
    # hand-over when two export them (docs/cluster.md "Metrics").
    def per_topic(metric: str) -> list[prometheus.Dataquery]:
        return [target(f"max by (topic) ({metric}{{{T}}})", "{{topic}}")]

    queues = per_topic("understudy_topic_queues")
    writable = per_topic("understudy_topic_writable_queues")
    readable = per_topic("understudy_topic_readable_queues")
    lag = f"sum by (topic, consumer_group) (understudy_consumer_lag_messages{{{T}}})"
    return board(
        uid="understudy-topics",
        title="Understudy / Topics",
        description="Per topic: queues, queues with a writer and with a reader, consumer lag.",
        topic_var=True,
        rows=[
            ("Now", [
                stat_panel(
                    "Queues", queues, w=8, h=5,
                    description="Queues of the topic over every group (removed ones excluded).",
                ),
                stat_panel(
                    "Writable queues", writable, background=True, w=8, h=5,
                    thresholds=[(None, "red"), (1, "green")],
                    description="Queues whose group has a broker holding WRITE. A dead master "
                    "takes its group's queues out; producers send to the others.",
                ),
                stat_panel(
                    "Readable queues", readable, background=True, w=8, h=5,
                    thresholds=[(None, "red"), (1, "green")],
                    description="Queues whose group has a broker holding READ (the master, or "
                    "the acting slave while the master is down).",
                ),
            ]),
            ("Over time", [
                timeseries_panel(
                    "Queues without a writer",
                    [target(
                        f"max by (topic) (understudy_topic_queues{{{T}}}) - "
                        f"max by (topic) (understudy_topic_writable_queues{{{T}}})",
                        "{{topic}}",
                    )],
                    steps=True, w=12, h=8, thresholds=[(None, "green"), (1, "orange")],
                    description="Queues that producers cannot write now; all of them: the "
                    "UnderstudyTopicNotWritable alert.",
                ),
                timeseries_panel(
                    "Queues without a reader",
                    [target(
                        f"max by (topic) (understudy_topic_queues{{{T}}}) - "
                        f"max by (topic) (understudy_topic_readable_queues{{{T}}})",
                        "{{topic}}",
                    )],
                    steps=True, w=12, h=8, thresholds=[(None, "green"), (1, "orange")],
                    description="Queues that consumers cannot pull now (a group failing over).",
                ),
            ]),
            ("Consumers", [
                timeseries_panel(
                    "Consumer lag", [target(lag, "{{topic}} {{consumer_group}}")], w=24, h=8,
                    description="Messages not yet committed, per topic and consumer group "
                    "(log end minus committed offset, summed over queues). Growing for long: "
                    "the UnderstudyConsumerLagGrowing alert.",
                ),
            ]),
        ],
    )


DASHBOARDS: dict[str, Callable[[], dash.Dashboard]] = {
    "group-overview.json": group_overview,
    "broker-performance.json": broker_performance,
    "failover-sla.json": failover_sla,
    "topics.json": topics,
}


def render(build: Callable[[], dash.Dashboard]) -> str:
    """The dashboard as committed: the SDK's encoding, keys sorted, one trailing newline."""
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (OUT / name).write_text(render(build))
        print(f"wrote {OUT / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
