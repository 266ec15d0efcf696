"""Which versions a node was dropping while something read its files (a scrub), so their vanishing is no finding.

Every drop is numbered when it starts and again when it ends; a reader takes a :meth:`DropWatch.mark` before it
looks, and :meth:`DropWatch.since` then names every drop under way or ended after the mark: exactly those that
could have removed a file under it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import takewhile
from typing import NamedTuple

KEPT_ENDED = 65_536
"""Ended drops remembered (about 100 bytes each); a scrub outlasting more drops than this also has the tombstones."""


class Dropped(NamedTuple):
    """A drop: a dataset's version (None: every version), and whether only its unsealed versions went (an abort)."""

    dataset: str
    version: int | None
    pending_only: bool

    def covers(self, dataset: str, version: int, sealed: bool) -> bool:
        """Whether this drop may have removed files of ``version`` of ``dataset`` (``sealed``: it has a manifest)."""
        if dataset != self.dataset or self.version not in (None, version):
            return False
        return not (self.pending_only and sealed)


class DropWatch:
    """The drops of one store, numbered; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._under_way: dict[int, Dropped] = {}
        self._ended: deque[tuple[int, Dropped]] = deque(maxlen=KEPT_ENDED)

    @contextmanager
    def dropping(self, drop: Dropped) -> Iterator[None]:
        """Number a drop for as long as it runs."""
        with self._lock:
            self._count += 1
            key = self._count
            self._under_way[key] = drop
        try:
            yield
        finally:
            with self._lock:
                self._count += 1
                del self._under_way[key]
                self._ended.append((self._count, drop))

    def mark(self) -> int:
        """Where the drops stand now, for :meth:`since`."""
        with self._lock:
            return self._count

    def under_way(self) -> list[Dropped]:
        """The drops running now."""
        with self._lock:
            return list(self._under_way.values())

    def since(self, mark: int) -> list[Dropped]:
        """Every drop under way now or ended after ``mark`` (those under way at the mark among them)."""
        with self._lock:
            return [*self._under_way.values(), *(d for _n, d in takewhile(lambda e: e[0] > mark,
                                                                          reversed(self._ended)))]
