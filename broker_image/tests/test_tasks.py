"""Stopping background tasks never swallows the caller's cancellation, and a task that
lost its cancellation is cancelled again (pure asyncio, no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from understudy_broker.tasks import stop_tasks


async def test_stop_tasks_cancels_and_retrieves_errors() -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def fails() -> None:
        raise ConnectionError("broker died")

    a = asyncio.create_task(forever())
    b = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await stop_tasks([a, b])
    assert a.cancelled()
    assert isinstance(b.exception(), ConnectionError)


async def test_a_timeout_around_close_is_honoured_even_if_a_task_lingers() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        # Finishes its cleanup only when released: a task that takes a while to stop.
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()
            raise

    t = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await stop_tasks([t])
    release.set()
    await asyncio.wait([t])
    assert t.cancelled()


async def test_a_task_that_swallowed_its_cancellation_is_cancelled_again() -> None:
    """On Python 3.11 ``asyncio.wait_for`` can lose a cancellation; the task then runs on
    after one ``cancel()``. ``stop_tasks`` cancels it again instead of waiting forever."""
    seen = 0

    async def swallows_once() -> None:
        nonlocal seen
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen += 1
                if seen >= 2:
                    raise

    t = asyncio.create_task(swallows_once())
    await asyncio.sleep(0)
    await stop_tasks([t], recancel_after_s=0.05)
    assert t.cancelled()
    assert seen == 2
