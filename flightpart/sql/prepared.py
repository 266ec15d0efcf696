"""The prepared statements the catalog keeps for Flight SQL clients, bounded per caller and in total.

A statement is its query and its bound values. Past its share
(:func:`~.limits.share`) of the count or bound bytes, a caller's own least
recently used statement is forgotten; past the total, that of the caller keeping
the most; and any unused for ``idle_seconds``. A forgotten handle is refused as
unknown.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time

import pyarrow as pa

from flightpart.errors import LimitExceeded, RequestRejected

from .limits import share


@dataclasses.dataclass
class Statement:
    query: str
    caller: str
    values: pa.Table | None = None
    nbytes: int = 0
    used: float = 0.0


class PreparedStatements:
    """The statements kept, least recently used first (see the module doc)."""

    def __init__(self, most: int, most_bytes: int, idle_seconds: float):
        self.most = most
        self.most_bytes = most_bytes
        self.idle_seconds = idle_seconds
        self._kept: collections.OrderedDict[bytes, Statement] = collections.OrderedDict()
        self._count: dict[str, int] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, caller: str, query: str) -> bytes:
        """A new statement of ``caller``'s: its handle (room made for it first)."""
        with self._lock:
            self._expire()
            while self._count.get(caller, 0) >= share(self.most):
                self._forget_oldest(caller, bound=False)
            while len(self._kept) >= self.most:
                self._forget_oldest(self._most_held(self._count), bound=False)
            handle = os.urandom(16)
            self._kept[handle] = Statement(query, caller, used=time.monotonic())
            self._count[caller] = self._count.get(caller, 0) + 1
            return handle

    def get(self, handle: bytes) -> tuple[str, pa.Table | None] | None:
        """A statement's query and bound values (None when it is unknown, closed or forgotten); it was used now."""
        with self._lock:
            self._expire()
            statement = self._kept.get(handle)
            if statement is None:
                return None
            self._touch(handle, statement)
            return statement.query, statement.values

    def bind(self, handle: bytes, values: pa.Table, nbytes: int, caller: str) -> None:
        """``values`` (``nbytes``) bound to ``caller``'s statement, in place of any before; room made for them first.
        Another caller's handle is unknown to this one."""
        if nbytes > share(self.most_bytes):
            raise LimitExceeded(f"Flight SQL: {nbytes:,} bytes of parameters, more than the {share(self.most_bytes):,} "
                                "one caller's prepared statements may keep", field="parameters")
        with self._lock:
            self._expire()
            statement = self._kept.get(handle)
            if statement is None or statement.caller != caller:
                raise unknown()
            self._set_bytes(statement, 0)
            statement.values = None
            self._touch(handle, statement)
            while self._bytes.get(statement.caller, 0) + nbytes > share(self.most_bytes):
                self._forget_oldest(statement.caller, bound=True)
            while self.held_bytes_locked() + nbytes > self.most_bytes:
                self._forget_oldest(self._most_held(self._bytes), bound=True)
            statement.values = values
            self._set_bytes(statement, nbytes)

    def close(self, handle: bytes, caller: str) -> None:
        """Forget ``caller``'s statement (another caller's handle closes nothing)."""
        with self._lock:
            statement = self._kept.get(handle)
            if statement is not None and statement.caller == caller:
                self._forget(handle)

    def held(self) -> tuple[int, int]:
        """The statements kept and the bytes of their bound values."""
        with self._lock:
            self._expire()
            return len(self._kept), self.held_bytes_locked()

    # ------------------------------------------------------------------ under the lock

    def held_bytes_locked(self) -> int:
        return sum(self._bytes.values())

    def _touch(self, handle: bytes, statement: Statement) -> None:
        statement.used = time.monotonic()
        self._kept.move_to_end(handle)

    def _expire(self) -> None:
        """Forget the statements unused for ``idle_seconds`` (the least recently used are first)."""
        now = time.monotonic()
        while self._kept:
            handle, statement = next(iter(self._kept.items()))
            if now - statement.used <= self.idle_seconds:
                return
            self._forget(handle)

    def _forget_oldest(self, caller: str, *, bound: bool) -> None:
        """Forget ``caller``'s least recently used statement (with bound values only, when ``bound``)."""
        handle = next((h for h, s in self._kept.items() if s.caller == caller and (not bound or s.values is not None)),
                      None)
        if handle is None:
            raise RuntimeError("no statement of the caller to forget")  # the counts say it has one
        self._forget(handle)

    @staticmethod
    def _most_held(counts: dict[str, int]) -> str:
        return max(counts, key=lambda caller: counts[caller])

    def _forget(self, handle: bytes) -> None:
        statement = self._kept.pop(handle, None)
        if statement is None:
            return
        self._set_bytes(statement, 0)
        left = self._count.get(statement.caller, 0) - 1
        if left > 0:
            self._count[statement.caller] = left
        else:
            self._count.pop(statement.caller, None)

    def _set_bytes(self, statement: Statement, nbytes: int) -> None:
        left = self._bytes.get(statement.caller, 0) - statement.nbytes + nbytes
        statement.nbytes = nbytes
        if left > 0:
            self._bytes[statement.caller] = left
        else:
            self._bytes.pop(statement.caller, None)


def unknown() -> RequestRejected:
    """The error for a handle no statement has."""
    return RequestRejected("Flight SQL: unknown prepared statement (closed, unused too long, forgotten to make room "
                           "for newer ones, or from a restarted catalog): prepare it again",
                           field="prepared_statement_handle")
