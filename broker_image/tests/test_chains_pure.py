"""The chain document's shape and the chain rules, on the worked example of docs/ordered.md."""

from __future__ import annotations

import pytest

from understudy_broker.chains import (
    GroupFacts,
    history_violations,
    initial_chains,
    step,
    still_head,
)
from understudy_broker.zklayout import ChainDoc, LayoutError, Link, chains_path

GROUPS = ("a", "b", "c")


def facts(*, down: tuple[str, ...] = (), backlog: tuple[str, ...] = (),
          view: int = 99) -> dict[str, GroupFacts]:
    return {g: GroupFacts(writable=g not in down, end=10, consumed=5 if g in backlog else 10,
                          view_epoch=view) for g in GROUPS}


def test_the_worked_example_of_the_docs() -> None:
    doc = initial_chains("t", GROUPS)
    assert (doc.send, doc.consume_groups(), doc.head) == (("a", "b", "c"), ("a",), "a")
    assert step(doc, facts(), GROUPS) is None  # healthy and nothing to drain: stays

    # a's master is killed: b is head and the consume tail in the same write.
    doc, why = step(doc, facts(down=("a",), backlog=("a",)), GROUPS) or (doc, "")
    assert doc.send == ("b", "c")
    assert doc.consume == (Link("a", 2), Link("b"))
    assert (doc.epoch, doc.head_epoch) == (2, 2)
    assert "b is head" in why
    # a still has a backlog, read through its acting slave: nothing moves.
    assert step(doc, facts(down=("a",), backlog=("a",)), GROUPS) is None

    # Consumers finish a: it leaves the consume chain.
    doc, _ = step(doc, facts(down=("a",)), GROUPS) or (doc, "")
    assert doc.consume == (Link("b"),)
    # a is back, healthy and empty: it joins the send chain's tail.
    doc, _ = step(doc, facts(), GROUPS) or (doc, "")
    assert doc.send == ("b", "c", "a")
    assert doc.epoch == 4
    # b's slave dies: c is head.
    doc, _ = step(doc, facts(down=("b",), backlog=("b",)), GROUPS) or (doc, "")
    assert doc.send == ("c", "a")
    assert doc.consume == (Link("b", 5), Link("c"))
    assert doc.head_epoch == 5
    doc.check(GROUPS)


def test_a_sealed_group_is_drained_only_once_its_reader_applied_the_sealing_epoch() -> None:
    doc = ChainDoc("t", ("b",), (Link("a", 7), Link("b")), epoch=7, head_epoch=7)
    # Reported with epoch 6 applied: a may still have taken a late write; wait.
    early = step(doc, facts(view=6), GROUPS)
    assert early is None or early[0].consume[0] == Link("a", 7)
    out = step(doc, facts(view=7), GROUPS)
    assert out is not None
    assert out[0].consume == (Link("b"),)


def test_a_group_with_a_backlog_never_joins_the_send_chain() -> None:
    doc = ChainDoc("t", ("b",), (Link("a", 2), Link("b")), epoch=2, head_epoch=2)
    # a is healthy and reports no backlog, but its consume link is still there: it must
    # leave the consume chain first (otherwise it could become head while consumers
    # still read its old messages).
    f = facts(view=1)  # a has not applied epoch 2: its link stays
    out = step(doc, f, GROUPS)
    assert out is not None
    assert "a" not in out[0].send  # c joins, a does not
    assert out[0].send == ("b", "c")


def test_a_group_in_neither_chain_joins_even_with_an_unacknowledged_leftover() -> None:
    """Found by bench/ordered.py: g2's master was hung with a batch appended and not yet on
    its slave; consumers drained g2 through the acting slave, g2 left the consume chain, and
    the master came back with that batch. Requiring no backlog kept g2 (and, once the send
    chain was empty, the topic) out for good: nobody reads a group in neither chain."""
    doc = ChainDoc("t", ("a",), (Link("a"),), epoch=5, head_epoch=4)
    f = facts(backlog=("b",))  # b: in neither chain, one unacknowledged message back
    out = step(doc, f, GROUPS)
    assert out is not None
    assert out[0].send == ("a", "b")
    empty = ChainDoc("t", (), (), epoch=5, head_epoch=4)  # the bench's stuck document
    out = step(empty, facts(down=("a",), backlog=("b",)), GROUPS)
    assert out is not None
    assert (out[0].send, out[0].consume) == (("b",), (Link("b"),))


