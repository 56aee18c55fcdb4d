"""The SLA report adds up: every total equals the sum of its parts.

- A property test (Hypothesis) over random plants: random per-bucket state timelines of
  many groups (mode, master and slave permission, each sometimes missing; whole buckets
  missing; groups without a mode series), straddling a UTC day and month boundary, through
  the transforms once per example. Per group: the daily total read-unavailable time
  equals an independent count from the generated timeline, and equals the incidents' time
  plus the time outside incidents; monthly = sum of daily, ``ALL`` = sum of the groups,
  known + unknown = the window; and the rendered report's "where the read-unavailable time
  is" table adds up the same way.
- ``make demo``'s shape (28 seconds of data, through the job's transforms): the bucket in which
  the master was gone and nobody read yet, while the controller's mode sample still said
  NORMAL, belongs to the incident (it was "3 s overall, 0 s in each of the three
  incidents"), time outside incidents is its own line, and the window is labelled too
  short to judge a monthly budget instead of "11111 %".
- The formatting and budget rules on their own (no Spark).
"""

from __future__ import annotations

import datetime as dt
import html.parser
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from understudy_spark import report
from understudy_spark import transforms as T
from understudy_spark.readers import SAMPLES_SCHEMA

# --- reading the rendered report back -------------------------------------------------------


@dataclass
class Cell:
    text: str
    attrs: dict[str, str | None]


class _Tables(html.parser.HTMLParser):
    """Every ``<table>`` of a page: its id, header texts and rows of cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self._cell: Cell | None = None
        self._row: list[Cell] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append({"id": dict(attrs).get("id"), "head": [], "rows": []})
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = Cell("", dict(attrs) | {"_tag": tag})

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.text += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row and all(c.attrs["_tag"] == "th" for c in self._row):
                self.tables[-1]["head"] = [c.text for c in self._row]
            else:
                self.tables[-1]["rows"].append(self._row)
            self._row = None


def tables_of(page: str) -> list[dict[str, Any]]:
    parser = _Tables()
    parser.feed(page)
    return parser.tables


def adds_up_table(page: str) -> dict[str, dict[str, float]]:
    """The "where the read-unavailable time is" table: row name -> column -> exact seconds."""
    (table,) = [t for t in tables_of(page) if t["id"] == "adds-up"]
    out: dict[str, dict[str, float]] = {}
    for row in table["rows"]:
        out[row[0].text] = {h: float(c.attrs["data-s"] or "nan")
                            for h, c in zip(table["head"], row, strict=True) if "data-s" in c.attrs}
    return out


def check_adds_up_in_page(page: str, *, total_s: float) -> dict[str, dict[str, float]]:
    """Each row: in incidents + outside = total; the group rows sum to "All groups", which is
    the monthly tables' total."""
    rows = adds_up_table(page)
    everything = rows.pop("All groups")
    outside = "Outside incidents (s)"
    for name, row in [*rows.items(), ("All groups", everything)]:
        parts = row["In incidents (s)"] + row.get(outside, 0.0)
        assert parts == pytest.approx(row["Total read-unavailable (s)"], abs=1e-6), (name, row)
    for column, value in everything.items():
        assert sum(r[column] for r in rows.values()) == pytest.approx(value, abs=1e-6), column
    assert everything["Total read-unavailable (s)"] == pytest.approx(total_s, abs=1e-6)
    return {**rows, "All groups": everything}


def check_headers_are_words(page: str) -> None:
    raw = set(T.INCIDENT_COLUMNS) | set(T.OUTSIDE_COLUMNS) | {
        "known_s", "unknown_s", "incidents_over_limit", "max_incident_read_unavailable_s", "failovers_counted",
        "read_availability", "target_met", "month", "day"}
    for table in tables_of(page):
        assert table["head"], table
        for text in table["head"]:
            assert text not in raw, (text, table["head"])
            assert "_" not in text, (text, table["head"])


# --- pure rules ------------------------------------------------------------------------------


