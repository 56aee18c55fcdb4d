"""The controller's transition journal: what it writes, and how a reader treats damage."""

from __future__ import annotations

from pathlib import Path

import pytest

from understudy_broker.model import GroupState, Mode
from understudy_operator.controller.journal import TransitionJournal, read_transitions


def test_journal_round_trip_in_order(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "transitions.jsonl"
    j = TransitionJournal(path)
    normal = GroupState(Mode.NORMAL, 1)
    fencing = GroupState(Mode.FENCING, 2, reason="master exited")
    sc = GroupState(Mode.SLAVE_CONSUME, 3, acting="g1-1", reason="master cannot read")
    j.record("g1", normal, fencing)
    j.record("g1", fencing, sc)
    j.close()
    got = read_transitions(path)
    assert [(t.previous, t.mode, t.epoch, t.acting) for t in got] == [
        (Mode.NORMAL, Mode.FENCING, 2, None),
        (Mode.FENCING, Mode.SLAVE_CONSUME, 3, "g1-1"),
    ]
    assert got[0].t_ns <= got[1].t_ns
    assert got[1].reason == "master cannot read"


def test_torn_last_line_is_skipped_but_damage_inside_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = '{"t_ns":1,"group":"g1","from":"NORMAL","mode":"FENCING","epoch":2,"acting":null,"reason":""}'
    path.write_text(good + "\n" + good[:30])  # killed mid-write
    assert [t.epoch for t in read_transitions(path)] == [2]
    path.write_text(good + "\n" + "garbage\n" + good + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:2: malformed"):
        read_transitions(path)
    assert read_transitions(tmp_path / "absent.jsonl") == []
