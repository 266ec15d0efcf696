"""Moving one partition: batches sized for Flight, projections, ``do_put``, memory maps.

Shared by the client (puts), the node (``copy-to``, serving) and ``get``
(local reads), so every path cuts and slices data the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from flightpart.errors import RequestRejected
from flightpart.wire import HeldPartition, PutTrailer, partition_path

from .connections import ConnectionPool

BATCH_BYTES = 1 << 20


def split_batch(batch: pa.RecordBatch, target_bytes: int = BATCH_BYTES) -> list[pa.RecordBatch]:
    """A record batch as zero-copy slices of about ``target_bytes`` each."""
    if batch.num_rows == 0 or batch.nbytes <= 2 * target_bytes:
        return [batch]
    rows = max(1, target_bytes * batch.num_rows // batch.nbytes)
    return [batch.slice(k, rows) for k in range(0, batch.num_rows, rows)]


def project(table: pa.Table, columns: tuple[str, ...] | None, rows: tuple[int, int] | None) -> pa.Table:
    """A zero-copy projection and row range of a partition (Python slice rules for rows)."""
    if columns is not None:
        unknown = [c for c in columns if c not in table.column_names]
        if unknown:
            raise RequestRejected(f"ticket.columns: unknown column {unknown[0]!r}; the partition has {table.column_names}",
                                  field="ticket.columns")
        table = table.select(list(columns))
    if rows is not None:
        start = min(rows[0], table.num_rows)
        table = table.slice(start, max(0, min(rows[1], table.num_rows) - start))
    return table


def send_partition(pool: ConnectionPool, uri: str, dataset: str, version: int, part: tuple[int, int],
                   table: pa.Table, *, timeout: float | None = None) -> HeldPartition | None:
    """``do_put`` one partition to a node in batches of about 1 MiB; returns the node's receipt.

    The stream ends with a :class:`~flightpart.wire.PutTrailer`: a node
    stores the partition only if the rows it received match it. ``timeout``
    bounds the whole call (a frozen node fails the put instead of hanging it).
    """
    descriptor = flight.FlightDescriptor.for_path(*partition_path(dataset, version, part))
    writer, reader = pool.client(uri).do_put(descriptor, table.schema, options=pool.options(timeout))
    with writer:
        for batch in table.to_batches():
            for piece in split_batch(batch):
                writer.write_batch(piece)
        writer.write_metadata(pa.py_buffer(PutTrailer(table.num_rows).encode()))  # the put is complete
        writer.done_writing()
        ack = reader.read()
    return HeldPartition.decode(ack.to_pybytes(), "put receipt") if ack is not None else None


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
