"""The route writer: one controller writes every group's route into ``/routes/doc``.

Why this module exists: every broker answers the route of every topic, and followed every
group by its own ZooKeeper watches, so a failover of G groups was about 3G notifications,
reads and view rebuilds on each of the B brokers: 3G x B in all, growing with the square
of the cluster (``bench/scale.py``: 50 groups killed at once were readable again after 8 s).
Now one process follows the groups, and the brokers follow one document it writes
(docs/cluster-routes.md; the broker side is ``ha/clusterview.py``).

The writer is the controller that exports the topic series: the one leading the cluster's
first elected group (:func:`~understudy_operator.controller.topicview.exports_topics`).
Once its own per-group :class:`~understudy_broker.ha.clusterview.ClusterView` has read
every group, it creates the ephemeral ``/routes/writer`` holding its identity and writes
``/routes/doc`` (:class:`~understudy_broker.zklayout.RoutesDoc`) after every change its
view sees, one write at a time and at most one every :data:`MIN_INTERVAL_S`: changes that
come meanwhile go into the next one, so a burst of failovers is a few writes a second, each
with everything seen so far, while a change after a quiet spell is written at once. (Every
write costs every broker a read and a decode of the whole document: written after each of
the ~150 changes of 50 groups failing over, it cost the brokers about what the per-group
watches it replaces did.)
The document's znode version is compared on each write; a writer that finds another's
write, or the writer node gone or someone else's, stops writing (and deletes the node
only when it is its own). It checks every :data:`CHECK_S` that it is still the one to
write; a controller that stops (or loses its session) takes the node with it, and the
brokers go back to their own watches at once.

A route is advice: every request is checked by the broker that gets it (DESIGN "Effective
permission", invariants 1, 2 and 6), so a document behind the groups costs time (a
client refused and asking again), never an invariant.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.zklayout import ROUTES_DOC, ROUTES_WRITER, RoutesDoc
from understudy_operator import zk as zkio

log = logging.getLogger(__name__)

#: How often the writer checks it is still the one to write (and a controller that is not
#: checks whether it has become the one).
CHECK_S = 1.0
#: The least time between two writes of the document (the first after a quiet spell is
#: not delayed).
MIN_INTERVAL_S = 0.05
#: How long a new writer's view may take to read every group before the writer says so
#: (and tries again at the next check).
COMPLETE_WAIT_S = 10.0


def routes_of(view: ClusterView, writer: str) -> RoutesDoc:
    """The document for what ``view`` holds now."""
    return RoutesDoc(writer, {g: tuple(view.group_route(g).brokers) for g in view.groups()})


class RouteWriter:
    """See the module docstring. ``led()``: the groups this controller leads now."""

    def __init__(self, zk: zkio.ZkGateway, identity: str, led: Callable[[], Sequence[str]],
                 *, check_s: float = CHECK_S, min_interval_s: float = MIN_INTERVAL_S,
                 on_write: Callable[[], None] = lambda: None) -> None:
        self._zk = zk
        self._identity = identity
        self._led = led
        self._check_s = check_s
        self._min_interval_s = min_interval_s
        self._on_write = on_write
        self._view: ClusterView | None = None
        self._last_write = 0.0
        self.writes = 0  # documents written (for tests and the bench)

    async def run(self) -> None:
        while True:
            try:
                if await self._chosen():
                    await self._write_while_chosen()
            except zkio.ZkError as exc:
                log.info("route writer: ZooKeeper error %r; trying again", exc)
            except Exception:  # never let a bug end the writer; it is logged loudly
                log.exception("route writer crashed; trying again")
            await asyncio.sleep(self._check_s)

    async def _chosen(self) -> bool:
        return await self._zk.leads_the_cluster(self._led())

    async def _ours(self) -> bool:
        found = await self._zk.get(ROUTES_WRITER)
        return found is not None and found[0].decode("utf-8", "replace") == self._identity

    async def _claim(self) -> bool:
        if await self._zk.create(ROUTES_WRITER, self._identity.encode(), ephemeral=True):
            log.info("route writer: %s writes the cluster's routes", self._identity)
            return True
        return await self._ours()  # still ours from before, or another writer's

    async def _write_while_chosen(self) -> None:
        view = self._view
        if view is None:
            view = self._view = self._zk.cluster_view(asyncio.get_running_loop())
            await view.start()
        # Never a document without every group: brokers that took it would route none
        # of the missing groups. Until the view is complete they follow the groups.
        waited = time.monotonic()
        while not view.complete():
            await view.wait_change(view.version, 0.05)
            if time.monotonic() - waited > COMPLETE_WAIT_S:
                log.warning("route writer: not every group read after %gs; not writing yet",
                            COMPLETE_WAIT_S)
                return
        if not await self._claim():
            return
        try:
            await self._write_loop(view)
        finally:
            if await self._ours():
                await self._zk.delete(ROUTES_WRITER)

    async def _write_loop(self, view: ClusterView) -> None:
        found = await self._zk.get(ROUTES_DOC)
        version = -1 if found is None else found[1]
        written: RoutesDoc | None = None
        check_at = time.monotonic() + self._check_s
        while True:
            seen = view.version
            doc = routes_of(view, self._identity)
            if doc != written and written is not None and (
                    wait := self._last_write + self._min_interval_s - time.monotonic()) > 0:
                await asyncio.sleep(wait)  # what changes meanwhile goes into this write
                continue
            if doc != written:
                version = await self._write(doc, version)
                if version < 0:  # someone else wrote it: still ours to write?
                    if not await self._ours():
                        log.warning("route writer: another writer holds %s", ROUTES_WRITER)
                        return
                    found = await self._zk.get(ROUTES_DOC)
                    version = -1 if found is None else found[1]
                    continue
                written = doc
                self._last_write = time.monotonic()
                self.writes += 1
                self._on_write()
            if time.monotonic() >= check_at:
                if not (await self._chosen() and await self._ours()):
                    return
                check_at = time.monotonic() + self._check_s
            await view.wait_change(seen, max(0.0, check_at - time.monotonic()))

    async def _write(self, doc: RoutesDoc, version: int) -> int:
        """Write ``doc`` over znode ``version`` (-1: create it); the new version, or -1
        when the node was not at ``version``."""
        data = doc.to_json()
        if version < 0:
            return 0 if await self._zk.create(ROUTES_DOC, data) is not None else -1
        return version + 1 if await self._zk.set_data(ROUTES_DOC, data, version=version) else -1
