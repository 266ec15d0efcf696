"""``client.sql(query)``: a query through the catalog's Flight SQL (docs/querying.md, "SQL over Flight").

The same path every ADBC client takes: the query goes to the catalog in a
``CommandStatementQuery``, DuckDB answers it there over pushdown scans of
the datasets it names, and the answer's endpoints are read back. A plain
scan's endpoints are partitions at their replicas (see
:mod:`flightpart.sql.scans`): they are read as ``get`` reads a partition, in
parallel, checked, moving past a replica that is down, frozen or lying to the
next (:func:`~flightpart.io.pull.read_replicas`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames
from flightpart import sqlwire as proto
from flightpart.errors import FlightpartError, ServerError
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.hosts import host_addresses
from flightpart.io.pull import read_replicas
from flightpart.io.transfer import read_whole
from flightpart.query.catalog_columns import CatalogColumns
from flightpart.query.soundness import unsound
from flightpart.wire import Ticket

PARALLEL_PARTS = 8
"""At most this many of a plain scan's partitions are read at once."""


class SqlResult:
    """A query's answer: an Arrow stream (``pa.table(result)``, ``pl.DataFrame(result)``, DuckDB), and the usual
    ``to_arrow()``, ``to_pandas()``, ``to_polars()``."""

    def __init__(self, table: pa.Table):
        self._table = table

    @property
    def schema(self) -> pa.Schema:
        return self._table.schema

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    def to_arrow(self) -> pa.Table:
        return self._table

    def to_pandas(self) -> Any:
        return frames.to_pandas(self._table)

    def to_polars(self) -> Any:
        return frames.to_polars(self._table)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self._table.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        return f"SqlResult({self._table.num_rows} rows: {', '.join(self._table.column_names)})"


def run_sql(pool: ConnectionPool, uri: str, query: str, timeout: float | None) -> SqlResult:
    """``query`` answered by the catalog at ``uri``, its endpoints read (a plain scan's in parallel) and kept in order."""
    descriptor = flight.FlightDescriptor.for_command(proto.pack(proto.STATEMENT_QUERY, proto.message((1, query))))
    options = pool.options(timeout)
    with translated():
        info = pool.client(uri).get_flight_info(descriptor, options=options)
        endpoints = list(info.endpoints)
        columns = CatalogColumns(info.schema)  # what each node's part must have: the answer's names and types

        def read(k: int) -> pa.Table:
            return _read_endpoint(pool, uri, endpoints[k], k, options, timeout, columns)

        if len(endpoints) > 1:
            with ThreadPoolExecutor(max_workers=PARALLEL_PARTS, thread_name_prefix="flightpart-sql") as ex:
                tables = list(ex.map(read, range(len(endpoints))))
        else:
            tables = [read(k) for k in range(len(endpoints))]
    return SqlResult(pa.concat_tables(tables) if tables else info.schema.empty_table())


def _read_endpoint(pool: ConnectionPool, uri: str, endpoint: flight.FlightEndpoint, k: int,
                   options: flight.FlightCallOptions, timeout: float | None, columns: CatalogColumns) -> pa.Table:
    """One endpoint's part of the answer: a partition at its replicas read as ``get`` reads one (each replica in turn,
    a frozen one left after the idle timeout, what it sends checked, its columns the answer's ``columns``), or the
    catalog's own part read from it."""
    replicas = [(location.uri.decode(), urlsplit(location.uri.decode()).hostname or "", 0)
                for location in endpoint.locations]
    ticket = _partition_ticket(endpoint.ticket.ticket) if replicas else None
    if ticket is None:
        where = replicas[0][0] if replicas else uri
        # read_whole, not read_all: a cancelled stream is an error here, not a Ctrl-C raised later in the main thread
        return _checked(read_whole(pool.client(where).do_get(endpoint.ticket, options=options)), where)
    return read_replicas(pool, ticket, replicas, f"part {k} of the SQL answer ({ticket.dataset!r} v{ticket.version} "
                         f"partition {ticket.part})", here=host_addresses(), expected_columns=columns,
                         deadline=None if timeout is None else time.monotonic() + timeout)


def _partition_ticket(raw: bytes) -> Ticket | None:
    """The partition ticket a plain scan's endpoint carries, or None for any other (the catalog's own answer)."""
    try:
        return Ticket.decode(raw, "ticket")
    except FlightpartError:
        return None


def _checked(table: pa.Table, where: str) -> pa.Table:
    """One endpoint's part of an answer, once it is safe to read: a plain scan's
    endpoints are the nodes themselves, and a faulty or hostile one's string offsets past their data had killed the
    process that read the answer. ServerError (INTERNAL) naming the endpoint otherwise."""
    why = unsound(table)
    if why is not None:
        raise ServerError(f"the SQL answer's part from {where} cannot be read safely: {why}")
    return table
