"""How a node stores partitions: atomic writes, hard links between versions, and seals of committed versions.

A write goes to a temporary file, fsynced and renamed into place, so a crash never leaves half a partition
visible. A stored file is never overwritten; a sealed version takes no new file but a missing replica of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from flightpart.errors import (
    LimitExceeded,
    PartitionMissing,
    SchemaMismatch,
    StorageFull,
    StorageUnwritable,
    VersionConflict,
)
from flightpart.io import layout
from flightpart.io.checksum import FORMAT, bound, encode_seal
from flightpart.query.statistics import StatsBuilder
from flightpart.wire import Commit

from ..recorded import Place, plain_crc, stats_body
from .cleanup import StoreCleanup
from .integrity import ChecksummedSink, file_checksum
from .paths import NO_SPACE, UNWRITABLE, StoredPartition
from .reads import StoreReads

DELTAS = ipc.IpcWriteOptions(emit_dictionary_deltas=True)
"""A partition file's dictionaries may grow batch by batch (an IPC file allows deltas, not replacements)."""


class StoreWrites(StoreReads, StoreCleanup):
    """Writes, links and seals of one node's partitions."""

    def write(self, dataset: str, version: int, part: tuple[int, int], schema: pa.Schema,
              batches: Iterable[pa.RecordBatch], check_complete: Callable[[int], None] | None = None, *,
              sync_directory: bool = True) -> StoredPartition:
        """Store one partition atomically; nothing is visible unless all of it is.

        The caller validated each batch in full. ``check_complete(rows)``
        runs before the rename and raises when the stream was cut short;
        the temporary file is then removed. With ``sync_directory=False``
        the caller makes the rename durable with :meth:`sync`.
        """
        final = self.path(dataset, version, part)
        self.refuse_gone(dataset, version)
        expected_rows = self._replica_rows(dataset, version, part)
        if final.exists():
            raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored; a stored partition is "
                                  "never overwritten", field="descriptor")
        created = self.make_dirs(final.parent)
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
            with self.lock:
                if final.exists():  # a racing put of the same partition won
                    raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored",
                                          field="descriptor")
                self.refuse_gone(dataset, version)  # dropped or aborted while it was arriving: nothing of it stays
                # statistics first, so a visible partition has them (lost in a crash, they only cost pruning)
                os.replace(stats_tmp, layout.stats_path(final))
                os.replace(tmp, final)
                self.remember_written(final, (checksummed.crc, size))
            if sync_directory:
                layout.fsync_path(final.parent)
        except BaseException as exc:
            self.remove_or_remember([tmp, stats_tmp])
            self.remove_empty(created)
            if isinstance(exc, OSError) and exc.errno in NO_SPACE:
                raise StorageFull(f"node disk full while storing partition {part} of {dataset} v{version}") from None
            if isinstance(exc, OSError) and exc.errno in UNWRITABLE:
                raise StorageUnwritable(f"the node's disk refused to store partition {part} of {dataset} v{version} "
                                        f"({os.strerror(exc.errno)}); nothing of it is kept") from None
            raise
        stored = StoredPartition(dataset, version, part, rows, size)
        with self.lock:
            self.group_schemas.setdefault((dataset, version, part[1]), schema)
            if expected_rows is None:  # a version being written; a replica added to a sealed one is not kept here
                self.fresh.setdefault((dataset, version), {})[part] = dataclasses.replace(stored, stats=columns)
                self.sums.setdefault((dataset, version), {})[part] = (total, size)
        return stored

    def link(self, dataset: str, source: int, source_part: tuple[int, int], version: int,
             part: tuple[int, int]) -> StoredPartition:
        """Make ``part`` of ``version`` the very file of ``source_part`` of ``source``: a hard link, no byte copied.

        Sound because stored files are never written again. The statistics
        go first, their sum bound to the new place. Refused like a write
        when the target exists or its version is sealed.
        """
        src = self.path(dataset, source, source_part)
        final = self.path(dataset, version, part)
        self.refuse_gone(dataset, version)
        try:
            self.verify(dataset, source, source_part)  # a damaged file is never given a second name
        except FileNotFoundError:
            raise PartitionMissing(f"partition {source_part} of {dataset!r} version {source} is not on this node",
                                   field="part") from None
        if self._replica_rows(dataset, version, part) is not None or final.exists():
            raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored or its version is "
                                  "committed; a stored partition is never replaced", field="descriptor")
        created = self.make_dirs(final.parent)
        side, placed_side = None, None
        try:
            side = self._stats_for_link(src, (dataset, source, source_part), (dataset, version, part))
            with self.lock:
                os.replace(side, layout.stats_path(final))
                placed_side = layout.stats_path(final)
                os.link(src, final)
            layout.fsync_path(final.parent)
        except BaseException as exc:
            if side is not None:
                side.unlink(missing_ok=True)
            if placed_side is not None and not final.exists():
                placed_side.unlink(missing_ok=True)
            self.remove_empty(created)
            if isinstance(exc, FileExistsError):
                raise VersionConflict(f"partition {part} of {dataset} v{version} is already stored",
                                      field="descriptor") from None
            if isinstance(exc, OSError) and exc.errno in NO_SPACE:
                raise StorageFull(f"node disk full while linking partition {part} of {dataset} v{version}") from None
            raise
        stored = self.describe(dataset, version, part, with_schema=False)
        schema = self.group_schema(dataset, source, source_part[1])
        recorded = self.stats_record(final, (dataset, version, part))
        with self.lock:
            if schema is not None:
                self.group_schemas.setdefault((dataset, version, part[1]), schema)
            self.fresh.setdefault((dataset, version), {})[part] = stored
            if recorded is not None and recorded.sum is not None:
                self.sums.setdefault((dataset, version), {})[part] = (recorded.sum, recorded.size)
        return stored

    def _stats_for_link(self, src: Path, source: Place, target: Place) -> Path:
        """A temporary statistics file for ``target``, a new name of the verified file at ``src``: the source's
        statistics, the sum bound to ``target``."""
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
        """The rows a new replica of ``part`` of a sealed version must have (a partition its manifest lists and
        this node lacks); None for a version not sealed."""
        if not self.sealed(dataset, version):
            return None
        manifest = self.manifest(dataset, version)
        entry = next((p for p in manifest.partitions if p.part == part), None) if manifest is not None else None
        if entry is None:
            raise VersionConflict(f"{dataset} v{version} is committed and has no partition {part}; its partitions "
                                  "cannot change", field="descriptor")
        return entry.shape[0]

    def too_large(self, dataset: str, version: int, part: tuple[int, int]) -> LimitExceeded:
        return LimitExceeded(f"partition {dataset} v{version} {part}: more than the node's limit of "
                             f"{self.max_partition_bytes} bytes", field="partition")

    def seal(self, manifest: Commit) -> bool:
        """Keep a committed version's manifest beside its partitions; False if this node holds none of them.

        Its files' checksums go first, into ``checksums.json``: from the seal on, a file with a checksum in
        neither its statistics nor there is damage (:meth:`_recorded`)."""
        dataset, version = manifest.dataset, manifest.version
        vdir = self.version_dir(dataset, version)
        if not vdir.is_dir():
            return False
        sums = encode_seal(dataset, version, self._seal_sums(manifest))
        layout.write_atomically(vdir / layout.SUMS, sums, self.modes.file, sync_directory=False)
        layout.write_atomically(vdir / layout.MANIFEST, manifest.encode(), self.modes.file)
        with self.lock:
            self.fresh.pop((dataset, version), None)  # the catalog has what it needs
            self.sums.pop((dataset, version), None)
        return True

    def _seal_sums(self, manifest: Commit) -> dict[tuple[int, int], tuple[int, int]]:
        """The bound sum and size of each file the manifest says this node holds: what this process stored, else
        its statistics, else an earlier seal (a file with none is left out)."""
        dataset, version = manifest.dataset, manifest.version
        with self.lock:
            kept = dict(self.sums.get((dataset, version), {}))
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
            recorded = self.stats_record(vdir / layout.partition_filename(part), (dataset, version, part))
            if recorded is not None:
                out[part] = (recorded.sum, recorded.size)
                continue
            earlier = self.sealed_sums(dataset, version) or {} if earlier is None else earlier
            if part in earlier:
                out[part] = earlier[part]
        return out

