"""Write the seed corpora, ``fuzz/corpus/<target>/<name>``: a handful of valid encodings
per target, from the codec's own encoders and a real master's log, so the fuzzer starts
from inputs that reach deep into each decoder. ``python -m fuzz.seeds`` rewrites them
(deterministic); the files are committed.
"""

from __future__ import annotations

import random
import shutil
import struct
import sys
import time
from pathlib import Path

from fuzz import targets as t
from fuzz.live import example_requests
from understudy_broker import protocol as p
from understudy_broker import scheduling as sch
from understudy_broker.replication import wire
from understudy_broker.storage.records import (
    EOF_MAGIC,
    EOF_MIN,
    Message,
    RecordTuple,
    encode_batch,
    encode_eof_marker,
    encode_record,
    record_size,
    segment_end,
)

CORPUS = Path(__file__).resolve().parent / "corpus"

#: Messages that fill more than one 4 KiB segment (an end-of-file marker and a roll).
MESSAGES: list[RecordTuple] = [
    ("t" if i % 3 else "orders", i % 2, None if i % 4 else b"key-%d" % i,
     bytes([65 + i]) * (100 + 90 * i), 1_700_000_000_000 + i)
    for i in range(12)
]


def _examples() -> list[tuple[p.Op, bytes]]:
    return example_requests("t", now_ms=1_700_000_000_000)


def _responses() -> dict[str, bytes]:
    route = p.RouteResponse(
        [p.GroupRoute("g1", [p.BrokerRoute("g1-0", "127.0.0.1:9000", "master", 3, 2)])],
        {"t": 2}, {"t": ["g1"]}, {"t": ["g1", None]}, 7, {"t": "g1"}, {"t": None})
    pulled = [p.PulledRecord(0, 1, None, b"a"), p.PulledRecord(1, 2, b"k", b"bb")]
    return {
        "response PULL": p.PullResponse(2, 0, 2, pulled).encode(),
        "response PULL_BATCH": p.encode_pull_batches(3, 0, 3, 1, [
            encode_batch(seq=0, queue_offset=0, messages=MESSAGES[:1] * 2),
            b"".join(encode_record(seq=2, queue_offset=2, message=Message(*MESSAGES[2]),
                                   topic_raw=b"orders"))]),
        "response PRODUCE": p.ProduceResponse([(0, 5), (1, 9)]).encode(),
        "response GET_ROUTE": route.encode(),
        "response COMMIT_OFFSET": p.OffsetsResponse({0: 3, 1: None}).encode(),
        "response QUEUE_STATS": p.QueueStatsResponse(
            "g1-0", "g1", {0: p.QueueStats(0, 4, {"cg": 2})}).encode(),
        "response MEMBER_HEARTBEAT": p.MemberHeartbeatResponse(
            3, [("t", 0)], [("t", 1)], "g1-0").encode(),
        "response HEARTBEAT": p.HeartbeatResponse("g1-0", "g1", "master", 3, 2, 4096).encode(),
    }


def _bodies() -> dict[str, bytes]:
    """Seeds of the ``bodies`` target: a decoder's index, then a body it accepts."""
    named: dict[str, bytes] = {f"request {op.name}": body for op, body in _examples()}
    named.update(_responses())
    named["decode_produce_full"] = p.encode_produce(
        "t", [(0, b"k", b"v"), (1, None, b"")], ("m", 1), [0, 5])
    named["decode_produce_batches"] = p.encode_produce_batches(
        "t", [(0, b"k", b"v"), (0, None, b""), (3, None, b"w")], ("m", 1), [0, 0, 5], (4, [0, 1, 0]))
    named["schedule record"] = sch.encode_entry(due_ms=5, topic="t", queue=1, payload=b"x")
    named["retry envelope"] = sch.encode_retry(sch.Retry(1, "t", 0, 9, b"body"))
    named["replication metadata"] = wire.encode_metadata(
        4096, {"topics": {"t": 2}, "offsets": {"cg": {"t": {"0": 1}}}})[wire.PUSH_HEADER.size:]
    named["replication hello"] = wire.encode_hello("g1-1")
    out = {}
    for name, body in named.items():
        out[name.replace(" ", "-").lower()] = bytes([t.decoder_index(name)]) + body
    for name, (decoder, body) in REGRESSIONS.items():
        out[f"regression-{name}"] = bytes([t.decoder_index(decoder)]) + body
    return out


