"""A node's put streams: partitions received from writers and from copies the catalog ordered.

Every batch is validated in full (:func:`checked`) before anything else touches it, and a partition is stored
only when its stream ended with a trailer that names its row count; a put of several partitions answers with
its receipts once every rename is durable.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import Forbidden, RequestRejected, SchemaMismatch
from flightpart.frames import check_columns, growing_dictionaries
from flightpart.io.transfer import BATCH_BYTES, chunks, split_batch
from flightpart.query.soundness import decimal_past_precision, holds_decimal
from flightpart.tokens import PUT_GRANT
from flightpart.wire import PartHeader, PutReceipts, PutTrailer, parse_put_path

from ..auth import admit_stream, authorize, credential_of, guard_of, require_version_grant
from ..base import boundary
from ..store import StoredPartition
from ..telemetry import describe
from .shared import NodeBase, log, within_limit


def decimal_columns(schema: pa.Schema) -> tuple[int, ...]:
    """The positions of ``schema``'s columns that are or hold decimals (a list or struct of them, at any depth), whose
    values :func:`checked` looks at beyond Arrow."""
    return tuple(k for k, field in enumerate(schema) if holds_decimal(field.type))


def checked(batch: pa.RecordBatch, name: str, version: int, part: tuple[int, int],
            decimals: tuple[int, ...] = ()) -> pa.RecordBatch:
    """A received batch after a full validation: offsets, lengths, row counts and dictionary indices in bounds,
    and its ``decimals`` (the positions of its decimal columns) without the one value past their precision that
    Arrow's validation misses (:func:`~flightpart.query.soundness.decimal_past_precision`).

    Nothing touches a batch before this check (decision 0011).
    """
    try:
        batch.validate(full=True)
        for k in decimals:
            decimal_past_precision(batch.column(k))
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise RequestRejected(f"the put of {name} v{version} {part} sent an invalid record batch: {str(exc)[:200]}",
                              field="batch") from None
    return batch


def split_all(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield from split_batch(batch, BATCH_BYTES)


class PutStreams(NodeBase):
    """``do_put``: one partition per stream, or several, each opened by a header and closed by a trailer."""

    RECEIPTS_PER_PAGE = 2000
    """Receipts per metadata message in the answer to a put of several partitions (about 300 KB)."""

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        with boundary(log, "do_put", self.telemetry, context,
                      counted=functools.partial(self.count_error, "put")) as call:
            name, version, part = parse_put_path(descriptor)
            credential = credential_of(context)
            if credential.role == PUT_GRANT:  # a copy the catalog ordered: this partition, to this node, nothing else
                if part is None or credential.put_scope != (name, version, part, self.node_id):
                    raise Forbidden(f"a put grant for {credential.name} does not put {name} v{version} {part} to node "
                                    f"{self.node_id}", field="authorization")
            else:  # a writer's put; a node token writes to no node (a copy carries the catalog's grant)
                authorize(context, "write")
                require_version_grant(guard_of(context), name, version, "put")
            within_limit(name, version, "descriptor.version")
            check_columns(reader.schema)  # a writer's own client refuses them first; a plain Flight writer meets this
            # a share of the streams per caller, and the slot of a put that sends nothing freed (as a do_get's is)
            guard = admit_stream(context, call.peer)
            self.counters.add(put_streams=1)
            stream = self.guard.received(guard, chunks(reader))
            if part is not None:
                stored = self._receive(context, stream, name, version, part, reader.schema, alone=True)
                describe("put", dataset=name, version=version, part=part, partitions=1, bytes=stored.nbytes,
                         rows=stored.rows)
                writer.write(pa.py_buffer(stored.encode()))
                return
            received: list[StoredPartition] = []
            for chunk in stream:
                if chunk.data is not None or chunk.app_metadata is None:
                    raise RequestRejected(f"the put of several partitions of {name} v{version} sent a record batch "
                                          "before its partition header", field="partition header")
                header = PartHeader.decode(chunk.app_metadata.to_pybytes(), "partition header")
                received.append(self._receive(context, stream, name, version, header.part, reader.schema, alone=False))
            if received:
                self.store.sync(name, version)  # every rename durable before any receipt
            describe("put", dataset=name, version=version, partitions=len(received),
                     bytes=sum(p.nbytes for p in received), rows=sum(p.rows for p in received))
            for k in range(0, len(received), self.RECEIPTS_PER_PAGE):
                writer.write(pa.py_buffer(PutReceipts(tuple(received[k:k + self.RECEIPTS_PER_PAGE])).encode()))

    def _receive(self, context: Any, stream: Iterator[Any], name: str, version: int, part: tuple[int, int],
                 schema: pa.Schema, *, alone: bool) -> StoredPartition:
        """Store one partition from ``stream``: its batches up to its trailer.

        ``alone``: the stream carries this partition only, so it must end
        after the trailer (data after it is refused); otherwise the trailer
        ends the partition and the stream goes on with the next header.
        """
        expected = self.store.group_schema(name, version, part[1])
        if expected is not None and not expected.equals(schema):
            raise SchemaMismatch(
                f"schema of {name} v{version} {part} differs from the partitions of its column group already stored: "
                f"got {schema}, expected {expected}", field="schema",
            )
        received = [0]
        declared: list[int] = []
        limit = self.store.max_partition_bytes
        decimals = decimal_columns(schema)

        def batches() -> Iterator[pa.RecordBatch]:
            for chunk in stream:
                if chunk.data is not None:
                    if declared:
                        raise RequestRejected(f"the put of {name} v{version} {part} sent data after its trailer",
                                              field="put trailer")
                    size = chunk.data.get_total_buffer_size()  # from buffer sizes alone: safe on a lying batch
                    received[0] += size
                    if limit is not None and received[0] > limit:
                        raise self.store.too_large(name, version, part)
                    yield checked(chunk.data, name, version, part, decimals)
                if chunk.app_metadata is not None:
                    declared.append(PutTrailer.decode(chunk.app_metadata.to_pybytes(), "put trailer").rows)
                    if not alone:
                        return

        def check_complete(rows: int) -> None:
            if context.is_cancelled():
                raise RequestRejected(f"the put of {name} v{version} {part} was cancelled after {rows} rows; "
                                      "nothing was stored", field="stream")
            if not declared:
                raise RequestRejected(f"the put of {name} v{version} {part} ended without its trailer after {rows} "
                                      'rows (a complete put ends with the metadata message {"rows": n}); nothing was '
                                      "stored",
                                      field="put trailer")
            if declared[-1] != rows:
                raise RequestRejected(f"the put of {name} v{version} {part} ended after {rows} rows, "
                                      f"the sender declared {declared[-1]}", field="put trailer")

        try:
            stored = self.store.write(name, version, part, schema, split_all(growing_dictionaries(batches())),
                                      check_complete, sync_directory=alone)
        except pa.ArrowInvalid as exc:  # a dictionary nested in a list or struct, replaced between batches
            if "dictionary" not in str(exc).lower():
                raise
            raise RequestRejected(f"the put of {name} v{version} {part} replaced a nested column's dictionary between "
                                  "batches, which a partition file cannot hold; send one dictionary for it",
                                  field="dictionary") from None
        self.counters.add(bytes_received=received[0], partitions_stored=1)
        return stored

