"""Moving the chains of ordered topics (docs/ordered.md "Who moves the chains").

Why this module exists: only the controller sees every group's state and every broker's
status, which is what the chain rules (``understudy_broker.chains.step``) decide on.
:func:`group_facts` turns one group's state and observation into ``GroupFacts`` (pure);
:class:`ChainMover` reads, decides and writes with the znode version it read, so a
controller acting on an old document loses and reads again. It runs where the topic series
are exported (the leader of the cluster's first elected group), so normally one controller
moves chains; the version keeps an overlapping one harmless.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Final

from understudy_broker.chains import GroupFacts, step
from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.zklayout import ChainDoc, GroupConfig, LayoutError, TopicDoc, chains_path
from understudy_operator import zk as zkio
from understudy_operator.controller.observe import Observation

if TYPE_CHECKING:
    from understudy_operator.controller.driver import Controller

log = logging.getLogger(__name__)

#: How often the chains of every ordered topic are checked (a send head's failure moves
#: the chain within this, after the group's own failover noticed it).
CHAINS_REFRESH_S: Final = 0.2
#: How often the list of ordered topics is read again.
TOPICS_LIST_S: Final = 1.0

#: One group as read for a pass: its config, state and observation.
_Seen = tuple[GroupConfig | None, GroupState | None, Observation | None]


def group_facts(topic: str, config: GroupConfig | None, state: GroupState | None,
                obs: Observation | None, subscribed: Collection[str] = ()) -> GroupFacts:
    """One group's facts for ``topic``. Writable: NORMAL, its master live and publishing
    WRITE with at least one slave linked (two copies). The log end, the consumed offset and
    the chain epoch come from the broker publishing READ (the group's reader); without one
    the group is treated as holding an unknown backlog (never drained, never joining). A
    consumer group in ``subscribed`` (a live member reads the topic) that has not committed
    on the topic has consumed nothing of it."""
    if config is None or state is None or obs is None:
        return GroupFacts(writable=False, end=1, consumed=0, view_epoch=-1)
    master = obs.brokers.get(config.master.name)
    writable = (state.mode is Mode.NORMAL and master is not None and master.zk_live
                and master.status is not None
                and bool(master.status.effective & Permission.WRITE)
                and bool(master.status.slave_links))
    for view in obs.brokers.values():
        st = view.status
        if view.zk_live and st is not None and st.effective & Permission.READ:
            reported = st.ordered.get(topic)
            if reported is not None:
                unseen = set(subscribed) - set(reported.groups)
                return GroupFacts(writable=writable, end=reported.end,
                                  consumed=0 if unseen else reported.consumed,
                                  view_epoch=reported.view_epoch)
    return GroupFacts(writable=writable, end=1, consumed=0, view_epoch=-1)


class ChainMover:
    """Every :data:`CHAINS_REFRESH_S`, when this controller exports the topic series: for
    each ordered topic, one :func:`~understudy_broker.chains.step` after another until
    nothing changes, each written with the version read."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller
        self.moves = 0
        self._refused: set[tuple[str, int]] = set()  # (topic, version) already logged
        self._ordered: list[TopicDoc] = []
        self._subscribed: dict[str, set[str]] = {}
        self._listed_at = -1.0

    async def run(self) -> None:
        while True:
            try:
                await self.move_all()
            except zkio.ZkError as exc:
                log.info("chains: ZooKeeper error %r; retrying", exc)
            except Exception:  # never let a bug end the loop; it is logged loudly
                log.exception("chains: check crashed")
            await asyncio.sleep(CHAINS_REFRESH_S)

    async def move_all(self) -> None:
        zk = self.c.zk
        led = [d.group for d in self.c.drivers if d.is_leader]
        if not await zk.leads_the_cluster(led):
            return
        now = asyncio.get_running_loop().time()
        if now - self._listed_at >= TOPICS_LIST_S:  # topics change rarely: list them slowly
            self._listed_at = now
            docs = [(await zk.read_topic(name, warn=_debug))[0] for name in await zk.topics()]
            self._ordered = [d for d in docs if d is not None and d.ordered]
        if self._ordered:  # a consumer group joining must hold what it has not read yet
            self._subscribed = await zk.subscribed_groups()
        seen: dict[str, _Seen] = {}  # each group is read once per pass, for every topic
        for doc in self._ordered:
            while await self.move_once(doc, seen):
                pass

    async def move_once(self, topic: TopicDoc, seen: dict[str, _Seen] | None = None) -> bool:
        """One change of ``topic``'s chains, written; whether something was written.
        ``seen``: the groups already read in this pass (a chain write changes no group's
        state; the readers' statuses after it are read at the next pass)."""
        zk = self.c.zk
        found = await zk.get(chains_path(topic.name))
        if found is None:
            return False
        raw, version = found
        groups = topic.groups()
        try:
            chains = ChainDoc.from_json(raw).check(groups)
        except LayoutError as exc:
            if (topic.name, version) not in self._refused:
                self._refused.add((topic.name, version))
                log.error("topic %s: not moving its chains: %s", topic.name, exc)
            return False
        seen = {} if seen is None else seen
        for g in groups:
            if g not in seen:
                seen[g] = await self._read_group(g)
        subscribed = self._subscribed.get(topic.name, set())
        facts = {g: group_facts(topic.name, *seen[g], subscribed) for g in groups}
        out = step(chains, facts, groups)
        if out is None:
            return False
        new, reason = out
        if not await zk.set_data(chains_path(topic.name), new.to_json(), version=version):
            return True  # someone else moved it: read again
        self.moves += 1
        log.warning("topic %s: chains epoch %d: %s (send %s, consume %s)", topic.name,
                    new.epoch, reason, ",".join(new.send) or "-",
                    ",".join(f"{c.group}@{c.until}" if c.until is not None else c.group
                             for c in new.consume) or "-")
        return True

    async def _read_group(self, group: str) -> _Seen:
        zk = self.c.zk
        config = await zk.read_config(group, warn=_debug)
        state, _v = await zk.read_state(group, warn=_debug)
        obs = None if config is None else await zk.observe_group(
            group, [b.name for b in config.brokers], warn=_debug)
        return config, state, obs



def _debug(message: str) -> None:
    log.debug("%s", message)
