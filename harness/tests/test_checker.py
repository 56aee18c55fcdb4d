"""The invariant checker over hand-built histories: every category, including the ones
that must report zero. Times are written in milliseconds and converted to the history's
nanoseconds by ``ms()``."""

from __future__ import annotations

from typing import Any

import pytest

from understudy_harness.checker import check, percentile
from understudy_harness.history import HistoryError

T = "orders"


def ms(x: float) -> int:
    return int(x * 1_000_000)


def ack(t: float, id: str, queue: int = 0, offset: int = 0) -> dict[str, Any]:
    return {"type": "produce_ack", "t": ms(t), "id": id, "topic": T, "queue": queue, "offset": offset}


def dlv(t: float, id: str, offset: int, *, cg: str = "cg1", queue: int = 0) -> dict[str, Any]:
    return {"type": "deliver", "t": ms(t), "cgroup": cg, "topic": T, "queue": queue, "offset": offset, "id": id}


def commit(t: float, offset: int, *, cg: str = "cg1", queue: int = 0) -> dict[str, Any]:
    return {"type": "commit", "t": ms(t), "cgroup": cg, "topic": T, "queue": queue, "offset": offset}


def perm(t: float, broker: str, eff: str, *, group: str = "g1") -> dict[str, Any]:
    return {"type": "perm", "t": ms(t), "group": group, "broker": broker, "effective": eff}


def mode(t: float, m: str, epoch: int, *, group: str = "g1") -> dict[str, Any]:
    return {"type": "mode", "t": ms(t), "group": group, "mode": m, "epoch": epoch}


def fault(t: float, cycle: int = 1, broker: str = "g1-0", *, group: str = "g1") -> dict[str, Any]:
    return {"type": "fault", "t": ms(t), "cycle": cycle, "kind": "kill", "broker": broker, "group": group}


def messages(n: int, *, t0: float = 0.0) -> list[dict[str, Any]]:
    """n acked messages, each delivered once and committed: a clean run."""
    out = []
    for i in range(n):
        out += [ack(t0 + i, f"m{i}", offset=i), dlv(t0 + i + 0.5, f"m{i}", i), commit(t0 + i + 0.6, i + 1)]
    return out


# ------------------------------------------------------------------ clean and lost


def test_clean_history_reports_zero_everywhere() -> None:
    report = check([*messages(5), perm(0, "g1-0", "FULL"), perm(0, "g1-1", "NONE")])
    assert report.ok
    assert report.violations == []
    assert (report.acked, report.delivered) == (5, 5)
    assert report.lost_acked == 0
    assert report.duplicates_inflight == report.duplicates_rewind == report.duplicates_produce == 0
    assert report.offset_rewinds == 0
    assert report.one_reader_violations == 0
    assert report.one_reader_overlap_s == 0.0
    assert report.skipped == {"cg1": 0}


def test_empty_history_is_clean() -> None:
    report = check([])
    assert report.ok
    assert report.acked == 0
    assert report.to_json()["reads_restored_ms_p99"] is None


def test_acked_but_never_delivered_is_lost() -> None:
    report = check([*messages(3), ack(10, "lost-1", offset=3), ack(11, "lost-2", offset=4)])
    assert report.lost_acked == 2
    assert report.lost_examples == ("lost-1", "lost-2")
    assert not report.ok
    assert "2 acknowledged message(s) lost" in report.violations


def test_unacked_produce_that_never_arrives_is_not_lost() -> None:
    # a send whose ack never came is not a promise: only produce_ack counts
    report = check(messages(3))
    assert report.lost_acked == 0


def test_message_received_by_one_group_but_not_another_is_skipped() -> None:
    history = [*messages(2), dlv(5, "m0", 0, cg="cg2")]
    report = check(history)
    assert report.lost_acked == 0
    assert report.skipped == {"cg1": 0, "cg2": 1}
    assert not report.ok


# ------------------------------------------------------------------ duplicates


