"""Model check: the send and consume chains of an ordered topic (``chains.step``) over
random interleavings of group failures, recoveries, sends, consumption and two controllers
acting on stale snapshots, asserting invariant 7 (order) and no loss in every state.

The world (docs/ordered.md "Model check"):

- ZooKeeper holds ``/ordered/<topic>/chains`` with a version; a write names the version it
  read (compare-and-set), so a controller acting on an old snapshot loses.
- Each group has a log of the topic (message ids), is writable (healthy, two copies) or
  not, and has a *reader* whose applied chain epoch trails ZooKeeper's until a watch is
  delivered; it reports ``end`` and its applied epoch to controllers.
- The one producer sends the next id to the group it believes is head; the group appends
  it only while ZooKeeper names it send head and its reader has applied that headship
  (what the send lease enforces in the broker, docs/ordered.md "Fencing the send head").
  A head's master may also append an id and die before its slave has it: the id is not
  acknowledged, readers (the acting slave) do not see it, and it is back in the group's
  log when the master recovers (found by bench/ordered.py).
- The consumer group reads the consume head's log from its position, in order, and
  commits each delivery; the controllers read the committed position, possibly stale.
- Two controllers each snapshot (document, version, facts) and act later with
  ``chains.step``.

Invariants after every step: the document passes ``ChainDoc.check``; a writable group
in neither chain is taken back by a step with current facts (no dead end); the deliveries of
acknowledged ids are a prefix of the acknowledgement order (invariant 7); every acknowledged id not yet delivered
is in the log of a consume-chain group at or after the consumer's position there (nothing
acknowledged is skipped).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from understudy_broker.chains import GroupFacts, initial_chains, step
from understudy_broker.zklayout import ChainDoc

GROUPS = ("a", "b", "c")


@dataclass
class Group:
    view: ChainDoc  # the chain document the group's brokers have applied (trails ZooKeeper)
    log: list[int] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)  # on the dead master only: unacknowledged
    writable: bool = True
    confirmed: bool = True  # its send lease: confirmed by reading ZooKeeper, lapses by time

    @property
    def view_epoch(self) -> int:
        return self.view.epoch


@dataclass
class Snapshot:
    doc: ChainDoc
    version: int
    facts: dict[str, GroupFacts]


class Chains(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.doc = initial_chains("t", GROUPS)
        self.version = 0
        self.groups = {g: Group(self.doc) for g in GROUPS}
        self.position = {g: 0 for g in GROUPS}  # the consumer group's committed offsets
        self.reported = dict(self.position)  # what controllers see (may trail)
        self.next_id = 0
        self.acked: list[int] = []
        self.delivered: list[int] = []
        self.snapshots: list[Snapshot | None] = [None, None]
        self.producer_head: str | None = self.doc.head
        self.writes = 0

    # ---- faults ---------------------------------------------------------------------
    @rule(g=st.sampled_from(GROUPS))
    def fail(self, g: str) -> None:
        self.groups[g].writable = False

    @rule(g=st.sampled_from(GROUPS))
    def recover(self, g: str) -> None:
        grp = self.groups[g]
        grp.writable = True
        grp.log += grp.tail  # the master is back: its slave catches up on what it lacked
        grp.tail = []

    @rule(g=st.sampled_from(GROUPS))
    def deliver_watch(self, g: str) -> None:
        """A watch or a lease renewal: the group applies ZooKeeper's document."""
        self.groups[g].view = self.doc
        self.groups[g].confirmed = True

    @rule(g=st.sampled_from(GROUPS))
    def lease_lapses(self, g: str) -> None:
        self.groups[g].confirmed = False

    # ---- clients --------------------------------------------------------------------
    @rule()
    def producer_learns_route(self) -> None:
        self.producer_head = self.doc.head

    @rule()
    def send(self) -> None:
        h = self.producer_head
        if h is None:
            return
        grp = self.groups[h]
        if not (grp.writable and grp.confirmed and grp.view.head == h):
            return  # refused: cannot keep two copies, or its applied chains name another head
        if any(k != h and o.confirmed and o.view.head == k for k, o in self.groups.items()):
            # Another group still holds a send lease as head: a new head takes its first
            # write one lease after its epoch, when every older head's lease has lapsed.
            return
        grp.log.append(self.next_id)
        self.acked.append(self.next_id)
        self.next_id += 1

    @rule()
    def head_dies_after_appending(self) -> None:
        """The head's master appends the next id and dies before its slave has it: the
        send fails (not acknowledged; the producer may send it again, as a new id here)."""
        h = self.producer_head
        if h is None:
            return
        grp = self.groups[h]
        if not (grp.writable and grp.confirmed and grp.view.head == h):
            return
        grp.tail.append(self.next_id)
        self.next_id += 1
        grp.writable = False

    @rule()
    def consume(self) -> None:
        if not self.doc.consume:
            return
        g = self.doc.consume[0].group
        pos = self.position[g]
        if pos < len(self.groups[g].log):  # read through the master or the acting slave
            self.delivered.append(self.groups[g].log[pos])
            self.position[g] = pos + 1

    @rule(g=st.sampled_from(GROUPS))
    def report_commit(self, g: str) -> None:
        self.reported[g] = self.position[g]

    # ---- controllers ----------------------------------------------------------------
    def facts(self) -> dict[str, GroupFacts]:
        return {g: GroupFacts(writable=grp.writable, end=len(grp.log),
                              consumed=self.reported[g], view_epoch=grp.view_epoch)
                for g, grp in self.groups.items()}

    @rule(c=st.sampled_from((0, 1)))
    def snapshot(self, c: int) -> None:
        self.snapshots[c] = Snapshot(self.doc, self.version, self.facts())

    @precondition(lambda self: any(s is not None for s in self.snapshots))
    @rule(c=st.sampled_from((0, 1)))
    def act(self, c: int) -> None:
        snap = self.snapshots[c]
        if snap is None:
            return
        out = step(snap.doc, snap.facts, GROUPS)
        if out is None:
            return
        new, _reason = out
        if snap.version != self.version:
            self.snapshots[c] = None  # lost the compare-and-set: re-read later
            return
        self.doc, self.version = new, self.version + 1
        self.writes += 1
        self.snapshots[c] = Snapshot(new, self.version, snap.facts)  # may act again, stale

    # ---- invariants -----------------------------------------------------------------
    @invariant()
    def shape(self) -> None:
        self.doc.check(GROUPS)

    @invariant()
    def order(self) -> None:
        acked = set(self.acked)
        got = [i for i in self.delivered if i in acked]
        assert got == self.acked[: len(got)], (
            f"delivered {got} is not a prefix of acknowledged {self.acked}")

    @invariant()
    def no_group_is_left_out(self) -> None:
        """No dead end: a writable group in neither chain (nobody reads it, nobody sends to
        it) is taken back by a controller with current facts."""
        doc, facts = self.doc, self.facts()
        for _ in range(4 * len(GROUPS)):  # steps with these facts, to their fixed point
            out = step(doc, facts, GROUPS)
            if out is None:
                break
            doc = out[0]
        busy = set(doc.send) | set(doc.consume_groups())
        left_out = [g for g, grp in self.groups.items() if grp.writable and g not in busy]
        assert not left_out, f"{left_out} left out of {doc} for good, with {facts}"

    @invariant()
    def nothing_skipped(self) -> None:
        acked = set(self.acked)
        pending = acked - set(self.delivered)
        reachable = set()
        for link in self.doc.consume:
            log = self.groups[link.group].log
            reachable.update(log[self.position[link.group]:])
        assert pending <= reachable, f"acknowledged ids out of every consumer's reach: " \
                                     f"{sorted(pending - reachable)}"


Chains.TestCase.settings = settings(
    max_examples=1000, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_chains_keep_order_and_lose_nothing = Chains.TestCase
