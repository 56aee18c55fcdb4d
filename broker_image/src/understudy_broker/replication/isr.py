"""The in-sync rules of synchronous replication, as pure functions.

Why this module exists: invariant 3 (no acknowledged message lost) depends on exactly when
the master may acknowledge a write and without whom. Those rules are decided here, over
plain sets and numbers, so they can be model-checked and unit-tested without sockets; the
master's :class:`~.master.ReplicationServer` only gathers the facts and applies the answers.

With an :class:`IsrStore` (ZooKeeper in production) the master keeps
``/groups/<g>/isr`` = the slaves that hold every acknowledged write:

* a write is acknowledged only once every *required* member (recorded, plus the slaves that
  caught up and are joining, minus those leaving) acknowledged it;
* a member whose link drops, or that has not acknowledged a waiting write within the lag
  bound, *leaves*: the record is rewritten (versioned) *before* anything is acknowledged
  without it, so the controller never picks an acting slave that lacks a write;
* a connected slave that has every byte of the log *joins* at once (new writes need it);
* a member more than ``max_lag_bytes`` behind the log's end leaves too (same record write
  first); it rejoins only with every byte, so a slave near the bound does not flap;
* the write needs :meth:`AckPolicy.copies_needed` copies, the master included (seed 001
  §9): ``in_sync_replicas``; with ``auto_degrade`` the in-sync count when fewer are in sync,
  but never fewer than ``min_insync + 1``. With fewer copies the write is refused at once
  (``NOT_ENOUGH_REPLICAS``: a producer moves to another group's queue).

Every in-sync member acknowledges every write, not any ``in_sync_replicas`` of them: that is
what lets the controller fail over to any recorded slave without a rewind (invariant 3).
``in_sync_replicas`` is therefore the fewest copies an acknowledged write has, and the
knobs decide only when writes are refused, never what is safe (docs/replication.md).

Without a store (static mode) the seed's quorum rule applies: the write waits for
``copies_needed - 1`` connected slaves within ``max_lag_bytes`` (:func:`quorum_offset`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from understudy_broker.replication.wire import ReplicationError


class NotEnoughReplicasError(ReplicationError):
    """Fewer copies are in sync than the write needs (:meth:`AckPolicy.copies_needed`)."""


class ReplicationTimeoutError(ReplicationError):
    """No quorum of slaves acknowledged the offset within the acknowledgement timeout."""


class IsrConflictError(ReplicationError):
    """The ISR record changed under us (another writer); reload its version."""


class IsrStore(Protocol):
    """Where the in-sync set is recorded (ZooKeeper in production)."""

    async def load(self) -> tuple[frozenset[str], int]:
        """The recorded set and its version; version -1 when there is no record (the
        returned set is then the one to create it with)."""
        ...

    async def store(self, members: frozenset[str], *, version: int) -> int:
        """Write ``members`` if the record is still at ``version`` (-1: create it);
        returns the new version. Raises :class:`IsrConflictError` on a version
        mismatch, any other exception when the store is unreachable."""
        ...


#: Default ``max_lag_bytes``: RocketMQ's ``haMaxGapNotInSync`` (seed 001 §9).
DEFAULT_MAX_LAG_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class AckPolicy:
    """How many copies a write needs before it is acknowledged (seed 001 §9).

    ``in_sync_replicas`` counts the master (2 = the master and one slave);
    ``min_insync`` counts slaves (it predates ``in_sync_replicas`` and keeps its meaning:
    no write is ever acknowledged with fewer in-sync slaves); ``auto_degrade`` lets the
    need fall from ``in_sync_replicas`` to the copies in sync, down to that floor.
    """

    in_sync_replicas: int
    min_insync: int
    auto_degrade: bool

    @classmethod
    def of(cls, *, min_insync: int, auto_degrade: bool, in_sync_replicas: int | None = None
           ) -> AckPolicy:
        """``in_sync_replicas`` defaults to ``min_insync + 1``; raises ValueError when the
        floor is above the need."""
        policy = cls(min_insync + 1 if in_sync_replicas is None else in_sync_replicas,
                     min_insync, auto_degrade)
        if policy.min_insync < 0:
            raise ValueError("min_insync must be >= 0")
        if policy.in_sync_replicas < policy.min_insync + 1:
            raise ValueError(
                f"in_sync_replicas ({policy.in_sync_replicas}, the master included) must be "
                f"at least min_insync + 1 ({policy.min_insync + 1})")
        return policy

    def copies_needed(self, in_sync: int) -> int:
        """Copies (the master included) a write needs when ``in_sync`` copies are in sync."""
        if not self.auto_degrade:
            return self.in_sync_replicas
        return max(self.min_insync + 1, min(self.in_sync_replicas, in_sync))

    def degraded(self, copies: int) -> bool:
        """A write acknowledged with ``copies`` has fewer than ``in_sync_replicas``."""
        return copies < self.in_sync_replicas


def quorum_offset(acked: list[int], min_insync: int) -> int:
    """The highest offset that at least ``min_insync`` of ``acked`` have reached (-1 if none)."""
    if min_insync <= 0:
        return 1 << 63
    if len(acked) < min_insync:
        return -1
    return sorted(acked, reverse=True)[min_insync - 1]


def required(recorded: frozenset[str], joining: Iterable[str], leaving: Iterable[str]
             ) -> frozenset[str]:
    """The members a write must wait for: recorded or joining, and not leaving."""
    return frozenset((recorded | frozenset(joining)) - frozenset(leaving))


def write_outcome(
    *,
    recorded: frozenset[str],
    joining: Iterable[str],
    leaving: Iterable[str],
    acked: Callable[[str], int],
    end: int,
    policy: AckPolicy,
) -> bool | None:
    """For a write ending at ``end``: ``None`` keep waiting, ``True`` acknowledge, ``False``
    refuse (fewer copies than ``policy`` needs). ``acked(m)`` is the offset member ``m``
    acknowledged (-1 when not connected)."""
    need = required(recorded, joining, leaving)
    copies = 1 + len(need)
    if copies < policy.copies_needed(copies):
        return False
    if any(acked(m) < end for m in need):
        return None
    if frozenset(leaving) & recorded:
        return None  # the record still names a slave we would go on without
    return True


def lagging(members: Iterable[str], *, acked: Callable[[str], int], end: int) -> frozenset[str]:
    """The members that have not acknowledged ``end``: they leave when the lag bound passes."""
    return frozenset(m for m in members if acked(m) < end)


def too_far_behind(members: Iterable[str], *, acked: Callable[[str], int], log_end: int,
                   max_lag_bytes: int) -> frozenset[str]:
    """The members more than ``max_lag_bytes`` behind the log's end: not in sync."""
    return frozenset(m for m in members if log_end - acked(m) > max_lag_bytes)


def joins(*, name: str, connected: bool, acked: int, log_end: int, recorded: frozenset[str],
          joining: Iterable[str], leaving: Iterable[str]) -> bool:
    """A connected slave that has every byte of the log joins, unless it already counts."""
    if not connected or name in frozenset(joining) or acked < log_end:
        return False
    return not (name in recorded and name not in frozenset(leaving))
