"""The broker's commit log: one append-only byte stream in fixed-size segment files.

Why this module exists: every message a broker stores goes through here, on the master
(``append``) and on every slave (``append_replicated``, with the master's bytes at the
master's offsets). Keeping one physical stream for all queues (RocketMQ's CommitLog)
makes replication a byte copy: a slave that writes what the master wrote at the same
positions ends with byte-identical segment files and rebuilds identical indexes.

Layout on disk (``<dir>/commitlog/<base offset, 20 digits>`` and ``<dir>/index/...``):

* The *physical offset* is the global byte position in the stream. Segment ``k`` holds
  bytes ``[k*segment_bytes, (k+1)*segment_bytes)`` and is named by its base offset.
* Records are contiguous. A record never straddles two segments: when one does not fit
  (keeping room for a marker), an end-of-file marker fills the rest of the segment and
  the record goes to the next segment's base. Every sealed segment therefore ends with
  a marker and is exactly ``segment_bytes`` long; the active one grows as written.

The record and end-of-file marker layout is :mod:`.records` (one definition, one walker).

Durability: ``FlushPolicy(mode="batch")`` fdatasyncs after each append call;
``mode="interval"`` leaves it to the caller (``needs_flush``/``flush``, which may run in a
worker thread). Recovery on open scans the last segments, truncates a torn tail and
repairs the indexes (``RecoveryReport``); inside a sealed segment, a record damaged in
place is kept and reported (reads refuse it: :class:`DamagedRecordError`) and any other
damage raises :class:`CorruptSegmentError` instead of dropping data.

The recovery point (``commitlog/recovery-point``, Kafka's recovery-point checkpoint,
RocketMQ's StoreCheckpoint): :meth:`CommitLog.write_recovery_point` records a position
the log is fsynced up to, the sequence number there and every queue's index end there.
Recovery then scans only from that position (never before the last segments' window):
a master restarted after ``kill -9`` re-reads the last second of records, not the whole
active segment (2 s of CPU for a 35 MB segment on the benchmark machine, taken from the
healthy group's writes sharing the cores). The bytes before it were fsynced before the
file was written, and are CRC-checked again by every read. An index that does not end
where the recovery point says (it was not on disk at a power loss) makes recovery
rebuild every index from the whole log, as a missing index always did; an unreadable or
impossible recovery point is ignored (logged in ``RecoveryReport.recovery_point``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, cast

from understudy_broker.checksum import crc32
from understudy_broker.storage.durability import durable_replace, fsync_dir, write_all
from understudy_broker.storage.index import (
    DEFAULT_INDEX_OPEN_FILES,
    IndexFileError,
    OpenFiles,
    QueueIndex,
)
from understudy_broker.storage.records import (
    BATCH_END,
    BATCH_MAGIC,
    BATCH_RECORD_SIZE,
    EOF_MIN,
    FIRST_SEQ,
    LEN_MAGIC,
    MAX_DELTA,
    PREFIX_SIZE,
    RECORD_MAGIC,
    CommitLogError,
    CorruptRecordError,
    InvalidMessageError,
    MessageTooLargeError,
    PackedBatch,
    RecordTuple,
    StoredRecord,
    Walk,
    Walked,
    batch_head_parts,
    batch_parts,
    check_item,
    decode_item,
    encode_eof_marker,
    item_head,
    topic_bytes,
    unpacked,
    walk,
)

_SEGMENT_RE = re.compile(r"^\d{20}$")
_PRESERVED_TAIL_SEGMENTS = 3
RECOVERY_POINT_FILE = "recovery-point"
#: ``<dir>/log-format``: the newest item format the log may hold (docs/record-batch.md).
#: 1: records only (brokers before 2026-11-28, which wrote no such file); 2: batches too.
FORMAT_FILE = "log-format"
LOG_FORMAT = 2
TAIL_CHECKED = 256
#: A read takes the next item of its queue into the same pread when at most this many
#: bytes of other queues lie before it (copying 16 KiB costs about what a pread does).
READ_GAP = 16 << 10


# ---- errors ------------------------------------------------------------------------
class CorruptSegmentError(CommitLogError):
    """A sealed segment is damaged; nothing was truncated. An operator decides."""

    def __init__(self, path: Path, position: int, reason: str) -> None:
        super().__init__(f"corrupt segment {path} at file position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class DamagedRecordError(CorruptRecordError):
    """A batch or record a read reached is damaged (a CRC, framing, or the index entry
    that led to it is wrong): it is not served. Names the queue offset asked for, the
    offset after the damaged item (``next_offset``: a consumer skips it by reading from
    there) and where it lies, so an operator can find it."""

    def __init__(self, *, topic: str, queue: int, offset: int, path: Path, position: int,
                 phys: int, reason: str, first_offset: int | None = None,
                 next_offset: int | None = None) -> None:
        self.detail = f"{reason} ({path} at file position {position}, log offset {phys})"
        self.first_offset = offset if first_offset is None else first_offset
        self.next_offset = offset + 1 if next_offset is None else next_offset
        held = (f"offset {offset} is" if self.next_offset == self.first_offset + 1
                else f"offsets {self.first_offset}..{self.next_offset - 1} are")
        super().__init__(f"{topic}/{queue} {held} damaged: {self.detail}")
        self.topic = topic
        self.queue = queue
        self.offset = offset
        self.path = path
        self.position = position
        self.phys = phys
        self.reason = reason


class UnsupportedLogFormatError(CommitLogError):
    """The log says it holds a format this broker cannot read (``<dir>/log-format``)."""


class ReplicationGapError(CommitLogError):
    """Replicated bytes do not start at this log's end."""


class ReplicationCorruptError(CommitLogError):
    """Replicated bytes hold an invalid or inconsistent record; none of it was written."""


# ---- value types -------------------------------------------------------------------
class RawItem(NamedTuple):
    """A stored item (batch or record) as :meth:`CommitLog.read_items` gives it: the
    queue offsets it holds, ``[first, end)``, and its bytes."""

    first: int
    end: int
    data: bytes


@dataclass(frozen=True, slots=True)
class AppendResult:
    start_phys: int
    end_phys: int
    queue_offsets: list[tuple[str, int, int]]


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """``batch``: fdatasync inside every append call. ``interval``: the caller flushes
    when :meth:`CommitLog.needs_flush` says so (every ``interval_ms``)."""

    mode: Literal["batch", "interval"] = "batch"
    interval_ms: int = 200

    def __post_init__(self) -> None:
        if self.mode not in ("batch", "interval"):
            raise ValueError(f"flush mode must be 'batch' or 'interval', not {self.mode!r}")
        if self.interval_ms <= 0:
            raise ValueError("flush interval_ms must be positive")


@dataclass(frozen=True, slots=True)
class Retention:
    """Delete whole sealed segments beyond ``max_bytes`` total or older than ``max_age_s``."""

    max_bytes: int | None = None
    max_age_s: float | None = None


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    truncated_bytes: int
    records_scanned: int  # items scanned: batches, records and markers
    indexes_rebuilt: int
    scanned_from: int = 0  # the physical offset recovery scanned from
    recovery_point: str = "none"  # "used", "none", or why the file was ignored
    index_problems: tuple[str, ...] = ()  # each index found wrong: its file and what was wrong
    damaged: tuple[str, ...] = ()  # records damaged in place that recovery stepped over
    # Indexes that ended before the log and agreed with it up to there: their entries
    # after the last recovery mark were not written yet (indexes are written behind the
    # log, index.py) and were added from the scan. Normal after a crash, not a problem.
    indexes_extended: int = 0


