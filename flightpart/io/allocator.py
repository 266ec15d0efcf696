"""Keeping freed memory for the next read, for processes that read large partitions again and again.

glibc maps gRPC's large buffers afresh and trims freed memory, so every read faults its whole size in again;
keeping freed memory (up to :data:`TRIM_BYTES`) cuts a warm reader's CPU severalfold (decision 0002). Kept
memory is not given back, so ``FLIGHTPART_MALLOC_TUNING`` chooses where:

- ``auto`` (default): nodes at start and readers at their first read of rows, but not a catalog, a process with
  capped memory or glibc's own settings, nor one whose first read is a windowed stream;
- ``on``: always; ``off`` (or any other value): never.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import resource
import threading
from pathlib import Path

log = logging.getLogger("flightpart.allocator")

TUNING_ENV = "FLIGHTPART_MALLOC_TUNING"
MODES = ("auto", "on", "off")
MMAP_BYTES = 32 << 20
"""Blocks below this come from the heap, not from a fresh ``mmap`` (glibc's own dynamic limit stops here too)."""
TRIM_BYTES = 1 << 30
"""Freed memory kept for reuse at the top of a heap before any is given back to the kernel."""
GLIBC_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")
"""glibc's own settings: a process started with any of them has had its allocator chosen for it."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_ALIASES = {"1": "on", "yes": "on", "true": "on", "0": "off", "no": "off", "false": "off"}
_lock = threading.Lock()
_state: dict[str, object] = {}


def keep_freed_memory(*, declined: str | None = None) -> bool:
    """Tune glibc's allocator for repeated large reads, deciding once per process; returns whether it is tuned.
    ``declined``: why the caller would rather give memory back; under ``auto`` it decides against tuning."""
    with _lock:
        if "tuned" not in _state:
            reason = _reason_not_to(declined)
            _state["tuned"] = reason is None and _tune()
            _state["why"] = reason or ("tuned" if _state["tuned"] else "this C library cannot be tuned")
        return bool(_state["tuned"])


def tuning_state() -> str:
    """Why this process's allocator is or is not tuned (``"undecided"`` before its first read)."""
    with _lock:
        return str(_state.get("why", "undecided"))


def mode() -> str:
    """The ``FLIGHTPART_MALLOC_TUNING`` setting: ``auto``, ``on`` or ``off`` (unset: ``auto``; ``1``/``yes``/``true``:
    ``on``; anything else: ``off``)."""
    value = os.environ.get(TUNING_ENV, "auto").strip().lower() or "auto"
    value = _ALIASES.get(value, value)
    if value not in MODES:
        log.warning("%s=%r is not one of auto, on, off: read as off", TUNING_ENV, value)
        return "off"
    return value


def _reason_not_to(declined: str | None) -> str | None:
    setting = mode()
    if setting == "on":
        return None
    if setting == "off":
        return f"{TUNING_ENV}={os.environ.get(TUNING_ENV, '').strip()}"
    if declined:
        return declined
    started_with = startup_environment()
    configured = [name for name in GLIBC_VARIABLES if name in started_with]
    if configured or "malloc" in started_with.get("GLIBC_TUNABLES", ""):
        return f"the allocator is configured by {(configured or ['GLIBC_TUNABLES'])[0]}"
    return memory_cap()


def startup_environment() -> dict[str, str]:
    """The environment this process started with, which glibc read its settings from (``os.environ`` may have
    changed)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def memory_cap() -> str | None:
    """What caps this process's memory, if anything: a resource limit, or a limit on its cgroup or one above."""
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        soft, _hard = resource.getrlimit(getattr(resource, name))
        if soft != resource.RLIM_INFINITY:
            return f"{name} is set"
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2 (mounted beside v1 as "unified" on hybrid systems)
            unified = Path("/sys/fs/cgroup/unified")
            base, name = (unified if unified.is_dir() else Path("/sys/fs/cgroup")), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        where = base / path.lstrip("/")
        for folder in (where, *where.parents):  # its own, then each above it, down to the mount's root
            if not folder.is_relative_to(base):
                break
            try:
                value = (folder / name).read_text().strip()
            except OSError:
                continue
            if value != "max" and value.isdigit() and int(value) < (1 << 60):  # v1 writes "no limit" as a huge number
                return f"a cgroup caps its memory ({folder / name})"
    return None


def _tune() -> bool:
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
