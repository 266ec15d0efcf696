"""The baseline the benchmark compares against: a minimal pyarrow Flight server.

It holds one table in memory (read fully, not memory-mapped) and streams it
cut in batches of the size the ticket asks for (``b"<bytes>"``), so the
benchmark can pick the batch size that suits it best, or only its first rows
(``b"<bytes>:<rows>"``, a zero-copy slice: a partition of that size); ``do_put`` reads and
keeps the stream in memory, the raw counterpart of a flightpart put. Run as
``python -m flightpart.bench.baseline HOST PATH``; prints ``READY baseline <uri>``.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.frames import rechunk


class BaselineServer(flight.FlightServerBase):
    def __init__(self, host: str, table: pa.Table):
        super().__init__(f"grpc://{host}:0")
        self.uri = f"grpc://{host}:{self.port}"
        self.table = table
        self._chunked: dict[int, pa.Table] = {}
        self.received: pa.Table | None = None

    def do_get(self, context, ticket):
        size, _, rows = ticket.ticket.decode().partition(":")
        batch = int(size)
        if batch not in self._chunked:
            self._chunked[batch] = rechunk(self.table, batch)
        table = self._chunked[batch]
        return flight.RecordBatchStream(table.slice(0, int(rows)) if rows else table)

    def do_put(self, context, descriptor, reader, writer):
        self.received = reader.read_all()


def main() -> None:
    host, path = sys.argv[1], sys.argv[2]
    with pa.OSFile(path, "rb") as source:  # read into memory: an in-memory table, not a map
        table = pa.ipc.open_file(source).read_all()
    server = BaselineServer(host, table)
    print(f"READY baseline {server.uri}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