#: Inputs that made a decoder fail before its fix (broker_image/tests/test_fuzz_findings.py).
REGRESSIONS: dict[str, tuple[str, bytes]] = {
    "metadata-digits": ("replication metadata", b'{"max_phys":' + b"9" * 5000 + b',"data":{}}'),
    "route-groups": ("response GET_ROUTE", b'{"groups":[],"topics":{"t":{"queues":1,"groups":5}}}'),
    "stats-queue-key": ("response QUEUE_STATS", b'{"broker":"b","group":"g","queues":'
                        b'{"x":{"start":0,"end":0,"committed":{}}}}'),
    "backsync-range": ("request BACKSYNC_OFFSETS", b'{"group":"g1","sender":"s","epoch":2,'
                       b'"offsets":{},"escaped":[[0,4611686018427387904]]}'),
}


def _dirty_marker(stream: bytes) -> bytes:
    """``stream`` with a byte of its first end-of-file marker's zero padding set."""
    at = stream.index(struct.pack(">I", EOF_MAGIC)) - 4 + EOF_MIN + 3
    return stream[:at] + b"\x5a" + stream[at + 1:]


def _frames() -> dict[str, bytes]:
    examples = _examples()
    frames = [p.encode_frame(request_id=i, op=op, body=body, epoch=i % 3)
              for i, (op, body) in enumerate(examples)]
    out = {f"frame-{op.name.lower()}-{i}": bytes([255, 7]) + f
           for i, ((op, _b), f) in enumerate(zip(examples, frames, strict=True))
           if i % 3 == 0}
    out["pipelined"] = bytes([255, 40]) + b"".join(frames[:6])
    out["response"] = bytes([255, 3]) + p.encode_error(
        request_id=9, op=p.Op.PULL, status=p.Status.NOT_MASTER, message="not master")
    out["small-limit"] = bytes([4, 1]) + frames[0] + frames[1]
    return out


def _push(stream: bytes, start: int = 0) -> bytes:
    return wire.PUSH_HEADER.pack(start, len(stream)) + stream


def _record_stream(messages: list[RecordTuple], segment_bytes: int = 4096) -> bytes:
    """The stream a broker from before batches wrote for ``messages`` (one record each):
    logs of that format are still read, so the walkers are fuzzed on both."""
    out = bytearray()
    ends: dict[tuple[str, int], int] = {}
    for seq, m in enumerate(messages):
        message = Message(*m)
        raw = message.topic.encode()
        size = record_size(topic_len=len(raw), key=message.key, body_len=len(message.body))
        seg_end = segment_end(len(out), segment_bytes)
        if len(out) + size + EOF_MIN > seg_end:
            out += encode_eof_marker(length=seg_end - len(out), next_seq=seq)
        qoff = ends.get((message.topic, message.queue), 0)
        ends[(message.topic, message.queue)] = qoff + 1
        out += b"".join(encode_record(seq=seq, queue_offset=qoff, message=message,
                                      topic_raw=raw))
    return bytes(out)


def _random(n: int, size: int, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"random-{i}": rng.randbytes(size) for i in range(n)}


def seeds() -> dict[str, dict[str, bytes]]:
    stream = t.master_stream(MESSAGES)
    metadata = wire.encode_metadata(len(stream), {"topics": {"t": 2, "orders": 2}})
    return {
        "frames": _frames(),
        "bodies": _bodies(),
        "json_bodies": _random(4, 48, 1),
        "replication": {
            "pushes": metadata + _push(stream[:700]) + _push(stream[700:]),
            "one-push": _push(stream[:2000]),
            "metadata": metadata,
        },
        "walk": {
            "segment-roll": bytes([63, 0]) + stream,
            "one-segment": bytes([63, 0]) + stream[:3000],
            "regression-marker-padding": bytes([63, 0]) + _dirty_marker(stream),
            "records-segment-roll": bytes([63, 0]) + _record_stream(MESSAGES),
        },
        "replicated": {
            "after-3": bytes([3]) + t.master_stream(t.PRELUDE + MESSAGES[:6], skip=3),
            "empty-log": bytes([0]) + stream,
            "regression-marker-padding": bytes([0]) + _dirty_marker(stream),
            "records-empty-log": bytes([0]) + _record_stream(MESSAGES),
        },
        "replicated_structured": _random(4, 256, 2),
    }


def main() -> None:
    started = time.monotonic()
    total = 0
    for target, files in seeds().items():
        assert target in t.TARGETS, target
        folder = CORPUS / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
            total += len(data)
        print(f"{target}: {len(files)} seeds", file=sys.stderr)
    print(f"{total} bytes in {time.monotonic() - started:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
