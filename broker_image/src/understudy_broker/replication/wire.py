"""The replication protocol's frames: what a slave and its master say on the replication
port, as ``struct`` layouts and pure encode/decode functions (no sockets, no asyncio).

Why this module exists: the master (:mod:`.master`) and the slave (:mod:`.slave`) must
agree to the byte, and a peer that sends something else must be caught with one clear
error before anything is allocated for it. Protocol (big-endian; one TCP connection per
slave):

slave -> master::

    HELLO      magic b"UQRS" | version | name length, then the name (utf-8, 1-255 bytes)
    HEARTBEAT  8-byte max physical offset: right after HELLO, every ~100 ms, and after
               every write. It is the acknowledgement: everything below it is persisted.
    ECHO       a heartbeat whose offset is ``ECHO_MARKER`` (2**64-1, never an offset),
               then probe sequence (8) | the group epoch this slave applied (8): the
               answer to a metadata frame's ``probe`` (docs/failover.md, "A master cut off
               from ZooKeeper only"). A slave sends it only for a master that probes.
    REPAIR     a heartbeat whose offset is ``REPAIR_MARKER`` (2**64-2), then the log offset
               (8) of a record this slave found damaged in its copy: "send me yours".

master -> slave::

    PUSH_HEADER  start offset (8) | length (4), then ``length`` raw log bytes
    metadata     the same header with start offset ``METADATA_OFFSET`` (2**64-1) and a
                 JSON body ``{"max_phys": N, "data": {...}}`` sent on connect and every
                 metadata interval: topics and the consumer-offset snapshot flow
                 master -> slave this way, and the master's applied group ``epoch``
                 (a slave that applied a newer one takes none of its bytes). While its
                 ZooKeeper confirmations fail, a master adds ``probe``:
                 ``{"seq": N, "hold_ms": H}`` (it will read for H ms from now on its
                 slaves' echoes; a slave that echoes uses no READ for that long).
    repair       the same header with start offset ``REPAIR_OFFSET`` (2**64-2): the log
                 offset (8), then the master's intact copy of that record (empty when
                 it has none), answering a REPAIR.

With a group secret (``--group-secret-file``, docs/security.md) a slave proves it before
its HELLO, and the master proves it back (HMAC-SHA-256 over both nonces, the group and
the side, so no answer can be replayed or reflected)::

    slave -> master   AUTH_HELLO   magic b"UQRA" | slave nonce (32)
    master -> slave   CHALLENGE    master nonce (32) | MAC("master", slave nonce, master nonce)
    slave -> master   PROOF        MAC("slave", master nonce, slave nonce), then HELLO ...

A secret file may hold several secrets, one per line, to rotate without an outage: a
master proves the first and accepts a proof of any; a slave accepts a master that proves
any of its own and proves that same one back (docs/security.md, "Rotating credentials").

A master with a secret closes a connection that starts with a plain HELLO or fails the
proof; a slave closes one whose master fails its MAC. Neither sends a log byte first.

Both sides cap frame sizes (:data:`MAX_PUSH_BYTES`, :data:`MAX_METADATA_BYTES`) *before*
reading a body.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any

HELLO_MAGIC = b"UQRS"
PROTOCOL_VERSION = 1
HELLO = struct.Struct(
    ">"
    "4s"  # magic b"UQRS"
    "H"  # protocol version
    "H"  # slave name length in bytes (1-255), the name follows
)
HEARTBEAT = struct.Struct(
    ">Q"  # slave's max physical offset: all bytes below are persisted on the slave
)
PUSH_HEADER = struct.Struct(
    ">"
    "Q"  # start physical offset of the bytes that follow, or METADATA_OFFSET
    "I"  # number of bytes that follow
)
METADATA_OFFSET = (1 << 64) - 1
ECHO_MARKER = (1 << 64) - 1
REPAIR_MARKER = (1 << 64) - 2
REPAIR_OFFSET = (1 << 64) - 2
REPAIR = struct.Struct(">Q")  # the damaged record's log offset
ECHO = struct.Struct(
    ">"
    "Q"  # the probe's sequence number
    "Q"  # the group epoch the slave applied when it answered
)
AUTH_MAGIC = b"UQRA"
NONCE_BYTES = 32
AUTH_HELLO = struct.Struct(">4s32s")  # magic b"UQRA", the slave's nonce
CHALLENGE = struct.Struct(">32s32s")  # the master's nonce, its MAC
PROOF = struct.Struct(">32s")  # the slave's MAC
MAX_NAME_BYTES = 255
MAX_PUSH_BYTES = 8 << 20
MAX_METADATA_BYTES = 16 << 20


class ReplicationError(Exception):
    """Base class of replication errors."""


class ReplicationProtocolError(ReplicationError):
    """A peer sent something the protocol does not allow; the link is dropped."""


class NotOfThisGroup(ReplicationError):
    """A peer did not prove the group secret: not one of this group's brokers."""