def test_seconds_are_printed_exactly_and_availability_never_rounds_up() -> None:
    assert report.fmt_seconds(2592015.0) == "2,592,015"  # was 2.59202e+06 in the tables
    assert report.fmt_seconds(0.5) == "0.5"
    assert report.fmt_seconds(3 * 0.1) == "0.3"
    assert report.fmt_seconds(0.0) == "0"
    assert report.fmt_seconds(float("nan")) == ""
    assert report.fmt_duration(28.0) == "28 s"
    assert report.fmt_duration(7200.0) == "7,200 s (2 h)"
    assert report.fmt_fraction(0.999) == "99.9 %"
    assert report.fmt_fraction(0.99999999) == "99.9999 %"  # not 100 %
    assert report.fmt_fraction(1.0) == "100 %"


def _meta(start: str, end: str) -> report.ReportMeta:
    return report.ReportMeta(inputs=("x",), step_s=1.0, targets=T.Targets(), samples=1, rejected_lines=0,
                             start=pd.Timestamp(start), end=pd.Timestamp(end))


def _month_row(**kw: Any) -> Any:
    row = {"group": "g", "month": "2026-11", "known_s": 27.0, "read_unavailable_s": 3.0, "read_availability": 1 - 3 / 27,
           "target": 0.999, "target_met": False, "incidents_over_limit": 0} | kw
    return next(pd.DataFrame([row]).itertuples(index=False))


def test_a_window_much_shorter_than_the_month_is_not_extrapolated() -> None:
    short = _meta("2026-11-26T14:34:02", "2026-11-26T14:34:30")
    b = report.budget(_month_row(), short)
    assert not b.judged
    assert b.text == "window 28 s: too short to judge a monthly budget"
    monthly = pd.DataFrame([_month_row()._asdict()])
    chart = report.attainment_svg(monthly, short)
    assert "<svg" not in chart
    assert "%" not in chart.replace("% of it readable", "")  # the measured share only
    assert "too short to judge a monthly budget" in chart
    assert "3 s read-unavailable of 27 s known time" in chart
    # a day of data is judged against the budget pro-rated to it
    day = _meta("2026-11-26T00:00:00", "2026-11-27T00:00:00")
    b = report.budget(_month_row(known_s=86400.0, read_unavailable_s=43.2), day)
    assert b.judged
    assert b.used == pytest.approx(0.5)
    assert b.text.startswith("50 % of 86.4 s")
    # the window is cut at the month's edges: 2 days of data, one in each month
    assert report.month_window_s("2026-11", pd.Timestamp("2026-11-30"), pd.Timestamp("2026-12-02")) == 86400.0
    assert report.month_window_s("2026-12", pd.Timestamp("2026-11-30"), pd.Timestamp("2026-12-02")) == 86400.0


# --- the property test over random plants -----------------------------------------------------
#
# Hypothesis draws the plants; they are then put through Spark together, one pass for all
# of them (a pass per example cost ~10 s of Spark planning and jobs; one pass costs about the
# same as one example). Each plant's groups are named after the plant, so every check is
# still per plant and per group; a failure names the plant and prints its timelines.

MONTH_EDGE = dt.datetime(2026, 12, 1)  # the session time zone is UTC
STEP = 15.0
N_PLANTS = 40

Bucket = tuple[int | None, int | None, int | None] | None  # (mode, master, slave); None: no sample


@dataclass(frozen=True)
class Plant:
    start: dt.datetime  # bucket 0 of the plant
    # group -> (offset in buckets, buckets: None = no sample at all, else (mode, master
    # permission, slave permission), each None = no sample of that series)
    groups: dict[str, tuple[int, list[Bucket]]]


BUCKET = st.one_of(
    st.none(),  # a scrape gap: nothing at all
    st.tuples(
        st.sampled_from([0, 0, 0, 1, 2, 2, 3, None]),
        st.sampled_from([3, 3, 3, 0, 0, None, None, 1]),
        st.sampled_from([0, 0, 0, 1, 1, None]),
    ),
)
# Runs of the states a failover goes through (mode, master, slave), so that incidents,
# lead-ins, two readers, gaps and stopped groups all occur, with fully random buckets
# between them.
PHASES: dict[str, Bucket] = {
    "healthy": (0, 3, 0),
    "master gone, mode still NORMAL": (0, None, 0),
    "fencing": (1, None, 0),
    "slave reads": (2, None, 1),
    "master back without READ": (2, 0, 1),
    "two readers": (2, 3, 1),
    "recovering": (3, 0, 0),
    "scrape gap": None,
    "stopped": (0, None, None),
}
FAILOVER = ["healthy", "master gone, mode still NORMAL", "fencing", "slave reads", "master back without READ",
            "two readers", "recovering", "healthy"]
