"""A node's partitions as Arrow IPC files in its data directory.

Writes go to a temporary file that is fsynced and renamed into place, so a
crash never leaves a half-written partition visible; every received batch
is fully validated before it is written, so no stored file can crash a
reader; a stored file is never overwritten, and a sealed (committed)
version takes no new file. Reads memory-map the file through a bounded
cache, so serving a partition copies nothing and the node never holds one
map per partition. Metadata (rows, schema) is read without keeping a map. The layout itself is :mod:`flightpart.io.layout`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc

from flightpart.errors import (
    CannotStart,
    DatasetNotFound,
    LimitExceeded,
    PartitionDamaged,
    PartitionMissing,
    RequestRejected,
    SchemaMismatch,
    StorageFull,
    StorageUnwritable,
    VersionConflict,
    VersionExpired,
)
from flightpart.io import layout
from flightpart.io.checksum import FORMAT, bound, crc32, decode_seal, encode_seal
from flightpart.io.maps import MappedFiles
from flightpart.io.transfer import READ_WHOLE_BYTES
from flightpart.io.writeback import Writeback
from flightpart.query.statistics import StatsBuilder
from flightpart.wire import Commit, Tombstones, p_stats, p_uint
from flightpart.wire import HeldPartition as StoredPartition

from .drop_watch import Dropped, DropWatch
from .recorded import UNREADABLE, Place, Recorded, from_stats, plain_crc, stats_body

log = logging.getLogger("flightpart.node")
T = TypeVar("T")

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
DELTAS = ipc.IpcWriteOptions(emit_dictionary_deltas=True)
"""A partition file's dictionaries may grow batch by batch (an IPC file allows deltas, not replacements)."""
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)
READ_CHUNK = 8 << 20
"""Bytes read at a time when a file's checksum is verified."""
WRITTEN_KEPT = 200_000
"""Checksums of files this process wrote that it keeps in memory until each file's first check."""
NO_RECORD = Recorded(0, source="nothing")
"""What :meth:`PartitionStore._recorded` answers for a file that must have a checksum and has none: damage."""
SEALS_KEPT = 64
"""Sealed versions whose ``checksums.json`` a store keeps parsed (read only for files whose statistics are lost)."""
MAX_KNOWN_PATHS = 4096
"""Partition paths a store keeps made (:meth:`PartitionStore.path`; about 700 bytes each); past this many it starts
over. Sixteen times the maps a node keeps by default: the partitions it is serving now."""


class ChecksummedSink:
    """A binary file that keeps the CRC-32 of everything written through it.

    The partition's checksum is computed from the very bytes handed to
    the disk, while they are written: storing a partition never reads it
    back. (:func:`~flightpart.io.checksum.crc32` runs at about 28 GB/s here with ISA-L, 4 GB/s with zlib.)
    """

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


