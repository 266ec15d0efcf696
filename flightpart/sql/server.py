"""A catalog that also speaks Flight SQL, so ADBC clients (DB-API, R, Go, Java, JDBC/ODBC bridges) query datasets.

Flight SQL rides on the same Flight calls as flightpart's own: a
``GetFlightInfo`` whose descriptor command is a Flight SQL message runs
the query (or the metadata request) and answers with one endpoint on this
catalog, whose ticket ``DoGet`` turns into the rows; the
``CreatePreparedStatement`` and ``ClosePreparedStatement`` actions hold a
query under a handle. Every other call is the catalog's. A query is
authorized as a read; it runs in :class:`~flightpart.sql.gateway.Gateway`.
What the service holds is bounded per caller (a token's role and name; the
caller's IP without one) and in total (:mod:`.limits`): query slots, answers
(:mod:`.answers`), prepared statements (:mod:`.prepared`), parameters being
read, DuckDB's memory and spill space (:mod:`.engine`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import sqlwire as proto
from flightpart.errors import (
    DatasetNotFound,
    FlightpartError,
    LimitExceeded,
    RequestRejected,
    VersionConflict,
)
from flightpart.frames import size_of
from flightpart.query.soundness import unsound
from flightpart.server.auth import authorize, peer_ip
from flightpart.server.base import boundary, schema_error
from flightpart.server.catalog import CatalogServer
from flightpart.tokens import role_token
from flightpart.wire import check_name

from .answers import Answers, Meter
from .gateway import Gateway
from .limits import SqlLimits
from .metadata import sql_info, xdbc_type_info
from .prepared import PreparedStatements, unknown
from .sending import AnswersSent
from .slots import QuerySlots
from .statuses import sql_error

log = logging.getLogger("flightpart.sql")

SENT_BATCH_BYTES = 1 << 20
"""About how large a batch of an answer a DoGet stream sends is: a client reading part of it holds the rest on the
catalog (counted as being sent) rather than a single message with all of it."""
BIND_WAIT_SECONDS = 30.0
"""The longest a bind waits for its turn to be read (:attr:`SqlLimits.binds` are read at once)."""
CREATE_PREPARED = "CreatePreparedStatement"
CLOSE_PREPARED = "ClosePreparedStatement"
CLOSE_SESSION = "CloseSession"
GET_SESSION_OPTIONS = "GetSessionOptions"
"""Flight's session options, which an ADBC client asks for its current catalog and schema: a catalog keeps no session,
so it has none (an empty GetSessionOptionsResult); the client's current catalog and schema are then not set."""
NOT_CLOSEABLE = 3
"""CloseSessionResult's status when there is no session to close (Flight.proto): the catalog keeps none."""
TABLE_TYPE = "TABLE"