def group_mac(secret: bytes, side: str, group: str, first: bytes, second: bytes) -> bytes:
    """The MAC one side of a replication link sends to prove the group secret."""
    msg = b"understudy-replication-v1|" + side.encode() + b"|" + group.encode() + b"|" \
        + first + second
    return hmac.new(secret, msg, hashlib.sha256).digest()


def proof_matches(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


def group_secrets(content: bytes) -> tuple[bytes, ...]:
    """The secrets of a ``--group-secret-file``: its non-empty lines, the one this broker
    proves first."""
    return tuple(line.strip() for line in content.splitlines() if line.strip())


def matching_secret(secrets: tuple[bytes, ...], side: str, group: str, first: bytes,
                    second: bytes, got: bytes) -> bytes | None:
    """The secret among ``secrets`` whose MAC is ``got`` (None: none)."""
    return next((s for s in secrets
                 if proof_matches(group_mac(s, side, group, first, second), got)), None)


def encode_hello(name: str) -> bytes:
    raw = name.encode("utf-8")
    if not 1 <= len(raw) <= MAX_NAME_BYTES:
        raise ValueError(f"slave name must be 1-{MAX_NAME_BYTES} bytes")
    return HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, len(raw)) + raw


def hello_name_length(head: bytes) -> int:
    """Check a HELLO header; returns the length of the name that follows."""
    magic, version, nlen = HELLO.unpack(head)
    if magic != HELLO_MAGIC:
        raise ReplicationProtocolError(f"not a replication hello (magic {magic!r})")
    if version != PROTOCOL_VERSION:
        raise ReplicationProtocolError(
            f"replication protocol version {version}, this master speaks {PROTOCOL_VERSION}"
        )
    if not 1 <= nlen <= MAX_NAME_BYTES:
        raise ReplicationProtocolError(f"slave name length {nlen} out of range")
    return int(nlen)


def decode_hello_name(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ReplicationProtocolError("slave name is not utf-8") from None


def check_body_length(length: int, cap: int) -> None:
    """Refuse a frame body before reading it: a peer's announcement allocates nothing."""
    if length > cap:
        raise ReplicationProtocolError(f"frame of {length} bytes exceeds the {cap}-byte limit")


def encode_metadata(max_phys: int, data: dict[str, Any]) -> bytes:
    """A metadata frame (header included); ``ValueError`` when it would exceed
    :data:`MAX_METADATA_BYTES`."""
    body = json.dumps({"max_phys": max_phys, "data": data}, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata of {len(body)} bytes exceeds {MAX_METADATA_BYTES}")
    return PUSH_HEADER.pack(METADATA_OFFSET, len(body)) + body


def decode_metadata(body: bytes) -> tuple[int, dict[str, Any]]:
    """``(max_phys, data)`` of a metadata body; :class:`ReplicationProtocolError` otherwise."""
    try:
        doc = json.loads(body.decode("utf-8"))
        max_phys = doc["max_phys"]
        data = doc["data"]
    except (ValueError, KeyError, TypeError) as exc:
        # ValueError: not UTF-8, not JSON, or a number longer than int() converts
        raise ReplicationProtocolError(f"bad metadata frame: {exc}") from None
    except RecursionError:
        raise ReplicationProtocolError("bad metadata frame: nested too deeply") from None
    if not isinstance(max_phys, int) or not isinstance(data, dict):
        raise ReplicationProtocolError("bad metadata frame: wrong field types")
    return max_phys, data


def encode_echo(seq: int, epoch: int) -> bytes:
    """The ECHO frame (slave -> master) answering probe ``seq`` at ``epoch``."""
    return HEARTBEAT.pack(ECHO_MARKER) + ECHO.pack(seq, epoch)


def decode_probe(data: dict[str, Any]) -> tuple[int, float] | None:
    """``(seq, hold_s)`` of a metadata frame's probe, or None when it has none.
    :class:`ReplicationProtocolError` for a probe of the wrong shape."""
    probe = data.get("probe")
    if probe is None:
        return None
    if not isinstance(probe, dict):
        raise ReplicationProtocolError("bad metadata frame: probe is not an object")
    seq, hold_ms = probe.get("seq"), probe.get("hold_ms")
    if (not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq < 1 << 64
            or not isinstance(hold_ms, int) or isinstance(hold_ms, bool) or hold_ms < 0):
        raise ReplicationProtocolError(f"bad metadata frame: probe {probe!r}")
    return seq, hold_ms / 1000.0


def encode_repair_request(phys: int) -> bytes:
    """The REPAIR frame (slave -> master) asking for the record at ``phys``."""
    return HEARTBEAT.pack(REPAIR_MARKER) + REPAIR.pack(phys)


def encode_repair(phys: int, data: bytes) -> bytes:
    """The repair frame (master -> slave): the record at ``phys`` (``b""``: none)."""
    return PUSH_HEADER.pack(REPAIR_OFFSET, REPAIR.size + len(data)) + REPAIR.pack(phys) + data


def decode_repair(body: bytes) -> tuple[int, bytes]:
    if len(body) < REPAIR.size:
        raise ReplicationProtocolError("repair frame shorter than its log offset")
    (phys,) = REPAIR.unpack_from(body)
    return phys, body[REPAIR.size:]
