"""The readable end (server/readable.py) as a pure unit: what it waits for before a record
may be read, and whom it wakes (a queue's readable end in the log:
test_commitlog.py's queue_offset_at test)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

import pytest

from understudy_broker import protocol as p
from understudy_broker.server.errors import RequestError
from understudy_broker.server.readable import Key, ReadableEnd
from understudy_harness.testing import eventually


class Log:
    """A log end that grows, and acknowledgements the test releases by hand."""

    def __init__(self) -> None:
        self.end = 100
        self.asked: list[int] = []
        self.gate: asyncio.Event = asyncio.Event()
        self.refuse = 0  # refuse this many acknowledgements first

    async def acknowledged(self, end: int, _start: int) -> None:
        self.asked.append(end)
        if self.refuse:
            self.refuse -= 1
            raise RequestError(p.Status.NOT_ENOUGH_REPLICAS, "no slave in sync")
        await self.gate.wait()


def make(log: Log, woken: list[set[Key]], *, immediate: bool = False) -> ReadableEnd:
    def wake(keys: Iterable[Key]) -> None:
        woken.append(set(keys))
    return ReadableEnd(log_end=lambda: log.end, acknowledged=log.acknowledged, wake=wake,
                       immediate=immediate, retry_min_s=0.001, retry_max_s=0.002)


@contextlib.asynccontextmanager
async def running(r: ReadableEnd) -> AsyncIterator[None]:
    task = asyncio.create_task(r.run())
    try:
        yield
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_master_makes_appends_readable_only_once_acknowledged() -> None:
    log = Log()
    woken: list[set[Key]] = []
    r = make(log, woken)
    assert r.phys == 100  # what the log held at start is readable
    async with running(r):
        log.end = 150
        r.appended(150, [("t", 0)])
        log.end = 180
        r.appended(180, [("t", 1)])
        await eventually(lambda: log.asked, "the acknowledgement is waited for")
        assert r.phys == 100  # appended, not acknowledged: not readable
        assert woken == []
        log.gate.set()
        await eventually(lambda: r.phys == 180, "readable up to the log end")
        assert set().union(*woken) == {("t", 0), ("t", 1)}  # both queues' readers woken


async def test_a_refused_acknowledgement_keeps_the_records_unreadable_until_one_passes() -> None:
    log = Log()
    woken: list[set[Key]] = []
    log.refuse = 3
    log.gate.set()
    r = make(log, woken)
    async with running(r):
        log.end = 120
        r.appended(120, [("t", 0)])
        await eventually(lambda: r.phys == 120, "readable after the refusals")
        assert log.asked == [120, 120, 120, 120]  # tried again after each refusal
        assert woken == [{("t", 0)}]


async def test_a_slave_reads_to_its_log_end_and_wakes_at_once() -> None:
    log = Log()
    woken: list[set[Key]] = []
    r = make(log, woken, immediate=True)
    log.end = 400
    r.appended(400, [("t", 2)])
    assert r.phys == 400
    assert woken == [{("t", 2)}]
    assert log.asked == []


async def test_a_produces_acknowledgement_makes_its_records_readable_at_once() -> None:
    """The task is still waiting (or backing off): the produce's acknowledgement, which
    waited the same things, moves the readable end to that produce's end and no further."""
    log = Log()
    woken: list[set[Key]] = []
    r = make(log, woken)
    async with running(r):
        log.end = 150
        r.appended(150, [("t", 0)])
        log.end = 180
        r.appended(180, [("t", 1)])
        await eventually(lambda: log.asked, "the task waits")
        r.acknowledged(150)
        assert r.phys == 150
        assert woken == [{("t", 0)}]  # queue 1's append is past it: not yet
        r.acknowledged(120)  # an older acknowledgement never moves it back
        assert r.phys == 150
        log.gate.set()
        await eventually(lambda: r.phys == 180, "the task takes it the rest of the way")
        assert woken == [{("t", 0)}, {("t", 1)}]
