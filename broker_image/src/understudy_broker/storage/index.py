"""Per-queue index ("consume queue"): logical queue offset -> position in the commit log.

Why this module exists: the commit log interleaves every queue of every topic in one
byte stream, so a consumer asking for "queue 3 of topic t from offset 1200" needs a map
from that logical offset to a physical position. Like RocketMQ's ConsumeQueue, that map
is a file of fixed-size entries, one per record, so entry ``i`` is found by arithmetic.
Indexes are *derived* data: the commit log is the truth and :meth:`CommitLog.open`
verifies, repairs or rebuilds them. That is why index writes are not fsynced per batch.

File layout (``index/<topic>/<queue>``), big-endian::

    header  INDEX_HEADER   magic b"UQIX", version, base offset (first logical offset kept)
    entries INDEX_ENTRY *  one per message, in queue-offset order; the messages of one
                           batch share its entry (its position and size), so entry ``i``
                           is still found by arithmetic and a batch's span by bisection

A trailing partial entry (torn write) is dropped on open. Retention rewrites the file
atomically (tmp + rename) with a higher base offset.

Written behind the log: an append goes to memory at once (lookups see it) and to the file
later, in one write per index: when :data:`WRITE_BEHIND_ENTRIES` are waiting, before any
operation that reads or rewrites the file, and at :meth:`QueueIndex.write_pending`, which
the log calls for every index holding waiting entries before it takes a recovery mark
(the broker a step at a time: ``CommitLog.write_pending_indexes``; so each file holds
every entry up to a recovery point before that point is recorded) and at close. A process that
dies loses at most the entries after the last mark, which recovery finds again: it scans
the log from that point and extends each index with what the scan found
(``RecoveryReport.indexes_extended``). Writing per append cost the broker a system call
per queue touched by each request, and, with more queues written than :class:`OpenFiles`
keeps open, an ``open`` and a ``close`` as well: with 100 topics of 8 queues that was
half of a slave's CPU.

Open files: a broker writes to as many queues as its topics have, so indexes do not each
hold a descriptor for the broker's life (10k written queues took 10k descriptors, past a
default ``ulimit -n``). They share an :class:`OpenFiles`: at most its ``limit`` are open,
the least recently used is closed first and reopened when next touched. Closing loses
nothing: an index is fsynced (reopened if need be) at :meth:`QueueIndex.fsync`, and
fsync covers every write to the file whichever descriptor made it.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from collections import OrderedDict
from pathlib import Path

from understudy_broker.storage.durability import durable_replace, write_all

INDEX_MAGIC = b"UQIX"
INDEX_VERSION = 1

INDEX_HEADER = struct.Struct(
    ">"
    "4s"  # magic b"UQIX"
    "H"  # format version (1)
    "Q"  # base offset: logical queue offset of the first entry in this file
)
INDEX_ENTRY = struct.Struct(
    ">"
    "Q"  # physical offset of the item (batch or record) holding the message in the log
    "I"  # the item's size in bytes (header included)
    "I"  # unused, written as 0 (held the key's crc32 before batches; nothing read it)
)
INDEX_HEADER_SIZE = INDEX_HEADER.size
INDEX_ENTRY_SIZE = INDEX_ENTRY.size


#: Index files a broker keeps open at once by default (``understudy broker
#: --index-open-files``): half of the descriptors kept from client connections
#: (``server/limits.py``).
DEFAULT_INDEX_OPEN_FILES = 512

#: Entries an index holds in memory only before it writes them (write-behind, above):
#: 128 entries are 2 KiB, so 10k queues hold at most 20 MiB that way between recovery
#: marks.
WRITE_BEHIND_ENTRIES = 128

#: Entries read from a file at once when a batch's span is sought among entries kept on
#: file only (:meth:`QueueIndex.item`).
_SPAN_BLOCK = 1024


class IndexFileError(Exception):
    """An index file is unreadable (bad magic/version); the caller rebuilds it from the log."""


class OpenFiles:
    """The index files held open: at most ``limit``, least recently used closed first.
    Event-loop thread only, as every index operation is."""

    def __init__(self, limit: int = DEFAULT_INDEX_OPEN_FILES) -> None:
        if limit < 1:
            raise ValueError(f"at least one index file must be open, not {limit}")
        self.limit = limit
        self._open: OrderedDict[QueueIndex, int] = OrderedDict()
        #: Times a file was opened: with more queues written than ``limit``, the price.
        self.opened = 0

    def __len__(self) -> int:
        return len(self._open)

    def fd(self, index: QueueIndex) -> int:
        """The descriptor of ``index``'s file, opened (closing the least recently used
        first, so never more than ``limit`` are open, not even for a moment) when it is
        not open."""
        fd = self._open.get(index)
        if fd is not None:
            self._open.move_to_end(index)
            return fd
        if len(self._open) >= self.limit:
            _, oldest = self._open.popitem(last=False)
            os.close(oldest)
        fd = os.open(index.path, os.O_RDWR)
        self.opened += 1
        self._open[index] = fd
        return fd

    def close(self, index: QueueIndex) -> None:
        """Close ``index``'s file if it is open (it is reopened when touched again)."""
        fd = self._open.pop(index, None)
        if fd is not None:
            os.close(fd)


