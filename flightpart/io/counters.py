"""Named counters, added to from many threads and read as one consistent snapshot."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Counters:
    """Integer counters with fixed names; thread-safe. Adding to an unknown name is a KeyError."""

    def __init__(self, names: Iterable[str]):
        self._lock = threading.Lock()
        self._values = dict.fromkeys(names, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._values[key] += delta

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
