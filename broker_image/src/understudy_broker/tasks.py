"""Stopping background tasks: the one way every part of the project does it.

Why this module exists: brokers, coordinators, controllers, the operator's group handles
and the client all own background tasks that must be gone when they stop. Two traps make a
hand-written ``task.cancel(); with suppress(CancelledError): await task`` wrong: it
swallows a cancellation aimed at the *caller* (a ``stop()`` under ``asyncio.timeout`` then
never gives up), and on Python 3.11 ``asyncio.wait_for`` can lose a cancellation that
arrives as its inner future completes, so a task may keep running after one ``cancel()``.
:func:`stop_tasks` avoids both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], *, recancel_after_s: float = 1.0) -> None:
    """Cancel ``tasks`` and wait until every one has finished.

    A task still running ``recancel_after_s`` after its cancellation (it lost it, see the
    module docstring) is cancelled again. The caller's own cancellation propagates
    (``asyncio.wait`` does not swallow it). The tasks' errors are retrieved: a stopping
    owner has nobody left to report them to, and asyncio must not log them as never
    retrieved."""
    owned = list(tasks)
    pending = {t for t in owned if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_after_s)
    for t in owned:
        if not t.cancelled():
            t.exception()
