"""Answers on their way to Flight SQL clients: the catalog memory they hold, and what becomes of one whose reader
stops taking it.

A DoGet stream holds what is left of its answer on the catalog until the
client has taken it all, so those bytes count against the catalog's budget
for answers until the stream ends. A client that opens streams and takes
nothing would hold that budget for as long as its connection lives, and every
other client would get ``BUSY``. pyarrow's server cannot end a stream from
outside, but what is left of an answer need not wait with it: a stream whose
reader took nothing for :data:`IDLE_SECONDS` lets its answer go (its memory
freed but for the batch in flight, its bytes no longer counted), and ends
with ``UNAVAILABLE`` when its reader comes back. Each batch sent is a copy of
its rows, so the batch in flight does not keep the whole answer alive (a
slice would hold every buffer of the part of the answer it comes from).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import NodeUnavailable
from flightpart.wire import encode_error

IDLE_SECONDS = 60.0
"""How long a reader may take nothing of an answer before the catalog lets the answer go: as long as a node waits
for a reader of its partitions (its stream idle timeout)."""


class Sending:
    """One answer being sent: what is left of it, its bytes as counted, and when its reader last took a batch."""

    __slots__ = ("table", "nbytes", "rows", "offset", "last_taken", "idled")

    def __init__(self, table: pa.Table, batch_bytes: int):
        self.table: pa.Table | None = table
        self.nbytes = table.nbytes
        self.rows = max(1, batch_bytes * table.num_rows // max(1, table.nbytes))  # rows of about batch_bytes
        self.offset = 0
        self.last_taken = time.monotonic()
        self.idled = False


class AnswersSent:
    """The answers DoGet streams are sending, and the bytes they hold (see the module doc)."""

    def __init__(self, batch_bytes: int, idle_seconds: float = IDLE_SECONDS):
        self.batch_bytes = batch_bytes
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._streams: set[Sending] = set()
        self._held = 0

    def held_bytes(self) -> int:
        """Bytes of answers being sent now, once the answers of readers idle for :attr:`idle_seconds` are let go."""
        now = time.monotonic()
        with self._lock:
            for sending in [s for s in self._streams if now - s.last_taken > self.idle_seconds]:
                self._let_go(sending)
                sending.idled = True
            return self._held

    def stream(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        """``table``'s batches for a DoGet stream, its bytes counted from now until the stream ends (read to its end,
        cancelled, its client gone: Flight then drops the generator, which closes it) or its reader idles."""
        sending = Sending(table, self.batch_bytes)
        with self._lock:
            self._streams.add(sending)
            self._held += sending.nbytes
        return self._sent(sending)

    def _sent(self, sending: Sending) -> Iterator[pa.RecordBatch]:
        try:
            while True:
                with self._lock:
                    batches = self._next_batches(sending)
                if not batches:
                    return
                yield from batches
                batches = []  # the reader took them: nothing of them held here while the next are waited for
        finally:
            with self._lock:
                self._let_go(sending)

    def _next_batches(self, sending: Sending) -> list[pa.RecordBatch]:
        """The next rows of ``sending`` (none past its end), copies of them; called with the lock held."""
        if sending.idled:
            cancelled = NodeUnavailable(f"Flight SQL: the answer's stream was ended, its reader took nothing for "
                                        f"{self.idle_seconds:g} s; run the query again", field="stream")
            raise flight.FlightUnavailableError(cancelled.message, extra_info=encode_error(cancelled))
        table = sending.table
        if table is None or sending.offset >= table.num_rows:
            return []
        sending.last_taken = time.monotonic()
        piece = table.slice(sending.offset, sending.rows)
        sending.offset += sending.rows
        return [_copied(batch) for batch in piece.to_batches()]

    def _let_go(self, sending: Sending) -> None:
        """Stop counting ``sending`` and drop what is left of it (once); called with the lock held."""
        if sending in self._streams:
            self._streams.discard(sending)
            self._held -= sending.nbytes
            sending.table = None


def _copied(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` in buffers of its own (a slice shares its parent's whole buffers)."""
    try:
        return pa.RecordBatch.from_arrays([pa.concat_arrays([column]) for column in batch.columns], schema=batch.schema)
    except pa.ArrowNotImplementedError:  # a type Arrow cannot concatenate: the slice, holding its parent
        return batch
