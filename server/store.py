"""A node's partitions as Arrow IPC files in its data directory.

Writes go to a temporary file that is fsynced and renamed into place, so a
crash never leaves a half-written partition visible; reads memory-map the
file, so serving a partition (or a client on the same host reading it)
copies nothing. A marker file names the node that owns the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.ipc as ipc

from flightpart.transfer import open_mapped, read_node_id
from flightpart.wire import NODE_MARKER, check_name, partition_relpath

TMP_PREFIX = ".tmp-"


class PartitionTooLarge(ValueError):
    """A put sent more bytes than the node's configured limit."""


@dataclass(frozen=True)
class StoredPartition:
    dataset: str
    version: int
    part: tuple[int, int]
    rows: int
    nbytes: int
    schema: pa.Schema

    def as_json(self) -> dict:
        return {"dataset": self.dataset, "version": self.version, "part": list(self.part), "rows": self.rows, "nbytes": self.nbytes}


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PartitionStore:
    """The files of one node; thread-safe."""

    def __init__(self, data_dir: str | os.PathLike, *, max_partition_bytes: int | None = None):
        self.root = Path(data_dir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_partition_bytes = max_partition_bytes
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int, tuple[int, int]], pa.Table] = {}
        self._group_schemas: dict[tuple[str, int, int], pa.Schema] = {}
        self.node_id = read_node_id(self.root) or self._write_marker()
        self._remove_leftover_temporaries()

    def _write_marker(self) -> str:
        node_id = uuid.uuid4().hex
        tmp = self.root / f"{TMP_PREFIX}{NODE_MARKER}"
        tmp.write_text(json.dumps({"node_id": node_id}))
        _fsync_path(tmp)
        os.replace(tmp, self.root / NODE_MARKER)
        _fsync_path(self.root)
        return node_id

    def _remove_leftover_temporaries(self) -> None:
        datasets = self.root / "datasets"
        if datasets.exists():
            for tmp in datasets.glob(f"*/v*/{TMP_PREFIX}*"):
                tmp.unlink(missing_ok=True)

    def path(self, dataset: str, version: int, part: tuple[int, int]) -> Path:
        return self.root / partition_relpath(dataset, version, part)

    def write(self, dataset: str, version: int, part: tuple[int, int], schema: pa.Schema, batches: Iterable[pa.RecordBatch],
              check_complete: Callable[[int], None] | None = None) -> StoredPartition:
        """Store one partition atomically; nothing is visible unless all of it is.

        ``check_complete(rows)`` runs before the rename and raises when the
        stream was cut short (a cancelled call, a row count that does not
        match the sender's): the temporary file is then removed.
        """
        final = self.path(dataset, version, part)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}.arrow"
        rows = 0
        try:
            with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
                for batch in batches:
                    if not batch.schema.equals(schema):
                        raise ValueError(f"a record batch has schema {batch.schema}, the stream declared {schema}")
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    if self.max_partition_bytes is not None and sink.tell() > self.max_partition_bytes:
                        raise PartitionTooLarge(
                            f"partition {dataset} v{version} {part}: more than the node's limit of "
                            f"{self.max_partition_bytes} bytes"
                        )
            if check_complete is not None:
                check_complete(rows)
            _fsync_path(tmp)
            os.replace(tmp, final)
            _fsync_path(final.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._open.pop((dataset, version, part), None)
            self._group_schemas.setdefault((dataset, version, part[1]), schema)
        return StoredPartition(dataset, version, part, rows, final.stat().st_size, schema)

    def group_schema(self, dataset: str, version: int, column_group: int) -> pa.Schema | None:
        """The schema partitions of one column group of a version already have, if any."""
        key = (dataset, version, column_group)
        with self._lock:
            known = self._group_schemas.get(key)
        if known is not None:
            return known
        vdir = self.root / "datasets" / check_name(dataset) / f"v{int(version)}"
        for path in vdir.glob(f"*_{int(column_group)}.arrow") if vdir.exists() else []:
            i = int(path.stem.split("_")[0])
            schema = self.open(dataset, version, (i, column_group)).schema
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
            raise KeyError(f"partition {part} of dataset {dataset!r} version {version} is not on this node") from None
        with self._lock:
            self._open[key] = table
        return table

    def describe(self, dataset: str, version: int, part: tuple[int, int]) -> StoredPartition:
        table = self.open(dataset, version, part)
        return StoredPartition(dataset, version, part, table.num_rows, self.path(dataset, version, part).stat().st_size, table.schema)

    def held(self, dataset: str, version: int) -> list[StoredPartition]:
        """Every partition of one dataset version on this node."""
        vdir = self.root / "datasets" / check_name(dataset) / f"v{int(version)}"
        out = []
        for path in sorted(vdir.glob("*_*.arrow")) if vdir.exists() else []:
            i, j = path.stem.split("_")
            out.append(self.describe(dataset, version, (int(i), int(j))))
        return out

    def scan(self) -> list[StoredPartition]:
        """Everything the directory holds: what a restarted node re-registers."""
        out = []
        datasets = self.root / "datasets"
        if not datasets.exists():
            return out
        for ddir in sorted(datasets.iterdir()):
            for vdir in sorted(ddir.glob("v*")):
                if vdir.name[1:].isdigit():
                    try:
                        out.extend(self.held(ddir.name, int(vdir.name[1:])))
                    except (ValueError, OSError, pa.ArrowException):
                        continue  # a foreign or damaged file is not ours to serve
        return out

    def count(self) -> int:
        """How many partitions the directory holds, from file names alone (no file is opened)."""
        datasets = self.root / "datasets"
        return sum(1 for _ in datasets.glob("*/v*/*_*.arrow")) if datasets.exists() else 0

    def drop(self, dataset: str, version: int | None = None) -> int:
        """Remove a version (or every version) of a dataset; returns files removed."""
        ddir = self.root / "datasets" / check_name(dataset)
        target = ddir / f"v{int(version)}" if version is not None else ddir
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
