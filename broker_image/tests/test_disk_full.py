"""A full disk: a refused append leaves the log and every per-queue index as they were
(real ENOSPC from a small tmpfs; the tests skip where the machine refuses the mount)."""

from __future__ import annotations

from pathlib import Path

import pytest

from understudy_broker.storage.commitlog import CommitLog, FlushPolicy
from understudy_harness.testing import SmallDisk

QUEUES = 64
SEGMENT = 256 << 10


def fill(log: CommitLog, sent: dict[tuple[str, int], list[bytes]], ballast: Path | None,
         *, refusals_wanted: int = 40) -> int:
    """Append small batches over many queues until the disk refuses; then free the
    ballast and go on with batches that each also write a new topic, until the disk has
    refused ``refusals_wanted`` batches. Returns the refusals seen.

    Why the ballast: the first refusal is nearly always the log's own write (it grows
    fastest). With a few pages freed after it, most of them go to new topics' index
    files, so later refusals come from an index while an earlier queue of the same batch
    was already indexed: the case where log and indexes used to part ways."""
    refusals = 0
    for n in range(200_000):
        if refusals:
            batch = [("t", n % QUEUES, None, b"a%d" % n, n), (f"new-{n}", 0, None, b"b", n)]
        else:
            batch = [("t", (n * 7 + i) % QUEUES, None, b"m%d.%d" % (n, i) * (1 + n % 3), n)
                     for i in range(1 + n % 4)]
        try:
            log.append(batch)
        except OSError:
            if ballast is not None and not refusals:
                ballast.unlink()
            refusals += 1
            if refusals >= refusals_wanted:
                return refusals
            continue
        for topic, q, _k, body, _ts in batch:
            sent.setdefault((topic, q), []).append(body)
        if ballast is None and n > 200:
            return refusals
    raise AssertionError("the disk never filled")


def read_queue(log: CommitLog, topic: str, queue: int) -> list[bytes]:
    out: list[bytes] = []
    offset = log.queue_start(topic, queue)
    while True:
        got = log.read(topic, queue, offset, max_bytes=1 << 20, max_records=100)
        if not got:
            return out
        out.extend(r.body for r in got)
        offset = got[-1].queue_offset + 1


def assert_all_readable(log: CommitLog, sent: dict[tuple[str, int], list[bytes]],
                        when: str) -> None:
    for (topic, q), bodies in sent.items():
        assert read_queue(log, topic, q) == bodies, f"{topic}/{q} {when}"


@pytest.mark.parametrize("mode", ["batch", "interval"])
def test_refused_appends_leave_log_and_indexes_consistent(small_disk: SmallDisk,
                                                          mode: str) -> None:
    root = small_disk.mount(1 << 20)
    ballast = root / "ballast"
    ballast.write_bytes(b"z" * (64 << 10))
    log = CommitLog.open(root / "data", segment_bytes=SEGMENT, flush=FlushPolicy(mode=mode))
    sent: dict[tuple[str, int], list[bytes]] = {}
    try:
        assert fill(log, sent, ballast) > 1
        assert log.flushed_phys <= log.max_phys  # no sync is claimed for discarded bytes
        assert_all_readable(log, sent, "after refusals")
        # Space returns: appends go on where they stopped, nothing lost or reused.
        small_disk.resize(8 << 20)
        assert fill(log, sent, None) == 0
        assert_all_readable(log, sent, "after space returned")
    finally:
        log.close()
    reopened = CommitLog.open(root / "data", segment_bytes=SEGMENT)
    try:
        assert_all_readable(reopened, sent, "after a restart")
    finally:
        reopened.close()
