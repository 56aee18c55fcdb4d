"""Consumer offsets: committed position per (consumer group, topic, queue).

Why this module exists: invariant 4 ("no rewind") is kept at the source. A commit lower
than the stored offset is ignored, and the two flows that move offsets between brokers
(master -> slave on an interval, slave -> master in back-sync) go through :meth:`merge`,
which takes the maximum per key. The only way down is :meth:`reset`, an explicit admin
action. The store persists atomically (tmp file, fsync, rename, fsync directory), so a
crash leaves either the old or the new file, never a mix; a leftover ``.tmp`` is ignored.

File format (UTF-8 JSON)::

    {"format": 1, "backsync_epoch": 7 | null,
     "offsets": {"<group>": {"<topic>": {"<queue>": <offset>, ...}, ...}, ...}}

A file that does not parse or has the wrong shape raises :class:`OffsetStoreCorruptError`
naming it; the file is left untouched. The broker's store then sets it aside
(:func:`.durability.set_aside`, kept for an operator) and rebuilds the offsets from the
commit records in the log (``storage.store.Store.open``; docs/storage-and-replication.md,
"Corruption").

Persisting costs two fsyncs (file and directory). On a slave the event loop that would
wait for them is also the one that acknowledges replicated bytes, so
:meth:`OffsetStore.persist_async` encodes the snapshot on the loop and writes it in a
worker thread. Writes are ordered by a generation number: an older snapshot never
replaces a newer one on disk, whichever thread finishes first.

Commits travel master -> slave as records of the internal topic :data:`COMMITS_TOPIC`
in the commit log (queue 0, body :func:`encode_commit_record`). That way a commit is
covered by the same synchronous replication acknowledgement as a produce: the master
answers a commit only once the in-sync slaves hold the record, and a slave that
restarts rebuilds every commit still in its log. The body is a one-key snapshot, so
applying it is :meth:`OffsetStore.merge` (maximum per key) and replays are harmless.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from understudy_broker.model import Snapshot, normalize_snapshot
from understudy_broker.storage.durability import durable_replace

FORMAT = 1
#: Internal commit-log topic carrying consumer commits to slaves. Clients cannot create,
#: produce to or read it (``RESERVED_PREFIX``).
COMMITS_TOPIC = "__understudy_commits"
RESERVED_PREFIX = "__understudy"

class OffsetStoreCorruptError(Exception):
    """The offsets file is unreadable; it was not modified."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"corrupt consumer-offset file {path}: {reason} (file left as is)")
        self.path = path
        self.reason = reason


