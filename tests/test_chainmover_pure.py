"""What the chain mover reads from one group (pure): writable only with two copies, the
backlog only from the broker holding READ."""

from __future__ import annotations

from understudy_broker.chains import GroupFacts
from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.zklayout import BrokerSpec, BrokerStatus, GroupConfig, OrderedFacts
from understudy_operator.controller.chainmover import group_facts
from understudy_operator.controller.observe import BrokerView, Observation

CONFIG = GroupConfig(group="g1", brokers=(
    BrokerSpec("m", 0, "127.0.0.1", 1, 2, 3, Permission.FULL),
    BrokerSpec("s", 1, "127.0.0.1", 4, 5, 6, Permission.READ),
)).validate()
NORMAL = GroupState(Mode.NORMAL, 3)
FACTS = {"t": OrderedFacts(9, 4, 2)}


def obs(master: BrokerStatus | None, slave: BrokerStatus | None = None, *,
        master_live: bool = True) -> Observation:
    return Observation(now=0.0, wall=0.0, brokers={
        "m": BrokerView("m", zk_live=master_live, status=master),
        "s": BrokerView("s", zk_live=True, status=slave)})


def test_a_healthy_master_with_a_linked_slave_is_writable_and_reports_the_backlog() -> None:
    m = BrokerStatus("m", Permission.FULL, 3, slave_links=("s",), ordered=FACTS)
    assert group_facts("t", CONFIG, NORMAL, obs(m)) == GroupFacts(True, 9, 4, 2)


def test_one_copy_or_a_group_out_of_normal_is_not_writable() -> None:
    alone = BrokerStatus("m", Permission.FULL, 3, slave_links=(), ordered=FACTS)
    assert not group_facts("t", CONFIG, NORMAL, obs(alone)).writable
    m = BrokerStatus("m", Permission.FULL, 3, slave_links=("s",), ordered=FACTS)
    assert not group_facts("t", CONFIG, GroupState(Mode.FENCING, 4), obs(m)).writable
    assert not group_facts("t", CONFIG, NORMAL, obs(m, master_live=False)).writable


def test_the_acting_slave_reports_the_backlog_while_the_master_is_dead() -> None:
    acting = BrokerStatus("s", Permission.READ, 5, ordered={"t": OrderedFacts(9, 9, 6)})
    f = group_facts("t", CONFIG, GroupState(Mode.SLAVE_CONSUME, 5, acting="s"),
                    obs(None, acting, master_live=False))
    assert f == GroupFacts(False, 9, 9, 6)


def test_no_reader_means_an_unknown_backlog_that_is_never_drained() -> None:
    silent = BrokerStatus("s", Permission.NONE, 5, ordered={"t": OrderedFacts(9, 9, 6)})
    f = group_facts("t", CONFIG, GroupState(Mode.FENCING, 5), obs(None, silent,
                                                                   master_live=False))
    assert not f.writable
    assert not f.no_backlog
    assert group_facts("t", None, None, None) == f


def test_a_subscribed_consumer_group_that_never_committed_holds_the_group() -> None:
    m = BrokerStatus("m", Permission.FULL, 3, slave_links=("s",),
                     ordered={"t": OrderedFacts(9, 9, 2, groups=("replay",))})
    assert group_facts("t", CONFIG, NORMAL, obs(m)).no_backlog  # replay read it all
    held = group_facts("t", CONFIG, NORMAL, obs(m), subscribed={"replay", "late"})
    assert held.consumed == 0  # "late" reads the topic and has committed nothing on it
    assert group_facts("t", CONFIG, NORMAL, obs(m), subscribed={"replay"}).no_backlog
