"""What ``flightpart put`` reads, as a stream of record batches: a file, a directory, a glob or stdin.

Nothing is read whole: Parquet row group by row group, CSV and
newline-delimited JSON block by block (``.gz``, ``.bz2``, ``.zst`` and ``.lz4``
decompressed as they are read), Arrow IPC batch by batch from a memory map,
a directory or a glob through ``pyarrow.dataset`` (a directory's Hive
layout, ``year=2024/month=1/...``, kept as columns). The put cuts the stream
into partitions as it arrives, so a file larger than memory can be put.

In a CSV an empty unquoted field is a null and ``""`` an empty string, as
``flightpart get`` writes them and DuckDB and Polars read them.
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as pads
import pyarrow.ipc as ipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

SOURCE_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json",
                  ".ndjson": "json", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".arrows": "arrow"}
"""File suffixes ``put`` knows, and the format each means."""
COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
"""Suffixes of compressed files, read through (``trips.csv.gz``); the format is the suffix before."""
STDIN = "-"
CSV_NULLS = pacsv.ConvertOptions(strings_can_be_null=True, quoted_strings_can_be_null=False)
CSV_BLOCK_BYTES = 16 << 20
"""Bytes of a CSV or JSON file read at a time; column types are inferred from the first block, so a large one."""
BATCH_ROWS = 128 * 1024
"""Rows per batch read from Parquet and datasets: small against a partition, large against per-batch costs."""
PARQUET_BUFFER_BYTES = 8 << 20
"""Parquet is read through a buffer of this size, one column chunk piece at a time. pyarrow's default (whole
column chunks, pre-buffered) grew a reader of a 183 MiB file by 260 MiB; buffered, by 60 MiB."""


class SourceError(ValueError):
    """The source cannot be read as asked; the message says what to do instead."""


def format_of(path: str, fmt: str | None = None) -> str:
    """The format of ``path``: ``fmt`` if given, else from its suffix (after a compression suffix)."""
    if fmt is not None:
        return fmt
    name = Path(path)
    suffix = name.suffix.lower()
    if suffix in COMPRESSED:
        suffix = Path(name.stem).suffix.lower()
    if suffix not in SOURCE_FORMATS:
        known = ", ".join(sorted(set(SOURCE_FORMATS)))
        raise SourceError(f"{path}: unknown format {suffix or '(no suffix)'!r}; name it {known} "
                          "(compressed: .gz, .zst, ...) or say --format parquet|csv|json|arrow")
    return SOURCE_FORMATS[suffix]


def open_source(source: str, fmt: str | None = None) -> pa.RecordBatchReader:
    """A reader of ``source`` (a file, a directory, a glob, or ``-`` for stdin) in ``fmt`` or the format its name
    says."""
    if source == STDIN:
        return _from_stdin(fmt)
    if any(ch in source for ch in "*?["):
        files = sorted(glob.glob(source, recursive=True))
        if not files:
            raise SourceError(f"{source}: no file matches")
        return _dataset_reader(files, _one_format(files, fmt), partitioning=None)
    path = Path(source)
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
        if not files:
            raise SourceError(f"{source}: an empty directory")
        return _dataset_reader(str(path), _one_format(files, fmt), partitioning="hive")
    if not path.is_file():
        raise SourceError(f"{source}: no such file or directory")
    return _file_reader(source, format_of(source, fmt))


def _one_format(files: list[str], fmt: str | None) -> str:
    formats = {format_of(f, fmt) for f in files}
    if len(formats) > 1:
        raise SourceError(f"{len(files)} files of several formats ({', '.join(sorted(formats))}): put one "
                          "format at a time")
    return formats.pop()


def _file_reader(path: str, fmt: str) -> pa.RecordBatchReader:
    compressed = Path(path).suffix.lower() in COMPRESSED
    if fmt == "csv":
        return pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                              convert_options=CSV_NULLS)
    if fmt == "json":
        return pajson.open_json(path, read_options=pajson.ReadOptions(block_size=CSV_BLOCK_BYTES))
    if compressed:
        raise SourceError(f"{path}: a compressed {fmt} file; decompress it first (CSV and JSON are read compressed)")
    if fmt == "parquet":
        parquet = pq.ParquetFile(path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
        batches = parquet.iter_batches(batch_size=BATCH_ROWS, use_threads=False)
        return pa.RecordBatchReader.from_batches(parquet.schema_arrow, batches)
    if fmt == "arrow":
        return _ipc_reader(pa.memory_map(path))
    raise SourceError(f"unknown format {fmt!r}; use parquet, csv, json or arrow")


def _ipc_reader(source: Any) -> pa.RecordBatchReader:
    """An Arrow IPC file (batch by batch from its footer) or stream."""
    try:
        file = ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return ipc.open_stream(source)
    return pa.RecordBatchReader.from_batches(file.schema, (file.get_batch(k) for k in range(file.num_record_batches)))


def _dataset_reader(paths: str | list[str], fmt: str, partitioning: str | None) -> pa.RecordBatchReader:
    buffered = pads.ParquetFragmentScanOptions(use_buffered_stream=True, buffer_size=PARQUET_BUFFER_BYTES,
                                               pre_buffer=False)
    formats = {"parquet": pads.ParquetFileFormat(default_fragment_scan_options=buffered),
               "csv": pads.CsvFileFormat(convert_options=CSV_NULLS), "json": pads.JsonFileFormat(),
               "arrow": pads.IpcFileFormat()}
    if fmt not in formats:
        raise SourceError(f"unknown format {fmt!r}; use parquet, csv, json or arrow")
    data = pads.dataset(paths, format=formats[fmt], partitioning=partitioning)
    return data.scanner(batch_size=BATCH_ROWS, use_threads=False, fragment_readahead=1, batch_readahead=1).to_reader()


def _from_stdin(fmt: str | None) -> pa.RecordBatchReader:
    """stdin read as a stream: an Arrow IPC stream (the default: what ``flightpart get -o -`` writes), CSV or JSON."""
    fmt = fmt or "arrow"
    stdin = pa.PythonFile(sys.stdin.buffer, mode="r")
    if fmt == "arrow":
        return ipc.open_stream(stdin)
    if fmt == "csv":
        return pacsv.open_csv(stdin, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                              convert_options=CSV_NULLS)
    if fmt == "json":
        return pajson.open_json(stdin, read_options=pajson.ReadOptions(block_size=CSV_BLOCK_BYTES))
    raise SourceError(f"--format {fmt} cannot be read from stdin (Parquet needs a file it can seek in): "
                      "write it to a file and put that")
