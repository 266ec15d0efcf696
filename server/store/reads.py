"""How a node reads its partitions: memory-mapped through a bounded cache (serving copies nothing; decision
0006), and metadata from the statistics file beside a partition, else its footer, without keeping a map.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc

from flightpart.errors import PartitionDamaged, PartitionMissing, RequestRejected
from flightpart.io import layout
from flightpart.io.transfer import READ_WHOLE_BYTES
from flightpart.wire import Commit, p_stats, p_uint

from .integrity import StoreIntegrity
from .paths import StoredPartition

T = TypeVar("T")


def _from_stats_file(path: Path, read: Callable[[dict], T]) -> T | None:
    """``read(body)`` of the statistics file beside a partition, or None when it is missing or damaged."""
    try:
        return read(json.loads(layout.stats_path(path).read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, RequestRejected):
        return None


def read_footer(path: Path) -> tuple[pa.Schema, int]:
    """Schema and row count of a partition file from its metadata alone, mapped only for this call."""
    with pa.memory_map(str(path), "r") as source:
        reader = ipc.open_file(source)
        return reader.schema, sum(reader.get_batch(k).num_rows for k in range(reader.num_record_batches))


class StoreReads(StoreIntegrity):
    """Opening partitions, and describing them (rows, bytes, statistics, schemas) for the catalog."""

    def open(self, dataset: str, version: int, part: tuple[int, int]) -> pa.Table:
        """The partition as a memory-mapped table (cached, bounded), verified before first use (:meth:`verify`),
        or PartitionMissing / PartitionDamaged."""
        return self.open_at(dataset, version, part, self.path(dataset, version, part))

    def open_at(self, dataset: str, version: int, part: tuple[int, int], path: Path) -> pa.Table:
        """:meth:`open` of the partition at ``path`` (its :meth:`path`); one ``stat`` serves both caches."""
        try:
            st = os.stat(path)
            identity = (st.st_ino, st.st_mtime_ns, st.st_size)
            data = None
            with self.lock:
                known = self.verified.get(path) == identity
            if not known:
                if identity[2] <= READ_WHOLE_BYTES:  # a small file's one read serves both its checksum and its table
                    with open(path, "rb") as f:
                        data = f.read()
                self.verify_at(dataset, version, part, path, identity, data=data)
            try:
                return self.maps.get(path, identity, data=data)
            except FileNotFoundError:
                raise
            except (pa.ArrowException, OSError):  # Arrow reports a file it cannot parse as either
                # a file checked earlier in this process may have rotted since, its stat unchanged (a failing disk
                # keeps the mtime): read against its checksum now; a mismatch is quarantined and refused as damaged
                # (other replicas serve). A file that matches (a map the kernel refused, say) is left as it is.
                self.verify_at(dataset, version, part, path, identity, again=True)
                raise
        except FileNotFoundError:
            self.refuse_gone(dataset, version)  # dropped (or aborted): said so, not "not on this node"
            raise PartitionMissing(f"partition {part} of dataset {dataset!r} version {version} is not on this node",
                                   field="ticket.part") from None

    def group_schema(self, dataset: str, version: int, column_group: int) -> pa.Schema | None:
        """The schema partitions of one column group of a version already have, if any."""
        key = (dataset, version, column_group)
        with self.lock:
            known = self.group_schemas.get(key)
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
            with self.lock:
                self.group_schemas[key] = schema
            return schema
        return None

    def describe(self, dataset: str, version: int, part: tuple[int, int], *,
                 with_schema: bool = True) -> StoredPartition:
        """What a node says of one partition: rows, bytes, statistics (and its schema), from its statistics
        file, else its footer."""
        path = self.path(dataset, version, part)
        try:
            size = path.stat().st_size
            with self.lock:
                fresh = self.fresh.get((dataset, version), {}).get(part)
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
        """The partitions of one dataset version on this node, in grid order (those after ``after``), lazily."""
        for part, _path in layout.partitions_in(self.version_dir(dataset, version)):
            if after is None or part > after:
                yield self.describe(dataset, version, part, with_schema=with_schema)

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

