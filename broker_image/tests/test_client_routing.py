"""The client's failover order, as a pure function."""

from __future__ import annotations

from understudy_broker.client import BrokerError, failover_order
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


def test_retriable_statuses() -> None:
    assert BrokerError(Status.NO_PERMISSION, "x").retriable
    assert BrokerError(Status.NOT_MASTER, "x").retriable
    assert not BrokerError(Status.UNKNOWN_TOPIC, "x").retriable
    assert not BrokerError(Status.BAD_FRAME, "x").retriable
    assert "NOT_MASTER" in str(BrokerError(Status.NOT_MASTER, "slave", address="a:1"))
