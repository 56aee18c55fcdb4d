"""Read leases: how long a broker may trust its cached view of the group state.

Why this module exists: a broker's view of ``/groups/<group>/state`` can be stale — a
master frozen by SIGSTOP, a long GC or a VM pause wakes up believing it is still NORMAL.
Effective READ is therefore also bounded by a *lease* (DESIGN "Read leases"): READ is
usable only while a fresh confirmation (the ZooKeeper session answering with ``state``
still at the epoch the broker applied) is younger than the lease duration, and that
duration is shorter than the earliest moment the controller could hand READ to someone
else. This module is the pure part: the one function that derives the duration, the
clock it is measured on, and the lease value itself. The renewal round trip lives in
:mod:`understudy_broker.ha.coordinator`.

Why the bound holds: a lease is granted from the moment the confirming request was
*sent*. The controller hands READ away from a broker it cannot hear only after that
broker's ZooKeeper session expired, and the server expires a session no earlier than
``session timeout`` after the last request it received from it — which is no earlier than
the send time of the last confirmation. So ``duration < session timeout`` means the lease
has lapsed before anyone else can read, even if the process was frozen in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

#: Fraction of the handover bound kept as margin (clock-rate error, scheduling delays).
DEFAULT_MARGIN = 0.25
#: Absolute slack subtracted after the margin, in seconds.
DEFAULT_SLACK_S = 0.05


def lease_clock() -> float:
    """Seconds on a clock that keeps running while the process is stopped or the machine
    sleeps: ``CLOCK_BOOTTIME`` on Linux, else ``CLOCK_MONOTONIC``."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        return time.clock_gettime(boottime)
    return time.monotonic()


def lease_duration_s(
    *,
    session_timeout_s: float,
    link_timeout_s: float,
    detection_checks: int,
    check_interval_s: float,
    margin: float = DEFAULT_MARGIN,
    slack_s: float = DEFAULT_SLACK_S,
) -> float:
    """The read-lease duration, derived in one place (DESIGN "Read leases").

    The earliest moment the controller could hand READ to another broker is bounded by
    ``handover = min(session_timeout, link_timeout + detection_checks x check_interval)``:
    the ZooKeeper session timeout (a silent broker is proven unable to read only when its
    session expires) and the slave's master-link timeout plus the controller's detection
    window (the soonest a slave can be eligible). The lease is
    ``handover x (1 - margin) - slack``. Raises ``ValueError`` if that is not positive:
    a configuration where no lease is short enough must not silently grant READ.
    """
    if session_timeout_s <= 0 or link_timeout_s < 0 or check_interval_s < 0 or detection_checks < 0:
        raise ValueError("lease inputs must be non-negative (session timeout positive)")
    if not 0 <= margin < 1:
        raise ValueError(f"lease margin must be in [0, 1), got {margin}")
    handover = min(session_timeout_s, link_timeout_s + detection_checks * check_interval_s)
    duration = handover * (1 - margin) - slack_s
    if duration <= 0:
        raise ValueError(
            f"no safe read lease: handover bound {handover:.3f}s leaves {duration:.3f}s after "
            "the margin; raise the session or link timeout"
        )
    return duration


def renewal_interval_s(duration_s: float) -> float:
    """Renew three times per lease, so one lost round trip does not lapse it."""
    return duration_s / 3.0


@dataclass(frozen=True, slots=True)
class Lease:
    """A read lease. ``granted_at`` is the :func:`lease_clock` reading when the confirming
    request was sent (``None``: never granted or revoked); ``epoch`` the epoch confirmed."""

    duration: float
    granted_at: float | None = None
    epoch: int = 0

    def valid(self, now: float) -> bool:
        """True while ``granted_at <= now < granted_at + duration``. A clock reading before
        the grant (which a monotonic clock never gives) counts as invalid."""
        return self.granted_at is not None and 0 <= now - self.granted_at < self.duration

    def remaining(self, now: float) -> float:
        if self.granted_at is None:
            return 0.0
        return max(0.0, self.granted_at + self.duration - now)

    def renewed(self, *, sent_at: float, confirmed_epoch: int, applied_epoch: int) -> Lease:
        """The lease after a confirmation sent at ``sent_at`` saw ``confirmed_epoch`` in
        ZooKeeper. It renews only if that is the epoch the broker applied (a mismatch means
        the broker's view is stale or ahead of a lagging server: no renewal). A late reply
        to an older request never moves the grant backwards."""
        if confirmed_epoch != applied_epoch:
            return self
        start = sent_at if self.granted_at is None else max(self.granted_at, sent_at)
        return replace(self, granted_at=start, epoch=confirmed_epoch)

    def with_duration(self, duration: float) -> Lease:
        """A new duration (the config changed). Shortening applies at once."""
        return replace(self, duration=duration)

    def revoked(self) -> Lease:
        return replace(self, granted_at=None)


