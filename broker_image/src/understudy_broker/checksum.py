"""CRC-32 for every checksum the broker computes: frame bodies and log records.

Why this module exists: every message is checksummed several times on its way (the
PRODUCE frame, the stored record on the master, its check on the slave, the record read
for a consumer, the PULL frame), so the CRC is a visible part of a message's CPU: zlib's
takes ~0.6 µs for 1 KiB here, ~40 µs for 64 KiB. zlib-ng computes the very same CRC-32
(IEEE 802.3, zlib's polynomial, initial value and chaining: existing logs and peers agree
to the bit) with carry-less multiplication where the CPU has it, about ten times faster.
It is a dependency; if it cannot be imported (a platform without its wheel), zlib's is
used and only the speed differs. :data:`IMPLEMENTATION` says which one runs.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32

    IMPLEMENTATION = "zlib-ng"
except ImportError:  # pragma: no cover - the wheel exists for the platforms we build
    from zlib import crc32

    IMPLEMENTATION = "zlib"

__all__ = ["IMPLEMENTATION", "crc32"]
