"""Topic-level SLA (docs/sla.md "Topic SLA") on a hand-written export with known outages.

Three groups scraped every 60 s for an hour, three topics placed by
``understudy_topic_queue_info``: ``orders`` (queues 0-1 on g1, 2-3 on g2), ``audit`` (on g3)
and ``late`` (on g2, created half-way). g1 fails over (no writer for 11 minutes, nobody
reads for 3 of them), g2 loses WRITE for 3 minutes inside g1's outage, g3 is not scraped
for 5 minutes and the placement series itself has a 2-minute gap. Every figure of
``topics.csv`` is asserted exactly, the totals add up, the columns keep their contract
names, and the report draws a topic chart. Also the ``--topic-target`` option's parsing.
"""

from __future__ import annotations

import csv
import pathlib
from typing import Any

import numpy as np
import pytest

from understudy_broker import metric_names as names
from understudy_spark import cli, job, topics
from understudy_spark.transforms import Targets

STEP = 60
T0 = 1793491200  # 2026-11-01T00:00:00Z
N = 60  # buckets
G1_UNWRITABLE = set(range(10, 21))  # master killed at 10, back at 20, NORMAL at 21
G1_UNREADABLE = {10, 11, 20}  # FENCING before the slave reads; RECOVERING after it stops
G2_UNWRITABLE = {15, 16, 17}  # READ only: WRITE lost (e.g. too few in-sync replicas)
G3_GAP = set(range(40, 45))  # no scrape at all: unknown
INFO_GAP = {50, 51}  # the placement exporter was not scraped (a controller hand-over)
LATE_FROM = 30


def _line(metric: str, labels: dict[str, str], value: float, bucket: int) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{text}}} {value:g} {T0 + bucket * STEP + 5}"


def group_lines(group: str, b: int) -> list[str]:
    """mode, master and slave permission of ``group`` at bucket ``b`` (none in a gap)."""
    if group == "g3" and b in G3_GAP:
        return []
    mode, slave = 0, 0.0
    master: float | None = 3.0
    if group == "g1" and b in G1_UNWRITABLE:
        mode = 1 if b < 12 else (2 if b < 20 else 3)
        master = None if b < 20 else 0.0
        slave = 1.0 if 12 <= b < 20 else 0.0
    if group == "g2" and b in G2_UNWRITABLE:
        master = 1.0
    ctl = {"group": group}
    out = [_line(names.GROUP_MODE, ctl, mode, b)]
    if master is not None:
        out.append(_line(names.BROKER_PERMISSION, {"group": group, "broker": f"{group}-0", "role": "master"}, master, b))
    out.append(_line(names.BROKER_PERMISSION, {"group": group, "broker": f"{group}-1", "role": "slave"}, slave, b))
    return out


PLACEMENT = {"orders": ["g1", "g1", "g2", "g2"], "audit": ["g3"], "late": ["g2"]}


def readable(group: str, b: int) -> bool:
    return not (group == "g1" and b in G1_UNREADABLE) and not (group == "g3" and b in G3_GAP)


def topic_lines(b: int) -> list[str]:
    out = []
    for topic, groups in PLACEMENT.items():
        if b in INFO_GAP or (topic == "late" and b < LATE_FROM):
            continue
        for q, g in enumerate(groups):
            out.append(_line(names.TOPIC_QUEUE_INFO, {"topic": topic, "queue": str(q), "group": g,
                                                      "instance": "ctl:9300"}, 1, b))
    # orders' consumer group: queue 0 lags b messages, the others none; a queue's lag is
    # exported by the broker reading its group, so nothing while nobody reads
    for q, g in enumerate(PLACEMENT["orders"]):
        if readable(g, b):
            out.append(_line(names.CONSUMER_LAG_MESSAGES, {"group": g, "topic": "orders", "queue": str(q),
                                                           "consumer_group": "billing"}, b if q == 0 else 0, b))
    return out


def export() -> str:
    lines = ["# TYPE understudy_group_mode gauge"]
    for b in range(N):
        for g in ("g1", "g2", "g3"):
            lines += group_lines(g, b)
        lines += topic_lines(b)
    return "\n".join([*lines, "# EOF"]) + "\n"


