"""The CRC-32 that partition files are checked with, and how it is bound to a partition's place.

The same checksum as ``zlib.crc32``, computed with ISA-L when the ``isal`` package is there (decision 0009).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

try:
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # a platform without its wheel: zlib's, the same values
    _fast_crc32 = None

_crc32: Callable[[Any, int], int] = _fast_crc32 or zlib.crc32


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of ``data`` (any bytes-like object) continuing from ``value``, equal to ``zlib.crc32(data, value)``."""
    return _crc32(data, value)


def implementation() -> str:
    """Which library computes :func:`crc32` in this process: ``"isal"`` or ``"zlib"``."""
    return "isal" if _fast_crc32 is not None else "zlib"


FORMAT = 2
"""The checksum format of partitions stored now: a statistics file with ``"format": 2`` also records ``sum``, the
CRC-32 bound to the partition's place (:func:`bound`), and a version sealed in this format keeps ``checksums.json``
(:func:`encode_seal`). Format 1 (no ``format`` key) recorded only ``crc32`` and ``size``, which a file copied to
another place carries along, and which a lost statistics file took away."""


def place_tag(dataset: str, version: int, part: tuple[int, int]) -> bytes:
    """The bytes that name a partition's place: its dataset, version and position, unambiguously separated."""
    return f"flightpart-place\0{dataset}\0{int(version)}\0{int(part[0])}\0{int(part[1])}".encode()


def bound(crc: int, dataset: str, version: int, part: tuple[int, int]) -> int:
    """The checksum of a file with CRC-32 ``crc`` at this place: the CRC continued over the place's tag, so a valid
    file copied to another place fails there, and one read of a file yields both sums."""
    return crc32(place_tag(dataset, version, part), crc)


def encode_seal(dataset: str, version: int, sums: dict[tuple[int, int], tuple[int, int]]) -> bytes:
    """The body of a sealed version's ``checksums.json``: each partition's bound sum and size, as columns."""
    parts = sorted(sums)
    return json.dumps({"format": FORMAT, "dataset": dataset, "version": int(version),
                       "i": [p[0] for p in parts], "j": [p[1] for p in parts],
                       "sum": [sums[p][0] for p in parts], "size": [sums[p][1] for p in parts]}).encode()


def decode_seal(raw: bytes, dataset: str, version: int) -> dict[tuple[int, int], tuple[int, int]] | None:
    """The sums of :func:`encode_seal`'s body, or None when it is not one for this dataset version."""
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("dataset") != dataset or body.get("version") != version:
            return None
        columns = [body[k] for k in ("i", "j", "sum", "size")]
    except (ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(c, list) and len(c) == len(columns[0]) for c in columns):
        return None
    if not all(type(x) is int and 0 <= x < 1 << 63 for c in columns for x in c):
        return None
    return {(i, j): (s, n) for i, j, s, n in zip(*columns)}
