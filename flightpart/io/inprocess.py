"""Nodes running in this very process, so their clients skip the network: a node registers an opener under its
URI and ``get`` looks it up first."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa

Opener = Callable[[str, int, tuple[int, int]], pa.Table]
_openers: dict[str, Opener] = {}
_lock = threading.Lock()


def register(uri: str, opener: Opener) -> None:
    with _lock:
        _openers[uri] = opener


def unregister(uri: str) -> None:
    with _lock:
        _openers.pop(uri, None)


def opener(uri: str) -> Opener | None:
    with _lock:
        return _openers.get(uri)
