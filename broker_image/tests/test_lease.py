"""Read leases: the one derivation, the clock, and the lease value (pure)."""

from __future__ import annotations

import time

import pytest

from understudy_broker.ha.lease import (
    MAX_OUTSTANDING_PROBES,
    Holdback,
    Lease,
    SlaveRoute,
    lease_clock,
    lease_duration_s,
    renewal_interval_s,
    slave_route_duration_s,
)


def test_duration_is_below_the_session_timeout_with_margin() -> None:
    d = lease_duration_s(session_timeout_s=2.0, link_timeout_s=5.0, detection_checks=2,
                         check_interval_s=0.25)
    assert d == pytest.approx(2.0 * 0.75 - 0.05)
    assert d < 2.0


def test_duration_is_below_link_timeout_plus_detection_window() -> None:
    d = lease_duration_s(session_timeout_s=10.0, link_timeout_s=1.0, detection_checks=2,
                         check_interval_s=0.25)
    assert d == pytest.approx(1.5 * 0.75 - 0.05)
    assert renewal_interval_s(d) == pytest.approx(d / 3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"session_timeout_s": 0.0},
        {"session_timeout_s": 0.05},  # nothing left after the margin and slack
        {"margin": 1.0},
        {"detection_checks": -1},
    ],
)
def test_impossible_configurations_are_refused(kwargs: dict[str, float]) -> None:
    args = {"session_timeout_s": 2.0, "link_timeout_s": 1.0, "detection_checks": 2,
            "check_interval_s": 0.25} | kwargs
    with pytest.raises(ValueError, match="lease"):
        lease_duration_s(**args)  # type: ignore[arg-type]


def test_clock_is_boottime_when_available() -> None:
    a = lease_clock()
    b = time.clock_gettime(time.CLOCK_BOOTTIME)
    c = lease_clock()
    assert a <= b <= c


def test_lease_lifecycle() -> None:
    lease = Lease(duration=1.0)
    assert not lease.valid(0.0)
    lease = lease.renewed(sent_at=10.0, confirmed_epoch=3, applied_epoch=3)
    assert lease.valid(10.0)
    assert lease.valid(10.99)
    assert not lease.valid(11.0)
    assert not lease.valid(9.0)  # before the grant
    assert lease.remaining(10.25) == pytest.approx(0.75)


def test_mismatched_epoch_does_not_renew() -> None:
    lease = Lease(duration=1.0).renewed(sent_at=10.0, confirmed_epoch=3, applied_epoch=3)
    stale = lease.renewed(sent_at=10.8, confirmed_epoch=4, applied_epoch=3)
    assert stale == lease
    assert not stale.valid(11.5)


def test_late_reply_never_moves_the_grant_backwards() -> None:
    lease = Lease(duration=1.0).renewed(sent_at=10.0, confirmed_epoch=3, applied_epoch=3)
    assert lease.renewed(sent_at=9.0, confirmed_epoch=3, applied_epoch=3).granted_at == 10.0


def test_paused_process_finds_its_lease_lapsed() -> None:
    # Renewed, then the process is frozen for longer than the lease: on a clock that keeps
    # running through the pause it must find the lease lapsed before serving anything.
    lease = Lease(duration=1.0).renewed(sent_at=100.0, confirmed_epoch=1, applied_epoch=1)
    assert not lease.valid(100.0 + 3.0)


def test_revoke_and_shorten() -> None:
    lease = Lease(duration=5.0).renewed(sent_at=0.0, confirmed_epoch=1, applied_epoch=1)
    assert not lease.with_duration(1.0).valid(2.0)
    assert not lease.revoked().valid(0.5)


# ------------------------------------------------------------ the slave route


def test_the_slave_route_needs_an_echo_from_every_slave_the_record_may_name() -> None:
    route = SlaveRoute(0.7)
    both = frozenset({"s1", "s2"})
    first = route.probe(10.0)
    assert route.echo("s1", first, epoch=4)
    assert not route.valid(10.1, epoch=4, required=both)  # s2 has not answered
    assert route.valid(10.1, epoch=4, required=frozenset({"s1"}))
    second = route.probe(10.2)
    route.echo("s2", second, epoch=4)
    # the lease runs from the older of the two latest echoes' probes
    assert route.grant(epoch=4, required=both) == 10.0
    assert route.valid(10.69, epoch=4, required=both)
    assert not route.valid(10.7, epoch=4, required=both)
    assert not route.valid(10.1, epoch=5, required=both)  # echoes at another epoch count for nothing
    assert not route.valid(10.1, epoch=4, required=frozenset())  # no record, no route


def test_an_echo_of_a_probe_never_sent_or_forgotten_counts_for_nothing() -> None:
    route = SlaveRoute(0.7)
    assert not route.echo("s1", 99, epoch=1)
    old = route.probe(0.0)
    for i in range(MAX_OUTSTANDING_PROBES):
        route.probe(0.001 * (i + 1))
    assert not route.echo("s1", old, epoch=1)
    assert route.grant(epoch=1, required=frozenset({"s1"})) is None


def test_a_late_echo_of_an_older_probe_never_moves_the_grant_backwards() -> None:
    route = SlaveRoute(0.7)
    a, b = route.probe(1.0), route.probe(2.0)
    route.echo("s1", b, epoch=1)
    route.echo("s1", a, epoch=1)
    assert route.grant(epoch=1, required=frozenset({"s1"})) == 2.0


def test_a_slave_that_echoes_holds_back_past_the_lease_it_granted() -> None:
    hold = Holdback(0.0, max_hold_s=1.0, slack_s=0.05)
    assert hold.held(1.0)  # a fresh process holds back for its longest hold
    assert not hold.held(1.06)
    assert hold.answer(5.0, 0.7)
    assert hold.held(5.74)
    assert not hold.held(5.76)
    assert not hold.answer(6.0, 1.5)  # longer than it would hold back: no echo
    assert not hold.held(6.0)


def test_the_slave_route_lease_stays_below_the_link_timeout() -> None:
    assert slave_route_duration_s(1.0) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="no slave-route lease"):
        slave_route_duration_s(0.05)
