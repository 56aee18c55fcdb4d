"""Closing a client never swallows the caller's cancellation (pure asyncio, no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from understudy_broker.client import stop_tasks


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
