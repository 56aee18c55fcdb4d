"""The shared vocabulary of Understudy: permissions, roles, group modes and the one
function that turns them into a broker's *effective* permission.

Why this module exists: the broker enforces effective permission, the controller
reasons about it and the tests assert it. If any of the three computed it differently,
the one-reader invariant would hold in one place and not in another. So there is exactly
one pure function, :func:`effective_permission`, with no I/O and no clock of its own; the
callers gather the facts (ZooKeeper state, link health, lease validity) and pass them in.

The rules are the ones in DESIGN.md ("Effective permission" and "Read leases").

Four more shared rules live here for the same reason, one copy each: what a topic may be
called (:func:`check_topic_name`: the codec refuses at the door what the log would refuse
later), the shape of a consumer-offset snapshot (:func:`normalize_snapshot`: the offset
store, the codec's back-sync body and the replicated commit records all validate with it),
what a ``HOST:PORT`` address is (:func:`parse_address`: the client, the broker's flags;
:func:`parse_address_list` for the client commands' and the workload's bootstrap lists)
and a ZooKeeper connect string (:func:`parse_zk_connect`: every command's ``--zk``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final


class Permission(enum.IntFlag):
    """Bit flags. ``FULL`` is ``READ | WRITE``."""

    NONE = 0
    READ = 1
    WRITE = 2
    FULL = 3

    @classmethod
    def parse(cls, text: str) -> Permission:
        """Parse ``FULL``/``WRITE``/``READ``/``NONE`` (case-insensitive) or ``0``-``3``."""
        t = text.strip().upper()
        if t.isdigit() and 0 <= int(t) <= 3:
            return cls(int(t))
        try:
            return cls[t]
        except KeyError:
            raise ValueError(
                f"unknown permission {text!r}: expected one of FULL, WRITE, READ, NONE"
            ) from None

    @property
    def label(self) -> str:
        """The canonical name (``FULL``, ``WRITE``, ``READ``, ``NONE``)."""
        return {0: "NONE", 1: "READ", 2: "WRITE", 3: "FULL"}[int(self)]


class Role(enum.StrEnum):
    """Roles are fixed by configuration: ordinal 0 is the master. Failover never
    promotes a slave to a writer."""

    MASTER = "master"
    SLAVE = "slave"


class Mode(enum.IntEnum):
    """Group mode; the numeric values are the ``understudy_group_mode`` metric values."""

    NORMAL = 0
    FENCING = 1
    SLAVE_CONSUME = 2
    RECOVERING = 3


@dataclass(frozen=True, slots=True)
class GroupState:
    """The content of ``/groups/<group>/state``."""

    mode: Mode
    epoch: int
    acting: str | None = None
    since: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Health:
    """What a broker knows about itself right now.

    ``zk_live``: its ZooKeeper session is connected and not expired.
    ``zk_lost_for``: seconds since the session was last known good (0 while live).
    ``fence_after``: how long ZooKeeper may be unreachable before a master counts as
    isolated (when the other isolation conditions hold).
    ``slaves_assigned``: the configuration names at least one slave.
    ``slave_connected``: some slave has a live replication link to this master.
    ``slave_once_connected``: some slave has connected at least once since start.
    ``lease_valid``: the read lease (DESIGN "Read leases") is currently valid.
    """

    zk_live: bool = True
    zk_lost_for: float = 0.0
    fence_after: float = 0.0
    slaves_assigned: bool = False
    slave_connected: bool = False
    slave_once_connected: bool = False
    lease_valid: bool = True


def is_isolated(health: Health) -> bool:
    """A master is isolated when ZooKeeper has been unreachable longer than the fence
    time AND no slave is connected AND a slave is assigned AND one has connected before.

    The last two conditions are the field-learned exceptions: a master without a
    configured slave, or whose slave never connected, never fences itself (there is
    nobody who could have taken over reads). Because this is recomputed from the current
    facts, a self-fenced master recovers as soon as ZooKeeper or a slave is back.
    """
    return (
        not health.zk_live
        and health.zk_lost_for > health.fence_after
        and not health.slave_connected
        and health.slaves_assigned
        and health.slave_once_connected
    )


def effective_permission(
    *,
    role: Role,
    name: str,
    configured: Permission,
    state: GroupState | None,
    health: Health,
) -> Permission:
    """The permission a broker enforces right now.

    ``state`` is the group state this broker has applied; ``None`` means the broker runs
    without coordination (static configuration, no ZooKeeper): a master then enforces its
    configured permission and a slave at most READ of its configured permission.
    """
    if role is Role.MASTER:
        if state is None:
            perm = configured
        elif state.mode is not Mode.NORMAL or is_isolated(health):
            perm = Permission.NONE
        else:
            perm = configured
    else:
        acting = (
            state is not None
            and state.mode is Mode.SLAVE_CONSUME
            and state.acting == name
            and health.zk_live
        )
        perm = configured & Permission.READ if state is None or acting else Permission.NONE
    if not health.lease_valid:
        perm &= ~Permission.READ
    return Permission(perm)


# --------------------------------------------------------------------------- topics

MAX_TOPIC_BYTES: Final = 200
_TOPIC_NAME = re.compile(r"(?:%RETRY%|%DLQ%)?[A-Za-z0-9._-]{1,200}")


class TopicNameError(ValueError):
    """A topic name breaks :func:`check_topic_name`; the message says the rule."""


def check_topic_name(topic: str) -> str:
    """Topic names are 1-200 characters of ASCII letters, digits, ``.``, ``_`` and ``-``,
    and not ``.`` or ``..`` (they become directory names). A consumer group's retry and
    dead-letter topics add a ``%RETRY%`` or ``%DLQ%`` prefix to such a name
    (docs/delayed.md). Returns the name."""
    if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise TopicNameError(
            f"invalid topic name {topic!r}: 1-{MAX_TOPIC_BYTES} characters of "
            "A-Z a-z 0-9 . _ - (not '.' or '..'), optionally after %RETRY% or %DLQ%"
        )
    return topic


# --------------------------------------------------------------------------- addresses


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), the port in 1-65535. The host is everything before
    the last colon and is not resolved here. ``ValueError`` naming the text otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):  # not '²', not '٣'
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port {int(port)} is outside 1-65535 in {address!r}")
    return host, int(port)


def parse_address_list(values: Iterable[str]) -> list[str]:
    """Addresses given as comma-separated ``HOST:PORT`` lists (one flag or several) ->
    each address, stripped, in order: empty entries (``a:1,,b:2``, a trailing comma) are
    skipped, every other one must be :func:`parse_address`'s ``HOST:PORT``, and there
    must be at least one. ``ValueError`` naming the bad entry otherwise."""
    out = []
    for value in values:
        for raw in value.split(","):
            entry = raw.strip()
            if entry:
                parse_address(entry)
                out.append(entry)
    if not out:
        raise ValueError("at least one HOST:PORT is needed")
    return out


def _bad_path_char(c: str) -> bool:
    """A character ZooKeeper refuses in a path (``PathUtils.validatePath``)."""
    o = ord(c)
    return (o <= 0x1F or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xF8FF
            or 0xFFF0 <= o <= 0xFFFF)


def parse_zk_connect(connect: str) -> tuple[list[tuple[str, int]], str | None]:
    """A ZooKeeper connect string ``HOST:PORT[,HOST:PORT...][/CHROOT]`` -> (the servers,
    the chroot or None). Every server is :func:`parse_address`'s ``HOST:PORT`` (spaces
    around it allowed); the chroot is a path ZooKeeper accepts: no empty part (``//``, a
    ``/`` at the end), no ``.`` or ``..``, none of the characters it refuses, not under
    ``/zookeeper`` (its own). ``ValueError`` saying what is wrong otherwise, at once
    rather than as a connection that never comes up."""
    hosts, slash, rest = connect.partition("/")
    entries = hosts.split(",")
    if not hosts.strip() or any(not e.strip() for e in entries):
        raise ValueError(f"expected HOST:PORT[,HOST:PORT...][/CHROOT], got {connect!r}")
    servers = [parse_address(e.strip()) for e in entries]
    return servers, check_zk_chroot("/" + rest) if slash else None


def check_zk_chroot(chroot: str) -> str:
    """A chroot ZooKeeper accepts (see :func:`parse_zk_connect`); returns it, or raises
    ``ValueError`` saying what is wrong."""
    if not chroot.startswith("/"):
        raise ValueError(f"chroot {chroot!r} is not an absolute path: start it with '/', "
                         "like /understudy")
    parts = chroot.split("/")[1:]
    if any(not part for part in parts):
        raise ValueError(f"chroot {chroot!r} has an empty part: a path like /understudy, "
                         "without '//' or a '/' at the end")
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"chroot {chroot!r}: '.' and '..' are not path parts in ZooKeeper")
    bad = next((c for c in chroot if _bad_path_char(c)), None)
    if bad is not None:
        raise ValueError(f"chroot {chroot!r}: ZooKeeper does not take the character {bad!r}")
    if parts[0] == "zookeeper":
        raise ValueError(f"chroot {chroot!r}: /zookeeper is ZooKeeper's own")
    return chroot


# --------------------------------------------------------------------------- offsets

#: Committed offsets: consumer group -> topic -> queue -> next offset to consume.
Snapshot = dict[str, dict[str, dict[int, int]]]


def normalize_snapshot(data: Any) -> Snapshot:
    """Validate a snapshot (as parsed from JSON: queue keys may be strings).

    Raises ValueError on the wrong shape or negative offsets.
    """
    if not isinstance(data, Mapping):
        raise ValueError("offsets must be an object")
    out: Snapshot = {}
    for group, topics in data.items():
        if not isinstance(group, str) or not isinstance(topics, Mapping):
            raise ValueError(f"group {group!r}: expected an object of topics")
        for topic, queues in topics.items():
            if not isinstance(topic, str) or not isinstance(queues, Mapping):
                raise ValueError(f"{group}/{topic}: expected an object of queues")
            for queue, offset in queues.items():
                try:
                    q = int(queue)
                except (TypeError, ValueError):
                    raise ValueError(f"{group}/{topic}: queue {queue!r} is not a number") from None
                if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or q < 0:
                    raise ValueError(f"{group}/{topic}/{queue}: bad offset {offset!r}")
                out.setdefault(group, {}).setdefault(topic, {})[q] = offset
    return out
