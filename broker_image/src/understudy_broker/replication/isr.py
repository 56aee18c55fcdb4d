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
* when fewer members than ``min_insync`` remain, ``auto_degrade`` acknowledges anyway (the
  record already says who lacks the write); otherwise the write is refused.

Without a store (static mode) the older quorum rule applies: ``min_insync`` connected
slaves (:func:`quorum_offset`) within a lag in bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from understudy_broker.replication.wire import ReplicationError


class NotEnoughReplicasError(ReplicationError):
    """Fewer slaves are in sync than ``min_insync`` and auto-degrade is off."""


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
    min_insync: int,
    auto_degrade: bool,
) -> bool | None:
    """For a write ending at ``end``: ``None`` keep waiting, ``True`` acknowledge, ``False``
    refuse (fewer than ``min_insync`` members without auto-degrade). ``acked(m)`` is the
    offset member ``m`` acknowledged (-1 when not connected)."""
    need = required(recorded, joining, leaving)
    if any(acked(m) < end for m in need):
        return None
    if frozenset(leaving) & recorded:
        return None  # the record still names a slave we would go on without
    if len(need) >= min_insync:
        return True
    return auto_degrade


def lagging(members: Iterable[str], *, acked: Callable[[str], int], end: int) -> frozenset[str]:
    """The members that have not acknowledged ``end``: they leave when the lag bound passes."""
    return frozenset(m for m in members if acked(m) < end)


def joins(*, name: str, connected: bool, acked: int, log_end: int, recorded: frozenset[str],
          joining: Iterable[str], leaving: Iterable[str]) -> bool:
    """A connected slave that has every byte of the log joins, unless it already counts."""
    if not connected or name in frozenset(joining) or acked < log_end:
        return False
    return not (name in recorded and name not in frozenset(leaving))
