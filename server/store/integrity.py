"""How a node checks what it holds: checksums bound to each file's place, verified before first use, and scrubs.

A file is read in full against its checksum once per process and file identity (inode, mtime, size); later rot
is the scrub's to find. A mismatch moves it to quarantine (never deleted) and tells
:attr:`~.paths.StorePaths.on_damage`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from flightpart.errors import PartitionDamaged
from flightpart.io import layout
from flightpart.io.checksum import bound, crc32, decode_seal
from flightpart.io.writeback import Writeback

from ..drop_watch import Dropped
from ..recorded import UNREADABLE, Place, Recorded, from_stats, stats_body
from .tombstones import StoreTombstones

READ_CHUNK = 8 << 20
"""Bytes read at a time when a file's checksum is verified."""
WRITTEN_KEPT = 200_000
"""Checksums of files this process wrote that it keeps in memory until each file's first check."""
NO_RECORD = Recorded(0, source="nothing")
"""What :meth:`PartitionStore._recorded` answers for a file that must have a checksum and has none: damage."""
SEALS_KEPT = 64
"""Sealed versions whose ``checksums.json`` a store keeps parsed (read only for files whose statistics are lost)."""


class ChecksummedSink:
    """A binary file that keeps the CRC-32 of the very bytes written through it: storing never reads back
    (decision 0009)."""

    def __init__(self, raw):
        self.raw = raw
        self.crc = 0
        self.size = 0
        self.closed = False
        self.writeback = Writeback(raw.fileno())

    def write(self, data) -> int:
        self.crc = crc32(data, self.crc)
        view = memoryview(data)
        self.raw.write(view)
        self.size += view.nbytes
        self.writeback.written(self.size)
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.raw.close()


