"""``client.sql(query)``: a query through the catalog's Flight SQL, the path every ADBC client takes.

DuckDB answers the query at the catalog over pushdown scans, and the answer's endpoints are read back. A plain
scan's endpoints are partitions at their replicas, read as ``get`` reads them: in parallel, checked, moving past
a replica that is down, frozen or faulty (:func:`~flightpart.io.pull.read_replicas`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames
from flightpart import sqlwire as proto
from flightpart.errors import FlightpartError, NodeUnavailable, QueryTimeout, ServerError
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.hosts import host_addresses
from flightpart.io.pull import IDLE_TIMEOUT, Expected, ReadOptions, read_replicas
from flightpart.io.transfer import read_whole
from flightpart.query.catalog_columns import CatalogColumns
from flightpart.query.soundness import unsound
from flightpart.wire import EndpointRows, Replica, Ticket

PARALLEL_PARTS = 8
"""At most this many of a plain scan's partitions are read at once."""
REUSE_CONNECTION = "arrow-flight-reuse-connection:"
"""A location that means "the server that answered GetFlightInfo" (Flight's well-known URI)."""


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


def run_sql(pool: ConnectionPool, uri: str, query: str, timeout: float | None, *, idle_timeout: float = IDLE_TIMEOUT,
            compression: str = "auto", host: str | None = None) -> SqlResult:
    """``query`` answered by the catalog at ``uri`` within ``timeout`` seconds, its endpoints read in order, with the
    client's reading settings."""
    descriptor = flight.FlightDescriptor.for_command(proto.pack(proto.STATEMENT_QUERY, proto.message((1, query))))
    deadline = None if timeout is None else time.monotonic() + timeout  # the whole call's, every part's too
    reading = _Reading(pool, uri, pool.options(timeout), deadline, idle_timeout, compression, host_addresses(host))
    try:
        return _answered(pool, uri, descriptor, reading)
    except NodeUnavailable as exc:
        if not isinstance(exc.__cause__, flight.FlightTimedOutError):
            raise
        # the caller's own deadline: no retry would be sooner (UNAVAILABLE had invited one)
        allowed = "the time" if timeout is None else f"the {timeout:g} s"
        raise QueryTimeout(f"the answer did not come within {allowed} this call allows: pass a larger "
                           f"timeout= (the catalog stops a query at its own limit); {exc.message}") from exc


def _answered(pool: ConnectionPool, uri: str, descriptor: flight.FlightDescriptor, reading: _Reading) -> SqlResult:
    with translated():
        info = pool.client(uri).get_flight_info(descriptor, options=reading.options)
        endpoints = list(info.endpoints)
        columns = CatalogColumns(info.schema)  # what each node's part must have: the answer's names and types

        def read(k: int) -> pa.Table:
            return reading.part(endpoints[k], k, columns)

        if len(endpoints) > 1:
            with ThreadPoolExecutor(max_workers=PARALLEL_PARTS, thread_name_prefix="flightpart-sql") as ex:
                tables = list(ex.map(read, range(len(endpoints))))
        else:
            tables = [read(k) for k in range(len(endpoints))]
        # each part as the answer's schema: a node's part was checked for its names and types, not for its fields'
        # nullability or metadata, which would keep the parts from being joined
        parts = [t if t.schema.equals(info.schema) else t.cast(info.schema) for t in tables]
        return SqlResult(pa.concat_tables(parts) if parts else frames.empty_table(info.schema))


@dataclass(frozen=True)
class _Reading:
    """How one query's answer is read: its catalog, call options, deadline and the client's reading settings."""

    pool: ConnectionPool
    catalog: str
    options: flight.FlightCallOptions
    deadline: float | None
    idle_timeout: float
    compression: str
    here: frozenset[str]

    def part(self, endpoint: flight.FlightEndpoint, k: int, columns: CatalogColumns) -> pa.Table:
        """One endpoint's part: a partition read from its replicas as ``get`` reads one (its columns the answer's
        ``columns``), or the catalog's own part."""
        replicas = [self._replica(location.uri.decode()) for location in endpoint.locations]
        ticket = _partition_ticket(endpoint.ticket.ticket) if replicas else None
        if ticket is None:
            where = replicas[0][0] if replicas else self.catalog
            # read_whole, not read_all: a cancelled stream is an error here, not a Ctrl-C raised later in the main
            # thread
            return _checked(read_whole(self.pool.client(where).do_get(endpoint.ticket, options=self._left())), where)
        # every column: asked by name, so a part's columns come back as the answer's, in order
        if ticket.columns is None:
            ticket = replace(ticket, columns=tuple(columns.schema.names))
        most_rows, most_bytes = _most_sent(endpoint)
        return read_replicas(self.pool, ticket, replicas, f"part {k} of the SQL answer ({ticket.dataset!r} "
                             f"v{ticket.version} partition {ticket.part})",
                             Expected(most_rows=most_rows, most_bytes=most_bytes, columns=columns),
                             ReadOptions(self.idle_timeout, self.compression, self.here, self.deadline))

    def _left(self) -> flight.FlightCallOptions:
        """Call options whose timeout is what is left of the query's deadline."""
        if self.deadline is None:
            return self.options
        return self.pool.options(max(0.001, self.deadline - time.monotonic()))

    def _replica(self, location: str) -> Replica:
        """A location as a replica to read from: its URI and host (the catalog's for "this connection")."""
        if location.startswith(REUSE_CONNECTION):
            location = self.catalog
        return location, urlsplit(location).hostname or "", 0


def _partition_ticket(raw: bytes) -> Ticket | None:
    """The partition ticket a plain scan's endpoint carries, or None for any other (the catalog's own answer)."""
    try:
        return Ticket.decode(raw, "ticket")
    except FlightpartError:
        return None


def _most_sent(endpoint: flight.FlightEndpoint) -> tuple[int | None, int]:
    """The most rows (and bytes of values, 0: not said) the endpoint's node may send
    (:class:`~flightpart.wire.EndpointRows`); rows None when the catalog did not say."""
    try:
        said = EndpointRows.decode(endpoint.app_metadata, "endpoint rows") if endpoint.app_metadata else None
    except FlightpartError:
        said = None
    if said is None:
        return None, 0
    return said.most_rows, said.most_bytes or 0


def _checked(table: pa.Table, where: str) -> pa.Table:
    """One endpoint's part once it is safe to read (a scan's endpoints are nodes, which may be faulty); ServerError
    (INTERNAL) naming the endpoint otherwise."""
    why = unsound(table)
    if why is not None:
        raise ServerError(f"the SQL answer's part from {where} cannot be read safely: {why}")
    return table
