"""Delayed messages, retries and dead letters: names, limits and the byte envelopes.

Why this module exists: a delayed message, a consumer's hand-back (nack) and a dead letter
are all *secondary* messages (seed 001 §6): the broker stores them once, then writes them
a second time when they fall due. The producer, the broker's produce and nack handlers,
the scheduler, the slave that escapes due messages and the consumer that unwraps a retry
all agree here on what those bytes are (docs/delayed.md). Pure: no files, no clock, no
asyncio.

A scheduled message is a record of the internal topic :data:`SCHEDULE_TOPIC`, queue 0,
in its group's commit log (so it is durable and replicated like any record); its key is
the message's key and its body is::

    ENTRY   kind=1 | due ms | target queue | target topic len | target topic | payload

The scheduler delivers it by appending ``payload`` to ``target topic``/``target queue``
(with the key) together with a ``DONE`` record naming the entry by its offset in the
schedule queue (its *origin*); a slave learns the schedule's progress from the same log::

    DONE    kind=2 | count | origin * count

A message redelivered to a consumer group after a nack lives in the group's retry topic
``%RETRY%<group>``, one that went past ``max_reconsume`` in ``%DLQ%<group>``; both carry
the original message in a retry envelope, which the client unwraps::

    RETRY   magic | reconsume times | origin queue | origin offset | origin topic len |
            origin topic | body
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from understudy_broker.model import TopicNameError, check_topic_name

#: The internal topic holding a group's schedule (reserved prefix: clients cannot use it).
SCHEDULE_TOPIC: Final = "__understudy_schedule"
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
#: RocketMQ's default, per consumer group (sent with each nack by the client).
DEFAULT_MAX_RECONSUME: Final = 16
#: The longest delay accepted: the issue asks for "at least 40 days".
MAX_DELAY_MS: Final = 45 * 24 * 3600 * 1000

KIND_ENTRY: Final = 1
KIND_DONE: Final = 2
_ENTRY = struct.Struct(">BqIH")  # kind, due ms, target queue, target topic length
_DONE_HEAD = struct.Struct(">BI")  # kind, count
_ORIGIN = struct.Struct(">Q")
#: DONE records hold at most this many origins each (8 bytes apiece: 64 KiB).
DONE_BATCH: Final = 8192

_RETRY_MAGIC: Final = 0x5E
_RETRY = struct.Struct(">BHIQH")  # magic, reconsume, origin queue, origin offset, topic len


class ScheduleError(ValueError):
    """A delivery time or envelope that cannot be accepted; the message says why."""


def retry_topic(cgroup: str) -> str:
    return check_topic_name(RETRY_PREFIX + cgroup)


def dlq_topic(cgroup: str) -> str:
    return check_topic_name(DLQ_PREFIX + cgroup)


def is_system_topic(topic: str) -> bool:
    """A retry or dead-letter topic: its records carry a retry envelope."""
    return topic.startswith((RETRY_PREFIX, DLQ_PREFIX))


def check_deliver_at(deliver_at_ms: int, now_ms: int) -> int:
    """The due time to schedule, or 0 for "deliver now" (no time, or one not after
    ``now_ms``: a time in the past); :class:`ScheduleError` beyond :data:`MAX_DELAY_MS`.
    Any future time is honoured, however near: a message is never delivered early."""
    if deliver_at_ms <= now_ms:
        return 0
    if deliver_at_ms - now_ms > MAX_DELAY_MS:
        days = (deliver_at_ms - now_ms) / 86_400_000
        raise ScheduleError(
            f"delivery time is {days:.1f} days away; the longest delay is "
            f"{MAX_DELAY_MS // 86_400_000} days")
    return deliver_at_ms


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}


def parse_duration_ms(text: str) -> int:
    """``500ms``, ``10s``, ``5m``, ``2h``, ``40d`` (a bare number is seconds) in ms;
    :class:`ScheduleError` for anything else."""
    m = _DURATION.match(text)
    if m is None:
        raise ScheduleError(f"{text!r} is not a duration: a number with ms, s, m, h or d "
                            "(e.g. 90s, 5m, 40d)")
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def parse_deliver_at_ms(text: str) -> int:
    """An ISO-8601 time (``2026-12-01T09:00:00Z``; without an offset: UTC) in ms since
    the epoch; :class:`ScheduleError` for anything else."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ScheduleError(f"{text!r} is not an ISO-8601 time (e.g. "
                            "2026-12-01T09:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


# ---- schedule records ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    due_ms: int
    topic: str
    queue: int
    payload: bytes


def encode_entry(*, due_ms: int, topic: str, queue: int, payload: bytes) -> bytes:
    raw = check_topic_name(topic).encode()
    return _ENTRY.pack(KIND_ENTRY, due_ms, queue, len(raw)) + raw + payload


def encode_done(origins: list[int]) -> bytes:
    if not 0 < len(origins) <= DONE_BATCH:
        raise ScheduleError(f"a DONE record names 1..{DONE_BATCH} origins, not {len(origins)}")
    return _DONE_HEAD.pack(KIND_DONE, len(origins)) + b"".join(_ORIGIN.pack(o) for o in origins)


def decode(body: bytes) -> Entry | list[int]:
    """A schedule record's body: an :class:`Entry`, or the origins a DONE record names.
    :class:`ScheduleError` for anything else (the scheduler logs and skips it)."""
    if not body:
        raise ScheduleError("empty schedule record")
    if body[0] == KIND_ENTRY:
        if len(body) < _ENTRY.size:
            raise ScheduleError("schedule entry truncated")
        _k, due, queue, tlen = _ENTRY.unpack_from(body)
        topic, end = _topic_at(body, _ENTRY.size, tlen, "schedule entry")
        return Entry(due, topic, queue, body[end:])
    if body[0] == KIND_DONE:
        if len(body) < _DONE_HEAD.size:
            raise ScheduleError("DONE record truncated")
        _k, count = _DONE_HEAD.unpack_from(body)
        if len(body) != _DONE_HEAD.size + count * _ORIGIN.size:
            raise ScheduleError("DONE record length disagrees with its count")
        return [o for (o,) in _ORIGIN.iter_unpack(body[_DONE_HEAD.size:])]
    raise ScheduleError(f"unknown schedule record kind {body[0]}")


# ---- retry envelope ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Retry:
    """A message handed back: how often so far, and where it was first consumed."""

    reconsume: int
    topic: str
    queue: int
    offset: int
    body: bytes


def encode_retry(r: Retry) -> bytes:
    raw = check_topic_name(r.topic).encode()
    return _RETRY.pack(_RETRY_MAGIC, min(r.reconsume, 0xFFFF), r.queue, r.offset,
                       len(raw)) + raw + r.body


def decode_retry(body: bytes) -> Retry:
    if len(body) < _RETRY.size or body[0] != _RETRY_MAGIC:
        raise ScheduleError("not a retry envelope")
    _m, reconsume, queue, offset, tlen = _RETRY.unpack_from(body)
    topic, end = _topic_at(body, _RETRY.size, tlen, "retry envelope")
    return Retry(reconsume, topic, queue, offset, body[end:])


def _topic_at(body: bytes, start: int, length: int, what: str) -> tuple[str, int]:
    """The topic name stored at ``body[start:start + length]``, and where it ends."""
    end = start + length
    if len(body) < end:
        raise ScheduleError(f"{what} truncated")
    try:
        return check_topic_name(body[start:end].decode()), end
    except (UnicodeDecodeError, TopicNameError) as exc:
        raise ScheduleError(f"{what}: {exc}") from None


def handed_back(*, topic: str, queue: int, offset: int, body: bytes, cgroup: str,
                max_reconsume: int) -> tuple[str, Retry]:
    """Where a nacked message goes (pure): the consumer group's retry topic with one more
    reconsume, or its dead-letter topic once that would exceed ``max_reconsume``.
    ``topic`` is where the consumer read it: a message read from the retry topic keeps its
    first origin and count."""
    if topic.startswith(RETRY_PREFIX):
        prior = decode_retry(body)
        nxt = Retry(prior.reconsume + 1, prior.topic, prior.queue, prior.offset, prior.body)
    else:
        nxt = Retry(1, topic, queue, offset, body)
    if nxt.reconsume > max_reconsume:
        return dlq_topic(cgroup), nxt
    return retry_topic(cgroup), nxt
