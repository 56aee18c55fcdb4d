"""The log's own cost per message, in one process (no sockets, no other servers).

Appends ``--requests`` requests of ``--batch`` messages of ``--size`` bytes spread over
``--queues`` queues to a master's ``CommitLog``, copies the master's bytes into a slave's
log with ``append_replicated`` (one push per request, as the replication link does), and
reads every queue back from the slave; then the same requests as a producer sends them
in batch form (PRODUCE_BATCH: packed batches, appended as they came) to another log, and
the slave's queues read as stored items (PULL_BATCH: checked, not decoded). Prints the CPU
time per message of each (``time.thread_time``, the minimum of ``--repeat`` runs: on a
shared machine the minimum is the figure least moved by others' work) and writes
``bench-results/logpath.json`` (``master_append_us_per_msg``, ``slave_append_us_per_msg``,
``read_us_per_msg``, ``master_packed_append_us_per_msg``, ``read_items_us_per_msg``).

The figure to compare before and after a change of the storage hot paths
(docs/perf-notes.md); ``bench/broker.py`` gives the same paths end to end, with the
protocol, replication and fsyncs around them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from understudy_broker.checksum import crc32
from understudy_broker.storage.commitlog import CommitLog, FlushPolicy
from understudy_broker.storage.records import PackedBatch, RecordTuple, encode_records


def packed(request: list[RecordTuple]) -> list[PackedBatch]:
    """A request as a producer sends it in batch form: one packed batch per queue."""
    by_queue: dict[int, list[RecordTuple]] = {}
    for m in request:
        by_queue.setdefault(m[1], []).append(m)
    out = []
    for queue, ms in by_queue.items():
        section = encode_records([(key, body, 0) for _t, _q, key, body, _ts in ms])
        out.append(PackedBatch(ms[0][0], queue, section, len(ms), ms[0][4], crc32(section)))
    return out


def run_once(requests: list[list[RecordTuple]], queues: int
             ) -> tuple[float, float, float, float, float]:
    """CPU seconds of the master's appends, the slave's appends, the reads (messages),
    the master's appends of packed batches and the reads of stored items."""
    with tempfile.TemporaryDirectory(prefix="understudy-bench-logpath.") as tmp:
        flush = FlushPolicy(mode="interval")
        master = CommitLog.open(Path(tmp) / "m", flush=flush)
        slave = CommitLog.open(Path(tmp) / "s", flush=flush)
        batched = CommitLog.open(Path(tmp) / "b", flush=flush)
        try:
            ready = [packed(request) for request in requests]
            t = time.thread_time()
            for request in ready:
                batched.append(request)
            packed_append = time.thread_time() - t
            t0 = time.thread_time()
            spans = [master.append(request) for request in requests]
            t1 = time.thread_time()
            pushes = [(s.start_phys, master.read_raw(s.start_phys, s.end_phys - s.start_phys))
                      for s in spans]
            t2 = time.thread_time()
            for start, data in pushes:
                slave.append_replicated(start, data)
            t3 = time.thread_time()
            read = 0
            for q in range(queues):
                offset = 0
                while got := slave.read("bench", q, offset, max_bytes=1 << 20,
                                        max_records=4096):
                    read += len(got)
                    offset = got[-1].queue_offset + 1
            t4 = time.thread_time()
            if read != sum(len(r) for r in requests):
                raise SystemExit(f"read back {read} messages of {sum(map(len, requests))}")
            held = 0
            for q in range(queues):
                offset = 0
                while items := slave.read_items("bench", q, offset, max_bytes=1 << 20,
                                                max_records=4096):
                    held += items[-1].end - offset
                    offset = items[-1].end
            t5 = time.thread_time()
            if held != read:
                raise SystemExit(f"stored items held {held} messages of {read}")
        finally:
            master.close()
            slave.close()
            batched.close()
    return t1 - t0, t3 - t2, t4 - t3, packed_append, t5 - t4


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128, help="messages per request")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench-results/logpath.json")
    args = ap.parse_args(argv)
    body = os.urandom(args.size)
    now = int(time.time() * 1000)
    # Round-robin over the queues, as the Producer spreads a batch without keys.
    requests: list[list[RecordTuple]] = [
        [("bench", i % args.queues, None, body, now + r) for i in range(args.batch)]
        for r in range(args.requests)]
    n = args.requests * args.batch
    runs = [run_once(requests, args.queues) for _ in range(args.repeat)]
    best = [min(run[k] for run in runs) / n * 1e6 for k in range(5)]
    result = {
        "messages": n, "batch": args.batch, "queues": args.queues, "size": args.size,
        "repeat": args.repeat,
        "master_append_us_per_msg": round(best[0], 2),
        "slave_append_us_per_msg": round(best[1], 2),
        "read_us_per_msg": round(best[2], 2),
        "master_packed_append_us_per_msg": round(best[3], 2),
        "read_items_us_per_msg": round(best[4], 2),
        "load_average": os.getloadavg()[0],
    }
    print(f"{n} messages of {args.size} B, {args.batch} a request over {args.queues} queues "
          f"(min of {args.repeat}): master append {best[0]:.2f} us/msg (packed by the "
          f"producer: {best[3]:.2f}), slave append {best[1]:.2f} us/msg, read "
          f"{best[2]:.2f} us/msg (stored items: {best[4]:.2f}); "
          f"load {result['load_average']:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