# --------------------------------------------------------------------------- slave route

#: Probes remembered for matching echoes (older ones are forgotten: their echoes count
#: for nothing, which is always safe).
MAX_OUTSTANDING_PROBES = 64


def slave_route_duration_s(link_timeout_s: float, *, margin: float = DEFAULT_MARGIN,
                           slack_s: float = DEFAULT_SLACK_S) -> float:
    """How long a master may read on its slaves' echoes of one probe (docs/failover.md,
    "A master cut off from ZooKeeper only").

    Safety does not rest on this value: a slave that echoes holds back its own READ for
    as long as the probe said, and the master needs an echo from every slave that could
    be chosen. It is kept below the link timeout because a restarted slave, which cannot
    know what it echoed before, holds back for a link timeout from its start, and a slave
    refuses to hold back for longer than that. Raises ``ValueError`` when nothing is left.
    """
    duration = link_timeout_s * (1 - margin) - slack_s
    if duration <= 0:
        raise ValueError(f"no slave-route lease under a {link_timeout_s:g}s link timeout")
    return duration


@dataclass(frozen=True, slots=True)
class Echo:
    """A slave's answer to a probe: the master's clock when the probe went out, and the
    group epoch the slave had applied when it answered."""

    sent_at: float
    epoch: int


class SlaveRoute:
    """The master's side of the slave route: probes sent and the latest echo per slave.

    Pure (no I/O, the clock is passed in). A probe is a sequence number; the master keeps
    when it sent each of the last :data:`MAX_OUTSTANDING_PROBES`. An echo of an unknown
    probe (forgotten, or invented) counts for nothing. :meth:`grant` is the moment the
    lease starts: the oldest of the latest echoes of every slave in ``required``, all at
    ``epoch``; without an echo from each of them there is no grant.
    """

    def __init__(self, duration: float) -> None:
        self.duration = duration
        self._next = 1
        self._sent: dict[int, float] = {}
        self._echoes: dict[str, Echo] = {}

    def probe(self, now: float) -> int:
        seq = self._next
        self._next += 1
        self._sent[seq] = now
        if len(self._sent) > MAX_OUTSTANDING_PROBES:
            del self._sent[min(self._sent)]
        return seq

    def echo(self, slave: str, seq: int, epoch: int) -> bool:
        """Record ``slave``'s echo of probe ``seq``; returns whether it was a probe we sent."""
        sent_at = self._sent.get(seq)
        if sent_at is None:
            return False
        old = self._echoes.get(slave)
        if old is None or sent_at >= old.sent_at:
            self._echoes[slave] = Echo(sent_at, epoch)
        return True

    def grant(self, *, epoch: int, required: frozenset[str]) -> float | None:
        if not required:
            return None
        sent = []
        for name in required:
            e = self._echoes.get(name)
            if e is None or e.epoch != epoch:
                return None
            sent.append(e.sent_at)
        return min(sent)

    def remaining(self, now: float, *, epoch: int, required: frozenset[str]) -> float:
        """Seconds the lease has left (0: none)."""
        granted = self.grant(epoch=epoch, required=required)
        if granted is None or now < granted:
            return 0.0
        return max(0.0, granted + self.duration - now)

    def valid(self, now: float, *, epoch: int, required: frozenset[str]) -> bool:
        return self.remaining(now, epoch=epoch, required=required) > 0

    def clear(self) -> None:
        """Forget every echo (the master stopped being a master at that epoch)."""
        self._echoes.clear()


class Holdback:
    """The slave's side: after echoing a probe that says the master may read for ``hold``
    seconds from when it sent the probe, this slave uses no READ until ``hold`` (plus
    ``slack_s``, for the two clocks' rates) after it answered, which is no earlier than
    the probe was sent. Pure; the clock is passed in. Starts held back for the longest
    hold it would agree to: a restarted slave cannot know what it echoed before."""

    def __init__(self, now: float, *, max_hold_s: float, slack_s: float = DEFAULT_SLACK_S) -> None:
        self.max_hold_s = max_hold_s
        self.slack_s = slack_s
        self.until = now + max_hold_s + slack_s

    def answer(self, now: float, hold_s: float) -> bool:
        """Agree to hold back for ``hold_s`` from ``now``; False (no echo) when the master
        asks for longer than this slave is willing to hold back."""
        if not 0 <= hold_s <= self.max_hold_s:
            return False
        self.until = max(self.until, now + hold_s + self.slack_s)
        return True

    def held(self, now: float) -> bool:
        return now < self.until

    def remaining(self, now: float) -> float:
        return max(0.0, self.until - now)
