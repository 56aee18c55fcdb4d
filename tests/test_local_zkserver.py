"""The private ZooKeeper server starts, serves kazoo, and expires sessions quickly."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from understudy_operator.local.zkserver import ZooKeeperServer, four_letter

pytestmark = pytest.mark.integration


def test_server_answers_and_stops_by_pid(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ZooKeeperServer(tmp_path)
    server.start()
    try:
        pid = server.pid
        assert pid is not None
        # A generous timeout: this asserts the answer, not how fast a JVM on a busy CI
        # machine gives it (1 s timed out once there, right after start() saw "imok").
        assert four_letter(server.host, server.port, "ruok", timeout=15.0) == "imok"
        client = KazooClient(hosts=server.connect, timeout=1.0)
        client.start(timeout=10)
        try:
            client.ensure_path("/understudy/groups/g1")
            assert client.exists("/understudy/groups/g1") is not None
        finally:
            client.stop()
            client.close()
    finally:
        server.stop()
    with pytest.raises(ConnectionRefusedError):
        four_letter(server.host, server.port, "ruok", timeout=0.5)
