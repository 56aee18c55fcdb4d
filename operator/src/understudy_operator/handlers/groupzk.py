"""The operator's ZooKeeper I/O for one group: config writes, state and status reads, the
versioned state writes of a planned handoff, and the cleanup on deletion.

Why this module exists: handlers stay thin and the rollout planner stays pure only if the
kazoo calls live in one place. Reads and writes go through the group controller's own session
(one session per group per operator replica), turned into awaitables with the broker package's
``kazoo_future``; the kazoo threads never touch the event loop's state directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from understudy_broker.model import GroupState
from understudy_broker.zklayout import (
    BrokerStatus,
    GroupConfig,
    LayoutError,
    config_path,
    controller_path,
    decode_state,
    encode_state,
    group_path,
    live_dir,
    state_path,
    status_dir,
    status_path,
)
from understudy_operator.controller.driver import Controller

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerZk:
    """One broker as ZooKeeper shows it."""

    live: bool
    status: BrokerStatus | None
    status_version: int = -1


class GroupZk:
    """ZooKeeper reads and writes for one group over its controller's session."""

    def __init__(self, controller: Controller) -> None:
        self._c = controller

    @property
    def client(self) -> KazooClient:
        return self._c.client

    async def _zk(self, async_result: Any) -> Any:
        return await self._c.zk(async_result)

    async def write_config(self, group: str, data: bytes) -> bool:
        """Store ``data`` at the group's ``config`` unless it is already there; True if written."""
        path = config_path(group)
        try:
            current, _ = await self._zk(self.client.get_async(path))
        except NoNodeError:
            try:
                await self._zk(self.client.create_async(path, data, acl=self._c.acl,
                                                        makepath=True))
                return True
            except NodeExistsError:
                current, _ = await self._zk(self.client.get_async(path))
        if current == data:
            return False
        await self._zk(self.client.set_async(path, data))
        return True

    async def read_config(self, group: str) -> GroupConfig | None:
        try:
            raw, _ = await self._zk(self.client.get_async(config_path(group)))
            return GroupConfig.from_json(raw)
        except NoNodeError:
            return None
        except LayoutError as exc:
            log.warning("group %s: malformed config in ZooKeeper: %s", group, exc)
            return None

    async def read_state(self, group: str) -> tuple[GroupState | None, int]:
        """The state and its znode version; ``(None, -1)`` when missing or malformed."""
        try:
            raw, stat = await self._zk(self.client.get_async(state_path(group)))
        except NoNodeError:
            return None, -1
        try:
            return decode_state(raw), int(stat.version)
        except LayoutError as exc:
            log.warning("group %s: malformed state in ZooKeeper: %s", group, exc)
            return None, -1

    async def read_brokers(self, group: str, names: list[str]) -> dict[str, BrokerZk]:
        try:
            live = set(await self._zk(self.client.get_children_async(live_dir(group))))
        except NoNodeError:
            live = set()
        out: dict[str, BrokerZk] = {}
        for name in names:
            status: BrokerStatus | None = None
            version = -1
            try:
                raw, stat = await self._zk(self.client.get_async(status_path(group, name)))
                version = int(stat.version)
                status = BrokerStatus.from_json(raw)
            except NoNodeError:
                pass
            except LayoutError as exc:
                log.warning("group %s: malformed status of %s: %s", group, name, exc)
            out[name] = BrokerZk(live=name in live, status=status, status_version=version)
        return out

    async def prune_statuses(self, group: str, keep: set[str]) -> list[str]:
        """Delete the ``status`` documents of brokers no longer in the group (scaled away) that
        have no live node; returns their names. A broker still running keeps its document."""
        try:
            names = set(await self._zk(self.client.get_children_async(status_dir(group))))
            live = set(await self._zk(self.client.get_children_async(live_dir(group))))
        except NoNodeError:
            return []
        pruned = []
        for name in sorted(names - keep - live):
            with contextlib.suppress(NoNodeError):
                await self._zk(self.client.delete_async(status_path(group, name)))
                pruned.append(name)
        return pruned

    async def write_state(self, group: str, new: GroupState, *, version: int) -> bool:
        """A versioned state write; False when someone else moved the state first."""
        try:
            await self._zk(self.client.set_async(state_path(group), encode_state(new),
                                                 version=version))
        except BadVersionError:
            return False
        return True

    async def wait_change(self, group: str, broker: str, *, timeout_s: float) -> None:
        """Return when the group's state, the broker's status or the live set changes, or
        after ``timeout_s``: a watch, not a poll."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def fire(*_: Any) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(changed.set)

        with contextlib.suppress(NoNodeError):
            await self._zk(self.client.exists_async(status_path(group, broker), watch=fire))
        with contextlib.suppress(NoNodeError):
            await self._zk(self.client.exists_async(state_path(group), watch=fire))
        with contextlib.suppress(NoNodeError):
            await self._zk(self.client.get_children_async(live_dir(group), watch=fire))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout_s)


def _delete_group_nodes(url: str, group: str, namespace: str, timeout_s: float) -> str:
    client = KazooClient(hosts=url, timeout=timeout_s)
    client.start(timeout=timeout_s)
    try:
        try:
            raw, _ = client.get(config_path(group))
            cfg = GroupConfig.from_json(raw)
            foreign = [b.host for b in cfg.brokers if not b.host.endswith(f".{namespace}.svc")]
            if foreign:
                return (f"kept {group_path(group)}: its config belongs to brokers outside "
                        f"namespace {namespace} ({', '.join(foreign)})")
        except (NoNodeError, LayoutError):
            pass
        client.delete(group_path(group), recursive=True)
        client.delete(controller_path(group), recursive=True)
        return f"deleted {group_path(group)} and {controller_path(group)}"
    finally:
        client.stop()
        client.close()


async def delete_group_nodes(*, url: str, group: str, namespace: str,
                             timeout_s: float = 10.0) -> str:
    """Remove ``/groups/<group>`` and ``/controllers/<group>`` (recursively) under ``url``'s
    chroot, unless the stored config names brokers of another namespace (a same-named group
    elsewhere). Returns what was done, in words; raises ``KazooException`` when unreachable."""
    try:
        return await asyncio.to_thread(_delete_group_nodes, url, group, namespace, timeout_s)
    except KazooException:
        raise
    except Exception as exc:  # kazoo raises plain timeouts when it cannot connect
        raise KazooException(f"ZooKeeper {url}: {exc!r}") from exc
