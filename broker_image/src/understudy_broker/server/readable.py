"""The readable end: how far into its log a broker lets consumers read.

Why this module exists: a master appends a record, then waits for its fdatasync
(``--flush batch``) and for the in-sync slaves before it acknowledges it. A consumer that
read the record in between could read a message that no slave holds and, after a power
loss of the master's machine, no disk holds either; its group would commit past it, and
the messages produced after the master came back would take the offsets below that
commit and never be read by the group (docs/storage-and-replication.md, "What a consumer
can read"). So a master serves reads only below its **readable end**: the log position up
to which every record may be acknowledged, as Kafka's consumers read only below the high
watermark.

One task advances it, whatever appended for consumers (a produce, the scheduler's
deliveries): it waits exactly what a produce's acknowledgement waits for, up to the log's
end as it stands, then moves the end and wakes the long polls of the queues whose
appends it passed. A produce waits for its acknowledgement here too
(:meth:`ReadableEnd.wait_acknowledged`, the one place that condition is asked), which
moves the readable end to that produce's end before the answer is sent: a client that
pulls the offset it was just given reads it. An append that cannot be acknowledged (no
slave in sync under a floor of one, a flush that failed) stays unreadable, and the task
tries again, until a slave has it.

A slave's readable end is its log end: everything it holds came from its master through
replication. A master's starts at the log end it recovered (what its disk held when it
started, as before this module), and moves on from there. An ordered topic is read to the
log end on every group of its chains but its send head (``requests.py:_reads_to_log_end``;
docs/ordered.md's rule 3 drains a sealed head's whole log).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from understudy_broker.retry import Backoff
from understudy_broker.server.errors import RequestError

log = logging.getLogger(__name__)

Key = tuple[str, int]


class ReadableEnd:
    """See the module docstring. ``log_end()`` is the log's end (``CommitLog.max_phys``);
    ``acknowledged(end, start)`` returns once everything up to ``end`` may be acknowledged
    and raises when it may not be now (``start``: the readable end so far, where the bytes
    in flight begin: a slave's byte lag is measured from it, as from a produce's start);
    ``wake(keys)`` wakes those queues' long polls. ``immediate``: a slave (the readable
    end is the log end)."""

    def __init__(self, *, log_end: Callable[[], int],
                 acknowledged: Callable[[int, int], Awaitable[None]],
                 wake: Callable[[Iterable[Key]], None], immediate: bool,
                 retry_min_s: float = 0.05, retry_max_s: float = 1.0) -> None:
        self._log_end = log_end
        self._acknowledged = acknowledged
        self._wake = wake
        self.immediate = immediate
        self._end = log_end()
        self._pending: deque[tuple[int, set[Key]]] = deque()
        self._kick = asyncio.Event()
        self._backoff = Backoff(retry_min_s, retry_max_s)

    @property
    def phys(self) -> int:
        """Records that start below this log position may be read."""
        return self._log_end() if self.immediate else self._end

    def appended(self, end_phys: int, keys: Iterable[Key]) -> None:
        """Records of ``keys`` were appended, up to ``end_phys``: their readers are woken
        once they are readable (at once on a slave)."""
        if self.immediate:
            self._wake(keys)
            return
        self._pending.append((end_phys, set(keys)))
        self._kick.set()

    async def wait_acknowledged(self, end_phys: int, start_phys: int) -> None:
        """Return once a write from ``start_phys`` to ``end_phys`` may be acknowledged (a
        produce's wait; raises as ``acknowledged`` does), its records readable from then."""
        await self._acknowledged(end_phys, start_phys)
        self.acknowledged(end_phys)

    def acknowledged(self, end_phys: int) -> None:
        """Everything up to ``end_phys`` was found acknowledgeable by someone else (a
        produce's acknowledgement waits exactly what :meth:`run` waits for): readable now,
        so a client that pulls what it was just told is stored reads it (read-your-writes
        does not depend on which of two woken tasks the loop runs first)."""
        if self.immediate or end_phys <= self._end:
            return
        self._end = end_phys
        self._release()

    async def run(self) -> None:
        """Advance the readable end as the log grows (a master's background task)."""
        if self.immediate:
            return
        while True:
            await self._kick.wait()
            self._kick.clear()
            target = self._log_end()
            if target <= self._end:
                self._release()
                continue
            try:
                await self._acknowledged(target, self._end)
            except RequestError as exc:  # refused now (no slave in sync, a failed flush)
                log.debug("log up to %d not readable yet: %s", target, exc.message)
                await self._again()
                continue
            except Exception:  # a background task must report, not vanish
                log.exception("advancing the readable end to %d failed", target)
                await self._again()
                continue
            self._backoff.reset()
            self._end = max(self._end, target)
            self._release()

    async def _again(self) -> None:
        self._kick.set()
        await self._backoff.sleep()

    def _release(self) -> None:
        keys: set[Key] = set()
        while self._pending and self._pending[0][0] <= self._end:
            keys |= self._pending.popleft()[1]
        if keys:
            self._wake(keys)
