"""A broker's replication role: what a master or a slave does with the data it stores.

Why this module exists: a master pushes its log to its slaves and waits for them before it
acknowledges; a slave appends what its master pushes, adopts the master's topics and
consumer offsets, and reports whether it still hears the master. The request handlers and
the broker's lifecycle must not branch on the role for each of those, so each role is one
class behind the same :class:`Replica` interface: :class:`MasterReplica` and
:class:`SlaveReplica`.

Consumer commits travel master -> slave as records of the internal topic
:data:`~understudy_broker.storage.offsets.COMMITS_TOPIC` (so the synchronous replication
acknowledgement covers a commit exactly as it covers a produce); a slave applies them in
log order with :meth:`OffsetStore.merge` (maximum per key, so replays are harmless).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from understudy_broker.ha.authority import Authority
from understudy_broker.model import Health
from understudy_broker.replication.master import ReplicationServer
from understudy_broker.replication.slave import ReplicationClient
from understudy_broker.storage.offsets import COMMITS_TOPIC, encode_snapshot_record
from understudy_broker.storage.records import CommitLogError, Message
from understudy_broker.storage.store import Store
from understudy_broker.tasks import stop_tasks

log = logging.getLogger(__name__)

#: How often the master pushes topics and consumer offsets to its slaves: a topic just
#: created is readable on a slave at most this much later (sooner when pushed at once).
METADATA_INTERVAL_S = 0.25


class Replica(Protocol):
    """The role-specific half of a broker."""

    @property
    def port(self) -> int | None:
        """The replication port a master listens on (``None`` on a slave)."""
        ...

    @property
    def master_link(self) -> bool | None:
        """A slave's replication connection (``None`` on a master), for readiness."""
        ...

    def appended(self) -> None:
        """Bytes were appended locally (a produce): push them."""
        ...

    async def replicated(self, end_phys: int, start_phys: int | None = None) -> None:
        """Return once a write ending at ``end_phys`` (starting at ``start_phys``, when
        known) may be acknowledged as far as replication goes (raises the replication
        layer's errors)."""
        ...

    def metadata_changed(self) -> None:
        """Topics changed: tell slaves now rather than at the next interval."""
        ...

    def epoch_changed(self) -> None:
        """The broker applied another group epoch."""
        ...

    def master_back(self) -> None:
        """The group's master registered again: a slave reconnects to it now."""
        ...

    def record_commits(self, body: bytes | None) -> int:
        """Record consumer commits for the slaves (``body``: a commit record, ``None`` when
        nothing moved). Returns the log offset a synchronous acknowledgement must wait for
        (the last commit record's end, even when nothing moved now: an earlier commit that
        moved these offsets may still be in flight), 0 for nothing to wait for."""
        ...

    def snapshot_offsets(self) -> None:
        """Record the whole offsets snapshot for slaves (after a back-sync), not waited for."""
        ...

    def facts(self) -> tuple[bool, tuple[str, ...]]:
        """``(hears its master, connected slave names)`` for the status document."""
        ...

    def echo_set(self) -> frozenset[str] | None:
        """A master: the slaves whose echoes renew its read lease (the in-sync record as
        it may stand); None on a slave or without a record."""
        ...

    def refresh(self, authority: Authority, lag: Callable[[str, int], None]) -> None:
        """Periodic: report replication health to ``authority`` and lag to ``lag``."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class MasterReplica:
    """A master: a :class:`ReplicationServer` over the store's log, plus the commit records
    that carry consumer offsets to the slaves."""

    def __init__(self, store: Store, server: ReplicationServer, *, sync: bool,
                 slaves_assigned: bool) -> None:
        self._store = store
        self._server = server
        self._sync = sync
        self._slaves_assigned = slaves_assigned
        self._commits_end = 0  # log end of the last commit record appended

    @property
    def server(self) -> ReplicationServer:
        return self._server

    @property
    def port(self) -> int | None:
        return self._server.port

    @property
    def master_link(self) -> bool | None:
        return None

    def appended(self) -> None:
        self._server.notify_appended()

    async def replicated(self, end_phys: int, start_phys: int | None = None) -> None:
        if self._sync:
            await self._server.wait_replicated(end_phys, start_phys=start_phys)

    def metadata_changed(self) -> None:
        self._server.push_metadata_now()

    def master_back(self) -> None:
        return None

    def record_commits(self, body: bytes | None) -> int:
        if body is not None:
            self._append_commit_record(body)
        return self._commits_end

    def snapshot_offsets(self) -> None:
        body = encode_snapshot_record(self._store.offsets.snapshot())
        try:
            self._append_commit_record(body)
        except (CommitLogError, ValueError) as exc:
            log.error("recording the back-synced offsets for the slaves failed: %s", exc)

    def _append_commit_record(self, body: bytes) -> None:
        record = Message(COMMITS_TOPIC, 0, None, body, int(time.time() * 1000))
        self._commits_end = self._store.log.append([record]).end_phys
        self._server.notify_appended()

    def facts(self) -> tuple[bool, tuple[str, ...]]:
        return False, tuple(sorted(lk.name for lk in self._server.links() if lk.connected))

    def epoch_changed(self) -> None:
        # The slaves hear the epoch at once, and the in-sync record is read again: an
        # acting slave may have taken members out of it meanwhile (server/mirror.py).
        self._server.push_metadata_now()
        self._server.reload_isr()

    def echo_set(self) -> frozenset[str] | None:
        return self._server.echo_set()

    def refresh(self, authority: Authority, lag: Callable[[str, int], None]) -> None:
        server = self._server
        authority.update_health(Health(
            slaves_assigned=self._slaves_assigned,
            slave_connected=server.slave_connected,
            slave_once_connected=server.slave_once_connected,
        ))
        for link in server.links():
            lag(link.name, link.lag_bytes)

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop()


@dataclass(frozen=True, slots=True)
class LinkSecurity:
    """The replication link's TLS context and the group secret both sides prove."""

    tls: ssl.SSLContext | None = None
    group: str = ""
    secret: bytes | None = field(default=None, repr=False)

    def kwargs(self) -> dict[str, Any]:
        return {"tls": self.tls, "group": self.group, "secret": self.secret}


