"""Free ports on 127.0.0.1 for the servers a local cluster, a drill or a test starts.

Why this module exists: a broker needs three ports chosen before it binds any of them,
ZooKeeper and Prometheus one each, and every test starts several. One chooser, shared by
all of them, hands out each port once per process and avoids the kernel's ephemeral range
(see :func:`free_port`), so two servers never collide on a port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago on ``host``, chosen below the kernel's ephemeral
    range: a port handed out by ``bind(0)`` comes from that range, and between choosing it
    and the server binding it, any outgoing connection (a ZooKeeper client, a replication
    link) may take it as its local port. Below the range only explicit binds compete.

    A port is never handed out twice by one process: a broker's three ports are chosen
    before it binds any of them, so a free-but-already-promised port must not come back.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(50):
        candidate = rng.randrange(10000, max(10001, low))
        if candidate in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, candidate))
            except OSError:
                continue
            _handed_out.add(candidate)
            return candidate
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
