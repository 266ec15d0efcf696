"""The checksum partition files are verified with must equal zlib's CRC-32, which stored files were written with."""

from __future__ import annotations

import os
import zlib

import pytest

from flightpart.io import checksum


@pytest.mark.parametrize("size", [0, 1, 7, 4096, 1 << 20, (3 << 20) + 5])
def test_the_checksum_is_zlibs_crc32_whole_and_in_pieces(size):
    data = os.urandom(size)
    assert checksum.crc32(data) == zlib.crc32(data)
    running = 0
    for k in range(0, size, 65_537):
        running = checksum.crc32(memoryview(data)[k:k + 65_537], running)
    assert running == zlib.crc32(data)
    assert checksum.crc32(bytearray(data), 12345) == zlib.crc32(data, 12345)


def test_the_fast_checksum_is_the_one_used_where_its_wheel_installs():
    """On x86-64 and aarch64 the ``isal`` wheel is a dependency: a silent fallback to zlib would cost 60 ms per
    290 MiB partition stored."""
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(f"no isal wheel is required on {platform.machine()}")
    assert checksum.implementation() == "isal"
