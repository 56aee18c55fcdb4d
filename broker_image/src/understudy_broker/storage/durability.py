"""Making bytes durable: one atomic file replace, one directory fsync, one group commit.

Why this module exists: a broker acknowledges a produce, a consumer commit or a back-sync
only once it is on disk, and it keeps small state files (topics, consumer offsets, the
per-queue index header) that must never be found half-written after a crash. Each of those
needs the same two mechanisms, and each copy of them is a chance to get one detail wrong
(a short write ignored, a missing directory fsync), so there is exactly one of each:

* :func:`durable_replace` writes a whole file next to the target, fsyncs it, renames it
  over the target and fsyncs the directory: a crash leaves the old or the new file
  (:func:`set_aside` is its counterpart for a file found unreadable: kept, renamed);
* :class:`GroupCommit` turns "make this durable" requests into as few flushes as possible:
  a flush that *starts* after a change covers it, so every request waiting while one
  flush runs is served by the next one (the commit log's fdatasync on a master, the
  slave's fsync before it acknowledges replicated bytes, the consumer-offsets file).

Errors are plain ``OSError``: storage does not know the wire protocol; the server maps a
failed flush to the status a client sees.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path


def write_all(fd: int, data: bytes | bytearray | memoryview, offset: int | None = None) -> None:
    """Write every byte of ``data`` to ``fd`` (at ``offset`` when given), whatever the
    kernel's short writes."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        if offset is not None:
            offset += n


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a file created, renamed or removed in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_replace(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably: write ``<name>.tmp``, fsync it,
    rename it over ``path``, fsync the directory. Raises ``OSError`` (the old file is then
    intact; a leftover ``.tmp`` is harmless and overwritten next time)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def set_aside(path: Path, *, companions: Sequence[str] = ()) -> Path:
    """Rename an unreadable file to ``<name>.corrupt-<unix time>`` (``.<n>`` appended when
    that exists: an earlier one is never overwritten), with its companion files
    (``<name><suffix>``: SQLite's ``-wal``, ``-shm``), and fsync the directory. The file is
    kept for an operator; the caller rebuilds what it held. Returns the new path."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    n = 0
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}.{n}")
    for suffix in ("", *companions):
        src = Path(f"{path}{suffix}")
        if src.exists():
            src.rename(Path(f"{aside}{suffix}"))
    fsync_dir(path.parent)
    return aside


class GroupCommit:
    """Coalesce flushes: one flush makes durable every change made before it began.

    ``mark()`` returns a number that grows with every change (the log's end offset, an
    offsets store's change counter); ``flush()`` makes durable everything changed before
    it was called. :meth:`durable` returns once a flush covering the given mark (default:
    the current one) has completed. At most one flush runs at a time; callers that arrive
    while it runs wait for it and, if it started before their change, for the next one,
    which one of them starts. Waiting callers may be cancelled without cancelling the
    flush. A failed flush raises its ``OSError`` in every caller waiting for it.
    """

    def __init__(
        self,
        flush: Callable[[], Awaitable[None]],
        *,
        mark: Callable[[], int],
        flushed: int = 0,
    ) -> None:
        self._flush = flush
        self._mark = mark
        self._flushed = flushed
        self._running: asyncio.Task[None] | None = None
        self.flushes = 0

    @property
    def flushed(self) -> int:
        """The mark covered by the last completed flush."""
        return self._flushed

    @property
    def pending(self) -> bool:
        """Something changed since the last completed flush began."""
        return self._mark() > self._flushed

    async def durable(self, upto: int | None = None) -> int:
        """Wait until a flush covering ``upto`` (default: every change so far) completed;
        returns the mark now covered. Raises the flush's ``OSError``."""
        target = self._mark() if upto is None else upto
        while self._flushed < target:
            task = self._running
            if task is None:
                task = self._running = asyncio.get_running_loop().create_task(self._flush_once())
                task.add_done_callback(_retrieve)
            await asyncio.shield(task)
        return self._flushed

    async def _flush_once(self) -> None:
        try:
            covered = self._mark()
            await self._flush()
            self._flushed = max(self._flushed, covered)
            self.flushes += 1
        finally:
            self._running = None


def _retrieve(task: asyncio.Task[None]) -> None:
    """A flush whose waiters were all cancelled must not log 'exception never retrieved';
    the waiters that remain receive the exception through ``shield``."""
    if not task.cancelled():
        task.exception()
