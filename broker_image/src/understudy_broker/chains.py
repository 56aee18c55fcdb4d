"""How the send and consume chains of an ordered topic evolve (pure; docs/ordered.md).

Why this module exists: an ordered topic spans several broker groups, but only one of them
(the send head) takes its writes at a time, and consumers drain the groups in the order in
which they were heads (seed 002). Every rule that moves a chain lives here, without I/O:
the controller reads ``/ordered/<topic>/chains`` with its version and what the groups
report, calls :func:`step`, and writes the result with a versioned write; a loser re-reads.
One change per call, so every intermediate document is one the model check has seen.

The rules, in the order :func:`step` applies them:

1. A send head that cannot take writes with two copies (its master or its in-sync slave is
   gone) leaves the send chain at once; its consume link is sealed at the new epoch. The
   next send-chain group becomes head and is appended to the consume chain in the same
   write, so no producer can learn of a head that consumers do not know.
2. A waiting send-chain group that is not healthy leaves the send chain.
3. The consume head leaves when it is sealed, its reader has applied the sealing epoch (its
   log of the topic is final) and every consumer group has consumed it to the end.
4. A healthy group that is in neither chain joins the send chain's tail (and, when the
   send chain was empty, becomes head and the consume tail). It is drained of everything
   acknowledged on it: it left the consume chain only when drained (rule 3) and has been
   no head since. A backlog it shows can only be what its master appended and never got
   to a slave before it died or hung (never acknowledged), back with the master.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from understudy_broker.model import Snapshot
from understudy_broker.zklayout import ChainDoc, LayoutError, Link


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """What the controller knows of one group for one ordered topic.

    ``writable``: the group is NORMAL, its master holds WRITE and enough in-sync slaves
    for two copies. ``end``: the group's log end of the topic, as its reader reported it
    after applying chain epoch ``view_epoch``. ``consumed``: the lowest offset committed on
    that queue over the topic's consumer groups (``end`` when none has subscribed yet)."""

    writable: bool
    end: int
    consumed: int
    view_epoch: int

    @property
    def no_backlog(self) -> bool:
        return self.consumed >= self.end


def consumed_upto(offsets: Snapshot, topic: str, queue: int, end: int) -> int:
    """The lowest committed offset of ``queue`` over the consumer groups that committed
    anything on ``topic`` (one that has not reached this queue yet counts as 0); ``end``
    when no consumer group has committed on the topic. A consumer group counts from its
    first commit on the topic: one that subscribed and never committed does not hold a
    group in the consume chain (docs/ordered.md)."""
    groups = [queues for topics in offsets.values() if (queues := topics.get(topic))]
    if not groups:
        return end
    return min(queues.get(queue, 0) for queues in groups)


def committed_groups(offsets: Snapshot, topic: str) -> tuple[str, ...]:
    """The consumer groups that committed anything on ``topic`` (the ones
    :func:`consumed_upto` counts)."""
    return tuple(sorted(g for g, topics in offsets.items() if topics.get(topic)))


def initial_chains(topic: str, groups: Sequence[str]) -> ChainDoc:
    """A new ordered topic: every group waits in the send chain, the first is head."""
    if not groups:
        raise ValueError("an ordered topic needs at least one group")
    return ChainDoc(topic, tuple(groups), (Link(groups[0]),), epoch=1, head_epoch=1)


def drained(link: Link, facts: GroupFacts | None) -> bool:
    """The link's log of the topic is final and every consumer group consumed it."""
    return (link.until is not None and facts is not None
            and facts.view_epoch >= link.until and facts.no_backlog)


