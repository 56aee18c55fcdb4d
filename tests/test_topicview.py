"""The topic view's counting (pure: no ZooKeeper, no processes): queues per topic, those whose
group has a writer or a reader, a group's permission from its live brokers' statuses, and
which controller exports the topic series."""

from __future__ import annotations

from understudy_broker.model import Permission
from understudy_broker.zklayout import BrokerStatus, TopicDoc
from understudy_operator.controller.observe import BrokerView, Observation
from understudy_operator.controller.topicview import (
    TopicCounts,
    exports_topics,
    group_permission,
    topic_counts,
)

R, W, FULL, NONE = Permission.READ, Permission.WRITE, Permission.FULL, Permission.NONE


def test_counts_queues_writers_and_readers_per_topic() -> None:
    orders = TopicDoc("orders", ("g1", "g2", "g1", "g2"))
    audit = TopicDoc("audit", ("g2",))
    where = {"orders": ((0, "g1"), (1, "g2"), (2, "g1"), (3, "g2")), "audit": ((0, "g2"),)}
    assert topic_counts([orders, audit], {"g1": FULL, "g2": FULL}) == {
        "orders": TopicCounts(queues=4, writable=4, readable=4, placement=where["orders"]),
        "audit": TopicCounts(queues=1, writable=1, readable=1, placement=where["audit"]),
    }
    # g1's master is dead and its acting slave reads: its queues keep readers, lose writers.
    assert topic_counts([orders, audit], {"g1": R, "g2": FULL}) == {
        "orders": TopicCounts(queues=4, writable=2, readable=4, placement=where["orders"]),
        "audit": TopicCounts(queues=1, writable=1, readable=1, placement=where["audit"]),
    }
    # Fencing: nobody reads g2 for a moment; a WRITE-only group writes but is not read.
    assert topic_counts([orders], {"g1": W, "g2": NONE}) == {
        "orders": TopicCounts(queues=4, writable=2, readable=0, placement=where["orders"])}


def test_removed_queues_and_unknown_groups() -> None:
    shrunk = TopicDoc("shrunk", ("g1", None, "g1", None, "g3"))
    assert topic_counts([shrunk], {"g1": FULL}) == {
        "shrunk": TopicCounts(queues=3, writable=2, readable=2,  # g3 unknown: holds nothing
                              placement=((0, "g1"), (2, "g1"), (4, "g3")))}  # removed queues: none
    assert topic_counts([TopicDoc("empty", (None, None))], {}) == {
        "empty": TopicCounts(queues=0, writable=0, readable=0)}
    assert topic_counts([], {"g1": FULL}) == {}


def status(name: str, effective: Permission) -> BrokerStatus:
    return BrokerStatus(broker=name, effective=effective, epoch_applied=1)


def obs(*views: BrokerView) -> Observation:
    return Observation(now=0.0, wall=0.0, brokers={v.name: v for v in views})


def test_group_permission_is_the_union_over_live_brokers_only() -> None:
    assert group_permission(obs(
        BrokerView("m", zk_live=True, status=status("m", W)),
        BrokerView("s", zk_live=True, status=status("s", R)))) == FULL
    # A killed master's last status still says FULL until its session ends: not counted.
    assert group_permission(obs(
        BrokerView("m", zk_live=False, status=status("m", FULL)),
        BrokerView("s", zk_live=True, status=status("s", R)))) == R
    assert group_permission(obs(BrokerView("m", zk_live=True, status=None))) == NONE
    assert group_permission(obs()) == NONE


def test_one_exporter_per_cluster_the_leader_of_the_first_elected_group() -> None:
    assert exports_topics(["g1", "g2"], "g1")
    assert exports_topics(["g1"], "g1")
    assert not exports_topics(["g2"], "g1")  # another controller leads g1: it exports
    assert exports_topics(["g2"], "g2")  # g1 has no controller left: g2's leader takes over
    assert not exports_topics([], "g1")
    assert not exports_topics(["g1"], None)
