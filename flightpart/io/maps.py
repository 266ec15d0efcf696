r"""A bounded cache of memory-mapped partition files, shared by nodes and clients.

At most ``capacity`` maps are kept, least recently used dropped first, since the kernel's map table is bounded
(decision 0006). Every lookup ``stat``\ s the file, so a dropped or replaced partition is never served from a
stale map and its disk space returns.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from flightpart.frames import size_of

from .transfer import open_stored

DEFAULT_CAPACITY = 256


class StoredFacts(NamedTuple):
    """What a node needs to know of a table it streams, worked out once per map (:func:`stored_facts`)."""

    nbytes: int
    batches: int
    """Record batches a stream of it sends: a partition's columns share chunk boundaries (one IPC file)."""
    dictionaries: bool
    """Whether a column is dictionary-encoded (such a stream goes out as Arrow writes it, deltas and all)."""


class _Sizes:
    """What is known of a mapped table's size: its file's bytes, its ``nbytes`` and :class:`StoredFacts` once asked."""

    __slots__ = ("table", "file_bytes", "nbytes", "facts")

    def __init__(self, table: pa.Table, file_bytes: int) -> None:
        self.table = weakref.ref(table)  # an entry left behind must never describe a new table given the same id
        self.file_bytes = file_bytes
        self.nbytes: int | None = None
        self.facts: StoredFacts | None = None


_sizes: dict[int, _Sizes] = {}  # id(table) -> its sizes, for tables a MappedFiles holds
_sizes_lock = threading.Lock()


def _sizes_of(table: pa.Table) -> _Sizes | None:
    """The sizes remembered for ``table`` itself (not for a freed table whose id it was given); the lock held."""
    known = _sizes.get(id(table))
    return known if known is not None and known.table() is table else None


def file_size(table: pa.Table) -> int | None:
    """The size of the file ``table`` maps, if a :class:`MappedFiles` holds it (else None), from the map's last
    ``stat``."""
    with _sizes_lock:
        known = _sizes_of(table)
        return None if known is None else known.file_bytes


def _remembered(table: pa.Table, slot: str, work_out: Callable[[pa.Table], Any]) -> Any:
    """``work_out(table)`` once per map, kept under ``slot`` (computed outside the lock; concurrent askers agree)."""
    with _sizes_lock:
        known = _sizes_of(table)
        if known is not None and getattr(known, slot) is not None:
            return getattr(known, slot)
    value = work_out(table)
    with _sizes_lock:
        known = _sizes_of(table)
        if known is not None:
            setattr(known, slot, value)
    return value


def stored_nbytes(table: pa.Table) -> int:
    """``table.nbytes`` (a walk of every batch), once per map."""
    return _remembered(table, "nbytes", size_of)


def stored_facts(table: pa.Table) -> StoredFacts:
    """``table``'s :class:`StoredFacts` for a stream of it alone, once per map."""
    return _remembered(table, "facts", lambda t: StoredFacts(
        stored_nbytes(t), t.column(0).num_chunks if t.num_columns else 0,
        any(pa.types.is_dictionary(field.type) for field in t.schema)))


def mapped_bytes(whole: pa.Table, part: pa.Table) -> int:
    """Bytes a local read mapped: the file's size, in the share of rows and columns ``part`` keeps of ``whole``
    (without walking its batches)."""
    size = file_size(whole)
    if size is None:
        return size_of(part)
    if part is whole:
        return size
    rows = part.num_rows / whole.num_rows if whole.num_rows else 0.0
    columns = part.num_columns / whole.num_columns if whole.num_columns else 0.0
    return round(size * min(rows, 1.0) * min(columns, 1.0))


def _remember(table: pa.Table, size: int | None) -> None:
    with _sizes_lock:
        if size is not None:
            _sizes[id(table)] = _Sizes(table, size)
        elif _sizes_of(table) is not None:
            del _sizes[id(table)]


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class MappedFiles:
    """Memory-mapped tables by path: bounded, thread-safe, checked against the file on every use."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._maps: OrderedDict[Path, tuple[tuple[int, int, int], pa.Table]] = OrderedDict()
        self._lock = threading.Lock()
        self._generation = 0  # bumped by forget(): a map made before it is not cached
        self._last_prune = 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._maps)

    def get(self, path: Path, identity: tuple[int, int, int] | None = None, data: bytes | None = None) -> pa.Table:
        """The table of ``path``, mapped once and reused while the file is the same (FileNotFoundError if gone).
        ``identity`` (inode, mtime, size): the caller's ``stat`` just before; ``data``: a small file's bytes it read."""
        try:
            if identity is None:
                identity = _identity(os.stat(path))
        except FileNotFoundError:
            with self._lock:
                dropped = self._maps.pop(path, None)
            if dropped is not None:
                _remember(dropped[1], None)
            raise
        with self._lock:
            cached = self._maps.get(path)
            if cached is not None and cached[0] == identity:
                self._maps.move_to_end(path)
                return cached[1]
            generation = self._generation
        table = open_stored(path, identity[2], data)
        evicted = []
        old = None
        with self._lock:
            if generation == self._generation:
                replaced = self._maps.get(path)  # another thread's map of the same file may have come in meanwhile
                old = replaced[1] if replaced is not None else None
                self._maps[path] = (identity, table)
                self._maps.move_to_end(path)
                _remember(table, identity[2])
                while len(self._maps) > self.capacity:
                    evicted.append(self._maps.popitem(last=False)[1])
        for _identity_of, gone in evicted:
            _remember(gone, None)
        if old is not None and old is not table:
            _remember(old, None)
        return table

    def forget(self, under: Path) -> int:
        """Let go of every map of a file below ``under`` (a dropped version); returns how many."""
        with self._lock:
            self._generation += 1
            gone = [p for p in self._maps if p == under or under in p.parents]
            for p in gone:
                _remember(self._maps.pop(p)[1], None)
        return len(gone)

    def prune(self, every: float = 1.0) -> int:
        """Let go of maps whose files are gone (at most once per ``every`` seconds); returns how many."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_prune < every:
                return 0
            self._last_prune = now
            paths = list(self._maps)
        gone = [p for p in paths if not p.exists()]
        with self._lock:
            for p in gone:
                dropped = self._maps.pop(p, None)
                if dropped is not None:
                    _remember(dropped[1], None)
        return len(gone)
