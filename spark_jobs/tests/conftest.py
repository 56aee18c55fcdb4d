"""Fixtures for the SLA job tests: one SparkSession for the whole run (a session costs
8-12 s and ~0.7 GB on these machines), replaced only when a test left it broken; and small
synthetic exports."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import random
import time
import warnings
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


def gateway_in_step(session: Any) -> bool:
    """Whether the session's JVM answers a round trip with its own answer. A test cut off
    by its timeout inside a py4j call (pytest-timeout raises in the middle of it) leaves
    that thread's gateway connection one answer behind: every later call reads the answer
    of the call before it and fails ("org does not exist in the JVM", a py4j KeyError)."""
    probe = random.randrange(1, 1 << 30)
    try:
        return bool(session.sparkContext._jvm.java.lang.Integer.valueOf(str(probe)) == probe)
    except Exception:  # any failure of the round trip means out of step
        return False


def discard_session(session: Any) -> None:
    """Stop a session whose gateway is out of step and forget it, its JVM killed by PID,
    so that the next ``build_session`` starts a new gateway and JVM."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    with contextlib.suppress(Exception):
        session.stop()
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


class SparkSessions:
    """The run's one SparkSession, replaced when a test left its gateway out of step, so
    that one test cut off by its timeout is one failure, not every Spark test after it
    (a drill test that ran past the suite's 300 s once took 60 with it)."""

    def __init__(self) -> None:
        self._session: Any = None
        self.replaced = 0

    def get(self) -> Any:
        if self._session is not None and not gateway_in_step(self._session):
            discard_session(self._session)
            self._session = None
            self.replaced += 1
            warnings.warn("the SparkSession's gateway was out of step (a test before this one was "
                          "cut off inside a Spark call): started a new session", stacklevel=2)
        if self._session is None:
            job.quiet_pandas_warning()
            self._session = job.build_session(shuffle_partitions=2, app="understudy-sla-tests",
                                              conf=TEST_CONF)
        return self._session

    def close(self) -> None:
        if self._session is None:
            return
        if gateway_in_step(self._session):
            self._session.stop()
        else:
            discard_session(self._session)
        self._session = None


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    sessions = SparkSessions()
    try:
        yield sessions
    finally:
        sessions.close()


@pytest.fixture
def spark(spark_sessions: SparkSessions) -> Any:
    """The run's SparkSession, checked in step before each test."""
    return spark_sessions.get()


@pytest.fixture(scope="module")
def module_spark(spark_sessions: SparkSessions) -> Any:
    """The same session for module-scoped fixtures (checked when the module starts)."""
    return spark_sessions.get()


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("synth")
    synthesize(SPEC, out=out)
    truth = json.loads((out / "ground_truth.json").read_text(encoding="utf-8"))
    return out, truth