def step(doc: ChainDoc, facts: Mapping[str, GroupFacts],
         groups: Sequence[str]) -> tuple[ChainDoc, str] | None:
    """The next change of ``doc`` given ``facts`` (a group without facts is neither
    writable nor drained), or None. ``groups``: the topic's groups, in topic order."""
    nxt = doc.epoch + 1

    def ok(g: str) -> bool:
        f = facts.get(g)
        return f is not None and f.writable

    if doc.send and not ok(doc.send[0]):
        old, rest = doc.send[0], doc.send[1:]
        links = (*doc.consume[:-1], Link(old, nxt))
        if rest:
            return (replace(doc, send=rest, consume=(*links, Link(rest[0])), epoch=nxt,
                            head_epoch=nxt),
                    f"send head {old} cannot take writes with two copies; {rest[0]} is head")
        return (replace(doc, send=(), consume=links, epoch=nxt),
                f"send head {old} cannot take writes with two copies; no group can (sends wait)")
    for g in doc.send[1:]:
        if not ok(g):
            return (replace(doc, send=tuple(x for x in doc.send if x != g), epoch=nxt),
                    f"{g} is not healthy; it leaves the send chain")
    if doc.consume and drained(doc.consume[0], facts.get(doc.consume[0].group)):
        return (replace(doc, consume=doc.consume[1:], epoch=nxt),
                f"{doc.consume[0].group} is drained; consumers move on")
    # A group in neither chain left the consume chain drained (rule 3) and has been no head
    # since: every message acknowledged on it was read. What it may hold beyond that was
    # appended by a master that died or hung before a slave had it (so never acknowledged)
    # and came back with the master; it must not keep the group out of the send chain for
    # good (nobody would ever read it), so it is read when the group is next head.
    busy = set(doc.send) | set(doc.consume_groups())
    for g in groups:
        f = facts.get(g)
        if g in busy or f is None or not f.writable:
            continue
        if doc.send:
            return (replace(doc, send=(*doc.send, g), epoch=nxt),
                    f"{g} is healthy and drained; it joins the send chain")
        return (replace(doc, send=(g,), consume=(*doc.consume, Link(g)), epoch=nxt,
                        head_epoch=nxt),
                f"{g} is healthy and drained; it is the send head")
    return None


def still_head(chains: ChainDoc | None, group: str, head_epoch: int, writes: bool) -> bool:
    """May ``group``'s master acknowledge an ordered write it appended while it was send
    head at ``head_epoch``? Only if it still writes and is still that head: a master frozen
    between the append and the acknowledgement wakes after the chains moved on, and an
    acknowledgement then would come after writes the new head acknowledged."""
    return (writes and chains is not None and chains.head == group
            and chains.head_epoch == head_epoch)


def history_violations(docs: Sequence[ChainDoc], groups: Sequence[str]) -> list[str]:
    """What is wrong with a sequence of chain documents as a watcher saw them (the drill
    records one):

    - every document is a shape the rules reach (:meth:`ChainDoc.check`), so the send head
      is always the consume chain's open tail (consumers knew of it before producers);
    - a changed document has a greater epoch;
    - a document one epoch after the one before is what :func:`step` makes of that one for
      *some* facts of the groups (every fact combination is tried: writable or not, with a
      backlog or not, the sealing epoch applied or not). A watch that skipped versions
      (written within one ZooKeeper round trip) leaves a gap of more than one epoch, over
      which only the epoch is checked.
    """
    out: list[str] = []
    for i, doc in enumerate(docs):
        try:
            doc.check(groups)
        except LayoutError as exc:
            out.append(f"document {i}: {exc}")
    for i, (a, b) in enumerate(itertools.pairwise(docs), start=1):
        if a == b:
            continue
        if b.epoch <= a.epoch:
            out.append(f"document {i}: epoch {b.epoch} after {a.epoch}")
        elif b.epoch == a.epoch + 1 and b not in _successors(a, groups):
            out.append(f"document {i}: send {b.send}, consume {_names(b)} at epoch {b.epoch} "
                       f"is no step of the rules from send {a.send}, consume {_names(a)}")
    return out


def _successors(doc: ChainDoc, groups: Sequence[str]) -> set[ChainDoc]:
    """Every document :func:`step` makes of ``doc``, over every combination of facts."""
    kinds = [GroupFacts(writable=w, end=1, consumed=1 if empty else 0, view_epoch=view)
             for w in (True, False) for empty in (True, False) for view in (0, 1 << 40)]
    out: set[ChainDoc] = set()
    for combo in itertools.product(kinds, repeat=len(groups)):
        nxt = step(doc, dict(zip(groups, combo, strict=True)), groups)
        if nxt is not None:
            out.add(nxt[0])
    return out


def _names(doc: ChainDoc) -> str:
    return "(" + ", ".join(doc.consume_groups()) + ")"