class QueueIndex:
    """The index of one (topic, queue). Entries are mirrored in memory for lookups, except
    a prefix the owner released (:meth:`release_before`): those are read from the file
    when asked for, and the rare whole-index operations (repair, truncation, retention)
    load them back first."""

    def __init__(self, path: Path, *, base: int, phys: array[int], sizes: array[int],
                 files: OpenFiles | None = None) -> None:
        self.path = path
        self._base = base
        self._phys = phys
        self._sizes = sizes
        self._released = 0  # entries [base, base + released) are on file only
        self._files = files if files is not None else OpenFiles(1)
        self._dirty = False  # written since the last fsync
        self._pending = bytearray()  # the last entries, packed, not written to the file yet

    @property
    def _fd(self) -> int:
        return self._files.fd(self)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, *, base: int = 0, files: OpenFiles | None = None,
               durable: bool = True) -> QueueIndex:
        """Create (or overwrite atomically) an empty index starting at ``base``. ``files``:
        the open files it shares (its own, of one file, when not given).

        ``durable=False`` (a queue's first record) writes the new file without an fsync:
        an index is derived data, and a crash that loses the file makes recovery rebuild
        it from the log. With fsyncs, a produce reaching hundreds of new queues at once
        (a PRODUCE_MULTI to just created topics) held the event loop for seconds, long
        enough for the slave's replication link to time out."""
        path.parent.mkdir(parents=True, exist_ok=True)
        header = INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, base)
        if durable:
            durable_replace(path, header)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, header)
            finally:
                os.close(fd)
        return cls(path, base=base, phys=array("q"), sizes=array("l"), files=files)

    @classmethod
    def load(cls, path: Path, *, files: OpenFiles | None = None) -> tuple[QueueIndex, int]:
        """Open an existing index; returns it and the number of torn bytes dropped.

        Raises :class:`IndexFileError` when the header is unusable.
        """
        raw = path.read_bytes()
        if len(raw) < INDEX_HEADER_SIZE:
            raise IndexFileError(f"{path}: index file shorter than its header")
        magic, version, base = INDEX_HEADER.unpack_from(raw, 0)
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            raise IndexFileError(f"{path}: not an index file (magic {magic!r}, version {version})")
        body = memoryview(raw)[INDEX_HEADER_SIZE:]
        whole = len(body) - len(body) % INDEX_ENTRY_SIZE
        phys: array[int] = array("q")
        sizes: array[int] = array("l")
        for p, s, _h in INDEX_ENTRY.iter_unpack(body[:whole]):
            phys.append(p)
            sizes.append(s)
        index = cls(path, base=base, phys=phys, sizes=sizes, files=files)
        torn = len(body) - whole
        if torn:
            os.ftruncate(index._fd, INDEX_HEADER_SIZE + whole)
        return index, torn

    # ---- queries ------------------------------------------------------------------
    @property
    def base(self) -> int:
        """First logical offset still indexed (the queue's start)."""
        return self._base

    @property
    def end(self) -> int:
        """Next logical offset to be written."""
        return self._base + self._released + len(self._phys)

    def __len__(self) -> int:
        return self._released + len(self._phys)

    def entry(self, offset: int) -> tuple[int, int]:
        """``(phys, size)`` of logical ``offset``; IndexError outside ``[base, end)``."""
        i = offset - self._base
        if i < 0 or i >= len(self):
            raise IndexError(offset)
        if i < self._released:
            p, s, _h = INDEX_ENTRY.unpack(
                os.pread(self._fd, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE + i * INDEX_ENTRY_SIZE))
            return p, s
        i -= self._released
        return self._phys[i], self._sizes[i]

    def item(self, offset: int) -> tuple[int, int, int, int]:
        """``(phys, size, first, end)`` of the item (batch or record) holding logical
        ``offset``: its entry, its first offset and the offset after its last;
        IndexError outside ``[base, end)``. The entries of an item are alike and
        positions only grow, so its span is a bisection (entries on file only are read
        a block at a time)."""
        i = offset - self._base
        if i < 0 or i >= len(self):
            raise IndexError(offset)
        released = self._released
        if i >= released:
            k = i - released
            phys = self._phys
            p = phys[k]
            lo = bisect.bisect_left(phys, p, 0, k)
            hi = bisect.bisect_right(phys, p, k)
            at = self._base + released
            if lo == 0 and released:  # it may begin among the entries on file
                return p, self._sizes[k], self._run_start(p, released), at + hi
            return p, self._sizes[k], at + lo, at + hi
        p, s = self.entry(offset)
        return p, s, self._run_start(p, i), self._run_end(p, i + 1)

    def _run_start(self, phys: int, i: int) -> int:
        """The first offset of the run of entries at ``phys`` that goes on at entry ``i``
        (relative to base): the entries before ``i`` on file are read back a block at a
        time until one is elsewhere."""
        while i > 0:
            lo = max(0, i - _SPAN_BLOCK)
            raw = os.pread(self._fd, (i - lo) * INDEX_ENTRY_SIZE,
                           INDEX_HEADER_SIZE + lo * INDEX_ENTRY_SIZE)
            rows = list(INDEX_ENTRY.iter_unpack(raw))
            for k in range(len(rows) - 1, -1, -1):
                if rows[k][0] != phys:
                    return self._base + lo + k + 1
            i = lo
        return self._base

    def _run_end(self, phys: int, i: int) -> int:
        """The offset after the run of entries at ``phys`` that goes on at entry ``i``
        (relative to base; on file): the file's entries a block at a time, then memory."""
        while i < self._released:
            hi = min(self._released, i + _SPAN_BLOCK)
            raw = os.pread(self._fd, (hi - i) * INDEX_ENTRY_SIZE,
                           INDEX_HEADER_SIZE + i * INDEX_ENTRY_SIZE)
            for k, row in enumerate(INDEX_ENTRY.iter_unpack(raw)):
                if row[0] != phys:
                    return self._base + i + k
            i = hi
        return self._base + self._released + bisect.bisect_right(self._phys, phys)

    def entries(self) -> list[tuple[int, int]]:
        self._restore()
        return list(zip(self._phys, self._sizes, strict=True))

    def first_index_at_or_after(self, phys: int) -> int:
        """Position (0-based, relative to base) of the first entry with phys >= ``phys``."""
        self._restore()
        return bisect.bisect_left(self._phys, phys)

    def release_before(self, offset: int) -> int:
        """Drop entries before ``offset`` from memory (they stay in the file; :meth:`entry`
        reads them from it). For a queue read mostly at its end and rarely far back: the
        schedule queue, whose pending entries the schedule index tracks (docs/delayed.md).
        Returns the entries released."""
        n = min(offset - self._base, len(self)) - self._released
        if n <= 0:
            return 0
        self.write_pending()  # released entries are read from the file
        del self._phys[:n]
        del self._sizes[:n]
        self._released += n
        return n

    def _restore(self) -> None:
        """Load released entries back into memory."""
        if not self._released:
            return
        raw = os.pread(self._fd, self._released * INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE)
        phys: array[int] = array("q")
        sizes: array[int] = array("l")
        for p, s, _h in INDEX_ENTRY.iter_unpack(raw):
            phys.append(p)
            sizes.append(s)
        phys.extend(self._phys)
        sizes.extend(self._sizes)
        self._phys, self._sizes, self._released = phys, sizes, 0

    # ---- mutation -----------------------------------------------------------------
    def append(self, entries: list[tuple[int, int, int]]) -> None:
        """Append ``(phys, size, count)`` items: the ``count`` messages of the batch (1: a
        record) at ``phys`` take the next offsets. In memory now, on file behind (module
        docstring)."""
        if not entries:
            return
        buf = self._pending
        phys, sizes = self._phys, self._sizes
        pack = INDEX_ENTRY.pack
        for p, s, n in entries:
            if n < 1:
                raise ValueError(f"an index entry's message count must be at least 1, not {n}")
            if n == 1:
                buf += pack(p, s, 0)
                phys.append(p)
                sizes.append(s)
            else:
                buf += pack(p, s, 0) * n
                phys.extend(array("q", (p,)) * n)
                sizes.extend(array("l", (s,)) * n)
        if len(buf) >= WRITE_BEHIND_ENTRIES * INDEX_ENTRY_SIZE:
            self.write_pending()

    @property
    def pending(self) -> int:
        """Entries appended but not written to the file yet."""
        return len(self._pending) // INDEX_ENTRY_SIZE

    def write_pending(self) -> None:
        """Write the entries held in memory only, with one write (a no-op when none are).
        On ``OSError`` they stay pending (and the file may hold part of them: the next
        write or :meth:`rollback` puts it right)."""
        data = self._pending
        if not data:
            return
        on_file = len(self) - self.pending
        self._pending = bytearray()
        try:
            write_all(self._fd, data, INDEX_HEADER_SIZE + on_file * INDEX_ENTRY_SIZE)
        except BaseException:
            self._pending = bytearray(data)  # a copy: the failed write's view may pin ``data``
            raise
        self._dirty = True

    def rollback(self, count: int) -> None:
        """Undo appends back to ``count`` entries (``len(self)`` before them), in memory
        and on file, including a torn tail a failed write may have left. Only entries
        appended since are dropped: they are still in memory."""
        drop = len(self) - count
        if drop < 0 or drop > len(self._phys):
            raise ValueError(f"cannot roll {self.path} back to {count} entries")
        if drop:
            del self._phys[-drop:]
            del self._sizes[-drop:]
        pending = max(self.pending - drop, 0)
        self._pending = self._pending[: pending * INDEX_ENTRY_SIZE]
        on_file = count - pending
        os.ftruncate(self._fd, INDEX_HEADER_SIZE + on_file * INDEX_ENTRY_SIZE)

    def truncate(self, count: int) -> None:
        """Keep only the first ``count`` entries."""
        self.write_pending()
        self._restore()
        if count >= len(self._phys):
            return
        del self._phys[count:]
        del self._sizes[count:]
        os.ftruncate(self._fd, INDEX_HEADER_SIZE + count * INDEX_ENTRY_SIZE)
        self._dirty = True

    def drop_before_phys(self, min_phys: int) -> int:
        """Drop the entries that point below ``min_phys`` (retention); rewrite atomically.

        Returns the number of entries dropped. The kept entries are copied from the
        file as they are.
        """
        cut = self.first_index_at_or_after(min_phys)
        if cut == 0:
            return 0
        self.write_pending()
        raw = os.pread(
            self._fd,
            (len(self._phys) - cut) * INDEX_ENTRY_SIZE,
            INDEX_HEADER_SIZE + cut * INDEX_ENTRY_SIZE,
        )
        new_base = self._base + cut
        durable_replace(self.path, INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, new_base) + raw)
        self._files.close(self)  # the old file's descriptor: the next use opens the new one
        del self._phys[:cut]
        del self._sizes[:cut]
        self._base = new_base
        return cut

    def fsync(self) -> None:
        """Write the pending entries and fsync the file (when anything was written)."""
        self.write_pending()
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        self.fsync()
        self._files.close(self)

