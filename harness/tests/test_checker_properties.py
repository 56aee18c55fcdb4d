"""Property tests: the checker's sweep-line results agree with brute-force oracles that
evaluate the same histories millisecond by millisecond."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from understudy_harness.checker import check

MS = 1_000_000
BROKERS = ("g1-0", "g1-1", "g1-2")
PERMS = ("FULL", "READ", "WRITE", "NONE")

# (time in ms, broker, permission); times on an integer-ms grid so the oracle is exact
perm_events = st.lists(
    st.tuples(st.integers(0, 200), st.sampled_from(BROKERS), st.sampled_from(PERMS)),
    max_size=25,
)


def as_events(raw: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    return [
        {"type": "perm", "t": t * MS, "group": "g1", "broker": b, "effective": p}
        for t, b, p in sorted(raw, key=lambda e: e[0])
    ]


def oracle_overlap(raw: list[tuple[int, str, str]]) -> tuple[int, int]:
    """(number of maximal overlaps, overlapping ms) by evaluating every millisecond."""
    if not raw:
        return 0, 0
    ordered = sorted(raw, key=lambda e: e[0])
    end = ordered[-1][0]
    count = total = 0
    inside = False
    for ms in range(end + 1):
        held: dict[str, bool] = {}
        for t, b, p in ordered:
            if t <= ms:
                held[b] = p in ("FULL", "READ")
        readers = sum(held.values())
        if readers >= 2:
            if not inside:
                count += 1
            inside = True
            if ms < end:
                total += 1
        else:
            inside = False
    return count, total


@settings(max_examples=150, deadline=None)
@given(perm_events)
def test_overlaps_match_a_millisecond_oracle(raw: list[tuple[int, str, str]]) -> None:
    report = check(as_events(raw))
    count, total_ms = oracle_overlap(raw)
    assert report.one_reader_violations == count
    assert round(report.one_reader_overlap_s * 1000) == total_ms


# commits per queue: a sequence of offsets in time order
commit_seqs = st.lists(st.lists(st.integers(0, 50), max_size=15), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(commit_seqs)
def test_rewinds_are_exactly_the_commits_below_an_earlier_maximum(seqs: list[list[int]]) -> None:
    events = []
    expected = 0
    t = 0
    for q, seq in enumerate(seqs):
        high = -1
        for off in seq:
            t += 1
            events.append({"type": "commit", "t": t, "cgroup": "cg", "topic": "x", "queue": q, "offset": off})
            if off < high:
                expected += 1
            high = max(high, off)
    assert check(events).offset_rewinds == expected


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 60), max_size=40), st.sets(st.integers(0, 60), max_size=40))
def test_lost_is_acked_minus_delivered(acked: set[int], delivered: set[int]) -> None:
    events: list[dict[str, Any]] = [
        {"type": "produce_ack", "t": i, "id": f"m{i}", "topic": "x", "queue": 0, "offset": i}
        for i in sorted(acked)
    ]
    events += [
        {"type": "deliver", "t": 100 + i, "cgroup": "cg", "topic": "x", "queue": 0, "offset": i, "id": f"m{i}"}
        for i in sorted(delivered)
    ]
    report = check(events)
    assert report.lost_acked == len(acked - delivered)
    assert report.ok == (not (acked - delivered))