RUN = st.one_of(
    # a whole failover, each phase 0-3 buckets long (a phase can be missed between scrapes)
    st.lists(st.integers(min_value=0, max_value=3), min_size=len(FAILOVER), max_size=len(FAILOVER)).map(
        lambda lengths: [PHASES[p] for p, n in zip(FAILOVER, lengths, strict=True) for _ in range(n)]),
    st.tuples(st.sampled_from(list(PHASES)).map(PHASES.__getitem__),
              st.integers(min_value=1, max_value=4)).map(lambda run: [run[0]] * run[1]),
    st.lists(BUCKET, min_size=1, max_size=3),
)


@st.composite
def plants(draw: st.DrawFn, index: int) -> Plant:
    n_groups = draw(st.integers(min_value=1, max_value=6))
    before_edge = draw(st.integers(min_value=0, max_value=60))  # straddles a day and a month
    groups: dict[str, tuple[int, list[Bucket]]] = {}
    for i in range(n_groups):
        has_mode = draw(st.booleans()) or i == 0
        offset = draw(st.integers(min_value=0, max_value=10))
        runs = draw(st.lists(RUN, min_size=3, max_size=20))
        buckets = [b for run in runs for b in run]
        if not has_mode:  # a group without a controller: no mode series at all
            buckets = [None if b is None else (None, b[1], b[2]) for b in buckets]
        if all(b is None or b == (None, None, None) for b in buckets):
            buckets = [(0 if has_mode else None, 3, 0)]
        groups[f"k{index:02d}/g{i}"] = (offset, buckets)
    return Plant(MONTH_EDGE - dt.timedelta(seconds=before_edge * STEP), groups)


def draw_plants(n: int) -> list[Plant]:
    """``n`` plants drawn by Hypothesis (derandomized: the same plants on every run)."""
    drawn: list[Plant] = []

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def collect(data: st.DataObject) -> None:
        drawn.append(data.draw(plants(len(drawn))))

    collect()
    return drawn


def plant_samples(spark: Any, plant_list: list[Plant], *, step_s: float = STEP) -> Any:
    rows = []
    for plant in plant_list:
        for group, (offset, buckets) in plant.groups.items():
            ctl = {"group": group, "instance": "ctl:9300"}
            master = {"group": group, "broker": f"{group}-0", "role": "master"}
            slave = {"group": group, "broker": f"{group}-1", "role": "slave"}
            for i, b in enumerate(buckets):
                if b is None:
                    continue
                at = plant.start + dt.timedelta(seconds=(offset + i + 0.3) * step_s)
                for metric, labels, value in ((T.MODE, ctl, b[0]), (T.PERMISSION, master, b[1]),
                                              (T.PERMISSION, slave, b[2])):
                    if value is not None:
                        rows.append((at, metric, labels, float(value)))
    return spark.createDataFrame(rows, schema=SAMPLES_SCHEMA)


def expected_unavailable_buckets(buckets: list[Bucket]) -> int:
    """Known and nobody readable, counted straight from a generated timeline (the
    definition in docs/sla.md, independent of the Spark code)."""
    present = [b for b in buckets if b is not None and b != (None, None, None)]
    n_brokers = max(sum(p is not None for p in b[1:]) for b in present)
    count = 0
    for mode, master, slave in present:
        perms = [p for p in (master, slave) if p is not None]
        known = mode is not None or (len(perms) >= n_brokers > 0)
        readable = any(p & 1 for p in perms)
        count += known and not readable
    return count