class SqlCatalogServer(CatalogServer):
    """The catalog, answering Flight SQL beside flightpart's own calls (see the module doc)."""

    def __init__(self, *args: Any, sql_limits: SqlLimits | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        limits = self.sql_limits = sql_limits if sql_limits is not None else SqlLimits.from_env()
        reader = role_token(self.secret, "reader", "sql-gateway") if self.secret is not None else None
        writer = role_token(self.secret, "writer", "sql-gateway") if self.secret is not None else None
        self.gateway = Gateway(self.uri, dataclasses.replace(self.pool.access, token=reader),
                               write_access=dataclasses.replace(self.pool.access, token=writer), limits=limits)
        # answers handed to DoGet streams that have not ended count too (a reader that idles lets go)
        self.answers_sent = AnswersSent(SENT_BATCH_BYTES)
        self.answers = Answers(limits.answers, limits.answer, self.answers_sent)
        self.prepared = PreparedStatements(limits.prepared, limits.prepared_bytes, limits.prepared_idle)
        self.binds = QuerySlots(limits.binds, queue_seconds=BIND_WAIT_SECONDS, per_caller=1, what="parameter binds")

    # ------------------------------------------------------------------ Flight calls

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        command = _command(descriptor)
        if command is None:
            return super().get_flight_info(context, descriptor)
        return self._read(context, f"Flight SQL {command.name:.60}", lambda: self._info(command, descriptor, context))

    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        command = _command(descriptor)
        if command is None:
            return super().get_schema(context, descriptor)
        return self._read(context, f"Flight SQL schema of {command.name:.60}",
                          lambda: flight.SchemaResult(self._schema_of(command, self._caller(context))),
                          sent_as=schema_error)

    def _schema_of(self, command: proto.Any_, caller: str) -> pa.Schema:
        """What the answer to ``command`` will be typed as: a plain scan's, the types its nodes send."""
        scanned = self._scan(command)
        return scanned[0] if scanned is not None else self._answer(command, Meter(caller), schema_only=True).schema

    def _read(self, context: Any, what: str, work: Any,
              sent_as: Callable[[FlightpartError], Exception] = sql_error) -> Any:
        """``work()`` for a caller allowed to read, inside the error boundary every call has; its errors sent as
        ``sent_as`` makes them (``GetSchema`` sends fewer statuses: :mod:`.statuses`)."""
        with boundary(log, what, self.telemetry, context, sent_as):
            authorize(context, "read")
            return work()

    @staticmethod
    def _caller(context: Any) -> str:
        """Who is calling, for the shares of :mod:`.limits`: a token's role and name; the owner (every caller of a
        cluster without a secret) by its IP as well."""
        credential = authorize(context, "read")
        if credential.role != "owner":
            return f"{credential.role}:{credential.name}"
        peer = context.peer() if context is not None and hasattr(context, "peer") else ""
        return f"owner@{peer_ip(peer)}"

    def _info(self, command: proto.Any_, descriptor: flight.FlightDescriptor, context: Any = None) -> flight.FlightInfo:
        """A query's FlightInfo: a plain scan's endpoints at the nodes, or one endpoint here for an answer counted
        as it is produced and kept until its DoGet (:class:`~.answers.Answers`)."""
        scanned = self._scan(command)
        if scanned is not None:  # the nodes send it: one endpoint per partition
            return flight.FlightInfo(scanned[0], descriptor, scanned[1], -1, -1)
        with self.answers.producing(self._caller(context)) as meter:
            table = self._answer(command, meter, cancelled=_gave_up(context))
            handle = self.answers.keep(meter, table)
        size = size_of(table)
        ticket = proto.pack(proto.TICKET_STATEMENT, proto.message((1, handle)))
        return flight.FlightInfo(table.schema, descriptor, [flight.FlightEndpoint(ticket, [])], table.num_rows, size)

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        command = proto.unpack(ticket.ticket)
        with boundary(log, "Flight SQL DoGet", self.telemetry, context, sql_error):
            if command is None or command.name != proto.TICKET_STATEMENT:
                raise RequestRejected("DoGet: the catalog sends no rows of its own but a Flight SQL answer, whose ticket "
                                      "is a TicketStatementQuery; a dataset's rows come from its nodes, at the "
                                      "endpoints of its FlightInfo", field="ticket")
            authorize(context, "read")
            handle = proto.bytes_field(command.value, 1, "statement_handle") or b""
            stream = self.answers.take(handle)
            if stream is None:
                raise RequestRejected("Flight SQL: no answer waits under this ticket (fetched already, or expired); "
                                      "run the query again", field="ticket")
            return stream

    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        if action.type == GET_SESSION_OPTIONS:
            with boundary(log, f"Flight SQL {action.type}", self.telemetry, context, sql_error):
                authorize(context, "read")
                return [flight.Result(pa.py_buffer(b""))]  # no option: an empty message
        if action.type not in (CREATE_PREPARED, CLOSE_PREPARED, CLOSE_SESSION):
            return super().do_action(context, action)
        with boundary(log, f"Flight SQL {action.type}", self.telemetry, context, sql_error):
            authorize(context, "read")
            command = proto.unpack(action.body.to_pybytes() if action.body is not None else b"")
            if action.type == CREATE_PREPARED:
                if command is None or command.name != proto.CREATE_PREPARED:
                    raise RequestRejected("CreatePreparedStatement: expected an ActionCreatePreparedStatementRequest",
                                          field="action")
                query = _query_text(command)
                caller = self._caller(context)
                schema = self.gateway.schema(query, caller)
                handle = self.prepared.add(caller, query)
                result = proto.message((1, handle), (2, schema.serialize().to_pybytes()))
                return [flight.Result(pa.py_buffer(proto.pack(proto.PREPARED_RESULT, result)))]
            if action.type == CLOSE_SESSION:
                # an ADBC connection's close(): a catalog keeps no session (no cookie names one), so nothing of one
                # connection can be told from another's; the driver closes its prepared statements one by one
                return [flight.Result(pa.py_buffer(proto.message((1, NOT_CLOSEABLE))))]
            if command is None or command.name != proto.CLOSE_PREPARED:
                raise RequestRejected("ClosePreparedStatement: expected an ActionClosePreparedStatementRequest",
                                      field="action")
            handle = proto.bytes_field(command.value, 1, "prepared_statement_handle") or b""
            self.prepared.close(handle)
            return []

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: flight.MetadataRecordBatchReader,
               writer: flight.FlightMetadataWriter) -> None:
        """Flight SQL binds a prepared query's parameters with a DoPut; a catalog takes no other data."""
        command = _command(descriptor)
        with boundary(log, "Flight SQL DoPut", self.telemetry, context, sql_error):
            if command is not None and command.name == proto.INGEST:
                authorize(context, "write")
                stored = self._ingest(command.value, reader)
                writer.write(pa.py_buffer(proto.message((1, stored))))  # DoPutUpdateResult
                return
            if command is not None and command.name != proto.PREPARED_QUERY:
                raise RequestRejected(f"Flight SQL: {command.name:.60} is not answered here: queries only, nothing that "
                                      "writes (executemany runs updates)", field="command")
            if command is None:
                raise RequestRejected(f"{self.uri} is a flightpart catalog: it stores no data (put partitions to a "
                                      "node; a Flight SQL client binds parameters here)", field="descriptor")
            caller = self._caller(context)
            handle = proto.bytes_field(command.value, 1, "prepared_statement_handle") or b""
            if self.prepared.get(handle) is None:
                raise unknown()
            with self.binds.held(_gave_up(context), caller):
                values, size = self._parameters(reader)
            _check_sound(values, "bound parameters", "parameters")
            self.prepared.bind(handle, values, size)
            writer.write(pa.py_buffer(proto.message((1, handle))))  # DoPutPreparedStatementResult

    def _parameters(self, reader: flight.MetadataRecordBatchReader) -> tuple[pa.Table, int]:
        """A bind's values and their bytes, counted as its batches arrive (from buffer sizes alone: safe on lying
        arrays) and refused ``LIMIT_EXCEEDED`` at the first batch past :attr:`SqlLimits.parameters`, the rest
        left unread."""
        most = self.sql_limits.parameters
        batches, size = [], 0
        for chunk in _chunks(reader):
            if chunk.data is None:
                continue
            size += chunk.data.get_total_buffer_size()
            if size > most:
                raise LimitExceeded(f"Flight SQL: parameters past {most:,} bytes, the most one bind may carry: refused "
                                    f"at {size:,} bytes, the rest not read", field="parameters")
            batches.append(chunk.data)
        return pa.Table.from_batches(batches, schema=reader.schema), size

    def stats(self) -> dict:
        """The catalog's figures, the queries stopped because their caller gave up (a deadline passed), its SQL
        query slots (queries running and waiting now, and those refused BUSY since it started) and what its SQL
        service holds: answers' bytes, prepared statements and their bound bytes, spill files' bytes."""
        slots = self.gateway.slots
        statements, bound = self.prepared.held()
        return {**super().stats(), "sql_queries_abandoned": self.gateway.abandoned, "sql_queries_running": slots.running,
                "sql_queries_waiting": slots.waiting, "sql_queries_refused_busy": slots.refused,
                "sql_answer_bytes": self.answers.held_bytes(), "sql_prepared": statements, "sql_prepared_bytes": bound,
                "sql_spill_bytes": self.gateway.engine.spilled_bytes()}

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [*super().list_actions(context), (CREATE_PREPARED, "Flight SQL: prepare a query"),
                (CLOSE_PREPARED, "Flight SQL: forget a prepared query"),
                (CLOSE_SESSION, "answered NOT_CLOSEABLE: the catalog keeps no session")]

    def shutdown(self) -> None:
        self.gateway.close()
        super().shutdown()

    # ------------------------------------------------------------------ ingest

    def _ingest(self, body: bytes, reader: flight.MetadataRecordBatchReader) -> int:
        """``adbc_ingest``: the stream stored as a dataset (a new one, the next version of one, or appended to one),
        cut into partitions as it arrives; the rows stored."""
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
        client = self.gateway.writer()
        exists = name in {entry["name"] for entry in client.list()}
        if exists and if_exists == "fail":
            raise VersionConflict(f"adbc_ingest: dataset {name!r} exists (mode='create'); append or replace it",
                                  field="table")
        if not exists and if_missing == "fail":
            raise DatasetNotFound(f"adbc_ingest: no dataset {name!r} to append to (mode='append')", field="table")
        batches = (_check_sound(chunk.data, "adbc_ingest: a batch", "batch")
                   for chunk in _chunks(reader) if chunk.data is not None)
        stream = pa.RecordBatchReader.from_batches(reader.schema, batches)
        if exists and if_exists == "append":
            before = client.open(name).shape[0]
            return client.append(name, stream).shape[0] - before
        return client.put(name, stream).shape[0]

    # ------------------------------------------------------------------ answers

    def _scan(self, command: proto.Any_) -> tuple[pa.Schema, list[flight.FlightEndpoint]] | None:
        """A plain scan's schema and endpoints at the nodes (:mod:`flightpart.sql.scans`), or None."""
        if command.name == proto.STATEMENT_QUERY:
            return self.gateway.scan(_query_text(command))
        if command.name == proto.PREPARED_QUERY:
            handle = proto.bytes_field(command.value, 1, "prepared_statement_handle") or b""
            query, values = self.prepared.get(handle) or (None, None)
            return self.gateway.scan(query) if query is not None and values is None else None
        return None

    def _answer(self, command: proto.Any_, meter: Meter, *, schema_only: bool = False,
                cancelled: Callable[[], bool] = lambda: False) -> pa.Table:
        """The rows a Flight SQL command asks for (only their schema when ``schema_only``), counted on ``meter`` as
        they are produced; the query stops when ``cancelled()`` says its caller gave up."""
        limit = 0 if schema_only else None
        count = None if schema_only else (lambda nbytes: self.answers.count(meter, nbytes))
        if command.name == proto.STATEMENT_QUERY:
            return self.gateway.run(_query_text(command), limit=limit, cancelled=cancelled, caller=meter.caller,
                                    count=count)
        if command.name == proto.PREPARED_QUERY:
            handle = proto.bytes_field(command.value, 1, "prepared_statement_handle") or b""
            query, values = self.prepared.get(handle) or (None, None)
            if query is None:
                raise unknown()
            return self.gateway.run(query, limit=limit, parameters=values, cancelled=cancelled, caller=meter.caller,
                                    count=count)
        if command.name == proto.GET_CATALOGS:  # datasets are tables of no catalog and no schema
            return pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)]).empty_table()
        if command.name == proto.GET_DB_SCHEMAS:  # one schema of no name, holding every dataset
            return pa.Table.from_arrays([pa.array([None], pa.utf8()), pa.array([""])], schema=pa.schema(
                [pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), nullable=False)]))
        if command.name == proto.GET_TABLE_TYPES:
            return pa.Table.from_arrays([pa.array([TABLE_TYPE])],
                                        schema=pa.schema([pa.field("table_type", pa.utf8(), nullable=False)]))
        if command.name == proto.GET_TABLES:
            return self._tables(command.value, schema_only)
        if command.name == proto.GET_SQL_INFO:
            return sql_info(proto.uint_fields(command.value, 1))
        if command.name == proto.GET_XDBC_TYPE_INFO:
            return xdbc_type_info(proto.int32_field(command.value, 1, "data_type"))
        raise RequestRejected(f"Flight SQL: {command.name} is not answered here", field="command")

    def _tables(self, body: bytes, schema_only: bool) -> pa.Table:
        include_schema = any(n == 5 and v for n, v in proto.fields(body))
        pattern = proto.text_field(body, 3, "table_name_filter_pattern")
        if pattern is not None and len(pattern) > MAX_PATTERN:
            raise RequestRejected(f"table_name_filter_pattern: {len(pattern):,} characters, more than the {MAX_PATTERN} "
                                  "a pattern may have", field="table_name_filter_pattern")
        types = _table_types(body)
        wanted = None if pattern is None else (lambda name: _like(name, pattern))  # schemas asked of those only
        rows = [] if schema_only or (types and TABLE_TYPE not in types) else \
            self.gateway.tables(wanted=wanted, schemas=include_schema)
        if not rows and pattern is not None and not schema_only and "%" not in pattern:
            version = self.gateway.version_table(pattern)  # adbc_get_table_schema("sales@3"): a version asked by name
            rows = [version] if version is not None and (not types or TABLE_TYPE in types) else []
        columns: dict[str, pa.Array] = {
            "catalog_name": pa.array([None] * len(rows), pa.utf8()),
            "db_schema_name": pa.array([None] * len(rows), pa.utf8()),
            "table_name": pa.array([name for name, _ in rows], pa.utf8()),
            "table_type": pa.array([TABLE_TYPE] * len(rows), pa.utf8()),
        }
        if include_schema:
            columns["table_schema"] = pa.array([schema.serialize().to_pybytes() for _, schema in rows], pa.binary())
        fields = [pa.field(k, v.type, nullable=k in ("catalog_name", "db_schema_name")) for k, v in columns.items()]
        return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields))


