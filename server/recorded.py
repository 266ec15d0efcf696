"""What a partition file must match to be served as its place: the checksum recorded for it, and where.

A partition stored in checksum format 2 has its checksum in two records: its statistics file (``sum``, bound to
its place, beside the plain ``crc32``) and, once sealed, the version's ``checksums.json``. A file is checked
against the first that can be read; in a version sealed in format 2 a file with neither is damage, never trust.
Versions sealed before keep format 1's rule: the plain CRC-32 when there is one, trust when there is none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from flightpart.io import layout
from flightpart.io.checksum import bound

Place = tuple[str, int, tuple[int, int]]


class Recorded(NamedTuple):
    """A file's recorded checksum (bound to its place, or plain), its size, and which record said so."""

    size: int
    sum: int | None = None
    crc: int | None = None
    source: str = "statistics file"

    def holds(self, crc: int, size: int, place: Place) -> bool:
        """Whether bytes of CRC-32 ``crc`` and ``size`` bytes are this record's file at ``place``."""
        if size != self.size:
            return False
        return bound(crc, *place) == self.sum if self.sum is not None else crc == self.crc

    def why_not(self, crc: int, size: int, place: Place) -> str:
        """Why such bytes are not this file, in a user's words (after :meth:`holds` said they are not)."""
        if size == self.size and self.sum is not None and self.crc == crc:
            return ("its bytes are intact but were written for another place (another position, version or dataset): "
                    "a file copied there, never to be served as this partition")
        kept = f"{self.sum:08x} bound to its place" if self.sum is not None else f"crc32 {self.crc:08x}"
        return f"crc32 {crc:08x} of {size} bytes, recorded in its {self.source} as {kept} of {self.size} bytes"


class Unreadable:
    """A statistics file that is there but cannot be read (garbled): its checksum is unreadable, not absent."""


UNREADABLE = Unreadable()


def stats_body(path: Path) -> dict | Unreadable | None:
    """The statistics file beside a partition: its body, :data:`UNREADABLE`, or None when there is none."""
    try:
        raw = layout.stats_path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return UNREADABLE
    try:
        body = json.loads(raw)
    except ValueError:
        return UNREADABLE
    return body if isinstance(body, dict) else UNREADABLE


def _uint(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < 1 << 63 else None


def from_stats(body: dict, place: Place) -> tuple[Recorded | None, Recorded | None]:
    """(bound, plain) records of a statistics file's body: format 2's sum when it has one, and its plain CRC-32.

    A moved file fails the bound sum but matches the plain CRC-32: how :meth:`Recorded.why_not` tells it from rot."""
    size, crc, total = _uint(body.get("size")), _uint(body.get("crc32")), _uint(body.get("sum"))
    if size is None:
        return None, None
    plain = Recorded(size, crc=crc) if crc is not None else None
    return (Recorded(size, sum=total, crc=crc) if total is not None else None), plain


def plain_crc(body: dict | Unreadable | None, place: Place, size: int) -> int | None:
    """The plain CRC-32 a statistics body vouches for at ``place`` and ``size`` (its bound sum agrees, or format
    1), or None."""
    if not isinstance(body, dict):
        return None
    bound_record, plain = from_stats(body, place)
    if plain is None or plain.size != size:
        return None
    if bound_record is not None and bound(plain.crc, *place) != bound_record.sum:
        return None
    return plain.crc
