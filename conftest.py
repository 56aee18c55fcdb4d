"""Repository-wide pytest fixtures: a real ZooKeeper server shared by the session.

Each test that uses ``zk`` gets its own chroot, so tests never see each other's nodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from understudy_operator.zkserver import ZooKeeperServer


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(Path(tmp_path_factory.mktemp("zookeeper")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk(zk_server: ZooKeeperServer) -> str:
    """A connect string with a fresh chroot: ``127.0.0.1:PORT/t-<random>``."""
    return f"{zk_server.connect}/t-{uuid.uuid4().hex[:10]}"