def _parse(path: Path, raw: bytes) -> tuple[Snapshot, int | None]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OffsetStoreCorruptError(path, f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise OffsetStoreCorruptError(path, f"expected an object with format {FORMAT}")
    epoch = doc.get("backsync_epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
        raise OffsetStoreCorruptError(path, "backsync_epoch is not an integer")
    try:
        return normalize_snapshot(doc.get("offsets", {})), epoch
    except ValueError as exc:
        raise OffsetStoreCorruptError(path, str(exc)) from None


def encode_commit_record(group: str, topic: str, offsets: Mapping[int, int]) -> bytes:
    """The body of a :data:`COMMITS_TOPIC` record: ``{group: {topic: {queue: offset}}}``."""
    doc = {group: {topic: {str(q): off for q, off in offsets.items()}}}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def encode_snapshot_record(snapshot: Snapshot) -> bytes:
    """The body of a :data:`COMMITS_TOPIC` record carrying a whole snapshot (after a
    back-sync, so slaves that were not acting learn the merged offsets)."""
    return json.dumps(snapshot, separators=(",", ":")).encode("utf-8")


def decode_commit_record(body: bytes) -> Snapshot:
    """Parse a :data:`COMMITS_TOPIC` record body; ValueError when it is not one."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"commit record is not JSON: {exc}") from None
    return normalize_snapshot(doc)


class OffsetStore:
    """In-memory offsets with atomic persistence. Not thread-safe (one event loop)."""

    def __init__(self, path: Path, *, offsets: Snapshot, backsync_epoch: int | None) -> None:
        self.path = path
        self._offsets = offsets
        self.backsync_epoch = backsync_epoch
        self._dirty = False
        self._version = 0  # bumped by every change: what a GroupCommit waits for
        self._write_lock = threading.Lock()  # one writer of the file at a time
        self._generation = 0  # of the last encoded snapshot
        self._written = 0  # generation on disk

    @classmethod
    def open(cls, path: Path) -> OffsetStore:
        """Load ``path`` (an absent file is an empty store)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path, offsets={}, backsync_epoch=None)
        offsets, epoch = _parse(path, raw)
        return cls(path, offsets=offsets, backsync_epoch=epoch)

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def version(self) -> int:
        """Grows with every change of the stored offsets or back-sync epoch."""
        return self._version

    def _changed(self) -> None:
        self._dirty = True
        self._version += 1

    def get(self, group: str, topic: str, queue: int) -> int | None:
        return self._offsets.get(group, {}).get(topic, {}).get(queue)

    def commit(self, group: str, topic: str, queue: int, offset: int) -> int:
        """Store ``offset`` unless it is lower than the stored one; returns the stored value."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        queues = self._offsets.setdefault(group, {}).setdefault(topic, {})
        current = queues.get(queue)
        if current is not None and offset <= current:
            return current
        queues[queue] = offset
        self._changed()
        return offset

    def reset(self, group: str, topic: str, queue: int, offset: int) -> None:
        """Explicit admin rewind (or skip): the one way an offset may go down."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._offsets.setdefault(group, {}).setdefault(topic, {})[queue] = offset
        self._changed()

    def snapshot(self) -> Snapshot:
        return {g: {t: dict(qs) for t, qs in ts.items()} for g, ts in self._offsets.items()}

    def merge(self, snapshot: Mapping[str, Any], *, epoch: int | None = None) -> int:
        """Take the maximum per key from ``snapshot``; returns how many keys moved up.

        With ``epoch`` (back-sync from an acting slave), record it as
        :attr:`backsync_epoch` if higher; the caller then persists and reports it.
        """
        moved = 0
        for group, topics in normalize_snapshot(snapshot).items():
            for topic, queues in topics.items():
                for queue, offset in queues.items():
                    before = self.get(group, topic, queue)
                    if self.commit(group, topic, queue, offset) != before:
                        moved += 1
        if epoch is not None and (self.backsync_epoch is None or epoch > self.backsync_epoch):
            self.backsync_epoch = epoch
            self._changed()
        return moved

    def persist(self) -> None:
        """Write atomically if anything changed since the last persist (blocking)."""
        if not self._dirty:
            return
        generation, data = self._encode()
        try:
            self._write(generation, data)
        except BaseException:
            self._dirty = True
            raise

    async def persist_async(self) -> None:
        """:meth:`persist` with the file work (write, two fsyncs, rename) in a thread.

        The snapshot is taken on the calling (event-loop) thread, so commits made while
        the write runs are simply persisted by the next call.
        """
        if not self._dirty:
            return
        generation, data = self._encode()
        try:
            await asyncio.to_thread(self._write, generation, data)
        except BaseException:
            self._dirty = True
            raise

    def _encode(self) -> tuple[int, bytes]:
        """The file contents for the current state; marks the store clean."""
        doc = {
            "format": FORMAT,
            "backsync_epoch": self.backsync_epoch,
            "offsets": {
                g: {t: {str(q): o for q, o in sorted(qs.items())} for t, qs in ts.items()}
                for g, ts in self._offsets.items()
            },
        }
        data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")
        self._generation += 1
        self._dirty = False
        return self._generation, data

    def _write(self, generation: int, data: bytes) -> None:
        """Atomic replace (:func:`.durability.durable_replace`); skips stale snapshots."""
        with self._write_lock:
            if generation <= self._written:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            durable_replace(self.path, data)
            self._written = generation