def _table_types(body: bytes) -> list[str]:
    """``CommandGetTables``' ``table_types`` (field 4, repeated): each must be UTF-8 text, as the protocol's strings
    are; one that is not is the request's mistake, refused with a code rather than failing the call."""
    types = []
    for n, value in proto.fields(body):
        if n != 4:
            continue
        if not isinstance(value, bytes):
            raise RequestRejected("Flight SQL: table_types holds a value that is not text", field="table_types")
        try:
            types.append(value.decode())
        except UnicodeDecodeError:
            raise RequestRejected(f"Flight SQL: table_types entry {value[:40]!r} is not UTF-8 text (e.g. 'TABLE')",
                                  field="table_types") from None
    return types


def _check_sound(data: Any, what: str, field: str) -> Any:
    """``data`` (a table or a batch a client sent), once it is safe to read: the catalog turns parameters into
    Python values and re-cuts an ingest's batches, which a lying array (string offsets past their data) had them
    read out of bounds by, killing the catalog. Refused with a code otherwise."""
    why = unsound(data if isinstance(data, pa.Table) else pa.Table.from_batches([data]))
    if why is not None:
        raise RequestRejected(f"Flight SQL: {what} that cannot be read safely: {why}", field=field)
    return data


def _chunks(reader: flight.MetadataRecordBatchReader) -> Any:
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return


