"""Turning a broker's permission-change log into history events (pure): incarnations,
SIGKILLed brokers that cannot write their last line, and what the checker then sees."""

from __future__ import annotations

from understudy_broker.model import Permission
from understudy_harness.checker import check
from understudy_harness.history import Fault, Perm
from understudy_harness.permevents import LoggedChange, perm_events_from_log

FULL, READ, NONE = Permission.FULL, Permission.READ, Permission.NONE


def convert(changes: list[LoggedChange], faults: list[Fault], broker: str = "g1-0") -> list[Perm]:
    return perm_events_from_log(group="g1", broker=broker, role="master", changes=changes, faults=faults)


def test_a_killed_incarnation_stops_reading_at_the_kill() -> None:
    changes = [
        LoggedChange(100, FULL, pid=1),
        LoggedChange(900, NONE, pid=2),  # the restarted broker's first line
        LoggedChange(950, FULL, pid=2),
    ]
    events = convert(changes, [Fault(500, 1, "kill", "g1-0", "g1")])
    assert [(e.t, e.effective) for e in events] == [(100, FULL), (500, NONE), (900, NONE), (950, FULL)]


def test_a_line_written_between_the_kills_record_and_its_signal_still_ends_at_the_kill() -> None:
    """The kill is stamped just before the signal: a master that took FULL back in between
    (the test kills it the moment the group is NORMAL) logs after the stamp. Its READ ends
    there, not 2 s later when the next incarnation first writes (a false one-reader
    violation against the slave that took over, seen once in the two-controllers test)."""
    changes = [
        LoggedChange(100, NONE, pid=1),
        LoggedChange(510, FULL, pid=1),  # after the kill's stamp at 500, before the signal
        LoggedChange(2600, NONE, pid=2),
    ]
    events = convert(changes, [Fault(500, 1, "kill", "g1-0", "g1")])
    assert [(e.t, e.effective) for e in events] == [
        (100, NONE), (510, FULL), (510, NONE), (2600, NONE)]
    last = convert(changes[:2], [Fault(500, 1, "kill", "g1-0", "g1")])
    assert [(e.t, e.effective) for e in last] == [(100, NONE), (510, FULL), (510, NONE)]


def test_a_kill_before_an_incarnation_began_does_not_end_it() -> None:
    changes = [LoggedChange(100, NONE, pid=1), LoggedChange(900, FULL, pid=2),
               LoggedChange(3000, NONE, pid=3)]
    events = convert(changes, [Fault(500, 1, "kill", "g1-0", "g1")])
    assert [(e.t, e.effective) for e in events] == [
        (100, NONE), (900, FULL), (3000, NONE), (3000, NONE)]


def test_a_death_the_drill_did_not_cause_ends_at_the_next_incarnation() -> None:
    changes = [LoggedChange(100, FULL, pid=1), LoggedChange(900, NONE, pid=2)]
    events = convert(changes, [])
    assert [(e.t, e.effective) for e in events] == [(100, FULL), (900, NONE), (900, NONE)]


def test_a_kill_without_restart_still_ends_the_read() -> None:
    events = convert([LoggedChange(100, FULL, pid=1)], [Fault(500, 1, "kill", "g1-0", "g1")])
    assert [(e.t, e.effective) for e in events] == [(100, FULL), (500, NONE)]


def test_hang_and_other_brokers_faults_end_nothing() -> None:
    changes = [LoggedChange(100, FULL, pid=1), LoggedChange(700, NONE, pid=1)]
    faults = [Fault(300, 1, "hang", "g1-0", "g1"), Fault(400, 2, "kill", "g1-1", "g1")]
    events = convert(changes, faults)
    assert [(e.t, e.effective) for e in events] == [(100, FULL), (700, NONE)]


def test_without_the_kill_marker_the_checker_would_see_two_readers() -> None:
    master = [LoggedChange(100, FULL, pid=1), LoggedChange(2000, NONE, pid=2)]
    slave = [LoggedChange(100, NONE, pid=7), LoggedChange(600, READ, pid=7)]
    fault = Fault(500, 1, "kill", "g1-0", "g1")
    slave_events = perm_events_from_log(group="g1", broker="g1-1", role="slave", changes=slave, faults=[fault])
    clean = check([*convert(master, [fault]), *slave_events, fault])
    assert clean.one_reader_violations == 0
    assert clean.cycles[0].reads_restored_ms == (600 - 500) / 1e6
    naive = check([*convert(master, []), *slave_events, fault])
    assert naive.one_reader_violations == 1
