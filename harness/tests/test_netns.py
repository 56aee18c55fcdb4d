"""The partition harness itself: the NFQUEUE delayer's messages (pure), a plan whose
processes are placed on hosts (pure), and a real three-host network whose paths are cut,
healed and delayed one at a time (skips where the machine refuses network namespaces)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from understudy_harness import netns as namespaces
from understudy_harness import nfqdelay
from understudy_operator.local.plan import (
    CONTROLLER,
    HOST,
    ClusterPlan,
    Placement,
    ZkNode,
    plan_cluster,
)

Make = Callable[[Sequence[str]], namespaces.Network]

# ------------------------------------------------------------------ pure


def packet_message(packet_id: int, queue: int = 7) -> bytes:
    """An NFQNL_MSG_PACKET as the kernel sends it: header, packet header, an ifindex."""
    attrs = (struct.pack("=HH", 11, 1) + struct.pack("!IHB", packet_id, 0x0800, 3) + b"\0"
             + struct.pack("=HH", 8, 6) + struct.pack("!I", 2))
    body = struct.pack("=BBH", 0, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (3 << 8) | 0, 0, 0, 0) + body


def test_the_delayer_reads_packet_ids_and_answers_accept() -> None:
    datagram = packet_message(1) + packet_message(0xABCDEF01)
    assert list(nfqdelay.packet_ids(datagram)) == [1, 0xABCDEF01]
    assert list(nfqdelay.packet_ids(b"\0" * 8)) == []  # a short datagram yields nothing
    msg = nfqdelay.verdict(7, 42)
    length, kind, flags, _seq, _pid = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags) == (len(msg), (3 << 8) | 1, 1)
    family, version, res_id = struct.unpack_from("=BBH", msg, 16)
    assert (family, version, socket.ntohs(res_id)) == (0, 0, 7)
    size, attr = struct.unpack_from("=HH", msg, 20)
    assert (size, attr) == (12, 2)
    assert struct.unpack_from("!II", msg, 24) == (1, 42)  # NF_ACCEPT, the packet id


def test_a_placed_plan_puts_each_process_on_its_host(tmp_path: Path) -> None:
    hosts = {"g1-0": Placement("10.77.0.3", ("ip", "netns", "exec", "m")),
             "g1-1": Placement("10.77.0.4", ("ip", "netns", "exec", "s")),
             CONTROLLER: Placement("10.77.0.2", ("ip", "netns", "exec", "z"))}
    ports = iter(range(20000, 20100))
    zk = ZkNode(0, 2181, host="10.77.0.2", prefix=("ip", "netns", "exec", "z"))
    plan = plan_cluster(directory=tmp_path, groups=1, slaves=1, sync=True,
                        port=lambda: next(ports), zk_nodes=[zk],
                        placement=lambda name: hosts[name])
    assert plan.zk_connect == "10.77.0.2:2181/understudy"
    assert [b.address for b in plan.groups[0].brokers] == ["10.77.0.3:20000", "10.77.0.4:20003"]
    master, slave, controller = (plan.process(n) for n in ("g1-0", "g1-1", CONTROLLER))
    assert master.argv[:4] == ("ip", "netns", "exec", "m")
    assert master.argv[master.argv.index("--host") + 1] == "10.77.0.3"
    assert slave.argv[slave.argv.index("--master") + 1] == "10.77.0.3:20001"
    assert controller.argv[:4] == ("ip", "netns", "exec", "z")
    assert controller.argv[controller.argv.index("--http-host") + 1] == "10.77.0.2"
    assert (master.host, controller.host) == ("10.77.0.3", "10.77.0.2")
    (tmp_path / "cluster.json").write_text(plan.to_json())
    loaded = ClusterPlan.load(tmp_path)
    assert loaded.zk_nodes == (zk,)
    assert loaded.processes == plan.processes
    # a cluster.json written before placements: everything on 127.0.0.1, no prefix
    doc = json.loads(plan.to_json())
    for node in doc["zkNodes"]:
        del node["host"], node["prefix"]
    for proc in doc["processes"]:
        del proc["host"]
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    old = ClusterPlan.load(tmp_path)
    assert old.zk_nodes == (ZkNode(0, 2181),)
    assert {p.host for p in old.processes} == {HOST}


def test_a_network_refuses_bad_host_lists() -> None:
    with pytest.raises(ValueError, match="distinct"):
        namespaces.Network(["a", "a"])
    with pytest.raises(ValueError, match="distinct"):
        namespaces.Network([])


# ------------------------------------------------------------------ real namespaces

ECHO = """
import socket, sys
srv = socket.create_server((sys.argv[1], 9000))
while True:
    conn, _ = srv.accept()
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
"""


def round_trips(address: str, n: int = 5) -> list[float]:
    """Milliseconds per 100-byte echo over one fresh connection (2 s to connect)."""
    with socket.create_connection((address, 9000), timeout=2) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out = []
        for _ in range(n):
            started = time.monotonic()
            conn.sendall(b"x" * 100)
            got = b""
            while len(got) < 100:
                got += conn.recv(100)
            out.append((time.monotonic() - started) * 1000)
    return out


@pytest.mark.integration
def test_paths_are_cut_healed_and_delayed_one_at_a_time(netns: Make) -> None:
    net = netns(["a", "b", "c"])
    server = net.popen("b", [sys.executable, "-c", ECHO, net.address("b")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        b = net.address("b")
        plain = net.call("a", lambda: _wait_for(lambda: round_trips(b)))
        net.cut("a", "b")
        net.cut("a", "b")  # idempotent
        with pytest.raises(TimeoutError):  # dropped, not refused: the connect times out
            net.call("a", lambda: round_trips(b))
        cut_elsewhere = net.call("c", lambda: round_trips(b))  # only a ↔ b is cut
        net.heal("a", "b")
        healed = net.call("a", lambda: round_trips(b))
        net.impair("a", "b", delay_ms=50)
        delayed = net.call("a", lambda: round_trips(b))
        net.heal_all()
        after = net.call("a", lambda: round_trips(b))
    finally:
        server.kill()
        server.wait()
    print(f"round trip ms: plain {max(plain):.2f}, c while a-b cut {max(cut_elsewhere):.2f}, "
          f"healed {max(healed):.2f}, delayed 50 ms each way {min(delayed):.1f}-"
          f"{max(delayed):.1f}, after {max(after):.2f}")
    assert max(plain) < 50
    assert max(cut_elsewhere) < 50
    assert max(healed) < 50
    assert min(delayed) >= 100  # 50 ms each way
    assert max(after) < 50
    names = [h.netns for h in net.hosts.values()] + [net.hub]
    assert net.close() == []
    assert not set(names) & set(namespaces.list_namespaces())


def _wait_for(probe: Callable[[], list[float]], within_s: float = 5.0) -> list[float]:
    """The first probe that works (the server may still be starting)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return probe()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.integration
def test_namespaces_of_a_dead_run_are_removed(netns: Make) -> None:
    dead = 1
    while Path(f"/proc/{dead}").exists():
        dead += 7919  # a pid that runs nothing now
    name = f"{namespaces.PREFIX}-{dead}-1-x"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in namespaces.remove_leftovers()
        assert name not in namespaces.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