def _rows(path: pathlib.Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def out(module_spark: Any, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    base = tmp_path_factory.mktemp("topics")
    (base / "plant.om").write_text(export(), encoding="utf-8")
    targets = Targets(topic_availability=0.9, topic_targets=(("orders", 0.9999),))
    job.run(module_spark, job.JobConfig(inputs=(str(base / "plant.om"),), out=str(base / "sla"), step_s=STEP,
                                 targets=targets), progress=lambda _m: None)
    return base / "sla"


# Expected, bucket by bucket (60 s each), from the outages above.
EXPECTED = {
    # known: every bucket but the placement gap; not writable: both groups at once (15-17);
    # partly readable: g1's unreadable minutes (g2's queues still read)
    "orders": {"known_s": 58 * 60, "unknown_s": 2 * 60, "write_unavailable_s": 3 * 60,
               "read_partial_s": 3 * 60, "read_none_s": 0, "write_available_s": 55 * 60, "read_full_s": 55 * 60},
    # g3's scrape gap and the placement gap are unknown, never unavailable
    "audit": {"known_s": 53 * 60, "unknown_s": 7 * 60, "write_unavailable_s": 0, "read_partial_s": 0,
              "read_none_s": 0, "write_available_s": 53 * 60, "read_full_s": 53 * 60},
    # counted from its creation only
    "late": {"known_s": 28 * 60, "unknown_s": 2 * 60, "write_unavailable_s": 0, "read_partial_s": 0,
             "read_none_s": 0, "write_available_s": 28 * 60, "read_full_s": 28 * 60},
}


@pytest.mark.spark
def test_each_topic_is_measured_exactly_and_judged_against_its_target(out: pathlib.Path) -> None:
    monthly = {r["topic"]: r for r in _rows(out / "topics.csv")}
    daily = {r["topic"]: r for r in _rows(out / "topics_daily.csv")}
    assert set(monthly) == set(EXPECTED) == set(daily)
    for topic, want in EXPECTED.items():
        row = monthly[topic]
        assert row["month"] == "2026-11"
        assert {k: float(row[k]) for k in want} == pytest.approx(want), topic
        assert float(row["write_availability"]) == pytest.approx(want["write_available_s"] / want["known_s"])
        assert float(row["read_availability"]) == pytest.approx(want["read_full_s"] / want["known_s"])
        # it adds up: writable + not = known = full + partial + none; months = days
        known = float(row["known_s"])
        assert float(row["write_available_s"]) + float(row["write_unavailable_s"]) == pytest.approx(known)
        assert sum(float(row[k]) for k in ("read_full_s", "read_partial_s", "read_none_s")) == pytest.approx(known)
        assert {k: float(daily[topic][k]) for k in want} == {k: float(row[k]) for k in want}
    # orders (55/58 = 94.8 %) misses its own 99.99 %; the others meet the default 90 %
    assert {t: r["target_met"] for t, r in monthly.items()} == {"orders": "False", "audit": "True", "late": "True"}
    assert float(monthly["orders"]["target"]) == pytest.approx(0.9999)
    assert float(monthly["late"]["target"]) == pytest.approx(0.9)


@pytest.mark.spark
def test_consumer_lag_percentiles_per_consumer_group(out: pathlib.Path) -> None:
    (row,) = _rows(out / "consumer_lag.csv")
    per_bucket = np.array([0 if b in G1_UNREADABLE else b for b in range(N)], dtype=float)
    assert (row["topic"], row["consumer_group"], row["month"], int(row["buckets"])) == ("orders", "billing", "2026-11", N)
    for q in (50, 95, 99):
        assert float(row[f"lag_p{q}"]) == pytest.approx(float(np.percentile(per_bucket, q)))
    assert float(row["lag_max"]) == N - 1


@pytest.mark.spark
def test_the_topic_tables_keep_their_columns_and_the_report_draws_them(out: pathlib.Path) -> None:
    with (out / "topics.csv").open(newline="") as fh:
        header = next(csv.reader(fh))
    assert header[:5] == ["topic", "month", "write_availability", "read_availability", "target_met"]
    assert header == topics.TOPIC_MONTHLY_COLUMNS
    for name in ("topics", "topics_daily", "consumer_lag"):
        assert any((out / "parquet" / name).glob("*.parquet")), name
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<h2>Topics</h2>" in page
    chart = page.split('aria-label="topic availability timeline"', 1)[1].split("</svg>", 1)[0]
    for topic in EXPECTED:
        assert f">{topic}</text>" in chart
    assert "orders no writes" in chart
    assert "orders some queues not readable" in chart
    assert "audit unknown" in chart
    assert "1 topic-month(s) missed the target: orders 2026-11." in page
    assert "| orders | 2026-11 |" in (out / "summary.md").read_text(encoding="utf-8")


def test_topic_targets_from_the_command_line_and_the_targets_file(tmp_path: pathlib.Path) -> None:
    assert cli.parse_topic_targets(("orders=99.99", "audit=99.5")) == (("audit", 0.995), ("orders", 0.9999))
    for bad in ("orders", "orders=", "=99", "orders=101", "orders=abc"):
        with pytest.raises(ValueError, match="--topic-target"):
            cli.parse_topic_targets((bad,))
    path = tmp_path / "targets.yaml"
    path.write_text("topic_availability: 0.9995\ntopic_targets:\n  orders: 0.9999\n", encoding="utf-8")
    targets = cli.load_targets(path)
    assert targets.topic_availability == 0.9995
    assert targets.topic_target_map() == {"orders": 0.9999}