def run_transforms(samples: Any, *, step_s: float, targets: T.Targets) -> dict[str, Any]:
    """The job's transforms, in the job's order (``job.run`` without the file output):
    the tables as pandas frames, and the first and last bucket."""
    states = T.group_states(T.clean_samples(samples, step_s=step_s))
    buckets = T.incident_buckets(states).cache()
    try:
        bounds = buckets.agg(F.min("bucket"), F.max("bucket")).first()
        assert bounds is not None
        lo, hi = int(bounds[0]), int(bounds[1])
        incidents = T.incidents(buckets, step_s=step_s).cache()
        daily = T.daily_sla(buckets, incidents, step_s=step_s, first_bucket=lo, last_bucket=hi,
                            targets=targets).cache()
        frames = {
            "incidents": incidents.toPandas().sort_values(["group", "master_lost_at"], ignore_index=True),
            "daily": daily.toPandas(),
            "monthly": T.monthly_sla(daily, targets=targets).toPandas(),
            "outside": T.outside_incidents(buckets, step_s=step_s).toPandas(),
            "timeline": T.timeline(buckets, step_s=step_s).toPandas(),
        }
        daily.unpersist()
        incidents.unpersist()
    finally:
        buckets.unpersist()
    return {**frames, "lo": lo, "hi": hi}


def run_plants(spark: Any, plant_list: list[Plant]) -> dict[str, Any]:
    targets = T.Targets(incident_read_unavailable_s=2 * STEP, monthly_read_availability=0.99)
    return run_transforms(plant_samples(spark, plant_list), step_s=STEP, targets=targets)


SUMMED = ["known_s", "unknown_s", "read_unavailable_s", "one_reader_violation_s", "one_reader_unresolved_s",
          "incidents", "incidents_over_limit", "failovers_counted"]


@pytest.fixture(scope="module")
def batch(module_spark: Any) -> tuple[list[Plant], dict[str, Any]]:
    plant_list = draw_plants(N_PLANTS)
    return plant_list, run_plants(module_spark, plant_list)


@pytest.mark.spark
def test_per_group_the_total_is_the_incidents_plus_the_time_outside_them(
        batch: tuple[list[Plant], dict[str, Any]]) -> None:
    plant_list, f = batch
    inc, daily, outside = f["incidents"], f["daily"], f["outside"]
    lo, hi = f["lo"], f["hi"]

    def by_group(frame: pd.DataFrame, column: str) -> dict[str, float]:
        return {str(g): float(v) for g, v in frame.groupby("group")[column].sum().items()} if len(frame) else {}

    total, in_inc, out = (by_group(daily, "read_unavailable_s"), by_group(inc, "read_unavailable_s"),
                          by_group(outside, "read_unavailable_s"))
    n_incidents = inc.groupby("group").size().to_dict() if len(inc) else {}
    checked = 0
    for plant in plant_list:
        for group, (_offset, buckets) in plant.groups.items():
            where = (group, buckets, inc[inc["group"] == group].to_dict("records"),
                     outside[outside["group"] == group].to_dict("records"))
            # the total is the timeline's own count; incidents + outside incidents = the total
            assert total.get(group, 0.0) == expected_unavailable_buckets(buckets) * STEP, where
            assert in_inc.get(group, 0.0) + out.get(group, 0.0) == total.get(group, 0.0), where
            # the daily table covers the window exactly: known + unknown over its days
            rows = daily[daily["group"] == group]
            assert float((rows["known_s"] + rows["unknown_s"]).sum()) == (hi - lo + 1) * STEP, where
            assert int(rows["incidents"].sum()) == n_incidents.get(group, 0), where
            checked += 1
    assert checked == daily["group"].nunique()
    # the plants exercise what they should: many groups, incidents with and without a
    # lead-in, open ones, gaps inside them, time outside them, two days
    assert checked > 100
    assert len(inc) > 50
    assert len(outside) > 20
    assert daily["day"].nunique() == 2
    assert bool(inc["open"].any())
    assert bool((inc["unknown_s"] > 0).any())
    lead_in = inc["master_lost_at"] < inc["reads_restored_at"] - pd.Timedelta(seconds=STEP)
    assert 0 < int(lead_in.sum()) < len(inc)


