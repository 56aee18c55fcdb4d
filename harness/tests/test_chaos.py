"""The chaos soak (``understudy drill --faults mixed``, ``make chaos``) on real processes,
short: one cycle of every fault kind this machine can run, over a topic on two groups
with two members per consumer group, judged by the shared checker over the whole run and
over the history cut at the end of every cycle. Kinds that cannot run here (no network
namespaces, no tmpfs: not root) must be reported as skipped with the reason.

Also the parts that need a real ZooKeeper but no cluster: the session password the soak
derives to expire a broker's session, and the expiry itself.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient

from understudy_harness import netns
from understudy_harness.chaos import KINDS, NETNS_KINDS
from understudy_harness.chaosfaults import Lab, expire_session, session_password
from understudy_harness.checker import check
from understudy_harness.cli.drill import drill
from understudy_harness.drill import DrillOptions, run_mixed
from understudy_harness.history import Fault, read_history
from understudy_harness.testing import wait_until
from understudy_operator.local.zkserver import ZooKeeperServer

CONTRACT = {"cycles", "lost_acked", "offset_rewinds", "one_reader_violations",
            "two_member_violations", "duplicates", "consumer_reads_restored_ms_p99",
            "write_stall_ms_p99"}


# ---------------------------------------------------------------- session expiry


def test_the_derived_password_is_the_one_zookeeper_gave_the_session(
        zk_server: ZooKeeperServer) -> None:
    client = KazooClient(hosts=zk_server.connect, timeout=2.0)
    client.start(timeout=10)
    try:
        for _ in range(3):
            session_id, password = client.client_id
            assert session_password(session_id) == password
            client.restart()  # a new session
    finally:
        client.stop()
        client.close()


def test_expiring_a_session_ends_it_and_its_ephemeral_nodes(zk_server: ZooKeeperServer) -> None:
    owner = KazooClient(hosts=zk_server.connect, timeout=2.0)
    states: list[str] = []
    owner.add_listener(states.append)
    owner.start(timeout=10)
    try:
        path = owner.create("/chaos-expiry-", ephemeral=True, sequence=True)
        session_id = owner.client_id[0]
        expire_session(zk_server.connect, session_id, timeout_s=2.0)
        wait_until(lambda: "LOST" in states, "the owner to hear its session expired", 10)
        wait_until(lambda: owner.connected and owner.client_id[0] != session_id,
                   "the owner to open a new session", 10)
        assert owner.exists(path) is None
    finally:
        owner.stop()
        owner.close()


# ---------------------------------------------------------------- what is skipped


def test_a_lab_without_namespaces_or_an_ensemble_says_why_each_kind_cannot_run() -> None:
    lab = Lab.open(kinds=KINDS, brokers=["g1-0", "g1-1"], masters=["g1-0"], zk_ensemble=1,
                   disk_bytes=1 << 20, use_netns=False)
    try:
        assert lab.net is None
        assert set(NETNS_KINDS) | {"zk_leader_loss"} <= set(lab.skipped)
        assert all("--no-netns" in lab.skipped[k] for k in NETNS_KINDS)
        assert "--zk-ensemble 3" in lab.skipped["zk_leader_loss"]
        # disk_full: a tmpfs for the master where the machine allows the mount, else why not
        assert ("disk_full" in lab.skipped) != bool(lab.disks)
        assert all(why for why in lab.skipped.values())
        roots = [d.path for d in lab.disks.values()]
    finally:
        lab.close()
    assert not any(_mounted(r) for r in roots)


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


# ---------------------------------------------------------------- the short soak


@pytest.mark.integration
@pytest.mark.slow
def test_one_cycle_of_every_kind_keeps_every_invariant(drill_dir: Path, tmp_path: Path) -> None:
    out, kinds_out = tmp_path / "drill.json", tmp_path / "chaos.json"
    started = time.monotonic()
    result = CliRunner().invoke(drill, [
        "--faults", "mixed", "--cycles", str(len(KINDS)), "--zk-ensemble", "3",
        "--dwell", "0.5", "--dir", str(drill_dir), "--json", str(out),
        "--kinds-json", str(kinds_out)])
    took = time.monotonic() - started
    doc = json.loads(out.read_text()) if out.exists() else {}
    assert out.exists(), result.output
    assert result.exit_code == 0, (result.output, doc.get("violations"))
    assert doc["errors"] == [], doc.get("chaos_cycles")
    assert doc["cycles_completed"] == len(KINDS)
    kinds: dict[str, Any] = json.loads(kinds_out.read_text())
    assert list(kinds)[: len(KINDS)] == list(KINDS)
    for kind in KINDS:
        row = kinds[kind]
        assert set(row) >= CONTRACT, kind
        # every kind ran, or says why it could not
        assert row["cycles"] >= 1 or row["skipped"], (kind, row)
        assert (row["lost_acked"], row["offset_rewinds"], row["one_reader_violations"],
                row["two_member_violations"]) == (0, 0, 0, 0), (kind, row)
        assert row["duplicates"]["rewind"] == 0, (kind, row)
    if netns.unavailable() is None:  # root here: namespaces, and so every partition kind
        assert all(kinds[k]["cycles"] == 1 for k in NETNS_KINDS), kinds
    assert doc["lost_acked"] == doc["offset_rewinds"] == doc["one_reader_violations"] == 0
    assert doc["two_member_violations"] == 0
    # the checker over the history cut at the end of each cycle (the next fault)
    events = read_history(Path(doc["history"])).events
    faults = sorted((e for e in events if isinstance(e, Fault) and e.kind in KINDS),
                    key=lambda e: e.t)
    assert len(faults) == len(KINDS)
    ends = [f.t for f in faults[1:]] + [max(e.t for e in events) + 1]
    for n, end in enumerate(ends, start=1):
        prefix = check([e for e in events if e.t < end])
        assert (prefix.one_reader_violations, prefix.offset_rewinds,
                prefix.two_member_violations, prefix.duplicates_rewind) == (0, 0, 0, 0), (
            n, faults[n - 1].kind, prefix.violations)
    island = next((c for c in doc["cycles"] if c["kind"] == "island_master"), None)
    if island is not None:  # the slave took reads while the master was an island
        assert island["reads_restored_ms"] is not None
    # nothing of the lab is left: namespaces of this process, small disks
    assert not [n for n in netns.list_namespaces() if n.startswith(f"usnet-{os.getpid()}-")]
    assert not any("understudy-chaos-disks-" in line
                   for line in Path("/proc/mounts").read_text().splitlines())
    print(f"\nshort chaos soak: {len(KINDS)} cycles in {took:.0f} s; "
          + ", ".join(f"{k}: {v['cycles']}" + (f" (skipped: {v['skipped']})" if v["skipped"] else "")
                      for k, v in kinds.items()))


@pytest.mark.integration
def test_the_time_cap_stops_new_cycles_and_says_so(drill_dir: Path) -> None:
    """A cap shorter than the drain, teardown and check need: no cycle starts, the run is
    still judged, and the result says why it stopped."""
    result = run_mixed(DrillOptions(faults="mixed", kinds=("kill",), cycles=100,
                                    max_seconds=60, directory=drill_dir))
    assert result.cycles_completed == 0
    assert result.stopped_early is not None
    assert "stopped after 0 of 100 cycles: the 1-minute cap" in result.stopped_early
    assert result.report.acked > 0
    assert result.ok, result.report.violations + result.errors
    assert [r.kind for r in result.chaos or []][:1] == ["kill"]
