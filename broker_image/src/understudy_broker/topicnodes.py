"""A topic's znodes, created and deleted in one ZooKeeper transaction.

Why this module exists: a topic is created by the broker (``understudy topic create``,
ADMIN_TOPIC) and by the operator (a BrokerTopic), and deleted by both. An ordered topic is
``/topics/<t>`` *and* its chains (``/ordered/<t>/chains``, docs/ordered.md); no broker or
controller may ever see one without the other, so both callers use these two functions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError, NotEmptyError, RolledBackError

from understudy_broker.chains import initial_chains
from understudy_broker.zkclient import kazoo_future
from understudy_broker.zklayout import (
    ORDERED_DIR,
    PRODUCER_GROUPS,
    TOPICS_DIR,
    TopicDoc,
    chains_path,
    ordered_dir,
    topic_path,
)


class TopicNodesExist(Exception):
    """The topic exists already."""


class OrderedNodesLeft(TopicNodesExist):
    """An ordered topic's ``/ordered/<t>`` exists without ``/topics/<t>`` (made by hand):
    refused until an operator removes it."""


async def create_topic_nodes(client: KazooClient, doc: TopicDoc, *, acl: Any,
                             loop: asyncio.AbstractEventLoop) -> None:
    """Create ``/topics/<t>`` and, for an ordered topic, its initial chains (every group
    waits in the send chain, the first is head). Raises :class:`TopicNodesExist` (or its
    :class:`OrderedNodesLeft`)."""
    for parent in (TOPICS_DIR, *((ORDERED_DIR,) if doc.ordered else ())):
        await kazoo_future(loop, client.ensure_path_async(parent, acl=acl))
    txn = client.transaction()
    txn.create(topic_path(doc.name), doc.to_json(), acl=acl)
    if doc.ordered:
        txn.create(ordered_dir(doc.name), b"", acl=acl)
        txn.create(chains_path(doc.name), initial_chains(doc.name, doc.groups()).to_json(),
                   acl=acl)
    results = await kazoo_future(loop, txn.commit_async())
    if isinstance(results[0], NodeExistsError):
        raise TopicNodesExist(f"topic {doc.name!r} exists already "
                              "(understudy topic alter changes it)")
    if any(isinstance(r, NodeExistsError) for r in results[1:]):
        raise OrderedNodesLeft(
            f"{ordered_dir(doc.name)} exists without its topic (left from a topic made by "
            "hand?); remove it before creating the ordered topic")
    raise_failed(results)


async def delete_topic_nodes(client: KazooClient, topic: str, *,
                             loop: asyncio.AbstractEventLoop, version: int = -1) -> bool:
    """Delete ``/topics/<t>`` (at ``version``; -1: any) with an ordered topic's chains.
    ``False`` when the topic did not exist; ``BadVersionError`` when it changed."""
    if await kazoo_future(loop, client.exists_async(topic_path(topic))) is None:
        return False
    txn = client.transaction()
    for extra in (chains_path(topic), ordered_dir(topic)):
        if await kazoo_future(loop, client.exists_async(extra)) is not None:
            txn.delete(extra)
    txn.delete(topic_path(topic), version=version)
    results = await kazoo_future(loop, txn.commit_async())
    if isinstance(results[-1], NoNodeError):
        return False  # deleted meanwhile
    raise_failed(results)
    # The producers of an ordered topic (members and assignment, held by brokers) go with
    # it; a producer still heartbeating is told the topic is unknown.
    producers = PRODUCER_GROUPS.group(topic)
    with contextlib.suppress(NoNodeError, NotEmptyError):
        await asyncio.to_thread(client.delete, producers, recursive=True)
    return True


def raise_failed(results: Sequence[object]) -> None:
    """A failed transaction's results hold an exception per operation (the one that failed,
    rollbacks for the rest): raise the one that failed."""
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise next((e for e in errors if not isinstance(e, RolledBackError)), errors[0])
