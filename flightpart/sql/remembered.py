"""What failed inside DuckDB's scans of the datasets, kept for the error the query ends with.

DuckDB wraps a node's failure inside a scan in an error of its own;
:class:`ScanFailures` keeps each query's first one, so the gateway raises it
with its code instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pds

from flightpart.client.duckdb_source import DuckDBScan


class ScanFailures:
    """The first error a query's dataset scans raised (scans run on DuckDB's threads, hence the lock)."""

    def __init__(self) -> None:
        self.first: Exception | None = None
        self._lock = threading.Lock()

    def scan(self, dataset: Any) -> pds.Dataset:
        """``dataset``'s DuckDB scan, whose failures are kept here."""
        return _RememberedScan(dataset, self)

    def note(self, exc: Exception) -> None:
        with self._lock:
            if self.first is None:
                self.first = exc

    def raise_first(self) -> None:
        """Raise the first error a scan raised, if one did: what failed, in place of DuckDB's wrapping of it."""
        if self.first is not None:
            raise self.first

    def batches(self, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        """``reader``'s batches, any error it raises kept before it goes on to DuckDB."""
        try:
            yield from reader
        except Exception as exc:
            self.note(exc)
            raise


class _RememberedScan(DuckDBScan):
    """A dataset's DuckDB scan (columns and filters sent to the nodes) whose stream's errors are kept."""

    def __init__(self, dataset: Any, failures: ScanFailures):
        super().__init__(dataset)
        self._failures = failures

    def scanner(self, columns: list[str] | None = None, filter: Any = None, **options: Any) -> pds.Scanner:
        try:
            reader = super().scanner(columns=columns, filter=filter, **options).to_reader()
        except Exception as exc:
            self._failures.note(exc)
            raise
        return pds.Scanner.from_batches(self._failures.batches(reader), schema=reader.schema)
