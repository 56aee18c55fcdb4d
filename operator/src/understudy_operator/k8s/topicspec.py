"""A BrokerTopic's spec, and what syncing it into ZooKeeper means: pure, no I/O.

Why this module exists: the BrokerTopic handler must never half-apply a spec, and its rules
must be the CLI's rules. So the spec is parsed here (every problem reported at once, the
CRD's CEL rules re-checked), and the change to ``/topics/<t>`` is planned with the same
pure functions ``understudy topic create|alter|delete`` use on the broker
(:mod:`understudy_broker.topology`): unknown groups, bad counts and removing a queue that
still holds messages are refused with the same codes and words.

Sync semantics (docs/kubernetes.md, "BrokerTopic"):

* absent topic -> created with ``queuesPerGroup`` queues on each group, interleaved;
* present topic -> groups added or removed and queues per group grown or shrunk to match;
  a queue is removed only when the brokers report it drained (the handler measures the
  backlog only when a plan removes queues); ``ordered`` never changes;
* deletion of the resource -> the topic is deleted per ``deletionPolicy``: ``Retain`` (the
  default) leaves it, ``Delete`` deletes it once every queue is drained, ``ForceDelete``
  deletes it with whatever it holds.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from understudy_broker.model import TopicNameError, check_topic_name
from understudy_broker.topology import (
    MAX_QUEUES_PER_GROUP,
    TopicPlanError,
    check_delete,
    plan_alter,
    plan_create,
)
from understudy_broker.zklayout import TopicDoc
from understudy_operator.k8s.spec import FieldParser, SpecError, ZooKeeperSpec, parse_zookeeper

KIND: Final = "BrokerTopic"
DEFAULT_QUEUES_PER_GROUP: Final = 4
MAX_GROUPS: Final = 64
_SPEC_KEYS: Final = frozenset(
    {"topicName", "groups", "queuesPerGroup", "ordered", "deletionPolicy", "zookeeper"})


class DeletionPolicy(enum.StrEnum):
    """What deleting the BrokerTopic does to the topic in ZooKeeper."""

    RETAIN = "Retain"
    DELETE = "Delete"
    FORCE_DELETE = "ForceDelete"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    topic: str
    groups: tuple[str, ...]
    queues_per_group: int
    ordered: bool
    deletion_policy: DeletionPolicy
    zookeeper: ZooKeeperSpec


def parse_topic_spec(spec: Mapping[str, Any], *, name: str,
                     default_zk_connect: str | None = None,
                     default_chroot: str | None = None) -> TopicSpec:
    """Validate a BrokerTopic's ``spec``; ``name`` (``metadata.name``) is the topic's name
    unless ``spec.topicName`` gives one. Raises :class:`SpecError` listing every problem."""
    if not isinstance(spec, Mapping):
        raise SpecError([f"spec: must be an object, got {type(spec).__name__}"], kind=KIND)
    p = FieldParser()
    p.unknown(spec, "spec", _SPEC_KEYS)
    topic = p.string(spec, "spec", "topicName", default=name)
    try:
        check_topic_name(topic)
    except TopicNameError as exc:
        where = "spec.topicName" if "topicName" in spec else "metadata.name"
        p.add(f"{where}: {exc}")
    groups = _groups(p, spec.get("groups"))
    ordered = p.boolean(spec, "spec", "ordered", default=False)
    per_group = p.integer(spec, "spec", "queuesPerGroup",
                          default=1 if ordered else DEFAULT_QUEUES_PER_GROUP,
                          minimum=1, maximum=MAX_QUEUES_PER_GROUP)
    if ordered and per_group != 1:
        p.add("spec.queuesPerGroup: an ordered topic has one queue per group "
              "(omit queuesPerGroup, or set 1)")
    policy = DeletionPolicy(p.enum_str(spec, "spec", "deletionPolicy", tuple(DeletionPolicy),
                                       default=DeletionPolicy.RETAIN.value))
    zookeeper = parse_zookeeper(p, spec, default_zk_connect, default_chroot)
    if p.problems:
        raise SpecError(p.problems, kind=KIND)
    return TopicSpec(topic, groups, per_group, ordered, policy, zookeeper)


def _groups(p: FieldParser, raw: Any) -> tuple[str, ...]:
    if raw is None:
        p.add("spec.groups: required (the BrokerGroups the topic's queues live on)")
        return ()
    if not isinstance(raw, list) or not all(isinstance(g, str) for g in raw):
        p.add(f"spec.groups: must be a list of BrokerGroup names, got {raw!r}")
        return ()
    if not raw:
        p.add("spec.groups: must name at least one BrokerGroup")
    elif len(raw) > MAX_GROUPS:
        p.add(f"spec.groups: at most {MAX_GROUPS} groups, got {len(raw)}")
    dupes = sorted({g for g in raw if raw.count(g) > 1})
    if dupes:
        p.add(f"spec.groups: {', '.join(dupes)} listed more than once")
    return tuple(raw)


def check_update(status: Mapping[str, Any], new: TopicSpec) -> list[str]:
    """What the CRD's transition rules refuse, re-checked against what the last sync
    applied (``status.topic``, ``status.zookeeper``): renaming the topic or moving it to
    another ZooKeeper would orphan the old one. (A change of ``ordered`` is refused by
    :func:`plan_sync` against the document itself.)"""
    problems = []
    topic, url = status.get("topic"), status.get("zookeeper")
    if topic and topic != new.topic:
        problems.append(f"spec.topicName: cannot change ({topic!r} -> {new.topic!r})")
    if url and url != new.zookeeper.url:
        problems.append(f"spec.zookeeper: cannot change; the topic lives in {url}")
    return problems


# ----------------------------------------------------------------------------- sync plans


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """``doc``: the document to write (``None``: ZooKeeper already matches the spec).
    ``removes``: queues the write would remove, so the caller must measure their backlog
    before asking again with it."""

    doc: TopicDoc | None
    removes: tuple[int, ...] = ()


def plan_sync(spec: TopicSpec, current: TopicDoc | None, *, known_groups: Collection[str],
              backlog: Mapping[int, int] | None = None) -> SyncPlan:
    """The write that makes ``/topics/<t>`` match ``spec``. Raises ``TopicPlanError`` (the
    topology codes, plus ``ordered-mismatch``) when it must be refused. A plan that removes
    queues carries them in ``removes``; with ``backlog`` for them it is checked as
    ``topic alter`` checks it (a queue holding messages is never removed)."""
    if current is None:
        return SyncPlan(plan_create(spec.topic, spec.groups, spec.queues_per_group,
                                    known_groups=known_groups, ordered=spec.ordered))
    if current.ordered != spec.ordered:
        raise TopicPlanError(
            "ordered-mismatch",
            f"topic {spec.topic!r} exists with ordered={str(current.ordered).lower()}; "
            "a BrokerTopic cannot change that (create another topic)")
    now = current.groups()
    add = [g for g in spec.groups if g not in now]
    remove = [g for g in now if g not in spec.groups]
    per_now = {g: len(current.queues_of(g)) for g in now if g not in remove}
    resize = any(n != spec.queues_per_group for n in per_now.values())
    if not add and not remove and not resize:
        return SyncPlan(None)
    # Everything but the backlog rule first: a forced plan shows which queues would go.
    forced = plan_alter(current, known_groups=known_groups, add_groups=add,
                        remove_groups=remove, queues_per_group=spec.queues_per_group,
                        force=True)
    removes = tuple(q for q in current.live_queues() if forced.queues[q] is None)
    if removes and backlog is None:
        return SyncPlan(None, removes)
    doc = plan_alter(current, known_groups=known_groups, add_groups=add, remove_groups=remove,
                     queues_per_group=spec.queues_per_group, backlog=backlog, force=False)
    return SyncPlan(doc, removes)


def plan_delete(spec: TopicSpec, current: TopicDoc | None,
                backlog: Mapping[int, int] | None) -> bool:
    """Whether deleting the BrokerTopic deletes the topic now. ``Retain`` never does; a
    topic already gone needs nothing; ``Delete`` raises ``TopicPlanError`` (code
    ``backlog``) while a queue holds messages or its backlog is unknown."""
    if spec.deletion_policy is DeletionPolicy.RETAIN or current is None:
        return False
    check_delete(current, backlog=backlog,
                 force=spec.deletion_policy is DeletionPolicy.FORCE_DELETE)
    return True


def placement_status(doc: TopicDoc | None) -> dict[str, Any]:
    """The status fields that describe the topic's placement in ZooKeeper."""
    if doc is None:
        return {"queueCount": 0, "groups": "", "queues": []}
    live = doc.live_queues()
    return {
        "queueCount": len(live),
        "groups": ",".join(doc.groups()),
        "ordered": doc.ordered,
        "queues": [{"queue": q, "group": doc.group_of(q)} for q in live],
    }
