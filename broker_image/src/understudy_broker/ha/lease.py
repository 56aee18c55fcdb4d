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
