"""Free ports on 127.0.0.1 for the servers a local cluster, a drill or a test starts.

Why this module exists: a broker needs three ports chosen before it binds any of them,
ZooKeeper and Prometheus one each, and every test starts several. One chooser, shared by
all of them, hands out each port once per process and avoids the kernel's ephemeral range
(see :func:`free_port`), so two servers never collide on a port.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

#: ``LO-HI``: choose only ports in ``[LO, HI)``. Two test runs side by side on one machine
#: (``scripts/test.sh``) take disjoint ranges, so neither promises a port the other holds.
PORT_RANGE_ENV = "UNDERSTUDY_PORT_RANGE"


def port_range(text: str | None, ephemeral_low: int) -> tuple[int, int]:
    """The ``[lo, hi)`` ports :func:`free_port` draws from: ``text`` (``LO-HI``, from
    ``PORT_RANGE_ENV``) when given, else 10000 up to the kernel's ephemeral range."""
    if not text:
        return 10000, max(10001, ephemeral_low)
    lo_text, sep, hi_text = text.partition("-")
    if not sep or not lo_text.isdigit() or not hi_text.isdigit() or not 1024 <= int(lo_text) < int(hi_text) <= 65536:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected LO-HI with 1024 <= LO < HI <= 65536")
    return int(lo_text), int(hi_text)


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
    lo, hi = port_range(os.environ.get(PORT_RANGE_ENV), _ephemeral_low())
    rng = random.SystemRandom()
    for _ in range(50):
        candidate = rng.randrange(lo, hi)
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
