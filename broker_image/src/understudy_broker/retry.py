"""One jittered, capped exponential backoff for every retry loop in the project.

Why this module exists: after a failover every client, every slave and every back-sync
retries at once. With the same deterministic delays (50 ms, 100 ms, 200 ms ...) they all
come back in lockstep and hit the new reader together; six hand-written copies of
``min(base * 2**attempt, cap)`` did exactly that. Here the delay doubles from ``initial_s``
up to ``max_s`` and each wait is drawn uniformly from the upper half of the current step
("equal jitter"): never shorter than half the step, so a retry loop still backs off, and
never longer than the step, so recovery after a short outage stays quick.

:func:`backoff_delay` is the pure rule (testable with a fixed random draw); :class:`Backoff`
carries the attempt count for a loop.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable


def backoff_delay(attempt: int, *, initial_s: float, max_s: float, draw: float,
                  multiplier: float = 2.0) -> float:
    """The wait before retry number ``attempt`` (0 = the first retry): the step
    ``min(initial_s * multiplier**attempt, max_s)`` scaled into ``[step / 2, step]`` by
    ``draw`` in ``[0, 1)``."""
    if initial_s < 0 or max_s < initial_s or multiplier < 1:
        raise ValueError("backoff needs 0 <= initial_s <= max_s and multiplier >= 1")
    step = max_s if attempt >= 64 else min(initial_s * multiplier**attempt, max_s)
    return step / 2 + step / 2 * min(max(draw, 0.0), 1.0)


class Backoff:
    """The delays of one retry loop: :meth:`next` after a failure, :meth:`reset` after a
    success. ``draw`` supplies the jitter (``random.random`` by default; a test passes a
    constant)."""

    def __init__(self, initial_s: float, max_s: float, *, multiplier: float = 2.0,
                 draw: Callable[[], float] = random.random) -> None:
        backoff_delay(0, initial_s=initial_s, max_s=max_s, draw=0.0, multiplier=multiplier)
        self.initial_s = initial_s
        self.max_s = max_s
        self.multiplier = multiplier
        self._draw = draw
        self.attempt = 0

    def next(self) -> float:
        """The wait before the next retry; each call moves one step up."""
        delay = backoff_delay(self.attempt, initial_s=self.initial_s, max_s=self.max_s,
                              draw=self._draw(), multiplier=self.multiplier)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0

    async def sleep(self) -> None:
        """Sleep for :meth:`next`."""
        await asyncio.sleep(self.next())
