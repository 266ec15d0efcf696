""":class:`PartitionStore`: the store's concerns composed, one module each (see the package docstring)."""

from __future__ import annotations

from .cleanup import StoreCleanup
from .integrity import StoreIntegrity
from .reads import StoreReads
from .writes import StoreWrites


class PartitionStore(StoreWrites, StoreReads, StoreIntegrity, StoreCleanup):
    """The files of one node; thread-safe."""
