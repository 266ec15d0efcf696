"""Keeping freed memory for the next read, for processes that read large partitions again and again.

Measured on a reader of 256 MiB partitions over loopback: 0.05 s of user
time, and 0.15 to 1.0 s of system time for 35,000 to 105,000 page faults per
read. gRPC receives each message into buffers from the C library's
allocator; glibc serves large ones with fresh ``mmap`` calls and gives freed
memory at the top of its heaps back to the kernel (``trim``), so every read
faults its whole size in again. With large blocks kept on the heap and up
to :data:`TRIM_BYTES` of freed memory kept for reuse, a warm reader takes
almost no faults and its CPU per GB falls severalfold.

It is off unless ``FLIGHTPART_MALLOC_TUNING=on``: kept memory is memory a
process does not give back, and a streaming reader whose memory must stay
flat (``to_batches()`` under a cap) grew past its bound with it (205 MB
against 183) and one capped at 400 MB was killed. Readers that hold whole
tables in turn, and nodes, are where it pays.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

TUNING_ENV = "FLIGHTPART_MALLOC_TUNING"
MMAP_BYTES = 32 << 20
"""Blocks below this come from the heap, not from a fresh ``mmap`` (glibc's own dynamic limit stops here too)."""
TRIM_BYTES = 1 << 30
"""Freed memory kept for reuse at the top of a heap before any is given back to the kernel."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_state: dict[str, bool] = {}


def keep_freed_memory() -> bool:
    """Tune glibc's allocator once per process for repeated large reads; returns whether it is tuned."""
    with _lock:
        if "tuned" not in _state:
            _state["tuned"] = _tune()
        return _state["tuned"]


def _tune() -> bool:
    if os.environ.get(TUNING_ENV, "").lower() not in ("on", "1", "yes", "true"):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (and mallopt's meaning)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))