def file_checksum(path: Path, pace: Callable[[int], None] | None = None) -> tuple[int, int]:
    """(CRC-32, size) of a file read in chunks; ``pace(n)`` is called after each chunk (a scrub's rate limit)."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        # no larger than the file (plus one byte, to see its end): a fresh 8 MiB buffer cost a small file 0.3 ms
        buffer = bytearray(min(READ_CHUNK, os.fstat(f.fileno()).st_size + 1))
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            crc = crc32(view[:n], crc)
            size += n
            if pace is not None:
                pace(n)
    return crc, size


class StoreIntegrity(StoreTombstones):
    """Checksums: verified, recorded, remembered; quarantine; scrubs and missing partitions."""

    def stats_record(self, path: Path, place: Place) -> Recorded | None:
        """The bound checksum a partition's statistics file records (format 1's plain CRC-32 bound here), or None."""
        body = stats_body(path)
        if not isinstance(body, dict):
            return None
        total, plain = from_stats(body, place)
        if total is not None:
            return total
        return Recorded(plain.size, sum=bound(plain.crc, *place)) if plain is not None else None

    def sealed_sums(self, dataset: str, version: int) -> dict[tuple[int, int], tuple[int, int]] | None:
        """A version's ``checksums.json`` (parsed once per file identity): None when there is none, empty when
        unreadable."""
        path = self.version_dir(dataset, version) / layout.SUMS
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError:
            return {}
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self.lock:
            known = self.seals.get(path)
        if known is not None and known[0] == identity:
            return known[1]
        try:
            sums = decode_seal(path.read_bytes(), dataset, version) or {}
        except OSError:
            return {}
        with self.lock:
            if len(self.seals) >= SEALS_KEPT:
                self.seals.clear()
            self.seals[path] = (identity, sums)
        return sums

    def verify(self, dataset: str, version: int, part: tuple[int, int], *, again: bool = False,
               pace: Callable[[int], None] | None = None) -> int:
        """Check a partition's file against the checksum recorded for its place; returns the bytes read (0: known
        good). Once per identity unless ``again`` (see the module docstring); damage is quarantined and raises
        PartitionDamaged; FileNotFoundError when it is not here."""
        path = self.path(dataset, version, part)
        st = os.stat(path)
        return self.verify_at(dataset, version, part, path, (st.st_ino, st.st_mtime_ns, st.st_size), again=again,
                               pace=pace)

    def verify_at(self, dataset: str, version: int, part: tuple[int, int], path: Path, identity: tuple[int, int, int],
                   *, again: bool = False, pace: Callable[[int], None] | None = None, data: bytes | None = None) -> int:
        """:meth:`verify` of the file at ``path`` whose ``stat`` gave ``identity``; ``data``: its bytes, if read."""
        with self.lock:
            if not again and self.verified.get(path) == identity:
                return 0
            written = self.written.pop(path, None)
        place = (dataset, version, part)
        if written is not None and written[0] == identity:  # this process wrote this very file at this place
            expected: Recorded | None = Recorded(written[1][1], crc=written[1][0], source="writer's memory")
        else:
            expected = self._recorded(path, place)
        if expected is None:
            return 0
        if expected is NO_RECORD:
            if not path.exists() or self._dropping(dataset, version):  # its statistics went with a drop
                raise FileNotFoundError(path)
            why = ("no checksum is recorded for it: its statistics file is missing or unreadable, and its sealed "
                   "version's checksums.json names none")
        else:
            found = ((crc32(data), len(data)) if data is not None and len(data) == identity[2]
                     else file_checksum(path, pace))
            if expected.holds(*found, place):
                with self.lock:
                    self.verified[path] = identity
                return found[1]
            why = expected.why_not(*found, place)
        self.quarantine(path)
        self.on_damage(dataset, version, part)
        raise PartitionDamaged(f"partition {part} of dataset {dataset!r} version {version} on this node failed its "
                               f"checksum ({why}); it was moved to quarantine and is not served", field="ticket.part")

    def _recorded(self, path: Path, place: Place) -> Recorded | None:
        """What the file at ``path`` must match to be served as ``place``, the first readable of: its statistics'
        sum bound to its place (format 2); its sealed ``checksums.json``; what this process stored there; its
        statistics' plain CRC-32 (format 1). With none, :data:`NO_RECORD` (damage), except None (trusted) for a
        file from before checksums: version not sealed in format 2, statistics (if any) readable."""
        dataset, version, part = place
        body = stats_body(path)
        total, plain = from_stats(body, place) if isinstance(body, dict) else (None, None)
        if total is not None:
            return total
        sealed = self.sealed_sums(dataset, version)
        if sealed is not None and part in sealed:
            return Recorded(sealed[part][1], sum=sealed[part][0], source="version's checksums.json")
        with self.lock:
            kept = self.sums.get((dataset, version), {}).get(part)
        if kept is not None:
            return Recorded(kept[1], sum=kept[0], source="writer's memory")
        if plain is not None:
            return plain
        return None if sealed is None and body is not UNREADABLE else NO_RECORD

    def _dropping(self, dataset: str, version: int) -> bool:
        """Whether a drop of ``version`` is under way here, or it is gone for good."""
        sealed = self.sealed(dataset, version)
        return (any(d.covers(dataset, version, sealed) for d in self.drops.under_way())
                or self.gone(dataset, version) is not None)

    def remember_written(self, path: Path, checksum: tuple[int, int]) -> None:
        """Keep the checksum of a file this process just stored (under the lock), for its first check."""
        try:
            st = os.stat(path)
        except OSError:
            return  # its check reads the statistics file, as after a restart
        if len(self.written) >= WRITTEN_KEPT:
            self.written.clear()  # bounded: past this many, checks read the statistics files
        self.written[path] = ((st.st_ino, st.st_mtime_ns, st.st_size), checksum)

    def quarantine(self, path: Path) -> Path:
        """Move a damaged partition (and its statistics) to ``<data dir>/quarantine/<dataset>/v<version>/``, never
        deleting it; returns where. Nothing lists or serves files there."""
        relative = path.relative_to(self.root / layout.DATASETS)
        target_dir = self.root / layout.QUARANTINE / relative.parent
        self.modes.make_dirs(target_dir, self.root)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        target = target_dir / f"{path.name}.{stamp}"
        side = layout.stats_path(path)
        with self.lock:
            self.verified.pop(path, None)
            os.replace(path, target)
            if side.exists():
                os.replace(side, target_dir / f"{side.name}.{stamp}")
        self.maps.forget(path)
        return target

    def scrub(self, claimed: set[tuple[str, int, tuple[int, int]]] = frozenset(),
              pace: Callable[[int], None] | None = None, stop: Callable[[], bool] = lambda: False,
              since: int | None = None) -> dict:
        """Read every partition file against its checksum and find the missing ones (:meth:`missing`).

        Returns ``{"checked", "bytes", "damaged", "missing"}``, places as (dataset, version, part).
        """
        since = self.drops.mark() if since is None else since
        checked, nbytes, damaged = 0, 0, []
        for dataset, version in self.versions():
            for part, _path in layout.partitions_in(self.version_dir(dataset, version)):
                if stop():
                    return {"checked": checked, "bytes": nbytes, "damaged": damaged, "missing": []}
                try:
                    nbytes += self.verify(dataset, version, part, again=True, pace=pace)
                except PartitionDamaged:
                    damaged.append((dataset, version, part))
                except FileNotFoundError:
                    continue  # dropped meanwhile
                checked += 1
        missing = [place for place in self.missing(claimed, since) if place not in damaged]
        return {"checked": checked, "bytes": nbytes, "damaged": damaged, "missing": missing}

    def missing(self, claimed: set[tuple[str, int, tuple[int, int]]] = frozenset(),
                since: int | None = None) -> list[tuple[str, int, tuple[int, int]]]:
        """Partitions that should be here and are not, from names alone: a statistics file without its partition,
        or one of ``claimed`` whose file is gone; never one a drop (buried, under way, or ended since ``since``,
        a :meth:`DropWatch.mark` taken before ``claimed`` was read) may have removed, nor one a write is placing
        (each absence is confirmed under the lock that a write's two renames hold)."""
        found: set[tuple[str, int, tuple[int, int]]] = set()
        for dataset, version in self.versions():
            vdir = self.version_dir(dataset, version)
            for side in vdir.glob(f"*{layout.STATS_SUFFIX}"):
                part = layout.part_of_filename(side.name[: -len(layout.STATS_SUFFIX)] + layout.SUFFIX)
                if part is not None and not self.path(dataset, version, part).exists():
                    found.add((dataset, version, part))
        found |= {place for place in claimed if not self.path(*place).exists()}
        with self.lock:  # a write places its statistics, then its file, under the lock: never seen between the two
            found = {place for place in found if not self.path(*place).exists()}
        drops = self.drops.since(self.drops.mark() if since is None else since)
        return sorted(place for place in found if not self._dropped(place, drops))

    def _dropped(self, place: Place, drops: list[Dropped]) -> bool:
        """Whether ``place`` is gone by a drop: one of ``drops`` covers it, or its version is buried."""
        dataset, version, _part = place
        sealed = self.sealed(dataset, version)
        return any(d.covers(dataset, version, sealed) for d in drops) or self.gone(dataset, version) is not None

    def claimed(self, node_id: str) -> set[tuple[str, int, tuple[int, int]]]:
        """Partitions the sealed manifests here say this node holds."""
        out = set()
        for dataset, version in self.versions():
            manifest = self.manifest(dataset, version)
            for p in manifest.partitions if manifest is not None else ():
                if node_id in p.nodes:
                    out.add((dataset, version, p.part))
        return out

    def forget_missing(self, dataset: str, version: int, part: tuple[int, int]) -> None:
        """Move aside the statistics of a partition whose file is gone, so it is reported missing once."""
        side = layout.stats_path(self.path(dataset, version, part))
        if side.exists():
            target_dir = self.root / layout.QUARANTINE / side.parent.relative_to(self.root / layout.DATASETS)
            self.modes.make_dirs(target_dir, self.root)
            os.replace(side, target_dir / f"{side.name}.{time.strftime('%Y%m%dT%H%M%S')}")

