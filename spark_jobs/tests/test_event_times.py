"""Event times (docs/sla.md "Event times"): with the event-time gauges in the export the job
places every transition to the millisecond; without them it keeps the bucket definitions
and says so.

One ``job.run`` over (groups renamed so that each input stays apart):

- ``q-``/``d-``/``o-``: a synthetic plant with event times, in each export form: every
  injected incident with its times and durations equal to the injected ones to the
  millisecond (``ground_truth.json`` ``exact``), nothing unresolved, nothing invented;
- ``p-``: the same plant without them (the conftest's): its incidents at step resolution,
  on bucket boundaries, as before;
- ``sub``: a failover of 62 ms of unreadability that falls between two scrapes 60 s apart
  (the issue's case): found with event times, exactly; ``sub-plain`` (the same samples
  without event times) shows no incident at all, and ``sub-undated`` (no controller dated
  the master's death) falls back to scrape resolution rather than guess.

Then the transforms on inline events: which event logs count as complete, and a hung
master whose READ ended when its lease lapsed.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import pathlib
from typing import Any

import pytest

from understudy_broker import metric_names as names
from understudy_spark import job, transforms
from understudy_spark.synth import SynthSpec, synthesize

pytestmark = pytest.mark.spark

STEP = 60.0
# The conftest's plant, with event times.
SPEC = SynthSpec(groups=3, days=1, step_s=60, incidents=5, seed=7, gaps=3, controller_restarts=2,
                 duplicate_fraction=0.002, violation_fraction=0.5, event_times=True, topics=3)
FORM_PREFIX = {"query_range": "q-", "dump": "d-", "openmetrics": "o-"}
TIMES = ("master_lost_at", "reads_restored_at", "master_back_at", "normal_at")
SECONDS = ("read_unavailable_s", "failback_gap_s", "one_reader_violation_s", "one_reader_unresolved_s",
           "backsync_s", "duration_s")

# The sub-scrape failover: scrapes at BASE + 7 s + k * 60 s; the master is killed at KILL,
# between the scrapes at 547 s and 607 s, and the group is NORMAL again 2.221 s later.
BASE = 1_793_577_600.0  # 2026-11-02T00:00:00Z
KILL = BASE + 560.0
SCRAPES = 20
SUB = {  # seconds after KILL
    "exited": 0.002, "fencing": 0.010, "slave_consume": 0.040, "slave_read": 0.045, "restarted": 1.500,
    "recovering": 2.200, "slave_lost": 2.201, "master_read": 2.220, "normal": 2.221,
}
SUB_EXACT = {
    "master_lost_at": KILL + SUB["exited"], "reads_restored_at": KILL + SUB["slave_read"],
    "master_back_at": KILL + SUB["restarted"], "normal_at": KILL + SUB["normal"],
    "read_unavailable_s": 0.062, "failback_gap_s": 0.019, "one_reader_violation_s": 0.0,
    "one_reader_unresolved_s": 0.0, "backsync_s": 0.021, "duration_s": 2.219,
}


def _rename(path: pathlib.Path, out: pathlib.Path, prefix: str) -> None:
    text = path.read_text(encoding="utf-8")
    for label, first in (("group", "g"), ("topic", "t")):
        text = text.replace(f'{label}="{first}', f'{label}="{prefix}{first}')
        text = text.replace(f'"{label}":"{first}', f'"{label}":"{prefix}{first}')
    out.write_text(text, encoding="utf-8")


def _line(metric: str, labels: dict[str, str], value: float, t: float) -> str:
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{label_text}}} {value:.3f} {t:.3f}"


def sub_scrape_exposition(group: str, *, events: bool, exits: bool = True) -> list[str]:
    """An OpenMetrics export of one group scraped every 60 s in which a whole failover
    happens between two scrapes: every sample says NORMAL, master FULL, slave NONE."""
    ctl = {"group": group, "instance": "ctl:9300"}
    master = {"group": group, "broker": f"{group}-0", "role": "master", "instance": "m:9400"}
    slave = {"group": group, "broker": f"{group}-1", "role": "slave", "instance": "s:9400"}
    long_ago = BASE - 86_400.0
    lines = []
    for k in range(SCRAPES):
        t = BASE + 7.0 + k * STEP
        after = t > KILL + 3.0
        lines += [
            _line(names.GROUP_MODE, ctl, 0, t),
            _line(names.FAILOVER_TOTAL, ctl, 1 if after else 0, t),
            _line(names.BROKER_PERMISSION, master, 3, t),
            _line(names.BROKER_PERMISSION, slave, 0, t),
        ]
        if not events:
            continue
        modes = {"NORMAL": KILL + SUB["normal"] if after else long_ago}
        if after:
            modes |= {"FENCING": KILL + SUB["fencing"], "SLAVE_CONSUME": KILL + SUB["slave_consume"],
                      "RECOVERING": KILL + SUB["recovering"]}
        lines += [_line(names.GROUP_MODE_ENTERED, {**ctl, "mode": m}, v, t) for m, v in modes.items()]
        if after and exits:
            lines.append(_line(names.BROKER_EXITED, {**ctl, "broker": f"{group}-0", "role": "master"},
                               KILL + SUB["exited"], t))
        lines += [
            _line(names.BROKER_STARTED, master, KILL + SUB["restarted"] if after else long_ago + 1, t),
            _line(names.BROKER_READ_GAINED, master, KILL + SUB["master_read"] if after else long_ago + 2, t),
            _line(names.BROKER_STARTED, slave, long_ago + 1, t),
        ]
        if after:
            lines += [_line(names.BROKER_READ_GAINED, slave, KILL + SUB["slave_read"], t),
                      _line(names.BROKER_READ_LOST, slave, KILL + SUB["slave_lost"], t)]
    return lines


def _rows(path: pathlib.Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _at(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def report(module_spark: Any, synthetic: tuple[pathlib.Path, dict[str, Any]],
           tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any], dict[str, Any]]:
    """One job run over every input; returns the output folder and both ground truths."""
    base = tmp_path_factory.mktemp("event_times")
    plant = base / "plant"
    synthesize(SPEC, out=plant)
    truth = json.loads((plant / "ground_truth.json").read_text(encoding="utf-8"))
    plain_dir, plain_truth = synthetic
    inputs = base / "inputs"
    inputs.mkdir()
    for form, prefix in FORM_PREFIX.items():
        for i, path in enumerate(sorted((plant / form).iterdir())):
            _rename(path, inputs / f"{form}-{i}{path.suffix}", prefix)
    for i, path in enumerate(sorted((plain_dir / "query_range").iterdir())):
        _rename(path, inputs / f"plain-{i}.json", "p-")
    sub = ["# TYPE understudy_group_mode gauge",
           *sub_scrape_exposition("sub", events=True),
           *sub_scrape_exposition("sub-plain", events=False),
           *sub_scrape_exposition("sub-undated", events=True, exits=False), "# EOF"]
    (inputs / "sub.om").write_text("\n".join(sub) + "\n", encoding="utf-8")
    out = base / "sla"
    ran = job.run(module_spark, job.JobConfig(inputs=(str(inputs),), out=str(out), step_s=STEP), progress=lambda _m: None)
    assert ran.rejected_lines == 0
    return out, truth, plain_truth


def _by_group(rows: list[dict[str, str]], prefix: str) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        if r["group"].startswith(prefix) and r["group"][len(prefix):].startswith("g"):
            found.setdefault(r["group"][len(prefix):], []).append(r)
    return found


def test_the_incidents_file_keeps_its_columns(report: tuple[pathlib.Path, dict[str, Any], dict[str, Any]]) -> None:
    out, _truth, _plain = report
    with (out / "incidents.csv").open(newline="") as fh:
        assert next(csv.reader(fh)) == transforms.INCIDENT_COLUMNS


@pytest.mark.parametrize("form", list(FORM_PREFIX))
def test_with_event_times_every_incident_is_exact_to_the_millisecond(
    report: tuple[pathlib.Path, dict[str, Any], dict[str, Any]], form: str
) -> None:
    out, truth, _plain = report
    found = _by_group(_rows(out / "incidents.csv"), FORM_PREFIX[form])
    expected = truth["incidents"]
    assert any(i["exact"]["one_reader_violation_s"] for i in expected), "the plant must hold two readers"
    assert sum(len(v) for v in found.values()) == len(expected), (found, expected)  # none invented
    for want in expected:
        exact = want["exact"]
        got = [r for r in found.get(want["group"], []) if abs(_at(r["master_lost_at"]) - _at(exact["master_lost_at"])) < 0.0005]
        assert len(got) == 1, (want, found.get(want["group"]))
        row = got[0]
        assert row["open"] == "False"
        for key in TIMES:  # to the millisecond
            assert abs(_at(row[key]) - _at(exact[key])) < 0.0005, (key, row, exact)
        for key in SECONDS:
            assert abs(float(row[key]) - exact[key]) < 1e-6, (key, row, exact)
        assert float(row["unknown_s"]) == 0
    # the days add up to the incidents (the plant has no unreadable time outside them)
    daily = [r for r in _rows(out / "daily.csv") if r["group"].startswith(FORM_PREFIX[form])]
    total = sum(float(r["read_unavailable_s"]) for r in daily)
    assert abs(total - sum(i["exact"]["read_unavailable_s"] for i in expected)) < 1e-6
    assert sum(float(r["one_reader_unresolved_s"]) for r in daily) == 0


def test_without_event_times_durations_stay_at_step_resolution(
    report: tuple[pathlib.Path, dict[str, Any], dict[str, Any]]
) -> None:
    out, _truth, plain = report
    found = _by_group(_rows(out / "incidents.csv"), "p-")
    expected = plain["incidents"]
    assert sum(len(v) for v in found.values()) == len(expected)
    for want in expected:
        rows = found[want["group"]]
        row = min(rows, key=lambda r: abs(_at(r["master_lost_at"]) - _at(want["master_lost_at"])))
        for key in TIMES:  # bucket starts, within one step of the injected bucket
            assert _at(row[key]) % STEP == 0, (key, row)
            assert abs(_at(row[key]) - _at(want[key])) <= STEP, (key, row, want)
        for key in ("read_unavailable_s", "failback_gap_s", "backsync_s"):
            assert float(row[key]) % STEP == 0, (key, row)
            assert abs(float(row[key]) - want[key]) <= STEP, (key, row, want)


def test_a_failover_between_two_scrapes_is_found_only_with_event_times(
    report: tuple[pathlib.Path, dict[str, Any], dict[str, Any]]
) -> None:
    out, _truth, _plain = report
    rows = _rows(out / "incidents.csv")
    sub = [r for r in rows if r["group"] == "sub"]
    assert len(sub) == 1, sub
    for key in TIMES:
        assert abs(_at(sub[0][key]) - SUB_EXACT[key]) < 0.0005, (key, sub[0][key])
    for key in SECONDS:
        assert abs(float(sub[0][key]) - SUB_EXACT[key]) < 1e-6, (key, sub[0][key])
    # every sample of the same group said NORMAL, master FULL: the samples alone see nothing
    assert not [r for r in rows if r["group"] in ("sub-plain", "sub-undated")]
    daily = {r["group"]: r for r in _rows(out / "daily.csv")}
    assert abs(float(daily["sub"]["read_unavailable_s"]) - 0.062) < 1e-6
    assert float(daily["sub-plain"]["read_unavailable_s"]) == 0


def test_the_report_says_which_groups_are_exact_and_why_the_others_are_not(
    report: tuple[pathlib.Path, dict[str, Any], dict[str, Any]]
) -> None:
    out, _truth, _plain = report
    summary = (out / "summary.md").read_text(encoding="utf-8")
    html = (out / "report.html").read_text(encoding="utf-8")
    lines = [line for line in summary.splitlines() if "durations" in line]
    exact = next(line for line in lines if line.endswith(": durations exact (event times)."))
    for group in ("sub", "q-g0000", "d-g0001", "o-g0002"):
        assert group in exact.split(":")[0].split(", "), (group, exact)
    assert "p-g0000, p-g0001, p-g0002, sub-plain: durations at scrape resolution (60 s): no event-time series." in lines
    assert ("sub-undated: durations at scrape resolution (60 s): sub-undated-0 restarted while holding READ, "
            "and no controller dated its exit.") in lines
    assert "durations exact (event times)" in html
    assert "no event-time series" in html


def test_the_timeline_shows_each_transition_at_its_instant(
    report: tuple[pathlib.Path, dict[str, Any], dict[str, Any]]
) -> None:
    out, _truth, _plain = report
    timeline = _rows(out / "timeline.csv")
    # the sub-scrape failover: 43 ms nobody reads, the acting slave reads, the 19 ms gap
    # before the master reads again; at scrape resolution it was not there at all
    sub = [(r["state"], _at(r["start"]), float(r["seconds"])) for r in timeline
           if r["group"] == "sub" and r["state"] != transforms.STATE_NORMAL]
    want = [(transforms.STATE_UNREADABLE, KILL + SUB["exited"], 0.043),
            (transforms.STATE_SLAVE_READ, KILL + SUB["slave_read"], 2.156),
            (transforms.STATE_UNREADABLE, KILL + SUB["slave_lost"], 0.019)]
    assert [s for s, _t, _d in sub] == [s for s, _t, _d in want], sub
    for (_s, t, d), (_w, wt, wd) in zip(sub, want, strict=True):
        assert abs(t - wt) < 0.0005
        assert d == pytest.approx(wd, abs=1e-6)
    assert {r["state"] for r in timeline if r["group"] == "sub-plain"} == {transforms.STATE_NORMAL}
    # every exact group's timeline adds up to its daily table, to the millisecond; the
    # groups without event times keep whole steps
    days: dict[str, list[dict[str, str]]] = {}
    for r in _rows(out / "daily.csv"):  # the window holds two days (the sub-scrape case's)
        days.setdefault(r["group"], []).append(r)
    for group, rows in days.items():
        runs = [r for r in timeline if r["group"] == group]
        unreadable = sum(float(r["seconds"]) for r in runs if r["state"] == transforms.STATE_UNREADABLE)
        two = sum(float(r["seconds"]) for r in runs if r["state"] == transforms.STATE_TWO_READERS)
        if group[:2] in ("q-", "d-", "o-"):
            assert unreadable == pytest.approx(sum(float(d["read_unavailable_s"]) for d in rows), abs=1e-6), group
            assert two == pytest.approx(sum(float(d["one_reader_violation_s"]) for d in rows), abs=1e-6), group
        elif group.startswith("p-"):
            assert unreadable % STEP == 0, group


@pytest.mark.parametrize("form", list(FORM_PREFIX))
def test_topics_with_event_times(report: tuple[pathlib.Path, dict[str, Any], dict[str, Any]], form: str) -> None:
    """The plant's topics: writes at scrape resolution as the ground truth counts them;
    reads from the event times: the topic on one group is unreadable exactly when its group
    is, to the millisecond; the totals add up."""
    out, truth, _plain = report
    prefix = FORM_PREFIX[form]
    rows = {r["topic"][len(prefix):]: r for r in _rows(out / "topics_daily.csv") if r["topic"].startswith(prefix)}
    want = {t["topic"]: t for t in truth["topics"]}
    assert set(rows) == set(want) == {"t00", "t01", "t02"}
    for topic, w in want.items():
        row = rows[topic]
        for key in ("known_s", "unknown_s", "write_available_s"):
            assert float(row[key]) == w[key], (topic, key)
        known = float(row["known_s"])
        assert float(row["write_available_s"]) + float(row["write_unavailable_s"]) == pytest.approx(known)
        assert sum(float(row[k]) for k in ("read_full_s", "read_partial_s", "read_none_s")) == pytest.approx(known)
    assert float(rows["t01"]["write_unavailable_s"]) > 0  # a topic on one group: its failovers stop writes
    day = truth["topics"][0]["day"]
    group = next(r for r in _rows(out / "daily.csv") if r["group"] == f"{prefix}g0001" and r["day"] == day)
    assert float(rows["t01"]["read_none_s"]) == pytest.approx(float(group["read_unavailable_s"]), abs=1e-6)
    assert float(rows["t01"]["read_none_s"]) % STEP != 0  # milliseconds, not whole steps
    assert float(rows["t01"]["read_partial_s"]) == 0


# ----------------------------------------------------------- the transforms on inline events

MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z, in ms


def _observed(spark: Any, rows: list[tuple[str, str, str, str, str, float]]) -> Any:
    return transforms.event_log(spark.createDataFrame(rows, transforms.OBSERVED_EVENTS_SCHEMA))


def _broker(group: str, ordinal: int, metric: str, t_ms: int) -> tuple[str, str, str, str, str, float]:
    return (group, f"{group}-{ordinal}", "master" if ordinal == 0 else "slave", "", metric, t_ms / 1000)


def _mode(group: str, mode: str, t_ms: int) -> tuple[str, str, str, str, str, float]:
    return (group, "", "", mode, names.GROUP_MODE_ENTERED, t_ms / 1000)


def test_an_event_at_an_impossible_time_is_no_event(spark: Any) -> None:
    # A gauge holding 1e300 s (or infinity) names no instant: it is left out of the log,
    # where an overflowing cast used to fail the job.
    rows = [_mode("g", "NORMAL", MS), ("g", "g-0", "master", "", names.BROKER_STARTED, 1e300),
            ("g", "g-0", "master", "", names.BROKER_STARTED, float("inf"))]
    assert [(r.group, r.kind, r.t_ms) for r in _observed(spark, rows).collect()] == [("g", transforms.KIND_MODE, MS)]


def test_a_group_is_exact_only_when_its_event_log_is_complete(spark: Any) -> None:
    day = 86_400_000
    rows = []
    for g, first in (("old", MS - day), ("new", MS + 2_000), ("upgraded", MS + 3_600_000)):
        rows += [_mode(g, "NORMAL", first), _broker(g, 0, names.BROKER_STARTED, first),
                 _broker(g, 0, names.BROKER_READ_GAINED, first + 100), _broker(g, 1, names.BROKER_STARTED, first)]
    rows += [_broker("nomode", 0, names.BROKER_STARTED, MS - day), _broker("nomode", 1, names.BROKER_STARTED, MS - day),
             _mode("halfway", "NORMAL", MS - day), _broker("halfway", 0, names.BROKER_STARTED, MS - day)]
    bounds = spark.createDataFrame(
        [(g, MS, MS + day, 2) for g in ("old", "new", "upgraded", "nomode", "halfway", "plain")],
        "group string, lo_ms long, hi_ms long, n_brokers int")
    got = {r.group: (r.exact, r.reason) for r in
           transforms.event_resolution(_observed(spark, rows), bounds, step_s=STEP).collect()}
    scrape = "durations at scrape resolution (60 s): "
    assert got == {
        "old": (True, "durations exact (event times)"),
        "new": (True, "durations exact (event times)"),  # a new group: its log begins with it
        "upgraded": (False, scrape + "event times begin only at 2026-11-02T01:00:00.000Z"),
        "nomode": (False, scrape + "no mode event times from the controller"),
        "halfway": (False, scrape + "a broker exports no event-time series"),
        "plain": (False, scrape + "no event-time series"),
    }


def test_a_hung_master_loses_read_when_its_lease_lapsed(spark: Any) -> None:
    """SIGSTOP: the master's lease lapses at LAPSE while it is frozen; on waking it logs the
    loss dated at the lapse. The controller fences later (its session expired), the slave
    reads, and the master is back at NORMAL. No exit: the process never died."""
    g = "hung"
    lapse, fencing, slave_read, recovering, slave_lost, master_read, normal = (
        MS + 100_000, MS + 101_200, MS + 101_900, MS + 110_000, MS + 110_001, MS + 110_030, MS + 110_031)
    rows = [
        _mode(g, "NORMAL", MS - 1_000), _broker(g, 0, names.BROKER_STARTED, MS - 2_000),
        _broker(g, 1, names.BROKER_STARTED, MS - 2_000), _broker(g, 0, names.BROKER_READ_GAINED, MS - 1_900),
        _broker(g, 0, names.BROKER_READ_LOST, lapse), _mode(g, "FENCING", fencing),
        _mode(g, "SLAVE_CONSUME", slave_read - 3), _broker(g, 1, names.BROKER_READ_GAINED, slave_read),
        _mode(g, "RECOVERING", recovering), _broker(g, 1, names.BROKER_READ_LOST, slave_lost),
        _broker(g, 0, names.BROKER_READ_GAINED, master_read), _mode(g, "NORMAL", normal),
    ]
    events = _observed(spark, rows)
    step_ms = int(STEP * 1000)
    buckets = range(MS // step_ms, MS // step_ms + 10)
    states = spark.createDataFrame([(g, b, True) for b in buckets], "group string, bucket long, known boolean")
    bounds = spark.createDataFrame([(g, buckets[0] * step_ms, (buckets[-1] + 1) * step_ms, 2)],
                                   "group string, lo_ms long, hi_ms long, n_brokers int")
    resolution = transforms.event_resolution(events, bounds, step_s=STEP)
    exact = transforms.exact_tables(events, resolution, bounds, states, step_s=STEP)
    (inc,) = exact.incidents.collect()
    utc = dt.UTC

    def at(t_ms: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(t_ms / 1000, tz=utc).replace(tzinfo=None)

    assert (inc.master_lost_at, inc.reads_restored_at, inc.master_back_at, inc.normal_at) == (
        at(lapse), at(slave_read), at(master_read), at(normal))
    assert inc.read_unavailable_s == pytest.approx((slave_read - lapse + master_read - slave_lost) / 1000, abs=1e-9)
    assert inc.failback_gap_s == pytest.approx(0.029, abs=1e-9)
    assert inc.backsync_s == pytest.approx(0.031, abs=1e-9)
    assert (inc.one_reader_violation_s, inc.one_reader_unresolved_s, inc.unknown_s, inc.open) == (0, 0, 0, False)
    assert exact.outside.count() == 0
