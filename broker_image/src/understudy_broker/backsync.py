"""Back-sync: the acting slave hands its consumer offsets back to the returning master.

Why this module exists: while the master was away, consumers committed their positions
on the acting slave. Before the master serves reads again (DESIGN "Failover", steps 3-4)
those offsets must be on the master's disk, or every consumer group would rewind to where
it was when the master died. The controller moves the group to ``RECOVERING`` at epoch
``e``; the acting slave, having dropped READ (no further commit can land on it), pushes
its final offsets tagged ``e`` with ``BACKSYNC_OFFSETS`` to the master's client port and
retries until the master acknowledges — the master answers only after its offsets file
is durable — or until the group leaves ``RECOVERING e`` (then the push is moot: the
controller timed out and gave reads back, and a later ``RECOVERING`` starts a new push).

The decision (:func:`backsync_epoch_due`) is pure; :func:`push_offsets` is one request on
one connection; :func:`push_until_acknowledged` is the retry loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from understudy_broker import protocol as p
from understudy_broker.model import GroupState, Mode, Role

log = logging.getLogger(__name__)


class BackSyncRefused(Exception):
    """The master answered with an error status."""

    def __init__(self, status: p.Status, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status


def backsync_epoch_due(*, role: Role, name: str, state: GroupState | None) -> int | None:
    """The epoch whose offsets this broker must push now, or ``None``: a slave pushes
    while the applied state is ``RECOVERING`` naming it as the acting slave."""
    if role is Role.SLAVE and state is not None and state.mode is Mode.RECOVERING \
            and state.acting == name:
        return state.epoch
    return None


async def push_offsets(
    *, host: str, port: int, request: p.BackSyncRequest, timeout_s: float,
    max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
) -> p.BackSyncResponse:
    """One BACKSYNC_OFFSETS on a fresh connection. Raises :class:`BackSyncRefused` for an
    error status, ``OSError``/``TimeoutError`` when the master cannot be reached, and
    ``protocol.FrameError`` for a garbled answer."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    try:
        writer.write(p.encode_frame(request_id=1, op=p.Op.BACKSYNC_OFFSETS,
                                    epoch=request.epoch, body=request.encode()))
        await asyncio.wait_for(writer.drain(), timeout_s)
        decoder = p.FrameDecoder(max_frame_bytes)
        while True:
            frame = decoder.next_frame()
            if isinstance(frame, p.Frame):
                break
            data = await asyncio.wait_for(reader.read(64 * 1024), timeout_s)
            if not data:
                raise ConnectionError("the master closed the connection before answering")
            decoder.feed(data)
        if frame.status != p.Status.OK:
            raise BackSyncRefused(p.Status(frame.status), p.error_message(frame))
        return p.BackSyncResponse.decode(frame.body)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), timeout_s)


async def push_until_acknowledged(
    *,
    epoch: int,
    master: Callable[[], tuple[str, int] | None],
    request: Callable[[], p.BackSyncRequest],
    still_due: Callable[[], bool],
    timeout_s: float = 2.0,
    backoff_s: tuple[float, float] = (0.02, 0.5),
) -> p.BackSyncResponse | None:
    """Push until the master acknowledges (returns its answer) or the push is no longer
    due or was refused as stale (returns ``None``). ``master`` gives the master's client
    address (it may change with the group config); ``request`` builds the request from the
    current offsets at each attempt."""
    delay, max_delay = backoff_s
    while still_due():
        where = master()
        if where is None:
            log.warning("back-sync epoch %d: the master's address is not known yet", epoch)
        else:
            try:
                return await push_offsets(host=where[0], port=where[1], request=request(),
                                          timeout_s=timeout_s)
            except BackSyncRefused as exc:
                if exc.status is p.Status.STALE_EPOCH:
                    log.info("back-sync epoch %d refused as stale: %s", epoch, exc)
                    return None
                log.warning("back-sync epoch %d refused: %s; retrying", epoch, exc)
            except (OSError, TimeoutError, p.FrameError) as exc:
                log.warning("back-sync epoch %d to %s:%d failed: %r; retrying", epoch,
                            where[0], where[1], exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)
    return None