@pytest.mark.spark
def test_monthly_is_the_sum_of_its_days_and_all_the_sum_of_its_groups(
        batch: tuple[list[Plant], dict[str, Any]]) -> None:
    _plants, f = batch
    daily, monthly = f["daily"], f["monthly"]
    daily = daily.assign(month=pd.to_datetime(daily["day"]).dt.strftime("%Y-%m"))
    assert daily["month"].nunique() == 2  # the plants straddle a month boundary
    per_group = monthly[monthly["group"] != T.OVERALL].set_index(["group", "month"]).sort_index()
    from_days = daily.groupby(["group", "month"])[SUMMED].sum().sort_index()
    assert list(per_group.index) == list(from_days.index)
    overall = monthly[monthly["group"] == T.OVERALL].set_index("month").sort_index()
    from_groups = per_group.groupby(level="month")[SUMMED].sum().sort_index()
    for column in SUMMED:
        assert per_group[column].astype(float).tolist() == pytest.approx(from_days[column].astype(float).tolist())
        assert overall[column].astype(float).tolist() == pytest.approx(from_groups[column].astype(float).tolist())
        assert float(overall[column].sum()) == pytest.approx(float(daily[column].sum()))
    worst = daily.groupby(["group", "month"])["max_incident_read_unavailable_s"].max().sort_index()
    assert per_group["max_incident_read_unavailable_s"].tolist() == pytest.approx(worst.tolist(), nan_ok=True)


@pytest.mark.spark
def test_incidents_hold_their_parts_and_nothing_unavailable_is_left_beside_them(
        batch: tuple[list[Plant], dict[str, Any]]) -> None:
    _plants, f = batch
    inc, outside = f["incidents"], f["outside"]
    for r in inc.itertuples(index=False):
        assert 0 <= r.failback_gap_s <= r.read_unavailable_s <= r.duration_s - r.unknown_s, r
        if not r.open:
            assert (r.normal_at - r.master_lost_at).total_seconds() == r.duration_s, r
    # time outside incidents never touches an incident: nothing unavailable is left right
    # before an incident's start (the demo's "0 s per incident"), no stretch overlaps one
    spans = {g: frame for g, frame in inc.groupby("group")}
    for s in outside.itertuples(index=False):
        for r in spans.get(s.group, inc.iloc[:0]).itertuples(index=False):
            end = r.master_lost_at + pd.Timedelta(seconds=r.duration_s)
            assert s.end != r.master_lost_at, (s, r)
            assert s.end <= r.master_lost_at or s.start >= end, (s, r)


@pytest.mark.spark
def test_the_rendered_report_adds_up_the_same_way(batch: tuple[list[Plant], dict[str, Any]]) -> None:
    _plants, f = batch
    inc, monthly, outside = f["incidents"], f["monthly"], f["outside"]
    meta = report.ReportMeta(inputs=("plants",), step_s=STEP, targets=T.Targets(), samples=1, rejected_lines=0,
                             start=pd.Timestamp(f["lo"] * STEP, unit="s"),
                             end=pd.Timestamp((f["hi"] + 1) * STEP, unit="s"))
    page = report.render_html(incidents=inc, daily=f["daily"], monthly=monthly, timeline=f["timeline"],
                              outside=outside, meta=meta)
    overall = monthly[monthly["group"] == T.OVERALL]
    rows = check_adds_up_in_page(page, total_s=float(overall["read_unavailable_s"].sum()))
    assert rows["All groups"]["In incidents (s)"] == pytest.approx(float(inc["read_unavailable_s"].sum()))
    assert rows["All groups"]["Outside incidents (s)"] == pytest.approx(float(outside["read_unavailable_s"].sum()))
    assert any(name.endswith("other group(s)") for name in rows)  # more groups than rows: folded, still adds up
    check_headers_are_words(page)
    assert "too short to judge a monthly budget" in page  # minutes of data
    assert "% of budget" not in page


# --- make demo's shape ---------------------------------------------------------------------

