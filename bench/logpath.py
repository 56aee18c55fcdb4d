"""The log's own cost per message, in one process (no sockets, no other servers).

Appends ``--requests`` requests of ``--batch`` messages of ``--size`` bytes spread over
``--queues`` queues to a master's ``CommitLog``, copies the master's bytes into a slave's
log with ``append_replicated`` (one push per request, as the replication link does), and
reads every queue back from the slave. Prints the CPU time per message of each of the
three (``time.thread_time``, the minimum of ``--repeat`` runs: on a shared machine the
minimum is the figure least moved by others' work) and writes ``bench-results/logpath.json``
(``master_append_us_per_msg``, ``slave_append_us_per_msg``, ``read_us_per_msg``).

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

from understudy_broker.storage.commitlog import CommitLog, FlushPolicy
from understudy_broker.storage.records import RecordTuple


def run_once(requests: list[list[RecordTuple]], queues: int) -> tuple[float, float, float]:
    """CPU seconds of the master's appends, the slave's appends and the reads."""
    with tempfile.TemporaryDirectory(prefix="understudy-bench-logpath.") as tmp:
        flush = FlushPolicy(mode="interval")
        master = CommitLog.open(Path(tmp) / "m", flush=flush)
        slave = CommitLog.open(Path(tmp) / "s", flush=flush)
        try:
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
        finally:
            master.close()
            slave.close()
    return t1 - t0, t3 - t2, t4 - t3


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
    best = [min(run[k] for run in runs) / n * 1e6 for k in range(3)]
    result = {
        "messages": n, "batch": args.batch, "queues": args.queues, "size": args.size,
        "repeat": args.repeat,
        "master_append_us_per_msg": round(best[0], 2),
        "slave_append_us_per_msg": round(best[1], 2),
        "read_us_per_msg": round(best[2], 2),
        "load_average": os.getloadavg()[0],
    }
    print(f"{n} messages of {args.size} B, {args.batch} a request over {args.queues} queues "
          f"(min of {args.repeat}): master append {best[0]:.2f} us/msg, slave append "
          f"{best[1]:.2f} us/msg, read {best[2]:.2f} us/msg; load {result['load_average']:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
