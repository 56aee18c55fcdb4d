"""Bounded fuzz runs in the suite (docs/fuzzing.md): every atheris target for a few
seconds, and a live broker process fed a few thousand fuzzed frames over TCP. ``make
fuzz`` runs the same for longer.

Environment: ``UNDERSTUDY_FUZZ_SECONDS`` (per atheris target, default 1),
``UNDERSTUDY_FUZZ_LIVE_SECONDS`` and ``UNDERSTUDY_FUZZ_LIVE_FRAMES`` (the live run's
bounds, default 10 s and 20000 frames), ``UNDERSTUDY_FUZZ_SEED`` (the live run's seed,
random by default and printed on failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
from pathlib import Path
from typing import Any

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import Producer, create_topic, request_once
from understudy_broker.storage.records import decode_item, walk
from understudy_harness.testing import load_script

ROOT = Path(__file__).resolve().parents[1]
campaign = load_script(ROOT / "fuzz" / "campaign.py", "fuzz_campaign")
live = load_script(ROOT / "fuzz" / "live.py", "fuzz_live")

SECONDS = float(os.environ.get("UNDERSTUDY_FUZZ_SECONDS", "1"))
LIVE_SECONDS = float(os.environ.get("UNDERSTUDY_FUZZ_LIVE_SECONDS", "10"))
LIVE_FRAMES = int(os.environ.get("UNDERSTUDY_FUZZ_LIVE_FRAMES", "20000"))

pytestmark = pytest.mark.fuzz


@pytest.mark.parametrize("target", campaign.target_names())
def test_target_keeps_its_properties(target: str, tmp_path: Path) -> None:
    """The committed seeds, then ``SECONDS`` of coverage-guided inputs: no crash, no
    out-of-memory, no input running over libFuzzer's timeout."""
    outcome = campaign.run_target(target, tmp_path / target, seconds=SECONDS,
                                  timeout_s=SECONDS + 120)
    assert outcome.ok, f"{outcome.summary()}\n{outcome.output[-8000:]}"
    assert outcome.runs


# ------------------------------------------------------------------ a live broker

TOPIC = "fz"
SEGMENT = 64 << 20  # the broker's default --segment-bytes
MiB = 1 << 20
AS_LIMIT = 4 << 30  # the broker's address space (it uses a few hundred MiB of it)


def _status(pid: int, field: str) -> int:
    """A size from /proc/PID/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def _rss(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS``)."""
    return _status(pid, "VmRSS")


async def _send_valid(address: str, prefix: bytes, n: int) -> dict[tuple[int, int], bytes]:
    """``n`` messages through the producer; ``(queue, offset) -> body``."""
    async with Producer([address]) as prod:
        futures = [(b"%s-%d" % (prefix, i), await prod.send(TOPIC, b"%s-%d" % (prefix, i)))
                   for i in range(n)]
        await prod.flush()
    return {await fut: body for body, fut in futures}


async def _pulled(address: str, queue: int, offset: int) -> bytes:
    frame = await request_once(address, p.Op.PULL,
                               p.PullRequest(TOPIC, queue, offset, 1024, 0).encode())
    assert frame.status == p.Status.OK, p.error_message(frame)
    records = p.PullResponse.decode(frame.body).records
    assert records, f"nothing at {TOPIC}/{queue}@{offset}"
    assert records[0].offset == offset
    return records[0].body


async def _announce_and_hold(address: str, lengths: list[int]) -> list[asyncio.StreamWriter]:
    """One connection per length, each sending a header announcing that many body bytes
    and a few of them; the connections are left open."""
    host, port = address.rsplit(":", 1)
    writers = []
    for i, length in enumerate(lengths):
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(live.announcing(length, rid=i) + b"\x00" * 100)
        await writer.drain()
        writers.append(writer)
    await asyncio.sleep(0.5)  # the broker reads what arrived
    return writers


