"""The root of a node's store: its data directory, the node marker (node id, cluster, epoch), the paths of its
files, and the caches every concern shares under :attr:`StorePaths.lock`.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from flightpart.errors import CannotStart, RequestRejected, StorageFull, StorageUnwritable
from flightpart.io import layout
from flightpart.io.maps import MappedFiles
from flightpart.wire import Commit
from flightpart.wire import HeldPartition as StoredPartition

from ..drop_watch import DropWatch

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)
MAX_KNOWN_PATHS = 4096
"""Partition paths a store keeps made (:meth:`PartitionStore.path`; about 700 bytes each); past this many it starts
over. Sixteen times the maps a node keeps by default: the partitions it is serving now."""


class StorePaths:
    """The data directory of one node: identity, paths, and the shared state (used under :attr:`lock`)."""

    def __init__(self, data_dir: str | os.PathLike, *, max_partition_bytes: int | None = None, max_maps: int = 256,
                 group: str | None = None, node_id: str | None = None):
        self.root = Path(data_dir).resolve()
        self.modes = layout.Modes(group)
        self.root.mkdir(parents=True, exist_ok=True)
        self.modes.apply(self.root, directory=True)
        self.max_partition_bytes = max_partition_bytes
        self.maps = MappedFiles(max_maps)
        self.lock = threading.Lock()
        self.group_schemas: dict[tuple[str, int, int], pa.Schema] = {}
        self._paths: dict[tuple[str, int, tuple[int, int]], Path] = {}
        # what this process stored in versions not yet sealed: the commit's `held` needs no statistics file read
        self.fresh: dict[tuple[str, int], dict[tuple[int, int], StoredPartition]] = {}
        # files whose checksum matched, by (inode, mtime, size): a file is read in full once per process, not per get
        self.verified: dict[Path, tuple[int, int, int]] = {}
        # the checksum of each file this process wrote, with the file's identity, until its first check: that check
        # reads the file but not its statistics file (what a read right after a put of 100,000 partitions pays)
        self.written: dict[Path, tuple[tuple[int, int, int], tuple[int, int]]] = {}
        # the bound sums (sum, size) of files stored in versions not yet sealed: what their seal records
        self.sums: dict[tuple[str, int], dict[tuple[int, int], tuple[int, int]]] = {}
        # sealed versions' checksums.json, parsed, by the file's (inode, mtime, size)
        self.seals: dict[Path, tuple[tuple[int, int, int], dict[tuple[int, int], tuple[int, int]]]] = {}
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
        """This directory's node id: the one recorded, else the node credential's name, else a fresh one; a
        directory recorded as another node's than the credential's is refused."""
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
        """Whether an order of a catalog with ``epoch`` may be obeyed: not below the highest seen (on disk before
        the order is carried out); without an epoch, only if no leased catalog was followed."""
        with self.lock:
            if epoch is None or (self.epoch is not None and epoch < self.epoch):
                return self.epoch is None
            if epoch != self.epoch:
                layout.write_node_marker(self.root, self.node_id, self.cluster, self.modes.file, epoch)
                self.epoch = epoch
            return True

    # ------------------------------------------------------------------ paths

    def path(self, dataset: str, version: int, part: tuple[int, int]) -> Path:
        """A partition's file, the same ``Path`` each time (not parsed and hashed again by every cache it keys)."""
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

    def manifest(self, dataset: str, version: int) -> Commit | None:
        try:
            return Commit.decode((self.version_dir(dataset, version) / layout.MANIFEST).read_bytes(), "manifest")
        except (OSError, RequestRejected):
            return None

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

    def make_dirs(self, directory: Path) -> list[Path]:
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

    def remove_empty(self, created: list[Path]) -> None:
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break  # not empty: another put uses it

