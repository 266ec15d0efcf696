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


PLACES = [("d", 1, (0, 0)), ("d", 1, (3, 0)), ("d", 2, (0, 0)), ("e", 1, (0, 0)), ("d", 1, (0, 1)),
          ("d\0" "1", 1, (0, 0))]


def test_a_bound_sum_differs_for_every_place_and_agrees_with_one_pass_over_bytes_and_place():
    data = os.urandom(10_000)
    sums = {checksum.bound(zlib.crc32(data), *place) for place in PLACES}
    assert len(sums) == len(PLACES)
    for place in PLACES:
        assert checksum.bound(zlib.crc32(data), *place) == zlib.crc32(data + checksum.place_tag(*place))


def test_a_seal_record_reads_back_only_for_its_own_dataset_version():
    sums = {(0, 0): (123, 456), (2, 1): (2**32 - 1, 0)}
    raw = checksum.encode_seal("d", 3, sums)
    assert checksum.decode_seal(raw, "d", 3) == sums
    assert checksum.decode_seal(raw, "d", 2) is None  # another version's record copied here
    assert checksum.decode_seal(raw, "e", 3) is None
    for bad in (raw[: len(raw) // 2], b"[]",
                b'{"dataset": "d", "version": 3, "i": [0], "j": [], "sum": [1], "size": [1]}',
                b'{"dataset": "d", "version": 3, "i": [-1], "j": [0], "sum": [1], "size": [1]}'):
        assert checksum.decode_seal(bad, "d", 3) is None
