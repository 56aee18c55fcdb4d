"""Consumer offsets: monotonic commits, merges with epochs, atomic persistence, bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from understudy_broker.offsets import OffsetStore, OffsetStoreCorruptError


def test_commit_is_monotonic_and_reset_is_the_only_way_down(tmp_path: Path) -> None:
    store = OffsetStore.open(tmp_path / "offsets.json")
    assert store.get("g", "t", 0) is None
    assert store.commit("g", "t", 0, 10) == 10
    assert store.commit("g", "t", 0, 4) == 10
    assert store.get("g", "t", 0) == 10
    assert store.commit("g", "t", 0, 11) == 11
    store.reset("g", "t", 0, 3)
    assert store.get("g", "t", 0) == 3
    with pytest.raises(ValueError, match=">= 0"):
        store.commit("g", "t", 0, -1)


def test_merge_takes_the_maximum_and_records_the_epoch(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore.open(path)
    store.commit("g", "t", 0, 10)
    store.commit("g", "t", 1, 5)
    moved = store.merge({"g": {"t": {"0": 7, "1": 9}}, "h": {"u": {2: 1}}}, epoch=4)
    assert moved == 2
    assert store.snapshot() == {"g": {"t": {0: 10, 1: 9}}, "h": {"u": {2: 1}}}
    assert store.backsync_epoch == 4
    store.merge({}, epoch=2)  # an older epoch never lowers the recorded one
    assert store.backsync_epoch == 4
    store.persist()
    again = OffsetStore.open(path)
    assert again.snapshot() == store.snapshot()
    assert again.backsync_epoch == 4
    with pytest.raises(ValueError, match="bad offset"):
        store.merge({"g": {"t": {"0": -5}}})
    assert store.get("g", "t", 0) == 10


def test_persist_is_atomic_and_a_leftover_tmp_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore.open(path)
    store.commit("g", "t", 0, 42)
    store.persist()
    committed = path.read_bytes()
    # Simulate a crash in the middle of the next persist: a half-written tmp file.
    (tmp_path / "offsets.json.tmp").write_bytes(b'{"format": 1, "offs')
    reopened = OffsetStore.open(path)
    assert reopened.get("g", "t", 0) == 42
    assert path.read_bytes() == committed
    reopened.commit("g", "t", 0, 43)
    reopened.persist()
    assert OffsetStore.open(path).get("g", "t", 0) == 43
    assert not (tmp_path / "offsets.json.tmp").exists()


def test_persist_writes_only_when_dirty(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore.open(path)
    store.persist()
    assert not path.exists()
    store.commit("g", "t", 0, 1)
    store.persist()
    mtime = path.stat().st_mtime_ns
    store.commit("g", "t", 0, 0)  # ignored: lower than stored
    assert not store.dirty
    store.persist()
    assert path.stat().st_mtime_ns == mtime


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xffgarbage",
        b"{not json",
        b"[]",
        json.dumps({"format": 99, "offsets": {}}).encode(),
        json.dumps({"format": 1, "offsets": {"g": {"t": {"x": 1}}}}).encode(),
        json.dumps({"format": 1, "offsets": {"g": {"t": {"0": -1}}}}).encode(),
        json.dumps({"format": 1, "backsync_epoch": "7", "offsets": {}}).encode(),
    ],
)
def test_a_corrupt_file_is_a_clear_error_and_is_kept(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "offsets.json"
    path.write_bytes(content)
    with pytest.raises(OffsetStoreCorruptError, match=re.escape(str(path))):
        OffsetStore.open(path)
    assert path.read_bytes() == content
