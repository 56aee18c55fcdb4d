"""Queue ownership for consumer groups: sticky, balanced, handed over in two steps (pure).

Why this module exists: brokers hold a consumer group's membership and queue ownership
(DESIGN "Topics across groups", invariant 6). Any broker hosting a member may recompute
the assignment and write it with a versioned write; because the result is a pure
function of (current assignment, live members, live queues), brokers racing each other
converge: the loser re-reads, recomputes and finds nothing left to do.

Rules, per topic, over the members subscribed to it:

- **Balanced**: queue counts differ by at most one. A queue counts for its *target*: the
  member it is being handed to (``next``) or else its owner.
- **Sticky**: a member keeps its queues up to its quota; only the surplus moves, and the
  members that hold most keep the extra ones. A join or a clean leave moves the minimum.
- **Two-step hand-over** (what keeps invariant 6): a queue owned by a live member is never
  given away directly; it is marked ``next=<taker>``. The owner stops pulling, commits,
  and releases (:func:`release`); only then does the taker own it. A queue whose owner is
  gone (clean leave, or its session expired) goes straight to its taker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from understudy_broker.zklayout import AssignmentDoc, Owner, QueueKey


def rebalance(
    current: Mapping[QueueKey, Owner],
    members: Mapping[str, Iterable[str]],
    queues: Mapping[str, Sequence[int]],
) -> dict[QueueKey, Owner]:
    """The next ownership map. ``members``: live member -> topics it subscribes to;
    ``queues``: topic -> its live queue ids."""
    out: dict[QueueKey, Owner] = {}
    for topic in sorted(queues):
        subscribed = sorted(m for m, ts in members.items() if topic in set(ts))
        mine = {q: o for (t, q), o in current.items() if t == topic}
        for q, o in _rebalance_topic(mine, subscribed, list(queues[topic])).items():
            out[(topic, q)] = o
    return out


def _rebalance_topic(current: Mapping[int, Owner], members: list[str],
                     queues: list[int]) -> dict[int, Owner]:
    if not members:
        return {}
    live = set(members)
    holder: dict[int, str] = {}  # a live member that holds (may pull) the queue now
    target: dict[int, str] = {}  # where the queue is heading
    # Queues whose holder was handing them to a member that left: back with the holder
    # for now, but not ones it was meant to keep.
    fell_back: set[int] = set()
    for q in sorted(set(queues)):
        o = current.get(q)
        if o is None:
            continue
        if o.member in live:
            holder[q] = o.member
            target[q] = o.next if o.next in live else o.member
            if o.next is not None and o.next not in live:
                fell_back.add(q)
        elif o.next in live:
            target[q] = o.next  # the holder is gone: its taker needs no release
    all_queues = sorted(set(queues))
    heading: dict[str, list[int]] = {x: [] for x in members}
    for q, x in target.items():
        heading[x].append(q)
    base, extra = divmod(len(all_queues), len(members))
    # The members heading for most keep the extra queues (fewest moves); ties by name.
    ranked = sorted(members, key=lambda x: (-len(heading[x]), x))
    quota = {x: base + (1 if i < extra else 0) for i, x in enumerate(ranked)}
    desired: dict[int, str] = {}
    pool: list[int] = [q for q in all_queues if q not in target]
    for x in members:
        # Keep what x was meant to keep, then what it already holds before what is still
        # being handed to it; low ids first. (Hypothesis found the case: a holder whose
        # hand-overs never completed kept a fallen-back queue and gave away one it was
        # meant to keep.)
        keep = sorted(heading[x], key=lambda q: (q in fell_back, holder.get(q) != x, q))
        for q in keep[: quota[x]]:
            desired[q] = x
        pool.extend(keep[quota[x]:])
    count = {x: sum(1 for q in desired if desired[q] == x) for x in members}
    for q in sorted(pool):
        # Back to its holder when the holder has room (cancels a hand-over), else to the
        # member furthest below its quota.
        h = holder.get(q)
        if h is not None and count[h] < quota[h]:
            x = h
        else:
            x = min(members, key=lambda y: (count[y] - quota[y], y))
        desired[q] = x
        count[x] += 1
    out: dict[int, Owner] = {}
    for q, x in desired.items():
        h = holder.get(q)
        out[q] = Owner(x) if h is None or h == x else Owner(h, x)
    return out


def release(current: Mapping[QueueKey, Owner], member: str,
            keys: Iterable[QueueKey]) -> dict[QueueKey, Owner]:
    """``member`` committed and stopped pulling ``keys``: each one it owned and was handing
    over now belongs to its taker."""
    out = dict(current)
    for k in keys:
        o = out.get(k)
        if o is not None and o.member == member and o.next is not None:
            out[k] = Owner(o.next)
    return out


def leave(current: Mapping[QueueKey, Owner], member: str) -> dict[QueueKey, Owner]:
    """``member`` left cleanly (it committed first): its queues go to their takers or are
    free for the next rebalance."""
    out: dict[QueueKey, Owner] = {}
    for k, o in current.items():
        if o.member == member:
            if o.next is not None:
                out[k] = Owner(o.next)
        elif o.next == member:
            out[k] = Owner(o.member)
        else:
            out[k] = o
    return out


def advance(doc: AssignmentDoc, owners: Mapping[QueueKey, Owner]) -> AssignmentDoc | None:
    """The next document, or None when ``owners`` changes nothing."""
    if dict(owners) == doc.owners:
        return None
    return AssignmentDoc(doc.generation + 1, dict(owners))


def view_of(doc: AssignmentDoc, member: str) -> tuple[list[QueueKey], list[QueueKey]]:
    """What a member is told: the queues it may pull, and among them those it must
    commit and release now."""
    owned = doc.owned_by(member)
    return owned, [k for k in owned if doc.owners[k].next is not None]
