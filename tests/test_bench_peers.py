"""bench/peers.py: the recovery figures from acknowledgement times (no server is started)."""

from __future__ import annotations

import pathlib
from types import ModuleType

from understudy_harness.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    return load_script(ROOT / "bench" / "peers.py", "bench_peers")


peers = _bench()


def test_the_gap_spans_the_kill_and_first_ack_counts_only_messages_sent_after_it() -> None:
    # (sent, acked): steady acks every 10 ms, the kill at 10.0, a message sent before the
    # kill is acknowledged at 10.3 (it ends the gap), the first one sent after it at 10.5.
    acks = [(9.0 + i / 100, 9.001 + i / 100) for i in range(100)]  # last ack 9.991
    acks += [(9.995, 10.3), (10.1, 10.5), (10.2, 10.501)]
    gap, first = peers.recovery_ms(acks, kill_at=10.0, start=9.0, end=11.0)
    assert gap == 309.0  # 9.991 -> 10.3
    assert first == 500.0  # kill -> the ack of the message sent at 10.1


def test_gaps_before_the_window_do_not_count() -> None:
    acks = [(0.0, 1.0), (4.9, 5.0), (5.05, 5.1), (5.15, 5.2)]
    gap, first = peers.recovery_ms(acks, kill_at=5.0, start=4.0, end=6.0)
    assert gap == 100.0  # 1.0 -> 5.0 starts before the window
    assert first == 100.0


def test_no_acknowledgement_after_the_kill_means_no_recovery() -> None:
    acks = [(1.0, 1.1), (1.9, 2.5)]  # the last was sent before the kill at 2.0
    assert peers.recovery_ms(acks, kill_at=2.0, start=1.0, end=3.0) == (None, None)


def test_rotate_puts_the_chosen_node_first_and_keeps_the_others_in_order() -> None:
    assert peers.rotate(["a", "b", "c"], "b") == ["b", "c", "a"]
    assert peers.rotate(["a", "b", "c"], "a") == ["a", "b", "c"]
