"""The job against synthetic exports with a known ground truth, in each export form:
every injected incident found with times and durations within one step, no invented
incident, scrape gaps reported as unknown, failovers counted through counter resets."""

from __future__ import annotations

import datetime as dt
import pathlib
from typing import Any

import pytest
from pyspark.sql import Observation
from pyspark.sql import functions as F

from understudy_spark import readers, transforms
from understudy_spark.synth import FORMATS

pytestmark = pytest.mark.spark

TIMES = ("master_lost_at", "reads_restored_at", "master_back_at", "normal_at")
DURATIONS = ("read_unavailable_s", "failback_gap_s", "one_reader_violation_s", "one_reader_unresolved_s",
             "backsync_s")


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=None)


def _tag_groups_with_form(parsed: Any) -> Any:
    """Rename group ``g`` to ``<form>/g`` so all three forms run through one pipeline
    (one set of Spark stages) and are still checked one by one."""
    form = F.regexp_extract("source_file", r"/(query_range|dump|openmetrics)/", 1)
    return parsed.withColumn("group", F.concat(form, F.lit("/"), F.col("group")))


@pytest.fixture(scope="module")
def results(module_spark: Any, synthetic: tuple[pathlib.Path, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any], int]:
    """The job's own path (keyed readers, rejects counted by an Observation in the same
    pass), run once over all three forms."""
    out, truth = synthetic
    step = float(truth["spec"]["step_s"])
    files = readers.list_inputs(module_spark, [str(out / form) for form in FORMATS])
    assert sorted({f.form.value for f in files}) == sorted(FORMATS)
    observation = Observation("rejects")
    parsed = _tag_groups_with_form(readers.read_parsed(module_spark, files, keyed=True)).observe(
        observation, F.count(F.when(~F.col("ok"), 1)).alias("rejected")
    )
    states = transforms.group_states(
        transforms.clean_keyed(readers.keyed_samples_of(parsed), step_s=step)
    ).cache()
    try:
        bounds = states.agg(F.min("bucket"), F.max("bucket")).first()  # the one pass over the input
        assert bounds is not None
        rejected = int(observation.get["rejected"])
        incidents = transforms.incidents(states, step_s=step).cache()
        found = [r.asDict() for r in incidents.collect()]
        daily = transforms.daily_sla(
            states, incidents, step_s=step,
            first_bucket=int(bounds[0]), last_bucket=int(bounds[1]), targets=transforms.Targets(),
        ).collect()
        incidents.unpersist()
    finally:
        states.unpersist()
    return found, daily, rejected


@pytest.mark.parametrize("form", FORMATS)
def test_every_injected_incident_is_found_and_nothing_else(
    synthetic: tuple[pathlib.Path, dict[str, Any]], results: tuple[list[dict[str, Any]], list[Any], int], form: str
) -> None:
    _out, truth = synthetic
    step = float(truth["spec"]["step_s"])
    all_found, all_daily, rejected = results
    assert rejected == 0
    prefix = f"{form}/"
    found = [dict(r, group=r["group"][len(prefix):]) for r in all_found if r["group"].startswith(prefix)]
    daily = [r for r in all_daily if r.group.startswith(prefix)]
    daily = [type("Day", (), {"group": r.group[len(prefix):], "unknown_s": r.unknown_s,
                              "failovers_counted": r.failovers_counted,
                              "read_unavailable_s": r.read_unavailable_s}) for r in daily]

    expected = truth["incidents"]
    assert len(expected) >= 3, "the plant must contain incidents"
    assert any(i["one_reader_violation_s"] for i in expected), "the plant must contain a proven violation"
    assert any(i["one_reader_unresolved_s"] for i in expected), "the plant must contain a lone two-reader bucket"
    assert len(found) == len(expected), (found, expected)  # none missed, none invented
    tolerance = dt.timedelta(seconds=step)
    for want in expected:
        matches = [
            got for got in found
            if got["group"] == want["group"] and abs(got["master_lost_at"] - _utc(want["master_lost_at"])) <= tolerance
        ]
        assert len(matches) == 1, want
        got = matches[0]
        assert not got["open"]
        for key in TIMES:
            assert abs(got[key] - _utc(want[key])) <= tolerance, (key, got, want)
        for key in DURATIONS:
            assert abs(got[key] - want[key]) <= step, (key, got, want)
        # proven vs unresolved two-reader time is a per-bucket verdict: exact
        assert (got["one_reader_violation_s"], got["one_reader_unresolved_s"]) == (
            want["one_reader_violation_s"], want["one_reader_unresolved_s"]), (got, want)
        assert got["unknown_s"] == 0

    unknown_by_group: dict[str, float] = {}
    failovers_by_group: dict[str, float] = {}
    for row in daily:
        unknown_by_group[row.group] = unknown_by_group.get(row.group, 0.0) + row.unknown_s
        failovers_by_group[row.group] = failovers_by_group.get(row.group, 0.0) + row.failovers_counted
    gaps: dict[str, float] = {}
    for gap in truth["gaps"]:
        gaps[gap["group"]] = gaps.get(gap["group"], 0.0) + gap["unknown_s"]
    assert truth["gaps"], "the plant must contain scrape gaps"
    for group in truth["groups"]:
        # a gap is unknown time (within a step per gap), never unavailability
        n_gaps = sum(1 for g in truth["gaps"] if g["group"] == group)
        assert abs(unknown_by_group.get(group, 0.0) - gaps.get(group, 0.0)) <= step * max(1, n_gaps), group
        assert failovers_by_group.get(group, 0.0) == truth["failovers_per_group"].get(group, 0), group
    total_unavailable = sum(r.read_unavailable_s for r in daily)
    assert abs(total_unavailable - sum(i["read_unavailable_s"] for i in expected)) <= step * len(expected)
