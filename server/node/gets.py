"""A node's get streams: stored partitions sent to readers, as zero-copy slices of memory-mapped files.

A version is served only once sealed here (:data:`READS_UNPUBLISHED` may read it before); a large partition goes
in row ranges paced by the reader (decision 0003); ``ticket.more`` sends many whole partitions in one stream.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError, PartitionMissing, RequestRejected, ServerBusy
from flightpart.io import layout
from flightpart.io.compression import PLAIN, write_options
from flightpart.io.maps import stored_facts, stored_nbytes
from flightpart.io.transfer import BUFFERED_BYTES, PiecePace, batches_of, row_pieces, split_batch
from flightpart.query.apply import apply_ticket
from flightpart.wire import MAX_PARTS_PER_RUN, PartRun, Ticket

from .. import substrait_check
from ..auth import admit_stream, authorize
from ..base import boundary, flight_error
from ..telemetry import describe
from .shared import NodeBase, log

READS_UNPUBLISHED = frozenset({"admin", "node", "owner"})
"""Who may read a version this node holds but was not told is committed (a put in progress, a staged append, an
aborted write): an admin, the owner, nodes (a repair's comparison, a repartition's pulls). A reader's or writer's
token had read such rows straight from a node; now they get ``BUSY`` (retried: a seal that is late arrives)."""

STREAM_PIECE_BYTES = 4 << 20
"""A ``do_get`` hands its stream a partition in zero-copy row ranges of at least about this size (several of a
stored file's 1 MiB batches each): the reader's pace is seen range by range, and Python steps in once per range,
not per batch."""
STREAM_WHOLE_BYTES = BUFFERED_BYTES
"""A ``do_get`` of at most this many bytes is handed to Arrow whole, not in row ranges: flow-control windows and
socket buffers take most of it at once whatever the reader's pace, so ranges would show the idle watch little, and
their steps of Python were most of a small read's cost on the node (0.15 ms of 0.75 ms of CPU for 1 MiB). Such a
stream keeps its slot until it ends, or until the idle watch frees it once it ran the idle timeout longer than a
reader at :data:`~flightpart.server.auth.WHOLE_STREAM_RATE` needs (the stream goes on, still counted in its
caller's share)."""
STREAM_PIECE_MOST_BYTES = 64 << 20
"""The largest row range a fast reader is handed at once (:class:`~flightpart.io.transfer.PiecePace`)."""
STREAM_PIECE_SECONDS = 0.1
"""About how long a reader should take one row range, once its pace is known (never more than a tenth of the
stream idle timeout, so a reader taking ranges at a steady pace is never seen idle)."""


def asks_work(spec: Ticket) -> bool:
    """Whether a ticket asks a partition for more than its rows as stored: a filter, an aggregate or first rows."""
    return spec.filter is not None or spec.aggregate is not None or spec.top is not None


class GetStreams(NodeBase):
    """``do_get``: one partition (projected, sliced, filtered or aggregated by its ticket), or many whole ones."""

    def init_gets(self) -> None:
        """Set up the filter checker and the memory of versions found sealed (:meth:`_published`)."""
        self.filters = substrait_check.shared()  # a ticket's filter is read by a child process first: some abort Arrow
        self._seen_sealed: set[tuple[str, int]] = set()  # versions a read found sealed here (see _published)

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        with boundary(log, "do_get", self.telemetry, context,
                      counted=functools.partial(self.count_error, "get")) as call:
            spec = Ticket.decode(ticket.ticket)
            credential = authorize(context, "read", (spec.dataset, spec.version))
            if credential.role not in READS_UNPUBLISHED and not self._published(spec.dataset, spec.version):
                raise ServerBusy(f"{spec.dataset} v{spec.version} is not published on this node: not committed, or "
                                 "its seal has not reached this node yet; retry shortly")
            guard = admit_stream(context, call.peer)
            if spec.more is not None:
                return self._several(spec, guard)
            if spec.filter is not None:
                self.filters.check(spec.filter)
            table = apply_ticket(self.store.open(spec.dataset, spec.version, spec.part), spec.columns, spec.rows,
                                 spec.filter, spec.matched, spec.aggregate, bool(spec.row_numbers), spec.top)
            compressed = write_options(table, spec.compression)
            options = compressed or PLAIN
            nbytes, batches, dictionaries = stored_facts(table)  # once per map for a whole partition
            describe("get", dataset=spec.dataset, version=spec.version, part=spec.part, bytes=nbytes,
                     rows=table.num_rows, compressed=compressed is not None)
        self.counters.add(bytes_sent=nbytes, rows_sent=table.num_rows, batches_sent=batches, partitions_served=1,
                          streams_compressed=int(compressed is not None), get_streams=1)
        if not table.num_rows:  # a stream of the table sends no batch, and so no dictionary (at any depth): one of none
            self.guard.sent_whole(guard, nbytes)
            return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(table.schema, batches_of(table)),
                                            options=options)
        if nbytes <= STREAM_WHOLE_BYTES or dictionaries:
            # a small partition (STREAM_WHOLE_BYTES), or dictionaries that grow from batch to batch, which go out as
            # deltas only Arrow's own stream of the table writes: sent whole, the reader given time by its size
            self.guard.sent_whole(guard, nbytes)
            return flight.RecordBatchStream(table, options=options)
        # row ranges handed out one at a time, so the guard sees a reader that stops taking them (its slot is freed);
        # each range's batches are written by Arrow without a step of Python per batch
        pace = PiecePace(STREAM_PIECE_BYTES, STREAM_PIECE_MOST_BYTES, self._piece_seconds())
        pieces = (flight.RecordBatchStream(piece, options=options)
                  for piece in pace.paced(row_pieces(table, nbytes, pace, STREAM_PIECE_BYTES), nbytes, table.num_rows))
        return flight.GeneratorStream(table.schema, self.guard.watch(guard, pieces), options=options)

    def _published(self, dataset: str, version: int) -> bool:
        """Whether ``version`` is sealed here; remembered once true (a seal is never taken back, a number never
        reused)."""
        if (dataset, version) in self._seen_sealed:
            return True
        if not self.store.sealed(dataset, version):
            return False
        self._seen_sealed.add((dataset, version))
        return True

    def forget_seals(self, dataset: str, version: int | None) -> None:
        """Forget the seals remembered (:meth:`_published`) for a dropped version, or every version of ``dataset``."""
        self._seen_sealed.difference_update([key for key in list(self._seen_sealed)
                                             if key[0] == dataset and (version is None or key[1] == version)])

    def _piece_seconds(self) -> float:
        """How long a reader should take one row range: :data:`STREAM_PIECE_SECONDS`, or a tenth of the stream idle
        timeout when that is shorter."""
        idle = self.guard.stream_idle_timeout
        return STREAM_PIECE_SECONDS if idle is None else min(STREAM_PIECE_SECONDS, idle / 10)

    def _several(self, spec: Ticket, guard: Any) -> flight.GeneratorStream:
        """Partitions of one column group in one stream, each as the ticket asks, in runs: each run's rows one batch,
        opened by a :class:`PartRun` naming its partitions and their rows (a partition larger than a batch goes
        alone).

        Each partition is opened as its turn comes (one map at a time); a missing one is refused before the
        stream starts, so the reader can ask another replica.
        """
        positions = (spec.part, *(spec.more or ()))
        folder = str(self.store.version_dir(spec.dataset, spec.version))
        paths = [Path(f"{folder}/{i}_{j}{layout.SUFFIX}") for i, j in positions]  # one walk of pathlib, not one each
        missing = [p for p, path in zip(positions[1:], paths[1:]) if not os.path.exists(path)]
        if missing:
            raise PartitionMissing(f"partition {missing[0]} of dataset {spec.dataset!r} version {spec.version} is not "
                                   "on this node", field="ticket.more")
        if spec.filter is not None:
            self.filters.check(spec.filter)

        def asked(table: pa.Table) -> pa.Table:
            return apply_ticket(table, spec.columns, None, spec.filter, aggregate=spec.aggregate, top=spec.top)

        first = asked(self.store.open(spec.dataset, spec.version, spec.part))
        schema = first.schema
        if any(pa.types.is_dictionary(field.type) for field in schema):
            raise RequestRejected("ticket.more: dictionary columns are read one partition per stream",
                                  field="ticket.more")
        options = write_options(first, spec.compression)
        self.counters.add(streams_compressed=int(options is not None), get_streams=1)
        describe("get", dataset=spec.dataset, version=spec.version, parts=len(positions),
                 compressed=options is not None)
        empty = pa.RecordBatch.from_pylist([], schema=schema)  # what opens a partition of no rows

        def opened(k: int, position: tuple[int, int]) -> pa.Table:
            """The next partition, or (past the start of the stream) a Flight error with its code."""
            if k == 0:
                return first
            try:
                table = asked(self.store.open_at(spec.dataset, spec.version, position, paths[k]))
                if not table.schema.equals(schema):
                    raise RequestRejected("ticket.more: partitions of different column groups cannot share a stream",
                                          field="ticket.more")
            except FlightpartError as exc:
                self.counters.add(errors=1)
                raise flight_error(exc) from None
            return table

        def sent(run: list[tuple[tuple[int, int], pa.Table, int]]) -> Iterator[Any]:
            """One run of partitions: their rows as one batch (a lone or large one as its own batches), the first
            batch carrying the :class:`PartRun` that says where each partition starts."""
            header = pa.py_buffer(PartRun(tuple(p for p, _t, _n in run),
                                          tuple(t.num_rows for _p, t, _n in run)).encode())
            whole = run[0][1] if len(run) == 1 else pa.concat_tables([t for _p, t, _n in run]).combine_chunks()
            batches = [piece for batch in whole.to_batches() for piece in split_batch(batch, STREAM_PIECE_BYTES)]
            self.counters.add(bytes_sent=sum(n for _p, _t, n in run), rows_sent=whole.num_rows,
                              partitions_served=len(run), batches_sent=max(1, len(batches)))
            yield (batches[0] if batches else empty), header
            yield from batches[1:]

        # a partition's answer (filtered, aggregated, first rows) goes as soon as it is worked out: the reader waits
        # for the next batch no longer than for one partition's work
        most_per_run = 1 if asks_work(spec) else MAX_PARTS_PER_RUN

        def pieces() -> Iterator[Any]:
            run: list[tuple[tuple[int, int], pa.Table, int]] = []
            size = 0
            for k, position in enumerate(positions):
                if run and len(run) >= most_per_run:
                    yield from sent(run)
                    run, size = [], 0
                table = opened(k, position)
                nbytes = stored_nbytes(table)
                if run and size + nbytes > STREAM_PIECE_BYTES:
                    yield from sent(run)
                    run, size = [], 0
                run.append((position, table, nbytes))
                size += nbytes
            if run:
                yield from sent(run)

        return flight.GeneratorStream(schema, self.guard.watch(guard, pieces()), options=options)
