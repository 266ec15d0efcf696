"""What ``flightpart get`` writes: a dataset's stream, batch by batch, to a file or stdout (Arrow IPC, Parquet, CSV).
What ``put`` reads is :mod:`flightpart.cli.sources`.

The format is decided, and the destination checked, before anything is
read; a file is written under a temporary name and renamed when complete,
so a failed or interrupted ``get`` never leaves a partial file that looks
whole.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from flightpart import frames

ROW_GROUP_ROWS = 1 << 20
"""Rows per Parquet row group written by ``get``: about DuckDB's and Polars' own (one group per streamed batch made
files a quarter larger and slower to scan)."""
ROW_GROUP_BYTES = 128 << 20
"""A row group is written early once its batches hold this many bytes, so wide rows keep ``get``'s memory bounded."""
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "arrow", ".feather": "arrow",
           ".ipc": "arrow", ".arrows": "arrow"}
STDOUT = "-"


def choose_format(output: str, fmt: str | None) -> str:
    """The format to write: ``fmt`` if given, else from the file's suffix (stdout defaults to an Arrow IPC stream)."""
    if fmt is not None:
        return fmt
    if output == STDOUT:
        return "arrow"
    suffix = Path(output).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"{output}: unknown format {suffix or '(no suffix)'!r}; use .parquet, .csv or "
                         ".arrow, or --format")
    return FORMATS[suffix]


def check_destination(output: str) -> None:
    """Fail before reading anything when the output cannot be written."""
    if output == STDOUT:
        return
    target = Path(output)
    if target.is_dir():
        raise ValueError(f"{output}: is a directory")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{output}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{output}: directory {parent} is not writable")


class BatchWriter:
    """One output (a file, renamed into place on :meth:`commit`, or stdout) taking record batches."""

    def __init__(self, output: str, fmt: str, schema: pa.Schema):
        self.output = output
        self.fmt = fmt
        self.rows = 0
        self._group: list[pa.RecordBatch] = []
        self._group_rows = 0
        self._group_bytes = 0
        self._tmp: Path | None = None
        if output == STDOUT:
            self._sink: BinaryIO = sys.stdout.buffer
        else:
            target = Path(output)
            self._tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part")
            self._sink = open(self._tmp, "wb")
        if fmt == "parquet":
            self._writer: Any = pq.ParquetWriter(self._sink, schema)
        elif fmt == "csv":
            self._writer = pacsv.CSVWriter(self._sink, schema)
        elif fmt == "arrow":
            # a file has a footer for random access; a pipe gets the stream format, read with pa.ipc.open_stream
            self._writer = ipc.new_stream(self._sink, schema) if output == STDOUT else ipc.new_file(self._sink, schema)
        else:
            self.abort()
            raise ValueError(f"unknown format {fmt!r}; use arrow, parquet or csv")

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self.fmt != "parquet":
            self._writer.write_batch(batch)
            return
        self._group.append(batch)  # Parquet: batches gathered into row groups of about ROW_GROUP_ROWS
        self._group_rows += batch.num_rows
        self._group_bytes += frames.size_of(batch)
        if self._group_rows >= ROW_GROUP_ROWS or self._group_bytes >= ROW_GROUP_BYTES:
            self._write_group()

    def _write_group(self, *, last: bool = False) -> None:
        """Write the gathered rows in row groups of ROW_GROUP_ROWS (the last, or one cut by the byte cap, smaller);
        keep a partial group for the rows that follow."""
        if not self._group:
            return
        gathered = pa.Table.from_batches(self._group)
        whole_groups = gathered.num_rows // ROW_GROUP_ROWS * ROW_GROUP_ROWS
        size = gathered.num_rows if last or not whole_groups else whole_groups  # no whole group: the byte cap
        self._writer.write_table(gathered.slice(0, size), row_group_size=min(size, ROW_GROUP_ROWS) or None)
        rest = gathered.slice(size)
        self._group = rest.to_batches()
        self._group_rows = rest.num_rows
        self._group_bytes = frames.size_of(rest) if rest.num_rows else 0

    def commit(self) -> None:
        if self.fmt == "parquet":
            self._write_group(last=True)
        self._writer.close()
        if self._tmp is None:
            self._sink.flush()
            return
        self._sink.flush()
        os.fsync(self._sink.fileno())
        self._sink.close()
        os.replace(self._tmp, self.output)

    def abort(self) -> None:
        if self._tmp is not None:
            self._sink.close()
            self._tmp.unlink(missing_ok=True)
