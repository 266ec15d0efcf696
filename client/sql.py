"""``client.sql(query)``: a query through the catalog's Flight SQL (docs/querying.md, "SQL over Flight").

The same path every ADBC client takes: the query goes to the catalog in a
``CommandStatementQuery``, DuckDB answers it there over pushdown scans of
the datasets it names, and the answer's endpoints are read back.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames
from flightpart import sqlwire as proto
from flightpart.errors import ServerError
from flightpart.io.connections import ConnectionPool
from flightpart.io.errors import translated
from flightpart.io.transfer import read_whole
from flightpart.query.soundness import unsound


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
    """``query`` answered by the catalog at ``uri``, its endpoints read in order."""
    descriptor = flight.FlightDescriptor.for_command(proto.pack(proto.STATEMENT_QUERY, proto.message((1, query))))
    options = pool.options(timeout)
    with translated():
        info = pool.client(uri).get_flight_info(descriptor, options=options)
        tables = []
        for endpoint in info.endpoints:
            where = endpoint.locations[0].uri.decode() if endpoint.locations else uri
            # read_whole, not read_all: a cancelled stream is an error here, not a Ctrl-C raised later in the main thread
            tables.append(_checked(read_whole(pool.client(where).do_get(endpoint.ticket, options=options)), where))
    return SqlResult(pa.concat_tables(tables) if tables else info.schema.empty_table())


def _checked(table: pa.Table, where: str) -> pa.Table:
    """One endpoint's part of an answer, once it is safe to read: a plain scan's
    endpoints are the nodes themselves, and a faulty or hostile one's string offsets past their data had killed the
    process that read the answer. ServerError (INTERNAL) naming the endpoint otherwise."""
    why = unsound(table)
    if why is not None:
        raise ServerError(f"the SQL answer's part from {where} cannot be read safely: {why}")
    return table