def test_redelivery_of_uncommitted_record_after_crash_is_in_flight() -> None:
    history = [
        ack(0, "a", offset=0), ack(0, "b", offset=1),
        dlv(1, "a", 0), commit(2, 1),  # offset 0 committed (next to read: 1)
        dlv(3, "b", 1),  # delivered, not yet committed
        fault(4),
        dlv(5, "b", 1),  # redelivered after the crash: the at-least-once window
        commit(6, 2),
    ]
    report = check(history)
    assert report.duplicates_inflight == 1
    assert report.duplicates_rewind == 0
    assert report.ok


def test_redelivery_of_committed_record_is_a_rewind() -> None:
    history = [
        ack(0, "a", offset=0), ack(0, "b", offset=1),
        dlv(1, "a", 0), dlv(1.5, "b", 1), commit(2, 2),  # both committed
        fault(4),
        dlv(5, "b", 1),  # the broker handed back a committed record
    ]
    report = check(history)
    assert report.duplicates_rewind == 1
    assert report.duplicates_inflight == 0
    assert "1 duplicate(s) from a rewind" in report.violations


def test_redelivery_without_any_disruption_is_a_rewind() -> None:
    history = [ack(0, "a"), dlv(1, "a", 0), dlv(2, "a", 0)]
    report = check(history)
    assert report.duplicates_rewind == 1


def test_commit_after_the_crash_does_not_excuse_or_convict() -> None:
    # the committed offset is taken as of the crash, not as of the redelivery
    history = [
        ack(0, "a"), dlv(1, "a", 0), fault(2), commit(3, 1), dlv(4, "a", 0),
    ]
    report = check(history)
    assert report.duplicates_inflight == 1


def test_failback_mode_change_is_a_disruption() -> None:
    # records read from the acting slave but not committed when it dropped READ
    history = [
        ack(0, "a"), fault(1), mode(1.1, "SLAVE_CONSUME", 3),
        dlv(2, "a", 0), mode(3, "RECOVERING", 4), mode(3.2, "NORMAL", 5), dlv(4, "a", 0),
    ]
    report = check(history)
    assert report.duplicates_inflight == 1
    assert report.duplicates_rewind == 0


def test_redelivery_in_another_consumer_group_is_independent() -> None:
    history = [ack(0, "a"), dlv(1, "a", 0, cg="cg1"), dlv(2, "a", 0, cg="cg2")]
    report = check(history)
    assert report.duplicates_inflight == report.duplicates_rewind == report.duplicates_produce == 0


def test_same_id_on_another_queue_is_produced_twice_not_a_rewind() -> None:
    """A retry moved to another group after an ambiguous failure: at-least-once."""
    history = [ack(0, "a", offset=0), ack(1, "a", offset=0), dlv(2, "a", 0),
               dlv(3, "a", 0, queue=1)]
    report = check(history)
    assert (report.duplicates_produce, report.duplicates_same_queue) == (1, 0)
    assert report.duplicates_rewind == 0
    assert report.ok


def test_same_id_twice_on_one_queue_breaks_invariant_8() -> None:
    history = [ack(0, "a", offset=0), ack(1, "a", offset=1), dlv(2, "a", 0), dlv(3, "a", 1)]
    report = check(history)
    assert (report.duplicates_produce, report.duplicates_same_queue) == (1, 1)
    assert report.duplicates_rewind == 0
    assert report.violations == [
        "1 message(s) stored twice on the same queue by a retried send (invariant 8)"]
    assert report.to_json()["duplicates_same_queue"] == 1


# ------------------------------------------------------------------ offset rewinds


def test_committed_offset_going_back_is_a_rewind() -> None:
    history = [commit(1, 5), commit(2, 7), commit(3, 6), commit(4, 8)]
    report = check(history)
    assert report.offset_rewinds == 1
    (r,) = report.rewind_examples
    assert (r.previous, r.offset, r.queue) == (7, 6, 0)


def test_equal_commits_and_other_queues_are_not_rewinds() -> None:
    history = [
        commit(1, 5, queue=0), commit(2, 5, queue=0), commit(3, 2, queue=1),
        commit(4, 3, queue=1), commit(5, 1, cg="cg2", queue=0),
    ]
    assert check(history).offset_rewinds == 0


