"""What a Flight SQL client puts to the catalog with a DoPut: a bind's parameters, and ``adbc_ingest``'s stream.

Both are read chunk by chunk and checked sound (:func:`check_sound`) before
anything reads their values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import sqlwire as proto
from flightpart.errors import DatasetNotFound, LimitExceeded, RequestRejected, VersionConflict
from flightpart.query.soundness import unsound
from flightpart.wire import check_name


def parameters(reader: flight.MetadataRecordBatchReader, most: int) -> tuple[pa.Table, int]:
    """A bind's values and their bytes, counted from buffer sizes as batches arrive (safe on lying arrays);
    ``LIMIT_EXCEEDED`` at the first batch past ``most`` bytes, the rest unread."""
    batches, size = [], 0
    for chunk in chunks(reader):
        if chunk.data is None:
            continue
        size += chunk.data.get_total_buffer_size()
        if size > most:
            raise LimitExceeded(f"Flight SQL: parameters past {most:,} bytes, the most one bind may carry: refused "
                                f"at {size:,} bytes, the rest not read", field="parameters")
        batches.append(chunk.data)
    return pa.Table.from_batches(batches, schema=reader.schema), size


def ingest(writer: Callable[[], Any], body: bytes, reader: flight.MetadataRecordBatchReader,
           may_write: Callable[[str], None] = lambda name: None) -> int:
    """``adbc_ingest``: the stream stored through ``writer()`` as a new dataset, the next version of one, or appended to
    one, cut into partitions as it arrives; returns the rows stored. ``may_write(name)`` raises when the caller may
    not write the table it names: asked before anything is read and again before each batch is taken."""
    options = dict(proto.fields(proto.bytes_field(body, 1, "table_definition_options") or b""))
    if_missing = proto.IF_NOT_EXIST.get(int(options.get(1, 0) or 0))
    if_exists = proto.IF_EXISTS.get(int(options.get(2, 0) or 0))
    if if_missing is None or if_exists is None:
        raise RequestRejected("adbc_ingest: say what to do if the table is missing and if it exists (mode=)",
                              field="table_definition_options")
    if any(n in (3, 4) and v for n, v in proto.fields(body)) or any(n == 5 and v for n, v in proto.fields(body)):
        raise RequestRejected("adbc_ingest: datasets have no catalog or schema, and none is temporary",
                              field="table")
    name = check_name(proto.text_field(body, 2, "table") or "", "table")
    may_write(name)
    client = writer()
    exists = name in {entry.name for entry in client.list()}
    if exists and if_exists == "fail":
        raise VersionConflict(f"adbc_ingest: dataset {name!r} exists (mode='create'); append or replace it",
                              field="table")
    if not exists and if_missing == "fail":
        raise DatasetNotFound(f"adbc_ingest: no dataset {name!r} to append to (mode='append')", field="table")
    def batches() -> Iterator[pa.RecordBatch]:
        for chunk in chunks(reader):
            if chunk.data is not None:
                may_write(name)  # again for each batch: a write withdrawn meanwhile stops it, publishing nothing
                yield check_sound(chunk.data, "adbc_ingest: a batch", "batch")

    stream = pa.RecordBatchReader.from_batches(reader.schema, batches())
    if exists and if_exists == "append":
        before = client.open(name).shape[0]
        return client.append(name, stream).shape[0] - before
    return client.put(name, stream).shape[0]


def check_sound(data: Any, what: str, field: str) -> Any:
    """``data`` a client sent, once it is safe to read (a lying array would make the catalog read out of bounds);
    refused with a code otherwise."""
    why = unsound(data if isinstance(data, pa.Table) else pa.Table.from_batches([data]))
    if why is not None:
        raise RequestRejected(f"Flight SQL: {what} that cannot be read safely: {why}", field=field)
    return data


def chunks(reader: flight.MetadataRecordBatchReader) -> Iterator[Any]:
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return
