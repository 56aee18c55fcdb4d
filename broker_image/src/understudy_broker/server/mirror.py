"""The acting slave's copy of every consumer commit on the other slaves of the in-sync record.

Why this module exists: invariant 4 (no offset rewind) with two or more slaves. The
controller picks a new acting slave only from the in-sync record (``/groups/<g>/isr``);
when the acting slave dies in SLAVE_CONSUME, the next one must already hold every commit
the dead one acknowledged. So the acting slave acknowledges a commit only once every other
slave of the record holds it, or was first removed from the record by a versioned write
(docs/failover.md, "Two or more slaves: the acting slave mirrors its commits") — the
master's rule for its own writes, with the acting slave as the reader.

The copy travels as a BACKSYNC_OFFSETS push (the one merge: maximum per key) tagged with
the acting epoch; a slave takes it only while it applied SLAVE_CONSUME at that epoch with
the sender acting (``requests.py:_backsync``). The record is loaded once per acting epoch;
only this slave writes it meanwhile (the master is fenced), and a version conflict reloads
it. A slave removed here is re-added by the master after the failback, once it caught up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, request_once
from understudy_broker.replication.isr import IsrConflictError, IsrStore, NotEnoughReplicasError
from understudy_broker.security import ClientSecurity

log = logging.getLogger(__name__)

Snapshot = Mapping[str, Mapping[str, Mapping[int, int]]]
#: Attempts at removing a slave from the record when the version keeps moving.
MAX_RECORD_ATTEMPTS = 5


class CommitMirror:
    """``mirror(epoch, offsets)`` returns once every other slave of the in-sync record holds
    ``offsets`` (or left the record); raises :class:`NotEnoughReplicasError` otherwise."""

    def __init__(self, *, name: str, group: str, store: IsrStore | None,
                 peers: Callable[[], Mapping[str, str]], timeout_s: float,
                 security: ClientSecurity | None = None) -> None:
        self._security = security
        self._name = name
        self._group = group
        self._store = store
        self._peers = peers  # the group's other slaves: name -> client address
        self._timeout_s = timeout_s
        self._record: tuple[int, frozenset[str], int] | None = None  # (epoch, members, version)
        self._lock = asyncio.Lock()

    async def mirror(self, epoch: int, offsets: Snapshot) -> None:
        if self._store is None or not offsets:
            return
        members = await self._members(epoch)
        targets = sorted(members - {self._name})
        if not targets:
            return
        body = p.BackSyncRequest(self._group, self._name, epoch, offsets).encode()
        peers = self._peers()
        held = await asyncio.gather(*(self._send(t, peers.get(t), epoch, body) for t in targets))
        missing = frozenset(t for t, ok in zip(targets, held, strict=True) if not ok)
        if missing:
            await self._remove(epoch, missing)

    async def _send(self, target: str, address: str | None, epoch: int, body: bytes) -> bool:
        if address is None:
            log.warning("mirror: %s is in the in-sync record but not in the group config", target)
            return False
        try:
            frame = await request_once(address, p.Op.BACKSYNC_OFFSETS, body, epoch=epoch,
                                       timeout_s=self._timeout_s, security=self._security)
        except (OSError, TimeoutError, BrokerError) as exc:
            log.warning("mirror: %s did not take a commit: %r", target, exc)
            return False
        if frame.status != p.Status.OK:
            log.warning("mirror: %s refused a commit: %s %s", target,
                        p.Status(frame.status).name, p.error_message(frame))
            return False
        return True

    async def _members(self, epoch: int) -> frozenset[str]:
        async with self._lock:
            return (await self._load(epoch))[0]

    async def _load(self, epoch: int) -> tuple[frozenset[str], int]:
        record = self._record
        if record is None or record[0] != epoch:
            assert self._store is not None
            members, version = await self._store.load()
            self._record = record = (epoch, members, version)
        return record[1], record[2]

    async def _remove(self, epoch: int, missing: frozenset[str]) -> None:
        """Shrink the record before acknowledging without ``missing`` (a versioned write);
        NotEnoughReplicasError when it cannot be written (ZooKeeper unreachable)."""
        assert self._store is not None
        async with self._lock:
            for _ in range(MAX_RECORD_ATTEMPTS):
                members, version = await self._load(epoch)
                if not members & missing:
                    return
                if version < 0:
                    raise NotEnoughReplicasError(
                        "no in-sync record to take a slave out of: the commit is not "
                        "acknowledged")
                wanted = members - missing
                try:
                    new_version = await self._store.store(wanted, version=version)
                except IsrConflictError:
                    self._record = None  # reload and try again
                    continue
                except Exception as exc:
                    raise NotEnoughReplicasError(
                        f"slave(s) {', '.join(sorted(missing))} did not take the commit and "
                        f"the in-sync record could not be updated ({exc}); not acknowledged"
                    ) from exc
                log.warning("slave(s) %s did not take a mirrored commit: in-sync set %s -> %s",
                            ", ".join(sorted(missing)), sorted(members), sorted(wanted))
                self._record = (epoch, wanted, new_version)
                return
        raise NotEnoughReplicasError("the in-sync record kept changing; not acknowledged")
