"""Fixtures for the SLA job tests: one SparkSession for the whole session (a session
costs 8-12 s and ~0.7 GB on these machines), and small synthetic exports."""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

# The tests write expected times as naive datetimes meaning UTC, and PySpark turns naive
# datetimes into instants (and collected ones back) in the process's local zone: on a
# machine not in UTC every such time would be off by the zone's offset. The job itself
# does not depend on it (a report under TZ=America/New_York over the US clock change
# equals the UTC one); the tests' way of writing times does.
os.environ["TZ"] = "UTC"
time.tzset()

pyspark = pytest.importorskip("pyspark", reason="the SLA tests need PySpark (pip install 'understudy[spark]')")

from understudy_spark import job  # noqa: E402
from understudy_spark.synth import SynthSpec, synthesize  # noqa: E402

# A small plant with everything the synthesiser injects: 3 groups, 1 day at 60 s
# (a coarser step keeps the test quick; the checks are "within one step" either way).
SPEC = SynthSpec(groups=3, days=1, step_s=60, incidents=5, seed=7, gaps=3, controller_restarts=2,
                 duplicate_fraction=0.002, violation_fraction=0.5)


# Test inputs are kilobytes: two partitions everywhere, AQE coalescing what is left, no
# Hive catalog, no UI, no compression of tiny shuffles, a small driver.
TEST_CONF = {
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "2",
    "spark.sql.catalogImplementation": "in-memory",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.shuffle.compress": "false",
    "spark.rdd.compress": "false",
    "spark.driver.memory": "1g",
    "spark.sql.files.openCostInBytes": "1048576",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    job.quiet_pandas_warning()
    session = job.build_session(shuffle_partitions=2, app="understudy-sla-tests", conf=TEST_CONF)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("synth")
    synthesize(SPEC, out=out)
    truth = json.loads((out / "ground_truth.json").read_text(encoding="utf-8"))
    return out, truth
