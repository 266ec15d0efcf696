"""The catalog memory SQL answers hold, counted from their first batch to the end of their stream (decision 0032).

An answer counts as DuckDB produces it (a :class:`Meter`), while it waits for
its DoGet, and while it is sent (:class:`~.sending.AnswersSent`), so all answers
together stay within :attr:`Answers.total`, one caller's within
:attr:`Answers.per_caller`. Past the per-answer limit an answer stops
``LIMIT_EXCEEDED``; past the room left once kept answers (oldest first) and idle
streams are dropped, ``BUSY``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import LimitExceeded, ServerBusy
from flightpart.frames import size_of

from .limits import share
from .sending import AnswersSent

RESULTS_KEPT = 64
"""Answers waiting for their DoGet, at most."""


@dataclasses.dataclass(eq=False)
class Meter:
    """One answer being produced by ``caller``: the bytes counted so far."""

    caller: str
    nbytes: int = 0
    settled: bool = False


@dataclasses.dataclass
class _Kept:
    table: pa.Table
    nbytes: int
    caller: str


class Answers:
    """The answers being produced, kept and sent, and the bytes they hold (see the module doc)."""

    def __init__(self, total: int, per_answer: int, sent: AnswersSent, *, kept_most: int = RESULTS_KEPT):
        self.total = total
        self.per_answer = per_answer
        self.per_caller = share(total)
        self.sent = sent
        self.kept_most = kept_most
        self._kept: collections.OrderedDict[bytes, _Kept] = collections.OrderedDict()
        self._producing: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def producing(self, caller: str) -> Iterator[Meter]:
        """A meter for one answer of ``caller``'s; its bytes stop counting as produced when the block ends."""
        meter = Meter(caller)
        try:
            yield meter
        finally:
            with self._lock:
                if not meter.settled:
                    self._release(meter)

    def count(self, meter: Meter, nbytes: int) -> None:
        """``nbytes`` more of ``meter``'s answer, once there is room for them (``LIMIT_EXCEEDED`` past the
        per-answer limit, ``BUSY`` past the room left)."""
        with self._lock:
            self._check_size(meter.nbytes + nbytes)
            self._make_room(meter.caller, nbytes, meter.nbytes)
            meter.nbytes += nbytes
            self._producing[meter.caller] = self._producing.get(meter.caller, 0) + nbytes

    def keep(self, meter: Meter, table: pa.Table) -> bytes:
        """``table``, ``meter``'s answer, kept for its DoGet under a new handle, its bytes moved from produced to kept
        and checked again (a listing is counted only here)."""
        size = size_of(table)
        with self._lock:
            self._release(meter)
            meter.settled = True
            self._check_size(size)
            self._make_room(meter.caller, size, 0)
            handle = os.urandom(16)
            self._kept[handle] = _Kept(table, size, meter.caller)
            while len(self._kept) > self.kept_most:
                self._kept.popitem(last=False)
            return handle

    def take(self, handle: bytes) -> flight.FlightDataStream | None:
        """The stream of the answer kept under ``handle`` (its bytes now counted as being sent), or None."""
        with self._lock:
            kept = self._kept.pop(handle, None)
            return None if kept is None else self.sent.stream(kept.table, kept.caller)

    def held_bytes(self) -> int:
        """Bytes of answers being produced, kept and sent now."""
        with self._lock:
            return self._held()

    # ------------------------------------------------------------------ under the lock

    def _held(self, caller: str | None = None) -> int:
        if caller is None:
            return (sum(self._producing.values()) + sum(k.nbytes for k in self._kept.values())
                    + self.sent.held_bytes())
        return (self._producing.get(caller, 0) + sum(k.nbytes for k in self._kept.values() if k.caller == caller)
                + self.sent.held_bytes(caller))

    def _release(self, meter: Meter) -> None:
        left = self._producing.get(meter.caller, 0) - meter.nbytes
        if left > 0:
            self._producing[meter.caller] = left
        else:
            self._producing.pop(meter.caller, None)
        meter.nbytes = 0

    def _check_size(self, size: int) -> None:
        most = min(self.per_answer, self.per_caller)
        if size > most:
            raise LimitExceeded(f"Flight SQL: the answer passed {most:,} bytes, the most an answer may have that the "
                                "catalog sends itself, and was stopped; aggregate it, or select fewer rows or columns",
                                field="query")

    def _make_room(self, caller: str, nbytes: int, has: int) -> None:
        """Room for ``nbytes`` more of ``caller``'s (whose answer has ``has``), within its share and the total: kept
        answers dropped (anyone's, then the caller's, oldest first), then idle streams let go; ``BUSY`` when not
        enough."""
        for who, budget in ((None, self.total), (caller, self.per_caller)):
            while self._held(who) + nbytes > budget:
                oldest = next((h for h, k in self._kept.items() if who is None or k.caller == who), None)
                if oldest is None:
                    break
                del self._kept[oldest]
            if self._held(who) + nbytes > budget:
                others = self._held(who) - self.sent.held_bytes(who)  # produced and kept: not the streams'
                self.sent.make_room(nbytes, budget - others, who)
            held = self._held(who)
            if held + nbytes > budget:
                whose = "this caller's answers hold" if who is not None else "answers being sent hold"
                raise ServerBusy(f"busy: {whose} {held:,} of the {budget:,} bytes the catalog keeps for "
                                 f"{'one caller' if who is not None else 'answers'}, and this one has "
                                 f"{has + nbytes:,}; retry shortly", field="query")
