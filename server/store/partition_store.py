"""A node's partitions as Arrow IPC files in its data directory: :class:`PartitionStore` composes the store's
concerns (paths and identity, tombstones, writes, reads, integrity, cleanup and drops), one module each."""

from __future__ import annotations

from .cleanup import StoreCleanup
from .integrity import StoreIntegrity
from .reads import StoreReads
from .writes import StoreWrites


class PartitionStore(StoreWrites, StoreReads, StoreIntegrity, StoreCleanup):
    """The files of one node; thread-safe."""
