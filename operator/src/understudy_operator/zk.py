"""The operator side's one door to ZooKeeper.

Why this module exists: the failover controller, the kopf handlers, ``understudy group``,
the local cluster and the drill all read and write the same znodes (DESIGN "ZooKeeper
layout"). Before this module each built its own ``KazooClient``, and the read that turns
``live`` + ``status`` + ``isr`` into the controller's :class:`Observation` existed three
times. Now:

* :func:`open_gateway` is the only way to a session (built by the project's one factory,
  :func:`understudy_broker.zkclient.make_client`, so digest credentials and ACLs are the
  same everywhere); :class:`ZkGateway` makes every call awaitable on the caller's loop,
  and hands watch callbacks to that loop (kazoo's threads never touch its state);
* every group document is read and written here once: config, state (versioned writes
  only), statuses, the in-sync record, and :meth:`ZkGateway.observe_group` — the one read
  the controller decides on, the status handler reports and ``group status`` shows.

No other operator module imports kazoo (an import-linter contract in ``make lint``): they
catch :data:`ZkError` and use the gateway. The documents' shapes are
:mod:`understudy_broker.zklayout`; this module only moves bytes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from understudy_broker import zkclient
from understudy_broker.ha.clusterview import ClusterView
from understudy_broker.model import GroupState
from understudy_broker.topicnodes import (
    OrderedNodesLeft,
    TopicNodesExist,
    create_topic_nodes,
    delete_topic_nodes,
)
from understudy_broker.zkclient import (
    close_client,
    digest_acl,
    kazoo_future,
    make_client,
    start_client,
)
from understudy_broker.zklayout import (
    ACL_RULES,
    ACL_USERS,
    CONSUMERS_DIR,
    CONTROLLERS_DIR,
    GROUPS_DIR,
    TOPICS_DIR,
    BrokerStatus,
    GroupConfig,
    LayoutError,
    MemberDoc,
    TopicDoc,
    acl_rules_path,
    acl_user_path,
    config_path,
    controller_path,
    decode_isr,
    decode_state,
    encode_state,
    group_path,
    isr_path,
    live_dir,
    member_path,
    members_dir,
    route_dir,
    route_path,
    state_path,
    status_dir,
    status_path,
    topic_path,
)
from understudy_operator.controller.observe import BrokerView, Observation, ProcessState
from understudy_operator.controller.topicview import exports_topics

log = logging.getLogger(__name__)
T = TypeVar("T")

#: ``(user, password)`` of a ZooKeeper digest identity, and its one parser (for the
#: ``--zk-digest`` flags): the operator's modules take both from here.
Digest = zkclient.Digest
parse_digest = zkclient.parse_digest
#: Any ZooKeeper failure (unreachable, session expired, refused): what callers catch.
ZkError: Final = KazooException
#: Session states a listener receives.
LOST: Final = KazooState.LOST
SUSPENDED: Final = KazooState.SUSPENDED
CONNECTED: Final = KazooState.CONNECTED


class ZkUnavailable(RuntimeError):
    """ZooKeeper could not be reached within the connect timeout; the message says where."""


Warn = Callable[[str], None]


def _log_warning(message: str) -> None:
    log.warning("%s", message)


@dataclass(frozen=True, slots=True)
class GroupRead:
    """What :meth:`ZkGateway.read_group` read: the config (``None``: absent or malformed),
    the state and its znode version (as :meth:`ZkGateway.read_state`), and the
    observation of the brokers it was asked for, ``None`` when those are not the config's
    brokers in its order (then observe them again: :meth:`ZkGateway.observe_group`).
    ``written``: whether the versioned state write sent first took (``None``: none sent);
    ``written_at``: when its answer came (wall clock), before the reads' answers;
    ``failed``: a read that failed after that write was answered (the connection was lost
    in between, say): the write's outcome still counts, the reads are empty."""

    config: GroupConfig | None
    state: GroupState | None
    version: int
    observation: Observation | None
    written: bool | None = None
    written_at: float | None = None
    failed: Exception | None = None