# ------------------------------------------------------------------ one reader


def test_two_readers_at_once_is_a_violation_with_its_overlap() -> None:
    history = [
        perm(0, "g1-0", "FULL"), perm(0, "g1-1", "NONE"),
        perm(1000, "g1-1", "READ"),  # slave reads while the master still does
        perm(1500, "g1-0", "NONE"),
        perm(3000, "g1-1", "NONE"), perm(3000, "g1-0", "FULL"),  # clean hand-back
    ]
    report = check(history)
    assert report.one_reader_violations == 1
    assert report.one_reader_overlap_s == pytest.approx(0.5)
    assert report.overlaps[0].brokers == ("g1-0", "g1-1")


def test_hand_over_in_one_sample_is_not_an_overlap() -> None:
    history = [
        # recorded grant-first within one sample: applied together, no overlap
        perm(0, "g1-0", "FULL"), perm(100, "g1-1", "READ"), perm(100, "g1-0", "NONE"),
        perm(200, "g1-0", "FULL"), perm(200, "g1-1", "NONE"),
    ]
    report = check(history)
    assert report.one_reader_violations == 0


def test_write_only_and_other_groups_do_not_count_as_readers() -> None:
    history = [
        perm(0, "g1-0", "WRITE"), perm(0, "g1-1", "READ"),
        perm(0, "g2-0", "FULL", group="g2"),
    ]
    assert check(history).one_reader_violations == 0


def test_overlaps_are_counted_and_summed_and_an_open_one_ends_with_the_history() -> None:
    history = [
        perm(0, "g1-0", "FULL"), perm(100, "g1-1", "READ"), perm(300, "g1-1", "NONE"),
        perm(1000, "g1-2", "READ"), ack(1400, "x"),
    ]
    report = check(history)
    assert report.one_reader_violations == 2
    assert report.one_reader_overlap_s == pytest.approx(0.2 + 0.4)


# ------------------------------------------------------------------ cycles


def cycle(t0: float, cycle_no: int, *, restored: float, hand_back_gap: float, backsync: float) -> list[dict[str, Any]]:
    """A failover/failback cycle starting at t0 (ms): kill, slave READ after ``restored``,
    RECOVERING at t0+1000, slave drops READ then, master FULL after ``hand_back_gap``,
    NORMAL ``backsync`` after RECOVERING."""
    rec = t0 + 1000
    return [
        fault(t0, cycle_no),
        perm(t0 + 10, "g1-0", "NONE"),
        mode(t0 + restored / 2, "FENCING", 10 * cycle_no),
        mode(t0 + restored, "SLAVE_CONSUME", 10 * cycle_no + 1),
        perm(t0 + restored, "g1-1", "READ"),
        {"type": "restart", "t": ms(t0 + 500), "cycle": cycle_no, "broker": "g1-0", "group": "g1"},
        mode(rec, "RECOVERING", 10 * cycle_no + 2),
        perm(rec, "g1-1", "NONE"),
        perm(rec + hand_back_gap, "g1-0", "FULL"),
        mode(rec + backsync, "NORMAL", 10 * cycle_no + 3),
    ]


def test_per_cycle_figures() -> None:
    history = [
        perm(0, "g1-0", "FULL"), perm(0, "g1-1", "NONE"), mode(0, "NORMAL", 1),
        *cycle(1000, 1, restored=200, hand_back_gap=40, backsync=60),
        *cycle(5000, 2, restored=100, hand_back_gap=20, backsync=30),
    ]
    report = check(history)
    assert report.ok
    c1, c2 = report.cycles
    assert (c1.cycle, c1.broker, c1.kind) == (1, "g1-0", "kill")
    assert c1.reads_restored_ms == pytest.approx(200)
    assert c1.failback_gap_ms == pytest.approx(40)
    assert c1.backsync_ms == pytest.approx(60)
    assert c1.normal_again_ms == pytest.approx(1060)
    assert c2.reads_restored_ms == pytest.approx(100)
    assert c2.failback_gap_ms == pytest.approx(20)
    doc = report.to_json()
    assert doc["reads_restored_ms_p50"] == pytest.approx(100)
    assert doc["reads_restored_ms_p99"] == pytest.approx(200)
    assert doc["failback_gap_ms_p99"] == pytest.approx(40)
    assert doc["backsync_ms_p99"] == pytest.approx(60)
    assert [c["cycle"] for c in doc["cycles"]] == [1, 2]


