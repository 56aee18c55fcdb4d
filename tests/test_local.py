"""``understudy local``: the plan (pure), the pid/process layer, bad input, and a real
cluster (ZooKeeper + broker processes + controller when present) driven through
up/status/kill/start/down."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from understudy_broker.zklayout import ReplicationPolicy
from understudy_harness import testing
from understudy_operator.cli.local import local
from understudy_operator.local import cluster as lc
from understudy_operator.local import ports, procs
from understudy_operator.local.plan import ClusterPlan, PlanError, plan_cluster


def fake_ports() -> Iterator[int]:
    return itertools.count(20000)


def make_plan(tmp_path: Path, *, groups: int = 2, slaves: int = 2,
              coordinated: bool = True, replication: ReplicationPolicy | None = None
              ) -> ClusterPlan:
    ports = fake_ports()
    return plan_cluster(
        directory=tmp_path, groups=groups, slaves=slaves, sync=True, coordinated=coordinated,
        port=lambda: next(ports), zk_port=2181, replication=replication,
    )  # fmt: skip


# ------------------------------------------------------------------ plan (pure)


def test_plan_names_roles_and_wiring(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, coordinated=False)
    assert [g.group for g in plan.groups] == ["g1", "g2"]
    g1 = plan.groups[0]
    assert [b.name for b in g1.brokers] == ["g1-0", "g1-1", "g1-2"]
    assert g1.master.name == "g1-0"
    assert [b.permission.label for b in g1.brokers] == ["FULL", "READ", "READ"]
    ports = [p for g in plan.groups for b in g.brokers for p in (b.port, b.http_port, b.replication_port)]
    assert len(set(ports)) == len(ports)
    slave = plan.process("g1-1")
    argv = list(slave.argv)
    assert argv[argv.index("--master") + 1] == f"127.0.0.1:{g1.master.replication_port}"
    assert argv[argv.index("--role") + 1] == "slave"
    assert argv[argv.index("--permission") + 1] == "read"
    assert "--zk" not in argv
    assert not any(p.name == "controller" for p in plan.processes)


def test_plan_with_coordination_adds_zk_flags_and_controller(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, groups=1, slaves=1)
    argv = list(plan.process("g1-0").argv)
    assert argv[argv.index("--zk") + 1] == "127.0.0.1:2181/understudy"
    assert argv[argv.index("--zk-session-timeout-ms") + 1] == "2000"
    ctl = list(plan.process("controller").argv)
    assert ctl[ctl.index("--group") + 1] == "g1"
    assert ctl[ctl.index("--pid-dir") + 1] == str((tmp_path / "pids").resolve())


def test_group_without_slaves_does_not_wait_for_replication(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, groups=1, slaves=0)
    assert "--async" in plan.process("g1-0").argv


def test_plan_round_trips_through_cluster_json(tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    (tmp_path / "cluster.json").write_text(plan.to_json())
    loaded = ClusterPlan.load(tmp_path)
    assert loaded.groups == plan.groups
    assert loaded.processes == plan.processes
    assert loaded.coordinated == plan.coordinated
    assert loaded.zk_connect == plan.zk_connect


@pytest.mark.parametrize(("groups", "slaves"), [(0, 1), (51, 1), (1, 9)])
def test_plan_rejects_out_of_range_sizes(tmp_path: Path, groups: int, slaves: int) -> None:
    with pytest.raises(PlanError):
        make_plan(tmp_path, groups=groups, slaves=slaves)


# ------------------------------------------------------------------ processes


def test_spawned_process_is_found_by_pid_and_marker_then_stopped(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
    pid = procs.spawn(
        [sys.executable, "-c", child, str(ready), "marker-xyz"], log=tmp_path / "p.log", cwd=tmp_path
    )
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:  # fully started, not exec'ing
        time.sleep(0.01)
    try:
        info = procs.inspect(pid, marker="marker-xyz")
        assert info is not None
        assert info.alive
        assert not info.stopped
        # a PID whose command line lacks the marker is someone else's (PID reuse)
        other = procs.inspect(pid, marker="not-this-one")
        assert other is not None
        assert not other.alive
        procs.send(pid, signal.SIGSTOP)
        assert procs.wait_stopped(pid, marker="marker-xyz")
        frozen = procs.inspect(pid, marker="marker-xyz")
        assert frozen is not None
        assert frozen.stopped
        assert procs.stop(pid, marker="marker-xyz", timeout=5) is True  # TERM + CONT
        gone = procs.inspect(pid, marker="marker-xyz")
        assert gone is not None
        assert not gone.alive
        assert procs.stop(pid, marker="marker-xyz") is False
    finally:
        procs.stop(pid, marker="marker-xyz", timeout=5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: not even a zombie is left


def test_pid_files(tmp_path: Path) -> None:
    assert procs.read_pid(tmp_path, "x") is None
    procs.write_pid(tmp_path, "x", 1234)
    assert procs.read_pid(tmp_path, "x") == 1234
    (tmp_path / "y.pid").write_text("garbage\n")
    assert procs.read_pid(tmp_path, "y") is None
    (tmp_path / "z.pid").write_text("0\n")  # kill(0, sig) would signal our own group
    assert procs.read_pid(tmp_path, "z") is None
    procs.remove_pid(tmp_path, "x")
    procs.remove_pid(tmp_path, "x")
    assert procs.read_pid(tmp_path, "x") is None


# ------------------------------------------------------------------ bad input (no servers)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(local, list(args))
    return result.exit_code, result.output


def test_status_without_a_cluster_is_a_clear_error(tmp_path: Path) -> None:
    code, out = run("status", "--dir", str(tmp_path / "none"))
    assert code == 2
    assert "no local cluster" in out
    assert "local up" in out


def test_corrupt_cluster_json_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text('{"zkPort": 1')
    code, out = run("status", "--dir", str(tmp_path))
    assert code == 2
    assert "unreadable" in out
    (tmp_path / "cluster.json").write_text('{"zkPort": 1}')
    code, out = run("kill", "g1-0", "--dir", str(tmp_path))
    assert code == 2
    assert "malformed" in out


def test_unknown_and_stopped_brokers_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(make_plan(tmp_path).to_json())
    code, out = run("kill", "g9-0", "--dir", str(tmp_path))
    assert code == 2
    assert "unknown broker 'g9-0'" in out
    assert "g1-0" in out
    code, out = run("kill", "g1-0", "--dir", str(tmp_path))
    assert code == 2
    assert "g1-0 is not running" in out
    code, out = run("kill", "g1-0", "--signal", "HUP", "--dir", str(tmp_path))
    assert code == 2
    code, out = run("start", "controller", "--dir", str(tmp_path))
    assert code == 2


def test_quorum_write_flags_reach_the_master_and_bad_ones_start_nothing(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, groups=1, replication=ReplicationPolicy(
        min_insync=1, in_sync_replicas=3, auto_degrade=True, max_lag_bytes=1 << 20))
    argv = list(plan.process("g1-0").argv)
    assert argv[argv.index("--in-sync-replicas") + 1] == "3"
    assert argv[argv.index("--min-insync-replicas") + 1] == "1"
    assert argv[argv.index("--max-lag-bytes") + 1] == str(1 << 20)
    assert "--auto-degrade" in argv
    code, out = run("up", "--dir", str(tmp_path / "c"), "--slaves", "1", "--in-sync-replicas", "3")
    assert code == 2
    assert "inSyncReplicas=3 (copies, the master included) must be between" in out
    assert not (tmp_path / "c").exists()  # refused before ZooKeeper or a broker started


def test_up_refuses_a_foreign_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    code, out = run("up", "--dir", str(tmp_path))
    assert code == 2
    assert "holds no local cluster" in out
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_down_with_nothing_running_says_so(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(make_plan(tmp_path).to_json())
    code, out = run("down", "--dir", str(tmp_path))
    assert code == 0
    assert "nothing was running" in out


# ------------------------------------------------------------------ a real cluster


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        _stop_everything(directory)


def _stop_everything(directory: Path) -> None:
    """Whatever happened in the test: stop every process this cluster recorded, by PID."""
    try:
        lc.down(directory)
    except Exception:  # the plan may be gone or corrupt: fall back to the pid files
        for pidfile in (directory / "pids").glob("*.pid"):
            pid = int(pidfile.read_text().strip() or 0)
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                procs.reap(pid)


@pytest.mark.integration
def test_up_status_kill_start_down(cluster_dir: Path) -> None:
    code, out = run("up", "--dir", str(cluster_dir), "--groups", "1", "--slaves", "1")
    assert code == 0, out
    assert str(cluster_dir.resolve()) in out

    code, out = run("status", "--dir", str(cluster_dir), "--json")
    assert code == 0, out
    doc = json.loads(out)
    (g1,) = doc["groups"]
    assert g1["name"] == "g1"
    assert set(g1) >= {"name", "mode", "epoch", "acting", "brokers"}
    assert (g1["mode"], g1["acting"]) == ("NORMAL", None)
    names = [b["name"] for b in g1["brokers"]]
    assert names == ["g1-0", "g1-1"]
    for b in g1["brokers"]:
        assert set(b) >= {"name", "role", "effective", "pid", "alive"}
        assert b["alive"] is True
        os.kill(b["pid"], 0)  # the PID is real
    assert g1["brokers"][0]["effective"] == "FULL"

    code, out = run("up", "--dir", str(cluster_dir))
    assert code == 2
    assert "in use" in out

    code, out = run("kill", "g1-1", "--dir", str(cluster_dir))
    assert code == 0, out
    st = lc.status(cluster_dir)
    slave = st.groups[0].brokers[1]
    assert not slave.alive

    code, out = run("start", "g1-1", "--dir", str(cluster_dir))
    assert code == 0, out
    slave = lc.status(cluster_dir).groups[0].brokers[1]
    assert slave.alive
    assert not slave.stopped

    code, out = run("kill", "g1-1", "--signal", "STOP", "--dir", str(cluster_dir))
    assert code == 0, out
    assert lc.status(cluster_dir).groups[0].brokers[1].stopped
    code, out = run("start", "g1-1", "--dir", str(cluster_dir))  # resumes a frozen broker
    assert code == 0, out
    assert not lc.status(cluster_dir).groups[0].brokers[1].stopped

    code, out = run("status", "--dir", str(cluster_dir))
    assert code == 0
    assert "g1-0" in out
    assert "g1-1" in out

    pids = [b.pid for b in lc.status(cluster_dir).groups[0].brokers]
    code, out = run("down", "--dir", str(cluster_dir))
    assert code == 0, out
    assert "stopped g1-0" in out
    assert "stopped zookeeper" in out
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    code, out = run("down", "--dir", str(cluster_dir))
    assert "nothing was running" in out


def wait_until(directory: Path, what: str, ok: Callable[[lc.GroupRow], bool], *, within_s: float = 20.0) -> lc.GroupRow:
    """Poll ``local status`` until group g1 satisfies ``ok`` (brokers publish their status
    a moment after they apply a new state)."""
    return testing.wait_until(lambda: lc.status(directory).groups[0], f"g1 {what}", within_s,
                              interval_s=0.1, ok=ok)


def effective(g: lc.GroupRow) -> list[str]:
    return [b.effective.label for b in g.brokers]


@pytest.mark.integration
def test_failover_and_failback_show_in_status(cluster_dir: Path) -> None:
    lc.up(cluster_dir, groups=1, slaves=1)
    lc.kill(cluster_dir, "g1-0", sig="KILL")
    g1 = wait_until(
        cluster_dir, "slave-consume with g1-1 reading",
        lambda g: g.mode == "SLAVE_CONSUME" and g.acting == "g1-1" and effective(g)[1] == "READ",
    )  # fmt: skip
    assert not g1.brokers[0].alive
    assert effective(g1) == ["NONE", "READ"]  # a dead master shows no permission
    lc.start(cluster_dir, "g1-0")
    g1 = wait_until(
        cluster_dir, "NORMAL with g1-0 FULL",
        lambda g: g.mode == "NORMAL" and effective(g) == ["FULL", "NONE"],
    )  # fmt: skip
    assert g1.acting is None
    assert g1.epoch is not None
    assert g1.epoch > 3  # NORMAL -> FENCING -> SLAVE_CONSUME -> RECOVERING -> NORMAL
    assert all(b.alive for b in g1.brokers)


def test_ports_come_from_the_configured_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two test runs side by side (scripts/test.sh) draw ports from disjoint ranges."""
    assert ports.port_range(None, 32768) == (10000, 32768)
    assert ports.port_range("21000-32000", 32768) == (21000, 32000)
    for bad in ("21000", "x-y", "32000-21000", "80-1000", "1024-70000"):
        with pytest.raises(ValueError, match=ports.PORT_RANGE_ENV):
            ports.port_range(bad, 32768)
    monkeypatch.setenv(ports.PORT_RANGE_ENV, "23000-23100")
    chosen = {ports.free_port() for _ in range(20)}
    assert all(23000 <= port < 23100 for port in chosen), chosen