DEMO_T0 = dt.datetime(2026, 11, 26, 14, 34, 2)
# g1, one bucket per second (mode, master permission, slave permission; None = no sample):
# three kills. In the first bucket of each the master is gone and the slave does not read
# yet, but the controller's mode sample still says NORMAL; then SLAVE_CONSUME, the master
# back without READ, NORMAL. (Recorded that way by a real 3-cycle drill at a 1 s scrape
# interval, depending on the scrape phases.)
_CYCLE: list[Bucket] = [(0, None, 0), (2, None, 1), (2, 0, 1), (0, 3, 0)]
_OK: Bucket = (0, 3, 0)
DEMO_G1 = [_OK] * 6 + _CYCLE + [_OK] * 4 + _CYCLE + [_OK] * 4 + _CYCLE + [_OK] * 2
# g2: fine until it is stopped in the last second (the controller still says NORMAL):
# read-unavailable outside any incident.
DEMO_G2 = [_OK] * 27 + [(0, None, None)]


def _at(seconds: float) -> pd.Timestamp:
    return pd.Timestamp(DEMO_T0) + pd.Timedelta(seconds=seconds)


@pytest.mark.spark
def test_demo_shaped_report_adds_up_and_is_not_extrapolated(spark: Any) -> None:
    """``make demo``: 28 s of data, three kills. It read "3 s overall, 0 s in each of its
    three incidents" and "11111 % of budget"."""
    assert len(DEMO_G1) == len(DEMO_G2) == 28
    demo = Plant(DEMO_T0, {"g1": (0, DEMO_G1), "g2": (0, DEMO_G2)})
    f = run_transforms(plant_samples(spark, [demo], step_s=1.0), step_s=1.0, targets=T.Targets())
    inc, monthly, outside = f["incidents"], f["monthly"], f["outside"]
    # the bucket before the controller noticed belongs to the incident: 1 s each, not 0 s
    assert [(r.group, r.master_lost_at, r.reads_restored_at, r.normal_at, r.read_unavailable_s)
            for r in inc.itertuples(index=False)] == [("g1", _at(s), _at(s + 1), _at(s + 3), 1.0) for s in (6, 14, 22)]
    assert list(inc.columns) == T.INCIDENT_COLUMNS
    assert [(r.group, r.start, r.end, r.read_unavailable_s) for r in outside.itertuples(index=False)] == [
        ("g2", _at(27), _at(28), 1.0)]
    overall = monthly[monthly["group"] == T.OVERALL]
    assert overall["read_unavailable_s"].tolist() == [4.0]  # 3 x 1 s in incidents + 1 s outside

    meta = report.ReportMeta(inputs=("demo",), step_s=1.0, targets=T.Targets(), samples=1, rejected_lines=0,
                             start=_at(0), end=_at(28))
    page = report.render_html(incidents=inc, daily=f["daily"], monthly=monthly, timeline=f["timeline"],
                              outside=outside, meta=meta)
    rows_seen = check_adds_up_in_page(page, total_s=4.0)
    assert rows_seen["g1"] == {"In incidents (s)": 3.0, "Outside incidents (s)": 0.0, "Total read-unavailable (s)": 3.0}
    assert rows_seen["g2"] == {"In incidents (s)": 0.0, "Outside incidents (s)": 1.0, "Total read-unavailable (s)": 1.0}
    assert "= 3 s in 3 incident(s) + 1 s outside any incident (1 stretch(es)" in page
    assert "<td>g2</td><td>2026-11-26T14:34:29Z</td><td>2026-11-26T14:34:30Z</td>" in page  # listed
    assert "window 28 s: too short to judge a monthly budget" in page
    assert "11111" not in page
    assert "% of budget" not in page
    assert "missed the target" not in page
    assert page.count("<svg") == 2  # timeline and distribution; the budget is a sentence
    check_headers_are_words(page)
    summary = report.render_summary(incidents=inc, monthly=monthly, meta=meta, outside=outside)
    assert "Read-unavailable: 4 s = 3 s in 3 incident(s) + 1 s outside incidents (1 stretch(es))." in summary
    assert "availability not judged (window too short)" in summary