@dataclass(frozen=True, slots=True)
class RecoveryPoint:
    """The log is on disk up to ``phys`` (a record boundary); the next record there is
    ``next_seq``; each queue's index ended at ``ends[(topic, queue)]`` there.
    ``tail_crc``: the CRC-32 of the (at most) :data:`TAIL_CHECKED` bytes before ``phys``
    in its segment. The log before ``phys`` never changes, so a mismatch means the file
    does not describe this log (a data directory put together by hand): it is ignored
    rather than trusted to say where a record starts."""

    phys: int
    next_seq: int
    ends: dict[tuple[str, int], int]
    tail_crc: int = 0

    def encode(self) -> bytes:
        queues: dict[str, dict[str, int]] = {}
        for (topic, queue), end in sorted(self.ends.items()):
            queues.setdefault(topic, {})[str(queue)] = end
        return json.dumps({"version": 1, "phys": self.phys, "next_seq": self.next_seq,
                           "tail_crc": self.tail_crc, "queues": queues}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> RecoveryPoint:
        """Raises ``ValueError`` (with why) for anything but a well-formed version 1."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("not a version 1 recovery point")
        phys, seq, queues = doc.get("phys"), doc.get("next_seq"), doc.get("queues")
        crc = doc.get("tail_crc")
        if not (isinstance(phys, int) and isinstance(seq, int) and phys >= 0 and seq >= 0
                and isinstance(crc, int) and isinstance(queues, dict)):
            raise ValueError("phys, next_seq, tail_crc or queues missing or malformed")
        ends: dict[tuple[str, int], int] = {}
        for topic, qs in queues.items():
            if not isinstance(qs, dict):
                raise ValueError(f"queues of {topic!r} malformed")
            for q, end in qs.items():
                if not (q.isdigit() and isinstance(end, int) and end >= 0):
                    raise ValueError(f"queue {topic}/{q} malformed")
                ends[(topic, int(q))] = end
        return cls(phys, seq, ends, crc)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the retention predicate needs to know about a segment."""

    base: int
    size: int
    modified_ms: int


# ---- pure helpers -------------------------------------------------------------------
def segments_to_delete(
    segments: Sequence[SegmentInfo],
    *,
    retention: Retention,
    now_ms: int,
    active_base: int,
    active_empty: bool,
    keep_from: int | None = None,
) -> list[int]:
    """Bases of the oldest sealed segments retention removes (a prefix, never a hole).

    The active segment is never deleted, nor the newest sealed one while the active
    segment is empty (its end-of-file marker carries the next sequence number), nor any
    segment holding physical offset ``keep_from`` or later (a delayed message not yet
    delivered: docs/delayed.md).
    """
    ordered = sorted(segments, key=lambda s: s.base)
    sealed = [s for s in ordered if s.base < active_base]
    if active_empty and sealed:
        sealed = sealed[:-1]
    total = sum(s.size for s in ordered)
    doomed: list[int] = []
    for seg in sealed:
        too_big = retention.max_bytes is not None and total > retention.max_bytes
        too_old = (
            retention.max_age_s is not None
            and now_ms - seg.modified_ms > retention.max_age_s * 1000
        )
        if not (too_big or too_old):
            break
        if keep_from is not None and seg.base + seg.size > keep_from:
            break
        doomed.append(seg.base)
        total -= seg.size
    return doomed


def _index_path(root: Path, topic: str, queue: int) -> Path:
    return root / "index" / topic / str(queue)


def _segment_name(base: int) -> str:
    return f"{base:020d}"


# ---- the log -----------------------------------------------------------------------
class CommitLog:
    """See the module docstring. Not thread-safe except :meth:`flush`/:meth:`needs_flush`."""

    recovery: RecoveryReport

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        flush: FlushPolicy,
        retention: Retention,
        on_damaged: Callable[[DamagedRecordError], None] | None = None,
        index_open_files: int = DEFAULT_INDEX_OPEN_FILES,
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.flush_policy = flush
        self.retention = retention
        self._log_dir = directory / "commitlog"
        self._segments: list[int] = []  # bases, ascending; the last is the active one
        self._read_fds: dict[int, int] = {}
        self._write_fd = -1
        self._write_base = -1
        self._max_phys = 0
        self._min_phys = 0
        self._next_seq = 0
        self._indexes: dict[tuple[str, int], QueueIndex] = {}
        self._unwritten: set[QueueIndex] = set()  # may hold entries not on file (index.py)
        # Every index shares these: at most ``index_open_files`` descriptors (index.py).
        self.index_files = OpenFiles(index_open_files)
        self._topic_raw: dict[str, bytes] = {}  # validated names, encoded
        self._topic_names: dict[bytes, str] = {}  # validated names, decoded (walk cache)
        self._lock = threading.Lock()
        self._unsynced: list[int] = []  # dup'd fds of sealed segments not yet fsynced
        self._flushed_phys = 0
        self._last_flush = time.monotonic()
        self.recovery = RecoveryReport(0, 0, 0)
        # Damaged records reads came across, by log offset: each is reported once.
        self._damaged: dict[int, DamagedRecordError] = {}
        self._on_damaged = on_damaged

    # ---- open & recovery ----------------------------------------------------------
    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        segment_bytes: int = 64 << 20,
        flush: FlushPolicy = FlushPolicy(),
        retention: Retention = Retention(),
        on_damaged: Callable[[DamagedRecordError], None] | None = None,
        index_open_files: int = DEFAULT_INDEX_OPEN_FILES,
    ) -> CommitLog:
        """``on_damaged`` is called once for each damaged record a read comes across
        (:meth:`read` raises :class:`DamagedRecordError` every time). At most
        ``index_open_files`` queue indexes hold an open descriptor at once."""
        if segment_bytes < 4096 or segment_bytes > 1 << 31:
            raise ValueError("segment_bytes must be between 4 KiB and 2 GiB")
        log = cls(directory, segment_bytes=segment_bytes, flush=flush, retention=retention,
                  on_damaged=on_damaged, index_open_files=index_open_files)
        try:
            log._recover()
        except BaseException:
            log.close()
            raise
        return log

    def _list_segments(self) -> list[int]:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(p.name) for p in self._log_dir.iterdir() if _SEGMENT_RE.match(p.name))
        for i, base in enumerate(bases):
            path = self._log_dir / _segment_name(base)
            if base % self.segment_bytes:
                raise CorruptSegmentError(
                    path, 0, f"base offset is not a multiple of segment_bytes={self.segment_bytes}"
                )
            size = path.stat().st_size
            if size > self.segment_bytes:
                raise CorruptSegmentError(
                    path, self.segment_bytes, f"file is {size} bytes, larger than segment_bytes"
                )
            if i + 1 < len(bases):
                if bases[i + 1] != base + self.segment_bytes:
                    raise CorruptSegmentError(
                        path,
                        size,
                        f"next segment is {bases[i + 1]}, expected {base + self.segment_bytes} (missing file)",
                    )
                if size != self.segment_bytes:
                    raise CorruptSegmentError(
                        path, size, f"sealed segment is {size} bytes, expected {self.segment_bytes}"
                    )
        return bases

    def _check_format(self) -> None:
        """Refuse a log of a format newer than :data:`LOG_FORMAT` (or an unreadable format
        file) before reading any of it; say this format otherwise (a log of records, with
        no file, goes on with batches)."""
        path = self.directory / FORMAT_FILE
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            durable_replace(path, f"{LOG_FORMAT}\n".encode())
            return
        try:
            found = int(text.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            raise UnsupportedLogFormatError(
                f"{path} does not hold a log format number ({text[:40]!r}); nothing was "
                "read or changed: restore the file (this broker writes "
                f"'{LOG_FORMAT}') or start the broker version that wrote it") from None
        if found > LOG_FORMAT:
            raise UnsupportedLogFormatError(
                f"the log in {self._log_dir} is format {found}, written by a newer broker; "
                f"this one reads formats 1 to {LOG_FORMAT}. Nothing was read or changed: "
                "start the newer broker version on it")
        if found < LOG_FORMAT:
            durable_replace(path, f"{LOG_FORMAT}\n".encode())

    def _recover(self) -> None:
        bases = self._list_segments()
        self._check_format()
        self._segments = bases
        if not bases:
            self._max_phys = self._min_phys = 0
            _rebuilt, problems, _extended = self._load_indexes(scan_start=0, scanned=[])
            self.recovery = RecoveryReport(0, 0, 0, index_problems=tuple(problems))
            self._flushed_phys = 0
            return
        self._min_phys = bases[0]
        first_scanned = max(0, len(bases) - _PRESERVED_TAIL_SEGMENTS)
        point, how = self._usable_recovery_point(bases, first_scanned)
        scan_start = bases[first_scanned] if point is None else point.phys
        items: list[Walked] = []
        truncated = 0
        end = scan_start
        for i in range(first_scanned, len(bases)):
            base = bases[i]
            if base + self.segment_bytes <= scan_start:
                continue
            path = self._log_dir / _segment_name(base)
            skip = max(0, scan_start - base)
            with path.open("rb") as fh:
                fh.seek(skip)
                data = fh.read()
            last = i == len(bases) - 1
            if last:  # the first invalid record is a torn tail: cut there
                res = walk(memoryview(data), start_phys=base + skip,
                           segment_bytes=self.segment_bytes, topics=self._topic_names)
            else:
                res = self._walk_over_damage(memoryview(data), base + skip)
            if not last and res.valid_end != base + self.segment_bytes:
                raise CorruptSegmentError(
                    path,
                    res.valid_end - base,
                    res.error or "segment does not end with a complete end-of-file marker",
                )
            items.extend(res.named())
            end = res.valid_end
            if last and res.valid_end - base < skip + len(data):
                truncated = skip + len(data) - (res.valid_end - base)
                with path.open("r+b") as fh:
                    fh.truncate(res.valid_end - base)
                    fh.flush()
                    os.fsync(fh.fileno())
        self._max_phys = end
        self._flushed_phys = end
        if items:
            last_item = items[-1]
            self._next_seq = last_item.seq + last_item.messages
        elif point is not None:
            self._next_seq = point.next_seq
        # A last segment that is exactly full: the next append creates the next file.
        if end < bases[-1] + self.segment_bytes:
            self._open_writer(bases[-1])
        rebuilt, problems, extended = self._load_indexes(
            scan_start=scan_start,
            scanned=[s for s in items if not s.is_marker],
            trusted={} if point is None else point.ends,
        )
        self.recovery = RecoveryReport(truncated, len(items), rebuilt, scan_start, how,
                                       tuple(problems),
                                       tuple(str(err) for err in self._damaged.values()),
                                       extended)
        self._unwritten = {ix for ix in self._indexes.values() if ix.pending}

    def _usable_recovery_point(self, bases: list[int], first_scanned: int
                               ) -> tuple[RecoveryPoint | None, str]:
        """The recovery point when recovery may start there, else None and why not."""
        path = self._log_dir / RECOVERY_POINT_FILE
        try:
            point = RecoveryPoint.decode(path.read_bytes())
        except FileNotFoundError:
            return None, "none"
        except (OSError, ValueError) as exc:
            return None, f"ignored: {exc}"
        if point.phys < bases[first_scanned]:
            return None, "ignored: before the scanned segments"  # nothing to save
        base = point.phys - point.phys % self.segment_bytes
        if base not in bases[first_scanned:]:
            return None, f"ignored: no segment holds offset {point.phys}"
        if (self._log_dir / _segment_name(base)).stat().st_size < point.phys - base:
            return None, f"ignored: offset {point.phys} is past the end of the log"
        if self._tail_crc(point.phys) != point.tail_crc:
            return None, f"ignored: the bytes before offset {point.phys} differ"
        return point, "used"

    def _tail_crc(self, phys: int) -> int:
        """CRC-32 of the bytes before ``phys`` in its segment (:class:`RecoveryPoint`).
        Opens the file itself: safe from a worker thread."""
        base = phys - phys % self.segment_bytes
        start = max(base, phys - TAIL_CHECKED)
        if start == phys:
            return 0
        fd = os.open(self._log_dir / _segment_name(base), os.O_RDONLY)
        try:
            return crc32(os.pread(fd, phys - start, start - base))
        finally:
            os.close(fd)

    def recovery_mark(self) -> RecoveryPoint:
        """Where the log stands now (call on the appending thread, between appends): hand
        it to :meth:`write_recovery_point`. Writes every index's pending entries first, so
        the files hold what the mark says before it is recorded; ``OSError`` when one
        cannot be written (then no mark: the old recovery point stays)."""
        self.write_pending_indexes(len(self._unwritten))
        return RecoveryPoint(self._max_phys, self._next_seq,
                             {key: ix.end for key, ix in self._indexes.items()})

    def write_pending_indexes(self, most: int) -> bool:
        """Write the waiting entries of up to ``most`` indexes (one write each); whether
        none is left waiting. A broker with thousands of queues written in a second
        calls this in steps before :meth:`recovery_mark`, giving the event loop back in
        between, so the mark itself has little left to write."""
        unwritten = self._unwritten
        for _ in range(min(most, len(unwritten))):
            ix = unwritten.pop()
            try:
                ix.write_pending()
            except OSError:
                unwritten.add(ix)
                raise
        return not unwritten

    def write_recovery_point(self, mark: RecoveryPoint) -> None:
        """Record ``mark`` durably as where the next recovery starts. The log must be
        flushed up to it already (``ValueError`` otherwise: flush through the caller's
        group commit, so two flushes never run at once). Blocking; safe from a worker
        thread during appends."""
        with self._lock:
            flushed = self._flushed_phys
        if flushed < mark.phys:
            raise ValueError(f"the log is flushed up to {flushed}, not to {mark.phys}")
        point = dataclasses.replace(mark, tail_crc=self._tail_crc(mark.phys))
        durable_replace(self._log_dir / RECOVERY_POINT_FILE, point.encode())

    def _load_indexes(self, *, scan_start: int, scanned: list[Walked],
                      trusted: dict[tuple[str, int], int] | None = None
                      ) -> tuple[int, list[str], int]:
        """Open every index; make each agree with the log. Returns the indexes repaired,
        for each index found wrong its file and what was wrong, and the indexes extended
        (short of the log but right as far as they went: written behind, index.py).

        ``trusted``: every queue's index end at ``scan_start`` (the recovery point); an
        index ending elsewhere there, or missing, is rebuilt with all the others. Last,
        the indexes must hold one entry per record of the log (counted from sequence
        numbers): an index cut short where recovery did not scan is caught there."""
        root = self.directory / "index"
        root.mkdir(parents=True, exist_ok=True)
        expected: dict[tuple[str, int], list[Walked]] = {}
        for s in scanned:
            expected.setdefault((s.topic, s.queue), []).append(s)
        repaired = extended = 0
        problems: dict[Path, str] = {}
        needs_full = False
        found_any = False
        for tdir in sorted(root.iterdir()):
            if not tdir.is_dir():
                continue
            for qfile in sorted(tdir.iterdir()):
                if not qfile.name.isdigit():
                    if qfile.name.endswith(".tmp"):
                        qfile.unlink()
                    continue
                found_any = True
                key = (tdir.name, int(qfile.name))
                try:
                    index, torn = QueueIndex.load(qfile, files=self.index_files)
                except IndexFileError as exc:
                    problems[qfile] = str(exc).removeprefix(f"{qfile}: ")
                    needs_full = True
                    continue
                self._indexes[key] = index
                if torn:
                    problems[qfile] = f"a torn entry ({torn} bytes) dropped"
                at_point = index.base + index.first_index_at_or_after(scan_start)
                if trusted and key in trusted and at_point != trusted[key]:
                    problems[qfile] = (f"ends at offset {at_point} at the recovery point, "
                                       f"which says {trusted[key]}")
                    needs_full = True
                    continue
                outcome = self._repair_index(index, scan_start, expected.get(key, []))
                if outcome == "extended" and not torn:
                    extended += 1
                    continue
                if outcome != "ok":
                    problems.setdefault(qfile, "disagrees with the log")
                if outcome == "rebuild":
                    needs_full = True
                elif torn or outcome == "repaired":
                    repaired += 1
        for key, items in expected.items():
            path = _index_path(self.directory, *key)
            if key in self._indexes or path in problems:
                continue
            problems[path] = "missing"
            if items[0].queue_offset != 0:
                needs_full = True
                continue
            index = QueueIndex.create(path, files=self.index_files)
            self._indexes[key] = index
            index.append([(s.phys, s.size, s.messages) for s in items])
            repaired += 1
        for key, end in (trusted or {}).items():
            path = _index_path(self.directory, *key)
            if end > 0 and key not in self._indexes:
                problems.setdefault(path, "missing")
                needs_full = True
        if not found_any and scan_start > self._min_phys:
            problems[root] = "no index files"
            needs_full = True
        if not needs_full:
            held = sum(len(ix) for ix in self._indexes.values())
            records = self._records_held()
            if records is not None and held != records:
                problems[root] = (f"the indexes hold {held} entries, the log {records} "
                                  "records")
                needs_full = True
        if needs_full:
            rebuilt, changed = self._rebuild()
            for path, how in changed.items():
                problems[path] = f"{problems[path]}; {how}" if path in problems else how
            repaired, extended = rebuilt, 0
        return repaired, [f"{path}: {why}" for path, why in problems.items()], extended

    def _records_held(self) -> int | None:
        """How many records the log holds: the next sequence number minus the first
        record's (one header read). None when that header is unreadable."""
        if self._max_phys <= self._min_phys:
            return 0
        head = os.pread(self._read_fd(self._min_phys), PREFIX_SIZE + FIRST_SEQ.size, 0)
        if (len(head) < PREFIX_SIZE + FIRST_SEQ.size
                or LEN_MAGIC.unpack_from(head)[1] not in (RECORD_MAGIC, BATCH_MAGIC)):
            return None
        (first,) = FIRST_SEQ.unpack_from(head, PREFIX_SIZE)
        return self._next_seq - first if first <= self._next_seq else None

    @staticmethod
    def _repair_index(
        index: QueueIndex, scan_start: int, items: list[Walked]
    ) -> Literal["ok", "extended", "repaired", "rebuild"]:
        """Make ``index`` agree with the scanned tail of the log.

        ``extended`` when it was right but short (the entries after it added);
        ``rebuild`` when the index disagrees about entries before the scanned region
        (missing or extra): only a scan of the whole log can fix that.
        """
        cut = index.first_index_at_or_after(scan_start)
        want: list[tuple[int, int]] = []
        for s in items:
            if s.queue_offset != index.base + cut + len(want):
                return "rebuild"
            want += [(s.phys, s.size)] * s.messages
        have = index.entries()[cut:]
        if have == want:
            return "ok"
        keep = cut
        for h, w in zip(have, want, strict=False):
            if h != w:
                break
            keep += 1
        index.truncate(keep)
        index.append([(ph, size, 1) for ph, size in want[keep - cut :]])
        return "extended" if keep == cut + len(have) else "repaired"

    def rebuild_indexes(self) -> int:
        """Rebuild every index from the whole log (CRC-checked). Returns indexes written."""
        return self._rebuild()[0]

    def _rebuild(self) -> tuple[int, dict[Path, str]]:
        """:meth:`rebuild_indexes`; also says which indexes held other offsets before."""
        old = {k: (ix.base, ix.end) for k, ix in self._indexes.items()}
        for ix in self._indexes.values():
            ix.close()
        self._indexes.clear()
        self._unwritten.clear()
        found: dict[tuple[str, int], list[Walked]] = {}
        for item in self._iter_log_items():
            if not item.is_marker:
                found.setdefault((item.topic, item.queue), []).append(item)
        changed: dict[Path, str] = {}
        for key in sorted(set(found) | set(old)):
            items = found.get(key, [])
            base = items[0].queue_offset if items else old[key][1]
            path = _index_path(self.directory, *key)
            index = QueueIndex.create(path, base=base, files=self.index_files)
            index.append([(s.phys, s.size, s.messages) for s in items])
            index.fsync()
            self._indexes[key] = index
            was = old.get(key)
            if was is not None and was != (index.base, index.end):
                changed[path] = (f"held offsets [{was[0]}, {was[1]}), the log holds "
                                 f"[{index.base}, {index.end})")
        return len(found.keys() | old.keys()), changed

    def _iter_log_items(self) -> Iterator[Walked]:
        """Every item of the log, checked (CRC; each queue's offsets follow on from one
        another); a record damaged in place is stepped over (:meth:`_walk_over_damage`)."""
        ends: dict[tuple[str, int], int] = {}
        for base in self._segments:
            path = self._log_dir / _segment_name(base)
            if not path.exists():
                continue
            data = path.read_bytes()
            res = self._walk_over_damage(memoryview(data), base, ends)
            if res.error is not None or res.valid_end - base != len(data):
                raise CorruptSegmentError(path, res.valid_end - base, res.error or "torn record")
            yield from res.named()

    def _walk_over_damage(self, view: memoryview, start: int,
                          ends: dict[tuple[str, int], int] | None = None) -> Walk:
        """:func:`.records.walk` over ``view`` (one segment's bytes from physical ``start``),
        stepping over records damaged in place: the CRC fails, but the framing
        holds and the next item is whole and carries the next sequence number. Such a
        record is kept, so its queue's later offsets stay where they are, and reported
        (:meth:`_damaged_record`); reading it raises :class:`DamagedRecordError`.

        ``ends``: each queue's next offset, followed across calls. With it, every record
        must continue its queue; a damaged one whose queue or offset cannot be confirmed
        that way stops the walk (the torn-tail rule of a last segment never steps)."""
        out = Walk(valid_end=start)
        pos = start
        while True:
            res = walk(view[pos - start:], start_phys=pos, segment_bytes=self.segment_bytes,
                       topics=self._topic_names)
            if ends is None:
                out.items += res.items
            else:
                for row in res.items:
                    phys, _size, is_marker, _seq, qoff, queue, topic, count = row
                    if not is_marker:
                        expected = ends.setdefault((topic, queue), qoff)
                        if qoff != expected:
                            out.valid_end = phys
                            out.error = (f"item at {phys} is offset {qoff} of {topic}/{queue},"
                                         f" which goes on at {expected}")
                            return out
                        ends[(topic, queue)] = qoff + count
                    out.items.append(row)
            out.valid_end, out.error = res.valid_end, res.error
            if res.error is None:
                return out
            bad = res.valid_end - start
            size = LEN_MAGIC.unpack_from(view, bad)[0]
            if bad + size + LEN_MAGIC.size <= len(view):  # frame the next item too
                size += LEN_MAGIC.unpack_from(view, bad + size)[0]
            pair = walk(view[bad:bad + size], start_phys=res.valid_end, verify=False,
                        segment_bytes=self.segment_bytes, topics=self._topic_names).named()
            if len(pair) < 2 or pair[0].is_marker or pair[1].seq != pair[0].seq + pair[0].messages:
                return out
            rec = pair[0]
            if ends is not None:
                if ends.get((rec.topic, rec.queue)) != rec.queue_offset:
                    return out
                ends[(rec.topic, rec.queue)] = rec.queue_offset + rec.messages
            self._damaged_record(rec.topic, rec.queue, rec.queue_offset, rec.phys,
                                 "CRC mismatch", next_offset=rec.queue_offset + rec.messages)
            out.items.append(rec)
            out.valid_end, out.error = rec.phys + rec.size, None
            pos = rec.phys + rec.size

    # ---- file handles -------------------------------------------------------------
    def _open_writer(self, base: int) -> None:
        path = self._log_dir / _segment_name(base)
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        if created:
            fsync_dir(self._log_dir)
        with self._lock:
            if self._write_fd >= 0:
                self._unsynced.append(self._write_fd)
            self._write_fd = fd
            self._write_base = base
        if not self._segments or self._segments[-1] != base:
            self._segments.append(base)

    def _read_fd(self, base: int) -> int:
        fd = self._read_fds.get(base)
        if fd is None:
            fd = os.open(self._log_dir / _segment_name(base), os.O_RDONLY)
            self._read_fds[base] = fd
        return fd

    def _write_at(self, phys: int, data: bytes | memoryview) -> None:
        """Write ``data`` (within one segment) at ``phys``; rolls to a new file if needed."""
        base = phys - phys % self.segment_bytes
        if base != self._write_base:
            self._open_writer(base)
        write_all(self._write_fd, data, phys - base)

    # ---- properties ---------------------------------------------------------------
    @property
    def max_phys(self) -> int:
        return self._max_phys

    @property
    def min_phys(self) -> int:
        return self._min_phys

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def flushed_phys(self) -> int:
        """Every byte below this offset has been fdatasynced (thread-safe)."""
        with self._lock:
            return self._flushed_phys

    # ---- master path --------------------------------------------------------------
    def _topic_bytes(self, topic: str) -> bytes:
        raw = self._topic_raw.get(topic)
        if raw is None:
            raw = topic_bytes(topic)
            self._topic_raw[topic] = raw
        return raw

    def _index(self, topic: str, queue: int, *, create: bool) -> QueueIndex | None:
        ix = self._indexes.get((topic, queue))
        if ix is None and create:
            ix = QueueIndex.create(_index_path(self.directory, topic, queue),
                                   files=self.index_files, durable=False)
            self._indexes[(topic, queue)] = ix
        return ix

    def append(self, messages: Sequence[RecordTuple | PackedBatch]) -> AppendResult:
        """Append messages (:class:`Message` or plain :data:`RecordTuple` items, and
        :class:`PackedBatch` items: records a producer packed): one batch per ``(topic,
        queue)`` of each run of messages of one topic (more at a segment's end), each
        packed batch as it came, one write per segment touched, indexes after the log.
        Messages of different topics keep their order in the log; so do each queue's
        (only a topic's queues are regrouped). The result's offsets are in the order
        given, one per message (``count`` for a packed batch).

        An append that might cross the end of the active segment takes its packed
        batches apart into messages first (the one time the master touches a producer's
        records: a batch never straddles two segments, and only messages can be split
        there)."""
        seg_bytes = self.segment_bytes
        limit = seg_bytes - EOF_MIN
        raws: list[bytes] = []
        topic_bytes = self._topic_bytes
        total = 0
        packed = False
        for m in messages:
            raw = topic_bytes(m[0])
            queue = m[1]
            if not 0 <= queue <= 0xFFFF_FFFF:
                raise InvalidMessageError(f"queue id {queue} out of range")
            if isinstance(m, PackedBatch):
                size = BATCH_END + len(raw) + len(m.records)
                packed = True
            else:
                key, body = m[2], m[3]
                size = (BATCH_END + len(raw) + BATCH_RECORD_SIZE
                        + (len(key) if key is not None else 0) + len(body))
                if size > limit:
                    raise MessageTooLargeError(
                        f"record of {size} bytes does not fit in a {seg_bytes}-byte segment")
            total += size
            raws.append(raw)
        if packed and self._max_phys % seg_bytes + total > limit:
            return self.append(unpacked(messages))
        try:
            return self._append_checked(messages, raws)
        except OSError:
            self._discard_unpublished()
            raise

    def _append_checked(self, messages: Sequence[RecordTuple | PackedBatch], raws: list[bytes]
                        ) -> AppendResult:
        """Group each run of one topic's messages by queue, then write each group as a
        batch (:func:`.records.batch_parts`: the records are packed once, the pieces
        written as they are), and each packed batch as it came under a header of its
        own (it fits: :meth:`append`). A group that does not fit in the segment's rest is
        split there: the batch of what fits, an end-of-file marker, the rest in the next
        segment.

        Only a topic's queues are regrouped, never one topic's messages moved past
        another's: what is appended after the messages it describes (an idempotent
        producer's record after each part of a PRODUCE_MULTI, the scheduler's DONE
        record after the deliveries) stays after them in the log, so a torn tail that
        keeps it keeps them too. A packed batch ends the run it is in, so a queue's
        messages keep their order around it."""
        groups: list[tuple[tuple[str, int], list[int] | int]] = []
        slots: list[int] = []  # where each item's offsets start in the result
        run_topic: str | None = None
        run: dict[tuple[str, int], list[int]] = {}
        n_out = 0
        for k, m in enumerate(messages):
            slots.append(n_out)
            if isinstance(m, PackedBatch):
                groups.append(((m[0], m[1]), k))
                run_topic = None
                n_out += m.messages
                continue
            n_out += 1
            if m[0] != run_topic:
                run_topic, run = m[0], {}
            ident = (m[0], m[1])
            group = run.get(ident)
            if group is None:
                group = run[ident] = []
                groups.append((ident, group))
            group.append(k)
        records = cast(Sequence[RecordTuple], messages)  # where a group's members are
        seg_bytes = self.segment_bytes
        start = pos = chunk_start = self._max_phys
        seg_end = (pos // seg_bytes + 1) * seg_bytes
        seq = self._next_seq
        pending: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
        offsets: list[tuple[str, int, int]] = [("", 0, 0)] * n_out
        chunk: list[bytes] = []
        ends: dict[tuple[str, int], int] = {}  # a queue met again in a later run
        for ident, members in groups:
            topic, queue = ident
            qoff = ends.get(ident, -1)
            if qoff < 0:
                ix = self._indexes.get(ident)
                qoff = ix.end if ix is not None else 0
            entries = pending.setdefault(ident, [])
            if isinstance(members, int):  # a packed batch, as it came
                b = messages[members]
                assert isinstance(b, PackedBatch)
                parts, size = batch_head_parts(
                    seq=seq, queue_offset=qoff, queue=queue, topic_raw=raws[members],
                    count=b.messages, first_ts=b.timestamp_ms, records_crc=b.records_crc,
                    records_len=len(b.records))
                chunk += parts
                chunk.append(b.records)
                entries.append((pos, size, b.messages))
                at = slots[members]
                offsets[at:at + b.messages] = [(topic, queue, o) for o in range(qoff, qoff + b.messages)]
                qoff += b.messages
                seq += b.messages
                pos += size
                ends[ident] = qoff
                continue
            raw = raws[members[0]]
            i, n = 0, len(members)
            while i < n:
                room = seg_end - pos - EOF_MIN - BATCH_END - len(raw)
                first_ts = records[members[i]][4]
                j, used = i, 0
                while j < n:
                    _t, _q, key, body, ts = records[members[j]]
                    own = BATCH_RECORD_SIZE + len(body) + (len(key) if key is not None else 0)
                    if used + own > room or not -MAX_DELTA <= ts - first_ts <= MAX_DELTA:
                        break
                    used += own
                    j += 1
                if j == i:  # not one more fits in this segment: close it with a marker
                    chunk.append(encode_eof_marker(length=seg_end - pos, next_seq=seq))
                    self._write_at(chunk_start, b"".join(chunk))
                    chunk = []
                    pos = chunk_start = seg_end
                    seg_end += seg_bytes
                    continue
                parts, size = batch_parts(seq=seq, queue_offset=qoff, queue=queue,
                                          topic_raw=raw,
                                          messages=[records[k] for k in members[i:j]])
                chunk += parts
                entries.append((pos, size, j - i))
                for k in members[i:j]:
                    offsets[slots[k]] = (topic, queue, qoff)
                    qoff += 1
                seq += j - i
                pos += size
                i = j
            ends[ident] = qoff
        if chunk:
            self._write_at(chunk_start, b"".join(chunk))
        self._commit(pos, seq, pending)
        return AppendResult(start, pos, offsets)

    def _discard_unpublished(self) -> None:
        """After a failed write, cut the files back to ``max_phys`` so stale bytes beyond
        it can never be mistaken for records by a later recovery."""
        end = self._max_phys
        with self._lock:  # a sync of the discarded bytes covers nothing written later
            self._flushed_phys = min(self._flushed_phys, end)
        while self._segments and self._segments[-1] > end:
            base = self._segments.pop()
            if base == self._write_base:
                with self._lock:
                    os.close(self._write_fd)
                    self._write_fd, self._write_base = -1, -1
            (self._log_dir / _segment_name(base)).unlink(missing_ok=True)
        path = self._log_dir / _segment_name(end - end % self.segment_bytes)
        if path.exists():
            os.truncate(path, end % self.segment_bytes)

    def _commit(
        self,
        end: int,
        next_seq: int,
        pending: dict[tuple[str, int], list[tuple[int, int, int]]],
        *,
        sync: bool = True,
    ) -> None:
        """Make written bytes durable (per policy), then indexed, then visible.

        All or nothing: when an index cannot be created or written (a full disk), the
        indexes already extended by this call are rolled back before the ``OSError``
        goes on to the caller, which cuts the log back (:meth:`_discard_unpublished`):
        log and every index stay as they were, and the positions reused by the next
        append are never named by a stale index entry."""
        if sync and self.flush_policy.mode == "batch" and end > self._max_phys:
            self._sync_now(end)
        done: list[tuple[QueueIndex, int]] = []
        unwritten = self._unwritten
        try:
            for (topic, queue), entries in pending.items():
                ix = self._index(topic, queue, create=True)
                if ix is not None:
                    done.append((ix, len(ix)))
                    ix.append(entries)
                    unwritten.add(ix)
        except OSError:
            for ix, count in done:
                ix.rollback(count)
            raise
        with self._lock:
            self._max_phys = end
        self._next_seq = next_seq

    def _sync_now(self, end: int) -> None:
        with self._lock:
            sealed, self._unsynced = self._unsynced, []
        for fd in sealed:
            os.fdatasync(fd)
            os.close(fd)
        os.fdatasync(self._write_fd)
        with self._lock:
            self._flushed_phys = max(self._flushed_phys, end)
            self._last_flush = time.monotonic()

    # ---- slave path ---------------------------------------------------------------
    def append_replicated(
        self, start_phys: int, data: bytes | memoryview, *, defer_sync: bool = False
    ) -> int:
        """Append the master's bytes at ``start_phys`` (which must equal ``max_phys``).

        Only whole records and markers are accepted: a trailing partial record is left
        for the caller to resend with the next bytes (compare the returned ``max_phys``
        with ``start_phys + len(data)``). Valid records before an invalid one are kept;
        the invalid one raises :class:`ReplicationCorruptError` and nothing of it is
        written. Returns the new ``max_phys``.

        ``defer_sync=True`` skips the ``batch`` policy's inline fdatasync: the caller
        promises to run :meth:`flush` (typically in a worker thread, covering several
        appends: group commit) and to acknowledge only up to :attr:`flushed_phys`.
        """
        if start_phys != self._max_phys:
            raise ReplicationGapError(
                f"replicated bytes start at {start_phys} but this log ends at {self._max_phys}"
            )
        view = memoryview(data)
        good_end, seq, pending, problem = self._check_replicated(view, start_phys)
        pos = start_phys
        try:
            while pos < good_end:
                seg_end = (pos // self.segment_bytes + 1) * self.segment_bytes
                stop = min(seg_end, good_end)
                self._write_at(pos, view[pos - start_phys : stop - start_phys])
                pos = stop
            if good_end > start_phys:
                self._commit(good_end, seq, pending, sync=not defer_sync)
        except OSError:
            self._discard_unpublished()
            raise
        if problem is not None:
            raise ReplicationCorruptError(f"replicated data rejected: {problem}")
        return self._max_phys

    def _check_replicated(
        self, view: memoryview, start_phys: int
    ) -> tuple[int, int, dict[tuple[str, int], list[tuple[int, int, int]]], str | None]:
        """Check replicated bytes: :func:`.records.walk` (framing, CRC, names), then
        continuity of the sequence and of every queue's offsets with this log.

        Returns ``(end of the whole valid prefix, next seq, index entries, problem)``;
        ``problem`` says why checking stopped early (None: data ended, possibly in the
        middle of a record that the caller resends).
        """
        walked = walk(view, start_phys=start_phys, segment_bytes=self.segment_bytes,
                      topics=self._topic_names)
        seq = self._next_seq
        ends: dict[tuple[str, int], int] = {}
        pending: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
        indexes = self._indexes
        good_end = start_phys
        for phys, size, is_marker, rseq, qoff, queue, topic, count in walked.items:
            if is_marker:
                if rseq != seq:
                    return good_end, seq, pending, (
                        f"end-of-file marker at {phys} says next seq {rseq}, expected {seq}")
                good_end = phys + size
                continue
            ident = (topic, queue)
            qend = ends.get(ident)
            if qend is None:
                ix = indexes.get(ident)
                qend = ix.end if ix is not None else 0
            if rseq != seq or qoff != qend:
                return good_end, seq, pending, (
                    f"record at {phys} has seq {rseq}/queue offset {qoff}, "
                    f"expected {seq}/{qend} (diverged from the master)")
            ends[ident] = qend + count
            entries = pending.get(ident)
            if entries is None:
                entries = pending[ident] = []
            entries.append((phys, size, count))
            seq += count
            good_end = phys + size
        return good_end, seq, pending, walked.error

    def read_raw(self, start_phys: int, max_bytes: int) -> bytes:
        """Raw log bytes from ``start_phys`` (within one segment), for the replication push."""
        if start_phys < self._min_phys or start_phys > self._max_phys:
            raise ReplicationGapError(
                f"offset {start_phys} is outside this log [{self._min_phys}, {self._max_phys}]"
            )
        seg_end = (start_phys // self.segment_bytes + 1) * self.segment_bytes
        stop = min(self._max_phys, seg_end, start_phys + max_bytes)
        if stop <= start_phys:
            return b""
        base = start_phys - start_phys % self.segment_bytes
        return os.pread(self._read_fd(base), stop - start_phys, start_phys - base)

    # ---- mending a damaged record from another copy ---------------------------------
    def damaged_phys(self) -> list[int]:
        """Log offsets of the damaged records found so far (recovery, index rebuild, reads)."""
        return sorted(self._damaged)

    def record_bytes(self, phys: int) -> bytes | None:
        """The whole record at ``phys`` if this copy holds it intact (CRC checked), for a
        slave that mends its damaged copy; None otherwise."""
        if not self._min_phys <= phys < self._max_phys:
            return None
        base = phys - phys % self.segment_bytes
        try:
            head = os.pread(self._read_fd(base), LEN_MAGIC.size, phys - base)
            if len(head) < LEN_MAGIC.size:
                return None
            size, magic = LEN_MAGIC.unpack(head)
            if (magic not in (RECORD_MAGIC, BATCH_MAGIC) or size < PREFIX_SIZE
                    or phys - base + size > self.segment_bytes):
                return None
            data = os.pread(self._read_fd(base), size, phys - base)
            check_item(memoryview(data), 0, phys)
        except (OSError, CorruptRecordError):
            return None
        return data

    def repair(self, phys: int, data: bytes) -> str | None:
        """Write another copy's intact bytes over the damaged record at ``phys`` (same
        place, same length: nothing else moves) and fsync. Returns None when mended, else
        why not (the copy is not that record, or the damage reaches the length field)."""
        err = self._damaged.get(phys)
        if err is None:
            return "no damaged record known there"
        try:
            rec = check_item(memoryview(data), 0, phys)
        except CorruptRecordError as exc:
            return f"the other copy is not intact either: {exc}"
        if rec.size != len(data) or (rec.topic, rec.queue) != (err.topic, err.queue) or not (
                rec.queue_offset <= err.offset < rec.queue_offset + rec.messages):
            return (f"the other copy holds {rec.topic}/{rec.queue} offset {rec.queue_offset} "
                    f"there, not {err.topic}/{err.queue} offset {err.offset}")
        base = phys - phys % self.segment_bytes
        own = os.pread(self._read_fd(base), PREFIX_SIZE, phys - base)
        if len(own) < PREFIX_SIZE or LEN_MAGIC.unpack_from(own)[0] != len(data):
            return "the damage reaches the record's length field: its neighbours cannot be trusted"
        fd = os.open(self._log_dir / _segment_name(base), os.O_WRONLY)
        try:
            write_all(fd, data, phys - base)
            os.fsync(fd)
        finally:
            os.close(fd)
        del self._damaged[phys]
        return None

    # ---- reads --------------------------------------------------------------------
    def read(
        self, topic: str, queue: int, offset: int, *, max_bytes: int, max_records: int
    ) -> list[StoredRecord]:
        """Records of one queue from ``offset``; at least one if any exists, then up to
        ``max_bytes`` (of the messages' own bytes) and ``max_records``. Offsets outside
        ``[queue_start, queue_end)`` give [].

        Every batch or record is checked (CRCs, framing, and that it is what the index
        names) before its messages are returned. The messages before a damaged one are
        returned; a read that starts at a damaged one raises :class:`DamagedRecordError`,
        which names it and the offset after it, so a reader can skip it."""
        return self._read(topic, queue, offset, max_bytes, max_records, raw=False)[0]

    def read_items(
        self, topic: str, queue: int, offset: int, *, max_bytes: int, max_records: int
    ) -> list[RawItem]:
        """:meth:`read`, but the stored items themselves (batches, records), each whole
        and checked (framing, CRCs, what the index names) without decoding a message:
        what a PULL_BATCH answer carries. The first may hold messages before ``offset``;
        ``max_bytes`` counts items' bytes (at least one item), ``max_records`` bounds
        where the last item may start."""
        return self._read(topic, queue, offset, max_bytes, max_records, raw=True)[1]

    def _read(self, topic: str, queue: int, offset: int, max_bytes: int, max_records: int,
              *, raw: bool) -> tuple[list[StoredRecord], list[RawItem]]:
        ix = self._indexes.get((topic, queue))
        out: list[StoredRecord] = []
        items: list[RawItem] = []
        if ix is None or max_records <= 0:
            return out, items
        offset = max(offset, ix.base)
        stop = min(ix.end, offset + max_records)
        total = 0
        i = offset
        seg_bytes = self.segment_bytes
        while i < stop:
            phys, size, start, end = ix.item(i)
            if phys < self._min_phys:
                i = end
                continue
            # Gather the items that follow closely in the same segment into one pread.
            # Other queues' items lie between; a pread copies them too, so a gap wider
            # than READ_GAP (a few system calls' worth of copying) starts another pread.
            base = phys - phys % seg_bytes
            run = [(phys, i, start, end)]
            run_bytes = size
            span_end = phys + size
            j = end
            while j < stop and total + run_bytes < max_bytes:
                p2, s2, b2, e2 = ix.item(j)
                if (p2 - p2 % seg_bytes != base or p2 - span_end > READ_GAP
                        or p2 + s2 - phys > 4 * max(max_bytes, 1 << 16)):
                    break
                run.append((p2, j, b2, e2))
                run_bytes += s2
                span_end = p2 + s2
                j = e2
            buf = memoryview(os.pread(self._read_fd(base), span_end - phys, phys - base))
            for p, first, begin, last in run:
                at = p - phys
                recs: list[StoredRecord] = []
                try:
                    if raw:
                        head, used = item_head(buf, at, p), 0
                    else:
                        head, recs, used = decode_item(
                            buf, at, p, first=first - begin, limit=min(last, stop) - first,
                            budget=max_bytes - total, must=not out)
                except CorruptRecordError as exc:
                    problem = str(exc).partition(f" at {p}: ")[2] or str(exc)
                else:
                    if (head.queue_offset == begin and head.messages == last - begin
                            and head.queue == queue and head.topic == topic):
                        if raw:
                            items.append(RawItem(begin, last, bytes(buf[at:at + head.size])))
                            total += head.size
                            if total >= max_bytes:
                                return out, items
                            continue
                        out += recs
                        total += used
                        if first + len(recs) < min(last, stop):
                            return out, items  # the byte budget ends inside this item
                        continue
                    problem = (f"the index of {topic}/{queue} points here, but the item here "
                               f"holds {head.topic}/{head.queue} offsets {head.queue_offset}.."
                               f"{head.queue_offset + head.messages - 1}")
                if out or items:
                    return out, items  # the intact ones before it; the next read reports it
                raise self._damaged_record(topic, queue, first, p, problem,
                                           first_offset=begin, next_offset=last)
            i = j
        return out, items

    def _damaged_record(self, topic: str, queue: int, offset: int, phys: int,
                        reason: str, *, first_offset: int | None = None,
                        next_offset: int | None = None) -> DamagedRecordError:
        """The error for a damaged record; the first time, also told to ``on_damaged``."""
        base = phys - phys % self.segment_bytes
        err = DamagedRecordError(topic=topic, queue=queue, offset=offset,
                                 path=self._log_dir / _segment_name(base),
                                 position=phys - base, phys=phys, reason=reason,
                                 first_offset=first_offset, next_offset=next_offset)
        if phys not in self._damaged:
            self._damaged[phys] = err
            if self._on_damaged is not None:
                self._on_damaged(err)
        return err

    def phys_of(self, topic: str, queue: int, offset: int) -> int | None:
        """Where record ``offset`` of ``topic``/``queue`` is in the log (None: not there)."""
        ix = self._indexes.get((topic, queue))
        if ix is None:
            return None
        try:
            return ix.entry(offset)[0]
        except IndexError:
            return None

    def queue_offset_at(self, topic: str, queue: int, phys: int) -> int:
        """The first offset of ``topic``/``queue`` whose record starts at or past ``phys``
        (the queue's end when none does): its records are appended in offset order, so
        this is a bisection of its index."""
        ix = self._indexes.get((topic, queue))
        return 0 if ix is None else ix.base + ix.first_index_at_or_after(phys)

    def release_index_memory(self, topic: str, queue: int, before: int) -> int:
        """Keep the index entries of ``topic``/``queue`` before offset ``before`` on disk
        only (:meth:`.index.QueueIndex.release_before`); returns how many."""
        ix = self._indexes.get((topic, queue))
        return 0 if ix is None else ix.release_before(before)

    def queue_end(self, topic: str, queue: int) -> int:
        ix = self._indexes.get((topic, queue))
        return ix.end if ix is not None else 0

    def queue_start(self, topic: str, queue: int) -> int:
        ix = self._indexes.get((topic, queue))
        return ix.base if ix is not None else 0

    def topics(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic, queue in self._indexes:
            out[topic] = max(out.get(topic, 0), queue + 1)
        return out

    # ---- flush & retention --------------------------------------------------------
    def needs_flush(self) -> bool:
        with self._lock:
            if self._max_phys <= self._flushed_phys:
                return False
            return (time.monotonic() - self._last_flush) * 1000 >= self.flush_policy.interval_ms

    def flush(self) -> None:
        """fdatasync what was written so far. Safe from a worker thread during appends."""
        with self._lock:
            target = self._max_phys
            fds = self._unsynced
            self._unsynced = []
            active = os.dup(self._write_fd) if self._write_fd >= 0 else -1
        try:
            for fd in fds:
                os.fdatasync(fd)
            if active >= 0:
                os.fdatasync(active)
        finally:
            for fd in fds:
                os.close(fd)
            if active >= 0:
                os.close(active)
        with self._lock:
            self._flushed_phys = max(self._flushed_phys, target)
            self._last_flush = time.monotonic()

    def flush_indexes(self) -> None:
        """fsync index files (derived data; call from the event-loop thread)."""
        for ix in self._indexes.values():
            ix.fsync()

    def segment_infos(self) -> list[SegmentInfo]:
        infos = []
        for base in self._segments:
            path = self._log_dir / _segment_name(base)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            infos.append(SegmentInfo(base, st.st_size, int(st.st_mtime * 1000)))
        return infos

    def apply_retention(self, now_ms: int, *, keep_from: int | None = None) -> int:
        """Delete the segments :func:`segments_to_delete` picks (keeping every segment
        from physical offset ``keep_from`` on); advance queue starts."""
        if self.retention.max_bytes is None and self.retention.max_age_s is None:
            return 0
        active_base = self._max_phys - self._max_phys % self.segment_bytes
        doomed = segments_to_delete(
            self.segment_infos(),
            retention=self.retention,
            now_ms=now_ms,
            active_base=active_base,
            active_empty=self._max_phys == active_base,
            keep_from=keep_from,
        )
        if not doomed:
            return 0
        new_min = doomed[-1] + self.segment_bytes
        for ix in self._indexes.values():
            ix.drop_before_phys(new_min)
        for base in doomed:
            fd = self._read_fds.pop(base, None)
            if fd is not None:
                os.close(fd)
            (self._log_dir / _segment_name(base)).unlink()
            self._segments.remove(base)
        fsync_dir(self._log_dir)
        self._min_phys = new_min
        return len(doomed)

    def close(self) -> None:
        with self._lock:
            fds = self._unsynced
            self._unsynced = []
            wfd, self._write_fd = self._write_fd, -1
        for fd in fds:
            os.fdatasync(fd)
            os.close(fd)
        if wfd >= 0:
            os.fdatasync(wfd)
            os.close(wfd)
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        for ix in self._indexes.values():
            ix.close()
        self._indexes.clear()
        self._unwritten.clear()

