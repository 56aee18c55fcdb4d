"""Consumer offsets: monotonic commits, merges with epochs, atomic persistence, bad files."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from understudy_broker.storage.offsets import OffsetStore, OffsetStoreCorruptError


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


async def test_persist_async_writes_in_a_thread_and_keeps_later_commits(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore.open(path)
    store.commit("g", "t", 0, 10)
    pending = asyncio.ensure_future(store.persist_async())
    store.commit("g", "t", 1, 4)  # made while the first write may still run
    await pending
    await store.persist_async()
    assert not store.dirty
    again = OffsetStore.open(path)
    assert (again.get("g", "t", 0), again.get("g", "t", 1)) == (10, 4)


async def test_concurrent_persists_never_put_an_older_snapshot_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore.open(path)
    writes = []
    for offset in range(1, 30):
        store.commit("g", "t", 0, offset)
        writes.append(asyncio.ensure_future(store.persist_async()))
    await asyncio.gather(*writes)
    assert OffsetStore.open(path).get("g", "t", 0) == 29


def test_a_stale_snapshot_is_skipped_whatever_the_write_order(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore.open(path)
    store.commit("g", "t", 0, 1)
    old = store._encode()
    store.commit("g", "t", 0, 2)
    new = store._encode()
    store._write(*new)
    store._write(*old)  # finished last, but older: must not rewind the file
    assert OffsetStore.open(path).get("g", "t", 0) == 2


async def test_a_failed_persist_keeps_the_store_dirty_and_loses_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    store = OffsetStore.open(blocker / "offsets.json")
    blocker.write_text("a file where the store's directory should be")
    store.commit("g", "t", 0, 7)
    with pytest.raises((FileExistsError, NotADirectoryError)):
        await store.persist_async()
    assert store.dirty
    with pytest.raises((FileExistsError, NotADirectoryError)):
        store.persist()
    assert store.dirty
    blocker.unlink()
    await store.persist_async()
    assert not store.dirty
    assert OffsetStore.open(blocker / "offsets.json").get("g", "t", 0) == 7