def test_hand_back_in_one_sample_has_zero_gap() -> None:
    history = [perm(0, "g1-0", "FULL"), *cycle(1000, 1, restored=150, hand_back_gap=0, backsync=5)]
    (c,) = check(history).cycles
    assert c.failback_gap_ms == 0.0


def test_master_that_never_lost_read_to_a_slave_has_no_failback_gap() -> None:
    # a short hang: the master lost READ and regained it; no slave took over
    history = [
        perm(0, "g1-0", "FULL"), perm(0, "g1-1", "NONE"), fault(1000),
        perm(1020, "g1-0", "NONE"), perm(1300, "g1-0", "FULL"),
    ]
    (c,) = check(history).cycles
    assert c.reads_restored_ms == pytest.approx(300)
    assert c.failback_gap_ms is None
    assert c.backsync_ms is None


def test_reads_never_restored_is_none_not_zero() -> None:
    history = [perm(0, "g1-0", "FULL"), fault(1000), perm(1020, "g1-0", "NONE")]
    (c,) = check(history).cycles
    assert c.reads_restored_ms is None
    assert check(history).to_json()["reads_restored_ms_p99"] is None


def test_cycles_of_two_groups_do_not_bleed_into_each_other() -> None:
    history = [
        perm(0, "g1-0", "FULL"), perm(0, "g2-0", "FULL", group="g2"),
        fault(1000, 1, "g1-0"), perm(1010, "g1-0", "NONE"),
        fault(1100, 1, "g2-0", group="g2"), perm(1110, "g2-0", "NONE", group="g2"),
        perm(1200, "g2-1", "READ", group="g2"),
        perm(1400, "g1-1", "READ"),
    ]
    c1, c2 = check(history).cycles
    assert (c1.group, c1.reads_restored_ms) == ("g1", pytest.approx(400))
    assert (c2.group, c2.reads_restored_ms) == ("g2", pytest.approx(100))


def test_events_out_of_order_are_sorted_by_time() -> None:
    history = [*messages(3)]
    history.reverse()
    assert check(history).ok


# ------------------------------------------------------------------ helpers and bad input


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_json_report_has_the_contract_keys() -> None:
    doc = check(messages(1)).to_json()
    for key in (
        "lost_acked", "duplicates_inflight", "duplicates_rewind", "offset_rewinds",
        "one_reader_violations", "reads_restored_ms_p50", "reads_restored_ms_p99",
        "failback_gap_ms_p99", "backsync_ms_p99", "cycles",
    ):
        assert key in doc


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"type": "explode", "t": 1}, "unknown event type"),
        ({"type": "deliver", "t": 1, "cgroup": "c", "topic": T, "queue": 0, "offset": 1}, "missing field 'id'"),
        ({"type": "produce_ack", "t": 1, "id": "a", "topic": T, "queue": True, "offset": 0}, "queue must be int"),
        ({"type": "produce_ack", "t": 1.5, "id": "a", "topic": T, "queue": 0, "offset": 0}, "integer 't'"),
        ({"type": "commit", "t": 1, "cgroup": "c", "topic": T, "queue": 0, "offset": -3}, "offset must be >= 0"),
        ({"type": "perm", "t": 1, "group": "g", "broker": "b", "effective": "ROOT"}, "unknown permission"),
        ({"type": "mode", "t": 1, "group": "g", "mode": "PANIC", "epoch": 1}, "PANIC"),
    ],
)
def test_malformed_event_is_a_clear_error(event: dict[str, Any], message: str) -> None:
    with pytest.raises(HistoryError, match=message):
        check([*messages(1), event])


# ------------------------------------------------------------ members and write stall


