"""Moving one partition: batches sized for Flight, projections, ``do_put``, memory maps.

Shared by the client (puts), the node (``copy-to``, serving) and ``get``
(local reads), so every path cuts and slices data the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from flightpart import aggregates, filters
from flightpart.errors import RequestRejected
from flightpart.wire import Aggregate, HeldPartition, PutTrailer, partition_path

from .connections import DEFAULT_TIMEOUT, ConnectionPool

BATCH_BYTES = 1 << 20
MIN_PUT_RATE = 16 << 20
"""Bytes per second a put may not fall below: its deadline is a base timeout plus its size at this rate."""


def split_batch(batch: pa.RecordBatch, target_bytes: int = BATCH_BYTES) -> list[pa.RecordBatch]:
    """A record batch as zero-copy slices of about ``target_bytes`` each."""
    if batch.num_rows == 0 or batch.nbytes <= 2 * target_bytes:
        return [batch]
    rows = max(1, target_bytes * batch.num_rows // batch.nbytes)
    return [batch.slice(k, rows) for k in range(0, batch.num_rows, rows)]


def project(table: pa.Table, columns: tuple[str, ...] | None, rows: tuple[int, int] | None, filter: bytes | None = None,
            matched: tuple[int, int] | None = None, aggregate: Aggregate | None = None) -> pa.Table:
    """What a ticket asks of a partition, in the ticket's order: a row range, a filter, a range of the rows it
    kept, a projection, an aggregate. Without a filter or aggregate every step is a zero-copy slice."""
    if rows is not None:
        table = _slice(table, rows)
    if filter is not None:
        table = filters.apply(table, filter)
    if matched is not None:
        table = _slice(table, matched)
    if aggregate is not None:
        return aggregates.partial(table, aggregate)
    if columns is not None:
        unknown = [c for c in columns if c not in table.column_names]
        if unknown:
            raise RequestRejected(f"ticket.columns: unknown column {unknown[0]!r}; the partition has {table.column_names}",
                                  field="ticket.columns")
        table = table.select(list(columns))
    return table


def _slice(table: pa.Table, rows: tuple[int, int]) -> pa.Table:
    """Python slice rules: a range past the end is cut, never an error."""
    start = min(rows[0], table.num_rows)
    return table.slice(start, max(0, min(rows[1], table.num_rows) - start))


def send_partition(pool: ConnectionPool, uri: str, dataset: str, version: int, part: tuple[int, int],
                   table: pa.Table, *, timeout: float = DEFAULT_TIMEOUT) -> HeldPartition | None:
    """``do_put`` one partition to a node in batches of about 1 MiB; returns the node's receipt.

    The stream ends with a :class:`~flightpart.wire.PutTrailer`: a node
    stores the partition only if the rows it received match it. The call's
    deadline is ``timeout`` plus the partition's size at :data:`MIN_PUT_RATE`,
    so every sender (client, node copy, Dask worker, Ray task, SPMD rank)
    fails in bounded time on a frozen node instead of hanging.
    """
    descriptor = flight.FlightDescriptor.for_path(*partition_path(dataset, version, part))
    deadline = timeout + table.nbytes / MIN_PUT_RATE
    writer, reader = pool.client(uri).do_put(descriptor, table.schema, options=pool.options(deadline))
    with writer:
        for batch in table.to_batches():
            for piece in split_batch(batch):
                writer.write_batch(piece)
        writer.write_metadata(pa.py_buffer(PutTrailer(table.num_rows).encode()))  # the put is complete
        writer.done_writing()
        ack = reader.read()
    return HeldPartition.decode(ack.to_pybytes(), "put receipt") if ack is not None else None


def chunks(reader: Any) -> Iterator[Any]:
    """The chunks (data and app metadata) of a Flight stream until it ends, for a reader of either side."""
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return


def open_mapped(path: str | Path) -> pa.Table:
    """A table whose buffers point into a read-only memory map of ``path``."""
    with pa.memory_map(str(path), "r") as source:
        return ipc.open_file(source).read_all()


@dataclass(frozen=True)
class SentPart:
    """What a worker that sent one partition reports back to the driver."""

    rows: int
    cols: int
    schema: pa.Schema
