"""Planning a topic's queues over broker groups: create, alter, delete (pure).

Why this module exists: `understudy topic create|alter|delete`, the broker that serves
them and the operator's BrokerTopic handler must agree on what a request does to
``/topics/<topic>`` and on what it refuses. Every rule lives here, without I/O: the
caller reads the current document, the known groups and the backlog, calls a planner,
and writes the result with a versioned write (DESIGN "Topics across groups").

Placement interleaves groups (queue 0 on the first group, queue 1 on the second, ...),
so round-robin over queue ids alternates groups. Queue ids are stable: a removed queue
becomes ``None`` and its id is never reused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final

from understudy_broker.model import check_topic_name
from understudy_broker.zklayout import LayoutError, TopicDoc, check_name

MAX_QUEUES_PER_GROUP: Final = 1024
MAX_QUEUES: Final = 4096


class TopicPlanError(ValueError):
    """A topic request that cannot be carried out; nothing was changed. ``code`` is a
    short machine-readable reason (``unknown-group``, ``backlog``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_ORDERED_QUEUES: Final = ("an ordered topic has one queue per group: strict order needs one "
                          "sequence per group (omit --queues-per-group, or pass 1)")


def _check_groups(groups: Sequence[str], known: Collection[str]) -> None:
    if not groups:
        raise TopicPlanError("no-groups", "a topic needs at least one group (--groups g1,g2)")
    for g in groups:
        try:
            check_name("group", g)
        except LayoutError as exc:
            raise TopicPlanError("bad-group", str(exc)) from None
    dup = sorted({g for g in groups if list(groups).count(g) > 1})
    if dup:
        raise TopicPlanError("duplicate-group", f"group {dup[0]!r} is listed twice")
    unknown = [g for g in groups if g not in known]
    if unknown:
        have = ", ".join(sorted(known)) or "none"
        raise TopicPlanError("unknown-group",
                             f"unknown group {unknown[0]!r}: the cluster's groups are {have}")


def _check_count(per_group: int) -> None:
    if not 1 <= per_group <= MAX_QUEUES_PER_GROUP:
        raise TopicPlanError("bad-queues",
                             f"--queues-per-group must be 1..{MAX_QUEUES_PER_GROUP}, got {per_group}")


def _interleave(groups: Sequence[str], per_group: int) -> list[str | None]:
    return [g for _ in range(per_group) for g in groups]


def plan_create(name: str, groups: Sequence[str], per_group: int, *, known_groups: Collection[str],
                ordered: bool = False, retention_hours: int | None = None) -> TopicDoc:
    """The document of a new topic: ``per_group`` queues on each of ``groups``."""
    try:
        check_topic_name(name)
    except ValueError as exc:
        raise TopicPlanError("bad-name", str(exc)) from None
    _check_groups(groups, known_groups)
    _check_count(per_group)
    if ordered and per_group != 1:
        raise TopicPlanError("ordered-queues", _ORDERED_QUEUES)
    if retention_hours is not None and retention_hours < 1:
        raise TopicPlanError("bad-retention", "retention must be at least 1 hour")
    return TopicDoc(name, tuple(_interleave(groups, per_group)), ordered, retention_hours)


def plan_alter(doc: TopicDoc, *, known_groups: Collection[str], add_groups: Sequence[str] = (),
               remove_groups: Sequence[str] = (), queues_per_group: int | None = None,
               backlog: Mapping[int, int] | None = None, force: bool = False) -> TopicDoc:
    """Add groups, grow or shrink the queues per group, remove groups.

    A queue is removed only when ``backlog`` (queue -> unconsumed messages, as the caller
    measured it) says it holds nothing, or with ``force``. New groups get
    ``queues_per_group`` queues, or as many as the topic has per group now.
    """
    queues: list[str | None] = list(doc.queues)
    current = doc.groups()
    for g in add_groups:
        if g in current:
            raise TopicPlanError("duplicate-group", f"topic {doc.name!r} already has queues on {g!r}")
    if add_groups:
        _check_groups(add_groups, known_groups)
    for g in remove_groups:
        if g not in current:
            raise TopicPlanError("not-a-member", f"topic {doc.name!r} has no queues on group {g!r}")
    if queues_per_group is not None:
        _check_count(queues_per_group)
    if doc.ordered and queues_per_group not in (None, 1):
        raise TopicPlanError("ordered-queues", _ORDERED_QUEUES)
    if doc.ordered and remove_groups:
        raise TopicPlanError(
            "ordered-remove", f"topic {doc.name!r} is ordered: removing a group from its "
            "chains is not supported yet (the group would first have to leave the send chain "
            "and be drained from the consume chain; docs/ordered.md)")
    per_now = max((len(doc.queues_of(g)) for g in current), default=1)
    per = queues_per_group if queues_per_group is not None else per_now
    removed: list[int] = [q for q, g in enumerate(queues) if g in remove_groups]
    kept_groups = [g for g in current if g not in remove_groups]
    for g in kept_groups:
        mine = [q for q, x in enumerate(queues) if x == g]
        if len(mine) > per:
            removed.extend(mine[per:])
    have = {g: len(doc.queues_of(g)) for g in kept_groups}
    adds: list[str | None] = []
    for i in range(per):  # round i: every group short of i+1 queues gets one more
        adds.extend(g for g in kept_groups if have[g] <= i)
        adds.extend(add_groups)
    if removed and not force:
        held = {q: (backlog or {}).get(q) for q in removed}
        busy = sorted(q for q, n in held.items() if n is None or n > 0)
        if busy:
            what = ", ".join(
                f"{q} ({held[q]} unconsumed)" if held[q] is not None else f"{q} (backlog unknown)"
                for q in busy[:5]
            )
            raise TopicPlanError(
                "backlog",
                f"queue{'s' if len(busy) > 1 else ''} {what} of topic {doc.name!r} "
                "still hold messages; consume them first or pass --force to drop them",
            )
    for q in removed:
        queues[q] = None
    queues.extend(adds)
    if not any(g is not None for g in queues):
        raise TopicPlanError("no-queues", "an alter may not remove every queue: delete the topic")
    if len(queues) > MAX_QUEUES:
        raise TopicPlanError("bad-queues", f"a topic may have at most {MAX_QUEUES} queue ids")
    return TopicDoc(doc.name, tuple(queues), doc.ordered, doc.retention_hours)


def check_delete(doc: TopicDoc, *, backlog: Mapping[int, int] | None, force: bool) -> None:
    """Refuse to delete a topic whose queues hold unconsumed messages, unless ``force``."""
    if force:
        return
    busy = sorted(q for q in doc.live_queues() if (backlog or {}).get(q, 1) > 0)
    if busy:
        raise TopicPlanError(
            "backlog",
            f"topic {doc.name!r} still holds unconsumed messages on queue(s) "
            f"{', '.join(map(str, busy[:8]))}; pass --force to delete it anyway",
        )
