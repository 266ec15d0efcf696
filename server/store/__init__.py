"""A node's partitions as Arrow IPC files in its data directory, cut by concern.

Writes go to a temporary file that is fsynced and renamed into place, so a
crash never leaves a half-written partition visible; every received batch
is fully validated before it is written, so no stored file can crash a
reader; a stored file is never overwritten, and a sealed (committed)
version takes no new file. Reads memory-map the file through a bounded
cache, so serving a partition copies nothing and the node never holds one
map per partition. Metadata (rows, schema) is read without keeping a map. The layout itself is :mod:`flightpart.io.layout`.

``paths`` (the directory, identity and shared state), ``tombstones`` (versions gone for good), ``writes``
(atomic writes, links, seals), ``reads`` (maps and descriptions), ``integrity`` (checksums, quarantine,
scrubs), ``cleanup`` (drops and leftovers), ``partition_store`` (:class:`PartitionStore`, composed of them).
"""

from .partition_store import PartitionStore
from .paths import StoredPartition

__all__ = ["PartitionStore", "StoredPartition"]
