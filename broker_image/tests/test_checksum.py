"""The CRC-32 of frames and records (understudy_broker/checksum.py) is zlib's, bit for bit."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from understudy_broker import checksum


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1), st.integers(0, 5000))
def test_the_crc_is_zlibs_whole_chained_and_over_views(data: bytes, start: int, cut: int) -> None:
    """Logs written and frames sent before zlib-ng came in, and peers without it, must
    check out: the same value for any bytes, any start value, in pieces, over a view."""
    assert checksum.crc32(data) == zlib.crc32(data)
    assert checksum.crc32(data, start) == zlib.crc32(data, start)
    assert checksum.crc32(data[cut:], checksum.crc32(data[:cut])) == zlib.crc32(data)
    assert checksum.crc32(memoryview(bytearray(data))[cut:]) == zlib.crc32(data[cut:])


def test_the_fast_implementation_is_the_one_installed() -> None:
    """zlib-ng is a dependency: falling back to zlib would only be slower, so it would
    go unnoticed without this."""
    assert checksum.IMPLEMENTATION == "zlib-ng"
