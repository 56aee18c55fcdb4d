"""Delay packets by a fixed time: a user-space ``netem delay`` over netfilter's NFQUEUE.

Why this module exists: the partition tests put loss and delay on one link (the
replication link between a master and its slave, :meth:`understudy_harness.netns.Network.
impair`). ``tc netem`` is the usual tool, but a kernel built without ``sch_netem`` (this
project's Debian 12 machines: ``CONFIG_NET_SCH_NETEM`` is not set) refuses it. Loss needs
no qdisc (an ``iptables -m statistic`` DROP rule), delay does: packets that an
``iptables ... -j NFQUEUE --queue-num N`` rule hands to user space wait here, and each is
given back (``NF_ACCEPT``) ``delay`` seconds after it arrived, in arrival order.

The rules sit on the receiver's INPUT hook: a packet queued on the sender's OUTPUT hook
still counts against its TCP socket's small-queue budget (netem orphans it, NFQUEUE does
not), which throttled a TCP stream to ~2 packets per delay (100 KB/s at 50 ms); queued on
arrival, the stream runs at full speed.

Run inside the namespace whose INPUT rules name the queue (a netlink queue belongs to one
network namespace): ``ip netns exec NS python -m understudy_harness.nfqdelay --queue N
--delay-ms 50``. It prints ``bound`` once packets go through it. SIGTERM gives back every
packet still waiting and exits 0; the rules say ``--queue-bypass``, so with no program
bound packets pass undelayed instead of being dropped.

The protocol (``nfnetlink_queue``, ``linux/netfilter/nfnetlink_queue.h``) is spoken with
:mod:`socket` and :mod:`struct` alone: bind the queue, ask for packet metadata only
(``NFQNL_COPY_META``), read ``NFQNL_MSG_PACKET`` messages for their packet id, answer
``NFQNL_MSG_VERDICT``.
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET = 0
MSG_VERDICT = 1
MSG_CONFIG = 2
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
CFG_CMD = 1  # NFQA_CFG_CMD
CFG_PARAMS = 2  # NFQA_CFG_PARAMS
CFG_QUEUE_MAXLEN = 3  # NFQA_CFG_QUEUE_MAXLEN
CMD_BIND = 1  # NFQNL_CFG_CMD_BIND
COPY_META = 1  # NFQNL_COPY_META: no packet bytes, only the header
PACKET_HDR = 1  # NFQA_PACKET_HDR
VERDICT_HDR = 2  # NFQA_VERDICT_HDR
NF_ACCEPT = 1
_NLMSG = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")


def _attr(kind: int, payload: bytes) -> bytes:
    size = _NLA.size + len(payload)
    return _NLA.pack(size, kind) + payload + b"\0" * (-size % 4)


def message(kind: int, queue: int, attrs: bytes, *, flags: int = NLM_F_REQUEST) -> bytes:
    """One ``nfnetlink_queue`` request for ``queue`` (family unspecified, version 0)."""
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return _NLMSG.pack(_NLMSG.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0,
                       0) + body


def verdict(queue: int, packet_id: int) -> bytes:
    """Give packet ``packet_id`` of ``queue`` back to the kernel (``NF_ACCEPT``)."""
    return message(MSG_VERDICT, queue, _attr(VERDICT_HDR, struct.pack("!II", NF_ACCEPT,
                                                                       packet_id)))


def packet_ids(data: bytes) -> Iterator[int]:
    """The packet ids of the ``NFQNL_MSG_PACKET`` messages in one netlink datagram."""
    off = 0
    while off + _NLMSG.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
        if length < _NLMSG.size:
            return
        if kind == (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET:
            attr = off + _NLMSG.size + _NFGEN.size
            while attr + _NLA.size <= off + length:
                size, atype = _NLA.unpack_from(data, attr)
                if size < _NLA.size:
                    break
                if atype & 0x7FFF == PACKET_HDR:
                    yield int(struct.unpack_from("!I", data, attr + _NLA.size)[0])
                attr += (size + 3) & ~3
        off += (length + 3) & ~3


class Delayer:
    """The bound queue: :meth:`run` until :meth:`stop` (or SIGTERM)."""

    def __init__(self, queue: int, delay_s: float, *, maxlen: int = 16384) -> None:
        self.queue = queue
        self.delay_s = delay_s
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._request(message(MSG_CONFIG, queue, _attr(CFG_CMD, struct.pack("!BxH", CMD_BIND, 0)),
                              flags=NLM_F_REQUEST | NLM_F_ACK))
        self._request(message(MSG_CONFIG, queue,
                              _attr(CFG_PARAMS, struct.pack("!IB", 0, COPY_META))
                              + _attr(CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen)),
                              flags=NLM_F_REQUEST | NLM_F_ACK))
        self.waiting: collections.deque[tuple[float, int]] = collections.deque()
        self.passed = 0
        self._running = True

    def _request(self, msg: bytes) -> None:
        self.sock.send(msg)
        data = self.sock.recv(65536)
        _length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data)
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, _NLMSG.size)
            if err:
                raise OSError(-err, f"nfnetlink_queue refused the request: {os.strerror(-err)}")

    def stop(self, *_: object) -> None:
        self._running = False

    def run(self) -> None:
        while self._running:
            now = time.monotonic()
            wait = max(0.0, self.waiting[0][0] - now) if self.waiting else 0.5
            try:
                readable, _, _ = select.select([self.sock], [], [], wait)
            except InterruptedError:
                continue
            if readable:
                due = time.monotonic() + self.delay_s
                self.waiting.extend((due, pid) for pid in packet_ids(self.sock.recv(1 << 16)))
            now = time.monotonic()
            while self.waiting and self.waiting[0][0] <= now:
                self._accept(self.waiting.popleft()[1])
        while self.waiting:
            self._accept(self.waiting.popleft()[1])

    def _accept(self, packet_id: int) -> None:
        self.sock.send(verdict(self.queue, packet_id))
        self.passed += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue", type=int, required=True, help="the NFQUEUE number")
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args(argv)
    delayer = Delayer(args.queue, args.delay_ms / 1000)
    signal.signal(signal.SIGTERM, delayer.stop)
    signal.signal(signal.SIGINT, delayer.stop)
    print("bound", flush=True)
    delayer.run()
    print(f"released {delayer.passed} packets", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
