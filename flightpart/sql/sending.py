"""Answers on their way to Flight SQL clients: the memory they hold, and what becomes of one whose reader stops reading.

A stream's answer counts against the answer budget until the stream ends. When a
new answer needs room, streams whose readers took nothing for
:data:`IDLE_SECONDS` let their answers go, the longest idle first, and end
``UNAVAILABLE`` when their readers come back (decision 0032). A batch cut from a
much larger chunk is copied, so the batch in flight does not keep the chunk
alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import NodeUnavailable
from flightpart.frames import size_of
from flightpart.server.base import UntracedUnknown
from flightpart.wire import encode_error, error_with_code

IDLE_SECONDS = 60.0
"""How long a reader may take nothing before its answer may be let go: a node's stream idle timeout."""


class Sending:
    """One answer being sent: what is left of it, its bytes as counted, and when its reader last took a batch."""

    __slots__ = ("table", "nbytes", "rows", "offset", "last_taken", "idled", "copied", "caller")

    def __init__(self, table: pa.Table, batch_bytes: int, caller: str = ""):
        self.table: pa.Table | None = table
        self.caller = caller
        self.nbytes = size_of(table)
        self.rows = max(1, batch_bytes * table.num_rows // max(1, self.nbytes))  # rows of about batch_bytes
        # a batch sent is a slice of one of the answer's chunks, which it keeps alive while in flight: copied only
        # where a chunk is much larger than a batch (DuckDB's can be the whole answer), not where slicing costs little
        self.copied = any(size_of(chunk) > 4 * batch_bytes for chunk in table.to_batches())
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
        self._held_by: dict[str, int] = {}

    def held_bytes(self, caller: str | None = None) -> int:
        """Bytes of answers being sent now (``caller``'s only, when given)."""
        with self._lock:
            return self._held if caller is None else self._held_by.get(caller, 0)

    def quiet_seconds(self) -> float:
        """Seconds since any answer stream last had a batch taken, for operators and tests."""
        with self._lock:
            latest = max((s.last_taken for s in self._streams), default=0.0)
        return time.monotonic() - latest

    def make_room(self, nbytes: int, budget: int, caller: str | None = None) -> int:
        """The bytes of answers being sent once room is made for ``nbytes`` more within ``budget``, by letting idle
        streams go, the longest idle first (``caller``: that caller's only)."""
        now = time.monotonic()
        with self._lock:
            idle = sorted((s for s in self._streams if now - s.last_taken > self.idle_seconds
                           and (caller is None or s.caller == caller)), key=lambda s: s.last_taken)
            for sending in idle:
                if self._held_now(caller) + nbytes <= budget:
                    break
                self._let_go(sending)
                sending.idled = True
            return self._held_now(caller)

    def _held_now(self, caller: str | None) -> int:
        return self._held if caller is None else self._held_by.get(caller, 0)

    def stream(self, table: pa.Table, caller: str = "") -> flight.FlightDataStream:
        """A DoGet stream of ``table``, its bytes counted until the stream ends (Flight closes its generator however it
        ends) or is let go (:meth:`make_room`)."""
        fields = table.schema
        if any(_nested_dictionary(field.type) for field in fields):
            # a dictionary inside a list or struct, which Arrow cannot unify: Arrow's writer of a reader sends each
            # batch's own dictionaries, but a Flight error raised in it as UNKNOWN (a let-go answer)
            sending = self._counted(table, caller)
            return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(fields,
                                                                              self._sent(sending, untraced=True)))
        if any(pa.types.is_dictionary(field.type) for field in fields):
            # a generator stream sends no dictionaries (an ENUM answer): its first batch goes as a stream of its
            # own, which sends them; every later batch shares them (unified) and goes as a batch
            sending = self._counted(table.unify_dictionaries(), caller)
            return flight.GeneratorStream(fields, _dictionaries_first(self._sent(sending)))
        return flight.GeneratorStream(fields, self._sent(self._counted(table, caller)))

    def _counted(self, table: pa.Table, caller: str) -> Sending:
        """``table`` as an answer being sent to ``caller``, its bytes counted from now."""
        sending = Sending(table, self.batch_bytes, caller)
        with self._lock:
            self._streams.add(sending)
            self._held += sending.nbytes
            self._held_by[caller] = self._held_by.get(caller, 0) + sending.nbytes
        return sending

    def _sent(self, sending: Sending, *, untraced: bool = False) -> Generator[pa.RecordBatch]:
        try:
            while True:
                with self._lock:
                    piece = self._next_piece(sending, untraced)
                if piece is None:
                    return
                for batch in piece.to_batches():
                    yield _copied(batch) if sending.copied else batch
                piece = batch = None  # the reader took them: nothing of them held here while the next are waited for
        finally:
            with self._lock:
                self._let_go(sending)

    def _next_piece(self, sending: Sending, untraced: bool) -> pa.Table | None:
        """The next rows of ``sending`` (None past its end); called with the lock held."""
        if sending.idled:
            cancelled = NodeUnavailable(f"Flight SQL: the answer's stream was ended, its reader took nothing for "
                                        f"{self.idle_seconds:g} s while the catalog needed the room for another; run "
                                        "the query again", field="stream")
            if untraced:
                raise UntracedUnknown(error_with_code(cancelled))
            raise flight.FlightUnavailableError(cancelled.message, extra_info=encode_error(cancelled))
        table = sending.table
        if table is None or sending.offset >= table.num_rows:
            return None
        sending.last_taken = time.monotonic()
        piece = table.slice(sending.offset, sending.rows)
        sending.offset += sending.rows
        return piece

    def _let_go(self, sending: Sending) -> None:
        """Stop counting ``sending`` and drop what is left of it (once); called with the lock held."""
        if sending in self._streams:
            self._streams.discard(sending)
            self._held -= sending.nbytes
            left = self._held_by.get(sending.caller, 0) - sending.nbytes
            if left > 0:
                self._held_by[sending.caller] = left
            else:
                self._held_by.pop(sending.caller, None)
            sending.table = None


def _nested_dictionary(kind: pa.DataType) -> bool:
    """Whether ``kind`` holds a dictionary type below its top level (in a list, a struct, a map)."""
    children = [kind.field(k).type for k in range(kind.num_fields)]
    return any(pa.types.is_dictionary(child) or _nested_dictionary(child) for child in children)


def _dictionaries_first(batches: Generator[pa.RecordBatch]) -> Iterator[pa.RecordBatch | pa.RecordBatchReader]:
    """``batches``, the first as a reader of its own (a generator stream sends only a reader's dictionaries), the rest
    sharing its dictionaries; ``batches`` is closed however the stream ends."""
    try:
        first = next(batches, None)
        if first is not None:
            yield pa.RecordBatchReader.from_batches(first.schema, [first])
            first = None
        yield from batches
    finally:
        batches.close()


def _copied(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` in buffers of its own (a slice shares its parent's whole buffers)."""
    try:
        return pa.RecordBatch.from_arrays([pa.concat_arrays([column]) for column in batch.columns], schema=batch.schema)
    except pa.ArrowNotImplementedError:  # a type Arrow cannot concatenate: the slice, holding its parent
        return batch