async def _close(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _stored(data_dir: Path) -> list[tuple[str, int, bytes | None, bytes]]:
    """Every message of the broker's log, walked with the one walker: the whole log must
    be valid batches (or records) and markers."""
    out = []
    for path in sorted((data_dir / "commitlog").iterdir()):
        if not path.name.isdigit():
            continue
        base = int(path.name)
        data = memoryview(path.read_bytes())
        w = walk(data, start_phys=base, segment_bytes=SEGMENT)
        assert w.error is None, f"{path}: {w.error}"
        assert w.valid_end == base + len(data), f"{path}: a torn item at {w.valid_end}"
        for phys, _size, is_marker, *_ in w.items:
            if not is_marker:
                _head, records, _used = decode_item(data, phys - base, phys)
                out += [(r.topic, r.queue, r.key, r.body) for r in records]
    return out


@pytest.mark.integration
async def test_a_live_broker_survives_fuzzed_frames(brokers: Any) -> None:
    """A broker fed thousands of mutated, truncated and hostile frames over hundreds of
    connections stays up, answers every malformed request with a clear status (never
    INTERNAL), allocates nothing for sizes it is merely announced, still takes and serves
    a valid produce, and holds in its log only valid records that a well-formed PRODUCE
    sent."""
    seed = int(os.environ.get("UNDERSTUDY_FUZZ_SEED", random.randrange(1 << 32)))
    broker = brokers.master("fuzzed", extra=["--async"])
    # A broker allocating what it is announced fails its request (INTERNAL, asserted
    # below) instead of taking the machine's memory.
    resource.prlimit(broker.pid, resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    address = broker.address
    await create_topic([address], topic=TOPIC, queues=4)
    before = await _send_valid(address, b"valid", 200)
    rss_start = _rss(broker.pid)

    # Headers announcing 16 MiB (the limit) and 2 GiB, with 100 bytes each: the first
    # are waited on, the second refused; neither is allocated.
    allowed = p.DEFAULT_MAX_FRAME_BYTES - p.HEADER_SIZE
    held = await _announce_and_hold(address, [allowed] * 24 + [2**31] * 8)
    try:
        held_growth = _rss(broker.pid) - rss_start
        assert held_growth < 48 * MiB, (
            f"RSS grew {held_growth / MiB:.0f} MiB holding 24 frames announced at 16 MiB each")
    finally:
        await _close(held)

    report = await live.hammer(address, topic=TOPIC, seconds=LIVE_SECONDS, frames=LIVE_FRAMES,
                               seed=seed)
    context = (f"seed {seed} (UNDERSTUDY_FUZZ_SEED={seed} reproduces it): {report.frames} "
               f"frames on {report.connections} connections in {report.seconds:.1f}s; "
               f"answers {dict(report.statuses)}; kinds {dict(report.kinds)}")
    print(context)
    assert broker.poll() is None, f"the broker died; {context}\n{broker.log()[-4000:]}"
    assert not report.internal, f"INTERNAL answers {report.internal[:5]}; {context}"
    assert "Traceback" not in broker.log(), f"{context}\n{broker.log()[-4000:]}"
    assert report.frames >= min(LIVE_FRAMES, 500), context
    assert not report.refused, f"{report.refused} connections refused; {context}"

    after = await _send_valid(address, b"after", 20)
    for (queue, offset), body in after.items():
        assert await _pulled(address, queue, offset) == body, context
    grown = _rss(broker.pid) - rss_start
    print(f"VmSize {_status(broker.pid, 'VmSize') / MiB:.0f} MiB; "
          f"RSS {rss_start / MiB:.0f} MiB at the start, +{held_growth / MiB:.1f} MiB holding "
          f"the announced frames, +{grown / MiB:.1f} MiB at the end")
    assert grown < 128 * MiB, f"RSS grew {grown / MiB:.0f} MiB; {context}"

    broker.stop()  # a quiet log to walk
    sent = {(TOPIC, q, None, body) for (q, _o), body in {**before, **after}.items()}
    stored = [live.stored_sent(*r) for r in _stored(broker.data_dir)]
    unexpected = {r for r in stored if r is not None} - sent - report.possible
    assert not unexpected, f"records no well-formed PRODUCE sent: {sorted(unexpected)[:5]}"
    assert sent <= set(stored), f"valid records missing: {sorted(sent - set(stored))[:5]}"