def own(t: float, member: str, held: bool, *, queue: int = 0, cg: str = "cg1") -> dict[str, Any]:
    return {"type": "own", "t": ms(t), "cgroup": cg, "topic": T, "queue": queue,
            "member": member, "held": held}


def mdlv(t: float, id: str, offset: int, member: str, *, queue: int = 0) -> dict[str, Any]:
    return {**dlv(t, id, offset, queue=queue), "member": member}


def test_a_clean_hand_over_between_members_is_not_a_violation() -> None:
    report = check([ack(0, "a"), ack(1, "b", offset=1),
                    own(0, "m1", True), mdlv(1, "a", 0, "m1"), own(5, "m1", False),
                    own(5, "m2", True), mdlv(6, "b", 1, "m2"), own(9, "m2", False)])
    assert report.two_member_violations == 0
    assert report.ok


def test_two_members_owning_one_queue_at_once_is_a_violation_with_its_overlap() -> None:
    report = check([ack(0, "a"), own(0, "m1", True), own(5, "m2", True), own(8, "m1", False),
                    mdlv(1, "a", 0, "m1"), own(20, "m2", False),
                    own(0, "m3", True, queue=1)])  # another queue: no conflict
    assert report.two_member_violations == 1
    assert report.two_member_overlap_s == pytest.approx(0.003)
    assert report.shared_queues[0].members == ("m1", "m2")
    assert "two members on one queue" in report.violations[0]
    assert report.to_json()["two_member_violations"] == 1


def test_a_delivery_by_a_member_that_does_not_own_the_queue_is_a_violation() -> None:
    report = check([ack(0, "a"), own(0, "m1", True), own(2, "m1", False),
                    own(2, "m2", True), mdlv(3, "a", 0, "m1")])
    assert report.two_member_violations == 1
    assert report.shared_queues[0].members == ("m1",)


def test_an_ownership_still_open_at_the_end_closes_there() -> None:
    report = check([own(0, "m1", True), own(4, "m2", True), ack(10, "a")])
    assert report.two_member_violations == 1
    assert report.two_member_overlap_s == pytest.approx(0.006)


def test_write_stall_is_the_longest_ack_gap_around_each_fault() -> None:
    acks = [ack(t, f"m{t}", offset=t) for t in (0, 5, 10, 15, 20, 95, 100, 105, 110, 2000, 2005)]
    history = [*acks, fault(17), fault(1500, cycle=2, broker="g2-0", group="g2")]
    report = check(history)
    stalls = [c.write_stall_ms for c in report.cycles]
    # cycle 1 (17..1500): the gap 20->95 (75 ms) and 110->2000 overlaps too (it starts
    # inside the window): a stall that runs into the next fault counts for both, for the
    # earlier one up to the next fault (110->1500) only.
    assert stalls == [pytest.approx(1390), pytest.approx(1890)]
    quiet = check([*acks[:9], fault(17)])
    assert quiet.cycles[0].write_stall_ms == pytest.approx(75)
    assert quiet.to_json()["write_stall_ms_p99"] == pytest.approx(75)


def test_member_faults_are_disruptions_not_failover_cycles() -> None:
    crash = {"type": "fault", "t": ms(5), "cycle": 1, "kind": "member-crash",
             "broker": "m1", "group": "cg1"}
    # m1 delivered offset 0 without committing, crashed; m2 got offset 0 again: in flight.
    report = check([ack(0, "a"), own(0, "m1", True), mdlv(1, "a", 0, "m1"), crash,
                    own(5, "m1", False), own(8, "m2", True), mdlv(9, "a", 0, "m2")])
    assert report.cycles == ()
    assert (report.duplicates_inflight, report.duplicates_rewind) == (1, 0)
    assert report.ok


# ------------------------------------------------------------------ order (invariant 7)


def ordered(t: float = 0.0) -> dict[str, Any]:
    return {"type": "topic", "t": ms(t), "topic": T, "ordered": True}


