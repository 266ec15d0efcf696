"""A bounded memory of values by key, the most recently used kept: what the services keep of one request for the
next (parsed queries, plans, schemas, opened datasets), bounded in total whoever asks."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

KEPT = 512
"""Values kept when a :class:`Kept` is not told how many."""

V = TypeVar("V")


class Kept(Generic[V]):
    """Values by key, the ``kept`` most recently used; safe to share between threads."""

    def __init__(self, kept: int = KEPT):
        self.kept = kept
        self._values: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.kept:
                self._values.popitem(last=False)

    def __len__(self) -> int:
        return len(self._values)
