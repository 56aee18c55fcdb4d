"""The shared pytest fixtures of every Understudy test suite (loaded by the root
``conftest.py``): one copy each of the ZooKeeper server (and a three-server ensemble),
a client on a private chroot, and broker processes stopped by PID whatever the test's
outcome.

Helpers that are not fixtures (polling, raw frames, the process wrapper) live in
:mod:`understudy_harness.testing` and are imported by the tests that use them.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from understudy_harness import netns as namespaces
from understudy_harness.testing import Brokers, SmallDisk, end_on_sigterm, zk_session
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import ClusterPlan
from understudy_operator.local.zkserver import ZooKeeperEnsemble, ZooKeeperServer


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job's timeout, ``kill``, a closed terminal) ends the run as Ctrl-C
    does, by unwinding, so that every fixture stops the servers it started, by PID.
    Python's default for SIGTERM ends the process at once: a ``make test`` stopped that
    way left its ZooKeeper and brokers running."""
    end_on_sigterm()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Again before each test: a command run in-process (CliRunner) that handled SIGTERM
    on its event loop leaves Python's default behind (``remove_signal_handler``)."""
    end_on_sigterm()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop every ZooKeeper client a test left running. Its connection keeps trying to
    reach a server the session has stopped; a watch callback waiting on it then never
    returns, and kazoo's exit hook joins that callback's thread: a run whose tests all
    passed never ended (seen once, 2026-11-29). Each is named on stderr; stopped, a
    client's reconnect loop ends within its backoff and its waiters are answered."""
    import gc

    from kazoo.client import KazooClient

    leaked = [c for c in gc.get_objects()
              if isinstance(c, KazooClient) and not c._stopped.is_set()]
    threads = []
    for client in leaked:
        hosts = ",".join(f"{h}:{port}" for h, port in client.hosts or ())
        sys.stderr.write(f"\npytest: a test left a ZooKeeper client running "
                         f"({hosts}{client.chroot or ''}): stopping it\n")
        thread = threading.Thread(target=client.stop, name="stop-leaked-zk", daemon=True)
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + 30
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper for the whole session (its process stopped by PID at the end)."""
    server = ZooKeeperServer(Path(tmp_path_factory.mktemp("zookeeper")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    """A real three-server ZooKeeper ensemble for one test, with the same settings as
    :func:`zk_server`: ``zk_ensemble.connect`` lists every server, ``zk_ensemble.nodes[i]``
    is killed (``kill()``), stopped and restarted (``start()``) one at a time and
    ``wait_leader()`` finds the leader. Every server is stopped by PID at the end."""
    ensemble = ZooKeeperEnsemble.on_free_ports(tmp_path / "zk-ensemble", size=3)
    ensemble.start()
    try:
        yield ensemble
    finally:
        ensemble.stop()


@pytest.fixture
def zk(zk_server: ZooKeeperServer) -> str:
    """A connect string with a fresh chroot: ``127.0.0.1:PORT/t-<random>``, so tests never
    see each other's nodes."""
    return f"{zk_server.connect}/t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def admin(zk: str) -> Iterator[Any]:
    """A started kazoo client on the test's chroot (the chroot created), for a test to
    read and write znodes the way an operator or a person would."""
    hosts, _, chroot = zk.partition("/")
    with zk_session(hosts, timeout_s=2.0) as root:
        root.ensure_path("/" + chroot)
    with zk_session(zk, timeout_s=2.0) as client:
        yield client


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Brokers]:
    """Broker processes for one test (``brokers.master()``, ``brokers.slave(m)``), all
    stopped at its end."""
    b = Brokers(tmp_path)
    try:
        yield b
    finally:
        b.stop_all()


@pytest.fixture(scope="module")
def module_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    """:func:`brokers` shared by the tests of one module."""
    b = Brokers(tmp_path_factory.mktemp("brokers"))
    try:
        yield b
    finally:
        b.stop_all()


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for ``lc.up``; whatever the test left running there is stopped by PID
    at the end (``lc.down``, then any leftover the pid files name)."""
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        with contextlib.suppress(Exception):
            lc.down(directory)
        procs.kill_leftovers(directory)


@pytest.fixture
def drill_dir(tmp_path: Path) -> Iterator[Path]:
    """A state directory for a drill (``DrillOptions.directory``, ``--dir``); afterwards
    nothing started in it may survive (checked, and anything left is stopped by PID so a
    failing test leaks nothing)."""
    directory = tmp_path / "drill"
    try:
        yield directory
    finally:
        leftovers = procs.kill_leftovers(directory)
        assert leftovers == [], f"the drill left processes running: {leftovers}"


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ClusterPlan]]:
    """A local cluster shared by the tests of one module: ZooKeeper, groups g1 and g2 of a
    master and a slave each, the controller; ``(directory, plan)``. Stopped by PID at the
    end whatever happened (``plan.address("g1-0")`` gives a broker's client address)."""
    directory = tmp_path_factory.mktemp("two-groups") / "c"
    try:
        plan = lc.up(directory, groups=2, slaves=1)
        yield directory, plan
    finally:
        if (directory / "cluster.json").exists():
            lc.down(directory)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A tmpfs for a data directory that fills up (``small_disk.mount(size)`` returns its
    path); unmounted at the end. Skips, saying why, where the machine refuses the mount
    (it needs root)."""
    disk = SmallDisk(tmp_path / "small-disk")
    try:
        disk.mount(1 << 20)
    except PermissionError as exc:
        pytest.skip(str(exc))
    disk.unmount()
    try:
        yield disk
    finally:
        disk.unmount()


@pytest.fixture(scope="module")
def netns() -> Iterator[Callable[[Sequence[str]], namespaces.Network]]:
    """Network namespaces for the tests of one module: ``netns(["zk", "m", "s"])`` builds
    a :class:`~understudy_harness.netns.Network` (one host per name on a private bridge;
    ``cut``, ``heal``, ``impair`` each path; ``call`` runs test code on a host). Every
    network is removed at the end of the module, with any process still inside it, by
    PID. Skips, with the kernel's reason, where the machine refuses ``ip netns add`` (or
    lacks ``iproute2``/``iptables``); namespaces left by an earlier run that was killed
    are removed first."""
    reason = namespaces.unavailable()
    if reason is not None:
        pytest.skip(reason)
    namespaces.remove_leftovers()
    made: list[namespaces.Network] = []

    def make(hosts: Sequence[str]) -> namespaces.Network:
        net = namespaces.Network(hosts)
        made.append(net)
        return net.start()

    try:
        yield make
    finally:
        for net in reversed(made):
            net.close()