def test_deliveries_in_acknowledgement_order_have_no_order_violation() -> None:
    """Two consumer groups read in ack order across two queues (a head move); a repeat
    of an id already read (after a crash) is a duplicate, not a violation."""
    events = [ordered(), ack(1, "a", 0, 0), ack(2, "b", 0, 1), ack(3, "c", 1, 0),
              dlv(4, "a", 0), dlv(5, "b", 1), dlv(5.5, "b", 1), dlv(6, "c", 0, queue=1),
              dlv(4, "a", 0, cg="cg2"), dlv(5, "b", 1, cg="cg2"), dlv(6, "c", 0, cg="cg2", queue=1)]
    report = check(events)
    assert report.order_violations == 0
    assert report.to_json()["order_violations"] == 0


def test_a_delivery_before_an_earlier_acknowledged_id_is_an_order_violation() -> None:
    events = [ordered(), ack(1, "a", 0, 0), ack(2, "b", 1, 0), ack(3, "c", 1, 1),
              dlv(4, "b", 0, queue=1), dlv(5, "a", 0), dlv(6, "c", 1, queue=1)]
    report = check(events)
    assert report.order_violations == 1
    assert report.order_examples == ("cg1 got b before a on orders",)
    assert "1 order violation(s) on ordered topics" in report.violations
    assert not report.ok


def test_order_is_judged_only_on_ordered_topics_and_a_lost_id_is_counted_once() -> None:
    out_of_order = [ack(1, "a", 0, 0), ack(2, "b", 1, 0), dlv(4, "b", 0, queue=1), dlv(5, "a", 0)]
    assert check(out_of_order).order_violations == 0  # an ordinary topic: any order
    # "a" is never delivered: it is lost (counted there), and b, c are not violations.
    gap = [ordered(), ack(1, "a", 0, 0), ack(2, "b", 0, 1), ack(3, "c", 0, 2),
           dlv(4, "b", 1), dlv(5, "c", 2)]
    report = check(gap)
    assert report.order_violations == 0
    assert report.lost_acked == 1


def test_a_paused_producers_late_recorded_acks_are_dated_at_its_pause() -> None:
    """p (paused at 10, continued at 20) sent p-1 before its pause; the broker acknowledged
    it then, but p recorded the ack only on waking (20.01), after q-0, which q sent and
    had acknowledged meanwhile. Read p-1 then q-0 (storage order): no violation. Without
    the pause events the same history reads as one."""
    pause = {"type": "fault", "t": ms(10), "cycle": 1, "kind": "producer-pause",
             "broker": "p", "group": T}
    resume = {"type": "restart", "t": ms(20), "cycle": 1, "broker": "p", "group": T}
    events = [ordered(), ack(1, "p-0", 0, 0), ack(15, "q-0", 0, 2), ack(20.01, "p-1", 0, 1),
              dlv(21, "p-0", 0), dlv(22, "p-1", 1), dlv(23, "q-0", 2)]
    assert check([*events, pause, resume]).order_violations == 0
    assert check(events).order_violations == 1
    # Past the grace after the resume, an ack is dated as recorded (a new send's).
    late = [ordered(), ack(1, "p-0", 0, 0), ack(15, "q-0", 0, 2), ack(2000, "p-1", 0, 1),
            dlv(21, "p-0", 0), dlv(22, "p-1", 1), dlv(23, "q-0", 2)]
    assert check([*late, pause, resume]).order_violations == 1


# ------------------------------------------------------------ delayed messages and nacks


def delayed_ack(t: float, id: str, due_ms: int) -> dict[str, Any]:
    return {**ack(t, id, offset=0), "offset": -1, "deliver_at_ms": due_ms}


def nack(t: float, id: str, *, cg: str = "cg1") -> dict[str, Any]:
    return {"type": "nack", "t": ms(t), "cgroup": cg, "id": id}


def test_a_delayed_message_delivered_on_time_once_is_clean() -> None:
    # t in ms on the history's clock; deliver_at_ms on the same clock (ms)
    report = check([delayed_ack(1, "d1", 100), dlv(100.5, "d1", 0), commit(101, 1)])
    assert report.ok
    assert (report.scheduled_lost, report.delivered_early, report.escape_duplicates) == (0, 0, 0)


