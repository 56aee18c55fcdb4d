"""The client's failover order, as a pure function."""

from __future__ import annotations

from understudy_broker.client import BrokerError, connect_order, failover_order
from understudy_broker.model import Permission
from understudy_broker.protocol import BrokerRoute, Status


def b(name: str, perm: Permission, reachable: bool = True) -> BrokerRoute:
    return BrokerRoute(name, f"h:{len(name)}", "slave", int(perm), 1, reachable)


def test_writes_prefer_full_then_write() -> None:
    brokers = [b("r", Permission.READ), b("n", Permission.NONE), b("w", Permission.WRITE),
               b("f", Permission.FULL)]
    assert [x.name for x in failover_order(brokers, Permission.WRITE)] == ["f", "w", "r", "n"]


def test_reads_go_to_a_reader_first() -> None:
    brokers = [b("w", Permission.WRITE), b("n", Permission.NONE), b("r", Permission.READ)]
    assert [x.name for x in failover_order(brokers, Permission.READ)] == ["r", "w", "n"]


def test_unreachable_brokers_come_last() -> None:
    brokers = [b("f", Permission.FULL, reachable=False), b("n", Permission.NONE)]
    assert [x.name for x in failover_order(brokers, Permission.READ)] == ["n", "f"]


def test_a_broker_that_just_failed_is_tried_last_but_a_slave_never_for_writes() -> None:
    master = BrokerRoute("m", "h:1", "master", int(Permission.FULL), 3)
    slave = BrokerRoute("s", "h:2", "slave", int(Permission.NONE), 3)
    avoided = {"h:1"}.__contains__  # the master's connection just closed on us
    assert [x.name for x in connect_order([master, slave], Permission.WRITE, avoided)] == ["m"]
    # Reads may go to the slave first: it takes READ when the controller fails over.
    assert [x.name for x in connect_order([master, slave], Permission.READ, avoided)] == [
        "s", "m"]
    assert [x.name for x in connect_order([master, slave], Permission.READ,
                                          lambda _a: False)] == ["m", "s"]


def test_what_needs_no_permission_goes_to_the_broker_holding_least() -> None:
    """The route watch must not park on the reader: a hung master would be the last to
    tell its clients that it was failed over."""
    master = BrokerRoute("m", "h:1", "master", int(Permission.FULL), 3)
    acting = BrokerRoute("a", "h:2", "slave", int(Permission.READ), 3)
    idle = BrokerRoute("s", "h:3", "slave", int(Permission.NONE), 3)
    gone = BrokerRoute("g", "h:4", "slave", int(Permission.NONE), 3, reachable=False)
    assert [x.name for x in connect_order([master, acting, gone, idle], Permission.NONE,
                                          lambda _a: False)] == ["s", "a", "m", "g"]
    assert [x.name for x in connect_order([master, acting, idle], Permission.NONE,
                                          {"h:3"}.__contains__)] == ["a", "m", "s"]


def test_retriable_statuses() -> None:
    assert BrokerError(Status.NO_PERMISSION, "x").retriable
    assert BrokerError(Status.NOT_MASTER, "x").retriable
    assert not BrokerError(Status.UNKNOWN_TOPIC, "x").retriable
    assert not BrokerError(Status.BAD_FRAME, "x").retriable
    assert "NOT_MASTER" in str(BrokerError(Status.NOT_MASTER, "slave", address="a:1"))
