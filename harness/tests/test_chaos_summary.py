"""The chaos soak's pure parts: which fault each cycle injects, and the checker's report
split by fault kind (every counted item charged to the cycle whose window holds it, a
lost id to the first cycle not yet healed when it was acknowledged), checked against
checks of the history cut at each cycle's end. Hand-built histories, times in ms."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from understudy_harness.chaos import (
    BEFORE_FAULTS,
    KINDS,
    KindSummary,
    rotation,
    summarize,
    to_json,
)
from understudy_harness.checker import MARKS, Report, check

T = "orders"
CONTRACT = {"cycles", "lost_acked", "offset_rewinds", "one_reader_violations",
            "two_member_violations", "duplicates", "consumer_reads_restored_ms_p99",
            "write_stall_ms_p99"}


def ms(x: float) -> int:
    return int(x * 1_000_000)


def ack(t: float, id: str, offset: int, queue: int = 0) -> dict[str, Any]:
    return {"type": "produce_ack", "t": ms(t), "id": id, "topic": T, "queue": queue,
            "offset": offset}


def dlv(t: float, id: str, offset: int, queue: int = 0) -> dict[str, Any]:
    return {"type": "deliver", "t": ms(t), "cgroup": "cg1", "topic": T, "queue": queue,
            "offset": offset, "id": id}


def commit(t: float, offset: int) -> dict[str, Any]:
    return {"type": "commit", "t": ms(t), "cgroup": "cg1", "topic": T, "queue": 0,
            "offset": offset}


def perm(t: float, broker: str, eff: str) -> dict[str, Any]:
    return {"type": "perm", "t": ms(t), "group": "g1", "broker": broker, "effective": eff}


def fault(t: float, cycle: int, kind: str) -> dict[str, Any]:
    return {"type": "fault", "t": ms(t), "cycle": cycle, "kind": kind, "broker": "g1-0",
            "group": "g1"}


def restart(t: float, cycle: int) -> dict[str, Any]:
    return {"type": "restart", "t": ms(t), "cycle": cycle, "broker": "g1-0", "group": "g1"}


# ------------------------------------------------------------------------ rotation


def test_the_fixed_rotation_runs_every_kind_in_order_and_each_meets_every_group() -> None:
    got = rotation(KINDS, ["g1", "g2"], 2 * len(KINDS))
    assert [k for k, _ in got] == [*KINDS, *KINDS]
    assert [g for _, g in got[:4]] == ["g1", "g2", "g1", "g2"]
    assert {(k, g) for k, g in got} == {(k, g) for k in KINDS for g in ("g1", "g2")}
    assert rotation(KINDS, ["g1", "g2"], 3) == got[:3]
    assert rotation(["kill"], ["g1"], 0) == []


def test_a_seed_shuffles_each_round_reproducibly() -> None:
    a = rotation(KINDS, ["g1", "g2", "g3"], 24, seed=7)
    assert a == rotation(KINDS, ["g1", "g2", "g3"], 24, seed=7)
    assert a != rotation(KINDS, ["g1", "g2", "g3"], 24, seed=8)
    for r in range(3):  # every round has every kind once
        assert sorted(k for k, _ in a[r * len(KINDS):(r + 1) * len(KINDS)]) == sorted(KINDS)
    with pytest.raises(ValueError, match="at least one kind"):
        rotation([], ["g1"], 1)


# ------------------------------------------------------------------- attribution


def soak() -> list[dict[str, Any]]:
    """Three cycles (kill at 100, zk_expiry at 1000, disk_full at 2000 ms; healed at 500,
    1500, 2500) with something counted in and around each."""
    return [
        perm(0, "g1-0", "FULL"), perm(0, "g1-1", "NONE"),
        # a rewind before any fault: its own row
        commit(10, 5), commit(20, 3),
        # acked before the kill, never delivered: lost by the kill
        ack(50, "lost-before-kill", 0),
        # delivered before the kill, not committed, delivered again after it: in flight
        ack(60, "a", 1, queue=2), dlv(70, "a", 1, queue=2),
        fault(100, 1, "kill"), perm(100, "g1-0", "NONE"), perm(150, "g1-1", "READ"),
        dlv(400, "a", 1, queue=2),
        restart(500, 1), perm(600, "g1-1", "NONE"), perm(650, "g1-0", "FULL"),
        # acked after the kill healed: lost by the next fault (zk_expiry)
        ack(700, "lost-after-heal", 2),
        fault(1000, 2, "zk_expiry"),
        # both read at once from 1100 to 1200, then a rewind
        perm(1100, "g1-1", "READ"), perm(1200, "g1-1", "NONE"), commit(1300, 2),
        restart(1500, 2),
        fault(2000, 3, "disk_full"),
        # the same id stored again on another queue: produced twice
        ack(2100, "b", 3), dlv(2110, "b", 3), ack(2200, "b", 0, queue=1), dlv(2210, "b", 0, queue=1),
        restart(2500, 3),
    ]


def heals(events: list[dict[str, Any]]) -> dict[int, int]:
    return {e["cycle"]: e["t"] for e in events if e["type"] == "restart"}


def test_every_counted_item_has_a_mark() -> None:
    report = check(soak())
    assert set(report.marks) == set(MARKS)
    assert len(report.marks["lost"]) == report.lost_acked == 2
    assert len(report.marks["offset_rewinds"]) == report.offset_rewinds == 2
    assert len(report.marks["one_reader"]) == report.one_reader_violations == 1
    assert len(report.marks["in_flight"]) == report.duplicates_inflight == 1
    assert len(report.marks["produced_other_queue"]) == report.duplicates_produce == 1
    assert report.marks["one_reader"] == (ms(1100),)


def rows_by_kind(report: Report, events: list[dict[str, Any]], **kw: Any) -> dict[str, KindSummary]:
    return {r.kind: r for r in summarize(report, heals=heals(events), **kw)}


def test_items_are_charged_to_the_cycle_whose_window_holds_them() -> None:
    events = soak()
    rows = rows_by_kind(check(events), events)
    assert list(rows) == [*KINDS, BEFORE_FAULTS]
    kill, expiry, disk = rows["kill"], rows["zk_expiry"], rows["disk_full"]
    assert (kill.cycles, expiry.cycles, disk.cycles, rows["hang"].cycles) == (1, 1, 1, 0)
    # lost: by the first cycle not yet healed when acknowledged
    assert (kill.lost_acked, expiry.lost_acked, disk.lost_acked) == (1, 1, 0)
    assert kill.duplicates["in_flight"] == 1
    assert (expiry.one_reader_violations, expiry.offset_rewinds) == (1, 1)
    assert disk.duplicates["produced_other_queue"] == 1
    assert rows[BEFORE_FAULTS].offset_rewinds == 1
    assert rows[BEFORE_FAULTS].cycles == 0
    assert kill.reads_restored_ms == (50.0,)  # the slave read 50 ms after the kill


def test_charged_counts_are_what_each_cycle_adds_to_a_check_cut_at_its_end() -> None:
    events = soak()
    rows = rows_by_kind(check(events), events)
    cuts = [ms(100), ms(1000), ms(2000), ms(10_000)]  # each fault, then the end
    fields = {"offset_rewinds": "offset_rewinds", "one_reader_violations": "one_reader_violations",
              "duplicates_inflight": "in_flight", "duplicates_produce": "produced_other_queue"}
    for kind, start, end in zip(("kill", "zk_expiry", "disk_full"), cuts, cuts[1:], strict=False):
        before = check([e for e in events if e["t"] < start])
        after = check([e for e in events if e["t"] < end])
        for report_field, name in fields.items():
            added = getattr(after, report_field) - getattr(before, report_field)
            row = rows[kind]
            got = row.duplicates.get(name, 0) if name in row.duplicates else getattr(row, name)
            assert got == added, (kind, name)


def test_skipped_kinds_keep_their_reason_and_the_json_has_the_contract_keys() -> None:
    events = soak()
    reason = "needs the cluster in network namespaces: no"
    rows = summarize(check(events), heals=heals(events), skipped={"island_master": reason},
                     incomplete={"disk_full": 1})
    doc = to_json(rows)
    assert list(doc)[: len(KINDS)] == list(KINDS)
    for kind in KINDS:
        assert set(doc[kind]) >= CONTRACT, kind
        assert set(doc[kind]["duplicates"]) == {"in_flight", "rewind", "produced_other_queue",
                                                "same_queue", "escape"}
    assert doc["island_master"]["skipped"] == reason
    assert doc["disk_full"]["incomplete"] == 1
    assert doc["kill"]["skipped"] is None
    assert doc["kill"]["consumer_reads_restored_ms_p99"] is None  # no consumer recorded one
    assert doc["kill"]["lost_acked"] == 1
    assert doc["kill"]["violations_at_ns"] == {"lost": [ms(50)]}
    assert doc["zk_expiry"]["violations_at_ns"] == {"lost": [ms(700)], "one_reader": [ms(1100)],
                                                    "offset_rewinds": [ms(1300)]}
    assert doc["disk_full"]["violations_at_ns"] == {}
    totals = Counter({r.kind: r.violations for r in rows})
    assert sum(totals.values()) == 2 + 2 + 1  # lost, rewinds, the overlap