def test_early_lost_and_twice_written_delayed_messages_are_told_apart() -> None:
    report = check([
        delayed_ack(1, "early", 100), dlv(60, "early", 0),  # 40 ms before its time
        delayed_ack(2, "gone", 100),  # never delivered
        delayed_ack(3, "twice", 100), dlv(101, "twice", 1), dlv(102, "twice", 0, queue=1),
        dlv(103, "twice", 1),  # the same position again: a consumer-side repeat, not a copy
    ])
    assert report.delivered_early == 1
    assert "early 40.0 ms early" in report.early_examples[0]
    assert (report.scheduled_lost, report.lost_acked) == (1, 1)
    assert report.escape_duplicates == 1
    assert report.duplicates_produce == 1  # seen as a second write, too
    assert "1 delayed message(s) delivered before their time" in report.violations
    doc = report.to_json()
    assert (doc["scheduled_lost"], doc["delivered_early"], doc["escape_duplicates"]) == (1, 1, 1)


def test_a_handed_back_message_must_come_again_once() -> None:
    redelivered = {"type": "deliver", "t": ms(30), "cgroup": "cg1", "topic": "%RETRY%cg1",
                   "queue": 0, "offset": 0, "id": "m0"}
    clean = check([ack(1, "m0"), dlv(2, "m0", 0), nack(3, "m0"), redelivered])
    assert clean.ok
    assert (clean.escape_duplicates, clean.duplicates_produce) == (0, 0)
    never = check([ack(1, "m0"), dlv(2, "m0", 0), nack(3, "m0")])
    assert never.scheduled_lost == 1
    assert "1 delayed or handed-back message(s) never delivered" in never.violations
    copied = check([ack(1, "m0"), dlv(2, "m0", 0), nack(3, "m0"), redelivered,
                    {**redelivered, "t": ms(31), "queue": 1}])
    assert copied.escape_duplicates == 1
    assert copied.ok  # counted: the at-least-once window, not a violation


def test_an_offset_of_minus_one_needs_a_delivery_time() -> None:
    with pytest.raises(HistoryError, match="offset must be >= 0"):
        check([{**ack(1, "x"), "offset": -1}])


def read_restored(t: float, broker: str, *, queue: int = 0) -> dict[str, Any]:
    return {"type": "read_restored", "t": ms(t), "cgroup": "cg1", "topic": "t", "queue": queue,
            "broker": broker}


def test_reads_restored_as_consumers_saw_it_is_their_first_answer_from_another_broker() -> None:
    report = check([
        perm(0, "g1-0", "FULL"), perm(0, "g1-1", "NONE"), perm(0, "g2-0", "FULL", group="g2"),
        fault(100),
        read_restored(90, "g1-1"),  # sent before the fault: not this fault's
        read_restored(120, "g2-0"),  # another group's broker
        perm(130, "g1-1", "READ"),
        read_restored(135, "g1-1", queue=1), read_restored(150, "g1-1"),
        read_restored(400, "g1-0"),  # the master back: not a restore by another broker
        fault(1000, cycle=2),
        read_restored(1300, "g1-1"),
    ])
    assert [c.consumer_reads_restored_ms for c in report.cycles] == [
        pytest.approx(35), pytest.approx(300)]
    doc = report.to_json()
    assert doc["consumer_reads_restored_ms_p50"] is not None
    assert doc["cycles"][0]["consumer_reads_restored_ms"] == pytest.approx(35)
    # No consumer recorded one: None, not a guess.
    assert check([perm(0, "g1-0", "FULL"), fault(100)]).cycles[0].consumer_reads_restored_ms \
        is None
    # No failover (the master lost its lease and read again): the master's own answer.
    alone = check([perm(0, "g1-0", "FULL"), perm(0, "g1-1", "NONE"), fault(100),
                   perm(1100, "g1-0", "WRITE"), perm(4000, "g1-0", "FULL"),
                   read_restored(3990, "g1-0"), read_restored(4100, "g1-0", queue=1)])
    assert alone.cycles[0].consumer_reads_restored_ms == pytest.approx(3890)
