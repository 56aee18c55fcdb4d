"""The test run's SparkSession survives a test cut off inside a Spark call.

pytest-timeout stops a test by raising in its main thread, wherever it is. Its exception
(pytest's ``Failed``) is a ``BaseException``, which py4j's ``except Exception`` around a
call does not catch: an Exception there closes the connection, this one leaves it open and
one answer behind, and every Spark call after it read the answer of the call before (a
drill test past the suite's 300 s once failed the 60 Spark tests after it). The ``spark``
fixture checks the gateway before each test and starts a new session when it is out of
step (conftest.SparkSessions)."""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Any

import pytest


class CutOff(BaseException):
    """Raised where pytest-timeout's signal method raises, and like its exception not an
    ``Exception`` (py4j recovers from those by itself)."""


def _slow(x: int) -> int:
    time.sleep(6)
    return x


@pytest.mark.spark
def test_a_test_cut_off_inside_a_spark_call_leaves_the_next_test_a_working_session(
        spark_sessions: Any) -> None:
    session = spark_sessions.get()
    replaced = spark_sessions.replaced

    def cut_off(_signum: int, _frame: FrameType | None) -> None:
        raise CutOff("cut off inside a py4j call")

    before = signal.signal(signal.SIGALRM, cut_off)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(CutOff):
            session.sparkContext.parallelize([1], 1).map(_slow).collect()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)

    with pytest.warns(UserWarning, match="out of step"):
        fresh = spark_sessions.get()
    assert spark_sessions.replaced == replaced + 1
    assert fresh is not session
    assert fresh.range(5).count() == 5
    assert spark_sessions.get() is fresh  # in step now: kept