def _command(descriptor: flight.FlightDescriptor) -> proto.Any_ | None:
    """The Flight SQL message in a command descriptor, or None (a path: flightpart's own)."""
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        return None
    return proto.unpack(descriptor.command)


MAX_QUERY_CHARACTERS = 1 << 20
"""Characters a query's text may have. Reading it (sqlglot parses it for each plan, DuckDB binds it) costs with its
length, before and beside the query's slot: a 4.5 MB query took a minute and 2.7 GB; ordinary queries are a few KB."""


def _query_text(command: proto.Any_) -> str:
    """The query a Flight SQL command carries (field 1), at most :data:`MAX_QUERY_CHARACTERS`."""
    text = proto.text_field(command.value, 1, "query") or ""
    if len(text) > MAX_QUERY_CHARACTERS:
        raise LimitExceeded(f"query: {len(text):,} characters, more than the {MAX_QUERY_CHARACTERS:,} a query may have",
                            field="query")
    return text


MAX_PATTERN = 256
"""Characters a table name pattern may have (matching one costs at most its length times a name's)."""


def _like(name: str, pattern: str) -> bool:
    """SQL's LIKE as Flight SQL's filter patterns use it (``%`` any run, ``_`` one character), matched greedily with
    one point to return to (the last ``%``): at most len(name) x len(pattern) steps, where a regular expression of
    40 ``%`` backtracked for minutes and held the catalog's interpreter all that time."""
    n = p = 0
    star = -1  # where in the pattern the last % was, and the name's position it matched up to
    matched = 0
    while n < len(name):
        if p < len(pattern) and pattern[p] == "%":
            star, matched = p, n
            p += 1
        elif p < len(pattern) and (pattern[p] == "_" or pattern[p] == name[n]):
            n += 1
            p += 1
        elif star >= 0:
            matched += 1
            n, p = matched, star + 1
        else:
            return False
    return all(c == "%" for c in pattern[p:])


def _gave_up(context: Any) -> Callable[[], bool]:
    """Whether the caller of this call gave up: its deadline passed or it cancelled (gRPC tells the server)."""
    if context is None or not hasattr(context, "is_cancelled"):
        return lambda: False
    return context.is_cancelled
