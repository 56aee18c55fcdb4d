"""The topic series on a real local cluster (ZooKeeper, groups g1 and g2, the controller): the
controller's /metrics counts a topic's queues, writable and readable queues; a master's kill
takes its group's queues out of the writable count (its acting slave keeps them readable);
the restarted master brings them back; an info series says which group holds each queue; a
deleted topic's series go."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from understudy_broker import metric_names as names
from understudy_broker.cli.client import topic
from understudy_broker.model import Permission
from understudy_harness import testing
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import ClusterPlan

pytestmark = pytest.mark.slow

TOPIC_NAMES = (names.TOPIC_QUEUES, names.TOPIC_WRITABLE_QUEUES, names.TOPIC_READABLE_QUEUES)


def topic_series(plan: ClusterPlan, name: str) -> tuple[float, ...] | None:
    """(queues, writable, readable) of topic ``name`` on the controller's /metrics, or None
    when the controller exports no such series."""
    text = lc.http_get(plan.controller_http_port or 0, "/metrics") or ""
    found = {s.name: s.value for family in text_string_to_metric_families(text)
             for s in family.samples if s.labels.get("topic") == name}
    if not found:
        return None
    return tuple(found.get(n, -1.0) for n in TOPIC_NAMES)


def placement(plan: ClusterPlan, name: str) -> dict[int, str]:
    """queue -> group of topic ``name``, from the controller's ``understudy_topic_queue_info``."""
    text = lc.http_get(plan.controller_http_port or 0, "/metrics") or ""
    return {int(s.labels["queue"]): s.labels["group"] for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == names.TOPIC_QUEUE_INFO and s.labels.get("topic") == name and s.value == 1}


def test_topic_series_follow_a_master_kill_and_a_delete(
        two_groups: tuple[Path, ClusterPlan]) -> None:
    directory, plan = two_groups
    b = plan.address("g2-0")
    created = CliRunner().invoke(topic, ["create", "-b", b, "-t", "viewed", "--groups", "g1,g2",
                                         "--queues-per-group", "2"])
    assert created.exit_code == 0, created.output
    testing.wait_until(lambda: topic_series(plan, "viewed"), "4 queues, all writable and readable",
                       10, ok=lambda v: v == (4, 4, 4))
    # where each queue lives, for the per-topic SLA: two queues on each group
    placed = placement(plan, "viewed")
    assert sorted(placed) == [0, 1, 2, 3], placed
    assert sorted(placed.values()) == ["g1", "g1", "g2", "g2"], placed

    lc.kill(directory, "g1-0")
    try:
        # g1's queues lose their writer; the acting slave keeps them readable.
        testing.wait_until(lambda: topic_series(plan, "viewed"), "g1's queues not writable",
                           20, ok=lambda v: v is not None and v[:2] == (4, 2))
        testing.wait_until(lambda: topic_series(plan, "viewed"), "the acting slave reads",
                           20, ok=lambda v: v == (4, 2, 4))
    finally:
        lc.start(directory, "g1-0")
        lc.wait_master_holds(plan, "g1", Permission.READ | Permission.WRITE,
                             deadline=time.monotonic() + 30)
    testing.wait_until(lambda: topic_series(plan, "viewed"), "g1 writable again", 10,
                       ok=lambda v: v == (4, 4, 4))

    deleted = CliRunner().invoke(topic, ["delete", "-b", b, "-t", "viewed"])
    assert deleted.exit_code == 0, deleted.output
    testing.wait_until(lambda: topic_series(plan, "viewed"), "the deleted topic's series gone",
                       10, ok=lambda v: v is None)