class ZkGateway:
    """Awaitable ZooKeeper calls over one kazoo session (see the module docstring).

    Every coroutine must run on the loop that created the gateway's callers' tasks; watch
    callbacks are called on the loop passed to :meth:`data_watch` (the running one by
    default)."""

    def __init__(self, client: KazooClient, *, digest: Digest | None = None) -> None:
        self.client = client
        self.acl = digest_acl(digest)

    # ------------------------------------------------------------------ session

    @property
    def connected(self) -> bool:
        return bool(self.client.connected)

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """``listener`` gets every session state (:data:`CONNECTED`, :data:`SUSPENDED`,
        :data:`LOST`) on kazoo's thread: it must only hand it to a loop."""
        self.client.add_listener(listener)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        self.client.remove_listener(listener)

    async def start(self, *, timeout_s: float) -> None:
        try:
            await start_client(self.client, timeout_s, self._close)
        except Exception as exc:  # kazoo raises its own timeout type, not TimeoutError
            raise ZkUnavailable(f"ZooKeeper not reachable within {timeout_s:g}s: {exc!r}") from exc

    async def stop(self) -> None:
        """Close the session: its ephemeral nodes (and election nodes) go at once."""
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        close_client(self.client)

    async def _call(self, async_result: Any) -> Any:
        return await kazoo_future(asyncio.get_running_loop(), async_result)

    # ------------------------------------------------------------------ nodes

    async def get(self, path: str) -> tuple[bytes, int] | None:
        """``(data, version)``, or ``None`` when the node does not exist."""
        try:
            raw, stat = await self._call(self.client.get_async(path))
        except NoNodeError:
            return None
        return bytes(raw), int(stat.version)

    async def children(self, path: str, *, watch: Callable[..., Any] | None = None) -> list[str]:
        """The children (``[]`` when the node does not exist)."""
        try:
            return list(await self._call(self.client.get_children_async(path, watch=watch)))
        except NoNodeError:
            return []

    async def exists(self, path: str, *, watch: Callable[..., Any] | None = None) -> bool:
        return await self._call(self.client.exists_async(path, watch=watch)) is not None

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequence: bool = False) -> str | None:
        """Create (with parents); returns the path created, ``None`` when it exists."""
        try:
            created = await self._call(self.client.create_async(
                path, data, acl=self.acl, ephemeral=ephemeral, sequence=sequence,
                makepath=True))
        except NodeExistsError:
            return None
        return str(created)

    async def set_data(self, path: str, data: bytes, *, version: int = -1) -> bool:
        """Write ``data`` if the node is still at ``version`` (-1: any); ``False`` when
        someone else wrote it first (or it was deleted)."""
        try:
            await self._call(self.client.set_async(path, data, version=version))
        except (BadVersionError, NoNodeError):
            return False
        return True

    async def delete(self, path: str, *, recursive: bool = False) -> bool:
        """Delete (with children when ``recursive``); ``False`` when it did not exist."""
        try:
            if recursive:  # kazoo has no asynchronous recursive delete
                await asyncio.to_thread(self.client.delete, path, recursive=True)
            else:
                await self._call(self.client.delete_async(path))
        except NoNodeError:
            return False
        return True

    def cluster_view(self, loop: asyncio.AbstractEventLoop) -> ClusterView:
        """A per-group view of every group's routes over this session, as a broker's
        (the route writer's: controller/routewriter.py)."""
        return ClusterView(self.client, loop, acl=self.acl)

    async def ensure_path(self, path: str) -> None:
        await asyncio.to_thread(self.client.ensure_path, path, acl=self.acl)

    async def watch_node(self, path: str, on_change: Callable[[bytes | None, int], None],
                         loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Call ``on_change(data, version)`` on ``loop`` (the running one by default) now
        and whenever the node changes (``(None, -1)`` while it does not exist); kazoo's
        DataWatch re-arms itself. Arming reads the node once, in a worker thread, so the
        loop never blocks on ZooKeeper."""
        target = loop or asyncio.get_running_loop()

        def fired(data: bytes | None, stat: Any, *_: Any) -> None:
            version = -1 if stat is None else int(stat.version)
            with contextlib.suppress(RuntimeError):  # the loop is closed
                target.call_soon_threadsafe(on_change, None if stat is None else data, version)

        await asyncio.to_thread(self.client.DataWatch, path, fired)

    async def data_watch(self, path: str, on_change: Callable[[bytes | None], None],
                         loop: asyncio.AbstractEventLoop | None = None) -> None:
        """As :meth:`watch_node`, without the version: ``on_change(data)``."""
        await self.watch_node(path, lambda data, _version: on_change(data), loop)

    async def children_watch(self, path: str, on_change: Callable[[list[str]], None],
                             loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Call ``on_change(children)`` on ``loop`` now and whenever they change."""
        target = loop or asyncio.get_running_loop()

        def fired(children: list[str]) -> None:
            with contextlib.suppress(RuntimeError):
                target.call_soon_threadsafe(on_change, list(children))

        await asyncio.to_thread(self.client.ChildrenWatch, path, fired)

    # ------------------------------------------------------------------ group documents

    async def read_config(self, group: str, *, warn: Warn = _log_warning) -> GroupConfig | None:
        """The group config; ``None`` when absent or malformed (``warn`` says why)."""
        found = await self.get(config_path(group))
        if found is None:
            return None
        try:
            return GroupConfig.from_json(found[0])
        except LayoutError as exc:
            warn(f"group {group}: malformed config: {exc}")
            return None

    async def write_config(self, group: str, data: bytes) -> bool:
        """Store ``data`` as the group config unless it is already there; True if written."""
        return await self.put(config_path(group), data)

    async def read_state(self, group: str, *, warn: Warn = _log_warning
                         ) -> tuple[GroupState | None, int]:
        """The state and its znode version: ``(None, -1)`` when absent, ``(None, version)``
        when present but malformed (``warn`` says why; an override can outbid it)."""
        found = await self.get(state_path(group))
        if found is None:
            return None, -1
        raw, version = found
        try:
            return decode_state(raw), version
        except LayoutError as exc:
            warn(f"group {group}: malformed state: {exc}")
            return None, version

    async def write_state(self, group: str, new: GroupState, *, version: int) -> bool:
        """A versioned state write (DESIGN: "every transition is a ZK write with the
        expected znode version"); ``False`` when someone else moved the state first."""
        return await self.set_data(state_path(group), encode_state(new), version=version)

    async def create_state(self, group: str, new: GroupState) -> bool:
        """The first state of a group; ``False`` when one exists already."""
        return await self.create(state_path(group), encode_state(new)) is not None

    async def read_isr(self, group: str, *, warn: Warn = _log_warning) -> frozenset[str] | None:
        """The recorded in-sync set, ``None`` when there is no record. A malformed record
        counts as an empty set: no slave is trusted to hold every acknowledged commit."""
        found = await self.get(isr_path(group))
        return isr_of(group, None if found is None else found[0], warn=warn)

    async def observe_group(
        self,
        group: str,
        brokers: Sequence[str],
        *,
        process: Callable[[str], ProcessState] = lambda _name: ProcessState.UNKNOWN,
        warn: Warn = _log_warning,
    ) -> Observation:
        """What the controller decides on: for each of ``brokers``, whether its ``live``
        node exists, its last ``status`` (and the znode version, which grows with every
        publish) and what ``process`` says of its process; and the in-sync record."""
        # Every read is sent at once, in this order, on the one session (gather starts its
        # tasks in argument order; ZooKeeper answers a session's requests in the order
        # sent): the in-sync record is still read after the statuses (``machine.py``
        # FENCING relies on it: the set is read after the proof, so it can no longer
        # shrink), and the observation costs one round trip instead of one per node (on a
        # loaded machine each round trip also waits for a CPU, for this thread and kazoo's).
        found_all: list[Any] = await asyncio.gather(*self._observe_reads(group, brokers, warn))
        return self._observed(group, brokers, found_all, process=process, warn=warn)

    def _observe_reads(self, group: str, brokers: Sequence[str], warn: Warn) -> list[Awaitable[Any]]:
        """The reads of an observation, in the order they must be sent."""
        return [self.children(live_dir(group)),
                *(self.get(status_path(group, name)) for name in brokers),
                self.read_isr(group, warn=warn)]

    @staticmethod
    def _observed(group: str, brokers: Sequence[str], found: Sequence[Any], *,
                  process: Callable[[str], ProcessState], warn: Warn) -> Observation:
        return observation_of(
            group, brokers, live=set(cast(list[str], found[0])),
            statuses=cast(list[tuple[bytes, int] | None], found[1:-1]),
            in_sync=cast(frozenset[str] | None, found[-1]), process=process, warn=warn)

    async def read_group(
        self,
        group: str,
        brokers: Sequence[str],
        *,
        write: tuple[GroupState, int] | None = None,
        process: Callable[[str], ProcessState] = lambda _name: ProcessState.UNKNOWN,
        warn_config: Warn = _log_warning,
        warn_state: Warn = _log_warning,
        warn: Warn = _log_warning,
    ) -> GroupRead:
        """The config, the state and the observation of ``brokers`` (the brokers the
        caller expects the config to name, in its order), in one round trip: every request
        is sent at once, the state before the observation's reads (as the controller has
        always read them). ``write``: a versioned state write ``(state, version)`` sent
        before the reads; ZooKeeper answers a session's requests in the order sent, so the
        reads see the store after that write (taken or not: :attr:`GroupRead.written`). A
        failed write raises; a read that fails after the write was answered does not
        (:attr:`GroupRead.failed`): the caller must still learn whether its write took."""
        async def write_first(new: GroupState, version: int) -> tuple[bool, float]:
            taken = await self.write_state(group, new, version=version)
            return taken, time.time()  # dated by its answer, before the reads' answers

        calls: list[Awaitable[Any]] = [] if write is None else [write_first(*write)]
        calls += [self.read_config(group, warn=warn_config), self.read_state(group, warn=warn_state),
                  *self._observe_reads(group, brokers, warn)]
        found: list[Any] = await asyncio.gather(*calls, return_exceptions=True)
        for outcome in found:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # a cancellation, not an answer
        written: bool | None = None
        written_at: float | None = None
        if write is not None:
            answer = found.pop(0)
            if isinstance(answer, Exception):
                raise answer
            written, written_at = cast(tuple[bool, float], answer)
        failed = next((r for r in found if isinstance(r, Exception)), None)
        if failed is not None:
            if written is None:
                raise failed
            return GroupRead(None, None, -1, None, written, written_at, failed)
        config = cast(GroupConfig | None, found[0])
        state, version = cast(tuple[GroupState | None, int], found[1])
        same = config is not None and [b.name for b in config.brokers] == list(brokers)
        observed = self._observed(group, brokers, found[2:], process=process, warn=warn) if same else None
        return GroupRead(config, state, version, observed, written, written_at)

    async def prune_statuses(self, group: str, keep: set[str]) -> list[str]:
        """Delete the ``status`` and ``route`` documents of brokers no longer in the group
        (scaled away) that have no live node; returns their names. A broker still running
        keeps its documents."""
        names = set(await self.children(status_dir(group)))
        routes = set(await self.children(route_dir(group)))
        live = set(await self.children(live_dir(group)))
        pruned = []
        for name in sorted((names | routes) - keep - live):
            deleted = [await self.delete(path(group, name)) for path in (route_path, status_path)]
            if any(deleted):
                pruned.append(name)
        return pruned

    async def wait_change(self, group: str, broker: str, *, timeout_s: float) -> None:
        """Return when the group's state, the broker's status or the live set changes, or
        after ``timeout_s``: a watch, not a poll."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def fire(*_: Any) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(changed.set)

        await self.exists(status_path(group, broker), watch=fire)
        await self.exists(state_path(group), watch=fire)
        await self.children(live_dir(group), watch=fire)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await changed.wait()

    async def leader(self, group: str) -> str | None:
        """The identity of the controller leading ``group`` (lowest election node)."""
        children = sorted(await self.children(controller_path(group)))
        if not children:
            return None
        found = await self.get(f"{controller_path(group)}/{children[0]}")
        return None if found is None else found[0].decode("utf-8", "replace")

    async def first_elected_group(self) -> str | None:
        """The first group, by name, that has a controller in its election (some node under
        ``/controllers/<group>``); ``None`` when no controller runs."""
        for group in sorted(await self.children(CONTROLLERS_DIR)):
            with contextlib.suppress(LayoutError):  # a stray node is not a group
                if await self.children(controller_path(group)):
                    return group
        return None

    async def leads_the_cluster(self, led: Sequence[str]) -> bool:
        """Whether a controller leading the groups ``led`` does the cluster's once-a-cluster
        work now (the topic series, the ordered topics' chains, the route document): it
        leads the first elected group (:func:`exports_topics`) and is connected. Reads
        ZooKeeper only when it leads a group."""
        return bool(led) and self.connected and exports_topics(
            led, await self.first_elected_group())

    async def groups(self) -> list[str]:
        """Every group with a node under ``/groups`` (configured or not)."""
        return sorted(await self.children(GROUPS_DIR))

    # ------------------------------------------------------------------ topic documents

    async def topics(self) -> list[str]:
        return sorted(await self.children(TOPICS_DIR))

    async def read_topic(self, topic: str, *, warn: Warn = _log_warning
                         ) -> tuple[TopicDoc | None, int]:
        """The topic and its znode version: ``(None, -1)`` when absent, ``(None, version)``
        when malformed (``warn`` says why)."""
        found = await self.get(topic_path(topic))
        if found is None:
            return None, -1
        try:
            return TopicDoc.from_json(found[0]), found[1]
        except LayoutError as exc:
            warn(f"topic {topic}: malformed document: {exc}")
            return None, found[1]

    async def write_topic(self, doc: TopicDoc, *, version: int) -> bool:
        """Create the topic (``version`` -1) or replace the version read; ``False`` when
        it exists already (create) or someone else changed it first."""
        if version < 0:
            try:  # an ordered topic with its chains, in one transaction
                await create_topic_nodes(self.client, doc, acl=self.acl,
                                         loop=asyncio.get_running_loop())
            except OrderedNodesLeft:
                raise
            except TopicNodesExist:
                return False
            return True
        return await self.set_data(topic_path(doc.name), doc.to_json(), version=version)

    async def subscribed_groups(self) -> dict[str, set[str]]:
        """Topic -> the consumer groups with a live member subscribed to it (from
        ``/consumers/<cg>/members/*``; a malformed member document is skipped)."""
        out: dict[str, set[str]] = {}
        for cg in await self.children(CONSUMERS_DIR):
            for m in await self.children(members_dir(cg)):
                found = await self.get(member_path(cg, m))
                if found is None:
                    continue
                with contextlib.suppress(LayoutError):
                    for t in MemberDoc.from_json(found[0]).topics:
                        out.setdefault(t, set()).add(cg)
        return out

    async def delete_topic(self, topic: str) -> bool:
        """Delete the topic (with an ordered topic's chains); ``False`` when it was gone."""
        return await delete_topic_nodes(self.client, topic, loop=asyncio.get_running_loop())

    # ------------------------------------------------------------------ users and ACLs

    async def put(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` or replace what is there; ``False`` when it already
        held exactly ``data`` (nothing written)."""
        found = await self.get(path)
        if found is None:
            if await self.create(path, data) is not None:
                return True
            found = await self.get(path)
        if found is not None and found[0] == data:
            return False
        return await self.set_data(path, data)

    async def read_acl_user(self, user: str) -> bytes | None:
        """``/acl/users/<user>`` (salted SCRAM credentials), raw; ``None`` when absent."""
        found = await self.get(acl_user_path(user))
        return None if found is None else found[0]

    async def read_acl_rules(self, user: str) -> bytes | None:
        found = await self.get(acl_rules_path(user))
        return None if found is None else found[0]

    async def write_acl_user(self, user: str, doc: bytes) -> bool:
        """Write ``/acl/users/<user>`` (an ``acl.UserDoc``); ``False`` when unchanged."""
        return await self.put(acl_user_path(user), doc)

    async def write_acl_rules(self, user: str, doc: bytes) -> bool:
        """Write ``/acl/rules/<user>`` (an ``acl.RulesDoc``); ``False`` when unchanged."""
        return await self.put(acl_rules_path(user), doc)

    async def delete_acl_user(self, user: str) -> list[str]:
        """Delete the user's credentials and rules; the paths that existed."""
        gone = []
        for path in (acl_user_path(user), acl_rules_path(user)):
            if await self.delete(path):
                gone.append(path)
        return gone

    async def acl_users(self) -> list[str]:
        return sorted(await self.children(ACL_USERS))

    async def acl_rule_users(self) -> list[str]:
        return sorted(await self.children(ACL_RULES))

    async def delete_group(self, group: str) -> None:
        """Remove ``/groups/<group>`` and ``/controllers/<group>`` recursively."""
        await self.delete(group_path(group), recursive=True)
        await self.delete(controller_path(group), recursive=True)


def isr_of(group: str, data: bytes | None, *, warn: Warn = _log_warning) -> frozenset[str] | None:
    """The in-sync set an ISR record's ``data`` holds, ``None`` when there is no record. A
    malformed record counts as an empty set: no slave is trusted to hold every
    acknowledged commit."""
    if data is None:
        return None
    try:
        return decode_isr(data)
    except LayoutError as exc:
        warn(f"group {group}: {exc}; trusting no slave")
        return frozenset()


def observation_of(group: str, brokers: Sequence[str], *, live: Collection[str],
                   statuses: Sequence[tuple[bytes, int] | None],
                   in_sync: frozenset[str] | None,
                   process: Callable[[str], ProcessState] = lambda _name: ProcessState.UNKNOWN,
                   warn: Warn = _log_warning,
                   parse: Callable[[bytes], BrokerStatus] = BrokerStatus.from_json) -> Observation:
    """The controller's :class:`Observation` from what ZooKeeper held: the ``live``
    children, each of ``brokers``' status ``(data, znode version)`` (None: absent) in
    order, and the in-sync record; read fresh (:meth:`ZkGateway.observe_group`) or kept
    by watches (the controller's periodic checks, which pass a ``parse`` that remembers
    the statuses it decoded: a quiet group's are the same bytes check after check)."""
    views: dict[str, BrokerView] = {}
    for name, found in zip(brokers, statuses, strict=True):
        status: BrokerStatus | None = None
        version = -1
        if found is not None:
            version = found[1]
            try:
                status = parse(found[0])
            except LayoutError as exc:
                warn(f"group {group}: ignoring malformed status of {name}: {exc}")
        views[name] = BrokerView(name=name, zk_live=name in live, process=process(name),
                                 status=status, status_version=version)
    return Observation(now=time.monotonic(), wall=time.time(), brokers=views, in_sync=in_sync)


async def secure_chroot(connect: str, chroot: str, *, digest: Digest,
                        timeout_s: float = 5.0) -> str:
    """Make sure ``chroot`` exists under ``connect`` (``host:port[,...]``, no chroot) and
    only ``digest``'s identity may use it: created with the digest ACL, or its ACL set to it
    when it was open to the world. Every node the components create under it gets the same
    ACL (:func:`understudy_broker.zkclient.digest_acl`). Returns what was done, in words;
    raises :class:`ZkUnavailable` or :data:`ZkError`."""
    wanted = digest_acl(digest) or []
    async with open_gateway(connect, timeout_s=timeout_s, digest=digest,
                            connect_timeout_s=timeout_s) as zk:
        if await zk.exists(chroot):
            acls, _stat = await asyncio.to_thread(zk.client.get_acls, chroot)
            if sorted(map(str, acls)) == sorted(map(str, wanted)):
                return f"{chroot}: digest ACL in place"
            await asyncio.to_thread(zk.client.set_acls, chroot, wanted)
            return f"{chroot}: ACL set to the digest identity {digest[0]} (was {acls!r})"
        parent = chroot.rsplit("/", 1)[0]
        if parent:
            await asyncio.to_thread(zk.client.ensure_path, parent)
        try:
            await asyncio.to_thread(zk.client.create, chroot, b"", acl=wanted)
        except NodeExistsError:
            return await secure_chroot(connect, chroot, digest=digest, timeout_s=timeout_s)
        return f"{chroot}: created with the digest identity {digest[0]}'s ACL"


def gateway(connect: str, *, timeout_s: float, digest: Digest | None = None) -> ZkGateway:
    """A gateway over a new, not yet started session to ``host:port[,...][/chroot]``."""
    return ZkGateway(make_client(connect, timeout_s=timeout_s, digest=digest), digest=digest)


@contextlib.asynccontextmanager
async def open_gateway(connect: str, *, timeout_s: float = 5.0, digest: Digest | None = None,
                       connect_timeout_s: float = 10.0) -> AsyncIterator[ZkGateway]:
    """A started gateway for the duration of the block; the session is closed after it.
    Raises :class:`ZkUnavailable` when ZooKeeper cannot be reached."""
    zk = gateway(connect, timeout_s=timeout_s, digest=digest)
    await zk.start(timeout_s=connect_timeout_s)
    try:
        yield zk
    finally:
        await zk.stop()


def with_gateway(connect: str, work: Callable[[ZkGateway], Awaitable[T]], *,
                 timeout_s: float = 5.0, digest: Digest | None = None) -> T:
    """Run ``work`` with a started gateway from synchronous code (the CLI, local mode) and
    return its result. From a thread whose loop is running (a test, a caller inside
    asyncio) it runs on a loop of its own in a worker thread, never blocking on itself.
    Raises :class:`ZkUnavailable` and :data:`ZkError` as the gateway does."""

    async def run() -> T:
        async with open_gateway(connect, timeout_s=timeout_s, digest=digest,
                                connect_timeout_s=max(timeout_s, 5.0)) as zk:
            return await work(zk)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run()).result()
