"""The catalog's built ``FlightInfo``\\ s: bounded by the partitions they describe, one build per key at a time.

A version is immutable, so its FlightInfo is built once per state of the nodes; an open that arrives during a
build waits for it (decision 0019). What is kept is bounded by the partitions described, not a count of versions.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import pyarrow.flight as flight

MAX_CACHED_PARTITIONS = 1_000_000
"""Partitions described by the FlightInfos kept at once (about 330 MB); the least recently used go first."""


class FlightInfoCache:
    """FlightInfos by key, each valid for one state of the nodes (``nodes``: any comparable value)."""

    def __init__(self, max_partitions: int = MAX_CACHED_PARTITIONS):
        self.max_partitions = max_partitions
        self._infos: OrderedDict[Hashable, tuple[Any, flight.FlightInfo, int]] = OrderedDict()
        self._partitions = 0
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._infos)

    def get(self, key: Hashable, nodes: Any, build: Callable[[], tuple[flight.FlightInfo, int]]) -> flight.FlightInfo:
        """The FlightInfo of ``key`` for ``nodes``; else ``build()`` -> (info, partitions), once however many ask."""
        found = self._cached(key, nodes)
        if found is not None:
            return found
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        try:
            with building:
                found = self._cached(key, nodes)
                if found is not None:
                    return found
                info, partitions = build()
                self._keep(key, nodes, info, partitions)
                return info
        finally:
            with self._lock:
                if self._building.get(key) is building:
                    del self._building[key]

    def clear(self) -> None:
        """Forget every FlightInfo (replicas, nodes or versions changed)."""
        with self._lock:
            self._infos.clear()
            self._partitions = 0

    def _cached(self, key: Hashable, nodes: Any) -> flight.FlightInfo | None:
        with self._lock:
            entry = self._infos.get(key)
            if entry is None or entry[0] != nodes:
                return None
            self._infos.move_to_end(key)
            return entry[1]

    def _keep(self, key: Hashable, nodes: Any, info: flight.FlightInfo, partitions: int) -> None:
        with self._lock:
            old = self._infos.pop(key, None)
            if old is not None:
                self._partitions -= old[2]
            self._infos[key] = (nodes, info, partitions)
            self._partitions += partitions
            while self._partitions > self.max_partitions and len(self._infos) > 1:
                self._partitions -= self._infos.popitem(last=False)[1][2]
