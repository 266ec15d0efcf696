"""Moving one partition: batches sized for Flight, projections, ``do_put``, memory maps; shared by puts, node
copies, serving and local reads, so every path cuts and slices data the same way."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from flightpart.errors import RequestRejected, ServerBusy
from flightpart.frames import compact_views, holds_dictionary, schema_without_views, size_of
from flightpart.wire import HeldPartition, PartHeader, PutReceipts, PutTrailer, partition_path, partitions_path

from .connections import DEFAULT_TIMEOUT, ConnectionPool
from .counters import Counters
from .errors import translate

BATCH_BYTES = 1 << 20


TRAFFIC = Counters(("bytes_sent", "bytes_received", "bytes_mapped"))
"""Partition bytes this process sent, received over the network and read from local memory maps: what a user
checks to see that an operation ran on the nodes (a repartition moves nothing through the client) or that a
neighbour was mapped rather than streamed (``fp.traffic()``)."""
MIN_PUT_RATE = 16 << 20
"""Bytes per second a put may not fall below: its deadline is a base timeout plus its size at this rate."""


def row_pieces(table: pa.Table, nbytes: int, target_bytes: int | Callable[[], int],
               cut_bytes: int | None = None) -> Iterator[pa.Table]:
    """``table`` (of ``nbytes``) as consecutive zero-copy row ranges of about ``target_bytes`` (or what the function
    answers per range), cut where batches end, and within a batch only past twice ``cut_bytes`` (default: the
    target)."""
    rows = table.num_rows
    if rows == 0:
        return
    target = target_bytes if callable(target_bytes) else (lambda: target_bytes)
    cut = (lambda: cut_bytes) if cut_bytes is not None else target
    per_row = max(nbytes, 1) / rows
    lengths = [len(chunk) for chunk in table.column(0).chunks] if table.num_columns else [rows]
    start = end = 0
    for length in lengths:
        if length * per_row > 2 * cut():  # a batch too large for one message: the range so far, then its slices
            if end > start:
                yield table.slice(start, end - start)
            step = max(1, int(cut() / per_row))
            for k in range(end, end + length, step):
                yield table.slice(k, min(step, end + length - k))
            end += length
            start = end
            continue
        if end > start and (end + length - start) * per_row > target():
            yield table.slice(start, end - start)
            start = end
        end += length
    if end > start:
        yield table.slice(start, end - start)


BUFFERED_BYTES = 16 << 20
"""More than a stream's flow-control windows and both sockets' buffers hold: what a reader of any pace seems to
take at once when a stream starts (:class:`PiecePace`)."""


class PiecePace:
    """The size of the row ranges a node hands its stream, set by how fast the reader takes them (decision 0003).

    A range taken quickly next to ``seconds`` doubles the next (up to ``most_bytes``); a slow reader brings them back
    to ``first_bytes``. gRPC takes a stream's first megabytes at once into its buffers, so no range grows before
    ``buffered_bytes`` were taken, and the pace is the lesser of the last range's and the stream's since.
    """

    def __init__(self, first_bytes: int, most_bytes: int, seconds: float,
                 buffered_bytes: int = BUFFERED_BYTES) -> None:
        self.first_bytes = first_bytes
        self.most_bytes = most_bytes
        self.seconds = seconds
        self.buffered_bytes = buffered_bytes
        self.bytes = first_bytes
        self.taken = 0.0
        self.began: float | None = None

    def __call__(self) -> int:
        return self.bytes

    def paced(self, pieces: Iterator[pa.Table], nbytes: int, rows: int) -> Iterator[pa.Table]:
        """``pieces`` (row ranges of a table of ``nbytes`` and ``rows``), timing how long each took to be taken."""
        per_row = max(nbytes, 1) / max(rows, 1)
        for piece in pieces:
            began = time.monotonic()
            if self.began is None:
                self.began = began
            yield piece
            now = time.monotonic()
            size = piece.num_rows * per_row
            self.taken += size
            last = size / max(now - began, 1e-6)
            overall = (self.taken - self.buffered_bytes) / max(now - self.began, 1e-6)
            rate = min(last, overall)
            self.bytes = int(max(self.first_bytes, min(rate * self.seconds, 2 * self.bytes, self.most_bytes)))


def split_batch(batch: pa.RecordBatch, target_bytes: int = BATCH_BYTES) -> list[pa.RecordBatch]:
    """A record batch as zero-copy slices of about ``target_bytes``; view columns are copied, since a view slice would
    write its whole array's data buffers."""
    size = size_of(batch) if batch.num_rows else 0
    if size <= 2 * target_bytes:
        return [batch]
    rows = max(1, target_bytes * batch.num_rows // size)
    plain = schema_without_views(batch.schema)
    if plain is None:
        return [batch.slice(k, rows) for k in range(0, batch.num_rows, rows)]
    pieces, start = [], 0
    while start < batch.num_rows:  # nbytes counts every buffer a view points into: each piece's own size sets the next
        piece = compact_views(batch.slice(start, rows), plain)
        pieces.append(piece)
        start += piece.num_rows
        rows = max(1, target_bytes * piece.num_rows // max(size_of(piece), 1))
    return pieces


def _write_table(writer: Any, table: pa.Table, sent: Callable[[int], None] | None = None) -> None:
    """A table's batches in pieces of about :data:`BATCH_BYTES`, then its trailer; ``sent`` is told each piece's
    bytes."""
    told = 0
    for batch in batches_of(table):
        for piece in split_batch(batch):
            writer.write_batch(piece)
            if sent is not None:
                step = size_of(piece)
                told += step
                sent(step)
    whole = size_of(table) if sent is not None else 0
    if whole > told:
        sent(whole - told)  # type: ignore[misc]
    writer.write_metadata(pa.py_buffer(PutTrailer(table.num_rows).encode()))


def batches_of(table: pa.Table) -> list[pa.RecordBatch]:
    """``table.to_batches()``, but one empty batch for an empty table with a dictionary column, so its dictionary
    survives the stream."""
    batches = table.to_batches()
    if batches or table.num_rows or not any(holds_dictionary(field.type) for field in table.schema):
        return batches
    return [pa.RecordBatch.from_arrays([column.chunk(0) if column.num_chunks else pa.nulls(0, column.type)
                                        for column in table.columns], schema=table.schema)]


def put_deadline(timeout: float, nbytes: int) -> float:
    """A put's deadline: ``timeout`` plus its size at :data:`MIN_PUT_RATE`."""
    return timeout + nbytes / MIN_PUT_RATE


BUSY_PATIENCE = 30.0
"""Seconds a read or a put keeps retrying, after a jittered backoff, when its nodes answer ``BUSY``."""


def patient_when_busy(send: Callable[[], Any]) -> Any:
    """``send()``, retried with backoff while its node answers ``BUSY``, for up to :data:`BUSY_PATIENCE` seconds
    (safe: a node refuses a put before reading a batch)."""
    give_up, delay = time.monotonic() + BUSY_PATIENCE, 0.05
    while True:
        try:
            return send()
        except flight.FlightUnavailableError as exc:
            if not isinstance(translate(exc), ServerBusy) or time.monotonic() + delay > give_up:
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 1.0)


class ToldOnce:
    """A put's progress callback across its attempts: only bytes past the most any attempt told are told."""

    def __init__(self, sent: Callable[[int], None] | None):
        self.sent = sent
        self.most = 0

    def attempt(self) -> Callable[[int], None] | None:
        """The callback for one attempt (None when nobody asked for progress)."""
        if self.sent is None:
            return None
        told = 0

        def tell(nbytes: int) -> None:
            nonlocal told
            told += nbytes
            if told > self.most:
                assert self.sent is not None
                self.sent(told - self.most)
                self.most = told

        return tell


@dataclass(frozen=True)
class PutCall:
    """How a put goes: ``timeout``, which its deadline grows from (:func:`put_deadline`); ``sent``, told the bytes
    sent as they go (None: nobody); ``grant``, the writer's leave from ``begin``."""

    timeout: float = DEFAULT_TIMEOUT
    sent: Callable[[int], None] | None = None
    grant: str | None = None


def send_partition(pool: ConnectionPool, uri: str, dataset: str, version: int, part: tuple[int, int],
                   table: pa.Table, call: PutCall = PutCall()) -> HeldPartition | None:
    """``do_put`` one partition to a node in batches of about 1 MiB; returns the node's receipt.

    The stream ends with a :class:`~flightpart.wire.PutTrailer` the node checks the rows against before storing, and
    the call ends by :func:`put_deadline`, so a frozen node fails the put in bounded time.
    """
    descriptor = flight.FlightDescriptor.for_path(*partition_path(dataset, version, part))
    options = pool.options(put_deadline(call.timeout, size_of(table)), call.grant)
    progress = ToldOnce(call.sent)

    def send() -> Any:
        writer, reader = pool.client(uri).do_put(descriptor, table.schema, options=options)
        with writer:
            _write_table(writer, table, progress.attempt())
            writer.done_writing()
            return reader.read()

    ack = patient_when_busy(send)
    TRAFFIC.add(bytes_sent=size_of(table))
    return HeldPartition.decode(ack.to_pybytes(), "put receipt") if ack is not None else None


def send_partitions(pool: ConnectionPool, uri: str, dataset: str, version: int,
                    parts: Sequence[tuple[tuple[int, int], pa.Table]],
                    call: PutCall = PutCall()) -> list[HeldPartition]:
    """``do_put`` several partitions of one column group and schema in one stream; returns the node's receipts, once
    all are durable. Raises :class:`RequestRejected` when the receipts do not name every partition."""
    schema = parts[0][1].schema
    options = pool.options(put_deadline(call.timeout, sum(size_of(t) for _, t in parts)), call.grant)
    for part, table in parts:
        if not table.schema.equals(schema, check_metadata=True):
            raise ValueError(f"partition {part}: one put stream carries one schema; send it on a stream of its own")

    progress = ToldOnce(call.sent)

    def send() -> list[HeldPartition]:
        receipts: list[HeldPartition] = []
        writer, reader = pool.client(uri).do_put(flight.FlightDescriptor.for_path(*partitions_path(dataset, version)),
                                                 schema, options=options)
        told = progress.attempt()
        with writer:
            for part, table in parts:
                writer.write_metadata(pa.py_buffer(PartHeader(part).encode()))
                _write_table(writer, table, told)
            writer.done_writing()
            while (page := reader.read()) is not None:
                receipts.extend(PutReceipts.decode(page.to_pybytes(), "put receipts").partitions)
        return receipts

    receipts = patient_when_busy(send)
    TRAFFIC.add(bytes_sent=sum(size_of(t) for _, t in parts))
    missing = {part for part, _ in parts} - {r.part for r in receipts}
    if missing:
        raise RequestRejected(f"the node at {uri} acknowledged {len(receipts)} of {len(parts)} partitions; "
                              f"missing {sorted(missing)[:5]}", field="put receipts")
    return receipts


STREAM_BYTES = 32 << 20
"""About how much one put stream of several partitions carries; a larger partition travels alone."""
STREAM_PARTS = 4096
"""At most this many partitions to one put stream, so a failure costs a bounded resend and receipts stay small."""


def streams_of(positions: Sequence[tuple[int, int]], tables: Mapping[tuple[int, int], pa.Table], *,
               max_bytes: int = STREAM_BYTES, max_parts: int = STREAM_PARTS) -> list[list[tuple[int, int]]]:
    """``positions`` cut into put streams: consecutive partitions of one column group and schema, up to a size."""
    groups: list[list[tuple[int, int]]] = []
    weight = 0
    for pos in positions:
        table = tables[pos]
        size = size_of(table)
        last = groups[-1] if groups else None
        if (last is None or last[0][1] != pos[1] or len(last) >= max_parts or weight + size > max_bytes
                or not tables[last[0]].schema.equals(table.schema, check_metadata=True)):
            groups.append([pos])
            weight = size
        else:
            last.append(pos)
            weight += size
    return groups


def read_whole(reader: flight.FlightStreamReader) -> pa.Table:
    """A Flight stream read to its end in C++ with one take of the GIL, raising Flight errors in this thread (unlike
    ``reader.read_all()``, which turns a cancel into a ``KeyboardInterrupt`` in the main thread)."""
    return flight.MetadataRecordBatchReader.read_all(reader)


def chunks(reader: Any) -> Iterator[Any]:
    """The chunks (data and app metadata) of a Flight stream until it ends, for a reader of either side."""
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return


READ_WHOLE_BYTES = 1 << 20
"""A partition file at most this large is read into memory rather than mapped (see :func:`open_stored`)."""


def open_stored(path: str | Path, size: int, data: bytes | None = None) -> pa.Table:
    """The table of a stored partition file of ``size`` bytes (``data``: its bytes, if read): memory-mapped when large,
    read into memory when small (decision 0006)."""
    if size <= READ_WHOLE_BYTES:
        if data is None or len(data) != size:  # ``data``: the caller read the file already (to check its checksum)
            with open(path, "rb") as f:
                data = f.read()
        return ipc.open_file(pa.py_buffer(data)).read_all()
    with pa.memory_map(str(path), "r") as source:
        return ipc.open_file(source).read_all()


@dataclass(frozen=True)
class SentPart:
    """What a worker that sent one partition reports back to the driver."""

    rows: int
    cols: int
    schema: pa.Schema
