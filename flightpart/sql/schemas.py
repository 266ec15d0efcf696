"""The schemas of prepared queries, kept per (query text, versions of the datasets it names).

Preparing a query tells the client its answer's schema, which the gateway
works out by planning the query without rows. A committed version never
changes and a dropped one's number is never used again, so a query's
schema over the same versions is the same: it is kept, and a client that
prepares the same query again (every ADBC execute prepares) is answered
without planning. Queries that list tables depend on every dataset and are
never kept; nor are texts over :data:`MAX_TEXT` characters. At most
:data:`KEPT` schemas are kept, the least recently used forgotten first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

import pyarrow as pa

KEPT = 512
MAX_TEXT = 16 << 10


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


class SchemaCache(Kept[pa.Schema]):
    """Schemas by key, the :data:`KEPT` most recently used."""
