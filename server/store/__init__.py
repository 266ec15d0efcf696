"""A node's partitions as Arrow IPC files in its data directory, cut by concern.

A stored file is validated before it is written, never overwritten, and verified before first use; the layout is
:mod:`flightpart.io.layout`. Modules: ``paths``, ``tombstones``, ``writes``, ``reads``, ``integrity``,
``cleanup``, and ``partition_store`` (:class:`PartitionStore`, composed of them).
"""

from .partition_store import PartitionStore
from .paths import StoredPartition

__all__ = ["PartitionStore", "StoredPartition"]
