"""The project's one way to build a ZooKeeper client and to await it from asyncio.

Why this module exists: brokers (:mod:`understudy_broker.ha.coordinator`) and the operator's
gateway (:mod:`understudy_operator.zk`) all talk to ZooKeeper through kazoo. They must
authenticate the same way, put the same digest ACL on every node they create, and never
block the event loop on kazoo's threads. One factory (:func:`make_client`), one credential
parser (:func:`parse_digest`, behind every ``--zk-digest``/``--digest`` flag), one way to
start a client from a loop (:func:`start_client`) and to close it (:func:`close_client`),
and one bridge from kazoo's
``IAsyncResult`` to an asyncio future (:func:`kazoo_future`) keep those rules in one
place; every client the factory builds waits on its socket through
:class:`PollHandler` (one ``poll(2)`` per wait, not an epoll selector built and closed).
This is the broker package's lowest ZooKeeper layer; the operator imports it only from
its own ``zk`` module.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.retry import KazooRetry
from kazoo.security import ACL, make_digest_acl

#: ``(user, password)`` of a ZooKeeper digest identity.
Digest = tuple[str, str]


def parse_digest(text: str) -> Digest:
    """``USER:PASSWORD`` (both non-empty; the password may contain ``:``); ``ValueError``
    with a message naming the expected shape otherwise."""
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError("expected USER:PASSWORD")
    return user, password


def digest_acl(digest: Digest | None) -> list[ACL] | None:
    """The ACL every node created with ``digest`` gets: all rights for that identity only
    (brokers, controllers and the operator share it). ``None`` without credentials."""
    return None if digest is None else [make_digest_acl(*digest, all=True)]


def reconnect_max_delay_s(timeout_s: float) -> float:
    """The longest pause between two rounds of reconnect attempts for a session of
    ``timeout_s``: an eighth of it, at most 1 s (what ZooKeeper's own Java client waits).

    Why bounded: when an ensemble regains its quorum, the new leader restarts every
    session's timeout, so a session survives an outage of any length if its client is back
    within ``timeout_s`` of that moment. kazoo's default backoff doubles up to an hour:
    after a quorum outage of a few seconds its clients slept ~2-6 s past the new leader,
    and every session of a 2 s timeout expired (brokers re-registered; the master read
    again 3.8 s after the quorum was back). With the bound (plus kazoo's 40 % jitter, one
    pause is under a fifth of the session) they are back within about half a second, and
    the master's read lease (three quarters of the session at most) is renewed after a
    leader election of a few hundred ms rather than lapsing."""
    return min(1.0, timeout_s / 8)


_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL


def poll_select(rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract (the file objects ready to read, to write, and none
    exceptional; ``timeout`` in seconds, ``None`` to block) through one ``poll(2)``, which
    takes descriptors of any number (``select(2)`` stops at 1024). A descriptor that hung
    up or failed is ready to read, as with kazoo's selectors (its reader then finds out);
    a bad one is a ``ValueError``, as kazoo's own raises."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    poller = select.poll()
    wanted: dict[int, int] = {}
    objects: dict[int, tuple[Any, Any]] = {}
    for objs, mask in ((rlist, select.POLLIN | select.POLLPRI), (wlist, select.POLLOUT)):
        for obj in objs:
            fd = obj if isinstance(obj, int) else obj.fileno()
            if not isinstance(fd, int) or fd < 0:
                raise ValueError(f"invalid file descriptor: {obj!r}")
            wanted[fd] = wanted.get(fd, 0) | mask
            reader, writer = objects.get(fd, (None, None))
            objects[fd] = (obj, writer) if mask != select.POLLOUT else (reader, obj)
    for fd, mask in wanted.items():
        poller.register(fd, mask)
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, events in poller.poll(None if timeout is None else timeout * 1000):
        reader, writer = objects[fd]
        if reader is not None and events & _READABLE:
            readable.append(reader)
        elif writer is not None and events & (select.POLLOUT | select.POLLERR
                                              | select.POLLHUP | select.POLLNVAL):
            writable.append(writer)
    return readable, writable, []


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler with :func:`poll_select` for its ``select``. kazoo's own
    builds an epoll selector for every call (epoll_create, a register per descriptor, the
    wait, close): 24 us of CPU a call against 3.5 us, and its connection thread calls it
    several times per request. In a profile of the controller failing 20 groups over at
    once, creating and closing those selectors was half of kazoo's thread's samples."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)


def make_client(connect: str, *, timeout_s: float, digest: Digest | None = None) -> KazooClient:
    """A (not yet started) client for ``host:port[,...][/chroot]`` that authenticates with
    ``digest``, gives the nodes it creates :func:`digest_acl`, and keeps trying to
    reconnect with pauses of at most :func:`reconnect_max_delay_s`."""
    auth = None if digest is None else [("digest", f"{digest[0]}:{digest[1]}")]
    retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2,
                       max_delay=reconnect_max_delay_s(timeout_s))
    return KazooClient(hosts=connect, timeout=timeout_s, auth_data=auth,
                       default_acl=digest_acl(digest), connection_retry=retry,
                       handler=PollHandler())


#: One lock per client, held while it starts and while it closes (see :func:`close_client`).
_LIFE: weakref.WeakKeyDictionary[KazooClient, threading.Lock] = weakref.WeakKeyDictionary()
_LIFE_GUARD = threading.Lock()


def _life_lock(client: KazooClient) -> threading.Lock:
    with _LIFE_GUARD:
        lock = _LIFE.get(client)
        if lock is None:
            lock = _LIFE[client] = threading.Lock()
        return lock


def close_client(client: KazooClient) -> None:
    """Stop and close ``client`` (blocking: call it off the loop), one caller at a time and
    never while :func:`start_client` is inside kazoo's ``start``. kazoo's ``stop`` returns
    at once when another thread's stop is still waiting for the connection to end (or
    before a start has cleared its stopped flag), and its ``close`` then raises "Cannot
    close connection until it is stopped": a stop of a component whose start had been
    cut short met the start's own clean-up that way, failed, and could leave the client
    running."""
    with _life_lock(client):
        client.stop()
        client.close()


async def start_client(client: KazooClient, timeout_s: float, close: Callable[[], None]) -> None:
    """``client.start(timeout_s)`` off the loop, never leaving a running client behind.

    A start that fails is closed (``close``, in the starting thread) and kazoo's error
    raised. A caller cancelled while the start runs cannot stop the thread, and the
    session may still connect after it gave up: whichever of the two finishes last calls
    ``close``. (A client left running reconnects for good, and kazoo's exit hook waits for
    its threads: a process that gave up on a start then hung at exit.)
    """
    lock = threading.Lock()
    abandoned = False
    started = False

    def run() -> None:
        nonlocal started
        try:
            with _life_lock(client):  # a close_client meanwhile waits for the start to end
                client.start(timeout_s)
        except Exception:
            close()
            raise
        with lock:
            started = True
            if not abandoned:
                return
        close()

    try:
        await asyncio.to_thread(run)
    except asyncio.CancelledError:
        with lock:
            abandoned = True
            ours = started
        if ours:
            await asyncio.to_thread(close)
        raise


def kazoo_future(loop: asyncio.AbstractEventLoop, async_result: Any) -> asyncio.Future[Any]:
    """An asyncio future completed on ``loop`` when a kazoo ``IAsyncResult`` is (its value,
    or its exception). The kazoo thread only calls ``loop.call_soon_threadsafe``."""
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any) -> None:
        try:
            value = result.get_nowait()
        except BaseException as exc:  # delivered to the awaiting coroutine
            with contextlib.suppress(RuntimeError):  # loop closed
                loop.call_soon_threadsafe(_set_exception, fut, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set_result, fut, value)

    async_result.rawlink(settle)
    return fut


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