class SlaveReplica:
    """A slave: a :class:`ReplicationClient` copying the master's log into the store, the
    master's topics and offsets adopted from its metadata, and the replicated commit
    records applied in order. ``on_data`` is called whenever replicated data arrived (to
    wake long-polls)."""

    def __init__(self, store: Store, *, name: str, master: tuple[str, int],
                 link_timeout_s: float, on_data: Callable[[], None],
                 epoch: Callable[[], int] = lambda: 0,
                 on_probe: Callable[[int, float], int | None] | None = None,
                 link: LinkSecurity | None = None) -> None:
        self._store = store
        self._name = name
        self._link_timeout_s = link_timeout_s
        self._on_data = on_data
        self._heard: tuple[int, float] | None = None  # (replication session, when)
        self._task: asyncio.Task[None] | None = None
        self.client = ReplicationClient(
            store.log, master_host=master[0], master_port=master[1], name=name,
            on_metadata=self._on_metadata, on_append=self._on_replicated,
            link_timeout_s=link_timeout_s, commit=store.log_commit, epoch=epoch,
            on_probe=on_probe, **(link or LinkSecurity()).kwargs(),
        )
        self.apply_commit_records()  # commits replicated after offsets.json was written

    @property
    def port(self) -> int | None:
        return None

    @property
    def master_link(self) -> bool | None:
        return self.client.connected

    def appended(self) -> None:
        return None

    async def replicated(self, end_phys: int, start_phys: int | None = None) -> None:
        return None

    def metadata_changed(self) -> None:
        return None

    def master_back(self) -> None:
        self.client.wake()

    def record_commits(self, body: bytes | None) -> int:
        return 0  # an acting slave keeps commits in its offsets file; back-sync returns them

    def snapshot_offsets(self) -> None:
        return None

    def facts(self) -> tuple[bool, tuple[str, ...]]:
        return self._master_link_up(), ()

    def epoch_changed(self) -> None:
        return None

    def echo_set(self) -> frozenset[str] | None:
        return None

    def refresh(self, authority: Authority, lag: Callable[[str, int], None]) -> None:
        lag(self._name, int(self.client.lag_bytes))

    def _heard_from_master(self) -> None:
        self._heard = (self.client.sessions, time.monotonic())

    def _master_link_up(self) -> bool:
        """The link counts as up only while the master is *heard* (metadata every 0.25 s,
        data): a TCP connection to a frozen master is accepted by its kernel and proves
        nothing, and reporting it as a link would keep the controller from fencing."""
        rc = self.client
        if not rc.connected or self._heard is None:
            return False
        session, at = self._heard
        return session == rc.sessions and time.monotonic() - at < self._link_timeout_s

    def _on_metadata(self, data: Mapping[str, Any]) -> None:
        self._heard_from_master()
        topics = data.get("topics")
        if isinstance(topics, dict):
            self._store.topics.merge({str(k): int(v) for k, v in topics.items()})
        snapshot = data.get("offsets")
        if snapshot is not None:
            # Written by housekeeping within the persist interval.
            self._store.offsets.merge(snapshot)

    def _on_replicated(self, *_args: object) -> None:
        self._heard_from_master()
        self.apply_commit_records()
        self._on_data()

    def apply_commit_records(self) -> None:
        """Apply the consumer commits replicated as :data:`COMMITS_TOPIC` records
        (:meth:`Store.apply_commit_records`)."""
        self._store.apply_commit_records()

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.client.run(),
                                                            name=f"replicate-{self._name}")

    async def stop(self) -> None:
        await self.client.stop()
        task, self._task = self._task, None
        if task is not None:
            await stop_tasks([task])

