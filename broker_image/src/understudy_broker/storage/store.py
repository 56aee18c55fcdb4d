"""One broker's data directory, opened: the commit log, consumer offsets and topics, and the
group commits that make them durable.

Why this module exists: the server needs three stores that are opened, recovered, flushed
and closed together, and whose durability rules (a produce is acknowledged after its
bytes are flushed, a commit after the offsets file is) must be applied the same way on
every path. :class:`Store` is that unit; it knows nothing of requests or replication.

Layout of the data directory::

    commitlog/<base offset>    segments (:mod:`.commitlog`)
    commitlog/recovery-point   where the next recovery starts scanning (:mod:`.commitlog`)
    index/<topic>/<queue>      per-queue indexes (:mod:`.index`)
    offsets.json               committed consumer offsets (:mod:`.offsets`)
    topics.json                topic -> queue count (:mod:`.topics`)
    permissions.jsonl          the permission-change log (written by the broker, not here)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from understudy_broker.storage.commitlog import (
    CommitLog,
    DamagedRecordError,
    FlushPolicy,
    Retention,
)
from understudy_broker.storage.durability import GroupCommit, set_aside
from understudy_broker.storage.index import DEFAULT_INDEX_OPEN_FILES
from understudy_broker.storage.offsets import (
    COMMITS_TOPIC,
    RESERVED_PREFIX,
    OffsetStore,
    OffsetStoreCorruptError,
    decode_commit_record,
)
from understudy_broker.storage.topics import TopicRegistry

log = logging.getLogger(__name__)

# How often the recovery point follows the log: a restart after kill -9 re-reads at most
# about this long of writes (plus what the flush interval left unsynced).
RECOVERY_POINT_INTERVAL_S = 1.0
#: Index files written between two looks at the event loop before a recovery mark: at
#: most ~4 ms of writes a step. With 10k queues written in a second, writing them in one
#: go held the loop for 95-102 ms (in-process, 512 index files open).
INDEX_WRITES_PER_STEP = 256


class Store:
    """Open with :meth:`open`, close with :meth:`close`.

    ``flush_before_ack`` (``--flush batch``): :meth:`log_durable` waits for an fdatasync
    covering the write (group commit: one fdatasync, run in a worker thread, covers every
    batch appended before it began). Otherwise the log is flushed every
    ``flush_interval_ms`` by :meth:`run_interval_flush` and :meth:`log_durable` returns at
    once (a crash may lose the last interval of acknowledged writes).
    """

    def __init__(
        self,
        log_: CommitLog,
        offsets: OffsetStore,
        topics: TopicRegistry,
        *,
        flush_before_ack: bool,
        on_log_flush: Callable[[float], None],
    ) -> None:
        self.log = log_
        self.offsets = offsets
        self.topics = topics
        self.flush_before_ack = flush_before_ack
        self._on_log_flush = on_log_flush
        self.log_commit = GroupCommit(self._flush_log, mark=lambda: log_.max_phys,
                                      flushed=log_.max_phys)
        self.offsets_commit = GroupCommit(offsets.persist_async, mark=lambda: offsets.version,
                                          flushed=offsets.version)
        self._commits_applied = 0  # next COMMITS_TOPIC offset apply_commit_records reads

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        segment_bytes: int,
        flush: FlushPolicy,
        retention: Retention,
        flush_before_ack: bool,
        on_log_flush: Callable[[float], None] = lambda _s: None,
        on_damaged_record: Callable[[DamagedRecordError], None] = lambda _e: None,
        index_open_files: int = DEFAULT_INDEX_OPEN_FILES,
    ) -> Store:
        """Open (and recover) the log, then the offsets and topics. Topics seen in the log
        but missing from the registry (a crash between the two) are re-registered so their
        data stays addressable. An offsets file that is unreadable is set aside and the
        offsets are rebuilt from the commit records in the log (docs/storage-and-replication.md,
        "Corruption"); so are they when the file is missing. ``on_damaged_record`` is
        called once per damaged record a read comes across (it is logged here)."""
        directory.mkdir(parents=True, exist_ok=True)

        def damaged(err: DamagedRecordError) -> None:
            log.error("damaged record, not served: %s. Readers skip it by reading from "
                      "offset %d (docs/storage-and-replication.md, \"Corruption\")",
                      err, err.offset + 1)
            on_damaged_record(err)

        log_ = CommitLog.open(directory, segment_bytes=segment_bytes, flush=flush,
                              retention=retention, on_damaged=damaged,
                              index_open_files=index_open_files)
        try:
            rec = log_.recovery
            if rec.truncated_bytes or rec.indexes_rebuilt:
                log.warning("recovered the log: truncated %d torn bytes, rebuilt %d indexes",
                            rec.truncated_bytes, rec.indexes_rebuilt)
            for problem in rec.index_problems:
                log.warning("index repaired from the log: %s", problem)
            if rec.indexes_extended:
                log.info("added the entries written after the last recovery point to %d "
                         "indexes", rec.indexes_extended)
            if rec.recovery_point.startswith("ignored"):
                log.warning("recovery point %s; scanned the last segments instead",
                            rec.recovery_point)
            log.info("opened the log: scanned %d items from offset %d (recovery point: %s)",
                     rec.records_scanned, rec.scanned_from, rec.recovery_point)
            offsets_path = directory / "offsets.json"
            rebuild = not offsets_path.exists()
            try:
                offsets = OffsetStore.open(offsets_path)
            except OffsetStoreCorruptError as exc:
                moved = set_aside(offsets_path)
                log.error("corrupt consumer-offset file %s: %s; moved to %s, rebuilding the "
                          "offsets from the commit records in the log", exc.path, exc.reason,
                          moved)
                offsets = OffsetStore.open(offsets_path)
                rebuild = True
            topics = TopicRegistry(directory / "topics.json")
            topics.merge({t: n for t, n in log_.topics().items()
                          if not t.startswith(RESERVED_PREFIX)})
            store = cls(log_, offsets, topics, flush_before_ack=flush_before_ack,
                        on_log_flush=on_log_flush)
            if rebuild and (applied := store.apply_commit_records()):
                offsets.persist()
                log.warning("consumer offsets of %d group(s) rebuilt from %d commit records "
                            "in the log", len(offsets.snapshot()), applied)
        except BaseException:
            log_.close()
            raise
        return store

    def apply_commit_records(self) -> int:
        """Apply the consumer commits recorded in the log (:data:`.offsets.COMMITS_TOPIC`)
        since the last call: maximum per key, so a replay is harmless. A damaged record
        is skipped (reported by the log). Returns the records applied."""
        lg = self.log
        end = lg.queue_end(COMMITS_TOPIC, 0)
        pos = max(self._commits_applied, lg.queue_start(COMMITS_TOPIC, 0))
        applied = 0
        while pos < end:
            try:
                records = lg.read(COMMITS_TOPIC, 0, pos, max_bytes=1 << 20, max_records=4096)
            except DamagedRecordError as exc:
                pos = exc.offset + 1
                continue
            if not records:
                break
            for rec in records:
                try:
                    self.offsets.merge(decode_commit_record(rec.body))
                    applied += 1
                except ValueError as exc:
                    log.error("skipping a malformed commit record at offset %d: %s",
                              rec.queue_offset, exc)
            pos = records[-1].queue_offset + 1
        self._commits_applied = pos
        return applied

    async def _flush_log(self) -> None:
        started = time.monotonic()
        await asyncio.to_thread(self.log.flush)
        self._on_log_flush(time.monotonic() - started)

    async def log_durable(self, end_phys: int) -> None:
        """Return once the log up to ``end_phys`` may be acknowledged (see the class
        docstring); raises ``OSError`` when the flush fails."""
        if self.flush_before_ack:
            await self.log_commit.durable(end_phys)

    async def offsets_durable(self) -> None:
        """Return once every offset change made so far is on disk; raises ``OSError``."""
        await self.offsets_commit.durable()

    async def run_interval_flush(self, interval_s: float) -> None:
        """The ``--flush interval`` flusher: fdatasync the log when something was written
        and the interval passed. Runs until cancelled; a failed flush is logged."""
        while True:
            await asyncio.sleep(interval_s)
            if not self.log.needs_flush():
                continue
            try:
                await self.log_commit.durable()
            except OSError as exc:
                log.error("flush failed: %s", exc)

    async def run_recovery_points(self, interval_s: float = RECOVERY_POINT_INTERVAL_S) -> None:
        """Every ``interval_s`` the log grew: make it durable up to where it stands (through
        the group commit, so flushes never overlap) and record that as the recovery point.
        Runs until cancelled; a failure is logged and the old point stays (it only makes
        the next recovery scan more)."""
        written = -1
        while True:
            await asyncio.sleep(interval_s)
            try:
                while True:  # the indexes' waiting entries first, a step at a time
                    if self.log.write_pending_indexes(INDEX_WRITES_PER_STEP):
                        break
                    await asyncio.sleep(0)  # requests run between the steps
                mark = self.log.recovery_mark()  # and what the last step left
                if mark.phys == written:
                    continue
                await self.log_commit.durable(mark.phys)
                await asyncio.to_thread(self.log.write_recovery_point, mark)
            except OSError as exc:
                log.error("writing the recovery point failed: %s", exc)
                continue
            written = mark.phys

    def close(self) -> None:
        """Flush the log and its indexes, record the recovery point (a clean restart scans
        nothing) and close every file (blocking)."""
        self.log.flush()
        self.log.flush_indexes()
        try:
            self.log.write_recovery_point(self.log.recovery_mark())
        except OSError as exc:
            log.error("writing the recovery point at close failed: %s", exc)
        self.log.close()
