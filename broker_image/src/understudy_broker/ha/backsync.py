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
one connection; :func:`push_until_acknowledged` is the retry loop; :class:`BackSyncer` is
what a coordinated slave runs: it starts (or abandons) the push whenever the group state
it applied changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, request_once
from understudy_broker.model import GroupState, Mode, Role, Snapshot
from understudy_broker.retry import Backoff
from understudy_broker.security import ClientSecurity
from understudy_broker.tasks import stop_tasks

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
    max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES, security: ClientSecurity | None = None,
) -> p.BackSyncResponse:
    """One BACKSYNC_OFFSETS on a fresh connection. Raises :class:`BackSyncRefused` for an
    error status, ``OSError``/``TimeoutError`` when the master cannot be reached, the
    client's ``BrokerError`` (``TIMEOUT``) when it does not answer in time, and
    ``protocol.FrameError`` for a garbled answer."""
    frame = await request_once(f"{host}:{port}", p.Op.BACKSYNC_OFFSETS, request.encode(),
                               epoch=request.epoch, timeout_s=timeout_s,
                               max_frame_bytes=max_frame_bytes, security=security)
    if frame.status != p.Status.OK:
        raise BackSyncRefused(p.Status(frame.status), p.error_message(frame))
    return p.BackSyncResponse.decode(frame.body)


async def push_until_acknowledged(
    *,
    epoch: int,
    master: Callable[[], tuple[str, int] | None],
    request: Callable[[], p.BackSyncRequest],
    still_due: Callable[[], bool],
    timeout_s: float = 2.0,
    backoff_s: tuple[float, float] = (0.02, 0.5),
    security: ClientSecurity | None = None,
) -> p.BackSyncResponse | None:
    """Push until the master acknowledges (returns its answer) or the push is no longer
    due or was refused as stale (returns ``None``). ``master`` gives the master's client
    address (it may change with the group config); ``request`` builds the request from the
    current offsets at each attempt. Retries back off with jitter (:class:`Backoff`)."""
    backoff = Backoff(*backoff_s)
    while still_due():
        where = master()
        if where is None:
            log.warning("back-sync epoch %d: the master's address is not known yet", epoch)
        else:
            try:
                return await push_offsets(host=where[0], port=where[1], request=request(),
                                          timeout_s=timeout_s, security=security)
            except BackSyncRefused as exc:
                if exc.status is p.Status.STALE_EPOCH:
                    log.info("back-sync epoch %d refused as stale: %s", epoch, exc)
                    return None
                log.warning("back-sync epoch %d refused: %s; retrying", epoch, exc)
            except (OSError, TimeoutError, p.FrameError, BrokerError) as exc:
                log.warning("back-sync epoch %d to %s:%d failed: %r; retrying", epoch,
                            where[0], where[1], exc)
        await backoff.sleep()
    return None


class BackSyncer:
    """A coordinated slave's back-sync: :meth:`on_state` is called whenever the applied
    state, the effective permission or the group config may have changed; it starts the
    push for a newly due epoch (cancelling an older one) and lets a push that is no
    longer due end by itself.

    ``state``, ``has_read`` and ``master`` read the broker's current view (the push
    re-checks them before every attempt); ``offsets`` is the consumer-offset snapshot;
    ``escaped`` the schedule entries this slave escaped while acting, sent along after
    ``escape_quiesce`` (docs/delayed.md) and dropped (``escaped_synced``) once taken.
    """

    def __init__(
        self,
        *,
        role: Role,
        name: str,
        group: str,
        state: Callable[[], GroupState | None],
        has_read: Callable[[], bool],
        master: Callable[[], tuple[str, int] | None],
        offsets: Callable[[], Snapshot],
        escape_quiesce: Callable[[], Awaitable[None]] | None = None,
        escaped: Callable[[], list[int]] = list,
        escaped_synced: Callable[[list[int]], None] = lambda _o: None,
        security: ClientSecurity | None = None,
    ) -> None:
        self._security = security
        self._role = role
        self._name = name
        self._group = group
        self._state = state
        self._has_read = has_read
        self._master = master
        self._offsets = offsets
        self._escape_quiesce = escape_quiesce
        self._escaped = escaped
        self._escaped_synced = escaped_synced
        self._epoch: int | None = None  # the epoch being pushed or acknowledged
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def _due(self) -> int | None:
        return backsync_epoch_due(role=self._role, name=self._name, state=self._state())

    def on_state(self) -> None:
        if self._stopping:
            return
        due = self._due()
        if due is None or due == self._epoch:
            return
        if self._task is not None:
            self._task.cancel()
        self._epoch = due
        self._task = asyncio.get_running_loop().create_task(self._run(due),
                                                            name=f"backsync-{due}")

    async def _run(self, epoch: int) -> None:
        def still_due() -> bool:
            return not self._stopping and not self._has_read() and self._due() == epoch

        sent: list[int] = []

        def request() -> p.BackSyncRequest:
            sent[:] = self._escaped()
            return p.BackSyncRequest(self._group, self._name, epoch, self._offsets(), sent)

        started = time.monotonic()
        try:
            if self._escape_quiesce is not None:
                # READ is gone, so no escape starts; one in flight finishes (or fails)
                # before the list of escaped entries is read (docs/delayed.md).
                await self._escape_quiesce()
            answer = await push_until_acknowledged(epoch=epoch, master=self._master,
                                                   request=request, still_due=still_due,
                                                   security=self._security)
            if answer is not None and sent:
                self._escaped_synced(list(sent))
        except Exception:  # a background task must report, not vanish
            log.exception("back-sync of epoch %d crashed", epoch)
            self._epoch = None
            return
        if answer is None:
            log.info("back-sync of epoch %d abandoned (no longer due)", epoch)
        else:
            log.info("back-sync of epoch %d acknowledged in %.1f ms (%d offsets moved up)",
                     epoch, (time.monotonic() - started) * 1000, answer.moved)

    async def stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            await stop_tasks([task])