def _from_stats_file(path: Path, read: Callable[[dict], T]) -> T | None:
    """``read(body)`` of the statistics file beside a partition, or None when it is missing, damaged or lacks a field."""
    try:
        return read(json.loads(layout.stats_path(path).read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, RequestRejected):
        return None


def read_footer(path: Path) -> tuple[pa.Schema, int]:
    """Schema and row count of a partition file from its metadata alone.

    The file is mapped only for this call (no data page is touched, and the
    map is gone when it returns), so answering metadata never adds to the
    node's maps.
    """
    with pa.memory_map(str(path), "r") as source:
        reader = ipc.open_file(source)
        return reader.schema, sum(reader.get_batch(k).num_rows for k in range(reader.num_record_batches))


class PartitionStore:
    """The files of one node; thread-safe."""

    def __init__(self, data_dir: str | os.PathLike, *, max_partition_bytes: int | None = None, max_maps: int = 256,
                 group: str | None = None, node_id: str | None = None):
        self.root = Path(data_dir).resolve()
        self.modes = layout.Modes(group)
        self.root.mkdir(parents=True, exist_ok=True)
        self.modes.apply(self.root, directory=True)
        self.max_partition_bytes = max_partition_bytes
        self.maps = MappedFiles(max_maps)
        self._lock = threading.Lock()
        self._group_schemas: dict[tuple[str, int, int], pa.Schema] = {}
        self._paths: dict[tuple[str, int, tuple[int, int]], Path] = {}
        # what this process stored in versions not yet sealed: the commit's `held` needs no statistics file read
        self._fresh: dict[tuple[str, int], dict[tuple[int, int], StoredPartition]] = {}
        # files whose checksum matched, by (inode, mtime, size): a file is read in full once per process, not per get
        self._verified: dict[Path, tuple[int, int, int]] = {}
        # the checksum of each file this process wrote, with the file's identity, until its first check: that check
        # reads the file but not its statistics file (what a read right after a put of 100,000 partitions pays)
        self._written: dict[Path, tuple[tuple[int, int, int], tuple[int, int]]] = {}
        # the bound sums (sum, size) of files stored in versions not yet sealed: what their seal records
        self._sums: dict[tuple[str, int], dict[tuple[int, int], tuple[int, int]]] = {}
        # sealed versions' checksums.json, parsed, by the file's (inode, mtime, size)
        self._seals: dict[Path, tuple[tuple[int, int, int], dict[tuple[int, int], tuple[int, int]]]] = {}
        self.drops = DropWatch()
        # what a put could not remove (its disk was read-only): removed again by retry_cleanup()
        self.leftovers: set[Path] = set()
        self.on_damage: Callable[[str, int, tuple[int, int]], None] = lambda dataset, version, part: None
        marker = layout.read_marker(self.root)
        self.node_id = self._identity(marker.get("node_id"), node_id)
        self.cluster: str | None = marker.get("cluster")
        epoch = marker.get("epoch")
        self.epoch: int | None = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None
        for tmp in layout.temporaries(self.root):
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ identity

    def _identity(self, recorded: str | None, credential_name: str | None) -> str:
        """This directory's node id: the one recorded, else the node credential's name (else a fresh one).

        A node credential names its node, so a directory already recorded as another node's is refused."""
        if recorded and credential_name and recorded != credential_name:
            raise CannotStart(f"data directory {self.root} belongs to node {recorded}, but the node token is for "
                              f"{credential_name}: give this node a token for {recorded} "
                              f"(`flightpart token --role node --name {recorded}`)")
        return recorded or layout.write_node_marker(self.root, credential_name, mode=self.modes.file)

    def join_cluster(self, cluster: str) -> None:
        """Record the cluster this node belongs to (once: a node never changes cluster by itself)."""
        if self.cluster is None:
            layout.write_node_marker(self.root, self.node_id, cluster, self.modes.file, self.epoch)
            self.cluster = cluster

    def obey_epoch(self, epoch: int | None) -> bool:
        """Whether an order of a catalog with ``epoch`` may be obeyed: not lower than the highest seen (kept on
        disk before the order is carried out, so a restart does not forget it). An order without an epoch is
        obeyed only by a node that has never followed a leased catalog."""
        with self._lock:
            if epoch is None or (self.epoch is not None and epoch < self.epoch):
                return self.epoch is None
            if epoch != self.epoch:
                layout.write_node_marker(self.root, self.node_id, self.cluster, self.modes.file, epoch)
                self.epoch = epoch
            return True

    # ------------------------------------------------------------------ tombstones

    def tombstones(self, dataset: str) -> Tombstones:
        """What this node remembers of ``dataset``'s versions that are gone (nothing, if the file is missing or damaged)."""
        try:
            return Tombstones.decode((self.root / layout.tombstones_relpath(dataset)).read_bytes(), "tombstones")
        except (OSError, RequestRejected):
            return Tombstones(dataset)

    def all_tombstones(self) -> list[Tombstones]:
        """The tombstones of every dataset, for a registration."""
        datasets = self.root / layout.DATASETS
        names = sorted(d.name for d in datasets.iterdir() if (d / layout.TOMBSTONES).exists()) if datasets.exists() else []
        return [self.tombstones(name) for name in names]

    def gone(self, dataset: str, version: int) -> str | None:
        """``"dropped"`` or ``"aborted"`` when ``version`` of ``dataset`` is gone for good here, else None."""
        known = self.tombstones(dataset)
        if version <= known.dropped_through or version in known.dropped:
            return "dropped"
        return "aborted" if version in known.aborted else None

    def bury(self, dataset: str, version: int | None, kind: str, through: int | None = None) -> None:
        """Remember, durably and before any file goes, that ``version`` (None: every version up to ``through``) is gone."""
        with self._lock:
            known = self.tombstones(dataset)
            if version is None:
                known = dataclasses.replace(known, dropped_through=max(known.dropped_through, through or 0))
            elif kind == "dropped" and version not in known.dropped and version > known.dropped_through:
                known = dataclasses.replace(known, dropped=(*known.dropped, version))
            elif kind == "aborted" and version not in known.aborted:
                known = dataclasses.replace(known, aborted=(*known.aborted, version))
            else:
                return
            path = self.root / layout.tombstones_relpath(dataset)
            self._make_dirs(path.parent)
            layout.write_atomically(path, known.encode(), self.modes.file)

    def _refuse_gone(self, dataset: str, version: int) -> None:
        """A version that was dropped or aborted takes no file (its number is never used again) and serves none: a
        reader of it is told it was dropped (DATASET_NOT_FOUND) or aborted (VERSION_EXPIRED), on every replica alike."""
        kind = self.gone(dataset, version)
        if kind == "aborted":
            raise VersionExpired(f"{dataset} v{version} was aborted (it was pending longer than the catalog's --pending-ttl, "
                                 "or its writer gave it up); nothing of it is kept: put the data again", field="version")
        if kind == "dropped":  # the dataset (or this version) was dropped while it was being written
            raise DatasetNotFound(f"{dataset} v{version} was dropped; nothing of it is stored any more, and its number is "
                                  "never used again (`flightpart ls` lists what can be read)", field="version")

    # ------------------------------------------------------------------ paths

    def path(self, dataset: str, version: int, part: tuple[int, int]) -> Path:
        """A partition's file, the same ``Path`` each time it is asked for (a fresh one is parsed again, and hashed
        again by every cache it keys: a tenth of a small read's time on the node)."""
        key = (dataset, version, part)
        path = self._paths.get(key)
        if path is None:
            if len(self._paths) >= MAX_KNOWN_PATHS:
                self._paths.clear()
            path = self._paths[key] = self.root / layout.partition_relpath(dataset, version, part)
        return path

    def version_dir(self, dataset: str, version: int) -> Path:
        return self.root / layout.version_relpath(dataset, version)

    def sealed(self, dataset: str, version: int) -> bool:
        return (self.version_dir(dataset, version) / layout.MANIFEST).exists()

    # ------------------------------------------------------------------ writes

    def write(self, dataset: str, version: int, part: tuple[int, int], schema: pa.Schema, batches: Iterable[pa.RecordBatch],
              check_complete: Callable[[int], None] | None = None, *, sync_directory: bool = True) -> StoredPartition:
        """Store one partition atomically; nothing is visible unless all of it is.

        Each batch has been checked with ``validate(full=True)`` by the
        caller before it gets here (a put's as it arrives, an assembled
        piece pulled from another node as it is received). ``check_complete(rows)`` runs before the rename and raises
        when the stream was cut short (a cancelled call, a row count that
        does not match the sender's): the temporary file is then removed,
        and so is a version directory the refused put created. With
        ``sync_directory=False`` the caller makes the rename durable with
        :meth:`sync` (once for a stream of several partitions) before it
        acknowledges the put.
        """
        final = self.path(dataset, version, part)
        self._refuse_gone(dataset, version)
        expected_rows = self._replica_rows(dataset, version, part)
        if final.exists():
            raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored; a stored partition is never "
                                  "overwritten", field="descriptor")
        created = self._make_dirs(final.parent)
        tmp = layout.temporary_path(final)
        stats_tmp = tmp.with_name(tmp.name + layout.STATS_SUFFIX)
        rows = 0
        stats = StatsBuilder(schema)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.modes.file))
            self.modes.apply(tmp, directory=False)
            checksummed = ChecksummedSink(open(tmp, "wb", buffering=0))
            with pa.PythonFile(checksummed, mode="w") as sink:
                writer = ipc.new_file(sink, schema, options=DELTAS)  # dictionaries grow: frames.growing_dictionaries
                for batch in batches:
                    if not batch.schema.equals(schema):
                        raise SchemaMismatch(f"a record batch has schema {batch.schema}, the stream declared {schema}",
                                             field="schema")
                    writer.write_batch(batch)
                    stats.add(batch)
                    rows += batch.num_rows
                    if self.max_partition_bytes is not None and sink.tell() > self.max_partition_bytes:
                        raise self.too_large(dataset, version, part)
                if check_complete is not None:
                    check_complete(rows)
                if expected_rows is not None and rows != expected_rows:
                    raise SchemaMismatch(f"a replica of partition {part} of {dataset} v{version} has {rows} rows, "
                                         f"the committed partition {expected_rows}", field="rows")
                writer.close()
                size = sink.tell()  # the file's size, footer included: no stat of it later
            layout.fsync_path(tmp)
            with os.fdopen(os.open(stats_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.modes.file), "wb") as out:
                columns = stats.result()
                total = bound(checksummed.crc, dataset, version, part)
                out.write(json.dumps({"rows": rows, "columns": columns, "crc32": checksummed.crc, "size": size,
                                      "format": FORMAT, "sum": total}).encode())
            self.modes.apply(stats_tmp, directory=False)
            with self._lock:
                if final.exists():  # a racing put of the same partition won
                    raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored", field="descriptor")
                self._refuse_gone(dataset, version)  # dropped or aborted while it was arriving: nothing of it stays
                # statistics first, so a visible partition has them (lost in a crash, they only cost pruning)
                os.replace(stats_tmp, layout.stats_path(final))
                os.replace(tmp, final)
                self._remember_written(final, (checksummed.crc, size))
            if sync_directory:
                layout.fsync_path(final.parent)
        except BaseException as exc:
            self.remove_or_remember([tmp, stats_tmp])
            self._remove_empty(created)
            if isinstance(exc, OSError) and exc.errno in NO_SPACE:
                raise StorageFull(f"node disk full while storing partition {part} of {dataset} v{version}") from None
            if isinstance(exc, OSError) and exc.errno in UNWRITABLE:
                raise StorageUnwritable(f"the node's disk refused to store partition {part} of {dataset} v{version} "
                                        f"({os.strerror(exc.errno)}); nothing of it is kept") from None
            raise
        stored = StoredPartition(dataset, version, part, rows, size)
        with self._lock:
            self._group_schemas.setdefault((dataset, version, part[1]), schema)
            if expected_rows is None:  # a version being written; a replica added to a sealed one is not kept here
                self._fresh.setdefault((dataset, version), {})[part] = dataclasses.replace(stored, stats=columns)
                self._sums.setdefault((dataset, version), {})[part] = (total, size)
        return stored

    def link(self, dataset: str, source: int, source_part: tuple[int, int], version: int,
             part: tuple[int, int]) -> StoredPartition:
        """Make ``part`` of ``version`` the very file of ``source_part`` of ``source``: a hard link, no byte copied.

        Stored files are never written again, so two versions can share
        one: dropping either removes a name, and the data stays while the
        other still names it. The statistics are written first (as
        :meth:`write` renames them first), with the sum bound to the new
        place, so each place's checksum names its own place. Refused like a
        write when the target already exists or its version is sealed.
        """
        src = self.path(dataset, source, source_part)
        final = self.path(dataset, version, part)
        self._refuse_gone(dataset, version)
        try:
            self.verify(dataset, source, source_part)  # a damaged file is never given a second name
        except FileNotFoundError:
            raise PartitionMissing(f"partition {source_part} of {dataset!r} version {source} is not on this node",
                                   field="part") from None
        if self._replica_rows(dataset, version, part) is not None or final.exists():
            raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored or its version is committed; "
                                  "a stored partition is never replaced", field="descriptor")
        created = self._make_dirs(final.parent)
        side, placed_side = None, None
        try:
            side = self._stats_for_link(src, (dataset, source, source_part), (dataset, version, part))
            with self._lock:
                os.replace(side, layout.stats_path(final))
                placed_side = layout.stats_path(final)
                os.link(src, final)
            layout.fsync_path(final.parent)
        except BaseException as exc:
            if side is not None:
                side.unlink(missing_ok=True)
            if placed_side is not None and not final.exists():
                placed_side.unlink(missing_ok=True)
            self._remove_empty(created)
            if isinstance(exc, FileExistsError):
                raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored", field="descriptor") from None
            if isinstance(exc, OSError) and exc.errno in NO_SPACE:
                raise StorageFull(f"node disk full while linking partition {part} of {dataset} v{version}") from None
            raise
        stored = self.describe(dataset, version, part, with_schema=False)
        schema = self.group_schema(dataset, source, source_part[1])
        recorded = self._stats_record(final, (dataset, version, part))
        with self._lock:
            if schema is not None:
                self._group_schemas.setdefault((dataset, version, part[1]), schema)
            self._fresh.setdefault((dataset, version), {})[part] = stored
            if recorded is not None and recorded.sum is not None:
                self._sums.setdefault((dataset, version), {})[part] = (recorded.sum, recorded.size)
        return stored

    def _stats_for_link(self, src: Path, source: Place, target: Place) -> Path:
        """A temporary statistics file for ``target``, a new name of the (verified) file at ``src``: the source's
        statistics with the sum bound to ``target``. The plain CRC-32 comes from the source's statistics when they
        vouch for it, else from reading the file."""
        body = stats_body(src)
        size = src.stat().st_size
        crc = plain_crc(body, source, size)
        if crc is None:
            crc, size = file_checksum(src)
        kept = {k: body[k] for k in ("rows", "columns") if k in body} if isinstance(body, dict) else {}
        tmp = layout.temporary_path(self.path(*target))
        tmp = tmp.with_name(tmp.name + layout.STATS_SUFFIX)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.modes.file), "wb") as out:
            out.write(json.dumps({**kept, "crc32": crc, "size": size, "format": FORMAT,
                                  "sum": bound(crc, *target)}).encode())
        self.modes.apply(tmp, directory=False)
        return tmp

    def sync(self, dataset: str, version: int) -> None:
        """Make every rename into a version's directory durable (one directory fsync)."""
        layout.fsync_path(self.version_dir(dataset, version))

    def _replica_rows(self, dataset: str, version: int, part: tuple[int, int]) -> int | None:
        """For a sealed (committed) version: the rows a new replica of ``part`` must have.

        A committed version takes no new data: only a copy of a partition
        its manifest lists and this node lacks (``copy-to``, repair), with the
        committed row count. None for a version that is not sealed.
        """
        if not self.sealed(dataset, version):
            return None
        manifest = self.manifest(dataset, version)
        entry = next((p for p in manifest.partitions if p.part == part), None) if manifest is not None else None
        if entry is None:
            raise VersionConflict(f"{dataset} v{version} is committed and has no partition {part}; its partitions cannot "
                                  "change", field="descriptor")
        return entry.shape[0]

    def too_large(self, dataset: str, version: int, part: tuple[int, int]) -> LimitExceeded:
        return LimitExceeded(f"partition {dataset} v{version} {part}: more than the node's limit of "
                             f"{self.max_partition_bytes} bytes", field="partition")

    def _make_dirs(self, directory: Path) -> list[Path]:
        """Create ``directory`` and missing parents with the store's modes; returns those created (deepest first)."""
        try:
            return self.modes.make_dirs(directory, self.root)
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise StorageFull("node disk full") from None
            if exc.errno in UNWRITABLE:
                raise StorageUnwritable(f"the node's disk refused to create {directory.name} "
                                        f"({os.strerror(exc.errno)}); nothing was stored") from None
            raise

    def _remove_empty(self, created: list[Path]) -> None:
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break  # not empty: another put uses it

    def seal(self, manifest: Commit) -> bool:
        """Keep a committed version's manifest beside its partitions; False if this node holds none of them.

        The checksums of the version's files here go first, into ``checksums.json`` (the manifest's write makes
        both durable): from the seal on, a file whose statistics are lost is checked against it, and a file with a
        checksum in neither is damage (:meth:`_recorded`)."""
        dataset, version = manifest.dataset, manifest.version
        vdir = self.version_dir(dataset, version)
        if not vdir.is_dir():
            return False
        sums = encode_seal(dataset, version, self._seal_sums(manifest))
        layout.write_atomically(vdir / layout.SUMS, sums, self.modes.file, sync_directory=False)
        layout.write_atomically(vdir / layout.MANIFEST, manifest.encode(), self.modes.file)
        with self._lock:
            self._fresh.pop((dataset, version), None)  # the catalog has what it needs
            self._sums.pop((dataset, version), None)
        return True

    def _seal_sums(self, manifest: Commit) -> dict[tuple[int, int], tuple[int, int]]:
        """The bound sum and size of each file the manifest says this node holds, for the seal: what this process
        stored (no file read), else what its statistics file records, else what an earlier seal recorded (a file
        with none is left out: its first check calls it damaged)."""
        dataset, version = manifest.dataset, manifest.version
        with self._lock:
            kept = dict(self._sums.get((dataset, version), {}))
        earlier: dict[tuple[int, int], tuple[int, int]] | None = None
        out = {}
        vdir = self.version_dir(dataset, version)
        for entry in manifest.partitions:
            part = entry.part
            if self.node_id not in entry.nodes:
                continue
            if part in kept:
                out[part] = kept[part]
                continue
            recorded = self._stats_record(vdir / layout.partition_filename(part), (dataset, version, part))
            if recorded is not None:
                out[part] = (recorded.sum, recorded.size)
                continue
            earlier = self._sealed_sums(dataset, version) or {} if earlier is None else earlier
            if part in earlier:
                out[part] = earlier[part]
        return out

    def _stats_record(self, path: Path, place: Place) -> Recorded | None:
        """The bound checksum a partition's statistics file records (format 1's plain CRC-32 bound here), or None."""
        body = stats_body(path)
        if not isinstance(body, dict):
            return None
        total, plain = from_stats(body, place)
        if total is not None:
            return total
        return Recorded(plain.size, sum=bound(plain.crc, *place)) if plain is not None else None

    def _sealed_sums(self, dataset: str, version: int) -> dict[tuple[int, int], tuple[int, int]] | None:
        """A version's ``checksums.json`` (parsed once per file identity): None when there is none (not sealed, or
        sealed before checksum format 2), empty when it cannot be read."""
        path = self.version_dir(dataset, version) / layout.SUMS
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError:
            return {}
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            known = self._seals.get(path)
        if known is not None and known[0] == identity:
            return known[1]
        try:
            sums = decode_seal(path.read_bytes(), dataset, version) or {}
        except OSError:
            return {}
        with self._lock:
            if len(self._seals) >= SEALS_KEPT:
                self._seals.clear()
            self._seals[path] = (identity, sums)
        return sums

    def manifest(self, dataset: str, version: int) -> Commit | None:
        try:
            return Commit.decode((self.version_dir(dataset, version) / layout.MANIFEST).read_bytes(), "manifest")
        except (OSError, RequestRejected):
            return None

    # ------------------------------------------------------------------ reads

    def open(self, dataset: str, version: int, part: tuple[int, int]) -> pa.Table:
        """The partition as a memory-mapped table (cached, bounded), or PartitionMissing / PartitionDamaged.

        The file's checksum is verified before its first use by this
        process (:meth:`verify`), so damaged bytes never reach a reader nor
        the IPC reader that maps them.
        """
        return self.open_at(dataset, version, part, self.path(dataset, version, part))

    def open_at(self, dataset: str, version: int, part: tuple[int, int], path: Path) -> pa.Table:
        """:meth:`open` of the partition at ``path`` (its :meth:`path`, made by a caller opening many): one ``stat``
        serves both the checksum's memory and the map cache's."""
        try:
            st = os.stat(path)
            identity = (st.st_ino, st.st_mtime_ns, st.st_size)
            data = None
            with self._lock:
                known = self._verified.get(path) == identity
            if not known:
                if identity[2] <= READ_WHOLE_BYTES:  # a small file's one read serves both its checksum and its table
                    with open(path, "rb") as f:
                        data = f.read()
                self._verify_at(dataset, version, part, path, identity, data=data)
            try:
                return self.maps.get(path, identity, data=data)
            except FileNotFoundError:
                raise
            except (pa.ArrowException, OSError):  # Arrow reports a file it cannot parse as either
                # a file checked earlier in this process may have rotted since, its stat unchanged (a failing disk
                # keeps the mtime): read against its checksum now; a mismatch is quarantined and refused as damaged
                # (other replicas serve). A file that matches (a map the kernel refused, say) is left as it is.
                self._verify_at(dataset, version, part, path, identity, again=True)
                raise
        except FileNotFoundError:
            self._refuse_gone(dataset, version)  # dropped (or aborted): said so, not "not on this node"
            raise PartitionMissing(f"partition {part} of dataset {dataset!r} version {version} is not on this node",
                                   field="ticket.part") from None

    # ------------------------------------------------------------------ integrity

    def verify(self, dataset: str, version: int, part: tuple[int, int], *, again: bool = False,
               pace: Callable[[int], None] | None = None) -> int:
        """Check a partition's file against the checksum recorded for its place; returns the bytes read (0: known good).

        A file is read in full once per process and identity (inode,
        mtime, size); later rot is the scrub's to find (``again`` reads it
        anyway). A mismatch, or a file whose version was sealed in checksum
        format 2 with no checksum recorded for it (:meth:`_recorded`),
        moves the file aside (:meth:`quarantine`) and raises
        PartitionDamaged; FileNotFoundError when it is not here. Only a file
        stored before checksums existed, in a version not sealed in format
        2, has no checksum and is trusted.
        """
        path = self.path(dataset, version, part)
        st = os.stat(path)
        return self._verify_at(dataset, version, part, path, (st.st_ino, st.st_mtime_ns, st.st_size), again=again,
                               pace=pace)

    def _verify_at(self, dataset: str, version: int, part: tuple[int, int], path: Path, identity: tuple[int, int, int],
                   *, again: bool = False, pace: Callable[[int], None] | None = None, data: bytes | None = None) -> int:
        """:meth:`verify` of the file at ``path`` whose ``stat`` gave ``identity``; ``data``: its bytes, already read."""
        with self._lock:
            if not again and self._verified.get(path) == identity:
                return 0
            written = self._written.pop(path, None)
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
            found = (crc32(data), len(data)) if data is not None and len(data) == identity[2] else file_checksum(path, pace)
            if expected.holds(*found, place):
                with self._lock:
                    self._verified[path] = identity
                return found[1]
            why = expected.why_not(*found, place)
        self.quarantine(path)
        self.on_damage(dataset, version, part)
        raise PartitionDamaged(f"partition {part} of dataset {dataset!r} version {version} on this node failed its "
                               f"checksum ({why}); it was moved to quarantine and is not served", field="ticket.part")

    def _recorded(self, path: Path, place: Place) -> Recorded | None:
        """What the file at ``path`` must match to be served as ``place``: the first record that can be read, of

        1. its statistics file's sum bound to its place (format 2);
        2. its sealed version's ``checksums.json``;
        3. what this process stored there, for a version not sealed yet;
        4. its statistics file's plain CRC-32 (format 1).

        None (trusted) only when there is none and the version was not sealed in format 2 and its statistics file,
        if any, is readable: a file stored before checksums existed. Otherwise, with none, :data:`NO_RECORD`."""
        dataset, version, part = place
        body = stats_body(path)
        total, plain = from_stats(body, place) if isinstance(body, dict) else (None, None)
        if total is not None:
            return total
        sealed = self._sealed_sums(dataset, version)
        if sealed is not None and part in sealed:
            return Recorded(sealed[part][1], sum=sealed[part][0], source="version's checksums.json")
        with self._lock:
            kept = self._sums.get((dataset, version), {}).get(part)
        if kept is not None:
            return Recorded(kept[1], sum=kept[0], source="writer's memory")
        if plain is not None:
            return plain
        return None if sealed is None and body is not UNREADABLE else NO_RECORD

    def _dropping(self, dataset: str, version: int) -> bool:
        """Whether a drop of ``version`` is under way here, or it is gone for good."""
        sealed = self.sealed(dataset, version)
        return any(d.covers(dataset, version, sealed) for d in self.drops.under_way()) or self.gone(dataset, version) is not None

    def _remember_written(self, path: Path, checksum: tuple[int, int]) -> None:
        """Keep the checksum of a file this process just stored (under the lock), for its first check."""
        try:
            st = os.stat(path)
        except OSError:
            return  # its check reads the statistics file, as after a restart
        if len(self._written) >= WRITTEN_KEPT:
            self._written.clear()  # bounded: past this many, checks read the statistics files
        self._written[path] = ((st.st_ino, st.st_mtime_ns, st.st_size), checksum)

    def quarantine(self, path: Path) -> Path:
        """Move a damaged partition (and its statistics) out of the served tree, never deleting it; returns where.

        It lands in ``<data dir>/quarantine/<dataset>/v<version>/`` with the
        time appended, for an operator to look at; nothing lists or serves
        files there.
        """
        relative = path.relative_to(self.root / layout.DATASETS)
        target_dir = self.root / layout.QUARANTINE / relative.parent
        self.modes.make_dirs(target_dir, self.root)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        target = target_dir / f"{path.name}.{stamp}"
        side = layout.stats_path(path)
        with self._lock:
            self._verified.pop(path, None)
            os.replace(path, target)
            if side.exists():
                os.replace(side, target_dir / f"{side.name}.{stamp}")
        self.maps.forget(path)
        return target

    def scrub(self, claimed: set[tuple[str, int, tuple[int, int]]] = frozenset(),
              pace: Callable[[int], None] | None = None, stop: Callable[[], bool] = lambda: False,
              since: int | None = None) -> dict:
        """Read every partition file against its checksum and find the missing ones.

        Missing: a partition whose statistics file is here without it, or
        one of ``claimed`` (the sealed manifests name this node as holder)
        whose file is gone, unless a drop took it (:meth:`missing`; ``since``:
        the :meth:`DropWatch.mark` taken before ``claimed`` was read, else
        now). Returns ``{"checked", "bytes", "damaged", "missing"}`` (places
        as (dataset, version, part)).
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
        """Partitions that should be here and are not, from names alone (no file is read).

        A statistics file without its partition (the partition deleted
        under the node), or one of ``claimed`` whose file is gone; never one
        of a version that is gone for good (its tombstone) or that a drop
        under way or ended since ``since`` (a :meth:`DropWatch.mark` taken
        before ``claimed`` was read) may have removed: a drop removes a
        version's files one by one, and the manifest that claimed them with
        them.
        """
        found: set[tuple[str, int, tuple[int, int]]] = set()
        for dataset, version in self.versions():
            vdir = self.version_dir(dataset, version)
            for side in vdir.glob(f"*{layout.STATS_SUFFIX}"):
                part = layout.part_of_filename(side.name[: -len(layout.STATS_SUFFIX)] + layout.SUFFIX)
                if part is not None and not self.path(dataset, version, part).exists():
                    found.add((dataset, version, part))
        found |= {place for place in claimed if not self.path(*place).exists()}
        drops = self.drops.since(self.drops.mark() if since is None else since)
        return sorted(place for place in found if not self._dropped(place, drops))

    def _dropped(self, place: Place, drops: list[Dropped]) -> bool:
        """Whether ``place`` is gone by a drop: one of ``drops`` covers it, or its version is buried."""
        dataset, version, _part = place
        sealed = self.sealed(dataset, version)
        return any(d.covers(dataset, version, sealed) for d in drops) or self.gone(dataset, version) is not None

    def claimed(self, node_id: str) -> set[tuple[str, int, tuple[int, int]]]:
        """Partitions the sealed manifests here say this node holds (a file deleted under the node is among them)."""
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

    # ------------------------------------------------------------------ cleanup

    def remove_or_remember(self, paths: Iterable[Path]) -> None:
        """Remove files a failed write left; those the disk will not let go (read-only) are removed later."""
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                with self._lock:
                    self.leftovers.add(path)

    def retry_cleanup(self) -> int:
        """Remove again what a failed put or drop could not (a disk that was read-only); returns how many are left."""
        with self._lock:
            pending = list(self.leftovers)
        for path in pending:
            try:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
                    self._remove_empty([path.parent])
            except OSError:
                continue
            with self._lock:
                self.leftovers.discard(path)
        with self._lock:
            return len(self.leftovers)

    def group_schema(self, dataset: str, version: int, column_group: int) -> pa.Schema | None:
        """The schema partitions of one column group of a version already have, if any."""
        key = (dataset, version, column_group)
        with self._lock:
            known = self._group_schemas.get(key)
        if known is not None:
            return known
        for part, path in layout.partitions_in(self.version_dir(dataset, version)):
            if part[1] != column_group:
                continue
            try:
                self.verify(dataset, version, part)  # a damaged footer never reaches the IPC reader
            except (PartitionDamaged, FileNotFoundError):
                continue
            schema, _rows = read_footer(path)
            with self._lock:
                self._group_schemas[key] = schema
            return schema
        return None

    def describe(self, dataset: str, version: int, part: tuple[int, int], *, with_schema: bool = True) -> StoredPartition:
        """What a node says of one partition: rows, bytes, statistics (and its schema).

        Rows come from the statistics written beside the partition, so no
        partition file is opened; only a partition without them (written
        before statistics existed, or whose statistics a crash lost) is
        read from its footer.
        """
        path = self.path(dataset, version, part)
        try:
            size = path.stat().st_size
            with self._lock:
                fresh = self._fresh.get((dataset, version), {}).get(part)
            if fresh is not None and fresh.nbytes == size and not with_schema:
                return fresh
        except FileNotFoundError:
            raise PartitionMissing(f"partition {part} of dataset {dataset!r} version {version} is not on this node",
                                   field="part") from None
        side = self.sidecar(path)
        if side is None or with_schema and self.group_schema(dataset, version, part[1]) is None:
            schema, rows = read_footer(path)
            return StoredPartition(dataset, version, part, rows, size, schema if with_schema else None, None)
        rows, stats = side
        return StoredPartition(dataset, version, part, rows, size, None, stats)

    def sidecar(self, path: Path) -> tuple[int, dict] | None:
        """(rows, column statistics) written beside a partition, or None when they were never written or were lost."""
        return _from_stats_file(path, lambda body: (p_uint(body["rows"], "rows"), p_stats(body["columns"], "stats")))

    def held(self, dataset: str, version: int, *, after: tuple[int, int] | None = None,
             with_schema: bool = True) -> Iterator[StoredPartition]:
        """The partitions of one dataset version on this node, in grid order (those after ``after``).

        Lazily: a caller that stops after one page reads the statistics of
        that page only.
        """
        for part, _path in layout.partitions_in(self.version_dir(dataset, version)):
            if after is None or part > after:
                yield self.describe(dataset, version, part, with_schema=with_schema)

    def versions(self) -> list[tuple[str, int]]:
        """Every (dataset, version) directory in the data directory, sealed or not."""
        out: list[tuple[str, int]] = []
        datasets = self.root / layout.DATASETS
        if not datasets.exists():
            return out
        for ddir in sorted(datasets.iterdir()):
            for vdir in sorted(ddir.iterdir()) if ddir.is_dir() else []:
                version = layout.version_of_dirname(vdir.name)
                if version is not None:
                    out.append((ddir.name, version))
        return out

    def scan(self) -> tuple[list[StoredPartition], list[Commit], list[tuple[str, int]]]:
        """What a (re)starting node reports: its partitions, its sealed manifests, every version it has."""
        parts: list[StoredPartition] = []
        manifests: list[Commit] = []
        versions = self.versions()
        for dataset, version in versions:
            try:
                parts.extend(list(self.held(dataset, version, with_schema=False)))  # all of a version, or none
            except (ValueError, OSError, pa.ArrowException):
                continue  # a foreign or damaged file is not ours to serve
            manifest = self.manifest(dataset, version)
            if manifest is not None:
                manifests.append(manifest)
        return parts, manifests, versions

    def count(self) -> int:
        """How many partitions the directory holds, from file names alone (no file is opened)."""
        datasets = self.root / layout.DATASETS
        return sum(1 for _ in datasets.glob(f"*/v*/*_*{layout.SUFFIX}")) if datasets.exists() else 0

    def free_bytes(self) -> int:
        """Free space on the data directory's file system, for unprivileged writers."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    # ------------------------------------------------------------------ drops

    def drop(self, dataset: str, version: int | None = None, *, pending_only: bool = False, through: int | None = None,
             remember: bool = False) -> int:
        """Remove a version (or every version) of a dataset; returns files removed.

        With ``pending_only`` (an abort), sealed versions are kept. Maps of
        the removed files are let go, so their disk space returns once no
        stream is still reading them. ``remember`` (an order of the catalog):
        the version is buried first (:meth:`bury`), so no file of it is ever
        stored again and a catalog that lost its state learns the number is
        taken; ``through`` is the highest version a drop of every version covers.
        """
        with self.drops.dropping(Dropped(dataset, version, pending_only)):
            return self._drop(dataset, version, pending_only=pending_only, through=through, remember=remember)

    def _drop(self, dataset: str, version: int | None, *, pending_only: bool, through: int | None,
              remember: bool) -> int:
        """:meth:`drop`, watched."""
        ddir = self.root / layout.dataset_relpath(dataset)
        if remember and not (pending_only and version is not None and self.sealed(dataset, version)):
            kind = "aborted" if pending_only else "dropped"
            if version is not None or through:
                try:
                    self.bury(dataset, version, kind, through)
                except OSError as exc:  # a read-only or full disk: delete what can be deleted; the catalog tells it again
                    log.warning("could not record that %s v%s is %s: %s", dataset, version, kind, exc)
        targets = [self.version_dir(dataset, version)] if version is not None else sorted(ddir.glob("v*"))
        removed = 0
        for target in targets:
            if not target.is_dir() or (pending_only and (target / layout.MANIFEST).exists()):
                continue
            removed += sum(1 for _ in target.glob(f"*{layout.SUFFIX}"))
            with self._lock:
                for key in [k for k in self._group_schemas if k[0] == dataset and (version is None or k[1] == version)]:
                    del self._group_schemas[key]
                for kept_by_version in (self._fresh, self._sums):
                    for key in [k for k in kept_by_version if k[0] == dataset and (version is None or k[1] == version)]:
                        del kept_by_version[key]
                self._seals.pop(target / layout.SUMS, None)
                for kept in (self._verified, self._written):
                    for path in [p for p in kept if target in p.parents]:
                        del kept[path]
            shutil.rmtree(target, ignore_errors=True)
            if target.exists():  # a disk that is read-only for now: removed by retry_cleanup
                with self._lock:
                    self.leftovers.add(target)
            self.maps.forget(target)
        with contextlib.suppress(OSError):
            if ddir.exists() and not any(ddir.iterdir()):
                ddir.rmdir()
        return removed