def test_no_healthy_group_leaves_sends_waiting_and_the_first_healthy_one_becomes_head() -> None:
    doc = initial_chains("t", ("a",))
    doc, _ = step(doc, {"a": GroupFacts(False, 3, 3, 9)}, ("a",)) or (doc, "")
    assert doc.send == ()
    assert doc.consume == (Link("a", 2),)
    assert step(doc, {"a": GroupFacts(False, 3, 3, 9)}, ("a",)) is not None  # drained: leaves
    doc = ChainDoc("t", (), (), epoch=3, head_epoch=1)
    doc, why = step(doc, {"a": GroupFacts(True, 3, 3, 9)}, ("a",)) or (doc, "")
    assert doc.send == ("a",)
    assert doc.consume == (Link("a"),)
    assert doc.head_epoch == 4
    assert "send head" in why


def test_the_document_round_trips_and_has_its_own_znode() -> None:
    doc = ChainDoc("t", ("c", "a"), (Link("b", 5), Link("c")), epoch=5, head_epoch=5)
    assert ChainDoc.from_json(doc.to_json()) == doc
    assert chains_path("t") == "/ordered/t/chains"


@pytest.mark.parametrize(("doc", "message"), [
    (ChainDoc("t", ("a", "a"), (Link("a"),), 1, 1), "twice in the send chain"),
    (ChainDoc("t", ("a",), (Link("a"), Link("a")), 1, 1), "twice in the consume chain"),
    (ChainDoc("t", ("x",), (Link("x"),), 1, 1), "not on"),
    (ChainDoc("t", ("a",), (Link("b"),), 1, 1), "consume chain's tail"),
    (ChainDoc("t", ("a",), (Link("a", 1),), 1, 1), "consume chain's tail"),
    (ChainDoc("t", ("a", "b"), (Link("b", 1), Link("a")), 2, 2), "still hold a backlog"),
    (ChainDoc("t", ("b",), (Link("a"), Link("b")), 2, 2), "needs an until epoch"),
    (ChainDoc("t", ("b",), (Link("a", 9), Link("b")), 2, 2), "needs an until epoch"),
    (ChainDoc("t", ("a",), (Link("a"),), 1, 2), "headEpoch"),
])
def test_a_hand_edited_impossible_shape_is_refused_with_a_clear_error(
        doc: ChainDoc, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        doc.check(GROUPS)


@pytest.mark.parametrize("raw", [b"{", b"[]", b'{"topic": "t"}',
                                 b'{"topic": "t", "send": ["a"], "consume": [1], '
                                 b'"epoch": 1, "headEpoch": 1}'])
def test_a_malformed_document_is_a_layout_error(raw: bytes) -> None:
    with pytest.raises(LayoutError):
        ChainDoc.from_json(raw)


def test_consumed_upto_counts_every_consumer_group_that_committed_on_the_topic() -> None:
    from understudy_broker.chains import consumed_upto

    assert consumed_upto({}, "t", 0, end=9) == 9  # nobody consumes: nothing is held
    assert consumed_upto({"cg": {"other": {0: 1}}}, "t", 0, end=9) == 9
    offsets = {"a": {"t": {0: 7}}, "b": {"t": {0: 4}}}
    assert consumed_upto(offsets, "t", 0, end=9) == 4  # the slowest group
    # A group that committed on the topic but not yet on this queue has read none of it.
    assert consumed_upto({"a": {"t": {0: 7}}, "b": {"t": {1: 3}}}, "t", 0, end=9) == 0


def test_a_status_carries_each_ordered_topics_facts_and_old_statuses_still_parse() -> None:
    from understudy_broker.model import Permission
    from understudy_broker.zklayout import BrokerStatus, OrderedFacts

    st = BrokerStatus("g1-0", Permission.FULL, 3,
                      ordered={"t": OrderedFacts(9, 4, 2, groups=("a", "b"))})
    assert BrokerStatus.from_json(st.to_json()) == st
    old = b'{"broker": "g1-0", "effective": "FULL", "epochApplied": 3}'
    assert BrokerStatus.from_json(old).ordered == {}
    with pytest.raises(LayoutError):
        BrokerStatus.from_json(b'{"broker": "b", "effective": "FULL", "epochApplied": 1, '
                               b'"ordered": {"t": {"end": 1}}}')


def test_committed_groups_are_those_with_a_commit_on_the_topic() -> None:
    from understudy_broker.chains import committed_groups

    offsets = {"b": {"t": {0: 1}}, "a": {"t": {1: 0}}, "c": {"other": {0: 5}}}
    assert committed_groups(offsets, "t") == ("a", "b")


def test_a_chain_history_made_by_the_rules_is_clean_with_or_without_skipped_versions() -> None:
    docs = [initial_chains("t", GROUPS)]
    for f in (facts(down=("a",), backlog=("a",)), facts(down=("a",)), facts(),
              facts(down=("b",), backlog=("b",)), facts(down=("b",))):
        nxt = step(docs[-1], f, GROUPS)
        assert nxt is not None
        docs.append(nxt[0])
    assert history_violations(docs, GROUPS) == []
    assert history_violations(docs[::2], GROUPS) == []  # a watch that skipped versions
    assert history_violations([docs[0], docs[0], docs[-1]], GROUPS) == []


def test_a_chain_history_the_rules_cannot_make_is_reported() -> None:
    start = ChainDoc("t", ("a", "b"), (Link("a"),), 1, 1)
    # b became head but a's open link vanished in the same write: its rest is skipped.
    skipped = ChainDoc("t", ("b",), (Link("b"),), 2, 2)
    assert history_violations([start, skipped], GROUPS) == [
        "document 1: send ('b',), consume (b) at epoch 2 is no step of the rules from send "
        "('a', 'b'), consume (a)"]
    # Over a gap of versions (a watch that missed some), only the epoch is judged.
    assert history_violations([start, ChainDoc("t", ("b",), (Link("b"),), 3, 2)], GROUPS) == []
    same_epoch = ChainDoc("t", ("b",), (Link("a", 1), Link("b")), 1, 1)
    assert history_violations([start, same_epoch], GROUPS) == ["document 1: epoch 1 after 1"]
    bad = ChainDoc("t", ("b",), (Link("a"),), 2, 2)  # the head is not the consume tail
    assert "must be the consume chain's tail" in history_violations([bad], GROUPS)[0]


def test_an_ordered_write_is_acknowledged_only_by_the_head_that_appended_it() -> None:
    """A master frozen between an ordered write's append and its acknowledgement wakes
    after the chains moved on (found by bench/ordered.py): it must not acknowledge then."""
    doc = ChainDoc("t", ("a", "b"), (Link("a"),), epoch=3, head_epoch=3)
    assert still_head(doc, "a", 3, writes=True)
    assert not still_head(doc, "a", 3, writes=False)  # its WRITE lease lapsed while frozen
    moved = ChainDoc("t", ("b",), (Link("a", 4), Link("b")), epoch=4, head_epoch=4)
    assert not still_head(moved, "a", 3, writes=True)
    again = ChainDoc("t", ("a",), (Link("b", 6), Link("a")), epoch=6, head_epoch=6)
    assert not still_head(again, "a", 3, writes=True)  # head again, but a later stint
    assert not still_head(None, "a", 3, writes=True)


def test_an_ordered_topic_on_one_group_keeps_order_but_sends_wait_while_it_is_down() -> None:
    """`--ordered` over one group is allowed (docs/ordered.md "Creating one"): there is no
    other group to send to, so sends wait while it cannot keep two copies, and the group
    is head again once it is back and its consumers read what it held."""
    one = ("g1",)
    doc = initial_chains("t", one)
    assert (doc.send, doc.consume) == (("g1",), (Link("g1"),))
    down = {"g1": GroupFacts(writable=False, end=10, consumed=5, view_epoch=99)}
    doc, why = step(doc, down, one) or (doc, "")
    assert doc.send == ()
    assert "no group can (sends wait)" in why
    assert step(doc, down, one) is None  # nothing to do until it is back or drained
    back = {"g1": GroupFacts(writable=True, end=10, consumed=10, view_epoch=99)}
    doc, _ = step(doc, back, one) or (doc, "")  # drained: it leaves the consume chain
    doc, _ = step(doc, back, one) or (doc, "")  # healthy: head again
    assert (doc.send, doc.consume) == (("g1",), (Link("g1"),))
    doc.check(one)
