"""Starting a file's write-out to disk while it is still being written (Linux's ``sync_file_range``)."""

from __future__ import annotations

import ctypes
import sys
from typing import Any

WRITEBACK_STEP = 8 << 20
"""Bytes written to a partition file between two starts of the kernel's write-out (:class:`Writeback`)."""
_SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Any:
    """Linux's ``sync_file_range`` (None elsewhere, or where the C library does not have it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_SYNC_FILE_RANGE = _sync_file_range() if sys.platform.startswith("linux") else None
WRITEBACK_AVAILABLE = _SYNC_FILE_RANGE is not None
"""Whether this system lets a write-out be started early (:class:`Writeback`)."""


class Writeback:
    """Starts the disk's write-out of a file's bytes while the rest of it still arrives (``sync_file_range`` every
    :data:`WRITEBACK_STEP`), so the fsync before a put's receipt finds little left (decision 0010). Where the call
    does not exist this does nothing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.started = 0
        self.refused = False

    def written(self, size: int) -> None:
        """The file now holds ``size`` bytes; starts the write-out of the last full step."""
        if _SYNC_FILE_RANGE is None or self.refused or size - self.started < WRITEBACK_STEP:
            return
        if _SYNC_FILE_RANGE(self.fd, self.started, size - self.started, _SYNC_FILE_RANGE_WRITE) == 0:
            self.started = size
        else:  # a file system (or descriptor) that refuses it: the fsync does it all, as without
            self.refused = True
