"""Small asyncio helpers shared by the broker's background loops."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Return when ``event`` is set or after ``timeout_s``, whichever comes first.

    Built on ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` can lose
    a cancellation that lands as the event is set, and a loop cancelled that way (by its
    owner's ``stop()``, which often sets the event too) never ends.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
