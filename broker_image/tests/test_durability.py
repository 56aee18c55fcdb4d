"""The one group commit and the one atomic replace, without a broker: what a caller that
waits for durability can rely on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from understudy_broker.storage.durability import GroupCommit, durable_replace, write_all


class Flushes:
    """A flush the test controls: records the mark each flush covered, may fail."""

    def __init__(self) -> None:
        self.mark = 0
        self.covered: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()
        self.fail: OSError | None = None

    async def flush(self) -> None:
        at_start = self.mark
        self.started.set()
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.covered.append(at_start)


async def test_one_flush_serves_every_waiter_that_arrived_before_it_began() -> None:
    f = Flushes()
    gc = GroupCommit(f.flush, mark=lambda: f.mark)
    f.gate.clear()
    f.mark = 1
    first = asyncio.create_task(gc.durable())
    await f.started.wait()  # the first flush has begun (and blocks), covering mark 1
    f.mark = 5  # four more changes while it runs
    waiters = [asyncio.create_task(gc.durable(m)) for m in (2, 3, 4, 5)]
    await asyncio.sleep(0)
    f.gate.set()
    await asyncio.gather(first, *waiters)
    # The first flush covered 1; the four later waiters share one more flush.
    assert f.covered == [1, 5]
    assert gc.flushed == 5
    assert gc.flushes == 2


async def test_a_waiter_already_covered_returns_without_a_flush() -> None:
    f = Flushes()
    gc = GroupCommit(f.flush, mark=lambda: f.mark, flushed=7)
    f.mark = 7
    assert await gc.durable() == 7
    assert f.covered == []
    assert not gc.pending


async def test_a_failed_flush_raises_oserror_in_every_waiter_and_the_next_one_retries() -> None:
    f = Flushes()
    gc = GroupCommit(f.flush, mark=lambda: f.mark)
    f.mark = 3
    f.fail = OSError(28, "No space left on device")
    results = await asyncio.gather(gc.durable(1), gc.durable(3), return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results)  # storage raises no protocol status
    assert gc.flushed == 0
    f.fail = None
    assert await gc.durable() == 3


async def test_a_cancelled_waiter_does_not_cancel_the_flush() -> None:
    f = Flushes()
    gc = GroupCommit(f.flush, mark=lambda: f.mark)
    f.mark = 1
    f.gate.clear()
    quitter = asyncio.create_task(gc.durable())
    stayer = asyncio.create_task(gc.durable())
    await f.started.wait()
    quitter.cancel()
    f.gate.set()
    assert await stayer == 1
    assert f.covered == [1]


def test_durable_replace_leaves_the_new_content_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    durable_replace(target, b"new" * 100_000)
    assert target.read_bytes() == b"new" * 100_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_write_all_writes_every_byte_across_short_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write

    def short(fd: int, data: bytes | memoryview) -> int:
        return real(fd, bytes(data)[:7])  # the kernel may write less than asked

    monkeypatch.setattr(os, "write", short)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_all(fd, b"0123456789" * 10)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"0123456789" * 10
