"""A node's partitions as Arrow IPC files in its data directory.

Writes go to a temporary file that is fsynced and renamed into place, so a
crash never leaves a half-written partition visible; reads memory-map the
file, so serving a partition (or a client on the same host reading it)
copies nothing. A marker file names the node that owns the directory; the
layout itself is :mod:`flightpart.io.layout`.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from flightpart.errors import LimitExceeded, PartitionMissing, SchemaMismatch
from flightpart.io import layout
from flightpart.io.transfer import open_mapped
from flightpart.wire import HeldPartition as StoredPartition


class PartitionStore:
    """The files of one node; thread-safe."""

    def __init__(self, data_dir: str | os.PathLike, *, max_partition_bytes: int | None = None):
        self.root = Path(data_dir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_partition_bytes = max_partition_bytes
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int, tuple[int, int]], pa.Table] = {}
        self._group_schemas: dict[tuple[str, int, int], pa.Schema] = {}
        self.node_id = layout.read_node_id(self.root) or layout.write_node_marker(self.root)
        for tmp in layout.temporaries(self.root):
            tmp.unlink(missing_ok=True)

    def path(self, dataset: str, version: int, part: tuple[int, int]) -> Path:
        return self.root / layout.partition_relpath(dataset, version, part)

    def version_dir(self, dataset: str, version: int) -> Path:
        return self.root / layout.version_relpath(dataset, version)

    def write(self, dataset: str, version: int, part: tuple[int, int], schema: pa.Schema, batches: Iterable[pa.RecordBatch],
              check_complete: Callable[[int], None] | None = None) -> StoredPartition:
        """Store one partition atomically; nothing is visible unless all of it is.

        ``check_complete(rows)`` runs before the rename and raises when the
        stream was cut short (a cancelled call, a row count that does not
        match the sender's): the temporary file is then removed.
        """
        final = self.path(dataset, version, part)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = layout.temporary_path(final)
        rows = 0
        try:
            with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
                for batch in batches:
                    if not batch.schema.equals(schema):
                        raise SchemaMismatch(f"a record batch has schema {batch.schema}, the stream declared {schema}")
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    if self.max_partition_bytes is not None and sink.tell() > self.max_partition_bytes:
                        raise LimitExceeded(
                            f"partition {dataset} v{version} {part}: more than the node's limit of "
                            f"{self.max_partition_bytes} bytes", field="partition",
                        )
            if check_complete is not None:
                check_complete(rows)
            layout.fsync_path(tmp)
            os.replace(tmp, final)
            layout.fsync_path(final.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._open.pop((dataset, version, part), None)
            self._group_schemas.setdefault((dataset, version, part[1]), schema)
        return StoredPartition(dataset, version, part, rows, final.stat().st_size)

    def group_schema(self, dataset: str, version: int, column_group: int) -> pa.Schema | None:
        """The schema partitions of one column group of a version already have, if any."""
        key = (dataset, version, column_group)
        with self._lock:
            known = self._group_schemas.get(key)
        if known is not None:
            return known
        for part, _path in layout.partitions_in(self.version_dir(dataset, version)):
            if part[1] != column_group:
                continue
            schema = self.open(dataset, version, part).schema
            with self._lock:
                self._group_schemas[key] = schema
            return schema
        return None

    def open(self, dataset: str, version: int, part: tuple[int, int]) -> pa.Table:
        """The partition as a memory-mapped table (cached), or KeyError."""
        key = (dataset, version, part)
        with self._lock:
            table = self._open.get(key)
        if table is not None:
            return table
        path = self.path(dataset, version, part)
        try:
            table = open_mapped(path)
        except FileNotFoundError:
            raise PartitionMissing(f"partition {part} of dataset {dataset!r} version {version} is not on this node",
                                   field="ticket.part") from None
        with self._lock:
            self._open[key] = table
        return table

    def describe(self, dataset: str, version: int, part: tuple[int, int]) -> StoredPartition:
        table = self.open(dataset, version, part)
        return StoredPartition(dataset, version, part, table.num_rows, self.path(dataset, version, part).stat().st_size,
                               table.schema)

    def held(self, dataset: str, version: int) -> list[StoredPartition]:
        """Every partition of one dataset version on this node."""
        return [self.describe(dataset, version, part) for part, _path in layout.partitions_in(self.version_dir(dataset, version))]

    def scan(self) -> list[StoredPartition]:
        """Everything the directory holds: what a restarted node re-registers."""
        out: list[StoredPartition] = []
        datasets = self.root / layout.DATASETS
        if not datasets.exists():
            return out
        for ddir in sorted(datasets.iterdir()):
            for vdir in sorted(ddir.iterdir()) if ddir.is_dir() else []:
                version = layout.version_of_dirname(vdir.name)
                if version is None:
                    continue
                try:
                    out.extend(self.held(ddir.name, version))
                except (ValueError, OSError, pa.ArrowException):
                    continue  # a foreign or damaged file is not ours to serve
        return out

    def count(self) -> int:
        """How many partitions the directory holds, from file names alone (no file is opened)."""
        datasets = self.root / layout.DATASETS
        return sum(1 for _ in datasets.glob(f"*/v*/*_*{layout.SUFFIX}")) if datasets.exists() else 0

    def drop(self, dataset: str, version: int | None = None) -> int:
        """Remove a version (or every version) of a dataset; returns files removed."""
        ddir = self.root / layout.dataset_relpath(dataset)
        target = self.version_dir(dataset, version) if version is not None else ddir
        if not target.exists():
            return 0
        count = len(list(target.rglob("*.arrow")))
        with self._lock:
            for cache in (self._open, self._group_schemas):
                for key in [k for k in cache if k[0] == dataset and (version is None or k[1] == version)]:
                    del cache[key]
        shutil.rmtree(target, ignore_errors=True)
        if version is not None and ddir.exists() and not any(ddir.iterdir()):
            ddir.rmdir()
        return count
