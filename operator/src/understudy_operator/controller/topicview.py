"""The topic view: how many of each topic's queues can be written and read right now.

Why this module exists: a topic is a set of queues spread over broker groups (DESIGN "Topics
across groups"), so a master's death takes away part of a topic's writers, not the topic.
The controller exports, per topic, the queues (``understudy_topic_queues``), those whose
group has a writer (``understudy_topic_writable_queues``) and those whose group has a reader
(``understudy_topic_readable_queues``); the Topics dashboard and the topic alerts read them.
This module is the counting, pure: ``/topics`` documents and each group's published
permissions in, counts out. The reads are the driver's (:class:`TopicExporter` in
:mod:`understudy_operator.controller.driver`).

A group's permission is the union of the *published* effective permissions of its brokers
that are live in ZooKeeper: the same view every broker serves as a topic's route
(``ha/clusterview.py``), so the counts say what producers and consumers can find.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from understudy_broker.model import Permission
from understudy_broker.zklayout import TopicDoc
from understudy_operator.controller.observe import Observation


@dataclass(frozen=True, slots=True)
class TopicCounts:
    """One topic's queues (removed ones excluded), and how many have a writer or a reader;
    ``placement``: each live queue and its group (``understudy_topic_queue_info``)."""

    queues: int
    writable: int
    readable: int
    placement: tuple[tuple[int, str], ...] = ()


def group_permission(obs: Observation) -> Permission:
    """What a group offers: the union of the published effective permissions of its
    brokers whose ``live`` node exists (a dead broker's last status is not a promise)."""
    held = Permission.NONE
    for view in obs.brokers.values():
        if view.zk_live and view.status is not None:
            held |= view.status.effective
    return held


def topic_counts(topics: Iterable[TopicDoc], groups: Mapping[str, Permission]
                 ) -> dict[str, TopicCounts]:
    """Per topic: its live queues (and their groups), and those whose group holds WRITE,
    or READ, in ``groups`` (a group missing from ``groups`` holds nothing)."""
    counts: dict[str, TopicCounts] = {}
    for doc in topics:
        live = tuple((q, g) for q, g in enumerate(doc.queues) if g is not None)
        placed = [groups.get(g, Permission.NONE) for _q, g in live]
        counts[doc.name] = TopicCounts(
            queues=len(placed),
            writable=sum(1 for p in placed if p & Permission.WRITE),
            readable=sum(1 for p in placed if p & Permission.READ),
            placement=live,
        )
    return counts


def exports_topics(led: Iterable[str], first_elected: str | None) -> bool:
    """Whether a controller leading the groups ``led`` exports the topic series: only the
    leader of the cluster's first group (by name) that has a controller elected, so one
    controller per cluster exports them, as one per group exports the group's series."""
    return first_elected is not None and first_elected in set(led)
