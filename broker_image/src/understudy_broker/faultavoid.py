"""Send-side fault avoidance: which groups a producer should skip for a while (pure).

Why this module exists: a producer spreading an unordered topic over groups should not
keep sending to a group whose master is dead, hung or slow (DESIGN "Topics across
groups"; RocketMQ's ``MQFaultStrategy``). After each send to a group the producer reports
the latency it saw, or a failure; the table isolates the group for a time that grows with
the latency, from the configurable steps below (RocketMQ's defaults: 50 ms .. 15 s of
latency -> 0 .. 10 minutes). A failure counts as the top step.

Unlike RocketMQ, isolation is not only waited out: when the route shows the group's
writer again at a newer epoch or with a fresh WRITE (routes are pushed on change), the
producer calls :meth:`FaultTable.route_changed` and the group is tried again at once — a
restarted master takes writes back in milliseconds instead of after ten minutes. A send
that began before that change describes the old writer: its outcome (a hung master's
late answer, a failure) is not held against the new one. Without that rule, the answers
a master sends as it wakes from SIGSTOP, arriving just after the route showed it back,
isolated its group for minutes, and the next fault in another group left the producer
nowhere to send but the faulty group (found by ``bench/cluster.py``: 500 ms write stalls).
A *refusal* is not a failure: a broker that answered "not now" (NOT_ENOUGH_REPLICAS while
its slave rejoins, a full disk, BUSY) is alive and quick, and the condition is usually
short. It isolates the group for ``refusal_ms`` (1 s), not the top step. Counted as a
failure, the refusals a master returns in the first milliseconds after it takes WRITE back
(its slave not yet in sync again) isolated its group for ten minutes; no route change
followed to lift it, so at the next hang of the other group the producer again had
nowhere to send but the hung group, and writes stalled until the hedge (500 ms stalls in
``bench/cluster.py``, one hang cycle in four). And a route change is only a return when
the claim is current: a master that re-registers after a restart or a hang is shown
without permission until it publishes the group's newest epoch
(:func:`understudy_broker.protocol.current_claims`); before that, its old FULL lifted the
isolation, the sends to it failed, and the group was isolated for ten minutes again.

Clock values are seconds from an injected monotonic clock, so every rule is tested
without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

#: (latency at or above, isolation) in milliseconds; RocketMQ's latencyMax/notAvailableDuration.
DEFAULT_STEPS: Final[tuple[tuple[float, float], ...]] = (
    (50, 0), (100, 0), (550, 30_000), (1_000, 60_000), (2_000, 120_000), (3_000, 180_000),
    (15_000, 600_000),
)


#: How long a refusal from a broker that answered isolates its group (module docstring).
REFUSAL_ISOLATION_MS: Final = 1_000.0


def parse_steps(text: str) -> tuple[tuple[float, float], ...]:
    """``"550:30000,1000:60000"`` -> steps; raises ValueError with the expected form."""
    steps: list[tuple[float, float]] = []
    for part in text.split(","):
        lat, sep, iso = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            steps.append((float(lat), float(iso)))
        except ValueError:
            raise ValueError(
                f"bad fault-avoidance step {part!r}: expected LATENCY_MS:ISOLATION_MS, ..."
            ) from None
    if any(a < 0 or b < 0 for a, b in steps):
        raise ValueError("fault-avoidance steps must not be negative")
    return tuple(sorted(steps))


def isolation_ms(latency_ms: float, steps: Sequence[tuple[float, float]]) -> float:
    """The isolation for one observed latency: the step of the highest threshold reached."""
    out = 0.0
    for threshold, iso in steps:
        if latency_ms >= threshold:
            out = iso
    return out


@dataclass(slots=True)
class _Entry:
    latency_ms: float
    until: float  # monotonic seconds
    failures: int = 0


@dataclass(slots=True)
class FaultTable:
    """Per group: last observed latency and isolation deadline."""

    steps: Sequence[tuple[float, float]] = DEFAULT_STEPS
    enabled: bool = True
    refusal_ms: float = REFUSAL_ISOLATION_MS
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _changed: dict[str, float] = field(default_factory=dict)  # group -> last route change
    #: Goes up whenever an entry changes: a choice made from this table (the producer's
    #: queues to pick from) holds while it stays and :meth:`next_change` has not passed.
    version: int = 0

    def observe(self, group: str, latency_ms: float, now: float, *, failed: bool = False,
                refused: bool = False, started: float | None = None) -> None:
        """A send to ``group`` that began at ``started`` finished after ``latency_ms``, or
        failed (no answer, a lost connection, a broker timeout), or was refused by a broker
        that answered (``refused``: isolated for ``refusal_ms`` only). Ignored when the
        group's route changed after the send began."""
        if not self.enabled:
            return
        if started is not None and started < self._changed.get(group, float("-inf")):
            return
        top = self.steps[-1][0] if self.steps else 0.0
        lat = max(latency_ms, top) if failed and not refused else latency_ms
        iso = isolation_ms(lat, self.steps)
        if refused:
            iso = max(iso, self.refusal_ms)
        prev = self._entries.get(group)
        failures = (prev.failures + 1 if prev else 1) if failed or refused else 0
        self._entries[group] = _Entry(lat, now + iso / 1000, failures)
        self.version += 1

    def route_changed(self, group: str, now: float) -> None:
        """The group's writer changed (a new epoch, WRITE back): try it again now, and
        disregard the outcome of every send to it that began before ``now``."""
        self._entries.pop(group, None)
        self._changed[group] = now
        self.version += 1

    def available(self, group: str, now: float) -> bool:
        e = self._entries.get(group)
        return e is None or now >= e.until

    def next_change(self, now: float) -> float:
        """When the next isolation running at ``now`` ends (``inf``: none runs): until
        then, and while :attr:`version` stays, :meth:`available` answers as it does now."""
        return min((e.until for e in self._entries.values() if e.until > now),
                   default=float("inf"))

    def isolated(self, now: float) -> dict[str, float]:
        """Groups isolated at ``now`` -> seconds left."""
        return {g: e.until - now for g, e in self._entries.items() if now < e.until}

    def least_bad(self, groups: Iterable[str], now: float) -> str | None:
        """When every group is isolated: the one whose isolation ends first (then the
        lowest latency)."""
        def key(g: str) -> tuple[float, float, str]:
            e = self._entries.get(g)
            return (0.0, 0.0, g) if e is None else (max(0.0, e.until - now), e.latency_ms, g)

        return min(groups, key=key, default=None)
